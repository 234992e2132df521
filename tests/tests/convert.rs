//! `tracer convert`: a saved `.nettrace` as profile files, its samples named from the file's own
//! method events — a committed capture of CoreCLR 8.0.4, and a fresh one `tracer run
//! --nettrace-dir` records from a real runtime running the test workload
//! (`tests/dotnet/coreclr_host.py` `burn`: `Inner` under `CallerA` and `CallerB` at 3:1, `Inner`
//! : `Other` at 2:1), whose `dotnet_event` ThreadSample lines name their stacks too.
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tests::coreclr::CoreclrHost;
use tests::pipeline::{is, is_event, run_config, start_run};
use tests::scratch::ScratchDir;
use tracer::pipeline::convert::{self, ConvertConfig, ConvertSummary};
use tracer::profile::format::Format;
use tracer::session::SessionMode;
use tracer_decode::diagnostic_ipc::DEFAULT_RUNDOWN_KEYWORD;

const FIXTURE: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/nettrace/coreclr8_thread_samples.nettrace");
const INNER: &str = "TracerWorkload.Hot.Inner_[j]";
const OTHER: &str = "TracerWorkload.Hot.Other_[j]";
const CALLER_A: &str = "TracerWorkload.Hot.CallerA_[j]";
const CALLER_B: &str = "TracerWorkload.Hot.CallerB_[j]";

fn convert_to(input: &Path, outputs: Vec<(Format, PathBuf)>) -> ConvertSummary {
    convert::run(&ConvertConfig { input: input.to_owned(), outputs }).expect("converted")
}

/// Weights of a folded file by leaf, and of `Inner`'s samples by the frame above it.
fn split(folded: &Path) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let (mut by_leaf, mut inner_by_caller) = (BTreeMap::new(), BTreeMap::new());
    for line in std::fs::read_to_string(folded).expect("the folded file").lines() {
        let (stack, weight) = line.rsplit_once(' ').expect("<stack> <weight>");
        let weight: u64 = weight.parse().expect("a weight");
        let frames: Vec<&str> = stack.split(';').collect();
        let leaf = frames[frames.len() - 1];
        if leaf == INNER {
            *inner_by_caller.entry(frames[frames.len() - 2].to_owned()).or_default() += weight;
        }
        *by_leaf.entry(leaf.to_owned()).or_default() += weight;
    }
    (by_leaf, inner_by_caller)
}

#[test]
fn a_captured_nettrace_converts_to_every_format_with_its_methods_named() {
    let dir = ScratchDir::new("convert-fixture");
    let outputs: Vec<(Format, PathBuf)> =
        [Format::Folded, Format::Pprof, Format::Speedscope, Format::Svg]
            .map(|f| (f, dir.path().join(format!("p{}", f.file_suffix()))))
            .into();
    let summary = convert_to(Path::new(FIXTURE), outputs.clone());
    assert_eq!(
        (summary.pid, summary.process_name.as_str()),
        (21_543, "/root/.pyenv/versions/3.11.7/bin/python3.11")
    );
    assert_eq!((summary.samples, summary.samples_refused), (469, 0));
    assert_eq!((summary.method_events, summary.undecodable), (238, 0));
    assert_eq!(summary.stream_error, None);
    assert_eq!(summary.summary.samples, 469);
    for (_, path) in &outputs {
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", path.display());
    }
    // Named once the whole file is read: the workload's frames all are.
    let (by_leaf, inner_by_caller) = split(&dir.path().join("p.folded"));
    assert_eq!((by_leaf[INNER], by_leaf[OTHER]), (267, 129));
    assert_eq!((inner_by_caller[CALLER_A], inner_by_caller[CALLER_B]), (197, 70));
    assert_eq!(summary.summary.leaf_named_samples, 406);
}

#[test]
fn a_symlink_is_not_written_through() {
    let dir = ScratchDir::new("convert-symlink");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    let link = dir.path().join("p.folded");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let config = ConvertConfig { input: FIXTURE.into(), outputs: vec![(Format::Folded, link)] };
    let error = convert::run(&config).unwrap_err();
    assert!(format!("{error:#}").contains("a symlink is refused"), "{error:#}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
}

#[test]
fn a_cut_file_converts_up_to_where_it_ends() {
    let dir = ScratchDir::new("convert-cut");
    let bytes = std::fs::read(FIXTURE).unwrap();
    let cut = dir.path().join("cut.nettrace");
    // Into its ninth block (a StackBlock at 84 334): the samples of the blocks before it are
    // converted.
    std::fs::write(&cut, &bytes[..84_400]).unwrap();
    let summary = convert_to(&cut, vec![(Format::Folded, dir.path().join("p.folded"))]);
    let error = summary.stream_error.expect("the file ends early");
    assert!(error.contains("stream ended without the end-of-stream tag"), "{error}");
    assert_eq!((summary.pid, summary.samples, summary.summary.samples), (21_543, 165, 165));
}

/// Seconds of workload traced.
const BURN_SECONDS: u32 = 4;
/// Fewest workload samples the shares are judged on.
const MIN_SAMPLES: u64 = 300;
const READY: Duration = Duration::from_secs(60);
const SESSION: Duration = Duration::from_secs(120);

/// `actual` is `expected` within ±25 %: EventPipe's sampler suspends every managed thread for
/// each sample and takes it where the thread stopped, at a safe point — its samples are not at
/// the random instants a timer interrupt would take them, and they include the first seconds of
/// the workload (tier-0 and on-stack-replacement code, as it is compiled).
fn within_25_percent(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() <= 0.25 * expected
}

/// `tracer run --nettrace-dir` with the sample profiler and the JIT and loader events of a real
/// CoreCLR 8 (and the rundown); its file converts to a profile with the workload's split, and
/// its ThreadSample lines name their stacks as they are written.
#[test]
fn a_recorded_coreclr8_workload_converts_with_its_split_and_its_lines_name_their_stacks() {
    let files = ScratchDir::new("convert-run-files");
    let tmp = ScratchDir::new("convert-run-host");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR host");
    let pid = host.host_pid;
    let providers = "Microsoft-DotNETCore-SampleProfiler,Microsoft-Windows-DotNETRuntime:0x18:5";
    let mut config = run_config(providers, SessionMode::Streaming, Duration::from_secs(10), 1024);
    config.session.request.rundown_keyword = DEFAULT_RUNDOWN_KEYWORD;
    config.session.nettrace_dir = Some(files.path().to_owned());
    config.target_pids = vec![pid];
    let mut tracer = start_run(READY, config);
    tracer.wait_for("session_started", SESSION, |l| is(l, "session_started", pid));
    host.burn(BURN_SECONDS).expect("burn");
    let (lines, _) = tracer.stop();
    let ended = lines.iter().find(|l| is(l, "session_ended", pid)).expect("session_ended");
    assert_eq!(
        (&ended["reason"], &ended["nettrace_file_complete"]),
        (&"stopped".into(), &true.into())
    );

    // The lines: every ThreadSample names its stack, leaf first; the workload's are named.
    let samples: Vec<&Value> = lines.iter().filter(|l| is_event(l, pid, "ThreadSample")).collect();
    let with_stack = samples.iter().filter(|l| l["stack"].is_array()).count();
    assert_eq!(with_stack, samples.len(), "every sample's stack is named");
    let frame = |l: &Value, i: usize| l["stack"][i].as_str().unwrap_or_default().to_owned();
    let workload: Vec<&&Value> =
        samples.iter().filter(|l| frame(l, 1).starts_with("TracerWorkload.Hot.")).collect();
    let inner_in_a = workload
        .iter()
        .filter(|l| {
            frame(l, 0) == "TracerWorkload.Hot.Inner" && frame(l, 1) == "TracerWorkload.Hot.CallerA"
        })
        .count();
    let named_leaf = samples.iter().filter(|l| !frame(l, 0).starts_with("0x")).count();
    let report = format!(
        "{} samples, {named_leaf} with a named leaf, {} in the workload, {inner_in_a} Inner in \
         CallerA",
        samples.len(),
        workload.len()
    );
    // Enough samples for the shares below; how many come depends on the machine's load.
    assert!(workload.len() >= MIN_SAMPLES as usize, "{report}");
    // Inner under CallerA is half the workload's samples (95 % of the samples have a named leaf
    // in a run on the development host: the leaf of a sample taken in code compiled moments
    // before, whose method event comes later in the stream, is still an address).
    assert!(named_leaf * 10 >= samples.len() * 8, "{report}");
    assert!(inner_in_a * 3 >= workload.len(), "{report}");

    // The file: the workload's split and callers.
    let file = PathBuf::from(ended["nettrace_file"].as_str().unwrap());
    let out = files.path().join("p.folded");
    let summary = convert_to(&file, vec![(Format::Folded, out.clone())]);
    assert_eq!(
        (summary.pid, summary.samples_refused, summary.stream_error.as_deref()),
        (pid, 0, None)
    );
    let (by_leaf, inner_by_caller) = split(&out);
    let (inner, other) = (by_leaf[INNER], by_leaf[OTHER]);
    let (a, b) = (inner_by_caller[CALLER_A], inner_by_caller[CALLER_B]);
    let report = format!("{summary}leaves: {by_leaf:?}\ninner by caller: {inner_by_caller:?}");
    assert!(inner + other >= MIN_SAMPLES, "{report}");
    assert!(within_25_percent(inner as f64 / other as f64, 2.0), "Inner : Other 2:1: {report}");
    assert!(within_25_percent(a as f64 / b as f64, 3.0), "CallerA : CallerB 3:1: {report}");
    assert_eq!(a + b, inner, "every Inner sample has its caller: {report}");
    host.ping().expect("runtime healthy");
}
