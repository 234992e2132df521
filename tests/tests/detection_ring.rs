//! The BPF ring buffer between the kernel programs and tracer, on the real kernel (root): lazy
//! events (process lifecycle) are submitted without waking the reader, so a burst must still
//! reach it whole — through the forced wake-up past the fill threshold or the drain timer — and
//! a detection must not wait behind them. Other tests run in parallel: every assertion is about
//! the processes this test started.
use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use tests::detection::read_until;
use tests::process::LineProcess;
use tracer::kernel::detect::{DetectOptions, Detector};
use tracer_decode::bpf_event::{DetectionEvent, EventBody};

const HELPER: &str = env!("CARGO_BIN_EXE_detect_helper");
const TIMEOUT: Duration = Duration::from_secs(30);
const BURST: usize = 1000;

fn helper(args: &[&str]) -> LineProcess {
    let mut command = Command::new(HELPER);
    command.args(args);
    LineProcess::spawn("detect_helper", command).expect("starting detect_helper")
}

fn json(helper: &mut LineProcess, phase: &str) -> serde_json::Value {
    let line = helper.next_line(TIMEOUT).expect("a helper line");
    let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(v["phase"], phase, "{v}");
    v
}

/// 1 000 children of a tracked process fork and exit while tracer does not read the ring
/// (the consumer paused): every fork and every exit arrives, none is lost, no sequence gap.
#[tokio::test(flavor = "current_thread")]
async fn a_burst_of_lifecycle_events_with_the_consumer_paused_loses_nothing() {
    let mut detector = Detector::attach(&DetectOptions::for_targets(&[])).expect("attach");
    let mut forker = helper(&["fork-burst", &BURST.to_string()]);
    let pid = json(&mut forker, "tracked")["pid"].as_u64().unwrap() as u32;
    forker.send_line("go").unwrap();
    let forked = json(&mut forker, "forked");
    // The consumer stays paused a while longer after the burst: 10 ms, the case to survive.
    std::thread::sleep(Duration::from_millis(10));
    let children: HashSet<u32> =
        forked["children"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap() as u32).collect();
    assert_eq!(children.len(), BURST);

    let exits = |events: &[DetectionEvent]| {
        events
            .iter()
            .filter(|e| matches!(e.body, EventBody::ProcessExit) && children.contains(&e.meta.pid))
            .count()
    };
    let mut seen = Vec::new();
    read_until(&mut detector, &mut seen, TIMEOUT, |events| exits(events) == BURST).await;
    let forks: HashSet<u32> = seen
        .iter()
        .filter(|e| e.meta.pid == pid)
        .filter_map(|e| match e.body {
            EventBody::ProcessFork { child_pid, .. } => Some(child_pid),
            _ => None,
        })
        .collect();
    assert_eq!(forks, children, "one fork event per child");
    assert_eq!(exits(&seen), BURST);
    assert_eq!(detector.losses().expect("losses"), vec![], "nothing lost");
    forker.wait_exit(TIMEOUT).unwrap();
}

/// A detection submitted behind lazy events nobody was woken for still wakes the reader (the
/// kernel's default wakes it only for a record at the head of the ring): with the lazy drain
/// off, the memfd_create before it and the `dotnet_ipc_ready` arrive together, woken.
#[tokio::test(flavor = "current_thread")]
async fn a_detection_behind_lazy_events_wakes_the_reader() {
    let options = DetectOptions {
        lazy_drain: Duration::from_secs(24 * 3600),
        ..DetectOptions::for_targets(&[])
    };
    // The drain timer's first tick is a period away: only a wake-up can end a read.
    let mut detector = Detector::attach(&options).expect("attach");
    // `sequence`: memfd_create (lazy) + mmap of the dotnet_ipc_created memfd (a detection).
    let mut target = helper(&["sequence"]);
    let pid = json(&mut target, "started")["pid"].as_u64().unwrap() as u32;
    target.send_line("go").unwrap();
    json(&mut target, "registered");
    let of_target = |e: &&DetectionEvent| e.meta.pid == pid;
    let mut seen = Vec::new();
    read_until(&mut detector, &mut seen, TIMEOUT, |events| {
        events.iter().filter(of_target).any(|e| matches!(e.body, EventBody::DotnetIpcReady(_)))
    })
    .await;
    let kinds: Vec<&str> = seen
        .iter()
        .filter(of_target)
        .map(|e| match e.body {
            EventBody::MemfdCreate(_) => "memfd_create",
            EventBody::DotnetIpcReady(_) => "dotnet_ipc_ready",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["memfd_create", "dotnet_ipc_ready"], "the lazy event came with it, first");
    target.send_line("go").unwrap();
    json(&mut target, "done");
}
