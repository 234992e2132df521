//! Loads and attaches the sampling programs for `tracer profile` (the `tracer-sampler` BPF
//! object, docs/protocol/profiling.md "Sampling in the kernel"): on-CPU samples from a cpu-clock
//! perf event on every CPU, or off-CPU stretches from `sched_switch`. Reads their ring through
//! tokio: CPU samples carry their frames; off-CPU stretches name stack ids, turned into frames
//! from the two stack maps (moving the programs from one to the other as one fills, and
//! emptying the one left behind). Reports every loss: the programs' per-CPU counters, records
//! that did not decode, stacks no longer readable.
use std::collections::HashMap as StdHashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use aya::maps::{Array, HashMap, MapData, MapError, PerCpuArray, RingBuf, StackTraceMap};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{BtfTracePoint, PerfEvent, ProgramError};
use aya::{Ebpf, EbpfLoader};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracer_common::sampling::{
    BLOCKED_THREAD_ENTRIES, BlockedThread, MAX_PROFILE_TARGETS, STACK_EPOCH_FILL_DIVISOR,
    STACK_MAP_ENTRIES, SampleKind, SampleLoss, SamplerConfig,
};
use tracer_decode::profile_sample::{self, CpuSample, OffCpuSample, ProfileSample, Stack};

use crate::kernel::bpf_programs::{
    Link, ProgramStats, attach_btf_typed, attach_classic, field_offset, load_error,
    loaded_program_stats, map_mut, with_kernel_btf,
};
use crate::kernel::btf::{AttachTarget, SamplerOffsets, sampler_offsets};
use crate::kernel::detect::{HookChoice, LifecycleMechanism};
use crate::kernel::privileges::require_bpf_tracing;
use crate::kernel::tracefs::Tracefs;
use crate::time::PeriodicTimer;

/// How often the ring is drained: samples wake the reader only once a quarter of the ring is
/// waiting.
pub const SAMPLE_DRAIN_INTERVAL: Duration = Duration::from_millis(100);

/// Off-CPU: how long after moving the programs to the other stack map user space waits before
/// it empties the old one: a program that read the old epoch has long finished by then (runs take
/// microseconds, with interrupts or preemption off).
const EPOCH_GRACE: Duration = Duration::from_millis(10);

/// Where the kernel says the highest sampling frequency it allows (it lowers the value when
/// sampling interrupts take too long).
const MAX_SAMPLE_RATE: &str = "/proc/sys/kernel/perf_event_max_sample_rate";

const CPU_PROGRAM: &str = "sample_cpu";
const SWITCH_PROGRAM: &str = "sched_switch";
const BTF_SWITCH_PROGRAM: &str = "btf_sched_switch";
const STACK_MAPS: [&str; 2] = ["STACKS_EVEN", "STACKS_ODD"];

/// What is sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleMode {
    /// Threads on a CPU, `frequency_hz` times a second per CPU (weight 1 each).
    Cpu { frequency_hz: u64 },
    /// Stretches threads spend blocked, each weighted by its nanoseconds.
    OffCpu,
}

/// Whose threads are sampled (never tracer's own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    All,
    /// These processes (tgids); more can be added and removed while sampling.
    Processes(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct SamplerOptions {
    pub mode: SampleMode,
    pub targets: Targets,
    /// Off-CPU: whether `sched_switch` runs as a `tp_btf` program (where the kernel loads it)
    /// or a classic tracepoint, chosen as for the detection's lifecycle hooks.
    pub hooks: HookChoice,
    /// Off-CPU: entries of each stack map ([`STACK_MAP_ENTRIES`]; at least
    /// [`STACK_EPOCH_FILL_DIVISOR`]).
    pub stack_map_entries: u32,
    /// [`SAMPLE_DRAIN_INTERVAL`]; above zero.
    pub drain_interval: Duration,
}

impl SamplerOptions {
    pub fn cpu(frequency_hz: u64, targets: Targets) -> SamplerOptions {
        SamplerOptions::new(SampleMode::Cpu { frequency_hz }, targets)
    }

    pub fn off_cpu(targets: Targets) -> SamplerOptions {
        SamplerOptions::new(SampleMode::OffCpu, targets)
    }

    fn new(mode: SampleMode, targets: Targets) -> SamplerOptions {
        SamplerOptions {
            mode,
            targets,
            hooks: HookChoice::Auto,
            stack_map_entries: STACK_MAP_ENTRIES,
            drain_interval: SAMPLE_DRAIN_INTERVAL,
        }
    }
}

/// Why a sample has no frames for one of its stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackError {
    /// Off-CPU: its hash bucket in the stack map held another stack (`EEXIST`).
    Collision,
    /// The kernel could not take it (`EFAULT`).
    Unreadable,
    /// `bpf_get_stack` or `bpf_get_stackid` failed with this errno (`ENOMEM`: no free stack
    /// map entry).
    Failed(i32),
    /// Off-CPU: its id could no longer be read: its stack map had been emptied.
    Unresolved,
}

impl StackError {
    /// The error of a stack the kernel did not take: `errno` as the helper returned it, negated.
    fn of_errno(errno: i32) -> StackError {
        match errno {
            libc::EEXIST => StackError::Collision,
            libc::EFAULT => StackError::Unreadable,
            errno => StackError::Failed(errno),
        }
    }
}

/// One sample, with its stacks' frames (innermost first) as the kernel saw them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSample {
    pub kind: SampleKind,
    /// CLOCK_MONOTONIC nanoseconds the stacks were taken at: the CPU sample's tick, or when the
    /// blocked thread switched out.
    pub time_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// The CPU the stacks were taken on.
    pub cpu: u32,
    /// Kernel text addresses; empty for a sample taken in user mode.
    pub kernel_frames: Vec<u64>,
    /// User addresses (return addresses below the innermost frame); empty for a kernel thread.
    pub user_frames: Vec<u64>,
    /// 1 for a CPU sample; an off-CPU stretch's nanoseconds.
    pub weight: u64,
    pub kernel_stack_error: Option<StackError>,
    pub user_stack_error: Option<StackError>,
}

/// One nonzero loss counter of the programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSampleLoss {
    pub cpu: u32,
    pub kind: SampleKind,
    pub reason: SampleLoss,
    pub count: u64,
}

/// Everything lost so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SamplerLosses {
    /// The programs' counters (only nonzero ones).
    pub kernel: Vec<KernelSampleLoss>,
    /// Ring records that did not decode (each was logged).
    pub corrupt_records: u64,
    /// Stack ids user space could not read back ([`StackError::Unresolved`]).
    pub unresolved_stacks: u64,
}

impl SamplerLosses {
    pub fn total(&self) -> u64 {
        self.kernel.iter().map(|l| l.count).sum::<u64>()
            + self.corrupt_records
            + self.unresolved_stacks
    }
}

/// The sampling programs, loaded and attached, and their ring.
pub struct Sampler {
    ebpf: Ebpf,
    ring: AsyncFd<RingBuf<MapData>>,
    drain_timer: PeriodicTimer,
    links: Vec<(&'static str, Link)>,
    /// The programs attached at start; still loaded (their statistics readable) after `detach`.
    programs: Vec<&'static str>,
    targets: Option<HashMap<MapData, u32, u8>>,
    /// Off-CPU: the stack maps the stretches' stack ids name.
    stacks: Option<StackTables>,
    switch_hook: Option<LifecycleMechanism>,
    corrupt_records: u64,
}

impl Sampler {
    /// Checks the options and privileges, loads the object, writes its configuration and
    /// targets, and attaches the programs of `options.mode`. Errors say what is missing and what
    /// to do.
    pub fn attach(options: &SamplerOptions) -> anyhow::Result<Sampler> {
        if let SampleMode::Cpu { frequency_hz } = options.mode {
            check_frequency(frequency_hz)?;
        }
        if options.mode == SampleMode::OffCpu
            && options.stack_map_entries < STACK_EPOCH_FILL_DIVISOR
        {
            bail!(
                "stack maps of {} entries are too small: at least {STACK_EPOCH_FILL_DIVISOR}",
                options.stack_map_entries
            );
        }
        require_bpf_tracing()?;
        let offsets = sampler_offsets();
        let mut config = SamplerConfig {
            tracer_tgid: std::process::id(),
            all_processes: u32::from(options.targets == Targets::All),
            task_flags_offset: offsets.task_flags.clone().unwrap_or_else(|why| {
                log::warn!("{why}: kernel threads' samples count their user stacks unreadable");
                0
            }),
            ..SamplerConfig::default()
        };
        let mut ebpf = load_object(options, config)?;
        let targets = match &options.targets {
            Targets::All => None,
            Targets::Processes(pids) => {
                let mut map = HashMap::try_from(take_map(&mut ebpf, "PROFILE_TARGETS")?)?;
                for &pid in pids {
                    insert_target(&mut map, pid)?;
                }
                Some(map)
            }
        };
        let ring = RingBuf::try_from(take_map(&mut ebpf, "SAMPLES")?)?;
        // SAFETY: `ring` owns its map fd, which stays open until the AsyncFd is dropped.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
            .context("registering the BPF sample ring with tokio")?;
        let (links, switch_hook, stacks) = match options.mode {
            SampleMode::Cpu { frequency_hz } => {
                (attach_cpu_clock(&mut ebpf, frequency_hz)?, None, None)
            }
            SampleMode::OffCpu => {
                let (link, mechanism) =
                    attach_switch_hook(&mut ebpf, options.hooks, &offsets, &mut config)?;
                log::info!("off-CPU sched_switch hook: {mechanism}");
                let stacks = StackTables::new(&mut ebpf, options.stack_map_entries)?;
                (vec![link], Some(mechanism), Some(stacks))
            }
        };
        let drain_timer = PeriodicTimer::new(options.drain_interval)
            .context("starting the sample ring's drain timer")?;
        // One cpu-clock link per CPU, all of one program.
        let mut programs: Vec<&'static str> = links.iter().map(|(name, _)| *name).collect();
        programs.dedup();
        Ok(Sampler {
            programs,
            ebpf,
            ring,
            drain_timer,
            links,
            targets,
            stacks,
            switch_hook,
            corrupt_records: 0,
        })
    }

    /// Samples the threads of process `tgid` too, from now on. Remove it when the process
    /// exits: its pid may be reused.
    pub fn add_target(&mut self, tgid: u32) -> anyhow::Result<()> {
        insert_target(self.chosen_targets()?, tgid)
    }

    /// Stops sampling process `tgid`. Stretches its threads began blocked before still arrive,
    /// as do samples already in the ring.
    pub fn remove_target(&mut self, tgid: u32) -> anyhow::Result<()> {
        match self.chosen_targets()?.remove(&tgid) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {tgid} from PROFILE_TARGETS")),
        }
    }

    fn chosen_targets(&mut self) -> anyhow::Result<&mut HashMap<MapData, u32, u8>> {
        self.targets.as_mut().context("every process is sampled: there are no targets to change")
    }

    /// Waits until the ring is a quarter full or the drain interval passed, then decodes every
    /// record in it into `out`. Cancel-safe: nothing is read before the wait ends, and the timer
    /// keeps its schedule across calls.
    pub async fn read(&mut self, out: &mut Vec<RawSample>) -> io::Result<()> {
        tokio::select! {
            guard = self.ring.readable_mut() => guard?.clear_ready(),
            tick = self.drain_timer.tick() => tick?,
        }
        self.drain(out);
        Ok(())
    }

    /// Decodes every record already in the ring into `out`, without waiting: every sample
    /// taken before a thread did something the caller then saw (a line it printed) is in it.
    pub fn drain(&mut self, out: &mut Vec<RawSample>) {
        let ring = self.ring.get_mut();
        let corrupt = &mut self.corrupt_records;
        let Some(stacks) = &mut self.stacks else {
            drain_ring(ring, None, corrupt, out);
            return;
        };
        drain_ring(ring, Some(stacks), corrupt, out);
        if stacks.retiring_is_due() {
            stacks.keep_blocked_stacks();
            // Records submitted while the blocked threads were read may name stacks only the
            // retiring map holds.
            drain_ring(ring, Some(stacks), corrupt, out);
            stacks.empty_retiring();
        }
        if let Err(e) = stacks.next_epoch_if_full() {
            log::warn!("{e:#}: stacks stay in the current map, which fills (collisions counted)");
        }
    }

    /// Detaches every program: no sample is taken after this returns (the ring may still hold
    /// some).
    pub fn detach(&mut self) {
        self.links.clear();
    }

    /// Everything lost so far.
    pub fn losses(&self) -> anyhow::Result<SamplerLosses> {
        let map = self.ebpf.map("SAMPLE_LOSSES").context("no SAMPLE_LOSSES map")?;
        let counters = PerCpuArray::<_, u64>::try_from(map)?;
        let mut kernel = Vec::new();
        for kind in SampleKind::ALL {
            for reason in SampleLoss::ALL {
                let index = SampleLoss::counter_index(kind, reason);
                let per_cpu = counters.get(&index, 0).context("reading SAMPLE_LOSSES")?;
                for (cpu, &count) in per_cpu.iter().enumerate() {
                    if count != 0 {
                        kernel.push(KernelSampleLoss { cpu: cpu as u32, kind, reason, count });
                    }
                }
            }
        }
        Ok(SamplerLosses {
            kernel,
            corrupt_records: self.corrupt_records,
            unresolved_stacks: self.stacks.as_ref().map_or(0, |stacks| stacks.unresolved),
        })
    }

    /// Off-CPU: the mechanism `sched_switch` runs on.
    pub fn switch_hook(&self) -> Option<&LifecycleMechanism> {
        self.switch_hook.as_ref()
    }

    /// Off-CPU: the stack epoch the programs take stacks in (it starts at 0 and goes up by one
    /// each time a stack map fills).
    pub fn stack_epoch(&self) -> Option<u32> {
        self.stacks.as_ref().map(|stacks| stacks.current.number)
    }

    /// Run statistics of the attached programs (`kernel.bpf_stats_enabled` for run times).
    pub fn program_stats(&self) -> anyhow::Result<Vec<(&'static str, ProgramStats)>> {
        loaded_program_stats(&self.ebpf, &self.programs)
    }
}

/// Decodes every record in `ring` into `out`: CPU samples with their frames, off-CPU stretches
/// with the frames of their stack ids from `stacks` (`None` when CPUs are sampled). A record
/// that does not decode, or of the mode not sampled, is counted in `corrupt` and logged.
fn drain_ring(
    ring: &mut RingBuf<MapData>,
    mut stacks: Option<&mut StackTables>,
    corrupt: &mut u64,
    out: &mut Vec<RawSample>,
) {
    while let Some(item) = ring.next() {
        let error = match (profile_sample::decode(&item), stacks.as_deref_mut()) {
            (Ok(ProfileSample::Cpu(sample)), None) => {
                out.push(cpu_sample(sample));
                continue;
            }
            (Ok(ProfileSample::OffCpu(sample)), Some(stacks)) => {
                out.push(stacks.resolve(&sample));
                continue;
            }
            (Ok(sample), _) => format!("a sample of the mode not sampled: {sample:?}"),
            (Err(e), _) => e.to_string(),
        };
        *corrupt += 1;
        log::warn!("corrupt sample record ({} bytes) skipped: {error}", item.len());
    }
}

/// A CPU sample: its frames came with it.
fn cpu_sample(sample: CpuSample) -> RawSample {
    let (user_frames, user_stack_error) = frames(sample.user_stack);
    let (kernel_frames, kernel_stack_error) = frames(sample.kernel_stack);
    RawSample {
        kind: SampleKind::Cpu,
        time_ns: sample.time_ns,
        tgid: sample.tgid,
        tid: sample.tid,
        cpu: sample.cpu,
        kernel_frames,
        user_frames,
        weight: 1,
        kernel_stack_error,
        user_stack_error,
    }
}

fn frames(stack: Stack<Vec<u64>>) -> (Vec<u64>, Option<StackError>) {
    match stack {
        Stack::None => (Vec::new(), None),
        Stack::Taken(frames) => (frames, None),
        Stack::Failed(errno) => (Vec::new(), Some(StackError::of_errno(errno))),
    }
}

/// Refuses a frequency the kernel would refuse, with the numbers.
fn check_frequency(frequency_hz: u64) -> anyhow::Result<()> {
    if frequency_hz == 0 {
        bail!("a sampling frequency of 0 Hz takes no samples: choose 1 Hz or more");
    }
    let text = match std::fs::read_to_string(MAX_SAMPLE_RATE) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => bail!(
            "this kernel has no perf events ({MAX_SAMPLE_RATE} does not exist): CPU sampling \
             needs a kernel built with CONFIG_PERF_EVENTS"
        ),
        Err(e) => return Err(e).with_context(|| format!("reading {MAX_SAMPLE_RATE}")),
    };
    let max: u64 =
        text.trim().parse().with_context(|| format!("{MAX_SAMPLE_RATE} holds {text:?}"))?;
    if frequency_hz > max {
        bail!(
            "sampling at {frequency_hz} Hz is above kernel.perf_event_max_sample_rate, {max} Hz \
             (the kernel lowers it when sampling interrupts take too long): sample at {max} Hz \
             or less, or raise the limit with `sysctl -w \
             kernel.perf_event_max_sample_rate={frequency_hz}`"
        );
    }
    Ok(())
}

/// The embedded sampling object, loaded with maps sized for `options`, and `config` written.
fn load_object(options: &SamplerOptions, config: SamplerConfig) -> anyhow::Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    // No CO-RE relocations: the few kernel offsets come in SAMPLER_CONFIG (as for detection).
    loader.btf(None);
    // CPU samples carry their frames: the off-CPU maps get one entry instead of their
    // preallocated tables.
    let off_cpu_entries = |entries| if options.mode == SampleMode::OffCpu { entries } else { 1 };
    for map in STACK_MAPS {
        loader.map_max_entries(map, off_cpu_entries(options.stack_map_entries));
    }
    loader.map_max_entries("BLOCKED_THREADS", off_cpu_entries(BLOCKED_THREAD_ENTRIES));
    let mut ebpf =
        loader.load(crate::SAMPLER_OBJECT).context("loading the embedded sampling BPF object")?;
    write_config(&mut ebpf, config)?;
    Ok(ebpf)
}

fn write_config(ebpf: &mut Ebpf, config: SamplerConfig) -> anyhow::Result<()> {
    Array::<_, SamplerConfig>::try_from(map_mut(ebpf, "SAMPLER_CONFIG")?)?
        .set(0, config, 0)
        .context("writing the SAMPLER_CONFIG map")
}

fn take_map(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<aya::maps::Map> {
    ebpf.take_map(name).ok_or_else(|| anyhow!("the sampling BPF object has no map {name}"))
}

fn insert_target(targets: &mut HashMap<MapData, u32, u8>, tgid: u32) -> anyhow::Result<()> {
    match targets.insert(tgid, 1, 0) {
        Ok(()) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::E2BIG) => {
            bail!("{MAX_PROFILE_TARGETS} processes are sampled already: {tgid} cannot be added")
        }
        Err(e) => Err(e).with_context(|| format!("adding {tgid} to PROFILE_TARGETS")),
    }
}

/// Loads the cpu-clock program and attaches it to a cpu-clock event of `frequency_hz` on every
/// online CPU (CPUs brought online later are not sampled).
fn attach_cpu_clock(
    ebpf: &mut Ebpf,
    frequency_hz: u64,
) -> anyhow::Result<Vec<(&'static str, Link)>> {
    let program: &mut PerfEvent = ebpf
        .program_mut(CPU_PROGRAM)
        .ok_or_else(|| anyhow!("the sampling BPF object has no program {CPU_PROGRAM}"))?
        .try_into()?;
    program.load().map_err(|e| load_error(CPU_PROGRAM, e))?;
    let cpus = aya::util::online_cpus()
        .map_err(|(path, e)| anyhow::Error::new(e).context(format!("reading {path}")))?;
    let mut links = Vec::with_capacity(cpus.len());
    for cpu in cpus {
        let id = program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(frequency_hz),
                false,
            )
            .map_err(|e| perf_event_error(e, cpu, frequency_hz))?;
        links.push((CPU_PROGRAM, Link::PerfEvent { _link: program.take_link(id)? }));
    }
    Ok(links)
}

/// Says what a refused cpu-clock event means and what to do.
fn perf_event_error(e: ProgramError, cpu: u32, frequency_hz: u64) -> anyhow::Error {
    let errno = match &e {
        ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
        _ => None,
    };
    let what = format!("opening a {frequency_hz} Hz cpu-clock perf event on CPU {cpu}");
    let hint = match errno {
        Some(libc::ENOSYS) => {
            "this kernel has no perf events: CPU sampling needs CONFIG_PERF_EVENTS".to_string()
        }
        Some(libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP) => {
            "this kernel offers no cpu-clock software event".to_string()
        }
        Some(libc::EACCES | libc::EPERM) => {
            "refused: run tracer as root or with CAP_PERFMON (kernel.perf_event_paranoid)"
                .to_string()
        }
        Some(libc::EINVAL) => match std::fs::read_to_string(MAX_SAMPLE_RATE) {
            Ok(max) => format!(
                "refused: kernel.perf_event_max_sample_rate is now {} Hz (the kernel lowers it \
                 when sampling interrupts take too long)",
                max.trim()
            ),
            Err(_) => "refused as invalid".to_string(),
        },
        _ => return anyhow::Error::new(e).context(what),
    };
    anyhow::Error::new(e).context(format!("{what}: {hint}"))
}

/// Attaches the off-CPU program to `sched_switch`: as `tp_btf` where `choice` allows it and the
/// kernel loads it, else on the classic tracepoint (whose record offsets go into `config`).
fn attach_switch_hook(
    ebpf: &mut Ebpf,
    choice: HookChoice,
    offsets: &SamplerOffsets,
    config: &mut SamplerConfig,
) -> anyhow::Result<((&'static str, Link), LifecycleMechanism)> {
    let why = match choice {
        HookChoice::SyscallTracepoints => "chosen with --hooks syscall-tracepoints".to_string(),
        HookChoice::Auto | HookChoice::Trampolines => {
            let attached = offsets.switch.clone().map_err(anyhow::Error::msg).and_then(|pid| {
                config.task_pid_offset = pid;
                write_config(ebpf, *config)?;
                let targets = [AttachTarget::tracepoint("sched_switch")];
                with_kernel_btf("the tp_btf sched_switch program", &targets, |btf| {
                    attach_btf_typed::<BtfTracePoint>(
                        ebpf,
                        btf,
                        [(BTF_SWITCH_PROGRAM, "sched_switch")].into_iter(),
                        "tp_btf",
                    )
                })
            });
            match attached {
                Ok(mut links) => {
                    let link = links.pop().context("no tp_btf link")?;
                    return Ok((link, LifecycleMechanism::BtfTracepoints));
                }
                Err(e) if choice == HookChoice::Trampolines => {
                    return Err(e.context(
                        "--hooks trampolines: the kernel refused the BTF tracepoint \
                         (--hooks auto falls back to the classic tracepoint)",
                    ));
                }
                Err(e) => format!("BTF tracepoints refused: {e:#}"),
            }
        }
    };
    let tracefs = Tracefs::find_or_mount()?;
    let format = tracefs.event_format("sched", "sched_switch")?;
    config.switch_prev_state_offset = field_offset(&format, "prev_state", 8, None)?;
    config.switch_next_pid_offset = field_offset(&format, "next_pid", 4, None)?;
    write_config(ebpf, *config)?;
    let mut links =
        attach_classic(ebpf, &tracefs, vec![(SWITCH_PROGRAM, "sched", "sched_switch")], || {
            format!("no BTF tracepoint ({why})")
        })?;
    let link = links.pop().context("no tracepoint link")?;
    Ok((link, LifecycleMechanism::Tracepoints { why }))
}

/// The stacks one epoch's map holds that user space has read.
struct Epoch {
    number: u32,
    read: StdHashMap<u32, Arc<[u64]>>,
}

impl Epoch {
    fn new(number: u32) -> Epoch {
        Epoch { number, read: StdHashMap::new() }
    }

    /// The frames of stack `id`, read from `map` the first time (an entry never changes while
    /// its epoch's map is in use: without `BPF_F_REUSE_STACKID` a taken bucket is kept).
    fn frames(&mut self, map: &StackTraceMap<MapData>, id: u32) -> Option<Arc<[u64]>> {
        if let Some(frames) = self.read.get(&id) {
            return Some(frames.clone());
        }
        let frames: Arc<[u64]> = match map.get(&id, 0) {
            Ok(stack) => stack.frames().iter().map(|f| f.ip).collect(),
            Err(e) => {
                log::debug!("stack {id} of epoch {} unreadable: {e}", self.number);
                return None;
            }
        };
        self.read.insert(id, frames.clone());
        Some(frames)
    }
}

/// Off-CPU: the two stack maps and what user space knows of them. The programs take stacks into
/// the map
/// of the current epoch (its low bit); once user space has read a fill limit's worth of
/// distinct stacks from it, the next epoch starts in the other map, and after `EPOCH_GRACE` the
/// old one is emptied — but first the stacks of threads still blocked with ids in it are kept.
struct StackTables {
    maps: [StackTraceMap<MapData>; 2],
    epoch_map: Array<MapData, u32>,
    /// The threads switched out blocked, whose stacks must outlive their stack map.
    blocked: HashMap<MapData, u32, BlockedThread>,
    current: Epoch,
    /// The previous epoch, from when the programs left it until its map is emptied.
    retiring: Option<(Epoch, Instant)>,
    /// (epoch, id) → frames of blocked threads' stacks whose map was emptied.
    kept: StdHashMap<(u32, u32), Arc<[u64]>>,
    fill_limit: usize,
    unresolved: u64,
}

impl StackTables {
    fn new(ebpf: &mut Ebpf, entries: u32) -> anyhow::Result<StackTables> {
        let [even, odd] = STACK_MAPS;
        Ok(StackTables {
            maps: [
                StackTraceMap::try_from(take_map(ebpf, even)?)?,
                StackTraceMap::try_from(take_map(ebpf, odd)?)?,
            ],
            epoch_map: Array::try_from(take_map(ebpf, "STACK_EPOCH")?)?,
            blocked: HashMap::try_from(take_map(ebpf, "BLOCKED_THREADS")?)?,
            current: Epoch::new(0),
            retiring: None,
            kept: StdHashMap::new(),
            fill_limit: (entries / STACK_EPOCH_FILL_DIVISOR) as usize,
            unresolved: 0,
        })
    }

    fn resolve(&mut self, sample: &OffCpuSample) -> RawSample {
        let (user_frames, user_stack_error) = self.stack(sample.stack_epoch, &sample.user_stack);
        let (kernel_frames, kernel_stack_error) =
            self.stack(sample.stack_epoch, &sample.kernel_stack);
        RawSample {
            kind: SampleKind::OffCpu,
            time_ns: sample.time_ns,
            tgid: sample.tgid,
            tid: sample.tid,
            cpu: sample.cpu,
            kernel_frames,
            user_frames,
            weight: sample.weight,
            kernel_stack_error,
            user_stack_error,
        }
    }

    fn stack(&mut self, epoch: u32, stack: &Stack<u32>) -> (Vec<u64>, Option<StackError>) {
        let id = match *stack {
            Stack::None => return (Vec::new(), None),
            Stack::Failed(errno) => return (Vec::new(), Some(StackError::of_errno(errno))),
            Stack::Taken(id) => id,
        };
        match self.frames(epoch, id) {
            Some(frames) => (frames.to_vec(), None),
            None => {
                self.unresolved += 1;
                (Vec::new(), Some(StackError::Unresolved))
            }
        }
    }

    fn frames(&mut self, epoch: u32, id: u32) -> Option<Arc<[u64]>> {
        let map = &self.maps[(epoch & 1) as usize];
        let retiring = self.retiring.as_mut().map(|(epoch, _)| epoch);
        match [Some(&mut self.current), retiring].into_iter().flatten().find(|e| e.number == epoch)
        {
            Some(live) => live.frames(map, id),
            None => self.kept.get(&(epoch, id)).cloned(),
        }
    }

    fn retiring_is_due(&self) -> bool {
        self.retiring.as_ref().is_some_and(|(_, left)| left.elapsed() >= EPOCH_GRACE)
    }

    /// Keeps the stacks that blocked threads switched out with in epochs other than the
    /// current one — from the retiring map, or from what was kept before — and drops the rest
    /// of what was kept: a stretch's record names its stacks when the thread switches in,
    /// however long after.
    fn keep_blocked_stacks(&mut self) {
        let Some((retiring, _)) = self.retiring.as_mut() else { return };
        let retiring_map = &self.maps[(retiring.number & 1) as usize];
        let mut kept = StdHashMap::new();
        for entry in self.blocked.iter() {
            let thread = match entry {
                Ok((_, thread)) => thread,
                Err(e) => {
                    log::warn!("reading BLOCKED_THREADS: {e} (the rest of it is not kept)");
                    break;
                }
            };
            if thread.stack_epoch == self.current.number {
                continue;
            }
            for id in [thread.user_stack_id, thread.kernel_stack_id] {
                let Ok(id) = u32::try_from(id) else { continue };
                let key = (thread.stack_epoch, id);
                let frames = if thread.stack_epoch == retiring.number {
                    retiring.frames(retiring_map, id)
                } else {
                    self.kept.get(&key).cloned()
                };
                if let Some(frames) = frames {
                    kept.insert(key, frames);
                }
            }
        }
        self.kept = kept;
    }

    /// Empties the retiring epoch's map for a later epoch to use.
    fn empty_retiring(&mut self) {
        let Some((retiring, _)) = self.retiring.take() else { return };
        let map = &mut self.maps[(retiring.number & 1) as usize];
        let ids: Vec<u32> = map.stack_ids().filter_map(Result::ok).collect();
        for id in ids {
            if let Err(e) = map.remove(&id) {
                log::warn!("emptying the stack map of epoch {}: {e}", retiring.number);
                return;
            }
        }
    }

    /// Moves the programs to the other map once the current one holds `fill_limit` stacks user
    /// space has read, unless the other is still retiring.
    fn next_epoch_if_full(&mut self) -> anyhow::Result<()> {
        if self.retiring.is_some() || self.current.read.len() < self.fill_limit {
            return Ok(());
        }
        let next = self.current.number.wrapping_add(1);
        self.epoch_map.set(0, next, 0).context("writing the STACK_EPOCH map")?;
        let left = std::mem::replace(&mut self.current, Epoch::new(next));
        self.retiring = Some((left, Instant::now()));
        Ok(())
    }
}
