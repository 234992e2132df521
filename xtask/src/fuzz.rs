//! `cargo xtask fuzz`: runs every fuzz target (one per decoder of untrusted bytes, see
//! fuzz/Cargo.toml) with cargo-fuzz on nightly for a fixed time each, starting from the seeds in
//! fuzz/corpus and the real captures in tests/fixtures. A crash fails the run and leaves its
//! input in fuzz/artifacts/<target>/.
use std::path::Path;
use std::process::Command;

use anyhow::Context as _;

use crate::util;

pub const TARGETS: &[&str] = &[
    "bpf_event",
    "ipc_reply",
    "nettrace",
    "user_events_record",
    "ftrace_page",
    "proc_and_tracefs_text",
    "cgroup_identity",
];

pub fn run(seconds: u32, only: &[String]) -> anyhow::Result<()> {
    let root = util::workspace_root();
    let fuzz = root.join("fuzz");
    for target in TARGETS.iter().filter(|t| only.is_empty() || only.iter().any(|o| o == *t)) {
        let corpus = fuzz.join("corpus").join(target);
        std::fs::create_dir_all(&corpus).with_context(|| format!("{}", corpus.display()))?;
        eprintln!("fuzz: {target} for {seconds} s");
        util::run_cmd(
            Command::new("cargo")
                .current_dir(&fuzz)
                .args(["+nightly", "fuzz", "run", target])
                .arg(&corpus)
                .args(seed_dirs(&root, target))
                .args(["--", &format!("-max_total_time={seconds}"), "-max_len=65536"])
                .env("CARGO_TARGET_DIR", fuzz.join("target")),
        )
        .with_context(|| format!("fuzz target {target} failed (see fuzz/artifacts/{target}/)"))?;
    }
    Ok(())
}

/// Real captures that make good starting inputs for a target (read-only seed directories).
fn seed_dirs(root: &Path, target: &str) -> Vec<std::path::PathBuf> {
    let dir = match target {
        "nettrace" => "tests/fixtures/nettrace",
        "ftrace_page" | "proc_and_tracefs_text" => "tests/fixtures/ftrace",
        _ => return Vec::new(),
    };
    vec![root.join(dir)]
}
