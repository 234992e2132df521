//! Decoder for the records the detection programs put on the `EVENTS` BPF ring buffer
//! (layouts in `tracer_common`). The bytes are untrusted: lengths are checked before any read,
//! reads are unaligned copies, and every inconsistency is a typed error, never a panic.
use std::mem::size_of;
use std::ptr;

use thiserror::Error;

use crate::unix_socket::{DiagnosticSocketName, diagnostic_socket_name};
use tracer_common::{
    DIAG_IOCSDEL, DIAG_IOCSREG, DIAG_IOCSUNREG, ENABLER_NAME_LEN, EnablerRecord, EnablerRecordKind,
    EventHeader, EventKind, IpcBindEvent, MemfdCreateEvent, MemfdKind, MmapEvent, ProcessExecEvent,
    ProcessExitEvent, ProcessForkEvent, UNIX_PATH_MAX, UserEventsIoctlEvent,
};

/// Header fields shared by every event (the task that caused it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventMeta {
    pub kind: EventKind,
    pub cpu: u32,
    /// Per-CPU, per-kind sequence number (gaps are events that were lost).
    pub seq: u64,
    /// CLOCK_MONOTONIC nanoseconds.
    pub ktime_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub uid: u32,
    pub gid: u32,
    pub cgroup_id: u64,
    pub comm: String,
    /// When the process started (its leader's `start_boottime`, CLOCK_BOOTTIME nanoseconds,
    /// exact); `None` where the programs could not read it (no kernel BTF).
    pub process_start_ns: Option<u64>,
}

/// A string read from user (or kernel) memory by the BPF program: its bytes, or the negative
/// errno the read failed with.
pub type Captured = Result<Vec<u8>, i32>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemfdCreate {
    pub memfd_kind: MemfdKind,
    pub flags: u32,
    pub name: Captured,
}

/// An `mmap` of a memfd of interest, as its arguments asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub memfd_kind: MemfdKind,
    pub fd: i32,
    /// The `addr` argument (0: the kernel chooses).
    pub addr_hint: u64,
    pub len: u64,
    pub prot: u64,
    pub flags: u64,
    pub offset: u64,
    /// The result (address or −errno), when the hook saw the syscall return.
    pub ret: Option<i64>,
}

/// `struct user_reg` as the process passed it (`write_index` as the kernel returned it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserReg {
    pub size: u32,
    pub enable_bit: u8,
    pub enable_size: u8,
    pub flags: u16,
    pub enable_addr: u64,
    /// User pointer to the `name_args` string.
    pub name_args_ptr: u64,
    pub write_index: u32,
}

/// `struct user_unreg` as the process passed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserUnreg {
    pub size: u32,
    pub disable_bit: u8,
    pub reserved: u8,
    pub reserved2: u16,
    pub disable_addr: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserEventsOp {
    /// `DIAG_IOCSREG`: the struct (or the errno reading it failed with) and `name_args`
    /// (`None` when the struct could not be read or its pointer is NULL).
    Register { reg: Result<UserReg, i32>, name_args: Option<Captured> },
    /// `DIAG_IOCSDEL`: the event name (`None` for a NULL argument).
    Delete { name: Option<Captured> },
    /// `DIAG_IOCSUNREG`.
    Unregister { unreg: Result<UserUnreg, i32> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserEventsIoctl {
    pub fd: i32,
    /// 0 or −errno.
    pub ret: i64,
    /// The full 64-bit command register.
    pub cmd: u64,
    pub arg: u64,
    pub op: UserEventsOp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventBody {
    MemfdCreate(MemfdCreate),
    DotnetIpcReady(Mapping),
    DotnetRuntimeSeen(Mapping),
    UserEvents(UserEventsIoctl),
    ProcessFork { child_pid: u32, clone_flags: u64 },
    ProcessExec { old_tid: u32, filename: Captured },
    ProcessExit,
    DotnetIpcSocket(IpcSocket),
}

impl EventBody {
    /// A .NET runtime was found: its diagnostic IPC is ready (`dotnet_ipc_created`), its W^X
    /// `doublemapper` was mapped, or it bound its diagnostic socket. The pipelines that start
    /// sessions or sample processes take these.
    pub fn finds_a_runtime(&self) -> bool {
        matches!(
            self,
            EventBody::DotnetIpcReady(_)
                | EventBody::DotnetRuntimeSeen(_)
                | EventBody::DotnetIpcSocket(_)
        )
    }
}

/// A `bind()` of an `AF_UNIX` socket with a diagnostic server's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcSocket {
    pub fd: i32,
    pub addrlen: u32,
    /// An abstract name (`path` is what follows its leading NUL).
    pub abstract_name: bool,
    pub path: Vec<u8>,
    pub name: DiagnosticSocketName,
}

/// One decoded ring-buffer record, owning its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectionEvent {
    pub meta: EventMeta,
    pub body: EventBody,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than the {HEADER_LEN}-byte event header")]
    TooShortForHeader { len: usize },
    #[error("unknown event kind {kind} in a {len}-byte record")]
    UnknownKind { kind: u32, len: usize },
    #[error("{kind:?} record has {len} bytes, expected {expected}")]
    WrongLength { kind: EventKind, len: usize, expected: usize },
    #[error("{kind:?} record: {field} length {len} exceeds its {max}-byte buffer")]
    BadStringLength { kind: EventKind, field: &'static str, len: i32, max: usize },
    #[error("{kind:?} record: unknown memfd kind {value}")]
    UnknownMemfdKind { kind: EventKind, value: u32 },
    #[error("{kind:?} record describes a {memfd_kind:?} memfd, which belongs to another kind")]
    MemfdKindMismatch { kind: EventKind, memfd_kind: MemfdKind },
    #[error("{kind:?} record names a socket that is not a diagnostic server's")]
    NotADiagnosticSocket { kind: EventKind },
    #[error("{kind:?} record carries ioctl command {cmd:#x}, which belongs to another kind")]
    CommandMismatch { kind: EventKind, cmd: u64 },
}

const HEADER_LEN: usize = size_of::<EventHeader>();

/// Wire structs of `tracer_common`: `#[repr(C)]`, integers and byte arrays only, so every bit
/// pattern is a valid value and an unaligned copy out of a byte slice is sound.
trait Wire: Copy {}
impl Wire for EventHeader {}
impl Wire for MemfdCreateEvent {}
impl Wire for MmapEvent {}
impl Wire for UserEventsIoctlEvent {}
impl Wire for ProcessForkEvent {}
impl Wire for ProcessExecEvent {}
impl Wire for ProcessExitEvent {}
impl Wire for IpcBindEvent {}
impl Wire for EnablerRecord {}

/// Copies a `T` from the start of `bytes`; the caller has checked `bytes.len() >= size_of::<T>()`.
fn read_wire<T: Wire>(bytes: &[u8]) -> T {
    assert!(bytes.len() >= size_of::<T>());
    // SAFETY: length checked above; `T: Wire` accepts any bit pattern; unaligned read.
    unsafe { ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

/// The wire size of the struct that carries events of `kind`.
pub fn wire_size(kind: EventKind) -> usize {
    match kind {
        EventKind::MemfdCreate => size_of::<MemfdCreateEvent>(),
        EventKind::DotnetIpcReady | EventKind::DotnetRuntimeSeen => size_of::<MmapEvent>(),
        EventKind::UserEventsRegister
        | EventKind::UserEventsDelete
        | EventKind::UserEventsUnregister => size_of::<UserEventsIoctlEvent>(),
        EventKind::ProcessFork => size_of::<ProcessForkEvent>(),
        EventKind::ProcessExec => size_of::<ProcessExecEvent>(),
        EventKind::ProcessExit => size_of::<ProcessExitEvent>(),
        EventKind::DotnetIpcSocket => size_of::<IpcBindEvent>(),
    }
}

/// Bytes up to the first NUL (or all of them), as text.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A string the BPF program captured: `len` bytes of `buf`, or `len` is the negative errno.
fn captured(
    kind: EventKind,
    field: &'static str,
    len: i32,
    buf: &[u8],
) -> Result<Captured, DecodeError> {
    if len < 0 {
        return Ok(Err(len));
    }
    buf.get(..len as usize).map(|s| Ok(s.to_vec())).ok_or(DecodeError::BadStringLength {
        kind,
        field,
        len,
        max: buf.len(),
    })
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<DetectionEvent, DecodeError> {
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::TooShortForHeader { len: bytes.len() });
    }
    let header: EventHeader = read_wire(bytes);
    let kind = EventKind::from_u32(header.kind)
        .ok_or(DecodeError::UnknownKind { kind: header.kind, len: bytes.len() })?;
    let expected = wire_size(kind);
    if bytes.len() != expected {
        return Err(DecodeError::WrongLength { kind, len: bytes.len(), expected });
    }
    let meta = EventMeta {
        kind,
        cpu: header.cpu,
        seq: header.seq,
        ktime_ns: header.ktime_ns,
        pid: header.pid,
        tid: header.tid,
        uid: header.uid,
        gid: header.gid,
        cgroup_id: header.cgroup_id,
        comm: c_string(&header.comm),
        process_start_ns: (header.process_start_ns != 0).then_some(header.process_start_ns),
    };
    let body = match kind {
        EventKind::MemfdCreate => {
            let ev: MemfdCreateEvent = read_wire(bytes);
            EventBody::MemfdCreate(MemfdCreate {
                memfd_kind: memfd_kind(kind, ev.memfd_kind)?,
                flags: ev.flags,
                name: captured(kind, "name", ev.name_len, &ev.name)?,
            })
        }
        EventKind::DotnetIpcReady | EventKind::DotnetRuntimeSeen => {
            let ev: MmapEvent = read_wire(bytes);
            let memfd_kind = memfd_kind(kind, ev.memfd_kind)?;
            let mapping = Mapping {
                memfd_kind,
                fd: ev.fd,
                addr_hint: ev.addr_hint,
                len: ev.len,
                prot: ev.prot,
                flags: ev.flags,
                offset: ev.offset,
                ret: (ev.ret_known != 0).then_some(ev.ret),
            };
            match (kind, memfd_kind) {
                (EventKind::DotnetIpcReady, MemfdKind::DotnetIpcCreated) => {
                    EventBody::DotnetIpcReady(mapping)
                }
                (EventKind::DotnetRuntimeSeen, MemfdKind::DoubleMapper) => {
                    EventBody::DotnetRuntimeSeen(mapping)
                }
                _ => return Err(DecodeError::MemfdKindMismatch { kind, memfd_kind }),
            }
        }
        EventKind::UserEventsRegister
        | EventKind::UserEventsDelete
        | EventKind::UserEventsUnregister => EventBody::UserEvents(user_events(kind, bytes)?),
        EventKind::ProcessFork => {
            let ev: ProcessForkEvent = read_wire(bytes);
            EventBody::ProcessFork { child_pid: ev.child_pid, clone_flags: ev.clone_flags }
        }
        EventKind::ProcessExec => {
            let ev: ProcessExecEvent = read_wire(bytes);
            EventBody::ProcessExec {
                old_tid: ev.old_tid,
                filename: captured(kind, "filename", ev.filename_len, &ev.filename)?,
            }
        }
        EventKind::ProcessExit => EventBody::ProcessExit,
        EventKind::DotnetIpcSocket => {
            let ev: IpcBindEvent = read_wire(bytes);
            let len = ev.path_len as usize;
            if len > UNIX_PATH_MAX {
                return Err(DecodeError::BadStringLength {
                    kind,
                    field: "path",
                    len: ev.path_len as i32,
                    max: UNIX_PATH_MAX,
                });
            }
            let path = ev.path[..len].to_vec();
            let name =
                diagnostic_socket_name(&path).ok_or(DecodeError::NotADiagnosticSocket { kind })?;
            EventBody::DotnetIpcSocket(IpcSocket {
                fd: ev.fd,
                addrlen: ev.addrlen,
                abstract_name: ev.abstract_name != 0,
                path,
                name,
            })
        }
    };
    Ok(DetectionEvent { meta, body })
}

fn memfd_kind(kind: EventKind, value: u32) -> Result<MemfdKind, DecodeError> {
    MemfdKind::from_u32(value).ok_or(DecodeError::UnknownMemfdKind { kind, value })
}

fn user_events(kind: EventKind, bytes: &[u8]) -> Result<UserEventsIoctl, DecodeError> {
    let ev: UserEventsIoctlEvent = read_wire(bytes);
    let cmd_kind = match ev.cmd as u32 {
        DIAG_IOCSREG => EventKind::UserEventsRegister,
        DIAG_IOCSDEL => EventKind::UserEventsDelete,
        DIAG_IOCSUNREG => EventKind::UserEventsUnregister,
        _ => return Err(DecodeError::CommandMismatch { kind, cmd: ev.cmd }),
    };
    if cmd_kind != kind {
        return Err(DecodeError::CommandMismatch { kind, cmd: ev.cmd });
    }
    let arg_read = if ev.arg_read == 0 { Ok(()) } else { Err(ev.arg_read) };
    let op = match kind {
        EventKind::UserEventsRegister => {
            let reg = arg_read.map(|()| UserReg {
                size: ev.reg_size,
                enable_bit: ev.reg_enable_bit,
                enable_size: ev.reg_enable_size,
                flags: ev.reg_flags,
                enable_addr: ev.reg_enable_addr,
                name_args_ptr: ev.reg_name_args,
                write_index: ev.reg_write_index,
            });
            let name_args = match &reg {
                Ok(reg) if reg.name_args_ptr != 0 => {
                    Some(captured(kind, "name_args", ev.name_len, &ev.name)?)
                }
                _ => None,
            };
            UserEventsOp::Register { reg, name_args }
        }
        EventKind::UserEventsDelete => UserEventsOp::Delete {
            name: if ev.arg == 0 {
                None
            } else {
                Some(captured(kind, "name", ev.name_len, &ev.name)?)
            },
        },
        // The `reg_*` fields carry `struct user_unreg` for UNREG (documented on
        // `UserEventsIoctlEvent`; the eBPF program fills them the same way).
        _ => UserEventsOp::Unregister {
            unreg: arg_read.map(|()| UserUnreg {
                size: ev.reg_size,
                disable_bit: ev.reg_enable_bit,
                reserved: ev.reg_enable_size,
                reserved2: ev.reg_flags,
                disable_addr: ev.reg_enable_addr,
            }),
        },
    };
    Ok(UserEventsIoctl { fd: ev.fd, ret: ev.ret, cmd: ev.cmd, arg: ev.arg, op })
}

/// A user_events registration a process held when tracer started, as the task iterator read it
/// from the kernel (docs/protocol/bpf-detection.md §9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingEnabler {
    pub pid: u32,
    pub enable_addr: u64,
    pub enable_bit: u8,
    /// 4 or 8: the enable word's size (the kernel keeps a flag for 4 on 64-bit).
    pub enable_size: u8,
    /// The event's name (its registration's `name_args` up to the first space).
    pub name: Captured,
}

/// The task iterator's whole output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExistingEnablers {
    pub enablers: Vec<ExistingEnabler>,
    /// Processes holding more enablers than the iterator reads (`MAX_ENABLERS_PER_PROCESS`).
    pub truncated: Vec<u32>,
    /// The reader stopped before the end of the output (set by the reader, not the decoder).
    pub output_cut: bool,
}

impl ExistingEnablers {
    /// Times the list was cut: per process past its limit, and once for the whole output.
    pub fn cuts(&self) -> u64 {
        self.truncated.len() as u64 + u64::from(self.output_cut)
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum EnablerDecodeError {
    #[error("iterator output of {len} bytes is not a whole number of {record}-byte records")]
    PartialRecord { len: usize, record: usize },
    #[error("iterator record at byte {offset}: unknown kind {kind}")]
    UnknownKind { offset: usize, kind: u32 },
    #[error(
        "iterator record at byte {offset}: name length {len} exceeds its {ENABLER_NAME_LEN}-byte buffer"
    )]
    BadNameLength { offset: usize, len: i32 },
}

/// The kernel's `values` of an enabler: the bit in the low 6 bits, bit 8 set for a 4-byte
/// enable word on a 64-bit kernel (`kernel/trace/trace_events_user.c`).
const ENABLE_VAL_BIT_MASK: u64 = 0x3f;
const ENABLE_VAL_32_ON_64: u64 = 1 << 8;

/// The size of one record of the task iterator's output.
pub const ENABLER_RECORD_LEN: usize = size_of::<EnablerRecord>();

/// Decodes the output of the `user_events_enablers` task iterator: fixed-size records.
pub fn decode_enablers(bytes: &[u8]) -> Result<ExistingEnablers, EnablerDecodeError> {
    let record = ENABLER_RECORD_LEN;
    if !bytes.len().is_multiple_of(record) {
        return Err(EnablerDecodeError::PartialRecord { len: bytes.len(), record });
    }
    let mut out = ExistingEnablers::default();
    for (i, chunk) in bytes.chunks_exact(record).enumerate() {
        let offset = i * record;
        let rec: EnablerRecord = read_wire(chunk);
        match rec.kind {
            k if k == EnablerRecordKind::Enabler as u32 => {
                let name = if rec.name_len < 0 {
                    Err(rec.name_len)
                } else {
                    let len = rec.name_len as usize;
                    let bytes = rec
                        .name
                        .get(..len)
                        .ok_or(EnablerDecodeError::BadNameLength { offset, len: rec.name_len })?;
                    Ok(bytes.to_vec())
                };
                out.enablers.push(ExistingEnabler {
                    pid: rec.pid,
                    enable_addr: rec.enable_addr,
                    enable_bit: (rec.values & ENABLE_VAL_BIT_MASK) as u8,
                    enable_size: if rec.values & ENABLE_VAL_32_ON_64 != 0 { 4 } else { 8 },
                    name,
                });
            }
            k if k == EnablerRecordKind::Truncated as u32 => out.truncated.push(rec.pid),
            kind => return Err(EnablerDecodeError::UnknownKind { offset, kind }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use tracer_common::{EXEC_FILENAME_LEN, MEMFD_NAME_LEN, TASK_COMM_LEN, USER_EVENT_NAME_LEN};

    use super::*;

    /// Bytes of a wire struct, as the ring buffer holds them.
    fn bytes_of<T: Wire>(value: &T) -> Vec<u8> {
        // SAFETY: `T: Wire` is plain data; viewing it as bytes is sound (padding is explicit).
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    fn header(kind: EventKind) -> EventHeader {
        let mut comm = [0u8; TASK_COMM_LEN];
        comm[..6].copy_from_slice(b"helper");
        EventHeader {
            kind: kind as u32,
            cpu: 1,
            seq: 7,
            ktime_ns: 123_456_789,
            pid: 4242,
            tid: 4243,
            uid: 1000,
            gid: 1001,
            cgroup_id: 99,
            comm,
            process_start_ns: 1_234_567_890,
        }
    }

    fn with_string<const N: usize>(s: &[u8]) -> [u8; N] {
        let mut buf = [0u8; N];
        buf[..s.len()].copy_from_slice(s);
        buf
    }

    fn mmap_event(kind: EventKind, memfd_kind: MemfdKind) -> MmapEvent {
        MmapEvent {
            header: header(kind),
            memfd_kind: memfd_kind as u32,
            fd: 5,
            addr_hint: 0x7f00_1234_5000,
            len: 4096,
            prot: 0,
            flags: 2,
            offset: 0,
            ret: 0,
            ret_known: 0,
            _pad: 0,
        }
    }

    fn register_event(ret: i64, name_args: &[u8]) -> UserEventsIoctlEvent {
        UserEventsIoctlEvent {
            header: header(EventKind::UserEventsRegister),
            fd: 3,
            arg_read: 0,
            ret,
            cmd: DIAG_IOCSREG as u64,
            arg: 0x7ffd_0000_1000,
            reg_size: 28,
            reg_enable_bit: 31,
            reg_enable_size: 4,
            reg_flags: 0,
            reg_enable_addr: 0x5555_0000_0040,
            reg_name_args: 0x5555_0000_0100,
            reg_write_index: 0,
            name_len: name_args.len() as i32,
            name: with_string(name_args),
        }
    }

    #[test]
    fn header_fields() {
        let ev = ProcessExitEvent { header: header(EventKind::ProcessExit) };
        let decoded = decode(&bytes_of(&ev)).unwrap();
        assert_eq!(
            decoded.meta,
            EventMeta {
                kind: EventKind::ProcessExit,
                cpu: 1,
                seq: 7,
                ktime_ns: 123_456_789,
                pid: 4242,
                tid: 4243,
                uid: 1000,
                gid: 1001,
                cgroup_id: 99,
                comm: "helper".into(),
                process_start_ns: Some(1_234_567_890),
            }
        );
        assert_eq!(decoded.body, EventBody::ProcessExit);
        let mut unknown = ev;
        unknown.header.process_start_ns = 0;
        assert_eq!(decode(&bytes_of(&unknown)).unwrap().meta.process_start_ns, None);
    }

    #[test]
    fn comm_without_nul_uses_all_bytes() {
        let mut ev = ProcessExitEvent { header: header(EventKind::ProcessExit) };
        ev.header.comm = *b"0123456789abcdef";
        assert_eq!(decode(&bytes_of(&ev)).unwrap().meta.comm, "0123456789abcdef");
    }

    #[test]
    fn memfd_create() {
        let ev = MemfdCreateEvent {
            header: header(EventKind::MemfdCreate),
            memfd_kind: MemfdKind::DotnetIpcCreated as u32,
            flags: 1,
            name_len: 18,
            _pad: 0,
            name: with_string::<MEMFD_NAME_LEN>(b"dotnet_ipc_created"),
        };
        let decoded = decode(&bytes_of(&ev)).unwrap();
        assert_eq!(
            decoded.body,
            EventBody::MemfdCreate(MemfdCreate {
                memfd_kind: MemfdKind::DotnetIpcCreated,
                flags: 1,
                name: Ok(b"dotnet_ipc_created".to_vec()),
            })
        );
        let mut failed = ev;
        failed.name_len = -14;
        let EventBody::MemfdCreate(m) = decode(&bytes_of(&failed)).unwrap().body else { panic!() };
        assert_eq!(m.name, Err(-14));
        let mut bad = ev;
        bad.name_len = MEMFD_NAME_LEN as i32 + 1;
        assert_eq!(
            decode(&bytes_of(&bad)),
            Err(DecodeError::BadStringLength {
                kind: EventKind::MemfdCreate,
                field: "name",
                len: 257,
                max: MEMFD_NAME_LEN
            })
        );
        let mut unknown = ev;
        unknown.memfd_kind = 9;
        assert_eq!(
            decode(&bytes_of(&unknown)),
            Err(DecodeError::UnknownMemfdKind { kind: EventKind::MemfdCreate, value: 9 })
        );
    }

    #[test]
    fn mappings() {
        let ready = mmap_event(EventKind::DotnetIpcReady, MemfdKind::DotnetIpcCreated);
        let expected = Mapping {
            memfd_kind: MemfdKind::DotnetIpcCreated,
            fd: 5,
            addr_hint: 0x7f00_1234_5000,
            len: 4096,
            prot: 0,
            flags: 2,
            offset: 0,
            ret: None,
        };
        assert_eq!(
            decode(&bytes_of(&ready)).unwrap().body,
            EventBody::DotnetIpcReady(expected.clone())
        );
        // From a hook at the syscall's return, the result comes along.
        let returned = MmapEvent { ret: 0x7f00_1234_5000, ret_known: 1, ..ready };
        assert_eq!(
            decode(&bytes_of(&returned)).unwrap().body,
            EventBody::DotnetIpcReady(Mapping { ret: Some(0x7f00_1234_5000), ..expected })
        );
        let seen = mmap_event(EventKind::DotnetRuntimeSeen, MemfdKind::DoubleMapper);
        assert!(matches!(
            decode(&bytes_of(&seen)).unwrap().body,
            EventBody::DotnetRuntimeSeen(Mapping { memfd_kind: MemfdKind::DoubleMapper, .. })
        ));
        let crossed = mmap_event(EventKind::DotnetIpcReady, MemfdKind::DoubleMapper);
        assert_eq!(
            decode(&bytes_of(&crossed)),
            Err(DecodeError::MemfdKindMismatch {
                kind: EventKind::DotnetIpcReady,
                memfd_kind: MemfdKind::DoubleMapper
            })
        );
    }

    #[test]
    fn ipc_socket_binds() {
        let path = b"/tmp/dotnet-diagnostic-42-9001-socket";
        let ev = IpcBindEvent {
            header: header(EventKind::DotnetIpcSocket),
            fd: 9,
            addrlen: 110,
            abstract_name: 0,
            path_len: path.len() as u32,
            path: with_string::<{ tracer_common::SOCKADDR_BUF_LEN }>(path),
        };
        assert_eq!(
            decode(&bytes_of(&ev)).unwrap().body,
            EventBody::DotnetIpcSocket(IpcSocket {
                fd: 9,
                addrlen: 110,
                abstract_name: false,
                path: path.to_vec(),
                name: DiagnosticSocketName { pid: 42, key: 9001 },
            })
        );
        let mut long = ev;
        long.path_len = UNIX_PATH_MAX as u32 + 1;
        assert_eq!(
            decode(&bytes_of(&long)),
            Err(DecodeError::BadStringLength {
                kind: EventKind::DotnetIpcSocket,
                field: "path",
                len: 109,
                max: UNIX_PATH_MAX
            })
        );
        let mut other = ev;
        other.path_len -= 1;
        assert_eq!(
            decode(&bytes_of(&other)),
            Err(DecodeError::NotADiagnosticSocket { kind: EventKind::DotnetIpcSocket })
        );
    }

    #[test]
    fn user_events_register() {
        let name = b"dotnet_test u8 version; u16 event_id";
        let ev = register_event(-25, name);
        let decoded = decode(&bytes_of(&ev)).unwrap();
        assert_eq!(
            decoded.body,
            EventBody::UserEvents(UserEventsIoctl {
                fd: 3,
                ret: -25,
                cmd: DIAG_IOCSREG as u64,
                arg: 0x7ffd_0000_1000,
                op: UserEventsOp::Register {
                    reg: Ok(UserReg {
                        size: 28,
                        enable_bit: 31,
                        enable_size: 4,
                        flags: 0,
                        enable_addr: 0x5555_0000_0040,
                        name_args_ptr: 0x5555_0000_0100,
                        write_index: 0,
                    }),
                    name_args: Some(Ok(name.to_vec())),
                },
            })
        );
        // A sign-extended command (musl's `int request`) is still a REG.
        let mut sign_extended = ev;
        sign_extended.cmd = 0xffff_ffff_c008_2a00;
        let EventBody::UserEvents(sign_extended) = decode(&bytes_of(&sign_extended)).unwrap().body
        else {
            panic!("a user_events event")
        };
        let EventBody::UserEvents(plain) = decoded.body else { unreachable!() };
        assert_eq!(
            sign_extended.cmd, 0xffff_ffff_c008_2a00,
            "the command as the process passed it"
        );
        assert_eq!(sign_extended.op, plain.op, "decoded as the same registration");
        // Struct read failed: no name either.
        let mut unread = ev;
        unread.arg_read = -14;
        assert!(matches!(
            decode(&bytes_of(&unread)).unwrap().body,
            EventBody::UserEvents(UserEventsIoctl {
                op: UserEventsOp::Register { reg: Err(-14), name_args: None },
                ..
            })
        ));
        let mut too_long = ev;
        too_long.name_len = 513;
        assert_eq!(
            decode(&bytes_of(&too_long)),
            Err(DecodeError::BadStringLength {
                kind: EventKind::UserEventsRegister,
                field: "name_args",
                len: 513,
                max: USER_EVENT_NAME_LEN
            })
        );
        let mut wrong_cmd = ev;
        wrong_cmd.cmd = DIAG_IOCSDEL as u64;
        assert_eq!(
            decode(&bytes_of(&wrong_cmd)),
            Err(DecodeError::CommandMismatch {
                kind: EventKind::UserEventsRegister,
                cmd: DIAG_IOCSDEL as u64
            })
        );
    }

    #[test]
    fn user_events_delete_and_unregister() {
        let mut del = register_event(-16, b"my_event");
        del.header.kind = EventKind::UserEventsDelete as u32;
        del.cmd = DIAG_IOCSDEL as u64;
        let EventBody::UserEvents(d) = decode(&bytes_of(&del)).unwrap().body else { panic!() };
        assert_eq!(d.op, UserEventsOp::Delete { name: Some(Ok(b"my_event".to_vec())) });
        assert_eq!(d.ret, -16);

        let mut unreg = register_event(0, b"");
        unreg.header.kind = EventKind::UserEventsUnregister as u32;
        unreg.cmd = DIAG_IOCSUNREG as u64;
        unreg.reg_size = 16;
        let EventBody::UserEvents(u) = decode(&bytes_of(&unreg)).unwrap().body else { panic!() };
        assert_eq!(
            u.op,
            UserEventsOp::Unregister {
                unreg: Ok(UserUnreg {
                    size: 16,
                    disable_bit: 31,
                    reserved: 4,
                    reserved2: 0,
                    disable_addr: 0x5555_0000_0040
                })
            }
        );
    }

    #[test]
    fn lifecycle() {
        let fork = ProcessForkEvent {
            header: header(EventKind::ProcessFork),
            child_pid: 5000,
            _pad: 0,
            clone_flags: 0x11,
        };
        assert_eq!(
            decode(&bytes_of(&fork)).unwrap().body,
            EventBody::ProcessFork { child_pid: 5000, clone_flags: 0x11 }
        );
        let exec = ProcessExecEvent {
            header: header(EventKind::ProcessExec),
            old_tid: 5000,
            filename_len: 9,
            filename: with_string::<EXEC_FILENAME_LEN>(b"/bin/true"),
        };
        assert_eq!(
            decode(&bytes_of(&exec)).unwrap().body,
            EventBody::ProcessExec { old_tid: 5000, filename: Ok(b"/bin/true".to_vec()) }
        );
    }

    #[test]
    fn framing_errors() {
        assert_eq!(decode(&[0u8; 10]), Err(DecodeError::TooShortForHeader { len: 10 }));
        let mut ev = ProcessExitEvent { header: header(EventKind::ProcessExit) };
        ev.header.kind = 77;
        assert_eq!(
            decode(&bytes_of(&ev)),
            Err(DecodeError::UnknownKind { kind: 77, len: HEADER_LEN })
        );
        // A fork header with only the header's bytes.
        let short = ProcessExitEvent { header: header(EventKind::ProcessFork) };
        assert_eq!(
            decode(&bytes_of(&short)),
            Err(DecodeError::WrongLength {
                kind: EventKind::ProcessFork,
                len: HEADER_LEN,
                expected: size_of::<ProcessForkEvent>()
            })
        );
        // Trailing bytes are as wrong as missing ones.
        let mut long = bytes_of(&ProcessExitEvent { header: header(EventKind::ProcessExit) });
        long.push(0);
        assert!(matches!(decode(&long), Err(DecodeError::WrongLength { .. })));
    }

    #[test]
    fn unaligned_input() {
        let ev = register_event(0, b"x u32 a");
        let mut buf = vec![0u8; 1];
        buf.extend(bytes_of(&ev));
        let decoded = decode(&buf[1..]).unwrap();
        assert_eq!(decoded.meta.pid, 4242);
    }

    fn enabler_record(kind: u32, values: u64, name: &[u8]) -> EnablerRecord {
        EnablerRecord {
            kind,
            pid: 77,
            enable_addr: 0x5555_0000_0040,
            values,
            name_len: name.len() as i32,
            _pad: 0,
            name: with_string(name),
        }
    }

    #[test]
    fn existing_enablers() {
        let mut bytes = bytes_of(&enabler_record(1, 31 | 1 << 8, b"dotnet_gc"));
        bytes.extend(bytes_of(&enabler_record(1, 63 | 1 << 6, b"x")));
        bytes.extend(bytes_of(&enabler_record(2, 0, b"")));
        let decoded = decode_enablers(&bytes).unwrap();
        let enabler = |bit, size, name: &[u8]| ExistingEnabler {
            pid: 77,
            enable_addr: 0x5555_0000_0040,
            enable_bit: bit,
            enable_size: size,
            name: Ok(name.to_vec()),
        };
        assert_eq!(
            decoded,
            ExistingEnablers {
                // The faulting flag (bit 6) is state, not part of the bit.
                enablers: vec![enabler(31, 4, b"dotnet_gc"), enabler(63, 8, b"x")],
                truncated: vec![77],
                output_cut: false,
            }
        );
        assert_eq!(decode_enablers(&[]), Ok(ExistingEnablers::default()));
    }

    #[test]
    fn corrupt_iterator_output_is_a_typed_error_with_its_offset() {
        let record = size_of::<EnablerRecord>();
        let one = bytes_of(&enabler_record(1, 3, b"a"));
        assert_eq!(
            decode_enablers(&one[..record - 1]),
            Err(EnablerDecodeError::PartialRecord { len: record - 1, record })
        );
        let mut two = one.clone();
        two.extend(bytes_of(&enabler_record(9, 3, b"a")));
        assert_eq!(
            decode_enablers(&two),
            Err(EnablerDecodeError::UnknownKind { offset: record, kind: 9 })
        );
        let mut long = enabler_record(1, 3, b"a");
        long.name_len = ENABLER_NAME_LEN as i32 + 1;
        assert_eq!(
            decode_enablers(&bytes_of(&long)),
            Err(EnablerDecodeError::BadNameLength { offset: 0, len: ENABLER_NAME_LEN as i32 + 1 })
        );
        let mut failed = enabler_record(1, 3, b"");
        failed.name_len = -14;
        assert_eq!(decode_enablers(&bytes_of(&failed)).unwrap().enablers[0].name, Err(-14));
    }
}
