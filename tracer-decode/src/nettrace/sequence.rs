//! Per-capture-thread sequence numbers (docs/protocol/nettrace.md §7): every event the runtime
//! tried to write on a thread takes the next number, so a gap — within the thread's events, or up
//! to a sequence point's number — is a count of events dropped by the runtime.

use std::collections::HashMap;

/// Differences at or above this are a number going backwards (duplicate or reordered), not a
/// gap: u32 sequence numbers wrap.
const BACKWARDS: u32 = 0x8000_0000;

#[derive(Debug)]
struct ThreadSequence {
    capture_thread_id: u64,
    last: u32,
    lost: u64,
}

#[derive(Debug)]
pub(super) struct SequenceTracker {
    threads: Vec<ThreadSequence>,
    index: HashMap<u64, usize>,
    /// Index of the last thread looked up: consecutive events mostly share a thread.
    recent: usize,
    max_threads: usize,
    total_lost: u64,
}

impl SequenceTracker {
    pub(super) fn new(max_threads: usize) -> Self {
        SequenceTracker {
            threads: Vec::new(),
            index: HashMap::new(),
            recent: 0,
            max_threads,
            total_lost: 0,
        }
    }

    /// Records an event's sequence number; `Err(max_threads)` when too many threads appear.
    #[inline]
    pub(super) fn observe(&mut self, thread: u64, sequence: u32) -> Result<(), usize> {
        let i = self.thread(thread)?;
        let expected = self.threads[i].last.wrapping_add(1);
        self.advance(i, sequence, expected);
        Ok(())
    }

    /// Records a sequence point entry: the last number the runtime used on `thread`.
    pub(super) fn sequence_point(&mut self, thread: u64, sequence: u32) -> Result<(), usize> {
        let i = self.thread(thread)?;
        let expected = self.threads[i].last;
        self.advance(i, sequence, expected);
        Ok(())
    }

    #[inline]
    fn advance(&mut self, i: usize, sequence: u32, expected: u32) {
        let gap = sequence.wrapping_sub(expected);
        if gap < BACKWARDS {
            let t = &mut self.threads[i];
            t.lost += u64::from(gap);
            t.last = sequence;
            self.total_lost += u64::from(gap);
        }
    }

    #[inline]
    fn thread(&mut self, thread: u64) -> Result<usize, usize> {
        if self.threads.get(self.recent).is_some_and(|t| t.capture_thread_id == thread) {
            return Ok(self.recent);
        }
        self.thread_slow(thread)
    }

    fn thread_slow(&mut self, thread: u64) -> Result<usize, usize> {
        let i = match self.index.get(&thread) {
            Some(&i) => i,
            None => {
                if self.threads.len() >= self.max_threads {
                    return Err(self.max_threads);
                }
                self.threads.push(ThreadSequence { capture_thread_id: thread, last: 0, lost: 0 });
                self.index.insert(thread, self.threads.len() - 1);
                self.threads.len() - 1
            }
        };
        self.recent = i;
        Ok(i)
    }

    pub(super) fn total_lost(&self) -> u64 {
        self.total_lost
    }

    pub(super) fn lost_by_thread(&self) -> Vec<(u64, u64)> {
        self.threads.iter().filter(|t| t.lost > 0).map(|t| (t.capture_thread_id, t.lost)).collect()
    }
}
