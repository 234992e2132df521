//! Plays the runtime side of a CollectTracing5 user_events session, written from the protocol
//! documentation (docs/protocol/diagnostic-ipc.md §4.2), not from tracer's code: reads the whole
//! message, then `recvmsg` of one byte carrying SCM_RIGHTS, writes `fd-ok\n` through the received
//! fd (so the test can see it is the fd it passed), replies OK with session id 0x5E5510, and keeps
//! the session until the client closes.
//!
//! Socket: this process's runtime name in `$TMPDIR`; connections that do not start with
//! CollectTracing5 are closed (other tracers on the host may probe it). stdout: `READY <path>`,
//! then `RECEIVED <message bytes> <extra data bytes> <fds>`. Then on stdin: `status` answers
//! `SESSION open` or `SESSION closed` (whether the client still holds the connection, from a
//! non-blocking peek at it); `wait-close` answers `CLOSED` once the client closed it.

use std::io::{BufRead, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use tests::procfs;

const SESSION_ID: u64 = 0x5E_5510;

fn main() -> Result<()> {
    let dir = std::env::var("TMPDIR").ok().filter(|d| !d.is_empty()).unwrap_or("/tmp".into());
    let path = PathBuf::from(dir).join(procfs::runtime_socket_name(std::process::id())?);
    let listener = UnixListener::bind(&path)?;
    println!("READY {}", path.display());
    let (mut stream, message) = accept_collect_tracing(&listener)?;

    let (extra, fds) = receive_fds(stream.as_raw_fd())?;
    for fd in &fds {
        std::fs::File::from(fd.try_clone()?).write_all(b"fd-ok\n")?;
    }
    println!("RECEIVED {} {} {}", message.len(), extra, fds.len());
    drop(fds);

    let mut reply = b"DOTNET_IPC_V1\0".to_vec();
    reply.extend_from_slice(&28u16.to_le_bytes());
    reply.extend_from_slice(&[0xFF, 0x00, 0, 0]);
    reply.extend_from_slice(&SESSION_ID.to_le_bytes());
    stream.write_all(&reply)?;

    // The session lives until the client closes its end.
    for line in std::io::stdin().lock().lines() {
        match line?.as_str() {
            "status" => {
                println!("SESSION {}", if is_open(&stream)? { "open" } else { "closed" });
            }
            "wait-close" => {
                let mut rest = Vec::new();
                stream.read_to_end(&mut rest)?;
                println!("CLOSED");
            }
            other => bail!("unknown command {other:?}"),
        }
    }
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// The first connection whose message is CollectTracing5 (command set 0x02, id 0x06), with that
/// message. Any other (another tracer on this host probing what looks like a runtime, e.g. a
/// `tracer run` of a test running at the same time) is closed unanswered, as a runtime that
/// does not know the command would do.
fn accept_collect_tracing(listener: &UnixListener) -> Result<(UnixStream, Vec<u8>)> {
    loop {
        let (mut stream, _) = listener.accept()?;
        let mut message = vec![0u8; 20];
        if stream.read_exact(&mut message).is_err() || &message[..14] != b"DOTNET_IPC_V1\0" {
            continue;
        }
        if message[16..18] != [0x02, 0x06] {
            continue;
        }
        let size = usize::from(u16::from_le_bytes([message[14], message[15]]));
        ensure!(size >= 20, "message size {size}");
        message.resize(size, 0);
        stream.read_exact(&mut message[20..])?;
        return Ok((stream, message));
    }
}

/// Whether the client still holds the connection: a non-blocking peek finds no end of stream.
fn is_open(stream: &UnixStream) -> Result<bool> {
    let mut byte = 0u8;
    let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT;
    // SAFETY: peeks at most one byte into a live local buffer.
    let n = unsafe { libc::recv(stream.as_raw_fd(), (&raw mut byte).cast(), 1, flags) };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        ensure!(err.kind() == std::io::ErrorKind::WouldBlock, "recv: {err}");
        // Nothing to read, and no end of stream: open.
        return Ok(true);
    }
    Ok(n > 0)
}

/// One `recvmsg`: (data bytes, received fds).
fn receive_fds(socket: RawFd) -> Result<(usize, Vec<OwnedFd>)> {
    let mut data = [0u8; 16];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let mut control = [0u64; 16];
    // SAFETY: plain-data struct, zero-initialised, then pointed at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control);
    // SAFETY: msg describes valid buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    ensure!(n >= 0, "recvmsg: {}", std::io::Error::last_os_error());
    ensure!(msg.msg_flags & libc::MSG_CTRUNC == 0, "control data truncated");
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* walk stays within msg_controllen as filled by the kernel.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..payload / size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((usize::try_from(n).context("byte count")?, fds))
}
