//! `tracer audit` on the real kernel (root): the library entry point and the built binary,
//! against `detect_helper` and a real CoreCLR 8.0.4. Every wait is on an event or a line with a
//! timeout; assertions compare exact fields and counts for the processes each test started.
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tests::audit_scenarios::{
    self, assert_sequence_reported, drive_sequence, finish, helper, json, pid_of, start_audit,
};
use tests::pipeline::is;
use tests::process::{line_channel, tracer_binary, wait_child_exit};
use tracer::kernel::detect::HookChoice;
use tracer::output::JsonLines;
use tracer::pipeline::audit::{self, AuditConfig};

const TIMEOUT: Duration = Duration::from_secs(20);
const HELPER: &str = env!("CARGO_BIN_EXE_detect_helper");

#[test]
fn helper_sequence_is_reported_exactly() {
    audit_scenarios::helper_sequence_is_reported_exactly(HookChoice::Auto);
}

/// This host loads `tp_btf`, so `auto` runs the lifecycle hooks there; the classic tracepoint
/// programs, chosen, report the same fork, exec and exit.
#[test]
fn helper_sequence_is_reported_exactly_on_classic_tracepoints() {
    audit_scenarios::helper_sequence_is_reported_exactly(HookChoice::SyscallTracepoints);
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

#[test]
fn refused_mapping_is_reported_without_an_address() {
    audit_scenarios::refused_mapping_is_reported_without_an_address(HookChoice::Auto);
}

#[test]
fn fixed_mapping_is_reported_at_its_address() {
    audit_scenarios::fixed_mapping_is_reported_at_its_address(HookChoice::Auto);
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
    audit_scenarios::process_exit_comes_with_the_last_thread_not_the_leader(HookChoice::Auto);
}

/// `group_dead` from the classic tracepoint's record (the test above: from the tp_btf
/// argument).
#[test]
fn process_exit_comes_with_the_last_thread_on_classic_tracepoints() {
    audit_scenarios::process_exit_comes_with_the_last_thread_not_the_leader(
        HookChoice::SyscallTracepoints,
    );
}

#[test]
fn coreclr_runtime_is_seen_live() {
    audit_scenarios::coreclr_runtime_is_seen_live(HookChoice::Auto);
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
    let (lines, summary) = audit.stop();
    assert_eq!(run.pid, u64::from(target_pid));
    assert_sequence_reported(&lines, &run, audit_scenarios::creations_may_be_lost(&summary));
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
    // BPF trampolines are refused on this host (EPERM): auto falls back, and says so.
    assert!(err_text.contains("  detection hooks: syscall tracepoints"), "{err_text}");
    let [.., table, summary_line] = out.as_slice() else { panic!("{out:#?}") };
    assert_eq!(summary_line["hooks"], "syscall_tracepoints");
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

#[test]
fn diagnostic_socket_binds_are_matched_in_the_kernel_once_per_process() {
    audit_scenarios::diagnostic_socket_binds_are_matched_in_the_kernel_once_per_process(
        HookChoice::Auto,
    );
}

#[test]
fn concurrent_runs_on_one_cpu_get_distinct_sequence_numbers() {
    audit_scenarios::concurrent_runs_on_one_cpu_get_distinct_sequence_numbers(
        HookChoice::Auto,
        100,
    );
}
