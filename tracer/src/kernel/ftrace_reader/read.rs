//! The `read()` transport: whole sub-buffers copied out of `trace_pipe_raw`, for kernels that
//! cannot map the ring buffer (before 6.10) or when asked to.
use std::os::fd::{AsRawFd as _, OwnedFd};

use anyhow::Context as _;
use tokio::io::unix::AsyncFd;
use tracer_decode::ftrace::stream::{RecordRef, StreamDecoder};

use super::DrainTo;

/// Reads and decodes pages of one CPU until the file has none (`EAGAIN`) or, for
/// [`DrainTo::Writer`], until two pages in a row came back less than half full.
///
/// A `read()` of the page the writer is on copies out only the records committed so far, one by
/// one under the buffer's lock; a reader that keeps up with a fast writer would read that page
/// over and over, a few records per syscall (at one producer CPU's full speed, ~23 records of
/// 16 bytes per `read()` against 127 on a full page). Two short pages in a row are that chase —
/// one short page alone may be the rest of a page read part-way at the last wake-up — and what
/// stays behind is the writer's page, read at the next wake-up or poll interval
/// (docs/protocol/ftrace.md §6.1).
#[allow(clippy::too_many_arguments)]
pub(super) fn drain(
    fd: &AsyncFd<OwnedFd>,
    cpu: u32,
    idx: usize,
    buf: &mut [u8],
    pages: &mut u64,
    to: DrainTo,
    decoder: &mut StreamDecoder,
    sink: &mut impl FnMut(usize, RecordRef<'_>),
) -> anyhow::Result<()> {
    let mut short_in_a_row = 0;
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
        let committed = decoder.whole_page(idx, cpu, id, &buf[..n as usize], sink)?;
        // A page whose header does not parse was counted as corrupt: not short.
        let short = committed.is_some_and(|len| len < decoder.layout().data_size / 2);
        short_in_a_row = if short { short_in_a_row + 1 } else { 0 };
        if to == DrainTo::Writer && short_in_a_row == 2 {
            return Ok(());
        }
    }
}
