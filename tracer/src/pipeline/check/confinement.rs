//! What a container runtime (or a service manager) may take away from tracer, each finding
//! naming the cause and the line of a pod spec or the podman flag that gives it back:
//! capabilities outside the bounding set, a seccomp filter in front of `bpf` or
//! `perf_event_open`, a pid namespace of its own, a tracefs that is missing or read-only, a cgroup
//! hierarchy that is not the host's, kernel addresses hidden. docs/deploy.md has the DaemonSet
//! these fixes come from.
use std::fmt;
use std::path::Path;

use tracer_decode::procfs::SeccompMode;

use super::{Finding, Status, finding};
use crate::kernel::bpf_probe::Reach;
use crate::kernel::privileges::{Capabilities, Capability};

/// How to give back what was taken: the line of the DaemonSet's pod spec
/// (deploy/kubernetes/daemonset.yaml) and podman's (or docker's) flag.
pub struct Fix {
    kubernetes: String,
    podman: String,
}

fn fix(kubernetes: impl Into<String>, podman: impl Into<String>) -> Fix {
    Fix { kubernetes: kubernetes.into(), podman: podman.into() }
}

impl fmt::Display for Fix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kubernetes: `{}`; podman: `{}`", self.kubernetes, self.podman)
    }
}

/// tracer's seccomp profile, as the repository ships it and as the DaemonSet names it (a path
/// under the kubelet's seccomp directory).
const SECCOMP_PROFILE: &str = "deploy/kubernetes/seccomp/tracer.json";
const SECCOMP_LOCALHOST_PROFILE: &str = "tracer.json";
/// The path tracefs is mounted at on a host, and where the DaemonSet mounts it.
const TRACEFS_PATH: &str = "/sys/kernel/tracing";

/// Why each capability of `missing` is not effective, with the fix: a capability outside the
/// bounding set was not granted (a container runtime's `--cap-drop`, a unit's
/// `CapabilityBoundingSet=`); one inside it is lost because tracer does not run as root.
fn missing_capabilities(caps: &Capabilities, missing: &[Capability]) -> String {
    let names = |set: &[Capability]| set.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
    let (unbounded, not_effective): (Vec<Capability>, Vec<Capability>) =
        missing.iter().partition(|c| !caps.bounds(**c));
    let mut parts = Vec::new();
    if !unbounded.is_empty() {
        let short: Vec<&str> = unbounded.iter().map(|c| c.short_name()).collect();
        let flags: Vec<String> =
            unbounded.iter().map(|c| format!("--cap-add={}", c.name())).collect();
        let add = fix(format!("capabilities: {{add: [{}]}}", short.join(", ")), flags.join(" "));
        parts.push(format!(
            "{} not in this process's bounding set (CapBnd in /proc/self/status): the container \
             runtime or service manager did not grant {}; {add}",
            names(&unbounded),
            if unbounded.len() == 1 { "it" } else { "them" },
        ));
    }
    if !not_effective.is_empty() {
        parts.push(format!(
            "{} in the bounding set but not effective: run tracer as root (sudo; {})",
            names(&not_effective),
            fix("runAsUser: 0", "--user 0")
        ));
    }
    parts.join("; ")
}

/// Loading and attaching BPF programs: CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN (both in one).
pub fn privileges(caps: &Capabilities) -> Finding {
    let what = "privileges";
    match caps.check_bpf_tracing() {
        Ok(()) if caps.has(Capability::SysAdmin) => {
            finding(Status::Ok, what, "CAP_SYS_ADMIN (root)")
        }
        Ok(()) => finding(Status::Ok, what, "CAP_BPF and CAP_PERFMON"),
        Err(_) => {
            let missing: Vec<Capability> = [Capability::Bpf, Capability::Perfmon]
                .into_iter()
                .filter(|c| !caps.has(*c))
                .collect();
            let detail = format!(
                "loading and attaching BPF programs needs CAP_BPF and CAP_PERFMON (or \
                 CAP_SYS_ADMIN): {}",
                missing_capabilities(caps, &missing)
            );
            finding(Status::Missing, what, detail)
        }
    }
}

/// Reaching runtimes' diagnostic sockets through `/proc/<pid>/root`, and reading their
/// environment (`--require-env`): `run`, `profile` and `ps` need both, `audit` neither.
pub fn process_access(caps: &Capabilities) -> Finding {
    let what = "process access";
    let needed = [Capability::SysPtrace, Capability::DacOverride];
    let missing: Vec<Capability> = needed.into_iter().filter(|c| !caps.has(*c)).collect();
    if missing.is_empty() {
        return finding(
            Status::Ok,
            what,
            "CAP_SYS_PTRACE and CAP_DAC_OVERRIDE: run, profile and ps reach every runtime's \
             socket through /proc/<pid>/root, whoever owns it",
        );
    }
    let detail = format!(
        "{}: run, profile and ps reach only runtimes of tracer's own user that hold no \
         capability tracer lacks (audit needs neither)",
        missing_capabilities(caps, &missing)
    );
    finding(Status::MissingOptional, what, detail)
}

/// Whether `/proc/kallsyms` shows addresses (`kallsyms`: how loading it went), which profiles
/// name kernel frames with.
pub fn kernel_symbols(caps: &Capabilities, kallsyms: anyhow::Result<()>) -> Finding {
    let what = "kernel symbols";
    let Err(e) = kallsyms else {
        return finding(
            Status::Ok,
            what,
            "/proc/kallsyms shows kernel addresses: profiles name kernel frames",
        );
    };
    let hidden = e.chain().any(|cause| {
        matches!(
            cause.downcast_ref(),
            Some(tracer_decode::symbols::kallsyms::KallsymsError::AddressesHidden { .. })
        )
    });
    let cause = if !hidden {
        String::new()
    } else if caps.has(Capability::Syslog) {
        ": kernel.kptr_restrict is 2 on this host (sysctl kernel.kptr_restrict=1 shows them to \
         CAP_SYSLOG)"
            .to_owned()
    } else {
        format!(": {}", missing_capabilities(caps, &[Capability::Syslog]))
    };
    finding(
        Status::MissingOptional,
        what,
        format!("{e:#}; profiles' kernel frames stay unnamed{cause}"),
    )
}

/// Whether a seccomp filter lets `bpf` and `perf_event_open` reach the kernel (`probes`: each
/// made with arguments only the kernel refuses, and how).
pub fn seccomp(mode: Option<SeccompMode>, probes: &[Reach]) -> Finding {
    let what = "seccomp";
    let filters = match mode {
        None | Some(SeccompMode::Disabled) => {
            return finding(
                Status::Ok,
                what,
                "no seccomp filter (Seccomp: 0 in /proc/self/status)",
            );
        }
        Some(SeccompMode::Strict) => {
            return finding(
                Status::Missing,
                what,
                "strict seccomp mode (Seccomp: 1): only read, write, exit and sigreturn are allowed",
            );
        }
        Some(SeccompMode::Filter { filters }) => filters,
    };
    let active =
        format!("a seccomp filter is active (Seccomp: 2, {filters} filters in /proc/self/status)");
    let refused: Vec<String> = probes
        .iter()
        .filter(|p| !p.reached_kernel())
        .map(|p| {
            format!(
                "{} ({}, where the kernel answers {})",
                p.syscall,
                p.answer,
                std::io::Error::from_raw_os_error(p.kernel_answer)
            )
        })
        .collect();
    if refused.is_empty() {
        let names: Vec<&str> = probes.iter().map(|p| p.syscall).collect();
        return finding(
            Status::Ok,
            what,
            format!("{active}; it lets {} through", names.join(" and ")),
        );
    }
    let profile = fix(
        format!(
            "seccompProfile: {{type: Localhost, localhostProfile: {SECCOMP_LOCALHOST_PROFILE}}}"
        ),
        format!("--security-opt seccomp={SECCOMP_PROFILE}"),
    );
    finding(
        Status::Missing,
        what,
        format!(
            "{active} and refuses {}: tracer cannot load or attach its programs; run it with \
             tracer's profile ({SECCOMP_PROFILE}, installed as docs/deploy.md says): {profile}",
            refused.join(" and ")
        ),
    )
}

/// Whether tracer sees the host's processes: its kernel programs report every process of the
/// machine by its pid in the host's namespace. `depth`: the pid namespaces that see tracer, by
/// its `NSpid` line (a container's own procfs shows only its own namespace's pid there);
/// `kthreadd_visible`: the kernel's thread-creating thread, pid 2 in the host's namespace, which
/// no other pid namespace sees.
pub fn pid_namespace(depth: Option<usize>, kthreadd_visible: bool) -> Finding {
    let what = "pid namespace";
    let why = match depth {
        Some(depth) if depth > 1 => format!("{depth} pids on NSpid in /proc/self/status"),
        _ if !kthreadd_visible => "kthreadd, pid 2 of the host's namespace, is not in /proc".into(),
        _ => return finding(Status::Ok, what, "the host's: tracer sees every process"),
    };
    finding(
        Status::Missing,
        what,
        format!(
            "tracer runs in a pid namespace of its own ({why}): it sees only that namespace's \
             processes, while its kernel programs report every process of the host by host pid; \
             {}",
            fix("hostPID: true", "--pid=host")
        ),
    )
}

/// The fix for a tracefs that is not there: the host's, mounted into the container.
pub fn tracefs_mount_fix() -> String {
    format!(
        "in a container, mount the host's at {TRACEFS_PATH}: {}",
        fix(
            format!("hostPath: {{path: {TRACEFS_PATH}}}"),
            format!("-v {TRACEFS_PATH}:{TRACEFS_PATH}")
        )
    )
}

/// Whether tracer can create its ftrace instances (user_events sessions, `tracer ftrace`, `run
/// --kernel-event`); detection only reads tracefs.
pub fn tracefs_writable(root: &Path, read_only: bool) -> Finding {
    let what = "tracefs writable";
    if !read_only {
        return finding(
            Status::Ok,
            what,
            format!("{}: tracer can create ftrace instances", root.display()),
        );
    }
    finding(
        Status::MissingOptional,
        what,
        format!(
            "{} is mounted read-only: tracer cannot create the ftrace instances of user_events \
             sessions, `tracer ftrace` and `run --kernel-event` (detection only reads it); mount \
             it writable: {}",
            root.display(),
            fix("readOnly: false", format!("-v {TRACEFS_PATH}:{TRACEFS_PATH}:rw"))
        ),
    )
}

/// The inode number of a cgroup2 hierarchy's root directory: the root cgroup's kernfs id. A
/// cgroup namespace's view (a container's own `/sys/fs/cgroup`) has another.
const CGROUP2_ROOT_INODE: u64 = 1;

/// Whether the cgroup2 hierarchy tracer finds is the host's: it resolves the cgroup ids of
/// processes that ended before tracer read their `/proc` by walking it (`root`: the mount and
/// its root directory's inode number).
pub fn cgroup_hierarchy(root: Option<(&Path, u64)>) -> Finding {
    let what = "cgroup hierarchy";
    let host = format!(
        "in a container, mount the host's at /sys/fs/cgroup: {}",
        fix("hostPath: {path: /sys/fs/cgroup}", "-v /sys/fs/cgroup:/sys/fs/cgroup:ro")
    );
    let without = "container ids of processes that end before tracer reads their /proc are not \
                   found (the --container and --pod-uid filters miss them)";
    match root {
        Some((path, CGROUP2_ROOT_INODE)) => {
            finding(Status::Ok, what, format!("the host's cgroup2 hierarchy at {}", path.display()))
        }
        Some((path, inode)) => finding(
            Status::MissingOptional,
            what,
            format!(
                "{} is not the root of the host's cgroup2 hierarchy (its inode is {inode}, the \
                 root's is {CGROUP2_ROOT_INODE}: a cgroup namespace's view): {without}; {host}",
                path.display()
            ),
        ),
        None => finding(
            Status::MissingOptional,
            what,
            format!("no cgroup2 hierarchy is mounted: {without}; {host}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn caps(effective: u64, bounding: u64) -> Capabilities {
        Capabilities::from_status(&format!("CapEff:\t{effective:016x}\nCapBnd:\t{bounding:016x}\n"))
            .unwrap()
    }

    fn bit(c: Capability) -> u64 {
        1 << c as u32
    }

    #[test]
    fn a_capability_outside_the_bounding_set_is_named_with_the_line_that_grants_it() {
        let granted = bit(Capability::Bpf) | bit(Capability::SysPtrace);
        let privileges = privileges(&caps(granted, granted));
        assert_eq!(
            privileges.to_string(),
            "MISSING            privileges: loading and attaching BPF programs needs CAP_BPF and \
             CAP_PERFMON (or CAP_SYS_ADMIN): CAP_PERFMON not in this process's bounding set \
             (CapBnd in /proc/self/status): the container runtime or service manager did not \
             grant it; Kubernetes: `capabilities: {add: [PERFMON]}`; podman: \
             `--cap-add=CAP_PERFMON`"
        );
        let access = process_access(&caps(granted, granted));
        assert_eq!(access.status, Status::MissingOptional);
        assert!(
            access.detail.starts_with(
                "CAP_DAC_OVERRIDE not in this process's bounding set (CapBnd in \
                 /proc/self/status): the container runtime or service manager did not grant it; \
                 Kubernetes: `capabilities: {add: [DAC_OVERRIDE]}`; podman: \
                 `--cap-add=CAP_DAC_OVERRIDE`: run, profile and ps reach only"
            ),
            "{access}"
        );
        let all = process_access(&caps(granted | bit(Capability::DacOverride), u64::MAX));
        assert_eq!(all.status, Status::Ok);
    }

    #[test]
    fn a_bounded_capability_that_is_not_effective_asks_for_root() {
        // A user's shell: everything in bounds, nothing effective.
        let finding = privileges(&caps(0, u64::MAX));
        assert_eq!(
            finding.detail,
            "loading and attaching BPF programs needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN): \
             CAP_BPF, CAP_PERFMON in the bounding set but not effective: run tracer as root \
             (sudo; Kubernetes: `runAsUser: 0`; podman: `--user 0`)"
        );
        // Both causes at once, each with its own fix.
        let mixed = privileges(&caps(0, bit(Capability::Bpf)));
        assert!(mixed.detail.contains("CAP_PERFMON not in this process's bounding set"), "{mixed}");
        assert!(mixed.detail.contains("CAP_BPF in the bounding set but not effective"), "{mixed}");
        assert_eq!(privileges(&caps(bit(Capability::SysAdmin), u64::MAX)).status, Status::Ok);
    }

    /// The two probes `check` makes, answered `bpf` and `perf` (the kernel's own answers are
    /// EINVAL and EFAULT).
    fn answered(bpf: i32, perf: i32) -> [Reach; 2] {
        let probe = |syscall, kernel_answer, answer| Reach {
            syscall,
            kernel_answer,
            answer: io::Error::from_raw_os_error(answer),
        };
        [probe("bpf", libc::EINVAL, bpf), probe("perf_event_open", libc::EFAULT, perf)]
    }

    #[test]
    fn a_seccomp_filter_that_refuses_bpf_is_named_with_tracer_s_profile() {
        let filter = Some(SeccompMode::Filter { filters: 1 });
        let refused = seccomp(filter, &answered(libc::EPERM, libc::EFAULT));
        assert_eq!(
            refused.to_string(),
            "MISSING            seccomp: a seccomp filter is active (Seccomp: 2, 1 filters in \
             /proc/self/status) and refuses bpf (Operation not permitted (os error 1), where the \
             kernel answers Invalid argument (os error 22)): tracer cannot load or attach its \
             programs; run it with tracer's profile (deploy/kubernetes/seccomp/tracer.json, \
             installed as docs/deploy.md says): Kubernetes: `seccompProfile: {type: Localhost, \
             localhostProfile: tracer.json}`; podman: `--security-opt \
             seccomp=deploy/kubernetes/seccomp/tracer.json`"
        );
        let both = seccomp(filter, &answered(libc::ENOSYS, libc::EPERM));
        assert!(both.detail.contains("refuses bpf (Function not implemented"), "{both}");
        assert!(both.detail.contains(" and perf_event_open (Operation not permitted"), "{both}");
        let through = seccomp(filter, &answered(libc::EINVAL, libc::EFAULT));
        assert_eq!(
            through.to_string(),
            "OK                 seccomp: a seccomp filter is active (Seccomp: 2, 1 filters in \
             /proc/self/status); it lets bpf and perf_event_open through"
        );
        assert_eq!(seccomp(Some(SeccompMode::Disabled), &[]).status, Status::Ok);
        assert_eq!(seccomp(Some(SeccompMode::Strict), &[]).status, Status::Missing);
    }

    #[test]
    fn namespaces_mounts_and_kernel_symbols() {
        assert_eq!(pid_namespace(Some(1), true).status, Status::Ok);
        assert_eq!(
            pid_namespace(Some(2), true).to_string(),
            "MISSING            pid namespace: tracer runs in a pid namespace of its own (2 pids \
             on NSpid in /proc/self/status): it sees only that namespace's processes, while its \
             kernel programs report every process of the host by host pid; Kubernetes: \
             `hostPID: true`; podman: `--pid=host`"
        );
        // A container's own procfs: one pid on NSpid, and no kernel thread in sight.
        let own_proc = pid_namespace(Some(1), false);
        assert_eq!(own_proc.status, Status::Missing);
        assert!(
            own_proc.detail.starts_with(
                "tracer runs in a pid namespace of its own (kthreadd, pid 2 of the host's \
                 namespace, is not in /proc)"
            ),
            "{own_proc}"
        );
        let tracefs = Path::new("/sys/kernel/tracing");
        assert_eq!(tracefs_writable(tracefs, false).status, Status::Ok);
        let read_only = tracefs_writable(tracefs, true);
        assert_eq!(read_only.status, Status::MissingOptional);
        assert!(
            read_only.detail.ends_with(
                "mount it writable: Kubernetes: `readOnly: false`; podman: `-v \
                 /sys/kernel/tracing:/sys/kernel/tracing:rw`"
            ),
            "{read_only}"
        );
        let cgroup = Path::new("/sys/fs/cgroup");
        assert_eq!(cgroup_hierarchy(Some((cgroup, 1))).status, Status::Ok);
        let namespaced = cgroup_hierarchy(Some((cgroup, 4026)));
        assert_eq!(namespaced.status, Status::MissingOptional);
        assert!(namespaced.detail.starts_with("/sys/fs/cgroup is not the root"), "{namespaced}");
        assert!(namespaced.detail.ends_with("podman: `-v /sys/fs/cgroup:/sys/fs/cgroup:ro`"));
        assert_eq!(cgroup_hierarchy(None).status, Status::MissingOptional);

        let hidden = || {
            Err(anyhow::Error::new(
                tracer_decode::symbols::kallsyms::KallsymsError::AddressesHidden { symbols: 9 },
            )
            .context("reading kernel symbols from /proc/kallsyms"))
        };
        let no_syslog = kernel_symbols(&caps(0, 0), hidden());
        assert!(
            no_syslog.detail.ends_with(
                "profiles' kernel frames stay unnamed: CAP_SYSLOG not in this process's bounding \
                 set (CapBnd in /proc/self/status): the container runtime or service manager did \
                 not grant it; Kubernetes: `capabilities: {add: [SYSLOG]}`; podman: \
                 `--cap-add=CAP_SYSLOG`"
            ),
            "{no_syslog}"
        );
        let restricted = kernel_symbols(&caps(bit(Capability::Syslog), u64::MAX), hidden());
        assert!(restricted.detail.contains("kernel.kptr_restrict is 2"), "{restricted}");
        assert_eq!(kernel_symbols(&caps(0, 0), Ok(())).status, Status::Ok);
    }
}
