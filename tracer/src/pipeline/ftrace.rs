//! `tracer ftrace`: stream kernel tracepoints from a private ftrace instance as JSON lines.
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use crate::decode::ftrace::record::Fields;
use crate::kernel::ftrace_reader::{
    Event, FtraceReader, Integrity, ReadMode, ReaderConfig, ReaderStats, Tracepoint,
};
use crate::kernel::tracefs::{EventSpec, Instance, Tracefs};
use crate::sink::{Clock, JsonLines};

/// Stream kernel tracepoints (ftrace events) as JSON lines.
///
/// Events are recorded in a private ftrace instance (`instances/tracer-<pid>`, removed on exit)
/// with the `mono` clock, read from the memory-mapped per-CPU ring buffers (or read() when the
/// kernel cannot map them), checked for integrity, and merged across CPUs in time order.
/// A summary (per-CPU records, overrun, lost events, corrupt pages, read mode) goes to stderr.
///
/// Example: tracer ftrace --event sched:sched_process_exec --event 'syscalls:sys_enter_openat:dfd == -100' --duration 10s
#[derive(Debug, clap::Args)]
pub struct FtraceArgs {
    /// Tracepoint to record: SYSTEM:NAME, SYSTEM:* (every event of the system), optionally
    /// followed by :FILTER (a kernel filter expression, e.g. `sched:sched_switch:prev_pid != 0`).
    /// Repeatable.
    #[arg(long = "event", required = true, value_name = "SYSTEM:NAME[:FILTER]")]
    pub events: Vec<EventSpec>,
    /// Ring-buffer size per CPU, in KiB.
    #[arg(long, default_value_t = 4096)]
    pub buffer_size_kb: u64,
    /// Wake the reader when a CPU buffer is this full (0–100; 0 = on every event). A 100 ms poll
    /// timer drains quieter CPUs anyway.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub buffer_percent: u32,
    /// How to read the ring buffer: mmap (Linux ≥ 6.10), read(), or auto (mmap, falling back).
    #[arg(long, value_enum, default_value = "auto")]
    pub read_mode: ReadMode,
    /// What a corrupt ring-buffer page does: lenient = report, count and skip; strict = exit 1.
    #[arg(long, value_enum, default_value = "lenient")]
    pub integrity: Integrity,
    /// Stop after this long (e.g. 30s, 5m); default: until SIGINT/SIGTERM.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub duration: Option<Duration>,
    /// Write JSON lines to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Entry point for `main`: runs the pipeline and maps errors to exit code 1.
pub fn main(args: FtraceArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tracer: error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tracer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One output line.
#[derive(Serialize)]
struct Line<'a> {
    ts: String,
    mono_ns: u64,
    kind: &'static str,
    system: &'a str,
    event: &'a str,
    cpu: u32,
    tid: i32,
    pid: Option<i32>,
    fields: Fields<'a>,
}

pub async fn run(args: FtraceArgs) -> anyhow::Result<()> {
    let tracefs = Tracefs::find_or_mount()?;
    let instance = Arc::new(Instance::create(&tracefs)?);
    instance.set_buffer_size_kb(args.buffer_size_kb)?;
    instance.set_buffer_percent(args.buffer_percent)?;
    instance
        .set_trace_clock("mono")
        .context("selecting the mono trace clock (timestamps must be CLOCK_MONOTONIC)")?;
    let mut tracepoints: Vec<Tracepoint> = Vec::new();
    for spec in &args.events {
        for (system, name) in instance.enable(spec)? {
            if !tracepoints.iter().any(|t| t.system == system && t.name == name) {
                tracepoints.push(Tracepoint::load(&instance, &system, &name)?);
            }
        }
    }
    let reader_tracepoints = tracepoints.len();
    let config =
        ReaderConfig { mode: args.read_mode, integrity: args.integrity, ..Default::default() };
    let mut reader = FtraceReader::open(instance.clone(), tracepoints, config)?;
    let mut sink = JsonLines::open(args.output.as_deref())?;
    let mut out = Output { clock: Clock::new(), tgids: HashMap::new(), bad_records: 0 };
    log::info!(
        "recording {} tracepoint(s) in instance {} ({} mode)",
        reader_tracepoints,
        instance.name(),
        serde_json::to_string(&reader.mode())?.trim_matches('"')
    );
    instance.set_tracing_on(true)?;

    let stop = super::stop_requested(args.duration);
    tokio::pin!(stop);
    let result = loop {
        tokio::select! {
            reason = &mut stop => break reason.map(|_| ()),
            batch = reader.next_batch() => match batch {
                Ok(events) => out.emit(&mut sink, &events, args.integrity)?,
                Err(e) => break Err(e),
            },
        }
    };
    instance.set_tracing_on(false)?;
    let result = result.and_then(|()| {
        let rest = reader.flush()?;
        out.emit(&mut sink, &rest, args.integrity)
    });
    print_summary(&reader.stats(), out.bad_records);
    drop(reader);
    drop(instance);
    result
}

struct Output {
    clock: Clock,
    /// tid → tgid from /proc (None: the thread is gone).
    tgids: HashMap<i32, Option<i32>>,
    /// Records whose dynamic fields point outside the record.
    bad_records: u64,
}

impl Output {
    fn emit(
        &mut self,
        sink: &mut JsonLines,
        events: &[Event],
        integrity: Integrity,
    ) -> anyhow::Result<()> {
        for e in events {
            let fields = match e.fields() {
                Ok(f) => f,
                Err(err) => {
                    let what = format!(
                        "cpu {} {}:{} record at ts {}: {err}",
                        e.cpu, e.tracepoint.system, e.tracepoint.name, e.ts
                    );
                    if integrity == Integrity::Strict {
                        anyhow::bail!("{what} (--integrity strict)");
                    }
                    log::warn!("{what}; record skipped");
                    self.bad_records += 1;
                    continue;
                }
            };
            let line = Line {
                ts: self.clock.iso8601(e.ts),
                mono_ns: e.ts,
                kind: "ftrace",
                system: &e.tracepoint.system,
                event: &e.tracepoint.name,
                cpu: e.cpu,
                tid: e.common.pid,
                pid: self.tgid(e.common.pid),
                fields,
            };
            sink.emit(&line).context("writing output")?;
        }
        Ok(())
    }

    fn tgid(&mut self, tid: i32) -> Option<i32> {
        if tid <= 0 {
            return Some(tid);
        }
        if self.tgids.len() > 65_536 {
            self.tgids.clear();
        }
        *self.tgids.entry(tid).or_insert_with(|| tgid_of(tid))
    }
}

fn tgid_of(tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:")?.trim().parse().ok())
}

fn print_summary(stats: &ReaderStats, bad_fields: u64) {
    let mode = match stats.mode {
        ReadMode::Mmap => "mmap",
        _ => "read()",
    };
    eprintln!("tracer ftrace summary: read mode {mode}");
    if let Some(reason) = &stats.fallback_reason {
        eprintln!("  fallback: {reason}");
    }
    for c in &stats.cpus {
        eprintln!(
            "  cpu {}: records {}, lost {} (overrun {}, dropped {}, on pages {}, pages with unknown \
             loss {}), entries left {}, corrupt pages {}, bad records {}, unknown events {}",
            c.cpu,
            c.records,
            c.lost(),
            c.overrun,
            c.dropped,
            c.lost_on_pages,
            c.pages_with_unknown_loss,
            c.entries,
            c.corrupt_pages,
            c.bad_records,
            c.unknown_events
        );
    }
    eprintln!(
        "  total: records {}, lost {}, corrupt pages {}, records with bad fields {}",
        stats.records(),
        stats.lost(),
        stats.corrupt_pages(),
        bad_fields
    );
}
