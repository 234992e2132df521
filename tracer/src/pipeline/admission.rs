//! Which detected processes get a session, and when: any local process can look like a .NET
//! runtime, so sessions are capped in all and per uid. A process over a cap waits (bounded) for
//! a slot of its uid; past the wait queue it is refused. Every wait and refusal is counted.
use std::collections::{HashMap, VecDeque};

/// The caps (`--max-sessions`, `--max-sessions-per-uid`, `--max-waiting-sessions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Live sessions in all.
    pub max_sessions: usize,
    /// Live sessions of processes of one uid: a user faking runtimes fills only its own share.
    pub max_per_uid: usize,
    /// Processes waiting for a slot (each holds a pidfd).
    pub max_waiting: usize,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits { max_sessions: 512, max_per_uid: 64, max_waiting: 256 }
    }
}

/// What became of a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Admitted<T> {
    /// Start its session now.
    Now(T),
    /// Queued until a slot frees.
    Waiting,
    /// The wait queue is full: no session.
    Refused,
}

/// Live sessions per uid and the processes waiting; `T` is what starts a session.
#[derive(Debug)]
pub struct Admission<T> {
    limits: AdmissionLimits,
    live: usize,
    live_by_uid: HashMap<u32, usize>,
    waiting: VecDeque<(u32, T)>,
    /// Requests that had to wait, and requests refused (queue full).
    pub waited: u64,
    pub refused: u64,
}

impl<T> Admission<T> {
    pub fn new(limits: AdmissionLimits) -> Self {
        Admission {
            limits,
            live: 0,
            live_by_uid: HashMap::new(),
            waiting: VecDeque::new(),
            waited: 0,
            refused: 0,
        }
    }

    fn has_slot(&self, uid: u32) -> bool {
        self.live < self.limits.max_sessions
            && self.live_by_uid.get(&uid).copied().unwrap_or(0) < self.limits.max_per_uid
    }

    fn take_slot(&mut self, uid: u32) {
        self.live += 1;
        *self.live_by_uid.entry(uid).or_default() += 1;
    }

    /// A process of `uid` wants a session.
    pub fn request(&mut self, uid: u32, what: T) -> Admitted<T> {
        if self.has_slot(uid) {
            self.take_slot(uid);
            return Admitted::Now(what);
        }
        if self.waiting.len() >= self.limits.max_waiting {
            self.refused += 1;
            return Admitted::Refused;
        }
        self.waited += 1;
        self.waiting.push_back((uid, what));
        Admitted::Waiting
    }

    /// A session of `uid` ended: returns the waiting requests that now get a slot, oldest first.
    pub fn finished(&mut self, uid: u32) -> Vec<T> {
        self.live = self.live.saturating_sub(1);
        if let Some(n) = self.live_by_uid.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.live_by_uid.remove(&uid);
            }
        }
        let mut admitted = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            let uid = self.waiting[i].0;
            if self.has_slot(uid) {
                self.take_slot(uid);
                admitted.push(self.waiting.remove(i).expect("index in range").1);
            } else {
                i += 1;
            }
        }
        admitted
    }

    /// Requests still waiting (at shutdown: never started).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_fills_only_its_share_and_waiters_start_in_order() {
        let limits = AdmissionLimits { max_sessions: 3, max_per_uid: 2, max_waiting: 2 };
        let mut a = Admission::new(limits);
        assert_eq!(a.request(1000, "fake1"), Admitted::Now("fake1"));
        assert_eq!(a.request(1000, "fake2"), Admitted::Now("fake2"));
        assert_eq!(a.request(1000, "fake3"), Admitted::Waiting, "uid 1000 is at its share");
        assert_eq!(a.request(0, "real"), Admitted::Now("real"), "another uid still gets in");
        assert_eq!(a.request(0, "real2"), Admitted::Waiting, "all slots taken");
        assert_eq!(a.request(0, "real3"), Admitted::Refused, "the wait queue is full");
        assert_eq!((a.waited, a.refused, a.waiting()), (2, 1, 2));
        // A uid-0 session ends: the uid-1000 waiter is older, but its uid is still at its
        // share; the uid-0 waiter starts.
        assert_eq!(a.finished(0), vec!["real2"]);
        assert_eq!(a.finished(1000), vec!["fake3"]);
        assert_eq!(a.waiting(), 0);
        assert_eq!(a.finished(1000), Vec::<&str>::new());
        assert_eq!(a.request(7, "other"), Admitted::Now("other"));
    }
}
