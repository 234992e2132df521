//! The mapped transport (Linux ≥ 6.10): the meta page and sub-buffers of `trace_pipe_raw`
//! mapped read-only, consumed with `TRACE_MMAP_IOCTL_GET_READER`; no copy of record bytes.
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, bail};
use tokio::io::unix::AsyncFd;
use tracer_decode::ftrace::page::{
    COMMIT_LEN_MASK, CorruptReason, Corruption, PageCursor, PageLayout, header_from_words,
};
use tracer_decode::ftrace::stream::{RecordRef, StreamDecoder};

use super::open_trace_pipe_raw;
use crate::kernel::tracefs::Instance;

/// `_IO('R', 0x20)`: swap in the next reader sub-buffer and refresh the meta page.
const TRACE_MMAP_IOCTL_GET_READER: libc::c_ulong = 0x5220;

// Offsets in `struct trace_buffer_meta` (include/uapi/linux/trace_mmap.h).
const META_PAGE_SIZE: usize = 0;
const META_SUBBUF_SIZE: usize = 8;
const META_NR_SUBBUFS: usize = 12;
const META_READER_ID: usize = 24;
const META_READER_READ: usize = 28;
const META_STRUCT_LEN: usize = 80;

fn get_reader(fd: std::os::fd::RawFd) -> anyhow::Result<()> {
    // SAFETY: a plain ioctl without argument on an open trace_pipe_raw fd.
    let rc = unsafe { libc::ioctl(fd, TRACE_MMAP_IOCTL_GET_READER, 0) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("TRACE_MMAP_IOCTL_GET_READER");
    }
    Ok(())
}

/// The read-only shared mapping of one CPU buffer: meta page + sub-buffers.
pub(super) struct Mapping {
    meta: *const u8,
    meta_len: usize,
    data: *const u8,
    data_len: usize,
    subbuf_size: usize,
    nr_subbufs: usize,
    layout: PageLayout,
    /// Current reader sub-buffer and the parse position in it (None: not started).
    reader_id: usize,
    cursor: Option<PageCursor>,
    /// No page parsed yet: the first one may have been partly consumed by an earlier reader.
    first_page: bool,
}

// SAFETY: the mapping is plain shared memory owned by this struct; nothing is thread-bound, and
// through `&Mapping` it is only read (volatile meta reads, atomic commit loads).
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

fn mmap_ro(fd: &OwnedFd, len: usize, offset: usize) -> std::io::Result<*const u8> {
    // SAFETY: a fresh mapping chosen by the kernel; PROT_READ + MAP_SHARED as the ABI requires.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    MAPPED.lock().expect("not poisoned").push((p as usize, len));
    Ok(p as *const u8)
}

fn munmap_ro(p: *const u8, len: usize) {
    MAPPED.lock().expect("not poisoned").retain(|&(start, _)| start != p as usize);
    // SAFETY: `p`/`len` is a region `mmap_ro` mapped and nothing reads it any more.
    unsafe { libc::munmap(p as *mut _, len) };
}

/// Every ring-buffer region this process has mapped (start, length), for
/// [`release_all_mappings`].
static MAPPED: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

/// Drops the process's references to every mapped ring buffer (a mapping keeps its instance
/// busy even after the fd is closed) by laying anonymous memory over each region: a reader that
/// still runs sees zeroes, not a fault. Only for an exit that follows at once.
pub(crate) fn release_all_mappings() {
    let regions = MAPPED.lock().map(|m| m.clone()).unwrap_or_default();
    for (start, len) in regions {
        // SAFETY: MAP_FIXED over a region this process mapped itself; the process is exiting
        // and only ever reads these pages.
        unsafe {
            libc::mmap(
                start as *mut _,
                len,
                libc::PROT_READ,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
    }
}

impl Mapping {
    pub(super) fn new(fd: &OwnedFd, layout: &PageLayout) -> anyhow::Result<Mapping> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let mut meta = mmap_ro(fd, page, 0).context("mmap of the meta page")?;
        let mut meta_len = page;
        let mut m = Mapping {
            meta,
            meta_len,
            data: std::ptr::null(),
            data_len: 0,
            subbuf_size: 0,
            nr_subbufs: 0,
            layout: *layout,
            reader_id: 0,
            cursor: None,
            first_page: true,
        };
        let meta_page_size = m.meta_u32(META_PAGE_SIZE) as usize;
        if meta_page_size > page {
            munmap_ro(meta, meta_len);
            m.meta = std::ptr::null();
            meta = mmap_ro(fd, meta_page_size, 0).context("remapping the meta page")?;
            meta_len = meta_page_size;
            m.meta = meta;
            m.meta_len = meta_len;
        }
        m.subbuf_size = m.meta_u32(META_SUBBUF_SIZE) as usize;
        m.nr_subbufs = m.meta_u32(META_NR_SUBBUFS) as usize;
        if m.subbuf_size != layout.subbuf_size() || m.nr_subbufs == 0 {
            bail!(
                "meta page reports sub-buffers of {} bytes ×{}, header_page says {}",
                m.subbuf_size,
                m.nr_subbufs,
                layout.subbuf_size()
            );
        }
        let data_len = m.subbuf_size * m.nr_subbufs;
        m.data = mmap_ro(fd, data_len, meta_page_size).context("mmap of the sub-buffers")?;
        m.data_len = data_len;
        m.reader_id = m.meta_u32(META_READER_ID) as usize;
        Ok(m)
    }

    fn meta_u32(&self, offset: usize) -> u32 {
        debug_assert!(offset + 4 <= META_STRUCT_LEN.min(self.meta_len));
        // SAFETY: within the mapped meta page; the kernel updates it only inside our ioctl.
        unsafe { std::ptr::read_volatile(self.meta.add(offset).cast::<u32>()) }
    }

    fn subbuf(&self, id: usize) -> *const u8 {
        // SAFETY: id < nr_subbufs is checked by the caller; inside the data mapping.
        unsafe { self.data.add(id * self.subbuf_size) }
    }

    /// Acquire-load of a sub-buffer's commit word: the data below it is then complete.
    fn load_commit(&self, id: usize) -> u64 {
        // SAFETY: the commit word is 8-aligned inside the sub-buffer; the kernel writes it with
        // local_t stores, so an atomic load is the right access.
        let commit = unsafe { &*(self.subbuf(id).add(8) as *const AtomicU64) };
        commit.load(Ordering::Acquire)
    }

    /// The consumer protocol of the mapped buffer (docs/protocol/ftrace.md §6.5): parse the reader
    /// sub-buffer up to its commit, GET_READER, and continue on the same page (new commit) or the
    /// next.
    pub(super) fn drain(
        &mut self,
        fd: &AsyncFd<OwnedFd>,
        cpu: u32,
        idx: usize,
        decoder: &mut StreamDecoder,
        sink: &mut impl FnMut(usize, RecordRef<'_>),
    ) -> anyhow::Result<()> {
        // GET_READER calls in a row that brought nothing new. The first call after a page is
        // read to its commit may only move the kernel's read position (docs/protocol/ftrace.md §6.4
        // step 2); only a second one that swaps in no new page shows the buffer is drained.
        let mut idle_calls = 0;
        // Set once the writer was seen appending to our reader page: the ring then holds nothing
        // older, so after parsing what it committed so far the CPU is drained for this wake-up.
        // Chasing the writer further would cost one ioctl per few records.
        let mut caught_writer = false;
        // Bounded so a CPU written faster than we read cannot starve the others.
        for _ in 0..3 * self.nr_subbufs + 2 {
            let id = self.reader_id;
            if id >= self.nr_subbufs {
                bail!("kernel reported reader sub-buffer {id} of {}", self.nr_subbufs);
            }
            let commit = self.load_commit(id);
            let commit_len = (commit & COMMIT_LEN_MASK) as usize;
            // Bytes the kernel guarantees stable: header, committed data, and the stored lost
            // count right after it (never beyond the sub-buffer).
            let stable = (self.layout.data_offset + commit_len + self.layout.commit_size)
                .min(self.subbuf_size);
            // SAFETY: within sub-buffer `id` of the mapping; these bytes are not written anymore.
            let page = unsafe { std::slice::from_raw_parts(self.subbuf(id), stable) };
            if self.cursor.is_none() {
                let ts = u64::from_le_bytes(page[0..8].try_into().expect("8 bytes"));
                match header_from_words(page, &self.layout, ts, commit) {
                    Ok(header) => {
                        decoder.missed(idx, header.missed);
                        let mut cursor = PageCursor::new(&self.layout, &header);
                        if std::mem::take(&mut self.first_page) {
                            // Skip what an earlier reader of this buffer consumed.
                            let consumed = self.meta_u32(META_READER_READ) as usize;
                            if consumed <= commit_len {
                                cursor.pos += consumed;
                            }
                        }
                        self.cursor = Some(cursor);
                    }
                    Err(c) => {
                        decoder.corrupt(idx, cpu, id as u64, c)?;
                        self.cursor = Some(PageCursor { pos: 0, ts: 0, ended: true });
                    }
                }
            }
            let cursor = self.cursor.as_mut().expect("set above");
            if !cursor.ended {
                let end = self.layout.data_offset + commit_len;
                if end > self.subbuf_size {
                    let c = Corruption {
                        offset: 8,
                        reason: CorruptReason::CommitBeyondSubbuf {
                            commit_len,
                            data_size: self.layout.data_size,
                        },
                    };
                    cursor.ended = true;
                    decoder.corrupt(idx, cpu, id as u64, c)?;
                } else {
                    decoder.parse(idx, cpu, id as u64, page, cursor, end, sink)?;
                }
            }
            if caught_writer {
                return Ok(());
            }
            let parsed_to = cursor.pos;
            let ended = cursor.ended;
            get_reader(fd.as_raw_fd())?;
            let new_id = self.meta_u32(META_READER_ID) as usize;
            if new_id != id {
                self.reader_id = new_id;
                self.cursor = None;
                idle_calls = 0;
                continue;
            }
            let now = (self.load_commit(id) & COMMIT_LEN_MASK) as usize;
            if !ended && self.layout.data_offset + now > parsed_to {
                // The kernel now counts everything up to `now` as consumed: parse it, then stop.
                caught_writer = true;
                continue;
            }
            idle_calls += 1;
            if idle_calls >= 2 {
                return Ok(());
            }
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if !self.data.is_null() {
            munmap_ro(self.data, self.data_len);
        }
        if !self.meta.is_null() {
            munmap_ro(self.meta, self.meta_len);
        }
    }
}

/// What a successful trial mapping of one CPU buffer showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmapProbe {
    pub meta_page_size: usize,
    pub subbuf_size: usize,
    pub nr_subbufs: usize,
}

/// Maps `cpu`'s buffer of `instance`, issues one GET_READER and unmaps: proves the kernel
/// supports the mapped consumer (`tracer check`). Use an idle scratch instance.
pub fn probe_mmap(instance: &Instance, cpu: u32) -> anyhow::Result<MmapProbe> {
    let layout = instance.page_layout()?;
    let fd = open_trace_pipe_raw(instance, cpu)?;
    let m = Mapping::new(&fd, &layout)?;
    get_reader(fd.as_raw_fd())?;
    Ok(MmapProbe {
        meta_page_size: m.meta_u32(META_PAGE_SIZE) as usize,
        subbuf_size: m.subbuf_size,
        nr_subbufs: m.nr_subbufs,
    })
}
