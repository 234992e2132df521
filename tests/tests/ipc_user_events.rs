//! CollectTracing5 user_events session setup against a double of the runtime side (the host
//! kernel has no CONFIG_USER_EVENTS and no .NET 10 is available here): message, then one byte
//! with the fd as SCM_RIGHTS, then the reply; the session lasts as long as the connection.

use std::io::Read;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::time::Duration;

use anyhow::{Result, ensure};
use tests::peer::HostilePeer;
use tests::process::{LineProcess, spawn_idle_target};
use tests::scratch::ScratchDir;
use tracer::ipc::client::{ClientError, DiagnosticClient, Timeouts};
use tracer::ipc::providers;
use tracer::ipc::socket::{Refusal, SocketError};
use tracer_decode::diagnostic_ipc::{
    CollectTracing, EventFilter, Request, TracepointConfig, TracepointSet, UserEventsProvider,
};

const FD_PEER: &str = env!("CARGO_BIN_EXE_fd_peer");
const HOSTILE_PEER: &str = env!("CARGO_BIN_EXE_hostile_peer");
const WAIT: Duration = Duration::from_secs(20);

fn user_events_providers() -> Result<Vec<UserEventsProvider>> {
    let gc = providers::profile("gc")?.remove(0).provider;
    Ok(vec![UserEventsProvider {
        provider: gc,
        filter: Some(EventFilter::Only(vec![1, 2])),
        tracepoints: TracepointConfig {
            default_name: None,
            sets: vec![TracepointSet { name: "tracer_gc".into(), event_ids: vec![1, 2] }],
        },
    }])
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fresh descriptors that we own from here on.
    ensure!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0, "pipe2 failed");
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[tokio::test]
async fn user_events_session_passes_the_fd_after_the_message() -> Result<()> {
    let dir = ScratchDir::new("ipc-fd");
    let mut command = std::process::Command::new(FD_PEER);
    command.env("TMPDIR", dir.path());
    let mut runtime = LineProcess::spawn("fd_peer", command)?;
    runtime.expect_line("READY", WAIT)?;
    let client = DiagnosticClient::for_pid(runtime.pid(), Timeouts::default())?;

    let (read_end, write_end) = pipe()?;
    let providers = user_events_providers()?;
    let session = client.start_user_events_session(0, &providers, write_end.as_fd()).await?;
    drop(write_end);
    assert_eq!(session.session_id, 0x5E_5510);

    let command = CollectTracing::V5UserEvents { rundown_keyword: 0, providers };
    let message_len = Request::CollectTracing(command).encode()?.len();
    // The whole message, then exactly one data byte carrying exactly one fd.
    assert_eq!(runtime.expect_line("RECEIVED", WAIT)?, format!("{message_len} 1 1"));
    // The fd the runtime received is our pipe: what it wrote arrives here.
    let mut written = String::new();
    std::fs::File::from(read_end).read_to_string(&mut written)?;
    assert_eq!(written, "fd-ok\n");

    // The session lives as long as the connection: the runtime side still sees it open.
    assert_eq!(runtime.request("status", "SESSION", WAIT)?, "open");
    drop(session.stream);
    assert_eq!(runtime.request("wait-close", "CLOSED", WAIT)?, "");
    Ok(())
}

#[tokio::test]
async fn no_fd_and_no_byte_reach_a_socket_bound_by_another_process() -> Result<()> {
    let dir = ScratchDir::new("ipc-fd-squat");
    let target = spawn_idle_target(dir.path())?;
    let target_pid = target.pid();
    let mut squatter =
        HostilePeer::spawn(HOSTILE_PEER, dir.path(), &["squat", &target_pid.to_string()])?;
    let client = DiagnosticClient::for_pid(target_pid, Timeouts::default())?;
    let (_read_end, write_end) = pipe()?;
    let providers = user_events_providers()?;
    let result = client.start_user_events_session(0, &providers, write_end.as_fd()).await;
    drop(target);
    match result {
        Err(ClientError::Socket(SocketError::Refused {
            refusal: Refusal::PeerPidMismatch { .. },
            ..
        })) => {}
        other => panic!("expected a peer pid refusal, got {other:?}"),
    }
    assert_eq!(squatter.received(1)?, (1, 0));
    Ok(())
}

#[tokio::test]
async fn user_events_command_is_not_accepted_as_a_streaming_session() -> Result<()> {
    // Refused before any connection: the socket need not exist.
    let socket = tracer::ipc::socket::DiagnosticSocket {
        host_pid: std::process::id(),
        ns_pid: std::process::id(),
        dir: "/nonexistent".into(),
        file_name: "dotnet-diagnostic-0-0-socket".into(),
        exact_key: true,
        target: tracer::ipc::socket::Target::pin(std::process::id())?,
        owner_uid: 0,
    };
    let client = DiagnosticClient::new(socket, Timeouts::default());
    let command =
        CollectTracing::V5UserEvents { rundown_keyword: 0, providers: user_events_providers()? };
    match client.start_streaming_session(&command).await {
        Err(ClientError::NeedsUserEventsFd) => Ok(()),
        other => panic!("expected NeedsUserEventsFd, got {other:?}"),
    }
}
