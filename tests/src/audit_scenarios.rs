//! `tracer audit` scenarios on the real kernel, shared by the host tests (`tests/audit.rs`,
//! `--hooks auto`) and the VM tests (`tests/vm_detection.rs`, each with both mechanisms): what
//! `detect_helper` does and what tracer must report about it, field by field. Every wait is on
//! a line with a timeout; assertions are about the processes each scenario started.
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tracer::kernel::detect::HookChoice;
use tracer::pipeline::audit::{self, AuditConfig, AuditSummary};
use tracer_common::{EventKind, LossReason};

use crate::pipeline::{Running, is};
use crate::process::LineProcess;
use crate::user_events::kernel_has_user_events;

/// `detect_helper` (a binary of this package, built with the test executables).
pub fn detect_helper() -> String {
    let bin = crate::process::built_binary("detect_helper", "`cargo build -p tests --bins`");
    bin.to_str().expect("a UTF-8 path").to_owned()
}

/// Every wait: 20 s on the host; TCG runs the VM guest 5–20× slower.
pub fn timeout() -> Duration {
    Duration::from_secs(if std::env::var_os("TRACER_VM").is_some() { 120 } else { 20 })
}

/// CoreCLR start-up under load can take a while.
pub fn coreclr_timeout() -> Duration {
    timeout() * 6
}

/// One test per function and mechanism: for each `name` (a function of `hooks: HookChoice`
/// and the extra arguments given, in scope where this is used), `trampolines::name` and
/// `syscall_tracepoints::name`, each insisting on its mechanism.
#[macro_export]
macro_rules! test_with_both_mechanisms {
    ($($name:ident $(($($arg:expr),*))?;)*) => {
        mod trampolines {
            $(#[test]
            fn $name() {
                super::$name(tracer::kernel::detect::HookChoice::Trampolines $($(, $arg)*)?);
            })*
        }
        mod syscall_tracepoints {
            $(#[test]
            fn $name() {
                super::$name(
                    tracer::kernel::detect::HookChoice::SyscallTracepoints $($(, $arg)*)?
                );
            })*
        }
    };
}

/// The audit configuration of a scenario: every process, hooks as chosen.
pub fn config(hooks: HookChoice) -> AuditConfig {
    AuditConfig { hooks, ..AuditConfig::default() }
}

/// The summary's mechanisms are the ones chosen (`auto`: whichever the kernel took).
pub fn assert_hooks(summary: &AuditSummary, hooks: HookChoice) {
    let name = summary.hooks.as_ref().map(|h| h.name());
    let lifecycle = summary.lifecycle_hooks.as_ref().map(|h| h.name());
    match hooks {
        HookChoice::Trampolines => {
            assert_eq!((name, lifecycle), (Some("trampolines"), Some("btf_tracepoints")))
        }
        HookChoice::SyscallTracepoints => {
            assert_eq!((name, lifecycle), (Some("syscall_tracepoints"), Some("tracepoints")))
        }
        HookChoice::Auto => assert!(name.is_some() && lifecycle.is_some(), "{summary:?}"),
    }
}

/// `audit::run` on its own thread (the shared pipeline harness).
pub type Audit = Running<AuditSummary>;

pub fn start_audit(config: AuditConfig) -> Audit {
    Running::start(timeout(), move |sink, stop, ready| audit::run(config, sink, stop, Some(ready)))
}

/// A helper program speaking lines on stdin/stdout.
pub fn helper(program: &str, args: &[&str]) -> LineProcess {
    let mut command = Command::new(program);
    command.args(args);
    LineProcess::spawn(program, command).expect("starting a helper")
}

pub fn json(helper: &mut LineProcess) -> Value {
    serde_json::from_str(&helper.next_line(timeout()).unwrap()).unwrap()
}

/// Closes the helper's stdin and waits for it to exit successfully.
pub fn finish(mut helper: LineProcess) {
    helper.close_stdin();
    helper.wait_exit(timeout()).unwrap();
}

pub fn pid_of(v: &Value) -> u64 {
    v["pid"].as_u64().unwrap()
}

/// What `detect_helper sequence` reported about itself.
pub struct SequenceRun {
    pub pid: u64,
    pub child_pid: u64,
    pub registered: Value,
}

/// Drives a started `sequence` helper through all steps; returns once tracer reported both
/// exits (the helper's and its child's).
pub fn drive_sequence(audit: Option<&mut Audit>, mut helper: LineProcess) -> SequenceRun {
    let started = json(&mut helper);
    assert_eq!(started["phase"], "started");
    helper.send_line("go").unwrap();
    let registered = json(&mut helper);
    assert_eq!(registered["phase"], "registered");
    let pid = pid_of(&registered);
    let mut audit = audit;
    if let Some(a) = audit.as_deref_mut() {
        // The mapping's line first: on syscall tracepoints its address is read from
        // /proc/<pid>/maps, which a process that has exited no longer has.
        a.wait_for("the helper's mapping", timeout(), |v| is(v, "dotnet_ipc_ready", pid));
        // Let tracer see the ioctl while the fd is open, so the /proc fd check can answer (on
        // a kernel with user_events: elsewhere the ioctl hooks are not attached).
        if kernel_has_user_events() {
            a.wait_for("the helper's user_events_register", timeout(), |v| {
                is(v, "user_events_register", pid)
            });
        }
    }
    helper.send_line("go").unwrap();
    let done = json(&mut helper);
    assert_eq!(done["phase"], "done");
    assert_eq!(done["child_status"], 0);
    let child_pid = done["child_pid"].as_u64().unwrap();
    finish(helper);
    if let Some(a) = audit {
        a.wait_for("the child's exit", timeout(), |v| is(v, "process_exit", child_pid));
        a.wait_for("the helper's exit", timeout(), |v| is(v, "process_exit", pid));
    }
    SequenceRun { pid, child_pid, registered }
}

/// Whether a `memfd_create` line may be missing from `summary`'s run: on the syscall
/// tracepoints a name on a page the process has not touched yet cannot be read at entry (a
/// string literal of a binary just loaded, say), so the line is lost and counted
/// (`read_failed`) while the mapping is still reported (docs/protocol/bpf-detection.md §7).
/// The trampolines read the name after the kernel copied it: never lost there.
pub fn creations_may_be_lost(summary: &AuditSummary) -> bool {
    let on_tracepoints = summary.hooks.as_ref().is_some_and(|h| h.name() == "syscall_tracepoints");
    on_tracepoints
        && summary
            .losses
            .iter()
            .any(|l| (l.kind, l.reason) == (EventKind::MemfdCreate, LossReason::ReadFailed))
}

/// The kinds of `pid`'s lines, in order; without `memfd_create` when `lost_creations` (see
/// [`creations_may_be_lost`]): compare them with [`expected_kinds`].
pub fn kinds_of(lines: &[Value], pid: u64, lost_creations: bool) -> Vec<&str> {
    let kinds = lines.iter().filter(|v| v["pid"] == pid).map(|v| v["kind"].as_str().unwrap());
    kinds.filter(|k| !(lost_creations && *k == "memfd_create")).collect()
}

/// `expected`, without `memfd_create` when `lost_creations`.
pub fn expected_kinds<'a>(expected: &[&'a str], lost_creations: bool) -> Vec<&'a str> {
    expected.iter().copied().filter(|k| !(lost_creations && *k == "memfd_create")).collect()
}

/// Exactly the events the helper's sequence must produce, field by field (`lost_creations`:
/// see [`creations_may_be_lost`]).
pub fn assert_sequence_reported(lines: &[Value], run: &SequenceRun, lost_creations: bool) {
    let r = &run.registered;
    let of = |pid: u64| -> Vec<&Value> { lines.iter().filter(|v| v["pid"] == pid).collect() };
    let kinds = |pid: u64| kinds_of(lines, pid, lost_creations);
    let expected = |kinds: &[&'static str]| expected_kinds(kinds, lost_creations);
    let h: Vec<&Value> = of(run.pid).into_iter().filter(|v| v["kind"] != "memfd_create").collect();
    let created = of(run.pid).into_iter().find(|v| v["kind"] == "memfd_create");
    for v in h.iter().chain(&of(run.child_pid)) {
        assert_eq!(v["source"], "kernel");
        assert!(v["ts"].as_str().unwrap().ends_with('Z'));
        assert!(v["mono_ns"].as_u64().unwrap() > 0);
        assert!(v["cgroup_id"].as_u64().is_some());
        assert_eq!(v["uid"], 0);
    }
    match created {
        Some(memfd) => {
            assert_eq!(memfd["name"], "dotnet_ipc_created");
            assert_eq!(memfd["memfd"], "dotnet_ipc_created");
            assert_eq!(memfd["flags"], "MFD_CLOEXEC");
            assert_eq!(memfd.get("ret"), None, "no result, by either mechanism");
            assert_eq!(memfd["comm"], "detect_helper");
        }
        None => assert!(lost_creations, "no memfd_create line and none counted lost"),
    }
    let ready = h[0];

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
            expected(&["memfd_create", "dotnet_ipc_ready", "process_fork", "process_exit"]),
            "helper events: {:#?}",
            h
        );
        assert_eq!(kinds(run.child_pid), ["process_exec", "process_exit"]);
        return;
    }
    assert_eq!(
        kinds(run.pid),
        expected(&[
            "memfd_create",
            "dotnet_ipc_ready",
            "user_events_register",
            "process_fork",
            "process_exit"
        ]),
        "helper events: {:#?}",
        h
    );
    assert_eq!(kinds(run.child_pid), ["process_exec", "process_exit"]);
    let (reg, fork, exit) = (h[1], h[2], h[3]);

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

/// `detect_helper sequence`: memfd_create, the IPC marker's mapping, a refused REG on
/// /dev/null, fork, exec, exit — each reported exactly, nothing else.
pub fn helper_sequence_is_reported_exactly(hooks: HookChoice) {
    let mut audit = start_audit(config(hooks));
    let helper = helper(&detect_helper(), &["sequence"]);
    let run = drive_sequence(Some(&mut audit), helper);
    let (lines, summary) = audit.stop();
    assert_sequence_reported(&lines, &run, creations_may_be_lost(&summary));
    assert_hooks(&summary, hooks);
    assert_eq!(summary.decode_errors, 0);
    assert!(summary.kernel_events["dotnet_ipc_ready"] >= 1);
    assert!(summary.registrations.is_none());
}

/// An `mmap` of the marker the kernel refuses is still reported (the runtime asked to map its
/// marker), with `addr` null — from the syscall tracepoint because the mapping never showed in
/// `/proc/<pid>/maps`, from the trampoline because the result is an error — and once.
pub fn refused_mapping_is_reported_without_an_address(hooks: HookChoice) {
    let mut audit = start_audit(config(hooks));
    let mut helper = helper(&detect_helper(), &["map-fails"]);
    let refused = json(&mut helper);
    assert_eq!((refused["phase"].as_str(), refused["errno"].as_i64()), (Some("refused"), Some(1)));
    let pid = pid_of(&refused);
    let v = audit.wait_for("the refused mapping", timeout(), |v| is(v, "dotnet_ipc_ready", pid));
    assert_eq!(v["source"], "kernel");
    assert_eq!(v["fd"], refused["fd"]);
    assert_eq!(v["addr"], Value::Null);
    assert_eq!(v["prot"], "PROT_READ|PROT_WRITE");
    assert_eq!(v["flags"], "MAP_SHARED");
    end_with_one_mapping(audit, helper, pid, hooks);
}

/// Lets a holding helper exit, then checks all tracer said of it: the marker's creation (where
/// it could be read), its one mapping, its exit.
fn end_with_one_mapping(mut audit: Audit, mut helper: LineProcess, pid: u64, hooks: HookChoice) {
    helper.send_line("go").unwrap();
    finish(helper);
    audit.wait_for("the helper's exit", timeout(), |v| is(v, "process_exit", pid));
    let (lines, summary) = audit.stop();
    assert_hooks(&summary, hooks);
    let lost = creations_may_be_lost(&summary);
    assert_eq!(
        kinds_of(&lines, pid, lost),
        expected_kinds(&["memfd_create", "dotnet_ipc_ready", "process_exit"], lost)
    );
}

/// A `MAP_FIXED` mapping of the marker (no address search in the kernel, which some hooks
/// would depend on) is reported once, at the address it was given.
pub fn fixed_mapping_is_reported_at_its_address(hooks: HookChoice) {
    let mut audit = start_audit(config(hooks));
    let mut helper = helper(&detect_helper(), &["map-fixed"]);
    let mapped = json(&mut helper);
    assert_eq!(mapped["phase"], "mapped");
    let pid = pid_of(&mapped);
    let v = audit.wait_for("the fixed mapping", timeout(), |v| is(v, "dotnet_ipc_ready", pid));
    assert_eq!(v["source"], "kernel");
    assert_eq!(v["addr"], mapped["addr"]);
    assert_eq!(v["prot"], "PROT_READ");
    assert_eq!(v["flags"], "MAP_SHARED|MAP_FIXED");
    end_with_one_mapping(audit, helper, pid, hooks);
}

/// A process whose leader exits first ends with its last thread — told by the exit tracepoint's
/// `group_dead` where it has one, else by the thread group's live count — and what that thread
/// maps is still the process's.
pub fn process_exit_comes_with_the_last_thread_not_the_leader(hooks: HookChoice) {
    let mut audit = start_audit(config(hooks));
    let mut helper = helper(&detect_helper(), &["leader-exits-first"]);
    let mapped = json(&mut helper);
    assert_eq!(mapped["phase"], "mapped");
    let pid = pid_of(&mapped);
    let gone = json(&mut helper);
    assert_eq!(gone["phase"], "leader_gone");
    let tid = gone["tid"].as_u64().unwrap();
    assert_ne!(tid, pid);
    audit.wait_for("the mapping made after the leader's exit", timeout(), |v| {
        is(v, "dotnet_runtime_seen", pid)
    });
    helper.send_line("go").unwrap();
    finish(helper);
    let exit = audit.wait_for("the process's exit", timeout(), |v| is(v, "process_exit", pid));
    let (lines, summary) = audit.stop();
    assert_hooks(&summary, hooks);
    let lost = creations_may_be_lost(&summary);
    let kinds = kinds_of(&lines, pid, lost);
    // Where the exit tracepoint says `group_dead` (6.18) and where the programs read the thread
    // group's live count instead (6.12): reported once, when the last thread exits.
    assert_eq!(exit["tid"], tid, "reported when the last thread exits: {exit}");
    let expected =
        ["memfd_create", "dotnet_ipc_ready", "memfd_create", "dotnet_runtime_seen", "process_exit"];
    assert_eq!(kinds, expected_kinds(&expected, lost));
}

/// A real CoreCLR 8.0.4 (W^X on): its one `doublemapper` memfd and its mapping, once.
pub fn coreclr_runtime_is_seen_live(hooks: HookChoice) {
    let mut audit = start_audit(config(hooks));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("dotnet/coreclr_host.py");
    let mut host = helper("python3", &[script.to_str().unwrap()]);
    let ready = host.next_line(coreclr_timeout()).unwrap();
    let fields: Vec<&str> = ready.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"READY"), "CoreCLR host failed to start: {ready}");
    assert!(fields[2].starts_with("8.0.4"), "{ready}");
    let pid: u64 = fields[1].parse().unwrap();
    let v = audit
        .wait_for("the CoreCLR doublemapper", timeout(), |v| is(v, "dotnet_runtime_seen", pid));
    assert_eq!(v["source"], "kernel");
    assert_eq!(v["memfd"], "doublemapper");
    assert!(v["addr"].as_str().unwrap().starts_with("0x"));
    host.send_line("exit").unwrap();
    finish(host);
    audit.wait_for("the CoreCLR host's exit", timeout(), |v| is(v, "process_exit", pid));
    let (lines, summary) = audit.stop();
    assert_hooks(&summary, hooks);
    let seen = lines.iter().filter(|v| is(v, "dotnet_runtime_seen", pid)).count();
    assert_eq!(seen, 1, "reported once per process");
    let created = lines.iter().filter(|v| is(v, "memfd_create", pid)).collect::<Vec<_>>();
    // W^X: CoreCLR creates its one doublemapper memfd at start-up, and no other of interest.
    if created.is_empty() && creations_may_be_lost(&summary) {
        return;
    }
    assert_eq!(created.len(), 1, "{created:#?}");
    assert_eq!(created[0]["memfd"], "doublemapper");
    assert_eq!(created[0]["name"], "doublemapper");
}

/// The helper binding `names`; returns it and its `bound` report.
fn bind_helper(names: &[String]) -> (LineProcess, Value) {
    let mut args = vec!["bind"];
    args.extend(names.iter().map(String::as_str));
    let mut helper = helper(&detect_helper(), &args);
    let bound = json(&mut helper);
    assert_eq!(bound["phase"], "bound");
    (helper, bound)
}

/// Diagnostic socket names are matched in the kernel (near misses are not), the first match
/// of a process is reported and no later one; abstract and full-size names too.
pub fn diagnostic_socket_binds_are_matched_in_the_kernel_once_per_process(hooks: HookChoice) {
    let tmp = crate::scratch::ScratchDir::new("audit-bind");
    let dir = tmp.path().to_str().unwrap().to_owned();
    let mut audit = start_audit(config(hooks));
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

    let v = audit
        .wait_for("the diagnostic socket bind", timeout(), |v| is(v, "dotnet_ipc_socket", pid));
    assert_eq!(v["source"], "kernel");
    assert_eq!(v["path"], names[4], "the first matching name: {v}");
    assert_eq!(v["fd"], fds[4]);
    assert_eq!(v["abstract"], false);
    assert_eq!((v["socket_pid"].as_u64(), v["key"].as_u64()), (Some(1), Some(2)));
    assert_eq!(v["comm"], "detect_helper");
    let v = audit.wait_for("the abstract bind", timeout(), |v| is(v, "dotnet_ipc_socket", abs_pid));
    assert_eq!(v["abstract"], true);
    assert_eq!(v["path"], abstract_name[1..]);
    assert_eq!((v["socket_pid"].as_u64(), v["key"].as_u64()), (Some(5), Some(6)));
    let v =
        audit.wait_for("the full-size bind", timeout(), |v| is(v, "dotnet_ipc_socket", sized_pid));
    assert_eq!(v["path"], format!("{dir}/dotnet-diagnostic-7-8-socket"));
    for helper in [plain, abs, sized] {
        finish(helper);
    }
    for p in [pid, abs_pid, sized_pid] {
        audit.wait_for("the helper's exit", timeout(), |v| is(v, "process_exit", p));
    }
    let (lines, summary) = audit.stop();
    assert_hooks(&summary, hooks);
    for p in [pid, abs_pid, sized_pid] {
        let kinds: Vec<&str> =
            lines.iter().filter(|v| v["pid"] == p).map(|v| v["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["dotnet_ipc_socket", "process_exit"], "pid {p}");
    }
}

/// Runs of one kernel program at once on one CPU (four helpers pinned to CPU 0, each mapping
/// `children` fresh `dotnet_ipc_created` memfds in child processes) get distinct sequence
/// numbers, so the gap arithmetic (highest + 1 − received) counts only events that were
/// really lost: every child's `dotnet_ipc_ready` is reported once, no (cpu, kind, seq) appears
/// twice, and the run has no gap and no loss.
pub fn concurrent_runs_on_one_cpu_get_distinct_sequence_numbers(
    hooks: HookChoice,
    children_per_helper: usize,
) {
    const HELPERS: usize = 4;
    let audit = start_audit(config(hooks));
    let helpers: Vec<LineProcess> = (0..HELPERS)
        .map(|_| {
            let mut command = Command::new("taskset");
            command.args([
                "-c",
                "0",
                &detect_helper(),
                "latency",
                &children_per_helper.to_string(),
            ]);
            LineProcess::spawn("detect_helper latency", command).expect("starting a helper")
        })
        .collect();
    // Each child prints its pid once it has mapped.
    let mut children = std::collections::HashSet::new();
    for mut h in helpers {
        for _ in 0..children_per_helper {
            children.insert(json(&mut h)["pid"].as_u64().unwrap());
        }
        h.wait_exit(timeout()).unwrap();
    }
    let (lines, summary) = audit.stop();
    assert_hooks(&summary, hooks);
    let all = HELPERS * children_per_helper;
    let ready = lines
        .iter()
        .filter(|l| l["kind"] == "dotnet_ipc_ready")
        .filter(|l| l["pid"].as_u64().is_some_and(|p| children.contains(&p)))
        .count();
    assert_eq!((ready, children.len()), (all, all));
    let mut seen = std::collections::HashSet::new();
    for l in lines.iter().filter(|l| l["source"] == "kernel") {
        let key = (l["cpu"].as_u64(), l["kind"].as_str().unwrap().to_owned(), l["seq"].as_u64());
        assert!(seen.insert(key.clone()), "sequence number used twice: {key:?}");
    }
    assert_eq!(summary.seq_gaps, vec![], "no events missing");
    // A forked child has no page-table entry yet for the name it passes to memfd_create, so the
    // syscall tracepoint cannot read it at entry: the creation line is lost (counted), the
    // mapping is still detected (docs/protocol/bpf-detection.md §7). The trampoline reads it
    // at the return, after the kernel copied it: nothing is lost there.
    let lost: Vec<_> = summary
        .losses
        .iter()
        .filter(|l| {
            hooks == HookChoice::Trampolines
                || (l.kind, l.reason) != (EventKind::MemfdCreate, LossReason::ReadFailed)
        })
        .collect();
    assert_eq!(lost, Vec::<&tracer::kernel::detect::Loss>::new());
}
