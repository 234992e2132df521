//! What `tracer ftrace` counted: printed at exit, published as metrics, reported in its
//! `summary` line.
use std::fmt;

use crate::kernel::ftrace_reader::{ReadMode, ReaderStats};
use crate::output::{self, LossCount};

/// What a `tracer ftrace` run read and lost; `Display` is the stderr summary.
#[derive(Clone, Debug)]
pub struct FtraceSummary {
    pub reader: ReaderStats,
    /// Records whose dynamic fields point outside the record.
    pub bad_fields: u64,
    /// Why the output stopped taking lines, when it did.
    pub output_error: Option<String>,
    /// Lines not written because the output failed.
    pub unwritten_lines: u64,
}

impl FtraceSummary {
    /// Every loss by where and how (zero counts left out).
    pub fn losses(&self) -> Vec<LossCount> {
        output::nonzero(self.all_losses())
    }

    /// Every kind of loss `ftrace` counts, zero counts included (metrics keep every series).
    pub fn all_losses(&self) -> Vec<LossCount> {
        let mut all = output::ftrace_losses("ftrace", &self.reader);
        all.push(LossCount { source: "ftrace", reason: "bad_fields", count: self.bad_fields });
        all.push(LossCount {
            source: "output",
            reason: "write_failed",
            count: self.unwritten_lines,
        });
        all
    }
}

impl fmt::Display for FtraceSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stats = &self.reader;
        let mode = match stats.mode {
            ReadMode::Mmap => "mmap",
            _ => "read()",
        };
        writeln!(f, "tracer ftrace summary: read mode {mode}")?;
        if let Some(reason) = &stats.fallback_reason {
            writeln!(f, "  fallback: {reason}")?;
        }
        for c in &stats.cpus {
            writeln!(
                f,
                "  cpu {}: records {}, lost {} (overrun {}, dropped {}, on pages {}, pages with \
                 unknown loss {}), entries left {}, corrupt pages {}, bad records {}, unknown \
                 events {}",
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
            )?;
        }
        if let Some(report) = &stats.last_corruption {
            writeln!(f, "  last {report}")?;
        }
        writeln!(
            f,
            "  total: records {}, lost {}, corrupt pages {}, records with bad fields {}",
            stats.records(),
            stats.lost(),
            stats.corrupt_pages(),
            self.bad_fields
        )?;
        if let Some(error) = &self.output_error {
            writeln!(f, "  output failed: {error} (lines not written: {})", self.unwritten_lines)?;
        }
        Ok(())
    }
}
