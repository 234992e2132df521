//! `tracer profile` of a C helper with known symbols (`tests/native/busy_helper.c`) on this
//! host's kernel: native frames named from the binary's ELF symbols with their split and caller,
//! kernel frames from kallsyms, and off-CPU stretches weighted by how long a thread slept.
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tests::native::NativeHelper;
use tests::pipeline::Running;
use tests::process::LineProcess;
use tests::scratch::ScratchDir;
use tracer::kernel::sampler::SampleMode;
use tracer::pipeline::profile::{self, ProfileConfig, ProfileSummary};
use tracer::profile::format::Format;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Profiles `helper <args>` from the moment it is told to go until it prints `DONE`; returns
/// the summary and the folded stacks (frames root first, weight).
fn profile(mode: SampleMode, args: &[&str]) -> (ProfileSummary, Vec<(Vec<String>, u64)>) {
    let helper = NativeHelper::compile("busy_helper");
    let tmp = ScratchDir::new("profile-native");
    let mut command = Command::new(helper.path());
    command.args(args);
    let mut process = LineProcess::spawn("busy_helper", command).expect("busy_helper");
    let pid = process.wait_line("READY", TIMEOUT).unwrap().parse().unwrap();
    let file = tmp.path().join("p.folded");
    let config = ProfileConfig {
        mode,
        target_pids: vec![pid],
        filter: Default::default(),
        hooks: Default::default(),
        outputs: vec![(Format::Folded, file.clone())],
        timeouts: Default::default(),
        locate_for: Duration::from_millis(100),
        drain_timeout: Duration::from_secs(1),
    };
    let tracer =
        Running::start(TIMEOUT, move |_sink, stop, ready| profile::run(config, stop, Some(ready)));
    process.send_line("go").unwrap();
    process.wait_line("DONE", TIMEOUT).unwrap();
    let (_, summary) = tracer.stop();
    (summary, folded(&file))
}

fn folded(file: &Path) -> Vec<(Vec<String>, u64)> {
    std::fs::read_to_string(file)
        .expect("the folded file")
        .lines()
        .map(|line| {
            let (stack, n) = line.rsplit_once(' ').expect("<stack> <weight>");
            (stack.split(';').map(str::to_owned).collect(), n.parse().expect("a weight"))
        })
        .collect()
}

fn weight(stacks: &[(Vec<String>, u64)], keep: impl Fn(&[String]) -> bool) -> u64 {
    stacks.iter().filter(|(frames, _)| keep(frames)).map(|(_, w)| w).sum()
}

/// The helper's `outer` and `inner` (its symbols) split the CPU 1:3, and `inner`'s samples
/// carry `outer` as their caller; it is not a .NET process, so its method session fails and
/// says why.
#[test]
fn native_frames_are_named_from_the_binarys_symbols() {
    let (summary, stacks) = profile(SampleMode::Cpu { frequency_hz: 999 }, &["spin", "2000"]);
    let inner = weight(&stacks, |f| f.last().is_some_and(|l| l == "inner"));
    let outer = weight(&stacks, |f| f.last().is_some_and(|l| l == "outer"));
    let inner_under_outer =
        weight(&stacks, |f| f.len() >= 2 && f[f.len() - 1] == "inner" && f[f.len() - 2] == "outer");
    let report = format!("{summary}\n{stacks:?}");
    assert!(inner + outer > 1000, "{report}");
    let ratio = inner as f64 / outer as f64;
    assert!((ratio - 3.0).abs() <= 0.45, "inner : outer 3:1, {ratio}: {report}");
    assert!(inner_under_outer as f64 >= 0.85 * inner as f64, "{report}");
    assert_eq!(summary.processes.len(), 1);
    let process = &summary.processes[0];
    let why = process.method_error.as_deref().unwrap_or_default();
    assert!(!why.is_empty() && process.method_events == 0, "no runtime: {report}");
}

/// Time in `read()` of /dev/zero is in the kernel: its frames are named from kallsyms.
#[test]
fn kernel_frames_are_named_from_kallsyms() {
    let (summary, stacks) = profile(SampleMode::Cpu { frequency_hz: 999 }, &["syscalls", "1500"]);
    let total = weight(&stacks, |_| true);
    let in_kernel = weight(&stacks, |f| f.last().is_some_and(|l| l.ends_with("_[k]")));
    let through_read = weight(&stacks, |f| f.iter().any(|l| l == "vfs_read_[k]"));
    let report = format!("{summary}\n{stacks:?}");
    assert!(in_kernel as f64 >= 0.5 * total as f64, "{report}");
    assert!(through_read as f64 >= 0.5 * total as f64, "{report}");
}

/// Off-CPU: a thread that sleeps 20 × 50 ms is weighted 1 s (±15 %) at its sleeping stacks,
/// which go through the kernel's nanosleep. Weighed under `sleeper`, which every one of them
/// shows: a nap that calls glibc's `nanosleep` itself (one in eight) shows its caller but not
/// its own frame, since glibc's function keeps no frame pointer and the walk goes from its
/// caller's frame; that stretch is the thread's sleep all the same.
#[test]
fn off_cpu_stretches_weigh_what_a_thread_slept() {
    let (summary, stacks) = profile(SampleMode::OffCpu, &["sleep", "20", "50"]);
    let sleeping = weight(&stacks, |f| f.iter().any(|l| l == "sleeper"));
    let report = format!("{summary}\n{stacks:?}");
    assert!((sleeping as f64 - 1e9).abs() <= 0.15e9, "slept 1 s, weighed {sleeping} ns: {report}");
    let in_nanosleep = weight(&stacks, |f| {
        f.iter().any(|l| l == "sleeper") && f.iter().any(|l| l == "do_nanosleep_[k]")
    });
    assert_eq!(in_nanosleep, sleeping, "{report}");
    // The naps below the first keep their frames: 17 of the 20.
    let napping = weight(&stacks, |f| f.iter().any(|l| l == "nap"));
    assert!(
        napping as f64 >= 0.7 * sleeping as f64,
        "{napping} of {sleeping} ns in naps: {report}"
    );
}
