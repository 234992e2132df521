//! The `read()` transport: whole sub-buffers copied out of `trace_pipe_raw`, for kernels that
//! cannot map the ring buffer (before 6.10) or when asked to.
use std::os::fd::{AsRawFd as _, OwnedFd};

use anyhow::Context as _;
use tokio::io::unix::AsyncFd;
use tracer_decode::ftrace::stream::{RecordRef, StreamDecoder};

/// Reads and decodes pages of one CPU until the file has none (`EAGAIN`).
pub(super) fn drain(
    fd: &AsyncFd<OwnedFd>,
    cpu: u32,
    idx: usize,
    buf: &mut [u8],
    pages: &mut u64,
    decoder: &mut StreamDecoder,
    sink: &mut impl FnMut(usize, RecordRef<'_>),
) -> anyhow::Result<()> {
    loop {
        // SAFETY: buf is a valid writable buffer of buf.len() bytes.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(()),
                Some(libc::EINTR) => continue,
                _ => return Err(err).context(format!("read of cpu {cpu} trace_pipe_raw")),
            }
        }
        if n == 0 {
            return Ok(());
        }
        let id = *pages;
        *pages += 1;
        decoder.whole_page(idx, cpu, id, &buf[..n as usize], sink)?;
    }
}
