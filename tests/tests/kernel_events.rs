//! `tracer run --kernel-event` on the real kernel (root): the kernel's records of a traced
//! process's threads — threads created and ended during the run among them — in the run's
//! output with the process's identity, and nobody else's.
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tests::double::Dotnet10Double;
use tests::pipeline::{run_config, start_run};
use tests::process::tracer_binary;
use tests::scratch::ScratchDir;
use tracer::session::SessionMode;

const TIMEOUT: Duration = Duration::from_secs(60);
/// Threads the double starts, each writing its events and ending.
const THREADS: u32 = 4;
const EVENTS_PER_THREAD: u32 = 50;

/// Every `sys_enter_sendto` of the double's threads — the short-lived writer threads included,
/// created after its session started and ended before the run does — is a line with the
/// double's pid and start; no line is of another process, though the test's own process (and
/// every other on the machine) sends meanwhile.
#[test]
fn the_syscalls_of_a_traced_process_threads_are_its_lines_and_no_one_elses() {
    let tmp = ScratchDir::new("kernel-events");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let mut config =
        run_config("TestDouble", SessionMode::Streaming, Duration::from_secs(10), 1024);
    config.target_pids = vec![pid];
    config.kernel_events = vec!["syscalls:sys_enter_sendto".parse().unwrap()];
    let mut tracer = start_run(TIMEOUT, config);
    let started = tracer.wait_for("session_started", TIMEOUT, |l| {
        l["kind"] == "session_started" && l["pid"] == pid
    });
    let (written, tids) = double.threads(THREADS, EVENTS_PER_THREAD).expect("threads");
    assert_eq!(written, u64::from(THREADS * EVENTS_PER_THREAD));
    // An untraced process sending at the same time.
    let other = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..100 {
        other.send_to(b"x", other.local_addr().unwrap()).unwrap();
    }
    let is_sendto = |l: &Value| l["kind"] == "ftrace" && l["event"] == "sys_enter_sendto";
    for &tid in &tids {
        tracer.wait_for("the writer thread's sendto", TIMEOUT, |l| is_sendto(l) && l["tid"] == tid);
    }
    let (lines, summary) = tracer.stop();
    let records: Vec<&Value> = lines.iter().filter(|l| is_sendto(l)).collect();
    for record in &records {
        assert_eq!(record["pid"], pid, "{record}");
        assert_eq!(record["process_start_ns"], started["process_start_ns"], "{record}");
        assert_eq!((&record["system"], &record["source"]), (&"syscalls".into(), &"ftrace".into()));
        assert!(record["fields"]["fd"].is_u64(), "{record}");
    }
    for &tid in &tids {
        let of_thread = records.iter().filter(|r| r["tid"] == tid).count();
        assert!(of_thread >= 1, "thread {tid} of {tids:?}: {of_thread} records");
    }
    // The runtime events the threads wrote are there too, on the same clock.
    let ticks = lines.iter().filter(|l| l["event"] == "Tick" && l["pid"] == pid).count();
    assert_eq!(ticks, (THREADS * EVENTS_PER_THREAD) as usize);
    assert_eq!(summary.kernel_events.written, records.len() as u64);
    let reader = summary.kernel_events_reader.as_ref().expect("kernel events read");
    assert_eq!(reader.lost(), 0, "{reader:?}");
    assert_eq!((summary.kernel_events.bad_fields, summary.kernel_events.thread_table_full), (0, 0));
}

/// A tracepoint this kernel does not have stops `tracer run` at start with a message saying so.
#[test]
fn an_unknown_kernel_event_is_refused_at_start() {
    let out = Command::new(tracer_binary())
        .args(["run", "--kernel-event", "sched:no_such_event", "--duration", "5s"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "--kernel-event sched:no_such_event: tracepoint sched:no_such_event does not exist on \
             this kernel"
        ),
        "{stderr}"
    );
    let out =
        Command::new(tracer_binary()).args(["run", "--kernel-event", "sched"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("invalid event \"sched\": expected SYSTEM:NAME or SYSTEM:*"),
        "{stderr}"
    );
}
