//! `tracer run --nettrace-dir`: each streaming session's stream saved as a `.nettrace` file,
//! byte for byte as the runtime sent it (the .NET 10 double tees what it sends), complete when
//! the session ends normally, truncated — and said to be — when the runtime is killed, and a
//! full disk stops only the file, not the tracing. Real kernel, real processes, real tmpfs.
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tests::coreclr::CoreclrHost;
use tests::double::Dotnet10Double;
use tests::pipeline::{is, is_event, run_config, start_run, u64_field};
use tests::scratch::ScratchDir;
use tracer::session::SessionMode;
use tracer_decode::nettrace::{NettraceError, NettraceParser};

const READY: Duration = Duration::from_secs(60);
const SESSION: Duration = Duration::from_secs(120);
const EVENTS: Duration = Duration::from_secs(30);
const PROVIDERS: &str = "Microsoft-Windows-DotNETRuntime:0x1:4,TestDouble";

/// `tracer run --nettrace-dir dir --pid pid` (other tests' runtimes are not traced, so the
/// summary is about `pid` alone).
fn tracer_with_files(
    dir: &Path,
    pid: u32,
) -> tests::pipeline::Running<tracer::pipeline::run::RunSummary> {
    let mut config = run_config(PROVIDERS, SessionMode::Streaming, Duration::from_secs(10), 1024);
    config.session.nettrace_dir = Some(dir.to_owned());
    config.target_pids = vec![pid];
    start_run(READY, config)
}

/// Events of the requested providers in a nettrace file, by name, parsed with the project's
/// parser (the file also has what the runtime sent unasked, e.g. EventPipe's ProcessInfo, which
/// tracer drops from the JSON lines), and how the file ended.
fn parse_file(path: &str) -> (BTreeMap<String, usize>, Result<(), NettraceError>) {
    let bytes = std::fs::read(path).expect("the nettrace file");
    let mut parser = NettraceParser::default();
    let mut events = BTreeMap::new();
    // What the sessions asked for, and EventPipe's ProcessInfo that starts every stream.
    let requested =
        ["Microsoft-Windows-DotNETRuntime", "TestDouble", "Microsoft-DotNETCore-EventPipe"];
    parser
        .feed(&bytes, |ev| {
            if requested.contains(&ev.metadata.provider.as_str()) {
                *events.entry(ev.decode().event.to_string()).or_default() += 1;
            }
        })
        .ok();
    (events, parser.finish())
}

/// Events of `pid` in the JSON lines, by name.
fn json_events(lines: &[Value], pid: u32) -> BTreeMap<String, usize> {
    let mut events = BTreeMap::new();
    for l in lines.iter().filter(|l| is(l, "dotnet_event", pid)) {
        *events.entry(l["event"].as_str().unwrap().to_owned()).or_default() += 1;
    }
    events
}

#[test]
fn the_file_is_the_stream_the_runtime_sent_byte_for_byte() {
    let files = ScratchDir::new("nettrace-files");
    let sent = ScratchDir::new("nettrace-sent");
    let tmp = ScratchDir::new("nettrace-double");
    let copy_dir = sent.path().to_str().unwrap();
    let mut double =
        Dotnet10Double::spawn_with(tmp.path(), &[("DOUBLE_STREAM_COPY_DIR", copy_dir)])
            .expect("double");
    let pid = double.pid();
    let mut tracer = tracer_with_files(files.path(), pid);
    let started = tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    let id = started["session_id"].as_str().unwrap().to_owned();
    double.gc(3).expect("gc");
    double.emit(4).expect("emit");
    tracer.wait_for_count("Tick", EVENTS, 4, |l| is_event(l, pid, "Tick"));
    let (lines, summary) = tracer.stop();
    double.expect_session_ended(&id).expect("StopTracing reached the double");

    let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
    assert_eq!(ended["reason"], "stopped");
    assert_eq!(ended["nettrace_file_complete"], true, "{ended}");
    let path = ended["nettrace_file"].as_str().unwrap();
    let name = Path::new(path).file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with(&format!("{pid}_python3_")), "{name}");
    assert!(name.ends_with(&format!("_{}.nettrace", id.trim_start_matches("0x"))), "{name}");
    let written = std::fs::read(path).unwrap();
    let sent_bytes =
        std::fs::read(sent.path().join(format!("{}.sent", id.trim_start_matches("0x"))))
            .expect("the double's copy");
    assert!(written == sent_bytes, "the file differs from what the runtime sent");
    assert_eq!(u64_field(ended, "nettrace_file_bytes"), written.len() as u64);
    assert_eq!(u64_field(ended, "bytes"), written.len() as u64);
    assert_eq!(ended["nettrace_file_unwritten_bytes"], 0);
    assert_eq!(std::fs::metadata(path).unwrap().permissions().mode() & 0o777, 0o600);

    let (events, end) = parse_file(path);
    assert_eq!(end, Ok(()), "the file ends with the end-of-stream tag");
    assert_eq!(events, json_events(&lines, pid), "the same events as the JSON lines");
    assert_eq!((events["GCStart"], events["GCEnd"], events["Tick"]), (3, 3, 4));
    assert_eq!((summary.nettrace_files_complete, summary.nettrace_files_truncated), (1, 0));
}

#[test]
fn a_killed_runtime_leaves_a_file_the_parser_reports_as_truncated() {
    let files = ScratchDir::new("nettrace-killed");
    let tmp = ScratchDir::new("nettrace-killed-double");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let mut tracer = tracer_with_files(files.path(), pid);
    tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    double.gc(2).expect("gc");
    tracer.wait_for_count("GCEnd", EVENTS, 2, |l| is_event(l, pid, "GCEnd"));
    // SAFETY: kill(2) on the double, a child of this test.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let ended = tracer.wait_for("session_ended", EVENTS, |l| is(l, "session_ended", pid));
    let (lines, summary) = tracer.stop();
    assert_eq!(ended["reason"], "process_exited");
    assert_eq!(ended["nettrace_file_complete"], false, "{ended}");
    assert!(ended.get("nettrace_file_error").is_none(), "nothing failed to write: {ended}");
    let (events, end) = parse_file(ended["nettrace_file"].as_str().unwrap());
    assert!(matches!(end, Err(NettraceError::Truncated { .. })), "truncated, not corrupt: {end:?}");
    assert_eq!(events, json_events(&lines, pid));
    assert_eq!((events["GCStart"], events["GCEnd"]), (2, 2));
    assert_eq!((summary.nettrace_files_complete, summary.nettrace_files_truncated), (0, 1));
    drop(double);
}

/// A tmpfs of 64 KiB mounted for the test (unmounted when dropped).
struct SmallTmpfs(ScratchDir);

impl SmallTmpfs {
    fn mount(tag: &str) -> SmallTmpfs {
        let dir = ScratchDir::new(tag);
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k,mode=0700", "tracer-test-small"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(status.success(), "mounting a small tmpfs");
        SmallTmpfs(dir)
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn a_full_disk_stops_the_file_not_the_tracing() {
    const TICKS: u32 = 3000;
    let disk = SmallTmpfs::mount("nettrace-full");
    let tmp = ScratchDir::new("nettrace-full-double");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    let mut tracer = tracer_with_files(disk.0.path(), pid);
    tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    assert_eq!(double.emit(TICKS).expect("emit"), (u64::from(TICKS), 0));
    tracer.wait_for_count("Tick", EVENTS, TICKS as usize, |l| is_event(l, pid, "Tick"));
    let (lines, summary) = tracer.stop();
    let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
    assert_eq!(ended["reason"], "stopped", "the session went on: {ended}");
    assert_eq!(lines.iter().filter(|l| is_event(l, pid, "Tick")).count(), TICKS as usize);
    assert_eq!(ended["nettrace_file_complete"], false);
    let error = ended["nettrace_file_error"].as_str().unwrap_or_default();
    assert!(error.contains("No space left on device"), "{ended}");
    let (bytes, unwritten) = (
        u64_field(ended, "nettrace_file_bytes"),
        u64_field(ended, "nettrace_file_unwritten_bytes"),
    );
    assert!(unwritten > 0, "{ended}");
    assert_eq!(bytes + unwritten, u64_field(ended, "bytes"), "every stream byte is accounted for");
    let path = ended["nettrace_file"].as_str().unwrap();
    assert_eq!(std::fs::metadata(path).unwrap().len(), bytes);
    assert_eq!(summary.nettrace_file_failures, 1);
    drop(double);
}

/// A real CoreCLR 8.0.4's file parses to the same runtime events as its JSON lines.
#[test]
fn a_real_runtimes_file_parses_to_its_json_events() {
    const N: u32 = 3;
    let files = ScratchDir::new("nettrace-coreclr");
    std::fs::set_permissions(files.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let tmp = ScratchDir::new("nettrace-coreclr-host");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR host");
    let pid = host.host_pid;
    let mut tracer = tracer_with_files(files.path(), pid);
    tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    host.gc(N).expect("gc");
    tracer.wait_for_count("induced GCStart", EVENTS, N as usize, |l| {
        is_event(l, pid, "GCStart") && l["fields"]["Reason"] == "Induced"
    });
    let (lines, _) = tracer.stop();
    let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
    assert_eq!(ended["nettrace_file_complete"], true, "{ended}");
    let (events, end) = parse_file(ended["nettrace_file"].as_str().unwrap());
    assert_eq!(end, Ok(()));
    assert_eq!(events, json_events(&lines, pid));
    assert!(events["GCStart"] >= N as usize);
    host.ping().expect("runtime healthy");
}
