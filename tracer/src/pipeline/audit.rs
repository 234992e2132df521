//! `tracer audit`: attach the detection programs and print every detection as a JSON line.
//!
//! Order of work: attach (so nothing that happens from now on is missed), scan /proc for
//! mappings that already existed (`"source":"procfs"`; a process mapping between the attach and
//! the scan is reported by both), signal readiness, stream live events (`"source":"kernel"`)
//! until stopped, detach, drain the ring, and summarise every kind of loss.
use std::future::Future;

use anyhow::Context as _;
use tokio::sync::oneshot;
use tracer_decode::bpf_event::{DetectionEvent, EventBody};

use crate::export::otlp::{self, OtlpConfig, PipelineExport};
use crate::identity::{ProcessFilter, ProcessTracker};
use crate::kernel::detect::{DetectOptions, Detector, HookChoice};
use crate::kernel::procfs::{self, DetectionChecks, MappingConfirmer};
use crate::metrics::{Health, Publisher};
use crate::output::{self, JsonLines, Kind, Line, Pid, RegistrationTableBody, Source};
use crate::registrations::RegistrationTable;
use crate::time::{Clock, monotonic_ns};

pub use crate::summary::AuditSummary;

#[derive(Clone, Debug, Default)]
pub struct AuditConfig {
    pub target_pids: Vec<u32>,
    /// `--hooks`: the mechanism of the syscall hooks.
    pub hooks: HookChoice,
    pub registrations: bool,
    /// `--container`, `--pod-uid`, `--cgroup`, `--require-env`: only these processes' lines.
    pub filter: ProcessFilter,
    /// `--metrics-addr`: counters and health published for the metrics endpoint.
    pub metrics: Option<Publisher>,
    /// `--otlp-endpoint`: every line also as an OTLP log record.
    pub otlp: Option<OtlpConfig>,
}

/// Runs the audit until `stop` resolves. `ready` is sent once the programs are attached and the
/// procfs findings are written: from then on every event of interest is reported.
pub async fn run(
    config: AuditConfig,
    mut sink: JsonLines,
    stop: impl Future<Output = ()>,
    ready: Option<oneshot::Sender<()>>,
) -> anyhow::Result<AuditSummary> {
    for pid in &config.target_pids {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            anyhow::bail!("--pid {pid}: no such process");
        }
    }
    config.filter.resolve_prefixes_now()?;
    let metrics = config.metrics.clone().unwrap_or_default();
    let mut detector = Detector::attach(&DetectOptions {
        hooks: config.hooks,
        ..DetectOptions::for_targets(&config.target_pids)
    })?;
    let clock = Clock::new();
    let export = PipelineExport::start(config.otlp.as_ref(), clock, &mut sink)?;
    let mut summary = AuditSummary {
        hooks: Some(detector.mechanism().clone()),
        lifecycle_hooks: Some(detector.lifecycle().clone()),
        ..AuditSummary::default()
    };
    let mut state = EventState {
        table: RegistrationTable::new(),
        tracker: ProcessTracker::new(config.filter.clone()),
        confirmer: MappingConfirmer::default(),
    };
    if config.registrations {
        // What processes registered before tracer started, where the kernel can tell: the
        // processes the filters select.
        match detector.existing_registrations() {
            Ok(mut found) => {
                found.enablers.retain(|e| state.tracker.lookup(e.pid, None).included);
                state.table.seed(&found);
                summary.registrations_at_start = found.enablers.len() as u64;
                summary.registration_lists_cut = found.cuts();
                log::info!(
                    "{} user_events registration(s) made before tracer started, found by the \
                     task iterator",
                    found.enablers.len()
                );
            }
            Err(e) => log::info!(
                "the registration table starts empty (registrations made before tracer \
                 started are not known): {e:#}"
            ),
        }
    }

    let scan = procfs::scan_targets(&config.target_pids)
        .context("scanning /proc for existing .NET mappings and diagnostic sockets")?;
    for (pid, _, line) in super::scan_lines(&scan, &clock) {
        let tracked = state.tracker.lookup(pid, None);
        if !tracked.included {
            summary.filtered_out += 1;
            continue;
        }
        let line = line.with_labels(tracked.labels);
        *summary.procfs_events.entry(line.kind().name()).or_default() += 1;
        sink.emit(&line);
    }
    log::info!(
        "attached {} detection programs; {} existing .NET mapping(s) and {} listening \
         diagnostic socket(s) found in /proc",
        detector.attached().len(),
        scan.mappings.len(),
        scan.sockets.len()
    );
    metrics.set_health(Health::Running);
    super::signal_ready(ready);

    let mut batch = Vec::new();
    let mut publish = crate::metrics::publish_interval(config.metrics.is_some());
    tokio::pin!(stop);
    // Until stopped, or until the output takes no more lines.
    while sink.failure().is_none() {
        tokio::select! {
            () = &mut stop => break,
            res = detector.read(&mut batch) => res.context("reading the BPF ring buffer")?,
            _ = publish.tick() => {
                read_losses(&detector, &mut summary)?;
                summary.otlp = export.stats();
                metrics.publish_audit(&summary);
                continue;
            }
        }
        state.emit(&mut batch, &clock, &mut sink.batch(), &mut summary);
    }

    metrics.set_health(Health::Stopping);
    detector.detach();
    detector.drain(&mut batch);
    state.emit(&mut batch, &clock, &mut sink.batch(), &mut summary);

    read_losses(&detector, &mut summary)?;
    if config.registrations {
        sink.emit(&registration_table_line(&state.table, &clock));
        summary.registrations = Some(state.table);
    }
    let events = summary.kernel_events.values().chain(summary.procfs_events.values()).sum();
    let export_deadline = tokio::time::Instant::now() + otlp::SHUTDOWN_TIMEOUT;
    summary.otlp = export.flush(export_deadline).await;
    let losses = summary.loss_counts();
    sink.emit(
        &output::summary_line(&clock, "audit", events, &losses)
            .with_hooks(summary.hooks.as_ref(), summary.lifecycle_hooks.as_ref()),
    );
    summary.otlp = export.finish(&mut sink, export_deadline).await;
    summary.output_error = sink.failure().map(|e| e.to_string());
    summary.unwritten_lines = sink.unwritten();
    metrics.publish_audit(&summary);
    Ok(summary)
}

/// Every loss the detector counts, into the summary (at exit, and live for the metrics).
fn read_losses(detector: &Detector, summary: &mut AuditSummary) -> anyhow::Result<()> {
    summary.losses = detector.losses()?;
    summary.seq_gaps = detector.seq_gaps().gaps();
    summary.decode_errors = detector.decode_errors();
    summary.program_stats = detector.program_stats()?;
    summary.recursion_misses = summary
        .program_stats
        .iter()
        .filter(|(_, s)| s.recursion_misses != 0)
        .map(|(p, s)| (*p, s.recursion_misses))
        .collect();
    Ok(())
}

/// What the detection events update as they become lines: who is selected, the user_events
/// registrations, and the mappings awaiting confirmation in `/proc`.
struct EventState {
    table: RegistrationTable,
    tracker: ProcessTracker,
    confirmer: MappingConfirmer,
}

impl EventState {
    /// The records of one ring-buffer read, as one write to `sink`.
    fn emit(
        &mut self,
        batch: &mut Vec<DetectionEvent>,
        clock: &Clock,
        sink: &mut JsonLines,
        summary: &mut AuditSummary,
    ) {
        let EventState { table, tracker, confirmer } = self;
        for event in batch.drain(..) {
            let (pid, cgroup_id) = (event.meta.pid, Some(event.meta.cgroup_id));
            let tracked = match event.body {
                // A new program image: a new environment for --require-env.
                EventBody::ProcessExec { .. } => tracker.refresh(pid, cgroup_id),
                _ => tracker.lookup(pid, cgroup_id),
            };
            match event.body {
                // A new thread is not a process (its exit is never reported).
                EventBody::ProcessFork { child_pid, clone_flags }
                    if clone_flags & libc::CLONE_THREAD as u64 == 0 =>
                {
                    tracker.inherit(pid, child_pid)
                }
                EventBody::ProcessExit => tracker.forget(pid),
                _ => {}
            }
            if !tracked.included {
                summary.filtered_out += 1;
                continue;
            }
            let checks = DetectionChecks::of(&event, confirmer);
            table.apply(&event);
            let line = output::detection_line(&event, clock, checks).with_labels(tracked.labels);
            *summary.kernel_events.entry(line.kind().name()).or_default() += 1;
            sink.emit(&line);
        }
    }
}

fn registration_table_line<'a>(
    table: &'a RegistrationTable,
    clock: &Clock,
) -> Line<RegistrationTableBody<'a>> {
    let body = RegistrationTableBody::of(table);
    Line::new(
        clock,
        monotonic_ns(),
        Kind::RegistrationTable,
        Source::Tracer,
        Pid::NotApplicable,
        body,
    )
}
