//! Who wrote a session's lines, when a process hands its diagnostic listener to another and its
//! pid is then reused: a session ends when the process it pinned ends (whoever still holds the
//! connection), and every line names the process incarnation — `pid` and `process_start_ns`,
//! and a runtime event its `session_id` — so nothing of the first process's session is ever attributed to
//! the process that got its pid.
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::time::Duration;

use serde_json::Value;
use tests::coreclr::CoreclrHost;
use tests::double::Dotnet10Double;
use tests::pipeline::{is, is_event, run_config, start_run};
use tests::scratch::ScratchDir;
use tracer::kernel::procfs::process_start_ns;
use tracer::session::SessionMode;

/// Loading CoreCLR on a loaded 2-core machine takes a while.
const TIMEOUT: Duration = Duration::from_secs(120);

/// A process the test did not start itself (the listener's new holder, a child of the double),
/// pinned by a pidfd and killed through it when the test ends, however it ends.
struct Pinned(OwnedFd);

impl Pinned {
    fn new(pid: u32) -> Pinned {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        assert!(fd >= 0, "pidfd_open({pid}): {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor that nothing else owns.
        Pinned(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: pidfd_send_signal on our pidfd with no siginfo; the pidfd names that process
        // only, whatever its pid holds now.
        unsafe {
            libc::syscall(libc::SYS_pidfd_send_signal, self.0.as_raw_fd(), libc::SIGKILL, 0, 0)
        };
    }
}

fn message(line: &Value) -> &str {
    line["fields"]["Message"].as_str().unwrap_or("")
}

/// A process binds and listens on its runtime socket, then hands the listener to a child
/// running as `nobody`, which serves the session tracer starts (writing a `forged` Tick every
/// 20 ms), and exits; its pid is then taken by a real CoreCLR 8 runtime.
#[test]
fn a_session_ends_with_its_process_and_its_lines_never_name_the_pids_next_holder() {
    let tmp = ScratchDir::new("handoff-reuse");
    let providers = "Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble";
    let config = run_config(providers, SessionMode::Streaming, Duration::from_secs(30), 1024);
    let mut tracer = start_run(TIMEOUT, config);

    let mut first =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_HAND_OFF", "1")]).expect("double");
    let pid = first.pid();
    let _holder = Pinned::new(first.handed_off().expect("HANDED_OFF"));
    let first_start = process_start_ns(pid).expect("the first process's start");
    let started = tracer.wait_for("the first process's session_started", TIMEOUT, |l| {
        is(l, "session_started", pid)
    });
    assert_eq!(started["process_start_ns"], first_start, "{started}");
    let first_session = started["session_id"].as_str().expect("session_id").to_owned();
    let tick = tracer.wait_for("a Tick of the first process's session", TIMEOUT, |l| {
        is_event(l, pid, "Tick") && l["session_id"] == first_session.as_str()
    });
    assert!(message(&tick).starts_with("forged "), "{tick}");
    assert_eq!(tick["process_start_ns"], first_start, "{tick}");

    // The process exits; the listener's holder goes on writing into the connection.
    first.exit().expect("the first process exits");
    let ended = tracer.wait_for("the first process's session_ended", TIMEOUT, |l| {
        is(l, "session_ended", pid) && l["session_id"] == first_session.as_str()
    });
    assert_eq!(ended["reason"], "process_exited", "{ended}");
    assert_eq!(ended["process_start_ns"], first_start, "{ended}");
    let why = ended["error"].as_str().unwrap_or_default();
    assert!(
        why.starts_with(
            "the process exited while another process held its session's connection open: "
        ) && why.ends_with(" bytes queued then were not decoded"),
        "{ended}"
    );

    // The pid goes to a real runtime, which tracer traces as the process it is.
    let helper = env!("CARGO_BIN_EXE_spawn_at_pid");
    let mut runtime = CoreclrHost::spawn_at_pid(tmp.path(), pid, helper).expect("CoreCLR");
    let second_start = process_start_ns(pid).expect("the runtime's start");
    assert_ne!(second_start, first_start);
    let started = tracer.wait_for("the runtime's session_started", TIMEOUT, |l| {
        is(l, "session_started", pid) && l["process_start_ns"] == second_start
    });
    let second_session = started["session_id"].as_str().expect("session_id").to_owned();
    assert_ne!(second_session, first_session);
    runtime.gc(1).expect("gc");
    tracer.wait_for("a GCStart of the runtime", TIMEOUT, |l| {
        is_event(l, pid, "GCStart") && l["session_id"] == second_session.as_str()
    });
    runtime.exit().expect("the runtime exits");
    tracer.wait_for("the runtime's session_ended", TIMEOUT, |l| {
        is(l, "session_ended", pid) && l["session_id"] == second_session.as_str()
    });
    let (lines, summary) = tracer.stop();

    // Every line about the pid names one of the two processes; each session's lines name the
    // process of that session; nothing the first process's session carried names the runtime.
    let about_pid: Vec<&Value> = lines.iter().filter(|l| l["pid"] == pid).collect();
    let mut of_runtime = 0;
    for line in &about_pid {
        let start = line["process_start_ns"].as_u64();
        let want = match line["session_id"].as_str() {
            Some(id) if id == first_session => Some(first_start),
            Some(id) => {
                assert_eq!(id, second_session, "{line}");
                Some(second_start)
            }
            // Detections: of either process.
            None => start.filter(|s| [first_start, second_start].contains(s)),
        };
        assert_eq!(start, want, "{line}");
        if start == Some(second_start) {
            of_runtime += 1;
            assert!(
                !message(line).starts_with("forged"),
                "a forged event as the runtime's: {line}"
            );
        }
    }
    assert!(of_runtime >= 4, "detection, session_started, GCStart, session_ended: {of_runtime}");
    // The first process's session wrote nothing after it ended.
    let first_end = lines
        .iter()
        .position(|l| is(l, "session_ended", pid) && l["session_id"] == first_session.as_str())
        .expect("the first process's session_ended");
    let late: Vec<&Value> = lines[first_end + 1..]
        .iter()
        .filter(|l| l["session_id"] == first_session.as_str())
        .collect();
    assert!(late.is_empty(), "lines of the first process's session after its end: {late:?}");
    assert_eq!(summary.sessions_ended.get("process_exited").copied(), Some(2), "{summary:?}");
}
