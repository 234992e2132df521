//! The kernel's own BTF (`/sys/kernel/btf/vmlinux`): the struct offsets the memfd programs
//! follow to name the file an `mmap` maps (docs/protocol/bpf-detection.md §7).
use anyhow::Context as _;
use tracer_common::Config;
use tracer_decode::btf::Btf;

/// Where the running kernel describes its own types (`CONFIG_DEBUG_INFO_BTF`).
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The member offsets of [`Config`] read from kernel BTF; the rest of the config is default.
/// An error says which file, struct or member is missing.
pub fn memfd_offsets() -> anyhow::Result<Config> {
    let data = std::fs::read(VMLINUX_BTF).with_context(|| {
        format!("reading {VMLINUX_BTF} (kernel built without CONFIG_DEBUG_INFO_BTF?)")
    })?;
    let btf = Btf::parse(&data).with_context(|| format!("parsing {VMLINUX_BTF}"))?;
    let offset = |structure, member| btf.member_offset(structure, member);
    Ok(Config {
        task_files_offset: offset("task_struct", "files")?,
        files_fdt_offset: offset("files_struct", "fdt")?,
        fdtable_max_fds_offset: offset("fdtable", "max_fds")?,
        fdtable_fd_offset: offset("fdtable", "fd")?,
        file_dentry_offset: offset("file", "f_path")? + offset("path", "dentry")?,
        dentry_name_offset: offset("dentry", "d_name")? + offset("qstr", "name")?,
        ..Config::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This host's kernel has BTF; the members whose place no kernel config changes are
    /// checked exactly (`struct path { mnt; dentry; }`, `struct qstr { hash_len; name; }`,
    /// `struct fdtable { max_fds; fd; ... }`).
    #[test]
    fn offsets_of_the_running_kernel() {
        let c = memfd_offsets().unwrap();
        let data = std::fs::read(VMLINUX_BTF).unwrap();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.member_offset("path", "dentry"), Ok(8));
        assert_eq!(btf.member_offset("qstr", "name"), Ok(8));
        assert_eq!((c.fdtable_max_fds_offset, c.fdtable_fd_offset), (0, 8));
        assert_eq!(c.file_dentry_offset, btf.member_offset("file", "f_path").unwrap() + 8);
        assert!(c.task_files_offset > 0 && c.dentry_name_offset > 8);
    }
}
