//! Streaming sessions with runtimes that misbehave the way a hostile (or overloaded) peer can:
//! one that sends events of providers nobody asked for, one that writes faster than tracer stops
//! it, and one that never answers StopTracing. Each tracer here traces only its own double
//! (`--pid`), so parallel tests cannot change its counts.
use std::time::Duration;

use serde_json::Value;
use tests::double::Dotnet10Double;
use tests::pipeline::{Running, is, run_config, start_run};
use tests::scratch::ScratchDir;
use tracer::pipeline::run::RunSummary;
use tracer::session::SessionMode;

const READY: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(60);

/// `tracer run` in-process for `pid` only, with `providers`; waits for its session to start and
/// returns the session id.
fn trace_only(pid: u32, providers: &str, drain: Duration) -> (Running<RunSummary>, String) {
    let mut config = run_config(providers, SessionMode::Streaming, Duration::from_secs(10), 1024);
    config.target_pids = vec![pid];
    config.session.drain_timeout = drain;
    let mut tracer = start_run(READY, config);
    let started = tracer.wait_for("session_started", WAIT, |l| is(l, "session_started", pid));
    (tracer, started["session_id"].as_str().unwrap().to_string())
}

fn events(lines: &[Value], pid: u32, event: &str) -> usize {
    lines.iter().filter(|l| is(l, "dotnet_event", pid) && l["event"] == event).count()
}

#[test]
fn events_of_providers_nobody_asked_for_are_dropped_and_counted() {
    let tmp = ScratchDir::new("unrequested");
    let mut double =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_ALL_PROVIDERS", "1")]).expect("double");
    let pid = double.pid();
    let (mut tracer, id) =
        trace_only(pid, "Microsoft-Windows-DotNETRuntime:0x1:4", Duration::from_secs(10));
    double.expect_session_started(&id).expect("double saw the session");
    // Other tracers on the host may hold sessions with the double too: none skips the Ticks.
    assert_eq!(double.emit(7).expect("emit").1, 0, "the double sends Ticks regardless");
    double.gc(2).expect("gc");
    tracer
        .wait_for_count("GCEnd", WAIT, 2, |l| is(l, "dotnet_event", pid) && l["event"] == "GCEnd");
    let (lines, summary) = tracer.stop();
    assert_eq!(events(&lines, pid, "Tick"), 0, "TestDouble was not requested");
    assert_eq!(events(&lines, pid, "GCStart"), 2);
    let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
    assert_eq!(ended["reason"], "stopped");
    assert_eq!(ended["unrequested_events"], 7);
    assert_eq!(ended["events"], 4);
    assert_eq!(summary.unrequested_events, 7);
    let last = lines.last().unwrap();
    assert_eq!(last["kind"], "summary");
    assert!(
        last["losses"].as_array().unwrap().iter().any(|l| l["reason"] == "unrequested_provider"
            && l["source"] == "nettrace"
            && l["count"] == 7),
        "{last}"
    );
}

#[test]
fn a_runtime_writing_while_it_is_stopped_is_read_until_it_acknowledges() {
    const BATCHES: u32 = 50;
    const TICKS: u32 = 1_000;
    let tmp = ScratchDir::new("heavy-stop");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let (mut tracer, id) = trace_only(pid, "TestDouble", Duration::from_secs(30));
    double.expect_session_started(&id).expect("double saw the session");
    // One block per batch, far more in all than a socket buffer holds: the double blocks
    // writing unless tracer reads, and (like the runtime) answers StopTracing only once its
    // stream is flushed. A tracer that stops reading while it waits for that answer waits in
    // vain until its IPC timeout.
    for _ in 0..BATCHES {
        double.start_emit(TICKS).expect("emit");
    }
    tracer.wait_for("the first Tick", WAIT, |l| is(l, "dotnet_event", pid));
    let (lines, summary) = tracer.stop();
    for _ in 0..BATCHES {
        assert_eq!(double.emitted(TICKS).expect("emitted").1, 0);
    }
    let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
    assert_eq!(ended["reason"], "stopped", "{ended}");
    assert_eq!(ended.get("stop_error"), None, "StopTracing acknowledged: {ended}");
    // The double ends the session between two batches; everything it wrote before arrived:
    // the stream ended with its end tag, and its sequence numbers show no gap.
    assert_eq!(ended["lost_events"], 0, "{ended}");
    let ticks = events(&lines, pid, "Tick");
    assert!(ticks > 0 && ticks.is_multiple_of(TICKS as usize), "whole batches: {ticks}");
    assert_eq!((summary.stop_failures, summary.unread_bytes_at_drain), (0, 0));
}

#[test]
fn a_runtime_that_never_acknowledges_stop_ends_at_the_drain_deadline_and_is_counted() {
    let tmp = ScratchDir::new("ignore-stop");
    let mut double =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_IGNORE_STOP", "1")]).expect("double");
    let pid = double.pid();
    let (mut tracer, id) = trace_only(pid, "TestDouble", Duration::from_millis(500));
    double.expect_session_started(&id).expect("double saw the session");
    double.emit(3).expect("emit");
    tracer.wait_for_count("Ticks", WAIT, 3, |l| is(l, "dotnet_event", pid));
    let (lines, summary) = tracer.stop();
    let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
    assert_eq!(ended["reason"], "drain_timeout", "{ended}");
    assert_eq!(ended["events"], 3);
    assert_eq!(summary.sessions_ended.get("drain_timeout"), Some(&1));
}

#[test]
fn fakes_of_one_uid_fill_only_its_share_and_a_real_runtime_is_still_traced() {
    const FAKES: usize = 120;
    const SHARE: usize = 8;
    let tmp = ScratchDir::new("fakes");
    // A shared temp dir, as /tmp is.
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o1777))
        .unwrap();
    // Processes of `nobody` that look like runtimes and hold their sessions: they accept the
    // connection and never answer.
    let mut fakes = Vec::new();
    for _ in 0..FAKES {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hostile_peer"));
        command.arg("silent").env("TMPDIR", tmp.path()).env("HOSTILE_PEER_IPC_MEMFD", "1");
        std::os::unix::process::CommandExt::uid(&mut command, 65534);
        std::os::unix::process::CommandExt::gid(&mut command, 65534);
        let mut fake = tests::process::LineProcess::spawn("hostile_peer", command).unwrap();
        fake.wait_line("READY", WAIT).unwrap();
        fakes.push(fake);
    }
    let mut config =
        run_config("TestDouble", SessionMode::Streaming, Duration::from_secs(10), 1024);
    config.admission.max_per_uid = SHARE;
    // The fakes keep their slots for the whole test.
    let patient = Duration::from_secs(600);
    config.session.timeouts =
        tracer::ipc::client::Timeouts { connect: patient, write: patient, read: patient };
    let mut tracer = start_run(READY, config);
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let started =
        tracer.wait_for("the real runtime's session", WAIT, |l| is(l, "session_started", pid));
    double.expect_session_started(started["session_id"].as_str().unwrap()).unwrap();
    let (_, summary) = tracer.stop();
    assert_eq!(summary.sessions_waited, (FAKES - SHARE) as u64, "only the fakes wait");
    assert_eq!(summary.sessions_not_admitted, (FAKES - SHARE) as u64, "still waiting at stop");
    drop(fakes);
}

#[test]
fn a_peer_that_accepts_a_session_but_never_streams_is_dropped() {
    let tmp = ScratchDir::new("silent-stream");
    let mut double =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_SILENT_STREAM", "1")]).expect("double");
    let pid = double.pid();
    let mut config =
        run_config("TestDouble", SessionMode::Streaming, Duration::from_secs(10), 1024);
    config.target_pids = vec![pid];
    config.session.timeouts.read = Duration::from_millis(300);
    let mut tracer = start_run(READY, config);
    let started = tracer.wait_for("session_started", WAIT, |l| is(l, "session_started", pid));
    double.expect_session_started(started["session_id"].as_str().unwrap()).unwrap();
    let ended = tracer.wait_for("session_ended", WAIT, |l| is(l, "session_ended", pid));
    assert_eq!(ended["reason"], "stream_not_started", "{ended}");
    assert_eq!(ended["events"], 0);
    let (_, summary) = tracer.stop();
    assert_eq!(summary.sessions_ended.get("stream_not_started"), Some(&1));
}
