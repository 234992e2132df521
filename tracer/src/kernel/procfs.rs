//! procfs lookups: the start-up scan for .NET mappings and listening diagnostic sockets that
//! existed before tracer attached, the
//! identity (comm, uid, cgroup id) of a pid, and what an fd of another process refers to.
//!
//! Everything read here belongs to other processes and can change or vanish at any moment: a
//! process that exits mid-scan is skipped, never an error.
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use std::io::Read as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use tracer_decode::bpf_event::{DetectionEvent, EventBody, Mapping};
use tracer_decode::procfs::{
    MemfdMapping, cgroup_v2_path, mapped_address, memfd_mappings, parse_ns_pid, parse_stat_ppid,
    parse_status_uid,
};
use tracer_decode::unix_socket::{
    ListeningDiagnosticSocket, listening_diagnostic_sockets, parse_socket_link,
};

const PROC: &str = "/proc";
/// Most bytes of one network namespace's `/proc/<pid>/net/unix` read (~100 bytes a socket: a
/// namespace with more than ~600k sockets is scanned in part, and says so in the log).
pub const MAX_NET_UNIX_BYTES: u64 = 64 << 20;

/// What the start-up scan found: memfds of interest mapped, and listening diagnostic sockets.
#[derive(Debug, Default)]
pub struct Scan {
    pub mappings: Vec<MemfdMapping>,
    pub sockets: Vec<FoundSocket>,
}

impl Scan {
    /// Every process found, once, in pid order.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.mappings.iter().map(|m| m.pid).collect();
        pids.extend(self.sockets.iter().map(|s| s.pid));
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

/// A process holding a listening socket with a diagnostic server's name (whose pid is the
/// process's own, as its pid namespace numbers it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundSocket {
    pub pid: u32,
    pub socket: ListeningDiagnosticSocket,
}

/// The thread ids of `pid` (`/proc/<pid>/task`).
pub fn task_ids(pid: u32) -> anyhow::Result<Vec<u32>> {
    let dir = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))?;
    Ok(entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
}

/// Reads at most `max` bytes of a file another process controls.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<(Vec<u8>, bool)> {
    let mut buf = Vec::new();
    std::fs::File::open(path)?.take(max + 1).read_to_end(&mut buf)?;
    let truncated = buf.len() as u64 > max;
    buf.truncate(max as usize);
    Ok((buf, truncated))
}

/// Every pid currently in /proc.
pub fn pids() -> std::io::Result<Vec<u32>> {
    let mut pids: Vec<u32> =
        fs::read_dir(PROC)?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    pids.sort_unstable();
    Ok(pids)
}

/// The start-up scan of `audit` and `run`: memfds of interest mapped, and listening diagnostic
/// sockets held, by every process but tracer, or only by `targets` and their descendants when
/// targets are given.
pub fn scan_targets(targets: &[u32]) -> std::io::Result<Scan> {
    let me = std::process::id();
    let mut selected = pids()?;
    if targets.is_empty() {
        selected.retain(|&pid| pid != me);
    } else {
        let parents: HashMap<u32, u32> = selected
            .iter()
            .filter_map(|&pid| {
                let stat = fs::read_to_string(Path::new(PROC).join(pid.to_string()).join("stat"));
                Some((pid, parse_stat_ppid(&stat.ok()?)?))
            })
            .collect();
        selected.retain(|&pid| pid != me && is_descendant(pid, targets, &parents));
    }
    Ok(Scan {
        mappings: scan_memfd_mappings(&selected),
        sockets: scan_diagnostic_sockets(&selected),
    })
}

/// The listening diagnostic sockets of `pids`: each network namespace's `net/unix` is read
/// once (through one of its processes), and a socket belongs to a process of that namespace
/// whose own (innermost) pid its name carries and which holds it (an fd `socket:[<inode>]`).
/// Processes that exit or deny access mid-scan are skipped.
pub fn scan_diagnostic_sockets(pids: &[u32]) -> Vec<FoundSocket> {
    let mut by_netns: HashMap<(u64, u64), Vec<u32>> = HashMap::new();
    for &pid in pids {
        if let Ok(ns) = fs::metadata(Path::new(PROC).join(pid.to_string()).join("ns/net")) {
            by_netns.entry((ns.dev(), ns.ino())).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    for members in by_netns.values() {
        let Some(text) = members.iter().find_map(|&pid| read_net_unix(pid)) else { continue };
        let sockets = listening_diagnostic_sockets(&text);
        if sockets.is_empty() {
            continue;
        }
        for &pid in members {
            let status = fs::read_to_string(Path::new(PROC).join(pid.to_string()).join("status"));
            let Some(ns_pid) = status.ok().and_then(|s| parse_ns_pid(&s)) else { continue };
            let named: Vec<&ListeningDiagnosticSocket> =
                sockets.iter().filter(|s| s.name.pid == u64::from(ns_pid)).collect();
            if named.is_empty() {
                continue;
            }
            let held = socket_inodes(pid);
            if let Some(s) = named.into_iter().find(|s| held.contains(&s.inode)) {
                found.push(FoundSocket { pid, socket: s.clone() });
            }
        }
    }
    found.sort_by_key(|f| f.pid);
    found
}

/// `/proc/<pid>/net/unix` (the sockets of `pid`'s network namespace), at most
/// [`MAX_NET_UNIX_BYTES`].
fn read_net_unix(pid: u32) -> Option<Vec<u8>> {
    let file = fs::File::open(Path::new(PROC).join(pid.to_string()).join("net/unix")).ok()?;
    let mut text = Vec::new();
    file.take(MAX_NET_UNIX_BYTES).read_to_end(&mut text).ok()?;
    if text.len() as u64 == MAX_NET_UNIX_BYTES {
        log::warn!(
            "/proc/{pid}/net/unix exceeds {MAX_NET_UNIX_BYTES} bytes: diagnostic sockets past \
             that are not scanned"
        );
    }
    Some(text)
}

/// Inodes of the sockets `pid` holds open.
pub fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(dir) = fs::read_dir(Path::new(PROC).join(pid.to_string()).join("fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let target = fs::read_link(e.ok()?.path()).ok()?;
        parse_socket_link(target.as_os_str().as_encoded_bytes())
    })
    .collect()
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

/// Scans `/proc/<pid>/maps` of `pids` for memfds of interest.
fn scan_memfd_mappings(pids: &[u32]) -> Vec<MemfdMapping> {
    let mut out = Vec::new();
    for &pid in pids {
        // Kernel threads have empty maps; processes may exit mid-scan.
        // Bytes, not UTF-8 text: a process can name files (or memfds) with any bytes, and one such
        // line must not hide its other mappings.
        let path = Path::new(PROC).join(pid.to_string()).join("maps");
        if let Ok((maps, _)) = read_bounded(&path, MAX_MAPS_BYTES) {
            out.extend(memfd_mappings(pid, &String::from_utf8_lossy(&maps)));
        }
    }
    out
}

/// How long one mapping detection waits for its mapping to show in `/proc/<pid>/maps`. The
/// programs report an `mmap` at syscall entry, and the reader can run before the mapping
/// exists (the wake-up may preempt the mapping thread): it usually shows within microseconds.
pub const MAPPING_CONFIRM_TIMEOUT: Duration = Duration::from_millis(20);
/// Most time spent waiting for mappings per second, over all detections: processes whose
/// `mmap`s fail (each costs the whole timeout) cannot stall the detection pipeline.
pub const MAPPING_CONFIRM_BUDGET_PER_SECOND: Duration = Duration::from_millis(100);
const MAPPING_CONFIRM_POLL: Duration = Duration::from_micros(200);
/// Bytes of `/proc/<pid>/maps` read per look, at start-up and per live mapping (another
/// process controls its length: ~65 k mappings with long names run to hundreds of MiB); a
/// mapping past them is not found.
pub const MAX_MAPS_BYTES: u64 = 16 << 20;
const MAP_FIXED: u64 = 0x10;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;

/// Finds the address a reported `mmap` got, within the waiting budget.
#[derive(Debug)]
pub struct MappingConfirmer {
    window_start: Instant,
    waited: Duration,
}

impl Default for MappingConfirmer {
    fn default() -> Self {
        MappingConfirmer { window_start: Instant::now(), waited: Duration::ZERO }
    }
}

impl MappingConfirmer {
    /// The address of `mapping` in `pid`, `None` when it did not show in time (the `mmap`
    /// failed, the process exited, or the budget is spent).
    pub fn mapped_address(&mut self, pid: u32, mapping: &Mapping) -> Option<u64> {
        let fixed_at =
            (mapping.flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0).then_some(mapping.addr_hint);
        let path = PathBuf::from(format!("{PROC}/{pid}/maps"));
        let find = || {
            let (maps, _) = read_bounded(&path, MAX_MAPS_BYTES).ok()?;
            let text = String::from_utf8_lossy(&maps);
            Some(mapped_address(&text, mapping.memfd_kind, mapping.offset, mapping.len, fixed_at))
        };
        let started = Instant::now();
        if started.duration_since(self.window_start) >= Duration::from_secs(1) {
            (self.window_start, self.waited) = (started, Duration::ZERO);
        }
        let deadline = MAPPING_CONFIRM_TIMEOUT
            .min(MAPPING_CONFIRM_BUDGET_PER_SECOND.saturating_sub(self.waited));
        let found = loop {
            match find() {
                // The process is gone.
                None => break None,
                Some(Some(addr)) => break Some(addr),
                Some(None) if started.elapsed() >= deadline => break None,
                Some(None) => std::thread::sleep(MAPPING_CONFIRM_POLL),
            }
        };
        self.waited += started.elapsed();
        found
    }
}

/// What procfs adds to a live detection, read when its line is made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetectionChecks {
    /// For a user_events ioctl: whether its fd is `user_events_data` (while the process most
    /// likely still holds it).
    pub user_events_data: Option<bool>,
    /// For a memfd mapping: the address it got.
    pub mapped_addr: Option<u64>,
    /// When the process started (`process_start_ns`): the kernel's, else read now.
    pub process_start_ns: Option<u64>,
}

impl DetectionChecks {
    pub fn of(event: &DetectionEvent, confirmer: &mut MappingConfirmer) -> DetectionChecks {
        let pid = event.meta.pid;
        let process_start_ns =
            event.meta.process_start_ns.map(start_ns_of_boottime).or_else(|| process_start_ns(pid));
        let checks = DetectionChecks { process_start_ns, ..DetectionChecks::default() };
        match &event.body {
            EventBody::UserEvents(ioctl) => {
                DetectionChecks { user_events_data: is_user_events_data(pid, ioctl.fd), ..checks }
            }
            EventBody::DotnetIpcReady(m) | EventBody::DotnetRuntimeSeen(m) => DetectionChecks {
                mapped_addr: match m.ret {
                    Some(ret) => mapped_result(ret),
                    None => confirmer.mapped_address(pid, m),
                },
                ..checks
            },
            _ => checks,
        }
    }
}

/// The address an `mmap` returned; `None` for an error (−4095..−1, as the kernel encodes them).
fn mapped_result(ret: i64) -> Option<u64> {
    (!(-4095..0).contains(&ret)).then_some(ret as u64)
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
    /// When it started ([`process_start_ns`]).
    pub start_ns: Option<u64>,
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
        .and_then(|p| cgroup_v2_mount().map(|root| root.join(p.trim_start_matches('/'))))
        .and_then(|dir| fs::metadata(dir).ok())
        .map(|m| m.ino());
    Some(ProcessIdentity { comm, uid, cgroup_id, start_ns: process_start_ns(pid) })
}

/// Nanoseconds per clock tick (`sysconf(_SC_CLK_TCK)`, the unit of `/proc/<pid>/stat`'s
/// `starttime`; 10 ms on every Linux architecture, where USER_HZ is 100).
pub fn ns_per_tick() -> u64 {
    static NS_PER_TICK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS_PER_TICK.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        u64::try_from(ticks_per_s).ok().filter(|t| *t > 0).map_or(10_000_000, |t| 1_000_000_000 / t)
    })
}

/// A process's start as every line carries it (`process_start_ns`, docs/protocol/bpf-detection.md
/// §11): CLOCK_BOOTTIME nanoseconds rounded down to a clock tick, the precision `/proc` gives
/// it, so the kernel's exact `start_boottime` and `/proc/<pid>/stat` name one process alike.
pub fn start_ns_of_boottime(boottime_ns: u64) -> u64 {
    boottime_ns - boottime_ns % ns_per_tick()
}

/// [`start_ns_of_boottime`] of a `/proc/<pid>/stat` `starttime` (clock ticks since boot).
pub fn start_ns_of_ticks(ticks: u64) -> u64 {
    ticks.saturating_mul(ns_per_tick())
}

/// When `pid` started ([`start_ns_of_ticks`] of its `/proc/<pid>/stat`); `None` when it is gone.
/// Read now: for a pid that may have been reused since, the kernel's value (an event's
/// `process_start_ns`) or a pinned process's is the one to use.
pub fn process_start_ns(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(Path::new(PROC).join(pid.to_string()).join("stat")).ok()?;
    tracer_decode::procfs::parse_start_time(&stat).map(start_ns_of_ticks)
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on
/// hybrid hosts).
pub fn cgroup_v2_mount() -> Option<PathBuf> {
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
    fn bounded_reads_cut_and_say_so() {
        let dir = std::env::temp_dir().join(format!("tracer-procfs-{}", std::process::id()));
        std::fs::write(&dir, b"0123456789").unwrap();
        assert_eq!(read_bounded(&dir, 4).unwrap(), (b"0123".to_vec(), true));
        assert_eq!(read_bounded(&dir, 10).unwrap(), (b"0123456789".to_vec(), false));
        std::fs::remove_file(&dir).unwrap();
    }

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
    fn scan_finds_a_listening_diagnostic_socket() {
        let dir = std::env::temp_dir().join(format!("tracer-scan-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let path = dir.join(format!("dotnet-diagnostic-{me}-1-socket"));
        let _ = fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let found = scan_diagnostic_sockets(&[me]);
        fs::remove_file(&path).unwrap();
        let inode = fs::metadata(format!("/proc/self/fd/{}", {
            use std::os::fd::AsRawFd as _;
            listener.as_raw_fd()
        }))
        .unwrap()
        .ino();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pid, me);
        assert_eq!(found[0].socket.inode, inode);
        assert_eq!(found[0].socket.path, path.as_os_str().as_encoded_bytes());
        assert_eq!(found[0].socket.name.pid, u64::from(me));
        drop(listener);
        assert_eq!(scan_diagnostic_sockets(&[me]), vec![]);
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

    /// The kernel's start and `/proc`'s agree once rounded to a tick: the same process, named
    /// alike by both sources.
    #[test]
    fn process_start_from_the_kernel_and_from_proc_agree() {
        let tick = ns_per_tick();
        assert_eq!(tick, 10_000_000, "USER_HZ 100");
        assert_eq!(start_ns_of_boottime(1_234_567_890), 1_230_000_000);
        assert_eq!(start_ns_of_ticks(123), 1_230_000_000);
        let stat = fs::read_to_string("/proc/self/stat").unwrap();
        let ticks = tracer_decode::procfs::parse_start_time(&stat).unwrap();
        assert_eq!(process_start_ns(std::process::id()), Some(ticks * tick));
        assert_eq!(process_start_ns(u32::MAX), None);
    }
}
