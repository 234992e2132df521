//! Child processes that speak a line protocol on stdin/stdout (the CoreCLR host, the IPC peers):
//! lines are awaited with a timeout, never with sleeps, and the child is killed on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};

pub struct LineProcess {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl LineProcess {
    pub fn spawn(name: &str, mut command: Command) -> Result<LineProcess> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {name}: {command:?}"))?;
        let lines = line_channel(child.stdout.take().expect("piped stdout"));
        let stdin = child.stdin.take();
        Ok(LineProcess { name: name.to_owned(), child, stdin, lines })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Next stdout line, or an error naming the process if none comes within `timeout`.
    pub fn next_line(&mut self, timeout: Duration) -> Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => {
                bail!("{} printed nothing within {timeout:?}", self.name)
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().ok();
                bail!("{} closed stdout (exit status {status:?})", self.name)
            }
        }
    }

    /// The next stdout line if one has arrived, without waiting (for a loop that does other
    /// work meanwhile); an error when the output is closed.
    pub fn try_next_line(&mut self) -> Result<Option<String>> {
        match self.lines.try_recv() {
            Ok(line) => Ok(Some(line)),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => {
                let status = self.child.wait().ok();
                bail!("{} closed stdout (exit status {status:?})", self.name)
            }
        }
    }

    /// Waits for a line starting with `prefix`; returns the rest of it.
    pub fn expect_line(&mut self, prefix: &str, timeout: Duration) -> Result<String> {
        let line = self.next_line(timeout)?;
        line.strip_prefix(prefix)
            .map(|rest| rest.trim().to_owned())
            .ok_or_else(|| anyhow!("{}: expected {prefix:?}, got {line:?}", self.name))
    }

    /// Waits for a line starting with `prefix`, skipping other lines; returns the rest of it.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .next_line(left)
                .with_context(|| format!("waiting for {prefix:?} from {}", self.name))?;
            if let Some(rest) = line.strip_prefix(prefix) {
                return Ok(rest.trim().to_owned());
            }
        }
    }

    /// Waits until the process exits by itself; an error if it is still running after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<()> {
        let status = exit_status_within(&mut self.child, timeout)?
            .with_context(|| format!("{} still running after {timeout:?}", self.name))?;
        ensure!(status.success(), "{} exited with {status}", self.name);
        Ok(())
    }

    /// Closes its stdin (EOF tells the line-protocol helpers to finish).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    pub fn send_line(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .with_context(|| format!("writing {line:?} to {}", self.name))
    }

    /// Sends `line` and returns the reply line that starts with `prefix`.
    pub fn request(&mut self, line: &str, prefix: &str, timeout: Duration) -> Result<String> {
        self.send_line(line)?;
        self.expect_line(prefix, timeout)
    }
}

/// A process with `TMPDIR=tmpdir` that serves no diagnostic socket (a target whose socket is
/// missing or squatted). Returned once its exec has completed: right after `spawn` the kernel may
/// not have set up the new environment yet, and `/proc/<pid>/environ` can still read as empty.
pub fn spawn_idle_target(tmpdir: &std::path::Path) -> Result<LineProcess> {
    let mut command = Command::new("sh");
    command.args(["-c", "echo READY; read _"]).env("TMPDIR", tmpdir);
    let mut target = LineProcess::spawn("idle target", command)?;
    target.expect_line("READY", Duration::from_secs(10))?;
    Ok(target)
}

/// `target/<profile>/tracer`, next to the directory holding the running test executable.
pub fn tracer_binary() -> std::path::PathBuf {
    built_binary("tracer", "`cargo build -p tracer`")
}

/// A binary of the workspace next to the running test executable's profile directory;
/// `how`: the command that builds it.
pub fn built_binary(name: &str, how: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(std::path::Path::parent).expect("target/<profile>");
    let bin = profile_dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build it first ({how}, or `cargo xtask test`)",
        bin.display()
    );
    bin
}

/// The child's exit status once it has exited, or `None` if it is still running after `timeout`.
/// Waits on a pidfd, which becomes readable when the process exits: no polling.
fn exit_status_within(
    child: &mut Child,
    timeout: Duration,
) -> Result<Option<std::process::ExitStatus>> {
    if let Some(status) = child.try_wait()? {
        return Ok(Some(status));
    }
    let pid = libc::pid_t::try_from(child.id()).context("pid out of range")?;
    // SAFETY: pidfd_open takes a pid and flags; the child is not reaped yet (try_wait above saw
    // it running, and only we wait for it), so the pid is still its own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    ensure!(fd >= 0, "pidfd_open({pid}): {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    Ok(wait_readable(pidfd.as_fd(), timeout)?.then(|| child.wait()).transpose()?)
}

/// Waits until process `pid` (not a child of this one: another's, which reaps it) has exited;
/// an error if it is still running after `timeout`, or was gone before it could be watched.
pub fn wait_gone(pid: u32, timeout: Duration) -> Result<()> {
    let raw = libc::pid_t::try_from(pid).context("pid out of range")?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
    ensure!(fd >= 0, "pidfd_open({pid}): {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    ensure!(wait_readable(pidfd.as_fd(), timeout)?, "pid {pid} still running after {timeout:?}");
    Ok(())
}

/// Waits until `fd` is readable (data, end of file or a process exit for a pidfd); false when
/// `timeout` passed first.
fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let millis = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut poll, 1, millis) };
        if ready < 0 {
            let err = std::io::Error::last_os_error();
            ensure!(err.kind() == std::io::ErrorKind::Interrupted, "poll: {err}");
            continue;
        }
        if ready > 0 {
            return Ok(true);
        }
        if left.is_zero() {
            return Ok(false);
        }
    }
}

/// The next line of a child's piped output, read on this thread — dropping `reader` then closes
/// the pipe at once (`| head -1`), which a reader thread blocked in `read` would not — or an
/// error when no complete line arrives within `timeout` or the output is closed.
pub fn read_line_within<R: Read + AsFd>(
    reader: &mut BufReader<R>,
    timeout: Duration,
) -> Result<String> {
    let deadline = Instant::now() + timeout;
    let mut line = Vec::new();
    loop {
        if reader.buffer().is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let partial = String::from_utf8_lossy(&line);
            ensure!(
                wait_readable(reader.get_ref().as_fd(), left)?,
                "no complete line within {timeout:?} (so far {partial:?})"
            );
        }
        let buf = reader.fill_buf()?;
        ensure!(!buf.is_empty(), "output closed (after {:?})", String::from_utf8_lossy(&line));
        match buf.iter().position(|&b| b == b'\n') {
            Some(end) => {
                line.extend_from_slice(&buf[..=end]);
                reader.consume(end + 1);
                return String::from_utf8(line).context("a line that is not UTF-8");
            }
            None => {
                let n = buf.len();
                line.extend_from_slice(buf);
                reader.consume(n);
            }
        }
    }
}

/// Waits for a child that was told to stop (a signal) to exit; panics after `timeout`.
pub fn wait_child_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    exit_status_within(child, timeout)
        .expect("try_wait")
        .unwrap_or_else(|| panic!("child did not exit within {timeout:?}"))
}

/// Lines read from `r` (a child's stdout or stderr) on a thread, as they arrive.
pub fn line_channel(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

impl Drop for LineProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
