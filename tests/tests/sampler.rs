//! The sampling programs for `tracer profile` (`tracer::kernel::sampler`,
//! docs/protocol/profiling.md "Sampling in the kernel") on this host's real kernel, with a C
//! helper whose machine code the tests know (tests/native/busy_helper.c): CPU samples land in
//! the helper's functions in the share of the work each does, with their callers, and only for
//! the processes chosen; kernel stacks are kernel text; a sleeping thread's off-CPU stretches
//! add up to its sleep, in the kernel's sleep path, with either `sched_switch` mechanism; CPU
//! samples carry their frames and lose nothing; off-CPU stack ids stay readable while the
//! programs move between the two stack maps.
use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use tests::native::NativeHelper;
use tests::process::LineProcess;
use tracer::kernel::detect::{HookChoice, LifecycleMechanism};
use tracer::kernel::sampler::{
    RawSample, Sampler, SamplerLosses, SamplerOptions, StackError, Targets,
};
use tracer_common::sampling::{SampleKind, SampleLoss};

const TIMEOUT: Duration = Duration::from_secs(60);
/// CPU time each spinning helper uses.
const SPIN_CPU_MS: u64 = 2000;
const FREQUENCY_HZ: u64 = 999;
/// Naps of the sleeping helper: 20 × 50 ms, one second.
const NAPS: u64 = 20;
const NAP_MS: u64 = 50;
/// The ±15 % the measured shares and sums may differ from what the helper does.
const TOLERANCE: f64 = 0.15;

/// `busy_helper <args>`, started and waiting for its go line; returns it, its pid and the
/// addresses of the functions it printed.
fn start(helper: &NativeHelper, args: &[&str]) -> (LineProcess, u32, HashMap<String, u64>) {
    let mut command = Command::new(helper.path());
    command.args(args);
    let mut process = LineProcess::spawn(&format!("busy_helper {}", args.join(" ")), command)
        .expect("busy_helper");
    let mut functions = HashMap::new();
    loop {
        let line = process.next_line(TIMEOUT).unwrap();
        if let Some(pid) = line.strip_prefix("READY ") {
            let pid: u32 = pid.parse().unwrap();
            assert_eq!(pid, process.pid());
            return (process, pid, functions);
        }
        let (name, address) = line
            .strip_prefix("FUNCTION ")
            .and_then(|f| f.split_once(' '))
            .unwrap_or_else(|| panic!("unexpected line {line:?}"));
        let address = u64::from_str_radix(address.trim_start_matches("0x"), 16).unwrap();
        functions.insert(name.to_owned(), address);
    }
}

/// Reads samples until `process` prints `DONE`; then closes its stdin, which ends it, and reads
/// what is left: every sample taken before it exited, every stretch its threads spent blocked
/// (a thread wakes to exit), so the loss counters cover exactly the samples returned.
async fn sample_until_done(sampler: &mut Sampler, process: &mut LineProcess) -> Vec<RawSample> {
    let deadline = Instant::now() + TIMEOUT;
    let mut samples = Vec::new();
    loop {
        sampler.read(&mut samples).await.expect("reading the sample ring");
        if let Some(line) = process.try_next_line().unwrap() {
            assert_eq!(line, "DONE");
            break;
        }
        assert!(Instant::now() < deadline, "the helper did not finish within {TIMEOUT:?}");
    }
    process.close_stdin();
    process.wait_exit(TIMEOUT).unwrap();
    sampler.drain(&mut samples);
    samples
}

/// A half-open address range.
#[derive(Clone, Copy, Debug)]
struct Range(u64, u64);

impl Range {
    fn contains(&self, address: u64) -> bool {
        (self.0..self.1).contains(&address)
    }
}

/// The executable mappings of `pid` whose file name ends with one of `files`.
fn text_of(pid: u32, files: &[&str]) -> Vec<Range> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let ranges: Vec<Range> = maps
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (range, perms, path) = (fields[0], fields[1], *fields.get(5)?);
            if !perms.contains('x') || !files.iter().any(|f| path.ends_with(f)) {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            Some(Range(u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?))
        })
        .collect();
    assert_eq!(ranges.len(), files.len(), "one executable mapping of each of {files:?}: {maps}");
    ranges
}

/// The range of function `name` in the helper running at `address` (its size from `nm`).
fn function_range(helper: &NativeHelper, name: &str, address: u64) -> Range {
    Range(address, address + helper.function_size(name))
}

/// Kernel text symbols from `/proc/kallsyms` (as root, with their addresses).
struct Kallsyms {
    /// (address, name) of every text symbol, by address.
    text: Vec<(u64, String)>,
}

impl Kallsyms {
    fn read() -> Kallsyms {
        let all = std::fs::read_to_string("/proc/kallsyms").expect("/proc/kallsyms");
        let mut text: Vec<(u64, String)> = all
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let address = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?;
                let name = fields.next()?;
                matches!(kind, "t" | "T").then(|| (address, name.to_owned()))
            })
            .collect();
        text.sort();
        assert!(
            text.iter().any(|(address, _)| *address != 0),
            "/proc/kallsyms shows no addresses: run the tests as root (kernel.kptr_restrict)"
        );
        Kallsyms { text }
    }

    fn address(&self, name: &str) -> u64 {
        self.text
            .iter()
            .find(|(_, n)| n == name)
            .unwrap_or_else(|| panic!("/proc/kallsyms has no text symbol {name}"))
            .0
    }

    /// `_stext` to `_etext`: the kernel's own text.
    fn kernel_text(&self) -> Range {
        Range(self.address("_stext"), self.address("_etext"))
    }

    /// From `name` to the next symbol above it.
    fn function(&self, name: &str) -> Range {
        let start = self.address(name);
        let end = self.text.iter().map(|(a, _)| *a).find(|a| *a > start).unwrap();
        Range(start, end)
    }
}

/// CPU samples carry their frames: none is lost, and every one has each stack it should.
fn assert_nothing_lost(sampler: &Sampler, samples: &[RawSample]) {
    assert_eq!(sampler.losses().unwrap(), SamplerLosses::default());
    for s in samples {
        assert_eq!((s.user_stack_error, s.kernel_stack_error), (None, None), "{s:?}");
    }
}

/// Off CPU: checks that every stack the stack map had no room for — its hash bucket held
/// another stack, which no map size rules out: a few in a thousand distinct stacks — is counted
/// once, on the stretch that lacks it, and that nothing was lost in user space. Returns the
/// programs' other loss counts, by reason (summed over CPUs).
fn other_off_cpu_losses(sampler: &Sampler, samples: &[RawSample]) -> HashMap<SampleLoss, u64> {
    let losses = sampler.losses().unwrap();
    assert_eq!((losses.corrupt_records, losses.unresolved_stacks), (0, 0), "{losses:?}");
    let mut counted = HashMap::new();
    for loss in &losses.kernel {
        assert_eq!(loss.kind, SampleKind::OffCpu, "{losses:?}");
        *counted.entry(loss.reason).or_insert(0u64) += loss.count;
    }
    let collided = |error: fn(&RawSample) -> Option<StackError>| {
        samples.iter().filter(|s| error(s) == Some(StackError::Collision)).count() as u64
    };
    let mut take = |reason| counted.remove(&reason).unwrap_or(0);
    assert_eq!(take(SampleLoss::UserStackCollision), collided(|s| s.user_stack_error));
    assert_eq!(take(SampleLoss::KernelStackCollision), collided(|s| s.kernel_stack_error));
    for s in samples {
        for error in [s.user_stack_error, s.kernel_stack_error] {
            assert!(matches!(error, None | Some(StackError::Collision)), "{s:?}");
        }
    }
    counted
}

/// Off CPU, also stretches whose switch-in the kernel did not report: this host reports no
/// switch away from some tasks of its own (measured: the threads of its pid 1), so a thread
/// those hand the CPU to is seen switching out again without having switched in. Returns how
/// many.
fn switch_ins_unseen(sampler: &Sampler, samples: &[RawSample]) -> u64 {
    let mut others = other_off_cpu_losses(sampler, samples);
    let unseen = others.remove(&SampleLoss::SwitchInUnseen).unwrap_or(0);
    assert_eq!(others, HashMap::new());
    unseen
}

/// The samples with user stacks; each one without lost it to a collision (off CPU, counted) or
/// was taken while its thread was exiting, in `do_exit`.
fn with_user_stacks<'a>(samples: &'a [RawSample], kallsyms: &Kallsyms) -> Vec<&'a RawSample> {
    let exiting = kallsyms.function("do_exit");
    let (stacked, unstacked): (Vec<&RawSample>, Vec<&RawSample>) =
        samples.iter().partition(|s| !s.user_frames.is_empty());
    for s in unstacked.iter().filter(|s| s.user_stack_error.is_none()) {
        assert!(s.kernel_frames.iter().any(|&f| exiting.contains(f)), "no user stack: {s:?}");
    }
    stacked
}

fn within(measured: f64, expected: f64) -> bool {
    (measured - expected).abs() <= expected * TOLERANCE
}

#[tokio::test(flavor = "current_thread")]
async fn cpu_samples_land_in_the_functions_of_the_chosen_process_in_their_share() {
    let helper = NativeHelper::compile("busy_helper");
    let spin = ["spin", &SPIN_CPU_MS.to_string()];
    let (mut target, pid, functions) = start(&helper, &spin);
    let (mut other, other_pid, _) = start(&helper, &spin);
    let mut sampler =
        Sampler::attach(&SamplerOptions::cpu(FREQUENCY_HZ, Targets::Processes(vec![])))
            .expect("attach");
    assert_eq!((sampler.switch_hook(), sampler.stack_epoch()), (None, None));
    // Targets come and go: the other helper is added and removed again before either spins.
    sampler.add_target(pid).unwrap();
    sampler.add_target(other_pid).unwrap();
    sampler.remove_target(other_pid).unwrap();
    let text = text_of(pid, &[helper.path().to_str().unwrap(), "/libc.so.6"]);
    let outer = function_range(&helper, "outer", functions["outer"]);
    let inner = function_range(&helper, "inner", functions["inner"]);

    target.send_line("go").unwrap();
    other.send_line("go").unwrap();
    let samples = sample_until_done(&mut sampler, &mut target).await;
    assert_nothing_lost(&sampler, &samples);
    // The other one spun as long, and none of it was sampled.
    other.wait_line("DONE", TIMEOUT).unwrap();
    let mut late = Vec::new();
    sampler.drain(&mut late);
    assert_eq!(late, Vec::new());

    // Only the chosen process, about one sample per 1/999 s of its 2 s of CPU.
    assert_eq!(samples.iter().filter(|s| s.tgid != pid).count(), 0, "{other_pid} is not sampled");
    let expected = SPIN_CPU_MS as f64 * FREQUENCY_HZ as f64 / 1000.0;
    assert!(within(samples.len() as f64, expected), "{} samples, ~{expected}", samples.len());
    for s in &samples {
        assert_eq!((s.kind, s.tid, s.weight), (SampleKind::Cpu, pid, 1), "{s:?}");
        assert!(s.cpu < 1024 && s.time_ns > 0, "{s:?}");
    }
    // Every user stack ends in the helper's code or libc's.
    let stacked = with_user_stacks(&samples, &Kallsyms::read());
    for s in &stacked {
        let leaf = s.user_frames[0];
        assert!(text.iter().any(|t| t.contains(leaf)), "leaf {leaf:#x} outside {text:?}");
    }
    let leaf_in = |f: Range| stacked.iter().filter(|s| f.contains(s.user_frames[0])).count();
    let (in_inner, in_outer) = (leaf_in(inner), leaf_in(outer));
    let ratio = in_inner as f64 / in_outer as f64;
    assert!(within(ratio, 3.0), "inner {in_inner} : outer {in_outer} samples, not 3:1");
    // inner's caller, outer, is the next frame.
    let with_caller = stacked
        .iter()
        .filter(|s| inner.contains(s.user_frames[0]))
        .filter(|s| s.user_frames.get(1).is_some_and(|&f| outer.contains(f)))
        .count();
    assert!(
        with_caller as f64 >= 0.85 * in_inner as f64,
        "{with_caller} of inner's {in_inner} samples have outer as their next frame"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_syscall_loop_yields_kernel_stacks_in_kernel_text() {
    let helper = NativeHelper::compile("busy_helper");
    let (mut target, pid, _) = start(&helper, &["syscalls", "1000"]);
    let mut sampler =
        Sampler::attach(&SamplerOptions::cpu(FREQUENCY_HZ, Targets::Processes(vec![pid])))
            .expect("attach");
    let kallsyms = Kallsyms::read();
    let kernel_text = kallsyms.kernel_text();
    target.send_line("go").unwrap();
    let samples = sample_until_done(&mut sampler, &mut target).await;
    assert_nothing_lost(&sampler, &samples);

    // read() of /dev/zero spends its time zeroing the buffer in the kernel.
    let in_kernel: Vec<&RawSample> =
        samples.iter().filter(|s| !s.kernel_frames.is_empty()).collect();
    assert!(
        in_kernel.len() * 2 > samples.len(),
        "{} of {} samples have kernel stacks",
        in_kernel.len(),
        samples.len()
    );
    for s in &in_kernel {
        assert!(
            s.kernel_frames.iter().all(|&f| kernel_text.contains(f)),
            "kernel frames outside {kernel_text:?}: {s:?}"
        );
    }
    // The thread entered the kernel from user code: its user stack is there too.
    with_user_stacks(&samples, &kallsyms);
}

/// The sleeping thread's stretches: one per nap (but for those whose switch-in went unseen,
/// counted), each at least a nap long, all in `do_nanosleep`, adding up to the naps' total
/// within the tolerance.
async fn sleeps_are_weighed_off_cpu(hooks: HookChoice, mechanism: LifecycleMechanism) {
    let helper = NativeHelper::compile("busy_helper");
    let (mut target, pid, _) = start(&helper, &["sleep", &NAPS.to_string(), &NAP_MS.to_string()]);
    let options =
        SamplerOptions { hooks, ..SamplerOptions::off_cpu(Targets::Processes(vec![pid])) };
    let mut sampler = Sampler::attach(&options).expect("attach");
    assert_eq!(sampler.switch_hook(), Some(&mechanism));
    let kallsyms = Kallsyms::read();
    let sleep_path = kallsyms.function("do_nanosleep");
    let schedule = kallsyms.function("schedule");
    target.send_line("go").unwrap();
    let sleeper: u32 = target.expect_line("SLEEPER", TIMEOUT).unwrap().parse().unwrap();
    let samples = sample_until_done(&mut sampler, &mut target).await;
    let unseen = switch_ins_unseen(&sampler, &samples);

    assert_eq!(samples.iter().filter(|s| s.tgid != pid).count(), 0);
    let naps: Vec<&RawSample> = samples
        .iter()
        .filter(|s| s.tid == sleeper && s.kernel_frames.iter().any(|&f| sleep_path.contains(f)))
        .collect();
    // Each nap is a stretch, unless its switch-in went unseen (counted).
    assert!(naps.len() as u64 <= NAPS && naps.len() as u64 + unseen >= NAPS, "{samples:#?}");
    for s in &naps {
        assert_eq!(s.kind, SampleKind::OffCpu);
        assert!(s.weight > 0, "{s:?}");
        assert!(s.kernel_frames.iter().any(|&f| schedule.contains(f)), "{s:?}");
        assert!(!s.user_frames.is_empty() || s.user_stack_error.is_some(), "{s:?}");
    }
    // A nap is shorter than NAP_MS only when the thread was preempted between arming its timer
    // and blocking (docs/protocol/profiling.md, "Off-CPU stretches on `sched_switch`"): a window of
    // microseconds in each 50 ms nap, hit once in some hundred runs on two busy cores.
    let cut_short = naps.iter().filter(|s| s.weight < NAP_MS * 1_000_000).count() as u64;
    assert!(cut_short <= NAPS / 10, "{cut_short} naps cut short: {naps:#?}");
    let slept: u64 = naps.iter().map(|s| s.weight).sum();
    let expected = (NAPS * NAP_MS * 1_000_000) as f64;
    assert!(within(slept as f64, expected), "{slept} ns off CPU in nanosleep, ~{expected}");
}

#[tokio::test(flavor = "current_thread")]
async fn sleeps_are_weighed_off_cpu_on_the_btf_tracepoint() {
    sleeps_are_weighed_off_cpu(HookChoice::Auto, LifecycleMechanism::BtfTracepoints).await;
}

#[tokio::test(flavor = "current_thread")]
async fn sleeps_are_weighed_off_cpu_on_the_classic_tracepoint() {
    let why = "chosen with --hooks syscall-tracepoints".to_string();
    sleeps_are_weighed_off_cpu(
        HookChoice::SyscallTracepoints,
        LifecycleMechanism::Tracepoints { why },
    )
    .await;
}

/// With stack maps of 16 entries the programs move to the other map every two stacks user
/// space reads: every stack id of a blocked thread still reads back (none unresolved), and every
/// stack the kernel could not store is one counted collision, stretch by stretch.
#[tokio::test(flavor = "current_thread")]
async fn blocked_threads_stacks_stay_readable_across_epochs() {
    let helper = NativeHelper::compile("busy_helper");
    let (mut target, pid, _) = start(&helper, &["sleep", &NAPS.to_string(), &NAP_MS.to_string()]);
    let options = SamplerOptions {
        stack_map_entries: 16,
        ..SamplerOptions::off_cpu(Targets::Processes(vec![pid]))
    };
    let mut sampler = Sampler::attach(&options).expect("attach");
    target.send_line("go").unwrap();
    target.expect_line("SLEEPER", TIMEOUT).unwrap();
    let samples = sample_until_done(&mut sampler, &mut target).await;

    let epoch = sampler.stack_epoch().expect("off-CPU stack epochs");
    assert!(epoch >= 2, "epoch {epoch}");
    switch_ins_unseen(&sampler, &samples);
    let resolved = samples.iter().filter(|s| s.user_stack_error.is_none()).count();
    assert!(resolved > 0, "{samples:#?}");
}

#[tokio::test(flavor = "current_thread")]
async fn every_process_but_tracer_is_sampled_when_all_are_chosen() {
    let helper = NativeHelper::compile("busy_helper");
    let (mut target, pid, _) = start(&helper, &["spin", "500"]);
    let mut sampler =
        Sampler::attach(&SamplerOptions::cpu(FREQUENCY_HZ, Targets::All)).expect("attach");
    assert_eq!(
        format!("{:#}", sampler.add_target(pid).unwrap_err()),
        "every process is sampled: there are no targets to change"
    );
    // This process spins too while the helper does: it is tracer here, never sampled.
    let spinning = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let spinner = {
        let spinning = spinning.clone();
        std::thread::spawn(move || while spinning.load(std::sync::atomic::Ordering::Relaxed) {})
    };
    target.send_line("go").unwrap();
    let samples = sample_until_done(&mut sampler, &mut target).await;
    spinning.store(false, std::sync::atomic::Ordering::Relaxed);
    spinner.join().unwrap();

    let own = std::process::id();
    assert_eq!(samples.iter().filter(|s| s.tgid == own).count(), 0);
    assert_eq!(samples.iter().filter(|s| s.tgid == 0).count(), 0, "the idle task is no process");
    let of_helper = samples.iter().filter(|s| s.tgid == pid).count() as f64;
    assert!(within(of_helper, 500.0 * FREQUENCY_HZ as f64 / 1000.0), "{of_helper} samples");
}

#[test]
fn a_frequency_the_kernel_refuses_is_refused_with_the_numbers() {
    let max: u64 = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .expect("perf events")
        .trim()
        .parse()
        .unwrap();
    let error = |hz| match Sampler::attach(&SamplerOptions::cpu(hz, Targets::All)) {
        Ok(_) => panic!("{hz} Hz was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert_eq!(
        error(max + 1),
        format!(
            "sampling at {} Hz is above kernel.perf_event_max_sample_rate, {max} Hz (the kernel \
             lowers it when sampling interrupts take too long): sample at {max} Hz or less, or \
             raise the limit with `sysctl -w kernel.perf_event_max_sample_rate={}`",
            max + 1,
            max + 1
        )
    );
    assert_eq!(error(0), "a sampling frequency of 0 Hz takes no samples: choose 1 Hz or more");
}
