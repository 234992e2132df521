//! procfs lookups: the start-up scan for .NET mappings that existed before tracer attached, the
//! identity (comm, uid, cgroup id) of a pid, and what an fd of another process refers to.
//!
//! Everything read here belongs to other processes and can change or vanish at any moment: a
//! process that exits mid-scan is skipped, never an error.
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use tracer_common::MemfdKind;

const PROC: &str = "/proc";

/// A mapping of a memfd of interest found in `/proc/<pid>/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemfdMapping {
    pub pid: u32,
    pub memfd_kind: MemfdKind,
    pub start: u64,
    pub end: u64,
    /// `rwxp`-style permissions as procfs prints them.
    pub perms: String,
    pub offset: u64,
    /// The path column, e.g. `/memfd:dotnet_ipc_created (deleted)`.
    pub path: String,
}

/// Parses one `/proc/<pid>/maps` line; `Some` when it maps a memfd of interest. Only the name
/// prefix is matched (the kernel appends ` (deleted)`); permissions are ignored because the
/// runtime's IPC mapping is `---p`.
pub fn parse_maps_line(pid: u32, line: &str) -> Option<MemfdMapping> {
    let mut cols = line.splitn(6, ' ');
    let range = cols.next()?;
    let perms = cols.next()?;
    let offset = cols.next()?;
    let _dev = cols.next()?;
    let _inode = cols.next()?;
    let path = cols.next()?.trim_start();
    let name = path.strip_prefix("/memfd:")?;
    let memfd_kind = if memfd_name_matches(name, "dotnet_ipc_created") {
        MemfdKind::DotnetIpcCreated
    } else if memfd_name_matches(name, "doublemapper") {
        MemfdKind::DoubleMapper
    } else {
        return None;
    };
    let (start, end) = range.split_once('-')?;
    Some(MemfdMapping {
        pid,
        memfd_kind,
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms: perms.to_string(),
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: path.to_string(),
    })
}

/// `name` is exactly `wanted`, optionally followed by procfs's ` (deleted)` marker.
fn memfd_name_matches(name: &str, wanted: &str) -> bool {
    name.strip_prefix(wanted).is_some_and(|rest| rest.is_empty() || rest.starts_with(" ("))
}

/// The first mapping of each memfd kind of interest in a `maps` text (one report per process
/// and kind, as the live path reports the runtime once).
pub fn memfd_mappings(pid: u32, maps: &str) -> Vec<MemfdMapping> {
    let mut found: Vec<MemfdMapping> = Vec::new();
    for m in maps.lines().filter_map(|l| parse_maps_line(pid, l)) {
        if !found.iter().any(|f| f.memfd_kind == m.memfd_kind) {
            found.push(m);
        }
    }
    found
}

/// Every pid currently in /proc.
pub fn pids() -> std::io::Result<Vec<u32>> {
    let mut pids: Vec<u32> =
        fs::read_dir(PROC)?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    pids.sort_unstable();
    Ok(pids)
}

/// Scans `/proc/*/maps` for memfds of interest. `include(pid)` selects processes.
pub fn scan_memfd_mappings(include: impl Fn(u32) -> bool) -> std::io::Result<Vec<MemfdMapping>> {
    let mut out = Vec::new();
    for pid in pids()?.into_iter().filter(|p| include(*p)) {
        // Kernel threads have empty maps; processes may exit mid-scan.
        if let Ok(maps) = fs::read_to_string(Path::new(PROC).join(pid.to_string()).join("maps")) {
            out.extend(memfd_mappings(pid, &maps));
        }
    }
    Ok(out)
}

/// What `/proc/<pid>/fd/<fd>` points to, if the process and fd still exist.
pub fn fd_target(pid: u32, fd: i32) -> Option<PathBuf> {
    fs::read_link(format!("{PROC}/{pid}/fd/{fd}")).ok()
}

/// Whether the fd is the tracefs `user_events_data` file; `None` when it cannot be told
/// (process or fd gone, no permission).
pub fn is_user_events_data(pid: u32, fd: i32) -> Option<bool> {
    fd_target(pid, fd).map(|t| t.file_name().is_some_and(|n| n == "user_events_data"))
}

/// Identity of a process as the BPF header reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub comm: String,
    /// Real uid.
    pub uid: u32,
    /// cgroup v2 id (the inode of the cgroup directory), as `bpf_get_current_cgroup_id`.
    pub cgroup_id: Option<u64>,
}

/// comm, uid and cgroup id of `pid`; `None` if it is gone.
pub fn process_identity(pid: u32) -> Option<ProcessIdentity> {
    let dir = Path::new(PROC).join(pid.to_string());
    let comm = fs::read_to_string(dir.join("comm")).ok()?.trim_end_matches('\n').to_string();
    let status = fs::read_to_string(dir.join("status")).ok()?;
    let uid = parse_status_uid(&status)?;
    let cgroup_id = fs::read_to_string(dir.join("cgroup"))
        .ok()
        .and_then(|c| cgroup_v2_path(&c).map(str::to_string))
        .and_then(|p| cgroup_v2_root().map(|root| root.join(p.trim_start_matches('/'))))
        .and_then(|dir| fs::metadata(dir).ok())
        .map(|m| m.ino());
    Some(ProcessIdentity { comm, uid, cgroup_id })
}

/// The real uid (first column of `Uid:`) of a `/proc/<pid>/status` text.
pub fn parse_status_uid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

/// The unified-hierarchy path (`0::/path`) of a `/proc/<pid>/cgroup` text.
pub fn cgroup_v2_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// Where the cgroup v2 hierarchy is mounted.
fn cgroup_v2_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let (_dev, dir, fstype) = (it.next()?, it.next()?, it.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(dir))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let ipc = "7f5e1c000000-7f5e1c001000 ---p 00000000 00:01 2054   /memfd:dotnet_ipc_created (deleted)";
        assert_eq!(
            parse_maps_line(7, ipc),
            Some(MemfdMapping {
                pid: 7,
                memfd_kind: MemfdKind::DotnetIpcCreated,
                start: 0x7f5e_1c00_0000,
                end: 0x7f5e_1c00_1000,
                perms: "---p".into(),
                offset: 0,
                path: "/memfd:dotnet_ipc_created (deleted)".into(),
            })
        );
        let dm = "7f0000000000-7f0000010000 r-xs 00010000 00:01 99 /memfd:doublemapper (deleted)";
        let m = parse_maps_line(8, dm).unwrap();
        assert_eq!(
            (m.memfd_kind, m.offset, m.perms.as_str()),
            (MemfdKind::DoubleMapper, 0x10000, "r-xs")
        );
        // Not deleted yet: still a match.
        assert!(
            parse_maps_line(1, "1000-2000 rw-s 00000000 00:01 5 /memfd:doublemapper").is_some()
        );
        for other in [
            "1000-2000 rw-s 00000000 00:01 5 /memfd:unrelated (deleted)",
            "1000-2000 rw-s 00000000 00:01 5 /memfd:dotnet_ipc_created_not (deleted)",
            "1000-2000 rw-s 00000000 00:01 5 /tmp/memfd:doublemapper",
            "1000-2000 rw-p 00000000 00:00 0 ",
            "1000-2000 rw-p 00000000 00:00 0",
            "garbage",
            "zz-2000 rw-s 00000000 00:01 5 /memfd:doublemapper",
        ] {
            assert_eq!(parse_maps_line(1, other), None, "{other}");
        }
    }

    #[test]
    fn one_mapping_per_kind() {
        let maps = "\
1000-2000 r-xs 00000000 00:01 5 /memfd:doublemapper (deleted)
3000-4000 rw-s 00001000 00:01 5 /memfd:doublemapper (deleted)
5000-6000 ---p 00000000 00:01 6 /memfd:dotnet_ipc_created (deleted)
";
        let found = memfd_mappings(3, maps);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].start, 0x1000);
        assert_eq!(found[1].memfd_kind, MemfdKind::DotnetIpcCreated);
    }

    #[test]
    fn status_and_cgroup() {
        assert_eq!(parse_status_uid("Name:\tx\nUid:\t1000\t1000\t1000\t1000\n"), Some(1000));
        assert_eq!(parse_status_uid("Name:\tx\n"), None);
        assert_eq!(cgroup_v2_path("0::/user.slice/a.scope\n"), Some("/user.slice/a.scope"));
        assert_eq!(cgroup_v2_path("1:name=systemd:/x\n"), None);
    }

    #[test]
    fn live_self_lookups() {
        let me = std::process::id();
        let id = process_identity(me).unwrap();
        // SAFETY: getuid has no preconditions.
        assert_eq!(id.uid, unsafe { libc::getuid() });
        assert!(!id.comm.is_empty());
        let file = fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        assert_eq!(fd_target(me, fd), Some(PathBuf::from("/dev/null")));
        assert_eq!(is_user_events_data(me, fd), Some(false));
        assert_eq!(is_user_events_data(me, 999_999), None);
        assert!(pids().unwrap().contains(&me));
    }
}
