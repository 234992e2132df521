//! How tracer ends, as a hostile environment would test it (every output and lifecycle
//! error ends cleanly): a private output file never written through a symlink, a closed pipe
//! (`| head -1`), SIGHUP log rotation, a second Ctrl-C, an instance left by a SIGKILLed tracer,
//! control characters from peers on stderr, and operator input that must not panic. The real
//! `tracer` binary runs as a child; its ftrace instance is looked at in tracefs.
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use tests::double::Dotnet10Double;
use tests::process::{line_channel, read_line_within, tracer_binary, wait_child_exit};
use tests::scratch::ScratchDir;

const TIMEOUT: Duration = Duration::from_secs(30);

/// A `tracer` child with its stderr read line by line.
struct Tracer {
    child: Child,
    stderr: Receiver<String>,
    seen: Vec<String>,
}

impl Tracer {
    fn spawn(args: &[&str], stdout: Stdio) -> Tracer {
        let mut child = Command::new(tracer_binary())
            .args(args)
            .env("TRACER_LOG", "info")
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning tracer");
        let stderr = line_channel(child.stderr.take().expect("piped"));
        Tracer { child, stderr, seen: Vec::new() }
    }

    /// `tracer ftrace` recording `ftrace:print` (markers) into `output`; returns once recording.
    fn ftrace(extra: &[&str], stdout: Stdio) -> Tracer {
        let mut args = vec!["ftrace", "--event", "ftrace:print", "--buffer-percent", "0"];
        args.extend_from_slice(extra);
        let mut tracer = Tracer::spawn(&args, stdout);
        tracer.wait_stderr("recording 1 tracepoint(s)");
        tracer
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The instance `tracer ftrace` records in.
    fn instance(&self) -> PathBuf {
        PathBuf::from(format!("/sys/kernel/tracing/instances/tracer-{}", self.pid()))
    }

    /// Writes a marker line into the tracer's instance.
    fn mark(&self, text: &str) {
        std::fs::write(self.instance().join("trace_marker"), text).expect("trace_marker");
    }

    fn wait_stderr(&mut self, needle: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        loop {
            match self.stderr.recv_timeout(TIMEOUT) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!("no stderr line with {needle:?} ({e}); so far:\n{:#?}", self.seen),
            }
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill with a valid signal on our own child.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, signal) }, 0);
    }

    /// Waits for the exit; returns the exit code (None: killed by a signal) and all of stderr.
    fn finish(mut self) -> (Option<i32>, String) {
        let status = wait_child_exit(&mut self.child, TIMEOUT);
        while let Ok(line) = self.stderr.recv_timeout(TIMEOUT) {
            self.seen.push(line);
        }
        (status.code(), std::mem::take(&mut self.seen).join("\n"))
    }
}

/// A test that fails midway must not leave its tracer running (it would trace every other
/// test's processes).
impl Drop for Tracer {
    fn drop(&mut self) {
        if self.child.try_wait().is_ok_and(|status| status.is_none()) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn lines_of(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

/// Waits until `path` holds a marker line with `text` (the file is written by another process:
/// there is no event to wait on, so its content is polled until the deadline).
fn wait_for_marker(path: &Path, text: &str) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !lines_of(path).iter().any(|l| l["fields"]["buf"] == text) {
        assert!(std::time::Instant::now() < deadline, "{text:?} never reached {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn output_file_is_private_and_a_symlink_is_refused() {
    let dir = ScratchDir::new("private-output");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "owned by root\n").unwrap();
    let link = dir.path().join("out.jsonl");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let tracer = Tracer::spawn(
        &["audit", "--duration", "10ms", "-o", link.to_str().unwrap()],
        Stdio::null(),
    );
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("a symlink is refused"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "owned by root\n");

    let fresh = dir.path().join("fresh.jsonl");
    let tracer = Tracer::spawn(
        &["audit", "--duration", "10ms", "-o", fresh.to_str().unwrap()],
        Stdio::null(),
    );
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "holds other users' command lines");
    let last = lines_of(&fresh).pop().expect("a summary line");
    assert_eq!((last["kind"].clone(), last["command"].clone()), ("summary".into(), "audit".into()));
}

#[test]
fn closed_stdout_stops_with_a_summary_and_removes_the_instance() {
    let mut tracer = Tracer::ftrace(&[], Stdio::piped());
    let mut stdout = BufReader::new(tracer.child.stdout.take().unwrap());
    tracer.mark("first\n");
    let first = read_line_within(&mut stdout, TIMEOUT).expect("the first marker's line");
    assert!(first.contains("\"buf\":\"first\\n\""), "{first}");
    drop(stdout); // `| head -1`
    tracer.mark("second\n");
    let instance = tracer.instance();
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(3), "documented exit status for a failed output: {stderr}");
    // Without --read-mode, whole sub-buffers are read (docs/protocol/ftrace.md §6.7).
    assert!(stderr.contains("tracer ftrace summary: read mode read()"), "{stderr}");
    assert!(stderr.contains("output failed: Broken pipe"), "{stderr}");
    assert!(!instance.exists(), "instance removed");
}

/// `tracer run | head -1` with a runtime being traced: the closed pipe stops the session the
/// way Ctrl-C does (StopTracing, which the runtime sees), the summary names the error, and the
/// exit status is the documented one.
#[test]
fn closed_stdout_of_run_stops_its_sessions_with_a_summary() {
    let tmp = ScratchDir::new("run-closed-stdout");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let pid_arg = pid.to_string();
    let providers = "Microsoft-Windows-DotNETRuntime:0x1:4";
    let args = ["run", "--session", "streaming", "--providers", providers, "--pid", &pid_arg];
    let mut tracer = Tracer::spawn(&args, Stdio::piped());
    let mut stdout = BufReader::new(tracer.child.stdout.take().unwrap());
    let started = loop {
        let line = read_line_within(&mut stdout, TIMEOUT).expect("tracer's output");
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON line");
        if v["kind"] == "session_started" && v["pid"] == pid {
            break v;
        }
    };
    let id = started["session_id"].as_str().unwrap();
    double.expect_session_started(id).expect("the double saw its session");
    drop(stdout); // `| head -1`
    double.gc(2).expect("gc");
    if let Err(e) = double.expect_session_ended(id) {
        tracer.signal(libc::SIGKILL);
        let (_, stderr) = tracer.finish();
        panic!("StopTracing did not reach the runtime: {e:#}\ntracer's stderr:\n{stderr}");
    }
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(3), "documented exit status for a failed output: {stderr}");
    assert!(stderr.contains("tracer run summary"), "{stderr}");
    assert!(stderr.contains("output failed: Broken pipe"), "{stderr}");
    assert!(stderr.contains("ended (stopped): 1"), "{stderr}");
    double.exit().expect("double exits");
}

#[test]
fn sighup_reopens_the_output_file() {
    let dir = ScratchDir::new("sighup");
    let out = dir.path().join("trace.jsonl");
    let rotated = dir.path().join("trace.jsonl.1");
    let mut tracer = Tracer::ftrace(&["-o", out.to_str().unwrap()], Stdio::null());
    tracer.mark("before rotation\n");
    wait_for_marker(&out, "before rotation\n");
    std::fs::rename(&out, &rotated).unwrap();
    tracer.signal(libc::SIGHUP);
    tracer.mark("after rotation\n");
    wait_for_marker(&out, "after rotation\n");
    tracer.wait_stderr(&format!("reopened {}", out.display()));
    tracer.signal(libc::SIGTERM);
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");
    let markers = |p: &Path| -> Vec<String> {
        lines_of(p)
            .iter()
            .filter(|l| l["kind"] == "ftrace")
            .map(|l| l["fields"]["buf"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(markers(&rotated), ["before rotation\n"]);
    assert_eq!(markers(&out), ["after rotation\n"]);
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn second_signal_exits_at_once_and_removes_the_instance() {
    // Nobody reads stdout: once the pipe is full, tracer is stuck writing and a first SIGINT
    // cannot end it; the second must.
    let mut tracer = Tracer::ftrace(&[], Stdio::piped());
    let instance = tracer.instance();
    let mut marker =
        std::fs::File::options().write(true).open(instance.join("trace_marker")).unwrap();
    for i in 0..2_000 {
        writeln!(marker, "filler line {i:05} to fill the pipe nobody reads...............")
            .unwrap();
    }
    drop(marker);
    tracer.signal(libc::SIGINT);
    tracer.wait_stderr("stopping (signal)");
    tracer.signal(libc::SIGINT);
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("second signal: exiting without draining"), "{stderr}");
    assert!(!instance.exists(), "instance removed on the forced exit: {stderr}");
}

#[test]
fn instance_of_a_killed_tracer_is_removed_at_the_next_start_and_a_live_one_is_kept() {
    let killed = Tracer::ftrace(&[], Stdio::null());
    let left = killed.instance();
    // Held by this test (as a tracer holds its own) until `check` starts: a tracer of another
    // test starting meanwhile would remove the killed one's instance before this test looks.
    let hold = std::fs::File::open(left.join("tracing_on")).expect("the live tracer's instance");
    killed.signal(libc::SIGKILL);
    let (code, _) = killed.finish();
    assert_eq!(code, None, "killed");
    assert!(left.exists(), "SIGKILL leaves the instance");
    let live = Tracer::ftrace(&[], Stdio::null());
    assert!(left.exists(), "an instance somebody holds is not removed");
    drop(hold);
    let check = Tracer::spawn(&["check"], Stdio::null());
    let (_, stderr) = check.finish();
    assert!(!left.exists(), "any subcommand removes a stale instance: {stderr}");
    assert!(live.instance().exists(), "a live tracer's instance stays");
    live.mark("still recording\n");
    live.signal(libc::SIGTERM);
    let (code, stderr) = live.finish();
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn control_characters_from_a_peer_are_escaped_on_stderr() {
    let dir = ScratchDir::new("escape");
    // A process whose TMPDIR clears the screen and forges a log line of its own.
    let tmpdir = dir.path().join("\u{1b}[2J\n[ERROR forged-tmpdir] x");
    std::fs::create_dir(&tmpdir).unwrap();
    let mut tracer = Tracer::spawn(&["run", "--session", "streaming"], Stdio::null());
    tracer.wait_stderr("watching for .NET processes");
    // Its socket name is a symlink: refused at once, with the path in the error.
    let mut peer = Command::new(env!("CARGO_BIN_EXE_hostile_peer"))
        .args(["symlink", "/nonexistent"])
        .env("TMPDIR", &tmpdir)
        .env("HOSTILE_PEER_IPC_MEMFD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(peer.stdout.take().unwrap()).read_line(&mut ready).unwrap();
    assert!(ready.starts_with("READY"), "{ready}");
    let failure = tracer.wait_stderr(&format!("pid {}: refused", peer.id()));
    assert!(failure.contains("\\u{1b}[2J\\n[ERROR forged-tmpdir] x"), "{failure}");
    drop(peer.stdin.take());
    peer.wait().unwrap();
    tracer.signal(libc::SIGTERM);
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "no raw escape reached stderr: {stderr:?}");
    assert!(!stderr.lines().any(|l| l.starts_with("[ERROR forged-tmpdir]")), "{stderr}");
}

/// A stopping event of a provider the sessions do not ask for could never match: refused.
#[test]
fn a_stopping_event_of_an_unrequested_provider_is_refused() {
    let out = Command::new(tracer_binary())
        .args(["run", "--providers", "TestDouble", "--stopping-event", "Other/Tick"])
        .output()
        .expect("tracer run");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "--stopping-event names provider \"Other\", which the sessions do not ask for"
        ),
        "{stderr}"
    );
}

#[test]
fn absurd_durations_are_refused_with_a_clear_error() {
    for args in [
        ["run", "--duration", "99999999999999999999"],
        ["run", "--ipc-timeout", "99999999999999999999"],
    ] {
        let mut child = Command::new(tracer_binary())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = String::new();
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = wait_child_exit(&mut child, TIMEOUT);
        assert_eq!(status.code(), Some(2), "a usage error, not a panic: {stderr}");
        assert!(
            stderr.contains("must be between 0 and 315360000 s (10 years)"),
            "{args:?}: {stderr}"
        );
    }
}
