//! Output amplification by a hostile peer: a fake runtime (the .NET 10 double in its `amplify` mode, a real
//! process on a real diagnostic socket, detected live) sends a small nettrace stream built to
//! amplify — a field list of 1 024 objects without fields, and 2-byte events whose event name is
//! 1 000 control characters (provider `Amplifier`, which the session asks for: events of
//! providers nobody asked for are dropped before decoding, see hostile_sessions.rs). tracer must
//! refuse the empty objects, end the session with `budget_exceeded` once its output would pass
//! 64 bytes per byte sent + 256 KiB, and keep tracing a well-behaved runtime at the same time,
//! every event of it.
//! (Before: the EmptyFields events rendered 22 KB each, the long-named ones 12 KB each — about
//! 6 000 output bytes per byte sent — and the session ran on.)
use std::time::Duration;

use serde_json::Value;
use tests::double::Dotnet10Double;
use tests::pipeline::{is, is_event, run_config, start_run};
use tests::scratch::ScratchDir;
use tracer::session::SessionMode;
use tracer_decode::budget::{OUTPUT_ALLOWANCE_BYTES, OUTPUT_BYTES_PER_INPUT_BYTE};

const READY: Duration = Duration::from_secs(60);
const SESSION: Duration = Duration::from_secs(120);
const EVENTS: Duration = Duration::from_secs(30);
const EMPTY_EVENTS: u32 = 20;
const NAMED_EVENTS: u32 = 3000;

#[test]
fn amplifying_stream_ends_with_budget_exceeded_and_a_good_runtime_gets_every_event() {
    let config = run_config(
        "Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble,Amplifier",
        SessionMode::Streaming,
        Duration::from_secs(10),
        1024,
    );
    let mut tracer = start_run(READY, config);
    let tmp = ScratchDir::new("hostile-amplify");
    let mut hostile = Dotnet10Double::spawn(tmp.path()).expect("hostile double");
    let mut good = Dotnet10Double::spawn(tmp.path()).expect("good double");
    let (bad, ok) = (hostile.pid(), good.pid());
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", bad));
    tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", ok));

    // Only into this tracer's session (other tracers on the host may trace the doubles too).
    let id = started["session_id"].as_str().unwrap();
    let (events, sent) = hostile.amplify(id, EMPTY_EVENTS, NAMED_EVENTS).expect("amplify");
    assert_eq!(events, u64::from(EMPTY_EVENTS + NAMED_EVENTS));
    good.gc(3).expect("gc 3");
    good.emit(4).expect("emit 4");
    let ended = tracer.wait_for("hostile session_ended", EVENTS, |l| is(l, "session_ended", bad));
    assert_eq!(ended["reason"], "budget_exceeded", "{ended}");
    tracer.wait_for_count("good GCEnd", EVENTS, 3, |l| is_event(l, ok, "GCEnd"));
    tracer.wait_for_count("good Tick", EVENTS, 4, |l| is_event(l, ok, "Tick"));

    let (lines, summary) = tracer.stop();
    // The objects without fields were refused: their events keep their (empty) payload as hex.
    let empty: Vec<&Value> = lines.iter().filter(|l| is_event(l, bad, "EmptyFields")).collect();
    assert_eq!(empty.len(), EMPTY_EVENTS as usize);
    for l in &empty {
        assert_eq!(l["fields"], serde_json::json!({"raw_payload": ""}), "{l}");
        assert_eq!(
            l["decode_error"],
            "payload byte 0: field : UnusableMetadata (payload is 0 bytes)"
        );
    }
    // Every event line written about the hostile peer (with its newline) stays within what it
    // paid for; its session_started / session_ended lines are per session, not per byte.
    let output: u64 = lines
        .iter()
        .filter(|l| is(l, "dotnet_event", bad))
        .map(|l| l.to_string().len() as u64 + 1)
        .sum();
    let limit = OUTPUT_BYTES_PER_INPUT_BYTE * sent + OUTPUT_ALLOWANCE_BYTES;
    eprintln!("hostile peer: {sent} bytes sent, {output} output bytes (limit {limit})");
    assert!(output <= limit, "{output} output bytes for {sent} bytes sent (limit {limit})");
    let named = lines.iter().filter(|l| is(l, "dotnet_event", bad) && l["id"] == 2).count();
    assert!(named > 0 && named < NAMED_EVENTS as usize, "{named} long-named events written");
    assert_eq!(summary.sessions_ended.get("budget_exceeded"), Some(&1));
    // What was decoded but not written is a loss, on the session's end and in the summary.
    let unwritten = ended["unwritten_events"].as_u64().expect("unwritten_events");
    assert!(unwritten > 0, "{ended}");
    let written = lines.iter().filter(|l| is(l, "dotnet_event", bad)).count() as u64;
    assert!(written + unwritten <= u64::from(EMPTY_EVENTS + NAMED_EVENTS), "{ended}");
    assert_eq!(summary.unwritten_over_budget, unwritten);
    let last = lines.last().unwrap();
    let loss = last["losses"].as_array().unwrap().iter().find(|l| l["reason"] == "budget_exceeded");
    assert_eq!(
        loss,
        Some(
            &serde_json::json!({"source":"nettrace","reason":"budget_exceeded","count":unwritten})
        )
    );

    // The well-behaved runtime, traced at the same time, got every event and a normal end.
    let count = |event: &str| lines.iter().filter(|l| is_event(l, ok, event)).count();
    assert_eq!((count("GCStart"), count("GCEnd"), count("Tick")), (3, 3, 4));
    let good_end: Vec<&Value> = lines.iter().filter(|l| is(l, "session_ended", ok)).collect();
    assert_eq!(good_end.len(), 1);
    assert_eq!(good_end[0]["reason"], "stopped");
}

/// A stream cut for its budget while the runtime is blocked writing the rest of it (more than
/// the socket holds): tracer makes the runtime's writes fail at once, so the runtime answers
/// StopTracing and the session ends now — not after the IPC read timeout (10 minutes here)
/// that StopTracing waited for while the runtime's writer held the session.
#[test]
fn a_stream_cut_for_its_budget_does_not_wait_for_a_blocked_runtime() {
    let mut config = run_config(
        "Microsoft-Windows-DotNETRuntime:0x1:4,Amplifier",
        SessionMode::Streaming,
        Duration::from_secs(10),
        1024,
    );
    config.session.timeouts.read = Duration::from_secs(600);
    let mut tracer = start_run(READY, config);
    let tmp = ScratchDir::new("hostile-amplify-blocked");
    let mut hostile = Dotnet10Double::spawn(tmp.path()).expect("hostile double");
    let bad = hostile.pid();
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", bad));
    let id = started["session_id"].as_str().unwrap().to_owned();
    // 400 000 bytes of 2-byte events: far more than a Unix socket buffers.
    let (events, _) = hostile.amplify(&id, 0, 200_000).expect("amplify");
    assert_eq!(events, 0, "the double's writes failed once tracer cut the stream");
    let ended = tracer.wait_for("hostile session_ended", EVENTS, |l| is(l, "session_ended", bad));
    assert_eq!(ended["reason"], "budget_exceeded", "{ended}");
    tracer.stop();
}
