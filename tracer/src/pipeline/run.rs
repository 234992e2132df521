//! `tracer run`: detect .NET processes (in-kernel, plus a /proc scan for those already running),
//! start a tracing session with each one, and stream decoded runtime events as JSON lines.
//!
//! Detection → sessions → decode → sink, in one direction: the detector's events start session
//! tasks; each task owns its socket and parser and sends finished lines to this loop, the only
//! writer of the output.
use std::collections::{BTreeMap, HashMap, HashSet};
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
use crate::kernel::tracefs::Tracefs;
use crate::kernel::user_events::UserEventsData;
use crate::pipeline::audit::{event_line, procfs_line};
use crate::session::{self, SessionConfig, SessionMessage, SessionMode, user_events};
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
    /// Session kind: `auto` uses CollectTracing5 user_events sessions when the kernel has
    /// user_events and the runtime is .NET 10+, streaming (nettrace over the socket) otherwise.
    #[arg(long, value_enum, default_value = "auto")]
    pub session: SessionMode,
    /// Per-CPU ftrace buffer of the user_events instance, in KiB.
    #[arg(long, default_value_t = 4096)]
    pub buffer_size_kb: u64,
}

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub providers: Vec<FilteredProvider>,
    pub target_pids: Vec<u32>,
    pub session: SessionConfig,
    /// One-line live status on stderr (only when stderr is a terminal).
    pub live_status: bool,
    /// Per-CPU ftrace buffer for user_events sessions, in KiB.
    pub buffer_size_kb: u64,
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
                mode: args.session,
                timeouts,
                locate_for: Duration::from_secs(10),
                drain_timeout: args.ipc_timeout,
            },
            providers,
            target_pids: args.pids.clone(),
            live_status: std::io::stderr().is_terminal(),
            buffer_size_kb: args.buffer_size_kb,
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
    /// user_events sessions: records lost in the ftrace ring buffer, corrupt pages, and records
    /// that did not decode.
    pub ftrace_lost_events: u64,
    pub ftrace_corrupt_pages: u64,
    pub user_events_decode_errors: u64,
}

impl RunSummary {
    pub fn events(&self) -> u64 {
        self.events_by_provider.values().sum()
    }

    /// Every event known lost: runtime sequence gaps, the ftrace buffer, detection in the kernel.
    pub fn lost(&self) -> u64 {
        self.runtime_lost_events
            + self.ftrace_lost_events
            + self.detection_losses.iter().map(|l| l.count).sum::<u64>()
    }

    /// Takes the user_events reader's counters.
    fn record_user_events_stats(&mut self, reader: &user_events::Reader) {
        let stats = reader.stats();
        self.ftrace_lost_events = stats.lost();
        self.ftrace_corrupt_pages = stats.corrupt_pages();
        self.user_events_decode_errors = reader.decode_errors();
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
        if self.ftrace_lost_events + self.ftrace_corrupt_pages + self.user_events_decode_errors > 0
        {
            eprintln!(
                "    user_events: {} lost in the ftrace buffer, {} corrupt pages, {} undecodable records",
                self.ftrace_lost_events, self.ftrace_corrupt_pages, self.user_events_decode_errors
            );
        }
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
    let mut user_events = start_user_events(&config)?;
    let backend = user_events.as_ref().map(user_events::Reader::backend);
    let clock = Clock::new();
    let mut summary = RunSummary::default();
    let (out_tx, mut out_rx) = mpsc::channel::<SessionMessage>(1024);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    // Processes that already have (or had) a session: each is traced once.
    let mut traced: HashSet<u32> = HashSet::new();
    let mut events_by_pid: HashMap<u32, u64> = HashMap::new();

    let mut start_session = |pid: u32, tasks: &mut JoinSet<()>, summary: &mut RunSummary| {
        if !traced.insert(pid) {
            return;
        }
        summary.processes += 1;
        tasks.spawn(session::run(
            pid,
            config.session.clone(),
            clock,
            out_tx.clone(),
            stop_rx.clone(),
            backend.clone(),
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
        existing.iter().map(|m| m.pid).collect::<HashSet<_>>().len(),
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
            Some(msg) = out_rx.recv() => handle_message(msg, &clock, &mut sink, &mut summary, &mut events_by_pid)?,
            lines = next_user_events(&mut user_events, &clock) => {
                emit_user_events(lines, &mut sink, &mut summary, &mut events_by_pid)?;
            }
            _ = tick.tick(), if status.enabled => {
                // Losses are read live so the status line shows them as they happen.
                summary.detection_losses = detector.losses()?;
                if let Some(reader) = &user_events {
                    summary.record_user_events_stats(reader);
                }
                status.show(&summary);
            }
        }
    }

    // Shutdown: every session stops (StopTracing, or closing a user_events session's
    // connection), then what they still send is drained.
    let _ = stop_tx.send(true);
    // The channel closes once every session task (each holds a sender) has finished.
    drop(out_tx);
    loop {
        tokio::select! {
            msg = out_rx.recv() => match msg {
                Some(msg) => handle_message(msg, &clock, &mut sink, &mut summary, &mut events_by_pid)?,
                None => break,
            },
            // Session tasks wait on the user_events reader (release) while they finish.
            lines = next_user_events(&mut user_events, &clock) => {
                emit_user_events(lines, &mut sink, &mut summary, &mut events_by_pid)?;
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    status.clear();
    if let Some(mut ue) = user_events {
        let lines = ue.flush(&clock);
        emit_user_events(lines, &mut sink, &mut summary, &mut events_by_pid)?;
        summary.record_user_events_stats(&ue);
    }
    detector.detach()?;
    summary.detection_losses = detector.losses()?;
    Ok(summary)
}

/// The user_events reader when sessions may use it: `auto` falls back to streaming (and says
/// why) when the kernel has no user_events; `user-events` requires it.
fn start_user_events(config: &RunConfig) -> anyhow::Result<Option<user_events::Reader>> {
    let mode = config.session.mode;
    if mode == SessionMode::Streaming {
        return Ok(None);
    }
    let tracefs = Tracefs::find_or_mount()?;
    if !UserEventsData::available(&tracefs) {
        let why = format!(
            "this kernel has no user_events ({} is missing: CONFIG_USER_EVENTS is off)",
            UserEventsData::path(&tracefs).display()
        );
        if mode == SessionMode::UserEvents {
            anyhow::bail!("--session user-events: {why}; use --session streaming or auto");
        }
        log::info!("{why}: using streaming sessions (nettrace over the diagnostic socket)");
        return Ok(None);
    }
    match user_events::Reader::start(&tracefs, config.buffer_size_kb) {
        Ok(reader) => {
            log::info!(
                "user_events available: .NET 10+ runtimes get CollectTracing5 user_events sessions"
            );
            Ok(Some(reader))
        }
        Err(e) if mode == SessionMode::Auto => {
            log::warn!("user_events sessions unavailable ({e:#}): using streaming sessions");
            Ok(None)
        }
        Err(e) => Err(e.context("--session user-events")),
    }
}

async fn next_user_events(
    reader: &mut Option<user_events::Reader>,
    clock: &Clock,
) -> Vec<(String, serde_json::Value)> {
    match reader {
        Some(r) => r.next(clock).await,
        None => std::future::pending().await,
    }
}

fn emit_user_events(
    lines: Vec<(String, serde_json::Value)>,
    sink: &mut JsonLines,
    summary: &mut RunSummary,
    events_by_pid: &mut HashMap<u32, u64>,
) -> anyhow::Result<()> {
    for (provider, line) in lines {
        let pid = line["pid"].as_u64().unwrap_or_default() as u32;
        count_event(summary, events_by_pid, pid, provider);
        sink.emit(&line).context("writing output")?;
    }
    Ok(())
}

fn count_event(
    summary: &mut RunSummary,
    events_by_pid: &mut HashMap<u32, u64>,
    pid: u32,
    provider: String,
) {
    *summary.events_by_provider.entry(provider).or_default() += 1;
    *events_by_pid.entry(pid).or_default() += 1;
}

fn handle_message(
    msg: SessionMessage,
    clock: &Clock,
    sink: &mut JsonLines,
    summary: &mut RunSummary,
    events_by_pid: &mut HashMap<u32, u64>,
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
        SessionMessage::Event { pid, provider, line } => {
            count_event(summary, events_by_pid, pid, provider);
            sink.emit(&line)
        }
        SessionMessage::Started { pid, session_id, command, mode, runtime } => {
            summary.sessions_started += 1;
            let details = serde_json::json!({
                "session": mode,
                "command": command.to_string(),
                "runtime_version": runtime.as_ref().and_then(|r| r.clr_product_version.clone()),
                "command_line": runtime.as_ref().map(|r| r.command_line.clone()),
            });
            log::info!("pid {pid}: {mode:?} session {session_id:#x} started with {command}");
            sink.emit(&line("session_started", pid, Some(session_id), details, None))
        }
        SessionMessage::Ended { pid, session_id, reason, detail, stream } => {
            *summary.sessions_ended.entry(reason.name()).or_default() += 1;
            let mut details = serde_json::json!({
                "reason": reason,
                "events": events_by_pid.get(&pid).copied().unwrap_or(0),
            });
            if let Some((stats, lost_by_thread)) = stream {
                summary.runtime_lost_events += stats.lost_events;
                if stats.lost_events > 0 {
                    log::warn!(
                        "pid {pid}: the runtime dropped {} events (sequence gaps)",
                        stats.lost_events
                    );
                }
                details["bytes"] = stats.bytes.into();
                details["lost_events"] = stats.lost_events.into();
                details["lost_by_thread"] = lost_by_thread
                    .iter()
                    .map(|(t, n)| serde_json::json!({"thread": t, "lost": n}))
                    .collect();
            }
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
        let events = s.events();
        let live = s.sessions_started - s.sessions_ended.values().sum::<u64>();
        eprint!(
            "\r\x1b[2Ktracer: {} processes | {} sessions | {} events/s | {} lost",
            s.processes,
            live,
            events - self.last_events,
            s.lost()
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
