//! Consumer of an ftrace instance's per-CPU ring buffers: memory-mapped `trace_pipe_raw`
//! (Linux ≥ 6.10: meta page + sub-buffers, `TRACE_MMAP_IOCTL_GET_READER`) with a fallback to
//! page-sized `read()`s of the same file ([`mmap`], [`read`]). Pages are decoded by
//! [`tracer_decode::ftrace::stream`];
//! records of the given tracepoints come out either merged across CPUs in timestamp order
//! ([`FtraceReader::next_batch`], owned [`Event`]s), or borrowed straight from the page they were
//! decoded from, in order per CPU ([`FtraceReader::next_records`], no copy, no allocation).
//!
//! Library use (the `tracer ftrace` pipeline, and user_events sessions in `tracer run`):
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use tracer::kernel::ftrace_reader::{FtraceReader, ReaderConfig};
//! use tracer::kernel::tracefs::{Instance, Tracefs};
//! let instance = Arc::new(Instance::create(&Tracefs::find_or_mount()?)?);
//! instance.set_trace_clock("mono")?;
//! let tp = instance.tracepoint("sched", "sched_process_exec")?;
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

mod mmap;
mod read;

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
pub use tracer_decode::ftrace::stream::{
    CorruptionReport, CpuStats, Event, RecordRef, ReorderWindow, StreamDecoder, Tracepoint,
};

use self::mmap::Mapping;
pub(crate) use self::mmap::release_all_mappings;
pub use self::mmap::{MmapProbe, probe_mmap};
use crate::kernel::tracefs::Instance;
use crate::time::{PeriodicTimer, monotonic_ns};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// Memory-map the ring buffer (Linux ≥ 6.10).
    Mmap,
    /// Copy whole sub-buffers with read().
    Read,
    /// mmap, falling back to read() when the kernel refuses the mapping.
    Auto,
}

impl ReadMode {
    pub fn name(self) -> &'static str {
        match self {
            ReadMode::Mmap => "mmap",
            ReadMode::Read => "read",
            ReadMode::Auto => "auto",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Integrity {
    /// Report, count and skip corrupt pages.
    Lenient,
    /// A corrupt page or record is a fatal error.
    Strict,
}

#[derive(Clone, Debug)]
pub struct ReaderConfig {
    /// Default [`ReadMode::Read`]: cheaper than the mapping per record below a few hundred
    /// bytes, as .NET's and most kernel tracepoints' records are (docs/protocol/ftrace.md §6.7).
    pub mode: ReadMode,
    pub integrity: Integrity,
    /// Upper bound between drains when no wake-up comes (buffer_percent not reached): a fixed
    /// schedule, so a reader that also wakes on its watermark drains on this beat too. Above zero.
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
            mode: ReadMode::Read,
            integrity: Integrity::Lenient,
            poll_interval: Duration::from_millis(100),
            reorder_window: Duration::from_millis(200),
            max_held_events: 1 << 20,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ReaderStats {
    /// The transport in use (`mmap` or `read`).
    pub mode: ReadMode,
    /// Why mmap was not used, when it was tried and refused.
    pub fallback_reason: Option<String>,
    pub cpus: Vec<CpuStats>,
    /// The latest corrupt page (all are counted per CPU).
    pub last_corruption: Option<CorruptionReport>,
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
    decoder: StreamDecoder,
    mode: ReadMode,
    fallback_reason: Option<String>,
    held: ReorderWindow,
    config: ReaderConfig,
    clock_is_mono: bool,
    /// One entry per CPU buffer's fd, for the `poll` that arms the next wake-up; empty when
    /// the instance's `buffer_percent` is 0, where epoll's own poll arms it.
    pollfds: Vec<libc::pollfd>,
    /// Paces drains when no watermark wake-up comes ([`ReaderConfig::poll_interval`]).
    poll_timer: PeriodicTimer,
    /// Every record committed before this CLOCK_MONOTONIC time has been returned.
    returned_through: u64,
    // Last: the instance outlives the mappings and fds above.
    instance: Arc<Instance>,
}

/// How far a drain of the `read()` transport goes (the mapped one always stops at the writer,
/// which it can see: docs/protocol/ftrace.md §6.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DrainTo {
    /// Until the reader has caught up with the writer (a wake-up: the writer's page, which the
    /// kernel hands out a few records at a time, waits for the next one).
    Writer,
    /// Until `EAGAIN` (a flush: nothing may stay behind).
    Empty,
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
        let clock_is_mono = instance.trace_clock()? == "mono";
        let mut files = Vec::new();
        for cpu in instance.cpus()? {
            files.push((cpu, open_trace_pipe_raw(&instance, cpu)?));
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
        let cpu_ids: Vec<u32> = cpus.iter().map(|c| c.cpu).collect();
        let strict = config.integrity == Integrity::Strict;
        // Unreadable counts as non-zero: the poll is then made, which is right either way.
        let watermark = instance.read("buffer_percent").map_or(true, |p| p.trim() != "0");
        let pollfds = match watermark {
            true => cpus
                .iter()
                .map(|c| libc::pollfd { fd: c.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
                .collect(),
            false => Vec::new(),
        };
        let poll_timer = PeriodicTimer::new(config.poll_interval)
            .context("starting the ftrace reader's poll-interval timer")?;
        Ok(FtraceReader {
            returned_through: 0,
            held: ReorderWindow::new(cpus.len()),
            pollfds,
            poll_timer,
            cpus,
            decoder: StreamDecoder::new(layout, tracepoints, &cpu_ids, strict),
            mode,
            fallback_reason,
            config,
            clock_is_mono,
            instance,
        })
    }

    /// Decodes records of one more tracepoint from now on (e.g. a user_events tracepoint
    /// registered after the reader was opened). Enable it in the instance as well.
    pub fn add_tracepoint(&mut self, tracepoint: Tracepoint) {
        self.decoder.add_tracepoint(tracepoint);
    }

    /// Stops decoding the tracepoint with this event id (its records count as unknown).
    pub fn remove_tracepoint(&mut self, id: u16) {
        self.decoder.remove_tracepoint(id);
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
        self.wait_for_data().await?;
        let drain_start = monotonic_ns();
        self.drain_into_window(DrainTo::Writer)?;
        let horizon = if self.clock_is_mono {
            monotonic_ns().saturating_sub(self.config.reorder_window.as_nanos() as u64)
        } else {
            // Without a clock shared with ours, all CPUs were just drained: release everything.
            u64::MAX
        };
        // A flush may have returned more already.
        self.returned_through = self.returned_through.max(drain_start.min(horizon));
        Ok(self.held.release(horizon, self.config.max_held_events))
    }

    /// A CLOCK_MONOTONIC time before which every record committed to the buffers has been
    /// returned by [`next_batch`](Self::next_batch) or [`flush`](Self::flush) (0 before the
    /// first): a drain, even one that stops at the writer's page, reads everything committed
    /// before it started (docs/protocol/ftrace.md §6.1), and the reorder window then releases
    /// what is older than its horizon.
    pub fn returned_through(&self) -> u64 {
        self.returned_through
    }

    /// Waits like [`next_batch`](Self::next_batch), then hands every record now in the buffers
    /// to `sink` straight from the page it is decoded from, CPU by CPU, each CPU's in time
    /// order: no copy, no allocation, no cross-CPU merge. For consumers that aggregate or
    /// forward records; do not mix with `next_batch`/`flush` on one reader.
    pub async fn next_records(
        &mut self,
        mut sink: impl FnMut(RecordRef<'_>),
    ) -> anyhow::Result<()> {
        self.wait_for_data().await?;
        self.drain_all(DrainTo::Writer, &mut |_, record| sink(record))
    }

    /// Returns at once when a CPU buffer has reached a non-zero `buffer_percent`, else waits
    /// for a wake-up or the poll interval. The check is a `poll` that does not wait, and it is
    /// also what arms the kernel's next wake-up: the kernel arms it only when a poll finds the
    /// watermark not reached, and epoll's own poll, when it reports a wake-up, finds it reached
    /// — without this, only the first wake-up would come and the poll interval would pace every
    /// later drain (docs/protocol/ftrace.md §9). With `buffer_percent` 0 epoll's poll arms it.
    async fn wait_for_data(&mut self) -> anyhow::Result<()> {
        if self.watermark_reached() {
            // Without a wait, this task would not yield while a writer outpaces the drains:
            // spend tokio's cooperative budget as a wait on the fd would, so that timers,
            // signals and other tasks still get their turn.
            tokio::task::consume_budget().await;
            return Ok(());
        }
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
            () = ready => Ok(()),
            tick = self.poll_timer.tick() => tick.context("waiting on the poll-interval timer"),
        }
    }

    /// The non-waiting `poll` of [`wait_for_data`](Self::wait_for_data): whether a CPU buffer
    /// is readable (at its watermark). No syscall where `pollfds` is empty.
    fn watermark_reached(&mut self) -> bool {
        if self.pollfds.is_empty() {
            return false;
        }
        for entry in &mut self.pollfds {
            entry.revents = 0;
        }
        let nfds = self.pollfds.len() as libc::nfds_t;
        // SAFETY: `pollfds` is an array of `nfds` initialised entries, borrowed mutably for the
        // call; its fds belong to `cpus`, which keeps them open. A timeout of 0 never blocks.
        let ready = unsafe { libc::poll(self.pollfds.as_mut_ptr(), nfds, 0) };
        // Readable only: an error or hang-up flag that stays set must not turn this into a
        // busy loop (the epoll wait reports those as before).
        ready > 0 && self.pollfds.iter().any(|entry| entry.revents & libc::POLLIN != 0)
    }

    /// Drains every CPU now and releases everything held (shutdown, tests).
    pub fn flush(&mut self) -> anyhow::Result<Vec<Event>> {
        let drain_start = monotonic_ns();
        self.drain_into_window(DrainTo::Empty)?;
        self.returned_through = drain_start;
        Ok(self.held.release(u64::MAX, self.config.max_held_events))
    }

    /// Counters, with the kernel's per-CPU stats read now.
    pub fn stats(&self) -> ReaderStats {
        let mut cpus = self.decoder.stats().to_vec();
        for s in &mut cpus {
            if let Ok(k) = self.instance.cpu_stats(s.cpu) {
                s.overrun = k.overrun;
                s.dropped = k.dropped_events;
                s.entries = k.entries;
            }
        }
        ReaderStats {
            mode: self.mode,
            fallback_reason: self.fallback_reason.clone(),
            cpus,
            last_corruption: self.decoder.last_corruption().cloned(),
        }
    }

    /// Hands every record now in the buffers to `sink` with the index of its CPU.
    fn drain_all(
        &mut self,
        to: DrainTo,
        sink: &mut impl FnMut(usize, RecordRef<'_>),
    ) -> anyhow::Result<()> {
        for (idx, c) in self.cpus.iter_mut().enumerate() {
            match &mut c.transport {
                Transport::Mapped(m) => m.drain(&c.fd, c.cpu, idx, &mut self.decoder, sink)?,
                Transport::Read { buf, pages } => {
                    read::drain(&c.fd, c.cpu, idx, buf, pages, to, &mut self.decoder, sink)?
                }
            }
        }
        Ok(())
    }

    fn drain_into_window(&mut self, to: DrainTo) -> anyhow::Result<()> {
        let mut held = std::mem::take(&mut self.held);
        let result = self.drain_all(to, &mut |idx, r| held.push(idx, r));
        self.held = held;
        result
    }
}

/// Opens `per_cpu/cpuN/trace_pipe_raw` non-blocking: every transport reads (or maps) this file.
fn open_trace_pipe_raw(instance: &Instance, cpu: u32) -> anyhow::Result<OwnedFd> {
    let path = instance.path(format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok(OwnedFd::from(file))
}
