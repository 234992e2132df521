//! `cargo xtask bench detect`: the cost of the detection programs.
//!
//! 1. Per-program BPF run time (`kernel.bpf_stats_enabled` run_time_ns / run_cnt, printed by
//!    `tracer audit` in its summary) while syscall loops run — target ≤ 100 ns per enter+exit.
//! 2. Slowdown of the hooked syscalls' common path (mmap+munmap of an unrelated memfd, a
//!    non-user_events ioctl, and getppid, which no hook watches) with tracer attached vs. not,
//!    alternating rounds, each loop pinned to one CPU: medians, and each round's ratio —
//!    targets ≤ 1.05× (mmap), ≤ 1.25× (ioctl), ≤ 1.27× (getppid).
//! 3. Latency from `mmap` returning in the helper (CLOCK_MONOTONIC) to the JSON line arriving on
//!    tracer's stdout pipe (CLOCK_MONOTONIC at reception) — target p99 ≤ 1 ms.
//! 4. A fork+exit+wait loop without tracer, with its default hooks and with classic tracepoints
//!    only: what the process-lifecycle hooks cost per mechanism (docs/protocol/bpf-detection.md
//!    §10).
use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::bench::{TIMEOUT, Tracer, context_line, median, percentile, write_docs_section};
use crate::util;

/// Alternating rounds: enough that one slow round moves the medians little (single rounds of
/// these loops vary by ±15–25 % on a shared VM).
const ROUNDS: usize = 9;
const MMAP_OPS: &str = "200000";
const IOCTL_OPS: &str = "1000000";
const GETPPID_OPS: &str = "1000000";
const FORK_OPS: &str = "2000";
const LATENCY_SAMPLES: usize = 500;
const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
/// Logged by `tracer audit` once its programs are attached.
const ATTACHED: &str = "attached";

pub fn run() -> anyhow::Result<()> {
    util::require_root("the benchmark loads BPF programs and enables kernel.bpf_stats_enabled")?;
    util::cargo(&["build", "--release", "-p", "tracer", "-p", "tests", "--bins"])?;
    let release = util::workspace_root().join("target/release");
    let stats_before = fs::read_to_string(BPF_STATS).context(BPF_STATS)?;
    let report = measure(&release.join("tracer"), &release.join("detect_helper"));
    fs::write(BPF_STATS, stats_before.trim()).context("restoring kernel.bpf_stats_enabled")?;
    let report = report?;
    println!("{report}");
    write_docs_section("detect", &report)?;
    Ok(())
}

fn measure(tracer: &Path, helper: &Path) -> anyhow::Result<String> {
    // (2) and (3) with run-time statistics off: they add two clock reads per program run.
    fs::write(BPF_STATS, "0").context("disabling kernel.bpf_stats_enabled")?;
    let (mut mmap_base, mut mmap_traced, mut ioctl_base, mut ioctl_traced) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut getppid_base, mut getppid_traced) = (Vec::new(), Vec::new());
    // fork loops: without tracer, with the default hooks, with classic tracepoints only.
    let (mut fork_base, mut fork_auto, mut fork_classic) = (Vec::new(), Vec::new(), Vec::new());
    let mut latencies = Vec::new();
    let mut lifecycle = String::new();
    for round in 0..ROUNDS {
        eprintln!("bench detect: round {}/{ROUNDS}", round + 1);
        mmap_base.push(ns_per_op(helper, "mmap-loop", MMAP_OPS)?);
        ioctl_base.push(ns_per_op(helper, "ioctl-loop", IOCTL_OPS)?);
        getppid_base.push(ns_per_op(helper, "getppid-loop", GETPPID_OPS)?);
        fork_base.push(ns_per_op(helper, "fork-loop", FORK_OPS)?);
        let mut t = Tracer::start(tracer, &["audit"], ATTACHED)?;
        mmap_traced.push(ns_per_op(helper, "mmap-loop", MMAP_OPS)?);
        ioctl_traced.push(ns_per_op(helper, "ioctl-loop", IOCTL_OPS)?);
        getppid_traced.push(ns_per_op(helper, "getppid-loop", GETPPID_OPS)?);
        fork_auto.push(ns_per_op(helper, "fork-loop", FORK_OPS)?);
        if round == 0 {
            latencies = latency(helper, &mut t)?;
        }
        lifecycle = summary_value(&t.stop()?, "lifecycle hooks: ")?;
        let classic =
            Tracer::start(tracer, &["audit", "--hooks", "syscall-tracepoints"], ATTACHED)?;
        fork_classic.push(ns_per_op(helper, "fork-loop", FORK_OPS)?);
        classic.stop()?;
    }

    // (1) per-program cost, from tracer's summary.
    fs::write(BPF_STATS, "1").context("enabling kernel.bpf_stats_enabled")?;
    let mut t = Tracer::start(tracer, &["audit"], ATTACHED)?;
    ns_per_op(helper, "mmap-loop", MMAP_OPS)?;
    ns_per_op(helper, "ioctl-loop", IOCTL_OPS)?;
    latency(helper, &mut t)?;
    let summary = t.stop()?;
    let programs = parse_program_stats(&summary);
    if programs.is_empty() {
        bail!("tracer printed no program statistics:\n{summary}");
    }

    let mechanism = summary_value(&summary, "detection hooks: ")?;
    let mut r = String::new();
    r += &context_line("cargo xtask bench detect");
    r += &format!("tracer's detection hooks here: {mechanism}\n\n");
    r += "(1) BPF cost per program (`kernel.bpf_stats_enabled`, all processes during the loops):\n\n";
    r += "| program | runs | avg ns/run |\n|---|---:|---:|\n";
    for (name, runs, avg) in &programs {
        r += &format!("| {name} | {runs} | {avg:.1} |\n");
    }
    let stats = |n: &str| programs.iter().find(|p| p.0 == n);
    let avg = |n: &str| stats(n).map_or(0.0, |p| p.2);
    // The ioctl pair is attached only on kernels with user_events; there, for a non-user_events
    // ioctl, sys_exit_ioctl returns after one array load: its average is what running any
    // program costs on this machine (dispatch, the statistics' clock reads).
    let ioctl_hooked = stats("sys_exit_ioctl").is_some_and(|p| p.1 > 0);
    let floor = avg("sys_exit_ioctl");
    if ioctl_hooked {
        r += &format!(
            "\nPer-run floor on this machine (`sys_exit_ioctl`, one array load): {floor:.1} ns.\n\n"
        );
    } else {
        r += "\nThis kernel has no user_events: the ioctl hooks are not attached (0 runs), so \
              no per-run floor is measured here.\n\n";
    }
    // mmap and memfd_create have entry programs only (docs/protocol/bpf-detection.md §7).
    r += "| hooked syscall | programs | ns | minus floor per program | target |\n\
          |---|---|---:|---:|---|\n";
    for (sys, programs) in [
        ("mmap", &["sys_enter_mmap"][..]),
        ("memfd_create", &["sys_enter_memfd_create"][..]),
        ("ioctl", &["sys_enter_ioctl", "sys_exit_ioctl"][..]),
    ] {
        if sys == "ioctl" && !ioctl_hooked {
            r += "| ioctl | enter + exit | not hooked | — | ≤ 100 ns |\n";
            continue;
        }
        let total: f64 = programs.iter().map(|p| avg(p)).sum();
        let kind = if programs.len() == 1 { "enter" } else { "enter + exit" };
        let above = if ioctl_hooked {
            format!("{:.1}", total - programs.len() as f64 * floor)
        } else {
            "—".into()
        };
        r += &format!("| {sys} | {kind} | {total:.1} | {above} | ≤ 100 ns |\n");
    }
    r += &format!(
        "\n(2) Syscall loops pinned to one CPU, median of {ROUNDS} alternating rounds (ns per \
         operation; a round's ratio is its traced loop over its untraced one):\n\n"
    );
    r += "| loop | without tracer | with `tracer audit` | ratio | per-round ratios: median \
          (min–max) | target |\n|---|---:|---:|---:|---|---|\n";
    for (name, base, traced, target) in [
        (
            "getppid() — a syscall tracer does not hook",
            &mut getppid_base,
            &mut getppid_traced,
            "≤ 1.27×",
        ),
        ("ioctl(FIONREAD) on /dev/null", &mut ioctl_base, &mut ioctl_traced, "≤ 1.25×"),
        ("mmap+munmap of an unrelated memfd", &mut mmap_base, &mut mmap_traced, "≤ 1.05×"),
    ] {
        let mut ratios: Vec<f64> = traced.iter().zip(base.iter()).map(|(t, b)| t / b).collect();
        let (b, t) = (median(base), median(traced));
        // `median` sorts: the ends are then the extremes.
        let paired = median(&mut ratios);
        let (low, high) = (ratios[0], ratios[ratios.len() - 1]);
        let spread = format!("{paired:.2}× ({low:.2}–{high:.2})");
        r += &format!("| {name} | {b:.1} | {t:.1} | {:.2}× | {spread} | {target} |\n", t / b);
    }
    r += &format!(
        "\n(3) mmap return → JSON line received on tracer's stdout pipe, {} samples: \
         p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs (target p99 ≤ 1000 µs).\n",
        latencies.len(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(0.0)
    );
    let (b, auto, classic) =
        (median(&mut fork_base), median(&mut fork_auto), median(&mut fork_classic));
    r += &format!(
        "\n(4) Process lifecycle: fork + exit + wait of an untracked child, median of {ROUNDS} \
         rounds (ns per operation): without tracer {b:.0}; with `tracer audit` ({lifecycle}) \
         {auto:.0} ({:.3}×); with `tracer audit --hooks syscall-tracepoints` (classic \
         tracepoints) {classic:.0} ({:.3}×).\n",
        auto / b,
        classic / b
    );
    r += READING_THE_NUMBERS;
    Ok(r)
}

const READING_THE_NUMBERS: &str = "
Reading the numbers:
* `run_time_ns` is wall time between program entry and exit. Syscall tracepoint programs are
  preemptible on ≥ 6.13 kernels, so on a loaded machine a program that was descheduled
  mid-run adds milliseconds to the total: the averages of rarely-run programs
  (memfd_create, exec, exit) are dominated by such outliers; the hot paths (mmap, ioctl: 10^5–10^6
  runs) are representative. They include the statistics' own overhead (two clock reads and a
  per-CPU update per run) and the cost of calling a program at all, which depends on the CPU
  and its Spectre mitigations (retpolines make every indirect call and return dearer): the
  floor above is that cost, measured in the same run.
* The loop slowdown is more than the programs' own cost: attaching any syscall tracepoint puts
  every syscall of every task on the traced slow path (`syscall_trace_enter`, perf tracepoint
  dispatch, the faultable-tracepoint SRCU section) — the getppid loop measures that floor. No
  `sys_exit_*` program is attached on kernels without user_events, so the exit side of that
  path stays unused. Below the floor: BPF trampolines, which tracer uses where the kernel
  allows them (docs/protocol/bpf-detection.md §8); on a host that refuses them this table
  measures the fallback, and `cargo xtask vm-test --bench` measures both in the VM.
";

/// What tracer's stderr summary says after `label` (`detection hooks: `, …).
fn summary_value(summary: &str, label: &str) -> anyhow::Result<String> {
    summary
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .map(str::to_string)
        .with_context(|| format!("tracer's summary has no {label:?} line:\n{summary}"))
}

/// `    <program>: runs=<n> avg_ns=<x>` lines of tracer's summary.
fn parse_program_stats(summary: &str) -> Vec<(String, u64, f64)> {
    summary
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(": runs=")?;
            let (runs, avg) = rest.split_once(" avg_ns=")?;
            Some((name.to_string(), runs.parse().ok()?, avg.parse().ok()?))
        })
        .collect()
}

fn ns_per_op(helper: &Path, mode: &str, n: &str) -> anyhow::Result<f64> {
    let out = util::output(Command::new(helper).args([mode, n]))?;
    let v: Value =
        serde_json::from_str(out.trim()).with_context(|| format!("helper said {out:?}"))?;
    v["ns_per_op"].as_f64().context("no ns_per_op")
}

/// mmap-return → JSON-line-received latencies in µs, sorted.
fn latency(helper: &Path, tracer: &mut Tracer) -> anyhow::Result<Vec<f64>> {
    let out = util::output(Command::new(helper).args(["latency", &LATENCY_SAMPLES.to_string()]))?;
    let mapped: Vec<u64> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).ok()?["mapped_mono_ns"].as_u64())
        .collect::<Option<_>>()
        .context("helper output")?;
    let mut received = Vec::new();
    while received.len() < mapped.len() {
        let (at, line) = tracer.lines.recv_timeout(TIMEOUT).context("events missing")?;
        let v: Value = serde_json::from_str(&line)?;
        if v["kind"] == "dotnet_ipc_ready" && v["comm"] == "detect_helper" {
            received.push(at);
        }
    }
    let mut us: Vec<f64> =
        mapped.iter().zip(&received).map(|(m, r)| (*r as f64 - *m as f64) / 1e3).collect();
    us.sort_by(f64::total_cmp);
    Ok(us)
}
