//! In-kernel detection for tracer.
//!
//! * `.NET` diagnostic IPC readiness: `memfd_create("dotnet_ipc_created")` followed by an `mmap`
//!   of that memfd (any protection), and CoreCLR's W^X `doublemapper` memfd (once per process),
//!   both seen at syscall entry (no exit programs: docs/protocol/bpf-detection.md §7).
//! * user_events registrations: `DIAG_IOCSREG` / `DIAG_IOCSDEL` / `DIAG_IOCSUNREG` ioctls, read at
//!   syscall exit (the kernel has just copied the argument, so the pages are resident).
//! * Every runtime's diagnostic server (.NET Core 3.0+, with or without W^X): `bind()` of an
//!   `AF_UNIX` socket named `dotnet-diagnostic-<pid>-<key>-socket`, read and matched at syscall
//!   entry (no exit program: `bind` is rare, but an exit program would run for every one).
//! * Lifecycle (fork / exec / exit) of the processes that did any of the above, so user space can
//!   keep the per-process registration table the kernel keeps per mm.
//! * Each syscall hook also as an `fexit` program on the kernel's `__x64_sys_*` function (BPF
//!   trampolines: only that syscall pays), used instead where the kernel allows it; both run the
//!   same code (`SyscallArgs`, docs/protocol/bpf-detection.md §8). And a task iterator that
//!   reads the user_events registrations processes already hold when tracer starts (§9).
//!
//! Events are reserved directly in the ring buffer and filled in place; lifecycle events are
//! submitted without waking the reader, detections with a forced wake-up
//! (docs/protocol/bpf-detection.md §6). The ring entry is the
//! scratch space for the 512-byte `name_args` (never the stack): on ≥ 6.13 kernels syscall
//! tracepoint programs are preemptible, so a per-CPU scratch slot shared by several programs
//! could be overwritten mid-use by another program on the same CPU; a reservation cannot.
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_task, bpf_get_current_uid_gid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes, bpf_probe_read_user,
        bpf_probe_read_user_buf, bpf_probe_read_user_str_bytes, bpf_seq_write,
    },
    macros::{btf_tracepoint, fexit, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, FExitContext, TracePointContext},
};
use tracer_common::{
    AF_UNIX, COUNTERS_LEN, Config, DIAG_IOCSDEL, DIAG_IOCSREG, DIAG_IOCSUNREG,
    DIAGNOSTIC_SOCKET_MAX_DIGITS, DIAGNOSTIC_SOCKET_PREFIX, DIAGNOSTIC_SOCKET_SUFFIX,
    DOTNET_IPC_MEMFD_NAME, DOUBLEMAPPER_MEMFD_NAME, ENABLER_NAME_LEN, EnablerRecord,
    EnablerRecordKind, EventHeader, EventKind, IpcBindEvent, LossReason, MAX_ENABLERS_PER_PROCESS,
    MAX_SESSION_PROCESSES, MemfdCreateEvent, MemfdKind, MmapEvent, ProcessExecEvent,
    ProcessExitEvent, ProcessForkEvent, SOCKADDR_BUF_LEN, SOCKADDR_UN_LEN, SYSCALL_ARG_OFFSETS,
    THREAD_TABLE_ENTRIES, ThreadTenure, UNIX_PATH_MAX, UserEventsIoctlEvent, UserReg, UserUnreg,
};

use crate::shared::{self, BPF_RB_FORCE_WAKEUP, kernel_value_at};

const MAP_ANONYMOUS: u64 = 0x20;
/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;
/// Map flag: allocate entries as they are inserted (`THREADS` is large and mostly empty).
const BPF_F_NO_PREALLOC: u32 = 1;
const CLONE_THREAD: u64 = 0x0001_0000;
/// Syscall tracepoint context: argument i at 16 + 8*i, the return value at 16
/// (docs/protocol/bpf-detection.md §2).
const SYSCALL_ARG0: usize = 16;
const SYSCALL_RET: usize = 16;

#[map]
/// 1 MiB: thousands of events of headroom for a consumer that drains it promptly, while the
/// doubly-mapped data pages stay a small part of tracer's resident memory. Full = counted loss.
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Bytes waiting in the ring past which a lazily submitted event wakes the reader anyway: a
/// quarter of the ring, so a burst wakes it long before the ring is full.
const LAZY_WAKEUP_BYTES: u64 = 256 << 10;

/// Submit flags of an event that need not reach user space at once (process lifecycle, memfd
/// creation, user_events registrations). Detections wake the reader with
/// `BPF_RB_FORCE_WAKEUP`: the kernel's default wakes it only when this record is the first
/// unread one, never behind lazy records (docs/protocol/bpf-detection.md "Wake-ups").
#[inline(always)]
fn lazy_wakeup() -> u64 {
    shared::lazy_wakeup(&EVENTS, LAZY_WAKEUP_BYTES)
}

/// Per-CPU loss counters, indexed by `LossReason::counter_index(kind, reason)`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS_LEN, 0);

/// Per-CPU, per-kind sequence number stamped into every event (gaps = events that never made
/// it). Taken with an atomic fetch-and-add: on kernels where syscall tracepoint programs run
/// preemptibly, two runs of one program can interleave on a CPU, and a plain read-then-write
/// would hand both the same number (docs/protocol/bpf-detection.md, "Sequence numbers").
#[map]
static SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(EventKind::TABLE_LEN as u32, 0);

#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// Optional target tgids (`Config::filter_targets`); children of targets are added on fork.
#[map]
static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);

/// Processes that did something of interest; their fork/exec/exit are reported.
#[map]
static TRACKED: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

/// Processes with a user_events session (tgid → session generation), written by user space:
/// their threads' lives are recorded in `THREADS` (docs/protocol/bpf-detection.md §12).
#[map]
static SESSION_PROCESSES: HashMap<u32, u32> = HashMap::with_max_entries(MAX_SESSION_PROCESSES, 0);

/// Thread id → the process and session it belongs to and when it was created and exited, for
/// every thread of a process in `SESSION_PROCESSES`: the records it wrote are attributed to its
/// process after it has exited. User space removes entries once their records are read; full =
/// counted loss (the thread's records are then dropped as another process's).
#[map]
static THREADS: HashMap<u32, ThreadTenure> =
    HashMap::with_max_entries(THREAD_TABLE_ENTRIES, BPF_F_NO_PREALLOC);

/// The session generation of `tgid`, when it has a user_events session.
#[inline(always)]
fn session_generation(tgid: u32) -> Option<u32> {
    // SAFETY: read-only lookup of a plain u32 value.
    unsafe { SESSION_PROCESSES.get(&tgid) }.copied()
}

/// (tgid << 8 | memfd kind) → `1 << kind` for every memfd of interest a process created since
/// its exec: the processes whose file `mmap`s are worth resolving to a name. The entry goes
/// when that kind's mapping is reported, at exec and at exit; bounded (full = counted loss).
#[map]
static MEMFD_CANDIDATES: HashMap<u64, u8> = HashMap::with_max_entries(16384, 0);

#[inline(always)]
fn candidate_key(tgid: u32, kind: MemfdKind) -> u64 {
    (u64::from(tgid) << 8) | kind as u64
}

/// How many `MEMFD_CANDIDATES` entries have a tgid with these low bits (index
/// `tgid % MEMFD_HINT_LEN`). `sys_enter_mmap` runs for every file mmap on the machine: a zero
/// here answers "no memfd of interest" with one array load instead of hash lookups. The count
/// is raised before an insert and lowered only after a successful removal, so it never
/// under-counts (which would hide an event); a collision only costs the lookups.
#[map]
static MEMFD_HINT: Array<u64> = Array::with_max_entries(MEMFD_HINT_LEN, 0);
const MEMFD_HINT_LEN: u32 = 1024;

/// The current task's process id (its thread group's).
#[inline(always)]
fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

#[inline(always)]
fn may_have_memfds(tgid: u32) -> bool {
    match MEMFD_HINT.get_ptr(tgid % MEMFD_HINT_LEN) {
        // SAFETY: map value pointer valid for this invocation; a racy read is fine (see map).
        Some(ptr) => (unsafe { core::ptr::read_volatile(ptr) }) != 0,
        None => true,
    }
}

/// `1 << kind` when (tgid, kind) is a candidate, else 0. A loaded value, not a pointer test:
/// the compiler may OR two map-value pointers, which the verifier refuses.
#[inline(always)]
fn candidate_bit(tgid: u32, kind: MemfdKind) -> u8 {
    // SAFETY: read-only lookup of a plain u8 value.
    unsafe { MEMFD_CANDIDATES.get(&candidate_key(tgid, kind)) }.copied().unwrap_or(0)
}

/// Adds (tgid, kind) to `MEMFD_CANDIDATES`, keeping `MEMFD_HINT` in step.
#[inline(always)]
fn add_candidate(tgid: u32, kind: MemfdKind) {
    let hint = tgid % MEMFD_HINT_LEN;
    atomic_add(&MEMFD_HINT, hint, 1);
    // BPF_NOEXIST: an entry already there (another memfd of the kind) keeps its one count.
    let bit = 1u8 << kind as u8;
    if MEMFD_CANDIDATES.insert(&candidate_key(tgid, kind), &bit, BPF_NOEXIST).is_err() {
        // Wrapping add of -1.
        atomic_add(&MEMFD_HINT, hint, u64::MAX);
        if candidate_bit(tgid, kind) == 0 {
            count_loss(EventKind::MemfdCreate, LossReason::MapFull);
        }
    }
}

/// Removes (tgid, kind) from `MEMFD_CANDIDATES`, keeping `MEMFD_HINT` in step.
#[inline(always)]
fn remove_candidate(tgid: u32, kind: MemfdKind) {
    if MEMFD_CANDIDATES.remove(&candidate_key(tgid, kind)).is_ok() {
        // Wrapping add of -1.
        atomic_add(&MEMFD_HINT, tgid % MEMFD_HINT_LEN, u64::MAX);
    }
}

/// At exec and exit: a new image (or none) starts without candidates.
#[inline(always)]
fn forget_memfds(tgid: u32) {
    if may_have_memfds(tgid) {
        remove_candidate(tgid, MemfdKind::DotnetIpcCreated);
        remove_candidate(tgid, MemfdKind::DoubleMapper);
    }
}

/// Per tgid, the memfd kinds whose mapping was already reported (bit `1 << kind`): each is
/// reported once per process image (doublemapper maps many times, and a process looping `mmap`
/// on its `dotnet_ipc_created` memfd must flood neither the ring nor the output).
#[map]
static REPORTED_KINDS: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

#[inline(always)]
fn reported_kinds(tgid: u32) -> u8 {
    // SAFETY: read-only lookup of a plain u8 value.
    unsafe { REPORTED_KINDS.get(&tgid) }.copied().unwrap_or(0)
}

#[repr(C)]
#[derive(Clone, Copy)]
struct PendingIoctl {
    cmd: u64,
    arg: u64,
    fd: i32,
    _pad: u32,
}

/// ioctl enter → exit correlation, keyed by pid_tgid (one syscall in flight per thread).
#[map]
static PENDING_IOCTL: HashMap<u64, PendingIoctl> = HashMap::with_max_entries(4096, 0);

/// Enter→exit entries in flight per syscall (index = `InFlight`). The exit program runs for
/// every ioctl on the machine and almost never has an entry: while the count is 0 it returns
/// after one array load instead of a hash lookup. A stale count (an entry never removed) only
/// costs the lookup again; it cannot hide an event.
#[map]
static IN_FLIGHT: Array<u64> = Array::with_max_entries(1, 0);

#[derive(Clone, Copy)]
enum InFlight {
    Ioctl = 0,
}

/// Adds `delta` (wrapping) to a shared counter that every CPU updates.
#[inline(always)]
fn atomic_add(map: &Array<u64>, index: u32, delta: u64) {
    if let Some(ptr) = map.get_ptr_mut(index) {
        // SAFETY: map value owned by the map for the program's lifetime.
        unsafe { shared::atomic_add(ptr, delta) };
    }
}

#[inline(always)]
fn in_flight_add(which: InFlight, delta: u64) {
    atomic_add(&IN_FLIGHT, which as u32, delta);
}

#[inline(always)]
fn none_in_flight(which: InFlight) -> bool {
    match IN_FLIGHT.get_ptr(which as u32) {
        // SAFETY: map value pointer valid for this invocation; a racy read is fine (see map).
        Some(ptr) => (unsafe { core::ptr::read_volatile(ptr) }) == 0,
        None => false,
    }
}

/// In an exit program: takes this thread's pending entry of `map` (returning from the program
/// when there is none), keeping `IN_FLIGHT` in step. Evaluates to (entry, pid_tgid).
macro_rules! take_pending {
    ($map:expr, $which:expr) => {{
        if none_in_flight($which) {
            return 0;
        }
        let pid_tgid = bpf_get_current_pid_tgid();
        // SAFETY: the value is copied out before the entry is removed.
        let Some(pending) = (unsafe { $map.get(&pid_tgid) }).copied() else { return 0 };
        if $map.remove(&pid_tgid).is_ok() {
            // Wrapping add of -1.
            in_flight_add($which, u64::MAX);
        }
        (pending, pid_tgid)
    }};
}

/// child tid → clone flags, from `task_newtask` to the `sched_process_fork` that follows it.
#[map]
static NEW_TASKS: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

#[inline(always)]
fn config() -> Option<&'static Config> {
    CONFIG.get(0)
}

#[inline(always)]
fn count_loss(kind: EventKind, reason: LossReason) {
    if let Some(ptr) = COUNTERS.get_ptr_mut(LossReason::counter_index(kind, reason)) {
        // SAFETY: the map value is a u64 owned by the map for the program's lifetime; atomic
        // because preemptible syscall programs on one CPU may interleave.
        unsafe { shared::atomic_add(ptr, 1) };
    }
}

/// True when events of `tgid` must not be reported (tracer itself, or not a selected target).
#[inline(always)]
fn excluded(tgid: u32) -> bool {
    let Some(cfg) = config() else { return true };
    if tgid == cfg.tracer_tgid {
        return true;
    }
    // SAFETY: read-only lookup of a plain u8 value.
    cfg.filter_targets != 0 && unsafe { TARGETS.get(&tgid) }.is_none()
}

#[inline(always)]
fn is_tracked(tgid: u32) -> bool {
    // SAFETY: read-only lookup of a plain u8 value.
    unsafe { TRACKED.get(&tgid) }.is_some()
}

#[inline(always)]
fn track(tgid: u32, kind: EventKind) {
    if TRACKED.insert(&tgid, &1, 0).is_err() {
        count_loss(kind, LossReason::MapFull);
    }
}

#[inline(always)]
fn next_seq(kind: EventKind) -> u64 {
    match SEQ.get_ptr_mut(kind as u32) {
        Some(ptr) => {
            let mut seq: u64 = 1;
            // `atomic_xadd` with its result used needs `-mcpu=v3` codegen, which aya-build's
            // fixed flags do not allow; the instruction itself (BPF_ATOMIC | BPF_FETCH |
            // BPF_ADD, kernel 5.12+) is written out. It adds `seq` to `*ptr` and leaves the old
            // value in `seq`.
            // SAFETY: `ptr` is the map value (a valid, 8-byte aligned u64 for this run) and is
            // updated only atomically; the instruction touches nothing else.
            unsafe {
                core::arch::asm!(
                    "{seq} = atomic_fetch_add((u64 *)({ptr} + 0), {seq})",
                    ptr = in(reg) ptr,
                    seq = inout(reg) seq,
                    options(nostack),
                );
            }
            seq
        }
        None => 0,
    }
}

/// Fills the common header of an event being emitted by the current task.
#[inline(always)]
fn fill_header(h: &mut EventHeader, kind: EventKind, seq: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let uid_gid = bpf_get_current_uid_gid();
    h.kind = kind as u32;
    // SAFETY: helpers without preconditions.
    unsafe {
        h.cpu = bpf_get_smp_processor_id();
        h.ktime_ns = bpf_ktime_get_ns();
        h.cgroup_id = bpf_get_current_cgroup_id();
    }
    h.seq = seq;
    h.pid = (pid_tgid >> 32) as u32;
    h.tid = pid_tgid as u32;
    h.uid = uid_gid as u32;
    h.gid = (uid_gid >> 32) as u32;
    h.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    h.process_start_ns = current_process_start().unwrap_or(0);
}

/// `current->group_leader->start_boottime`: when the current process started (CLOCK_BOOTTIME
/// nanoseconds; kept by exec, which makes the execing thread the leader with the old leader's
/// start). `None` without the offsets from kernel BTF.
#[inline(always)]
fn current_process_start() -> Option<u64> {
    let cfg = config()?;
    if cfg.task_group_leader_offset == 0 {
        return None;
    }
    // SAFETY: a helper without preconditions; the task is only read through the helper.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let leader = kernel_ptr_at(task, cfg.task_group_leader_offset)?;
    kernel_value_at::<u64>(leader, cfg.task_start_boottime_offset)
}

/// Reserves an event of type `T`, or counts the loss. The sequence number is taken first so a
/// failed reservation leaves a visible gap.
macro_rules! reserve {
    ($ty:ty, $kind:expr) => {{
        let seq = next_seq($kind);
        match EVENTS.reserve::<$ty>(0) {
            Some(entry) => Some((entry, seq)),
            None => {
                count_loss($kind, LossReason::RingFull);
                None
            }
        }
    }};
}

/// Loads a u64 of a syscall tracepoint's context directly: tracepoint contexts are readable
/// memory the verifier bounds-checks, so no `bpf_probe_read_kernel` helper call (these run on
/// every mmap and ioctl of the machine).
#[inline(always)]
fn syscall_ctx_u64(ctx: &TracePointContext, offset: usize) -> u64 {
    use aya_ebpf::EbpfContext as _;
    // SAFETY: offsets 16..64 lie inside every syscall tracepoint context
    // (docs/protocol/bpf-detection.md §2).
    unsafe { core::ptr::read(ctx.as_ptr().cast::<u8>().add(offset).cast::<u64>()) }
}

#[inline(always)]
fn syscall_arg(ctx: &TracePointContext, i: usize) -> u64 {
    syscall_ctx_u64(ctx, SYSCALL_ARG0 + 8 * i)
}

#[inline(always)]
fn syscall_ret(ctx: &TracePointContext) -> i64 {
    syscall_ctx_u64(ctx, SYSCALL_RET) as i64
}

/// Where a syscall hook finds the syscall's arguments: each hook's work is written once, for
/// the syscall tracepoint and for the BPF trampoline on the syscall function alike
/// (docs/protocol/bpf-detection.md §8).
trait SyscallArgs {
    fn arg(&self, i: usize) -> u64;
}

impl SyscallArgs for TracePointContext {
    #[inline(always)]
    fn arg(&self, i: usize) -> u64 {
        syscall_arg(self, i)
    }
}

/// The `const struct pt_regs *` a `__x64_sys_*` function receives: the caller's registers.
/// Arguments are loaded only when a hook asks for them, so the common early returns cost none.
struct SavedRegs {
    regs: *const u8,
}

impl SavedRegs {
    /// The registers of a trampoline program on a syscall function (its only argument).
    #[inline(always)]
    fn of(ctx: &FExitContext) -> SavedRegs {
        SavedRegs { regs: ctx.arg(0) }
    }
}

impl SyscallArgs for SavedRegs {
    #[inline(always)]
    fn arg(&self, i: usize) -> u64 {
        // A direct load at a constant offset, no helper call: the verifier knows `regs` as a
        // `struct pt_regs` pointer (from BTF) and checks the offset against that struct, and
        // turns the load into one that cannot fault.
        // SAFETY: `i` < 6 at every call site; the registers stay valid for the whole syscall.
        unsafe { core::ptr::read_volatile(self.regs.add(SYSCALL_ARG_OFFSETS[i]).cast::<u64>()) }
    }
}

/// The return value a trampoline program on a function sees.
#[inline(always)]
fn function_ret(ctx: &FExitContext) -> i64 {
    ctx.ret::<i64>().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// memfd_create

/// Names of interest are short: a 32-byte read tells them apart from every longer name.
const NAME_READ_LEN: usize = 32;
/// The prefix the kernel gives a memfd's file name (`memfd_create(2)`).
const MEMFD_FILE_PREFIX: &[u8] = b"memfd:";

/// Reported at syscall entry, with no exit program: an attached `sys_exit_*` program puts
/// every syscall of every process on a dearer path, and the fd `memfd_create` returns is not
/// needed — `sys_enter_mmap` reads the name of the file it maps instead
/// (docs/protocol/bpf-detection.md §7).
#[tracepoint(category = "syscalls", name = "sys_enter_memfd_create")]
pub fn sys_enter_memfd_create(ctx: TracePointContext) -> u32 {
    memfd_created(&ctx)
}

/// The trampoline twin of `sys_enter_memfd_create`, at the syscall's return: the kernel has
/// copied the name by then, so the page is resident and the read does not fail.
#[fexit(function = "__x64_sys_memfd_create")]
pub fn fexit_memfd_create(ctx: FExitContext) -> u32 {
    memfd_created(&SavedRegs::of(&ctx))
}

#[inline(always)]
fn memfd_created(args: &impl SyscallArgs) -> u32 {
    let tgid = current_tgid();
    if excluded(tgid) {
        return 0;
    }
    let mut buf = [0u8; NAME_READ_LEN];
    let uname = args.arg(0) as *const u8;
    // SAFETY: reads user memory through the helper, bounded by `buf`.
    let name = match unsafe { bpf_probe_read_user_str_bytes(uname, &mut buf) } {
        Ok(name) => name,
        Err(_) => {
            // A name not paged in yet (the kernel has not copied it at entry): either kind
            // may follow, so both are watched for; the creation itself goes unreported.
            count_loss(EventKind::MemfdCreate, LossReason::ReadFailed);
            add_candidate(tgid, MemfdKind::DotnetIpcCreated);
            add_candidate(tgid, MemfdKind::DoubleMapper);
            return 0;
        }
    };
    let Some(kind) = memfd_kind_of(name) else { return 0 };
    let name_len = name.len();
    if reported_kinds(tgid) & (1u8 << kind as u8) == 0 {
        add_candidate(tgid, kind);
    }
    track(tgid, EventKind::MemfdCreate);

    let Some((mut entry, seq)) = reserve!(MemfdCreateEvent, EventKind::MemfdCreate) else {
        return 0;
    };
    // SAFETY: the reservation is exactly one MemfdCreateEvent; every field is written below.
    let ev = unsafe { &mut *entry.as_mut_ptr() };
    fill_header(&mut ev.header, EventKind::MemfdCreate, seq);
    ev.memfd_kind = kind as u32;
    ev.flags = args.arg(1) as u32;
    ev.name_len = name_len as i32;
    ev._pad = 0;
    ev.name = [0; tracer_common::MEMFD_NAME_LEN];
    let src = match kind {
        MemfdKind::DotnetIpcCreated => DOTNET_IPC_MEMFD_NAME,
        MemfdKind::DoubleMapper => DOUBLEMAPPER_MEMFD_NAME,
    };
    let mut i = 0;
    while i < src.len() && i < ev.name.len() {
        ev.name[i] = src[i];
        i += 1;
    }
    entry.submit(lazy_wakeup());
    0
}

#[inline(always)]
fn memfd_kind_of(name: &[u8]) -> Option<MemfdKind> {
    if name == DOTNET_IPC_MEMFD_NAME {
        Some(MemfdKind::DotnetIpcCreated)
    } else if name == DOUBLEMAPPER_MEMFD_NAME {
        Some(MemfdKind::DoubleMapper)
    } else {
        None
    }
}

/// The errno a string field carries (negated, as the helpers return theirs) when the pointer
/// to the string could not be read.
const EFAULT: i32 = 14;

/// Reads a non-null kernel pointer at `base + offset`.
#[inline(always)]
fn kernel_ptr_at(base: *const u8, offset: u32) -> Option<*const u8> {
    kernel_value_at::<*const u8>(base, offset).filter(|p| !p.is_null())
}

/// The memfd kind of the current task's open file `fd`, from the file's name
/// (`current->files->fdt->fd[fd]->f_path.dentry->d_name.name`, at the offsets user space read
/// from kernel BTF).
#[inline(always)]
fn memfd_kind_of_fd(cfg: &Config, fd: i32) -> Option<MemfdKind> {
    // SAFETY: a helper without preconditions; the task is only read through the helper.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let files = kernel_ptr_at(task, cfg.task_files_offset)?;
    let fdt = kernel_ptr_at(files, cfg.files_fdt_offset)?;
    // SAFETY: as in `kernel_ptr_at`.
    let max_fds = unsafe {
        bpf_probe_read_kernel(fdt.add(cfg.fdtable_max_fds_offset as usize).cast::<u32>())
    }
    .ok()?;
    if fd as u32 >= max_fds {
        return None;
    }
    let fd_array = kernel_ptr_at(fdt, cfg.fdtable_fd_offset)?;
    let file = kernel_ptr_at(fd_array, fd as u32 * 8)?;
    let dentry = kernel_ptr_at(file, cfg.file_dentry_offset)?;
    let name = kernel_ptr_at(dentry, cfg.dentry_name_offset)?;
    let mut buf = [0u8; NAME_READ_LEN];
    // SAFETY: reads kernel memory through the helper, bounded by `buf`.
    let name = unsafe { bpf_probe_read_kernel_str_bytes(name, &mut buf) }.ok()?;
    memfd_kind_of(name.strip_prefix(MEMFD_FILE_PREFIX)?)
}

// ---------------------------------------------------------------------------------------------
// mmap

/// A file `mmap` by a process that created a memfd of interest: the fd's file name says which
/// memfd it maps. Reported at entry (no exit program, see `sys_enter_memfd_create`); user space
/// reads the address the mapping got from `/proc/<pid>/maps`.
#[tracepoint(category = "syscalls", name = "sys_enter_mmap")]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    mapped(&ctx, None)
}

/// The trampoline twin of `sys_enter_mmap`, at the syscall's return: the result (the address)
/// comes with the event.
#[fexit(function = "__x64_sys_mmap")]
pub fn fexit_mmap(ctx: FExitContext) -> u32 {
    mapped(&SavedRegs::of(&ctx), Some(function_ret(&ctx)))
}

/// `ret`: the syscall's result, when the hook runs at its return.
#[inline(always)]
fn mapped(args: &impl SyscallArgs, ret: Option<i64>) -> u32 {
    // The per-tgid hint first: it turns away almost every mmap before any argument is read.
    let tgid = current_tgid();
    if !may_have_memfds(tgid) {
        return 0;
    }
    let flags = args.arg(3);
    let fd = args.arg(4) as i32;
    if flags & MAP_ANONYMOUS != 0 || fd < 0 {
        return 0;
    }
    let wanted = candidate_bit(tgid, MemfdKind::DotnetIpcCreated)
        | candidate_bit(tgid, MemfdKind::DoubleMapper);
    if wanted == 0 || excluded(tgid) {
        return 0;
    }
    let Some(cfg) = config() else { return 0 };
    let Some(kind) = memfd_kind_of_fd(cfg, fd) else { return 0 };
    if wanted & (1u8 << kind as u8) == 0 {
        return 0;
    }
    // Reported once per process image: no more lookups for this kind. Two threads mapping at
    // once may both report: a duplicate, never a miss.
    remove_candidate(tgid, kind);
    let event_kind = match kind {
        MemfdKind::DotnetIpcCreated => EventKind::DotnetIpcReady,
        MemfdKind::DoubleMapper => EventKind::DotnetRuntimeSeen,
    };
    let reported = reported_kinds(tgid) | (1u8 << kind as u8);
    if REPORTED_KINDS.insert(&tgid, &reported, 0).is_err() {
        count_loss(event_kind, LossReason::MapFull);
    }
    // Tracked here too: the creation may have gone unread (and untracked).
    track(tgid, event_kind);
    let Some((mut entry, seq)) = reserve!(MmapEvent, event_kind) else { return 0 };
    // SAFETY: the reservation is exactly one MmapEvent; every field is written below.
    let ev = unsafe { &mut *entry.as_mut_ptr() };
    fill_header(&mut ev.header, event_kind, seq);
    ev.memfd_kind = kind as u32;
    ev.fd = fd;
    ev.addr_hint = args.arg(0);
    ev.len = args.arg(1);
    ev.prot = args.arg(2);
    ev.flags = flags;
    ev.offset = args.arg(5);
    ev.ret = ret.unwrap_or(0);
    ev.ret_known = u32::from(ret.is_some());
    ev._pad = 0;
    entry.submit(BPF_RB_FORCE_WAKEUP);
    0
}

// ---------------------------------------------------------------------------------------------
// bind (diagnostic server sockets)

/// `REPORTED_KINDS` bit of a diagnostic socket bind (the memfd kinds use `1 << MemfdKind`).
const REPORTED_IPC_SOCKET: u8 = 1 << 7;
/// Offset of `sun_path` in `struct sockaddr_un`.
const SUN_PATH: usize = 2;
/// Shortest diagnostic socket name: prefix, one digit, `-`, one digit, suffix.
const MIN_NAME_LEN: usize = DIAGNOSTIC_SOCKET_PREFIX.len() + 3 + DIAGNOSTIC_SOCKET_SUFFIX.len();
/// Masks an index into the sockaddr buffer (a power of two long).
const BUF_MASK: usize = SOCKADDR_BUF_LEN - 1;

#[inline(always)]
fn at(buf: &[u8; SOCKADDR_BUF_LEN], i: usize) -> u8 {
    buf[i & BUF_MASK]
}

/// How many digits (at most `DIAGNOSTIC_SOCKET_MAX_DIGITS`) end just before `end`, none before
/// `start`.
#[inline(always)]
fn digits_before(buf: &[u8; SOCKADDR_BUF_LEN], end: usize, start: usize) -> usize {
    let mut n = 0;
    while n < DIAGNOSTIC_SOCKET_MAX_DIGITS {
        if end <= start + n || !at(buf, end - n - 1).is_ascii_digit() {
            break;
        }
        n += 1;
    }
    n
}

/// The name in a `sockaddr_un` of `len` bytes (`sun_path` from `start`; ending at its first NUL
/// unless abstract) when its basename is `dotnet-diagnostic-<digits>-<digits>-socket` — the
/// pattern `tracer_decode::unix_socket::diagnostic_socket_name` matches. Returns its end.
///
/// The end of a path comes from a string-copy helper, not a loop: the verifier then knows it as
/// one bounded value, where a loop's exits would give it a constant per path and the checks
/// below would be verified once per possible length (over the verifier's budget).
#[inline(always)]
fn diagnostic_name_end(
    buf: &[u8; SOCKADDR_BUF_LEN],
    len: usize,
    start: usize,
    abstract_name: bool,
) -> Option<usize> {
    let end = if abstract_name {
        len
    } else {
        let mut copy = [0u8; SOCKADDR_BUF_LEN];
        // SAFETY: `buf` is zero past the `len` bytes read (and `len` ≤ SOCKADDR_UN_LEN <
        // SOCKADDR_BUF_LEN), so the string ends inside it; the copy is bounded by `copy`.
        let path = unsafe {
            bpf_probe_read_kernel_str_bytes(buf.as_ptr().add(SUN_PATH), &mut copy[..=UNIX_PATH_MAX])
        }
        .ok()?;
        (SUN_PATH + path.len()).min(len)
    };
    if end < start + MIN_NAME_LEN {
        return None;
    }
    let suffix = DIAGNOSTIC_SOCKET_SUFFIX;
    let mut i = end - suffix.len();
    for (k, &c) in suffix.iter().enumerate() {
        if at(buf, i + k) != c {
            return None;
        }
    }
    for _number in 0..2 {
        let digits = digits_before(buf, i, start);
        if digits == 0 {
            return None;
        }
        i -= digits;
        // The `-` before the key, then the prefix's last byte before the pid.
        if i <= start || at(buf, i - 1) != b'-' {
            return None;
        }
        i -= 1;
    }
    // `i` is now just past the prefix without its trailing `-`.
    let prefix = DIAGNOSTIC_SOCKET_PREFIX;
    let head = prefix.len() - 1;
    if i < start + head {
        return None;
    }
    i -= head;
    for (k, &c) in prefix[..head].iter().enumerate() {
        if at(buf, i + k) != c {
            return None;
        }
    }
    if i > start && at(buf, i - 1) != b'/' {
        return None;
    }
    Some(end)
}

/// A process binding its diagnostic server's socket: reported once per process image, at entry
/// (the name is in user memory now; whether the bind succeeds the session finds out).
#[tracepoint(category = "syscalls", name = "sys_enter_bind")]
pub fn sys_enter_bind(ctx: TracePointContext) -> u32 {
    bound(&ctx)
}

/// The trampoline twin of `sys_enter_bind` (at the return, where the kernel has copied the
/// address: its page is resident).
#[fexit(function = "__x64_sys_bind")]
pub fn fexit_bind(ctx: FExitContext) -> u32 {
    bound(&SavedRegs::of(&ctx))
}

#[inline(always)]
fn bound(args: &impl SyscallArgs) -> u32 {
    let addrlen = args.arg(2);
    if addrlen < (SUN_PATH + MIN_NAME_LEN) as u64 {
        return 0;
    }
    let tgid = current_tgid();
    if reported_kinds(tgid) & REPORTED_IPC_SOCKET != 0 || excluded(tgid) {
        return 0;
    }
    let len = (addrlen as usize).min(SOCKADDR_UN_LEN);
    let mut buf = [0u8; SOCKADDR_BUF_LEN];
    let src = args.arg(1) as *const u8;
    // SAFETY: reads user memory through the helper, at most `SOCKADDR_UN_LEN` bytes into `buf`.
    if unsafe { bpf_probe_read_user_buf(src, &mut buf[..len]) }.is_err() {
        count_loss(EventKind::DotnetIpcSocket, LossReason::ReadFailed);
        return 0;
    }
    if u16::from_ne_bytes([buf[0], buf[1]]) != AF_UNIX {
        return 0;
    }
    let abstract_name = buf[SUN_PATH] == 0;
    let start = if abstract_name { SUN_PATH + 1 } else { SUN_PATH };
    let Some(end) = diagnostic_name_end(&buf, len, start, abstract_name) else { return 0 };

    // Two threads binding at once may both report: a duplicate, never a miss.
    let reported = reported_kinds(tgid) | REPORTED_IPC_SOCKET;
    if REPORTED_KINDS.insert(&tgid, &reported, 0).is_err() {
        count_loss(EventKind::DotnetIpcSocket, LossReason::MapFull);
    }
    track(tgid, EventKind::DotnetIpcSocket);
    let Some((mut entry, seq)) = reserve!(IpcBindEvent, EventKind::DotnetIpcSocket) else {
        return 0;
    };
    // SAFETY: the reservation is exactly one IpcBindEvent; every field is written below.
    let ev = unsafe { &mut *entry.as_mut_ptr() };
    fill_header(&mut ev.header, EventKind::DotnetIpcSocket, seq);
    ev.fd = args.arg(0) as i32;
    ev.addrlen = addrlen as u32;
    ev.abstract_name = u32::from(abstract_name);
    let path_len = end - start;
    ev.path_len = path_len as u32;
    for k in 0..SOCKADDR_BUF_LEN {
        ev.path[k] = if k < path_len { at(&buf, start + k) } else { 0 };
    }
    entry.submit(BPF_RB_FORCE_WAKEUP);
    0
}

// ---------------------------------------------------------------------------------------------
// ioctl (user_events)

#[inline(always)]
fn user_events_kind(cmd: u64) -> Option<EventKind> {
    // Callers declaring `int request` sign-extend the command: compare the low 32 bits only.
    match cmd as u32 {
        DIAG_IOCSREG => Some(EventKind::UserEventsRegister),
        DIAG_IOCSDEL => Some(EventKind::UserEventsDelete),
        DIAG_IOCSUNREG => Some(EventKind::UserEventsUnregister),
        _ => None,
    }
}

#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    let cmd = syscall_arg(&ctx, 1);
    let Some(kind) = user_events_kind(cmd) else { return 0 };
    let pid_tgid = bpf_get_current_pid_tgid();
    if excluded((pid_tgid >> 32) as u32) {
        return 0;
    }
    let pending =
        PendingIoctl { cmd, arg: syscall_arg(&ctx, 2), fd: syscall_arg(&ctx, 0) as i32, _pad: 0 };
    if PENDING_IOCTL.insert(&pid_tgid, &pending, 0).is_err() {
        count_loss(kind, LossReason::MapFull);
    } else {
        in_flight_add(InFlight::Ioctl, 1);
    }
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_ioctl")]
pub fn sys_exit_ioctl(ctx: TracePointContext) -> u32 {
    let (pending, pid_tgid) = take_pending!(PENDING_IOCTL, InFlight::Ioctl);
    let Some(kind) = user_events_kind(pending.cmd) else { return 0 };
    let ioctl = Ioctl { fd: pending.fd, cmd: pending.cmd, arg: pending.arg };
    user_events_ioctl_done((pid_tgid >> 32) as u32, kind, &ioctl, syscall_ret(&ctx))
}

/// The trampoline twin of the ioctl pair, at the syscall's return: one program sees the
/// arguments and the result, and no other syscall pays for it. (The kernel's own
/// `user_events_ioctl` would spare every other ioctl too, but kernel/trace/ is built without
/// the function-tracer call sites a trampoline attaches to.)
#[fexit(function = "__x64_sys_ioctl")]
pub fn fexit_ioctl(ctx: FExitContext) -> u32 {
    let args = SavedRegs::of(&ctx);
    let cmd = args.arg(1);
    let Some(kind) = user_events_kind(cmd) else { return 0 };
    let tgid = current_tgid();
    if excluded(tgid) {
        return 0;
    }
    let ioctl = Ioctl { fd: args.arg(0) as i32, cmd, arg: args.arg(2) };
    user_events_ioctl_done(tgid, kind, &ioctl, function_ret(&ctx))
}

/// A user_events ioctl as its hook saw it.
struct Ioctl {
    fd: i32,
    cmd: u64,
    arg: u64,
}

/// Reports a finished user_events ioctl with what its argument holds now (the kernel has
/// copied it in, and for REG written `write_index` back).
#[inline(always)]
fn user_events_ioctl_done(tgid: u32, kind: EventKind, ioctl: &Ioctl, ret: i64) -> u32 {
    track(tgid, kind);
    let Some((mut entry, seq)) = reserve!(UserEventsIoctlEvent, kind) else { return 0 };
    // SAFETY: the reservation is exactly one UserEventsIoctlEvent; every field is written below.
    let ev = unsafe { &mut *entry.as_mut_ptr() };
    fill_header(&mut ev.header, kind, seq);
    ev.fd = ioctl.fd;
    ev.ret = ret;
    ev.cmd = ioctl.cmd;
    ev.arg = ioctl.arg;
    ev.arg_read = 0;
    ev.reg_size = 0;
    ev.reg_enable_bit = 0;
    ev.reg_enable_size = 0;
    ev.reg_flags = 0;
    ev.reg_enable_addr = 0;
    ev.reg_name_args = 0;
    ev.reg_write_index = 0;
    ev.name_len = 0;

    // The string to capture: name_args for REG, the event name for DEL, none for UNREG.
    let mut string_ptr = 0u64;
    match kind {
        EventKind::UserEventsRegister => {
            // SAFETY: user memory read through the helper.
            match unsafe { bpf_probe_read_user(ioctl.arg as *const UserReg) } {
                Ok(reg) => {
                    ev.reg_size = reg.size;
                    ev.reg_enable_bit = reg.enable_bit;
                    ev.reg_enable_size = reg.enable_size;
                    ev.reg_flags = reg.flags;
                    ev.reg_enable_addr = reg.enable_addr;
                    ev.reg_name_args = reg.name_args;
                    ev.reg_write_index = reg.write_index;
                    string_ptr = reg.name_args;
                }
                Err(e) => {
                    ev.arg_read = e;
                    count_loss(kind, LossReason::ReadFailed);
                }
            }
        }
        EventKind::UserEventsUnregister => {
            // SAFETY: user memory read through the helper.
            match unsafe { bpf_probe_read_user(ioctl.arg as *const UserUnreg) } {
                Ok(unreg) => {
                    // The `reg_*` fields carry `struct user_unreg` for UNREG (see the doc of
                    // `UserEventsIoctlEvent`; the decoder reads them back the same way).
                    ev.reg_size = unreg.size;
                    ev.reg_enable_bit = unreg.disable_bit;
                    ev.reg_enable_size = unreg.reserved;
                    ev.reg_flags = unreg.reserved2;
                    ev.reg_enable_addr = unreg.disable_addr;
                }
                Err(e) => {
                    ev.arg_read = e;
                    count_loss(kind, LossReason::ReadFailed);
                }
            }
        }
        _ => string_ptr = ioctl.arg,
    }
    if string_ptr != 0 {
        // SAFETY: user memory read through the helper into the reserved entry, bounded by it.
        ev.name_len =
            match unsafe { bpf_probe_read_user_str_bytes(string_ptr as *const u8, &mut ev.name) } {
                Ok(s) => s.len() as i32,
                Err(e) => {
                    count_loss(kind, LossReason::ReadFailed);
                    e
                }
            };
    }
    entry.submit(lazy_wakeup());
    0
}

// ---------------------------------------------------------------------------------------------
// Process lifecycle of tracked processes

/// Whether no thread of the current task's group is left alive: `do_exit` lowers
/// `current->signal->live` before the exit tracepoint fires, and the thread that takes it to 0
/// ends the process (docs/protocol/bpf-detection.md §10). None without the offsets.
#[inline(always)]
fn no_live_thread_left() -> Option<bool> {
    let cfg = config()?;
    if cfg.task_signal_offset == 0 {
        return None;
    }
    // SAFETY: a helper without preconditions; the task is only read through the helper.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let signal = kernel_ptr_at(task, cfg.task_signal_offset)?;
    Some(kernel_value_at::<i32>(signal, cfg.signal_live_offset)? == 0)
}

/// Where a process-lifecycle hook finds what its tracepoint says: in the record of the classic
/// tracepoint (at offsets from its format file) or in the arguments of the BTF-typed one
/// (`tp_btf`: the kernel's own pointers, read at struct offsets from kernel BTF). Each hook's
/// work is written once for both (docs/protocol/bpf-detection.md §10).
trait LifecycleArgs {
    /// `task_newtask`: the new task's id and its clone flags.
    fn new_task(&self, cfg: &Config) -> Option<(u32, u64)>;
    /// `sched_process_fork`: the child's id.
    fn forked_child(&self, cfg: &Config) -> Option<u32>;
    /// `sched_process_exec`: the id of the thread that called exec (0: unknown).
    fn exec_old_tid(&self, cfg: &Config) -> u32;
    /// `sched_process_exec`: copies the executed file's name into `buf`; its length, or the
    /// helper's error.
    fn exec_filename(&self, cfg: &Config, buf: &mut [u8]) -> i32;
}

impl LifecycleArgs for TracePointContext {
    #[inline(always)]
    fn new_task(&self, cfg: &Config) -> Option<(u32, u64)> {
        // SAFETY: offsets come from the tracepoint's format file (user space checks their bounds).
        unsafe {
            let child = self.read_at::<u32>(cfg.newtask_pid_offset as usize).ok()?;
            Some((child, self.read_at::<u64>(cfg.newtask_clone_flags_offset as usize).ok()?))
        }
    }

    #[inline(always)]
    fn forked_child(&self, cfg: &Config) -> Option<u32> {
        // SAFETY: offset from the format file.
        unsafe { self.read_at::<u32>(cfg.fork_child_pid_offset as usize) }.ok()
    }

    #[inline(always)]
    fn exec_old_tid(&self, cfg: &Config) -> u32 {
        // SAFETY: offset from the format file.
        unsafe { self.read_at::<u32>(cfg.exec_old_pid_offset as usize) }.unwrap_or(0)
    }

    #[inline(always)]
    fn exec_filename(&self, cfg: &Config, buf: &mut [u8]) -> i32 {
        // SAFETY: offset from the format file; `filename` is a __data_loc (offset | len << 16)
        // relative to the start of the record.
        unsafe {
            match self.read_at::<u32>(cfg.exec_filename_offset as usize) {
                Ok(loc) => {
                    let src = self.as_ptr_u8().add((loc & 0xffff) as usize);
                    match bpf_probe_read_kernel_str_bytes(src, buf) {
                        Ok(s) => s.len() as i32,
                        Err(e) => e as i32,
                    }
                }
                Err(e) => e as i32,
            }
        }
    }
}

/// `tp_btf` arguments are the tracepoint's own (after its hidden `void *__data`):
/// `task_newtask(task, clone_flags)`, `sched_process_fork(parent, child)`,
/// `sched_process_exec(p, old_pid, bprm)`.
impl LifecycleArgs for BtfTracePointContext {
    #[inline(always)]
    fn new_task(&self, cfg: &Config) -> Option<(u32, u64)> {
        let task: *const u8 = self.arg(0);
        Some((kernel_value_at::<u32>(task, cfg.task_pid_offset)?, self.arg::<u64>(1)))
    }

    #[inline(always)]
    fn forked_child(&self, cfg: &Config) -> Option<u32> {
        kernel_value_at::<u32>(self.arg::<*const u8>(1), cfg.task_pid_offset)
    }

    #[inline(always)]
    fn exec_old_tid(&self, _: &Config) -> u32 {
        self.arg::<u64>(1) as u32
    }

    #[inline(always)]
    fn exec_filename(&self, cfg: &Config, buf: &mut [u8]) -> i32 {
        let Some(name) = kernel_ptr_at(self.arg::<*const u8>(2), cfg.binprm_filename_offset) else {
            return -EFAULT;
        };
        // SAFETY: the helper reads kernel memory without faulting; a bad address is an error.
        match unsafe { bpf_probe_read_kernel_str_bytes(name, buf) } {
            Ok(s) => s.len() as i32,
            Err(e) => e as i32,
        }
    }
}

/// Records the clone flags of a new task so `sched_process_fork` can tell threads from processes.
#[tracepoint(category = "task", name = "task_newtask")]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    new_task(&ctx)
}

#[btf_tracepoint(function = "task_newtask")]
pub fn btf_task_newtask(ctx: BtfTracePointContext) -> u32 {
    new_task(&ctx)
}

/// Also records each new thread of a process with a user_events session in `THREADS`, before
/// the thread first runs (so before it can write a record).
#[inline(always)]
fn new_task(args: &impl LifecycleArgs) -> u32 {
    let tgid = current_tgid();
    let generation = session_generation(tgid);
    let tracked = is_tracked(tgid);
    if generation.is_none() && !tracked {
        return 0;
    }
    let Some(cfg) = config() else { return 0 };
    let Some((child, flags)) = args.new_task(cfg) else {
        count_loss(EventKind::ProcessFork, LossReason::ReadFailed);
        return 0;
    };
    if let Some(generation) = generation
        && flags & CLONE_THREAD != 0
    {
        // SAFETY: a helper without preconditions.
        let born_ns = unsafe { bpf_ktime_get_ns() };
        let tenure = ThreadTenure { tgid, generation, born_ns, exited_ns: 0 };
        // A stale entry of an earlier holder of the tid is replaced.
        if THREADS.insert(&child, &tenure, 0).is_err() {
            count_loss(EventKind::ProcessFork, LossReason::MapFull);
        }
    }
    if tracked && NEW_TASKS.insert(&child, &flags, 0).is_err() {
        count_loss(EventKind::ProcessFork, LossReason::MapFull);
    }
    0
}

/// Stamps the exit of a thread of a process with a user_events session (`generation`) in
/// `THREADS`; a thread that ran before the session and has no entry yet gets one.
#[inline(always)]
fn thread_exited(tid: u32, tgid: u32, generation: u32) {
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(entry) = THREADS.get_ptr_mut(&tid) {
        // SAFETY: the map value stays valid for this run; its fields are plain integers.
        unsafe {
            if (*entry).tgid == tgid && (*entry).generation == generation {
                (*entry).exited_ns = now;
                return;
            }
        }
    }
    let tenure = ThreadTenure { tgid, generation, born_ns: 0, exited_ns: now };
    if THREADS.insert(&tid, &tenure, 0).is_err() {
        count_loss(EventKind::ProcessExit, LossReason::MapFull);
    }
}

#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    forked(&ctx)
}

#[btf_tracepoint(function = "sched_process_fork")]
pub fn btf_sched_process_fork(ctx: BtfTracePointContext) -> u32 {
    forked(&ctx)
}

#[inline(always)]
fn forked(args: &impl LifecycleArgs) -> u32 {
    let tgid = current_tgid();
    if !is_tracked(tgid) {
        return 0;
    }
    let Some(cfg) = config() else { return 0 };
    let Some(child) = args.forked_child(cfg) else {
        count_loss(EventKind::ProcessFork, LossReason::ReadFailed);
        return 0;
    };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(clone_flags) = (unsafe { NEW_TASKS.get(&child) }).copied() else {
        count_loss(EventKind::ProcessFork, LossReason::MapFull);
        return 0;
    };
    let _ = NEW_TASKS.remove(&child);
    if clone_flags & CLONE_THREAD != 0 {
        return 0;
    }
    track(child, EventKind::ProcessFork);
    // SAFETY: read-only lookup.
    if cfg.filter_targets != 0
        && unsafe { TARGETS.get(&tgid) }.is_some()
        && TARGETS.insert(&child, &1, 0).is_err()
    {
        // The child of a target goes unwatched: counted, like every other full map.
        count_loss(EventKind::ProcessFork, LossReason::MapFull);
    }
    if excluded(tgid) {
        return 0;
    }
    let Some((mut entry, seq)) = reserve!(ProcessForkEvent, EventKind::ProcessFork) else {
        return 0;
    };
    // SAFETY: the reservation is exactly one ProcessForkEvent; every field is written below.
    let ev = unsafe { &mut *entry.as_mut_ptr() };
    fill_header(&mut ev.header, EventKind::ProcessFork, seq);
    ev.child_pid = child;
    ev._pad = 0;
    ev.clone_flags = clone_flags;
    entry.submit(lazy_wakeup());
    0
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    executed(&ctx)
}

#[btf_tracepoint(function = "sched_process_exec")]
pub fn btf_sched_process_exec(ctx: BtfTracePointContext) -> u32 {
    executed(&ctx)
}

#[inline(always)]
fn executed(args: &impl LifecycleArgs) -> u32 {
    let tgid = current_tgid();
    // The new image starts without the old one's memfds of interest or runtime.
    forget_memfds(tgid);
    let _ = REPORTED_KINDS.remove(&tgid);
    if !is_tracked(tgid) || excluded(tgid) {
        return 0;
    }
    let Some(cfg) = config() else { return 0 };
    let Some((mut entry, seq)) = reserve!(ProcessExecEvent, EventKind::ProcessExec) else {
        return 0;
    };
    // SAFETY: the reservation is exactly one ProcessExecEvent; every field is written below.
    let ev = unsafe { &mut *entry.as_mut_ptr() };
    fill_header(&mut ev.header, EventKind::ProcessExec, seq);
    ev.old_tid = args.exec_old_tid(cfg);
    ev.filename_len = args.exec_filename(cfg, &mut ev.filename);
    entry.submit(lazy_wakeup());
    0
}

/// `sched_process_exit`'s `group_dead` from the classic tracepoint's record, where the kernel
/// has the field.
#[inline(always)]
fn record_group_dead(ctx: &TracePointContext) -> Option<bool> {
    let cfg = config()?;
    if cfg.exit_group_dead_offset == 0 {
        return None;
    }
    // SAFETY: offset from the format file, checked to be a 1-byte field in the record.
    Some(unsafe { ctx.read_at::<u8>(cfg.exit_group_dead_offset as usize) }.is_ok_and(|v| v != 0))
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    exited(record_group_dead(&ctx))
}

/// For kernels whose `sched_process_exit(p)` has no `group_dead` (6.12): the verifier refuses a
/// program that reads an argument the prototype lacks, so each prototype has its own program.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn btf_sched_process_exit(_ctx: BtfTracePointContext) -> u32 {
    exited(None)
}

/// For kernels whose `sched_process_exit(p, group_dead)` says whether the thread group died.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn btf_sched_process_exit_group(ctx: BtfTracePointContext) -> u32 {
    // A `bool` argument: its low byte.
    exited(Some(ctx.arg::<u64>(1) as u8 != 0))
}

/// `group_dead`: whether this thread's exit ends its process, where the tracepoint says. The
/// last thread to exit need not be the leader (the leader may have exited first). Where the
/// tracepoint does not say, the thread group's live count does, and without its offsets only
/// the leader's exit is taken for the process's.
#[inline(always)]
fn exited(group_dead: Option<bool>) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if let Some(generation) = session_generation(tgid) {
        thread_exited(pid_tgid as u32, tgid, generation);
    }
    let leader = pid_tgid as u32 == tgid;
    if !group_dead.or_else(no_live_thread_left).unwrap_or(leader) {
        return 0;
    }
    forget_memfds(tgid);
    let _ = REPORTED_KINDS.remove(&tgid);
    // One report per process: threads exiting together may all find no live thread left, and
    // only one of them removes the entry.
    if TRACKED.remove(&tgid).is_err() {
        return 0;
    }
    let report = !excluded(tgid);
    let _ = TARGETS.remove(&tgid);
    if !report {
        return 0;
    }
    let Some((mut entry, seq)) = reserve!(ProcessExitEvent, EventKind::ProcessExit) else {
        return 0;
    };
    // SAFETY: the reservation is exactly one ProcessExitEvent.
    let ev = unsafe { &mut *entry.as_mut_ptr() };
    fill_header(&mut ev.header, EventKind::ProcessExit, seq);
    entry.submit(lazy_wakeup());
    0
}

// ---------------------------------------------------------------------------------------------
// Registrations made before tracer started (task iterator)

/// Scratch for one [`EnablerRecord`] (too big for the stack with the rest). Iterator programs
/// run one at a time per CPU, with migration disabled; no other program uses it.
#[map]
static ENABLER_SCRATCH: PerCpuArray<EnablerRecord> = PerCpuArray::with_max_entries(1, 0);

/// A BPF iterator over every task (run when user space reads the iterator): for each process
/// (its leader task) the user_events enablers its mm holds, one [`EnablerRecord`] each, written
/// to the iterator's output (docs/protocol/bpf-detection.md §9). The kernel changes these lists
/// under its own mutex; read here without it, through `bpf_probe_read_kernel`, a list changing
/// meanwhile gives a stale or cut walk, never a fault, and the walk is bounded.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub fn user_events_enablers(ctx: *mut core::ffi::c_void) -> i32 {
    // `struct bpf_iter__task { struct bpf_iter_meta *meta; struct task_struct *task; }`, and
    // `struct bpf_iter_meta { struct seq_file *seq; ... }`: direct loads, so the verifier
    // knows `seq` for `bpf_seq_write`.
    // SAFETY: ctx is the iterator context of that layout.
    let (meta, task) = unsafe {
        let fields = ctx.cast::<*const u8>();
        (*fields, *fields.add(1))
    };
    if task.is_null() {
        return 0;
    }
    // SAFETY: `meta` is the kernel's non-null iterator metadata for this run.
    let seq = unsafe { *meta.cast::<*mut aya_ebpf::bindings::seq_file>() };
    let Some(cfg) = config() else { return 0 };
    let (Some(pid), Some(tgid)) = (
        kernel_value_at::<u32>(task, cfg.task_pid_offset),
        kernel_value_at::<u32>(task, cfg.task_tgid_offset),
    ) else {
        return 0;
    };
    // The enablers belong to the mm, which every thread shares: the leader reports them.
    if pid != tgid || excluded(tgid) {
        return 0;
    }
    let Some(user_mm) = kernel_ptr_at(task, cfg.task_user_event_mm_offset) else { return 0 };
    let Some(rec) = ENABLER_SCRATCH.get_ptr_mut(0) else { return 0 };
    // SAFETY: the per-CPU scratch value, this program's alone while it runs.
    let rec = unsafe { &mut *rec };
    rec.pid = tgid;
    rec._pad = 0;
    // SAFETY: an address computed for comparison only, never dereferenced directly.
    let head = unsafe { user_mm.add(cfg.user_event_mm_enablers_offset as usize) };
    let mut node = kernel_ptr_at(head, 0);
    let mut read = 0;
    while read < MAX_ENABLERS_PER_PROCESS {
        let Some(link) = node.filter(|n| *n != head) else { return 0 };
        // SAFETY: as above: `container_of`, read only through the helper.
        let enabler = unsafe { link.sub(cfg.enabler_link_offset as usize) };
        rec.kind = EnablerRecordKind::Enabler as u32;
        rec.enable_addr = kernel_value_at(enabler, cfg.enabler_addr_offset).unwrap_or(0);
        rec.values = kernel_value_at(enabler, cfg.enabler_values_offset).unwrap_or(0);
        rec.name = [0; ENABLER_NAME_LEN];
        rec.name_len = match kernel_ptr_at(enabler, cfg.enabler_event_offset)
            .and_then(|event| kernel_ptr_at(event, cfg.user_event_name_offset))
        {
            // SAFETY: reads kernel memory through the helper into the scratch, bounded by it.
            Some(name) => match unsafe { bpf_probe_read_kernel_str_bytes(name, &mut rec.name) } {
                Ok(s) => s.len() as i32,
                Err(e) => e as i32,
            },
            None => -EFAULT,
        };
        // SAFETY: `seq` is the iterator's seq_file; `rec` is a plain struct of that size.
        unsafe {
            bpf_seq_write(
                seq,
                (rec as *const EnablerRecord).cast(),
                size_of::<EnablerRecord>() as u32,
            )
        };
        node = kernel_ptr_at(link, 0);
        read += 1;
    }
    if node.is_some_and(|n| n != head) {
        rec.kind = EnablerRecordKind::Truncated as u32;
        // SAFETY: as above.
        unsafe {
            bpf_seq_write(
                seq,
                (rec as *const EnablerRecord).cast(),
                size_of::<EnablerRecord>() as u32,
            )
        };
    }
    0
}

trait CtxBytes {
    fn as_ptr_u8(&self) -> *const u8;
}

impl CtxBytes for TracePointContext {
    fn as_ptr_u8(&self) -> *const u8 {
        use aya_ebpf::EbpfContext;
        self.as_ptr() as *const u8
    }
}
