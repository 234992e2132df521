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
use tests::pipeline::{Running, is, is_event, run_config, start_run, u64_field};
use tests::scratch::ScratchDir;
use tests::user_events::tracefs_with_user_events;
use tracer::pipeline::run::{RunConfig, RunSummary};
use tracer::session::SessionMode;

/// One tracer at a time: a second tracer would attach its own session to the other test's
/// double and change the double's per-session counts.
static ONE_TRACER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// TCG emulation is slow: generous limits.
const TIMEOUT: Duration = Duration::from_secs(120);

/// A `tracer run` configuration of these tests: a 30 s locate window, a 1 MiB ftrace buffer.
fn config(providers: &str, mode: SessionMode) -> RunConfig {
    run_config(providers, mode, Duration::from_secs(30), 1024)
}

fn start(providers: &str, mode: SessionMode) -> Running<RunSummary> {
    start_run(TIMEOUT, config(providers, mode))
}

/// `tracer_<16 hex>_<pid>_<provider>`: a tracepoint tracer registered for `pid`.
fn is_tracer_name(name: &str, pid: u32) -> bool {
    let Some(rest) = name.strip_prefix("tracer_") else { return false };
    let Some((nonce, rest)) = rest.split_once('_') else { return false };
    nonce.len() == 16
        && nonce.bytes().all(|b| b.is_ascii_hexdigit())
        && rest.strip_prefix(&format!("{pid}_")).is_some_and(|p| !p.is_empty())
}

/// The `tracer_*` events in `events/user_events/` (the directory goes when its last event does).
fn tracer_events(tracefs: &std::path::Path) -> std::collections::BTreeSet<String> {
    let Ok(dir) = std::fs::read_dir(tracefs.join("events/user_events")) else {
        return Default::default();
    };
    dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("tracer_"))
        .collect()
}

/// Two doubles, each with its user_events session of `tracer` started: (hostile, victim).
fn hostile_and_victim(
    tracer: &mut Running<RunSummary>,
    tmpdir: &std::path::Path,
) -> (Dotnet10Double, Dotnet10Double) {
    let mut hostile = Dotnet10Double::spawn(tmpdir).expect("hostile double");
    let mut victim = Dotnet10Double::spawn(tmpdir).expect("victim double");
    for d in [&mut hostile, &mut victim] {
        let pid = d.pid();
        let started =
            tracer.wait_for("session_started", TIMEOUT, |l| is(l, "session_started", pid));
        assert_eq!(started["session"], "user_events", "{started}");
        d.expect_session_started(started["session_id"].as_str().unwrap()).expect("CT5");
    }
    (hostile, victim)
}

fn message(line: &Value) -> &str {
    line["fields"]["Message"].as_str().unwrap_or("")
}

/// The `user_events_data` fd is private to its session. A hostile runtime writing
/// every write index of its fd reaches only its own tracepoints (with one shared fd it wrote
/// into the other target's), and records written into its tracepoints by another process (its
/// forked child, through the inherited fd) are dropped and counted as `foreign_writer`.
#[test]
fn a_runtime_cannot_write_into_another_targets_session() {
    let _serial = ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner());
    const N: u32 = 20;
    const FOREIGN: u32 = 7;
    tracefs_with_user_events();
    let mut tracer = start("Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble", SessionMode::Auto);
    let tmp = ScratchDir::new("vm-run-ue-forge");
    let (mut hostile, mut victim) = hostile_and_victim(&mut tracer, tmp.path());
    let (hostile_pid, victim_pid) = (hostile.pid(), victim.pid());

    assert!(hostile.forge(2).expect("forge") > 0, "the hostile double wrote nothing");
    let (foreign, child) = hostile.fork_write(FOREIGN).expect("fork_write");
    assert_eq!(foreign, u64::from(FOREIGN), "the child wrote through the inherited fd");
    assert_ne!(child, hostile_pid);
    assert_eq!(victim.emit(N).expect("emit"), (u64::from(N), 0));
    tracer.wait_for_count("victim Tick", TIMEOUT, N as usize, |l| is_event(l, victim_pid, "Tick"));
    // The hostile double's own (forged) records come after its child's: once they are read,
    // so are the child's.
    tracer.wait_for("hostile forged Tick", TIMEOUT, |l| {
        is_event(l, hostile_pid, "Tick") && message(l).starts_with("forged")
    });

    let (lines, summary) = tracer.stop();
    let victim_ticks: Vec<&str> =
        lines.iter().filter(|l| is_event(l, victim_pid, "Tick")).map(message).collect();
    let expected: Vec<String> = (1..=N).map(|k| format!("tick {k}")).collect();
    assert_eq!(victim_ticks, expected, "exactly the victim's own events");
    assert!(
        !lines
            .iter()
            .any(|l| l["pid"] == victim_pid && l["kind"] == "dotnet_event" && l["event"] != "Tick"),
        "nothing else attributed to the victim"
    );
    let foreign_lines: Vec<&Value> =
        lines.iter().filter(|l| message(l).starts_with("foreign")).collect();
    assert!(foreign_lines.is_empty(), "records of another process written: {foreign_lines:?}");
    assert_eq!(summary.user_events_foreign_writer, u64::from(FOREIGN));
    assert!(summary.losses().iter().any(|l| l.source == "user_events"
        && l.reason == "foreign_writer"
        && l.count == u64::from(FOREIGN)));
    let ended = lines.iter().find(|l| is(l, "session_ended", hostile_pid)).expect("hostile end");
    assert_eq!(ended["foreign_writer"], FOREIGN, "its session_ended says so too: {ended}");
    hostile.exit().expect("hostile exits (and kills its child)");
}

/// Tracepoint names are unpredictable (two tracers of one process get different
/// names, none derived from tracer's pid), and once a target's sessions end, tracefs is back to
/// where it was — while the tracers keep running (a shared `user_events_data` kept every event
/// referenced until tracer exited).
#[test]
fn names_are_unpredictable_and_finished_sessions_leave_no_tracepoints() {
    let _serial = ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner());
    let tracefs = tracefs_with_user_events();
    let baseline = tracer_events(&tracefs);
    let providers = "Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble";
    let mut tracers = [start(providers, SessionMode::Auto), start(providers, SessionMode::Auto)];
    let tmp = ScratchDir::new("vm-run-ue-names");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    for t in &mut tracers {
        let started = t.wait_for("session_started", TIMEOUT, |l| is(l, "session_started", pid));
        assert_eq!(started["session"], "user_events", "{started}");
    }
    let names: Vec<String> = tracer_events(&tracefs).difference(&baseline).cloned().collect();
    assert_eq!(names.len(), 4, "2 providers x 2 tracers, all distinct: {names:?}");
    assert!(names.iter().all(|n| is_tracer_name(n, pid)), "{names:?}");
    let predictable = format!("tracer_{}_{pid}_", std::process::id());
    assert!(!names.iter().any(|n| n.starts_with(&predictable)), "{names:?}");

    double.exit().expect("double exits");
    for t in &mut tracers {
        let ended = t.wait_for("session_ended", TIMEOUT, |l| is(l, "session_ended", pid));
        assert_eq!(ended["reason"], "process_exited", "{ended}");
    }
    // The kernel deletes unreferenced events from a workqueue: poll.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = tracer_events(&tracefs);
        if now == baseline {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tracepoints left after the sessions ended: {:?}",
            now.difference(&baseline).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for t in tracers {
        t.stop();
    }
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
    for field in ["foreign_writer", "undecodable", "unwritten_events", "buffer_lost"] {
        assert_eq!(ended[0][field], 0, "{field}: {}", ended[0]);
    }

    // Closing the connection ended the session in the runtime, which unregistered its
    // tracepoints; with tracer's registrations gone too, the kernel deletes the events.
    double.expect_session_ended(&id).expect("the double saw its session end");
    let status = tracefs.join("user_events_status");
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let text = std::fs::read_to_string(&status).expect("user_events_status");
        if !text.lines().any(|l| is_tracer_name(l.split(' ').next().unwrap_or(""), pid)) {
            break;
        }
        // The kernel deletes unreferenced events from a workqueue: poll its status file.
        assert!(Instant::now() < deadline, "tracepoints still registered:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(double.emit(1).expect("emit after the session"), (0, 0), "no session left");
}

/// Records written by threads that have exited before tracer reads them — a thread pool's
/// workers, created, writing and ended between two reads, so tracer never saw them alive — are
/// the process's (the kernel recorded each thread as it was created): every one is delivered
/// with its writer's thread id and the session's identity, none is counted foreign.
#[test]
fn records_of_writer_threads_that_have_exited_are_all_delivered() {
    let _serial = ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner());
    const THREADS: u32 = 2;
    const EACH: u32 = 250;
    tracefs_with_user_events();
    let mut tracer = start("Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble", SessionMode::Auto);
    let tmp = ScratchDir::new("vm-run-ue-threads");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let started = tracer.wait_for("session_started", TIMEOUT, |l| is(l, "session_started", pid));
    assert_eq!(started["session"], "user_events", "{started}");
    let id = started["session_id"].as_str().unwrap().to_owned();
    double.expect_session_started(&id).expect("CT5");

    let (written, tids) = double.threads(THREADS, EACH).expect("threads");
    assert_eq!(written, u64::from(THREADS * EACH));
    // Python's join returns once a thread's last Python code ran; its kernel task ends a moment
    // later (seen under qemu TCG): awaited, so the records read are of threads already gone.
    let ended = |tid: &u32| !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists();
    let deadline = Instant::now() + TIMEOUT;
    while !tids.iter().all(ended) {
        assert!(Instant::now() < deadline, "writers {tids:?} never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    let total = (THREADS * EACH) as usize;
    tracer.wait_for_count("the threads' Ticks", TIMEOUT, total, |l| is_event(l, pid, "Tick"));
    let (lines, summary) = tracer.stop();
    let ticks: Vec<&Value> = lines.iter().filter(|l| is_event(l, pid, "Tick")).collect();
    assert_eq!(ticks.len(), total, "every record of the ended threads");
    for (i, tid) in tids.iter().enumerate() {
        let mine: Vec<&str> =
            ticks.iter().filter(|t| t["thread"] == *tid).map(|t| message(t)).collect();
        let want: Vec<String> = (1..=EACH).map(|k| format!("thread {i} tick {k}")).collect();
        assert_eq!(mine, want, "thread {i} ({tid})");
    }
    for t in &ticks {
        assert_eq!(
            (&t["session_id"], &t["process_start_ns"]),
            (&started["session_id"], &started["process_start_ns"]),
            "{t}"
        );
    }
    assert_eq!(summary.user_events_foreign_writer, 0);
    assert_eq!(summary.losses(), vec![], "nothing lost anywhere");
    let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
    assert_eq!(ended["foreign_writer"], 0, "{ended}");
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

/// Output amplification: a runtime whose records render far more output than their bytes (an event name
/// of 1 000 control characters, each escaped to 6 bytes, named by records of 15 bytes) ends its
/// own session with `budget_exceeded`, its unwritten records counted in its `session_ended` and
/// the summary; another target traced at the same time loses nothing.
#[test]
fn a_user_events_session_past_its_budget_ends_and_other_sessions_lose_nothing() {
    let _serial = ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner());
    const RECORDS: u32 = 2000;
    const N: u32 = 50;
    tracefs_with_user_events();
    let mut tracer = start("Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble", SessionMode::Auto);
    let tmp = ScratchDir::new("vm-run-ue-budget");
    let (mut hostile, mut victim) = hostile_and_victim(&mut tracer, tmp.path());
    let (hostile_pid, victim_pid) = (hostile.pid(), victim.pid());

    let written = hostile.ue_amplify(RECORDS).expect("ue_amplify");
    let ended =
        tracer.wait_for("hostile session_ended", TIMEOUT, |l| is(l, "session_ended", hostile_pid));
    assert_eq!(ended["reason"], "budget_exceeded", "{ended}");
    assert_eq!(victim.emit(N).expect("emit"), (u64::from(N), 0));
    tracer.wait_for_count("victim Tick", TIMEOUT, N as usize, |l| is_event(l, victim_pid, "Tick"));

    let (lines, summary) = tracer.stop();
    let amplified =
        lines.iter().filter(|l| is(l, "dotnet_event", hostile_pid) && l["id"] == 9).count() as u64;
    let unwritten = u64_field(&ended, "unwritten_events");
    assert!(amplified > 0 && unwritten > 0, "{amplified} written, {unwritten} not: {ended}");
    // Every record the double wrote while its tracepoint was enabled is either written or
    // counted; only the one write racing the disable at the session's end may not be recorded.
    assert!(
        (written.saturating_sub(1)..=written).contains(&(amplified + unwritten)),
        "{written} records written by the double, {amplified} lines + {unwritten} unwritten"
    );
    assert_eq!(ended["events"], amplified, "{ended}");
    for (field, count) in [("foreign_writer", 0), ("undecodable", 0), ("buffer_lost", 0)] {
        assert_eq!(ended[field], count, "{field}: {ended}");
    }
    assert_eq!(summary.sessions_ended.get("budget_exceeded"), Some(&1));
    assert_eq!(summary.user_events_over_budget, unwritten);
    assert_eq!(
        summary.losses().iter().map(|l| (l.source, l.reason, l.count)).collect::<Vec<_>>(),
        vec![("user_events", "budget_exceeded", unwritten)]
    );
    let victim_ticks: Vec<&str> =
        lines.iter().filter(|l| is_event(l, victim_pid, "Tick")).map(message).collect();
    let expected: Vec<String> = (1..=N).map(|k| format!("tick {k}")).collect();
    assert_eq!(victim_ticks, expected);
    let victim_end = lines.iter().find(|l| is(l, "session_ended", victim_pid)).expect("victim end");
    assert_eq!(victim_end["reason"], "stopped");
    assert_eq!(victim_end["unwritten_events"], 0, "{victim_end}");
    hostile.exit().expect("hostile exits");
}

/// The user_events lines of `user_events_status` (one per registered event, after the header).
fn registered_events(tracefs: &std::path::Path) -> usize {
    let status = std::fs::read_to_string(tracefs.join("user_events_status")).expect("status");
    status.lines().take_while(|l| !l.is_empty()).count()
}

/// Granting the `user_events_data` fd: it is granted by uid. A process of another user (nobody)
/// gets a streaming session by default and so has no fd to register (and pin) host-wide
/// user_events with; granted (`--user-events-uids all`), the same process can — which is what
/// the default prevents.
#[test]
fn user_events_fds_go_only_to_granted_uids() {
    use std::os::unix::fs::PermissionsExt as _;
    let _serial = ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner());
    const PINS: u32 = 5;
    let tracefs = tracefs_with_user_events();
    let tmp = ScratchDir::new("vm-run-ue-grant");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let providers = "Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble";

    let mut tracer = start(providers, SessionMode::Auto);
    let mut nobody = Dotnet10Double::spawn_as_nobody(tmp.path()).expect("double as nobody");
    let pid = nobody.pid();
    let started = tracer.wait_for("session_started", TIMEOUT, |l| is(l, "session_started", pid));
    assert_eq!(started["session"], "streaming", "{started}");
    nobody.expect_session_started(started["session_id"].as_str().unwrap()).expect("session");
    let before = registered_events(&tracefs);
    assert_eq!(nobody.pin(PINS).expect("pin"), 0, "no fd to register with");
    assert_eq!(registered_events(&tracefs), before);
    assert_eq!(nobody.emit(3).expect("emit"), (3, 0), "traced all the same, by streaming");
    tracer.wait_for_count("Tick", TIMEOUT, 3, |l| is_event(l, pid, "Tick"));
    nobody.exit().expect("double exits");
    tracer.stop();

    let mut config = config(providers, SessionMode::Auto);
    config.session.user_events_grant = tracer::session::UserEventsGrant::All;
    let mut tracer = tests::pipeline::start_run(TIMEOUT, config);
    let mut nobody = Dotnet10Double::spawn_as_nobody(tmp.path()).expect("double as nobody");
    let pid = nobody.pid();
    let started = tracer.wait_for("session_started", TIMEOUT, |l| is(l, "session_started", pid));
    assert_eq!(started["session"], "user_events", "{started}");
    nobody.expect_session_started(started["session_id"].as_str().unwrap()).expect("CT5");
    let before = registered_events(&tracefs);
    assert_eq!(nobody.pin(PINS).expect("pin"), u64::from(PINS), "granted: it registers");
    assert_eq!(registered_events(&tracefs), before + PINS as usize);
    nobody.exit().expect("double exits");
    tracer.stop();
}

/// `--stopping-event` on a user_events session: the record of the second tick ends the
/// session (the runtime's connection is closed, it unregisters), with reason `stopping_event`.
#[test]
fn a_stopping_event_ends_a_user_events_session() {
    let _serial = ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner());
    tracefs_with_user_events();
    let tmp = ScratchDir::new("vm-run-ue-stopping");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let mut config = config("Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble", SessionMode::Auto);
    config.target_pids = vec![pid];
    config.session.stopping_event = Some("TestDouble/Tick:Sequence=2".parse().unwrap());
    let mut tracer = tests::pipeline::start_run(TIMEOUT, config);
    let started = tracer.wait_for("session_started", TIMEOUT, |l| is(l, "session_started", pid));
    assert_eq!(started["session"], "user_events", "{started}");
    let id = started["session_id"].as_str().unwrap().to_owned();
    double.expect_session_started(&id).expect("CT5");
    assert_eq!(double.emit(3).expect("emit"), (3, 0));
    let ended = tracer.wait_for("session_ended", TIMEOUT, |l| is(l, "session_ended", pid));
    assert_eq!(ended["reason"], "stopping_event", "{ended}");
    double.expect_session_ended(&id).expect("the runtime saw its session end");
    let (lines, _) = tracer.stop();
    let ticks: Vec<&str> = lines.iter().filter(|l| is_event(l, pid, "Tick")).map(message).collect();
    assert_eq!(ticks, ["tick 1", "tick 2", "tick 3"], "written before the stop: all read");
}

/// `--nettrace-dir` on a user_events session: its records become a NetTrace file (metadata,
/// events, sequence point, end tag) that the project's parser reads back to the events of the
/// JSON lines — the same ids, threads and timestamps in the same order, the payload bytes the
/// runtime wrote — complete when the session ends.
#[test]
fn a_user_events_session_is_saved_as_a_nettrace_file() {
    let _serial = ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner());
    const TICKS: u32 = 20;
    tracefs_with_user_events();
    let tmp = ScratchDir::new("vm-run-ue-file");
    let files = ScratchDir::new("vm-run-ue-files");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let mut config = config("Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble", SessionMode::Auto);
    config.target_pids = vec![pid];
    config.session.nettrace_dir = Some(files.path().to_owned());
    let mut tracer = tests::pipeline::start_run(TIMEOUT, config);
    let started = tracer.wait_for("session_started", TIMEOUT, |l| is(l, "session_started", pid));
    assert_eq!(started["session"], "user_events", "{started}");
    double.expect_session_started(started["session_id"].as_str().unwrap()).expect("CT5");
    assert_eq!(double.emit(TICKS).expect("emit"), (u64::from(TICKS), 0));
    double.gc(3).expect("gc");
    tracer.wait_for_count("GCEnd", TIMEOUT, 3, |l| is_event(l, pid, "GCEnd"));
    let (lines, summary) = tracer.stop();

    let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
    assert_eq!(ended["nettrace_file_complete"], true, "{ended}");
    let path = ended["nettrace_file"].as_str().unwrap();
    let bytes = std::fs::read(path).expect("the file");
    assert_eq!(ended["nettrace_file_bytes"], bytes.len());
    let mut parser = tracer_decode::nettrace::NettraceParser::default();
    let mut events = Vec::new();
    parser
        .feed(&bytes, |ev| {
            let d = ev.decode();
            events.push((
                d.id,
                ev.thread_id,
                ev.timestamp,
                d.provider.to_owned(),
                ev.payload.to_vec(),
            ));
        })
        .expect("the file parses");
    assert_eq!(parser.finish(), Ok(()), "it ends with the end tag");
    assert_eq!(parser.stats().lost_events, 0);
    let json: Vec<(u64, u64, i64)> = lines
        .iter()
        .filter(|l| is(l, "dotnet_event", pid))
        .map(|l| {
            (l["id"].as_u64().unwrap(), u64_field(l, "thread"), l["timestamp"].as_i64().unwrap())
        })
        .collect();
    let file: Vec<(u64, u64, i64)> =
        events.iter().map(|(id, thread, ts, _, _)| (u64::from(*id), *thread, *ts)).collect();
    assert_eq!(file, json, "the same events, in the same order");
    assert_eq!(json.len(), TICKS as usize + 6);
    let ticks: Vec<&Vec<u8>> =
        events.iter().filter(|e| e.3 == "TestDouble").map(|e| &e.4).collect();
    let expected: Vec<Vec<u8>> = (1..=TICKS as i32)
        .map(|k| {
            let mut p = k.to_le_bytes().to_vec();
            p.extend(format!("tick {k}").encode_utf16().chain([0]).flat_map(u16::to_le_bytes));
            p
        })
        .collect();
    assert_eq!(ticks, expected.iter().collect::<Vec<_>>(), "the payload bytes the runtime wrote");
    assert_eq!(summary.nettrace_files_complete, 1);
    double.exit().expect("double exits");
}
