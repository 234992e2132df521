//! Hostile owners of a diagnostic socket: each must produce its exact typed error (an error other
//! than `Timeout` proves no timer ran out; a `Timeout` names the phase and the limit), and the
//! socket-trust checks must refuse before any byte is sent. The peer must be the detected process
//! (docs/security.md, "Peer identity"): names planted by another user in a shared temp dir, a stale listener on a
//! recycled pid and a target in a time namespace. No test bounds elapsed time from above: on a
//! loaded machine that measures the scheduler, not the client.

use std::os::unix::fs::FileTypeExt;
use std::time::{Duration, Instant};

use anyhow::Result;
use tests::peer::{HostilePeer, PeerOptions};
use tests::process::spawn_idle_target;
use tests::procfs;
use tests::scratch::ScratchDir;
use tracer::ipc::client::{ClientError, DiagnosticClient, Phase, Timeouts};
use tracer::ipc::providers;
use tracer::ipc::socket::{self, Refusal, SocketError, Target};
use tracer::session::{self, LocateReport, MAX_REPORTED_REFUSALS, SessionConfig, SessionMode};
use tracer_decode::diagnostic_ipc::{
    CollectTracing, CommandCode, DecodeError, ProcessInfo, ReplyShape, TracingRequest,
    oldest_collect_tracing,
};

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
        buffering_mode: None,
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

/// A directory like a shared `/tmp`: world-writable and sticky.
fn shared_tmp(tag: &str) -> Result<ScratchDir> {
    use std::os::unix::fs::PermissionsExt;
    let dir = ScratchDir::new(tag);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))?;
    Ok(dir)
}

fn nobody() -> PeerOptions {
    PeerOptions { as_nobody: true, ..PeerOptions::default() }
}

/// What [`session::locate_and_probe`] returns, from a task.
type LocateTask =
    tokio::task::JoinHandle<Result<(DiagnosticClient, Option<ProcessInfo>), ClientError>>;
type Reports = tokio::sync::mpsc::UnboundedReceiver<LocateReport>;

/// [`session::locate_and_probe`] of `target` in a task, looking for up to `locate_for`; its
/// reports arrive on the channel.
fn locate_in_a_task(target: Target, locate_for: Duration) -> Result<(LocateTask, Reports)> {
    let config = SessionConfig {
        request: TracingRequest {
            circular_buffer_mb: 64,
            providers: providers::profile("gc")?,
            rundown_keyword: 0,
            request_stackwalk: true,
            buffering_mode: None,
        },
        mode: SessionMode::Streaming,
        timeouts: timeouts(),
        locate_for,
        drain_timeout: TIMEOUT,
        user_events_grant: Default::default(),
        nettrace_dir: None,
        stopping_event: None,
        meters: None,
    };
    let (reports_tx, reports) = tokio::sync::mpsc::unbounded_channel();
    let session = tokio::spawn(async move {
        let report = move |report| {
            let _ = reports_tx.send(report);
            async {}
        };
        session::locate_and_probe(&target, &config, report).await
    });
    Ok((session, reports))
}

/// A temp dir holding more names for the target's pid than tracer examines (a huge
/// `TMPDIR`): every look-up examines exactly `MAX_TEMP_DIR_ENTRIES` of them, the first
/// `MAX_REPORTED_REFUSALS` refusals are reported one by one and the rest once, as a count — not
/// 105 000 `socket_refused` lines for every target sharing the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temp_dir_of_planted_names_costs_a_bounded_scan_and_bounded_reports() -> Result<()> {
    const PLANTED: usize = socket::MAX_TEMP_DIR_ENTRIES + 5_000;
    const PLANTED_KEY_BASE: u64 = 1 << 40;
    let dir = shared_tmp("ipc-huge-tmpdir")?;
    let waiting = PeerOptions { wait: true, ..PeerOptions::default() };
    let victim = HostilePeer::spawn_opts(BIN, dir.path(), &["garbage"], waiting)?;
    let pid = victim.pid();
    // Keys far above any start time (clock ticks since boot): none is the victim's own name,
    // which would be refused as the exact name rather than examined as a fallback.
    for key in (0..PLANTED).map(|n| PLANTED_KEY_BASE + n as u64) {
        let name = format!("dotnet-diagnostic-{pid}-{key}-socket");
        std::os::unix::fs::symlink("/nonexistent", dir.path().join(name))?;
    }
    let (session, mut reports) = locate_in_a_task(Target::pin(pid)?, Duration::from_secs(1))?;
    let result = session.await?;
    assert!(matches!(result, Err(ClientError::NotReady { .. })), "{result:?}");
    let mut all = Vec::new();
    while let Ok(report) = reports.try_recv() {
        all.push(report);
    }
    let (refused, rest) = all.split_at(MAX_REPORTED_REFUSALS.min(all.len()));
    assert!(
        refused.iter().all(|r| matches!(r, LocateReport::Refused(p, Refusal::Symlink)
            if p.parent() == Some(dir.path()))),
        "{refused:?}"
    );
    assert_eq!(refused.len(), MAX_REPORTED_REFUSALS);
    let examined = socket::MAX_TEMP_DIR_ENTRIES as u64;
    assert_eq!(rest, [LocateReport::NotReported(examined - MAX_REPORTED_REFUSALS as u64)]);
    drop(victim);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_planted_by_another_user_do_not_block_the_owners_socket() -> Result<()> {
    let dir = shared_tmp("ipc-planted")?;
    // A runtime detected before its socket exists (the start-up race), with two names for its
    // pid that another user (nobody) created meanwhile: the newest would be taken as a fallback.
    let waiting = PeerOptions { wait: true, ..PeerOptions::default() };
    let mut victim = HostilePeer::spawn_opts(BIN, dir.path(), &["garbage"], waiting)?;
    let pid = victim.pid();
    let target = Target::pin(pid)?;
    let pid_arg = pid.to_string();
    let mut planted = Vec::new();
    for key in ["1", "2"] {
        planted.push(HostilePeer::spawn_opts(
            BIN,
            dir.path(),
            &["plant", &pid_arg, key],
            nobody(),
        )?);
    }
    let planted_paths: Vec<_> = planted.iter().map(|p| p.path.clone()).collect();

    // Neither planted name is taken: the target has no socket yet.
    match socket::locate(pid) {
        Err(SocketError::NotFound { pid: p, ns_pid, dir: d }) => {
            assert_eq!((p, ns_pid, d.as_path()), (pid, pid, dir.path()));
        }
        other => panic!("expected NotFound, got {other:?}"),
    }

    // A session keeps looking past them (each reported once, with its reason) until the
    // runtime binds its name.
    let (session, mut refused_rx) = locate_in_a_task(target, Duration::from_secs(20))?;
    let mut refused = Vec::new();
    for _ in 0..2 {
        let next = tokio::time::timeout(Duration::from_secs(10), refused_rx.recv()).await?;
        refused.push(next.expect("the session reports both planted names"));
    }
    refused.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    let owner_mismatch = Refusal::OwnerMismatch { owner: 65534, expected: 0 };
    assert_eq!(
        refused,
        planted_paths
            .iter()
            .map(|p| LocateReport::Refused(p.clone(), owner_mismatch.clone()))
            .collect::<Vec<_>>()
    );

    let exact = victim.go()?.to_owned();
    let (result, _) = match session.await? {
        Err(ClientError::Decode { pid: p, source: DecodeError::BadMagic { .. }, .. }) => (p, ()),
        other => panic!("expected the victim's own (garbage) reply, got {other:?}"),
    };
    assert_eq!(result, pid);
    assert_eq!(exact.file_name().unwrap().to_str().unwrap(), procfs::runtime_socket_name(pid)?);
    // The victim got the request; nothing was sent to the planted names, nor reported twice.
    assert_eq!(victim.received(1)?, (1, 20));
    for mut p in planted {
        assert_eq!(p.received(0)?, (0, 0));
    }
    assert!(refused_rx.try_recv().is_err());
    Ok(())
}

#[tokio::test]
async fn exact_name_bound_by_another_user_is_refused_for_its_owner() -> Result<()> {
    let dir = shared_tmp("ipc-squat-nobody")?;
    let target = spawn_idle_target(dir.path())?;
    let pid = target.pid();
    let mut squatter =
        HostilePeer::spawn_opts(BIN, dir.path(), &["squat", &pid.to_string()], nobody())?;
    let mut refused = Vec::new();
    match socket::locate_target(&Target::pin(pid)?, &mut refused) {
        Err(SocketError::NotFound { .. }) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    let owner_mismatch = Refusal::OwnerMismatch { owner: 65534, expected: 0 };
    assert_eq!(refused, vec![(squatter.path.clone(), owner_mismatch.clone())]);
    // Connecting by that name is refused on the opened inode as well, before connecting.
    let located = socket::DiagnosticSocket {
        host_pid: pid,
        ns_pid: pid,
        dir: dir.path().to_owned(),
        file_name: procfs::runtime_socket_name(pid)?,
        exact_key: true,
        target: Target::pin(pid)?,
        owner_uid: 0,
    };
    match socket::connect(&located, TIMEOUT).await {
        Err(SocketError::Refused { pid: p, path, refusal }) => {
            assert_eq!((p, path, refusal), (pid, squatter.path.clone(), owner_mismatch));
        }
        other => panic!("expected an owner refusal, got {other:?}"),
    }
    assert_eq!(squatter.received(0)?, (0, 0), "not even a connection");
    Ok(())
}

#[tokio::test]
async fn stale_listener_on_a_recycled_pid_is_refused() -> Result<()> {
    let dir = ScratchDir::new("ipc-pid-reuse");
    let output = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", env!("CARGO_BIN_EXE_pid_reuse")])
        .arg(dir.path())
        .output()?;
    let stdout = String::from_utf8(output.stdout)?;
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let mut lines = stdout.lines();
    let pids = lines.next().and_then(|l| l.strip_prefix("PIDS ")).expect("PIDS line");
    let (creator, victim) = pids.split_once(' ').expect("PIDS <creator> <victim>");
    assert_eq!(creator, victim, "the victim reused the listener creator's pid");
    let result = lines.next().and_then(|l| l.strip_prefix("RESULT ")).expect("RESULT line");
    // SO_PEERCRED names the victim's pid; SO_PEERPIDFD shows another (exited) process.
    let name = std::fs::read_dir(dir.path())?
        .map(|e| e.map(|e| e.file_name().into_string().unwrap()))
        .collect::<Result<Vec<_>, _>>()?;
    assert_eq!(name.len(), 1, "{name:?}");
    let path = dir.path().join(&name[0]);
    assert_eq!(
        result,
        format!(
            "Refused {{ pid: {victim}, path: {path:?}, refusal: PeerNotTarget {{ pid: {victim} }} }}"
        )
    );
    Ok(())
}

#[tokio::test]
async fn target_in_a_time_namespace_is_found_by_its_exact_name() -> Result<()> {
    let dir = shared_tmp("ipc-timens")?;
    // The runtime's clock is 1000 s ahead: its key is its start time as it reads it.
    let in_timens = PeerOptions { boottime_offset_s: Some(1000), ..PeerOptions::default() };
    let mut peer = HostilePeer::spawn_opts(BIN, dir.path(), &["garbage"], in_timens)?;
    let pid = peer.pid();
    let host_key = procfs::start_time(pid)?;
    let name = peer.path.file_name().unwrap().to_str().unwrap().to_owned();
    assert_eq!(name, format!("dotnet-diagnostic-{pid}-{}-socket", host_key + 1000 * 100));
    // Another user plants the name the host's view of the start time gives, newer.
    let mut planted = HostilePeer::spawn_opts(
        BIN,
        dir.path(),
        &["plant", &pid.to_string(), &host_key.to_string()],
        nobody(),
    )?;

    let client = DiagnosticClient::for_pid(pid, timeouts())?;
    assert!(client.socket().exact_key);
    assert_eq!(client.socket().file_name, name);
    match client.probe().await {
        Err(ClientError::Decode { pid: p, source: DecodeError::BadMagic { .. }, .. }) => {
            assert_eq!(p, pid);
        }
        other => panic!("expected the peer's own (garbage) reply, got {other:?}"),
    }
    assert_eq!(peer.received(1)?, (1, 20));
    assert_eq!(planted.received(0)?, (0, 0));
    Ok(())
}
