//! Consumer of an ftrace instance's per-CPU ring buffers: memory-mapped `trace_pipe_raw`
//! (Linux ≥ 6.10: meta page + sub-buffers, `TRACE_MMAP_IOCTL_GET_READER`) with a fallback to
//! page-sized `read()`s of the same file. Pages are decoded by [`crate::decode::ftrace::page`];
//! records of the given tracepoints come out either merged across CPUs in timestamp order
//! ([`FtraceReader::next_batch`], owned [`Event`]s), or borrowed straight from the page they were
//! decoded from, in order per CPU ([`FtraceReader::next_records`], no copy, no allocation).
//!
//! Library use (the `tracer ftrace` pipeline, and user_events sessions in `tracer run`):
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use tracer::kernel::ftrace_reader::{FtraceReader, ReaderConfig, Tracepoint};
//! use tracer::kernel::tracefs::{Instance, Tracefs};
//! let instance = Arc::new(Instance::create(&Tracefs::find_or_mount()?)?);
//! instance.set_trace_clock("mono")?;
//! let tp = Tracepoint::load(&instance, "sched", "sched_process_exec")?;
//! instance.enable(&"sched:sched_process_exec".parse().map_err(anyhow::Error::msg)?)?;
//! let mut reader = FtraceReader::open(instance.clone(), vec![tp], ReaderConfig::default())?;
//! instance.set_tracing_on(true)?;
//! loop {
//!     for event in reader.next_batch().await? {
//!         println!("{} cpu{} {} {:?}", event.ts, event.cpu, event.common.pid, event.fields());
//!     }
//! }
//! # }
//! ```

use std::collections::{HashMap, VecDeque};
use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::decode::ftrace::format::EventFormat;
use crate::decode::ftrace::page::{
    COMMIT_LEN_MASK, CorruptReason, Corruption, Missed, PageCursor, PageLayout, RawEvent,
    header_from_words, parse_header,
};
use crate::decode::ftrace::record::{
    CommonFields, Fields, RecordError, common_fields, decode_fields,
};
use crate::kernel::tracefs::Instance;
use crate::sink::clock::monotonic_ns;

/// `_IO('R', 0x20)`: swap in the next reader sub-buffer and refresh the meta page.
const TRACE_MMAP_IOCTL_GET_READER: libc::c_ulong = 0x5220;

// Offsets in `struct trace_buffer_meta` (include/uapi/linux/trace_mmap.h).
const META_PAGE_SIZE: usize = 0;
const META_SUBBUF_SIZE: usize = 8;
const META_NR_SUBBUFS: usize = 12;
const META_READER_ID: usize = 24;
const META_READER_READ: usize = 28;
const META_STRUCT_LEN: usize = 80;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ReadMode {
    /// Memory-map the ring buffer (Linux ≥ 6.10).
    Mmap,
    /// Copy whole sub-buffers with read().
    Read,
    /// mmap, falling back to read() when the kernel refuses the mapping.
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Integrity {
    /// Report, count and skip corrupt pages.
    Lenient,
    /// A corrupt page or record is a fatal error.
    Strict,
}

#[derive(Clone, Debug)]
pub struct ReaderConfig {
    pub mode: ReadMode,
    pub integrity: Integrity,
    /// Upper bound between drains when no wake-up comes (buffer_percent not reached).
    pub poll_interval: Duration,
    /// Events are held this long (by their CLOCK_MONOTONIC timestamp) so that events of other
    /// CPUs read later can be merged before them.
    pub reorder_window: Duration,
    /// Bound on held events; beyond it the oldest are released early.
    pub max_held_events: usize,
}

impl Default for ReaderConfig {
    fn default() -> Self {
        ReaderConfig {
            mode: ReadMode::Auto,
            integrity: Integrity::Lenient,
            poll_interval: Duration::from_millis(100),
            reorder_window: Duration::from_millis(200),
            max_held_events: 1 << 20,
        }
    }
}

/// A tracepoint the reader decodes: its system, name and parsed format (which holds the id).
#[derive(Clone, Debug)]
pub struct Tracepoint {
    pub system: String,
    pub name: String,
    pub format: EventFormat,
}

impl Tracepoint {
    pub fn load(instance: &Instance, system: &str, name: &str) -> anyhow::Result<Tracepoint> {
        Ok(Tracepoint {
            system: system.to_string(),
            name: name.to_string(),
            format: instance.event_format(system, name)?,
        })
    }
}

/// One decoded record.
#[derive(Clone, Debug)]
pub struct Event {
    pub cpu: u32,
    /// Timestamp in the instance's `trace_clock` (CLOCK_MONOTONIC ns with `mono`).
    pub ts: u64,
    pub tracepoint: Arc<Tracepoint>,
    pub common: CommonFields,
    /// The record from `common_type` on, including the ring buffer's alignment padding.
    pub record: Vec<u8>,
}

impl Event {
    /// The format's fields (without `common_*`).
    pub fn fields(&self) -> Result<Fields<'_>, RecordError> {
        decode_fields(&self.tracepoint.format, &self.record)
    }
}

/// One decoded record, borrowed from the ring-buffer page it was read from: with the mmap
/// transport that is the kernel's sub-buffer itself, so nothing has been copied. Its fields:
/// `decode_fields(&record.tracepoint.format, record.record)`.
#[derive(Clone, Copy, Debug)]
pub struct RecordRef<'a> {
    pub cpu: u32,
    /// Timestamp in the instance's `trace_clock`.
    pub ts: u64,
    pub tracepoint: &'a Arc<Tracepoint>,
    pub common: CommonFields,
    /// The record from `common_type` on, including the ring buffer's alignment padding.
    pub record: &'a [u8],
}

impl RecordRef<'_> {
    pub fn to_event(&self) -> Event {
        Event {
            cpu: self.cpu,
            ts: self.ts,
            tracepoint: self.tracepoint.clone(),
            common: self.common,
            record: self.record.to_vec(),
        }
    }
}

/// A page that failed an integrity check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CorruptionReport {
    pub cpu: u32,
    /// mmap: the sub-buffer id; read(): the index of the page read from this CPU.
    pub subbuf_id: u64,
    /// Byte offset within the sub-buffer.
    pub offset: usize,
    pub reason: String,
}

impl std::fmt::Display for CorruptionReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "corrupt ring-buffer page: cpu {} sub-buffer {} byte {}: {}",
            self.cpu, self.subbuf_id, self.offset, self.reason
        )
    }
}

/// Per-CPU counters: what was decoded, and every way events were lost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CpuStats {
    pub cpu: u32,
    /// Records decoded and handed out.
    pub records: u64,
    /// Sum of the lost counts stored on pages (RB_MISSED_STORED).
    pub lost_on_pages: u64,
    /// Pages flagged RB_MISSED_EVENTS without a stored count.
    pub pages_with_unknown_loss: u64,
    /// Kernel: entries overwritten (overwrite mode), from the stats file.
    pub overrun: u64,
    /// Kernel: entries dropped because the buffer was full (no-overwrite mode).
    pub dropped: u64,
    /// Kernel: entries still in the buffer.
    pub entries: u64,
    pub corrupt_pages: u64,
    /// Records whose size is below their format's fixed size.
    pub bad_records: u64,
    /// Records of event ids not in the reader's tracepoint set.
    pub unknown_events: u64,
}

impl CpuStats {
    /// Events lost on this CPU. Page flags and the overrun counter describe the same overwritten
    /// events (the flags only once a later page is read), so the larger one counts.
    pub fn lost(&self) -> u64 {
        self.overrun.max(self.lost_on_pages) + self.dropped
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ReaderStats {
    /// The transport in use (`mmap` or `read`).
    pub mode: ReadMode,
    /// Why mmap was not used, when it was tried and refused.
    pub fallback_reason: Option<String>,
    pub cpus: Vec<CpuStats>,
}

impl ReaderStats {
    pub fn records(&self) -> u64 {
        self.cpus.iter().map(|c| c.records).sum()
    }

    pub fn lost(&self) -> u64 {
        self.cpus.iter().map(CpuStats::lost).sum()
    }

    pub fn corrupt_pages(&self) -> u64 {
        self.cpus.iter().map(|c| c.corrupt_pages).sum()
    }
}

/// Reads the per-CPU buffers of one instance. Drop it before the [`Instance`] (it holds an `Arc`
/// to it, so that order is automatic unless the caller keeps another reference).
pub struct FtraceReader {
    cpus: Vec<CpuBuffer>,
    decoder: Decoder,
    mode: ReadMode,
    fallback_reason: Option<String>,
    held: ReorderWindow,
    config: ReaderConfig,
    clock_is_mono: bool,
    // Last: the instance outlives the mappings and fds above.
    instance: Arc<Instance>,
}

struct CpuBuffer {
    cpu: u32,
    fd: AsyncFd<OwnedFd>,
    transport: Transport,
}

enum Transport {
    Mapped(Mapping),
    Read { buf: Vec<u8>, pages: u64 },
}

impl FtraceReader {
    /// Opens every CPU buffer of `instance` (set buffer sizes before this: a mapped buffer cannot
    /// be resized). Must be called inside a tokio runtime.
    pub fn open(
        instance: Arc<Instance>,
        tracepoints: Vec<Tracepoint>,
        config: ReaderConfig,
    ) -> anyhow::Result<FtraceReader> {
        let layout = instance.page_layout()?;
        let mut by_id = HashMap::new();
        for tp in tracepoints {
            by_id.insert(tp.format.id, Arc::new(tp));
        }
        let clock_is_mono = instance.trace_clock()? == "mono";
        let mut files = Vec::new();
        for cpu in instance.cpus()? {
            let path = instance.path(format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            files.push((cpu, OwnedFd::from(file)));
        }
        let read = || Transport::Read { buf: vec![0; layout.subbuf_size()], pages: 0 };
        let mut transports = Vec::new();
        let mut fallback_reason = None;
        if config.mode != ReadMode::Read {
            for (cpu, fd) in &files {
                match Mapping::new(fd, &layout) {
                    Ok(m) => transports.push(Transport::Mapped(m)),
                    Err(e) if config.mode == ReadMode::Auto => {
                        // All CPUs use one transport: unmap those already mapped.
                        let reason = format!("mmap of cpu{cpu} trace_pipe_raw failed: {e:#}");
                        log::warn!("{reason}; reading the ring buffer with read() instead");
                        fallback_reason = Some(reason);
                        transports.clear();
                        break;
                    }
                    Err(e) => return Err(e.context(format!("mapping cpu{cpu} trace_pipe_raw"))),
                }
            }
        }
        let mode = if transports.is_empty() {
            transports = files.iter().map(|_| read()).collect();
            ReadMode::Read
        } else {
            ReadMode::Mmap
        };
        let mut cpus = Vec::new();
        for ((cpu, fd), transport) in files.into_iter().zip(transports) {
            // SAFETY: the OwnedFd stays open, unchanged, for the AsyncFd's whole life.
            let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                .map_err(|e| e.into_parts().1)
                .context("registering trace_pipe_raw with tokio")?;
            cpus.push(CpuBuffer { cpu, fd, transport });
        }
        if cpus.is_empty() {
            bail!("instance {} has no per-CPU buffers", instance.name());
        }
        let stats = cpus.iter().map(|c| CpuStats { cpu: c.cpu, ..Default::default() }).collect();
        let nr_cpus = cpus.len();
        Ok(FtraceReader {
            cpus,
            decoder: Decoder {
                layout,
                by_id,
                stats,
                strict: config.integrity == Integrity::Strict,
                corruptions: Vec::new(),
            },
            mode,
            fallback_reason,
            held: ReorderWindow {
                per_cpu: (0..nr_cpus).map(|_| VecDeque::new()).collect(),
                len: 0,
            },
            config,
            clock_is_mono,
            instance,
        })
    }

    /// Decodes records of one more tracepoint from now on (e.g. a user_events tracepoint
    /// registered after the reader was opened). Enable it in the instance as well.
    pub fn add_tracepoint(&mut self, tracepoint: Tracepoint) {
        self.decoder.by_id.insert(tracepoint.format.id, Arc::new(tracepoint));
    }

    /// The transport in use: [`ReadMode::Mmap`] or [`ReadMode::Read`].
    pub fn mode(&self) -> ReadMode {
        self.mode
    }

    pub fn instance(&self) -> &Arc<Instance> {
        &self.instance
    }

    /// Waits for a wake-up (buffer_percent reached) or the poll interval, drains every CPU and
    /// returns the events that left the reorder window, oldest first (possibly none).
    pub async fn next_batch(&mut self) -> anyhow::Result<Vec<Event>> {
        self.wait_for_data().await;
        self.drain_into_window()?;
        let horizon = if self.clock_is_mono {
            monotonic_ns().saturating_sub(self.config.reorder_window.as_nanos() as u64)
        } else {
            // Without a clock shared with ours, all CPUs were just drained: release everything.
            u64::MAX
        };
        Ok(self.held.release(horizon, self.config.max_held_events))
    }

    /// Waits like [`next_batch`](Self::next_batch), then hands every record now in the buffers
    /// to `sink` straight from the page it is decoded from, CPU by CPU, each CPU's in time
    /// order: no copy, no allocation, no cross-CPU merge. For consumers that aggregate or
    /// forward records; do not mix with `next_batch`/`flush` on one reader.
    pub async fn next_records(
        &mut self,
        mut sink: impl FnMut(RecordRef<'_>),
    ) -> anyhow::Result<()> {
        self.wait_for_data().await;
        self.drain_all(&mut |_, record| sink(record))
    }

    async fn wait_for_data(&self) {
        let cpus = &self.cpus;
        let ready = std::future::poll_fn(|cx| {
            for c in cpus {
                if let Poll::Ready(Ok(mut guard)) = c.fd.poll_read_ready(cx) {
                    guard.clear_ready();
                    return Poll::Ready(());
                }
            }
            Poll::Pending
        });
        tokio::select! {
            () = ready => {}
            () = tokio::time::sleep(self.config.poll_interval) => {}
        }
    }

    /// Drains every CPU now and releases everything held (shutdown, tests).
    pub fn flush(&mut self) -> anyhow::Result<Vec<Event>> {
        self.drain_into_window()?;
        Ok(self.held.release(u64::MAX, self.config.max_held_events))
    }

    /// Corruption reports since the last call.
    pub fn take_corruptions(&mut self) -> Vec<CorruptionReport> {
        std::mem::take(&mut self.decoder.corruptions)
    }

    /// Decodes one sub-buffer obtained elsewhere (a saved capture, splice) as if read from
    /// `cpu`, with the same integrity checks and accounting; its events join the merge.
    pub fn ingest_page(&mut self, cpu: u32, subbuf_id: u64, page: &[u8]) -> anyhow::Result<()> {
        let idx = self.decoder.cpu_index(cpu)?;
        let held = &mut self.held;
        self.decoder.whole_page(idx, cpu, subbuf_id, page, &mut |idx, r| held.push(idx, r))
    }

    /// Counters, with the kernel's per-CPU stats read now.
    pub fn stats(&self) -> ReaderStats {
        let mut cpus = self.decoder.stats.clone();
        for s in &mut cpus {
            if let Ok(k) = self.instance.cpu_stats(s.cpu) {
                s.overrun = k.overrun;
                s.dropped = k.dropped_events;
                s.entries = k.entries;
            }
        }
        ReaderStats { mode: self.mode, fallback_reason: self.fallback_reason.clone(), cpus }
    }

    /// Hands every record now in the buffers to `sink` with the index of its CPU.
    fn drain_all(&mut self, sink: &mut impl FnMut(usize, RecordRef<'_>)) -> anyhow::Result<()> {
        for (idx, c) in self.cpus.iter_mut().enumerate() {
            match &mut c.transport {
                Transport::Mapped(m) => m.drain(&c.fd, c.cpu, idx, &mut self.decoder, sink)?,
                Transport::Read { buf, pages } => {
                    drain_read(&c.fd, c.cpu, idx, buf, pages, &mut self.decoder, sink)?
                }
            }
        }
        Ok(())
    }

    fn drain_into_window(&mut self) -> anyhow::Result<()> {
        let mut held = std::mem::take(&mut self.held);
        let result = self.drain_all(&mut |idx, r| held.push(idx, r));
        self.held = held;
        result
    }
}

/// Events in the reorder window, one queue per CPU (each already in time order).
#[derive(Default)]
struct ReorderWindow {
    per_cpu: Vec<VecDeque<Event>>,
    len: usize,
}

impl ReorderWindow {
    fn push(&mut self, idx: usize, record: RecordRef<'_>) {
        self.per_cpu[idx].push_back(record.to_event());
        self.len += 1;
    }

    /// Merges the per-CPU queues: releases, oldest first, every event at or before `horizon`
    /// (and more while more than `max_held` are held).
    fn release(&mut self, horizon: u64, max_held: usize) -> Vec<Event> {
        let mut out = Vec::new();
        loop {
            let oldest = self
                .per_cpu
                .iter()
                .enumerate()
                .filter_map(|(i, q)| q.front().map(|e| (e.ts, i)))
                .min();
            let Some((ts, idx)) = oldest else { break };
            if ts > horizon && self.len <= max_held {
                break;
            }
            out.push(self.per_cpu[idx].pop_front().expect("front exists"));
            self.len -= 1;
        }
        out
    }
}

/// Turns page bytes into events and reports; shared by both transports.
struct Decoder {
    layout: PageLayout,
    by_id: HashMap<u16, Arc<Tracepoint>>,
    stats: Vec<CpuStats>,
    strict: bool,
    corruptions: Vec<CorruptionReport>,
}

impl Decoder {
    fn cpu_index(&self, cpu: u32) -> anyhow::Result<usize> {
        self.stats
            .iter()
            .position(|s| s.cpu == cpu)
            .ok_or_else(|| anyhow::anyhow!("cpu {cpu} is not read by this reader"))
    }

    fn missed(&mut self, idx: usize, missed: Missed) {
        match missed {
            Missed::None => {}
            Missed::Unknown => self.stats[idx].pages_with_unknown_loss += 1,
            Missed::Count(n) => self.stats[idx].lost_on_pages += n,
        }
    }

    /// Records a corrupt page; fatal in strict mode.
    fn corrupt(
        &mut self,
        idx: usize,
        cpu: u32,
        subbuf_id: u64,
        c: Corruption,
    ) -> anyhow::Result<()> {
        self.stats[idx].corrupt_pages += 1;
        let report =
            CorruptionReport { cpu, subbuf_id, offset: c.offset, reason: c.reason.to_string() };
        if self.strict {
            bail!("{report} (--integrity strict)");
        }
        log::warn!("{report}; page skipped");
        self.corruptions.push(report);
        Ok(())
    }

    /// Decodes a complete page (read() transport, ingested pages).
    fn whole_page(
        &mut self,
        idx: usize,
        cpu: u32,
        subbuf_id: u64,
        page: &[u8],
        sink: &mut impl FnMut(usize, RecordRef<'_>),
    ) -> anyhow::Result<()> {
        let header = match parse_header(page, &self.layout) {
            Ok(h) => h,
            Err(c) => return self.corrupt(idx, cpu, subbuf_id, c),
        };
        self.missed(idx, header.missed);
        let mut cursor = PageCursor::new(&self.layout, &header);
        self.parse(
            idx,
            cpu,
            subbuf_id,
            page,
            &mut cursor,
            self.layout.data_offset + header.commit_len,
            sink,
        )
    }

    /// Parses `page[cursor.pos..end]`. Events before a corruption are kept (each passed every
    /// check); the rest of the page is skipped.
    #[allow(clippy::too_many_arguments)]
    fn parse(
        &mut self,
        idx: usize,
        cpu: u32,
        subbuf_id: u64,
        page: &[u8],
        cursor: &mut PageCursor,
        end: usize,
        sink: &mut impl FnMut(usize, RecordRef<'_>),
    ) -> anyhow::Result<()> {
        let (stats, by_id) = (&mut self.stats[idx], &self.by_id);
        let result = cursor.parse(page, end, |raw| {
            if let Some(record) = checked_record(stats, by_id, cpu, raw) {
                sink(idx, record);
            }
        });
        if let Err(c) = result {
            cursor.ended = true;
            self.corrupt(idx, cpu, subbuf_id, c)?;
        }
        Ok(())
    }
}

/// The record of `raw` when it is of a known tracepoint and long enough for its format;
/// otherwise counted in `stats`.
fn checked_record<'a>(
    stats: &mut CpuStats,
    by_id: &'a HashMap<u16, Arc<Tracepoint>>,
    cpu: u32,
    raw: RawEvent<'a>,
) -> Option<RecordRef<'a>> {
    let Ok(common) = common_fields(raw.data) else {
        stats.bad_records += 1;
        return None;
    };
    let Some(tracepoint) = by_id.get(&common.common_type) else {
        stats.unknown_events += 1;
        return None;
    };
    if raw.data.len() < tracepoint.format.fixed_size() {
        stats.bad_records += 1;
        log::warn!(
            "cpu {cpu} byte {}: {}:{} record of {} bytes is shorter than its format's {}",
            raw.offset,
            tracepoint.system,
            tracepoint.name,
            raw.data.len(),
            tracepoint.format.fixed_size()
        );
        return None;
    }
    stats.records += 1;
    Some(RecordRef { cpu, ts: raw.ts, tracepoint, common, record: raw.data })
}

fn drain_read(
    fd: &AsyncFd<OwnedFd>,
    cpu: u32,
    idx: usize,
    buf: &mut [u8],
    pages: &mut u64,
    decoder: &mut Decoder,
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

fn get_reader(fd: std::os::fd::RawFd) -> anyhow::Result<()> {
    // SAFETY: a plain ioctl without argument on an open trace_pipe_raw fd.
    let rc = unsafe { libc::ioctl(fd, TRACE_MMAP_IOCTL_GET_READER, 0) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("TRACE_MMAP_IOCTL_GET_READER");
    }
    Ok(())
}

/// The read-only shared mapping of one CPU buffer: meta page + sub-buffers.
struct Mapping {
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
    Ok(p as *const u8)
}

impl Mapping {
    fn new(fd: &OwnedFd, layout: &PageLayout) -> anyhow::Result<Mapping> {
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
            // SAFETY: unmapping exactly what was mapped above.
            unsafe { libc::munmap(meta as *mut _, meta_len) };
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

    /// The consumer protocol of the mapped buffer (reference §2.5): parse the reader sub-buffer
    /// up to its commit, GET_READER, and continue on the same page (new commit) or the next.
    fn drain(
        &mut self,
        fd: &AsyncFd<OwnedFd>,
        cpu: u32,
        idx: usize,
        decoder: &mut Decoder,
        sink: &mut impl FnMut(usize, RecordRef<'_>),
    ) -> anyhow::Result<()> {
        // GET_READER calls in a row that brought nothing new. The first call after a page is
        // read to its commit may only move the kernel's read position (§2.4 step 2); only a
        // second one that swaps in no new page shows the buffer is drained.
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
        // SAFETY: unmapping exactly the regions mapped in `new`.
        unsafe {
            if !self.data.is_null() {
                libc::munmap(self.data as *mut _, self.data_len);
            }
            if !self.meta.is_null() {
                libc::munmap(self.meta as *mut _, self.meta_len);
            }
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
    let path = instance.path(format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let fd = OwnedFd::from(file);
    let m = Mapping::new(&fd, &layout)?;
    get_reader(fd.as_raw_fd())?;
    Ok(MmapProbe {
        meta_page_size: m.meta_u32(META_PAGE_SIZE) as usize,
        subbuf_size: m.subbuf_size,
        nr_subbufs: m.nr_subbufs,
    })
}
