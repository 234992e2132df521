//! What `tracer run` counted: printed at exit, published as metrics, reported in its `summary`
//! line.
use std::collections::BTreeMap;

use tracer_common::LossReason;
use tracer_decode::text::escape_control;

use crate::export::otlp::ExportStats;
use crate::export::otlp_metrics::MetricsExportStats;
use crate::kernel::detect::{HookMechanism, LifecycleMechanism, Loss};
use crate::kernel::ftrace_reader::ReaderStats;
use crate::metrics::runtime::RuntimeCounters;
use crate::output::{self, LossCount};
use crate::session::user_events;

/// What happened during a run; printed to stderr at the end.
#[derive(Debug, Default)]
pub struct RunSummary {
    pub processes: u64,
    pub sessions_started: u64,
    pub sessions_ended: BTreeMap<&'static str, u64>,
    pub sessions_failed: u64,
    pub sessions_refused: u64,
    /// Names refused as a process's socket (by reason), also those a session then looked past.
    pub sockets_refused: BTreeMap<&'static str, u64>,
    /// Refused names beyond the ones each session reports individually.
    pub sockets_refused_not_reported: u64,
    /// `--nettrace-dir`: files complete, and truncated (abnormal end or failed write).
    pub nettrace_files_complete: u64,
    pub nettrace_files_truncated: u64,
    /// Files whose creation or a write failed (disk full).
    pub nettrace_file_failures: u64,
    pub events_by_provider: BTreeMap<String, u64>,
    /// Runtime events that neither their metadata nor the runtime-event table names: written
    /// as `EventID(<id>)` with a `raw_payload`.
    pub unnamed_events: u64,
    /// `ILogger` messages whose payload did not decode as one (written as `dotnet_event` lines,
    /// not as `log` lines).
    pub unparsed_log_messages: u64,
    /// Events the runtimes numbered but never delivered (nettrace sequence gaps), all sessions.
    pub runtime_lost_events: u64,
    /// Events of providers no session asked for, dropped undecoded.
    pub unrequested_events: u64,
    /// Bytes still queued on sockets when drain timeouts ended sessions.
    pub unread_bytes_at_drain: u64,
    /// Bytes not decoded because the session's process had exited while another process held
    /// its connection open.
    pub bytes_after_exit: u64,
    /// Events decoded but not written because their streaming session passed a byte budget.
    pub unwritten_over_budget: u64,
    /// Stacks streams defined that their parsers did not keep (their events' lines have no
    /// `stack`).
    pub stacks_refused: u64,
    /// Lines written without their `stack`: their session's stack budget was spent.
    pub stacks_unwritten: u64,
    /// Streaming sessions whose StopTracing the runtime did not acknowledge.
    pub stop_failures: u64,
    /// Processes that had to wait for a session slot.
    pub sessions_waited: u64,
    /// Processes that never got a session: the wait queue was full, or tracer stopped first.
    pub sessions_not_admitted: u64,
    /// Detection losses in the kernel (ring full, failed reads, full maps).
    pub detection_losses: Vec<Loss>,
    /// Detection program invocations the kernel skipped (another BPF program was running).
    pub detection_recursion_misses: u64,
    /// The mechanism of the syscall hooks.
    pub hooks: Option<HookMechanism>,
    /// The mechanism of the process-lifecycle hooks.
    pub lifecycle_hooks: Option<LifecycleMechanism>,
    /// Detection records that did not decode.
    pub detection_decode_errors: u64,
    /// user_events sessions: the ftrace reader of tracer's instance.
    pub user_events_reader: Option<ReaderStats>,
    /// user_events records that did not decode.
    pub user_events_decode_errors: u64,
    /// user_events records decoded but not written: their process's output budget was spent.
    pub user_events_over_budget: u64,
    /// user_events event metadata the cache refused (full): those events keep raw payloads.
    pub user_events_metadata_refused: u64,
    /// user_events records written by a process that is not (verifiably) a thread of the
    /// session's process: dropped.
    pub user_events_foreign_writer: u64,
    /// user_events records of sessions whose start was never confirmed (or past the bound of
    /// records held until it was): dropped.
    pub user_events_not_started: u64,
    /// user_events enable words leaked because the kernel refused to unregister them.
    pub user_events_leaked_words: u64,
    /// Why the output stopped taking lines (`EPIPE`, `ENOSPC`, …), when it did.
    pub output_error: Option<String>,
    /// Lines not written because the output failed.
    pub unwritten_lines: u64,
    /// Detection lines written, by (source, kind).
    pub detections: BTreeMap<(&'static str, &'static str), u64>,
    /// Runtime events written, by source (`nettrace`, `user_events`).
    pub events_by_source: BTreeMap<&'static str, u64>,
    /// .NET processes the filters did not select (no session, no lines).
    pub filtered_out: u64,
    /// `--otlp-endpoint`: records sent and lost.
    pub otlp: Option<ExportStats>,
    /// `--otlp-endpoint`: runtime metrics' data points sent and lost.
    pub otlp_metrics: Option<MetricsExportStats>,
    /// `OTEL_RESOURCE_ATTRIBUTES` entries of traced processes left out of their resource
    /// (malformed, or past the bounds).
    pub resource_attributes_dropped: u64,
    /// `--metrics-addr`: the traced processes' runtime counters (`EventCounters` events).
    pub runtime_counters: Option<RuntimeCounters>,
    /// `--kernel-event`: the reader of the kernel events' instance, and what they wrote and
    /// dropped.
    pub kernel_events_reader: Option<ReaderStats>,
    pub kernel_events: KernelEventCounts,
}

impl RunSummary {
    pub fn events(&self) -> u64 {
        self.events_by_provider.values().sum()
    }

    /// Every loss, by where and how (zero counts left out).
    pub fn losses(&self) -> Vec<LossCount> {
        output::nonzero(self.all_losses())
    }

    /// Every kind of loss `run` counts, zero counts included (metrics keep every series).
    pub fn all_losses(&self) -> Vec<LossCount> {
        let mut all = detection_losses(&self.detection_losses);
        all.extend([
            loss("kernel", "recursion_miss", self.detection_recursion_misses),
            loss("kernel", "corrupt_record", self.detection_decode_errors),
            loss("nettrace", "sequence_gap", self.runtime_lost_events),
            loss("nettrace", "unrequested_provider", self.unrequested_events),
            loss("nettrace", "unread_bytes_at_drain_timeout", self.unread_bytes_at_drain),
            loss("nettrace", "bytes_after_exit", self.bytes_after_exit),
            loss("nettrace", "budget_exceeded", self.unwritten_over_budget),
            loss("nettrace", "stack_refused", self.stacks_refused),
            loss("nettrace", "stack_budget_exceeded", self.stacks_unwritten),
            loss("nettrace", "unparsed_log_message", self.unparsed_log_messages),
            loss("user_events", "undecodable_record", self.user_events_decode_errors),
            loss("user_events", "budget_exceeded", self.user_events_over_budget),
            loss("user_events", "metadata_cache_full", self.user_events_metadata_refused),
            loss("user_events", "foreign_writer", self.user_events_foreign_writer),
            loss("user_events", "session_not_started", self.user_events_not_started),
            loss("output", "write_failed", self.unwritten_lines),
        ]);
        if let Some(stats) = &self.user_events_reader {
            all.extend(output::ftrace_losses("user_events", stats));
        }
        if let Some(otlp) = &self.otlp {
            all.extend(otlp.losses());
        }
        if let Some(otlp) = &self.otlp_metrics {
            all.extend(otlp.losses());
            all.push(loss(
                "otlp_metrics",
                "resource_attribute_dropped",
                self.resource_attributes_dropped,
            ));
        }
        if let Some(stats) = &self.kernel_events_reader {
            all.extend(kernel_event_losses(stats, &self.kernel_events));
        }
        if let Some(counters) = &self.runtime_counters {
            all.extend([
                loss("metrics", "series_limit", counters.refused()),
                loss("metrics", "bad_counter", counters.bad_samples()),
            ]);
            all.extend(
                counters.runtime_losses().map(|(why, count)| loss("metrics", why.reason(), count)),
            );
        }
        all
    }

    /// Every event known lost.
    pub fn lost(&self) -> u64 {
        self.losses().iter().map(|l| l.count).sum()
    }

    /// Counts a session's `--nettrace-dir` file.
    pub(crate) fn count_nettrace_file(&mut self, file: Option<&crate::output::NettraceFileTotals>) {
        let Some(file) = file else { return };
        if file.nettrace_file_complete {
            self.nettrace_files_complete += 1;
        } else {
            self.nettrace_files_truncated += 1;
        }
        self.nettrace_file_failures += u64::from(file.nettrace_file_error.is_some());
    }

    /// Takes the user_events hub's counters.
    pub(crate) fn record_user_events_stats(&mut self, hub: &user_events::Hub) {
        self.user_events_reader = Some(hub.stats());
        self.user_events_decode_errors = hub.decode_errors();
        self.user_events_over_budget = hub.over_budget();
        self.user_events_metadata_refused = hub.metadata_refused();
        self.user_events_foreign_writer = hub.foreign_writer();
        self.user_events_not_started = hub.not_started();
        self.user_events_leaked_words = crate::kernel::user_events::leaked_enable_words();
    }

    /// The summary on stderr.
    pub fn print(&self) {
        eprintln!("tracer run summary:");
        if let Some(hooks) = &self.hooks {
            eprintln!("  detection hooks: {hooks}");
        }
        if let Some(lifecycle) = &self.lifecycle_hooks {
            eprintln!("  lifecycle hooks: {lifecycle}");
        }
        eprintln!("  processes detected: {}", self.processes);
        if self.filtered_out > 0 {
            eprintln!("  processes filtered out: {}", self.filtered_out);
        }
        eprintln!(
            "  sessions: {} started, {} failed, {} refused (unsafe socket)",
            self.sessions_started, self.sessions_failed, self.sessions_refused
        );
        for (reason, n) in &self.sessions_ended {
            eprintln!("    ended ({reason}): {n}");
        }
        if self.sessions_waited + self.sessions_not_admitted > 0 {
            eprintln!(
                "    admission: {} waited for a slot, {} never admitted",
                self.sessions_waited, self.sessions_not_admitted
            );
        }
        if self.stop_failures > 0 {
            eprintln!("    StopTracing not acknowledged: {}", self.stop_failures);
        }
        for (reason, n) in &self.sockets_refused {
            eprintln!("    socket names refused ({reason}): {n}");
        }
        if self.nettrace_files_complete + self.nettrace_files_truncated > 0 {
            eprintln!(
                "  nettrace files: {} complete, {} truncated ({} failed to write)",
                self.nettrace_files_complete,
                self.nettrace_files_truncated,
                self.nettrace_file_failures
            );
        }
        if self.sockets_refused_not_reported > 0 {
            eprintln!(
                "    socket names refused, not reported one by one: {}",
                self.sockets_refused_not_reported
            );
        }
        eprintln!("  events: {}", self.events());
        for (provider, n) in &self.events_by_provider {
            eprintln!("    {}: {n}", escape_control(provider));
        }
        if self.unnamed_events > 0 {
            eprintln!("    unnamed (not in the runtime-event table): {}", self.unnamed_events);
        }
        if let Some(otlp) = &self.otlp {
            eprintln!("  OTLP records sent: {}, lost: {}", otlp.exported, otlp.lost());
        }
        if self.kernel_events_reader.is_some() {
            eprintln!(
                "  kernel events: {} written, {} of other processes not written",
                self.kernel_events.written, self.kernel_events.other_process
            );
        }
        let losses = self.losses();
        eprintln!("  losses: {}", losses.iter().map(|l| l.count).sum::<u64>());
        for l in &losses {
            eprintln!("    {} {}: {}", l.source, l.reason, l.count);
        }
        for l in &self.detection_losses {
            eprintln!(
                "    detection cpu {} {} {}: {}",
                l.cpu,
                l.kind.name(),
                l.reason.name(),
                l.count
            );
        }
        if self.user_events_leaked_words > 0 {
            eprintln!(
                "  user_events enable words leaked (unregister failed): {}",
                self.user_events_leaked_words
            );
        }
        if let Some(error) = &self.output_error {
            eprintln!("  output failed: {error} (lines not written: {})", self.unwritten_lines);
        }
    }
}

fn loss(source: &'static str, reason: &'static str, count: u64) -> LossCount {
    LossCount { source, reason, count }
}

/// Kernel detection losses summed over CPUs and kinds, per reason.
pub fn detection_losses(losses: &[Loss]) -> Vec<LossCount> {
    LossReason::ALL
        .iter()
        .map(|&reason| {
            let count = losses.iter().filter(|l| l.reason == reason).map(|l| l.count).sum();
            loss("kernel", reason.name(), count)
        })
        .collect()
}

/// What the kernel events wrote and dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelEventCounts {
    /// Records of a thread not known as one of a traced process's: mostly of other processes
    /// (a traced process's children, the other side of a context switch), so counted apart
    /// from the losses.
    pub other_process: u64,
    /// Records whose fields did not decode.
    pub bad_fields: u64,
    /// Threads not remembered: the table was full.
    pub thread_table_full: u64,
    /// Records written.
    pub written: u64,
}

/// The losses of the kernel events: the reader's and the records of traced threads dropped,
/// zero counts included.
pub fn kernel_event_losses(stats: &ReaderStats, counts: &KernelEventCounts) -> Vec<LossCount> {
    let mut all = output::ftrace_losses("kernel_events", stats);
    let loss = |reason, count| LossCount { source: "kernel_events", reason, count };
    all.extend([
        loss("bad_fields", counts.bad_fields),
        loss("thread_table_full", counts.thread_table_full),
    ]);
    all
}
