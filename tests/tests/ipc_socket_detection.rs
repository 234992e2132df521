//! Runtimes found through their diagnostic server socket (docs/protocol/bpf-detection.md §3.4): live at `bind()` (a real
//! CoreCLR 8.0.4 with W^X off, which maps no `doublemapper`), by the start-up scan of
//! `/proc/<pid>/net/unix`, through `--pid`, and between `bind()` and `listen()`. Real kernel,
//! root; other tests run in parallel, so every assertion is about the processes started here.
use std::time::Duration;

use serde_json::Value;
use tests::coreclr::CoreclrHost;
use tests::double::Dotnet10Double;
use tests::pipeline::{Running, count, is, is_event, run_config, start_run, u64_field};
use tests::scratch::ScratchDir;
use tracer::pipeline::run::{RunConfig, RunSummary};
use tracer::session::SessionMode;

const READY: Duration = Duration::from_secs(60);
/// CoreCLR start-up and first flush on a loaded 2-core machine.
const SESSION: Duration = Duration::from_secs(120);
const EVENTS: Duration = Duration::from_secs(30);
const LOCATE: Duration = Duration::from_secs(10);
/// Locate window of the `--pid` test whose target never gets a socket.
const SHORT_LOCATE: Duration = Duration::from_secs(1);

fn config(providers: &str, locate_for: Duration) -> RunConfig {
    run_config(providers, SessionMode::Streaming, locate_for, 1024)
}

fn start(config: RunConfig) -> Running<RunSummary> {
    start_run(READY, config)
}

/// The double's session: started once, `n` GCs traced exactly, stopped once.
fn trace_double_gcs(
    tracer: &mut Running<RunSummary>,
    double: &mut Dotnet10Double,
    n: u32,
) -> String {
    let pid = double.pid();
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    assert_eq!(started["runtime_version"], "10.0.0+test-double");
    let id = started["session_id"].as_str().unwrap().to_owned();
    assert_eq!(double.expect_session_started(&id).expect("double saw the session"), "streaming");
    assert_eq!(double.gc(n).expect("gc"), u64::from(n));
    tracer.wait_for_count("GCStart", EVENTS, n as usize, |l| is_event(l, pid, "GCStart"));
    id
}

fn assert_one_clean_session(lines: &[Value], pid: u32, gcs: usize) {
    assert_eq!(count(lines, |l| is_event(l, pid, "GCStart")), gcs);
    assert_eq!(count(lines, |l| is(l, "session_started", pid)), 1);
    assert_eq!(count(lines, |l| is(l, "session_failed", pid)), 0);
    assert_eq!(count(lines, |l| is(l, "socket_refused", pid)), 0);
    let ended: Vec<&Value> = lines.iter().filter(|l| is(l, "session_ended", pid)).collect();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0]["reason"], "stopped");
}

#[test]
fn real_coreclr_without_wx_is_detected_by_its_socket_and_traced() {
    const N: u32 = 4;
    let mut tracer = start(config("Microsoft-Windows-DotNETRuntime:0x1:4", LOCATE));
    let tmp = ScratchDir::new("ipcsock-coreclr");
    let mut host = CoreclrHost::spawn_with(tmp.path(), &[("DOTNET_EnableWriteXorExecute", "0")])
        .expect("CoreCLR host");
    let pid = host.host_pid;
    assert!(host.version.starts_with("8.0.4"), "{}", host.version);

    let seen = tracer.wait_for("socket detection", SESSION, |l| is(l, "dotnet_ipc_socket", pid));
    assert_eq!(seen["source"], "kernel");
    assert_eq!(seen["abstract"], false);
    assert_eq!(seen["socket_pid"], pid);
    let path = seen["path"].as_str().unwrap();
    let dir = tmp.path().to_str().unwrap();
    assert_eq!(path, format!("{dir}/dotnet-diagnostic-{pid}-{}-socket", seen["key"]));
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    assert!(started["runtime_version"].as_str().unwrap().starts_with("8.0.4"), "{started}");

    let before = host.gc(0).expect("gc 0");
    let after = host.gc(N).expect("induce GCs");
    assert_eq!(after, before + u64::from(N));
    tracer.wait_for_count("induced GCStart", EVENTS, N as usize, |l| {
        is_event(l, pid, "GCStart") && l["fields"]["Reason"] == "Induced"
    });
    let (lines, _) = tracer.stop();
    let starts: Vec<&Value> = lines.iter().filter(|l| is_event(l, pid, "GCStart")).collect();
    let counts: Vec<u64> = starts.iter().map(|l| u64_field(&l["fields"], "Count")).collect();
    assert_eq!(counts, (before + 1..=after).collect::<Vec<_>>(), "exactly the induced GCs");
    // W^X off: no doublemapper, so the socket was the only signal.
    assert_eq!(count(&lines, |l| is(l, "dotnet_runtime_seen", pid)), 0);
    assert_eq!(count(&lines, |l| is(l, "dotnet_ipc_socket", pid)), 1, "once per process");
    assert_eq!(count(&lines, |l| is(l, "session_started", pid)), 1);
    assert_eq!(count(&lines, |l| is(l, "session_failed", pid)), 0);
    assert_eq!(host.ping().expect("the runtime still runs managed code"), after);
}

/// A real .NET Core 3.1.23 already running when tracer starts, named with `--pid`: no memfd and
/// no ProcessInfo, found by the start-up scan of its listening socket and traced (exactly the
/// induced GCs), the runtime healthy afterwards.
#[test]
fn real_coreclr_3_1_already_running_is_found_by_its_socket_and_traced() {
    const N: u32 = 3;
    let tmp = ScratchDir::new("ipcsock-coreclr31");
    let mut host = CoreclrHost::spawn_with(tmp.path(), &[("CORECLR_HOST_RUNTIME", "3.1")])
        .expect("CoreCLR 3.1 host");
    let pid = host.host_pid;
    assert_eq!(host.version, "3.1.23");
    let mut cfg = config("Microsoft-Windows-DotNETRuntime:0x1:4", LOCATE);
    cfg.target_pids = vec![pid];
    let mut tracer = start(cfg);
    let found = tracer.wait_for("scan", SESSION, |l| is(l, "dotnet_ipc_socket", pid));
    assert_eq!(found["source"], "procfs");
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    assert_eq!(started["command"], "CollectTracing2 (0x0203)");
    assert_eq!(started["runtime_version"], Value::Null, "3.1 answers no ProcessInfo");
    // 3.1's GC picks up the session's keywords at its own pace: a GC right after the session
    // started has come with its GCEnd but without its GCStart (seen once in ~10 loaded runs).
    // A warm-up GC whose GCEnd arrives first; the induced GCs are counted after it.
    let before = host.gc(1).expect("warm-up gc");
    tracer.wait_for("the warm-up GC's end", EVENTS, |l| {
        is_event(l, pid, "GCEnd") && u64_field(&l["fields"], "Count") == before
    });
    let after = host.gc(N).expect("induce GCs");
    tracer.wait_for_count("induced GCStart", EVENTS, N as usize, |l| {
        is_event(l, pid, "GCStart")
            && l["fields"]["Reason"] == "Induced"
            && u64_field(&l["fields"], "Count") > before
    });
    let (lines, _) = tracer.stop();
    let counts: Vec<u64> = lines
        .iter()
        .filter(|l| is_event(l, pid, "GCStart"))
        .map(|l| u64_field(&l["fields"], "Count"))
        .collect();
    let warm_up = counts.iter().filter(|&&c| c <= before).count();
    assert!(warm_up <= 1, "{counts:?}");
    assert_eq!(counts[warm_up..], (before + 1..=after).collect::<Vec<_>>(), "the induced GCs");
    assert_one_clean_session(&lines, pid, N as usize + warm_up);
    assert_eq!(host.ping().expect("the runtime still runs managed code"), after);
}

#[test]
fn listening_runtime_is_found_by_the_startup_scan() {
    let tmp = ScratchDir::new("ipcsock-scan");
    let mut double =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_IPC_MEMFD", "0")]).expect("double");
    let pid = double.pid();
    let mut tracer = start(config("Microsoft-Windows-DotNETRuntime:0x1:4", LOCATE));
    let found = tracer.wait_for("scan", SESSION, |l| is(l, "dotnet_ipc_socket", pid));
    assert_eq!(found["source"], "procfs");
    assert_eq!(found["path"], double.socket);
    assert_eq!(found["socket_pid"], pid);
    assert_eq!(found["fd"], Value::Null);
    assert!(found["inode"].as_u64().unwrap() > 0);
    let id = trace_double_gcs(&mut tracer, &mut double, 3);
    let (lines, _) = tracer.stop();
    assert_one_clean_session(&lines, pid, 3);
    assert_eq!(count(&lines, |l| is(l, "dotnet_ipc_socket", pid)), 1);
    assert_eq!(count(&lines, |l| is(l, "dotnet_ipc_ready", pid)), 0);
    double.expect_session_ended(&id).expect("double saw StopTracing");
}

#[test]
fn pid_option_traces_its_process_and_says_why_not() {
    let tmp = ScratchDir::new("ipcsock-pid");
    let mut double =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_IPC_MEMFD", "0")]).expect("double");
    let other =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_IPC_MEMFD", "0")]).expect("other");
    let pid = double.pid();
    // A process that never has a diagnostic socket.
    let mut plain = std::process::Command::new("sleep").arg("600").spawn().expect("sleep");
    let plain_pid = plain.id();
    let mut cfg = config("Microsoft-Windows-DotNETRuntime:0x1:4", SHORT_LOCATE);
    cfg.target_pids = vec![pid, plain_pid];
    let mut tracer = start(cfg);
    let id = trace_double_gcs(&mut tracer, &mut double, 2);
    let failed =
        tracer.wait_for("plain pid fails", SESSION, |l| is(l, "session_failed", plain_pid));
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("has no diagnostic socket"), "{error}");
    assert!(error.contains("locate window"), "{error}");
    assert_eq!(failed["refused"], false);
    let (lines, summary) = tracer.stop();
    plain.kill().expect("kill sleep");
    plain.wait().expect("reap sleep");
    assert_one_clean_session(&lines, pid, 2);
    assert_eq!(count(&lines, |l| l["pid"] == other.pid()), 0, "not a target");
    assert_eq!(count(&lines, |l| l["pid"] == plain_pid), 1, "only its session_failed");
    assert_eq!(summary.processes, 2);
    assert_eq!(summary.sessions_failed, 1);
    double.expect_session_ended(&id).expect("double saw StopTracing");
}

#[test]
fn runtime_between_bind_and_listen_is_traced_not_refused() {
    let mut tracer = start(config("Microsoft-Windows-DotNETRuntime:0x1:4", LOCATE));
    let tmp = ScratchDir::new("ipcsock-bound");
    let mut double =
        Dotnet10Double::spawn_bound(tmp.path(), &[("DOUBLE_IPC_MEMFD", "0")]).expect("double");
    let pid = double.pid();
    let seen = tracer.wait_for("bind detection", SESSION, |l| is(l, "dotnet_ipc_socket", pid));
    assert_eq!(seen["source"], "kernel");
    assert_eq!(seen["path"], double.socket);
    // The socket file exists and refuses connections: the session is looking at a runtime
    // between bind() and listen().
    let refused = std::os::unix::net::UnixStream::connect(&double.socket).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::ECONNREFUSED));
    double.listen().expect("listen");
    let id = trace_double_gcs(&mut tracer, &mut double, 2);
    let (lines, summary) = tracer.stop();
    assert_one_clean_session(&lines, pid, 2);
    assert_eq!(summary.sessions_refused, 0);
    double.expect_session_ended(&id).expect("double saw StopTracing");
}

/// Real CoreCLR 8.0.4 runtimes started one after another while both CPUs are kept busy (the
/// start-up window between bind() and listen(), and between the doublemapper mapping and the
/// socket, widens under load): every one is traced — a session started, none failed.
#[test]
fn runtimes_started_under_cpu_load_are_traced_every_time() {
    const STARTS: usize = 8;
    let hogs: Vec<std::process::Child> = (0..2)
        .map(|_| {
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .expect("a CPU hog")
        })
        .collect();
    let mut tracer = start(config("Microsoft-Windows-DotNETRuntime:0x1:4", LOCATE));
    let tmp = ScratchDir::new("ipcsock-load");
    let mut pids = Vec::new();
    for _ in 0..STARTS {
        let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR host");
        let pid = host.host_pid;
        tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
        host.exit().expect("host exits");
        tracer.wait_for("session_ended", SESSION, |l| is(l, "session_ended", pid));
        pids.push(pid);
    }
    for mut hog in hogs {
        hog.kill().expect("kill the hog");
        hog.wait().expect("reap the hog");
    }
    let (lines, _) = tracer.stop();
    for pid in pids {
        assert_eq!(count(&lines, |l| is(l, "session_started", pid)), 1, "pid {pid}");
        assert_eq!(count(&lines, |l| is(l, "session_failed", pid)), 0, "pid {pid}");
    }
}
