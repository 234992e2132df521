//! The kernel's own BTF (`/sys/kernel/btf/vmlinux`): the struct offsets the memfd programs
//! follow to name the file an `mmap` maps (docs/protocol/bpf-detection.md §7), where the
//! trampoline programs find syscall arguments (§8), what the task iterator walks (§9) and what
//! the BTF-typed lifecycle programs read (§10) and where every event's process start is (§11);
//! what the sampling programs read (docs/protocol/profiling.md); and the type ids BTF-typed
//! programs are loaded against ([`attach_btf`]).
use anyhow::Context as _;
use tracer_common::{Config, SYSCALL_ARG_OFFSETS};
use tracer_decode::btf::{Btf, BtfError, KIND_FUNC, KIND_TYPEDEF, StandInType, stand_in};

/// Where the running kernel describes its own types (`CONFIG_DEBUG_INFO_BTF`).
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// What the programs read at offsets from kernel BTF, by group: each group is found whole or
/// its programs are not attached (a group found in part may leave some of its fields set).
#[derive(Clone, Debug)]
pub struct KernelOffsets {
    /// Every offset found, in its [`Config`] field; the rest of the config is default.
    pub config: Config,
    /// The memfd programs' file-name walk (§7), or why it cannot be done.
    pub memfd: Result<(), String>,
    /// Whether `struct pt_regs` has syscall arguments 0..6 where the trampoline programs on
    /// `__x64_sys_*` load them (`SYSCALL_ARG_OFFSETS`, §8).
    pub syscall_args: Result<(), String>,
    /// The task iterator's walk to each process's user_events enablers (§9); a kernel without
    /// user_events has none of these structs.
    pub enablers: Result<(), String>,
    /// What the `tp_btf` lifecycle programs read (§10): the tracepoints' arguments as the
    /// programs expect them, `task_struct.pid` and `linux_binprm.filename`.
    pub lifecycle: Result<(), String>,
    /// Whether `sched_process_exit` passes `group_dead` (its second argument): which of the two
    /// `tp_btf` exit programs the kernel's verifier takes.
    pub exit_group_dead: bool,
}

/// (tracepoint, the arguments its `tp_btf` program reads: the fewest its prototype may have).
/// `sched_process_exit` may also pass `group_dead` (a second argument, where the kernel has it).
const LIFECYCLE_TRACEPOINT_ARGS: [(&str, usize); 4] = [
    ("task_newtask", 2),
    ("sched_process_fork", 2),
    ("sched_process_exec", 3),
    ("sched_process_exit", 1),
];

/// The `struct pt_regs` members holding syscall arguments 0..6 (the x86-64 syscall ABI).
const SYSCALL_ARG_REGISTERS: [&str; 6] = ["di", "si", "dx", "r10", "r8", "r9"];

fn read_vmlinux_btf() -> anyhow::Result<Vec<u8>> {
    std::fs::read(VMLINUX_BTF).with_context(|| {
        format!("reading {VMLINUX_BTF} (kernel built without CONFIG_DEBUG_INFO_BTF?)")
    })
}

/// Reads kernel BTF once for every offset the programs need. A group's error says which file,
/// struct or member is missing.
pub fn kernel_offsets() -> KernelOffsets {
    match read_vmlinux_btf().and_then(|data| groups(&data)) {
        Ok(offsets) => offsets,
        Err(e) => {
            let why = Err(format!("{e:#}"));
            KernelOffsets {
                config: Config::default(),
                memfd: why.clone(),
                syscall_args: why.clone(),
                enablers: why.clone(),
                lifecycle: why,
                exit_group_dead: false,
            }
        }
    }
}

/// What the sampling programs read at offsets from kernel BTF (docs/protocol/profiling.md
/// "Sampling in the kernel").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplerOffsets {
    /// `task_struct.flags` (kernel threads have no user stack to take), or why it is not known.
    pub task_flags: Result<u32, String>,
    /// `task_struct.pid`, which the `tp_btf` `sched_switch` program reads of the thread it
    /// switches in, once the tracepoint is known to pass the 4 arguments the program reads;
    /// or why that program cannot run here.
    pub switch: Result<u32, String>,
}

/// The `sched_switch` arguments the `tp_btf` off-CPU program reads: `preempt`, `prev`, `next`
/// and `prev_state` (the last since Linux 5.18).
const SCHED_SWITCH_ARGS: usize = 4;

/// Reads kernel BTF for the sampling programs' offsets; each error says what is missing.
pub fn sampler_offsets() -> SamplerOffsets {
    let data = match read_vmlinux_btf() {
        Ok(data) => data,
        Err(e) => {
            let why = Err(format!("{e:#}"));
            return SamplerOffsets { task_flags: why.clone(), switch: why };
        }
    };
    let btf = match Btf::parse(&data) {
        Ok(btf) => btf,
        Err(e) => {
            let why = Err(format!("parsing {VMLINUX_BTF}: {e}"));
            return SamplerOffsets { task_flags: why.clone(), switch: why };
        }
    };
    let found = |r: Result<u32, BtfError>| r.map_err(|e| format!("{VMLINUX_BTF}: {e}"));
    let switch = match btf.tracepoint_args("sched_switch") {
        Ok(args) if args >= SCHED_SWITCH_ARGS => found(btf.member_offset("task_struct", "pid")),
        Ok(args) => Err(format!(
            "tracepoint sched_switch passes {args} arguments, its tp_btf program reads \
             {SCHED_SWITCH_ARGS}"
        )),
        Err(e) => Err(format!("{VMLINUX_BTF}: {e}")),
    };
    SamplerOffsets { task_flags: found(btf.member_offset("task_struct", "flags")), switch }
}

/// The kernel type a BTF-typed program is loaded against, named and kinded as aya's load looks
/// it up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachTarget {
    type_name: String,
    kind: u32,
}

impl AttachTarget {
    /// A trampoline's kernel function.
    pub fn function(name: &str) -> AttachTarget {
        AttachTarget { type_name: name.to_owned(), kind: KIND_FUNC }
    }

    /// A `tp_btf` program's tracepoint: the `btf_trace_<name>` typedef.
    pub fn tracepoint(name: &str) -> AttachTarget {
        AttachTarget { type_name: format!("btf_trace_{name}"), kind: KIND_TYPEDEF }
    }

    /// A BPF iterator's target: the `bpf_iter_<name>` function.
    pub fn iterator(name: &str) -> AttachTarget {
        AttachTarget { type_name: format!("bpf_iter_{name}"), kind: KIND_FUNC }
    }
}

/// A stand-in for the kernel's BTF holding `targets` at the ids the running kernel gives them
/// (those it has; loading against one it lacks fails as against the whole BTF): all that
/// aya's loads of BTF-typed programs read of kernel BTF. aya's parse of the whole of it peaks
/// at ~20 MiB of heap, more than tracer holds at any other time; this reads the file (5 MiB),
/// finds the ids with tracer's own decoder and hands aya 12 bytes per type id up to the
/// highest target's (docs/protocol/bpf-detection.md §8).
pub fn attach_btf(targets: &[AttachTarget]) -> anyhow::Result<aya::Btf> {
    let stand_in = {
        let data = read_vmlinux_btf()?;
        let btf = Btf::parse(&data).with_context(|| format!("parsing {VMLINUX_BTF}"))?;
        let types: Vec<StandInType<'_>> = targets
            .iter()
            .filter_map(|t| {
                let id = btf.type_id(&t.type_name, t.kind)?;
                Some(StandInType { id, name: &t.type_name, kind: t.kind })
            })
            .collect();
        stand_in(&types)
    };
    aya::Btf::parse(&stand_in, aya::Endianness::default())
        .context("aya refused the stand-in for kernel BTF")
}

fn groups(data: &[u8]) -> anyhow::Result<KernelOffsets> {
    let btf = Btf::parse(data).with_context(|| format!("parsing {VMLINUX_BTF}"))?;
    let offset = |structure, member| btf.member_offset(structure, member);
    let found = |group: Result<(), BtfError>| group.map_err(|e| format!("{VMLINUX_BTF}: {e}"));
    let mut c = Config::default();
    let memfd = found((|| {
        c.task_files_offset = offset("task_struct", "files")?;
        c.files_fdt_offset = offset("files_struct", "fdt")?;
        c.fdtable_max_fds_offset = offset("fdtable", "max_fds")?;
        c.fdtable_fd_offset = offset("fdtable", "fd")?;
        c.file_dentry_offset = offset("file", "f_path")? + offset("path", "dentry")?;
        c.dentry_name_offset = offset("dentry", "d_name")? + offset("qstr", "name")?;
        Ok(())
    })());
    // The programs load the arguments at fixed offsets (a direct load needs a constant one):
    // attached only where this kernel's BTF agrees.
    let syscall_args = SYSCALL_ARG_REGISTERS.iter().zip(&SYSCALL_ARG_OFFSETS).try_for_each(
        |(register, &built_for)| match offset("pt_regs", register) {
            Ok(at) if at as usize == built_for => Ok(()),
            Ok(at) => {
                Err(format!("pt_regs.{register} is at {at}, the programs load it at {built_for}"))
            }
            Err(e) => Err(format!("{VMLINUX_BTF}: {e}")),
        },
    );
    let mut exit_group_dead = false;
    let lifecycle = (|| {
        for (tracepoint, wanted) in LIFECYCLE_TRACEPOINT_ARGS {
            let args =
                btf.tracepoint_args(tracepoint).map_err(|e| format!("{VMLINUX_BTF}: {e}"))?;
            if args < wanted {
                return Err(format!(
                    "tracepoint {tracepoint} passes {args} arguments, its tp_btf program reads \
                     {wanted}"
                ));
            }
            if tracepoint == "sched_process_exit" {
                exit_group_dead = args >= 2;
            }
        }
        found((|| {
            c.task_pid_offset = offset("task_struct", "pid")?;
            c.binprm_filename_offset = offset("linux_binprm", "filename")?;
            Ok(())
        })())
    })();
    // Both exit programs use these where the tracepoint has no `group_dead`; without them
    // they take the leader's exit for the process's (the offsets stay 0).
    if let (Ok(signal), Ok(live)) =
        (offset("task_struct", "signal"), offset("signal_struct", "live"))
    {
        (c.task_signal_offset, c.signal_live_offset) = (signal, live);
    }
    // Every event's process start (§11); without them user space reads `/proc/<pid>/stat`.
    if let (Ok(leader), Ok(start)) =
        (offset("task_struct", "group_leader"), offset("task_struct", "start_boottime"))
    {
        (c.task_group_leader_offset, c.task_start_boottime_offset) = (leader, start);
    }
    let enablers = found((|| {
        c.task_pid_offset = offset("task_struct", "pid")?;
        c.task_tgid_offset = offset("task_struct", "tgid")?;
        c.task_user_event_mm_offset = offset("task_struct", "user_event_mm")?;
        c.user_event_mm_enablers_offset = offset("user_event_mm", "enablers")?;
        c.enabler_link_offset = offset("user_event_enabler", "mm_enablers_link")?;
        c.enabler_event_offset = offset("user_event_enabler", "event")?;
        c.enabler_addr_offset = offset("user_event_enabler", "addr")?;
        c.enabler_values_offset = offset("user_event_enabler", "values")?;
        c.user_event_name_offset = offset("user_event", "reg_name")?;
        Ok(())
    })());
    Ok(KernelOffsets { config: c, memfd, syscall_args, enablers, lifecycle, exit_group_dead })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This host's kernel has BTF; the members whose place no kernel config changes are
    /// checked exactly (`struct path { mnt; dentry; }`, `struct qstr { hash_len; name; }`,
    /// `struct fdtable { max_fds; fd; ... }`).
    #[test]
    fn offsets_of_the_running_kernel() {
        let offsets = kernel_offsets();
        assert_eq!(offsets.memfd, Ok(()));
        let c = offsets.config;
        let data = std::fs::read(VMLINUX_BTF).unwrap();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.member_offset("path", "dentry"), Ok(8));
        assert_eq!(btf.member_offset("qstr", "name"), Ok(8));
        assert_eq!((c.fdtable_max_fds_offset, c.fdtable_fd_offset), (0, 8));
        assert_eq!(c.file_dentry_offset, btf.member_offset("file", "f_path").unwrap() + 8);
        assert!(c.task_files_offset > 0 && c.dentry_name_offset > 8);
        // x86-64 `struct pt_regs`: r15 first, 8 bytes each, as the programs load it.
        assert_eq!(offsets.syscall_args, Ok(()));
        // This kernel has no user_events: no enablers to walk.
        let missing = offsets.enablers.unwrap_err();
        assert!(missing.contains("user_event_mm"), "{missing}");
        // 6.18: `sched_process_exit(p, group_dead)`, as its format file says too.
        assert_eq!(offsets.lifecycle, Ok(()));
        assert_eq!(c.task_pid_offset, btf.member_offset("task_struct", "pid").unwrap());
        assert_eq!(
            c.binprm_filename_offset,
            btf.member_offset("linux_binprm", "filename").unwrap()
        );
        assert!(offsets.exit_group_dead);
        // What the exit programs read where the tracepoint has no group_dead.
        assert_eq!(c.task_signal_offset, btf.member_offset("task_struct", "signal").unwrap());
        assert_eq!(c.signal_live_offset, btf.member_offset("signal_struct", "live").unwrap());
        assert!(c.task_signal_offset > 0);
        assert_eq!(
            (c.task_group_leader_offset, c.task_start_boottime_offset),
            (
                btf.member_offset("task_struct", "group_leader").unwrap(),
                btf.member_offset("task_struct", "start_boottime").unwrap()
            )
        );
        assert!(c.task_group_leader_offset > 0 && c.task_start_boottime_offset > 0);
    }

    /// 6.18 passes `sched_switch` its four arguments; `task_struct.flags` and `.pid` are where
    /// BTF says.
    #[test]
    fn sampler_offsets_of_the_running_kernel() {
        let data = std::fs::read(VMLINUX_BTF).unwrap();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.tracepoint_args("sched_switch"), Ok(4));
        assert_eq!(
            sampler_offsets(),
            SamplerOffsets {
                task_flags: Ok(btf.member_offset("task_struct", "flags").unwrap()),
                switch: Ok(btf.member_offset("task_struct", "pid").unwrap()),
            }
        );
    }

    /// The stand-in gives aya the ids aya finds in the whole of this kernel's BTF, and no
    /// type the kernel lacks.
    #[test]
    fn a_stand_in_gives_aya_the_kernels_ids() {
        use aya_obj::btf::BtfKind;
        let stand_in = attach_btf(&[
            AttachTarget::function("__x64_sys_memfd_create"),
            AttachTarget::tracepoint("sched_switch"),
            AttachTarget::iterator("task"),
            AttachTarget::function("no_such_kernel_function"),
        ])
        .unwrap();
        let whole = aya::Btf::from_sys_fs().unwrap();
        for (name, kind) in [
            ("__x64_sys_memfd_create", BtfKind::Func),
            ("btf_trace_sched_switch", BtfKind::Typedef),
            ("bpf_iter_task", BtfKind::Func),
        ] {
            let id = stand_in.id_by_type_name_kind(name, kind).unwrap();
            assert_eq!(id, whole.id_by_type_name_kind(name, kind).unwrap(), "{name}");
        }
        assert!(stand_in.id_by_type_name_kind("no_such_kernel_function", BtfKind::Func).is_err());
        assert!(stand_in.id_by_type_name_kind("sched_switch", BtfKind::Func).is_err());
    }
}
