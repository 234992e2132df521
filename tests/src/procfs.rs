//! Minimal /proc readers for the test programs (independent of tracer's own code on purpose: the
//! test doubles must not share the implementation they check).

use std::fs;

use anyhow::{Context, Result};

/// Last `NSpid` value: the pid inside the innermost pid namespace.
pub fn ns_pid(pid: u32) -> Result<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("NSpid:")).context("no NSpid line")?;
    Ok(line.split_whitespace().last().context("empty NSpid")?.parse()?)
}

/// Fields of /proc/<pid>/stat after the comm, numbered as in proc(5) (3 = state).
fn stat_field(pid: u32, field: usize) -> Result<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = &stat[stat.rfind(')').context("no ')' in stat")? + 1..];
    Ok(rest.split_whitespace().nth(field - 3).context("short stat")?.to_owned())
}

/// The runtime's socket-name key: start time in clock ticks (field 22).
pub fn start_time(pid: u32) -> Result<u64> {
    Ok(stat_field(pid, 22)?.parse()?)
}

pub fn parent_pid(pid: u32) -> Result<u32> {
    Ok(stat_field(pid, 4)?.parse()?)
}

/// Pids whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return vec![] };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| parent_pid(*child).is_ok_and(|ppid| ppid == pid))
        .collect()
}

/// The socket name a runtime with host pid `pid` uses.
pub fn runtime_socket_name(pid: u32) -> Result<String> {
    Ok(format!("dotnet-diagnostic-{}-{}-socket", ns_pid(pid)?, start_time(pid)?))
}
