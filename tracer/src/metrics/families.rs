//! The metric families of each pipeline, computed from the summary it prints: one place decides
//! which summary counter becomes which series.
use std::collections::BTreeMap;

use super::runtime::RuntimeFamilies;
use crate::kernel::detect::HookMechanism;
use crate::output::LossCount;
use crate::summary::AuditSummary;
use crate::summary::FtraceSummary;
use crate::summary::RunSummary;

/// Every series value, by family and labels.
#[derive(Clone, Debug, Default, PartialEq)]
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
    /// `run`: the traced processes' runtime counters, one family per counter metric name; built
    /// when scraped, from the table `run` serves (`Publisher::serve_runtime_counters`).
    pub runtime: RuntimeFamilies,
    /// `tracer_detection_hooks{mechanism}` (1 for the one running): `run` and `audit`.
    pub detection_hooks: Option<&'static str>,
}

impl Families {
    fn event(&mut self, source: &str, kind: &str, n: u64) {
        *self.events.entry((source.into(), kind.into())).or_default() += n;
    }

    /// A loss series; written even at 0 so alerts see the series from the start.
    fn lost(&mut self, source: &str, reason: &str, n: u64) {
        *self.lost.entry((source.into(), reason.into())).or_default() += n;
    }

    /// The summary's loss counts, every one a series (0 until it happens).
    fn losses(&mut self, losses: &[LossCount]) {
        for l in losses {
            self.lost(l.source, l.reason, l.count);
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
        f.losses(&s.all_loss_counts());
        f.detection_hooks = s.hooks.as_ref().map(HookMechanism::name);
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
        if s.kernel_events_reader.is_some() {
            f.event("ftrace", "ftrace", s.kernel_events.written);
        }
        f.losses(&s.all_losses());
        let ended: u64 = s.sessions_ended.values().sum();
        f.sessions.insert("active".into(), s.sessions_started.saturating_sub(ended));
        f.sessions.insert("ended".into(), ended);
        f.sessions_failed.insert("refused".into(), s.sessions_refused);
        f.sessions_failed.insert("error".into(), s.sessions_failed);
        f.detection_hooks = s.hooks.as_ref().map(HookMechanism::name);
        f
    }

    pub fn of_ftrace(s: &FtraceSummary) -> Families {
        let mut f = Families::default();
        // Records handed out minus those whose fields did not decode: the lines written.
        f.event("ftrace", "ftrace", s.reader.records().saturating_sub(s.bad_fields));
        f.losses(&s.all_losses());
        f
    }
}
