//! `per_cpu/cpuN/stats` of a tracefs instance: the kernel's own counters of one CPU buffer.
use serde::Serialize;

/// Counters of one CPU buffer from `per_cpu/cpuN/stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CpuBufferStats {
    /// Entries currently in the buffer.
    pub entries: u64,
    /// Entries overwritten (lost) in overwrite mode.
    pub overrun: u64,
    pub commit_overrun: u64,
    /// Entries dropped in no-overwrite mode (not flagged on pages).
    pub dropped_events: u64,
    pub read_events: u64,
}

impl CpuBufferStats {
    pub fn parse(text: &str) -> CpuBufferStats {
        let mut s = CpuBufferStats::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once(':') else { continue };
            let Ok(v) = value.trim().parse::<u64>() else { continue };
            match key.trim() {
                "entries" => s.entries = v,
                "overrun" => s.overrun = v,
                "commit overrun" => s.commit_overrun = v,
                "dropped events" => s.dropped_events = v,
                "read events" => s.read_events = v,
                _ => {}
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_layout() {
        let s = CpuBufferStats::parse(
            "entries: 5\noverrun: 7\ncommit overrun: 0\nbytes: 10\noldest event ts:     0.000000\n\
             now ts:  1009.465220\ndropped events: 2\nread events: 9\n",
        );
        assert_eq!(
            s,
            CpuBufferStats {
                entries: 5,
                overrun: 7,
                commit_overrun: 0,
                dropped_events: 2,
                read_events: 9
            }
        );
        assert_eq!(CpuBufferStats::parse("entries: x\ngarbage\n"), CpuBufferStats::default());
    }
}
