//! The metric families of each pipeline, computed from the summary it prints: one place decides
//! which summary counter becomes which series.
use std::collections::BTreeMap;

use crate::pipeline::audit::AuditSummary;
use crate::pipeline::ftrace::FtraceSummary;
use crate::pipeline::run::RunSummary;

/// Every series value, by family and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Families {
    /// `tracer_events_total{source,kind}`
    pub events: BTreeMap<(String, String), u64>,
    /// `tracer_lost_events_total{source,reason}`
    pub lost: BTreeMap<(String, String), u64>,
    /// `tracer_detections_total{kind}`
    pub detections: BTreeMap<String, u64>,
    /// `tracer_sessions{state}`
    pub sessions: BTreeMap<String, u64>,
    /// `tracer_sessions_failed_total{reason}`
    pub sessions_failed: BTreeMap<String, u64>,
}

impl Families {
    fn event(&mut self, source: &str, kind: &str, n: u64) {
        *self.events.entry((source.into(), kind.into())).or_default() += n;
    }

    /// A loss series; written even at 0 so alerts see the series from the start.
    fn lost(&mut self, source: &str, reason: &str, n: u64) {
        *self.lost.entry((source.into(), reason.into())).or_default() += n;
    }

    /// Kernel detection losses: every reason the BPF programs count, summed over CPUs and kinds,
    /// each present (0 until it happens).
    fn detection_losses(&mut self, losses: &[crate::kernel::detect::Loss]) {
        for reason in tracer_common::LossReason::ALL {
            self.lost("kernel", reason.name(), 0);
        }
        for l in losses {
            self.lost("kernel", l.reason.name(), l.count);
        }
    }

    pub fn of_audit(s: &AuditSummary) -> Families {
        let mut f = Families::default();
        for (kind, n) in &s.kernel_events {
            f.event("kernel", kind, *n);
            *f.detections.entry(kind.to_string()).or_default() += n;
        }
        for (kind, n) in &s.procfs_events {
            f.event("procfs", kind, *n);
            *f.detections.entry(kind.to_string()).or_default() += n;
        }
        f.detection_losses(&s.losses);
        f.lost("kernel", "sequence_gap", s.seq_gaps.iter().map(|g| g.2).sum());
        f.lost("kernel", "recursion_miss", s.recursion_misses.iter().map(|r| r.1).sum());
        f.lost("kernel", "decode_error", s.decode_errors);
        f
    }

    pub fn of_run(s: &RunSummary) -> Families {
        let mut f = Families::default();
        for ((source, kind), n) in &s.detections {
            f.event(source, kind, *n);
            *f.detections.entry(kind.to_string()).or_default() += n;
        }
        for (source, n) in &s.events_by_source {
            f.event(source, "dotnet_event", *n);
        }
        f.detection_losses(&s.detection_losses);
        f.lost("nettrace", "sequence_gap", s.runtime_lost_events);
        f.lost("user_events", "ring_buffer", s.ftrace_lost_events);
        f.lost("user_events", "corrupt_page", s.ftrace_corrupt_pages);
        f.lost("user_events", "decode_error", s.user_events_decode_errors);
        let ended: u64 = s.sessions_ended.values().sum();
        f.sessions.insert("active".into(), s.sessions_started.saturating_sub(ended));
        f.sessions.insert("ended".into(), ended);
        f.sessions_failed.insert("refused".into(), s.sessions_refused);
        f.sessions_failed.insert("error".into(), s.sessions_failed);
        f
    }

    pub fn of_ftrace(s: &FtraceSummary) -> Families {
        let mut f = Families::default();
        // Records handed out minus those whose fields did not decode: the lines written.
        f.event("ftrace", "ftrace", s.reader.records().saturating_sub(s.bad_fields));
        let sum = |g: fn(&tracer_decode::ftrace::stream::CpuStats) -> u64| -> u64 {
            s.reader.cpus.iter().map(g).sum()
        };
        // Page flags and the kernel's overrun count describe the same overwritten events: the
        // larger of the two counts (as in the summary's `lost`).
        f.lost("ftrace", "overrun", sum(|c| c.overrun.max(c.lost_on_pages)));
        f.lost("ftrace", "dropped", sum(|c| c.dropped));
        f.lost("ftrace", "missed_page", sum(|c| c.pages_with_unknown_loss));
        f.lost("ftrace", "corrupt_page", sum(|c| c.corrupt_pages));
        f.lost("ftrace", "bad_record", sum(|c| c.bad_records));
        f.lost("ftrace", "unknown_event", sum(|c| c.unknown_events));
        f.lost("ftrace", "bad_fields", s.bad_fields);
        f
    }
}
