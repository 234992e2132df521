//! A stale listener on a recycled pid, made deterministic: run as pid 1 of a new pid namespace
//! with its own `/proc` (`unshare --pid --fork --mount-proc pid_reuse <dir>`).
//!
//! 1. A child `C` binds and listens on `<dir>/stale.sock`, passes the listener to this process
//!    over SCM_RIGHTS and exits; it is reaped.
//! 2. `ns_last_pid` is set so that the next process, an idle victim `V` with `TMPDIR=<dir>`, gets
//!    `C`'s pid.
//! 3. The listener's file is renamed to `V`'s exact runtime socket name: the kernel still reports
//!    `C`'s pid — now `V`'s — as the listener's `SO_PEERCRED` pid.
//! 4. tracer's `locate_and_connect(V)` runs here (pids and `/proc` of this namespace) and its
//!    result is printed: `PIDS <C> <V>`, then `RESULT CONNECTED` or `RESULT <error as Debug>`.

use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

fn main() -> Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).context("usage: pid_reuse <dir>")?);
    ensure!(std::process::id() == 1, "run as pid 1 of a new pid namespace (unshare --pid --fork)");
    let stale = dir.join("stale.sock");
    let (parent_end, child_end) = UnixStream::pair()?;
    // SAFETY: this process is single-threaded (no runtime started yet), so the child may run
    // arbitrary code before it exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if child == 0 {
        let code = match listen_and_pass(&stale, &child_end) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("pid_reuse child: {e:#}");
                1
            }
        };
        // SAFETY: _exit ends the forked child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let listener = receive_fd(&parent_end)?;
    let mut status = 0;
    // SAFETY: waits for our own child; status is a valid out pointer.
    ensure!(unsafe { libc::waitpid(child, &mut status, 0) } == child, "waitpid");
    ensure!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: {status}");

    // No other thread exists, so the next pid allocated in this namespace is `child`.
    std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", child - 1))?;
    let mut victim = Command::new("sh")
        .args(["-c", "echo started; read _"])
        .env("TMPDIR", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("spawning the victim")?;
    let victim_pid = victim.id();
    // spawn() returns once exec has begun, before the kernel has set up the new image's
    // environment (/proc/<pid>/environ is empty until then): wait for the shell to run.
    let mut started = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(victim.stdout.take().context("piped stdout")?),
        &mut started,
    )?;
    ensure!(started == "started\n", "the victim printed {started:?}");
    println!("PIDS {child} {victim_pid}");
    ensure!(victim_pid == child as u32, "the victim got pid {victim_pid}, not {child}");
    let name = tests::procfs::runtime_socket_name(victim_pid)?;
    std::fs::rename(&stale, dir.join(&name))?;

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result =
        rt.block_on(tracer::ipc::socket::locate_and_connect(victim_pid, Duration::from_secs(5)));
    match result {
        Ok(_) => println!("RESULT CONNECTED"),
        Err(e) => println!("RESULT {e:?}"),
    }
    drop(listener);
    drop(victim.stdin.take());
    victim.wait()?;
    Ok(())
}

fn listen_and_pass(path: &std::path::Path, to: &UnixStream) -> Result<()> {
    let listener = UnixListener::bind(path)?;
    tracer::ipc::socket::send_fd_once(to.as_fd(), listener.as_raw_fd())?;
    Ok(())
}

fn receive_fd(stream: &UnixStream) -> Result<OwnedFd> {
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    // SAFETY: msghdr is plain data; zero is a valid initial value for every field.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr().cast();
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: msg points at a writable iovec and control buffer that outlive the call.
    let received = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    ensure!(received == 1, "recvmsg: {}", std::io::Error::last_os_error());
    // SAFETY: recvmsg filled the control buffer; CMSG_FIRSTHDR checks msg_controllen.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: cmsg is null or points at a complete header inside `control`.
    ensure!(
        !cmsg.is_null()
            && unsafe {
                (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS
            },
        "no SCM_RIGHTS"
    );
    // SAFETY: an SCM_RIGHTS header carries at least one fd, which is now ours alone.
    Ok(unsafe {
        OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>()))
    })
}
