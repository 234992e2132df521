//! `tracer profile`: where .NET processes spend CPU (`cpu`) or wait (`off-cpu`), sampled in the
//! kernel, every frame named without writing into the target, written as the files profilers
//! open (docs/protocol/profiling.md).
//!
//! Detection → sampling → naming → files, in one direction: the processes are those the
//! detection finds (or `--pid`), selected by the filters; each gets the kernel sampler's
//! attention and a method session with its runtime ([`methods`]); samples arrive with their
//! stacks' addresses, kernel and native frames are named as they arrive (while the process and
//! its mappings still exist), and JIT frames once the method sessions have ended with their
//! rundown, each by the method that owned its address at the sample's time.
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracer_decode::bpf_event::DetectionEvent;
use tracer_decode::nettrace::methods::{ManagedFrame, OsrFrames, code_address};

use crate::identity::{ProcessFilter, ProcessTracker};
use crate::ipc::client::{ClientError, Timeouts};
use crate::ipc::socket::Target;
use crate::kernel::detect::{DetectOptions, Detector, HookChoice};
use crate::kernel::procfs;
use crate::kernel::sampler::{
    RawSample, SampleMode, Sampler, SamplerLosses, SamplerOptions, Targets,
};
use crate::metrics::{ProfileRequest, ProfileSource};
use crate::profile::format::Format;
use crate::profile::methods::{self, MethodCollection};
use crate::profile::symbolize::{KernelSymbols, NativeSymbolizer, ProcessMaps};
use crate::profile::{Frame, FrameId, FrameKind, LimitCounts, Mode, ProcessSummary, Profile};
use crate::time::{monotonic_ns, realtime_ns};

/// Frames kept of samples waiting for their JIT frames to be named (at the end); samples past
/// it are refused and counted: about 24 bytes a frame.
pub const MAX_PENDING_FRAMES: usize = 8 << 20;
/// How long after its last read a process's mappings are read again when a frame lies outside
/// all of them (a library loaded since).
pub const MAPS_REFRESH: Duration = Duration::from_millis(200);
/// Frames named by address and kept for the samples that follow, all processes together
/// (stacks repeat: naming a frame again costs a symbol lookup and its strings); the cache starts
/// over when full. About 64 bytes an address.
pub const MAX_NAMED_ADDRESSES: usize = 1 << 16;
/// How long a method session may take, beyond the drain timeout, to hand over its table at the
/// end.
const METHOD_SESSION_GRACE: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
pub struct ProfileConfig {
    pub mode: SampleMode,
    /// Only these processes (none: every .NET process detected).
    pub target_pids: Vec<u32>,
    pub filter: ProcessFilter,
    pub hooks: HookChoice,
    /// The files to write.
    pub outputs: Vec<(Format, PathBuf)>,
    pub timeouts: Timeouts,
    /// How long a method session keeps looking for a runtime's socket.
    pub locate_for: Duration,
    /// How long a method session's rundown may take after StopTracing.
    pub drain_timeout: Duration,
}

/// One profiled process, as the summary reports it.
#[derive(Debug)]
pub struct ProcessReport {
    pub pid: u32,
    pub process_start_ns: Option<u64>,
    pub name: String,
    pub summary: ProcessSummary,
    /// Method and module events of its runtime, and whether its rundown came.
    pub method_events: u64,
    pub rundown_complete: bool,
    /// Why it has no managed names, when its method session failed.
    pub method_error: Option<String>,
}

/// What `tracer profile` did.
#[derive(Debug, Default)]
pub struct ProfileSummary {
    pub mode: Option<SampleMode>,
    pub processes: Vec<ProcessReport>,
    /// Samples taken of the profiled processes.
    pub samples: u64,
    /// Samples refused past [`MAX_PENDING_FRAMES`].
    pub samples_refused: u64,
    pub losses: SamplerLosses,
    /// Why native frames went unnamed, by reason (files refused, not ELF, …).
    pub native_refusals: Vec<(&'static str, u64)>,
    pub limits: LimitCounts,
    pub files: Vec<PathBuf>,
}

impl fmt::Display for ProfileSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "tracer profile summary:")?;
        writeln!(
            f,
            "  samples: {} taken, {} refused (memory bound)",
            self.samples, self.samples_refused
        )?;
        for p in &self.processes {
            let s = &p.summary;
            let share = |n: u64, of: u64| if of == 0 { 0.0 } else { 100.0 * n as f64 / of as f64 };
            writeln!(
                f,
                "  pid {} ({}): {} samples, named leaf {:.1} %, named frames {:.1} %, {} method events{}",
                p.pid,
                tracer_decode::text::escape_control(&p.name),
                s.samples,
                share(s.leaf_named_samples, s.samples),
                share(s.named_frames, s.frames),
                p.method_events,
                match (&p.method_error, p.rundown_complete) {
                    (Some(e), _) => format!(" (managed frames unnamed: {e})"),
                    (None, false) => " (no rundown: methods compiled before may be unnamed)".into(),
                    (None, true) => String::new(),
                }
            )?;
        }
        writeln!(f, "  lost: {}", self.losses.total())?;
        for l in &self.losses.kernel {
            writeln!(f, "    cpu {} {:?} {:?}: {}", l.cpu, l.kind, l.reason, l.count)?;
        }
        if self.losses.corrupt_records + self.losses.unresolved_stacks > 0 {
            writeln!(
                f,
                "    corrupt records: {}, stacks no longer readable: {}",
                self.losses.corrupt_records, self.losses.unresolved_stacks
            )?;
        }
        for (why, n) in self.native_refusals.iter().filter(|(_, n)| *n > 0) {
            writeln!(f, "  native names not read ({why}): {n}")?;
        }
        for file in &self.files {
            writeln!(f, "  wrote {}", file.display())?;
        }
        Ok(())
    }
}

/// A frame of a sample still to be named.
#[derive(Clone)]
enum Pending {
    Named(FrameId),
    /// A user address no file named: a JIT frame for the method table to name at the end,
    /// else `module+offset`.
    User {
        address: u64,
        module: Arc<str>,
        module_offset: u64,
    },
}

/// A frame of a sample once the method tables are in.
enum Resolved {
    Id(FrameId),
    Managed(ManagedFrame),
    Unnamed { module: Arc<str>, module_offset: u64 },
}

/// A sample waiting for its JIT frames' names.
struct Stored {
    time_ns: u64,
    tid: u32,
    weight: u64,
    /// Leaf first.
    frames: Vec<Pending>,
}

/// One process being profiled.
struct Profiled {
    id: crate::profile::ProcessId,
    maps: Option<ProcessMaps>,
    maps_read: Instant,
    /// Counts the reads of `maps` that replaced them: what was named from older ones is not
    /// used.
    maps_generation: u64,
    /// Module names, shared by the frames that carry them.
    modules: HashMap<String, Arc<str>>,
    samples: Vec<Stored>,
    methods: Option<JoinHandle<Result<MethodCollection, ClientError>>>,
}

/// Everything the naming needs while samples arrive.
struct Namer {
    profile: Profile,
    kernel: Option<KernelSymbols>,
    native: NativeSymbolizer,
    processes: HashMap<u32, Profiled>,
    /// (kernel address, whether it is the leaf) → frame: the kernel's symbols do not change.
    kernel_frames: HashMap<(u64, bool), FrameId>,
    /// (pid, user address) → (its maps' generation, frame).
    user_frames: HashMap<(u32, u64), (u64, Pending)>,
    pending_frames: usize,
    summary: ProfileSummary,
}

impl Namer {
    /// Takes one sample of a profiled process (others are ignored: a process the sampler still
    /// watched while it was being removed).
    fn take(&mut self, sample: RawSample) {
        let Some(process) = self.processes.get_mut(&sample.tgid) else { return };
        self.summary.samples += 1;
        let depth = sample.kernel_frames.len() + sample.user_frames.len();
        if self.pending_frames + depth > MAX_PENDING_FRAMES {
            self.summary.samples_refused += 1;
            return;
        }
        self.pending_frames += depth;
        let mut frames = Vec::with_capacity(depth);
        for (i, &address) in sample.kernel_frames.iter().enumerate() {
            let key = (address, i == 0);
            if let Some(&id) = self.kernel_frames.get(&key) {
                frames.push(Pending::Named(id));
                continue;
            }
            let at = code_address(i, address);
            let frame = match self.kernel.as_ref().and_then(|k| k.lookup(at)) {
                Some(s) => Frame::named(FrameKind::Kernel, s.name, Some(s.module)),
                None => Frame::unnamed(FrameKind::Kernel, Some("[kernel]"), address),
            };
            let id = self.profile.intern_frame(frame);
            remember(&mut self.kernel_frames, key, id);
            frames.push(Pending::Named(id));
        }
        let first_user = sample.kernel_frames.len();
        for (i, &address) in sample.user_frames.iter().enumerate() {
            let at = code_address(first_user + i, address);
            refresh_stale_maps(process, sample.tgid, at);
            let Some(maps) = process.maps.as_ref() else {
                let module = shared_module(&mut process.modules, "[unknown]");
                frames.push(Pending::User { address: at, module, module_offset: at });
                continue;
            };
            let key = (sample.tgid, at);
            match self.user_frames.get(&key) {
                Some((generation, pending)) if *generation == process.maps_generation => {
                    frames.push(pending.clone());
                    continue;
                }
                _ => {}
            }
            let native = self.native.symbolize(maps, at);
            let pending = if native.named() {
                let frame = Frame::named(FrameKind::Native, &native.name, Some(&native.module));
                Pending::Named(self.profile.intern_frame(frame))
            } else {
                Pending::User {
                    address: at,
                    module: shared_module(&mut process.modules, &native.module),
                    module_offset: native.module_offset,
                }
            };
            remember(&mut self.user_frames, key, (process.maps_generation, pending.clone()));
            frames.push(pending);
        }
        process.samples.push(Stored {
            time_ns: sample.time_ns,
            tid: sample.tid,
            weight: sample.weight,
            frames,
        });
    }
}

/// Reads the process's mappings again when `address` is outside them and they are older than
/// [`MAPS_REFRESH`] (they stay `None` once the process is gone before they could be read).
fn refresh_stale_maps(process: &mut Profiled, pid: u32, address: u64) {
    let stale = match &process.maps {
        Some(maps) => {
            maps.mapping(address).is_none() && process.maps_read.elapsed() >= MAPS_REFRESH
        }
        None => process.maps_read.elapsed() >= MAPS_REFRESH,
    };
    if stale {
        process.maps_read = Instant::now();
        if let Ok(maps) = ProcessMaps::read(pid) {
            process.maps = Some(maps);
            process.maps_generation += 1;
        }
    }
}

/// Keeps a named frame, emptying the cache first when it holds [`MAX_NAMED_ADDRESSES`].
fn remember<K: std::hash::Hash + Eq, V>(cache: &mut HashMap<K, V>, key: K, value: V) {
    if cache.len() >= MAX_NAMED_ADDRESSES {
        cache.clear();
    }
    cache.insert(key, value);
}

fn shared_module(modules: &mut HashMap<String, Arc<str>>, name: &str) -> Arc<str> {
    if let Some(m) = modules.get(name) {
        return m.clone();
    }
    let m: Arc<str> = name.into();
    modules.insert(name.to_owned(), m.clone());
    m
}

/// Where JIT code runs: anonymous memory, or W^X's double mapping.
pub(crate) fn holds_jit_code(module: &str) -> bool {
    module == "[anon]"
        || module.starts_with("/memfd:doublemapper")
        || module.starts_with("memfd:doublemapper")
}

/// Samples until `stop`, then names every frame and writes the files.
pub async fn run(
    config: ProfileConfig,
    stop: impl std::future::Future<Output = ()>,
    ready: Option<oneshot::Sender<()>>,
) -> anyhow::Result<ProfileSummary> {
    if config.outputs.is_empty() {
        bail!("no output format asked for");
    }
    let (mut summary, profile) = collect(&config, stop, ready).await?;
    for (format, path) in &config.outputs {
        format.write_file(&profile, path)?;
        summary.files.push(path.clone());
    }
    Ok(summary)
}

/// Samples until `stop` resolves, then names every frame: the profile and its summary
/// (`config.outputs` is not looked at). Dropped before it ends, it stops sampling (the
/// programs detach) and its method sessions stop.
pub async fn collect(
    config: &ProfileConfig,
    stop: impl std::future::Future<Output = ()>,
    ready: Option<oneshot::Sender<()>>,
) -> anyhow::Result<(ProfileSummary, Profile)> {
    config.filter.resolve_prefixes_now()?;
    let mut detector = Detector::attach(&DetectOptions {
        hooks: config.hooks,
        ..DetectOptions::for_targets(&config.target_pids)
    })?;
    let initial: Vec<u32> = Vec::new();
    let mut sampler = Sampler::attach(&SamplerOptions {
        hooks: config.hooks,
        ..match config.mode {
            SampleMode::Cpu { frequency_hz } => {
                SamplerOptions::cpu(frequency_hz, Targets::Processes(initial))
            }
            SampleMode::OffCpu => SamplerOptions::off_cpu(Targets::Processes(initial)),
        }
    })
    .context("starting the kernel sampler")?;
    let kernel =
        KernelSymbols::load().inspect_err(|e| log::warn!("kernel frames stay unnamed: {e:#}")).ok();
    let mode = match config.mode {
        SampleMode::Cpu { frequency_hz } => Mode::Cpu {
            frequency_hz: NonZeroU32::new(u32::try_from(frequency_hz).unwrap_or(u32::MAX))
                .context("a sampling frequency of 0 Hz")?,
        },
        SampleMode::OffCpu => Mode::OffCpu,
    };
    let started_mono = monotonic_ns();
    let mut namer = Namer {
        profile: Profile::new(mode, realtime_ns() as u64),
        kernel,
        native: NativeSymbolizer::new(),
        processes: HashMap::new(),
        kernel_frames: HashMap::new(),
        user_frames: HashMap::new(),
        pending_frames: 0,
        summary: ProfileSummary { mode: Some(config.mode), ..ProfileSummary::default() },
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tracker = ProcessTracker::new(config.filter.clone());
    let mut select =
        |pid: u32, cgroup_id: Option<u64>, namer: &mut Namer, sampler: &mut Sampler| {
            if namer.processes.contains_key(&pid) {
                return;
            }
            let tracked = tracker.lookup(pid, cgroup_id);
            if !tracked.included {
                return;
            }
            let target = match Target::pin(pid) {
                Ok(t) => t,
                Err(e) => return log::warn!("pid {pid}: not profiled: {e}"),
            };
            if let Err(e) = sampler.add_target(pid) {
                return log::warn!("pid {pid}: not profiled: {e:#}");
            }
            let labels = tracked.labels.as_deref();
            let info = crate::profile::ProcessInfo {
                pid,
                process_start_ns: target.incarnation().start_ns.unwrap_or(0),
                name: process_name(pid),
                container_id: labels.and_then(|l| l.container_id.clone()),
                pod_uid: labels.and_then(|l| l.pod_uid.clone()),
            };
            let id = namer.profile.add_process(info);
            let (timeouts, locate_for, drain) =
                (config.timeouts, config.locate_for, config.drain_timeout);
            let stop = stop_rx.clone();
            let methods = tokio::spawn(async move {
                methods::collect(&target, timeouts, locate_for, drain, stop).await
            });
            log::info!("pid {pid}: profiling");
            namer.processes.insert(
                pid,
                Profiled {
                    id,
                    maps: ProcessMaps::read(pid).ok(),
                    maps_read: Instant::now(),
                    maps_generation: 0,
                    modules: HashMap::new(),
                    samples: Vec::new(),
                    methods: Some(methods),
                },
            );
        };

    let found = if config.target_pids.is_empty() {
        procfs::scan_targets(&[]).context("scanning /proc for running .NET processes")?.pids()
    } else {
        config.target_pids.clone()
    };
    for pid in found {
        select(pid, None, &mut namer, &mut sampler);
    }
    log::info!(
        "sampling {} ({} processes so far; new .NET processes are added as they are detected)",
        match config.mode {
            SampleMode::Cpu { frequency_hz } => format!("on-CPU stacks at {frequency_hz} Hz"),
            SampleMode::OffCpu => "off-CPU stretches".to_string(),
        },
        namer.processes.len()
    );
    super::signal_ready(ready);
    let mut detections: Vec<DetectionEvent> = Vec::new();
    let mut samples: Vec<RawSample> = Vec::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            res = detector.read(&mut detections) => {
                res.context("reading the detection ring buffer")?;
                for event in detections.drain(..) {
                    if event.body.finds_a_runtime() {
                        select(event.meta.pid, Some(event.meta.cgroup_id), &mut namer, &mut sampler);
                    }
                }
            }
            res = sampler.read(&mut samples) => {
                res.context("reading the sampler's ring buffer")?;
                for sample in samples.drain(..) {
                    namer.take(sample);
                }
            }
        }
    }
    // Sampling stops first; the method sessions' rundowns then list the code as it is.
    sampler.detach();
    sampler.drain(&mut samples);
    for sample in samples.drain(..) {
        namer.take(sample);
    }
    detector.detach();
    namer.summary.losses = sampler.losses()?;
    let _ = stop_tx.send(true);
    let duration_ns = monotonic_ns() - started_mono;
    Ok(finish(namer, config.drain_timeout + METHOD_SESSION_GRACE, duration_ns).await)
}

/// Sampling frequency of the profiles the metrics endpoint serves (Parca's and Pyroscope's
/// default rate, and `tracer profile`'s).
pub const SERVED_PROFILE_HZ: u64 = 99;

/// The CPU profiles `tracer run --metrics-addr` serves at `/debug/pprof/profile`: of the
/// processes the run selects (its filters), sampled and named as `tracer profile` does it.
#[derive(Debug)]
pub struct ServedProfiles {
    base: ProfileConfig,
}

impl ServedProfiles {
    /// Profiles of the processes `filter` selects; `timeouts`, `locate_for` and `drain_timeout`
    /// of the method sessions, as of the run's sessions.
    pub fn new(
        filter: ProcessFilter,
        hooks: HookChoice,
        timeouts: Timeouts,
        locate_for: Duration,
        drain_timeout: Duration,
    ) -> ServedProfiles {
        let mode = SampleMode::Cpu { frequency_hz: SERVED_PROFILE_HZ };
        let outputs = Vec::new();
        let target_pids = Vec::new();
        ServedProfiles {
            base: ProfileConfig {
                mode,
                target_pids,
                filter,
                hooks,
                outputs,
                timeouts,
                locate_for,
                drain_timeout,
            },
        }
    }

    /// The profile's configuration: the run's, narrowed to the request's processes.
    fn config(&self, request: &ProfileRequest) -> anyhow::Result<ProfileConfig> {
        let mut config = self.base.clone();
        config.target_pids.clone_from(&request.pids);
        if !request.containers.is_empty() {
            config.filter =
                config.filter.narrowed_to_containers(&request.containers).context("container=")?;
        }
        Ok(config)
    }
}

impl ProfileSource for ServedProfiles {
    fn profile(
        &self,
        request: ProfileRequest,
    ) -> Pin<Box<dyn Future<Output = anyhow::Result<Vec<u8>>> + Send>> {
        let config = self.config(&request);
        Box::pin(async move {
            let config = config?;
            let collected = collect(&config, tokio::time::sleep(request.duration), None).await;
            let pprof = collected.and_then(|(_, profile)| {
                let mut pprof = Vec::new();
                Format::Pprof.write(&profile, &mut pprof)?;
                Ok(pprof)
            });
            // A long-running agent: what the sampler, the kernel symbols and the profile took
            // goes back to the kernel, not kept at its peak.
            crate::kernel::release_free_heap();
            pprof
        })
    }
}

/// Waits for the method sessions (within `wait` in all), names the JIT frames, and builds the
/// profile.
async fn finish(mut namer: Namer, wait: Duration, duration_ns: u64) -> (ProfileSummary, Profile) {
    let deadline = Instant::now() + wait;
    let mut processes: Vec<(u32, Profiled)> = namer.processes.drain().collect();
    processes.sort_by_key(|(pid, _)| *pid);
    for (pid, mut process) in processes {
        let collected = match process.methods.take() {
            Some(task) => match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(Ok(collected))) => Ok(collected),
                Ok(Ok(Err(e))) => Err(e.to_string()),
                Ok(Err(e)) => Err(format!("the method session failed: {e}")),
                Err(_) => Err(format!("no method table within {wait:?}")),
            },
            None => Err("no method session".to_string()),
        };
        let (mut table, method_events, rundown_complete, method_error) = match collected {
            Ok(c) => (c.table, c.events, c.rundown_complete, None),
            Err(e) => (Default::default(), 0, false, Some(e)),
        };
        let mut stack: Vec<FrameId> = Vec::new();
        for stored in process.samples {
            let time = stored.time_ns;
            let resolved: Vec<Resolved> = stored
                .frames
                .into_iter()
                .map(|pending| match pending {
                    Pending::Named(id) => Resolved::Id(id),
                    Pending::User { address, module, module_offset } => {
                        match table.lookup(address, time) {
                            Some(method) => Resolved::Managed(method),
                            None => Resolved::Unnamed { module, module_offset },
                        }
                    }
                })
                .collect();
            stack.clear();
            let mut osr = OsrFrames::default();
            for frame in resolved {
                let method = match &frame {
                    Resolved::Managed(m) => Some(m),
                    _ => None,
                };
                if !osr.shows(method) {
                    continue;
                }
                let frame = match frame {
                    Resolved::Id(id) => {
                        stack.push(id);
                        continue;
                    }
                    Resolved::Managed(m) => {
                        Frame::named(FrameKind::Managed, &m.name, m.module.as_deref())
                    }
                    Resolved::Unnamed { module, module_offset } => {
                        let kind = match holds_jit_code(&module) {
                            true => FrameKind::Managed,
                            false => FrameKind::Native,
                        };
                        Frame::unnamed(kind, Some(&module), module_offset)
                    }
                };
                stack.push(namer.profile.intern_frame(frame));
            }
            namer.profile.add_sample(process.id, stored.tid, &stack, stored.weight);
        }
        let info = namer.profile.process(process.id).info();
        namer.summary.processes.push(ProcessReport {
            pid,
            process_start_ns: Some(info.process_start_ns).filter(|&s| s != 0),
            name: info.name.clone(),
            summary: namer.profile.summary(process.id),
            method_events,
            rundown_complete,
            method_error,
        });
    }
    namer.profile.set_duration_ns(duration_ns);
    namer.summary.native_refusals = namer.native.counters().refusals();
    namer.summary.limits = namer.profile.limit_counts();
    (namer.summary, namer.profile)
}

/// What to call a process: its `comm` (its command line may hold secrets).
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| format!("pid {pid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_address_cache_starts_over_when_full() {
        let mut cache = HashMap::new();
        for address in 0..MAX_NAMED_ADDRESSES as u64 {
            remember(&mut cache, address, ());
        }
        assert_eq!(cache.len(), MAX_NAMED_ADDRESSES);
        remember(&mut cache, u64::MAX, ());
        assert_eq!(cache.len(), 1);
        assert!(cache.contains_key(&u64::MAX));
    }
}
