//! `cargo xtask fuzz`: runs every fuzz target (the `[[bin]]`s of fuzz/Cargo.toml, one per decoder
//! of untrusted bytes) with cargo-fuzz on nightly for a fixed time each, starting from the seeds
//! committed in fuzz/corpus/<target>/. Every target runs even when an earlier one fails; a crash
//! leaves its input in fuzz/artifacts/<target>/. libFuzzer's output goes to a log per target, so
//! what stays on screen is one line per target.
use std::fs::File;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util::{self, output, run_cmd};

/// Input size limit, so seeds and mutations stay in the range real inputs have.
const MAX_LEN: usize = 65536;
/// Log lines shown when a target fails (the sanitizer report and the failing input).
const FAILURE_TAIL_LINES: usize = 40;
/// Committed seeds (fuzz/.gitignore); what libFuzzer adds to a corpus is not committed.
#[cfg(test)]
const SEED_EXTENSION: &str = "seed";
/// libFuzzer's words for a saved failing input: `Test unit written to <path>`.
const ARTIFACT_WRITTEN: &str = "Test unit written to ";

/// One target's run.
#[derive(Debug, PartialEq, Eq)]
pub struct TargetRun {
    pub name: String,
    /// From libFuzzer's closing `Done N runs in S second(s)`.
    pub runs: Option<u64>,
    /// The failing input libFuzzer saved (crash, timeout, out-of-memory, leak).
    pub artifact: Option<String>,
    /// Why the run failed; `None` when it passed.
    pub failure: Option<String>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub seconds: u32,
    pub targets: Vec<TargetRun>,
}

impl Report {
    pub fn crashes(&self) -> usize {
        self.targets.iter().filter(|t| t.artifact.is_some()).count()
    }

    pub fn failures(&self) -> Vec<String> {
        self.targets
            .iter()
            .filter_map(|t| Some(format!("{}: {}", t.name, t.failure.as_ref()?)))
            .collect()
    }
}

/// `cargo xtask fuzz`: fails listing every failed target.
pub fn run_checked(seconds: u32, only: &[String]) -> anyhow::Result<()> {
    let failures = run(seconds, only)?.failures();
    if !failures.is_empty() {
        bail!("fuzz targets failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}

/// Builds the targets, then runs each for `seconds`; an error only when nothing could run.
pub fn run(seconds: u32, only: &[String]) -> anyhow::Result<Report> {
    let root = util::workspace_root();
    let fuzz = root.join("fuzz");
    let all = targets(&fuzz)?;
    if let Some(unknown) = only.iter().find(|o| !all.contains(o)) {
        bail!("no fuzz target {unknown} (fuzz/Cargo.toml has {})", all.join(", "));
    }
    let selected: Vec<&String> =
        all.iter().filter(|t| only.is_empty() || only.contains(t)).collect();
    // Built up front, in view: the runs below only log libFuzzer's output. (`cargo fuzz build`
    // takes one target or all.)
    for target in &selected {
        run_cmd(cargo_fuzz(&fuzz).args(["build", target]))
            .with_context(|| format!("building fuzz target {target}"))?;
    }
    let logs = fuzz.join("target/logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let mut report = Report { seconds, targets: Vec::new() };
    for target in selected {
        let run = run_target(&fuzz, &logs, target, seconds)?;
        match &run.failure {
            None => eprintln!(
                "fuzz: {target}: {seconds} s, {} runs, no crash",
                run.runs.map_or("?".into(), |n| n.to_string())
            ),
            Some(why) => eprintln!("fuzz: {target}: FAILED: {why}"),
        }
        report.targets.push(run);
    }
    Ok(report)
}

/// The `[[bin]]` names of fuzz/Cargo.toml, as cargo reads them: the one list of targets.
pub fn targets(fuzz: &Path) -> anyhow::Result<Vec<String>> {
    let metadata = output(util::cargo_command().args([
        "metadata",
        "--no-deps",
        "--format-version=1",
        "--manifest-path",
        &path_arg(&fuzz.join("Cargo.toml"))?,
    ]))?;
    let metadata: serde_json::Value =
        serde_json::from_str(&metadata).context("cargo metadata printed no JSON")?;
    let names = bin_names(&metadata);
    if names.is_empty() {
        bail!("fuzz/Cargo.toml declares no [[bin]] target");
    }
    Ok(names)
}

fn bin_names(metadata: &serde_json::Value) -> Vec<String> {
    let packages = metadata["packages"].as_array().map(Vec::as_slice).unwrap_or_default();
    packages
        .iter()
        .flat_map(|p| p["targets"].as_array().map(Vec::as_slice).unwrap_or_default())
        .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bin")))
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

fn path_arg(path: &Path) -> anyhow::Result<String> {
    path.to_str().map(str::to_owned).with_context(|| format!("{} is not UTF-8", path.display()))
}

fn cargo_fuzz(fuzz: &Path) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(fuzz).args(["+nightly", "fuzz"]).env("CARGO_TARGET_DIR", fuzz.join("target"));
    cmd
}

fn run_target(fuzz: &Path, logs: &Path, target: &str, seconds: u32) -> anyhow::Result<TargetRun> {
    let corpus = fuzz.join("corpus").join(target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("{}", corpus.display()))?;
    let log_path = logs.join(format!("{target}.log"));
    let log = File::create(&log_path).with_context(|| format!("{}", log_path.display()))?;
    eprintln!("fuzz: {target} for {seconds} s (log: {})", log_path.display());
    let status = cargo_fuzz(fuzz)
        .args(["run", target])
        .arg(&corpus)
        .args(["--", &format!("-max_total_time={seconds}"), &format!("-max_len={MAX_LEN}")])
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .with_context(|| format!("running cargo fuzz run {target}"))?;
    let text = std::fs::read_to_string(&log_path)
        .with_context(|| format!("reading {}", log_path.display()))?;
    let mut run = parse_log(target, &text);
    if run.failure.is_none() && !status.success() {
        run.failure = Some(format!("cargo fuzz run: {status}"));
    }
    if run.failure.is_some() {
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(FAILURE_TAIL_LINES)..];
        eprintln!("fuzz: {target}: last lines of {}:\n{}", log_path.display(), tail.join("\n"));
    }
    Ok(run)
}

/// What libFuzzer's log says: the number of runs, and the failing input it saved, if any.
fn parse_log(target: &str, log: &str) -> TargetRun {
    let runs = log.lines().rev().find_map(|line| {
        line.strip_prefix("Done ")?.split_once(" runs in ")?.0.trim().parse().ok()
    });
    let artifact = log.lines().find_map(|line| {
        let at = line.find(ARTIFACT_WRITTEN)?;
        Some(line[at + ARTIFACT_WRITTEN.len()..].trim().to_owned())
    });
    let failure = match (&artifact, runs) {
        (Some(input), _) => Some(format!("failing input saved as {input}")),
        (None, None) => Some("libFuzzer did not report finishing (`Done N runs`)".into()),
        (None, Some(_)) => None,
    };
    TargetRun { name: target.to_owned(), runs, artifact, failure }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_the_bin_targets_cargo_reads() {
        let metadata = serde_json::json!({"packages": [{"targets": [
            {"name": "tracer_fuzz", "kind": ["lib"]},
            {"name": "nettrace", "kind": ["bin"]},
            {"name": "ipc_reply", "kind": ["bin"]},
        ]}]});
        assert_eq!(bin_names(&metadata), ["nettrace", "ipc_reply"]);
    }

    #[test]
    fn every_target_starts_from_committed_seeds() {
        let root = util::workspace_root();
        let targets = targets(&root.join("fuzz")).unwrap();
        assert!(targets.len() > 1, "{targets:?}");
        for target in &targets {
            let dir = root.join("fuzz/corpus").join(target);
            let seeds = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .filter(|e| {
                    e.as_ref().unwrap().path().extension().is_some_and(|x| x == SEED_EXTENSION)
                })
                .count();
            assert!(seeds > 0, "{} has no *.{SEED_EXTENSION}", dir.display());
        }
    }

    #[test]
    fn a_clean_run_reports_its_runs() {
        let log = "INFO: Seed: 1\n#2\tINITED cov: 10\nDone 123456 runs in 15 second(s)\n";
        assert_eq!(
            parse_log("nettrace", log),
            TargetRun {
                name: "nettrace".into(),
                runs: Some(123_456),
                artifact: None,
                failure: None
            }
        );
    }

    #[test]
    fn a_crash_names_its_saved_input() {
        let log = "==42== ERROR: libFuzzer: deadly signal\nMS: 1 ChangeBit-;\n\
                   artifact_prefix='/w/fuzz/artifacts/nettrace/'; Test unit written to \
                   /w/fuzz/artifacts/nettrace/crash-da39a3ee\n";
        let run = parse_log("nettrace", log);
        assert_eq!(run.artifact.as_deref(), Some("/w/fuzz/artifacts/nettrace/crash-da39a3ee"));
        assert_eq!(
            run.failure.as_deref(),
            Some("failing input saved as /w/fuzz/artifacts/nettrace/crash-da39a3ee")
        );
        let report = Report { seconds: 15, targets: vec![run] };
        assert_eq!(report.crashes(), 1);
        assert_eq!(
            report.failures(),
            ["nettrace: failing input saved as /w/fuzz/artifacts/nettrace/crash-da39a3ee"]
        );
    }

    #[test]
    fn a_run_that_never_finished_fails() {
        let run = parse_log("ipc_reply", "error: could not compile `tracer`\n");
        assert_eq!((run.runs, run.artifact), (None, None));
        assert!(run.failure.unwrap().contains("did not report finishing"));
    }
}
