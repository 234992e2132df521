//! The kernel's record of the threads of processes with user_events sessions (the detection
//! programs' `SESSION_PROCESSES` and `THREADS`, docs/protocol/bpf-detection.md §12), on this
//! host's real kernel, with both lifecycle mechanisms: each thread a watched process creates is
//! recorded before it runs, with its creation time; its exit is stamped; threads that ran before
//! the watch are recorded from `/proc`; nothing of other processes is; entries stay until no
//! record can need them. The user_events sessions that rely on it run in the VM
//! (`tests/vm_run_user_events.rs`).
use std::process::Command;
use std::time::Duration;

use tests::process::LineProcess;
use tracer::kernel::detect::{DetectOptions, Detector, HookChoice, LifecycleMechanism};
use tracer::kernel::threads::ThreadTable;
use tracer::time::monotonic_ns;
use tracer_common::ThreadTenure;

const TIMEOUT: Duration = Duration::from_secs(30);

/// A `thread_churn` process, started.
fn churn() -> (LineProcess, u32) {
    let mut process =
        LineProcess::spawn("thread_churn", Command::new(env!("CARGO_BIN_EXE_thread_churn")))
            .expect("thread_churn");
    let pid = process.expect_line("READY", TIMEOUT).unwrap().parse().unwrap();
    assert_eq!(pid, process.pid());
    (process, pid)
}

/// Sends `command`, returns the thread id of the reply `<prefix> <tid>`.
fn tid_of(process: &mut LineProcess, command: &str, prefix: &str) -> u32 {
    process.send_line(command).unwrap();
    process.expect_line(prefix, TIMEOUT).unwrap().parse().unwrap()
}

fn table(hooks: HookChoice) -> (Detector, ThreadTable) {
    let mut detector =
        Detector::attach(&DetectOptions { hooks, ..DetectOptions::for_targets(&[]) })
            .expect("attach");
    let table = detector.take_thread_table().expect("a thread table").expect("its maps");
    (detector, table)
}

fn records_threads(hooks: HookChoice, lifecycle: LifecycleMechanism) {
    let (detector, mut table) = table(hooks);
    assert_eq!(detector.lifecycle(), &lifecycle);
    let (mut process, pid) = churn();
    let before = tid_of(&mut process, "start", "STARTED");
    let watched_at = monotonic_ns();
    let generation = table.watch(pid).expect("watch");
    // Threads that ran before the watch: from /proc, running since before it (born 0).
    let running = ThreadTenure { tgid: pid, generation, born_ns: 0, exited_ns: 0 };
    assert_eq!(table.tenure(pid), Some(running));
    assert_eq!(table.tenure(before), Some(running));

    // A thread created and ended while watched, before anyone looked: both stamps, in order.
    let quick = tid_of(&mut process, "quick", "QUICK");
    let t = table.tenure(quick).expect("the quick thread was recorded");
    assert_eq!((t.tgid, t.generation), (pid, generation));
    assert!(watched_at < t.born_ns && t.born_ns <= t.exited_ns, "{t:?}");
    assert!(t.exited_ns <= monotonic_ns(), "{t:?}");

    // A thread that runs on, then ends: stamped then.
    let long = tid_of(&mut process, "start", "STARTED");
    let started = table.tenure(long).expect("recorded");
    assert!(started.born_ns > watched_at && started.exited_ns == 0, "{started:?}");
    assert_eq!(tid_of(&mut process, &format!("end {long}"), "ENDED"), long);
    let ended = table.tenure(long).unwrap();
    assert_eq!(ended.born_ns, started.born_ns);
    assert!(ended.exited_ns >= started.born_ns, "{ended:?}");
    // The thread that ran before the watch ends: its entry from /proc gets its exit.
    assert_eq!(tid_of(&mut process, &format!("end {before}"), "ENDED"), before);
    assert!(table.tenure(before).unwrap().exited_ns > watched_at);

    // Threads of other processes are not recorded: this test's own.
    let other = std::thread::spawn(|| unsafe { libc::gettid() } as u32).join().unwrap();
    assert_eq!(table.tenure(other), None);

    // A sweep keeps what a record may still need: every entry while the reader has returned
    // nothing; the exited threads once it has returned everything; the rest while watched.
    let live = std::collections::HashSet::from([generation]);
    assert_eq!(table.sweep(&live, 0), 0);
    assert_eq!(table.sweep(&live, u64::MAX), 3, "quick, long and before went");
    assert_eq!((table.tenure(quick), table.tenure(long), table.tenure(before)), (None, None, None));
    assert_eq!(table.tenure(pid), Some(running));

    // No longer watched: new threads are not recorded, and a sweep clears the rest.
    table.unwatch(pid);
    let after = tid_of(&mut process, "start", "STARTED");
    assert_eq!(table.tenure(after), None);
    assert_eq!(table.sweep(&Default::default(), 0), 1);
    assert_eq!(table.tenure(pid), None);

    // A new watch of the pid is a new generation; the process's exit stamps its threads.
    let next = table.watch(pid).expect("watch again");
    assert_ne!(next, generation);
    assert_eq!(table.tenure(after).map(|t| (t.generation, t.exited_ns)), Some((next, 0)));
    process.send_line("exit").unwrap();
    process.wait_exit(TIMEOUT).unwrap();
    for tid in [pid, after] {
        let t = table.tenure(tid).unwrap();
        assert!(t.generation == next && t.exited_ns > 0, "{tid}: {t:?}");
    }
    table.unwatch(pid);
}

#[tokio::test(flavor = "current_thread")]
async fn threads_are_recorded_by_the_btf_lifecycle_hooks() {
    records_threads(HookChoice::Auto, LifecycleMechanism::BtfTracepoints);
}

#[tokio::test(flavor = "current_thread")]
async fn threads_are_recorded_by_the_classic_lifecycle_hooks() {
    let why = "chosen with --hooks syscall-tracepoints".to_string();
    records_threads(HookChoice::SyscallTracepoints, LifecycleMechanism::Tracepoints { why });
}

#[tokio::test(flavor = "current_thread")]
async fn a_process_that_is_gone_cannot_be_watched() {
    let (_detector, mut table) = table(HookChoice::Auto);
    let (mut process, pid) = churn();
    process.send_line("exit").unwrap();
    process.wait_exit(TIMEOUT).unwrap();
    let error = format!("{:#}", table.watch(pid).unwrap_err());
    assert!(error.starts_with(&format!("listing /proc/{pid}/task: ")), "{error}");
    // The failed watch leaves nothing recording.
    assert_eq!(table.sweep(&Default::default(), 0), 0);
}
