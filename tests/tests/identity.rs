//! Container and pod identity with real cgroups (root, cgroup v2): `detect_helper` processes are
//! moved into cgroups named like a containerd pod's container and a docker container, then
//! `tracer audit` and `tracer run` must label every line about them with the cgroup, container
//! id and pod uid, and every filter must select exactly the processes it names.
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;
use tests::cgroups::{CgroupTree, container_id};
use tests::pipeline::Running;
use tests::process::LineProcess;
use tests::user_events::kernel_has_user_events;
use tracer::identity::ProcessFilter;
use tracer::pipeline::audit::{self, AuditConfig, AuditSummary};

const HELPER: &str = env!("CARGO_BIN_EXE_detect_helper");
/// Generous: under a loaded full run a helper sequence and its exit lines can take a while.
const TIMEOUT: Duration = Duration::from_secs(60);
/// The environment variable `--require-env` looks for; only the docker helper has it.
const ENV: &str = "TRACER_IDENTITY_TEST";

/// Two cgroups named like real containers: containerd (CRI, systemd driver) in a burstable pod,
/// and docker.
struct Fixture {
    tree: CgroupTree,
    pod: Container,
    docker: Container,
    pod_uid: String,
}

struct Container {
    cgroup: String,
    id: String,
}

fn fixture(name: &str) -> Fixture {
    let mut tree = CgroupTree::new(name).expect("cgroup tree");
    // Ids of this fixture alone: other tests run helpers in containers of their own at the same
    // time (other processes, or other threads of this one), and this test's filters must not
    // select those.
    static FIXTURES: AtomicU32 = AtomicU32::new(0);
    let seed = (std::process::id() << 6) | (FIXTURES.fetch_add(1, Ordering::Relaxed) & 63);
    let pod_id = container_id("c0ffee", seed);
    let docker_id = container_id("d0cce7", seed);
    let pod_uid = format!("0c8f2a4e-5b1d-4c3a-9e7f-{seed:012x}");
    let slice = format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        pod_uid.replace('-', "_")
    );
    let pod = Container {
        cgroup: tree.create(&format!("{slice}/cri-containerd-{pod_id}.scope")).unwrap(),
        id: pod_id,
    };
    let docker = Container {
        cgroup: tree.create(&format!("system.slice/docker-{docker_id}.scope")).unwrap(),
        id: docker_id,
    };
    Fixture { tree, pod, docker, pod_uid }
}

/// What one `detect_helper sequence` in a container did.
struct Sequence {
    pid: u64,
    child_pid: u64,
}

fn json(helper: &mut LineProcess) -> Value {
    serde_json::from_str(&helper.next_line(TIMEOUT).unwrap()).unwrap()
}

/// Runs `detect_helper sequence` inside `cgroup` (moved there before it does anything tracer
/// detects); with `audit`, waits until tracer reported its and its child's exit.
fn sequence_in(
    tree: &CgroupTree,
    cgroup: &str,
    env: bool,
    audit: Option<&mut Running<AuditSummary>>,
) -> Sequence {
    let mut command = Command::new(HELPER);
    command.arg("sequence");
    if env {
        command.env(ENV, "1");
    }
    let mut helper = LineProcess::spawn(HELPER, command).unwrap();
    assert_eq!(json(&mut helper)["phase"], "started");
    tree.enter(cgroup, helper.pid()).unwrap();
    helper.send_line("go").unwrap();
    let registered = json(&mut helper);
    assert_eq!(registered["phase"], "registered");
    let pid = registered["pid"].as_u64().unwrap();
    let mut audit = audit;
    if let Some(audit) = audit.as_deref_mut() {
        // The helper stays alive until tracer has looked it up: --require-env reads its
        // environment from /proc, which a process that has exited no longer has (tracer then
        // cannot select it, by design).
        audit.wait_for("the helper's mapping", TIMEOUT, |v| {
            v["kind"] == "dotnet_ipc_ready" && v["pid"] == pid
        });
    }
    helper.send_line("go").unwrap();
    let done = json(&mut helper);
    assert_eq!(done["phase"], "done");
    helper.close_stdin();
    helper.wait_exit(TIMEOUT).unwrap();
    let run = Sequence { pid, child_pid: done["child_pid"].as_u64().unwrap() };
    if let Some(audit) = audit {
        for pid in [run.child_pid, run.pid] {
            audit.wait_for("an exit in the container", TIMEOUT, |v| {
                v["kind"] == "process_exit" && v["pid"] == pid
            });
        }
    }
    run
}

fn start_audit(filter: ProcessFilter) -> Running<AuditSummary> {
    let config = AuditConfig { filter, ..AuditConfig::default() };
    Running::start(TIMEOUT, move |sink, stop, ready| audit::run(config, sink, stop, Some(ready)))
}

fn filter(containers: &[&str], pods: &[&str], cgroups: &[&str], env: &[&str]) -> ProcessFilter {
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    ProcessFilter::new(
        &s(containers),
        &s(pods),
        &s(cgroups),
        ProcessFilter::env_requirements(&s(env)).unwrap(),
        tracer::identity::cgroup_v2_mount().as_deref(),
    )
    .unwrap()
}

fn lines_of<'a>(lines: &'a [Value], run: &Sequence) -> Vec<&'a Value> {
    lines.iter().filter(|v| v["pid"] == run.pid || v["pid"] == run.child_pid).collect()
}

/// Every line about the helper and its child, and exactly those kinds, with the container's
/// labels.
fn assert_labelled(lines: &[Value], run: &Sequence, c: &Container, pod_uid: Option<&str>) {
    let of = lines_of(lines, run);
    let kinds: Vec<&str> = of.iter().map(|v| v["kind"].as_str().unwrap()).collect();
    // The helper's DIAG_IOCSREG is seen only where the kernel has user_events (elsewhere the
    // ioctl hooks are not attached).
    let register = kernel_has_user_events().then_some("user_events_register");
    let expected: Vec<&str> = ["memfd_create", "dotnet_ipc_ready"]
        .into_iter()
        .chain(register)
        .chain(["process_fork", "process_exec", "process_exit", "process_exit"])
        .collect();
    assert_eq!(kinds, expected, "{of:#?}");
    for v in of {
        assert_eq!(v["cgroup"], c.cgroup.as_str(), "{v}");
        assert_eq!(v["container_id"], c.id.as_str(), "{v}");
        match pod_uid {
            Some(uid) => assert_eq!(v["pod_uid"], uid, "{v}"),
            None => assert!(v.get("pod_uid").is_none(), "{v}"),
        }
    }
}

#[test]
fn audit_lines_carry_cgroup_container_and_pod() {
    let f = fixture("labels");
    let mut audit = start_audit(ProcessFilter::default());
    let pod = sequence_in(&f.tree, &f.pod.cgroup, false, Some(&mut audit));
    let docker = sequence_in(&f.tree, &f.docker.cgroup, true, Some(&mut audit));
    let (lines, summary) = audit.stop();
    assert_labelled(&lines, &pod, &f.pod, Some(&f.pod_uid));
    assert_labelled(&lines, &docker, &f.docker, None);
    assert_eq!(summary.filtered_out, 0);
}

/// Runs the excluded container's helper first, then the included one's; once tracer reported
/// the included helper's exits, everything before them was processed too. `filter` is made
/// from the fixture's containers.
fn check_filter(name: &str, filter: impl FnOnce(&Fixture) -> ProcessFilter, include_pod: bool) {
    let f = fixture(name);
    let mut audit = start_audit(filter(&f));
    let (included, excluded) = if include_pod { (&f.pod, &f.docker) } else { (&f.docker, &f.pod) };
    let out = sequence_in(&f.tree, &excluded.cgroup, include_pod, None);
    let ins = sequence_in(&f.tree, &included.cgroup, !include_pod, Some(&mut audit));
    let (lines, summary) = audit.stop();
    assert_labelled(&lines, &ins, included, include_pod.then_some(f.pod_uid.as_str()));
    assert_eq!(lines_of(&lines, &out), Vec::<&Value>::new(), "{name}: excluded process reported");
    // At least the excluded helper's and its child's lines (other processes of this machine
    // may be refused too): 7, or 6 without user_events (no registration line).
    let excluded_lines = 6 + u64::from(kernel_has_user_events());
    assert!(summary.filtered_out >= excluded_lines, "{name}: {}", summary.filtered_out);
    for v in lines.iter().filter(|v| v["kind"] != "summary") {
        assert_eq!(v["container_id"], included.id.as_str(), "{name}: only the container: {v}");
    }
}

#[test]
fn container_filter_full_id_and_prefix() {
    check_filter("full", |f| filter(&[&f.pod.id], &[], &[], &[]), true);
    check_filter("prefix", |f| filter(&[&f.pod.id[..12]], &[], &[], &[]), true);
    let docker = |f: &Fixture| filter(&[&f.docker.id[..16].to_uppercase()], &[], &[], &[]);
    check_filter("docker", docker, false);
}

#[test]
fn pod_uid_filter() {
    check_filter("pod", |f| filter(&[], &[&f.pod_uid], &[], &[]), true);
}

#[test]
fn cgroup_filter_is_a_subtree() {
    let pods = |f: &Fixture| filter(&[], &[], &[&format!("{}/kubepods.slice", f.tree.root())], &[]);
    check_filter("subtree", pods, true);
    // The same cgroup given under the cgroup2 mount.
    let mount = tracer::identity::cgroup_v2_mount().unwrap();
    let under_mount = |f: &Fixture| format!("{}{}/system.slice", mount.display(), f.tree.root());
    check_filter("subtree", |f| filter(&[], &[], &[&under_mount(f)], &[]), false);
}

#[test]
fn require_env_filter() {
    check_filter("env", |_| filter(&[], &[], &[], &[&format!("{ENV}=1")]), false);
}

#[test]
fn an_ambiguous_container_prefix_is_refused() {
    let mut tree = CgroupTree::new("ambiguous").unwrap();
    let mut parked = Vec::new();
    for seed in [1, 2] {
        let id = container_id("abcdef123456", seed);
        let cgroup = tree.create(&format!("system.slice/docker-{id}.scope")).unwrap();
        let mut command = Command::new(HELPER);
        command.arg("sequence");
        let mut helper = LineProcess::spawn(HELPER, command).unwrap();
        assert_eq!(json(&mut helper)["phase"], "started");
        tree.enter(&cgroup, helper.pid()).unwrap();
        parked.push(helper);
    }
    let config =
        AuditConfig { filter: filter(&["abcdef123456"], &[], &[], &[]), ..Default::default() };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sink = tracer::output::JsonLines::writer(std::io::sink());
    let err = runtime.block_on(audit::run(config, sink, async {}, None)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "--container abcdef123456: ambiguous prefix, it matches 2 running containers: {}, {}",
            container_id("abcdef123456", 1),
            container_id("abcdef123456", 2)
        )
    );
    for mut helper in parked {
        helper.close_stdin();
        // The helper exits with an error when stdin closes before "go"; only its end matters.
        let _ = helper.wait_exit(TIMEOUT);
    }
}

/// `tracer run`: the detection and the session lines of a process carry its labels; a process
/// the filter does not select gets no line and no session.
#[test]
fn run_traces_only_the_selected_container() {
    use tracer::session::SessionMode;
    let f = fixture("run");
    let mut config = tests::pipeline::run_config(
        "Microsoft-Windows-DotNETRuntime:0x1:4",
        SessionMode::Streaming,
        Duration::from_millis(200),
        1024,
    );
    config.filter = filter(&[&f.pod.id[..12]], &[], &[], &[]);
    let mut run = tests::pipeline::start_run(TIMEOUT, config);
    let out = sequence_in(&f.tree, &f.docker.cgroup, true, None);
    let ins = sequence_in(&f.tree, &f.pod.cgroup, false, None);
    // The helper has no diagnostic server: its session fails, and says so with its labels.
    let failed = run.wait_for("the pod helper's session_failed", TIMEOUT, |v| {
        v["kind"] == "session_failed" && v["pid"] == ins.pid
    });
    let (lines, summary) = run.stop();
    let of: Vec<&Value> = lines_of(&lines, &ins);
    let kinds: Vec<&str> = of.iter().map(|v| v["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["dotnet_ipc_ready", "session_failed"], "{of:#?}");
    for v in of.iter().copied().chain([&failed]) {
        assert_eq!(v["cgroup"], f.pod.cgroup.as_str(), "{v}");
        assert_eq!(v["container_id"], f.pod.id.as_str(), "{v}");
        assert_eq!(v["pod_uid"], f.pod_uid.as_str(), "{v}");
    }
    assert_eq!(lines_of(&lines, &out), Vec::<&Value>::new(), "excluded process reported");
    assert!(summary.filtered_out >= 1, "{summary:?}");
    assert_eq!(summary.sessions_failed + summary.sessions_refused, 1, "one session, the pod's");
    assert_eq!(summary.processes, 1);
}

/// The kernel's id of a cgroup (its directory's inode), as BPF events carry it.
fn cgroup_id(cgroup: &str) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let mount = tracer::identity::cgroup_v2_mount().expect("cgroup2 mount");
    std::fs::metadata(mount.join(cgroup.trim_start_matches('/'))).unwrap().ino()
}

/// A process gone before tracer read its `/proc` entry (tracer behind a short-lived process, as
/// on a loaded host) is still placed by the cgroup id its kernel events carry: labelled, and
/// selected or not by the container and pod filters; `--require-env` cannot hold any more.
#[test]
fn a_process_gone_before_it_was_read_is_placed_by_its_cgroup_id() {
    use tracer::identity::{ProcessLabels, ProcessTracker};
    let f = fixture("gone");
    let mut helper = LineProcess::spawn(HELPER, {
        let mut c = Command::new(HELPER);
        c.arg("sequence");
        c
    })
    .unwrap();
    assert_eq!(json(&mut helper)["phase"], "started");
    let pid = helper.pid();
    f.tree.enter(&f.docker.cgroup, pid).unwrap();
    helper.close_stdin();
    // The helper exits with an error when stdin closes before "go"; only its end matters.
    let _ = helper.wait_exit(TIMEOUT);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "reaped");

    let mut tracker = ProcessTracker::new(filter(&[&f.docker.id[..12]], &[], &[], &[]));
    let gone = tracker.lookup(pid, Some(cgroup_id(&f.docker.cgroup)));
    let labels = ProcessLabels {
        cgroup: Some(f.docker.cgroup.clone()),
        container_id: Some(f.docker.id.clone()),
        pod_uid: None,
        ..ProcessLabels::default()
    };
    assert_eq!(gone.labels.as_deref(), Some(&labels));
    assert!(gone.included);
    assert!(!tracker.lookup(pid, Some(cgroup_id(&f.pod.cgroup))).included, "another container");
    let mut pods = ProcessTracker::new(filter(&[], &[&f.pod_uid], &[], &[]));
    let in_pod = pods.lookup(pid, Some(cgroup_id(&f.pod.cgroup)));
    assert_eq!(in_pod.labels.unwrap().pod_uid, Some(f.pod_uid.clone()));
    assert!(in_pod.included);
    let mut env = ProcessTracker::new(filter(&[], &[], &[], &[ENV]));
    assert!(!env.lookup(pid, Some(cgroup_id(&f.docker.cgroup))).included, "environment gone");
    // An id no cgroup has: unknown, not selected.
    assert!(tracker.lookup(pid, Some(u64::MAX)).labels.is_none());
}
