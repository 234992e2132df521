//! Wire types and limits of the sampling programs (the `tracer-sampler` object: CPU samples on a
//! perf event, off-CPU stretches on `sched_switch`; docs/protocol/profiling.md "Sampling in the
//! kernel"). User space decodes the ring's records ([`CpuSampleHeader`] and its frames,
//! [`OffCpuRecord`]) from untrusted bytes (`tracer_decode::profile_sample`).

/// Frames of a stack at most: the kernel's `PERF_MAX_STACK_DEPTH`, which is also the most a
/// kernel allows by default (`kernel.perf_event_max_stack`; a stack map of deeper entries is
/// refused). Deeper stacks are cut: their outermost frames are lost.
pub const STACK_DEPTH: usize = 127;

/// Bytes of one stack's frames at most (`STACK_DEPTH` u64 addresses): the buffer size the CPU
/// program gives `bpf_get_stack`.
pub const STACK_BYTES: usize = STACK_DEPTH * 8;

/// Off-CPU: stacks each of the two stack maps holds (their `max_entries`; user space may set
/// another size at load, and cuts them to one entry when it samples CPUs, whose records carry
/// their frames). The kernel preallocates every entry, 127 frames each: 16.3 MiB of locked
/// kernel memory for both maps (their `memlock`, measured). A stack whose hash bucket another
/// stack holds is not stored (counted as a collision): the fuller a map, the likelier, so user
/// space moves the programs to the other map once it has read a [`STACK_EPOCH_FILL_DIVISOR`]th
/// of this many stacks from it.
pub const STACK_MAP_ENTRIES: u32 = 8192;

/// User space starts a new stack epoch once it has read `entries / STACK_EPOCH_FILL_DIVISOR`
/// distinct stacks in the current one: a new stack then finds its bucket taken at most one time
/// in eight.
pub const STACK_EPOCH_FILL_DIVISOR: u32 = 8;

/// Threads the off-CPU program holds as blocked at once (`BLOCKED_THREADS`, preallocated: 1.6 MiB
/// of locked kernel memory, measured). A thread blocking while it is full is not sampled
/// (counted, `blocked_table_full`).
pub const BLOCKED_THREAD_ENTRIES: u32 = 16384;

/// Processes sampled at once (`PROFILE_TARGETS`); adding one more is refused.
pub const MAX_PROFILE_TARGETS: u32 = 4096;

/// Bytes of the sample ring. A CPU sample's record is [`CPU_SAMPLE_HEADER_BYTES`] and 8 bytes a
/// frame, plus the ring's 8-byte header: about 125 bytes for the tests' CoreCLR 8 workload
/// (measured: about ten frames), 520 for a 60-frame stack, 2 072 at most. At 999 Hz on two busy
/// CPUs the ring holds 17 s of the former, 4 s of the latter, and 1 s if every sample had both
/// stacks at full depth: ten times the reader's 100 ms drain interval at worst.
pub const SAMPLE_RING_BYTES: u32 = 4 << 20;

/// A stack field that holds no stack because there is none to take: the kernel stack of a
/// sample taken in user mode, the user stack of a kernel thread or of a thread that is exiting.
/// Errors are negative errnos.
pub const NO_STACK: i32 = i32::MIN;

/// What a sample record stands for: the first 4 bytes of every record on the ring, which tell
/// its layout ([`CpuSampleHeader`] or [`OffCpuRecord`]). Values are the wire encoding.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleKind {
    /// A thread found on a CPU by the cpu-clock event; weight 1.
    Cpu = 1,
    /// A stretch a thread spent blocked (switched out while not runnable, until switched in
    /// again); weight: its length in nanoseconds.
    OffCpu = 2,
}

impl SampleKind {
    pub const ALL: [SampleKind; 2] = [SampleKind::Cpu, SampleKind::OffCpu];

    /// The name in logs and summaries.
    pub fn name(self) -> &'static str {
        match self {
            SampleKind::Cpu => "cpu",
            SampleKind::OffCpu => "off_cpu",
        }
    }

    pub fn from_u32(value: u32) -> Option<SampleKind> {
        SampleKind::ALL.into_iter().find(|k| *k as u32 == value)
    }
}

/// Why a sample, or one of its stacks, was lost in the kernel: one per-CPU counter per
/// (sample kind, reason) in `SAMPLE_LOSSES`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleLoss {
    /// `bpf_ringbuf_reserve` failed: the sample is gone.
    RingFull = 0,
    /// `BLOCKED_THREADS` was full: a thread's blocked stretch is not sampled.
    BlockedTableFull = 1,
    /// Off-CPU: the user stack's bucket in the stack map held another stack (`-EEXIST`): the
    /// stretch has no user stack. (CPU samples carry their frames: they have no stack map.)
    UserStackCollision = 2,
    /// The same for the kernel stack.
    KernelStackCollision = 3,
    /// The user stack could not be taken (`-EFAULT`: no callchain buffer free on the CPU, or
    /// nothing to walk).
    UserStackUnreadable = 4,
    /// The kernel stack could not be taken (`-EFAULT`).
    KernelStackUnreadable = 5,
    /// `bpf_get_stack` or `bpf_get_stackid` failed otherwise (`-ENOMEM`: no free stack map
    /// entry; `-EINVAL`).
    StackFailed = 6,
    /// A blocked thread switched out again (or exited) with no switch-in seen since: the
    /// kernel did not report it (e.g. hosts that report no switch away from some tasks of
    /// their own), so the stretch's end is not known and it is not sampled.
    SwitchInUnseen = 7,
}

impl SampleLoss {
    pub const COUNT: usize = 8;
    pub const ALL: [SampleLoss; SampleLoss::COUNT] = [
        SampleLoss::RingFull,
        SampleLoss::BlockedTableFull,
        SampleLoss::UserStackCollision,
        SampleLoss::KernelStackCollision,
        SampleLoss::UserStackUnreadable,
        SampleLoss::KernelStackUnreadable,
        SampleLoss::StackFailed,
        SampleLoss::SwitchInUnseen,
    ];

    /// The name in logs and summaries.
    pub fn name(self) -> &'static str {
        match self {
            SampleLoss::RingFull => "ring_full",
            SampleLoss::BlockedTableFull => "blocked_table_full",
            SampleLoss::UserStackCollision => "user_stack_collision",
            SampleLoss::KernelStackCollision => "kernel_stack_collision",
            SampleLoss::UserStackUnreadable => "user_stack_unreadable",
            SampleLoss::KernelStackUnreadable => "kernel_stack_unreadable",
            SampleLoss::StackFailed => "stack_failed",
            SampleLoss::SwitchInUnseen => "switch_in_unseen",
        }
    }

    /// Index into `SAMPLE_LOSSES`.
    pub const fn counter_index(kind: SampleKind, reason: SampleLoss) -> u32 {
        (kind as u32 - 1) * SampleLoss::COUNT as u32 + reason as u32
    }
}

/// Entries of the per-CPU `SAMPLE_LOSSES` array.
pub const SAMPLE_LOSS_COUNTERS: u32 = (SampleKind::ALL.len() * SampleLoss::COUNT) as u32;

/// The fixed part of a CPU sample's record on the ring (32 bytes). The user stack's frames
/// follow it, then the kernel stack's: u64 addresses, innermost first, as many as the two stack
/// fields say. The record is exactly that long; its weight is 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSampleHeader {
    /// [`SampleKind::Cpu`].
    pub kind: u32,
    /// The CPU the sample was taken on.
    pub cpu: u32,
    /// CLOCK_MONOTONIC nanoseconds of the sample's tick.
    pub time_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// What `bpf_get_stack` returned for the user stack: the bytes of frames that follow (a
    /// multiple of 8, at most [`STACK_BYTES`]), a negative errno, or [`NO_STACK`] (none
    /// taken, no frames follow).
    pub user_stack: i32,
    /// The same for the kernel stack, whose frames follow the user stack's.
    pub kernel_stack: i32,
}

/// Bytes of [`CpuSampleHeader`].
pub const CPU_SAMPLE_HEADER_BYTES: usize = core::mem::size_of::<CpuSampleHeader>();

/// Where the CPU program assembles a record (a per-CPU scratch value): the header and room for
/// both stacks at their deepest. The kernel stack is taken right behind the user stack's
/// frames, so the record is this buffer's first `header + frames` bytes, copied to the ring.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CpuSampleBuffer {
    pub header: CpuSampleHeader,
    pub frames: [u64; 2 * STACK_DEPTH],
}

/// Bytes of the longest CPU sample record: both stacks [`STACK_DEPTH`] deep.
pub const CPU_SAMPLE_MAX_BYTES: usize = core::mem::size_of::<CpuSampleBuffer>();

/// An off-CPU stretch's record on the ring (48 bytes): its stacks are ids in a stack map,
/// taken when the thread switched out.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuRecord {
    /// [`SampleKind::OffCpu`].
    pub kind: u32,
    /// Where the thread switched out.
    pub cpu: u32,
    /// CLOCK_MONOTONIC nanoseconds the stacks were taken at: when the blocked thread switched
    /// out.
    pub time_ns: u64,
    /// The stretch's nanoseconds.
    pub weight: u64,
    pub tgid: u32,
    pub tid: u32,
    /// A stack id in the stack map of `stack_epoch`, a negative errno, or [`NO_STACK`].
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// The stack epoch the ids belong to: its low bit says which of the two stack maps.
    pub stack_epoch: u32,
    pub _pad: u32,
}

/// A thread the off-CPU program saw switch out blocked (`BLOCKED_THREADS`, keyed by thread
/// id), until it switches in again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockedThread {
    pub tgid: u32,
    pub cpu: u32,
    /// CLOCK_MONOTONIC nanoseconds it switched out at.
    pub since_ns: u64,
    /// As in [`OffCpuRecord`], taken when it switched out.
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    pub stack_epoch: u32,
    pub _pad: u32,
}

const _: () = assert!(CPU_SAMPLE_HEADER_BYTES == 32);
const _: () = assert!(CPU_SAMPLE_MAX_BYTES == CPU_SAMPLE_HEADER_BYTES + 2 * STACK_BYTES);
const _: () = assert!(core::mem::size_of::<OffCpuRecord>() == 48);
const _: () = assert!(core::mem::size_of::<BlockedThread>() == 32);

/// Settings user space writes into `SAMPLER_CONFIG` (index 0) before attaching.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SamplerConfig {
    /// tracer itself is never sampled.
    pub tracer_tgid: u32,
    /// Non-zero: every process is sampled; else only those in `PROFILE_TARGETS`.
    pub all_processes: u32,
    /// `task_struct.flags`, from kernel BTF: a kernel thread (`PF_KTHREAD`), a user worker
    /// (`PF_USER_WORKER`) or an exiting thread (`PF_EXITING`) has no user stack to take. 0: not
    /// known; the user stack is then asked for every thread, and a kernel thread's counts as
    /// unreadable.
    pub task_flags_offset: u32,
    /// `task_struct.pid`, from kernel BTF: the thread `sched_switch` (`tp_btf`) switches in.
    pub task_pid_offset: u32,
    /// The classic `sched_switch` record's `prev_state` (8 bytes) and `next_pid` (4 bytes),
    /// from its format file.
    pub switch_prev_state_offset: u32,
    pub switch_next_pid_offset: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain-old-data structs without references, with explicit padding.
    unsafe impl aya::Pod for super::SamplerConfig {}
    // SAFETY: as above: u32, u32, u64, then four 4-byte fields.
    unsafe impl aya::Pod for super::BlockedThread {}
}
