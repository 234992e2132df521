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
use std::collections::HashMap;
use std::os::fd::AsFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, anyhow};
use tokio::io::AsyncReadExt as _;
use tokio::sync::{mpsc, oneshot};

use tracer_decode::budget::OutputBudget;
use tracer_decode::diagnostic_ipc::{
    CommandCode, ProcessInfo, TracepointConfig, UserEventsProvider,
};
use tracer_decode::nettrace::{DecodedEvent, EventContext, MetadataLimits};
use tracer_decode::user_events::{MetadataCache, RecordLayout, parse_record};

use super::{EndReason, EventLine, SessionContext, SessionMessage, SessionMode, stopped};
use crate::ipc::client::DiagnosticClient;
use crate::kernel::ftrace_reader::{self, FtraceReader, ReaderConfig, ReaderStats};
use crate::kernel::tracefs::{EventSpec, Instance, Tracefs};
use crate::kernel::user_events::{DOTNET_TRACEPOINT_FIELDS, UserEventsData};
use crate::output::{self, Source};
use crate::time::Clock;

/// user_events event names are limited (dynamic event names: 64 bytes with the NUL).
const MAX_TRACEPOINT_NAME: usize = 63;
/// Metadata entries cached across all sessions (metadata arrives once per event and session);
/// bytes are bounded too (`tracer_decode::user_events::CACHE_MAX_BYTES`, in total and per
/// process).
const METADATA_CACHE_ENTRIES: usize = 64 * 1024;
/// Records the ftrace reader holds in its reorder window (each at most a page): beyond it the
/// oldest are released early, so a batch holds at most this many records plus one drain.
pub const MAX_HELD_RECORDS: usize = 16 * 1024;

/// What session tasks ask of the pipeline's [`Hub`].
pub enum Request {
    /// Register, start decoding and enable one tracepoint per provider of `pid`; replies with
    /// the tracepoint names in provider order.
    Prepare {
        pid: u32,
        providers: Vec<String>,
        pointer_size: u32,
        reply: oneshot::Sender<anyhow::Result<Vec<String>>>,
    },
    /// Read what is buffered, then disable and unregister `pid`'s tracepoints.
    Release { pid: u32, reply: oneshot::Sender<()> },
}

/// A session task's handle on the pipeline's [`Hub`].
#[derive(Clone)]
pub struct HubHandle {
    data: Arc<UserEventsData>,
    requests: mpsc::Sender<Request>,
}

/// Runs one user_events session with an already probed runtime.
pub(super) async fn run(
    pid: u32,
    client: DiagnosticClient,
    runtime: Option<ProcessInfo>,
    ctx: SessionContext,
    hub: HubHandle,
) {
    let SessionContext { config, out, mut stop, .. } = ctx;
    let providers: Vec<String> =
        config.request.providers.iter().map(|p| p.provider.name.clone()).collect();
    let pointer_size = match runtime.as_ref().map(|r| r.arch.as_str()) {
        Some("x86" | "arm32" | "arm") => 4,
        _ => 8,
    };
    let (reply, prepared) = oneshot::channel();
    let prepare = Request::Prepare { pid, providers, pointer_size, reply };
    if hub.requests.send(prepare).await.is_err() {
        return;
    }
    let names = match prepared.await {
        Ok(Ok(names)) => names,
        Ok(Err(e)) => {
            let error = format!("preparing user_events tracepoints: {e:#}");
            let _ = out.send(SessionMessage::Failed { pid, error, refused: false }).await;
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
        .start_user_events_session(
            config.request.rundown_keyword,
            &session_providers,
            hub.data.as_fd(),
        )
        .await;
    let session = match started {
        Ok(s) => s,
        Err(e) => {
            release(&hub, pid).await;
            return super::report_failure(pid, e, &out).await;
        }
    };
    let (session_id, mut stream) = (session.session_id, session.stream);
    let started = SessionMessage::Started {
        pid,
        session_id,
        command: CommandCode::CollectTracing5,
        mode: SessionMode::UserEvents,
        runtime,
    };
    if out.send(started).await.is_err() {
        return;
    }

    // The runtime sends nothing more on this connection; EOF means it went away.
    let mut byte = [0u8; 1];
    let (reason, detail) = tokio::select! {
        () = stopped(&mut stop) => (EndReason::Stopped, None),
        r = stream.read(&mut byte) => match r {
            Ok(0) => (EndReason::ProcessExited, Some("the runtime closed the session's connection".to_string())),
            Ok(_) => (EndReason::ReadError, Some("unexpected data on a user_events session connection".to_string())),
            Err(e) => (EndReason::ReadError, Some(e.to_string())),
        },
    };
    // Closing the connection ends the session in the runtime (it polls it every 100 ms).
    drop(stream);
    release(&hub, pid).await;
    let _ = out.send(SessionMessage::Ended { pid, session_id, reason, detail, stream: None }).await;
}

async fn release(hub: &HubHandle, pid: u32) {
    let (reply, released) = oneshot::channel();
    if hub.requests.send(Request::Release { pid, reply }).await.is_ok() {
        let _ = released.await;
    }
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

/// The pipeline's side: tracer's `user_events_data`, its private ftrace instance and reader,
/// and what it needs to decode the records of every session's tracepoints.
pub struct Hub {
    data: Arc<UserEventsData>,
    reader: FtraceReader,
    tracepoints: HashMap<String, TracepointInfo>,
    by_pid: HashMap<u32, Vec<String>>,
    cache: MetadataCache,
    requests: mpsc::Receiver<Request>,
    sender: mpsc::Sender<Request>,
    decode_errors: u64,
    /// Per traced process: output bytes earned by its record bytes (see
    /// `tracer_decode::budget`).
    budgets: HashMap<u32, OutputBudget>,
    over_budget: u64,
    /// Cgroup, container and pod of each traced process, for its event lines.
    labels: crate::identity::LabelRegistry,
}

impl Hub {
    /// Opens `user_events_data` and a private instance (trace_clock mono, so record timestamps
    /// are CLOCK_MONOTONIC like every other source) with its mapped reader.
    pub fn start(tracefs: &Tracefs, buffer_size_kb: u64) -> anyhow::Result<Hub> {
        let data = UserEventsData::open(tracefs)?;
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
            data: Arc::new(data),
            reader,
            tracepoints: HashMap::new(),
            by_pid: HashMap::new(),
            cache: MetadataCache::new(METADATA_CACHE_ENTRIES),
            requests,
            sender,
            decode_errors: 0,
            budgets: HashMap::new(),
            over_budget: 0,
            labels: Default::default(),
        })
    }

    /// Where the pipeline keeps each traced process's labels.
    pub fn set_labels(&mut self, labels: crate::identity::LabelRegistry) {
        self.labels = labels;
    }

    pub fn handle(&self) -> HubHandle {
        HubHandle { data: self.data.clone(), requests: self.sender.clone() }
    }

    /// Waits for a request or buffered records; returns the decoded event lines (possibly none).
    pub async fn next(&mut self, clock: &Clock) -> Vec<EventLine> {
        tokio::select! {
            Some(request) = self.requests.recv() => self.handle_request(request, clock),
            batch = self.reader.next_batch() => match batch {
                Ok(events) => self.decode(&events, clock),
                Err(e) => {
                    log::error!("reading the user_events ftrace buffer: {e:#}");
                    Vec::new()
                }
            },
        }
    }

    /// Everything still buffered (at shutdown).
    pub fn flush(&mut self, clock: &Clock) -> Vec<EventLine> {
        match self.reader.flush() {
            Ok(events) => self.decode(&events, clock),
            Err(e) => {
                log::error!("reading the user_events ftrace buffer: {e:#}");
                Vec::new()
            }
        }
    }

    pub fn stats(&self) -> ReaderStats {
        self.reader.stats()
    }

    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
    }

    /// Records decoded but not written: their process's output budget was spent.
    pub fn over_budget(&self) -> u64 {
        self.over_budget
    }

    /// Event metadata the cache refused to keep (full): those events keep raw payloads.
    pub fn metadata_refused(&self) -> u64 {
        self.cache.refused()
    }

    fn handle_request(&mut self, request: Request, clock: &Clock) -> Vec<EventLine> {
        match request {
            Request::Prepare { pid, providers, pointer_size, reply } => {
                let result = providers
                    .iter()
                    .map(|provider| self.prepare(pid, provider, pointer_size))
                    .collect::<anyhow::Result<Vec<String>>>();
                if result.is_err() {
                    self.release(pid);
                }
                let _ = reply.send(result);
                Vec::new()
            }
            Request::Release { pid, reply } => {
                // Records already written belong to the session: read them before disabling.
                let lines = self.flush(clock);
                self.release(pid);
                let _ = reply.send(());
                lines
            }
        }
    }

    fn prepare(&mut self, pid: u32, provider: &str, pointer_size: u32) -> anyhow::Result<String> {
        let name = tracepoint_name(std::process::id(), pid, provider);
        self.data
            .register(&name, DOTNET_TRACEPOINT_FIELDS)
            .with_context(|| format!("registering user_events tracepoint {name}"))?;
        self.by_pid.entry(pid).or_default().push(name.clone());
        self.budgets.entry(pid).or_default();
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

    fn release(&mut self, pid: u32) {
        for name in self.by_pid.remove(&pid).unwrap_or_default() {
            if let Err(e) = self.reader.instance().disable("user_events", &name) {
                log::warn!("disabling user_events:{name}: {e:#}");
            }
            if let Some(info) = self.tracepoints.remove(&name) {
                self.reader.remove_tracepoint(info.id);
            }
            if let Err(e) = self.data.unregister(&name) {
                log::warn!("unregistering user_events tracepoint {name}: {e}");
            }
        }
        self.cache.forget_process(pid);
        self.budgets.remove(&pid);
    }

    fn decode(&mut self, events: &[ftrace_reader::Event], clock: &Clock) -> Vec<EventLine> {
        let limits = MetadataLimits::default();
        let mut lines = Vec::with_capacity(events.len());
        for ev in events {
            let name = &ev.tracepoint.name;
            let Some(info) = self.tracepoints.get(name) else { continue };
            let mut record = match parse_record(&info.layout, &ev.record, &info.provider, &limits) {
                Ok(r) => r,
                Err(e) => {
                    self.decode_errors += 1;
                    log::warn!(
                        "pid {}: user_events:{name} record on cpu {}: {e}",
                        info.pid,
                        ev.cpu
                    );
                    continue;
                }
            };
            let meta = self.cache.resolve(info.pid, name, &info.provider, &mut record);
            let context = EventContext {
                thread: ev.common.pid as u64,
                sequence: None,
                timestamp: ev.ts as i64,
                activity_id: record.activity_id.unwrap_or_default(),
                related_activity_id: record.related_activity_id.unwrap_or_default(),
            };
            let decoded = DecodedEvent::new(&meta, record.payload, info.pointer_size, context);
            let line = output::dotnet_event(clock, ev.ts, Source::UserEvents, info.pid, decoded)
                .with_labels(self.labels.get(info.pid))
                .render();
            let budget = self.budgets.entry(info.pid).or_default();
            budget.earn(ev.record.len() as u64);
            if let Err(e) = budget.spend(line.as_bytes().len() as u64 + 1) {
                self.over_budget += 1;
                if self.over_budget.is_power_of_two() {
                    log::warn!("pid {}: user_events record not written: {e}", info.pid);
                }
                continue;
            }
            lines.push(EventLine { pid: info.pid, provider: info.provider.clone(), line });
        }
        lines
    }
}

/// `tracer_<tracer pid>_<target pid>_<provider>`: unique per tracer and target (two tracers
/// tracing one runtime must not share a tracepoint), characters tracefs accepts, bounded length.
pub fn tracepoint_name(tracer_pid: u32, pid: u32, provider: &str) -> String {
    let prefix = format!("tracer_{tracer_pid}_{pid}_");
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
            tracepoint_name(7, 1234, "Microsoft-Windows-DotNETRuntime"),
            "tracer_7_1234_Microsoft_Windows_DotNETRuntime"
        );
        let long = "My.Company/Product?Events*With-A-Really-Long-Name-That-Goes-On";
        let a = tracepoint_name(4_000_000, 4_000_001, long);
        let b = tracepoint_name(4_000_000, 4_000_001, &format!("{long}2"));
        assert!(a.len() <= MAX_TRACEPOINT_NAME && b.len() <= MAX_TRACEPOINT_NAME, "{a} {b}");
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{a}");
    }
}
