//! `tracer run`: detect .NET processes (in-kernel, plus a /proc scan for those already running),
//! start a tracing session with each one, and stream decoded runtime events as JSON lines.
//!
//! Detection → sessions → decode → sink, in one direction: the detector's events start session
//! tasks; each task owns its socket and parser and sends finished lines to this loop, the only
//! writer of the output.
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tracer_decode::bpf_event::DetectionEvent;
use tracer_decode::diagnostic_ipc::FilteredProvider;

use super::admission::{Admission, AdmissionLimits, Admitted};
use super::kernel_events::KernelEvents;
use crate::export::otlp::{self, OtlpConfig, PipelineExport};
use crate::export::otlp_metrics::MetricsExporter;
use crate::export::resource::process_resource;
use crate::identity::{LabelRegistry, ProcessFilter, ProcessTracker};
use crate::ipc::socket::SocketError;
use crate::ipc::socket::Target;
use crate::kernel::detect::{DetectOptions, Detector, HookChoice};
use crate::kernel::ftrace_reader::Event;
use crate::kernel::procfs::{self, DetectionChecks, MappingConfirmer};
use crate::kernel::tracefs::{EventSpec, Tracefs};
use crate::kernel::user_events::UserEventsData;
use crate::metrics::runtime::RuntimeCounters;
use crate::metrics::{Health, Publisher};
use crate::output::{
    self, Incarnation, JsonLines, Kind, SessionEnded, SessionFailed, SessionId, SessionProvider,
    SessionStarted, SocketRefused, StreamTotals, ThreadLoss,
};
use crate::session::{
    self, EventLines, LineExtras, MAX_REPORTED_REFUSALS, SessionConfig, SessionContext, SessionEnd,
    SessionMessage, SessionMode, inbox::Inbox, user_events,
};
use crate::time::Clock;

pub use crate::summary::RunSummary;

#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Caps on sessions in all and per uid.
    pub admission: AdmissionLimits,
    pub providers: Vec<FilteredProvider>,
    pub target_pids: Vec<u32>,
    /// `--hooks`: the mechanism of the syscall hooks.
    pub hooks: HookChoice,
    pub session: SessionConfig,
    /// One-line live status on stderr (only when stderr is a terminal).
    pub live_status: bool,
    /// Per-CPU ftrace buffer for user_events sessions, in KiB.
    pub buffer_size_kb: u64,
    /// `--container`, `--pod-uid`, `--cgroup`, `--require-env`: only these processes are traced.
    pub filter: ProcessFilter,
    /// `--metrics-addr`: counters and health published for the metrics endpoint.
    pub metrics: Option<Publisher>,
    /// `--otlp-endpoint`: every line also as an OTLP log record, and the runtime metrics as OTLP
    /// metrics.
    pub otlp: Option<OtlpConfig>,
    /// `--kernel-event`: tracepoints whose records of the traced processes' threads are written
    /// too.
    pub kernel_events: Vec<EventSpec>,
}

/// How long a session keeps looking for the socket of a process whose runtime was seen before
/// its diagnostic server listened.
pub const LOCATE_WINDOW: Duration = Duration::from_secs(10);

/// What starts a session: pid, uid, and the process pinned at detection.
type Candidate = (u32, u32, Result<Target, SocketError>);

/// Runs until `stop` resolves (or the output fails), then stops every session and drains it.
pub async fn run(
    config: RunConfig,
    mut sink: JsonLines,
    stop: impl Future<Output = ()>,
    ready: Option<oneshot::Sender<()>>,
) -> anyhow::Result<RunSummary> {
    config.filter.resolve_prefixes_now()?;
    let metrics = config.metrics.clone().unwrap_or_default();
    metrics.serve_profiles(std::sync::Arc::new(super::profile::ServedProfiles::new(
        config.filter.clone(),
        config.hooks,
        config.session.timeouts,
        config.session.locate_for,
        config.session.drain_timeout,
    )));
    let mut tracker = ProcessTracker::new(config.filter.clone());
    let labels = LabelRegistry::default();
    let mut detector = Detector::attach(&DetectOptions {
        hooks: config.hooks,
        ..DetectOptions::for_targets(&config.target_pids)
    })?;
    let mut user_events = start_user_events(&config, &mut detector)?;
    let mut kernel_events = if config.kernel_events.is_empty() {
        None
    } else {
        Some(KernelEvents::start(&config.kernel_events, config.buffer_size_kb)?)
    };
    // Runtime counters for the metrics endpoint, the OTLP metrics, or both.
    let counters_on = metrics.is_enabled() || config.otlp.is_some();
    let line_extras =
        LineExtras { otlp_records: config.otlp.is_some(), counter_samples: counters_on };
    if let Some(hub) = &mut user_events {
        hub.set_output(labels.clone(), line_extras);
    }
    let clock = Clock::new();
    let export = PipelineExport::start(config.otlp.as_ref(), clock, &mut sink)?;
    let mut summary = RunSummary {
        runtime_counters: counters_on.then(|| RuntimeCounters::new(config.otlp.is_some())),
        hooks: Some(detector.mechanism().clone()),
        lifecycle_hooks: Some(detector.lifecycle().clone()),
        ..RunSummary::default()
    };
    if let Some(counters) = &summary.runtime_counters {
        metrics.serve_runtime_counters(counters.clone());
    }
    let metrics_export = match (&config.otlp, &summary.runtime_counters) {
        (Some(otlp), Some(counters)) => {
            Some(MetricsExporter::start(otlp, counters.clone(), otlp.metrics_interval)?)
        }
        _ => None,
    };
    summary.otlp_metrics = metrics_export.as_ref().map(MetricsExporter::stats);
    let (mut inbox, out_tx, bell) = Inbox::new();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    // Processes that already have (or had) a session, as (pid, start time): each is traced
    // once, and a recycled pid is another process.
    let mut traced: HashSet<(u32, u64)> = HashSet::new();
    // Processes the filters refused (counted once each).
    let mut traced_or_refused: HashSet<u32> = HashSet::new();
    let mut events_by_process: HashMap<Incarnation, u64> = HashMap::new();
    let mut admission = Admission::new(config.admission);
    // The uid each session's slot belongs to.
    let mut slot_uids: HashMap<tokio::task::Id, u32> = HashMap::new();
    crate::kernel::raise_open_file_limit();

    let context = SessionContext {
        config: config.session.clone(),
        clock,
        out: out_tx,
        bell,
        stop: stop_rx,
        user_events: user_events.as_ref().map(user_events::Hub::handle),
        labels: labels.clone(),
        line_extras,
    };
    // Starts the session of an admitted process (pinned at detection).
    let spawn = move |(pid, uid, target): Candidate,
                      tasks: &mut JoinSet<()>,
                      slot_uids: &mut HashMap<tokio::task::Id, u32>| {
        let task = tasks.spawn(session::run(pid, target, context.clone()));
        slot_uids.insert(task.id(), uid);
    };
    let mut start_session = move |pid: u32,
                                  uid: u32,
                                  admission: &mut Admission<Candidate>,
                                  summary: &mut RunSummary|
          -> Option<Candidate> {
        // Pinned at detection; a process already gone is reported by its session (start time 0).
        let target = Target::pin(pid);
        if !traced.insert((pid, target.as_ref().map_or(0, Target::start_time))) {
            return None;
        }
        summary.processes += 1;
        match admission.request(uid, (pid, uid, target)) {
            Admitted::Now(candidate) => Some(candidate),
            Admitted::Waiting => {
                log::info!("pid {pid}: waiting for a session slot (uid {uid} or all in use)");
                None
            }
            Admitted::Refused => {
                log::warn!("pid {pid}: not traced: every session slot and the wait queue are full");
                None
            }
        }
    };
    // A detection of `pid`: its line and session when the filters select it (once per process).
    let mut detected = |pid: u32, cgroup_id: Option<u64>, summary: &mut RunSummary| {
        let tracked = tracker.lookup(pid, cgroup_id);
        if !tracked.included {
            if traced_or_refused.insert(pid) {
                summary.filtered_out += 1;
            }
            return None;
        }
        if let Some(l) = &tracked.labels {
            labels.insert(pid, l.clone());
        }
        Some(tracked.labels)
    };

    let scan = procfs::scan_targets(&config.target_pids)
        .context("scanning /proc for running .NET processes")?;
    for (pid, uid, line) in super::scan_lines(&scan, &clock) {
        let Some(process_labels) = detected(pid, None, &mut summary) else { continue };
        let line = line.with_labels(process_labels);
        *summary.detections.entry(("procfs", line.kind().name())).or_default() += 1;
        sink.emit(&line);
        if let Some(c) = start_session(pid, uid, &mut admission, &mut summary) {
            spawn(c, &mut tasks, &mut slot_uids);
        }
    }
    // `--pid P` traces P whatever it showed (dotnet-trace's `-p`): a target the scan did not find
    // gets its session too, which looks for its socket through the locate window and says why
    // when there is none.
    let found = scan.pids();
    for &pid in config.target_pids.iter().filter(|pid| !found.contains(pid)) {
        if detected(pid, None, &mut summary).is_none() {
            continue;
        }
        let uid = procfs::process_identity(pid).map_or(0, |id| id.uid);
        log::info!("pid {pid} (--pid): no .NET mapping or listening diagnostic socket yet");
        if let Some(c) = start_session(pid, uid, &mut admission, &mut summary) {
            spawn(c, &mut tasks, &mut slot_uids);
        }
    }
    log::info!(
        "watching for .NET processes ({} already running); providers: {}",
        found.len(),
        config.providers.iter().map(|p| p.provider.name.as_str()).collect::<Vec<_>>().join(", ")
    );
    metrics.set_health(Health::Running);
    super::signal_ready(ready);

    let mut batch: Vec<DetectionEvent> = Vec::new();
    let mut confirmer = MappingConfirmer::default();
    let mut publish = crate::metrics::publish_interval(metrics.is_enabled());
    let mut status = LiveStatus::new(config.live_status);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tokio::pin!(stop);
    // Until stopped, or until the output takes no more lines (`tracer run | head -1`).
    while sink.failure().is_none() {
        tokio::select! {
            () = &mut stop => break,
            res = detector.read(&mut batch) => {
                res.context("reading the BPF ring buffer")?;
                for event in batch.drain(..) {
                    if event.body.finds_a_runtime() {
                        let (pid, uid) = (event.meta.pid, event.meta.uid);
                        let Some(process_labels) =
                            detected(pid, Some(event.meta.cgroup_id), &mut summary)
                        else {
                            continue;
                        };
                        let checks = DetectionChecks::of(&event, &mut confirmer);
                        let line = output::detection_line(&event, &clock, checks)
                            .with_labels(process_labels);
                        *summary.detections.entry(("kernel", line.kind().name())).or_default() += 1;
                        sink.emit(&line);
                        if let Some(c) = start_session(pid, uid, &mut admission, &mut summary) {
                            spawn(c, &mut tasks, &mut slot_uids);
                        }
                    }
                }
            }
            Some(msg) = inbox.recv() => handle_messages(msg, &mut inbox, &clock, &mut sink, &mut summary, &mut events_by_process, &labels, kernel_events.as_mut()),
            events = next_kernel_events(&mut kernel_events) => {
                let events = events.context("reading the kernel events' ftrace buffer")?;
                if let Some(kernel) = &mut kernel_events {
                    kernel.emit(&events, &clock, &labels, &mut sink);
                }
            }
            Some(done) = tasks.join_next_with_id() => {
                let id = done.map_or_else(|e| e.id(), |(id, ())| id);
                let uid = slot_uids.remove(&id).expect("every session has a slot");
                for candidate in admission.finished(uid) {
                    spawn(candidate, &mut tasks, &mut slot_uids);
                }
            }
            lines = next_user_events(&mut user_events, &clock) => {
                emit_events("user_events", lines, &mut sink, &mut summary, &mut events_by_process, &labels);
            }
            _ = publish.tick() => {
                summary.detection_losses = detector.losses()?;
                if let Some(kernel) = &kernel_events {
                    summary.kernel_events_reader = Some(kernel.stats());
                    summary.kernel_events = kernel.counts();
                }
                if let Some(reader) = &user_events {
                    summary.record_user_events_stats(reader);
                }
                summary.otlp = export.stats();
                summary.otlp_metrics = metrics_export.as_ref().map(MetricsExporter::stats);
                metrics.publish_run(&summary);
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
    metrics.set_health(Health::Stopping);
    let _ = stop_tx.send(true);
    // The channel closes once every session task (each holds a sender) has finished; the
    // pipeline's own sender goes with the session starter.
    drop((start_session, spawn));
    loop {
        tokio::select! {
            msg = inbox.recv() => match msg {
                Some(msg) => handle_messages(msg, &mut inbox, &clock, &mut sink, &mut summary, &mut events_by_process, &labels, kernel_events.as_mut()),
                None => break,
            },
            // Session tasks wait on the user_events reader (release) while they finish.
            lines = next_user_events(&mut user_events, &clock) => {
                emit_events("user_events", lines, &mut sink, &mut summary, &mut events_by_process, &labels);
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    status.clear();
    if let Some(mut kernel) = kernel_events {
        let events = kernel.flush().context("reading the kernel events' ftrace buffer")?;
        kernel.emit(&events, &clock, &labels, &mut sink);
        summary.kernel_events_reader = Some(kernel.stats());
        summary.kernel_events = kernel.counts();
    }
    if let Some(mut ue) = user_events {
        let lines = ue.flush(&clock);
        emit_events("user_events", lines, &mut sink, &mut summary, &mut events_by_process, &labels);
        summary.record_user_events_stats(&ue);
    }
    summary.sessions_waited = admission.waited;
    summary.sessions_not_admitted = admission.refused + admission.waiting() as u64;
    detector.detach();
    summary.detection_losses = detector.losses()?;
    summary.detection_decode_errors = detector.decode_errors();
    summary.detection_recursion_misses =
        detector.program_stats()?.iter().map(|(_, s)| s.recursion_misses).sum();
    let export_deadline = tokio::time::Instant::now() + otlp::SHUTDOWN_TIMEOUT;
    if let (Some(exporter), Some(counters)) = (metrics_export, &summary.runtime_counters) {
        summary.otlp_metrics = Some(exporter.finish(export_deadline, counters).await);
    }
    summary.otlp = export.flush(export_deadline).await;
    let losses = summary.losses();
    let line = output::summary_line(&clock, "run", summary.events(), &losses)
        .with_unnamed_events(summary.unnamed_events)
        .with_hooks(summary.hooks.as_ref(), summary.lifecycle_hooks.as_ref());
    sink.emit(&line);
    summary.otlp = export.finish(&mut sink, export_deadline).await;
    summary.output_error = sink.failure().map(|e| e.to_string());
    summary.unwritten_lines = sink.unwritten();
    metrics.publish_run(&summary);
    Ok(summary)
}

/// The user_events hub when sessions may use it: `auto` falls back to streaming (and says why)
/// when the kernel has no user_events; `user-events` requires it.
fn start_user_events(
    config: &RunConfig,
    detector: &mut Detector,
) -> anyhow::Result<Option<user_events::Hub>> {
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
    let threads = detector
        .take_thread_table()
        .context("the detection programs have no thread table")?
        .context("taking the detection programs' thread table")?;
    match user_events::Hub::start(&tracefs, config.buffer_size_kb, threads) {
        Ok(hub) => {
            log::info!(
                "user_events available: .NET 10+ runtimes get CollectTracing5 user_events sessions"
            );
            Ok(Some(hub))
        }
        Err(e) if mode == SessionMode::Auto => {
            log::warn!("user_events sessions unavailable ({e:#}): using streaming sessions");
            Ok(None)
        }
        Err(e) => Err(e.context("--session user-events")),
    }
}

async fn next_kernel_events(kernel: &mut Option<KernelEvents>) -> anyhow::Result<Vec<Event>> {
    match kernel {
        Some(k) => k.next_batch().await,
        None => std::future::pending().await,
    }
}

async fn next_user_events(hub: &mut Option<user_events::Hub>, clock: &Clock) -> EventLines {
    match hub {
        Some(h) => h.next(clock).await,
        None => std::future::pending().await,
    }
}

/// Most session messages handled in one batch of lines (one write) before the pipeline looks at
/// its other work again.
const MAX_BATCH_MESSAGES: usize = 256;

/// `first`, then what the sessions have sent meanwhile, as one batch of lines (one write; the
/// inbox waits a round before the next once this finds it empty). `kernel`: the
/// kernel events, which start recording a process's threads before its `session_started` line
/// is written (a reader of the output sees them from then on).
#[allow(clippy::too_many_arguments)] // the loop's state, each borrowed apart
fn handle_messages(
    first: SessionMessage,
    inbox: &mut Inbox,
    clock: &Clock,
    sink: &mut JsonLines,
    summary: &mut RunSummary,
    events_by_process: &mut HashMap<Incarnation, u64>,
    labels: &LabelRegistry,
    mut kernel: Option<&mut KernelEvents>,
) {
    let mut batch = sink.batch();
    let mut handle = |msg: SessionMessage| {
        if let (SessionMessage::Started { process, .. }, Some(kernel)) = (&msg, &mut kernel)
            && let Err(e) = kernel.watch(*process)
        {
            log::warn!("kernel events: pid {}: {e:#}", process.pid);
        }
        handle_message(msg, clock, &mut batch, summary, events_by_process, labels);
    };
    handle(first);
    for _ in 1..MAX_BATCH_MESSAGES {
        let Some(msg) = inbox.try_recv() else { break };
        handle(msg);
    }
}

/// The one path of every runtime event: counted, written, and (with metrics on) its counter
/// value kept for the exposition. The lines come rendered, many to a message.
fn emit_events(
    source: &'static str,
    events: EventLines,
    sink: &mut JsonLines,
    summary: &mut RunSummary,
    events_by_process: &mut HashMap<Incarnation, u64>,
    labels: &LabelRegistry,
) {
    let EventLines { lines, runs, unnamed, unparsed_logs, counters, .. } = events;
    summary.unparsed_log_messages += unparsed_logs;
    *summary.events_by_source.entry(source).or_default() += lines.lines();
    for run in runs {
        *events_by_process.entry(run.process).or_default() += run.lines;
        match summary.events_by_provider.get_mut(&run.provider) {
            Some(n) => *n += run.lines,
            None => drop(summary.events_by_provider.insert(run.provider, run.lines)),
        }
    }
    summary.unnamed_events += unnamed;
    if !lines.is_empty() {
        sink.emit_batch(&lines);
    }
    if let Some(runtime_counters) = &summary.runtime_counters {
        let samples = counters.into_iter().map(|c| (c.process, c.sample));
        runtime_counters.record_all(samples, |pid| labels.get(pid));
    }
}

fn handle_message(
    msg: SessionMessage,
    clock: &Clock,
    sink: &mut JsonLines,
    summary: &mut RunSummary,
    events_by_process: &mut HashMap<Incarnation, u64>,
    labels: &LabelRegistry,
) {
    match msg {
        SessionMessage::Events(events) => {
            emit_events("nettrace", events, sink, summary, events_by_process, labels);
        }
        SessionMessage::Started { process, session_id, command, mode, runtime, providers } => {
            let pid = process.pid;
            summary.sessions_started += 1;
            let body = SessionStarted {
                session_id: SessionId(session_id),
                session: mode.name(),
                command: command.to_string(),
                runtime_version: runtime.as_ref().and_then(|r| r.clr_product_version.as_deref()),
                command_line: runtime.as_ref().map(|r| r.command_line.as_str()),
                providers: providers.iter().map(SessionProvider::from).collect(),
            };
            log::info!("pid {pid}: {} session {session_id:#x} started with {command}", mode.name());
            let process_labels = labels.get(pid);
            if let Some(counters) =
                summary.runtime_counters.as_ref().filter(|c| c.wants_resources())
            {
                let environ = crate::identity::read_environ(pid);
                let (resource, dropped) = process_resource(
                    process,
                    process_labels.as_deref(),
                    runtime.as_ref(),
                    environ.as_deref(),
                    clock,
                );
                if dropped > 0 {
                    log::info!("pid {pid}: {dropped} OTEL_RESOURCE_ATTRIBUTES entries dropped");
                }
                summary.resource_attributes_dropped += dropped as u64;
                counters.describe(process, process_labels.as_deref(), resource);
            }
            let line = output::session_line(clock, Kind::SessionStarted, process, body);
            sink.emit(&line.with_labels(process_labels));
        }
        SessionMessage::Ended { process, session_id, reason, detail, end } => {
            let pid = process.pid;
            *summary.sessions_ended.entry(reason.name()).or_default() += 1;
            let (stream, records) = match end {
                Some(SessionEnd::Stream(end)) => (Some(end), None),
                Some(SessionEnd::Records(records)) => (None, Some(records)),
                None => (None, None),
            };
            let stream = stream.map(|end| {
                let stats = end.stats;
                summary.runtime_lost_events += stats.lost_events;
                summary.unrequested_events += end.unrequested_events;
                summary.unread_bytes_at_drain += end.unread_bytes;
                summary.bytes_after_exit += end.bytes_after_exit;
                summary.unwritten_over_budget += end.unwritten_events;
                summary.stacks_refused += stats.stacks_refused;
                summary.stacks_unwritten += end.stacks_unwritten;
                summary.stop_failures += u64::from(end.stop_error.is_some());
                summary.count_nettrace_file(end.file.as_ref());
                if stats.lost_events > 0 {
                    log::warn!(
                        "pid {pid}: the runtime dropped {} events (sequence gaps)",
                        stats.lost_events
                    );
                }
                StreamTotals {
                    bytes: stats.bytes,
                    lost_events: stats.lost_events,
                    lost_by_thread: end
                        .lost_by_thread
                        .into_iter()
                        .map(|(thread, lost)| ThreadLoss { thread, lost })
                        .collect(),
                    unrequested_events: end.unrequested_events,
                    unread_bytes: end.unread_bytes,
                    bytes_after_exit: end.bytes_after_exit,
                    unwritten_events: end.unwritten_events,
                    stacks_refused: stats.stacks_refused,
                    stacks_unwritten: end.stacks_unwritten,
                    stop_error: end.stop_error,
                    file: end.file,
                }
            });
            if let Some(records) = &records {
                summary.count_nettrace_file(records.file.as_ref());
            }
            let body = SessionEnded {
                session_id: SessionId(session_id),
                reason: reason.name(),
                events: events_by_process.remove(&process).unwrap_or(0),
                stream,
                records,
                error: detail.as_deref(),
            };
            let line = output::session_line(clock, Kind::SessionEnded, process, body);
            sink.emit(&line.with_labels(labels.get(pid)));
            forget_process(process, summary, labels);
        }
        SessionMessage::Refused { process, path, refusal } => {
            let pid = process.pid;
            *summary.sockets_refused.entry(refusal.name()).or_default() += 1;
            // Debug formatting escapes control characters of the peer's path.
            log::warn!("pid {pid}: refused {path:?} as its diagnostic socket: {refusal}");
            let path = path.to_string_lossy();
            let error = refusal.to_string();
            let body = SocketRefused { path: &path, reason: refusal.name(), error: &error };
            let line = output::session_line(clock, Kind::SocketRefused, process, body);
            sink.emit(&line.with_labels(labels.get(pid)));
        }
        SessionMessage::RefusalsNotReported { process, count } => {
            let pid = process.pid;
            summary.sockets_refused_not_reported += count;
            log::warn!(
                "pid {pid}: {count} more names refused as its diagnostic socket, not reported one \
                 by one (at most {MAX_REPORTED_REFUSALS} per session)"
            );
        }
        SessionMessage::Failed { process, error, refused } => {
            let pid = process.pid;
            if refused {
                summary.sessions_refused += 1;
                log::error!("pid {pid}: refused to talk to its diagnostic socket: {error}");
            } else {
                summary.sessions_failed += 1;
                log::error!("pid {pid}: no session: {error}");
            }
            let line = output::session_line(
                clock,
                Kind::SessionFailed,
                process,
                SessionFailed { refused, error: &error },
            );
            sink.emit(&line.with_labels(labels.get(pid)));
            forget_process(process, summary, labels);
        }
    }
}

/// A process's session is over: its labels and its counter series go.
fn forget_process(process: Incarnation, summary: &mut RunSummary, labels: &LabelRegistry) {
    labels.remove(process.pid);
    if let Some(counters) = &summary.runtime_counters {
        counters.remove(process);
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
