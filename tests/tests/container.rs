//! The image `cargo xtask image` builds, run by a real container runtime (podman with runc) the
//! way deploy/kubernetes/daemonset.yaml runs it: its hostPID, security context (capabilities,
//! seccomp profile, read-only root), volumes, arguments and ports read from the file itself
//! (`tests::container`). `tracer check` passes there; `tracer run` traces a real CoreCLR 8 on the
//! host and one in its own pid and mount namespaces, answers /metrics and a CPU profile through
//! the published port, exports to an OTLP receiver on the host by its name, and ends every
//! session when the container is stopped. Then each piece a container runtime may take away is
//! taken, and `tracer check` names it with the line that gives it back.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;
use tests::container::{Container, DaemonSetPod, local_image, output};
use tests::coreclr::CoreclrHost;
use tests::process::LineProcess;
use tests::scratch::ScratchDir;
use tracer::kernel::procfs::process_start_ns;
use tracer::kernel::tracefs::Tracefs;

/// The node name the downward API gives the pod.
const NODE_NAME: &str = "tracer-test-node";
/// The namespaced runtime's TMPDIR, inside its private /tmp.
const INNER_TMPDIR: &str = "/tmp/tracer-container-test";
/// The environment the DaemonSet's `--require-env` selects runtimes by.
const SELECTED: (&str, &str) = ("TRACER_TRACE", "1");
/// From `podman run` to both sessions' first counters (image start, BPF load, two sessions).
const TRACING_TIMEOUT: Duration = Duration::from_secs(120);
/// The OTLP/HTTP receiver (tests/fixtures/otlp_receiver.py), on the host.
const RECEIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/otlp_receiver.py");
/// The host as the container's /etc/hosts names it (podman's; a pod would use its node's IP).
const HOST_FROM_CONTAINER: &str = "host.containers.internal";
/// A receiver's next record, or tracer's next line.
const LINE_TIMEOUT: Duration = Duration::from_secs(30);
/// The CPU profile asked of the agent, while the host's runtime burns for longer.
const PROFILE_SECONDS: u32 = 2;

/// The DaemonSet's pod with its log volume in `logs`.
fn daemonset(logs: &Path) -> DaemonSetPod {
    DaemonSetPod::read(&[("logs", logs)], NODE_NAME).expect("translating the DaemonSet")
}

/// `tracer check` in the pod's container: its exit status and its lines by what they check.
fn check(pod: &DaemonSetPod, image: &str) -> (bool, HashMap<String, String>) {
    let out = output(&mut pod.command(image, &["--rm"], &["check".to_owned()])).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = text
        .lines()
        .filter_map(|line| {
            let (status, rest) = line.split_at(line.len().min(19));
            let (what, _) = rest.split_once(": ")?;
            Some((what.to_owned(), format!("{} {rest}", status.trim_end())))
        })
        .collect::<HashMap<_, _>>();
    assert!(!lines.is_empty(), "tracer check printed no finding:\n{text}\n{stderr}");
    (out.status.success(), lines)
}

fn line<'a>(lines: &'a HashMap<String, String>, what: &str) -> &'a str {
    lines.get(what).unwrap_or_else(|| panic!("no {what:?} finding in {lines:#?}"))
}

/// Tracefs mounted on the host, as systemd mounts it on a node: the pod mounts the host's.
fn host_tracefs() {
    Tracefs::find_or_mount().expect("mounting tracefs on the host");
}

#[test]
fn the_daemonset_s_container_traces_host_and_namespaced_runtimes_and_stops_cleanly() -> Result<()> {
    host_tracefs();
    let logs = ScratchDir::new("container-logs");
    let pod = daemonset(logs.path());
    let image = local_image(&pod.image)?;

    // The pod as the DaemonSet defines it lets tracer do everything, without CAP_SYS_ADMIN.
    let (passed, lines) = check(&pod, &image);
    assert!(passed, "tracer check failed in the DaemonSet's container: {lines:#?}");
    assert_eq!(line(&lines, "privileges"), "OK privileges: CAP_BPF and CAP_PERFMON");
    assert_eq!(
        line(&lines, "seccomp"),
        "OK seccomp: a seccomp filter is active (Seccomp: 2, 1 filters in /proc/self/status); it \
         lets bpf and perf_event_open through"
    );
    for what in [
        "process access",
        "pid namespace",
        "tracefs writable",
        "cgroup hierarchy",
        "kernel symbols",
    ] {
        assert!(line(&lines, what).starts_with("OK "), "{}", line(&lines, what));
    }

    let tmp = ScratchDir::new("container-runtime");
    let mut on_host = CoreclrHost::spawn_with(tmp.path(), &[SELECTED])?;
    let mut namespaced = CoreclrHost::spawn_in_namespaces_with(INNER_TMPDIR, true, &[SELECTED])?;
    assert_ne!(namespaced.host_pid, namespaced.ns_pid);
    let ours = [on_host.host_pid, namespaced.host_pid];

    // The DaemonSet's arguments, exporting to a Collector as docs/deploy.md adds it.
    let mut receiver = LineProcess::spawn("otlp receiver", {
        let mut python = std::process::Command::new("python3");
        python.args([RECEIVER, "0.0.0.0"]);
        python
    })?;
    let listening: Value = serde_json::from_str(&receiver.next_line(LINE_TIMEOUT)?)?;
    let mut args = pod.args.clone();
    args.push(format!("--otlp-endpoint=http://{HOST_FROM_CONTAINER}:{}", listening["port"]));

    let name = format!("tracer-test-{}", std::process::id());
    let run = output(&mut pod.command(&image, &["--detach", &format!("--name={name}")], &args))?;
    ensure!(run.status.success(), "podman run: {}", String::from_utf8_lossy(&run.stderr));
    let container = Container(name);
    let inspect = output(std::process::Command::new("podman").args([
        "inspect",
        "--format={{.State.Pid}}",
        &container.0,
    ]))?;
    let tracer_pid: u32 = String::from_utf8(inspect.stdout)?.trim().parse()?;

    // The DaemonSet's --output, in the log volume: followed as it is written.
    let output_arg =
        pod.args.iter().find_map(|a| a.strip_prefix("--output=")).context("--output")?;
    let file = logs.path().join(Path::new(output_arg).strip_prefix("/var/log/tracer")?);
    let mut follow = LineProcess::spawn("tail of the DaemonSet's output", {
        let mut tail = std::process::Command::new("tail");
        tail.args(["--follow=name", "--retry", "--lines=+1"]).arg(&file);
        tail
    })?;
    // Each runtime's session, then its runtime counters: lines with its identity.
    let mut first_counters: HashMap<u32, Value> = HashMap::new();
    let mut started: HashMap<u32, Value> = HashMap::new();
    let deadline = std::time::Instant::now() + TRACING_TIMEOUT;
    while first_counters.len() < ours.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let text = follow.next_line(left).context("waiting for both runtimes' counters")?;
        let line: Value = serde_json::from_str(&text)?;
        let Some(pid) = line["pid"].as_u64().and_then(|p| u32::try_from(p).ok()) else { continue };
        if !ours.contains(&pid) {
            continue;
        }
        match line["kind"].as_str() {
            Some("session_started") => {
                started.insert(pid, line);
            }
            Some("dotnet_event") if line["event"] == "EventCounters" => {
                first_counters.entry(pid).or_insert(line);
            }
            _ => {}
        }
    }
    for pid in ours {
        let start = process_start_ns(pid).context("runtime gone")?;
        let session = &started[&pid];
        assert_eq!(session["process_start_ns"], start, "{session}");
        assert_eq!(session["runtime_version"], "8.0.4", "{session}");
        let counters = &first_counters[&pid];
        assert_eq!(counters["process_start_ns"], start, "{counters}");
        assert_eq!(counters["session_id"], session["session_id"], "{counters}");
        assert_eq!(counters["provider"], "System.Runtime", "{counters}");
    }

    // The metrics port, published as a pod's port is reachable, and its probes.
    let metrics = pod.ports["metrics"];
    for (path, port) in &pod.probes {
        let answer = tests::http::get(pod.ports[port], path, &[])?;
        assert_eq!((answer.status, answer.body.trim()), (200, "ok"), "GET {path}");
    }
    let exposition = tests::http::get(metrics, "/metrics", &[])?;
    assert_eq!(exposition.status, 200);
    for pid in ours {
        let label = format!("pid=\"{pid}\"");
        let series = exposition
            .body
            .lines()
            .filter(|l| l.starts_with("systemruntime_") && l.contains(&label))
            .count();
        assert!(series > 0, "no runtime counter of {pid} in\n{}", exposition.body);
    }
    // The node agent's OTLP export: records of each runtime, with the node's name.
    let mut exported: HashMap<u64, Value> = HashMap::new();
    while exported.len() < ours.len() {
        let record: Value = serde_json::from_str(&receiver.next_line(LINE_TIMEOUT)?)?;
        assert!(record.get("error").is_none(), "receiver: {record}");
        let Some(pid) = record["attributes"]["process.pid"].as_u64() else { continue };
        if ours.contains(&(pid as u32)) {
            exported.entry(pid).or_insert(record);
        }
    }
    for record in exported.values() {
        assert_eq!(record["resource"]["k8s.node.name"], NODE_NAME, "{record}");
    }

    // A CPU profile from the agent names the managed method that burns on the host.
    let url = format!(
        "http://{metrics}/debug/pprof/profile?seconds={PROFILE_SECONDS}&pid={}",
        on_host.host_pid
    );
    let pprof = std::process::Command::new("go")
        .args(["tool", "pprof", "-top", &url])
        .env("PPROF_TMPDIR", tmp.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("go tool pprof (`cargo xtask setup` installs golang-go)")?;
    on_host.burn(PROFILE_SECONDS + 2)?;
    let top = pprof.wait_with_output()?;
    let top_text = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{top_text}{}", String::from_utf8_lossy(&top.stderr));
    assert!(top_text.contains("TracerWorkload.Hot.Inner"), "{top_text}");
    namespaced.ping()?;

    // Stopped as the kubelet stops a pod: SIGTERM, then the grace period.
    let stop = output(std::process::Command::new("podman").args([
        "stop",
        &format!("--time={}", pod.grace_seconds),
        &container.0,
    ]))?;
    ensure!(stop.status.success(), "podman stop: {}", String::from_utf8_lossy(&stop.stderr));
    let exit = output(std::process::Command::new("podman").args([
        "inspect",
        "--format={{.State.ExitCode}}",
        &container.0,
    ]))?;
    assert_eq!(String::from_utf8(exit.stdout)?.trim(), "0", "tracer's exit status");
    let lines: Vec<Value> = std::fs::read_to_string(&file)?
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    for pid in ours {
        let ended: Vec<&Value> =
            lines.iter().filter(|l| l["kind"] == "session_ended" && l["pid"] == pid).collect();
        assert_eq!(ended.len(), 1, "{pid}: {ended:?}");
        assert_eq!(ended[0]["reason"], "stopped", "{}", ended[0]);
        assert_eq!(ended[0]["session_id"], started[&pid]["session_id"]);
        assert_eq!(ended[0]["lost_events"], 0, "{}", ended[0]);
    }
    assert_eq!(lines.last().map(|l| l["kind"].clone()), Some("summary".into()));
    // No ftrace instance of the container's tracer is left on the host.
    let instances = Path::new("/sys/kernel/tracing/instances");
    let left: Vec<String> = std::fs::read_dir(instances)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(&format!("tracer-{tracer_pid}")))
        .collect();
    assert_eq!(left, Vec::<String>::new());
    on_host.exit()?;
    namespaced.exit()?;
    Ok(())
}

/// The image holds tracer and the libraries it links (as `ldd` finds them), nothing else (no
/// shell), and runs as the user the DaemonSet says.
#[test]
fn the_image_holds_tracer_and_its_libraries_and_nothing_else() -> Result<()> {
    let logs = ScratchDir::new("container-image-logs");
    let pod = daemonset(logs.path());
    let image = local_image(&pod.image)?;
    let podman = |args: &[&str]| -> Result<String> {
        let out = output(std::process::Command::new("podman").args(args))?;
        ensure!(out.status.success(), "podman {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8(out.stdout)?.trim().to_owned())
    };
    let config =
        podman(&["image", "inspect", "--format={{.Config.User}} {{.Config.Entrypoint}}", &image])?;
    assert_eq!(config, "0:0 [/usr/local/bin/tracer]");
    assert!(pod.flags.contains(&"--user=0:0".to_owned()), "the DaemonSet's user: {:?}", pod.flags);

    // The image's own files, mounted read-only from container storage.
    let root = PathBuf::from(podman(&["image", "mount", &image])?);
    let _unmount = Unmount(image.clone());
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                dirs.push(path);
            } else {
                files.push(format!("/{}", path.strip_prefix(&root)?.display()));
            }
        }
    }
    files.sort();
    // What the image's own binary links, as the loader on this machine finds it.
    let ldd = output(std::process::Command::new("ldd").arg(root.join("usr/local/bin/tracer")))?;
    let mut expected: Vec<String> = String::from_utf8(ldd.stdout)?
        .lines()
        .filter_map(|l| {
            let found = l.split_once(" => ").map_or(l, |(_, found)| found).trim();
            found.starts_with('/').then(|| found.split(" (0x").next().unwrap_or(found).to_owned())
        })
        .chain(["/usr/local/bin/tracer".to_owned()])
        .collect();
    expected.sort();
    assert_eq!(files, expected);
    Ok(())
}

/// Unmounts an image mounted by `podman image mount` when dropped.
struct Unmount(String);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman").args(["image", "unmount", &self.0]).output();
    }
}

/// Each piece a container runtime may take away, taken from the DaemonSet's container: `tracer
/// check` names it, with the pod spec's line and podman's flag that give it back.
#[test]
fn check_names_what_a_container_runtime_takes_away() -> Result<()> {
    host_tracefs();
    let logs = ScratchDir::new("container-check-logs");
    let pod = daemonset(logs.path());
    let image = local_image(&pod.image)?;
    let seccomp = |f: &str| f.starts_with("--security-opt=seccomp=");
    let tracefs_volume = |f: &str| f.starts_with("--volume=/sys/kernel/tracing:");

    // The container runtime's default seccomp profile: bpf and perf_event_open only with
    // CAP_SYS_ADMIN, which the DaemonSet does not grant.
    let (passed, lines) = check(&pod.without(seccomp), &image);
    assert!(!passed, "{lines:#?}");
    assert_eq!(
        line(&lines, "seccomp"),
        "MISSING seccomp: a seccomp filter is active (Seccomp: 2, 1 filters in /proc/self/status) \
         and refuses bpf (Operation not permitted (os error 1), where the kernel answers Invalid \
         argument (os error 22)) and perf_event_open (Operation not permitted (os error 1), where \
         the kernel answers Bad address (os error 14)): tracer cannot load or attach its \
         programs; run it with tracer's profile (deploy/kubernetes/seccomp/tracer.json, installed \
         as docs/deploy.md says): Kubernetes: `seccompProfile: {type: Localhost, \
         localhostProfile: tracer.json}`; podman: `--security-opt \
         seccomp=deploy/kubernetes/seccomp/tracer.json`"
    );
    assert_eq!(
        line(&lines, "BPF syscall"),
        "MISSING BPF syscall: bpf(BPF_MAP_CREATE): Operation not permitted (os error 1): this \
         process's seccomp filter refuses bpf before the kernel sees it (the seccomp line says how \
         to run with tracer's profile)"
    );

    // `tracer run` under it stops at once and says the same, not just EPERM.
    let mut run = pod.without(seccomp).command(&image, &["--rm"], &["run".to_owned()]);
    let refused = output(&mut run)?;
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(
            "a seccomp filter refuses bpf() (Operation not permitted (os error 1), where the \
             kernel answers Invalid argument (os error 22)): tracer cannot load its programs; \
             run it with tracer's seccomp profile (`tracer check` says how)"
        ),
        "{stderr}"
    );

    // A pid namespace of its own.
    let (passed, lines) = check(&pod.without(|f| f == "--pid=host"), &image);
    assert!(!passed, "{lines:#?}");
    assert_eq!(
        line(&lines, "pid namespace"),
        "MISSING pid namespace: tracer runs in a pid namespace of its own (kthreadd, pid 2 of the \
         host's namespace, is not in /proc): it sees only that namespace's processes, while its \
         kernel programs report every process of the host by host pid; Kubernetes: `hostPID: \
         true`; podman: `--pid=host`"
    );

    // CAP_BPF not granted.
    let (passed, lines) = check(&pod.without(|f| f == "--cap-add=CAP_BPF"), &image);
    assert!(!passed, "{lines:#?}");
    assert_eq!(
        line(&lines, "privileges"),
        "MISSING privileges: loading and attaching BPF programs needs CAP_BPF and CAP_PERFMON (or \
         CAP_SYS_ADMIN): CAP_BPF not in this process's bounding set (CapBnd in \
         /proc/self/status): the container runtime or service manager did not grant it; \
         Kubernetes: `capabilities: {add: [BPF]}`; podman: `--cap-add=CAP_BPF`"
    );

    // No tracefs mounted into the container (and no CAP_SYS_ADMIN to mount one).
    let (passed, lines) = check(&pod.without(tracefs_volume), &image);
    assert!(!passed, "{lines:#?}");
    let tracefs = line(&lines, "tracefs");
    assert!(tracefs.starts_with("MISSING tracefs: tracefs is not mounted and mounting it failed"));
    assert!(
        tracefs.ends_with(
            "Operation not permitted (os error 1); in a container, mount the host's at \
             /sys/kernel/tracing: Kubernetes: `hostPath: {path: /sys/kernel/tracing}`; podman: \
             `-v /sys/kernel/tracing:/sys/kernel/tracing`; tracepoint and ring-buffer checks \
             skipped"
        ),
        "{tracefs}"
    );

    // The host's tracefs, read-only: detection works, ftrace instances cannot be made.
    let read_only = pod.without(tracefs_volume);
    let mut read_only_flags = read_only.flags.clone();
    read_only_flags.push("--volume=/sys/kernel/tracing:/sys/kernel/tracing:ro".into());
    let read_only = DaemonSetPod { flags: read_only_flags, ..read_only };
    let (passed, lines) = check(&read_only, &image);
    assert!(passed, "a read-only tracefs is not required: {lines:#?}");
    assert_eq!(
        line(&lines, "tracefs writable"),
        "MISSING (optional) tracefs writable: /sys/kernel/tracing is mounted read-only: tracer \
         cannot create the ftrace instances of user_events sessions, `tracer ftrace` and `run \
         --kernel-event` (detection only reads it); mount it writable: Kubernetes: `readOnly: \
         false`; podman: `-v /sys/kernel/tracing:/sys/kernel/tracing:rw`"
    );

    // Neither CAP_SYSLOG nor the host's cgroup hierarchy: tracer runs, names less.
    let less = pod
        .without(|f| f == "--cap-add=CAP_SYSLOG")
        .without(|f| f.starts_with("--volume=/sys/fs/cgroup:"));
    let (passed, lines) = check(&less, &image);
    assert!(passed, "{lines:#?}");
    let symbols = line(&lines, "kernel symbols");
    assert!(symbols.starts_with("MISSING (optional) kernel symbols: "), "{symbols}");
    assert!(
        symbols.ends_with(
            "profiles' kernel frames stay unnamed: CAP_SYSLOG not in this process's bounding set \
             (CapBnd in /proc/self/status): the container runtime or service manager did not \
             grant it; Kubernetes: `capabilities: {add: [SYSLOG]}`; podman: `--cap-add=CAP_SYSLOG`"
        ),
        "{symbols}"
    );
    let cgroup = line(&lines, "cgroup hierarchy");
    assert!(cgroup.starts_with("MISSING (optional) cgroup hierarchy: "), "{cgroup}");
    assert!(
        cgroup.ends_with(
            "in a container, mount the host's at /sys/fs/cgroup: Kubernetes: `hostPath: {path: \
             /sys/fs/cgroup}`; podman: `-v /sys/fs/cgroup:/sys/fs/cgroup:ro`"
        ),
        "{cgroup}"
    );
    Ok(())
}
