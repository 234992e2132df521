//! Wire types shared by the eBPF programs (`tracer-ebpf`) and user space (`tracer`).
//!
//! Every event starts with an [`EventHeader`]; `EventHeader::kind` says which struct follows.
//! All structs are `#[repr(C)]` with explicit padding so both sides agree on the layout, and
//! user space decodes them from untrusted byte slices (`tracer_decode::bpf_event`). The sampling
//! programs' types are in [`sampling`].
#![no_std]

pub mod sampling;

pub const TASK_COMM_LEN: usize = 16;
/// `MFD_NAME_MAX_LEN` is 249 bytes + NUL; 256 keeps the buffer a power of two for the verifier.
pub const MEMFD_NAME_LEN: usize = 256;
/// `MAX_EVENT_DESC` of user_events: the longest `name_args` the kernel accepts.
pub const USER_EVENT_NAME_LEN: usize = 512;
pub const EXEC_FILENAME_LEN: usize = 256;

/// user_events ioctls (64-bit values; the size field encodes `sizeof(pointer)`).
pub const DIAG_IOCSREG: u32 = 0xC008_2A00;
pub const DIAG_IOCSDEL: u32 = 0x4008_2A01;
pub const DIAG_IOCSUNREG: u32 = 0x4008_2A02;

/// `struct user_reg` of `include/uapi/linux/user_events.h` (packed, 28 bytes), as passed to
/// `DIAG_IOCSREG`. Read fields by value (never by reference: the struct is packed).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UserReg {
    pub size: u32,
    pub enable_bit: u8,
    pub enable_size: u8,
    pub flags: u16,
    pub enable_addr: u64,
    pub name_args: u64,
    /// Written by the kernel on success.
    pub write_index: u32,
}

/// `struct user_unreg` (packed, 16 bytes), as passed to `DIAG_IOCSUNREG`.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UserUnreg {
    pub size: u32,
    pub disable_bit: u8,
    pub reserved: u8,
    pub reserved2: u16,
    pub disable_addr: u64,
}

const _: () = assert!(core::mem::size_of::<UserReg>() == 28);
const _: () = assert!(core::mem::size_of::<UserUnreg>() == 16);

/// Name the .NET runtime (11+, 10.x backport) gives the memfd it maps once its diagnostic IPC is
/// ready.
pub const DOTNET_IPC_MEMFD_NAME: &[u8] = b"dotnet_ipc_created";
/// Name CoreCLR (7+, W^X enabled) gives the memfd behind its executable memory.
pub const DOUBLEMAPPER_MEMFD_NAME: &[u8] = b"doublemapper";

/// `sizeof(sun_path)` of `struct sockaddr_un`.
pub const UNIX_PATH_MAX: usize = 108;
/// `sizeof(struct sockaddr_un)`: `sun_family` (2 bytes) + `sun_path`.
pub const SOCKADDR_UN_LEN: usize = 2 + UNIX_PATH_MAX;
/// `AF_UNIX`.
pub const AF_UNIX: u16 = 1;
/// Buffer for a `sockaddr_un` read from user memory: a power of two above
/// [`SOCKADDR_UN_LEN`], so an index masked with `SOCKADDR_BUF_LEN - 1` is always in bounds.
pub const SOCKADDR_BUF_LEN: usize = 128;
/// Basename of a .NET diagnostic server socket: `dotnet-diagnostic-<pid>-<key>-socket`.
pub const DIAGNOSTIC_SOCKET_PREFIX: &[u8] = b"dotnet-diagnostic-";
pub const DIAGNOSTIC_SOCKET_SUFFIX: &[u8] = b"-socket";
/// Most decimal digits of the pid and of the key in a diagnostic socket name (every 19-digit
/// number fits a u64; a runtime writes a pid and a start time in clock ticks): a longer run is
/// not a runtime's name.
pub const DIAGNOSTIC_SOCKET_MAX_DIGITS: usize = 19;

/// Kind of every record on the BPF ring buffer. Values are the wire encoding.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    MemfdCreate = 1,
    DotnetIpcReady = 2,
    DotnetRuntimeSeen = 3,
    UserEventsRegister = 4,
    UserEventsDelete = 5,
    UserEventsUnregister = 6,
    ProcessFork = 7,
    ProcessExec = 8,
    ProcessExit = 9,
    /// `bind()` of an `AF_UNIX` socket named `dotnet-diagnostic-<pid>-<key>-socket`: a
    /// runtime's diagnostic server (every .NET since Core 3.0) is about to listen.
    DotnetIpcSocket = 10,
}

impl EventKind {
    /// The name of the kind in output lines and summaries.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::MemfdCreate => "memfd_create",
            EventKind::DotnetIpcReady => "dotnet_ipc_ready",
            EventKind::DotnetRuntimeSeen => "dotnet_runtime_seen",
            EventKind::UserEventsRegister => "user_events_register",
            EventKind::UserEventsDelete => "user_events_delete",
            EventKind::UserEventsUnregister => "user_events_unregister",
            EventKind::ProcessFork => "process_fork",
            EventKind::ProcessExec => "process_exec",
            EventKind::ProcessExit => "process_exit",
            EventKind::DotnetIpcSocket => "dotnet_ipc_socket",
        }
    }

    /// Number of slots in per-kind tables (index 0 is unused so the wire value is the index).
    pub const TABLE_LEN: usize = 11;
    pub const ALL: [EventKind; 10] = [
        EventKind::MemfdCreate,
        EventKind::DotnetIpcReady,
        EventKind::DotnetRuntimeSeen,
        EventKind::UserEventsRegister,
        EventKind::UserEventsDelete,
        EventKind::UserEventsUnregister,
        EventKind::ProcessFork,
        EventKind::ProcessExec,
        EventKind::ProcessExit,
        EventKind::DotnetIpcSocket,
    ];

    pub fn from_u32(v: u32) -> Option<EventKind> {
        EventKind::ALL.iter().copied().find(|k| *k as u32 == v)
    }
}

/// Why an event could not be delivered intact; one per-CPU counter per (event kind, reason).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// `bpf_ringbuf_reserve` failed: the ring was full, the event is gone.
    RingFull = 0,
    /// A `bpf_probe_read_*` of the syscall's argument failed; the event was sent with a status.
    ReadFailed = 1,
    /// The enter→exit pending map or a tracking map was full; the event could not be correlated.
    MapFull = 2,
}

impl LossReason {
    /// The name of the reason in output lines and summaries.
    pub fn name(self) -> &'static str {
        match self {
            LossReason::RingFull => "ring_full",
            LossReason::ReadFailed => "read_failed",
            LossReason::MapFull => "map_full",
        }
    }

    pub const COUNT: usize = 3;
    pub const ALL: [LossReason; 3] =
        [LossReason::RingFull, LossReason::ReadFailed, LossReason::MapFull];

    /// Index into the `COUNTERS` per-CPU array.
    pub const fn counter_index(kind: EventKind, reason: LossReason) -> u32 {
        kind as u32 * LossReason::COUNT as u32 + reason as u32
    }
}

pub const COUNTERS_LEN: u32 = (EventKind::TABLE_LEN * LossReason::COUNT) as u32;

/// Which memfd of interest a mapping or creation refers to.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemfdKind {
    DotnetIpcCreated = 1,
    DoubleMapper = 2,
}

impl MemfdKind {
    /// The memfd name this kind stands for.
    pub fn name(self) -> &'static str {
        match self {
            MemfdKind::DotnetIpcCreated => "dotnet_ipc_created",
            MemfdKind::DoubleMapper => "doublemapper",
        }
    }

    pub fn from_u32(v: u32) -> Option<MemfdKind> {
        match v {
            1 => Some(MemfdKind::DotnetIpcCreated),
            2 => Some(MemfdKind::DoubleMapper),
            _ => None,
        }
    }
}

/// Common prefix of every ring-buffer record (72 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventHeader {
    pub kind: u32,
    /// CPU the event was produced on; `seq` counts per CPU so user space can see gaps.
    pub cpu: u32,
    pub seq: u64,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ktime_ns: u64,
    /// Thread-group id (the process id user space sees).
    pub pid: u32,
    pub tid: u32,
    pub uid: u32,
    pub gid: u32,
    pub cgroup_id: u64,
    pub comm: [u8; TASK_COMM_LEN],
    /// The process's start (its thread group leader's `start_boottime`): CLOCK_BOOTTIME
    /// nanoseconds; 0 where the offsets are not known (no kernel BTF). With `pid` it names one
    /// process across pid reuse (docs/protocol/bpf-detection.md §11).
    pub process_start_ns: u64,
}

/// Processes with a user_events session at once whose threads the kernel records
/// (`SESSION_PROCESSES`): one more session is refused.
pub const MAX_SESSION_PROCESSES: u32 = 4096;
/// Threads of processes with user_events sessions recorded at once (`THREADS`, allocated as
/// used): a thread created beyond it is counted (`map_full`) and its records are dropped.
pub const THREAD_TABLE_ENTRIES: u32 = 65536;

/// The thread → process relation of one thread of a process with a user_events session
/// (`THREADS`, keyed by thread id): the session's records carry only the writing thread's id,
/// which must still be attributed to its process after the thread has exited
/// (docs/protocol/bpf-detection.md §12).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadTenure {
    /// The process (thread group) the thread belongs to.
    pub tgid: u32,
    /// The session generation (`SESSION_PROCESSES` value) current when the thread was recorded:
    /// an entry left by a previous session with a reused pid never matches a later one.
    pub generation: u32,
    /// CLOCK_MONOTONIC nanoseconds the thread was created at; 0: it already ran when the session
    /// started (recorded by user space from `/proc/<pid>/task`).
    pub born_ns: u64,
    /// CLOCK_MONOTONIC nanoseconds the thread exited at; 0 while it runs.
    pub exited_ns: u64,
}

/// `memfd_create` of a name of interest, at syscall entry: its result is not known
/// (docs/protocol/bpf-detection.md §7).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemfdCreateEvent {
    pub header: EventHeader,
    pub memfd_kind: u32,
    pub flags: u32,
    /// Bytes of `name` read (without NUL), or a negative errno if the read failed.
    pub name_len: i32,
    pub _pad: u32,
    pub name: [u8; MEMFD_NAME_LEN],
}

/// An `mmap` of a memfd of interest: `DotnetIpcReady` or `DotnetRuntimeSeen`. From the syscall
/// tracepoint it is seen at entry (result unknown); from the BPF trampoline on the syscall
/// function, at its return.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MmapEvent {
    pub header: EventHeader,
    pub memfd_kind: u32,
    pub fd: i32,
    /// The `addr` argument (0: the kernel chooses). Without a known result, where the mapping
    /// went is read from `/proc/<pid>/maps`.
    pub addr_hint: u64,
    pub len: u64,
    pub prot: u64,
    pub flags: u64,
    pub offset: u64,
    /// The syscall's result (the address, or -errno) when `ret_known` is 1.
    pub ret: i64,
    pub ret_known: u32,
    pub _pad: u32,
}

/// A user_events ioctl (`DIAG_IOCSREG`, `DIAG_IOCSDEL`, `DIAG_IOCSUNREG`), read at syscall exit.
///
/// For REG the `reg_*` fields are `struct user_reg`; for UNREG they hold `struct user_unreg`
/// (`reg_enable_bit` = disable_bit, `reg_enable_size`/`reg_flags` = the reserved fields,
/// `reg_enable_addr` = disable_addr). For DEL only `name` is meaningful.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserEventsIoctlEvent {
    pub header: EventHeader,
    pub fd: i32,
    /// 0 when the argument struct was read, else the negative errno of the read.
    pub arg_read: i32,
    /// 0 or -errno.
    pub ret: i64,
    /// Full 64-bit command register as the tracepoint saw it.
    pub cmd: u64,
    pub arg: u64,
    pub reg_size: u32,
    pub reg_enable_bit: u8,
    pub reg_enable_size: u8,
    pub reg_flags: u16,
    pub reg_enable_addr: u64,
    pub reg_name_args: u64,
    pub reg_write_index: u32,
    /// Bytes of `name` read (without NUL), or a negative errno; 0 when there is no string.
    pub name_len: i32,
    pub name: [u8; USER_EVENT_NAME_LEN],
}

/// A new process (not a thread) was forked; the header describes the parent.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessForkEvent {
    pub header: EventHeader,
    pub child_pid: u32,
    pub _pad: u32,
    pub clone_flags: u64,
}

/// `execve` succeeded; the header describes the process after exec.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessExecEvent {
    pub header: EventHeader,
    /// Thread id that called exec (differs from the pid when a non-leader thread execs).
    pub old_tid: u32,
    /// Bytes of `filename` read, or a negative errno.
    pub filename_len: i32,
    pub filename: [u8; EXEC_FILENAME_LEN],
}

/// The thread-group leader exited (emitted once per process).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessExitEvent {
    pub header: EventHeader,
}

/// `bind()` of an `AF_UNIX` socket whose name has a diagnostic socket's basename (emitted at
/// syscall entry: whether the bind succeeds is for user space to find out).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IpcBindEvent {
    pub header: EventHeader,
    pub fd: i32,
    /// The `addrlen` argument.
    pub addrlen: u32,
    /// 1: an abstract name (`sun_path[0] == 0`; `path` holds the bytes after that NUL).
    pub abstract_name: u32,
    /// Bytes of `path` that are the name (at most [`UNIX_PATH_MAX`]).
    pub path_len: u32,
    pub path: [u8; SOCKADDR_BUF_LEN],
}

/// The name buffer of an [`EnablerRecord`]: event names longer than 127 bytes are cut.
pub const ENABLER_NAME_LEN: usize = 128;

/// Most enablers the task iterator reads per process; past them it writes a truncation record.
pub const MAX_ENABLERS_PER_PROCESS: u32 = 64;

/// What one record of the task iterator's output is.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnablerRecordKind {
    /// A registration the process holds.
    Enabler = 1,
    /// The process holds more than [`MAX_ENABLERS_PER_PROCESS`]: the rest were not read.
    Truncated = 2,
}

/// One user_events enabler (a registration) a process holds, as the task iterator
/// (`user_events_enablers`) reads it from the kernel's `task->user_event_mm->enablers` when
/// tracer starts: the registrations made before tracer ran. Written to the iterator's output
/// (`bpf_seq_write`), not the ring.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EnablerRecord {
    pub kind: u32,
    pub pid: u32,
    /// The address of the enable word in the process.
    pub enable_addr: u64,
    /// The kernel's `values` word: the bit (low 6 bits) and state flags.
    pub values: u64,
    /// Bytes of `name` read (without NUL), or a negative errno.
    pub name_len: i32,
    pub _pad: u32,
    /// The event's name (`user_event.reg_name`).
    pub name: [u8; ENABLER_NAME_LEN],
}

/// Offsets in x86-64's `struct pt_regs` of syscall arguments 0..6 (`di`, `si`, `dx`, `r10`,
/// `r8`, `r9`; fixed by the entry code that pushes the registers): where the BPF-trampoline
/// programs on `__x64_sys_*` functions load the arguments, with direct loads the verifier
/// checks against kernel BTF. User space attaches them only where kernel BTF has these same
/// offsets (docs/protocol/bpf-detection.md §8).
pub const SYSCALL_ARG_OFFSETS: [usize; 6] = [112, 104, 96, 56, 72, 64];

/// Settings user space writes into the `CONFIG` array (index 0) before attaching.
///
/// Tracepoint field offsets vary between kernels (e.g. `sched_process_fork` switched its comm
/// fields to `__data_loc` in recent kernels), so user space reads them from the `format` files.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Events from this tgid (tracer itself) are never emitted.
    pub tracer_tgid: u32,
    /// Non-zero: only tgids present in the `TARGETS` map are reported.
    pub filter_targets: u32,
    /// `sched_process_fork.child_pid`.
    pub fork_child_pid_offset: u32,
    /// `task_newtask.pid` and `task_newtask.clone_flags`.
    pub newtask_pid_offset: u32,
    pub newtask_clone_flags_offset: u32,
    /// `sched_process_exec.filename` (`__data_loc char[]`) and `old_pid`.
    pub exec_filename_offset: u32,
    pub exec_old_pid_offset: u32,
    /// `sched_process_exit.group_dead`; 0 on kernels whose tracepoint lacks it.
    pub exit_group_dead_offset: u32,
    /// Struct member offsets from kernel BTF, for the name of the file an `mmap` maps
    /// (docs/protocol/bpf-detection.md §7): `task_struct.files`, `files_struct.fdt`,
    /// `fdtable.max_fds`, `fdtable.fd`, `file.f_path` + `path.dentry`, `dentry.d_name` +
    /// `qstr.name`. Without kernel BTF the memfd programs are not attached.
    pub task_files_offset: u32,
    pub files_fdt_offset: u32,
    pub fdtable_max_fds_offset: u32,
    pub fdtable_fd_offset: u32,
    pub file_dentry_offset: u32,
    pub dentry_name_offset: u32,
    /// Offsets from kernel BTF for the task iterator (docs/protocol/bpf-detection.md §9):
    /// `task_struct.pid`, `.tgid`, `.user_event_mm`, `user_event_mm.enablers`,
    /// `user_event_enabler.mm_enablers_link`, `.event`, `.addr`, `.values`, `user_event.reg_name`.
    pub task_pid_offset: u32,
    pub task_tgid_offset: u32,
    pub task_user_event_mm_offset: u32,
    pub user_event_mm_enablers_offset: u32,
    pub enabler_link_offset: u32,
    pub enabler_event_offset: u32,
    pub enabler_addr_offset: u32,
    pub enabler_values_offset: u32,
    pub user_event_name_offset: u32,
    /// For the BTF-typed lifecycle programs (`tp_btf`, docs/protocol/bpf-detection.md §10):
    /// `linux_binprm.filename`. They use `task_pid_offset` too.
    pub binprm_filename_offset: u32,
    /// `task_struct.signal` and `signal_struct.live` (an `atomic_t`), from kernel BTF: where
    /// `sched_process_exit` does not say whether the thread group died, a live count of 0 does
    /// (docs/protocol/bpf-detection.md §10). 0: not known, the leader's exit is taken instead.
    pub task_signal_offset: u32,
    pub signal_live_offset: u32,
    /// `task_struct.group_leader` and `task_struct.start_boottime`, from kernel BTF: every
    /// event's `process_start_ns` (docs/protocol/bpf-detection.md §11). 0: not known.
    pub task_group_leader_offset: u32,
    pub task_start_boottime_offset: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain-old-data structs without references, with explicit padding.
    unsafe impl aya::Pod for super::Config {}
    // SAFETY: as above: two u32 then two u64, no padding.
    unsafe impl aya::Pod for super::ThreadTenure {}
}
