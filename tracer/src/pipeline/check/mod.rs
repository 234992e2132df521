//! `tracer check`: is this host able to run tracer? One OK/MISSING line per requirement, each
//! MISSING line saying what to do; exit status 1 when a required feature is missing. What a
//! container runtime takes away is in [`confinement`].
mod confinement;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::ExitCode;

use crate::kernel::bpf_probe::{Reach, bpf_reach, perf_event_open_reach};
use crate::kernel::btf::KernelOffsets;
use crate::kernel::detect::{HookMechanism, LifecycleMechanism};
use crate::kernel::ftrace_reader::probe_mmap;
use crate::kernel::privileges::Capabilities;
use crate::kernel::tracefs::{Instance, Tracefs};

/// Tracepoints the eBPF detection programs attach to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    Missing,
    /// Missing, but tracer works without it (degraded).
    MissingOptional,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub status: Status,
    pub what: String,
    pub detail: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tag = match self.status {
            Status::Ok => "OK",
            Status::Missing => "MISSING",
            Status::MissingOptional => "MISSING (optional)",
        };
        write!(f, "{tag:<18} {}: {}", self.what, self.detail)
    }
}

fn finding(status: Status, what: impl Into<String>, detail: impl Into<String>) -> Finding {
    Finding { status, what: what.into(), detail: detail.into() }
}

/// `tracer check`: prints every finding; exit status 1 when a required feature is missing.
pub fn main() -> ExitCode {
    let findings = run();
    for f in &findings {
        println!("{f}");
    }
    if required_missing(&findings) {
        println!("tracer cannot run here: fix the MISSING lines above");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// A required feature is missing: `tracer check` exits 1.
pub fn required_missing(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.status == Status::Missing)
}

/// Runs every check.
pub fn run() -> Vec<Finding> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = match Capabilities::from_status(&status) {
        Some(caps) => caps,
        None => {
            let unreadable = "cannot read the capabilities of /proc/self/status";
            return vec![finding(Status::Missing, "privileges", unreadable)];
        }
    };
    let reaches = [bpf_reach(), perf_event_open_reach()];
    let mut out = vec![
        confinement::privileges(&caps),
        confinement::seccomp(tracer_decode::procfs::parse_status_seccomp(&status), &reaches),
        bpf_syscall(&reaches[0]),
        confinement::process_access(&caps),
        confinement::pid_namespace(
            tracer_decode::procfs::parse_ns_pid_depth(&status),
            kthreadd_visible(),
        ),
    ];
    let release = kernel_release();
    out.push(kernel_version(&release));
    let offsets = crate::kernel::btf::kernel_offsets();
    out.push(kernel_btf(&offsets));
    // Which classic tracepoints tracer would not need: those the BTF-typed programs replace.
    let btf_typed = match crate::kernel::detect::probe_mechanism(&offsets) {
        Ok((syscalls, lifecycle)) => {
            let typed = BtfTyped {
                syscalls: syscalls == HookMechanism::Trampolines,
                lifecycle: lifecycle == LifecycleMechanism::BtfTracepoints,
            };
            out.push(detection_hooks(syscalls));
            out.push(lifecycle_hooks(lifecycle));
            typed
        }
        Err(e) => {
            out.push(finding(Status::Missing, "detection hooks", format!("{e:#}")));
            BtfTyped::default()
        }
    };
    match Tracefs::find_or_mount() {
        Ok(tracefs) => {
            out.push(finding(
                Status::Ok,
                "tracefs",
                format!("mounted at {}", tracefs.root().display()),
            ));
            out.push(confinement::tracefs_writable(tracefs.root(), is_read_only(tracefs.root())));
            for (system, name) in crate::kernel::detect::tracepoints() {
                let id = tracefs.event_dir(system, name).join("id");
                let readable = std::fs::read_to_string(&id).map(drop);
                out.push(tracepoint(system, name, &id, readable, btf_typed));
            }
            // Unreadable: its tracepoint's line above says so.
            if let Ok(exit) = tracefs.event_format("sched", "sched_process_exit") {
                let live_count = offsets.config.task_signal_offset != 0;
                out.push(process_exits(exit.field("group_dead").is_some(), live_count));
            }
            out.push(user_events(&tracefs));
            out.push(mmap_support(&tracefs));
            out.push(subbuf_support(&tracefs));
        }
        Err(e) => out.push(finding(
            Status::Missing,
            "tracefs",
            format!(
                "{e:#}; {}; tracepoint and ring-buffer checks skipped",
                confinement::tracefs_mount_fix()
            ),
        )),
    }
    let cgroup_root = crate::kernel::procfs::cgroup_v2_mount()
        .and_then(|path| std::fs::metadata(&path).ok().map(|m| (path, m.ino())));
    out.push(confinement::cgroup_hierarchy(
        cgroup_root.as_ref().map(|(p, ino)| (p.as_path(), *ino)),
    ));
    let kallsyms = crate::profile::symbolize::KernelSymbols::load().map(drop);
    out.push(confinement::kernel_symbols(&caps, kallsyms));
    out
}

/// Whether `/proc` shows kthreadd as pid 2 without a parent, as only the host's pid namespace
/// does.
fn kthreadd_visible() -> bool {
    std::fs::read_to_string("/proc/2/stat").is_ok_and(|stat| {
        stat.starts_with("2 (kthreadd) ")
            && tracer_decode::procfs::parse_stat_ppid(&stat) == Some(0)
    })
}

/// Whether the file system holding `path` is mounted read-only.
fn is_read_only(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a statvfs buffer the kernel fills on success.
    if unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: statvfs returned 0, so it filled the buffer.
    let stat = unsafe { stat.assume_init() };
    stat.f_flag & libc::ST_RDONLY != 0
}

/// A BPF map created; when that fails, why (`bpf`: whether the call reaches the kernel at all).
fn bpf_syscall(bpf: &Reach) -> Finding {
    match crate::kernel::bpf_probe::create_array_map() {
        Ok(()) => finding(Status::Ok, "BPF syscall", "created and freed a BPF array map"),
        Err(err) => {
            let hint = match err.raw_os_error() {
                _ if !bpf.reached_kernel() => {
                    "this process's seccomp filter refuses bpf before the kernel sees it (the \
                     seccomp line says how to run with tracer's profile)"
                }
                Some(libc::EPERM) => {
                    "run as root or with CAP_BPF; check kernel.unprivileged_bpf_disabled and LSM \
                     policy"
                }
                Some(libc::ENOSYS) => "the kernel is built without CONFIG_BPF_SYSCALL",
                _ => "BPF maps cannot be created",
            };
            finding(Status::Missing, "BPF syscall", format!("bpf(BPF_MAP_CREATE): {err}: {hint}"))
        }
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string()
}

/// (major, minor) of a release string like `6.18.44-fc-v769`.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn kernel_version(release: &str) -> Finding {
    let what = "kernel version";
    match parse_release(release) {
        None => finding(Status::Missing, what, format!("cannot parse kernel release {release:?}")),
        Some(v) if v < (5, 8) => finding(
            Status::Missing,
            what,
            format!("{release}: tracer needs ≥ 5.8 (BPF ring buffer); upgrade the kernel"),
        ),
        Some(v) => {
            let mut notes = vec!["≥ 5.8 (BPF ring buffer)"];
            notes.push(if v >= (6, 10) {
                "≥ 6.10 (trace_pipe_raw mmap)"
            } else {
                "< 6.10: no trace_pipe_raw mmap, ftrace is read with read()"
            });
            notes.push(if v >= (6, 4) {
                "≥ 6.4 (user_events ABI)"
            } else {
                "< 6.4: no usable user_events"
            });
            let status = if v >= (6, 10) { Status::Ok } else { Status::MissingOptional };
            finding(status, what, format!("{release}: {}", notes.join(", ")))
        }
    }
}

/// Which hooks run on BTF-typed programs (and so need no classic tracepoint).
#[derive(Clone, Copy, Debug, Default)]
struct BtfTyped {
    /// The syscall hooks, on BPF trampolines.
    syscalls: bool,
    /// The lifecycle hooks, on tp_btf.
    lifecycle: bool,
}

/// The finding of one tracepoint a program may attach to, from whether its `id` file is
/// readable. A classic tracepoint is needed only where its hook runs on it: where the
/// BTF-typed program works, a missing one is optional.
fn tracepoint(
    system: &str,
    name: &str,
    id: &Path,
    readable: std::io::Result<()>,
    btf_typed: BtfTyped,
) -> Finding {
    let what = format!("tracepoint {system}:{name}");
    let Err(e) = readable else { return finding(Status::Ok, what, "available") };
    let unreadable = format!("{} unreadable ({e})", id.display());
    let (replaced, by, needs) = if system == "syscalls" {
        (btf_typed.syscalls, "the syscall hooks run on BPF trampolines", "CONFIG_FTRACE_SYSCALLS")
    } else {
        (btf_typed.lifecycle, "the lifecycle hooks run on BTF tracepoints", "this tracepoint")
    };
    if replaced {
        let detail = format!(
            "{unreadable}: not needed while {by} (only with --hooks syscall-tracepoints, which \
             needs {needs})"
        );
        return finding(Status::MissingOptional, what, detail);
    }
    let detail = if system == "syscalls" {
        format!("{unreadable}: syscall tracepoints need CONFIG_FTRACE_SYSCALLS")
    } else {
        format!("{unreadable}: the kernel lacks this tracepoint")
    };
    finding(Status::Missing, what, detail)
}

fn kernel_btf(offsets: &KernelOffsets) -> Finding {
    let what = "kernel BTF";
    match offsets.memfd.clone().map(|()| offsets.config) {
        Ok(c) => finding(
            Status::Ok,
            what,
            format!(
                "{}: the memfd programs read the name of the file an mmap maps (task_struct.files \
                 at {}, dentry name at {})",
                crate::kernel::btf::VMLINUX_BTF,
                c.task_files_offset,
                c.dentry_name_offset
            ),
        ),
        Err(e) => finding(
            Status::MissingOptional,
            what,
            format!(
                "{e}: the .NET memfd mapping detection is off; runtimes are still found by their \
                 diagnostic socket; rebuild with CONFIG_DEBUG_INFO_BTF=y for it"
            ),
        ),
    }
}

/// How the exit programs tell which thread's exit ends a process (docs/protocol/bpf-detection.md
/// §10): the exit tracepoint's `group_dead`, else the thread group's live count (offsets from
/// kernel BTF), else only the leader's exit.
fn process_exits(group_dead: bool, live_count: bool) -> Finding {
    let what = "process exits";
    match (group_dead, live_count) {
        (true, _) => finding(
            Status::Ok,
            what,
            "sched_process_exit says which thread's exit ends its process (group_dead)",
        ),
        (false, true) => finding(
            Status::Ok,
            what,
            "sched_process_exit has no group_dead: the exit that leaves no live thread ends the \
             process (signal_struct.live, at its offset from kernel BTF)",
        ),
        (false, false) => finding(
            Status::MissingOptional,
            what,
            "sched_process_exit has no group_dead and kernel BTF gives no signal_struct.live: a \
             process whose leader exits before its other threads is reported gone at the \
             leader's exit",
        ),
    }
}

/// What loading and attaching the trampoline programs as `tracer audit` would (reporting
/// nothing) found.
fn detection_hooks(probed: HookMechanism) -> Finding {
    let typed = probed == HookMechanism::Trampolines;
    mechanism_finding(
        "detection hooks",
        probed,
        typed,
        "the kernel loaded and attached the fexit programs",
        "detection works the same (a kernel with BTF, BPF trampolines and \
         CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS costs less)",
    )
}

/// What loading and attaching the lifecycle hooks' tp_btf programs found.
fn lifecycle_hooks(probed: LifecycleMechanism) -> Finding {
    let typed = probed == LifecycleMechanism::BtfTracepoints;
    mechanism_finding(
        "lifecycle hooks",
        probed,
        typed,
        "the kernel loaded and attached the tp_btf programs",
        "detection works the same (with kernel BTF the kernel spares every fork, exec and exit \
         the building of a tracepoint record)",
    )
}

/// OK when the hooks run on their BTF-typed programs (`typed`), else optional: detection
/// works either way.
fn mechanism_finding(
    what: &str,
    mechanism: impl std::fmt::Display,
    typed: bool,
    loaded: &str,
    fallback: &str,
) -> Finding {
    if typed {
        finding(Status::Ok, what, format!("{mechanism}: {loaded}"))
    } else {
        finding(Status::MissingOptional, what, format!("{mechanism}; {fallback}"))
    }
}

fn user_events(tracefs: &Tracefs) -> Finding {
    let path = tracefs.path("user_events_data");
    if path.exists() {
        finding(
            Status::Ok,
            "user_events",
            format!(
                "{} present: `tracer run` can use user_events sessions, and `tracer audit` \
                 attaches its ioctl hooks (registrations)",
                path.display()
            ),
        )
    } else {
        finding(
            Status::MissingOptional,
            "user_events",
            format!(
                "{} absent (kernel built without CONFIG_USER_EVENTS): `tracer run` will use \
                 streaming (EventPipe) sessions instead, and the ioctl hooks are not attached \
                 (no process can register user_events, and every ioctl of the machine is spared \
                 them); rebuild with CONFIG_USER_EVENTS=y for user_events sessions",
                path.display()
            ),
        )
    }
}

/// Sub-buffers of this size are asked of a scratch instance: two pages, the smallest change.
const SUBBUF_PROBE_KB: u64 = 8;

/// Whether `--subbuf-size-kb` can be used: a scratch instance's sub-buffer size is changed
/// (kernels before 6.8 have no such setting; some forbid the change by policy), then the
/// instance is removed.
fn subbuf_support(tracefs: &Tracefs) -> Finding {
    let what = "ftrace sub-buffer size";
    let trial = Instance::create_with_suffix(tracefs, Some("check-subbuf")).and_then(|inst| {
        inst.set_subbuf_size_kb(SUBBUF_PROBE_KB)?;
        inst.subbuf_size()
    });
    match trial {
        Ok(Some(size)) if size == SUBBUF_PROBE_KB as usize * 1024 => finding(
            Status::Ok,
            what,
            format!(
                "a scratch instance took {SUBBUF_PROBE_KB} KiB sub-buffers: `tracer ftrace \
                 --subbuf-size-kb` can be used"
            ),
        ),
        Ok(size) => finding(
            Status::MissingOptional,
            what,
            format!(
                "asked for {SUBBUF_PROBE_KB} KiB sub-buffers, the kernel reports {size:?} bytes: \
                 leave --subbuf-size-kb out"
            ),
        ),
        Err(e) => finding(Status::MissingOptional, what, format!("{e:#}")),
    }
}

/// What the transport line adds whatever the mapping does (docs/protocol/ftrace.md §6.7).
const READ_MODE_DEFAULT: &str = "tracer reads with read() by default, which costs less than the \
     mapping per record under a few hundred bytes (.NET's records are smaller); --read-mode mmap \
     for larger ones";

/// Maps CPU 0's buffer of an idle scratch instance, then removes the instance.
fn mmap_support(tracefs: &Tracefs) -> Finding {
    let what = "trace_pipe_raw mmap";
    let trial = Instance::create_with_suffix(tracefs, Some("check")).and_then(|inst| {
        let cpu = *inst.cpus()?.first().ok_or_else(|| anyhow::anyhow!("no per-CPU buffers"))?;
        inst.set_buffer_size_kb(16)?;
        probe_mmap(&inst, cpu).map(|p| (cpu, p))
    });
    match trial {
        Ok((cpu, p)) => finding(
            Status::Ok,
            what,
            format!(
                "mapped cpu{cpu} of a scratch instance (meta page {} bytes, {} sub-buffers of {} \
                 bytes); {READ_MODE_DEFAULT}",
                p.meta_page_size, p.nr_subbufs, p.subbuf_size
            ),
        ),
        Err(e) => finding(
            Status::MissingOptional,
            what,
            format!("{e:#}: --read-mode mmap needs Linux ≥ 6.10; {READ_MODE_DEFAULT}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_and_line_format() {
        assert_eq!(parse_release("6.18.44-fc-v769"), Some((6, 18)));
        assert_eq!(parse_release("5.10.0-23-amd64"), Some((5, 10)));
        assert_eq!(parse_release("x"), None);
        assert_eq!(kernel_version("6.9.1").status, Status::MissingOptional);
        assert_eq!(kernel_version("5.4.0").status, Status::Missing);
        assert_eq!(
            finding(Status::Ok, "tracefs", "mounted at /sys/kernel/tracing").to_string(),
            "OK                 tracefs: mounted at /sys/kernel/tracing"
        );
    }

    #[test]
    fn process_exits_say_how_the_last_thread_is_told() {
        let line = |group_dead, live| process_exits(group_dead, live).to_string();
        assert_eq!(
            line(true, false),
            "OK                 process exits: sched_process_exit says which thread's exit ends \
             its process (group_dead)"
        );
        assert!(line(false, true).starts_with("OK "), "{}", line(false, true));
        assert!(line(false, true).contains("signal_struct.live"));
        let leader = process_exits(false, false);
        assert_eq!(leader.status, Status::MissingOptional);
        assert!(leader.detail.ends_with("is reported gone at the leader's exit"), "{leader}");
    }

    /// A missing classic tracepoint stops tracer only where its hook needs it.
    #[test]
    fn classic_tracepoints_are_required_only_without_their_btf_typed_programs() {
        let id = Path::new("/t/events/syscalls/sys_enter_mmap/id");
        let gone = || Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        let typed = BtfTyped { syscalls: true, lifecycle: false };
        let with_trampolines = tracepoint("syscalls", "sys_enter_mmap", id, gone(), typed);
        assert_eq!(
            with_trampolines.to_string(),
            "MISSING (optional) tracepoint syscalls:sys_enter_mmap: \
             /t/events/syscalls/sys_enter_mmap/id unreadable (No such file or directory (os \
             error 2)): not needed while the syscall hooks run on BPF trampolines (only with \
             --hooks syscall-tracepoints, which needs CONFIG_FTRACE_SYSCALLS)"
        );
        let without = tracepoint("syscalls", "sys_enter_mmap", id, gone(), BtfTyped::default());
        assert_eq!(without.status, Status::Missing);
        assert!(without.detail.ends_with("syscall tracepoints need CONFIG_FTRACE_SYSCALLS"));
        // The lifecycle tracepoints, by their own mechanism.
        let exec = tracepoint("sched", "sched_process_exec", id, gone(), typed);
        assert_eq!(exec.status, Status::Missing);
        assert!(exec.detail.ends_with("the kernel lacks this tracepoint"));
        let tp_btf = BtfTyped { syscalls: false, lifecycle: true };
        let exec = tracepoint("sched", "sched_process_exec", id, gone(), tp_btf);
        assert_eq!(exec.status, Status::MissingOptional);
        assert!(
            exec.detail.ends_with(
                "not needed while the lifecycle hooks run on BTF tracepoints (only with --hooks \
                 syscall-tracepoints, which needs this tracepoint)"
            ),
            "{}",
            exec.detail
        );
        assert_eq!(tracepoint("syscalls", "x", id, Ok(()), tp_btf).status, Status::Ok);
    }
}
