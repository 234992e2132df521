//! Tracing sessions started over the diagnostic IPC: one task per traced process. The task
//! locates the socket (retrying through the start-up race), probes the runtime, then runs either
//! a streaming session (nettrace on the socket) or a CollectTracing5 user_events session
//! (records through tracer's ftrace instance), and reports through [`SessionMessage`]s.
pub mod streaming;
pub mod user_events;

use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::decode::ipc::{CommandCode, ProcessInfo, TracingRequest};
use crate::decode::nettrace::{DecodedEvent, NettraceStats};
use crate::ipc::client::{ClientError, DiagnosticClient, RuntimeInfo, Timeouts};
use crate::ipc::socket::SocketError;
use crate::sink::Clock;

/// Which kind of session to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionMode {
    /// user_events when the kernel has it and the runtime is .NET 10+, else streaming.
    Auto,
    /// nettrace streamed over the diagnostic socket (every runtime since .NET Core 3.0).
    Streaming,
    /// CollectTracing5 user_events sessions (Linux with CONFIG_USER_EVENTS, .NET 10+).
    UserEvents,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
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
    Event {
        pid: u32,
        provider: String,
        line: serde_json::Value,
    },
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

/// The JSON line of one runtime event: the common envelope, then the decoded event.
#[derive(Serialize)]
pub struct DotnetEventLine<'a> {
    pub ts: String,
    pub mono_ns: u64,
    pub kind: &'static str,
    /// `nettrace` or `user_events`.
    pub source: &'static str,
    pub pid: u32,
    #[serde(flatten)]
    pub event: DecodedEvent<'a>,
}

impl<'a> DotnetEventLine<'a> {
    pub fn new(
        clock: &Clock,
        mono_ns: u64,
        source: &'static str,
        pid: u32,
        event: DecodedEvent<'a>,
    ) -> Self {
        DotnetEventLine {
            ts: clock.iso8601(mono_ns),
            mono_ns,
            kind: "dotnet_event",
            source,
            pid,
            event,
        }
    }
}

/// Runs one process's session to its end, reporting through `out`. `stop` flips to true at
/// shutdown. `user_events` is the pipeline's user_events backend, when the kernel has one.
pub async fn run(
    pid: u32,
    config: SessionConfig,
    clock: Clock,
    out: mpsc::Sender<SessionMessage>,
    mut stop: watch::Receiver<bool>,
    user_events: Option<user_events::Backend>,
) {
    let probed = tokio::select! {
        r = locate_and_probe(pid, &config) => r,
        () = stopped(&mut stop) => return,
    };
    let (client, runtime) = match probed {
        Ok(p) => p,
        Err(e) => return report_failure(pid, e, &out).await,
    };
    let backend = match (config.mode, user_events) {
        (SessionMode::Streaming, _) | (_, None) => None,
        (SessionMode::UserEvents, Some(b)) => Some(b),
        (SessionMode::Auto, Some(b)) => {
            let major = runtime.as_ref().and_then(ProcessInfo::major_version);
            if major.is_some_and(|m| m >= 10) {
                Some(b)
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
    match backend {
        Some(b) => user_events::run(pid, client, runtime, &config, clock, out, stop, b).await,
        None => streaming::run(pid, client, runtime, &config, clock, out, stop).await,
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
/// mapping may not have bound its diagnostic socket yet (reference §5.2).
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
