//! `cargo xtask bench sampler`: what CPU sampling costs (docs/protocol/profiling.md "Sampling in
//! the kernel"). A CPU-bound helper (tests/native/busy_helper.c, one spinning thread per CPU)
//! runs without sampling and sampled at 99 Hz and 999 Hz per CPU, in alternating rounds; each
//! run is one `sampler_bench` process (tests/src/bin/sampler_bench.rs). Printed: the helper's
//! throughput (median, and its ratio to the unsampled median), the samples read, the sampler's
//! own CPU time in user space, and — from separate runs with `kernel.bpf_stats_enabled`, which
//! adds two clock reads to every program run — the BPF program's run time per run and per
//! sample. Records the table in docs/benchmarks.md ("sampler").
use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::bench::{context_line, median, write_docs_section};
use crate::util;

/// Alternating rounds: single runs of a spinning helper on a shared machine vary by several
/// percent, more than what sampling costs.
const ROUNDS: usize = 5;
/// Length of each run.
const RUN_MS: &str = "5000";
/// Sampling frequencies measured; 0 is the unsampled baseline.
const FREQUENCIES: [u64; 3] = [0, 99, 999];
const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

pub fn run() -> anyhow::Result<()> {
    util::require_root("the benchmark loads BPF programs and enables kernel.bpf_stats_enabled")?;
    util::cargo(&["build", "--release", "-p", "tests", "--bin", "sampler_bench"])?;
    let bench = util::workspace_root().join("target/release/sampler_bench");
    let stats_before = fs::read_to_string(BPF_STATS).context(BPF_STATS)?;
    let report = measure(&bench);
    fs::write(BPF_STATS, stats_before.trim()).context("restoring kernel.bpf_stats_enabled")?;
    let report = report?;
    println!("{report}");
    write_docs_section("sampler", &report)
}

/// One `sampler_bench` run at `frequency_hz`.
fn once(bench: &Path, frequency_hz: u64) -> anyhow::Result<Value> {
    let out = util::output(Command::new(bench).args([&frequency_hz.to_string(), RUN_MS]))?;
    let run: Value =
        serde_json::from_str(out.trim()).with_context(|| format!("sampler_bench said {out:?}"))?;
    if run["losses"].as_u64() != Some(0) {
        eprintln!("bench sampler: {frequency_hz} Hz run lost samples: {run}");
    }
    Ok(run)
}

fn field(run: &Value, name: &str) -> anyhow::Result<f64> {
    run[name].as_f64().with_context(|| format!("no {name} in {run}"))
}

fn measure(bench: &Path) -> anyhow::Result<String> {
    let seconds: f64 = RUN_MS.parse::<f64>()? / 1e3;
    fs::write(BPF_STATS, "0").context("disabling kernel.bpf_stats_enabled")?;
    let mut runs: Vec<Vec<Value>> = vec![Vec::new(); FREQUENCIES.len()];
    for round in 0..ROUNDS {
        eprintln!("bench sampler: round {}/{ROUNDS}", round + 1);
        for (i, &hz) in FREQUENCIES.iter().enumerate() {
            runs[i].push(once(bench, hz)?);
        }
    }
    fs::write(BPF_STATS, "1").context("enabling kernel.bpf_stats_enabled")?;
    let mut stats_runs = Vec::new();
    for &hz in &FREQUENCIES[1..] {
        stats_runs.push(once(bench, hz)?);
    }

    let medians = |runs: &[Value], name: &str| -> anyhow::Result<f64> {
        let mut values = runs.iter().map(|r| field(r, name)).collect::<anyhow::Result<Vec<_>>>()?;
        Ok(median(&mut values))
    };
    let baseline = medians(&runs[0], "units_per_second")?;
    if baseline <= 0.0 {
        bail!("the unsampled helper did no work");
    }
    let mut r = context_line("cargo xtask bench sampler");
    r += &format!(
        "A CPU-bound helper (tests/native/busy_helper.c `throughput`: one spinning thread per \
         CPU, every CPU busy) for {seconds} s per run, median of {ROUNDS} alternating rounds; \
         tracer's CPU sampler (`tracer::kernel::sampler`, cpu-clock on every CPU, the helper as \
         its target) reads the samples as `tracer profile` does. BPF run time from one more run \
         per frequency with `kernel.bpf_stats_enabled` (its clock reads included).\n\n"
    );
    r += "| sampling | helper work/s | vs unsampled | per-round ratios: median (min–max) | \
          samples/s | sampler CPU (user space) | BPF ns per run | BPF ns per sample | BPF CPU |\n\
          |---|---:|---:|---|---:|---:|---:|---:|---:|\n";
    for (i, &hz) in FREQUENCIES.iter().enumerate() {
        let work = medians(&runs[i], "units_per_second")?;
        if hz == 0 {
            r += &format!("| none | {work:.0} | 1.000× | — | — | — | — | — | — |\n");
            continue;
        }
        // Each round's sampled run over the same round's unsampled one.
        let mut ratios = runs[i]
            .iter()
            .zip(&runs[0])
            .map(|(sampled, unsampled)| {
                Ok(field(sampled, "units_per_second")? / field(unsampled, "units_per_second")?)
            })
            .collect::<anyhow::Result<Vec<f64>>>()?;
        // `median` sorts: the ends are then the extremes.
        let paired = median(&mut ratios);
        let spread = format!("{paired:.3}× ({:.3}–{:.3})", ratios[0], ratios[ratios.len() - 1]);
        let samples = medians(&runs[i], "samples")? / seconds;
        let cpu_ms = medians(&runs[i], "sampler_cpu_seconds")? * 1e3 / seconds;
        let stats = &stats_runs[i - 1];
        let (run_time, bpf_runs, sampled) =
            (field(stats, "bpf_run_time_ns")?, field(stats, "bpf_runs")?, field(stats, "samples")?);
        r += &format!(
            "| {hz} Hz | {work:.0} | {:.3}× | {spread} | {samples:.0} | {cpu_ms:.2} ms/s ({:.1} \
             µs per sample) | {:.0} | {:.0} | {:.2} ms/s |\n",
            work / baseline,
            cpu_ms * 1e3 / samples,
            run_time / bpf_runs.max(1.0),
            run_time / sampled.max(1.0),
            run_time / 1e6 / seconds,
        );
    }
    r += READING_THE_NUMBERS;
    Ok(r)
}

const READING_THE_NUMBERS: &str = "
Reading the numbers:
* The program runs on every tick of every CPU, also when the CPU runs something else (then it
  returns after the process check); \"per sample\" spreads all its runs over the samples taken.
  Most of a sample's cost is `bpf_get_stack`: walking the user stack's frame pointers
  (reading user memory from the interrupt); the frames are then copied to the ring with the
  record. At 99 Hz each run meets cold caches, so a run costs more than at 999 Hz.
* The sampler's user-space CPU is this process's time while the helper ran: the 100 ms drain
  timer and decoding the records, frames included.
* The throughput ratio is the helper's loss to the sampling interrupts and programs. What the
  programs take (the BPF CPU column, summed over the CPUs) is a fraction of a percent of the
  CPUs, less than rounds of the helper differ on a shared machine: the per-round ratios show
  that spread, and a median above 1 is that noise, not a gain.
";
