//! Tracing sessions started over the diagnostic IPC: one task per traced process. The task
//! locates the socket (retrying through the start-up race), probes the runtime, then runs either
//! a streaming session (nettrace on the socket) or a CollectTracing5 user_events session
//! (records through tracer's ftrace instance), and reports through [`SessionMessage`]s: events
//! arrive already rendered as output lines, so the pipeline only counts and writes them.
pub mod inbox;
pub mod nettrace_file;
pub mod stopping;
pub mod streaming;
pub mod user_events;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracer_decode::counters::{CounterError, CounterReader, CounterSample, MeterSession};
use tracer_decode::diagnostic_ipc::{CommandCode, ProcessInfo, ProviderConfig, TracingRequest};
use tracer_decode::logging::{LOGGING_PROVIDER, MESSAGE_JSON, log_record};
use tracer_decode::nettrace::{NettraceStats, OutputEvent};

use crate::ipc::client::{ClientError, DiagnosticClient, RuntimeInfo, Timeouts};
use crate::ipc::providers::MeterRequest;
use crate::ipc::socket::{self, Refusal, SocketError, Target};
use crate::output::{
    Incarnation, Kind, LineBatch, LineIdentity, LogLine, Pid, ProcessLabels, RecordTotals, Source,
};
use crate::time::Clock;

/// Which kind of session to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionMode {
    /// user_events when the kernel has it and the runtime is .NET 10+, else streaming.
    Auto,
    /// nettrace streamed over the diagnostic socket (every runtime since .NET Core 3.0).
    Streaming,
    /// CollectTracing5 user_events sessions (Linux with CONFIG_USER_EVENTS, .NET 10+).
    UserEvents,
}

impl SessionMode {
    pub fn name(self) -> &'static str {
        match self {
            SessionMode::Auto => "auto",
            SessionMode::Streaming => "streaming",
            SessionMode::UserEvents => "user_events",
        }
    }
}

#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub request: TracingRequest,
    pub mode: SessionMode,
    pub timeouts: Timeouts,
    /// How long to keep looking for the socket of a process whose runtime was seen before its
    /// diagnostic server listened (the `doublemapper` start-up race).
    pub locate_for: Duration,
    /// After StopTracing, how long to wait for the rest of the stream (rundown, end tag).
    pub drain_timeout: Duration,
    /// Which processes may be granted a `user_events_data` fd (the rest stream).
    pub user_events_grant: UserEventsGrant,
    /// Where each streaming session's nettrace stream is also saved (`--nettrace-dir`).
    pub nettrace_dir: Option<PathBuf>,
    /// The event after which a process's session stops (`--stopping-event`).
    pub stopping_event: Option<stopping::StoppingEvent>,
    /// The Meter API's instruments every session asks for (`--meters`).
    pub meters: Option<MeterRequest>,
}

/// Numbers the Meter clients of this tracer: each session is a client of its own.
static NEXT_METER_CLIENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl SessionConfig {
    /// What a session with `pid`'s runtime of `major` asks for, and, when it adds the Meter
    /// provider (`--meters`), the Meter session whose values and notices are its own: each
    /// session a client with its own `ClientId` (`tracer-<tracer pid>-<pid>-<n>`), so that the
    /// runtime's shared session keeps counting it apart from other tools' clients.
    pub fn request_for(
        &self,
        pid: u32,
        major: Option<u32>,
    ) -> (TracingRequest, Option<MeterSession>) {
        let Some(meters) = &self.meters else { return (self.request.clone(), None) };
        let n = NEXT_METER_CLIENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let client_id = format!("tracer-{}-{pid}-{n}", std::process::id());
        let (providers, session) = meters.providers_for(&self.request.providers, major, &client_id);
        (TracingRequest { providers, ..self.request.clone() }, session)
    }
}

/// Which processes may get a user_events session, i.e. a `user_events_data` fd
/// (docs/security.md, "user_events grant"); the others get streaming sessions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserEventsGrant {
    /// Every process.
    All,
    /// Processes whose real, effective, saved and filesystem uids are all in the list.
    Uids(Vec<u32>),
}

impl Default for UserEventsGrant {
    /// root and tracer's own effective uid: processes that could open `user_events_data`
    /// themselves, so the fd gives them nothing new.
    fn default() -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        let mut uids = vec![0, euid];
        uids.dedup();
        UserEventsGrant::Uids(uids)
    }
}

impl std::str::FromStr for UserEventsGrant {
    type Err = String;

    /// `all`, or a comma-separated list of uids.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("all") {
            return Ok(UserEventsGrant::All);
        }
        s.split(',')
            .map(|uid| {
                uid.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{uid:?} in {s:?} is not a uid (a number) or `all`"))
            })
            .collect::<Result<Vec<u32>, String>>()
            .map(UserEventsGrant::Uids)
    }
}

impl UserEventsGrant {
    /// Whether a process with these (real, effective, saved, filesystem) uids gets the fd.
    pub fn allows(&self, uids: [u32; 4]) -> bool {
        match self {
            UserEventsGrant::All => true,
            UserEventsGrant::Uids(list) => uids.iter().all(|u| list.contains(u)),
        }
    }

    /// Whether process `pid` gets the fd (its uids read from `/proc/<pid>/status`; unreadable:
    /// no).
    fn allows_pid(&self, pid: u32) -> bool {
        if *self == UserEventsGrant::All {
            return true;
        }
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| tracer_decode::procfs::parse_status_uids(&s))
            .is_some_and(|uids| self.allows(uids))
    }
}

/// How a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// tracer stopped it (streaming: the stream ended with its end tag).
    Stopped,
    /// The runtime ended the stream on its own (end tag without a StopTracing from tracer).
    RuntimeEnded,
    /// The connection was cut without an end tag: the process exited or crashed.
    ProcessExited,
    /// After StopTracing the rest of the stream did not arrive within the drain timeout.
    DrainTimeout,
    /// The stream was corrupt; tracer stopped the session.
    DecodeError,
    /// Reading the socket failed.
    ReadError,
    /// The runtime accepted the session but sent no byte of its stream within the IPC read
    /// timeout: a peer holding a session slot without using it.
    StreamNotStarted,
    /// The peer made tracer exceed a byte budget (output per input byte, pending lines,
    /// metadata): tracer stopped the session; other sessions are unaffected.
    BudgetExceeded,
    /// The `--stopping-event` arrived; tracer stopped the session (events already in flight
    /// were still read).
    StoppingEvent,
}

impl EndReason {
    pub fn name(self) -> &'static str {
        match self {
            EndReason::Stopped => "stopped",
            EndReason::RuntimeEnded => "runtime_ended",
            EndReason::ProcessExited => "process_exited",
            EndReason::DrainTimeout => "drain_timeout",
            EndReason::DecodeError => "decode_error",
            EndReason::ReadError => "read_error",
            EndReason::StreamNotStarted => "stream_not_started",
            EndReason::BudgetExceeded => "budget_exceeded",
            EndReason::StoppingEvent => "stopping_event",
        }
    }
}

/// Runtime events rendered as their output lines into one buffer ([`LineBatch`]), with what the
/// pipeline counts of them: handed on as one message and written with one copy, not one
/// message, allocation and write per event. A streaming session sends one per read of its
/// stream (cut at [`EVENT_LINES_BATCH_BYTES`]), the user_events hub one per batch of records.
#[derive(Debug, Default)]
pub struct EventLines {
    /// The lines (with `--otlp-endpoint`, and their OTLP log records).
    pub lines: LineBatch,
    /// Lines per process and provider: one entry per run of lines of the same pair (a batch has
    /// few runs; a new entry per change keeps each line O(1)).
    pub runs: Vec<ProviderLines>,
    /// Lines of events neither their metadata nor the runtime-event table names
    /// (`EventID(<id>)`).
    pub unnamed: u64,
    /// `ILogger` messages whose payload did not make a `log` line (written as `dotnet_event`).
    pub unparsed_logs: u64,
    /// The runtime counter values `EventCounters` events carried (for `--metrics-addr` and
    /// `tracer top`).
    pub counters: Vec<CounterEvent>,
    /// The envelope members the last line's process and source repeat, rendered once.
    identity: Option<LineIdentity>,
    extras: LineExtras,
    /// The `fields` of the line being rendered, when its counter sample came from their decode.
    fields_json: Vec<u8>,
    /// Reads the counter samples, with the metric names it built for the session's counters.
    counter_reader: CounterReader,
}

/// Whether an event of `meta` is an `ILogger` message (made a `log` line).
fn is_log_message(meta: &tracer_decode::nettrace::EventMetadata) -> bool {
    meta.event_name == MESSAGE_JSON && meta.provider.eq_ignore_ascii_case(LOGGING_PROVIDER)
}

/// A counter value an event carried, with its process and when the runtime wrote it.
#[derive(Debug)]
pub struct CounterEvent {
    pub process: Incarnation,
    /// The event's timestamp (CLOCK_MONOTONIC ns): the end of the interval a rate covers.
    pub time_ns: u64,
    pub sample: Result<CounterSample, CounterError>,
}

/// What event lines carry besides their JSON, as the pipeline's outputs need it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineExtras {
    /// `--otlp-endpoint`: each line's OTLP log record, encoded with the line.
    pub otlp_records: bool,
    /// `--metrics-addr`: the counter values `EventCounters` and `Meter` events carry.
    pub counter_samples: bool,
}

/// Lines of one process and provider (see [`EventLines::runs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderLines {
    pub process: Incarnation,
    pub provider: String,
    pub lines: u64,
}

/// Whose runtime events a line is about: the process and the session that carried them (every
/// `dotnet_event` line names both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventOrigin {
    pub process: Incarnation,
    pub session_id: u64,
}

/// A streaming session hands on its lines when they reach this many bytes (and at the end of
/// each read): what one message holds, so the channel to the pipeline holds a bounded amount.
pub const EVENT_LINES_BATCH_BYTES: usize = 64 << 10;

impl EventLines {
    /// An empty batch with room for a full one ([`EVENT_LINES_BATCH_BYTES`] and the line that
    /// crosses it, unless that one is long): its lines go in without growing and copying it.
    pub fn new(extras: LineExtras) -> EventLines {
        EventLines {
            lines: LineBatch::with_capacity(EVENT_LINES_BATCH_BYTES + 4096, extras.otlp_records),
            extras,
            ..EventLines::default()
        }
    }

    /// [`EventLines::new`] whose counter samples are `session`'s alone (see [`MeterSession`]).
    pub fn for_meter_session(extras: LineExtras, session: Option<MeterSession>) -> EventLines {
        let counter_reader = session.map(CounterReader::for_session).unwrap_or_default();
        EventLines { counter_reader, ..EventLines::new(extras) }
    }

    /// The lines so far, to hand on; this batch starts again empty (with room for a full one)
    /// and keeps the rendered envelope of its process for the lines that follow.
    pub fn take(&mut self) -> EventLines {
        let identity = self.identity.take();
        let counter_reader = std::mem::take(&mut self.counter_reader);
        let full = std::mem::replace(self, EventLines::new(self.extras));
        (self.identity, self.counter_reader) = (identity, counter_reader);
        full
    }

    /// Renders `event` of `origin` as its `dotnet_event` line (an `ILogger` message as a `log`
    /// line), unless `keep` (told the bytes the line takes, newline included: a budget) refuses
    /// it. Returns whether it was kept.
    pub fn push_if(
        &mut self,
        clock: &Clock,
        source: Source,
        origin: EventOrigin,
        labels: Option<&Arc<ProcessLabels>>,
        event: OutputEvent<'_>,
        keep: impl FnOnce(usize) -> bool,
    ) -> bool {
        let meta = event.metadata;
        // With metrics on, and then only for the events whose names can be counters: read from
        // the decode that renders the line's fields.
        self.fields_json.clear();
        let counter = if self.extras.counter_samples {
            self.counter_reader.read(&event, &mut self.fields_json)
        } else {
            None
        };
        let rendered_fields = (!self.fields_json.is_empty()).then_some(&self.fields_json[..]);
        let event = OutputEvent { rendered_fields, ..event };
        let mono_ns = event.context.timestamp as u64;
        let log = match is_log_message(meta).then(|| log_record(&event.decode())).flatten() {
            Some(Ok(record)) => Some(record),
            Some(Err(e)) => {
                // Written as the runtime event it is; its record is the loss.
                self.unparsed_logs += 1;
                log::debug!("pid {}: a log message not made a `log` line: {e}", origin.process.pid);
                None
            }
            None => None,
        };
        let EventOrigin { process, session_id } = origin;
        let kind = if log.is_some() { Kind::Log } else { Kind::DotnetEvent };
        let (pid, session) = (Pid::Known(process), Some(session_id));
        let identity = match &mut self.identity {
            Some(identity) if identity.is_of(kind, source, pid, labels, session) => identity,
            slot => slot.insert(LineIdentity::new(kind, source, pid, labels.cloned(), session)),
        };
        let kept = match &log {
            Some(record) => {
                let line = LogLine::new(record, event.context.thread);
                self.lines.push_if(&identity.line(clock, mono_ns, line), clock, keep)
            }
            None => self.lines.push_if(&identity.line(clock, mono_ns, event), clock, keep),
        };
        if !kept {
            return false;
        }
        match self.runs.last_mut() {
            Some(run) if run.process == process && run.provider == meta.provider => run.lines += 1,
            _ => {
                let provider = meta.provider.clone();
                self.runs.push(ProviderLines { process, provider, lines: 1 });
            }
        }
        self.unnamed += u64::from(!meta.is_named());
        if let Some(sample) = counter {
            self.counters.push(CounterEvent { process, time_ns: mono_ns, sample });
        }
        true
    }
}

/// What a session task reports to the pipeline, in order: `Started`, any number of `Events`,
/// then exactly one `Ended`; or a single `Failed` when no session could be started.
#[derive(Debug)]
pub enum SessionMessage {
    Started {
        process: Incarnation,
        session_id: u64,
        command: CommandCode,
        mode: SessionMode,
        runtime: Option<ProcessInfo>,
        /// What the session asked the runtime for.
        providers: Vec<ProviderConfig>,
    },
    Events(EventLines),
    Ended {
        process: Incarnation,
        session_id: u64,
        reason: EndReason,
        detail: Option<String>,
        /// What the session's stream or records carried and lost (none when the pipeline shut
        /// down first).
        end: Option<SessionEnd>,
    },
    Failed {
        process: Incarnation,
        error: String,
        refused: bool,
    },
    /// A name that could have been the process's socket was refused (each distinct name and
    /// reason once per session); the session goes on looking. Sent before `Started`/`Failed`.
    Refused {
        process: Incarnation,
        path: PathBuf,
        refusal: Refusal,
    },
    /// How many more distinct names were refused than [`MAX_REPORTED_REFUSALS`] (once, before
    /// `Started`/`Failed`).
    RefusalsNotReported {
        process: Incarnation,
        count: u64,
    },
}

/// What a session carried and lost, by kind of session.
#[derive(Debug)]
pub enum SessionEnd {
    Stream(StreamEnd),
    Records(RecordTotals),
}

/// What a streaming session's nettrace stream carried, and what did not make it to the output.
#[derive(Debug)]
pub struct StreamEnd {
    pub stats: NettraceStats,
    /// (capture thread, events the runtime numbered but never sent).
    pub lost_by_thread: Vec<(u64, u64)>,
    /// Events of providers the session did not ask for: dropped, not decoded.
    pub unrequested_events: u64,
    /// Bytes still queued on the socket when the drain timeout ended the session.
    pub unread_bytes: u64,
    /// Bytes queued on the socket, not decoded, when the session ended because its process
    /// exited while another process still held the connection open.
    pub bytes_after_exit: u64,
    /// Events decoded but not written because the session passed a byte budget (then ended).
    pub unwritten_events: u64,
    /// Lines written without their named stack: the session's stack budget was spent.
    pub stacks_unwritten: u64,
    /// Why StopTracing was not acknowledged, when tracer sent it and it was not.
    pub stop_error: Option<String>,
    /// `--nettrace-dir`: the stream's file.
    pub file: Option<crate::output::NettraceFileTotals>,
}

/// What every session task gets from the pipeline.
#[derive(Clone)]
pub struct SessionContext {
    pub config: SessionConfig,
    pub clock: Clock,
    /// Where the task reports.
    pub out: mpsc::Sender<SessionMessage>,
    /// Rung with a burst of lines, for the pipeline to take them now ([`inbox`]).
    pub bell: inbox::Bell,
    /// Flips to true when the pipeline shuts down.
    pub stop: watch::Receiver<bool>,
    /// The pipeline's user_events hub, when the kernel has user_events.
    pub user_events: Option<user_events::HubHandle>,
    /// Cgroup, container and pod of each traced process, for its event lines.
    pub labels: crate::identity::LabelRegistry,
    /// What each event line carries besides its JSON.
    pub line_extras: LineExtras,
}

/// Runs one process's session to its end, reporting through `ctx.out`. `target` is the process
/// pinned at detection (or why it could not be pinned).
pub async fn run(pid: u32, target: Result<Target, SocketError>, mut ctx: SessionContext) {
    let target = match target {
        Ok(t) => t,
        Err(e) => return report_failure(Incarnation::new(pid, None), e.into(), &ctx.out).await,
    };
    let process = target.incarnation();
    let out = ctx.out.clone();
    let report = |report: LocateReport| {
        let out = out.clone();
        let message = match report {
            LocateReport::Refused(path, refusal) => {
                SessionMessage::Refused { process, path, refusal }
            }
            LocateReport::NotReported(count) => {
                SessionMessage::RefusalsNotReported { process, count }
            }
        };
        async move { drop(out.send(message).await) }
    };
    let probed = tokio::select! {
        r = locate_and_probe(&target, &ctx.config, report) => r,
        () = stopped(&mut ctx.stop) => return,
    };
    let (client, runtime) = match probed {
        Ok(p) => p,
        Err(e) => return report_failure(process, e, &ctx.out).await,
    };
    let hub = match (ctx.config.mode, ctx.user_events.take()) {
        (SessionMode::Streaming, _) | (_, None) => None,
        (SessionMode::UserEvents, Some(h)) => Some(h),
        // CollectTracing6's buffering applies to streaming sessions.
        (SessionMode::Auto, Some(_)) if ctx.config.request.buffering_mode.is_some() => None,
        (SessionMode::Auto, Some(h)) => {
            let major = runtime.as_ref().and_then(ProcessInfo::major_version);
            if major.is_some_and(|m| m >= 10) {
                Some(h)
            } else {
                log::info!(
                    "pid {pid}: runtime {} predates user_events sessions (.NET 10): streaming",
                    runtime
                        .as_ref()
                        .and_then(|r| r.clr_product_version.as_deref())
                        .unwrap_or("< 6.0")
                );
                None
            }
        }
    };
    let hub = hub.filter(|_| {
        let granted = ctx.config.user_events_grant.allows_pid(pid);
        if !granted {
            log::info!(
                "pid {pid}: its uids are not granted user_events sessions \
                 (--user-events-uids): streaming"
            );
        }
        granted
    });
    match hub {
        Some(hub) => user_events::run(&target, client, runtime, ctx, hub).await,
        None => streaming::run(&target, client, runtime, ctx).await,
    }
}

async fn report_failure(process: Incarnation, e: ClientError, out: &mpsc::Sender<SessionMessage>) {
    let refused = matches!(&e, ClientError::Socket(s) if s.refusal().is_some());
    let _ = out.send(SessionMessage::Failed { process, error: e.to_string(), refused }).await;
}

/// Distinct refused names one session reports individually (`socket_refused` lines); more are
/// only counted ([`LocateReport::NotReported`]): a directory of planted names must not turn into
/// as many output lines for every target sharing it.
pub const MAX_REPORTED_REFUSALS: usize = 32;

/// What [`locate_and_probe`] tells its caller about names it looked past.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocateReport {
    /// A name refused as the target's socket (each distinct name and reason once).
    Refused(PathBuf, Refusal),
    /// Distinct refusals past [`MAX_REPORTED_REFUSALS`], once at the end of the look-up.
    NotReported(u64),
}

/// Locates the socket of `target` and probes its runtime, looking until `config.locate_for` has
/// passed while there is no socket yet, or only names that cannot be the target's
/// ([`retry_locating`]). Each distinct refused name is handed to `report` once, the first
/// [`MAX_REPORTED_REFUSALS`] of them; the number of the others, once, at the end.
pub async fn locate_and_probe<F, Fut>(
    target: &Target,
    config: &SessionConfig,
    mut report: F,
) -> Result<(DiagnosticClient, Option<ProcessInfo>), ClientError>
where
    F: FnMut(LocateReport) -> Fut,
    Fut: Future<Output = ()>,
{
    let (result, not_reported) = locate_and_probe_inner(target, config, &mut report).await;
    if not_reported > 0 {
        report(LocateReport::NotReported(not_reported)).await;
    }
    result
}

/// [`locate_and_probe`], returning also how many distinct refusals were not reported: the most
/// any one look-up found besides the reported ones (the names of one directory scan are
/// distinct, and counting per scan needs no memory per name).
async fn locate_and_probe_inner<F, Fut>(
    target: &Target,
    config: &SessionConfig,
    report: &mut F,
) -> (Result<(DiagnosticClient, Option<ProcessInfo>), ClientError>, u64)
where
    F: FnMut(LocateReport) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut reported: HashSet<(PathBuf, Refusal)> = HashSet::new();
    let mut not_reported = 0u64;
    let give_up = Instant::now() + config.locate_for;
    let mut delay = Duration::from_millis(20);
    let result = loop {
        let mut exact_key = true;
        let (located, mut refused) = locate_off_the_workers(target).await;
        let attempt = match located {
            Ok(located) => {
                exact_key = located.exact_key;
                let client = DiagnosticClient::new(located, config.timeouts);
                client.probe().await.map(|info| (client, info))
            }
            Err(e) => Err(ClientError::Socket(e)),
        };
        if let Err(ClientError::Socket(SocketError::Refused { path, refusal, .. })) = &attempt {
            refused.push((path.clone(), refusal.clone()));
        }
        let mut beyond_the_cap = 0u64;
        for (path, refusal) in refused {
            let key = (path, refusal);
            if reported.contains(&key) {
                continue;
            }
            if reported.len() >= MAX_REPORTED_REFUSALS {
                beyond_the_cap += 1;
                continue;
            }
            reported.insert(key.clone());
            report(LocateReport::Refused(key.0, key.1)).await;
        }
        not_reported = not_reported.max(beyond_the_cap);
        match attempt {
            Ok((client, RuntimeInfo::Known { info, .. })) => break Ok((client, Some(info))),
            Ok((client, RuntimeInfo::PreNet5)) => break Ok((client, None)),
            Err(e) if retry_locating(&e, exact_key) => {
                if Instant::now() >= give_up {
                    if matches!(&e, ClientError::Socket(s) if s.refusal().is_some()) {
                        break Err(e);
                    }
                    break Err(ClientError::NotReady {
                        waited: config.locate_for,
                        source: Box::new(e),
                    });
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            Err(e) => break Err(e),
        }
    };
    (result, not_reported)
}

/// At most this many sessions read another process's `/proc` files and scan its temp directory
/// at once; the work runs on blocking threads, never on the async workers, so a slow or huge
/// target stalls no other session.
pub const MAX_CONCURRENT_LOCATES: usize = 8;

/// [`socket::locate_target`] on a blocking thread, at most [`MAX_CONCURRENT_LOCATES`] at once.
pub(crate) async fn locate_off_the_workers(
    target: &Target,
) -> (Result<socket::DiagnosticSocket, SocketError>, Vec<(PathBuf, Refusal)>) {
    static LOCATES: tokio::sync::Semaphore =
        tokio::sync::Semaphore::const_new(MAX_CONCURRENT_LOCATES);
    let _permit = LOCATES.acquire().await.expect("the semaphore is never closed");
    let target = target.clone();
    let work = tokio::task::spawn_blocking(move || {
        let mut refused = Vec::new();
        (socket::locate_target(&target, &mut refused), refused)
    });
    work.await.expect("locating the socket does not panic")
}

/// Whether to keep looking for the socket (within the locate window): there is none yet (a
/// runtime seen through its `doublemapper` mapping or its `bind()` may not have bound it yet,
/// docs/protocol/diagnostic-ipc.md §1.5), or it is there but not listening yet (`ECONNREFUSED`:
/// the socket file exists between `bind()` and `listen()`; `ENOENT`: it was removed and is being
/// bound again); the name found belongs to another uid (planted in a shared temp dir); or the
/// fallback name (not the exact key) could not be used — the runtime may still bind its exact
/// name. A safety refusal of the exact name owned by the target's uid is final.
fn retry_locating(e: &ClientError, exact_key: bool) -> bool {
    let ClientError::Socket(e) = e else { return false };
    match e {
        SocketError::NotFound { .. } => true,
        SocketError::Refused { refusal: Refusal::OwnerMismatch { .. }, .. } => true,
        SocketError::Connect { source, .. } | SocketError::Open { source, .. }
            if not_ready(source) =>
        {
            true
        }
        SocketError::Refused { .. }
        | SocketError::Connect { .. }
        | SocketError::ConnectTimeout { .. } => !exact_key,
        _ => false,
    }
}

/// A socket that is not ready yet: not listening (`ECONNREFUSED`), or not (again) there
/// (`ENOENT`).
fn not_ready(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOENT))
}

/// Resolves once the pipeline asks sessions to stop (or is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard returned by wait_for is dropped here, before the caller's next await.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// Whether `provider` (an event's) is the provider `name` (a request's or a spec's): EventPipe
/// matches provider names without regard to case. The exact comparison first: asked for every
/// event, and runtimes send the name as it was requested, which a `memcmp` confirms at a
/// fraction of a case-folding comparison's cost.
pub fn is_provider(name: &str, provider: &str) -> bool {
    name == provider || name.eq_ignore_ascii_case(provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch handed on takes its lines and counts; the batch left is empty and renders the
    /// lines that follow as a fresh one would.
    #[test]
    fn a_batch_taken_leaves_an_empty_one_that_writes_the_same_lines() {
        use tracer_decode::nettrace::EventContext;
        use tracer_decode::nettrace::metadata::EventMetadata;
        let meta =
            EventMetadata::native(tracer_decode::nettrace::runtime_events::RUNTIME_PROVIDER, 2);
        let event = |timestamp| OutputEvent {
            metadata: &meta,
            payload: &[],
            pointer_size: 8,
            stack: None,
            rendered_fields: None,
            context: EventContext { timestamp, ..EventContext::default() },
        };
        let (clock, labels) = (Clock::new(), Some(Arc::new(ProcessLabels::default())));
        let process = Incarnation::new(7, Some(1_230_000_000));
        let origin = EventOrigin { process, session_id: 0x42 };
        let push = |lines: &mut EventLines, timestamp| {
            assert!(lines.push_if(
                &clock,
                Source::Nettrace,
                origin,
                labels.as_ref(),
                event(timestamp),
                |_| true
            ));
        };
        let mut lines = EventLines::new(LineExtras::default());
        push(&mut lines, 1_000);
        push(&mut lines, 2_000);
        let full = lines.take();
        assert_eq!((full.lines.lines(), full.unnamed), (2, 0));
        let provider = meta.provider.clone();
        assert_eq!(full.runs, [ProviderLines { process, provider, lines: 2 }]);
        let first = String::from_utf8(full.lines.iter().next().unwrap().to_vec()).unwrap();
        assert!(
            first.contains(
                r#""pid":7,"process_start_ns":1230000000,"session_id":"0x42","provider":"#
            ),
            "{first}"
        );
        assert_eq!((lines.lines.lines(), lines.runs.len(), lines.counters.len()), (0, 0, 0));
        push(&mut lines, 3_000);
        let mut fresh = EventLines::new(LineExtras::default());
        push(&mut fresh, 3_000);
        assert_eq!(lines.lines.iter().collect::<Vec<_>>(), fresh.lines.iter().collect::<Vec<_>>());
    }

    #[test]
    fn providers_match_without_regard_to_case() {
        let runtime = "Microsoft-Windows-DotNETRuntime";
        assert!(is_provider(runtime, runtime));
        assert!(is_provider(runtime, "microsoft-windows-dotnetruntime"));
        assert!(!is_provider(runtime, "Microsoft-Windows-DotNETRuntimeRundown"));
        assert!(!is_provider(runtime, "Microsoft-Windows-DotNETRuntimf"));
    }

    fn connect(errno: i32) -> ClientError {
        ClientError::Socket(SocketError::Connect {
            pid: 1,
            path: PathBuf::from("/tmp/s"),
            source: std::io::Error::from_raw_os_error(errno),
        })
    }

    #[test]
    fn not_ready_sockets_are_retried_and_unsafe_ones_refused_for_good() {
        // Between bind() and listen(), or removed and bound again: not ready yet.
        assert!(retry_locating(&connect(libc::ECONNREFUSED), true));
        assert!(retry_locating(&connect(libc::ENOENT), true));
        let gone = ClientError::Socket(SocketError::NotFound {
            pid: 1,
            ns_pid: 1,
            dir: PathBuf::from("/tmp"),
        });
        assert!(retry_locating(&gone, true));
        // Any other connect failure of the exact name is final; of a fallback name, not.
        assert!(!retry_locating(&connect(libc::EACCES), true));
        assert!(retry_locating(&connect(libc::EACCES), false));
        let unsafe_peer = ClientError::Socket(SocketError::Refused {
            pid: 1,
            path: PathBuf::from("/tmp/s"),
            refusal: Refusal::PeerPidMismatch { expected: 1, actual: 2 },
        });
        assert!(!retry_locating(&unsafe_peer, true));
        let not_ready =
            ClientError::NotReady { waited: Duration::from_secs(10), source: Box::new(gone) };
        assert!(
            not_ready.to_string().ends_with("(still so after the 10s locate window)"),
            "{not_ready}"
        );
    }

    #[test]
    fn user_events_grant_policy() {
        let grant: UserEventsGrant = "0, 1000".parse().unwrap();
        assert_eq!(grant, UserEventsGrant::Uids(vec![0, 1000]));
        assert!(grant.allows([1000, 1000, 1000, 1000]));
        assert!(grant.allows([0, 1000, 0, 0]));
        // Every uid must be granted: a setuid-root program run by uid 65534 is not root's.
        assert!(!grant.allows([65534, 0, 0, 0]));
        assert!(!grant.allows([0, 0, 0, 65534]));
        assert_eq!("ALL".parse::<UserEventsGrant>(), Ok(UserEventsGrant::All));
        assert!(UserEventsGrant::All.allows([65534; 4]));
        assert!("0,root".parse::<UserEventsGrant>().unwrap_err().contains("\"root\""));
        // The default: root and tracer's own uid.
        // SAFETY: geteuid has no preconditions.
        let own = unsafe { libc::geteuid() };
        let default = UserEventsGrant::default();
        assert!(default.allows([0; 4]) && default.allows([own; 4]));
        if own == 0 {
            assert!(!default.allows([65534; 4]));
        }
        assert!(default.allows_pid(std::process::id()), "tracer's own processes");
        assert!(!default.allows_pid(u32::MAX), "an unreadable process gets no grant");
    }
}
