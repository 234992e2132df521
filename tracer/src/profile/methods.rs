//! Where a profiled runtime's methods are, from its own events (docs/protocol/profiling.md,
//! "Naming managed frames"): a streaming session that asks for the JIT and loader events at
//! verbose level — every method compiled while the profile runs, with its code's address, size
//! and name — and a rundown when it stops, which lists every method with code (those compiled
//! before tracer attached and ReadyToRun code too). Nothing is written into the target and no
//! environment variable or restart is needed.
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::sync::watch;
use tokio::time::Instant;
use tracer_decode::diagnostic_ipc::{
    DEFAULT_RUNDOWN_KEYWORD, FilteredProvider, ProcessInfo, TracingRequest, oldest_collect_tracing,
};
use tracer_decode::nettrace::NettraceParser;
use tracer_decode::nettrace::methods::MethodTable;

use crate::ipc::client::{ClientError, Timeouts};
use crate::ipc::providers::with_method_events;
use crate::ipc::socket::Target;
use crate::session::{LocateReport, SessionConfig, SessionMode, locate_and_probe};

/// What a method session gathered.
#[derive(Debug, Default)]
pub struct MethodCollection {
    pub table: MethodTable,
    /// The runtime as it described itself (None before .NET 5).
    pub runtime: Option<ProcessInfo>,
    /// Method and module events taken; those whose payload did not decode.
    pub events: u64,
    pub undecodable: u64,
    /// Whether the rundown's end came (the stream's end tag after StopTracing): without it,
    /// methods compiled before the session and not run since stay unnamed.
    pub rundown_complete: bool,
    /// Why the stream ended otherwise, when it did.
    pub error: Option<String>,
}

/// The request of a method session.
pub fn request() -> TracingRequest {
    // The runtime's method and module events only (`with_method_events`).
    let mut providers: Vec<FilteredProvider> = Vec::new();
    with_method_events(&mut providers);
    TracingRequest {
        circular_buffer_mb: 64,
        providers,
        rundown_keyword: DEFAULT_RUNDOWN_KEYWORD,
        // CollectTracing2 (every runtime since .NET Core 3.0) always walks stacks.
        request_stackwalk: true,
        buffering_mode: None,
    }
}

/// Runs a method session with `target`'s runtime until `stop` flips (or the process exits),
/// then stops it and reads the rundown, for at most `drain`.
pub async fn collect(
    target: &Target,
    timeouts: Timeouts,
    locate_for: Duration,
    drain: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<MethodCollection, ClientError> {
    let config = SessionConfig {
        request: request(),
        mode: SessionMode::Streaming,
        timeouts,
        locate_for,
        drain_timeout: drain,
        user_events_grant: Default::default(),
        nettrace_dir: None,
        stopping_event: None,
        meters: None,
    };
    let pid = target.pid();
    let report = |r: LocateReport| async move {
        if let LocateReport::Refused(path, refusal) = r {
            log::warn!("pid {pid}: refused {path:?} as its diagnostic socket: {refusal}");
        }
    };
    let (client, runtime) = locate_and_probe(target, &config, report).await?;
    let session = client.start_streaming_session(&oldest_collect_tracing(&config.request)).await?;
    let (session_id, mut stream) = (session.session_id, session.stream);
    let mut collected = MethodCollection { runtime, ..MethodCollection::default() };
    let mut parser = NettraceParser::default();
    let mut buf = vec![0u8; 64 * 1024];
    let stop_call = client.stop_session(session_id);
    tokio::pin!(stop_call);
    let exited = target.exited();
    tokio::pin!(exited);
    let (mut drain_deadline, mut stop_answered) = (None::<Instant>, false);
    loop {
        let read = tokio::select! {
            r = stream.read(&mut buf) => r,
            _ = stop.wait_for(|s| *s), if drain_deadline.is_none() => {
                drain_deadline = Some(Instant::now() + drain);
                continue;
            }
            // A runtime that exits sends no rundown: what its live events said is all.
            () = &mut exited, if drain_deadline.is_none() => {
                drain_deadline = Some(Instant::now() + drain);
                continue;
            }
            answer = &mut stop_call, if drain_deadline.is_some() && !stop_answered => {
                stop_answered = true;
                if let Err(e) = answer {
                    log::warn!("pid {pid}: StopTracing of its method session failed: {e}");
                }
                continue;
            }
            () = sleep_until(drain_deadline) => {
                collected.error = Some(format!("the rundown did not end within {drain:?}"));
                break;
            }
        };
        let n = match read {
            Ok(0) => {
                match parser.finish() {
                    Ok(()) => collected.rundown_complete = drain_deadline.is_some(),
                    Err(e) => collected.error = Some(e.to_string()),
                }
                break;
            }
            Ok(n) => n,
            Err(e) => {
                collected.error = Some(format!("reading the method session: {e}"));
                break;
            }
        };
        let fed = parser.feed(&buf[..n], |ev| {
            let (meta, time) = (ev.metadata, ev.timestamp as u64);
            let Some(decoded) =
                collected.table.take_event(&meta.provider, meta.event_id, ev.payload, time)
            else {
                return;
            };
            collected.events += 1;
            collected.undecodable += u64::from(decoded.is_err());
        });
        if let Err(e) = fed {
            collected.error = Some(e.to_string());
            break;
        }
    }
    if !collected.rundown_complete {
        log::warn!(
            "pid {pid}: method session ended without its rundown ({}): frames of methods \
             compiled before it stay unnamed",
            collected.error.as_deref().unwrap_or("stream ended")
        );
    }
    Ok(collected)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
