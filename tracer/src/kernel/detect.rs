//! Loads and attaches the detection programs (`tracer-ebpf`) — the syscall hooks on BPF
//! trampolines where the kernel allows them, else on syscall tracepoints — reads their ring
//! buffer through tokio, and reports every kind of loss: ring reservation failures and failed
//! reads (per-CPU counters), sequence gaps, and program runs the kernel skipped
//! (`recursion_misses`). Loading and attaching programs is `super::bpf_programs`' (the sampler
//! shares it).
use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::{BtfTracePoint, FExit, Iter};
use aya::{Ebpf, EbpfLoader};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracer_common::{COUNTERS_LEN, Config, EventKind, LossReason};

pub use crate::kernel::bpf_programs::ProgramStats;
use crate::kernel::bpf_programs::{
    Link, attach_btf_typed, attach_classic, field_offset, load_error, loaded_program_stats,
    map_mut, with_kernel_btf,
};
use crate::kernel::btf::{AttachTarget, KernelOffsets};
use crate::kernel::privileges::require_bpf_tracing;
use crate::kernel::threads::ThreadTable;
use crate::kernel::tracefs::Tracefs;
use crate::time::PeriodicTimer;
use tracer_decode::bpf_event::{self, DetectionEvent, ExistingEnablers};
use tracer_decode::ftrace::format::DynamicKind;

/// What a syscall hook needs from the kernel to be worth attaching.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Needs {
    Nothing,
    /// The memfd hooks follow kernel structs to a file's name (offsets from kernel BTF).
    KernelBtf,
    /// The ioctl hooks see only user_events registrations (`user_events_data` in tracefs).
    UserEvents,
}

/// One detection on syscalls, by either mechanism: its syscall tracepoint programs (each
/// attached to the tracepoint of its own name, category `syscalls`), or one fexit program on
/// a kernel function (docs/protocol/bpf-detection.md §8).
#[derive(Clone, Copy, Debug)]
pub struct SyscallHook {
    /// The syscall it watches, for logs and `tracer check`.
    pub syscall: &'static str,
    pub tracepoints: &'static [&'static str],
    /// (program, kernel function).
    pub trampoline: (&'static str, &'static str),
    needs: Needs,
}

/// Every syscall hook of the object.
pub const SYSCALL_HOOKS: [SyscallHook; 4] = [
    SyscallHook {
        syscall: "memfd_create",
        tracepoints: &["sys_enter_memfd_create"],
        trampoline: ("fexit_memfd_create", "__x64_sys_memfd_create"),
        needs: Needs::KernelBtf,
    },
    SyscallHook {
        syscall: "mmap",
        tracepoints: &["sys_enter_mmap"],
        trampoline: ("fexit_mmap", "__x64_sys_mmap"),
        needs: Needs::KernelBtf,
    },
    SyscallHook {
        syscall: "bind",
        tracepoints: &["sys_enter_bind"],
        trampoline: ("fexit_bind", "__x64_sys_bind"),
        needs: Needs::Nothing,
    },
    SyscallHook {
        syscall: "ioctl",
        tracepoints: &["sys_enter_ioctl", "sys_exit_ioctl"],
        trampoline: ("fexit_ioctl", "__x64_sys_ioctl"),
        needs: Needs::UserEvents,
    },
];

/// One process-lifecycle hook: a tracepoint, and the two programs that can watch it.
#[derive(Clone, Copy, Debug)]
pub struct LifecycleHook {
    pub category: &'static str,
    pub tracepoint: &'static str,
    /// On the classic tracepoint (reads the event's record).
    pub program: &'static str,
    /// On the BTF-typed tracepoint (`tp_btf`: reads the kernel's arguments, no record built).
    pub btf_program: &'static str,
    /// The `tp_btf` program for kernels whose `sched_process_exit` also passes `group_dead`
    /// (the verifier refuses a program reading an argument the prototype lacks).
    pub btf_group_dead_program: Option<&'static str>,
}

/// The process lifecycle hooks. Not syscall tracepoints, so they put no task on the syscall
/// slow path; their `tp_btf` twins also spare every fork, exec and exit of the machine the
/// building of the tracepoint's record.
pub const LIFECYCLE_HOOKS: [LifecycleHook; 4] = [
    LifecycleHook {
        category: "task",
        tracepoint: "task_newtask",
        program: "task_newtask",
        btf_program: "btf_task_newtask",
        btf_group_dead_program: None,
    },
    LifecycleHook {
        category: "sched",
        tracepoint: "sched_process_fork",
        program: "sched_process_fork",
        btf_program: "btf_sched_process_fork",
        btf_group_dead_program: None,
    },
    LifecycleHook {
        category: "sched",
        tracepoint: "sched_process_exec",
        program: "sched_process_exec",
        btf_program: "btf_sched_process_exec",
        btf_group_dead_program: None,
    },
    LifecycleHook {
        category: "sched",
        tracepoint: "sched_process_exit",
        program: "sched_process_exit",
        btf_program: "btf_sched_process_exit",
        btf_group_dead_program: Some("btf_sched_process_exit_group"),
    },
];

/// (category, name) of every tracepoint a program of the object may attach to.
pub fn tracepoints() -> impl Iterator<Item = (&'static str, &'static str)> {
    SYSCALL_HOOKS
        .iter()
        .flat_map(|hook| hook.tracepoints.iter().map(|name| ("syscalls", *name)))
        .chain(LIFECYCLE_HOOKS.iter().map(|hook| (hook.category, hook.tracepoint)))
}

/// Which mechanism the hooks use (`--hooks`, whose values `cli` names and explains).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HookChoice {
    /// The BTF-typed programs where they load, else classic tracepoints, each hook set on its own.
    #[default]
    Auto,
    /// The BTF-typed programs or fail.
    Trampolines,
    /// Classic tracepoints only.
    SyscallTracepoints,
}

/// The mechanism the syscall hooks run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookMechanism {
    /// fexit programs on BPF trampolines: only the hooked kernel functions pay for them.
    Trampolines,
    /// Syscall tracepoints: while any is attached, every syscall of every process takes the
    /// kernel's traced slow path. `why`: why the trampolines are not used.
    SyscallTracepoints { why: String },
}

impl HookMechanism {
    /// The name in logs, summaries and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            HookMechanism::Trampolines => "trampolines",
            HookMechanism::SyscallTracepoints { .. } => "syscall_tracepoints",
        }
    }
}

impl std::fmt::Display for HookMechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HookMechanism::Trampolines => {
                f.write_str("BPF trampolines (fexit): only the hooked functions pay")
            }
            HookMechanism::SyscallTracepoints { why } => write!(
                f,
                "syscall tracepoints (every syscall of every process pays a few tens of ns): {why}"
            ),
        }
    }
}

/// The mechanism the process-lifecycle hooks run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LifecycleMechanism {
    /// `tp_btf` programs: the kernel's arguments, no tracepoint record built.
    BtfTracepoints,
    /// Classic tracepoints: the kernel builds each event's record for the program. `why`: why
    /// the BTF tracepoints are not used.
    Tracepoints { why: String },
}

impl LifecycleMechanism {
    /// The name in logs and summaries.
    pub fn name(&self) -> &'static str {
        match self {
            LifecycleMechanism::BtfTracepoints => "btf_tracepoints",
            LifecycleMechanism::Tracepoints { .. } => "tracepoints",
        }
    }
}

impl std::fmt::Display for LifecycleMechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LifecycleMechanism::BtfTracepoints => f.write_str("BTF tracepoints (tp_btf)"),
            LifecycleMechanism::Tracepoints { why } => write!(f, "classic tracepoints: {why}"),
        }
    }
}

/// How long an event submitted without a wake-up (process lifecycle, memfd creation,
/// user_events registrations) may wait in the ring: the reader drains it this often. Detections
/// wake the reader at once, and so does a burst of lazy events (`LAZY_WAKEUP_BYTES` in the
/// programs); docs/protocol/bpf-detection.md "Wake-ups".
pub const LAZY_DRAIN_INTERVAL: Duration = Duration::from_millis(100);

/// The task iterator reporting user_events registrations made before tracer started.
const ENABLERS_ITERATOR: &str = "user_events_enablers";
/// Most bytes of the task iterator's output read (~100 000 registrations); past them the rest is
/// not read, and the log says so.
pub const MAX_ENABLER_OUTPUT_BYTES: usize = 16 << 20;

#[derive(Clone, Debug)]
pub struct DetectOptions {
    /// Report only these processes (and their descendants); empty = every process.
    pub target_pids: Vec<u32>,
    /// How often the ring is drained of events submitted without a wake-up
    /// ([`LAZY_DRAIN_INTERVAL`]); above zero.
    pub lazy_drain: Duration,
    pub hooks: HookChoice,
}

impl DetectOptions {
    /// Every process, or only `target_pids` and their descendants.
    pub fn for_targets(target_pids: &[u32]) -> DetectOptions {
        DetectOptions {
            target_pids: target_pids.to_vec(),
            lazy_drain: LAZY_DRAIN_INTERVAL,
            hooks: HookChoice::Auto,
        }
    }
}

/// The detection programs, loaded and attached, and their ring buffer.
pub struct Detector {
    ebpf: Ebpf,
    ring: AsyncFd<RingBuf<MapData>>,
    /// Drains what the programs submitted without waking the reader (lifecycle events).
    lazy_drain: PeriodicTimer,
    links: Vec<(&'static str, Link)>,
    /// The programs attached at start; still loaded (their statistics readable) after `detach`.
    programs: Vec<&'static str>,
    mechanism: HookMechanism,
    lifecycle: LifecycleMechanism,
    /// Whether the task iterator can walk to user_events enablers (offsets in CONFIG), or why not.
    enablers: Result<(), String>,
    seq: SeqTracker,
    decode_errors: u64,
}

/// One nonzero loss counter (summed over nothing: one CPU, one kind, one reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loss {
    pub cpu: u32,
    pub kind: EventKind,
    pub reason: LossReason,
    pub count: u64,
}

impl Detector {
    /// Checks privileges, loads the object, writes the configuration and target maps, and
    /// attaches every program. Errors say what is missing and what to do.
    pub fn attach(options: &DetectOptions) -> anyhow::Result<Detector> {
        require_bpf_tracing()?;
        let tracefs = Tracefs::find_or_mount()?;
        // The classic tracepoints are needed only where the BTF-typed programs do not run
        // (`attach_syscall_hooks`, `attach_lifecycle_hooks`).
        let offsets = crate::kernel::btf::kernel_offsets();
        // Without kernel BTF no file name can be resolved: the memfd programs stay off and
        // the diagnostic socket (bind) detection still finds every runtime.
        if let Err(e) = &offsets.memfd {
            log::warn!(
                "{e}: the .NET memfd mapping detection stays off (runtimes are still found by \
                 their diagnostic socket)"
            );
        }
        let config = Config {
            tracer_tgid: std::process::id(),
            filter_targets: u32::from(!options.target_pids.is_empty()),
            ..config_offsets(&tracefs, offsets.config)?
        };
        let mut ebpf = load_object(config)?;
        {
            let mut targets = HashMap::<_, u32, u8>::try_from(map_mut(&mut ebpf, "TARGETS")?)?;
            for pid in &options.target_pids {
                targets
                    .insert(pid, 1, 0)
                    .with_context(|| format!("adding pid {pid} to TARGETS"))?;
            }
        }
        {
            // Targets are tracked from the start so their fork/exec/exit are reported too.
            let mut tracked = HashMap::<_, u32, u8>::try_from(map_mut(&mut ebpf, "TRACKED")?)?;
            for pid in &options.target_pids {
                tracked
                    .insert(pid, 1, 0)
                    .with_context(|| format!("adding pid {pid} to TRACKED"))?;
            }
        }

        let ring =
            RingBuf::try_from(ebpf.take_map("EVENTS").ok_or_else(|| anyhow!("no EVENTS map"))?)?;
        // SAFETY: `ring` owns its map fd, which stays open until the AsyncFd is dropped.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
            .context("registering the BPF ring buffer with tokio")?;

        // Every ioctl of every process pays for an attached ioctl pair; without
        // user_events_data no registration can happen, so they are not attached.
        let user_events = user_events_available(&tracefs);
        if !user_events {
            log::info!(
                "this kernel has no user_events (no {}): the ioctl hooks stay off",
                tracefs.path("user_events_data").display()
            );
        }
        let hooks = wanted_hooks(offsets.memfd.is_ok(), user_events);
        let btf = attach_btf_programs(&mut ebpf, &hooks, options.hooks, &offsets)?;
        let (mut links, mechanism) =
            attach_syscall_hooks(&mut ebpf, &tracefs, &hooks, btf.syscalls)?;
        let (lifecycle_links, lifecycle) =
            attach_lifecycle_hooks(&mut ebpf, &tracefs, btf.lifecycle)?;
        links.extend(lifecycle_links);
        log::info!(
            "detection hooks on {}: {mechanism}",
            hooks.iter().map(|h| h.syscall).collect::<Vec<_>>().join(", ")
        );
        log::info!("process lifecycle hooks: {lifecycle}");
        let lazy_drain =
            PeriodicTimer::new(options.lazy_drain).context("starting the lazy-drain timer")?;
        Ok(Detector {
            ebpf,
            ring,
            lazy_drain,
            programs: links.iter().map(|(name, _)| *name).collect(),
            links,
            mechanism,
            lifecycle,
            enablers: offsets.enablers,
            seq: SeqTracker::default(),
            decode_errors: 0,
        })
    }

    /// The programs attached (the ioctl hook only on kernels with user_events, the memfd
    /// hooks only with kernel BTF; trampoline or tracepoint programs by the mechanism).
    pub fn attached(&self) -> &[&'static str] {
        &self.programs
    }

    /// The mechanism the syscall hooks run on.
    pub fn mechanism(&self) -> &HookMechanism {
        &self.mechanism
    }

    /// The mechanism the process-lifecycle hooks run on.
    pub fn lifecycle(&self) -> &LifecycleMechanism {
        &self.lifecycle
    }

    /// The user_events registrations processes held when tracer started, read once by the
    /// task iterator (docs/protocol/bpf-detection.md §9). An error says why the kernel cannot
    /// tell (no user_events, no BTF for their structs, BPF iterators refused).
    pub fn existing_registrations(&mut self) -> anyhow::Result<ExistingEnablers> {
        use std::io::Read as _;
        self.enablers.clone().map_err(anyhow::Error::msg)?;
        let program: &mut Iter = self
            .ebpf
            .program_mut(ENABLERS_ITERATOR)
            .ok_or_else(|| anyhow!("the BPF object has no program {ENABLERS_ITERATOR}"))?
            .try_into()?;
        with_kernel_btf("the task iterator", &[AttachTarget::iterator("task")], |btf| {
            program.load("task", btf).map_err(|e| load_error(ENABLERS_ITERATOR, e))
        })?;
        let id = program.attach().context("attaching the task iterator")?;
        let file = program.take_link(id)?.into_file().context("opening the task iterator")?;
        // Reading runs the program over every task.
        let mut out = Vec::new();
        file.take(MAX_ENABLER_OUTPUT_BYTES as u64 + 1)
            .read_to_end(&mut out)
            .context("reading the task iterator")?;
        let cut = out.len() > MAX_ENABLER_OUTPUT_BYTES;
        if cut {
            let whole = MAX_ENABLER_OUTPUT_BYTES / bpf_event::ENABLER_RECORD_LEN;
            out.truncate(whole * bpf_event::ENABLER_RECORD_LEN);
            log::warn!(
                "more user_events registrations than the {MAX_ENABLER_OUTPUT_BYTES} bytes of \
                 iterator output read: the first {whole} are tabled"
            );
        }
        let mut found = bpf_event::decode_enablers(&out)?;
        found.output_cut = cut;
        Ok(found)
    }

    /// Waits until the kernel wakes the reader (a detection, or a burst of lazy events) or
    /// [`LAZY_DRAIN_INTERVAL`] passed, then decodes every record in the ring into `out`.
    /// Cancel-safe: the timer keeps its schedule across calls.
    pub async fn read(&mut self, out: &mut Vec<DetectionEvent>) -> io::Result<()> {
        tokio::select! {
            guard = self.ring.readable_mut() => guard?.clear_ready(),
            tick = self.lazy_drain.tick() => tick?,
        }
        drain_ring(self.ring.get_mut(), &mut self.seq, &mut self.decode_errors, out);
        Ok(())
    }

    /// The kernel's record of the threads of processes with user_events sessions (the
    /// lifecycle programs keep it); `None` once taken.
    pub fn take_thread_table(&mut self) -> Option<anyhow::Result<ThreadTable>> {
        let sessions = self.ebpf.take_map("SESSION_PROCESSES")?;
        let threads = self.ebpf.take_map("THREADS")?;
        Some(ThreadTable::new(sessions, threads))
    }

    /// Decodes every record already in the ring without waiting.
    pub fn drain(&mut self, out: &mut Vec<DetectionEvent>) {
        drain_ring(self.ring.get_mut(), &mut self.seq, &mut self.decode_errors, out);
    }

    /// Detaches every program: no event is produced after this returns.
    pub fn detach(&mut self) {
        self.links.clear();
    }

    /// Nonzero loss counters per CPU, event kind and reason.
    pub fn losses(&self) -> anyhow::Result<Vec<Loss>> {
        let map = self.ebpf.map("COUNTERS").ok_or_else(|| anyhow!("no COUNTERS map"))?;
        let counters = PerCpuArray::<_, u64>::try_from(map)?;
        let mut out = Vec::new();
        for kind in EventKind::ALL {
            for reason in LossReason::ALL {
                let index = LossReason::counter_index(kind, reason);
                debug_assert!(index < COUNTERS_LEN);
                let per_cpu = counters.get(&index, 0).context("reading COUNTERS")?;
                for (cpu, &count) in per_cpu.iter().enumerate() {
                    if count != 0 {
                        out.push(Loss { cpu: cpu as u32, kind, reason, count });
                    }
                }
            }
        }
        Ok(out)
    }

    /// Events missing from the per-(CPU, kind) sequence numbers seen so far.
    pub fn seq_gaps(&self) -> &SeqTracker {
        &self.seq
    }

    /// Ring records that failed to decode (each was logged).
    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
    }

    /// Run statistics of every attached program, by program name.
    pub fn program_stats(&self) -> anyhow::Result<Vec<(&'static str, ProgramStats)>> {
        loaded_program_stats(&self.ebpf, &self.programs)
    }
}

/// Run statistics of the loaded programs `names` of `ebpf`, by program name.
fn drain_ring(
    ring: &mut RingBuf<MapData>,
    seq: &mut SeqTracker,
    decode_errors: &mut u64,
    out: &mut Vec<DetectionEvent>,
) {
    while let Some(item) = ring.next() {
        match bpf_event::decode(&item) {
            Ok(event) => {
                seq.observe(event.meta.cpu, event.meta.kind, event.meta.seq);
                out.push(event);
            }
            Err(e) => {
                *decode_errors += 1;
                log::warn!("corrupt BPF ring record ({} bytes) skipped: {e}", item.len());
            }
        }
    }
}

/// The embedded object, loaded, with `config` in its `CONFIG` map.
fn load_object(config: Config) -> anyhow::Result<Ebpf> {
    // Without BTF relocations: the programs use no CO-RE relocations (the few kernel offsets
    // they need come in CONFIG). `EbpfLoader::new` parses the kernel's BTF all the same
    // (docs/protocol/bpf-detection.md §8); `.btf(None)` drops that parse here.
    let mut ebpf = EbpfLoader::new()
        .btf(None)
        .load(crate::EBPF_OBJECT)
        .context("loading the embedded BPF object")?;
    Array::<_, Config>::try_from(map_mut(&mut ebpf, "CONFIG")?)?
        .set(0, config, 0)
        .context("writing the CONFIG map")?;
    Ok(ebpf)
}

/// The BTF-typed programs attached (each set whole), or why a set is not.
struct BtfPrograms {
    /// The syscall hooks' trampolines.
    syscalls: Result<Vec<(&'static str, Link)>, String>,
    /// The lifecycle hooks' `tp_btf` programs.
    lifecycle: Result<Vec<(&'static str, Link)>, String>,
}

/// Loads and attaches the BTF-typed programs `choice` allows, with one parse of kernel BTF:
/// the trampolines of `hooks` and the lifecycle hooks' `tp_btf` programs, each set whole or
/// not at all. An error only when `--hooks trampolines` insists and the kernel refuses.
fn attach_btf_programs(
    ebpf: &mut Ebpf,
    hooks: &[SyscallHook],
    choice: HookChoice,
    offsets: &KernelOffsets,
) -> anyhow::Result<BtfPrograms> {
    if choice == HookChoice::SyscallTracepoints {
        let why = || Err("chosen with --hooks syscall-tracepoints".to_string());
        return Ok(BtfPrograms { syscalls: why(), lifecycle: why() });
    }
    let needs = |group: &Result<(), String>| group.clone().map_err(anyhow::Error::msg);
    let targets: Vec<AttachTarget> = trampolines(hooks)
        .map(|(_, function)| AttachTarget::function(function))
        .chain(
            lifecycle_programs(offsets.exit_group_dead).map(|(_, tp)| AttachTarget::tracepoint(tp)),
        )
        .collect();
    let attempts = with_kernel_btf("the BTF-typed programs", &targets, |btf| {
        let syscalls =
            needs(&offsets.syscall_args).and_then(|()| attach_trampolines(ebpf, hooks, btf));
        let lifecycle = needs(&offsets.lifecycle)
            .and_then(|()| attach_btf_tracepoints(ebpf, btf, offsets.exit_group_dead));
        Ok((syscalls, lifecycle))
    });
    let (syscalls, lifecycle) = match attempts {
        Ok(both) => both,
        Err(e) => (Err(anyhow!("{e:#}")), Err(e)),
    };
    let decide = |attached: anyhow::Result<_>, what: &str, fallback: &str| match attached {
        Ok(links) => Ok(Ok(links)),
        Err(e) if choice == HookChoice::Trampolines => Err(e.context(format!(
            "--hooks trampolines: the kernel refused the {what} (--hooks auto falls back to \
             {fallback})"
        ))),
        Err(e) => Ok(Err(format!("{what} refused: {e:#}"))),
    };
    Ok(BtfPrograms {
        syscalls: decide(syscalls, "BPF trampolines", "syscall tracepoints")?,
        lifecycle: decide(lifecycle, "BTF tracepoints", "classic tracepoints")?,
    })
}

/// Attaches `hooks`: on their trampolines when those are attached, else on syscall tracepoints
/// (saying why).
fn attach_syscall_hooks(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    hooks: &[SyscallHook],
    trampolines: Result<Vec<(&'static str, Link)>, String>,
) -> anyhow::Result<(Vec<(&'static str, Link)>, HookMechanism)> {
    let why = match trampolines {
        Ok(links) => return Ok((links, HookMechanism::Trampolines)),
        Err(why) => why,
    };
    let programs = hooks.iter().flat_map(|h| h.tracepoints.iter().map(|n| (*n, "syscalls", *n)));
    let links =
        attach_classic(ebpf, tracefs, programs.collect(), || format!("no trampolines ({why})"))?;
    Ok((links, HookMechanism::SyscallTracepoints { why }))
}

/// Attaches the lifecycle hooks: their `tp_btf` programs when those are attached, else the
/// classic tracepoint programs (saying why).
fn attach_lifecycle_hooks(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    btf_tracepoints: Result<Vec<(&'static str, Link)>, String>,
) -> anyhow::Result<(Vec<(&'static str, Link)>, LifecycleMechanism)> {
    let why = match btf_tracepoints {
        Ok(links) => return Ok((links, LifecycleMechanism::BtfTracepoints)),
        Err(why) => why,
    };
    let programs = LIFECYCLE_HOOKS.iter().map(|h| (h.program, h.category, h.tracepoint));
    let links = attach_classic(ebpf, tracefs, programs.collect(), || {
        format!("no BTF tracepoints ({why})")
    })?;
    Ok((links, LifecycleMechanism::Tracepoints { why }))
}

/// What `--hooks auto` runs on with this kernel, found the way `Detector::attach` finds it:
/// the BTF-typed programs this kernel would get are loaded and attached (with an empty target
/// set, so nothing is reported), then detached. `offsets`: the kernel's BTF offsets, as
/// `crate::kernel::btf::kernel_offsets` reads them.
pub fn probe_mechanism(
    offsets: &KernelOffsets,
) -> anyhow::Result<(HookMechanism, LifecycleMechanism)> {
    let tracefs = Tracefs::find_or_mount()?;
    let config = Config { tracer_tgid: std::process::id(), filter_targets: 1, ..offsets.config };
    let mut ebpf = load_object(config)?;
    let hooks = wanted_hooks(offsets.memfd.is_ok(), user_events_available(&tracefs));
    let btf = attach_btf_programs(&mut ebpf, &hooks, HookChoice::Auto, offsets)?;
    let syscalls = match btf.syscalls {
        Ok(_links) => HookMechanism::Trampolines,
        Err(why) => HookMechanism::SyscallTracepoints { why },
    };
    let lifecycle = match btf.lifecycle {
        Ok(_links) => LifecycleMechanism::BtfTracepoints,
        Err(why) => LifecycleMechanism::Tracepoints { why },
    };
    Ok((syscalls, lifecycle))
}

fn user_events_available(tracefs: &Tracefs) -> bool {
    tracefs.path("user_events_data").exists()
}

/// The syscall hooks worth attaching on this kernel.
fn wanted_hooks(kernel_btf: bool, user_events: bool) -> Vec<SyscallHook> {
    SYSCALL_HOOKS
        .into_iter()
        .filter(|hook| match hook.needs {
            Needs::Nothing => true,
            Needs::KernelBtf => kernel_btf,
            Needs::UserEvents => user_events,
        })
        .collect()
}

/// Loads and attaches the fexit program of every hook; on the first refusal the ones
/// attached so far are detached (dropped) and the error says which program and function.
fn attach_trampolines(
    ebpf: &mut Ebpf,
    hooks: &[SyscallHook],
    btf: &aya::Btf,
) -> anyhow::Result<Vec<(&'static str, Link)>> {
    if !cfg!(target_arch = "x86_64") {
        bail!("the trampoline programs hook x86-64 syscall functions (__x64_sys_*)");
    }
    attach_btf_typed::<FExit>(ebpf, btf, trampolines(hooks), "a trampoline on")
}

/// (program, kernel function) of each hook's trampoline.
fn trampolines(hooks: &[SyscallHook]) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
    hooks.iter().map(|hook| hook.trampoline)
}

/// Loads and attaches the `tp_btf` program of every lifecycle hook (the exit one for this
/// kernel's prototype); on the first refusal the ones attached so far are detached (dropped).
fn attach_btf_tracepoints(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    exit_group_dead: bool,
) -> anyhow::Result<Vec<(&'static str, Link)>> {
    attach_btf_typed::<BtfTracePoint>(ebpf, btf, lifecycle_programs(exit_group_dead), "tp_btf")
}

/// (program, tracepoint) of each lifecycle hook's `tp_btf` program (the exit one for this
/// kernel's prototype).
fn lifecycle_programs(exit_group_dead: bool) -> impl Iterator<Item = (&'static str, &'static str)> {
    LIFECYCLE_HOOKS.iter().map(move |hook| {
        let program = match hook.btf_group_dead_program {
            Some(program) if exit_group_dead => program,
            _ => hook.btf_program,
        };
        (program, hook.tracepoint)
    })
}

/// `base` with the field offsets of the sched/task tracepoints, read from their format files and
/// checked against the layouts the programs expect (they read them with fixed-size loads).
fn config_offsets(tracefs: &Tracefs, base: Config) -> anyhow::Result<Config> {
    let newtask = tracefs.event_format("task", "task_newtask")?;
    let fork = tracefs.event_format("sched", "sched_process_fork")?;
    let exec = tracefs.event_format("sched", "sched_process_exec")?;
    let exit = tracefs.event_format("sched", "sched_process_exit")?;
    // Older kernels lack `group_dead`; the programs then read the thread group's live count
    // (offsets from kernel BTF), or without it take the leader's exit as the process's.
    let exit_group_dead_offset = match exit.field("group_dead") {
        Some(_) => field_offset(&exit, "group_dead", 1, None)?,
        None => {
            if base.task_signal_offset == 0 {
                log::warn!(
                    "sched_process_exit has no group_dead and kernel BTF gave no \
                     task_struct.signal/signal_struct.live: a process whose leader exits before \
                     its other threads is reported gone at the leader's exit"
                );
            }
            0
        }
    };
    Ok(Config {
        fork_child_pid_offset: field_offset(&fork, "child_pid", 4, None)?,
        newtask_pid_offset: field_offset(&newtask, "pid", 4, None)?,
        newtask_clone_flags_offset: field_offset(&newtask, "clone_flags", 8, None)?,
        exec_filename_offset: field_offset(&exec, "filename", 4, Some(DynamicKind::DataLoc))?,
        exec_old_pid_offset: field_offset(&exec, "old_pid", 4, None)?,
        exit_group_dead_offset,
        ..base
    })
}

/// Counts events missing from per-(CPU, kind) sequence numbers. The programs start every
/// sequence at 0 and may be preempted between taking a number and reserving, so records of one
/// CPU can arrive out of order: the count of missing events is (highest + 1) − received.
#[derive(Clone, Debug, Default)]
pub struct SeqTracker {
    /// (cpu, kind wire value) → (highest seq seen, events received)
    seen: BTreeMap<(u32, u32), (u64, u64)>,
}

impl SeqTracker {
    pub fn observe(&mut self, cpu: u32, kind: EventKind, seq: u64) {
        let e = self.seen.entry((cpu, kind as u32)).or_insert((seq, 0));
        e.0 = e.0.max(seq);
        e.1 += 1;
    }

    /// Missing events per (cpu, kind); only nonzero entries.
    pub fn gaps(&self) -> Vec<(u32, EventKind, u64)> {
        self.seen
            .iter()
            .filter_map(|(&(cpu, kind), &(max, received))| {
                let missing = (max + 1).saturating_sub(received);
                if missing == 0 {
                    return None;
                }
                Some((cpu, EventKind::from_u32(kind)?, missing))
            })
            .collect()
    }

    pub fn total(&self) -> u64 {
        self.gaps().iter().map(|g| g.2).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_gaps_tolerate_reordering() {
        let mut t = SeqTracker::default();
        for seq in [0, 2, 1, 3] {
            t.observe(0, EventKind::ProcessExit, seq);
        }
        assert_eq!(t.total(), 0);
        t.observe(1, EventKind::ProcessExit, 0);
        t.observe(1, EventKind::ProcessExit, 4);
        t.observe(0, EventKind::DotnetIpcReady, 1);
        assert_eq!(
            t.gaps(),
            vec![(0, EventKind::DotnetIpcReady, 1), (1, EventKind::ProcessExit, 3)]
        );
        assert_eq!(t.total(), 4);
    }
}
