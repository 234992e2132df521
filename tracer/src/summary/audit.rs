//! What `tracer audit` counted: printed at exit, published as metrics, reported in its
//! `summary` line.
use std::collections::BTreeMap;
use std::fmt;

use tracer_common::EventKind;

use crate::export::otlp::ExportStats;
use crate::kernel::detect::{HookMechanism, LifecycleMechanism, Loss, ProgramStats};
use crate::output::{self, LossCount};
use crate::registrations::RegistrationTable;

/// What happened during a run; `Display` is the stderr summary.
#[derive(Debug, Default)]
pub struct AuditSummary {
    /// Live events per kind name.
    pub kernel_events: BTreeMap<&'static str, u64>,
    /// Start-up procfs findings per kind name.
    pub procfs_events: BTreeMap<&'static str, u64>,
    pub losses: Vec<Loss>,
    /// (cpu, kind, missing events)
    pub seq_gaps: Vec<(u32, EventKind, u64)>,
    pub decode_errors: u64,
    /// (program, skipped invocations), nonzero only.
    pub recursion_misses: Vec<(&'static str, u64)>,
    /// Run statistics per program; run counts and times stay 0 unless
    /// `kernel.bpf_stats_enabled` is 1.
    pub program_stats: Vec<(&'static str, ProgramStats)>,
    /// The mechanism of the syscall hooks.
    pub hooks: Option<HookMechanism>,
    /// The mechanism of the process-lifecycle hooks.
    pub lifecycle_hooks: Option<LifecycleMechanism>,
    /// The table at exit, when `registrations` was requested.
    pub registrations: Option<RegistrationTable>,
    /// Registrations found at start (the task iterator), and times their list was cut.
    pub registrations_at_start: u64,
    pub registration_lists_cut: u64,
    /// Why the output stopped taking lines, when it did.
    pub output_error: Option<String>,
    /// Lines not written because the output failed.
    pub unwritten_lines: u64,
    /// Lines not written because the process filters do not select their process.
    pub filtered_out: u64,
    /// `--otlp-endpoint`: records sent and lost.
    pub otlp: Option<ExportStats>,
}

impl AuditSummary {
    pub fn total_lost(&self) -> u64 {
        self.loss_counts().iter().map(|l| l.count).sum()
    }

    /// Every loss by where and how, as the `summary` line reports it (sequence gaps are left
    /// out: they are the ring reservations that failed, counted as `ring_full`).
    pub fn loss_counts(&self) -> Vec<LossCount> {
        output::nonzero(self.all_loss_counts())
    }

    /// Every kind of loss `audit` counts, zero counts included (metrics keep every series).
    pub fn all_loss_counts(&self) -> Vec<LossCount> {
        let mut all = super::run::detection_losses(&self.losses);
        all.extend([
            LossCount {
                source: "kernel",
                reason: "recursion_miss",
                count: self.recursion_misses.iter().map(|r| r.1).sum(),
            },
            LossCount { source: "kernel", reason: "corrupt_record", count: self.decode_errors },
            LossCount {
                source: "kernel",
                reason: "registration_list_cut",
                count: self.registration_lists_cut,
            },
            LossCount { source: "output", reason: "write_failed", count: self.unwritten_lines },
        ]);
        if let Some(otlp) = &self.otlp {
            all.extend(otlp.losses());
        }
        all
    }
}

impl fmt::Display for AuditSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "tracer audit summary")?;
        let counts = |m: &BTreeMap<&str, u64>| {
            if m.is_empty() {
                "none".to_string()
            } else {
                m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
            }
        };
        writeln!(f, "  kernel events: {}", counts(&self.kernel_events))?;
        writeln!(f, "  procfs events: {}", counts(&self.procfs_events))?;
        if let Some(hooks) = &self.hooks {
            writeln!(f, "  detection hooks: {hooks}")?;
        }
        if let Some(lifecycle) = &self.lifecycle_hooks {
            writeln!(f, "  lifecycle hooks: {lifecycle}")?;
        }
        if self.losses.is_empty() {
            writeln!(f, "  losses: none")?;
        } else {
            writeln!(f, "  losses:")?;
            for l in &self.losses {
                writeln!(
                    f,
                    "    cpu {} {} {}: {}",
                    l.cpu,
                    l.kind.name(),
                    l.reason.name(),
                    l.count
                )?;
            }
        }
        if self.seq_gaps.is_empty() {
            writeln!(f, "  sequence gaps: none")?;
        } else {
            writeln!(f, "  sequence gaps:")?;
            for (cpu, kind, missing) in &self.seq_gaps {
                writeln!(f, "    cpu {cpu} {}: {missing} missing", kind.name())?;
            }
        }
        if self.recursion_misses.is_empty() {
            writeln!(f, "  skipped invocations (recursion_misses): none")?;
        } else {
            for (prog, n) in &self.recursion_misses {
                writeln!(f, "  skipped invocations of {prog} (recursion_misses): {n}")?;
            }
        }
        writeln!(f, "  corrupt ring records: {}", self.decode_errors)?;
        if self.filtered_out > 0 {
            writeln!(
                f,
                "  lines filtered out (--container/--pod-uid/--cgroup/--require-env): {}",
                self.filtered_out
            )?;
        }
        if self.program_stats.iter().any(|(_, s)| s.run_cnt != 0) {
            writeln!(f, "  program run time (kernel.bpf_stats_enabled):")?;
            for (prog, s) in &self.program_stats {
                let avg =
                    if s.run_cnt == 0 { 0.0 } else { s.run_time_ns as f64 / s.run_cnt as f64 };
                writeln!(f, "    {prog}: runs={} avg_ns={avg:.1}", s.run_cnt)?;
            }
        }
        if let Some(otlp) = &self.otlp {
            writeln!(f, "  OTLP records sent: {}", otlp.exported)?;
            let lost = otlp.losses().map(|l| format!("{}={}", l.reason, l.count));
            writeln!(f, "  OTLP records lost: {}", lost.join(" "))?;
        }
        if let Some(table) = &self.registrations {
            writeln!(f, "user_events registrations at exit:")?;
            write!(f, "{}", table.render())?;
        }
        if let Some(error) = &self.output_error {
            writeln!(f, "  output failed: {error} (lines not written: {})", self.unwritten_lines)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_text() {
        let mut s = AuditSummary::default();
        s.kernel_events.insert("process_exit", 2);
        s.losses.push(Loss {
            cpu: 1,
            kind: EventKind::DotnetIpcReady,
            reason: tracer_common::LossReason::RingFull,
            count: 4,
        });
        s.seq_gaps.push((1, EventKind::DotnetIpcReady, 4));
        s.program_stats.push(("sys_enter_mmap", ProgramStats::default()));
        assert!(!s.to_string().contains("program run time"), "hidden while stats are off");
        s.program_stats[0].1.run_cnt = 4;
        s.program_stats[0].1.run_time_ns = 100;
        let text = s.to_string();
        assert!(text.contains("sys_enter_mmap: runs=4 avg_ns=25.0"), "{text}");
        assert!(text.contains("kernel events: process_exit=2"), "{text}");
        assert!(text.contains("cpu 1 dotnet_ipc_ready ring_full: 4"), "{text}");
        assert!(text.contains("cpu 1 dotnet_ipc_ready: 4 missing"), "{text}");
        assert_eq!(s.total_lost(), 4);
    }
}
