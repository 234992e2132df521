//! `run --kernel-event SYSTEM:EVENT`: the kernel tracepoint records of the traced processes'
//! threads, written into `run`'s output beside their runtime events — the same envelope
//! (`pid`, `process_start_ns`, the process's labels) and the same clock (`trace_clock` mono:
//! `mono_ns` is CLOCK_MONOTONIC like every line's), so one stream shows a GC and the context
//! switches or syscalls around it (docs/protocol/ftrace.md §11).
//!
//! Filtered in the kernel, then by thread: the instance's `set_event_pid` holds the threads of
//! every traced process (listed from `/proc/<pid>/task` when its session starts, listed again
//! after the write so a thread created meanwhile is not missed), and with `options/event-fork`
//! the kernel adds each task they create and drops each that exits. Tasks they create that are
//! other processes (a fork) pass that filter too, so each record is attributed by its writer's
//! thread id (`common_pid`): the threads listed, and the threads the traced ones create, seen
//! in the instance's own `task:task_newtask` records with `CLONE_THREAD`, read in time order
//! with the records. A record of a thread that is not (or no longer) known as a traced one is
//! dropped undecoded and counted (the summary's "kernel events of other processes", not a
//! loss: they are mostly records nobody asked for). A `sched_switch` passes the
//! kernel's filter when either task is traced; it is attributed to the task switched away from
//! (`common_pid`), so switches *to* a traced thread from another process are among those
//! dropped.
use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context as _;
use tracer_decode::ftrace::record::FieldValue;

use crate::identity::LabelRegistry;
use crate::kernel::ftrace_reader::{Event, FtraceReader, ReaderConfig, ReaderStats, Tracepoint};
use crate::kernel::procfs;
use crate::kernel::tracefs::{EventSpec, Instance, Tracefs};
use crate::output::{FtraceRecord, Incarnation, JsonLines, Kind, Line, Pid, Source};
use crate::summary::run::KernelEventCounts;
use crate::time::Clock;

/// Threads of traced processes remembered; when full, the threads of processes that have ended
/// are forgotten, and a thread beyond is not attributed (its records count as
/// `other_process`; the refusals as `thread_table_full`).
pub const MAX_KERNEL_EVENT_THREADS: usize = 65_536;
/// `clone()`'s flag for a new thread of the same process (rather than a new process).
const CLONE_THREAD: u64 = 0x0001_0000;
/// The tracepoint that tells which traced thread created which task.
const NEWTASK: (&str, &str) = ("task", "task_newtask");

pub struct KernelEvents {
    instance: Arc<Instance>,
    reader: FtraceReader,
    /// Thread id → the traced process it is a thread of.
    threads: HashMap<u32, Incarnation>,
    /// Whether the user asked for `task:task_newtask` too (else its records are only read).
    newtask_asked: bool,
    counts: KernelEventCounts,
}

impl KernelEvents {
    /// A private instance recording `events` (each checked against the kernel's tracepoints),
    /// off until the first process is watched: an empty `set_event_pid` filters nothing.
    pub fn start(events: &[EventSpec], buffer_size_kb: u64) -> anyhow::Result<KernelEvents> {
        let tracefs = Tracefs::find_or_mount()?;
        let instance = Arc::new(Instance::create_with_suffix(&tracefs, Some("kernel-events"))?);
        instance.set_buffer_size_kb(buffer_size_kb)?;
        instance
            .set_trace_clock("mono")
            .context("selecting the mono trace clock (timestamps must be CLOCK_MONOTONIC)")?;
        instance.write("options/event-fork", "1").context("following forks (event-fork)")?;
        let mut tracepoints: Vec<Tracepoint> = Vec::new();
        let newtask =
            EventSpec { system: NEWTASK.0.into(), name: Some(NEWTASK.1.into()), filter: None };
        let mut newtask_asked = false;
        for spec in events.iter().chain(std::iter::once(&newtask)) {
            let enabled = instance.enable(spec).with_context(|| {
                format!("--kernel-event {}:{}", spec.system, spec.name.as_deref().unwrap_or("*"))
            })?;
            for (system, name) in enabled {
                let is_newtask = (system.as_str(), name.as_str()) == NEWTASK;
                newtask_asked |= is_newtask && !std::ptr::eq(spec, &newtask);
                if !tracepoints.iter().any(|t| t.system == system && t.name == name) {
                    tracepoints.push(instance.tracepoint(&system, &name)?);
                }
            }
        }
        let reader = FtraceReader::open(instance.clone(), tracepoints, ReaderConfig::default())?;
        Ok(KernelEvents {
            instance,
            reader,
            threads: HashMap::new(),
            newtask_asked,
            counts: KernelEventCounts::default(),
        })
    }

    /// Records the threads of `process` from now on (its session started).
    pub fn watch(&mut self, process: Incarnation) -> anyhow::Result<()> {
        let pid = process.pid;
        let mut listed = 0;
        // Listed again after the write: a thread created between the listing and the write by
        // a thread not yet in the filter would otherwise be missed.
        for _ in 0..2 {
            let tids =
                procfs::task_ids(pid).with_context(|| format!("listing pid {pid}'s threads"))?;
            let new: Vec<u32> =
                tids.into_iter().filter(|t| !self.threads.contains_key(t)).collect();
            if new.is_empty() {
                break;
            }
            for &tid in &new {
                self.remember(tid, process);
            }
            listed += new.len();
            let list = new.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
            // Appended (no O_TRUNC): the kernel keeps the threads already listed.
            std::fs::OpenOptions::new()
                .append(true)
                .open(self.instance.path("set_event_pid"))
                .and_then(|mut f| f.write_all(list.as_bytes()))
                .with_context(|| format!("adding pid {pid}'s threads to set_event_pid"))?;
        }
        self.instance.set_tracing_on(true)?;
        log::debug!("kernel events: pid {pid}: {listed} threads");
        Ok(())
    }

    fn remember(&mut self, tid: u32, process: Incarnation) {
        if self.threads.len() >= MAX_KERNEL_EVENT_THREADS && !self.threads.contains_key(&tid) {
            // Threads of processes that have ended (or whose pid is another process now).
            self.threads.retain(|_, p| procfs::process_start_ns(p.pid) == p.start_ns);
        }
        if self.threads.len() >= MAX_KERNEL_EVENT_THREADS && !self.threads.contains_key(&tid) {
            self.counts.thread_table_full += 1;
            return;
        }
        self.threads.insert(tid, process);
    }

    /// The next records, in time order.
    pub async fn next_batch(&mut self) -> anyhow::Result<Vec<Event>> {
        self.reader.next_batch().await
    }

    /// What is still buffered (at shutdown).
    pub fn flush(&mut self) -> anyhow::Result<Vec<Event>> {
        self.instance.set_tracing_on(false)?;
        self.reader.flush()
    }

    /// Writes the records of traced threads as lines; follows the threads they create.
    pub fn emit(
        &mut self,
        events: &[Event],
        clock: &Clock,
        labels: &LabelRegistry,
        sink: &mut JsonLines,
    ) {
        let mut sink = sink.batch();
        for e in events {
            let tid = u32::try_from(e.common.pid).unwrap_or(0);
            let Some(&process) = self.threads.get(&tid) else {
                self.counts.other_process += 1;
                continue;
            };
            let fields = match e.fields() {
                Ok(fields) => fields,
                Err(err) => {
                    log::debug!("{}:{} record: {err}", e.tracepoint.system, e.tracepoint.name);
                    self.counts.bad_fields += 1;
                    continue;
                }
            };
            let is_newtask = (e.tracepoint.system.as_str(), e.tracepoint.name.as_str()) == NEWTASK;
            if is_newtask {
                let number = |name| match fields.get(name) {
                    Some(FieldValue::Signed(v)) => u64::try_from(*v).ok(),
                    Some(FieldValue::Unsigned(v)) => Some(*v),
                    _ => None,
                };
                if let (Some(child), Some(flags)) = (number("pid"), number("clone_flags"))
                    && flags & CLONE_THREAD != 0
                {
                    self.remember(u32::try_from(child).unwrap_or(0), process);
                }
                if !self.newtask_asked {
                    continue;
                }
            }
            let body = FtraceRecord::of(e, fields);
            let line =
                Line::new(clock, e.ts, Kind::Ftrace, Source::Ftrace, Pid::Known(process), body)
                    .with_labels(labels.get(process.pid));
            sink.emit(&line);
            self.counts.written += 1;
        }
    }

    pub fn counts(&self) -> KernelEventCounts {
        self.counts.clone()
    }

    pub fn stats(&self) -> ReaderStats {
        self.reader.stats()
    }
}
