//! Tracing sessions started over the diagnostic IPC: one task per traced process. The task
//! locates the socket (retrying through the start-up race), probes the runtime, then runs either
//! a streaming session (nettrace on the socket) or a CollectTracing5 user_events session
//! (records through tracer's ftrace instance), and reports through [`SessionMessage`]s: events
//! arrive already rendered as output lines, so the pipeline only counts and writes them.
pub mod streaming;
pub mod user_events;

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracer_decode::diagnostic_ipc::{CommandCode, ProcessInfo, TracingRequest};
use tracer_decode::nettrace::NettraceStats;

use crate::ipc::client::{ClientError, DiagnosticClient, RuntimeInfo, Timeouts};
use crate::ipc::socket::SocketError;
use crate::output::RenderedLine;
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
        }
    }
}

/// One runtime event, rendered as its output line.
#[derive(Debug)]
pub struct EventLine {
    pub pid: u32,
    pub provider: String,
    pub line: RenderedLine,
}

/// What a session task reports to the pipeline, in order: `Started`, any number of `Event`s,
/// then exactly one `Ended`; or a single `Failed` when no session could be started.
#[derive(Debug)]
pub enum SessionMessage {
    Started {
        pid: u32,
        session_id: u64,
        command: CommandCode,
        mode: SessionMode,
        runtime: Option<ProcessInfo>,
    },
    Event(EventLine),
    Ended {
        pid: u32,
        session_id: u64,
        reason: EndReason,
        detail: Option<String>,
        /// Streaming sessions only: what the nettrace stream carried and lost.
        stream: Option<(NettraceStats, Vec<(u64, u64)>)>,
    },
    Failed {
        pid: u32,
        error: String,
        refused: bool,
    },
}

/// What every session task gets from the pipeline.
#[derive(Clone)]
pub struct SessionContext {
    pub config: SessionConfig,
    pub clock: Clock,
    /// Where the task reports.
    pub out: mpsc::Sender<SessionMessage>,
    /// Flips to true when the pipeline shuts down.
    pub stop: watch::Receiver<bool>,
    /// The pipeline's user_events hub, when the kernel has user_events.
    pub user_events: Option<user_events::HubHandle>,
    /// Cgroup, container and pod of each traced process, for its event lines.
    pub labels: crate::identity::LabelRegistry,
}

/// Runs one process's session to its end, reporting through `ctx.out`.
pub async fn run(pid: u32, mut ctx: SessionContext) {
    let probed = tokio::select! {
        r = locate_and_probe(pid, &ctx.config) => r,
        () = stopped(&mut ctx.stop) => return,
    };
    let (client, runtime) = match probed {
        Ok(p) => p,
        Err(e) => return report_failure(pid, e, &ctx.out).await,
    };
    let hub = match (ctx.config.mode, ctx.user_events.take()) {
        (SessionMode::Streaming, _) | (_, None) => None,
        (SessionMode::UserEvents, Some(h)) => Some(h),
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
    match hub {
        Some(hub) => user_events::run(pid, client, runtime, ctx, hub).await,
        None => streaming::run(pid, client, runtime, ctx).await,
    }
}

async fn report_failure(pid: u32, e: ClientError, out: &mpsc::Sender<SessionMessage>) {
    let refused = matches!(&e, ClientError::Socket(s) if s.refusal().is_some());
    let _ = out.send(SessionMessage::Failed { pid, error: e.to_string(), refused }).await;
}

async fn locate_and_probe(
    pid: u32,
    config: &SessionConfig,
) -> Result<(DiagnosticClient, Option<ProcessInfo>), ClientError> {
    let client = locate(pid, config).await?;
    let runtime = match client.probe().await? {
        RuntimeInfo::Known { info, .. } => Some(info),
        RuntimeInfo::PreNet5 => None,
    };
    Ok((client, runtime))
}

/// Retries while the socket does not exist yet: a runtime seen through its `doublemapper`
/// mapping may not have bound its diagnostic socket yet (docs/protocol/diagnostic-ipc.md §1.5).
async fn locate(pid: u32, config: &SessionConfig) -> Result<DiagnosticClient, ClientError> {
    let give_up = Instant::now() + config.locate_for;
    let mut delay = Duration::from_millis(20);
    loop {
        match DiagnosticClient::for_pid(pid, config.timeouts) {
            Err(ClientError::Socket(SocketError::NotFound { .. })) if Instant::now() < give_up => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// Resolves once the pipeline asks sessions to stop (or is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard returned by wait_for is dropped here, before the caller's next await.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}
