//! `tracer audit` on the real kernel (root): the library entry point and the built binary,
//! against `detect_helper` and a real CoreCLR 8.0.4. Every wait is on an event or a line with a
//! timeout; assertions compare exact fields and counts for the processes each test started.
use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tests::pipeline::Running;
use tests::process::{LineProcess, line_channel, tracer_binary, wait_child_exit};
use tests::user_events::kernel_has_user_events;
use tracer::output::JsonLines;
use tracer::pipeline::audit::{self, AuditConfig, AuditSummary};
use tracer_common::{EventKind, LossReason};

const HELPER: &str = env!("CARGO_BIN_EXE_detect_helper");
const TIMEOUT: Duration = Duration::from_secs(20);
/// CoreCLR start-up under load can take a while.
const CORECLR_TIMEOUT: Duration = Duration::from_secs(120);

/// `audit::run` on its own thread (the shared pipeline harness).
type Audit = Running<AuditSummary>;

fn start_audit(config: AuditConfig) -> Audit {
    Running::start(TIMEOUT, move |sink, stop, ready| audit::run(config, sink, stop, Some(ready)))
}

/// A helper program speaking lines on stdin/stdout.
fn helper(program: &str, args: &[&str]) -> LineProcess {
    let mut command = Command::new(program);
    command.args(args);
    LineProcess::spawn(program, command).expect("starting a helper")
}

fn json(helper: &mut LineProcess) -> Value {
    serde_json::from_str(&helper.next_line(TIMEOUT).unwrap()).unwrap()
}

/// Closes the helper's stdin and waits for it to exit successfully.
fn finish(mut helper: LineProcess) {
    helper.close_stdin();
    helper.wait_exit(TIMEOUT).unwrap();
}

fn pid_of(v: &Value) -> u64 {
    v["pid"].as_u64().unwrap()
}

fn is(v: &Value, kind: &str, pid: u64) -> bool {
    v["kind"] == kind && v["pid"] == pid
}

/// What `detect_helper sequence` reported about itself.
struct SequenceRun {
    pid: u64,
    child_pid: u64,
    registered: Value,
}

/// Drives a started `sequence` helper through all steps; returns once tracer reported both
/// exits (the helper's and its child's).
fn drive_sequence(audit: Option<&mut Audit>, mut helper: LineProcess) -> SequenceRun {
    let started = json(&mut helper);
    assert_eq!(started["phase"], "started");
    helper.send_line("go").unwrap();
    let registered = json(&mut helper);
    assert_eq!(registered["phase"], "registered");
    let pid = pid_of(&registered);
    // Let tracer see the ioctl while the fd is open, so the /proc fd check can answer (on a
    // kernel with user_events: elsewhere the ioctl hooks are not attached).
    let mut audit = audit;
    if let Some(a) = audit.as_deref_mut().filter(|_| kernel_has_user_events()) {
        a.wait_for("the helper's user_events_register", TIMEOUT, |v| {
            is(v, "user_events_register", pid)
        });
    }
    helper.send_line("go").unwrap();
    let done = json(&mut helper);
    assert_eq!(done["phase"], "done");
    assert_eq!(done["child_status"], 0);
    let child_pid = done["child_pid"].as_u64().unwrap();
    finish(helper);
    if let Some(a) = audit {
        a.wait_for("the child's exit", TIMEOUT, |v| is(v, "process_exit", child_pid));
        a.wait_for("the helper's exit", TIMEOUT, |v| is(v, "process_exit", pid));
    }
    SequenceRun { pid, child_pid, registered }
}

/// Exactly the events the helper's sequence must produce, field by field.
fn assert_sequence_reported(lines: &[Value], run: &SequenceRun) {
    let r = &run.registered;
    let of = |pid: u64| -> Vec<&Value> { lines.iter().filter(|v| v["pid"] == pid).collect() };
    let kinds = |pid: u64| -> Vec<String> {
        of(pid).iter().map(|v| v["kind"].as_str().unwrap().to_string()).collect()
    };
    let h = of(run.pid);
    for v in h.iter().chain(&of(run.child_pid)) {
        assert_eq!(v["source"], "kernel");
        assert!(v["ts"].as_str().unwrap().ends_with('Z'));
        assert!(v["mono_ns"].as_u64().unwrap() > 0);
        assert!(v["cgroup_id"].as_u64().is_some());
        assert_eq!(v["uid"], 0);
    }
    let (memfd, ready) = (h[0], h[1]);
    assert_eq!(memfd["kind"], "memfd_create");
    assert_eq!(memfd["name"], "dotnet_ipc_created");
    assert_eq!(memfd["memfd"], "dotnet_ipc_created");
    assert_eq!(memfd["flags"], "MFD_CLOEXEC");
    assert_eq!(memfd.get("ret"), None, "seen at entry: no result");
    assert_eq!(memfd["comm"], "detect_helper");

    assert_eq!(ready["kind"], "dotnet_ipc_ready");
    assert_eq!(ready["tid"], run.pid);
    assert_eq!(ready["memfd"], "dotnet_ipc_created");
    assert_eq!(ready["fd"], r["ipc_fd"]);
    assert_eq!(ready["addr"], r["ipc_addr"]);
    assert_eq!(ready["len"], 4096);
    assert_eq!(ready["prot"], "PROT_NONE");
    assert_eq!(ready["flags"], "MAP_PRIVATE");
    assert_eq!(ready["offset"], 0);
    if !kernel_has_user_events() {
        // No user_events_data: no registration can happen, and tracer spares every ioctl of
        // the machine its hooks — the helper's DIAG_IOCSREG on /dev/null is not seen.
        assert_eq!(
            kinds(run.pid),
            ["memfd_create", "dotnet_ipc_ready", "process_fork", "process_exit"],
            "helper events: {:#?}",
            h
        );
        assert_eq!(kinds(run.child_pid), ["process_exec", "process_exit"]);
        return;
    }
    assert_eq!(
        kinds(run.pid),
        [
            "memfd_create",
            "dotnet_ipc_ready",
            "user_events_register",
            "process_fork",
            "process_exit"
        ],
        "helper events: {:#?}",
        h
    );
    assert_eq!(kinds(run.child_pid), ["process_exec", "process_exit"]);
    let (reg, fork, exit) = (h[2], h[3], h[4]);

    assert_eq!(r["ioctl_ret"], -1);
    assert_eq!(r["ioctl_errno"], libc::ENOTTY);
    assert_eq!(reg["ret"], -libc::ENOTTY);
    assert_eq!(reg["error"], "ENOTTY");
    assert_eq!(reg["fd"], r["ioctl_fd"]);
    assert_eq!(reg["cmd"], "0xc0082a00");
    assert_eq!(reg["name_args"], r["name_args"]);
    assert_eq!(reg["enable_addr"], r["enable_addr"]);
    assert_eq!(reg["enable_bit"], r["enable_bit"]);
    assert_eq!(reg["enable_size"], r["enable_size"]);
    assert_eq!(reg["size"], 28);
    assert_eq!(reg["user_events_data"], false, "/dev/null is not user_events_data");
    assert!(reg.get("write_index").is_none(), "a failed REG has no write_index: {reg}");

    assert_eq!(fork["child_pid"], run.child_pid);
    assert!(!fork["clone_flags"].as_str().unwrap().contains("CLONE_THREAD"));
    assert!(exit.get("child_pid").is_none());

    let c = of(run.child_pid);
    assert_eq!(c[0]["filename"], "/bin/true");
    assert_eq!(c[0]["comm"], "true");
    assert_eq!(c[0]["old_tid"], run.child_pid);

    for v in lines {
        assert!(!v.to_string().contains("unrelated"), "unrelated memfd reported: {v}");
        if let Some(addr) = v.get("addr") {
            assert_ne!(addr, &r["unrelated_addr"], "unrelated mapping reported: {v}");
        }
    }
}

#[test]
fn helper_sequence_is_reported_exactly() {
    let mut audit = start_audit(AuditConfig::default());
    let helper = helper(HELPER, &["sequence"]);
    let run = drive_sequence(Some(&mut audit), helper);
    let (lines, summary) = audit.stop();
    assert_sequence_reported(&lines, &run);
    assert_eq!(summary.decode_errors, 0);
    assert!(summary.kernel_events["dotnet_ipc_ready"] >= 1);
    assert!(summary.registrations.is_none());
}

#[test]
fn registration_table_is_printed_on_request() {
    let mut audit = start_audit(AuditConfig { registrations: true, ..AuditConfig::default() });
    let run = drive_sequence(Some(&mut audit), helper(HELPER, &["sequence"]));
    let (lines, summary) = audit.stop();
    let [.., last, summary_line] = lines.as_slice() else { panic!("{lines:#?}") };
    assert_eq!(last["kind"], "registration_table");
    assert_eq!(summary_line["kind"], "summary", "the summary line comes last");
    // The helper's only REG failed (ENOTTY) and it has exited: it holds no registration.
    let table = summary.registrations.expect("table requested");
    assert!(table.get(run.pid as u32).is_empty());
    assert!(table.get(run.child_pid as u32).is_empty());
    assert!(!last["processes"].as_array().unwrap().iter().any(|p| p["pid"] == run.pid), "{last}");
}

/// The programs see an `mmap` at entry: one the kernel then refuses is still reported (the
/// runtime asked to map its marker), with `addr` null — the mapping never showed in
/// `/proc/<pid>/maps` — and once.
#[test]
fn refused_mapping_is_reported_without_an_address() {
    let mut audit = start_audit(AuditConfig::default());
    let mut helper = helper(HELPER, &["map-fails"]);
    let refused = json(&mut helper);
    assert_eq!((refused["phase"].as_str(), refused["errno"].as_i64()), (Some("refused"), Some(1)));
    let pid = pid_of(&refused);
    let v = audit.wait_for("the refused mapping", TIMEOUT, |v| is(v, "dotnet_ipc_ready", pid));
    assert_eq!(v["source"], "kernel");
    assert_eq!(v["fd"], refused["fd"]);
    assert_eq!(v["addr"], Value::Null);
    assert_eq!(v["prot"], "PROT_READ|PROT_WRITE");
    assert_eq!(v["flags"], "MAP_SHARED");
    helper.send_line("go").unwrap();
    finish(helper);
    audit.wait_for("the helper's exit", TIMEOUT, |v| is(v, "process_exit", pid));
    let (lines, _) = audit.stop();
    let kinds: Vec<&str> =
        lines.iter().filter(|v| v["pid"] == pid).map(|v| v["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["memfd_create", "dotnet_ipc_ready", "process_exit"]);
}

#[test]
fn preexisting_mapping_is_reported_from_procfs() {
    let mut helper = helper(HELPER, &["map-and-hold"]);
    let mapped = json(&mut helper);
    assert_eq!(mapped["phase"], "mapped");
    let pid = pid_of(&mapped);
    let mut audit = start_audit(AuditConfig::default());
    let v = audit.wait_for("the procfs finding", TIMEOUT, |v| is(v, "dotnet_ipc_ready", pid));
    assert_eq!(v["source"], "procfs");
    assert_eq!(v["addr"], mapped["addr"]);
    assert_eq!(v["len"], 4096);
    assert_eq!(v["prot"], "PROT_NONE");
    assert_eq!(v["flags"], "MAP_PRIVATE");
    assert_eq!(v["memfd"], "dotnet_ipc_created");
    assert_eq!(v["comm"], "detect_helper");
    assert_eq!(v["path"], "/memfd:dotnet_ipc_created (deleted)");
    assert_eq!(v["uid"], 0);
    helper.send_line("go").unwrap();
    finish(helper);
    let (lines, _) = audit.stop();
    let mine: Vec<&Value> = lines.iter().filter(|v| v["pid"] == pid).collect();
    assert_eq!(mine.len(), 1, "only the procfs finding: {mine:#?}");
}

#[test]
fn process_exit_comes_with_the_last_thread_not_the_leader() {
    let mut audit = start_audit(AuditConfig::default());
    let mut helper = helper(HELPER, &["leader-exits-first"]);
    let mapped = json(&mut helper);
    assert_eq!(mapped["phase"], "mapped");
    let pid = pid_of(&mapped);
    let gone = json(&mut helper);
    assert_eq!(gone["phase"], "leader_gone");
    let tid = gone["tid"].as_u64().unwrap();
    assert_ne!(tid, pid);
    // The leader's exit did not end the process: what its last thread maps is still its own.
    audit.wait_for("the mapping made after the leader's exit", TIMEOUT, |v| {
        is(v, "dotnet_runtime_seen", pid)
    });
    helper.send_line("go").unwrap();
    finish(helper);
    let exit = audit.wait_for("the process's exit", TIMEOUT, |v| is(v, "process_exit", pid));
    assert_eq!(exit["tid"], tid, "reported when the last thread exits: {exit}");
    let (lines, _) = audit.stop();
    let kinds: Vec<&str> =
        lines.iter().filter(|v| v["pid"] == pid).map(|v| v["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["memfd_create", "dotnet_ipc_ready", "memfd_create", "dotnet_runtime_seen", "process_exit"]
    );
}

#[test]
fn coreclr_runtime_is_seen_live() {
    let mut audit = start_audit(AuditConfig::default());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("dotnet/coreclr_host.py");
    let mut host = helper("python3", &[script.to_str().unwrap()]);
    let ready = host.next_line(CORECLR_TIMEOUT).unwrap();
    let fields: Vec<&str> = ready.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"READY"), "CoreCLR host failed to start: {ready}");
    assert!(fields[2].starts_with("8.0.4"), "{ready}");
    let pid: u64 = fields[1].parse().unwrap();
    let v =
        audit.wait_for("the CoreCLR doublemapper", TIMEOUT, |v| is(v, "dotnet_runtime_seen", pid));
    assert_eq!(v["source"], "kernel");
    assert_eq!(v["memfd"], "doublemapper");
    assert!(v["addr"].as_str().unwrap().starts_with("0x"));
    host.send_line("exit").unwrap();
    finish(host);
    audit.wait_for("the CoreCLR host's exit", TIMEOUT, |v| is(v, "process_exit", pid));
    let (lines, _) = audit.stop();
    let seen = lines.iter().filter(|v| is(v, "dotnet_runtime_seen", pid)).count();
    assert_eq!(seen, 1, "reported once per process");
    let created = lines.iter().filter(|v| is(v, "memfd_create", pid)).collect::<Vec<_>>();
    // W^X: CoreCLR creates its one doublemapper memfd at start-up, and no other of interest.
    assert_eq!(created.len(), 1, "{created:#?}");
    assert_eq!(created[0]["memfd"], "doublemapper");
    assert_eq!(created[0]["name"], "doublemapper");
}

#[test]
fn pid_filter_excludes_other_processes() {
    let target = helper(HELPER, &["sequence"]);
    let other = helper(HELPER, &["sequence"]);
    // Both wait at `started` until told to go; their pids are known before tracer attaches.
    let target_pid = target.pid();
    let mut audit =
        start_audit(AuditConfig { target_pids: vec![target_pid], ..AuditConfig::default() });
    let other_thread = std::thread::spawn(move || drive_sequence(None, other));
    let run = drive_sequence(Some(&mut audit), target);
    let other_run = other_thread.join().unwrap();
    let (lines, _) = audit.stop();
    assert_eq!(run.pid, u64::from(target_pid));
    assert_sequence_reported(&lines, &run);
    for v in &lines {
        assert_ne!(v["pid"], other_run.pid, "filtered process reported: {v}");
        assert_ne!(v["pid"], other_run.child_pid, "filtered child reported: {v}");
    }
}

#[test]
fn cli_exits_zero_on_sigint_with_summary() {
    let mut tracer = Command::new(tracer_binary())
        .args(["audit", "--registrations"])
        .env("TRACER_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = line_channel(tracer.stdout.take().unwrap());
    let stderr = line_channel(tracer.stderr.take().unwrap());
    let mut err_text = String::new();
    loop {
        let line = stderr.recv_timeout(TIMEOUT).expect("tracer did not report attaching");
        err_text.push_str(&line);
        err_text.push('\n');
        if line.contains("attached") {
            break;
        }
    }
    let run = drive_sequence(None, helper(HELPER, &["sequence"]));
    // Wait for the helper's exit line on stdout before stopping.
    let mut out = Vec::new();
    loop {
        let line = stdout.recv_timeout(TIMEOUT).expect("helper exit not printed");
        let v: Value = serde_json::from_str(&line).unwrap();
        let done = is(&v, "process_exit", run.pid);
        out.push(v);
        if done {
            break;
        }
    }
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) }, 0);
    let status = wait_child_exit(&mut tracer, TIMEOUT);
    assert_eq!(status.code(), Some(0), "stderr:\n{err_text}");
    err_text.extend(stderr.iter().map(|l| l + "\n"));
    out.extend(stdout.iter().map(|l| serde_json::from_str(&l).unwrap()));
    assert!(err_text.contains("tracer audit summary"), "{err_text}");
    assert!(err_text.contains("losses:"), "{err_text}");
    assert!(err_text.contains("sequence gaps:"), "{err_text}");
    assert!(err_text.contains("user_events registrations at exit:"), "{err_text}");
    let [.., table, summary_line] = out.as_slice() else { panic!("{out:#?}") };
    assert_eq!(
        (table["kind"].as_str(), summary_line["kind"].as_str()),
        (Some("registration_table"), Some("summary"))
    );
    assert_eq!(out.iter().filter(|v| is(v, "dotnet_ipc_ready", run.pid)).count(), 1);
}

#[test]
fn cli_without_capabilities_names_the_missing_ones() {
    // Root without any capability: an empty bounding set leaves nothing to gain at exec.
    let output = Command::new("setpriv")
        .args(["--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--"])
        .arg(tracer_binary())
        .args(["audit", "--duration", "1s"])
        .output()
        .expect("setpriv (util-linux) is needed for this test");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("missing: CAP_BPF, CAP_PERFMON"), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn unknown_pid_is_refused_before_attaching() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Above the kernel's PID_MAX_LIMIT: can never exist.
    let pid = i32::MAX as u32;
    let config = AuditConfig { target_pids: vec![pid], ..AuditConfig::default() };
    let err = rt
        .block_on(audit::run(config, JsonLines::writer(std::io::sink()), async {}, None))
        .unwrap_err();
    assert_eq!(err.to_string(), format!("--pid {pid}: no such process"));
}

#[test]
fn cli_duration_stops_and_output_goes_to_file() {
    let mut helper = helper(HELPER, &["map-and-hold"]);
    let mapped = json(&mut helper);
    let out = std::env::temp_dir().join(format!("tracer-audit-{}.jsonl", std::process::id()));
    let mut tracer = Command::new(tracer_binary())
        .args(["audit", "--duration", "1500ms", "--output"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_child_exit(&mut tracer, TIMEOUT);
    let mut stderr = String::new();
    tracer.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let mut stdout = String::new();
    tracer.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("stopping (duration)"), "{stderr}");
    assert!(stderr.contains("tracer audit summary"), "{stderr}");
    assert!(stdout.is_empty(), "JSON goes to the file: {stdout}");
    let text = std::fs::read_to_string(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let found: Vec<&Value> =
        lines.iter().filter(|v| is(v, "dotnet_ipc_ready", pid_of(&mapped))).collect();
    assert_eq!(found.len(), 1, "{text}");
    assert_eq!(found[0]["source"], "procfs");
    assert_eq!(found[0]["addr"], mapped["addr"]);
    helper.send_line("go").unwrap();
    finish(helper);
}

/// The helper binding `names`; returns it and its `bound` report.
fn bind_helper(names: &[String]) -> (LineProcess, Value) {
    let mut args = vec!["bind"];
    args.extend(names.iter().map(String::as_str));
    let mut helper = helper(HELPER, &args);
    let bound = json(&mut helper);
    assert_eq!(bound["phase"], "bound");
    (helper, bound)
}

#[test]
fn diagnostic_socket_binds_are_matched_in_the_kernel_once_per_process() {
    let tmp = tests::scratch::ScratchDir::new("audit-bind");
    let dir = tmp.path().to_str().unwrap().to_owned();
    let mut audit = start_audit(AuditConfig::default());
    let names: Vec<String> = [
        "dotnet-diagnostic-1-2-socketx",
        "xdotnet-diagnostic-1-2-socket",
        "dotnet-diagnostic-1--socket",
        "dotnet-diagnostic-12345678901234567890-2-socket",
        "dotnet-diagnostic-1-2-socket",
        "dotnet-diagnostic-3-4-socket",
    ]
    .iter()
    .map(|n| format!("{dir}/{n}"))
    .collect();
    let (plain, bound) = bind_helper(&names);
    let fds: Vec<i64> =
        bound["fds"].as_array().unwrap().iter().map(|f| f.as_i64().unwrap()).collect();
    assert!(fds.iter().all(|&fd| fd >= 0), "every bind succeeded: {fds:?}");
    let pid = pid_of(&bound);
    let abstract_name = format!("@tracer-test-{}/dotnet-diagnostic-5-6-socket", std::process::id());
    let (abs, abs_bound) = bind_helper(std::slice::from_ref(&abstract_name));
    let abs_pid = pid_of(&abs_bound);
    let full = format!("full:{dir}/dotnet-diagnostic-7-8-socket");
    let (sized, sized_bound) = bind_helper(&[full]);
    let sized_pid = pid_of(&sized_bound);

    let v =
        audit.wait_for("the diagnostic socket bind", TIMEOUT, |v| is(v, "dotnet_ipc_socket", pid));
    assert_eq!(v["source"], "kernel");
    assert_eq!(v["path"], names[4], "the first matching name: {v}");
    assert_eq!(v["fd"], fds[4]);
    assert_eq!(v["abstract"], false);
    assert_eq!((v["socket_pid"].as_u64(), v["key"].as_u64()), (Some(1), Some(2)));
    assert_eq!(v["comm"], "detect_helper");
    let v = audit.wait_for("the abstract bind", TIMEOUT, |v| is(v, "dotnet_ipc_socket", abs_pid));
    assert_eq!(v["abstract"], true);
    assert_eq!(v["path"], abstract_name[1..]);
    assert_eq!((v["socket_pid"].as_u64(), v["key"].as_u64()), (Some(5), Some(6)));
    let v =
        audit.wait_for("the full-size bind", TIMEOUT, |v| is(v, "dotnet_ipc_socket", sized_pid));
    assert_eq!(v["path"], format!("{dir}/dotnet-diagnostic-7-8-socket"));
    for helper in [plain, abs, sized] {
        finish(helper);
    }
    for p in [pid, abs_pid, sized_pid] {
        audit.wait_for("the helper's exit", TIMEOUT, |v| is(v, "process_exit", p));
    }
    let (lines, _) = audit.stop();
    for p in [pid, abs_pid, sized_pid] {
        let kinds: Vec<&str> =
            lines.iter().filter(|v| v["pid"] == p).map(|v| v["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["dotnet_ipc_socket", "process_exit"], "pid {p}");
    }
}

/// Runs of one kernel program at once on one CPU (four helpers pinned to CPU 0, each mapping
/// 100 fresh `dotnet_ipc_created` memfds in child processes) get distinct sequence numbers, so
/// the gap arithmetic (highest + 1 − received) counts only events that were really lost: every
/// child's `dotnet_ipc_ready` is reported once, no (cpu, kind, seq) appears twice, and the run
/// has no gap and no loss.
#[test]
fn concurrent_runs_on_one_cpu_get_distinct_sequence_numbers() {
    const HELPERS: usize = 4;
    const CHILDREN: usize = 100;
    let audit = start_audit(AuditConfig::default());
    let helpers: Vec<LineProcess> = (0..HELPERS)
        .map(|_| {
            let mut command = Command::new("taskset");
            command.args(["-c", "0", HELPER, "latency", &CHILDREN.to_string()]);
            LineProcess::spawn("detect_helper latency", command).expect("starting a helper")
        })
        .collect();
    // Each child prints its pid once it has mapped.
    let mut children = std::collections::HashSet::new();
    for mut h in helpers {
        for _ in 0..CHILDREN {
            children.insert(json(&mut h)["pid"].as_u64().unwrap());
        }
        h.wait_exit(TIMEOUT).unwrap();
    }
    let (lines, summary) = audit.stop();
    let ready = lines
        .iter()
        .filter(|l| l["kind"] == "dotnet_ipc_ready")
        .filter(|l| l["pid"].as_u64().is_some_and(|p| children.contains(&p)))
        .count();
    assert_eq!((ready, children.len()), (HELPERS * CHILDREN, HELPERS * CHILDREN));
    let mut seen = std::collections::HashSet::new();
    for l in lines.iter().filter(|l| l["source"] == "kernel") {
        let key = (l["cpu"].as_u64(), l["kind"].as_str().unwrap().to_owned(), l["seq"].as_u64());
        assert!(seen.insert(key.clone()), "sequence number used twice: {key:?}");
    }
    assert_eq!(summary.seq_gaps, vec![], "no events missing");
    // A forked child has no page-table entry yet for the name it passes to memfd_create, so the
    // programs cannot read it at syscall entry: the creation line is lost (counted), the
    // mapping is still detected (docs/protocol/bpf-detection.md §7).
    let lost: Vec<_> = summary
        .losses
        .iter()
        .filter(|l| (l.kind, l.reason) != (EventKind::MemfdCreate, LossReason::ReadFailed))
        .collect();
    assert_eq!(lost, Vec::<&tracer::kernel::detect::Loss>::new());
}
