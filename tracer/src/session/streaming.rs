//! One streaming (nettrace) session with one process: locate its socket (retrying through the
//! start-up race), probe the runtime, start the session with the oldest CollectTracing command
//! that expresses the request, decode the stream, and stop it on request with StopTracing on a new
//! connection, draining the rest of the stream within a time limit.
use std::time::Duration;

use serde::Serialize;
use tokio::io::AsyncReadExt as _;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::decode::ipc::{CommandCode, ProcessInfo, TracingRequest, oldest_collect_tracing};
use crate::decode::nettrace::{DecodedEvent, NettraceParser, NettraceStats};
use crate::ipc::client::{ClientError, DiagnosticClient, RuntimeInfo, Timeouts};
use crate::ipc::socket::SocketError;
use crate::sink::Clock;

#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub request: TracingRequest,
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
    /// tracer stopped it; the stream ended with its end tag.
    Stopped,
    /// The runtime ended the stream on its own (end tag without a StopTracing from tracer).
    RuntimeEnded,
    /// The stream was cut without an end tag: the process exited or crashed.
    ProcessExited,
    /// After StopTracing the rest of the stream did not arrive within the drain timeout.
    DrainTimeout,
    /// The stream was corrupt; tracer stopped the session.
    DecodeError,
    /// Reading the socket failed.
    ReadError,
}

/// What a session task reports to the pipeline, in order: `Started`, any number of `Event`s,
/// then exactly one `Ended`; or a single `Failed` when no session could be started.
#[derive(Debug)]
pub enum SessionMessage {
    Started {
        pid: u32,
        session_id: u64,
        command: CommandCode,
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
        stats: NettraceStats,
        lost_by_thread: Vec<(u64, u64)>,
    },
    Failed {
        pid: u32,
        error: String,
        refused: bool,
    },
}

/// The JSON line of one runtime event: the common envelope, then the decoded event.
#[derive(Serialize)]
struct EventLine<'a> {
    ts: String,
    mono_ns: u64,
    kind: &'static str,
    source: &'static str,
    pid: u32,
    #[serde(flatten)]
    event: DecodedEvent<'a>,
}

/// Runs one session to its end, reporting through `out`. `stop` flips to true at shutdown.
pub async fn run(
    pid: u32,
    config: SessionConfig,
    clock: Clock,
    out: mpsc::Sender<SessionMessage>,
    mut stop: watch::Receiver<bool>,
) {
    let started = tokio::select! {
        r = start(pid, &config) => r,
        () = stopped(&mut stop) => return,
    };
    let (client, session_id, command, runtime, mut stream) = match started {
        Ok(s) => s,
        Err(e) => {
            let refused = matches!(&e, ClientError::Socket(s) if s.refusal().is_some());
            let _ = out.send(SessionMessage::Failed { pid, error: e.to_string(), refused }).await;
            return;
        }
    };
    if out.send(SessionMessage::Started { pid, session_id, command, runtime }).await.is_err() {
        return;
    }

    let mut parser = NettraceParser::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut lines = Vec::new();
    let mut drain_deadline: Option<Instant> = None;
    let mut detail = None;
    let reason = loop {
        let read = tokio::select! {
            r = stream.read(&mut buf) => r,
            () = stopped(&mut stop), if drain_deadline.is_none() => {
                if let Err(e) = client.stop_session(session_id).await {
                    log::warn!("pid {pid}: StopTracing failed: {e}");
                }
                drain_deadline = Some(Instant::now() + config.drain_timeout);
                continue;
            }
            _ = sleep_until_opt(drain_deadline) => break EndReason::DrainTimeout,
        };
        let n = match read {
            Ok(0) => break end_of_stream(&parser, drain_deadline.is_some(), &mut detail),
            Ok(n) => n,
            Err(e) => {
                detail = Some(e.to_string());
                break EndReason::ReadError;
            }
        };
        let fed = parser.feed(&buf[..n], |ev| {
            let decoded = ev.decode();
            let provider = decoded.provider.to_string();
            let line = EventLine {
                ts: clock.iso8601(ev.timestamp as u64),
                mono_ns: ev.timestamp as u64,
                kind: "dotnet_event",
                source: "nettrace",
                pid,
                event: decoded,
            };
            match serde_json::to_value(&line) {
                Ok(v) => lines.push((provider, v)),
                Err(e) => log::error!("pid {pid}: cannot serialize an event: {e}"),
            }
        });
        for (provider, line) in lines.drain(..) {
            if out.send(SessionMessage::Event { pid, provider, line }).await.is_err() {
                return;
            }
        }
        if let Err(e) = fed {
            detail = Some(e.to_string());
            // Leave the runtime healthy: end its session rather than just dropping the socket.
            if drain_deadline.is_none() {
                let _ = client.stop_session(session_id).await;
            }
            break EndReason::DecodeError;
        }
    };
    let _ = out
        .send(SessionMessage::Ended {
            pid,
            session_id,
            reason,
            detail,
            stats: parser.stats(),
            lost_by_thread: parser.lost_by_thread(),
        })
        .await;
}

type Started = (DiagnosticClient, u64, CommandCode, Option<ProcessInfo>, tokio::net::UnixStream);

async fn start(pid: u32, config: &SessionConfig) -> Result<Started, ClientError> {
    let client = locate(pid, config).await?;
    let runtime = match client.probe().await? {
        RuntimeInfo::Known { info, .. } => Some(info),
        RuntimeInfo::PreNet5 => None,
    };
    let command = oldest_collect_tracing(&config.request);
    let session = client.start_streaming_session(&command).await?;
    Ok((client, session.session_id, command.code(), runtime, session.stream))
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

fn end_of_stream(
    parser: &NettraceParser,
    stopping: bool,
    detail: &mut Option<String>,
) -> EndReason {
    match parser.finish() {
        Ok(()) if stopping => EndReason::Stopped,
        Ok(()) => EndReason::RuntimeEnded,
        Err(e) => {
            *detail = Some(e.to_string());
            EndReason::ProcessExited
        }
    }
}

/// Resolves once the pipeline asks sessions to stop (or is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard returned by wait_for is dropped here, before the caller's next await.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
