//! `tracer profile` end to end on this host's kernel, against real CoreCLR runtimes running a
//! workload with known hot methods (`tests/dotnet/coreclr_host.py` `burn`: `Inner` under
//! `CallerA` and `CallerB` at 3:1, `Inner` : `Other` at 2:1, every method JIT-compiled from a
//! dynamic assembly): the split, the callers, the share of named frames, with W^X on (the
//! default: JIT code runs from a `memfd:doublemapper` mapping) and off, for a runtime that was
//! running before tracer started and one in pid and mount namespaces, with no environment
//! variable and nothing written into the target.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tests::coreclr::CoreclrHost;
use tests::pipeline::Running;
use tests::scratch::ScratchDir;
use tracer::kernel::sampler::SampleMode;
use tracer::pipeline::profile::{self, ProfileConfig, ProfileSummary};
use tracer::profile::format::Format;

/// Starting profiling (BPF loads) and CoreCLR on a loaded 2-core machine take a while.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Seconds of workload each test profiles.
const BURN_SECONDS: u32 = 4;
/// Seconds the workload runs before profiling, to reach its steady state (tier 1 code).
const WARM_UP_SECONDS: u32 = 3;

const INNER: &str = "TracerWorkload.Hot.Inner_[j]";
const OTHER: &str = "TracerWorkload.Hot.Other_[j]";
const CALLER_A: &str = "TracerWorkload.Hot.CallerA_[j]";
const CALLER_B: &str = "TracerWorkload.Hot.CallerB_[j]";
const BURN: &str = "TracerWorkload.Hot.Burn_[j]";

fn config(pids: Vec<u32>, dir: &Path, frequency_hz: u64) -> ProfileConfig {
    ProfileConfig {
        mode: SampleMode::Cpu { frequency_hz },
        target_pids: pids,
        filter: Default::default(),
        hooks: Default::default(),
        outputs: vec![(Format::Folded, dir.join("p.folded")), (Format::Pprof, dir.join("p.pb.gz"))],
        timeouts: Default::default(),
        locate_for: Duration::from_secs(30),
        drain_timeout: Duration::from_secs(30),
    }
}

fn start(config: ProfileConfig) -> Running<ProfileSummary> {
    Running::start(TIMEOUT, move |_sink, stop, ready| profile::run(config, stop, Some(ready)))
}

/// The folded stacks of `file`: (frames root first, weight).
fn folded(file: &Path) -> Vec<(Vec<String>, u64)> {
    let text = std::fs::read_to_string(file).expect("the folded file");
    text.lines()
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').expect("<stack> <count>");
            (stack.split(';').map(str::to_owned).collect(), count.parse().expect("a count"))
        })
        .collect()
}

/// What the workload's samples show: weights by leaf, and of `Inner`'s by the frame above it.
struct Split {
    total: u64,
    by_leaf: BTreeMap<String, u64>,
    inner_by_caller: BTreeMap<String, u64>,
}

/// The weight of the stacks `keep` selects.
fn weight(stacks: &[(Vec<String>, u64)], keep: impl Fn(&[String]) -> bool) -> u64 {
    stacks.iter().filter(|(frames, _)| keep(frames)).map(|(_, w)| w).sum()
}

fn split(stacks: &[(Vec<String>, u64)]) -> Split {
    let mut s = Split { total: 0, by_leaf: BTreeMap::new(), inner_by_caller: BTreeMap::new() };
    for (frames, weight) in stacks {
        s.total += weight;
        let leaf = frames.last().expect("a frame").clone();
        if leaf == INNER && frames.len() >= 2 {
            *s.inner_by_caller.entry(frames[frames.len() - 2].clone()).or_default() += weight;
        }
        *s.by_leaf.entry(leaf).or_default() += weight;
    }
    s
}

/// `actual` is `expected` within ±15 %.
fn within_15_percent(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() <= 0.15 * expected
}

/// Profiles `runtime` burning CPU; checks that the hot methods are named with their split.
/// `warmed_up`: the workload's methods are compiled fully optimized and ran before tracer
/// started, so only the rundown names them, and it runs in its steady state (tiered code would
/// move from tier 0 through on-stack replacement to tier 1 whenever the machine's load lets the
/// runtime's background compiler get to it): then every sample of `Inner` also carries its
/// caller, split 3:1, and nearly every sample has a named leaf.
/// (While a loop's first, tier-0 call runs on-stack-replacement code, the frame-pointer walk
/// skips that call's caller: see docs/protocol/profiling.md, "What frame pointers show".)
fn profile_the_workload(
    runtime: &mut CoreclrHost,
    dir: &Path,
    warmed_up: bool,
) -> (ProfileSummary, Split) {
    let pid = runtime.host_pid;
    if warmed_up {
        runtime.optimize_workload().expect("an optimized workload");
        runtime.burn(WARM_UP_SECONDS).expect("burn before profiling");
    }
    let tracer = start(config(vec![pid], dir, 999));
    runtime.burn(BURN_SECONDS).expect("burn");
    let (_, summary) = tracer.stop();
    let stacks = folded(&dir.join("p.folded"));
    let split = split(&stacks);
    let inner = split.by_leaf.get(INNER).copied().unwrap_or(0);
    let other = split.by_leaf.get(OTHER).copied().unwrap_or(0);
    let (a, b) = (
        split.inner_by_caller.get(CALLER_A).copied().unwrap_or(0),
        split.inner_by_caller.get(CALLER_B).copied().unwrap_or(0),
    );
    let report = format!(
        "{summary}\nleaves: {:?}\ninner by caller: {:?}",
        split.by_leaf, split.inner_by_caller
    );
    eprintln!("{report}");
    // Samples carry their frames: none is lost, however distinct the JIT'd stacks.
    assert_eq!(summary.losses.total(), 0, "nothing lost: {report}");
    assert!(inner > 500 && other > 250, "Inner and Other sampled and named: {report}");
    assert_eq!(summary.processes.len(), 1, "{report}");
    let process = &summary.processes[0];
    assert_eq!(process.pid, pid);
    assert!(process.rundown_complete, "{report}");
    if warmed_up {
        // Tier-0 and OSR code run at speeds of their own: the split holds for optimized code.
        assert!(within_15_percent(inner as f64 / other as f64, 2.0), "Inner : Other 2:1: {report}");
        assert!(within_15_percent(a as f64 / b as f64, 3.0), "CallerA : CallerB 3:1: {report}");
        assert!((a + b) as f64 >= 0.85 * inner as f64, "Inner's samples carry a caller: {report}");
        // The workload thread's samples: the runtime's own threads (the JIT compiling in the
        // background, in stripped libclrjit.so) take a share that grows with the machine's
        // load; `cargo xtask bench profile` reports the whole process's share on a quiet one.
        let workload = |f: &[String]| f.iter().any(|n| n == BURN);
        let named_leaf = |f: &[String]| f.last().is_some_and(|l| !l.contains("+0x"));
        let on_workload = weight(&stacks, workload);
        let named = weight(&stacks, |f| workload(f) && named_leaf(f));
        assert!(named as f64 >= 0.95 * on_workload as f64, "named leaves: {report}");
    }
    (summary, split)
}

#[test]
fn a_coreclr8_workload_with_w_x_on_is_named_with_its_split_and_callers() {
    let tmp = ScratchDir::new("profile-wx-on");
    let mut runtime = CoreclrHost::spawn(tmp.path()).expect("CoreCLR");
    profile_the_workload(&mut runtime, tmp.path(), true);
    runtime.exit().expect("exit");
}

#[test]
fn a_coreclr8_workload_with_w_x_off_is_named_alike() {
    let tmp = ScratchDir::new("profile-wx-off");
    let mut runtime = CoreclrHost::spawn_with(tmp.path(), &[("DOTNET_EnableWriteXorExecute", "0")])
        .expect("CoreCLR");
    profile_the_workload(&mut runtime, tmp.path(), true);
    runtime.exit().expect("exit");
}

/// CoreCLR 3.1 (PyPI dotnetcore2): the same names from its events and rundown.
#[test]
fn a_coreclr31_workload_is_named_alike() {
    let tmp = ScratchDir::new("profile-31");
    let mut runtime =
        CoreclrHost::spawn_with(tmp.path(), &[("CORECLR_HOST_RUNTIME", "3.1")]).expect("CoreCLR");
    assert!(runtime.version.starts_with("3.1."), "{}", runtime.version);
    profile_the_workload(&mut runtime, tmp.path(), true);
    runtime.exit().expect("exit");
}

/// Methods compiled while tracer profiles are named from the runtime's live JIT events.
#[test]
fn methods_compiled_while_profiling_are_named() {
    let tmp = ScratchDir::new("profile-live-jit");
    let mut runtime = CoreclrHost::spawn(tmp.path()).expect("CoreCLR");
    profile_the_workload(&mut runtime, tmp.path(), false);
    runtime.exit().expect("exit");
}

#[test]
fn a_runtime_in_pid_and_mount_namespaces_is_named_alike() {
    let tmp = ScratchDir::new("profile-ns");
    let mut runtime = CoreclrHost::spawn_in_namespaces("/tmp/profile-ns", true).expect("CoreCLR");
    assert_ne!(runtime.host_pid, runtime.ns_pid, "in its own pid namespace");
    profile_the_workload(&mut runtime, tmp.path(), true);
    runtime.exit().expect("exit");
}

/// `go tool pprof` reads the pprof file and names the hot method at the top.
#[test]
fn go_tool_pprof_reads_the_profile_and_names_the_hot_method() {
    let tmp = ScratchDir::new("profile-pprof");
    let mut runtime = CoreclrHost::spawn(tmp.path()).expect("CoreCLR");
    let (summary, split) = profile_the_workload(&mut runtime, tmp.path(), true);
    runtime.exit().expect("exit");
    let file: PathBuf = tmp.path().join("p.pb.gz");
    assert!(summary.files.contains(&file), "{summary}");
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=3"])
        .arg(&file)
        .output()
        .expect("go tool pprof (run `cargo xtask setup`: it installs golang-go)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let top = text
        .lines()
        .find(|l| l.contains("TracerWorkload.Hot."))
        .unwrap_or_else(|| panic!("no workload method in:\n{text}"));
    assert!(top.ends_with("TracerWorkload.Hot.Inner"), "Inner is the hottest: {top}\n{text}");
    assert!(split.total > 0);
}
