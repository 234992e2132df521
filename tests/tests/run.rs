//! `tracer run` end to end on the real kernel (root): live detection → diagnostic IPC session →
//! nettrace decoding → JSON lines, against a real CoreCLR 8.0.4, the .NET 10 test double and a
//! runtime inside pid + mount namespaces. Other tests run in parallel, so every assertion is
//! about the processes this test started.
use std::io::Read as _;
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::coreclr::CoreclrHost;
use tests::double::Dotnet10Double;
use tests::pipeline::{
    Running, count, is, is_event, run_config, start_run, u64_field, with_providers,
};
use tests::process::{line_channel, tracer_binary, wait_child_exit};
use tests::scratch::ScratchDir;
use tracer::ipc::client::Timeouts;
use tracer::pipeline::run::{self, RunConfig, RunSummary};
use tracer::session::SessionMode;

const READY: Duration = Duration::from_secs(60);
/// CoreCLR start-up and first flush on a loaded 2-core machine.
const SESSION: Duration = Duration::from_secs(120);
const EVENTS: Duration = Duration::from_secs(30);

fn config(providers: &str) -> RunConfig {
    run_config(providers, SessionMode::Auto, Duration::from_secs(10), 1024)
}

fn start(config: RunConfig) -> Running<RunSummary> {
    start_run(READY, config)
}

#[test]
fn real_coreclr_gc_session_reports_exactly_the_induced_gcs_and_leaves_the_runtime_healthy() {
    const N: u32 = 5;
    let mut tracer = start(config("Microsoft-Windows-DotNETRuntime:0x1:4"));
    let tmp = ScratchDir::new("run-coreclr");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR host");
    let pid = host.host_pid;

    let seen = tracer.wait_for("runtime detection", SESSION, |l| is(l, "dotnet_runtime_seen", pid));
    assert_eq!(seen["memfd"], "doublemapper");
    assert_eq!(seen["source"], "kernel");
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    assert_eq!(started["command"], "CollectTracing2 (0x0203)");
    assert!(started["runtime_version"].as_str().unwrap().starts_with("8.0.4"), "{started}");

    let before = host.gc(0).expect("gc 0");
    let after = host.gc(N).expect("induce GCs");
    assert_eq!(after, before + u64::from(N));
    let gcs = tracer.wait_for_count("induced GCStart", EVENTS, N as usize, |l| {
        is_event(l, pid, "GCStart") && l["fields"]["Reason"] == "Induced"
    });

    let (lines, summary) = tracer.stop();
    let starts: Vec<&Value> = lines.iter().filter(|l| is_event(l, pid, "GCStart")).collect();
    assert_eq!(starts.len(), N as usize, "exactly the induced GCs: {starts:?}");
    assert_eq!(gcs.len(), N as usize);
    let counts: Vec<u64> = starts.iter().map(|l| u64_field(&l["fields"], "Count")).collect();
    let expected: Vec<u64> = (before + 1..=after).collect();
    assert_eq!(counts, expected, "GC counts are the runtime's, increasing by one");
    for l in &starts {
        assert_eq!(l["provider"], "Microsoft-Windows-DotNETRuntime");
        assert_eq!(l["id"], 1);
        assert_eq!(l["fields"]["Reason"], "Induced");
    }
    let ended: Vec<&Value> = lines.iter().filter(|l| is(l, "session_ended", pid)).collect();
    assert_eq!(ended.len(), 1, "one session end: {ended:?}");
    assert_eq!(ended[0]["reason"], "stopped");
    assert_eq!(ended[0]["lost_events"], 0);
    assert!(summary.sessions_started >= 1);

    // StopTracing ended only the session: the runtime still runs managed code.
    assert_eq!(host.ping().expect("runtime healthy after the session"), after);
}

/// dotnet-trace's default profiles, `--profile dotnet-common,dotnet-sampled-thread-time`, with
/// rundown, on a real CoreCLR 8: the runtime accepts both providers, the induced GCs are exactly
/// the ones asked for, and every event of the runtime's own providers — thread samples and the
/// rundown at the end included — has its name and its fields from the runtime-event table: no
/// `EventID(n)`, no raw bytes, no decode error.
#[test]
fn dotnet_trace_default_profiles_with_rundown_name_and_decode_every_runtime_event() {
    const N: u32 = 3;
    let profiles = ["dotnet-common".to_string(), "dotnet-sampled-thread-time".to_string()];
    let providers = tracer::ipc::providers::profiles(&profiles).expect("profiles");
    let mut config = with_providers(config("Microsoft-Windows-DotNETRuntime:0x1:4"), providers);
    config.session.request.rundown_keyword = tracer_decode::diagnostic_ipc::DEFAULT_RUNDOWN_KEYWORD;
    let mut tracer = start(config);
    let tmp = ScratchDir::new("run-coreclr-profiles");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR host");
    let pid = host.host_pid;
    tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    let before = host.gc(0).expect("gc 0");
    assert_eq!(host.gc(N).expect("induce GCs"), before + u64::from(N));
    tracer.wait_for_count("induced GCStart", EVENTS, N as usize, |l| {
        is_event(l, pid, "GCStart") && l["fields"]["Reason"] == "Induced"
    });
    tracer.wait_for("a thread sample", EVENTS, |l| is_event(l, pid, "ThreadSample"));
    let (lines, _) = tracer.stop();
    let induced =
        count(&lines, |l| is_event(l, pid, "GCStart") && l["fields"]["Reason"] == "Induced");
    assert_eq!(induced, N as usize);
    let ended: Vec<&Value> = lines.iter().filter(|l| is(l, "session_ended", pid)).collect();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0]["reason"], "stopped");
    assert_eq!(ended[0]["unrequested_events"], 0, "rundown events are asked for by keyword");

    assert_runtime_events_named_with_samples_and_rundown(&lines, pid);
}

/// tracer's own `default` profile (the runtime's default keywords) with thread samples and
/// rundown: every runtime event named and decoded, as with dotnet-trace's profiles.
#[test]
fn the_default_profile_with_rundown_names_and_decodes_every_runtime_event() {
    let names = ["default".to_string(), "dotnet-sampled-thread-time".to_string()];
    let providers = tracer::ipc::providers::profiles(&names).expect("default");
    let mut config = with_providers(config("Microsoft-Windows-DotNETRuntime:0x1:4"), providers);
    config.session.request.rundown_keyword = tracer_decode::diagnostic_ipc::DEFAULT_RUNDOWN_KEYWORD;
    let mut tracer = start(config);
    let tmp = ScratchDir::new("run-coreclr-default");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR host");
    let pid = host.host_pid;
    tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    host.gc(2).expect("induce GCs");
    tracer.wait_for("a thread sample", EVENTS, |l| is_event(l, pid, "ThreadSample"));
    let (lines, _) = tracer.stop();
    assert_runtime_events_named_with_samples_and_rundown(&lines, pid);
}

/// Every event of `pid` from the runtime's own providers has its name and decoded fields (no
/// `EventID(n)`, raw bytes or decode error); thread samples have a type and a stack; the
/// rundown names methods and modules, then ends.
fn assert_runtime_events_named_with_samples_and_rundown(lines: &[Value], pid: u32) {
    let runtime_events: Vec<&Value> = lines
        .iter()
        .filter(|l| is(l, "dotnet_event", pid))
        .filter(|l| {
            let provider = l["provider"].as_str().unwrap();
            provider.starts_with("Microsoft-Windows-DotNETRuntime")
                || provider == "Microsoft-DotNETCore-SampleProfiler"
        })
        .collect();
    for l in &runtime_events {
        let name = l["event"].as_str().unwrap();
        assert!(!name.starts_with("EventID("), "an unnamed runtime event: {l}");
        assert!(l.get("decode_error").is_none(), "undecodable: {l}");
        let fields = l["fields"].as_object().unwrap();
        assert!(!fields.contains_key("raw_payload") && !fields.contains_key("raw_tail"), "{l}");
    }
    let samples: Vec<&Value> =
        runtime_events.iter().copied().filter(|l| l["event"] == "ThreadSample").collect();
    assert!(!samples.is_empty());
    for s in &samples {
        assert!(["External", "Managed"].contains(&s["fields"]["Type"].as_str().unwrap()), "{s}");
        assert!(s["stack_id"].as_u64().unwrap() > 0, "a sample names its stack: {s}");
        assert!(s["stack"].as_array().is_some_and(|frames| !frames.is_empty()), "its frames: {s}");
    }
    // The rundown at the end names the methods and modules for symbolization.
    let rundown = |event: &str| {
        count(lines, |l| {
            is_event(l, pid, event) && l["provider"] == "Microsoft-Windows-DotNETRuntimeRundown"
        })
    };
    assert!(rundown("MethodDCEndVerbose") > 100, "methods of the rundown");
    assert!(rundown("ModuleDCEnd") > 0 && rundown("DCEndComplete") == 1, "modules, then the end");
}

#[test]
fn dotnet10_double_is_discovered_live_through_dotnet_ipc_created_and_traced() {
    let mut tracer = start(config("Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble"));
    let tmp = ScratchDir::new("run-double");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();

    let ready = tracer.wait_for("dotnet_ipc_ready", SESSION, |l| is(l, "dotnet_ipc_ready", pid));
    assert_eq!(ready["memfd"], "dotnet_ipc_created");
    assert_eq!(ready["source"], "kernel");
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    assert_eq!(started["runtime_version"], "10.0.0+test-double");
    // This host kernel has no user_events: auto mode chose a streaming session.
    assert_eq!(started["session"], "streaming");
    assert_eq!(started["command"], "CollectTracing2 (0x0203)");
    let id = started["session_id"].as_str().unwrap();
    assert_eq!(double.expect_session_started(id).expect("double saw the session"), "streaming");

    double.gc(3).expect("gc 3");
    double.emit(4).expect("emit 4");
    tracer.wait_for_count("GCStart", EVENTS, 3, |l| is_event(l, pid, "GCStart"));
    let ticks = tracer.wait_for_count("Tick", EVENTS, 4, |l| is_event(l, pid, "Tick"));
    for (i, t) in ticks.iter().enumerate() {
        assert_eq!(t["provider"], "TestDouble");
        assert_eq!(t["fields"]["Sequence"], i as u64 + 1);
        assert_eq!(t["fields"]["Message"], format!("tick {}", i + 1));
    }

    let (lines, _) = tracer.stop();
    assert_eq!(count(&lines, |l| is_event(l, pid, "GCStart")), 3);
    assert_eq!(count(&lines, |l| is_event(l, pid, "GCEnd")), 3);
    assert_eq!(count(&lines, |l| is_event(l, pid, "Tick")), 4);
    let ended: Vec<&Value> = lines.iter().filter(|l| is(l, "session_ended", pid)).collect();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0]["reason"], "stopped");
    double.expect_session_ended(id).expect("double saw StopTracing");
}

#[test]
fn process_exiting_mid_session_ends_its_session_once() {
    let mut tracer = start(config("Microsoft-Windows-DotNETRuntime:0x1:4"));
    let tmp = ScratchDir::new("run-exit");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    double.gc(1).expect("gc 1");
    tracer.wait_for("GCStart", EVENTS, |l| is_event(l, pid, "GCStart"));

    double.exit().expect("double exits");
    let ended = tracer.wait_for("session_ended", EVENTS, |l| is(l, "session_ended", pid));
    assert_eq!(ended["reason"], "process_exited");
    assert!(ended["error"].as_str().unwrap().contains("without the end-of-stream tag"), "{ended}");

    let (lines, summary) = tracer.stop();
    assert_eq!(count(&lines, |l| is(l, "session_ended", pid)), 1, "reported once");
    assert_eq!(count(&lines, |l| is(l, "session_failed", pid)), 0);
    assert!(summary.sessions_ended["process_exited"] >= 1);
}

#[test]
fn runtime_in_pid_and_mount_namespaces_with_private_tmp_is_traced_from_the_host() {
    let mut tracer = start(config("Microsoft-Windows-DotNETRuntime:0x1:4"));
    let mut host = CoreclrHost::spawn_in_namespaces("/tmp/app-tmp", true).expect("namespaced host");
    let pid = host.host_pid;
    assert_ne!(pid, host.ns_pid, "the runtime has its own pid namespace");

    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    assert!(started["runtime_version"].as_str().unwrap().starts_with("8.0.4"));
    host.gc(2).expect("gc 2");
    tracer.wait_for_count("induced GCStart", EVENTS, 2, |l| {
        is_event(l, pid, "GCStart") && l["fields"]["Reason"] == "Induced"
    });
    let (lines, _) = tracer.stop();
    assert_eq!(count(&lines, |l| is_event(l, pid, "GCStart")), 2);
    assert_eq!(count(&lines, |l| is(l, "session_ended", pid) && l["reason"] == "stopped"), 1);
    host.ping().expect("runtime healthy");
}

/// Hostile owners of "runtime" sockets (each maps `dotnet_ipc_created`, so detection picks it
/// up): (a) garbage replies, (b) a 60 KB announcement with 10 bytes, (c) silence, (d) a symlink to
/// another socket, (e) a socket bound by a different process. Each gets a clear
/// `session_failed` after its detection (the error names the timer that ran out, if one did),
/// nothing is ever sent to (d)'s target or (e)'s squatter, and a well-behaved runtime started
/// alongside them is traced as usual.
#[test]
fn hostile_peers_fail_clearly_within_the_timeout_and_other_targets_are_still_traced() {
    const BIN: &str = env!("CARGO_BIN_EXE_hostile_peer");
    const IPC_TIMEOUT: Duration = Duration::from_secs(1);
    use tests::peer::HostilePeer;
    let mut cfg = config("Microsoft-Windows-DotNETRuntime:0x1:4");
    cfg.session.timeouts = Timeouts { connect: IPC_TIMEOUT, write: IPC_TIMEOUT, read: IPC_TIMEOUT };
    cfg.session.locate_for = Duration::from_secs(20);
    let mut tracer = start(cfg);

    let dir = ScratchDir::new("run-hostile");
    let victim_dir = ScratchDir::new("run-hostile-victim");
    let victim_path = victim_dir.path().join("victim.sock");
    let mut victim =
        HostilePeer::spawn(BIN, victim_dir.path(), &["listen", victim_path.to_str().unwrap()])
            .unwrap();
    let garbage = HostilePeer::spawn_with(BIN, dir.path(), &["garbage"], true).unwrap();
    let short = HostilePeer::spawn_with(BIN, dir.path(), &["short"], true).unwrap();
    let silent = HostilePeer::spawn_with(BIN, dir.path(), &["silent"], true).unwrap();
    let symlink =
        HostilePeer::spawn_with(BIN, dir.path(), &["symlink", victim_path.to_str().unwrap()], true)
            .unwrap();
    // (e): the detected process listens elsewhere; another process binds its runtime name.
    let elsewhere = dir.path().join("elsewhere.sock");
    let squatted =
        HostilePeer::spawn_with(BIN, dir.path(), &["listen", elsewhere.to_str().unwrap()], true)
            .unwrap();
    let mut squatter =
        HostilePeer::spawn(BIN, dir.path(), &["squat", &squatted.pid().to_string()]).unwrap();
    let good_dir = ScratchDir::new("run-hostile-good");
    let mut good = Dotnet10Double::spawn(good_dir.path()).expect("double");

    // The failure, which must follow the process's first detection: the bind of its socket,
    // where it binds one under its own runtime name (the session starts from that line, and
    // may fail before the memfd is even mapped), else the memfd mapping.
    let failure = |tracer: &mut Running<RunSummary>, pid: u32| -> Value {
        let detected = tracer.wait_for("detection", SESSION, |l| {
            is(l, "dotnet_ipc_socket", pid) || is(l, "dotnet_ipc_ready", pid)
        });
        let failed = tracer.wait_for("session_failed", SESSION, |l| is(l, "session_failed", pid));
        assert!(u64_field(&failed, "mono_ns") >= u64_field(&detected, "mono_ns"), "{failed}");
        failed
    };
    let error = |l: &Value| l["error"].as_str().unwrap().to_owned();

    let f = failure(&mut tracer, garbage.pid());
    assert!(
        error(&f).contains("invalid reply to ProcessInfo3") && error(&f).contains("bad magic"),
        "{f}"
    );
    assert_eq!(f["refused"], false);

    let f = failure(&mut tracer, short.pid());
    assert!(error(&f).contains("timed out after 1s while reading the reply payload"), "{f}");

    let f = failure(&mut tracer, silent.pid());
    assert!(error(&f).contains("timed out after 1s while reading the reply header"), "{f}");

    let f = failure(&mut tracer, symlink.pid());
    assert_eq!(f["refused"], true);
    assert!(error(&f).contains("symbolic link"), "{f}");

    let f = failure(&mut tracer, squatted.pid());
    assert_eq!(f["refused"], true);
    assert!(
        error(&f).contains(&format!(
            "belongs to pid {}, not to the detected pid {}",
            squatter.pid(),
            squatted.pid()
        )),
        "{f}"
    );

    // The well-behaved runtime is traced despite the hostile ones.
    let pid = good.pid();
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    good.expect_session_started(started["session_id"].as_str().unwrap()).unwrap();
    good.gc(2).unwrap();
    tracer.wait_for_count("GCStart", EVENTS, 2, |l| is_event(l, pid, "GCStart"));

    let (lines, summary) = tracer.stop();
    assert_eq!(summary.sessions_refused, 2, "symlink and squatter");
    for hostile in [garbage.pid(), short.pid(), silent.pid(), symlink.pid(), squatted.pid()] {
        assert_eq!(
            count(&lines, |l| is(l, "session_failed", hostile)),
            1,
            "pid {hostile} reported once"
        );
        assert_eq!(count(&lines, |l| is(l, "session_started", hostile)), 0);
    }
    // Nothing ever reached the symlink's target; the squatter was connected to (to read its
    // credentials) but received no byte. (Tracers of tests running in parallel refuse it too,
    // so it may count more than one connection.)
    assert_eq!(victim.received(0).unwrap(), (0, 0));
    let (connections, bytes) = squatter.received(1).unwrap();
    assert!(connections >= 1);
    assert_eq!(bytes, 0, "not a byte may reach a socket bound by another process");
}

#[test]
fn without_user_events_forcing_user_events_sessions_fails_with_the_reason() {
    let tracefs = tracer::kernel::tracefs::Tracefs::find_or_mount().expect("tracefs");
    assert!(
        !tracer::kernel::user_events::UserEventsData::available(&tracefs),
        "this host test needs a kernel without user_events; the vm_* tests cover user_events"
    );
    let mut cfg = config("Microsoft-Windows-DotNETRuntime:0x1:4");
    cfg.session.mode = SessionMode::UserEvents;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sink = tracer::output::JsonLines::writer(std::io::sink());
    let err = rt.block_on(run::run(cfg, sink, async {}, None)).unwrap_err();
    assert_eq!(
        format!("{err:#}"),
        format!(
            "--session user-events: this kernel has no user_events ({}/user_events_data is \
             missing: CONFIG_USER_EVENTS is off); use --session streaming or auto",
            tracefs.root().display()
        )
    );
}

/// A pseudo-terminal: (master, slave).
fn open_pty() -> (std::fs::File, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: out-pointers to two ints; no name, termios or window size.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both fds were just opened and are owned by nobody else.
    unsafe { (std::fs::File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// What the terminal shows, chunk by chunk, until every writer closed it.
fn terminal_output(mut master: std::fs::File) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // EIO once the last slave fd is closed.
        while let Ok(n @ 1..) = master.read(&mut buf) {
            if tx.send(String::from_utf8_lossy(&buf[..n]).into_owned()).is_err() {
                break;
            }
        }
    });
    rx
}

/// The live status lines in `screen` (each starts by clearing the line), parsed as
/// (processes, sessions, events/s, lost). Only lines already followed by another clear are
/// complete.
fn status_lines(screen: &str) -> Vec<[u64; 4]> {
    let segments: Vec<&str> = screen.split("\r\x1b[2K").collect();
    let complete = &segments[1..segments.len().saturating_sub(1).max(1)];
    complete
        .iter()
        .filter_map(|s| {
            let s = s.strip_prefix("tracer: ")?;
            let n: Vec<u64> =
                s.split(" | ").map(|f| f.split(' ').next()?.parse().ok()).collect::<Option<_>>()?;
            let labels: Vec<&str> =
                s.split(" | ").filter_map(|f| f.split_once(' ')).map(|f| f.1).collect();
            assert_eq!(labels, ["processes", "sessions", "events/s", "lost"], "status line {s:?}");
            n.try_into().ok()
        })
        .collect()
}

#[test]
fn on_a_terminal_a_live_status_line_counts_processes_sessions_events_and_losses() {
    let tmp = ScratchDir::new("run-tty");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let (master, slave) = open_pty();
    // --pid: runtimes of tests running in parallel are left alone.
    let mut tracer = Command::new(tracer_binary())
        .args(["run", "--pid", &pid.to_string(), "--providers", "TestDouble"])
        .env("TRACER_LOG", "off")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    let stdout = line_channel(tracer.stdout.take().unwrap());
    let terminal = terminal_output(master);
    let next_json = |what: &str, pred: &dyn Fn(&Value) -> bool| loop {
        let line = stdout.recv_timeout(SESSION).unwrap_or_else(|_| panic!("no {what}"));
        let v: Value = serde_json::from_str(&line).unwrap();
        if pred(&v) {
            return v;
        }
    };
    next_json("session_started", &|v| is(v, "session_started", pid));
    double.emit(5).expect("emit 5");
    for _ in 0..5 {
        next_json("Tick", &|v| is_event(v, pid, "Tick"));
    }

    // Refreshed every second: wait until the events/s of the lines add up to the five events.
    let mut screen = String::new();
    let deadline = Instant::now() + EVENTS;
    let lines = loop {
        let lines = status_lines(&screen);
        if lines.iter().map(|l| l[2]).sum::<u64>() == 5 {
            break lines;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = terminal.recv_timeout(left).unwrap_or_else(|_| panic!("status: {screen:?}"));
        screen.push_str(&chunk);
    };
    let last = lines.last().unwrap();
    assert_eq!((last[0], last[1], last[3]), (1, 1, 0), "processes, sessions, lost: {screen:?}");

    // SAFETY: signalling our own child.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    assert!(wait_child_exit(&mut tracer, SESSION).success());
    screen.extend(terminal.iter());
    // The status line is cleared before the summary is printed.
    let after_last_clear = screen.rsplit("\r\x1b[2K").next().unwrap();
    assert!(after_last_clear.starts_with("tracer run summary:"), "{after_last_clear:?}");
}

/// `--stopping-event TestDouble/Tick:Sequence=3`: the session stops after the third tick
/// (StopTracing reaches the runtime), the ticks before it are all there, and the process is
/// not traced again.
#[test]
fn a_stopping_event_ends_the_session_after_it() {
    let tmp = ScratchDir::new("run-stopping");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let mut cfg = config("Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble");
    cfg.target_pids = vec![pid];
    cfg.session.stopping_event = Some("TestDouble/Tick:Sequence=3".parse().unwrap());
    let mut tracer = start(cfg);
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    let id = started["session_id"].as_str().unwrap().to_owned();
    double.expect_session_started(&id).expect("double saw the session");
    double.gc(1).expect("gc");
    double.emit(5).expect("emit 5");
    let ended = tracer.wait_for("session_ended", EVENTS, |l| is(l, "session_ended", pid));
    assert_eq!(ended["reason"], "stopping_event", "{ended}");
    double.expect_session_ended(&id).expect("StopTracing reached the runtime");
    assert_eq!(double.emit(2).expect("emit after"), (0, 0), "no session left in the runtime");
    let (lines, summary) = tracer.stop();
    let ticks: Vec<u64> = lines
        .iter()
        .filter(|l| is_event(l, pid, "Tick"))
        .map(|l| u64_field(&l["fields"], "Sequence"))
        .collect();
    // The double wrote all five before tracer's StopTracing: in flight, they still arrive.
    assert_eq!(ticks, [1, 2, 3, 4, 5]);
    assert_eq!(count(&lines, |l| is(l, "session_started", pid)), 1, "not traced again");
    assert_eq!(summary.sessions_ended.get("stopping_event"), Some(&1));
}

/// A real CoreCLR 8.0.4 with `--stopping-event Microsoft-Windows-DotNETRuntime/GCStart:Reason=Induced`:
/// the first induced GC ends the session, and the runtime goes on running.
#[test]
fn a_stopping_event_ends_a_real_runtimes_session() {
    let tmp = ScratchDir::new("run-stopping-coreclr");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR host");
    let pid = host.host_pid;
    let mut cfg = config("Microsoft-Windows-DotNETRuntime:0x1:4");
    cfg.target_pids = vec![pid];
    cfg.session.stopping_event =
        Some("Microsoft-Windows-DotNETRuntime/GCStart:Reason=Induced".parse().unwrap());
    let mut tracer = start(cfg);
    tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    let before = host.gc(0).expect("gc 0");
    host.gc(1).expect("one induced GC");
    let ended = tracer.wait_for("session_ended", EVENTS, |l| is(l, "session_ended", pid));
    assert_eq!(ended["reason"], "stopping_event", "{ended}");
    assert_eq!(host.gc(2).expect("GCs after the session"), before + 3, "the runtime goes on");
    let (lines, _) = tracer.stop();
    let induced: Vec<u64> = lines
        .iter()
        .filter(|l| is_event(l, pid, "GCStart") && l["fields"]["Reason"] == "Induced")
        .map(|l| u64_field(&l["fields"], "Count"))
        .collect();
    assert_eq!(induced, [before + 1], "the GCs after the session are not traced");
}

/// `--profile gc-collect` asks for dotnet-trace's GC-only rundown: a .NET 10 runtime (the double)
/// gets it with CollectTracing4; a real CoreCLR 8, which cannot be asked for a rundown mask, is
/// traced without rundown (CollectTracing2), its induced GCs exactly.
#[test]
fn gc_collect_asks_for_the_gc_rundown_where_the_runtime_can_give_it() {
    let names = ["gc-collect".to_string()];
    let providers = tracer::ipc::providers::profiles(&names).expect("gc-collect");
    let tmp = ScratchDir::new("run-gc-collect");
    let mut net10 = Dotnet10Double::spawn(tmp.path()).expect("double");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR host");
    let mut cfg = with_providers(config("Microsoft-Windows-DotNETRuntime:0x1:4"), providers);
    cfg.session.request.rundown_keyword = tracer::ipc::providers::profiles_rundown_keyword(&names);
    cfg.target_pids = vec![net10.pid(), host.host_pid];
    let mut tracer = start(cfg);
    let started =
        tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", net10.pid()));
    assert_eq!(started["command"], "CollectTracing4 (0x0205)");
    net10.expect_session_started(started["session_id"].as_str().unwrap()).expect("CT4");
    let pid = host.host_pid;
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    assert_eq!(started["command"], "CollectTracing2 (0x0203)");
    let before = host.gc(0).expect("gc 0");
    assert_eq!(host.gc(2).expect("induce GCs"), before + 2);
    let induced = |l: &Value| is_event(l, pid, "GCStart") && l["fields"]["Reason"] == "Induced";
    tracer.wait_for_count("induced GCStart", EVENTS, 2, induced);
    let (lines, _) = tracer.stop();
    assert_eq!(count(&lines, induced), 2);
    let rundown = |l: &Value| {
        is(l, "dotnet_event", pid) && l["provider"] == "Microsoft-Windows-DotNETRuntimeRundown"
    };
    assert_eq!(count(&lines, rundown), 0, "no rundown was asked of .NET 8");
    for pid in [net10.pid(), pid] {
        let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
        assert_eq!(ended["reason"], "stopped", "{ended}");
    }
}

/// `--buffering-mode block` (CollectTracing6): a .NET 11 runtime (the double reporting 11.0.0)
/// gets a lossless session and is traced; a .NET 10 one cannot give one, and its session fails
/// saying why.
#[test]
fn block_buffering_uses_collect_tracing6_and_refuses_older_runtimes() {
    use tracer_decode::diagnostic_ipc::BufferingMode;
    let tmp = ScratchDir::new("run-ct6-block");
    let mut net11 =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_VERSION", "11.0.0+test-double")])
            .expect("double 11");
    let net10 = Dotnet10Double::spawn(tmp.path()).expect("double 10");
    let mut cfg = config("Microsoft-Windows-DotNETRuntime:0x1:4");
    cfg.target_pids = vec![net11.pid(), net10.pid()];
    cfg.session.request.buffering_mode = Some(BufferingMode::Block);
    let mut tracer = start(cfg);
    let started =
        tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", net11.pid()));
    assert_eq!(started["command"], "CollectTracing6 (0x0207)");
    assert_eq!(started["session"], "streaming");
    let id = started["session_id"].as_str().unwrap();
    assert_eq!(net11.expect_session_started(id).expect("CT6"), "streaming block");
    net11.gc(2).expect("gc");
    tracer.wait_for_count("GCStart", EVENTS, 2, |l| is_event(l, net11.pid(), "GCStart"));
    let failed =
        tracer.wait_for("session_failed", SESSION, |l| is(l, "session_failed", net10.pid()));
    assert_eq!(
        failed["error"],
        "lossless (block) buffering needs CollectTracing6, which runtimes before .NET 11 lack \
         (.NET 10): use --buffering-mode drop, or leave it out"
    );
    let (lines, _) = tracer.stop();
    assert_eq!(count(&lines, |l| is_event(l, net11.pid(), "GCStart")), 2);
    assert_eq!(count(&lines, |l| is(l, "session_started", net10.pid())), 0);
}

/// `--buffering-mode drop`: CollectTracing6 with mode 0 where the runtime has it, the older
/// commands elsewhere (nothing is lost by falling back: they drop too).
#[test]
fn drop_buffering_falls_back_on_older_runtimes() {
    use tracer_decode::diagnostic_ipc::BufferingMode;
    let tmp = ScratchDir::new("run-ct6-drop");
    let mut net11 =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_VERSION", "11.0.0+test-double")])
            .expect("double 11");
    let mut net10 = Dotnet10Double::spawn(tmp.path()).expect("double 10");
    let mut cfg = config("Microsoft-Windows-DotNETRuntime:0x1:4");
    cfg.target_pids = vec![net11.pid(), net10.pid()];
    cfg.session.request.buffering_mode = Some(BufferingMode::Drop);
    let mut tracer = start(cfg);
    for (double, command, kind) in [
        (&mut net11, "CollectTracing6 (0x0207)", "streaming drop"),
        (&mut net10, "CollectTracing2 (0x0203)", "streaming"),
    ] {
        let pid = double.pid();
        let started =
            tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
        assert_eq!(started["command"], command);
        let id = started["session_id"].as_str().unwrap();
        assert_eq!(double.expect_session_started(id).expect("session"), kind);
        double.gc(1).expect("gc");
        tracer.wait_for_count("GCStart", EVENTS, 1, |l| is_event(l, pid, "GCStart"));
    }
    tracer.stop();
}
