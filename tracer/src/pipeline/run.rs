//! `tracer run`: detect .NET processes (in-kernel, plus a /proc scan for those already running),
//! start a tracing session with each one, and stream decoded runtime events as JSON lines.
//!
//! Detection → sessions → decode → sink, in one direction: the detector's events start session
//! tasks; each task owns its socket and parser and sends finished lines to this loop, the only
//! writer of the output.
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::decode::bpf_event::{DetectionEvent, EventBody};
use crate::decode::ipc::{DEFAULT_RUNDOWN_KEYWORD, FilteredProvider, TracingRequest};
use crate::ipc::client::Timeouts;
use crate::ipc::providers::{PROFILE_NAMES, parse_providers, profile};
use crate::kernel::detect::{DetectOptions, Detector, Loss};
use crate::kernel::procfs;
use crate::pipeline::audit::{event_line, procfs_line};
use crate::session::streaming::{self, EndReason, SessionConfig, SessionMessage};
use crate::sink::{Clock, JsonLines};

/// Detect .NET processes and trace them: one session per process, decoded events as JSON lines.
///
/// Every .NET process that becomes ready while tracer runs (detected in the kernel through its
/// `dotnet_ipc_created` or `doublemapper` memfd mapping), and every one already running at start
/// (found in /proc), gets a session with the selected providers. Each output line is one event:
/// {"ts","mono_ns","kind":"dotnet_event","pid","provider","event","id","level","keywords",
/// "thread","fields":{...}}; session_started / session_ended / session_failed lines report the
/// sessions themselves. Stop with Ctrl-C (SIGINT) or SIGTERM: every session is stopped with
/// StopTracing, drained, and a summary goes to stderr.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Providers in dotnet-trace syntax: `Name[:KeywordsHex[:Level[:Args]]]`, comma-separated,
    /// e.g. 'Microsoft-Windows-DotNETRuntime:0x1:4,MyEventSource'. Overrides --profile.
    #[arg(long)]
    pub providers: Option<String>,
    /// Named provider set used when --providers is absent: `gc` (GC events at Informational) or
    /// `default` (dotnet-trace's default: CPU sampling + runtime events).
    #[arg(long, default_value = "default", value_parser = clap::builder::PossibleValuesParser::new(PROFILE_NAMES))]
    pub profile: String,
    /// Trace only these processes (repeatable); default: every .NET process.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Stop after this long (e.g. 30s, 5m); default: until SIGINT/SIGTERM.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub duration: Option<Duration>,
    /// Write JSON lines to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Time limit for each step of a diagnostic IPC command (connect, write, read reply).
    #[arg(long, default_value = "5s", value_parser = crate::cli::parse_duration)]
    pub ipc_timeout: Duration,
    /// Runtime-side session buffer (circularBufferMB).
    #[arg(long, default_value_t = 64)]
    pub buffer_mb: u32,
    /// Request rundown events at session end (method/module names for symbolization).
    #[arg(long)]
    pub rundown: bool,
}

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub providers: Vec<FilteredProvider>,
    pub target_pids: Vec<u32>,
    pub session: SessionConfig,
    /// One-line live status on stderr (only when stderr is a terminal).
    pub live_status: bool,
}

impl RunConfig {
    pub fn from_args(args: &RunArgs) -> anyhow::Result<RunConfig> {
        let providers = match &args.providers {
            Some(spec) => parse_providers(spec)?,
            None => profile(&args.profile)?,
        };
        let timeouts =
            Timeouts { connect: args.ipc_timeout, write: args.ipc_timeout, read: args.ipc_timeout };
        Ok(RunConfig {
            session: SessionConfig {
                request: TracingRequest {
                    circular_buffer_mb: args.buffer_mb,
                    providers: providers.clone(),
                    rundown_keyword: if args.rundown { DEFAULT_RUNDOWN_KEYWORD } else { 0 },
                    request_stackwalk: true,
                },
                timeouts,
                locate_for: Duration::from_secs(10),
                drain_timeout: args.ipc_timeout,
            },
            providers,
            target_pids: args.pids.clone(),
            live_status: std::io::stderr().is_terminal(),
        })
    }
}

/// What happened during a run; printed to stderr at the end.
#[derive(Debug, Default)]
pub struct RunSummary {
    pub processes: u64,
    pub sessions_started: u64,
    pub sessions_ended: BTreeMap<&'static str, u64>,
    pub sessions_failed: u64,
    pub sessions_refused: u64,
    pub events_by_provider: BTreeMap<String, u64>,
    /// Events the runtimes numbered but never delivered (nettrace sequence gaps), all sessions.
    pub runtime_lost_events: u64,
    /// Detection losses in the kernel (ring full, failed reads, full maps).
    pub detection_losses: Vec<Loss>,
}

impl RunSummary {
    pub fn events(&self) -> u64 {
        self.events_by_provider.values().sum()
    }

    fn print(&self) {
        eprintln!("tracer run summary:");
        eprintln!("  processes detected: {}", self.processes);
        eprintln!(
            "  sessions: {} started, {} failed, {} refused (unsafe socket)",
            self.sessions_started, self.sessions_failed, self.sessions_refused
        );
        for (reason, n) in &self.sessions_ended {
            eprintln!("    ended ({reason}): {n}");
        }
        eprintln!("  events: {}", self.events());
        for (provider, n) in &self.events_by_provider {
            eprintln!("    {provider}: {n}");
        }
        eprintln!("  losses: {} runtime events (sequence gaps)", self.runtime_lost_events);
        for l in &self.detection_losses {
            eprintln!("    detection cpu {} {:?} {:?}: {}", l.cpu, l.kind, l.reason, l.count);
        }
    }
}

#[derive(Serialize)]
struct SessionLine<'a> {
    ts: String,
    mono_ns: u64,
    kind: &'static str,
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    #[serde(flatten)]
    details: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

/// Runs until `stop` resolves, then stops every session and drains it.
pub async fn run(
    config: RunConfig,
    mut sink: JsonLines,
    stop: impl Future<Output = ()>,
    ready: Option<oneshot::Sender<()>>,
) -> anyhow::Result<RunSummary> {
    let mut detector =
        Detector::attach(&DetectOptions { target_pids: config.target_pids.clone() })?;
    let clock = Clock::new();
    let mut summary = RunSummary::default();
    let (out_tx, mut out_rx) = mpsc::channel::<SessionMessage>(1024);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    // Processes that already have (or had) a session: each is traced once.
    let mut traced: HashMap<u32, ()> = HashMap::new();

    let mut start_session = |pid: u32, tasks: &mut JoinSet<()>, summary: &mut RunSummary| {
        if traced.insert(pid, ()).is_some() {
            return;
        }
        summary.processes += 1;
        tasks.spawn(streaming::run(
            pid,
            config.session.clone(),
            clock,
            out_tx.clone(),
            stop_rx.clone(),
        ));
    };

    let me = std::process::id();
    let targets = config.target_pids.clone();
    let existing = procfs::scan_memfd_mappings(|pid| {
        pid != me && (targets.is_empty() || targets.contains(&pid))
    })
    .context("scanning /proc for running .NET processes")?;
    for m in &existing {
        sink.emit(&procfs_line(m, &clock, procfs::process_identity(m.pid)))
            .context("writing output")?;
        start_session(m.pid, &mut tasks, &mut summary);
    }
    log::info!(
        "watching for .NET processes ({} already running); providers: {}",
        existing.iter().map(|m| m.pid).collect::<std::collections::BTreeSet<_>>().len(),
        config.providers.iter().map(|p| p.provider.name.as_str()).collect::<Vec<_>>().join(", ")
    );
    if let Some(ready) = ready {
        let _ = ready.send(());
    }

    let mut batch: Vec<DetectionEvent> = Vec::new();
    let mut status = LiveStatus::new(config.live_status);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            res = detector.read(&mut batch) => {
                res.context("reading the BPF ring buffer")?;
                for event in batch.drain(..) {
                    if let EventBody::DotnetIpcReady(_) | EventBody::DotnetRuntimeSeen(_) = event.body {
                        sink.emit(&event_line(&event, &clock, None)).context("writing output")?;
                        start_session(event.meta.pid, &mut tasks, &mut summary);
                    }
                }
            }
            Some(msg) = out_rx.recv() => handle_message(msg, &clock, &mut sink, &mut summary)?,
            _ = tick.tick() => status.show(&summary),
        }
    }

    // Shutdown: StopTracing for every live session, then drain what they still send.
    let _ = stop_tx.send(true);
    // The channel closes once every session task (each holds a sender) has finished.
    drop(out_tx);
    while let Some(msg) = out_rx.recv().await {
        handle_message(msg, &clock, &mut sink, &mut summary)?;
    }
    while tasks.join_next().await.is_some() {}
    status.clear();
    detector.detach()?;
    summary.detection_losses = detector.losses()?;
    Ok(summary)
}

fn handle_message(
    msg: SessionMessage,
    clock: &Clock,
    sink: &mut JsonLines,
    summary: &mut RunSummary,
) -> anyhow::Result<()> {
    let now = crate::sink::clock::monotonic_ns();
    let line = |kind, pid, session_id: Option<u64>, details, error| SessionLine {
        ts: clock.iso8601(now),
        mono_ns: now,
        kind,
        pid,
        session_id: session_id.map(|id| format!("{id:#x}")),
        details,
        error,
    };
    match msg {
        SessionMessage::Event { provider, line, .. } => {
            *summary.events_by_provider.entry(provider).or_default() += 1;
            sink.emit(&line)
        }
        SessionMessage::Started { pid, session_id, command, runtime } => {
            summary.sessions_started += 1;
            let details = serde_json::json!({
                "command": command.to_string(),
                "runtime_version": runtime.as_ref().and_then(|r| r.clr_product_version.clone()),
                "command_line": runtime.as_ref().map(|r| r.command_line.clone()),
            });
            log::info!("pid {pid}: session {session_id:#x} started with {command}");
            sink.emit(&line("session_started", pid, Some(session_id), details, None))
        }
        SessionMessage::Ended { pid, session_id, reason, detail, stats, lost_by_thread } => {
            *summary.sessions_ended.entry(reason_name(reason)).or_default() += 1;
            summary.runtime_lost_events += stats.lost_events;
            if stats.lost_events > 0 {
                log::warn!("pid {pid}: the runtime dropped {} events (sequence gaps)", stats.lost_events);
            }
            let details = serde_json::json!({
                "reason": reason,
                "events": stats.events,
                "bytes": stats.bytes,
                "lost_events": stats.lost_events,
                "lost_by_thread": lost_by_thread.iter().map(|(t, n)| serde_json::json!({"thread": t, "lost": n})).collect::<Vec<_>>(),
            });
            sink.emit(&line("session_ended", pid, Some(session_id), details, detail.as_deref()))
        }
        SessionMessage::Failed { pid, error, refused } => {
            if refused {
                summary.sessions_refused += 1;
                log::error!("pid {pid}: refused to talk to its diagnostic socket: {error}");
            } else {
                summary.sessions_failed += 1;
                log::error!("pid {pid}: no session: {error}");
            }
            let details = serde_json::json!({ "refused": refused });
            sink.emit(&line("session_failed", pid, None, details, Some(&error)))
        }
    }
    .context("writing output")
}

fn reason_name(reason: EndReason) -> &'static str {
    match reason {
        EndReason::Stopped => "stopped",
        EndReason::RuntimeEnded => "runtime_ended",
        EndReason::ProcessExited => "process_exited",
        EndReason::DrainTimeout => "drain_timeout",
        EndReason::DecodeError => "decode_error",
        EndReason::ReadError => "read_error",
    }
}

/// `processes / sessions / events/s / losses` on one self-overwriting stderr line.
struct LiveStatus {
    enabled: bool,
    last_events: u64,
    shown: bool,
}

impl LiveStatus {
    fn new(enabled: bool) -> LiveStatus {
        LiveStatus { enabled, last_events: 0, shown: false }
    }

    fn show(&mut self, s: &RunSummary) {
        if !self.enabled {
            return;
        }
        let events = s.events();
        let live = s.sessions_started - s.sessions_ended.values().sum::<u64>();
        eprint!(
            "\r\x1b[2Ktracer: {} processes | {} sessions | {} events/s | {} lost",
            s.processes,
            live,
            events - self.last_events,
            s.runtime_lost_events
        );
        self.last_events = events;
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[2K");
        }
    }
}

/// Entry point of the `run` subcommand.
pub fn main(args: RunArgs) -> ExitCode {
    match main_inner(args) {
        Ok(summary) => {
            summary.print();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tracer run: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn main_inner(args: RunArgs) -> anyhow::Result<RunSummary> {
    let config = RunConfig::from_args(&args)?;
    let sink = JsonLines::open(args.output.as_deref())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let stop = async {
            if let Err(e) = crate::pipeline::stop_requested(args.duration).await {
                log::error!("cannot wait for signals: {e}");
            }
        };
        run(config, sink, stop, None).await
    })
}
