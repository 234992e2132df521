//! Detection next to processes that try to flood it, and the `--pid` promise ("and its
//! descendants") at start-up. Real processes, real kernel, `audit::run` in-process.
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tests::pipeline::{Running, is};
use tests::process::LineProcess;
use tracer::pipeline::audit::{self, AuditConfig, AuditSummary};

const HELPER: &str = env!("CARGO_BIN_EXE_detect_helper");
const TIMEOUT: Duration = Duration::from_secs(30);

fn start_audit(config: AuditConfig) -> Running<AuditSummary> {
    Running::start(TIMEOUT, move |sink, stop, ready| audit::run(config, sink, stop, Some(ready)))
}

#[test]
fn a_process_mapping_its_ipc_memfd_in_a_loop_is_reported_once() {
    const TIMES: &str = "2000";
    let mut audit = start_audit(AuditConfig::default());
    let mut command = Command::new(HELPER);
    command.args(["map-repeat", TIMES]);
    let mut helper = LineProcess::spawn("detect_helper", command).unwrap();
    let mapped: Value = serde_json::from_str(&helper.next_line(TIMEOUT).unwrap()).unwrap();
    assert_eq!(mapped["times"], 2000);
    let pid = mapped["pid"].as_u64().unwrap();
    helper.close_stdin();
    helper.wait_exit(TIMEOUT).unwrap();
    // The exit comes after every event of the process.
    audit.wait_for("process_exit", TIMEOUT, |v| is(v, "process_exit", pid));
    let (lines, summary) = audit.stop();
    let ready: Vec<&Value> = lines.iter().filter(|v| is(v, "dotnet_ipc_ready", pid)).collect();
    assert_eq!(ready.len(), 1, "2001 mappings of two memfds, one report");
    assert_eq!(ready[0]["source"], "kernel");
    let memfds = lines.iter().filter(|v| is(v, "memfd_create", pid)).count();
    // The losses, if any, say why one is missing (a program run the kernel skipped).
    assert_eq!(memfds, 2, "each memfd_create is still audited; lost: {:?}", summary.loss_counts());
    assert_eq!(summary.total_lost(), 0);
}

#[test]
fn pid_filter_covers_descendants_that_already_run_at_start() {
    // A shell (the target) whose child already maps the IPC memfd when tracer starts.
    let mut command = Command::new("sh");
    command.args(["-c", &format!("{HELPER} map-and-hold; :")]);
    let mut parent = LineProcess::spawn("sh", command).unwrap();
    let mapped: Value = serde_json::from_str(&parent.next_line(TIMEOUT).unwrap()).unwrap();
    let child = mapped["pid"].as_u64().unwrap();
    assert_ne!(child, u64::from(parent.pid()), "the mapping is the child's");
    let config = AuditConfig { target_pids: vec![parent.pid()], ..AuditConfig::default() };
    let audit = start_audit(config);
    let (lines, _) = audit.stop();
    let found: Vec<&Value> = lines.iter().filter(|v| is(v, "dotnet_ipc_ready", child)).collect();
    assert_eq!(found.len(), 1, "{lines:#?}");
    assert_eq!(found[0]["source"], "procfs");
    assert_eq!(found[0]["addr"], mapped["addr"]);
    parent.close_stdin();
    parent.wait_exit(TIMEOUT).unwrap();
}
