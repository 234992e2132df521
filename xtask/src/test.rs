//! `cargo xtask test`: every runner in turn (the container image the host tests run, host tests
//! with nextest, doctests, the VM tests, the fuzz smoke runs), each to the end even when an
//! earlier one failed, then one closing line whose numbers come from the runners' own output,
//! and a last line `N passed, N failed` with the totals (CI's log reader reads that line).
use std::fmt::Write as _;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use crate::libtest::TestResult;
use crate::{fuzz, image, setup, util, vm};

/// Seconds per fuzz target: they prove every target builds and survives its seeds plus fresh
/// inputs.
const FUZZ_SMOKE_SECONDS: u32 = 15;
/// Wall-clock limit of the VM run (boot, the vm_* binaries, the short benchmarks).
const VM_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// One runner's part of the closing line.
#[derive(Debug, PartialEq, Eq)]
struct Stage {
    label: &'static str,
    /// Its counts as shown, e.g. `157 passed, 0 failed`.
    detail: String,
    passed: u64,
    failed: u64,
    /// Why it failed: the tests that did not pass, or what went wrong.
    failures: Vec<String>,
}

impl Stage {
    /// A runner that could not run at all: the summary says what it was doing (the whole
    /// error is among the failures printed above it).
    fn not_run(label: &'static str, error: &anyhow::Error) -> Stage {
        Stage {
            label,
            detail: format!("not run ({error})"),
            passed: 0,
            failed: 0,
            failures: vec![format!("{error:#}")],
        }
    }

    /// Failures count at least once even when no test failed (a build error, a hang).
    fn failed_count(&self) -> u64 {
        if self.failures.is_empty() { self.failed } else { self.failed.max(1) }
    }
}

pub fn run(args: &[String]) -> ExitCode {
    let prepared = util::require_root("the tests load BPF programs and use tracefs")
        .and_then(|()| setup::run())
        .and_then(|()| util::cargo(&["build", "--workspace", "--all-targets"]));
    let stages = match prepared {
        Err(e) => vec![Stage::not_run("set-up", &e)],
        Ok(()) => vec![image_stage(), host(args), doc(), vm_stage(), fuzz_stage()],
    };
    let (summary, totals) = closing_lines(&stages);
    let failures: Vec<String> = stages
        .iter()
        .flat_map(|s| s.failures.iter().map(move |f| format!("{}: {f}", s.label)))
        .collect();
    if !failures.is_empty() {
        eprintln!("\nxtask test: failed:\n  {}", failures.join("\n  "));
    }
    // stdout, after everything else went to stderr: a reader of either sees them last.
    println!("{summary}");
    println!("{totals}");
    if stages.iter().all(|s| s.failed_count() == 0) { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn closing_lines(stages: &[Stage]) -> (String, String) {
    let summary: Vec<String> =
        stages.iter().map(|s| format!("{}: {}", s.label, s.detail)).collect();
    let passed: u64 = stages.iter().map(|s| s.passed).sum();
    let failed: u64 = stages.iter().map(Stage::failed_count).sum();
    (summary.join(" | "), format!("{passed} passed, {failed} failed"))
}

/// The container image the host tests run (tests/tests/container.rs), built from this tree: no
/// test of its own; a failed build is a failure (and those tests fail for want of the image).
fn image_stage() -> Stage {
    match image::build(None) {
        Ok(name) => Stage {
            label: "image",
            detail: format!("built {name}"),
            passed: 0,
            failed: 0,
            failures: Vec::new(),
        },
        Err(e) => Stage::not_run("image", &e),
    }
}

/// Host tests: everything but the `vm_*` binaries, as root on the real kernel.
fn host(args: &[String]) -> Stage {
    let host_only = format!("not binary(/^{}/)", vm::VM_TEST_PREFIX);
    let ran = util::run_tee(
        util::cargo_command()
            .args(["nextest", "run", "--workspace", "--no-fail-fast", "--no-tests=fail"])
            .args(["-E", &host_only])
            .args(args),
    );
    match ran {
        Ok((status, lines)) => host_stage(status, &lines),
        Err(e) => Stage::not_run("host", &e),
    }
}

fn host_stage(status: ExitStatus, lines: &[String]) -> Stage {
    let Some((at, summary)) =
        lines.iter().enumerate().find_map(|(i, l)| Some((i, NextestSummary::parse(l)?)))
    else {
        return Stage {
            label: "host",
            detail: "no result".into(),
            passed: 0,
            failed: 0,
            failures: vec![format!("cargo nextest printed no Summary line ({status})")],
        };
    };
    // After its Summary, nextest lists each test that did not pass (`FAIL [..] binary test`).
    let mut failures: Vec<String> = lines[at + 1..]
        .iter()
        .map(|l| l.trim())
        .filter(|l| is_status_line(l))
        .map(str::to_owned)
        .collect();
    if !status.success() && failures.is_empty() {
        failures.push(format!("cargo nextest: {status}"));
    }
    Stage {
        label: "host",
        detail: format!(
            "{} passed, {} failed, {} skipped",
            summary.passed, summary.failed, summary.skipped
        ),
        passed: summary.passed,
        failed: summary.failed,
        failures,
    }
}

/// `FAIL [   0.139s] (2/4) crate test`, `TIMEOUT [..] ..`: an upper-case word, then a duration.
fn is_status_line(line: &str) -> bool {
    line.split_once(" [")
        .is_some_and(|(word, _)| !word.is_empty() && word.chars().all(|c| c.is_ascii_uppercase()))
}

/// nextest's closing `Summary [  4.014s] 4 tests run: 2 passed, 1 failed, 1 timed out,
/// 1 skipped` (or `3/157 tests run` when cancelled).
#[derive(Debug, PartialEq, Eq)]
struct NextestSummary {
    passed: u64,
    /// Every selected test that did not pass: failed, timed out, or never run.
    failed: u64,
    skipped: u64,
}

impl NextestSummary {
    fn parse(line: &str) -> Option<NextestSummary> {
        let rest = line.trim_start().strip_prefix("Summary [")?;
        let (_, rest) = rest.split_once("] ")?;
        let (run, counts) = rest.split_once(" run: ")?;
        let run = run.strip_suffix(" tests").or_else(|| run.strip_suffix(" test"))?;
        // `3/157`: 157 were selected, the run stopped after 3.
        let selected: u64 = run.rsplit('/').next()?.parse().ok()?;
        let count = |word: &str| -> u64 {
            counts
                .split(", ")
                .find_map(|part| {
                    let (n, what) = part.split_once(' ')?;
                    what.starts_with(word).then(|| n.parse().ok()).flatten()
                })
                .unwrap_or(0)
        };
        let passed = count("passed");
        Some(NextestSummary {
            passed,
            failed: selected.saturating_sub(passed),
            skipped: count("skipped"),
        })
    }
}

/// Doctests (nextest does not run them), counted from libtest's result lines.
fn doc() -> Stage {
    let ran = util::run_tee(util::cargo_command().args(["test", "--doc", "--workspace"]));
    let (status, lines) = match ran {
        Ok(ran) => ran,
        Err(e) => return Stage::not_run("doc", &e),
    };
    let result = TestResult::sum(&lines).unwrap_or_default();
    let mut failures = Vec::new();
    if !status.success() {
        failures.push(format!("cargo test --doc: {status}"));
    }
    Stage {
        label: "doc",
        detail: format!("{} passed, {} failed", result.passed, result.failed),
        passed: result.passed,
        failed: result.failed,
        failures,
    }
}

fn vm_stage() -> Stage {
    let report = vm::run(&vm::Options {
        bench: false,
        short_benches: true,
        timeout: VM_TIMEOUT,
        only: Vec::new(),
        args: Vec::new(),
    });
    match report {
        Ok(report) => Stage {
            label: "vm",
            detail: format!(
                "{} binaries, {} passed, {} failed",
                report.binaries, report.totals.passed, report.failed
            ),
            passed: report.totals.passed,
            failed: report.failed,
            failures: report.failures,
        },
        Err(e) => Stage::not_run("vm", &e),
    }
}

fn fuzz_stage() -> Stage {
    match fuzz::run(FUZZ_SMOKE_SECONDS, &[]) {
        Ok(report) => fuzz_summary(&report),
        Err(e) => Stage::not_run("fuzz", &e),
    }
}

/// Each target counts once in the totals: passed when it ran its time without a failure.
fn fuzz_summary(report: &fuzz::Report) -> Stage {
    let failures = report.failures();
    let crashes = report.crashes();
    let mut detail = format!(
        "{} targets × {} s, {crashes} {}",
        report.targets.len(),
        report.seconds,
        if crashes == 1 { "crash" } else { "crashes" }
    );
    let other = failures.len() - crashes;
    if other > 0 {
        write!(detail, ", {other} failed to run").expect("writing to a String");
    }
    Stage {
        label: "fuzz",
        detail,
        passed: (report.targets.len() - failures.len()) as u64,
        failed: failures.len() as u64,
        failures,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn nextest_summaries() {
        let parse = NextestSummary::parse;
        assert_eq!(
            parse("     Summary [  12.345s] 157 tests run: 157 passed, 14 skipped"),
            Some(NextestSummary { passed: 157, failed: 0, skipped: 14 })
        );
        assert_eq!(
            parse(
                "     Summary [   4.014s] 4 tests run: 2 passed, 1 failed, 1 timed out, 1 skipped"
            ),
            Some(NextestSummary { passed: 2, failed: 2, skipped: 1 })
        );
        assert_eq!(
            parse("Summary [   9.000s] 3 tests run: 3 passed (1 slow)"),
            Some(NextestSummary { passed: 3, failed: 0, skipped: 0 })
        );
        assert_eq!(
            parse("Summary [   1.000s] 1 test run: 1 passed, 0 skipped"),
            Some(NextestSummary { passed: 1, failed: 0, skipped: 0 })
        );
        // Cancelled: the 154 tests that never ran did not pass either.
        assert_eq!(
            parse("Summary [   2.000s] 3/157 tests run: 2 passed, 1 failed, 14 skipped"),
            Some(NextestSummary { passed: 2, failed: 155, skipped: 14 })
        );
        assert_eq!(parse("    Starting 157 tests across 20 binaries"), None);
    }

    #[test]
    fn a_failed_host_run_lists_the_tests_nextest_names_after_its_summary() {
        let output = lines(
            "        PASS [   0.011s] (3/4) nx e\n\
             ────────────\n     Summary [   4.014s] 4 tests run: 2 passed, 1 failed, 1 timed out, 1 skipped\n\
             \x20       FAIL [   0.139s] (2/4) nx b\n     TIMEOUT [   4.005s] (4/4) nx d\n\
             error: test run failed",
        );
        let stage = host_stage(ExitStatus::from_raw(100 << 8), &output);
        assert_eq!(
            stage,
            Stage {
                label: "host",
                detail: "2 passed, 2 failed, 1 skipped".into(),
                passed: 2,
                failed: 2,
                failures: vec![
                    "FAIL [   0.139s] (2/4) nx b".into(),
                    "TIMEOUT [   4.005s] (4/4) nx d".into()
                ],
            }
        );
    }

    #[test]
    fn a_host_run_without_a_summary_fails() {
        let stage = host_stage(ExitStatus::from_raw(101 << 8), &lines("error: could not compile"));
        assert_eq!((stage.passed, stage.failed_count()), (0, 1));
        assert_eq!(stage.failures, ["cargo nextest printed no Summary line (exit status: 101)"]);
    }

    fn stage(label: &'static str, passed: u64, failed: u64, failures: &[&str]) -> Stage {
        Stage {
            label,
            detail: format!("{passed} passed, {failed} failed"),
            passed,
            failed,
            failures: failures.iter().map(|f| (*f).to_owned()).collect(),
        }
    }

    #[test]
    fn totals_add_up_every_stage_and_count_each_failure_without_counts_once() {
        let stages = [
            stage("host", 157, 0, &[]),
            stage("doc", 1, 0, &[]),
            stage("vm", 14, 2, &["vm_a: exit status 101", "vm_b: exit status 101"]),
            Stage::not_run(
                "fuzz",
                &anyhow::anyhow!("exit status: 1").context("building fuzz target bpf_event"),
            ),
        ];
        let (summary, totals) = closing_lines(&stages);
        assert_eq!(
            summary,
            "host: 157 passed, 0 failed | doc: 1 passed, 0 failed | vm: 14 passed, 2 failed | \
             fuzz: not run (building fuzz target bpf_event)"
        );
        assert_eq!(stages[3].failures, ["building fuzz target bpf_event: exit status: 1"]);
        assert_eq!(totals, "172 passed, 3 failed");
    }

    #[test]
    fn a_clean_run_ends_with_zero_failed() {
        let (_, totals) = closing_lines(&[stage("host", 3, 0, &[]), stage("doc", 0, 0, &[])]);
        assert_eq!(totals, "3 passed, 0 failed");
    }

    fn target(name: &str, artifact: Option<&str>, failure: Option<&str>) -> fuzz::TargetRun {
        fuzz::TargetRun {
            name: name.into(),
            runs: Some(10),
            artifact: artifact.map(str::to_owned),
            failure: failure.map(str::to_owned),
        }
    }

    #[test]
    fn a_crash_in_the_last_fuzz_target_fails_the_stage() {
        let report = fuzz::Report {
            seconds: 15,
            targets: vec![
                target("a", None, None),
                target("b", None, Some("libFuzzer did not report finishing")),
                target("c", Some("crash-1"), Some("failing input saved as crash-1")),
            ],
        };
        let stage = fuzz_summary(&report);
        assert_eq!(stage.detail, "3 targets × 15 s, 1 crash, 1 failed to run");
        assert_eq!((stage.passed, stage.failed_count()), (1, 2));
        assert_eq!(
            stage.failures,
            ["b: libFuzzer did not report finishing", "c: failing input saved as crash-1"]
        );
    }
}
