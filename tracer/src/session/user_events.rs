//! CollectTracing5 user_events sessions (docs/protocol/diagnostic-ipc.md §4,
//! docs/protocol/user_events.md §7): the runtime writes its events into Linux user_events
//! tracepoints through a `user_events_data` fd tracer passes it; tracer reads them from the mapped
//! ftrace ring buffer of its private instance.
//!
//! Order per session (the runtime writes an event's metadata only with its first record,
//! docs/protocol/user_events.md §7.4, so the tracepoint must be recorded before the runtime is told
//! about it): tracer registers each tracepoint itself with the runtime's exact field list, starts
//! decoding its id, and enables it in its instance; only then does it send CollectTracing5 followed
//! by the fd (SCM_RIGHTS, after the peer-credential check), and it keeps the connection open for
//! the session's lifetime. Closing the connection ends the session; tracer then reads what is
//! buffered, disables its tracepoints and unregisters them.
//!
//! The ftrace reader has one owner, the pipeline's [`Hub`]; session tasks reach it through
//! their [`HubHandle`].
//!
//! The fd is a privilege (docs/security.md, "user_events grant"): each session gets its own
//! `open()` of `user_events_data`, closed when the session ends; its tracepoint names carry 64
//! random bits (nobody can pre-register or guess them); and a record written by a thread that
//! was not, when it wrote it, a thread of the session's process (an fd passed on, a guessed
//! name) is dropped and counted (`foreign_writer`). Which process a thread belonged to comes
//! from the kernel's record of the session process's threads ([`ThreadTable`]), which outlives
//! the threads: records of threads that have exited since are still theirs.
//!
//! A record's line names its session, whose id the runtime's reply carries: records read
//! before the session task has it are held ([`MAX_RECORDS_BEFORE_START`]) until it does.
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, anyhow};
use tokio::io::AsyncReadExt as _;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use tracer_common::ThreadTenure;
use tracer_decode::budget::OutputBudget;
use tracer_decode::diagnostic_ipc::{
    CommandCode, ProcessInfo, TracepointConfig, UserEventsProvider,
};
use tracer_decode::nettrace::{EventContext, MetadataLimits, OutputEvent};
use tracer_decode::user_events::{MetadataCache, RecordLayout, parse_record};

use super::nettrace_file::{FileRecord, RecordsFile};
use super::stopping::StoppingEvent;
use super::{
    EndReason, EventLines, EventOrigin, LineExtras, SessionContext, SessionEnd, SessionMessage,
    SessionMode, stopped,
};
use crate::ipc::client::DiagnosticClient;
use crate::ipc::socket::Target;
use crate::kernel::ftrace_reader::{self, FtraceReader, ReaderConfig, ReaderStats};
use crate::kernel::threads::{SWEEP_INTERVAL, ThreadTable};
use crate::kernel::tracefs::{EventSpec, Instance, Tracefs};
use crate::kernel::user_events::{DOTNET_TRACEPOINT_FIELDS, UserEventsData};
use crate::output::{Incarnation, RecordTotals, Source};
use crate::time::Clock;

/// user_events event names are limited (dynamic event names: 64 bytes with the NUL).
const MAX_TRACEPOINT_NAME: usize = 63;
/// Metadata entries cached across all sessions (metadata arrives once per event and session);
/// bytes are bounded too (`tracer_decode::user_events::CACHE_MAX_BYTES`, in total and per
/// process).
const METADATA_CACHE_ENTRIES: usize = 64 * 1024;
/// Records of one session held while its start is not yet confirmed (the runtime may write
/// before tracer has read its reply); beyond, they are dropped and counted
/// (`session_not_started`), as are those of a session that never starts.
pub const MAX_RECORDS_BEFORE_START: usize = 16 * 1024;
/// Random bytes in each session's tracepoint names (hex: twice as many characters).
const NAME_NONCE_BYTES: usize = 8;
/// Records the ftrace reader holds in its reorder window (each at most a page): beyond it the
/// oldest are released early, so a batch holds at most this many records plus one drain.
pub const MAX_HELD_RECORDS: usize = 16 * 1024;

/// What session tasks ask of the pipeline's [`Hub`].
pub enum Request {
    /// Register, start decoding and enable one tracepoint per provider of `process`, and
    /// record its threads; replies with the tracepoint names in provider order.
    Prepare {
        process: Incarnation,
        providers: Vec<String>,
        pointer_size: u32,
        stopping_event: Option<StoppingEvent>,
        /// `--nettrace-dir`: where the session's records are also written as a `.nettrace`.
        nettrace_dir: Option<PathBuf>,
        reply: oneshot::Sender<anyhow::Result<Prepared>>,
    },
    /// The runtime started `pid`'s session: its records are written from now on, each naming
    /// `session_id`.
    Started { pid: u32, session_id: u64 },
    /// Read what is buffered, then disable and unregister `pid`'s tracepoints; replies with what
    /// the session's records lost.
    Release { pid: u32, reply: oneshot::Sender<RecordTotals> },
}

/// What [`Request::Prepare`] yields: the tracepoint names in provider order, the session's
/// own `user_events_data` (to pass to the runtime), and word of why the session must end when
/// its records decide it (its output budget passed, its stopping event arrived).
pub struct Prepared {
    names: Vec<String>,
    data: Arc<UserEventsData>,
    end: oneshot::Receiver<EndReason>,
}

/// A session task's handle on the pipeline's [`Hub`].
#[derive(Clone)]
pub struct HubHandle {
    requests: mpsc::Sender<Request>,
}

/// Runs one user_events session with an already probed runtime.
pub(super) async fn run(
    target: &Target,
    client: DiagnosticClient,
    runtime: Option<ProcessInfo>,
    ctx: SessionContext,
    hub: HubHandle,
) {
    let SessionContext { config, out, mut stop, .. } = ctx;
    let (pid, process) = (target.pid(), target.incarnation());
    let major = runtime.as_ref().and_then(ProcessInfo::major_version);
    // The hub reads every session's records: Meter values are not told apart by session here.
    let (request, _) = config.request_for(pid, major);
    let providers: Vec<String> =
        request.providers.iter().map(|p| p.provider.name.clone()).collect();
    let pointer_size = match runtime.as_ref().map(|r| r.arch.as_str()) {
        Some("x86" | "arm32" | "arm") => 4,
        _ => 8,
    };
    let (reply, prepared) = oneshot::channel();
    let prepare = Request::Prepare {
        process,
        providers,
        pointer_size,
        stopping_event: config.stopping_event.clone(),
        nettrace_dir: config.nettrace_dir.clone(),
        reply,
    };
    if hub.requests.send(prepare).await.is_err() {
        return;
    }
    let Prepared { names, data, end } = match prepared.await {
        Ok(Ok(prepared)) => prepared,
        Ok(Err(e)) => {
            let error = format!("preparing user_events tracepoints: {e:#}");
            let _ = out.send(SessionMessage::Failed { process, error, refused: false }).await;
            return;
        }
        Err(_) => return,
    };
    let session_providers: Vec<UserEventsProvider> = config
        .request
        .providers
        .iter()
        .zip(names)
        .map(|(p, name)| UserEventsProvider {
            provider: p.provider.clone(),
            filter: p.filter.clone(),
            tracepoints: TracepointConfig { default_name: Some(name), sets: Vec::new() },
        })
        .collect();
    let started = client
        .start_user_events_session(request.rundown_keyword, &session_providers, data.as_fd())
        .await;
    // The runtime has its copy now; the hub holds the session's file until the session ends.
    drop(data);
    let session = match started {
        Ok(s) => s,
        Err(e) => {
            // No session: its `.nettrace` (only a header so far) goes too.
            if let Some(file) = release(&hub, pid).await.and_then(|r| r.file) {
                let _ = std::fs::remove_file(&file.nettrace_file);
            }
            return super::report_failure(process, e, &out).await;
        }
    };
    let (session_id, mut stream) = (session.session_id, session.stream);
    let started = SessionMessage::Started {
        process,
        session_id,
        command: CommandCode::CollectTracing5,
        mode: SessionMode::UserEvents,
        runtime,
        providers: session_providers.into_iter().map(|p| p.provider).collect(),
    };
    if out.send(started).await.is_err()
        || hub.requests.send(Request::Started { pid, session_id }).await.is_err()
    {
        return;
    }

    // The runtime sends nothing more on this connection; EOF means it went away.
    let mut byte = [0u8; 1];
    let decided = async {
        match end.await {
            Ok(reason) => reason,
            // The hub drops the sender unused when the session is released some other way.
            Err(_) => std::future::pending().await,
        }
    };
    let exited = (EndReason::ProcessExited, Some("the process exited".to_string()));
    let (reason, detail) = tokio::select! {
        () = stopped(&mut stop) => (EndReason::Stopped, None),
        reason = decided => {
            let detail = (reason == EndReason::BudgetExceeded)
                .then(|| "its records rendered more output than their bytes pay for".to_string());
            (reason, detail)
        }
        // Whoever holds the connection now: no thread of the process writes any more.
        () = target.exited() => exited,
        r = stream.read(&mut byte) => match r {
            Ok(0) => (EndReason::ProcessExited, Some("the runtime closed the session's connection".to_string())),
            Ok(_) => (EndReason::ReadError, Some("unexpected data on a user_events session connection".to_string())),
            Err(e) => (EndReason::ReadError, Some(e.to_string())),
        },
    };
    // Closing the connection ends the session in the runtime (it polls it every 100 ms).
    drop(stream);
    let records = release(&hub, pid).await;
    let end = SessionEnd::Records(records.unwrap_or_default());
    let message = SessionMessage::Ended { process, session_id, reason, detail, end: Some(end) };
    let _ = out.send(message).await;
}

/// Ends `pid`'s grant; `None` when the pipeline is shutting down.
async fn release(hub: &HubHandle, pid: u32) -> Option<RecordTotals> {
    let (reply, released) = oneshot::channel();
    hub.requests.send(Request::Release { pid, reply }).await.ok()?;
    released.await.ok()
}

/// Decoding facts of one tracepoint tracer registered.
struct TracepointInfo {
    pid: u32,
    provider: String,
    layout: RecordLayout,
    pointer_size: u32,
    /// The tracepoint's event id, to stop decoding it when the session ends.
    id: u16,
}

/// One session's grant: its own open `user_events_data`, its tracepoints, the generation of its
/// process's threads in the kernel's record, and what its records earned and lost.
struct Grant {
    /// Closed (after unregistering every tracepoint) when the grant is dropped.
    data: Arc<UserEventsData>,
    process: Incarnation,
    /// Which of the kernel's thread entries are this session's ([`ThreadTable::watch`]).
    generation: u32,
    /// The runtime's id of the session, once its reply was read; records read before are held
    /// in `before_start`.
    session_id: Option<u64>,
    before_start: Vec<ftrace_reader::Event>,
    nonce: String,
    names: Vec<String>,
    /// Output bytes earned by the session's record bytes (see `tracer_decode::budget`).
    budget: OutputBudget,
    stopping_event: Option<StoppingEvent>,
    /// `--nettrace-dir`: the session's records as a NetTrace stream.
    file: Option<RecordsFile>,
    /// Fired once, when the budget first refuses a line or the stopping event arrives: the
    /// session task then ends the session for that reason.
    end: Option<oneshot::Sender<EndReason>>,
    records: RecordTotals,
    /// The shared buffer's lost-record count when the session started.
    buffer_lost_at_start: u64,
}

/// The pipeline's side: the sessions' `user_events_data` files, tracer's private ftrace instance
/// and reader, the kernel's record of the sessions' threads, and what it needs to decode the
/// records of every session's tracepoints.
pub struct Hub {
    tracefs: Tracefs,
    reader: FtraceReader,
    threads: ThreadTable,
    /// When the thread table was last swept ([`SWEEP_INTERVAL`]).
    swept: Instant,
    tracepoints: HashMap<String, TracepointInfo>,
    grants: HashMap<u32, Grant>,
    cache: MetadataCache,
    requests: mpsc::Receiver<Request>,
    sender: mpsc::Sender<Request>,
    counts: HubCounts,
    /// Cgroup, container and pod of each traced process, for its event lines.
    labels: crate::identity::LabelRegistry,
    /// What each event line carries besides its JSON.
    line_extras: LineExtras,
}

/// What the hub dropped, over all sessions.
#[derive(Debug, Default)]
struct HubCounts {
    decode_errors: u64,
    /// Records whose writer was not a thread of the session's process when it wrote them.
    foreign_writer: u64,
    over_budget: u64,
    /// Records of sessions whose start was never confirmed, or past
    /// [`MAX_RECORDS_BEFORE_START`].
    not_started: u64,
}

impl Hub {
    /// Checks that `user_events_data` opens and creates a private instance (trace_clock mono, so
    /// record timestamps are CLOCK_MONOTONIC like every other source and like the thread
    /// table's stamps) with its reader.
    pub fn start(
        tracefs: &Tracefs,
        buffer_size_kb: u64,
        threads: ThreadTable,
    ) -> anyhow::Result<Hub> {
        // Each session opens its own; this one only proves it can be opened.
        drop(UserEventsData::open(tracefs)?);
        // Several pipelines may run in one process (tests): each gets its own instance.
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        let suffix = format!("run{}", INSTANCES.fetch_add(1, Ordering::Relaxed));
        let instance = Instance::create_with_suffix(tracefs, Some(&suffix))?;
        instance.set_trace_clock("mono")?;
        instance.set_buffer_size_kb(buffer_size_kb)?;
        // Wake the reader as soon as there is data: runtime events are sparse.
        instance.set_buffer_percent(0)?;
        let config = ReaderConfig { max_held_events: MAX_HELD_RECORDS, ..ReaderConfig::default() };
        let reader = FtraceReader::open(Arc::new(instance), Vec::new(), config)?;
        // Instances start with tracing off; record only once every CPU buffer has its reader.
        reader.instance().set_tracing_on(true)?;
        let (sender, requests) = mpsc::channel(64);
        Ok(Hub {
            tracefs: tracefs.clone(),
            reader,
            threads,
            swept: Instant::now(),
            tracepoints: HashMap::new(),
            grants: HashMap::new(),
            cache: MetadataCache::new(METADATA_CACHE_ENTRIES),
            requests,
            sender,
            counts: HubCounts::default(),
            labels: Default::default(),
            line_extras: LineExtras::default(),
        })
    }

    /// Where the pipeline keeps each traced process's labels, and what its lines carry.
    pub fn set_output(&mut self, labels: crate::identity::LabelRegistry, extras: LineExtras) {
        self.labels = labels;
        self.line_extras = extras;
    }

    pub fn handle(&self) -> HubHandle {
        HubHandle { requests: self.sender.clone() }
    }

    /// Waits for a request or buffered records; returns the decoded event lines (possibly none).
    pub async fn next(&mut self, clock: &Clock) -> EventLines {
        let lines = tokio::select! {
            Some(request) = self.requests.recv() => self.handle_request(request, clock),
            batch = self.reader.next_batch() => match batch {
                Ok(events) => self.decode(events, clock),
                Err(e) => {
                    log::error!("reading the user_events ftrace buffer: {e:#}");
                    EventLines::default()
                }
            },
        };
        if self.swept.elapsed() >= SWEEP_INTERVAL {
            self.sweep();
        }
        lines
    }

    /// Everything still buffered (at shutdown).
    pub fn flush(&mut self, clock: &Clock) -> EventLines {
        match self.reader.flush() {
            Ok(events) => self.decode(events, clock),
            Err(e) => {
                log::error!("reading the user_events ftrace buffer: {e:#}");
                EventLines::default()
            }
        }
    }

    pub fn stats(&self) -> ReaderStats {
        self.reader.stats()
    }

    pub fn decode_errors(&self) -> u64 {
        self.counts.decode_errors
    }

    /// Records dropped because their writer was not a thread of the session's process.
    pub fn foreign_writer(&self) -> u64 {
        self.counts.foreign_writer
    }

    /// Records decoded but not written: their process's output budget was spent.
    pub fn over_budget(&self) -> u64 {
        self.counts.over_budget
    }

    /// Records dropped because their session's start was never confirmed (or too many came
    /// before it was).
    pub fn not_started(&self) -> u64 {
        self.counts.not_started
    }

    /// Event metadata the cache refused to keep (full): those events keep raw payloads.
    pub fn metadata_refused(&self) -> u64 {
        self.cache.refused()
    }

    fn handle_request(&mut self, request: Request, clock: &Clock) -> EventLines {
        match request {
            Request::Prepare {
                process,
                providers,
                pointer_size,
                stopping_event,
                nettrace_dir,
                reply,
            } => {
                let pid = process.pid;
                let file = nettrace_dir.as_deref();
                let result = self
                    .grant(process, stopping_event, file, pointer_size, clock)
                    .and_then(|end| {
                        let names = providers
                            .iter()
                            .map(|provider| self.prepare(pid, provider, pointer_size))
                            .collect::<anyhow::Result<Vec<String>>>()?;
                        let data = self.grants[&pid].data.clone();
                        Ok(Prepared { names, data, end })
                    });
                if result.is_err() {
                    self.disable(pid);
                    self.release(pid);
                }
                let _ = reply.send(result);
                EventLines::default()
            }
            Request::Started { pid, session_id } => {
                let Some(grant) = self.grants.get_mut(&pid) else { return EventLines::default() };
                grant.session_id = Some(session_id);
                let held = std::mem::take(&mut grant.before_start);
                self.decode(held, clock)
            }
            Request::Release { pid, reply } => {
                // Disabled first, so that every record the session's tracepoints took is in the
                // buffer for the flush: records written after it are not recorded at all.
                self.disable(pid);
                let lines = self.flush(clock);
                let records = self.release(pid).unwrap_or_default();
                let _ = reply.send(records);
                lines
            }
        }
    }

    /// Opens `process`'s own `user_events_data`, records its threads and draws its tracepoint
    /// names' random part; returns word of why the session must end, when its records decide
    /// it. With `nettrace_dir`, the session's records are also written to a `.nettrace` there.
    fn grant(
        &mut self,
        process: Incarnation,
        stopping_event: Option<StoppingEvent>,
        nettrace_dir: Option<&std::path::Path>,
        pointer_size: u32,
        clock: &Clock,
    ) -> anyhow::Result<oneshot::Receiver<EndReason>> {
        let pid = process.pid;
        if self.grants.contains_key(&pid) {
            anyhow::bail!("pid {pid} already has a user_events session");
        }
        let data = Arc::new(UserEventsData::open(&self.tracefs)?);
        let nonce = name_nonce()?;
        // Before the runtime learns the names: every thread that can write is recorded.
        let generation = self.threads.watch(pid).context("recording the process's threads")?;
        let (end, end_rx) = oneshot::channel();
        // Named like a streaming session's file, with the names' random part as the id.
        let name_id = u64::from_str_radix(&nonce, 16).unwrap_or_default();
        let file =
            nettrace_dir.map(|dir| RecordsFile::create(dir, pid, name_id, pointer_size, clock));
        let grant = Grant {
            data,
            process,
            generation,
            session_id: None,
            before_start: Vec::new(),
            nonce,
            names: Vec::new(),
            budget: OutputBudget::default(),
            stopping_event,
            file,
            end: Some(end),
            records: RecordTotals::default(),
            buffer_lost_at_start: self.reader.stats().lost(),
        };
        self.grants.insert(pid, grant);
        Ok(end_rx)
    }

    fn prepare(&mut self, pid: u32, provider: &str, pointer_size: u32) -> anyhow::Result<String> {
        let grant = self.grants.get_mut(&pid).context("no user_events grant")?;
        let name = tracepoint_name(&grant.nonce, pid, provider);
        grant
            .data
            .register(&name, DOTNET_TRACEPOINT_FIELDS)
            .with_context(|| format!("registering user_events tracepoint {name}"))?;
        grant.names.push(name.clone());
        let tracepoint = self.reader.instance().tracepoint("user_events", &name)?;
        let layout = RecordLayout::from_format(&tracepoint.format).ok_or_else(|| {
            anyhow!("user_events:{name} does not have the runtime's fields (format changed?)")
        })?;
        let id = tracepoint.format.id;
        self.reader.add_tracepoint(tracepoint);
        self.tracepoints.insert(
            name.clone(),
            TracepointInfo { pid, provider: provider.to_string(), layout, pointer_size, id },
        );
        let spec =
            EventSpec { system: "user_events".into(), name: Some(name.clone()), filter: None };
        self.reader.instance().enable(&spec)?;
        Ok(name)
    }

    /// Disables `pid`'s tracepoints in tracer's instance.
    fn disable(&self, pid: u32) {
        for name in self.grants.get(&pid).map_or(&[][..], |g| &g.names) {
            if let Err(e) = self.reader.instance().disable("user_events", name) {
                log::warn!("disabling user_events:{name}: {e:#}");
            }
        }
    }

    /// Stops decoding and unregisters `pid`'s tracepoints (disabled already), then closes its
    /// `user_events_data` (the kernel deletes the events once the runtime lets go of them too)
    /// and stops recording its threads; returns what the session's records lost.
    fn release(&mut self, pid: u32) -> Option<RecordTotals> {
        let mut grant = self.grants.remove(&pid)?;
        for name in &grant.names {
            if let Some(info) = self.tracepoints.remove(name) {
                self.reader.remove_tracepoint(info.id);
            }
            if let Err(e) = grant.data.unregister(name) {
                log::warn!("unregistering user_events tracepoint {name}: {e}");
            }
        }
        self.threads.unwatch(pid);
        if Arc::strong_count(&grant.data) > 1 {
            // Only while a session task has not yet handed the fd on; it drops it right after.
            log::debug!("pid {pid}: user_events_data still referenced by its session task");
        }
        let unconfirmed = grant.before_start.len() as u64;
        if unconfirmed > 0 {
            log::warn!("pid {pid}: {unconfirmed} records of a session that never started: dropped");
            self.counts.not_started += unconfirmed;
        }
        let buffer_lost = self.reader.stats().lost().saturating_sub(grant.buffer_lost_at_start);
        let file = grant.file.take().map(RecordsFile::finish);
        let records = RecordTotals {
            buffer_lost,
            file,
            not_started: grant.records.not_started + unconfirmed,
            ..grant.records.clone()
        };
        drop(grant);
        self.cache.forget_process(pid);
        Some(records)
    }

    /// Removes the thread entries no record can need any more: of ended sessions, and of
    /// threads that exited before what the reader has returned — unless records are held for a
    /// session's start (those were returned, not yet attributed).
    fn sweep(&mut self) {
        self.swept = Instant::now();
        if self.grants.values().any(|g| !g.before_start.is_empty()) {
            return;
        }
        let live: HashSet<u32> = self.grants.values().map(|g| g.generation).collect();
        self.threads.sweep(&live, self.reader.returned_through());
    }

    fn decode(&mut self, events: Vec<ftrace_reader::Event>, clock: &Clock) -> EventLines {
        let mut lines = EventLines::new(self.line_extras);
        // What the kernel recorded of each writer, looked up once per batch.
        let mut writers: HashMap<u32, Option<ThreadTenure>> = HashMap::new();
        for ev in events {
            self.decode_one(ev, clock, &mut lines, &mut writers);
        }
        lines
    }

    fn decode_one(
        &mut self,
        ev: ftrace_reader::Event,
        clock: &Clock,
        lines: &mut EventLines,
        writers: &mut HashMap<u32, Option<ThreadTenure>>,
    ) {
        let limits = MetadataLimits::default();
        let name = &ev.tracepoint.name;
        let Some(info) = self.tracepoints.get(name) else { return };
        let Some(grant) = self.grants.get_mut(&info.pid) else { return };
        let Some(session_id) = grant.session_id else {
            if grant.before_start.len() < MAX_RECORDS_BEFORE_START {
                grant.before_start.push(ev);
            } else {
                self.counts.not_started += 1;
                grant.records.not_started += 1;
            }
            return;
        };
        let writer = ev.common.pid as u32;
        let threads = &self.threads;
        let tenure = writers.entry(writer).or_insert_with(|| threads.tenure(writer));
        if !tenure.is_some_and(|t| wrote_for(&t, info.pid, grant.generation, ev.ts)) {
            self.counts.foreign_writer += 1;
            grant.records.foreign_writer += 1;
            if self.counts.foreign_writer.is_power_of_two() {
                log::warn!(
                    "pid {}: user_events:{name} record written by thread {writer}, not one of \
                     its threads then: dropped",
                    info.pid
                );
            }
            return;
        }
        let mut record = match parse_record(&info.layout, &ev.record, &info.provider, &limits) {
            Ok(r) => r,
            Err(e) => {
                self.counts.decode_errors += 1;
                grant.records.undecodable += 1;
                log::warn!("pid {}: user_events:{name} record on cpu {}: {e}", info.pid, ev.cpu);
                return;
            }
        };
        let metadata_bytes = record.metadata_bytes.take();
        let meta = self.cache.resolve(info.pid, name, &info.provider, &mut record);
        let context = EventContext {
            thread: ev.common.pid as u64,
            sequence: None,
            timestamp: ev.ts as i64,
            activity_id: record.activity_id.unwrap_or_default(),
            related_activity_id: record.related_activity_id.unwrap_or_default(),
            stack_id: 0,
        };
        let event = OutputEvent {
            metadata: &meta,
            payload: record.payload,
            pointer_size: info.pointer_size,
            stack: None,
            rendered_fields: None,
            context,
        };
        if grant.stopping_event.as_ref().is_some_and(|s| s.matches(&event))
            && let Some(end) = grant.end.take()
        {
            log::info!("pid {}: the stopping event arrived: stopping the session", info.pid);
            let _ = end.send(EndReason::StoppingEvent);
        }
        grant.budget.earn(ev.record.len() as u64);
        let labels = self.labels.get(info.pid);
        let budget = &mut grant.budget;
        let mut over = None;
        let spend = |len: usize| match budget.spend(len as u64) {
            Ok(()) => true,
            Err(e) => {
                over = Some(e);
                false
            }
        };
        let origin = EventOrigin { process: grant.process, session_id };
        if !lines.push_if(clock, Source::UserEvents, origin, labels.as_ref(), event, spend) {
            self.counts.over_budget += 1;
            grant.records.unwritten_events += 1;
            if let (Some(e), Some(end)) = (over, grant.end.take()) {
                log::warn!("pid {}: user_events session ends: {e}", info.pid);
                let _ = end.send(EndReason::BudgetExceeded);
            }
            return;
        }
        if let Some(file) = &mut grant.file {
            file.record(&FileRecord {
                tracepoint: name,
                provider: &info.provider,
                event_id: record.event_id,
                metadata: metadata_bytes.as_deref(),
                thread: ev.common.pid as u64,
                timestamp: ev.ts as i64,
                activity_id: record.activity_id.unwrap_or_default(),
                related_activity_id: record.related_activity_id.unwrap_or_default(),
                payload: record.payload,
            });
        }
    }
}

/// Whether a record written at `ts` (CLOCK_MONOTONIC) by a thread the kernel recorded as
/// `tenure` was written by a thread of session `generation`'s process `pid`: the thread was its
/// then — created before the record (or already running when the session started) and not yet
/// exited.
fn wrote_for(tenure: &ThreadTenure, pid: u32, generation: u32, ts: u64) -> bool {
    tenure.tgid == pid
        && tenure.generation == generation
        && tenure.born_ns <= ts
        && (tenure.exited_ns == 0 || ts <= tenure.exited_ns)
}

/// The random part of one session's tracepoint names: [`NAME_NONCE_BYTES`] from the kernel's
/// CSPRNG, in hex.
fn name_nonce() -> anyhow::Result<String> {
    let mut bytes = [0u8; NAME_NONCE_BYTES];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the valid buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(std::io::Error::last_os_error())
            .context("getrandom for user_events tracepoint names");
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `tracer_<nonce>_<target pid>_<provider>`: unpredictable (the nonce is random per session, so
/// nobody can pre-register tracer's names or guess another session's), unique per session,
/// characters tracefs accepts, bounded length.
pub fn tracepoint_name(nonce: &str, pid: u32, provider: &str) -> String {
    let prefix = format!("tracer_{nonce}_{pid}_");
    let clean: String =
        provider.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if prefix.len() + clean.len() <= MAX_TRACEPOINT_NAME {
        return prefix + &clean;
    }
    // Too long: keep the start and add a hash of the full name so providers stay distinct.
    let hash = provider.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let keep = MAX_TRACEPOINT_NAME - prefix.len() - 9;
    format!("{prefix}{}_{:08x}", &clean[..keep], hash as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracepoint_names_are_tracefs_safe_unique_and_bounded() {
        assert_eq!(
            tracepoint_name("0123456789abcdef", 1234, "Microsoft-Windows-DotNETRuntime"),
            "tracer_0123456789abcdef_1234_Microsoft_Windows_DotNETRuntime"
        );
        let long = "My.Company/Product?Events*With-A-Really-Long-Name-That-Goes-On";
        let nonce = name_nonce().unwrap();
        // pid_max is at most 2^22: 7 digits.
        let a = tracepoint_name(&nonce, 4_194_304, long);
        let b = tracepoint_name(&nonce, 4_194_304, &format!("{long}2"));
        assert!(a.len() <= MAX_TRACEPOINT_NAME && b.len() <= MAX_TRACEPOINT_NAME, "{a} {b}");
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{a}");
        let runtime = tracepoint_name(&nonce, 4_194_304, "Microsoft-Windows-DotNETRuntime");
        assert!(runtime.ends_with("_Microsoft_Windows_DotNETRuntime"), "not truncated: {runtime}");
    }

    #[test]
    fn name_nonces_are_random() {
        let (a, b) = (name_nonce().unwrap(), name_nonce().unwrap());
        assert_eq!(a.len(), 2 * NAME_NONCE_BYTES);
        assert_ne!(a, b);
    }

    /// A record is its process's when the thread that wrote it was one of the process's at
    /// that time, even if the thread has exited since; a reused tid, another process's thread
    /// and an entry of a previous session with the pid are not.
    #[test]
    fn records_are_attributed_by_what_their_thread_was_when_it_wrote() {
        let (pid, generation) = (100, 7);
        let exited = ThreadTenure { tgid: pid, generation, born_ns: 1_000, exited_ns: 5_000 };
        assert!(wrote_for(&exited, pid, generation, 1_000));
        assert!(wrote_for(&exited, pid, generation, 5_000), "written just before it exited");
        assert!(!wrote_for(&exited, pid, generation, 5_001), "after it exited: a new holder");
        assert!(!wrote_for(&exited, pid, generation, 999), "before it was created");
        let running = ThreadTenure { tgid: pid, generation, born_ns: 0, exited_ns: 0 };
        assert!(wrote_for(&running, pid, generation, u64::MAX), "running since the start");
        assert!(!wrote_for(&running, 101, generation, 10), "a thread of another process");
        assert!(!wrote_for(&running, pid, generation + 1, 10), "a previous session's entry");
    }
}
