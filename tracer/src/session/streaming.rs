//! A streaming session: the runtime writes nettrace on the diagnostic socket after its reply.
//! Stopping sends StopTracing on a new connection while the stream keeps being read (a runtime
//! blocked on a full socket would not answer it), then drains the rest of the stream (rundown,
//! end tag) within the drain timeout; bytes still unread at that deadline are counted.
//!
//! Events of providers the session did not ask for are dropped and counted, not decoded.
//!
//! An event that carries a stack gets its frames named (`stack`) from the stream's own method
//! and module events (the session's [`MethodTable`]), each frame by the method whose code
//! covered its address at the event's time, else as its address: only methods whose events the
//! session asked for are named (docs/protocol/nettrace.md §4.6).
//!
//! Bounded by what the peer sends (docs/security.md): the lines written for a session cost at
//! most [`tracer_decode::budget::OUTPUT_BYTES_PER_INPUT_BYTE`] per byte it sent plus
//! [`tracer_decode::budget::OUTPUT_ALLOWANCE_BYTES`]; lines are handed on in batches (at
//! [`super::EVENT_LINES_BATCH_BYTES`] and at the end of each read, `try_send`), and only while
//! the pipeline is behind are they held, at most
//! [`MAX_PENDING_LINE_BYTES`] per session and [`MAX_TOTAL_PENDING_LINE_BYTES`] over all sessions;
//! the metadata tables hold at most [`tracer_decode::nettrace::MAX_METADATA_BYTES`] per session,
//! the stack and method tables theirs ([`tracer_decode::nettrace::stacks`],
//! [`tracer_decode::nettrace::methods::MAX_METHOD_TABLE_BYTES`]), and all of these together
//! [`MAX_TOTAL_TABLE_BYTES`] over all sessions. A session past any of these ends with
//! [`EndReason::BudgetExceeded`]. Named stacks are spent from a budget of their own
//! ([`OutputBudget::for_stacks`]): past it, lines are written without their `stack` (counted).
use std::os::fd::AsRawFd as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::AsyncReadExt as _;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::Instant;

use tracer_decode::budget::OutputBudget;
use tracer_decode::diagnostic_ipc::{
    BufferingMode, COLLECT_TRACING4_MAJOR, COLLECT_TRACING6_MAJOR, CommandCode, ProcessInfo,
    ServerError, collect_tracing_for, oldest_collect_tracing, rundown_mask_unsupported,
};
use tracer_decode::nettrace::methods::MethodTable;
use tracer_decode::nettrace::runtime_events::{EVENTPIPE_PROVIDER, RUNDOWN_PROVIDER};
use tracer_decode::nettrace::stacks::NamedStack;
use tracer_decode::nettrace::{NettraceError, NettraceParser};

use super::inbox::Bell;
use super::nettrace_file::NettraceFile;
use super::{
    EVENT_LINES_BATCH_BYTES, EndReason, EventLines, EventOrigin, SessionContext, SessionEnd,
    SessionMessage, SessionMode, StreamEnd, stopped,
};
use crate::ipc::client::DiagnosticClient;
use crate::ipc::socket::Target;
use crate::output::Source;

/// Rendered lines one session may hold while the pipeline is behind.
pub const MAX_PENDING_LINE_BYTES: usize = 8 << 20;
/// Rendered lines all streaming sessions together may hold while the pipeline is behind.
pub const MAX_TOTAL_PENDING_LINE_BYTES: usize = 64 << 20;
/// Bytes of the metadata, stack and method tables of all streaming sessions together (each
/// session's are bounded on their own).
pub const MAX_TOTAL_TABLE_BYTES: usize = 256 << 20;

static PENDING_LINE_BYTES: AtomicUsize = AtomicUsize::new(0);
static TABLE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A session's share of a process-wide byte gauge, given back when dropped.
struct Share {
    gauge: &'static AtomicUsize,
    max: usize,
    held: usize,
}

impl Share {
    fn new(gauge: &'static AtomicUsize, max: usize) -> Share {
        Share { gauge, max, held: 0 }
    }

    /// Takes `bytes` more, or nothing when the gauge would pass its maximum.
    fn take(&mut self, bytes: usize) -> bool {
        let before = self.gauge.fetch_add(bytes, Ordering::Relaxed);
        if before.saturating_add(bytes) > self.max {
            self.gauge.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        self.held += bytes;
        true
    }

    fn release_all(&mut self) {
        self.gauge.fetch_sub(std::mem::take(&mut self.held), Ordering::Relaxed);
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// Where a session's lines go: to the pipeline at once, unless it is behind; then held (in
/// order, within [`MAX_PENDING_LINE_BYTES`] and the session's share of
/// [`MAX_TOTAL_PENDING_LINE_BYTES`]) until the read's events are all decoded. A full batch, or
/// a full channel, rings the pipeline's bell: a burst is taken at once.
struct Outbox<'o> {
    out: &'o mpsc::Sender<SessionMessage>,
    bell: &'o Bell,
    held: Vec<EventLines>,
    share: Share,
    /// The pipeline is gone: the session ends.
    closed: bool,
}

impl Outbox<'_> {
    /// Hands `lines` on, or holds them; `Err` says why they could be neither (then they are
    /// dropped: the session ends over budget).
    fn offer(&mut self, mut lines: EventLines) -> Result<(), String> {
        let len = lines.lines.len_bytes();
        if self.held.is_empty() {
            match self.out.try_send(SessionMessage::Events(lines)) {
                Ok(()) => {
                    if len >= EVENT_LINES_BATCH_BYTES {
                        self.bell.ring();
                    }
                    return Ok(());
                }
                Err(TrySendError::Closed(_)) => {
                    self.closed = true;
                    return Ok(());
                }
                Err(TrySendError::Full(SessionMessage::Events(back))) => lines = back,
                Err(TrySendError::Full(_)) => unreachable!("Events were sent"),
            }
        }
        self.bell.ring();
        if self.share.held + len > MAX_PENDING_LINE_BYTES || !self.share.take(len) {
            return Err(format!(
                "{} bytes of lines held while the pipeline is behind (at most {} per session, \
                 {} in total)",
                self.share.held + len,
                MAX_PENDING_LINE_BYTES,
                MAX_TOTAL_PENDING_LINE_BYTES
            ));
        }
        self.held.push(lines);
        Ok(())
    }

    /// Sends what is held, waiting for the pipeline; `Err` once it is gone.
    async fn send_held(&mut self) -> Result<(), ()> {
        for lines in self.held.drain(..) {
            if self.out.send(SessionMessage::Events(lines)).await.is_err() {
                self.closed = true;
                return Err(());
            }
        }
        self.share.release_all();
        Ok(())
    }
}

pub(super) async fn run(
    target: &Target,
    client: DiagnosticClient,
    runtime: Option<ProcessInfo>,
    ctx: SessionContext,
) {
    let SessionContext { config, clock, out, bell, mut stop, labels, line_extras, .. } = ctx;
    let (pid, process) = (target.pid(), target.incarnation());
    let labels = labels.get(pid);
    let major = runtime.as_ref().and_then(ProcessInfo::major_version);
    let (request, meter_session) = config.request_for(pid, major);
    let mut command = match collect_tracing_for(&request, major) {
        Ok(command) => command,
        Err(e) => {
            let _ = out
                .send(SessionMessage::Failed { process, error: e.to_string(), refused: false })
                .await;
            return;
        }
    };
    if rundown_mask_unsupported(&request, major) {
        log::info!(
            "pid {pid}: runtime {} has no CollectTracing4 (.NET {COLLECT_TRACING4_MAJOR}+) for a \
             rundown keyword mask: the session runs without rundown",
            runtime.as_ref().and_then(|r| r.clr_product_version.as_deref()).unwrap_or("< 6.0"),
        );
    }
    if request.buffering_mode.is_some() && command.code() != CommandCode::CollectTracing6 {
        log::info!(
            "pid {pid}: runtime {} has no CollectTracing6 (.NET {COLLECT_TRACING6_MAJOR}+): a \
             {} session with the runtime's usual dropping buffers",
            runtime.as_ref().and_then(|r| r.clr_product_version.as_deref()).unwrap_or("< 6.0"),
            command.code()
        );
    }
    let mut started = client.start_streaming_session(&command).await;
    // A runtime reporting 11+ that still lacks the command: with `drop`, nothing is lost by
    // falling back.
    if let Err(e) = &started
        && e.server_error() == Some(ServerError::UnknownCommand)
        && request.buffering_mode == Some(BufferingMode::Drop)
    {
        command = oldest_collect_tracing(&request);
        log::info!("pid {pid}: CollectTracing6 is unknown to the runtime: {}", command.code());
        started = client.start_streaming_session(&command).await;
    }
    let session = match started {
        Ok(s) => s,
        Err(e) => return super::report_failure(process, e, &out).await,
    };
    let (session_id, mut stream) = (session.session_id, session.stream);
    let origin = EventOrigin { process, session_id };
    let started = SessionMessage::Started {
        process,
        session_id,
        command: command.code(),
        mode: SessionMode::Streaming,
        runtime,
        providers: request.providers.iter().map(|p| p.provider.clone()).collect(),
    };
    if out.send(started).await.is_err() {
        return;
    }

    // EventPipe's own ProcessInfo event comes with every session, and a rundown (asked for by
    // keyword, not by provider) from a provider of its own (docs/protocol/runtime-events.md).
    let mut requested: Vec<&str> =
        request.providers.iter().map(|p| p.provider.name.as_str()).collect();
    requested.push(EVENTPIPE_PROVIDER);
    if request.rundown_keyword != 0 {
        requested.push(RUNDOWN_PROVIDER);
    }
    let mut unrequested = 0u64;
    let mut parser = NettraceParser::default();
    let mut budget = OutputBudget::default();
    let (mut methods, mut named) = (MethodTable::default(), NamedStack::default());
    let mut stack_budget = OutputBudget::for_stacks();
    let mut stacks_unwritten = 0u64;
    let mut outbox = Outbox {
        out: &out,
        bell: &bell,
        held: Vec::new(),
        share: Share::new(&PENDING_LINE_BYTES, MAX_TOTAL_PENDING_LINE_BYTES),
        closed: false,
    };
    let mut table_share = Share::new(&TABLE_BYTES, MAX_TOTAL_TABLE_BYTES);
    let mut buf = vec![0u8; 64 * 1024];
    // One batch for the session's reads: handed on when full and at the end of a read that
    // rendered lines, so a read without lines allocates nothing.
    let mut lines = EventLines::for_meter_session(line_extras, meter_session);
    let mut file = config
        .nettrace_dir
        .as_deref()
        .map(|dir| NettraceFile::create(dir, pid, session_id, &clock));
    let mut drain_deadline: Option<Instant> = None;
    // Polled only once a stop was asked for, side by side with the reads.
    let stop_call = client.stop_session(session_id);
    tokio::pin!(stop_call);
    let mut stop_answered = false;
    let mut stop_error = None;
    let mut detail = None;
    let mut unwritten_events = 0;
    // A runtime starts its stream (the nettrace header) at once; a peer that does not is dropped.
    let mut start_deadline = Some(Instant::now() + config.timeouts.read);
    // `--stopping-event`: set once an event matched (the session then stops like on Ctrl-C).
    let mut stopping_matched = false;
    // Resolves when the pinned process exits: its lines must not go on with a stream that may
    // now come from another process (a listener handed on; docs/security.md, "Peer identity").
    let exited = target.exited();
    tokio::pin!(exited);
    let mut exit_seen = false;
    let mut bytes_after_exit = 0;
    let reason = loop {
        let read = tokio::select! {
            r = stream.read(&mut buf) => r,
            () = &mut exited, if !exit_seen => match after_exit(&stream) {
                // The connection's last holder closed it: the process's own, at its exit. The
                // bytes queued before that are its stream: read on to the end.
                AfterExit::PeerClosed => {
                    exit_seen = true;
                    continue;
                }
                AfterExit::StillOpen(queued) => {
                    bytes_after_exit = queued;
                    detail = Some(format!(
                        "the process exited while another process held its session's \
                         connection open: {queued} bytes queued then were not decoded"
                    ));
                    log::warn!("pid {pid}: {}", detail.as_deref().unwrap_or_default());
                    cut(&stream);
                    break EndReason::ProcessExited;
                }
            },
            () = crate::time::sleep_until_opt(start_deadline) => break EndReason::StreamNotStarted,
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
            () = crate::time::sleep_until_opt(drain_deadline) => break EndReason::DrainTimeout,
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
        if let Some(file) = &mut file {
            file.write(&buf[..n]);
        }
        budget.earn(n as u64);
        stack_budget.earn(n as u64);
        let mut over: Option<String> = None;
        let mut not_written = 0u64;
        let fed = parser.feed(&buf[..n], |ev| {
            if over.is_some() || outbox.closed {
                not_written += 1;
                return;
            }
            if !requested.iter().any(|p| super::is_provider(p, &ev.metadata.provider)) {
                unrequested += 1;
                return;
            }
            let time = ev.timestamp as u64;
            // The stream's own method events name its stacks' frames.
            methods.take_event(&ev.metadata.provider, ev.metadata.event_id, ev.payload, time);
            let mut event = ev.output();
            let mut stack_bytes = 0;
            if let Some(ips) = ev.stack {
                if named.name_within(&mut stack_budget, ips, time, &mut methods) {
                    event.stack = Some(&named);
                    stack_bytes = named.member_len();
                } else {
                    stacks_unwritten += 1;
                }
            }
            if !stopping_matched
                && config.stopping_event.as_ref().is_some_and(|s| s.matches(&event))
            {
                stopping_matched = true;
            }
            let spend = |len: usize| match budget.spend((len - stack_bytes) as u64) {
                Ok(()) => true,
                Err(e) => {
                    over = Some(e.to_string());
                    false
                }
            };
            if !lines.push_if(&clock, Source::Nettrace, origin, labels.as_ref(), event, spend) {
                not_written += 1;
                return;
            }
            if lines.lines.len_bytes() >= EVENT_LINES_BATCH_BYTES {
                let full = lines.take();
                let count = full.lines.lines();
                if let Err(why) = outbox.offer(full) {
                    over = Some(why);
                    not_written += count;
                }
            }
        });
        let count = lines.lines.lines();
        if count > 0
            && let Err(why) = outbox.offer(lines.take())
        {
            over = over.or(Some(why));
            not_written += count;
        }
        if outbox.closed || outbox.send_held().await.is_err() {
            return;
        }
        if stopping_matched && drain_deadline.is_none() {
            log::info!("pid {pid}: the stopping event arrived: stopping the session");
            drain_deadline = Some(Instant::now() + config.drain_timeout);
        }
        let tables = parser.metadata_bytes() + parser.stack_bytes() + methods.heap_bytes();
        if tables > table_share.held && !table_share.take(tables - table_share.held) {
            over = over.or(Some(format!(
                "metadata, stack and method tables of all sessions would pass \
                 {MAX_TOTAL_TABLE_BYTES} bytes"
            )));
        }
        if let Some(why) = over {
            let unread =
                if drain_deadline.is_none() { "; the rest of the stream unread" } else { "" };
            detail = Some(format!("{why}; {not_written} decoded events not written{unread}"));
            unwritten_events = not_written;
            log::warn!("pid {pid}: session ended: {}", detail.as_deref().unwrap_or_default());
            cut(&stream);
            if drain_deadline.is_none() {
                let _ = client.stop_session(session_id).await;
            }
            break EndReason::BudgetExceeded;
        }
        if let Err(e) = fed {
            detail = Some(e.to_string());
            // Leave the runtime healthy: end its session rather than just dropping the socket.
            cut(&stream);
            if drain_deadline.is_none() {
                let _ = client.stop_session(session_id).await;
            }
            if matches!(e, NettraceError::MetadataBudget { .. }) {
                break EndReason::BudgetExceeded;
            }
            break EndReason::DecodeError;
        }
    };
    let reason = if reason == EndReason::Stopped && stopping_matched {
        EndReason::StoppingEvent
    } else {
        reason
    };
    let unread_bytes = if reason == EndReason::DrainTimeout { pending_bytes(&stream) } else { 0 };
    let end = Some(SessionEnd::Stream(StreamEnd {
        stats: parser.stats(),
        lost_by_thread: parser.lost_by_thread(),
        unrequested_events: unrequested,
        unread_bytes,
        bytes_after_exit,
        unwritten_events,
        stacks_unwritten,
        stop_error,
        // The end tag arrived only when the session ended this way.
        file: file
            .map(|f| f.finish(matches!(reason, EndReason::Stopped | EndReason::RuntimeEnded))),
    }));
    let _ = out.send(SessionMessage::Ended { process, session_id, reason, detail, end }).await;
}

/// What a session's connection holds once its process has exited.
enum AfterExit {
    /// The peer has closed it: every byte queued was written before that.
    PeerClosed,
    /// Another process still holds it open; this many bytes are queued (and not decoded).
    StillOpen(u64),
}

/// Whether the peer of `stream` has closed it (`POLLRDHUP`), else the bytes queued on it.
fn after_exit(stream: &tokio::net::UnixStream) -> AfterExit {
    let mut entry = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one valid pollfd, borrowed for the call; a timeout of 0 never blocks.
    let ready = unsafe { libc::poll(&mut entry, 1, 0) };
    if ready > 0 && entry.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0 {
        AfterExit::PeerClosed
    } else {
        AfterExit::StillOpen(pending_bytes(stream))
    }
}

/// Makes the runtime's further writes into the stream fail (EPIPE) at once: tracer reads no more
/// of it, and a runtime blocked writing into the full socket would not answer StopTracing
/// (it waits for its streaming thread) until the IPC timeout.
fn cut(stream: &tokio::net::UnixStream) {
    // SAFETY: shutdown(2) on the socket the stream owns (borrowed, open); no memory is passed.
    unsafe { libc::shutdown(stream.as_raw_fd(), libc::SHUT_RDWR) };
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::output::{FieldMap, Kind, Line, Pid};
    use crate::session::inbox::{CAPACITY, Inbox, LOOK_INTERVAL};
    use crate::time::Clock;

    /// Lines of at least `bytes`.
    fn lines_of(bytes: usize) -> EventLines {
        let clock = Clock::new();
        let line = Line::new(
            &clock,
            0,
            Kind::Summary,
            Source::Tracer,
            Pid::NotApplicable,
            FieldMap::default(),
        );
        let mut lines = EventLines::default();
        while lines.lines.len_bytes() < bytes {
            lines.lines.push_if(&line, &clock, |_| true);
        }
        lines
    }

    fn failed() -> SessionMessage {
        let process = crate::output::Incarnation::new(1, None);
        SessionMessage::Failed { process, error: String::new(), refused: false }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_or_a_full_channel_rings_the_pipeline_at_once() {
        static HELD: AtomicUsize = AtomicUsize::new(0);
        let (mut inbox, out, bell) = Inbox::new();
        let mut outbox = Outbox {
            out: &out,
            bell: &bell,
            held: Vec::new(),
            share: Share::new(&HELD, MAX_TOTAL_PENDING_LINE_BYTES),
            closed: false,
        };
        // The end of a read: a few lines, taken at the pipeline's next round.
        assert!(inbox.try_recv().is_none(), "the round's look finds nothing");
        let start = Instant::now();
        outbox.offer(lines_of(1)).unwrap();
        assert!(matches!(inbox.recv().await, Some(SessionMessage::Events(_))));
        assert_eq!(start.elapsed(), LOOK_INTERVAL);
        // A full batch: at once.
        assert!(inbox.try_recv().is_none());
        let start = Instant::now();
        outbox.offer(lines_of(EVENT_LINES_BATCH_BYTES)).unwrap();
        assert!(matches!(inbox.recv().await, Some(SessionMessage::Events(_))));
        assert_eq!(start.elapsed(), Duration::ZERO);
        // A full channel: the lines are held, and the pipeline is rung.
        assert!(inbox.try_recv().is_none());
        for _ in 0..CAPACITY {
            out.try_send(failed()).unwrap();
        }
        let start = Instant::now();
        outbox.offer(lines_of(1)).unwrap();
        assert_eq!((outbox.held.len(), HELD.load(Ordering::Relaxed) > 0), (1, true));
        assert!(matches!(inbox.recv().await, Some(SessionMessage::Failed { .. })));
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
