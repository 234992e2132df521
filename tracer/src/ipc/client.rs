//! Thin async client for a runtime's diagnostic server: one command per connection, the whole
//! message in one write, every step bounded by a timeout (the runtime's server is single-threaded
//! and never times out on its own, docs/protocol/diagnostic-ipc.md §2.5 item 2), replies decoded by
//! [`tracer_decode::diagnostic_ipc`].

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::ipc::socket::{self, DiagnosticSocket, SocketError, VerifiedStream};
use tracer_decode::diagnostic_ipc::{
    CollectTracing, CommandCode, DecodeError, EncodeError, HEADER_LEN, ProcessInfo, Reply, Request,
    ServerError, UserEventsProvider,
};

/// Client-side limits for each step of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub write: Duration,
    /// For each read of the reply (header, then payload).
    pub read: Duration,
}

impl Default for Timeouts {
    /// 5 s each, as Microsoft's record-trace settled on after runtime hangs
    /// (docs/protocol/diagnostic-ipc.md §2.6).
    fn default() -> Self {
        let five = Duration::from_secs(5);
        Timeouts { connect: five, write: five, read: five }
    }
}

/// The step a command failed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    WriteRequest,
    SendFd,
    ReadReplyHeader,
    ReadReplyPayload,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::WriteRequest => "while writing the request",
            Phase::SendFd => "while passing the fd",
            Phase::ReadReplyHeader => "while reading the reply header",
            Phase::ReadReplyPayload => "while reading the reply payload",
        })
    }
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The socket was still missing or not listening when the locate window ended.
    #[error("{source} (still so after the {waited:?} locate window)")]
    NotReady {
        waited: Duration,
        #[source]
        source: Box<ClientError>,
    },
    #[error("cannot encode {command}: {source}")]
    Encode {
        command: CommandCode,
        #[source]
        source: EncodeError,
    },
    #[error("pid {pid}: {command} timed out after {timeout:?} {phase} (runtime hung?)")]
    Timeout { pid: u32, command: CommandCode, phase: Phase, timeout: Duration },
    #[error("pid {pid}: {command} failed {phase}: {source}")]
    Io {
        pid: u32,
        command: CommandCode,
        phase: Phase,
        #[source]
        source: io::Error,
    },
    #[error(
        "pid {pid}: connection closed {phase} of {command} after {received} of {expected} bytes"
    )]
    Closed { pid: u32, command: CommandCode, phase: Phase, received: usize, expected: usize },
    #[error("pid {pid}: invalid reply to {command}: {source}")]
    Decode {
        pid: u32,
        command: CommandCode,
        #[source]
        source: DecodeError,
    },
    #[error("pid {pid}: runtime refused {command}: {error}{}", message.as_ref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Server { pid: u32, command: CommandCode, error: ServerError, message: Option<String> },
    #[error(
        "a CollectTracing5 user_events session needs the user_events_data fd: use \
         start_user_events_session"
    )]
    NeedsUserEventsFd,
    #[error("pid {pid}: StopTracing for session {sent:#x} was answered for session {echoed:#x}")]
    StopMismatch { pid: u32, sent: u64, echoed: u64 },
}

impl ClientError {
    /// The runtime's refusal, if that is what this is.
    pub fn server_error(&self) -> Option<ServerError> {
        match self {
            ClientError::Server { error, .. } => Some(*error),
            _ => None,
        }
    }
}

/// What the version probe found (ProcessInfo3 → ProcessInfo2 → ProcessInfo,
/// docs/protocol/diagnostic-ipc.md §3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeInfo {
    /// `answered_by` is the newest ProcessInfo command the runtime knew.
    Known { info: ProcessInfo, answered_by: CommandCode },
    /// Every ProcessInfo is an unknown command: .NET Core 3.x. CollectTracing2 still works.
    PreNet5,
}

/// A streaming session: the nettrace stream follows on `stream` until StopTracing.
#[derive(Debug)]
pub struct StreamingSession {
    pub session_id: u64,
    pub stream: UnixStream,
}

/// A user_events session: the runtime keeps it while `stream` stays open
/// (docs/protocol/diagnostic-ipc.md §4.2 step 8).
#[derive(Debug)]
pub struct UserEventsSession {
    pub session_id: u64,
    pub stream: UnixStream,
}

/// Talks to one process's diagnostic socket, one connection per command.
#[derive(Debug, Clone)]
pub struct DiagnosticClient {
    socket: DiagnosticSocket,
    timeouts: Timeouts,
}

impl DiagnosticClient {
    pub fn new(socket: DiagnosticSocket, timeouts: Timeouts) -> DiagnosticClient {
        DiagnosticClient { socket, timeouts }
    }

    /// Locates the socket of `host_pid` (see [`socket::locate`]).
    pub fn for_pid(host_pid: u32, timeouts: Timeouts) -> Result<DiagnosticClient, ClientError> {
        Ok(DiagnosticClient::new(socket::locate(host_pid)?, timeouts))
    }

    pub fn socket(&self) -> &DiagnosticSocket {
        &self.socket
    }

    fn pid(&self) -> u32 {
        self.socket.host_pid
    }

    /// Sends `request` on a new verified connection and returns its OK reply together with the
    /// connection (positioned right after the reply). Error replies become [`ClientError::Server`].
    pub async fn exchange(
        &self,
        request: &Request,
    ) -> Result<(Reply, VerifiedStream), ClientError> {
        let message = self.encode(request)?;
        let mut stream = socket::connect(&self.socket, self.timeouts.connect).await?;
        self.write(&mut stream, request.code(), &message).await?;
        let reply = self.read_reply(&mut stream, request.code()).await?;
        Ok((reply, stream))
    }

    /// Sends a command whose reply ends the conversation.
    pub async fn send(&self, request: &Request) -> Result<Reply, ClientError> {
        self.exchange(request).await.map(|(reply, _)| reply)
    }

    /// ProcessInfo3 → ProcessInfo2 → ProcessInfo; an unknown command falls back to the older one.
    pub async fn probe(&self) -> Result<RuntimeInfo, ClientError> {
        for request in [Request::ProcessInfo3, Request::ProcessInfo2, Request::ProcessInfo] {
            match self.send(&request).await {
                Ok(Reply::ProcessInfo(info)) => {
                    return Ok(RuntimeInfo::Known { info, answered_by: request.code() });
                }
                Ok(other) => unreachable!("decoder returned {other:?} for a ProcessInfo shape"),
                Err(e) if is_version_refusal(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(RuntimeInfo::PreNet5)
    }

    /// Starts a streaming session (CollectTracing1–4 or CollectTracing5 with session_type 0).
    pub async fn start_streaming_session(
        &self,
        command: &CollectTracing,
    ) -> Result<StreamingSession, ClientError> {
        if !command.streams_nettrace() {
            return Err(ClientError::NeedsUserEventsFd);
        }
        let request = Request::CollectTracing(command.clone());
        let (reply, stream) = self.exchange(&request).await?;
        Ok(StreamingSession { session_id: expect_session_id(reply), stream: stream.into_inner() })
    }

    /// Stops a session with StopTracing on a new connection (the session's own socket only
    /// carries its stream, docs/protocol/diagnostic-ipc.md §2.5 item 1).
    pub async fn stop_session(&self, session_id: u64) -> Result<(), ClientError> {
        let echoed = expect_session_id(self.send(&Request::StopTracing { session_id }).await?);
        if echoed != session_id {
            return Err(ClientError::StopMismatch { pid: self.pid(), sent: session_id, echoed });
        }
        Ok(())
    }

    /// Starts a CollectTracing5 user_events session: writes the message, then passes
    /// `user_events_data` as SCM_RIGHTS on one extra byte — only over a [`VerifiedStream`] — then
    /// reads the reply (the runtime's order, docs/protocol/diagnostic-ipc.md §4.2). The returned
    /// stream must stay open for the session's lifetime; closing it ends the session.
    pub async fn start_user_events_session(
        &self,
        rundown_keyword: u64,
        providers: &[UserEventsProvider],
        user_events_data: BorrowedFd<'_>,
    ) -> Result<UserEventsSession, ClientError> {
        let request = Request::CollectTracing(CollectTracing::V5UserEvents {
            rundown_keyword,
            providers: providers.to_vec(),
        });
        let code = request.code();
        let message = self.encode(&request)?;
        let mut stream = socket::connect(&self.socket, self.timeouts.connect).await?;
        self.write(&mut stream, code, &message).await?;
        stream
            .send_fd(user_events_data, self.timeouts.write)
            .await
            .map_err(|source| self.io_error(code, Phase::SendFd, source, self.timeouts.write))?;
        let reply = self.read_reply(&mut stream, code).await?;
        Ok(UserEventsSession { session_id: expect_session_id(reply), stream: stream.into_inner() })
    }

    fn encode(&self, request: &Request) -> Result<Vec<u8>, ClientError> {
        request.encode().map_err(|source| ClientError::Encode { command: request.code(), source })
    }

    async fn write(
        &self,
        stream: &mut VerifiedStream,
        command: CommandCode,
        message: &[u8],
    ) -> Result<(), ClientError> {
        let timeout = self.timeouts.write;
        match tokio::time::timeout(timeout, stream.stream_mut().write_all(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(self.io_error(command, Phase::WriteRequest, source, timeout)),
            Err(_) => Err(self.timeout(command, Phase::WriteRequest, timeout)),
        }
    }

    /// Reads exactly the 20-byte header, validates it against the expected reply, then exactly
    /// `size - 20` bytes (at most 65515: the size is a u16).
    async fn read_reply(
        &self,
        stream: &mut VerifiedStream,
        command: CommandCode,
    ) -> Result<Reply, ClientError> {
        let shape = command.reply_shape();
        let mut message = vec![0u8; HEADER_LEN];
        self.read_exact(stream, command, Phase::ReadReplyHeader, &mut message).await?;
        let header = tracer_decode::diagnostic_ipc::decode_reply_header(shape, &message)
            .map_err(|source| ClientError::Decode { pid: self.pid(), command, source })?;
        message.resize(usize::from(header.size), 0);
        self.read_exact(stream, command, Phase::ReadReplyPayload, &mut message[HEADER_LEN..])
            .await?;
        match tracer_decode::diagnostic_ipc::decode_reply(shape, &message) {
            Ok(Reply::Error { error, message }) => {
                Err(ClientError::Server { pid: self.pid(), command, error, message })
            }
            Ok(reply) => Ok(reply),
            Err(source) => Err(ClientError::Decode { pid: self.pid(), command, source }),
        }
    }

    async fn read_exact(
        &self,
        stream: &mut VerifiedStream,
        command: CommandCode,
        phase: Phase,
        buf: &mut [u8],
    ) -> Result<(), ClientError> {
        let timeout = self.timeouts.read;
        let read_all = async {
            let mut filled = 0;
            while filled < buf.len() {
                match stream.stream_mut().read(&mut buf[filled..]).await {
                    Ok(0) => return Ok(Err(filled)),
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(Ok(()))
        };
        match tokio::time::timeout(timeout, read_all).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(received))) => Err(ClientError::Closed {
                pid: self.pid(),
                command,
                phase,
                received,
                expected: buf.len(),
            }),
            Ok(Err(source)) => Err(self.io_error(command, phase, source, timeout)),
            Err(_) => Err(self.timeout(command, phase, timeout)),
        }
    }

    fn timeout(&self, command: CommandCode, phase: Phase, timeout: Duration) -> ClientError {
        ClientError::Timeout { pid: self.pid(), command, phase, timeout }
    }

    fn io_error(
        &self,
        command: CommandCode,
        phase: Phase,
        source: io::Error,
        timeout: Duration,
    ) -> ClientError {
        if source.kind() == io::ErrorKind::TimedOut {
            return self.timeout(command, phase, timeout);
        }
        ClientError::Io { pid: self.pid(), command, phase, source }
    }
}

/// UNKNOWN_COMMAND, or BAD_ENCODING from runtimes that cannot parse a newer command
/// (docs/protocol/diagnostic-ipc.md §3.3).
fn is_version_refusal(error: &ClientError) -> bool {
    matches!(error.server_error(), Some(ServerError::UnknownCommand | ServerError::BadEncoding))
}

/// CollectTracing* and StopTracing have the SessionId reply shape, so the decoder returned one.
fn expect_session_id(reply: Reply) -> u64 {
    match reply {
        Reply::SessionId(id) => id,
        other => unreachable!("decoder returned {other:?} for the SessionId shape"),
    }
}
