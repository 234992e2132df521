//! The kernel's own BTF (`/sys/kernel/btf/vmlinux`): the struct offsets the memfd programs
//! follow to name the file an `mmap` maps (docs/protocol/bpf-detection.md §7), and where the
//! trampoline programs find syscall arguments (§8).
use anyhow::Context as _;
use tracer_common::Config;
use tracer_decode::btf::Btf;

/// Where the running kernel describes its own types (`CONFIG_DEBUG_INFO_BTF`).
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// What the programs read at offsets from kernel BTF.
#[derive(Clone, Debug)]
pub struct KernelOffsets {
    /// The memfd programs' struct member offsets in [`Config`]; the rest of it is default.
    pub memfd: Config,
    /// Where in `struct pt_regs` syscall arguments 0..6 are (the trampoline programs on
    /// `__x64_sys_*` read them there), or why that is not known.
    pub syscall_args: Result<[u32; 6], String>,
}

/// The `struct pt_regs` members holding syscall arguments 0..6 (the x86-64 syscall ABI).
const SYSCALL_ARG_REGISTERS: [&str; 6] = ["di", "si", "dx", "r10", "r8", "r9"];

/// Reads kernel BTF once for every offset the programs need. An error says which file,
/// struct or member is missing.
pub fn kernel_offsets() -> anyhow::Result<KernelOffsets> {
    let data = std::fs::read(VMLINUX_BTF).with_context(|| {
        format!("reading {VMLINUX_BTF} (kernel built without CONFIG_DEBUG_INFO_BTF?)")
    })?;
    let btf = Btf::parse(&data).with_context(|| format!("parsing {VMLINUX_BTF}"))?;
    let offset = |structure, member| btf.member_offset(structure, member);
    let memfd = Config {
        task_files_offset: offset("task_struct", "files")?,
        files_fdt_offset: offset("files_struct", "fdt")?,
        fdtable_max_fds_offset: offset("fdtable", "max_fds")?,
        fdtable_fd_offset: offset("fdtable", "fd")?,
        file_dentry_offset: offset("file", "f_path")? + offset("path", "dentry")?,
        dentry_name_offset: offset("dentry", "d_name")? + offset("qstr", "name")?,
        ..Config::default()
    };
    let mut syscall_args = Ok([0; 6]);
    for (i, register) in SYSCALL_ARG_REGISTERS.iter().enumerate() {
        match (&mut syscall_args, offset("pt_regs", register)) {
            (Ok(args), Ok(at)) => args[i] = at,
            (Ok(_), Err(e)) => syscall_args = Err(format!("{VMLINUX_BTF}: {e}")),
            (Err(_), _) => {}
        }
    }
    Ok(KernelOffsets { memfd, syscall_args })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This host's kernel has BTF; the members whose place no kernel config changes are
    /// checked exactly (`struct path { mnt; dentry; }`, `struct qstr { hash_len; name; }`,
    /// `struct fdtable { max_fds; fd; ... }`).
    #[test]
    fn offsets_of_the_running_kernel() {
        let offsets = kernel_offsets().unwrap();
        let c = offsets.memfd;
        let data = std::fs::read(VMLINUX_BTF).unwrap();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.member_offset("path", "dentry"), Ok(8));
        assert_eq!(btf.member_offset("qstr", "name"), Ok(8));
        assert_eq!((c.fdtable_max_fds_offset, c.fdtable_fd_offset), (0, 8));
        assert_eq!(c.file_dentry_offset, btf.member_offset("file", "f_path").unwrap() + 8);
        assert!(c.task_files_offset > 0 && c.dentry_name_offset > 8);
        // x86-64 `struct pt_regs`: r15 first, 8 bytes each, the argument registers in this
        // order (arch/x86/include/asm/ptrace.h).
        assert_eq!(offsets.syscall_args, Ok([112, 104, 96, 56, 72, 64]));
    }
}
