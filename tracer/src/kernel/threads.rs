//! The kernel's record of the threads of processes with user_events sessions: which process
//! each thread belongs to, when it was created and when it exited (the detection programs'
//! `SESSION_PROCESSES` and `THREADS` maps, docs/protocol/bpf-detection.md §12).
//!
//! A user_events record carries only the id of the thread that wrote it (`common_pid`). Asking
//! `/proc` at read time whether that thread belongs to the session's process fails for every
//! thread that has exited since — which real runtimes' thread pools do all the time. The
//! programs record each thread when it is created (before it first runs) and stamp its exit, so
//! a record is attributed by what the thread was when it wrote it; the entries stay until every
//! record written before the exit has been read ([`ThreadTable::sweep`]).
use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context as _, bail};
use aya::maps::{HashMap, Map, MapData, MapError};
use tracer_common::{MAX_SESSION_PROCESSES, THREAD_TABLE_ENTRIES, ThreadTenure};

/// How often [`ThreadTable::sweep`] runs while sessions record threads.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;

/// The two maps, taken from the loaded detection programs.
pub struct ThreadTable {
    sessions: HashMap<MapData, u32, u32>,
    threads: HashMap<MapData, u32, ThreadTenure>,
    /// The last session generation handed out (never 0, which no entry carries).
    generation: u32,
}

impl ThreadTable {
    pub(crate) fn new(sessions: Map, threads: Map) -> anyhow::Result<ThreadTable> {
        Ok(ThreadTable {
            sessions: HashMap::try_from(sessions).context("the SESSION_PROCESSES map")?,
            threads: HashMap::try_from(threads).context("the THREADS map")?,
            generation: 0,
        })
    }

    /// Starts recording the threads of `pid` for a new session: the kernel records each thread
    /// it creates from now on and each exit; the threads it already has are listed from
    /// `/proc/<pid>/task` after that (so none falls between the two). Returns the session's
    /// generation, which its entries carry.
    pub fn watch(&mut self, pid: u32) -> anyhow::Result<u32> {
        self.generation = self.generation.checked_add(1).unwrap_or(1);
        let generation = self.generation;
        if let Err(e) = self.sessions.insert(pid, generation, 0) {
            if is_errno(&e, libc::E2BIG) {
                bail!(
                    "{MAX_SESSION_PROCESSES} processes already have user_events sessions (the \
                     kernel's table of their threads is full)"
                );
            }
            return Err(e).context("recording the process in SESSION_PROCESSES");
        }
        let listed = crate::kernel::procfs::task_ids(pid).and_then(|tids| {
            tids.into_iter().try_for_each(|tid| self.record_running(pid, generation, tid))
        });
        if let Err(e) = listed {
            self.unwatch(pid);
            return Err(e);
        }
        Ok(generation)
    }

    /// Records thread `tid` of `pid`, running since before the session (`born_ns` 0), unless
    /// the kernel has an entry of this session for it already: the thread was created or
    /// exited meanwhile, and the kernel's stamp is the truth. An entry of an earlier holder of
    /// the tid (another session's, not yet swept) is replaced.
    fn record_running(&mut self, pid: u32, generation: u32, tid: u32) -> anyhow::Result<()> {
        let tenure = ThreadTenure { tgid: pid, generation, born_ns: 0, exited_ns: 0 };
        match self.threads.insert(tid, tenure, BPF_NOEXIST) {
            Ok(()) => return Ok(()),
            Err(e) if is_errno(&e, libc::EEXIST) => {}
            Err(e) if is_errno(&e, libc::E2BIG) => bail!(
                "the kernel's table of user_events sessions' threads is full \
                 ({THREAD_TABLE_ENTRIES} threads)"
            ),
            Err(e) => return Err(e).context("recording a thread in THREADS"),
        }
        match self.threads.get(&tid, 0) {
            Ok(known) if known.generation == generation => Ok(()),
            _ => self.threads.insert(tid, tenure, 0).context("recording a thread in THREADS"),
        }
    }

    /// Stops recording `pid`'s threads (the session ended); its entries go at the next sweep.
    pub fn unwatch(&mut self, pid: u32) {
        if let Err(e) = self.sessions.remove(&pid)
            && !matches!(e, MapError::KeyNotFound | MapError::ElementNotFound)
        {
            log::warn!("pid {pid}: removing it from SESSION_PROCESSES: {e}");
        }
    }

    /// What the kernel recorded of thread `tid`, if anything.
    pub fn tenure(&self, tid: u32) -> Option<ThreadTenure> {
        self.threads.get(&tid, 0).ok()
    }

    /// Removes the entries no record can need any more: those of sessions not in `live`
    /// (generations), and threads that exited before `returned_through` (every record committed
    /// before it has been read, `FtraceReader::returned_through`). Returns how many went.
    pub fn sweep(&mut self, live: &HashSet<u32>, returned_through: u64) -> usize {
        let stale: Vec<u32> = self
            .threads
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, t)| {
                !live.contains(&t.generation)
                    || (t.exited_ns != 0 && t.exited_ns < returned_through)
            })
            .map(|(tid, _)| tid)
            .collect();
        // An entry replaced meanwhile (the tid reused) may go too: its thread's records are
        // then counted as another process's, as for a full table.
        stale.iter().filter(|tid| self.threads.remove(tid).is_ok()).count()
    }
}

/// Whether a map operation failed with `errno`.
fn is_errno(e: &MapError, errno: i32) -> bool {
    matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(errno))
}
