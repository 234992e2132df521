//! `tracer ps`: the .NET processes on this host, as dotnet-trace's `ps` lists them — found by
//! the start-up scan (`dotnet_ipc_created` / `doublemapper` mappings, listening diagnostic
//! sockets), each asked for ProcessInfo over its verified socket (never a session: the runtime
//! is left as it was), with the session kinds tracer can start with it.
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;

use anyhow::Context as _;
use tracer_common::MemfdKind;
use tracer_decode::diagnostic_ipc::major_version;
use tracer_decode::procfs::coreclr_version;
use tracer_decode::text::escape_control;

use crate::identity::read_labels;
use crate::ipc::client::{DiagnosticClient, RuntimeInfo, Timeouts};
use crate::ipc::socket::{self, Target};
use crate::kernel::procfs;
use crate::kernel::procfs::read_bounded;
use crate::kernel::tracefs::Tracefs;
use crate::output::{
    self, DotnetProcess, Incarnation, JsonLines, Kind, Line, Pid, ProcessLabels, Source,
};
use crate::time::{Clock, monotonic_ns};

/// Runtimes asked for ProcessInfo at once (each look-up reads `/proc` on a blocking thread and
/// each exchange is bounded by the IPC timeout).
pub const MAX_CONCURRENT_PROBES: usize = 16;
/// Bytes of `/proc/<pid>/maps` read for the `libcoreclr.so` path and of `cmdline` for the
/// command line (another process controls both).
const MAX_PROC_TEXT_BYTES: u64 = 4 << 20;
/// Refused socket names an error names.
const MAX_NAMED_REFUSALS: usize = 4;

#[derive(Clone, Debug)]
pub struct PsConfig {
    /// Limits of each step of one ProcessInfo exchange.
    pub timeouts: Timeouts,
    /// How long the whole listing may take: runtimes not answered by then (silent, or waiting
    /// behind [`MAX_CONCURRENT_PROBES`] others) are listed with the reason.
    pub deadline: std::time::Duration,
}

/// One process `tracer ps` lists.
#[derive(Clone, Debug)]
pub struct Listed {
    pub pid: u32,
    /// When it started (`process_start_ns`), read when it was found.
    pub start_ns: Option<u64>,
    pub labels: Option<ProcessLabels>,
    pub process: DotnetProcess,
}

/// Every .NET process found on the host, in pid order.
pub async fn list(config: &PsConfig) -> anyhow::Result<Vec<Listed>> {
    let scan = tokio::task::spawn_blocking(|| procfs::scan_targets(&[]))
        .await
        .context("the /proc scan panicked")?
        .context("scanning /proc")?;
    let mut found_by: BTreeMap<u32, Vec<&'static str>> = BTreeMap::new();
    for m in &scan.mappings {
        let how = match m.memfd_kind {
            MemfdKind::DotnetIpcCreated => "dotnet_ipc_created",
            MemfdKind::DoubleMapper => "doublemapper",
        };
        found_by.entry(m.pid).or_default().push(how);
    }
    for s in &scan.sockets {
        found_by.entry(s.pid).or_default().push("socket");
    }
    let user_events =
        Tracefs::find_or_mount().is_ok_and(|tracefs| tracefs.path("user_events_data").exists());
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_PROBES));
    let deadline = tokio::time::Instant::now() + config.deadline;
    let mut probes = tokio::task::JoinSet::new();
    for (pid, how) in found_by {
        let (permits, timeouts, limit) = (permits.clone(), config.timeouts, config.deadline);
        probes.spawn(async move {
            let start_ns = procfs::process_start_ns(pid);
            let asked = tokio::time::timeout_at(deadline, async {
                let _permit = permits.acquire_owned().await.expect("never closed");
                ask(pid, timeouts).await
            })
            .await
            .unwrap_or_else(|_| {
                Err(format!("no answer within the listing's {} s (--timeout)", limit.as_secs_f64()))
            });
            describe(Incarnation::new(pid, start_ns), how, asked, user_events)
        });
    }
    let mut listed = Vec::new();
    while let Some(done) = probes.join_next().await {
        listed.push(done.context("a ProcessInfo probe panicked")?);
    }
    listed.sort_by_key(|l| l.pid);
    Ok(listed)
}

/// What asking `pid` gave: its socket (found and checked), then its ProcessInfo answer —
/// or why there is none.
type Asked = Result<(String, Result<RuntimeInfo, String>), String>;

/// Locates `pid`'s socket and asks it for ProcessInfo.
async fn ask(pid: u32, timeouts: Timeouts) -> Asked {
    let located = locate(pid).await?;
    let socket = located.path().to_string_lossy().into_owned();
    let answer = DiagnosticClient::new(located, timeouts).probe().await.map_err(|e| e.to_string());
    Ok((socket, answer))
}

/// What `pid` is, from what it answered (when it could be asked) and its `/proc` files.
fn describe(
    who: Incarnation,
    found_by: Vec<&'static str>,
    asked: Asked,
    user_events: bool,
) -> Listed {
    let pid = who.pid;
    let mut process = DotnetProcess {
        command_line: None,
        runtime_version: None,
        version_from: None,
        sessions: Vec::new(),
        found_by,
        socket: None,
        error: None,
    };
    match asked {
        Err(e) => process.error = Some(e),
        Ok((socket, answer)) => {
            process.socket = Some(socket);
            match answer {
                Ok(RuntimeInfo::Known { info, .. }) => {
                    process.command_line = Some(info.command_line.clone());
                    process.runtime_version = info.clr_product_version.clone();
                    process.version_from =
                        info.clr_product_version.as_ref().map(|_| "process_info");
                    process.sessions.push("streaming");
                }
                Ok(RuntimeInfo::PreNet5) => process.sessions.push("streaming"),
                Err(e) => process.error = Some(e),
            }
        }
    }
    if process.runtime_version.is_none()
        && let Some(version) = read_proc_text(pid, "maps").as_deref().and_then(coreclr_version)
    {
        process.runtime_version = Some(version.to_owned());
        process.version_from = Some("libcoreclr_path");
    }
    if process.command_line.is_none() {
        process.command_line = read_proc_text(pid, "cmdline")
            .map(|c| c.trim_end_matches('\0').replace('\0', " "))
            .filter(|c| !c.is_empty());
    }
    let major = process.runtime_version.as_deref().and_then(major_version);
    if !process.sessions.is_empty() && major.is_some_and(|m| m >= 10) && user_events {
        process.sessions.push("user_events");
    }
    if !process.sessions.is_empty() && major.is_some_and(|m| m >= 11) {
        process.sessions.push("buffering");
    }
    Listed { pid, start_ns: who.start_ns, labels: read_labels(pid), process }
}

/// `pid`'s diagnostic socket, pinned and located as a session's would be (one look, no
/// waiting, off the async workers); the error says why not, with the names refused on the way
/// (at most [`MAX_NAMED_REFUSALS`]).
async fn locate(pid: u32) -> Result<socket::DiagnosticSocket, String> {
    let target = Target::pin(pid).map_err(|e| e.to_string())?;
    let (located, refused) = crate::session::locate_off_the_workers(&target).await;
    located.map_err(|e| {
        let mut why = e.to_string();
        for (path, refusal) in refused.iter().take(MAX_NAMED_REFUSALS) {
            why += &format!("; refused {path:?}: {refusal}");
        }
        why
    })
}

/// A `/proc/<pid>/` text file another process controls, bounded.
fn read_proc_text(pid: u32, file: &str) -> Option<String> {
    let path = std::path::PathBuf::from(format!("/proc/{pid}/{file}"));
    let (bytes, _) = read_bounded(&path, MAX_PROC_TEXT_BYTES).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The `dotnet_process` lines of `listed`, then the summary line.
pub fn write_lines(listed: &[Listed], sink: &mut JsonLines) {
    let clock = Clock::new();
    for l in listed {
        let line = Line::new(
            &clock,
            monotonic_ns(),
            Kind::DotnetProcess,
            Source::Procfs,
            Pid::Known(Incarnation::new(l.pid, l.start_ns)),
            &l.process,
        );
        sink.emit(&line.with_labels(l.labels.clone().map(Arc::new)));
    }
    sink.emit(&output::summary_line(&clock, "ps", listed.len() as u64, &[]));
}

/// The table `tracer ps` prints on a terminal; every string a process controls is escaped.
pub fn write_table(listed: &[Listed], mut w: impl Write) -> std::io::Result<()> {
    let dash = || "-".to_string();
    let text = |s: &str| escape_control(s).into_owned();
    let rows: Vec<[String; 7]> = listed
        .iter()
        .map(|l| {
            let p = &l.process;
            let container = l.labels.as_ref().and_then(|x| x.container_id.as_deref());
            [
                l.pid.to_string(),
                container.map_or_else(dash, |c| c.chars().take(12).collect()),
                p.runtime_version.as_deref().map_or_else(dash, text),
                if p.sessions.is_empty() { dash() } else { p.sessions.join(",") },
                p.found_by.join(","),
                p.socket.as_deref().map_or_else(dash, text),
                match (&p.command_line, &p.error) {
                    (_, Some(e)) => format!("(not asked: {})", text(e)),
                    (Some(c), None) => text(c),
                    (None, None) => dash(),
                },
            ]
        })
        .collect();
    let header = ["PID", "CONTAINER", "VERSION", "SESSIONS", "FOUND BY", "SOCKET", "COMMAND"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut print = |cells: [&str; 7]| {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        writeln!(w, "{}", line.trim_end())
    };
    print(header)?;
    for row in &rows {
        print(row.each_ref().map(String::as_str))?;
    }
    Ok(())
}
