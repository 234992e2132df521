//! procfs lookups: the start-up scan for .NET mappings that existed before tracer attached, the
//! identity (comm, uid, cgroup id) of a pid, and what an fd of another process refers to.
//!
//! Everything read here belongs to other processes and can change or vanish at any moment: a
//! process that exits mid-scan is skipped, never an error.
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use tracer_decode::procfs::{
    MemfdMapping, cgroup_v2_path, memfd_mappings, parse_stat_ppid, parse_status_uid,
};

const PROC: &str = "/proc";

/// Every pid currently in /proc.
pub fn pids() -> std::io::Result<Vec<u32>> {
    let mut pids: Vec<u32> =
        fs::read_dir(PROC)?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    pids.sort_unstable();
    Ok(pids)
}

/// The start-up scan of `audit` and `run`: memfds of interest mapped by every process but
/// tracer, or only by `targets` and their descendants when targets are given.
pub fn scan_targets(targets: &[u32]) -> std::io::Result<Vec<MemfdMapping>> {
    let me = std::process::id();
    if targets.is_empty() {
        return scan_memfd_mappings(|pid| pid != me);
    }
    let parents: HashMap<u32, u32> = pids()?
        .into_iter()
        .filter_map(|pid| {
            let stat = fs::read_to_string(Path::new(PROC).join(pid.to_string()).join("stat"));
            Some((pid, parse_stat_ppid(&stat.ok()?)?))
        })
        .collect();
    scan_memfd_mappings(|pid| pid != me && is_descendant(pid, targets, &parents))
}

/// `pid` is one of `targets` or has one as an ancestor in `parents` (child → parent).
fn is_descendant(pid: u32, targets: &[u32], parents: &HashMap<u32, u32>) -> bool {
    let mut current = pid;
    // At most one step per process: a snapshot taken while processes exit and pids are reused
    // may hold a cycle.
    for _ in 0..=parents.len() {
        if targets.contains(&current) {
            return true;
        }
        match parents.get(&current) {
            Some(&parent) if parent != 0 && parent != current => current = parent,
            _ => return false,
        }
    }
    false
}

/// Scans `/proc/*/maps` for memfds of interest. `include(pid)` selects processes.
fn scan_memfd_mappings(include: impl Fn(u32) -> bool) -> std::io::Result<Vec<MemfdMapping>> {
    let mut out = Vec::new();
    for pid in pids()?.into_iter().filter(|p| include(*p)) {
        // Kernel threads have empty maps; processes may exit mid-scan.
        // Bytes, not UTF-8 text: a process can name files (or memfds) with any bytes, and one such
        // line must not hide its other mappings.
        if let Ok(maps) = fs::read(Path::new(PROC).join(pid.to_string()).join("maps")) {
            out.extend(memfd_mappings(pid, &String::from_utf8_lossy(&maps)));
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
    fn descendants_follow_parent_links() {
        let parents: HashMap<u32, u32> =
            [(10, 1), (11, 10), (12, 11), (20, 1), (30, 31), (31, 30)].into_iter().collect();
        assert!(is_descendant(10, &[10], &parents));
        assert!(is_descendant(12, &[10], &parents), "grandchild");
        assert!(!is_descendant(20, &[10], &parents), "sibling");
        assert!(!is_descendant(1, &[10], &parents), "parent");
        assert!(!is_descendant(30, &[10], &parents), "a cycle ends");
        assert!(!is_descendant(99, &[10], &parents), "unknown pid");
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
