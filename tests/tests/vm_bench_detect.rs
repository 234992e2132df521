//! `cargo xtask vm-test --bench`: what the detection hooks cost every other process, per
//! mechanism, in the VM whose kernel allows BPF trampolines (the host refuses them): the syscall
//! loops of `cargo xtask bench detect` without tracer's programs, with them on trampolines and
//! with them on syscall tracepoints, alternating rounds in one run, medians.
//! Under TCG software emulation every instruction is emulated, so a syscall costs several times
//! what it costs on hardware and the ratios are smaller than on hardware: compare the mechanisms
//! with each other, not with the host's table.
//! `cargo xtask test` runs it shortened (`TRACER_VM_BENCH_SHORT=1`) for its assertions: both
//! mechanisms attach and every loop runs.
use std::process::Command;

use tests::audit_scenarios::detect_helper;
use tracer::kernel::detect::{DetectOptions, Detector, HookChoice, HookMechanism};

const ROUNDS: usize = 5;
/// Operations per loop, a tenth of the host benchmark's: TCG runs them ~10× slower.
const LOOPS: [(&str, &str, u64); 3] = [
    ("getppid() — a syscall tracer does not hook", "getppid-loop", 100_000),
    ("ioctl(FIONREAD) on /dev/null", "ioctl-loop", 100_000),
    ("mmap+munmap of an unrelated memfd", "mmap-loop", 20_000),
];

fn ns_per_op(mode: &str, ops: u64) -> f64 {
    let out = Command::new(detect_helper()).args([mode, &ops.to_string()]).output().unwrap();
    assert!(out.status.success(), "{mode}: {out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["ns_per_op"].as_f64().expect("ns_per_op")
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The programs attached by `hooks` (every process watched) while the loops run.
fn attached(hooks: HookChoice, want: &HookMechanism) -> Detector {
    let detector = Detector::attach(&DetectOptions { hooks, ..DetectOptions::for_targets(&[]) })
        .expect("attach");
    assert_eq!(detector.mechanism().name(), want.name(), "{:?}", detector.mechanism());
    detector
}

/// (The detector registers its ring with tokio: a runtime, though nothing is read.)
#[tokio::test(flavor = "current_thread")]
async fn syscall_loops_by_hook_mechanism() {
    let short = std::env::var_os("TRACER_VM_BENCH_SHORT").is_some();
    let (rounds, scale) = if short { (1, 10) } else { (ROUNDS, 1) };
    let tracepoints = HookMechanism::SyscallTracepoints { why: String::new() };
    // [loop][without, trampolines, syscall tracepoints] → ns per operation, one per round.
    let mut samples = vec![[Vec::new(), Vec::new(), Vec::new()]; LOOPS.len()];
    let run_loops = |samples: &mut Vec<[Vec<f64>; 3]>, column: usize| {
        for (i, (_, mode, ops)) in LOOPS.iter().enumerate() {
            samples[i][column].push(ns_per_op(mode, ops / scale));
        }
    };
    for _ in 0..rounds {
        run_loops(&mut samples, 0);
        let detector = attached(HookChoice::Trampolines, &HookMechanism::Trampolines);
        run_loops(&mut samples, 1);
        drop(detector);
        let detector = attached(HookChoice::SyscallTracepoints, &tracepoints);
        run_loops(&mut samples, 2);
        drop(detector);
    }
    let mut table = String::from(
        "| loop | without | trampolines | ratio | syscall tracepoints | ratio |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for ((name, _, _), [base, trampolines, syscall]) in LOOPS.iter().zip(&mut samples) {
        let (b, t, s) = (median(base), median(trampolines), median(syscall));
        assert!(b > 0.0 && t > 0.0 && s > 0.0, "{name}: {b} {t} {s}");
        table +=
            &format!("| {name} | {b:.0} | {t:.0} | {:.2}× | {s:.0} | {:.2}× |\n", t / b, s / b);
    }
    println!(
        "@@BENCH detection hooks, ns per operation, median of {rounds} rounds (TCG):\n{table}"
    );
}
