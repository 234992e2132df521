//! Finding a detected process's diagnostic socket and connecting to it without trusting the
//! paths an (unprivileged, possibly containerised) target controls.
//!
//! tracer runs as root and resolves names inside the target's root and temp dir, which the
//! target owns. So (docs/protocol/diagnostic-ipc.md §1.3):
//! * the socket name uses the target's innermost pid (`NSpid`), its `TMPDIR` and its start time
//!   (field 22 of `/proc/<pid>/stat`), exactly as the runtime builds it;
//! * the path is opened with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_MAGICLINKS)` relative to `/proc/<pid>/root`, so no symlink (not even one inside
//!   the container) can redirect us, as an `O_PATH` fd that must be a socket;
//! * the socket file must be owned by the target's uid or root (docs/security.md, "Peer identity"): in a shared `/tmp`
//!   any user can create names for other users' pids;
//! * we connect to *that inode* through `/proc/self/fd/<n>` (no second path lookup), and the
//!   listener must be the detected process itself: its `SO_PEERCRED` pid is the detected pid and
//!   its `SO_PEERPIDFD` is the process pinned at detection ([`Target`]) — or, on kernels without
//!   `SO_PEERPIDFD` (< 6.5), the pid still has the pinned start time. A socket bound by anyone
//!   else, or a listener created by an exited process whose pid the target reused, is refused
//!   before a single byte is sent.
//!
//! The key is the start time *as the target sees it*: `starttime` in `/proc/<pid>/stat` depends
//! on the reader's time namespace, so the value tracer reads is shifted by the difference of the
//! two namespaces' boottime offsets (`/proc/<pid>/timens_offsets`).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd as _, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use thiserror::Error;
use tokio::net::UnixStream;
use tracer_decode::procfs::{
    TimensOffsets, parse_ns_pid, parse_pidfd_fdinfo_pid, parse_start_time, parse_status_uids,
    parse_timens_offsets, parse_tmpdir, start_time_in_namespace,
};

use crate::output::Incarnation;

/// A detected process, pinned when it was detected: a pidfd (which always refers to that
/// process, never to a later one with the same pid) and its start time. Every connection is
/// verified against it.
#[derive(Debug, Clone)]
pub struct Target {
    pid: u32,
    start_time: u64,
    /// `None` on kernels without `pidfd_open` (< 5.3).
    pidfd: Option<Arc<OwnedFd>>,
}

impl Target {
    /// Pins `pid`: opens a pidfd, then reads the start time and checks, through the pidfd, that
    /// the process is still there — so the start time read belongs to the process the pidfd pins.
    pub fn pin(pid: u32) -> Result<Target, SocketError> {
        let pidfd = pidfd_open(pid).map_err(|source| SocketError::Pin { pid, source })?;
        let start_time = start_time_key(pid)?;
        if let Some(fd) = &pidfd {
            pidfd_alive(fd).map_err(|source| SocketError::Pin { pid, source })?;
        }
        Ok(Target { pid, start_time, pidfd: pidfd.map(Arc::new) })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Start time in clock ticks since boot, as tracer's time namespace sees it.
    pub fn start_time(&self) -> u64 {
        self.start_time
    }

    /// What identifies the process across pid reuse: (pid, start time).
    pub fn key(&self) -> (u32, u64) {
        (self.pid, self.start_time)
    }

    /// The process as its lines name it: pid and start (docs/protocol/bpf-detection.md §11).
    pub fn incarnation(&self) -> Incarnation {
        Incarnation {
            pid: self.pid,
            start_ns: Some(crate::kernel::procfs::start_ns_of_ticks(self.start_time)),
        }
    }

    /// Resolves once the pinned process has exited (its pidfd turns readable), whoever still
    /// holds its sockets; never on kernels without pidfds (< 5.3).
    pub async fn exited(&self) {
        let Some(pidfd) = &self.pidfd else { return std::future::pending().await };
        // Registered on a duplicate: each waiter owns the fd it hands to the reactor.
        let registered = pidfd.try_clone().and_then(|fd| {
            // SAFETY: the duplicate stays open, unchanged, for the AsyncFd's whole life.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }
            .map_err(|e| e.into_parts().1)
        });
        match registered {
            Ok(fd) => drop(fd.readable().await),
            Err(e) => {
                log::warn!(
                    "pid {}: cannot wait on its pidfd ({e}): its exit ends no session",
                    self.pid
                );
                std::future::pending().await
            }
        }
    }
}

/// Where a process's diagnostic socket is, as seen from inside the process's root.
#[derive(Debug, Clone)]
pub struct DiagnosticSocket {
    /// The pid tracer detected (host pid namespace).
    pub host_pid: u32,
    /// The pid the runtime sees and puts in the socket name.
    pub ns_pid: u32,
    /// The target's temp directory, absolute inside its root (`$TMPDIR` or `/tmp`).
    pub dir: PathBuf,
    /// `dotnet-diagnostic-<nspid>-<key>-socket`.
    pub file_name: String,
    /// False when the exact name was absent and the newest `dotnet-diagnostic-<nspid>-*-socket`
    /// owned by the target's uid was taken instead (e.g. a runtime without its own `/proc` reads
    /// another process's start time).
    pub exact_key: bool,
    /// The process the listener must be.
    pub target: Target,
    /// The uid files the target creates are owned by (its filesystem uid): the socket's owner
    /// must be this uid or root.
    pub owner_uid: u32,
}

impl DiagnosticSocket {
    /// Path inside the target's root, for messages.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.file_name)
    }
}

/// Why tracer refused to use a socket. Nothing has been sent to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Error)]
pub enum Refusal {
    #[error("a component of the path is a symbolic link (symlinks are never followed)")]
    Symlink,
    /// openat2 saw the lookup leave the root (EXDEV), e.g. a concurrent rename racing `..`.
    #[error("resolving the path left the process's root")]
    EscapesRoot,
    #[error("it is not a socket (file mode {mode:#o})")]
    NotASocket { mode: u32 },
    #[error(
        "the listening socket belongs to pid {actual}, not to the detected pid {expected}: \
         another process bound this name"
    )]
    PeerPidMismatch { expected: u32, actual: i64 },
    #[error("the kernel did not report the listener's pid (SO_PEERCRED)")]
    PeerPidUnknown,
    #[error(
        "the socket file is owned by uid {owner}, not by the target's uid {expected} or root: \
         another user created this name"
    )]
    OwnerMismatch { owner: u32, expected: u32 },
    #[error(
        "the listening socket was created by another process that had pid {pid} (it has \
         exited and the pid was reused, or the pid was reused since detection)"
    )]
    PeerNotTarget { pid: u32 },
    #[error(
        "the process that created the listening socket with pid {pid} has exited (a listener \
         passed on by an earlier holder of the pid)"
    )]
    PeerExited { pid: u32 },
    #[error(
        "pid {pid} now has start time {actual}, not {expected} as when it was detected: the pid \
         was reused"
    )]
    PeerStartTimeMismatch { pid: u32, expected: u64, actual: u64 },
}

impl Refusal {
    /// A short stable name for counting and for the `reason` of a `socket_refused` line.
    pub fn name(&self) -> &'static str {
        match self {
            Refusal::Symlink => "symlink",
            Refusal::EscapesRoot => "escapes_root",
            Refusal::NotASocket { .. } => "not_a_socket",
            Refusal::PeerPidMismatch { .. } => "peer_pid_mismatch",
            Refusal::PeerPidUnknown => "peer_pid_unknown",
            Refusal::OwnerMismatch { .. } => "owner_mismatch",
            Refusal::PeerNotTarget { .. } => "peer_not_target",
            Refusal::PeerExited { .. } => "peer_exited",
            Refusal::PeerStartTimeMismatch { .. } => "peer_start_time_mismatch",
        }
    }
}

#[derive(Debug, Error)]
pub enum SocketError {
    #[error("cannot read /proc/{pid}/{file}: {source} (has the process exited? is tracer root?)")]
    Proc {
        pid: u32,
        file: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("/proc/{pid}/{file} is malformed: {what}")]
    Malformed { pid: u32, file: &'static str, what: &'static str },
    #[error("cannot pin pid {pid} (pidfd_open): {source} (has the process exited?)")]
    Pin {
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error(
        "pid {pid} has no diagnostic socket dotnet-diagnostic-{ns_pid}-*-socket in {dir:?} \
         (diagnostics disabled with DOTNET_EnableDiagnostics=0, or not a .NET process)"
    )]
    NotFound { pid: u32, ns_pid: u32, dir: PathBuf },
    #[error("cannot open {path:?} inside the root of pid {pid}: {source}")]
    Open {
        pid: u32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("refused diagnostic socket {path:?} of pid {pid}: {refusal}")]
    Refused { pid: u32, path: PathBuf, refusal: Refusal },
    #[error("connecting to {path:?} of pid {pid} failed: {source}")]
    Connect {
        pid: u32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("connecting to {path:?} of pid {pid} timed out after {timeout:?}")]
    ConnectTimeout { pid: u32, path: PathBuf, timeout: Duration },
}

impl SocketError {
    /// The refusal, when this error is a security refusal (the caller emits an audit event).
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            SocketError::Refused { refusal, .. } => Some(refusal),
            _ => None,
        }
    }
}

/// A connection whose listener was verified to be the detected process. Only this type can send
/// commands or file descriptors, so nothing reaches an unverified peer.
#[derive(Debug)]
pub struct VerifiedStream {
    stream: UnixStream,
    host_pid: u32,
}

impl VerifiedStream {
    pub fn host_pid(&self) -> u32 {
        self.host_pid
    }

    pub fn stream_mut(&mut self) -> &mut UnixStream {
        &mut self.stream
    }

    pub fn into_inner(self) -> UnixStream {
        self.stream
    }

    /// Sends one data byte carrying `fd` as SCM_RIGHTS (docs/protocol/diagnostic-ipc.md §4.2 step
    /// 5), waiting at most `timeout` for the socket to become writable.
    pub async fn send_fd(&self, fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<()> {
        let fd = fd.as_raw_fd();
        let send = self
            .stream
            .async_io(tokio::io::Interest::WRITABLE, || send_fd_once(self.stream.as_fd(), fd));
        match tokio::time::timeout(timeout, send).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "sending the fd timed out")),
        }
    }
}

/// One `sendmsg` of one data byte carrying `fd` as SCM_RIGHTS on `socket` (a connected
/// `AF_UNIX` stream socket); `WouldBlock` when the socket is full.
pub fn send_fd_once(socket: BorrowedFd<'_>, fd: RawFd) -> io::Result<()> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; zero is a valid initial value for every field.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: msg points at a control buffer of CMSG_SPACE(4) bytes, so the first header and
    // its 4-byte data fit; all pointers stay valid during the sendmsg call.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    match sent {
        1 => Ok(()),
        -1 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::new(io::ErrorKind::WriteZero, "sendmsg sent no data byte")),
    }
}

/// Pins `host_pid` and locates its diagnostic socket (docs/protocol/diagnostic-ipc.md §1.3).
pub fn locate(host_pid: u32) -> Result<DiagnosticSocket, SocketError> {
    locate_target(&Target::pin(host_pid)?, &mut Vec::new())
}

/// Locates the diagnostic socket of `target`. Names that cannot be the target's socket are
/// skipped and pushed to `refused` with the reason (a name owned by another uid; on the
/// fallback, anything but a socket): such a name never hides the target's own socket.
pub fn locate_target(
    target: &Target,
    refused: &mut Vec<(PathBuf, Refusal)>,
) -> Result<DiagnosticSocket, SocketError> {
    let host_pid = target.pid;
    let status = read_proc(host_pid, "status")?;
    let status = String::from_utf8_lossy(&status);
    let ns_pid = parse_ns_pid(&status).ok_or(SocketError::Malformed {
        pid: host_pid,
        file: "status",
        what: "no parsable NSpid line",
    })?;
    let [_, _, _, owner_uid] = parse_status_uids(&status).ok_or(SocketError::Malformed {
        pid: host_pid,
        file: "status",
        what: "no parsable Uid line",
    })?;
    let dir = temp_dir(host_pid)?;
    let keys = socket_keys(target)?;
    let root = open_root(host_pid)?;
    let dir_fd = open_in_root(host_pid, &root, &dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let socket = |file_name: String, exact_key: bool| DiagnosticSocket {
        host_pid,
        ns_pid,
        dir: dir.clone(),
        file_name,
        exact_key,
        target: target.clone(),
        owner_uid,
    };
    let exact: Vec<String> =
        keys.iter().map(|key| format!("dotnet-diagnostic-{ns_pid}-{key}-socket")).collect();
    for name in &exact {
        match lstat_at(&dir_fd, name) {
            Ok(st) if !owner_allowed(st.st_uid, owner_uid) => {
                let refusal = Refusal::OwnerMismatch { owner: st.st_uid, expected: owner_uid };
                refused.push((dir.join(name), refusal));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            // Anything else (a symlink of the owner, say) is for connect() to refuse with its
            // reason.
            _ => return Ok(socket(name.clone(), true)),
        }
    }
    let newest = newest_candidate(&dir_fd, ns_pid, &exact, owner_uid, |name, refusal| {
        refused.push((dir.join(name), refusal));
    })
    .map_err(|source| SocketError::Open { pid: host_pid, path: dir.clone(), source })?;
    match newest {
        Some(file_name) => Ok(socket(file_name, false)),
        None => Err(SocketError::NotFound { pid: host_pid, ns_pid, dir }),
    }
}

/// The socket file's owner may be the uid the target creates files with, or root.
fn owner_allowed(owner: u32, target_uid: u32) -> bool {
    owner == target_uid || owner == 0
}

/// Opens the socket inode without following symlinks, checks its owner and type, connects to it
/// and verifies that the listener is the pinned target. Every call re-verifies: the name may
/// have been re-bound since `locate`.
pub async fn connect(
    socket: &DiagnosticSocket,
    timeout: Duration,
) -> Result<VerifiedStream, SocketError> {
    let pid = socket.host_pid;
    let path = socket.path();
    let refused = |refusal| SocketError::Refused { pid, path: path.clone(), refusal };
    let root = open_root(pid)?;
    let fd = open_in_root(pid, &root, &path, libc::O_PATH)?;
    let st = fstat(&fd).map_err(|source| SocketError::Open { pid, path: path.clone(), source })?;
    if !owner_allowed(st.st_uid, socket.owner_uid) {
        return Err(refused(Refusal::OwnerMismatch {
            owner: st.st_uid,
            expected: socket.owner_uid,
        }));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(refused(Refusal::NotASocket { mode: st.st_mode }));
    }
    let via_fd = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let stream = match tokio::time::timeout(timeout, UnixStream::connect(&via_fd)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(source)) => return Err(SocketError::Connect { pid, path, source }),
        Err(_) => return Err(SocketError::ConnectTimeout { pid, path, timeout }),
    };
    drop(fd);
    match verify_peer(&stream, &socket.target) {
        Ok(Ok(())) => Ok(VerifiedStream { stream, host_pid: pid }),
        Ok(Err(refusal)) => Err(refused(refusal)),
        Err(source) => Err(SocketError::Connect { pid, path, source }),
    }
}

/// The listener must be the pinned target: `SO_PEERCRED` names its pid, and `SO_PEERPIDFD`
/// (Linux 6.5+) the very process — `SO_PEERCRED` alone also matches a listener created by an
/// exited process whose pid the target now has. Without `SO_PEERPIDFD` the pid must still have
/// the pinned start time (which catches a target replaced since detection, not a listener
/// inherited from an earlier holder of the pid: docs/security.md, "Peer identity").
fn verify_peer(stream: &UnixStream, target: &Target) -> io::Result<Result<(), Refusal>> {
    let pid = target.pid;
    match stream.peer_cred()?.pid() {
        Some(actual) if actual == pid as libc::pid_t => {}
        Some(actual) => {
            return Ok(Err(Refusal::PeerPidMismatch { expected: pid, actual: actual.into() }));
        }
        None => return Ok(Err(Refusal::PeerPidUnknown)),
    }
    let same = match (peer_pidfd(stream), &target.pidfd) {
        (Ok(peer), Some(pinned)) => same_process(&peer, pinned, pid)?,
        // Kernels before 6.5 (ENOPROTOOPT), or without pidfd_open: the start-time re-check.
        (Err(e), _) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {
            return Ok(start_time_recheck(target));
        }
        (Ok(_), None) => return Ok(start_time_recheck(target)),
        // Kernels that give no pidfd for an exited process.
        (Err(e), _) if matches!(e.raw_os_error(), Some(libc::ESRCH | libc::EINVAL)) => {
            return Ok(Err(Refusal::PeerExited { pid }));
        }
        (Err(e), _) => return Err(e),
    };
    Ok(if same { Ok(()) } else { Err(Refusal::PeerNotTarget { pid }) })
}

fn start_time_recheck(target: &Target) -> Result<(), Refusal> {
    let pid = target.pid;
    match start_time_key(pid) {
        Ok(now) if now == target.start_time => Ok(()),
        Ok(actual) => {
            Err(Refusal::PeerStartTimeMismatch { pid, expected: target.start_time, actual })
        }
        Err(_) => Err(Refusal::PeerExited { pid }),
    }
}

/// `SO_PEERPIDFD` of linux/socket.h (not in every libc).
const SO_PEERPIDFD: libc::c_int = 77;
/// `PID_FS_MAGIC` of linux/magic.h: pidfds are pidfs inodes (6.9+), one inode per process.
const PID_FS_MAGIC: i64 = 0x5049_4446;

fn peer_pidfd(stream: &UnixStream) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`, which outlives the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if fd < 0 || len as usize != size_of::<libc::c_int>() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "SO_PEERPIDFD gave no fd"));
    }
    // SAFETY: SO_PEERPIDFD installed a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether two pidfds refer to the same process. On pidfs (6.9+) a process has one inode for
/// its whole life and inode numbers are never reused; before, pidfds share one anonymous inode
/// and the pid each one shows in its fdinfo is compared instead (`-1` once exited): the pinned
/// process is read last, so a match means both were alive with `pid` at once.
fn same_process(peer: &OwnedFd, pinned: &OwnedFd, pid: u32) -> io::Result<bool> {
    if is_pidfs(peer)? && is_pidfs(pinned)? {
        let (a, b) = (fstat(peer)?, fstat(pinned)?);
        return Ok(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
    }
    let shown = |fd: &OwnedFd| -> io::Result<Option<i64>> {
        let text = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
        Ok(parse_pidfd_fdinfo_pid(&text))
    };
    let want = Some(i64::from(pid));
    Ok(shown(peer)? == want && shown(pinned)? == want)
}

fn is_pidfs(fd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: statfs is plain data, filled by fstatfs on a valid fd.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is a valid descriptor and sfs a writable statfs.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // f_type's integer type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    Ok(sfs.f_type as i64 == PID_FS_MAGIC)
}

/// `pidfd_open(pid, 0)`; `None` on kernels without it (ENOSYS, < 5.3).
fn pidfd_open(pid: u32) -> io::Result<Option<OwnedFd>> {
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOSYS) { Ok(None) } else { Err(e) };
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
}

/// Signal 0 through the pidfd: `Ok` while the process exists (a zombie still holds its pid).
fn pidfd_alive(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with signal 0 and no siginfo only checks for existence.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Locates and connects in one step.
pub async fn locate_and_connect(
    host_pid: u32,
    timeout: Duration,
) -> Result<(DiagnosticSocket, VerifiedStream), SocketError> {
    let socket = locate(host_pid)?;
    let stream = connect(&socket, timeout).await?;
    Ok((socket, stream))
}

/// The most tracer reads of a `/proc/<pid>/` file another process controls (its `environ` is
/// the largest: the kernel limits arguments and environment to a quarter of the stack limit,
/// 2 MiB by default). A larger file is refused, not read.
pub const MAX_PROC_FILE_BYTES: u64 = 4 << 20;

/// At most this many entries of a target's temp directory are examined for a fallback socket
/// name: a directory of millions of entries costs a bounded amount of work.
pub const MAX_TEMP_DIR_ENTRIES: usize = 100_000;

fn read_proc(pid: u32, file: &'static str) -> Result<Vec<u8>, SocketError> {
    use std::io::Read as _;
    let proc_error = |source| SocketError::Proc { pid, file, source };
    let f = fs::File::open(format!("/proc/{pid}/{file}")).map_err(proc_error)?;
    let mut bytes = Vec::new();
    f.take(MAX_PROC_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(proc_error)?;
    if bytes.len() as u64 > MAX_PROC_FILE_BYTES {
        return Err(SocketError::Malformed {
            pid,
            file,
            what: "larger than MAX_PROC_FILE_BYTES (4 MiB)",
        });
    }
    Ok(bytes)
}

/// `TMPDIR` from /proc/<pid>/environ; `/tmp` when unset or empty (CoreCLR's rule,
/// docs/protocol/diagnostic-ipc.md §1.2).
fn temp_dir(pid: u32) -> Result<PathBuf, SocketError> {
    let environ = read_proc(pid, "environ")?;
    Ok(parse_tmpdir(&environ))
}

/// The socket key: the start time (field 22) of /proc/<pid>/stat.
fn start_time_key(pid: u32) -> Result<u64, SocketError> {
    let stat = read_proc(pid, "stat")?;
    parse_start_time(&String::from_utf8_lossy(&stat)).ok_or(SocketError::Malformed {
        pid,
        file: "stat",
        what: "no parsable start time (field 22)",
    })
}

/// The socket keys the target may have computed: its start time as its own time namespace shows
/// it (docs/protocol/diagnostic-ipc.md §1.2). One key unless the namespaces' boottime offsets
/// differ by a fraction of a clock tick (then two neighbours); none if the offsets would make it
/// negative. Kernels without time namespaces have no `timens_offsets`: offset 0.
fn socket_keys(target: &Target) -> Result<Vec<u64>, SocketError> {
    let offsets = |pid: u32, path: String| -> Result<TimensOffsets, SocketError> {
        let file = "timens_offsets";
        match fs::read(&path) {
            Ok(text) => parse_timens_offsets(&String::from_utf8_lossy(&text))
                .ok_or(SocketError::Malformed { pid, file, what: "unparsable clock offsets" }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(TimensOffsets::default()),
            Err(source) => Err(SocketError::Proc { pid, file, source }),
        }
    };
    let pid = target.pid;
    let theirs = offsets(pid, format!("/proc/{pid}/timens_offsets"))?;
    let ours = offsets(std::process::id(), "/proc/self/timens_offsets".to_owned())?;
    Ok(start_time_in_namespace(
        target.start_time,
        theirs.boottime_ns - ours.boottime_ns,
        crate::kernel::procfs::ns_per_tick(),
    ))
}

/// `/proc/<pid>/root` is a magic link to the process's root; opening it (not resolving paths
/// through it by name) gives a directory fd that RESOLVE_IN_ROOT then treats as `/`.
fn open_root(pid: u32) -> Result<OwnedFd, SocketError> {
    let path = format!("/proc/{pid}/root");
    let c_path = CString::new(path.clone()).expect("no NUL in a formatted path");
    // SAFETY: c_path is a valid NUL-terminated string; the returned fd is owned below.
    let fd =
        unsafe { libc::open(c_path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(SocketError::Proc { pid, file: "root", source: io::Error::last_os_error() });
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

const RESOLVE_STRICT: u64 =
    libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

fn open_in_root(pid: u32, root: &OwnedFd, path: &Path, flags: i32) -> Result<OwnedFd, SocketError> {
    openat2(root.as_raw_fd(), path, flags, RESOLVE_STRICT).map_err(|source| {
        let refusal = match source.raw_os_error() {
            Some(libc::ELOOP) => Some(Refusal::Symlink),
            Some(libc::EXDEV) => Some(Refusal::EscapesRoot),
            _ => None,
        };
        match refusal {
            Some(refusal) => SocketError::Refused { pid, path: path.to_owned(), refusal },
            None => SocketError::Open { pid, path: path.to_owned(), source },
        }
    })
}

/// `struct open_how` of linux/openat2.h (libc's is non-exhaustive, so it cannot be built).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(2)` of `path` below `dirfd` with `RESOLVE_*` flags `resolve` (close-on-exec).
pub(crate) fn openat2(dirfd: RawFd, path: &Path, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let how = OpenHow { flags: (flags | libc::O_CLOEXEC) as u64, mode: 0, resolve };
    // SAFETY: openat2 reads `how` (size passed) and the NUL-terminated path; both outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            c_path.as_ptr(),
            &how as *const OpenHow,
            size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `fstat(2)`: what an open descriptor refers to.
pub(crate) fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; zero is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is a valid descriptor and st a writable stat.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, a symlink not followed.
fn lstat_at(dir: &OwnedFd, name: &str) -> io::Result<libc::stat> {
    let c_name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))?;
    // SAFETY: stat is plain data; zero is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: dir is a valid directory fd, c_name NUL-terminated, st writable; all outlive the
    // call.
    let rc = unsafe {
        libc::fstatat(dir.as_raw_fd(), c_name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Newest-mtime `dotnet-diagnostic-<nspid>-<digits>-socket` in the directory (older ones belong to
/// recycled pids) other than the `exact` names, among sockets owned by `owner_uid` or root.
/// Other candidates are reported to `refuse` with the reason; entries are examined without
/// following symlinks.
fn newest_candidate(
    dir: &OwnedFd,
    ns_pid: u32,
    exact: &[String],
    owner_uid: u32,
    mut refuse: impl FnMut(&str, Refusal),
) -> io::Result<Option<String>> {
    let prefix = format!("dotnet-diagnostic-{ns_pid}-");
    let mut best: Option<(SystemTime, String)> = None;
    let entries = fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?;
    for entry in entries.take(MAX_TEMP_DIR_ENTRIES) {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        let is_candidate = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix("-socket"))
            .is_some_and(|key| !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()));
        if !is_candidate || exact.contains(&name) {
            continue;
        }
        // DirEntry::metadata does not follow symlinks.
        let Ok(meta) = entry.metadata() else { continue };
        let (owner, mode) = (meta.uid(), meta.mode());
        if !owner_allowed(owner, owner_uid) {
            refuse(&name, Refusal::OwnerMismatch { owner, expected: owner_uid });
            continue;
        }
        match mode & libc::S_IFMT {
            libc::S_IFSOCK => {}
            libc::S_IFLNK => {
                refuse(&name, Refusal::Symlink);
                continue;
            }
            _ => {
                refuse(&name, Refusal::NotASocket { mode });
                continue;
            }
        }
        let Ok(modified) = meta.modified() else { continue };
        if best.as_ref().is_none_or(|(t, _)| modified > *t) {
            best = Some((modified, name));
        }
    }
    Ok(best.map(|(_, name)| name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_resolves_to_its_values() {
        let pid = std::process::id();
        let stat = fs::read_to_string("/proc/self/stat").unwrap();
        let target = Target::pin(pid).unwrap();
        let start = stat.split_whitespace().nth(21).unwrap().parse::<u64>().unwrap();
        assert_eq!(target.key(), (pid, start));
        // Same time namespace: the key is the start time tracer reads.
        assert_eq!(socket_keys(&target).unwrap(), vec![start]);
    }
}
