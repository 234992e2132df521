//! A streaming session: the runtime writes nettrace on the diagnostic socket after its reply.
//! Stopping sends StopTracing on a new connection, then drains the rest of the stream (rundown,
//! end tag) within the drain timeout.
use tokio::io::AsyncReadExt as _;
use tokio::time::Instant;

use tracer_decode::diagnostic_ipc::{ProcessInfo, oldest_collect_tracing};
use tracer_decode::nettrace::NettraceParser;

use super::{EndReason, EventLine, SessionContext, SessionMessage, SessionMode, stopped};
use crate::ipc::client::DiagnosticClient;
use crate::output::{self, Source};

pub(super) async fn run(
    pid: u32,
    client: DiagnosticClient,
    runtime: Option<ProcessInfo>,
    ctx: SessionContext,
) {
    let SessionContext { config, clock, out, mut stop, labels, .. } = ctx;
    let labels = labels.get(pid);
    let command = oldest_collect_tracing(&config.request);
    let session = match client.start_streaming_session(&command).await {
        Ok(s) => s,
        Err(e) => return super::report_failure(pid, e, &out).await,
    };
    let (session_id, mut stream) = (session.session_id, session.stream);
    let started = SessionMessage::Started {
        pid,
        session_id,
        command: command.code(),
        mode: SessionMode::Streaming,
        runtime,
    };
    if out.send(started).await.is_err() {
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
            () = sleep_until_opt(drain_deadline) => break EndReason::DrainTimeout,
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
            let mono_ns = ev.timestamp as u64;
            let line = output::dotnet_event(&clock, mono_ns, Source::Nettrace, pid, decoded)
                .with_labels(labels.clone());
            lines.push(EventLine { pid, provider, line: line.render() });
        });
        for event in lines.drain(..) {
            if out.send(SessionMessage::Event(event)).await.is_err() {
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
    let stream = Some((parser.stats(), parser.lost_by_thread()));
    let _ = out.send(SessionMessage::Ended { pid, session_id, reason, detail, stream }).await;
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

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
