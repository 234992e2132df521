//! `tracer ftrace`: stream kernel tracepoints from a private ftrace instance as JSON lines.
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::oneshot;

use crate::kernel::ftrace_reader::{
    Event, FtraceReader, Integrity, ReadMode, ReaderConfig, Tracepoint,
};
use crate::kernel::tracefs::{EventSpec, Instance, Tracefs};
use crate::output::{self, FtraceRecord, Incarnation, JsonLines, Kind, Line, Pid, Source};
use crate::time::Clock;

pub use crate::summary::FtraceSummary;

/// What `tracer ftrace` records and how.
#[derive(Clone, Debug)]
pub struct FtraceConfig {
    pub events: Vec<EventSpec>,
    /// Ring-buffer size per CPU, in KiB.
    pub buffer_size_kb: u64,
    /// Sub-buffer size in KiB; `None`: the kernel's default (one page).
    pub subbuf_size_kb: Option<u64>,
    /// Wake the reader when a CPU buffer is this full (percent).
    pub buffer_percent: u32,
    pub read_mode: ReadMode,
    pub integrity: Integrity,
    /// `--metrics-addr`: counters and health published for the metrics endpoint.
    pub metrics: Option<crate::metrics::Publisher>,
}

/// Records until `stop` resolves, then drains what is buffered. `ready` is sent once tracing
/// is on: every event from then on is recorded.
pub async fn run(
    config: FtraceConfig,
    mut sink: JsonLines,
    stop: impl Future<Output = ()>,
    ready: Option<oneshot::Sender<()>>,
) -> anyhow::Result<FtraceSummary> {
    let tracefs = Tracefs::find_or_mount()?;
    let instance = Arc::new(Instance::create(&tracefs)?);
    // First: a new sub-buffer size reallocates the buffer.
    if let Some(kb) = config.subbuf_size_kb {
        instance.set_subbuf_size_kb(kb)?;
    }
    instance.set_buffer_size_kb(config.buffer_size_kb)?;
    instance.set_buffer_percent(config.buffer_percent)?;
    instance
        .set_trace_clock("mono")
        .context("selecting the mono trace clock (timestamps must be CLOCK_MONOTONIC)")?;
    let mut tracepoints: Vec<Tracepoint> = Vec::new();
    for spec in &config.events {
        for (system, name) in instance.enable(spec)? {
            if !tracepoints.iter().any(|t| t.system == system && t.name == name) {
                tracepoints.push(instance.tracepoint(&system, &name)?);
            }
        }
    }
    let reader_tracepoints = tracepoints.len();
    let integrity = config.integrity;
    let reader_config = ReaderConfig { mode: config.read_mode, integrity, ..Default::default() };
    let mut reader = FtraceReader::open(instance.clone(), tracepoints, reader_config)?;
    let mut out = Output { clock: Clock::new(), processes: HashMap::new(), bad_records: 0 };
    instance.set_tracing_on(true)?;
    // Logged once recording: a marker written after this line is recorded (tests wait for it).
    log::info!(
        "recording {} tracepoint(s) in instance {} ({} mode)",
        reader_tracepoints,
        instance.name(),
        reader.mode().name()
    );
    let metrics = config.metrics.clone().unwrap_or_default();
    metrics.set_health(crate::metrics::Health::Running);
    super::signal_ready(ready);

    let mut publish = crate::metrics::publish_interval(metrics.is_enabled());
    tokio::pin!(stop);
    // Until stopped, or until the output takes no more lines.
    let result = loop {
        if sink.failure().is_some() {
            break Ok(());
        }
        tokio::select! {
            () = &mut stop => break Ok(()),
            _ = publish.tick() => metrics.publish_ftrace(&FtraceSummary {
                reader: reader.stats(),
                bad_fields: out.bad_records,
                output_error: None,
                unwritten_lines: sink.unwritten(),
            }),
            batch = reader.next_batch() => match batch {
                // A batch of records, one write.
                Ok(events) => out.emit(&mut sink.batch(), &events, integrity)?,
                Err(e) => break Err(e),
            },
        }
    };
    metrics.set_health(crate::metrics::Health::Stopping);
    instance.set_tracing_on(false)?;
    let result = result.and_then(|()| {
        let rest = reader.flush()?;
        out.emit(&mut sink.batch(), &rest, integrity)
    });
    let mut summary = FtraceSummary {
        reader: reader.stats(),
        bad_fields: out.bad_records,
        output_error: None,
        unwritten_lines: 0,
    };
    let written = summary.reader.records() - summary.bad_fields;
    sink.emit(&output::summary_line(&out.clock, "ftrace", written, &summary.losses()));
    summary.output_error = sink.failure().map(|e| e.to_string());
    summary.unwritten_lines = sink.unwritten();
    metrics.publish_ftrace(&summary);
    drop(reader);
    drop(instance);
    // A failure mid-run still reports what was read before it.
    result.map(|()| summary.clone()).inspect_err(|_| eprint!("{summary}"))
}

struct Output {
    clock: Clock,
    /// tid → its process from /proc (None: the thread is gone).
    processes: HashMap<i32, Option<Incarnation>>,
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
            let body = FtraceRecord::of(e, fields);
            let pid = match self.process(e.common.pid) {
                Some(process) => Pid::Known(process),
                None => Pid::Unknown,
            };
            let line = Line::new(&self.clock, e.ts, Kind::Ftrace, Source::Ftrace, pid, body);
            sink.emit(&line);
        }
        Ok(())
    }

    /// The process of thread `tid` (the idle task, 0, has no start), read once.
    fn process(&mut self, tid: i32) -> Option<Incarnation> {
        if tid <= 0 {
            return Some(Incarnation::new(tid as u32, None));
        }
        if self.processes.len() > 65_536 {
            self.processes.clear();
        }
        *self.processes.entry(tid).or_insert_with(|| process_of(tid))
    }
}

/// The process (thread group) of thread `tid`, and its start, read now.
fn process_of(tid: i32) -> Option<Incarnation> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let tgid = u32::try_from(tracer_decode::procfs::parse_status_tgid(&status)?).ok()?;
    Some(Incarnation::new(tgid, crate::kernel::procfs::process_start_ns(tgid)))
}
