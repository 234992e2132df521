//! Sampling for `tracer profile` (docs/protocol/profiling.md "Sampling in the kernel").
//!
//! * `sample_cpu`: a perf_event program on each CPU's cpu-clock event. At each tick, if the
//!   interrupted thread belongs to a sampled process, it sends one record to the sample ring:
//!   time, thread, CPU and the frames of its user and kernel stacks (`bpf_get_stack`), or their
//!   errors. Nearly every tick of JIT-compiled code is a stack of its own, so a sample carries
//!   its frames: nothing is shared between samples that could fill up or collide.
//! * `sched_switch` (classic tracepoint) and `btf_sched_switch` (`tp_btf`, where the kernel
//!   loads it), one body: a sampled thread switching out blocked leaves its stacks and the time
//!   in `BLOCKED_THREADS`; when it switches in again the stretch goes to the ring, weighted by
//!   its length.
//!
//! Off-CPU stacks are stored in one of two stack maps (they must outlive the stretch, and a
//! thread blocks at few distinct places), by the stack epoch user space sets: it reads a stack
//! the first time it sees its id, moves the programs to the other map once this one fills, and
//! clears the old one when no record can name it any more. Every loss is counted per CPU, per
//! sample kind and reason (`SAMPLE_LOSSES`).
use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_smp_processor_id, bpf_get_stack,
        bpf_ktime_get_ns,
    },
    macros::{btf_tracepoint, map, perf_event, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{
        BtfTracePointContext, PerfEventContext, TracePointContext, tracing::StackIdContext,
    },
};
use tracer_common::sampling::{
    BLOCKED_THREAD_ENTRIES, BlockedThread, CPU_SAMPLE_HEADER_BYTES, CpuSampleBuffer,
    CpuSampleHeader, MAX_PROFILE_TARGETS, NO_STACK, OffCpuRecord, SAMPLE_LOSS_COUNTERS,
    SAMPLE_RING_BYTES, STACK_BYTES, STACK_MAP_ENTRIES, SampleKind, SampleLoss, SamplerConfig,
};

use crate::shared::{self, kernel_value_at};

#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(SAMPLE_RING_BYTES, 0);

/// Bytes waiting past which a sample wakes the reader: a quarter of the ring. Samples are not
/// wanted at once, so below it they wake nobody and user space drains the ring on a timer.
const LAZY_WAKEUP_BYTES: u64 = SAMPLE_RING_BYTES as u64 / 4;

/// Where `sample_cpu` assembles its record before copying the part used to the ring: one per
/// CPU, used by one run at a time (the program runs from the CPU's timer interrupt, and the
/// kernel skips a perf-event program while another runs on the CPU: `bpf_prog_active`).
#[map]
static CPU_SAMPLE_BUFFER: PerCpuArray<CpuSampleBuffer> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU loss counters, indexed by `SampleLoss::counter_index(kind, reason)`.
#[map]
static SAMPLE_LOSSES: PerCpuArray<u64> = PerCpuArray::with_max_entries(SAMPLE_LOSS_COUNTERS, 0);

#[map]
static SAMPLER_CONFIG: Array<SamplerConfig> = Array::with_max_entries(1, 0);

/// The stack epoch (index 0), written by user space: off-CPU stacks are taken into
/// `STACKS_EVEN` while it is even, `STACKS_ODD` while odd, and every stretch names the epoch of
/// its ids.
#[map]
static STACK_EPOCH: Array<u32> = Array::with_max_entries(1, 0);

/// The processes sampled (tgid → 1) unless `SamplerConfig::all_processes`; written by user space.
#[map]
static PROFILE_TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_PROFILE_TARGETS, 0);

/// Off-CPU: stack id → frames (`bpf_get_stackid`): one stack per hash bucket, identical stacks
/// share an id. A stack whose bucket another holds is not stored (`-EEXIST`, counted), so user
/// space empties a map once the programs have moved to the other one. (Cut to one entry when
/// CPUs are sampled.)
#[map]
static STACKS_EVEN: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);
#[map]
static STACKS_ODD: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);

/// Thread id → when and where a sampled thread switched out blocked, until it switches in.
/// Full = counted loss.
#[map]
static BLOCKED_THREADS: HashMap<u32, BlockedThread> =
    HashMap::with_max_entries(BLOCKED_THREAD_ENTRIES, 0);

/// `bpf_get_stack(id)` flag: the user stack (else the kernel's).
const BPF_F_USER_STACK: u64 = 1 << 8;
/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = 17;
const EFAULT: i32 = 14;
/// `task_struct.flags` of threads without a user stack to take: kernel threads and user workers
/// (io_uring's), for which the kernel returns none, and exiting threads, whose user memory may
/// already be gone.
const PF_KTHREAD: u32 = 0x0020_0000;
const PF_USER_WORKER: u32 = 0x0000_4000;
const PF_EXITING: u32 = 0x0000_0004;
/// x86-64 `user_mode(regs)`: the interrupted code's privilege level, the low bits of `cs`.
const USER_PRIVILEGE: u64 = 3;
/// `task_struct.__state` of a thread that has exited: its last switch-out, it never runs again.
const TASK_DEAD: u32 = 0x80;
/// The classic `sched_switch` record's `prev_state` is not `__state` but what the kernel
/// reports: 0 for a runnable thread, `TASK_REPORT_MAX` (0x100) for a preempted one, one bit per
/// blocked state — `EXIT_DEAD` (0x10) and `EXIT_ZOMBIE` (0x20) for an exiting thread.
const REPORTED_PREEMPTED: i64 = 0x100;
const REPORTED_EXITING: i64 = 0x10 | 0x20;

#[inline(always)]
fn config() -> Option<&'static SamplerConfig> {
    SAMPLER_CONFIG.get(0)
}

/// Whether threads of `tgid` are sampled: a selected process (or any, when all are), never
/// tracer itself nor the idle task (tgid 0), which is no process.
#[inline(always)]
fn sampled(cfg: &SamplerConfig, tgid: u32) -> bool {
    // SAFETY: read-only lookup of a plain u8 value.
    tgid != 0
        && tgid != cfg.tracer_tgid
        && (cfg.all_processes != 0 || unsafe { PROFILE_TARGETS.get(&tgid) }.is_some())
}

#[inline(always)]
fn count_loss(kind: SampleKind, reason: SampleLoss) {
    if let Some(ptr) = SAMPLE_LOSSES.get_ptr_mut(SampleLoss::counter_index(kind, reason)) {
        // SAFETY: the map value is a u64 owned by the map for the program's lifetime.
        unsafe { shared::atomic_add(ptr, 1) };
    }
}

/// Whether the current thread has a user stack to take (see `PF_KTHREAD`). Without the flags'
/// offset every thread is asked for one.
#[inline(always)]
fn has_user_stack(cfg: &SamplerConfig) -> bool {
    if cfg.task_flags_offset == 0 {
        return true;
    }
    // SAFETY: a helper without preconditions; the task is only read through the helper.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    kernel_value_at::<u32>(task, cfg.task_flags_offset)
        .is_none_or(|flags| flags & (PF_KTHREAD | PF_USER_WORKER | PF_EXITING) == 0)
}

/// Counts a stack the kernel did not take (`errno` negative), by the reason it gave.
#[inline(always)]
fn count_stack_loss(kind: SampleKind, flags: u64, errno: i32) {
    let user = flags & BPF_F_USER_STACK != 0;
    let reason = match -errno {
        EEXIST if user => SampleLoss::UserStackCollision,
        EEXIST => SampleLoss::KernelStackCollision,
        EFAULT if user => SampleLoss::UserStackUnreadable,
        EFAULT => SampleLoss::KernelStackUnreadable,
        _ => SampleLoss::StackFailed,
    };
    count_loss(kind, reason);
}

/// One `bpf_get_stack` of the current thread into `frames` (room for `STACK_BYTES`): the bytes
/// of frames written, or the negative errno, counted.
#[inline(always)]
fn take_frames(ctx: &PerfEventContext, frames: *mut u64, flags: u64) -> i32 {
    // SAFETY: `frames` has room for `STACK_BYTES` bytes (the caller's buffer), which is all the
    // helper writes; the context is this run's.
    let taken = unsafe { bpf_get_stack(ctx.as_ptr(), frames.cast(), STACK_BYTES as u32, flags) };
    if taken < 0 {
        count_stack_loss(SampleKind::Cpu, flags, taken as i32);
    }
    taken as i32
}

/// The bytes of frames a `take_frames` result says follow the header, bounded for the verifier
/// (the kernel never writes more than it was given room for).
#[inline(always)]
fn frame_bytes(taken: i32) -> usize {
    if taken <= 0 {
        0
    } else if taken as usize > STACK_BYTES {
        STACK_BYTES
    } else {
        taken as usize
    }
}

/// A tick of the cpu-clock event on this CPU: the thread it interrupted, if sampled, with its
/// stacks' frames.
#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    // SAFETY: a helper without preconditions.
    let time_ns = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let Some(cfg) = config() else { return 0 };
    if !sampled(cfg, tgid) {
        return 0;
    }
    let Some(buffer) = CPU_SAMPLE_BUFFER.get_ptr_mut(0) else { return 0 };
    // A direct load of the context's saved registers, which the verifier allows.
    // SAFETY: `ctx.ctx` is the kernel's `bpf_perf_event_data` for this run.
    let cs = unsafe { core::ptr::read_volatile(&raw const (*ctx.ctx).regs.cs) };
    // SAFETY: the map value is this CPU's, used by this run alone (see CPU_SAMPLE_BUFFER).
    let frames = unsafe { (&raw mut (*buffer).frames).cast::<u64>() };
    let user =
        if has_user_stack(cfg) { take_frames(&ctx, frames, BPF_F_USER_STACK) } else { NO_STACK };
    let user_bytes = frame_bytes(user);
    // The kernel stack right behind the user stack's frames: the record has no gap.
    let kernel = if cs & USER_PRIVILEGE == 0 {
        // SAFETY: `user_bytes` is at most STACK_BYTES, so STACK_BYTES of room remain.
        take_frames(&ctx, unsafe { frames.byte_add(user_bytes) }, 0)
    } else {
        NO_STACK
    };
    let header = CpuSampleHeader {
        kind: SampleKind::Cpu as u32,
        // SAFETY: a helper without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        time_ns,
        tgid,
        tid: pid_tgid as u32,
        user_stack: user,
        kernel_stack: kernel,
    };
    let len = CPU_SAMPLE_HEADER_BYTES + user_bytes + frame_bytes(kernel);
    // SAFETY: as above; the header is written before the buffer's first `len` bytes are read,
    // all within it (`len` is at most the header and both stacks at their deepest).
    let record = unsafe {
        (&raw mut (*buffer).header).write(header);
        core::slice::from_raw_parts(buffer.cast::<u8>(), len)
    };
    let flags = shared::lazy_wakeup(&SAMPLES, LAZY_WAKEUP_BYTES);
    if SAMPLES.output::<[u8]>(record, flags).is_err() {
        count_loss(SampleKind::Cpu, SampleLoss::RingFull);
    }
    0
}

/// The current thread's user stack (if it has user memory) and kernel stack (it is in the
/// scheduler) into the current epoch's stack map: their ids, or negative errnos (counted), or
/// [`NO_STACK`]; and the epoch.
#[inline(always)]
fn take_blocked_stacks(ctx: &impl StackIdContext, cfg: &SamplerConfig) -> (i32, i32, u32) {
    let epoch = STACK_EPOCH.get(0).copied().unwrap_or(0);
    let user = if has_user_stack(cfg) { stack_id(ctx, epoch, BPF_F_USER_STACK) } else { NO_STACK };
    (user, stack_id(ctx, epoch, 0), epoch)
}

/// One `bpf_get_stackid` into the map of `epoch`: the id, or the negative errno. The errno is
/// counted when the stretch's record goes out (`switched`): a stretch lost before that (its
/// switch-in unseen) is counted once, as that.
#[inline(always)]
fn stack_id(ctx: &impl StackIdContext, epoch: u32, flags: u64) -> i32 {
    let taken = if epoch & 1 == 0 {
        ctx.get_stackid(&STACKS_EVEN, flags)
    } else {
        ctx.get_stackid(&STACKS_ODD, flags)
    };
    match taken {
        Ok(id) => id as i32,
        Err(errno) => errno,
    }
}

/// Counts the stacks a stretch's record goes out without.
#[inline(always)]
fn count_missing_stacks(record: &OffCpuRecord) {
    for (id, flags) in [(record.user_stack_id, BPF_F_USER_STACK), (record.kernel_stack_id, 0)] {
        if id < 0 && id != NO_STACK {
            count_stack_loss(SampleKind::OffCpu, flags, id);
        }
    }
}

/// What the off-CPU body needs from a `sched_switch` context, classic or BTF-typed. The
/// tracepoint runs in the scheduler before the switch, so the current thread is the one
/// switching out.
trait SwitchArgs: StackIdContext {
    /// Whether the thread switching out blocked: it is neither runnable (preempted, or
    /// yielding) nor exiting.
    fn prev_blocked(&self, cfg: &SamplerConfig) -> bool;
    /// The thread switching in.
    fn next_tid(&self, cfg: &SamplerConfig) -> Option<u32>;
}

impl SwitchArgs for TracePointContext {
    #[inline(always)]
    fn prev_blocked(&self, cfg: &SamplerConfig) -> bool {
        // SAFETY: offset from the format file, checked to be an 8-byte field of the record.
        let Ok(state) = (unsafe { self.read_at::<i64>(cfg.switch_prev_state_offset as usize) })
        else {
            return false;
        };
        state != 0 && state & (REPORTED_PREEMPTED | REPORTED_EXITING) == 0
    }

    #[inline(always)]
    fn next_tid(&self, cfg: &SamplerConfig) -> Option<u32> {
        // SAFETY: offset from the format file, checked to be a 4-byte field of the record.
        unsafe { self.read_at::<u32>(cfg.switch_next_pid_offset as usize) }.ok()
    }
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`: `prev_state` is the thread's `__state`, and `preempt` says
/// whether it was preempted (runnable whatever its state).
impl SwitchArgs for BtfTracePointContext {
    #[inline(always)]
    fn prev_blocked(&self, _: &SamplerConfig) -> bool {
        // A `bool` argument: its low byte.
        let preempted = self.arg::<u64>(0) as u8 != 0;
        let state = self.arg::<u64>(3) as u32;
        !preempted && state != 0 && state & TASK_DEAD == 0
    }

    #[inline(always)]
    fn next_tid(&self, cfg: &SamplerConfig) -> Option<u32> {
        kernel_value_at::<u32>(self.arg::<*const u8>(2), cfg.task_pid_offset)
    }
}

/// A sampled thread switching out (the current one): if it blocked, its stacks and the time go
/// into `BLOCKED_THREADS` until it switches in. A thread switches in between two switch-outs,
/// so an entry still there is a stretch whose switch-in the kernel did not report: its end is
/// not known, and it is counted lost.
#[inline(always)]
fn switched_out(ctx: &impl SwitchArgs, cfg: &SamplerConfig, now: u64, tgid: u32, tid: u32) {
    if !ctx.prev_blocked(cfg) {
        // Preempted, yielding or exiting: it ran since any entry was made.
        if BLOCKED_THREADS.remove(&tid).is_ok() {
            count_loss(SampleKind::OffCpu, SampleLoss::SwitchInUnseen);
        }
        return;
    }
    let (user_stack_id, kernel_stack_id, stack_epoch) = take_blocked_stacks(ctx, cfg);
    let blocked = BlockedThread {
        tgid,
        // SAFETY: a helper without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        since_ns: now,
        user_stack_id,
        kernel_stack_id,
        stack_epoch,
        _pad: 0,
    };
    match BLOCKED_THREADS.insert(&tid, &blocked, BPF_NOEXIST) {
        Ok(()) => {}
        Err(errno) if -errno as i32 == EEXIST => {
            count_loss(SampleKind::OffCpu, SampleLoss::SwitchInUnseen);
            if BLOCKED_THREADS.insert(&tid, &blocked, 0).is_err() {
                count_loss(SampleKind::OffCpu, SampleLoss::BlockedTableFull);
            }
        }
        Err(_) => count_loss(SampleKind::OffCpu, SampleLoss::BlockedTableFull),
    }
}

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    switched(&ctx)
}

#[btf_tracepoint(function = "sched_switch")]
pub fn btf_sched_switch(ctx: BtfTracePointContext) -> u32 {
    switched(&ctx)
}

#[inline(always)]
fn switched(ctx: &impl SwitchArgs) -> u32 {
    let Some(cfg) = config() else { return 0 };
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if sampled(cfg, tgid) {
        switched_out(ctx, cfg, now, tgid, pid_tgid as u32);
    }
    let Some(next) = ctx.next_tid(cfg) else { return 0 };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(blocked) = (unsafe { BLOCKED_THREADS.get(&next) }).copied() else { return 0 };
    let record = OffCpuRecord {
        kind: SampleKind::OffCpu as u32,
        cpu: blocked.cpu,
        time_ns: blocked.since_ns,
        weight: now.saturating_sub(blocked.since_ns),
        tgid: blocked.tgid,
        tid: next,
        user_stack_id: blocked.user_stack_id,
        kernel_stack_id: blocked.kernel_stack_id,
        stack_epoch: blocked.stack_epoch,
        _pad: 0,
    };
    match SAMPLES.reserve::<OffCpuRecord>(0) {
        Some(mut entry) => {
            count_missing_stacks(&record);
            entry.write(record);
            entry.submit(shared::lazy_wakeup(&SAMPLES, LAZY_WAKEUP_BYTES));
        }
        None => count_loss(SampleKind::OffCpu, SampleLoss::RingFull),
    }
    // Removed only after the record is submitted: user space, before it empties a stack map,
    // keeps the stacks of the entries it finds, so an entry gone means its record is in the ring.
    let _ = BLOCKED_THREADS.remove(&next);
    0
}
