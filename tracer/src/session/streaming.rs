//! A streaming session: the runtime writes nettrace on the diagnostic socket after its reply.
//! Stopping sends StopTracing on a new connection while the stream keeps being read (a runtime
//! blocked on a full socket would not answer it), then drains the rest of the stream (rundown,
//! end tag) within the drain timeout; bytes still unread at that deadline are counted.
//!
//! Events of providers the session did not ask for are dropped and counted, not decoded.
use tokio::io::AsyncReadExt as _;
use tokio::time::Instant;

use tracer_decode::diagnostic_ipc::{ProcessInfo, oldest_collect_tracing};
use tracer_decode::nettrace::NettraceParser;

use std::os::fd::AsRawFd as _;

use super::{
    EndReason, EventLine, SessionContext, SessionMessage, SessionMode, StreamEnd, stopped,
};
use crate::ipc::client::DiagnosticClient;
use crate::output::{self, Source};

pub(super) async fn run(
    pid: u32,
    client: DiagnosticClient,
    runtime: Option<ProcessInfo>,
    ctx: SessionContext,
) {
    let SessionContext { config, clock, out, mut stop, .. } = ctx;
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

    let requested: Vec<&str> =
        config.request.providers.iter().map(|p| p.provider.name.as_str()).collect();
    let mut unrequested = 0u64;
    let mut parser = NettraceParser::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut lines = Vec::new();
    let mut drain_deadline: Option<Instant> = None;
    // Polled only once a stop was asked for, side by side with the reads.
    let stop_call = client.stop_session(session_id);
    tokio::pin!(stop_call);
    let mut stop_answered = false;
    let mut stop_error = None;
    let mut detail = None;
    // A runtime starts its stream (the nettrace header) at once; a peer that does not is dropped.
    let mut start_deadline = Some(Instant::now() + config.timeouts.read);
    let reason = loop {
        let read = tokio::select! {
            r = stream.read(&mut buf) => r,
            () = sleep_until_opt(start_deadline) => break EndReason::StreamNotStarted,
            () = stopped(&mut stop), if drain_deadline.is_none() => {
                drain_deadline = Some(Instant::now() + config.drain_timeout);
                continue;
            }
            answer = &mut stop_call, if drain_deadline.is_some() && !stop_answered => {
                stop_answered = true;
                if let Err(e) = answer {
                    log::warn!("pid {pid}: StopTracing failed: {e}");
                    stop_error = Some(e.to_string());
                }
                continue;
            }
            () = sleep_until_opt(drain_deadline) => break EndReason::DrainTimeout,
        };
        let n = match read {
            Ok(0) => break end_of_stream(&parser, drain_deadline.is_some(), &mut detail),
            Ok(n) => {
                start_deadline = None;
                n
            }
            Err(e) => {
                detail = Some(e.to_string());
                break EndReason::ReadError;
            }
        };
        let fed = parser.feed(&buf[..n], |ev| {
            // EventPipe matches provider names without regard to case.
            if !requested.iter().any(|p| p.eq_ignore_ascii_case(&ev.metadata.provider)) {
                unrequested += 1;
                return;
            }
            let decoded = ev.decode();
            let provider = decoded.provider.to_string();
            let mono_ns = ev.timestamp as u64;
            let line = output::dotnet_event(&clock, mono_ns, Source::Nettrace, pid, decoded);
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
    let unread_bytes = if reason == EndReason::DrainTimeout { pending_bytes(&stream) } else { 0 };
    let stream = Some(StreamEnd {
        stats: parser.stats(),
        lost_by_thread: parser.lost_by_thread(),
        unrequested_events: unrequested,
        unread_bytes,
        stop_error,
    });
    let _ = out.send(SessionMessage::Ended { pid, session_id, reason, detail, stream }).await;
}

/// Bytes the runtime sent that are still queued on the socket (FIONREAD).
fn pending_bytes(stream: &tokio::net::UnixStream) -> u64 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the valid pointer; the fd is open (borrowed).
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc < 0 { 0 } else { n as u64 }
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
