//! `tracer top`: every .NET process on the host in one live screen (docs/top.md).
//!
//! Detection → sessions → model → screen, in one direction: the processes are those the
//! start-up scan and the detection programs find (or `--pid`), selected by the filters; each
//! gets the session `tracer run --profile counters` starts (its `System.Runtime` counters every
//! second, nothing else) and the kernel sampler's attention at a low rate; `/proc` gives their
//! CPU and memory every refresh. The model turns all that into what a row shows; the screen
//! (or `--once`'s JSON lines) reads the model.
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use futures_core::Stream as _;
use ratatui::crossterm::event::{Event, EventStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracer_decode::bpf_event::DetectionEvent;
use tracer_decode::diagnostic_ipc::TracingRequest;
use tracer_decode::nettrace::methods::MethodTable;

use super::admission::{Admission, AdmissionLimits, Admitted};
use crate::identity::{LabelRegistry, ProcessFilter, ProcessTracker};
use crate::ipc::client::{ClientError, Timeouts};
use crate::ipc::providers::{profiles, profiles_rundown_keyword};
use crate::ipc::socket::{SocketError, Target};
use crate::kernel::detect::{DetectOptions, Detector, HookChoice};
use crate::kernel::procfs::{self, ns_per_tick, read_bounded};
use crate::kernel::sampler::{RawSample, Sampler, SamplerOptions, Targets};
use crate::output::{JsonLines, Kind, Line, Pid, Source};
use crate::profile::methods::{self, MethodCollection};
use crate::session::inbox::Inbox;
use crate::session::{
    self, LineExtras, SessionConfig, SessionContext, SessionMessage, SessionMode,
};
use crate::time::{Clock, monotonic_ns};
use crate::top::hot::{HotSampling, SAMPLE_HZ};
use crate::top::model::{Model, ProcessRow, SessionState};
use crate::top::procstat::{self, Threads};
use crate::top::terminal::{self, Screen};
use crate::top::view::{Action, Ui};

/// How often the screen is refreshed (and `/proc` read).
pub const REFRESH: Duration = Duration::from_secs(1);
/// `--once`: the least sampling before the snapshot (the hot methods are counted over it).
pub const ONCE_MIN_SAMPLING: Duration = Duration::from_secs(3);
/// `--once`: the longest wait for every process's counters (two whole rounds: a rate over a
/// whole interval, a running total's growth) and method names; then the snapshot shows what
/// has come.
pub const ONCE_LIMIT: Duration = Duration::from_secs(20);
/// How long a rundown may take (the runtime lists every method with code).
pub const RUNDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// At the end, how long the sessions and rundowns get to stop, beyond their drain timeout.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Session messages handled in one round before the loop looks at its other work.
const MAX_ROUND_MESSAGES: usize = 256;
/// Bytes of `/proc/<pid>/cmdline` read (for a runtime that answers no ProcessInfo).
const MAX_CMDLINE_BYTES: u64 = 64 << 10;
/// The profile whose request each runtime gets.
pub const SESSION_PROFILE: &str = "counters";
/// The runtime-side buffer of a session, as `tracer run`'s default `--buffer-mb`.
pub const SESSION_BUFFER_MB: u32 = 64;

#[derive(Clone, Debug)]
pub struct TopConfig {
    /// Only these processes (none: every .NET process detected).
    pub target_pids: Vec<u32>,
    pub filter: ProcessFilter,
    pub hooks: HookChoice,
    pub admission: AdmissionLimits,
    /// Each step of a diagnostic IPC command; a session's drain after StopTracing.
    pub timeouts: Timeouts,
}

/// Where the model is shown.
pub enum Display {
    /// The full-screen view, until quit.
    Screen,
    /// One snapshot, as `top_process` lines.
    Once(JsonLines),
}

/// What each runtime is asked for: what `tracer run --profile counters` asks.
pub fn session_request() -> TracingRequest {
    let profile = [SESSION_PROFILE.to_string()];
    TracingRequest {
        circular_buffer_mb: SESSION_BUFFER_MB,
        providers: profiles(&profile).expect("the counters profile exists"),
        rundown_keyword: profiles_rundown_keyword(&profile),
        request_stackwalk: true,
        buffering_mode: None,
    }
}

/// What starts a session: pid, uid, and the process pinned when it was found.
type Candidate = (u32, u32, Result<Target, SocketError>);

/// Everything the loop keeps.
struct Top {
    model: Model,
    hot: HotSampling,
    sampler: Sampler,
    tracker: ProcessTracker,
    labels: LabelRegistry,
    admission: Admission<Candidate>,
    sessions: JoinSet<()>,
    /// The uid each session's slot belongs to.
    slot_uids: HashMap<tokio::task::Id, u32>,
    /// Each process's sessions start from it; dropped at the end, so the inbox closes once
    /// every session has finished.
    context: Option<SessionContext>,
    /// Each process as pinned when found (its rundowns use it).
    targets: HashMap<u32, Target>,
    rundowns: JoinSet<(u32, Result<MethodCollection, ClientError>)>,
    timeouts: Timeouts,
    threads: Threads,
}

/// Runs until `stop` resolves, `q` is pressed, or (`--once`) the snapshot is written; then
/// ends every session. Returns whether the output failed.
pub async fn run(
    config: TopConfig,
    display: Display,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<bool> {
    config.filter.resolve_prefixes_now()?;
    let mut detector = Detector::attach(&DetectOptions {
        hooks: config.hooks,
        ..DetectOptions::for_targets(&config.target_pids)
    })?;
    let sampler = Sampler::attach(&SamplerOptions {
        hooks: config.hooks,
        // The samples are counted once a refresh: read as often (each read wakes tracer).
        drain_interval: REFRESH,
        ..SamplerOptions::cpu(SAMPLE_HZ, Targets::Processes(Vec::new()))
    })
    .context("starting the kernel sampler")?;
    crate::kernel::raise_open_file_limit();
    let (mut inbox, out, bell) = Inbox::new();
    let (stop_sessions, stop_rx) = watch::channel(false);
    let labels = LabelRegistry::default();
    let context = SessionContext {
        config: SessionConfig {
            request: session_request(),
            mode: SessionMode::Streaming,
            timeouts: config.timeouts,
            locate_for: super::run::LOCATE_WINDOW,
            drain_timeout: config.timeouts.read,
            user_events_grant: Default::default(),
            nettrace_dir: None,
            stopping_event: None,
            meters: None,
        },
        clock: Clock::new(),
        out,
        bell,
        stop: stop_rx,
        user_events: None,
        labels: labels.clone(),
        line_extras: LineExtras { otlp_records: false, counter_samples: true },
    };
    let mut top = Top {
        model: Model::default(),
        hot: HotSampling::default(),
        sampler,
        tracker: ProcessTracker::new(config.filter.clone()),
        labels,
        admission: Admission::new(config.admission),
        sessions: JoinSet::new(),
        slot_uids: HashMap::new(),
        context: Some(context),
        targets: HashMap::new(),
        rundowns: JoinSet::new(),
        timeouts: config.timeouts,
        threads: Threads::default(),
    };
    let scan = procfs::scan_targets(&config.target_pids)
        .context("scanning /proc for running .NET processes")?;
    let mut found = scan.pids();
    // `--pid P` watches P whatever the scan showed, as `tracer run` traces it.
    found.extend(config.target_pids.iter().filter(|pid| !found.contains(pid)).collect::<Vec<_>>());
    for pid in found {
        top.add(pid, None);
    }

    let (mut screen, mut input, once) = match display {
        Display::Screen => (Some(Screen::take()?), Some(EventStream::new()), None),
        Display::Once(sink) => (None, None, Some(sink)),
    };
    let mut ui = Ui::default();
    let started = Instant::now();
    let mut refresh = tokio::time::interval(REFRESH);
    let mut detections: Vec<DetectionEvent> = Vec::new();
    let mut samples: Vec<RawSample> = Vec::new();
    let mut failure = None;
    tokio::pin!(stop);
    loop {
        let mut redraw = false;
        tokio::select! {
            () = &mut stop => break,
            res = detector.read(&mut detections) => {
                res.context("reading the detection ring buffer")?;
                for event in detections.drain(..) {
                    if event.body.finds_a_runtime() {
                        top.add(event.meta.pid, Some(event.meta.cgroup_id));
                    }
                }
            }
            res = top.sampler.read(&mut samples) => {
                res.context("reading the sampler's ring buffer")?;
                for sample in samples.drain(..) {
                    top.hot.take(&sample);
                }
            }
            Some(msg) = inbox.recv() => {
                top.handle(msg);
                for _ in 1..MAX_ROUND_MESSAGES {
                    let Some(msg) = inbox.try_recv() else { break };
                    top.handle(msg);
                }
            }
            Some(done) = top.sessions.join_next_with_id() => {
                let id = done.map_or_else(|e| e.id(), |(id, ())| id);
                let uid = top.slot_uids.remove(&id).expect("every session has a slot");
                for candidate in top.admission.finished(uid) {
                    top.spawn_session(candidate);
                }
            }
            Some(done) = top.rundowns.join_next() => {
                if let Ok((pid, collected)) = done {
                    top.rundown_done(pid, collected);
                }
            }
            _ = refresh.tick() => {
                top.refresh(ui.detail);
                if once.is_some() && (top.once_ready(started) || started.elapsed() >= ONCE_LIMIT) {
                    break;
                }
                redraw = true;
            }
            event = next_input(&mut input) => match event {
                Some(Ok(Event::Key(key))) => match ui.key(key, &top.model) {
                    Action::Quit => break,
                    Action::Redraw => {
                        // The detail's threads are read as it opens, not a second later.
                        if let Some(pid) = ui.detail {
                            top.threads.read(pid, monotonic_ns());
                        }
                        redraw = true;
                    }
                    Action::Nothing => {}
                },
                Some(Ok(Event::Resize(..))) => redraw = true,
                Some(Ok(_)) => {}
                // The terminal went away.
                Some(Err(_)) | None => break,
            },
        }
        if screen.is_some() && !terminal::is_taken() {
            failure =
                Some(anyhow::anyhow!("a panic gave the terminal back (its message is above)"));
            break;
        }
        if let (true, Some(screen)) = (redraw, &mut screen) {
            ui.keep_selection_visible(&top.model);
            let drawn = screen.terminal.draw(|frame| ui.draw(frame, &top.model, &top.threads));
            if drawn.is_err() {
                // The terminal went away.
                break;
            }
        }
    }
    // The terminal first: the user gets it back while the sessions stop.
    drop(screen);
    let output_failed = match once {
        Some(mut sink) => {
            write_snapshot(&top.model, &mut sink);
            sink.failure().is_some()
        }
        None => false,
    };
    top.stop(stop_sessions, &mut inbox).await;
    detector.detach();
    if let Some(failure) = failure {
        return Err(failure);
    }
    let losses = top.sampler.losses()?;
    if losses.total() + top.hot.losses.samples_refused + top.hot.losses.tables_refused > 0 {
        log::warn!(
            "samples lost: {} by the sampler, {} past the window's bound; method tables not \
             kept: {}",
            losses.total(),
            top.hot.losses.samples_refused,
            top.hot.losses.tables_refused
        );
    }
    Ok(output_failed)
}

/// The next key or resize of the terminal (never, without a screen).
async fn next_input(input: &mut Option<EventStream>) -> Option<std::io::Result<Event>> {
    match input {
        Some(events) => {
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut *events).poll_next(cx)).await
        }
        None => std::future::pending().await,
    }
}

/// One `top_process` line per process, in pid order.
fn write_snapshot(model: &Model, sink: &mut JsonLines) {
    let clock = Clock::new();
    for row in model.rows() {
        let line = Line::new(
            &clock,
            monotonic_ns(),
            Kind::TopProcess,
            Source::Tracer,
            Pid::Known(row.process),
            row.snapshot(),
        );
        sink.emit(&line.with_labels(row.labels.clone()));
    }
}

impl Top {
    /// A process found (by the scan, or the kernel with its cgroup id): shown, sampled, and
    /// given its session, when the filters select it.
    fn add(&mut self, pid: u32, cgroup_id: Option<u64>) {
        let target = Target::pin(pid);
        let start = target.as_ref().ok().and_then(|t| t.incarnation().start_ns);
        match self.model.by_pid(pid) {
            // A recycled pid is another process: the one shown has exited.
            Some(row) if row.process.start_ns != start && start.is_some() => self.remove(pid),
            Some(_) => return,
            None => {}
        }
        let tracked = self.tracker.lookup(pid, cgroup_id);
        if !tracked.included {
            return;
        }
        let Ok(pinned) = &target else {
            return log::info!("pid {pid}: gone before it could be watched");
        };
        let process = pinned.incarnation();
        let name = procstat::name(pid).unwrap_or_default();
        let mut row = ProcessRow::new(process, name, tracked.labels.clone());
        row.command_line = command_line(pid);
        self.model.insert(row);
        if let Some(labels) = tracked.labels {
            self.labels.insert(pid, labels);
        }
        if let Err(e) = self.sampler.add_target(pid) {
            log::warn!("pid {pid}: not sampled: {e:#}");
        }
        self.hot.add(pid);
        self.targets.insert(pid, pinned.clone());
        let uid = procfs::process_identity(pid).map_or(0, |id| id.uid);
        match self.admission.request(uid, (pid, uid, target)) {
            Admitted::Now(candidate) => self.spawn_session(candidate),
            Admitted::Waiting => {
                log::info!("pid {pid}: waiting for a session slot (uid {uid} or all in use)")
            }
            Admitted::Refused => {
                let why = "every session slot and the wait queue are full";
                if let Some(row) = self.model.get_mut(process) {
                    row.session = SessionState::Failed(why.to_string());
                }
            }
        }
    }

    fn spawn_session(&mut self, (pid, uid, target): Candidate) {
        let Some(context) = &self.context else { return };
        let task = self.sessions.spawn(session::run(pid, target, context.clone()));
        self.slot_uids.insert(task.id(), uid);
    }

    /// A process that exited leaves the list (its session ends by itself).
    fn remove(&mut self, pid: u32) {
        self.model.remove(pid);
        self.hot.remove(pid);
        if let Err(e) = self.sampler.remove_target(pid) {
            log::warn!("pid {pid}: {e:#}");
        }
        self.labels.remove(pid);
        self.tracker.forget(pid);
        self.targets.remove(&pid);
    }

    fn handle(&mut self, msg: SessionMessage) {
        match msg {
            SessionMessage::Started { process, runtime, .. } => {
                if let Some(row) = self.model.get_mut(process) {
                    row.session = SessionState::Tracing;
                    if let Some(runtime) = runtime {
                        row.runtime_version = runtime.clr_product_version;
                        // The kernel's has every argument (a hosted runtime reports only its
                        // executable); the runtime's stands in when it could not be read.
                        row.command_line.get_or_insert(runtime.command_line);
                    }
                }
            }
            SessionMessage::Events(events) => {
                for counter in events.counters {
                    match (self.model.get_mut(counter.process), counter.sample) {
                        (Some(row), Ok(sample)) => row.counters.record(&sample, counter.time_ns),
                        (Some(_), Err(e)) => log::debug!("pid {}: {e}", counter.process.pid),
                        (None, _) => {}
                    }
                }
            }
            SessionMessage::Ended { process, reason, .. } => {
                if let Some(row) = self.model.get_mut(process) {
                    row.session = SessionState::Ended(reason.name());
                    row.counters.clear();
                }
            }
            SessionMessage::Failed { process, error, .. } => {
                log::warn!("pid {}: no session: {error}", process.pid);
                if let Some(row) = self.model.get_mut(process) {
                    row.session = SessionState::Failed(error);
                }
            }
            SessionMessage::Refused { process, path, refusal } => {
                // Debug formatting escapes control characters of the peer's path.
                log::warn!(
                    "pid {}: refused {path:?} as its diagnostic socket: {refusal}",
                    process.pid
                );
            }
            SessionMessage::RefusalsNotReported { process, count } => {
                log::warn!("pid {}: {count} more names refused as its socket", process.pid);
            }
        }
    }

    /// Every refresh: each process's CPU and memory (those gone leave), the hot methods (and
    /// the rundowns they need), the detail's threads.
    fn refresh(&mut self, detail: Option<u32>) {
        let now_ns = monotonic_ns();
        let mut gone = Vec::new();
        for row in self.model.rows_mut() {
            match procstat::usage(row.process) {
                Some(usage) => {
                    row.take_usage(usage.cpu_ticks, ns_per_tick(), usage.rss_bytes, now_ns)
                }
                None => gone.push(row.pid()),
            }
        }
        for pid in gone {
            self.remove(pid);
        }
        for pid in self.hot.refresh(now_ns) {
            self.start_rundown(pid);
        }
        for row in self.model.rows_mut() {
            row.hot = self.hot.hot(row.pid()).cloned().unwrap_or_default();
        }
        if let Some(pid) = detail.filter(|&pid| self.model.contains(pid)) {
            self.threads.read(pid, now_ns);
        }
    }

    /// Asks `pid`'s runtime for a rundown: a session stopped as soon as it starts, which lists
    /// every method with code (docs/protocol/profiling.md, "Naming managed frames").
    fn start_rundown(&mut self, pid: u32) {
        let Some(target) = self.targets.get(&pid).cloned() else {
            return self.hot.rundown_done(pid, None);
        };
        let timeouts = self.timeouts;
        log::info!("pid {pid}: asking its runtime for a rundown (methods to name its samples)");
        self.rundowns.spawn(async move {
            // Stopped from the start: the session ends with its rundown.
            let (_stopped, stop) = watch::channel(true);
            let locate_for = super::run::LOCATE_WINDOW;
            let collected =
                methods::collect(&target, timeouts, locate_for, RUNDOWN_TIMEOUT, stop).await;
            (pid, collected)
        });
    }

    fn rundown_done(&mut self, pid: u32, collected: Result<MethodCollection, ClientError>) {
        let table: Option<MethodTable> = match collected {
            Ok(collection) => {
                log::info!(
                    "pid {pid}: rundown: {} method events{}",
                    collection.events,
                    collection.error.map(|e| format!(" ({e})")).unwrap_or_default()
                );
                Some(collection.table)
            }
            Err(e) => {
                log::warn!("pid {pid}: no rundown: {e}");
                None
            }
        };
        self.hot.rundown_done(pid, table);
    }

    /// `--once`: every process has sent two whole rounds of counters (or has no session to send
    /// them), no rundown is under way, and the samples cover the least window.
    fn once_ready(&self, started: Instant) -> bool {
        started.elapsed() >= ONCE_MIN_SAMPLING
            && self.model.rows().all(|row| {
                let counted = match row.session {
                    SessionState::Starting => false,
                    SessionState::Tracing => row.counters.whole_rounds() >= 2,
                    SessionState::Ended(_) | SessionState::Failed(_) => true,
                };
                counted && !self.hot.rundown_in_flight(row.pid())
            })
    }

    /// Stops every session (StopTracing, then its drain) and waits for the rundowns, within
    /// their time limits and [`STOP_GRACE`].
    async fn stop(&mut self, stop_sessions: watch::Sender<bool>, inbox: &mut Inbox) {
        let _ = stop_sessions.send(true);
        self.context = None;
        let longest = match self.rundowns.is_empty() {
            true => self.timeouts.read,
            false => self.timeouts.read.max(RUNDOWN_TIMEOUT),
        };
        let deadline = Instant::now() + longest + STOP_GRACE;
        loop {
            tokio::select! {
                msg = inbox.recv() => match msg {
                    Some(msg) => self.handle(msg),
                    None => break,
                },
                () = tokio::time::sleep_until(deadline) => {
                    log::warn!("sessions still stopping after the grace time: left");
                    break;
                }
            }
        }
        while let Ok(Some(_)) = tokio::time::timeout_at(deadline, self.sessions.join_next()).await {
        }
        while let Ok(Some(_)) = tokio::time::timeout_at(deadline, self.rundowns.join_next()).await {
        }
        self.sessions.abort_all();
        self.rundowns.abort_all();
    }
}

/// `/proc/<pid>/cmdline` with spaces between its arguments.
fn command_line(pid: u32) -> Option<String> {
    let path = std::path::PathBuf::from(format!("/proc/{pid}/cmdline"));
    let (bytes, _) = read_bounded(&path, MAX_CMDLINE_BYTES).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim_end_matches('\0').replace('\0', " ");
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command, run_config};

    #[test]
    fn each_runtime_is_asked_what_run_profile_counters_asks() {
        let cli = Cli::try_parse_from(["tracer", "run", "--profile", "counters"]).unwrap();
        let Command::Run(run) = cli.command else { unreachable!("a run command") };
        assert_eq!(session_request(), run_config(&run).unwrap().session.request);
    }
}
