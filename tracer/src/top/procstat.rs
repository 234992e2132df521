//! What `tracer top` reads of a process from `/proc` every refresh: its CPU time and resident
//! memory (`stat`), and for the process in the detail view each thread's name, state and CPU
//! time (`task/<tid>/stat`). The kernel's own accounting, whatever the runtime says.
use std::collections::HashMap;
use std::fs::File;
use std::io::Read as _;

use tracer_decode::procfs::{TaskStat, parse_task_stat};

use crate::kernel::procfs::{ns_per_tick, start_ns_of_ticks};
use crate::output::Incarnation;

/// Bytes of a `stat` file read (a line of a few hundred bytes; its name is at most 64).
const MAX_STAT_BYTES: usize = 4096;
/// Threads of the detail view's process read each refresh; the others are counted.
pub const MAX_THREADS_SHOWN: usize = 512;

/// A process's CPU time (all threads) and resident memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ticks: u64,
    pub rss_bytes: u64,
}

/// The usage of `process`, `None` once it has exited (or its pid names another process now).
pub fn usage(process: Incarnation) -> Option<Usage> {
    let stat = with_stat(&format!("/proc/{}/stat", process.pid), |stat| {
        (stat.start_ticks, stat.utime_ticks + stat.stime_ticks, stat.rss_pages)
    })?;
    let (start_ticks, cpu_ticks, rss_pages) = stat;
    if process.start_ns.is_some_and(|start| start != start_ns_of_ticks(start_ticks)) {
        return None;
    }
    Some(Usage { cpu_ticks, rss_bytes: rss_pages.saturating_mul(page_size()) })
}

/// The `comm` of `pid` now (`None`: gone).
pub fn name(pid: u32) -> Option<String> {
    with_stat(&format!("/proc/{pid}/stat"), |stat| stat.comm.to_owned())
}

/// One thread, as the detail view shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadRow {
    pub tid: u32,
    /// Its `comm` (any text: the process names its threads).
    pub name: String,
    pub state: char,
    /// CPU over the last refresh, in percent of one CPU (`None` on its first read).
    pub cpu_percent: Option<f64>,
}

/// The threads of the detail view's process, with their CPU share between two reads.
#[derive(Debug, Default)]
pub struct Threads {
    pid: Option<u32>,
    /// Each thread's CPU ticks at the last read, and when (monotonic ns).
    last: HashMap<u32, u64>,
    last_ns: u64,
    pub rows: Vec<ThreadRow>,
    /// Threads past [`MAX_THREADS_SHOWN`], not read.
    pub not_shown: usize,
}

impl Threads {
    /// Reads the threads of `pid` at `now_ns` (starting over when it is another process).
    pub fn read(&mut self, pid: u32, now_ns: u64) {
        if self.pid != Some(pid) {
            *self = Threads { pid: Some(pid), ..Threads::default() };
        }
        let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|dir| dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        tids.sort_unstable();
        self.not_shown = tids.len().saturating_sub(MAX_THREADS_SHOWN);
        tids.truncate(MAX_THREADS_SHOWN);
        let elapsed_ns = now_ns.saturating_sub(self.last_ns);
        let mut last = HashMap::with_capacity(tids.len());
        self.rows.clear();
        for tid in tids {
            let path = format!("/proc/{pid}/task/{tid}/stat");
            let read =
                with_stat(&path, |s| (s.comm.to_owned(), s.state, s.utime_ticks + s.stime_ticks));
            let Some((name, state, ticks)) = read else { continue };
            let cpu_percent = self.last.get(&tid).filter(|_| elapsed_ns > 0).map(|&before| {
                ticks.saturating_sub(before).saturating_mul(ns_per_tick()) as f64 * 100.0
                    / elapsed_ns as f64
            });
            last.insert(tid, ticks);
            self.rows.push(ThreadRow { tid, name, state, cpu_percent });
        }
        (self.last, self.last_ns) = (last, now_ns);
        self.rows.sort_by(|a, b| {
            let (x, y) = (a.cpu_percent.unwrap_or(0.0), b.cpu_percent.unwrap_or(0.0));
            y.total_cmp(&x).then(a.tid.cmp(&b.tid))
        });
    }
}

/// What a thread's state letter means (`/proc/<pid>/task/<tid>/stat`, proc(5)).
pub fn state_name(state: char) -> &'static str {
    match state {
        'R' => "running",
        'S' => "sleeping",
        'D' => "disk wait",
        'T' => "stopped",
        't' => "traced",
        'Z' => "zombie",
        'X' => "dead",
        'I' => "idle",
        'P' => "parked",
        _ => "?",
    }
}

/// `f` of the `stat` file at `path`, read with one `read` (procfs hands the whole line to a
/// read of a page; a line is a few hundred bytes), `None` when it is gone or does not parse.
fn with_stat<T>(path: &str, f: impl FnOnce(TaskStat<'_>) -> T) -> Option<T> {
    let mut buf = [0u8; MAX_STAT_BYTES];
    let n = File::open(path).ok()?.read(&mut buf).ok()?;
    parse_task_stat(&String::from_utf8_lossy(&buf[..n])).map(f)
}

fn page_size() -> u64 {
    static PAGE_SIZE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE_SIZE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_usage_and_threads_and_a_reused_pid_has_none() {
        let pid = std::process::id();
        let start = crate::kernel::procfs::process_start_ns(pid);
        let own = usage(Incarnation::new(pid, start)).expect("this process's stat");
        assert!(own.rss_bytes > 0);
        assert_eq!(usage(Incarnation::new(pid, start.map(|s| s + 1))), None, "another start");
        assert_eq!(usage(Incarnation::new(u32::MAX, None)), None);
        let mut threads = Threads::default();
        threads.read(pid, 1);
        assert!(threads.rows.iter().any(|t| t.tid == pid && t.cpu_percent.is_none()));
        threads.read(pid, 1_000_000_001);
        let main = threads.rows.iter().find(|t| t.tid == pid).expect("the main thread");
        assert!(main.cpu_percent.is_some(), "{main:?}");
        assert_eq!(state_name('R'), "running");
    }
}
