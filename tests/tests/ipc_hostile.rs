//! Hostile owners of a diagnostic socket: each must produce its exact typed error (an error other
//! than `Timeout` proves no timer ran out; a `Timeout` names the phase and the limit), and the
//! socket-trust checks must refuse before any byte is sent. No test bounds elapsed time from
//! above: on a loaded machine that measures the scheduler, not the client.

use std::os::unix::fs::FileTypeExt;
use std::time::{Duration, Instant};

use anyhow::Result;
use tests::peer::HostilePeer;
use tests::process::spawn_idle_target;
use tests::procfs;
use tests::scratch::ScratchDir;
use tracer::decode::ipc::{
    CollectTracing, CommandCode, DecodeError, ReplyShape, TracingRequest, oldest_collect_tracing,
};
use tracer::ipc::client::{ClientError, DiagnosticClient, Phase, Timeouts};
use tracer::ipc::providers;
use tracer::ipc::socket::{self, Refusal, SocketError};

const BIN: &str = env!("CARGO_BIN_EXE_hostile_peer");
const TIMEOUT: Duration = Duration::from_secs(1);
/// The silent peer's client gives up only after this long: far beyond anything the other
/// target's probe takes, so which one ends first is not a race.
const STALLED: Duration = Duration::from_secs(600);

fn timeouts() -> Timeouts {
    Timeouts { connect: TIMEOUT, write: TIMEOUT, read: TIMEOUT }
}

fn gc_session() -> Result<CollectTracing> {
    Ok(oldest_collect_tracing(&TracingRequest {
        circular_buffer_mb: 64,
        providers: providers::profile("gc")?,
        rundown_keyword: 0,
        request_stackwalk: true,
    }))
}

/// Runs `f`, returning its result and how long it took (a timeout must have waited its limit).
async fn timed<T>(f: impl Future<Output = T>) -> (T, Duration) {
    let start = Instant::now();
    let out = f.await;
    (out, start.elapsed())
}

#[tokio::test]
async fn garbage_reply_is_refused_as_bad_magic() -> Result<()> {
    let dir = ScratchDir::new("ipc-garbage");
    let peer = HostilePeer::spawn(BIN, dir.path(), &["garbage"])?;
    let client = DiagnosticClient::for_pid(peer.pid(), timeouts())?;
    match client.probe().await {
        Err(ClientError::Decode {
            pid,
            command: CommandCode::ProcessInfo3,
            source: DecodeError::BadMagic { found },
        }) => {
            assert_eq!(pid, peer.pid());
            assert_eq!(&found, b"HTTP/1.1 200 O");
        }
        other => panic!("expected BadMagic, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn announced_60k_reply_with_10_bytes_times_out_or_is_refused() -> Result<()> {
    let dir = ScratchDir::new("ipc-short");
    let peer = HostilePeer::spawn(BIN, dir.path(), &["short"])?;
    let client = DiagnosticClient::for_pid(peer.pid(), timeouts())?;

    // ProcessInfo3 replies may be that large: the client waits for the rest, then gives up.
    let (result, took) = timed(client.probe()).await;
    match result {
        Err(ClientError::Timeout {
            command: CommandCode::ProcessInfo3,
            phase: Phase::ReadReplyPayload,
            timeout,
            ..
        }) => assert_eq!(timeout, TIMEOUT),
        other => panic!("expected a payload read timeout, got {other:?}"),
    }
    assert!(took >= TIMEOUT, "gave up after {took:?}, before its {TIMEOUT:?}");

    // A session reply is 28 bytes: 60 000 is refused from the header, without waiting.
    match client.start_streaming_session(&gc_session()?).await {
        Err(ClientError::Decode {
            command: CommandCode::CollectTracing2,
            source:
                DecodeError::Oversize {
                    size: 60_000,
                    max: 28,
                    shape: ReplyShape::SessionId,
                    kind: "OK",
                },
            ..
        }) => {}
        other => panic!("expected Oversize, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn announced_60k_reply_cut_after_10_bytes_is_reported_as_closed() -> Result<()> {
    let dir = ScratchDir::new("ipc-short-close");
    let peer = HostilePeer::spawn(BIN, dir.path(), &["short-close"])?;
    let client = DiagnosticClient::for_pid(peer.pid(), timeouts())?;
    match client.probe().await {
        Err(ClientError::Closed {
            command: CommandCode::ProcessInfo3,
            phase: Phase::ReadReplyPayload,
            received: 10,
            expected: 59_980,
            ..
        }) => {}
        other => panic!("expected Closed after 10 payload bytes, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn silent_peer_times_out_on_the_reply_header() -> Result<()> {
    let dir = ScratchDir::new("ipc-silent");
    let mut peer = HostilePeer::spawn(BIN, dir.path(), &["silent"])?;
    let client = DiagnosticClient::for_pid(peer.pid(), timeouts())?;
    let (result, took) = timed(client.probe()).await;
    match result {
        Err(ClientError::Timeout {
            pid,
            command: CommandCode::ProcessInfo3,
            phase: Phase::ReadReplyHeader,
            timeout,
        }) => assert_eq!((pid, timeout), (peer.pid(), TIMEOUT)),
        other => panic!("expected a header read timeout, got {other:?}"),
    }
    assert!(took >= TIMEOUT, "gave up after {took:?}, before its {TIMEOUT:?}");
    // It did receive the 20-byte ProcessInfo3 request: the peer really was the one talked to.
    assert_eq!(peer.received(1)?, (1, 20));
    Ok(())
}

#[tokio::test]
async fn symlinked_socket_is_refused_and_its_target_gets_nothing() -> Result<()> {
    let dir = ScratchDir::new("ipc-symlink");
    let real = dir.path().join("real.sock");
    let mut other = HostilePeer::spawn(BIN, dir.path(), &["listen", real.to_str().unwrap()])?;
    let target = HostilePeer::spawn(BIN, dir.path(), &["symlink", real.to_str().unwrap()])?;
    assert!(std::fs::symlink_metadata(&target.path)?.file_type().is_symlink());

    let client = DiagnosticClient::for_pid(target.pid(), timeouts())?;
    assert_eq!(client.socket().file_name, procfs::runtime_socket_name(target.pid())?);
    match client.probe().await {
        Err(ClientError::Socket(SocketError::Refused { pid, path, refusal: Refusal::Symlink })) => {
            assert_eq!(pid, target.pid());
            assert_eq!(path, target.path);
        }
        other => panic!("expected a symlink refusal, got {other:?}"),
    }
    assert_eq!(other.received(0)?, (0, 0), "nothing may reach the symlink's target");
    Ok(())
}

#[tokio::test]
async fn socket_bound_by_another_process_is_refused_before_sending() -> Result<()> {
    let dir = ScratchDir::new("ipc-squat");
    let target = spawn_idle_target(dir.path())?;
    let target_pid = target.pid();
    let mut squatter = HostilePeer::spawn(BIN, dir.path(), &["squat", &target_pid.to_string()])?;
    assert!(std::fs::metadata(&squatter.path)?.file_type().is_socket());

    let client = DiagnosticClient::for_pid(target_pid, timeouts())?;
    assert!(client.socket().exact_key);
    match client.start_streaming_session(&gc_session()?).await {
        Err(ClientError::Socket(SocketError::Refused {
            pid,
            refusal: Refusal::PeerPidMismatch { expected, actual },
            ..
        })) => {
            assert_eq!((pid, expected), (target_pid, target_pid));
            assert_eq!(actual, i64::from(squatter.pid()));
        }
        other => panic!("expected a peer pid refusal, got {other:?}"),
    }
    // The connection was made (to read SO_PEERCRED) and closed without a byte.
    assert_eq!(squatter.received(1)?, (1, 0));
    Ok(())
}

#[tokio::test]
async fn regular_file_named_like_a_socket_is_refused() -> Result<()> {
    let dir = ScratchDir::new("ipc-file");
    let target = spawn_idle_target(dir.path())?;
    let pid = target.pid();
    let path = dir.path().join(procfs::runtime_socket_name(pid)?);
    std::fs::write(&path, b"not a socket")?;
    match socket::locate_and_connect(pid, TIMEOUT).await {
        Err(SocketError::Refused { refusal: Refusal::NotASocket { mode }, .. }) => {
            assert_eq!(mode & libc::S_IFMT, libc::S_IFREG);
        }
        other => panic!("expected NotASocket, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn process_without_socket_is_not_found() -> Result<()> {
    let dir = ScratchDir::new("ipc-none");
    let target = spawn_idle_target(dir.path())?;
    let pid = target.pid();
    match socket::locate(pid) {
        Err(SocketError::NotFound { pid: p, ns_pid, dir: d }) => {
            assert_eq!((p, ns_pid, d.as_path()), (pid, pid, dir.path()));
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_does_not_stall_other_targets() -> Result<()> {
    let dir = ScratchDir::new("ipc-parallel");
    let mut silent = HostilePeer::spawn(BIN, dir.path(), &["silent"])?;
    let garbage = HostilePeer::spawn(BIN, dir.path(), &["garbage"])?;
    let stall = Timeouts { connect: STALLED, write: STALLED, read: STALLED };
    let silent_client = DiagnosticClient::for_pid(silent.pid(), stall)?;
    let garbage_client = DiagnosticClient::for_pid(garbage.pid(), timeouts())?;
    let stalled = tokio::spawn(async move { silent_client.probe().await });
    // The silent peer holds the whole 20-byte request: the probe now waits for its reply.
    assert_eq!(tokio::task::block_in_place(|| silent.received_bytes(20))?, (1, 20));

    match garbage_client.probe().await {
        Err(ClientError::Decode { source: DecodeError::BadMagic { .. }, .. }) => {}
        other => panic!("expected BadMagic from the other target, got {other:?}"),
    }
    assert!(!stalled.is_finished(), "the other target was answered only after the silent one");
    stalled.abort();
    assert!(stalled.await.expect_err("aborted").is_cancelled());
    // Cancelling closed the connection; the peer got exactly the request, on one connection.
    assert_eq!(tokio::task::block_in_place(|| silent.received(1))?, (1, 20));
    Ok(())
}
