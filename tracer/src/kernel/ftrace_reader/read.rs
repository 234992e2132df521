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
    let mut chase = WriterChase::default();
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
        let caught_up = chase.caught_up(committed, decoder.layout().data_size);
        if to == DrainTo::Writer && caught_up {
            return Ok(());
        }
    }
}

/// The stop rule of a [`DrainTo::Writer`] drain, fed each page's committed length as read.
#[derive(Default)]
struct WriterChase {
    short_in_a_row: u8,
}

impl WriterChase {
    /// Whether this page is the second short one (under half of `data_size`) in a row.
    /// `None` (a page whose header does not parse, counted as corrupt) is not short.
    fn caught_up(&mut self, committed: Option<usize>, data_size: usize) -> bool {
        let short = committed.is_some_and(|len| len < data_size / 2);
        self.short_in_a_row = if short { self.short_in_a_row.saturating_add(1) } else { 0 };
        self.short_in_a_row >= 2
    }
}

#[cfg(test)]
mod tests {
    use super::WriterChase;

    const DATA: usize = 4080;

    /// The pages' committed lengths → the index of the page the drain stops after.
    fn stop_after(pages: &[Option<usize>]) -> Option<usize> {
        let mut chase = WriterChase::default();
        pages.iter().position(|&committed| chase.caught_up(committed, DATA))
    }

    #[test]
    fn two_short_pages_in_a_row_stop_the_drain() {
        assert_eq!(stop_after(&[Some(DATA), Some(368), Some(368)]), Some(2));
        assert_eq!(stop_after(&[Some(0), Some(DATA / 2 - 1)]), Some(1));
    }

    #[test]
    fn one_short_page_between_full_ones_does_not() {
        // The rest of a page read part-way at the last wake-up, then full pages again.
        let pages = [Some(200), Some(DATA), Some(300), Some(DATA / 2), Some(DATA)];
        assert_eq!(stop_after(&pages), None);
    }

    #[test]
    fn a_corrupt_page_breaks_the_run() {
        assert_eq!(stop_after(&[Some(16), None, Some(16)]), None);
        assert_eq!(stop_after(&[Some(16), None, Some(16), Some(16)]), Some(3));
    }
}
