//! Finding a detected process's diagnostic socket and connecting to it without trusting the
//! paths an (unprivileged, possibly containerised) target controls.
//!
//! tracer runs as root and resolves names inside the target's root and temp dir, which the
//! target owns. So (docs/protocol/diagnostic-ipc.md §1.3, issue 3):
//! * the socket name uses the target's innermost pid (`NSpid`), its `TMPDIR` and its start time
//!   (field 22 of `/proc/<pid>/stat`), exactly as the runtime builds it;
//! * the path is opened with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_MAGICLINKS)` relative to `/proc/<pid>/root`, so no symlink (not even one inside
//!   the container) can redirect us, as an `O_PATH` fd that must be a socket;
//! * we connect to *that inode* through `/proc/self/fd/<n>` (no second path lookup), and the
//!   listener's `SO_PEERCRED` pid must be the detected pid — a socket bound by anyone else is
//!   refused before a single byte is sent.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use thiserror::Error;
use tokio::net::UnixStream;
use tracer_decode::procfs::{parse_ns_pid, parse_start_time, parse_tmpdir};

/// Where a process's diagnostic socket is, as seen from inside the process's root.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// was taken instead (e.g. the start-time key differs across time namespaces).
    pub exact_key: bool,
}

impl DiagnosticSocket {
    /// Path inside the target's root, for messages.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.file_name)
    }
}

/// Why tracer refused to use a socket. Nothing has been sent to it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
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
    #[error(
        "pid {pid} has no diagnostic socket dotnet-diagnostic-{ns_pid}-*-socket in {dir} \
         (diagnostics disabled with DOTNET_EnableDiagnostics=0, or not a .NET process)"
    )]
    NotFound { pid: u32, ns_pid: u32, dir: PathBuf },
    #[error("cannot open {path} inside the root of pid {pid}: {source}")]
    Open {
        pid: u32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("refused diagnostic socket {path} of pid {pid}: {refusal}")]
    Refused { pid: u32, path: PathBuf, refusal: Refusal },
    #[error("connecting to {path} of pid {pid} failed: {source}")]
    Connect {
        pid: u32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("connecting to {path} of pid {pid} timed out after {timeout:?}")]
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
        let send =
            self.stream.async_io(tokio::io::Interest::WRITABLE, || send_fd_once(&self.stream, fd));
        match tokio::time::timeout(timeout, send).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "sending the fd timed out")),
        }
    }
}

fn send_fd_once(stream: &UnixStream, fd: RawFd) -> io::Result<()> {
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
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    match sent {
        1 => Ok(()),
        -1 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::new(io::ErrorKind::WriteZero, "sendmsg sent no data byte")),
    }
}

/// Locates the diagnostic socket of `host_pid` (docs/protocol/diagnostic-ipc.md §1.3).
pub fn locate(host_pid: u32) -> Result<DiagnosticSocket, SocketError> {
    let ns_pid = innermost_ns_pid(host_pid)?;
    let dir = temp_dir(host_pid)?;
    let key = start_time_key(host_pid)?;
    let root = open_root(host_pid)?;
    let dir_fd = open_in_root(host_pid, &root, &dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let exact = format!("dotnet-diagnostic-{ns_pid}-{key}-socket");
    let exists = match openat2(dir_fd.as_raw_fd(), Path::new(&exact), libc::O_PATH, RESOLVE_STRICT)
    {
        Ok(_) => true,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
        // Anything else (a symlink, say) is for connect() to refuse with its reason.
        Err(_) => true,
    };
    if exists {
        return Ok(DiagnosticSocket { host_pid, ns_pid, dir, file_name: exact, exact_key: true });
    }
    let newest = newest_candidate(&dir_fd, ns_pid).map_err(|source| SocketError::Open {
        pid: host_pid,
        path: dir.clone(),
        source,
    })?;
    match newest {
        Some(file_name) => {
            Ok(DiagnosticSocket { host_pid, ns_pid, dir, file_name, exact_key: false })
        }
        None => Err(SocketError::NotFound { pid: host_pid, ns_pid, dir }),
    }
}

/// Opens the socket inode without following symlinks, checks it, connects to it and verifies
/// the listener's pid. Every call re-verifies: the name may have been re-bound since `locate`.
pub async fn connect(
    socket: &DiagnosticSocket,
    timeout: Duration,
) -> Result<VerifiedStream, SocketError> {
    let pid = socket.host_pid;
    let path = socket.path();
    let refused = |refusal| SocketError::Refused { pid, path: path.clone(), refusal };
    let root = open_root(pid)?;
    let fd = open_in_root(pid, &root, &path, libc::O_PATH)?;
    let mode =
        fstat_mode(&fd).map_err(|source| SocketError::Open { pid, path: path.clone(), source })?;
    if mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(refused(Refusal::NotASocket { mode }));
    }
    let via_fd = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let stream = match tokio::time::timeout(timeout, UnixStream::connect(&via_fd)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(source)) => return Err(SocketError::Connect { pid, path, source }),
        Err(_) => return Err(SocketError::ConnectTimeout { pid, path, timeout }),
    };
    drop(fd);
    let cred = stream.peer_cred().map_err(|source| SocketError::Connect {
        pid,
        path: path.clone(),
        source,
    })?;
    match cred.pid() {
        Some(actual) if actual == pid as libc::pid_t => {
            Ok(VerifiedStream { stream, host_pid: pid })
        }
        Some(actual) => {
            Err(refused(Refusal::PeerPidMismatch { expected: pid, actual: actual.into() }))
        }
        None => Err(refused(Refusal::PeerPidUnknown)),
    }
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

fn read_proc(pid: u32, file: &'static str) -> Result<Vec<u8>, SocketError> {
    fs::read(format!("/proc/{pid}/{file}")).map_err(|source| SocketError::Proc {
        pid,
        file,
        source,
    })
}

/// Last value of `NSpid:` in /proc/<pid>/status: the pid inside the innermost pid namespace.
fn innermost_ns_pid(pid: u32) -> Result<u32, SocketError> {
    let status = read_proc(pid, "status")?;
    parse_ns_pid(&String::from_utf8_lossy(&status)).ok_or(SocketError::Malformed {
        pid,
        file: "status",
        what: "no parsable NSpid line",
    })
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

fn openat2(dirfd: RawFd, path: &Path, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
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

fn fstat_mode(fd: &OwnedFd) -> io::Result<u32> {
    // SAFETY: stat is plain data, filled by fstat on a valid fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_mode)
}

/// Newest-mtime `dotnet-diagnostic-<nspid>-<digits>-socket` in the directory (older ones belong to
/// recycled pids). Entries are examined without following symlinks.
fn newest_candidate(dir: &OwnedFd, ns_pid: u32) -> io::Result<Option<String>> {
    let prefix = format!("dotnet-diagnostic-{ns_pid}-");
    let mut best: Option<(SystemTime, String)> = None;
    for entry in fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        let is_candidate = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix("-socket"))
            .is_some_and(|key| !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()));
        if !is_candidate {
            continue;
        }
        // DirEntry::metadata does not follow symlinks.
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else { continue };
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
        assert_eq!(innermost_ns_pid(pid).unwrap(), pid);
        let stat = fs::read_to_string("/proc/self/stat").unwrap();
        let key = start_time_key(pid).unwrap();
        assert_eq!(stat.split_whitespace().nth(21).unwrap().parse::<u64>().unwrap(), key);
    }
}
