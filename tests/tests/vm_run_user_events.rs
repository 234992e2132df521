//! `tracer run` with CollectTracing5 user_events sessions, end to end on a kernel with user_events
//! (runs inside the VM: `cargo xtask vm-test`; fails on a kernel without user_events).
//!
//! The .NET 10 test double (written from docs/protocol/diagnostic-ipc.md) receives tracer's
//! `user_events_data` fd over SCM_RIGHTS, registers the runtime's tracepoint format through it,
//! writes events with `writev` only while the kernel has set its enable bit, and unregisters when
//! tracer closes the session's connection. tracer reads the records from its private instance's
//! mapped ftrace ring buffer and decodes them.
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::double::Dotnet10Double;
use tests::pipeline::{Running, run_config, start_run, u64_field};
use tests::scratch::ScratchDir;
use tests::user_events::tracefs_with_user_events;
use tracer::pipeline::run::RunSummary;
use tracer::session::SessionMode;

/// One tracer at a time: a second tracer would attach its own session to the other test's
/// double and change the double's per-session counts.
static ONE_TRACER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// TCG emulation is slow: generous limits.
const TIMEOUT: Duration = Duration::from_secs(120);

fn start(providers: &str, mode: SessionMode) -> Running<RunSummary> {
    start_run(TIMEOUT, run_config(providers, mode, Duration::from_secs(30), 1024))
}

fn is(line: &Value, kind: &str, pid: u32) -> bool {
    line["kind"] == kind && line["pid"] == pid
}

fn is_event(line: &Value, pid: u32, event: &str) -> bool {
    is(line, "dotnet_event", pid) && line["event"] == event
}

#[test]
fn ct5_user_events_session_delivers_exactly_the_events_the_runtime_wrote() {
    let _serial = ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner());
    const N: u32 = 200;
    let tracefs = tracefs_with_user_events();
    let mut tracer = start("Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble", SessionMode::Auto);
    let tmp = ScratchDir::new("vm-run-ue");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();

    let started = tracer.wait_for("session_started", TIMEOUT, |l| is(l, "session_started", pid));
    assert_eq!(started["session"], "user_events", "{started}");
    assert_eq!(started["command"], "CollectTracing5 (0x0206)");
    assert_eq!(started["runtime_version"], "10.0.0+test-double");
    let id = started["session_id"].as_str().unwrap().to_owned();
    assert_eq!(double.expect_session_started(&id).expect("double saw CT5"), "user_events");

    // tracer enabled its tracepoints before sending CT5: not one write is skipped.
    let (written, skipped) = double.emit(N).expect("emit");
    assert_eq!((written, skipped), (u64::from(N), 0));
    double.gc(3).expect("gc 3");

    let ticks = tracer.wait_for_count("Tick", TIMEOUT, N as usize, |l| is_event(l, pid, "Tick"));
    for (i, t) in ticks.iter().enumerate() {
        assert_eq!(t["source"], "user_events");
        assert_eq!(t["provider"], "TestDouble");
        assert_eq!(t["id"], 1);
        assert_eq!(t["fields"]["Sequence"], i as u64 + 1, "{t}");
        assert_eq!(t["fields"]["Message"], format!("tick {}", i + 1));
    }
    // Native runtime events carry no metadata: decoded with the built-in layouts.
    let gcs = tracer.wait_for_count("GCStart", TIMEOUT, 3, |l| is_event(l, pid, "GCStart"));
    let counts: Vec<u64> = gcs.iter().map(|g| u64_field(&g["fields"], "Count")).collect();
    assert_eq!(counts, [1, 2, 3]);
    assert!(gcs.iter().all(|g| g["fields"]["Reason"] == "Induced"
        && g["provider"] == "Microsoft-Windows-DotNETRuntime"));

    let (lines, summary) = tracer.stop();
    let count = |event: &str| lines.iter().filter(|l| is_event(l, pid, event)).count();
    assert_eq!(count("Tick"), N as usize, "exactly the events written");
    assert_eq!(count("GCStart"), 3);
    assert_eq!(count("GCEnd"), 3);
    assert_eq!(summary.losses(), vec![], "nothing lost anywhere");
    let ended: Vec<&Value> = lines.iter().filter(|l| is(l, "session_ended", pid)).collect();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0]["reason"], "stopped");
    assert_eq!(ended[0]["events"], u64::from(N) + 6);

    // Closing the connection ended the session in the runtime, which unregistered its
    // tracepoints; with tracer's registrations gone too, the kernel deletes the events.
    double.expect_session_ended(&id).expect("the double saw its session end");
    let prefix = format!("tracer_{}_{pid}_", std::process::id());
    let status = tracefs.join("user_events_status");
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let text = std::fs::read_to_string(&status).expect("user_events_status");
        if !text.lines().any(|l| l.starts_with(&prefix)) {
            break;
        }
        // The kernel deletes unreferenced events from a workqueue: poll its status file.
        assert!(Instant::now() < deadline, "tracepoints still registered:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(double.emit(1).expect("emit after the session"), (0, 0), "no session left");
}

#[test]
fn streaming_mode_can_still_be_chosen_on_a_user_events_kernel() {
    let _serial = ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner());
    tracefs_with_user_events();
    let mut tracer = start("Microsoft-Windows-DotNETRuntime:0x1:4", SessionMode::Streaming);
    let tmp = ScratchDir::new("vm-run-stream");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let started = tracer.wait_for("session_started", TIMEOUT, |l| is(l, "session_started", pid));
    assert_eq!(started["session"], "streaming");
    let id = started["session_id"].as_str().unwrap();
    assert_eq!(double.expect_session_started(id).expect("double saw the session"), "streaming");
    double.gc(2).expect("gc 2");
    tracer.wait_for_count("GCStart", TIMEOUT, 2, |l| {
        is_event(l, pid, "GCStart") && l["source"] == "nettrace"
    });
    let (lines, _) = tracer.stop();
    assert_eq!(lines.iter().filter(|l| is_event(l, pid, "GCStart")).count(), 2);
}
