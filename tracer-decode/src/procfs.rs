//! Parsers of `/proc/<pid>/*` text. Every byte of these files is controlled (or influenced) by
//! the process they describe, which tracer does not trust: parsers take the text, never a path,
//! and return `None` for anything they cannot parse.
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;

use tracer_common::MemfdKind;

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

/// The columns of one `/proc/<pid>/maps` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    pub start: u64,
    /// Exclusive.
    pub end: u64,
    /// `rwxp`-style permissions as procfs prints them.
    pub perms: &'a str,
    /// File offset of `start` (0 for anonymous mappings).
    pub offset: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    /// 0 for anonymous mappings.
    pub inode: u64,
    /// The path column with its leading padding removed: a file (` (deleted)` appended once
    /// it is unlinked, a newline in its name printed as `\012`), `[heap]`, `[stack]`, `[vdso]`,
    /// or empty for anonymous memory.
    pub path: &'a str,
}

/// Parses the columns of one `/proc/<pid>/maps` line.
pub fn parse_maps_columns(line: &str) -> Option<MapsLine<'_>> {
    let mut cols = line.splitn(6, ' ');
    let (start, end) = cols.next()?.split_once('-')?;
    let perms = cols.next()?;
    let offset = cols.next()?;
    let (dev_major, dev_minor) = cols.next()?.split_once(':')?;
    let inode = cols.next()?;
    Some(MapsLine {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms,
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev_major: u32::from_str_radix(dev_major, 16).ok()?,
        dev_minor: u32::from_str_radix(dev_minor, 16).ok()?,
        inode: inode.parse().ok()?,
        path: cols.next().unwrap_or("").trim_start(),
    })
}

/// Parses one `/proc/<pid>/maps` line; `Some` when it maps a memfd of interest. Only the name
/// prefix is matched (the kernel appends ` (deleted)`); permissions are ignored because the
/// runtime's IPC mapping is `---p`.
pub fn parse_maps_line(pid: u32, line: &str) -> Option<MemfdMapping> {
    let columns = parse_maps_columns(line)?;
    let name = columns.path.strip_prefix("/memfd:")?;
    let memfd_kind = if memfd_name_matches(name, "dotnet_ipc_created") {
        MemfdKind::DotnetIpcCreated
    } else if memfd_name_matches(name, "doublemapper") {
        MemfdKind::DoubleMapper
    } else {
        return None;
    };
    Some(MemfdMapping {
        pid,
        memfd_kind,
        start: columns.start,
        end: columns.end,
        perms: columns.perms.to_string(),
        offset: columns.offset,
        path: columns.path.to_string(),
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

/// Where the `mmap` of `len` bytes at file offset `offset` of a memfd of `kind` went, by a
/// `maps` text: the address of that file range in the first mapping holding it (adjacent
/// mappings of one file may have merged into one line). With `fixed_at` (a `MAP_FIXED`
/// address) only a mapping holding that address counts. `None`: not mapped (yet).
pub fn mapped_address(
    maps: &str,
    kind: MemfdKind,
    offset: u64,
    len: u64,
    fixed_at: Option<u64>,
) -> Option<u64> {
    maps.lines().filter_map(|l| parse_maps_line(0, l)).find_map(|m| {
        let delta = offset.checked_sub(m.offset)?;
        let addr = m.start.checked_add(delta)?;
        let holds = m.memfd_kind == kind
            && addr.checked_add(len).is_some_and(|end| end <= m.end)
            && fixed_at.is_none_or(|at| at == addr);
        holds.then_some(addr)
    })
}

impl MemfdMapping {
    /// `PROT_*` bits of the `rwxp` permissions column (`r-xp` → PROT_READ|PROT_EXEC).
    pub fn prot(&self) -> u64 {
        let b = self.perms.as_bytes();
        let bit = |i: usize, c: u8, v: u64| if b.get(i) == Some(&c) { v } else { 0 };
        bit(0, b'r', 1) | bit(1, b'w', 2) | bit(2, b'x', 4)
    }

    /// The mapping is shared (`s` in the fourth permissions column), not private.
    pub fn is_shared(&self) -> bool {
        self.perms.as_bytes().get(3) == Some(&b's')
    }
}

/// The runtime version a process's `maps` text shows: the name of the directory holding the
/// `libcoreclr.so` it mapped, when that name is a version (`…/Microsoft.NETCore.App/3.1.23/
/// libcoreclr.so` → `3.1.23`). Runtimes before .NET 5 answer no ProcessInfo, and this is
/// where their version can still be read (docs/protocol/diagnostic-ipc.md §5).
pub fn coreclr_version(maps: &str) -> Option<&str> {
    maps.lines().find_map(|line| {
        let path = line.splitn(6, ' ').nth(5)?.trim_start();
        let dir = path.strip_suffix("/libcoreclr.so")?;
        let version = dir.rsplit('/').next()?;
        let looks_like_a_version = version.split('.').count() >= 2
            && version.starts_with(|c: char| c.is_ascii_digit())
            && version.bytes().all(|b| b.is_ascii_alphanumeric() || b"-+.".contains(&b));
        looks_like_a_version.then_some(version)
    })
}

/// The real uid (first column of `Uid:`) of a `/proc/<pid>/status` text.
pub fn parse_status_uid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

/// The unified-hierarchy path (`0::/path`) of a `/proc/<pid>/cgroup` text.
pub fn cgroup_v2_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The thread-group id (`Tgid:`) of a `/proc/<tid>/status` text: the process a thread belongs to.
pub fn parse_status_tgid(status: &str) -> Option<i32> {
    status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()
}

/// The effective capability set (`CapEff:`, hex) of a `/proc/<pid>/status` text.
pub fn parse_status_cap_eff(status: &str) -> Option<u64> {
    parse_status_hex(status, "CapEff:")
}

/// The bounding capability set (`CapBnd:`, hex) of a `/proc/<pid>/status` text: the
/// capabilities the process can ever have (a container runtime drops the others from it).
pub fn parse_status_cap_bnd(status: &str) -> Option<u64> {
    parse_status_hex(status, "CapBnd:")
}

fn parse_status_hex(status: &str, key: &str) -> Option<u64> {
    u64::from_str_radix(status.lines().find_map(|l| l.strip_prefix(key))?.trim(), 16).ok()
}

/// The innermost pid of the `NSpid:` line of a `/proc/<pid>/status` text.
pub fn parse_ns_pid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// How many pid namespaces see the process: the number of pids on its `NSpid:` line (1 in the
/// host's namespace, one more for each nested namespace).
pub fn parse_ns_pid_depth(status: &str) -> Option<usize> {
    let pids = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace();
    let mut depth = 0;
    for pid in pids {
        pid.parse::<u32>().ok()?;
        depth += 1;
    }
    (depth > 0).then_some(depth)
}

/// A process's seccomp state, from the `Seccomp:` and `Seccomp_filters:` lines of its
/// `/proc/<pid>/status` text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeccompMode {
    /// `Seccomp: 0`.
    Disabled,
    /// `Seccomp: 1`: only read, write, _exit and sigreturn.
    Strict,
    /// `Seccomp: 2`: BPF filters decide every system call (`filters` of them; 0 when the kernel
    /// has no `Seccomp_filters:` line, before 5.9).
    Filter { filters: u32 },
}

/// The seccomp mode of a `/proc/<pid>/status` text; `None` when the kernel prints none
/// (built without CONFIG_SECCOMP) or the line is not one of the three modes.
pub fn parse_status_seccomp(status: &str) -> Option<SeccompMode> {
    let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).map(str::trim);
    match field("Seccomp:")? {
        "0" => Some(SeccompMode::Disabled),
        "1" => Some(SeccompMode::Strict),
        "2" => {
            let filters = field("Seccomp_filters:").and_then(|n| n.parse().ok()).unwrap_or(0);
            Some(SeccompMode::Filter { filters })
        }
        _ => None,
    }
}

/// `TMPDIR` of a NUL-separated `/proc/<pid>/environ` text, `/tmp` when unset or empty.
pub fn parse_tmpdir(environ: &[u8]) -> PathBuf {
    environ
        .split(|b| *b == 0)
        .find_map(|var| var.strip_prefix(b"TMPDIR="))
        .filter(|dir| !dir.is_empty())
        .map(|dir| PathBuf::from(OsStr::from_bytes(dir)))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// Field 22 of a `/proc/<pid>/stat` text (`starttime`, in clock ticks since boot), counted after
/// the last `)` because the comm field may contain spaces and parentheses.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // after_comm starts at field 3 (state), so field 22 is the 20th token.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// The uids of the `Uid:` line of a `/proc/<pid>/status` text: real, effective, saved and
/// filesystem uid (the one a file the process creates is owned by).
pub fn parse_status_uids(status: &str) -> Option<[u32; 4]> {
    let mut ids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace();
    let mut uids = [0u32; 4];
    for uid in &mut uids {
        *uid = ids.next()?.parse().ok()?;
    }
    ids.next().is_none().then_some(uids)
}

/// The clock offsets of a time namespace, from a `/proc/<pid>/timens_offsets` text, in
/// nanoseconds (may be negative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimensOffsets {
    pub monotonic_ns: i128,
    pub boottime_ns: i128,
}

/// Parses `/proc/<pid>/timens_offsets`: one `<clock> <seconds> <nanoseconds>` line per clock, the
/// clock named `monotonic` or `boottime` (or given by its clock id, 1 or 7, as the file accepts
/// on write), nanoseconds in `0..1e9`. A clock that is not listed has offset 0; any other line
/// makes the text malformed (`None`).
pub fn parse_timens_offsets(text: &str) -> Option<TimensOffsets> {
    let mut offsets = TimensOffsets::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut cols = line.split_whitespace();
        let (clock, secs, nanos) = (cols.next()?, cols.next()?, cols.next()?);
        if cols.next().is_some() {
            return None;
        }
        let secs: i64 = secs.parse().ok()?;
        let nanos: u32 = nanos.parse().ok()?;
        if nanos >= 1_000_000_000 {
            return None;
        }
        let ns = i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        match clock {
            "monotonic" | "1" => offsets.monotonic_ns = ns,
            "boottime" | "7" => offsets.boottime_ns = ns,
            _ => return None,
        }
    }
    Some(offsets)
}

/// The start-time values (`starttime`, field 22 of `/proc/<pid>/stat`) a process may read for
/// itself in its own time namespace, given the value `reader_ticks` that a reader in another
/// time namespace read. The kernel reports `(start_boottime + boottime offset of the reader's
/// namespace) / ns_per_tick`, rounded down; the monotonic offset plays no part. The two offsets
/// differ by `delta_ns` (target's boottime offset minus the reader's): when `delta_ns` is a
/// whole number of ticks the value is exact, otherwise the rounding makes it one of two
/// neighbours (lower first). Values that would be negative are left out (`ns_per_tick` 0: none).
pub fn start_time_in_namespace(reader_ticks: u64, delta_ns: i128, ns_per_tick: u64) -> Vec<u64> {
    if ns_per_tick == 0 {
        return Vec::new();
    }
    let tick = i128::from(ns_per_tick);
    // The reader's start time in ns lies in [reader_ticks × tick, (reader_ticks + 1) × tick).
    let first = i128::from(reader_ticks) * tick + delta_ns;
    let lo = first.div_euclid(tick);
    let hi = (first + tick - 1).div_euclid(tick);
    let mut keys: Vec<u64> = [lo, hi].into_iter().filter_map(|k| u64::try_from(k).ok()).collect();
    keys.dedup();
    keys
}

/// The `Pid:` of a pidfd's `/proc/<pid>/fdinfo/<fd>` text: the process's pid in the reader's pid
/// namespace, `-1` once it has exited, `0` when it has no pid there.
pub fn parse_pidfd_fdinfo_pid(fdinfo: &str) -> Option<i64> {
    fdinfo.lines().find_map(|l| l.strip_prefix("Pid:"))?.trim().parse().ok()
}

/// Field 4 (`ppid`) of a `/proc/<pid>/stat` text: the parent process.
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // after_comm starts at field 3 (state).
    after_comm.split_whitespace().nth(1)?.parse().ok()
}

/// What `tracer top` reads of a `/proc/<pid>/stat` or `/proc/<pid>/task/<tid>/stat` text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskStat<'a> {
    /// Field 2, between the first `(` and the last `)`: the task's own name, which it may set
    /// to anything (`prctl(PR_SET_NAME)`), spaces, parentheses and control characters included.
    pub comm: &'a str,
    /// Field 3: `R` running, `S` sleeping, `D` in uninterruptible wait, `T` stopped, …
    pub state: char,
    /// Fields 14 and 15: CPU time in user and kernel mode, in clock ticks (of every thread, for
    /// a process).
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    /// Field 20.
    pub num_threads: u64,
    /// Field 22: clock ticks since boot when it started.
    pub start_ticks: u64,
    /// Field 24: resident pages.
    pub rss_pages: u64,
}

/// Parses the fields of a `stat` text [`TaskStat`] holds; `None` when one is missing or not a
/// number. The fields after the name are counted from the last `)`.
pub fn parse_task_stat(stat: &str) -> Option<TaskStat<'_>> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    // after_comm starts at field 3 (state): field N is token N - 3.
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().take(22).collect();
    let mut state = fields.first()?.chars();
    let (state, None) = (state.next()?, state.next()) else { return None };
    let number = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some(TaskStat {
        comm,
        state,
        utime_ticks: number(14)?,
        stime_ticks: number(15)?,
        num_threads: number(20)?,
        start_ticks: number(22)?,
        rss_pages: number(24)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_address_finds_the_file_range() {
        let maps = "7f0000000000-7f0000002000 rw-s 00000000 00:01 9 /memfd:doublemapper (deleted)\n\
                    7f0000010000-7f0000013000 r-xs 00001000 00:01 9 /memfd:doublemapper (deleted)\n\
                    7f0000020000-7f0000021000 ---p 00000000 00:01 8 /memfd:dotnet_ipc_created (deleted)\n";
        let dm = MemfdKind::DoubleMapper;
        // Page 1 of the file is in both doublemapper lines; the first holding it wins.
        assert_eq!(mapped_address(maps, dm, 0x1000, 0x1000, None), Some(0x7f00_0000_1000));
        // With MAP_FIXED, the mapping holding that address.
        let fixed = Some(0x7f00_0001_0000);
        assert_eq!(mapped_address(maps, dm, 0x1000, 0x1000, fixed), fixed);
        // A length the kernel rounded up to the page.
        assert_eq!(mapped_address(maps, dm, 0x2000, 10, None), Some(0x7f00_0001_1000));
        assert_eq!(mapped_address(maps, dm, 0x3000, 0x2000, None), None, "past the mapping");
        let ipc = MemfdKind::DotnetIpcCreated;
        assert_eq!(mapped_address(maps, ipc, 0, 0x1000, None), Some(0x7f00_0002_0000));
        assert_eq!(mapped_address(maps, ipc, 0, 0x2000, None), None, "longer than mapped");
        assert_eq!(mapped_address("", ipc, 0, 1, None), None);
    }

    #[test]
    fn the_coreclr_version_is_its_directorys_name() {
        let maps = "7f00-7f10 r--p 00000000 08:01 42   /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f20-7f30 r-xp 00001000 08:01 43   /opt/dotnet/shared/Microsoft.NETCore.App/3.1.23/libcoreclr.so\n";
        assert_eq!(coreclr_version(maps), Some("3.1.23"));
        let preview = "7f20-7f30 r-xp 00001000 08:01 43 /d/Microsoft.NETCore.App/10.0.0-rc.2.25502.107/libcoreclr.so";
        assert_eq!(coreclr_version(preview), Some("10.0.0-rc.2.25502.107"));
        // A copy in a directory that is not a version says nothing.
        assert_eq!(coreclr_version("7f20-7f30 r-xp 0 0:0 1 /app/libcoreclr.so"), None);
        assert_eq!(coreclr_version("7f20-7f30 r-xp 0 0:0 1 /x/8/libcoreclr.so"), None);
        assert_eq!(coreclr_version("7f20-7f30 r-xp 0 0:0 1 /x/8.0.4/libcoreclr.so.bak"), None);
        assert_eq!(coreclr_version("7f20-7f30 r-xp 0 0:0 1 /x/8.0\u{1b}[2J/libcoreclr.so"), None);
        assert_eq!(coreclr_version(""), None);
    }

    #[test]
    fn maps_columns_of_files_and_anonymous_memory() {
        let lib = "7f3a1c200000-7f3a1c3a0000 r-xp 00028000 fd:01 1054   /usr/lib/libc.so.6";
        assert_eq!(
            parse_maps_columns(lib),
            Some(MapsLine {
                start: 0x7f3a_1c20_0000,
                end: 0x7f3a_1c3a_0000,
                perms: "r-xp",
                offset: 0x28000,
                dev_major: 0xfd,
                dev_minor: 1,
                inode: 1054,
                path: "/usr/lib/libc.so.6",
            })
        );
        let stack = parse_maps_columns("7ffd5e000000-7ffd5e021000 rw-p 00000000 00:00 0 [stack]");
        assert_eq!(stack.map(|m| (m.inode, m.path)), Some((0, "[stack]")));
        let anon = parse_maps_columns("7f00-7f10 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((anon.inode, anon.path), (0, ""));
        assert_eq!(parse_maps_columns("7f00-7f10 rw-p 00000000 00:00 0").unwrap().path, "");
        let spaced = parse_maps_columns("1000-2000 r--p 0 00:2a 7 /tmp/a dir/x (deleted)").unwrap();
        assert_eq!((spaced.dev_minor, spaced.path), (0x2a, "/tmp/a dir/x (deleted)"));
        for bad in
            ["1000 r--p 0 00:00 0", "1000-2000 r--p 0 0000 0 /x", "1000-2000 r--p 0 00:00 x /x", ""]
        {
            assert_eq!(parse_maps_columns(bad), None, "{bad}");
        }
    }

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
    fn ns_pid_is_the_last_value() {
        assert_eq!(parse_ns_pid("Name:\tx\nNSpid:\t4242\n"), Some(4242));
        assert_eq!(parse_ns_pid("NSpid:\t4242\t17\t1\nPPid:\t1\n"), Some(1));
        assert_eq!(parse_ns_pid("Name:\tx\n"), None);
        assert_eq!(parse_ns_pid("NSpid:\t\n"), None);
        assert_eq!(parse_ns_pid_depth("Name:\tx\nNSpid:\t4242\n"), Some(1));
        assert_eq!(parse_ns_pid_depth("NSpid:\t4242\t17\t1\nPPid:\t1\n"), Some(3));
        assert_eq!(parse_ns_pid_depth("NSpid:\t\n"), None);
        assert_eq!(parse_ns_pid_depth("NSpid:\t4242\tx\n"), None);
    }

    #[test]
    fn tmpdir_from_environ() {
        assert_eq!(parse_tmpdir(b"A=1\0TMPDIR=/run/t\0B=2\0"), PathBuf::from("/run/t"));
        assert_eq!(parse_tmpdir(b"A=1\0TMPDIR=\0"), PathBuf::from("/tmp"));
        assert_eq!(parse_tmpdir(b"XTMPDIR=/x\0"), PathBuf::from("/tmp"));
        assert_eq!(parse_tmpdir(b""), PathBuf::from("/tmp"));
    }

    #[test]
    fn start_time_after_the_last_paren() {
        let fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        let stat = format!("77 (a) b (c)) {}", fields.join(" "));
        assert_eq!(parse_start_time(&stat), Some(22));
        assert_eq!(parse_start_time("77 (x) S 1 2"), None);
        assert_eq!(parse_start_time("no paren"), None);
        assert_eq!(parse_stat_ppid(&stat), Some(4));
        assert_eq!(parse_stat_ppid("7 (x) S"), None);
    }

    #[test]
    fn status_uids() {
        let status = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t5\t5\t5\t5\n";
        assert_eq!(parse_status_uids(status), Some([1000, 1001, 1002, 1003]));
        assert_eq!(parse_status_uids("Uid:\t1\t2\t3\n"), None);
        assert_eq!(parse_status_uids("Uid:\t1\t2\t3\t4\t5\n"), None);
        assert_eq!(parse_status_uids("Uid:\t1\t2\tx\t4\n"), None);
        assert_eq!(parse_status_uids("Name:\tx\n"), None);
    }

    #[test]
    fn timens_offsets() {
        let host = "monotonic           0         0\nboottime            0         0\n";
        assert_eq!(parse_timens_offsets(host), Some(TimensOffsets::default()));
        let shifted = "monotonic         500         0\nboottime         1000       250\n";
        assert_eq!(
            parse_timens_offsets(shifted),
            Some(TimensOffsets { monotonic_ns: 500_000_000_000, boottime_ns: 1_000_000_000_250 })
        );
        assert_eq!(
            parse_timens_offsets("boottime -3 5\n"),
            Some(TimensOffsets { monotonic_ns: 0, boottime_ns: -2_999_999_995 })
        );
        assert_eq!(
            parse_timens_offsets("7 2 0\n1 1 0\n"),
            Some(TimensOffsets { monotonic_ns: 1_000_000_000, boottime_ns: 2_000_000_000 })
        );
        assert_eq!(parse_timens_offsets(""), Some(TimensOffsets::default()));
        for bad in [
            "boottime 1\n",
            "boottime 1 1000000000\n",
            "boottime 1 -1\n",
            "realtime 1 0\n",
            "boottime 1 0 0\n",
            "boottime x 0\n",
        ] {
            assert_eq!(parse_timens_offsets(bad), None, "{bad}");
        }
    }

    #[test]
    fn start_time_seen_from_another_time_namespace() {
        const TICK: u64 = 10_000_000;
        // Same namespace, or whole seconds apart: one exact value.
        assert_eq!(start_time_in_namespace(841_313, 0, TICK), vec![841_313]);
        assert_eq!(start_time_in_namespace(841_313, 1_000_000_000_000, TICK), vec![941_313]);
        assert_eq!(start_time_in_namespace(841_313, -1_000_000_000_000, TICK), vec![741_313]);
        // A fraction of a tick apart: the rounding gives one of two neighbours.
        assert_eq!(start_time_in_namespace(100, 2_500_000, TICK), vec![100, 101]);
        assert_eq!(start_time_in_namespace(100, -2_500_000, TICK), vec![99, 100]);
        // Before the clock's zero: nothing.
        assert_eq!(start_time_in_namespace(100, -2_000_000_000, TICK), Vec::<u64>::new());
        assert_eq!(start_time_in_namespace(0, -2_500_000, TICK), vec![0]);
        assert_eq!(start_time_in_namespace(u64::MAX, 1_000_000_000, TICK), Vec::<u64>::new());
        assert_eq!(start_time_in_namespace(5, 0, 0), Vec::<u64>::new());
    }

    #[test]
    fn pidfd_fdinfo() {
        let live =
            "pos:\t0\nflags:\t02000002\nmnt_id:\t4\nino:\t87672\nPid:\t22749\nNSpid:\t22749\n";
        assert_eq!(parse_pidfd_fdinfo_pid(live), Some(22749));
        assert_eq!(parse_pidfd_fdinfo_pid("Pid:\t-1\nNSpid:\t-1\n"), Some(-1));
        assert_eq!(parse_pidfd_fdinfo_pid("pos:\t0\n"), None);
    }

    #[test]
    fn perms_to_prot_and_sharing() {
        let m = parse_maps_line(1, "1000-2000 r-xs 00000000 00:01 5 /memfd:doublemapper").unwrap();
        assert_eq!((m.prot(), m.is_shared()), (0b101, true));
        let m = parse_maps_line(1, "1000-2000 ---p 00000000 00:01 5 /memfd:doublemapper").unwrap();
        assert_eq!((m.prot(), m.is_shared()), (0, false));
    }

    #[test]
    fn tgid_and_capabilities() {
        assert_eq!(parse_status_tgid("Name:\tx\nTgid:\t4242\nPid:\t4243\n"), Some(4242));
        assert_eq!(parse_status_tgid("Name:\tx\n"), None);
        assert_eq!(parse_status_cap_eff("CapEff:\t000001ffffffffff\n"), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_status_cap_eff("CapEff:\tzz\n"), None);
        // As a podman container's process with --cap-drop=ALL --cap-add=CAP_BPF prints them.
        let status = "CapPrm:\t0000008000000000\nCapEff:\t0000008000000000\n\
                      CapBnd:\t0000008000000000\nCapAmb:\t0000000000000000\n";
        assert_eq!(parse_status_cap_bnd(status), Some(1 << 39));
        assert_eq!(parse_status_cap_bnd("CapEff:\t0000008000000000\n"), None);
    }

    #[test]
    fn seccomp_modes() {
        let filter =
            "Seccomp:\t2\nSeccomp_filters:\t3\nSpeculation_Store_Bypass:\tthread vulnerable\n";
        assert_eq!(parse_status_seccomp(filter), Some(SeccompMode::Filter { filters: 3 }));
        // Kernels before 5.9 print no filter count.
        assert_eq!(parse_status_seccomp("Seccomp:\t2\n"), Some(SeccompMode::Filter { filters: 0 }));
        assert_eq!(
            parse_status_seccomp("Seccomp:\t0\nSeccomp_filters:\t0\n"),
            Some(SeccompMode::Disabled)
        );
        assert_eq!(parse_status_seccomp("Seccomp:\t1\n"), Some(SeccompMode::Strict));
        assert_eq!(parse_status_seccomp("Seccomp:\t7\n"), None);
        assert_eq!(parse_status_seccomp("Name:\tx\n"), None);
    }

    #[test]
    fn task_stat_fields_are_counted_after_the_last_parenthesis() {
        let stat = "31896 (a) b) S\n) R 31890 31896 31890 0 -1 4194560 2515 0 0 0 12 4 0 0 20 0 9 \
                    0 148750 3051737088 6656 18446744073709551615 1 1 0 0 0 0 0 4096\n";
        let parsed = parse_task_stat(stat).expect("a stat line");
        assert_eq!(
            parsed,
            TaskStat {
                comm: "a) b) S\n",
                state: 'R',
                utime_ticks: 12,
                stime_ticks: 4,
                num_threads: 9,
                start_ticks: 148_750,
                rss_pages: 6656,
            }
        );
        assert_eq!(parse_task_stat("1 (x) S 1 2 3"), None, "cut short");
        assert_eq!(parse_task_stat(&stat.replace(" 12 4 ", " 12 -4 ")), None, "not a count");
        assert_eq!(parse_task_stat(&stat.replace(") R ", ") RS ")), None, "one state letter");
        assert_eq!(parse_task_stat("1 x) S"), None, "no name");
    }
}
