//! Bodies of detection lines: a live detection from the eBPF programs or a mapping found by the
//! start-up scan. Fields follow the kind, so the body is an ordered map of them.
use serde_json::{Value, json};
use tracer_common::{EventKind, MemfdKind};
use tracer_decode::bpf_event::{Captured, DetectionEvent, EventBody, Mapping, UserEventsOp};
use tracer_decode::names;
use tracer_decode::procfs::MemfdMapping;
use tracer_decode::unix_socket::{DiagnosticSocketName, ListeningDiagnosticSocket};

use super::{Incarnation, Kind, Line, Pid, Source};
use crate::kernel::procfs::{DetectionChecks, ProcessIdentity};
use crate::time::{Clock, monotonic_ns};

/// Fields in the order they were pushed: the body of lines whose fields depend on the event.
pub type FieldMap = tracer_decode::ordered::OrderedMap<&'static str, Value>;

fn hex(v: u64) -> Value {
    json!(format!("{v:#x}"))
}

fn text(bytes: &[u8]) -> Value {
    json!(String::from_utf8_lossy(bytes))
}

/// Adds `<key>` (the string, or null) and, when the read failed, `<key>_error` (errno name).
fn push_captured(line: &mut FieldMap, key: &'static str, error_key: &'static str, c: &Captured) {
    match c {
        Ok(bytes) => {
            line.push(key, text(bytes));
        }
        Err(e) => {
            line.push(key, Value::Null).push(error_key, names::syscall_error_name((*e).into()));
        }
    }
}

/// `ret` plus `error` (errno name, or null on success).
fn push_ret(line: &mut FieldMap, ret: i64) {
    line.push("ret", ret).push("error", names::syscall_error_name(ret));
}

/// The line of a live detection, with what procfs added to it.
pub fn detection_line(
    event: &DetectionEvent,
    clock: &Clock,
    checks: DetectionChecks,
) -> Line<FieldMap> {
    let m = &event.meta;
    let process = Pid::Known(Incarnation::new(m.pid, checks.process_start_ns));
    let body = detection_body(event, checks);
    Line::new(clock, m.ktime_ns, Kind::Detection(m.kind), Source::Kernel, process, body)
}

/// The body of a live detection line: the process, the CPU and sequence, the kind's fields.
fn detection_body(event: &DetectionEvent, checks: DetectionChecks) -> FieldMap {
    let m = &event.meta;
    let mut line = FieldMap::default();
    line.push("tid", m.tid)
        .push("comm", m.comm.as_str())
        .push("uid", m.uid)
        .push("cgroup_id", m.cgroup_id)
        .push("cpu", m.cpu)
        .push("seq", m.seq);
    match &event.body {
        EventBody::MemfdCreate(mc) => {
            line.push("memfd", mc.memfd_kind.name());
            push_captured(&mut line, "name", "name_error", &mc.name);
            line.push("flags", names::memfd_flag_names(mc.flags.into()));
        }
        EventBody::DotnetIpcReady(map) | EventBody::DotnetRuntimeSeen(map) => {
            push_mapping(&mut line, map, checks.mapped_addr);
        }
        EventBody::UserEvents(ioctl) => {
            line.push("fd", ioctl.fd);
            push_ret(&mut line, ioctl.ret);
            line.push("cmd", hex(ioctl.cmd))
                .push("arg", hex(ioctl.arg))
                .push("user_events_data", checks.user_events_data);
            match &ioctl.op {
                UserEventsOp::Register { reg, name_args } => match reg {
                    Ok(reg) => {
                        line.push("size", reg.size)
                            .push("enable_bit", reg.enable_bit)
                            .push("enable_size", reg.enable_size)
                            .push("reg_flags", reg.flags)
                            .push("enable_addr", hex(reg.enable_addr));
                        match name_args {
                            Some(c) => push_captured(&mut line, "name_args", "name_args_error", c),
                            None => {
                                line.push("name_args", Value::Null);
                            }
                        }
                        if ioctl.ret == 0 {
                            line.push("write_index", reg.write_index);
                        }
                    }
                    Err(e) => {
                        line.push("arg_error", names::syscall_error_name((*e).into()));
                    }
                },
                UserEventsOp::Delete { name } => match name {
                    Some(c) => push_captured(&mut line, "name", "name_error", c),
                    None => {
                        line.push("name", Value::Null);
                    }
                },
                UserEventsOp::Unregister { unreg } => match unreg {
                    Ok(u) => {
                        line.push("size", u.size)
                            .push("disable_bit", u.disable_bit)
                            .push("disable_addr", hex(u.disable_addr));
                    }
                    Err(e) => {
                        line.push("arg_error", names::syscall_error_name((*e).into()));
                    }
                },
            }
        }
        EventBody::ProcessFork { child_pid, clone_flags } => {
            line.push("child_pid", *child_pid)
                .push("clone_flags", names::clone_flag_names(*clone_flags));
        }
        EventBody::ProcessExec { old_tid, filename } => {
            push_captured(&mut line, "filename", "filename_error", filename);
            line.push("old_tid", *old_tid);
        }
        EventBody::ProcessExit => {}
        EventBody::DotnetIpcSocket(socket) => {
            line.push("fd", socket.fd);
            push_socket(&mut line, &socket.path, socket.abstract_name, socket.name);
        }
    }
    line
}

/// `path`, `abstract`, and the pid and key the name carries (the pid as the runtime saw it).
fn push_socket(line: &mut FieldMap, path: &[u8], abstract_name: bool, name: DiagnosticSocketName) {
    line.push("path", text(path))
        .push("abstract", abstract_name)
        .push("socket_pid", name.pid)
        .push("key", name.key);
}

/// The fields every detection line starts with, as procfs can tell them: the process (comm,
/// uid, cgroup), and null for the thread, CPU and sequence only the kernel path knows.
fn procfs_header(id: Option<ProcessIdentity>) -> FieldMap {
    let id = id.unwrap_or_default();
    let mut line = FieldMap::default();
    line.push("tid", Value::Null)
        .push("comm", id.comm)
        .push("uid", id.uid)
        .push("cgroup_id", id.cgroup_id)
        .push("cpu", Value::Null)
        .push("seq", Value::Null);
    line
}

/// The line of a listening diagnostic socket found by the start-up scan (or `--pid`), stamped
/// now: fields only the kernel path knows are null, and the socket's inode is added.
pub fn procfs_socket_line(
    pid: u32,
    socket: &ListeningDiagnosticSocket,
    clock: &Clock,
    id: Option<ProcessIdentity>,
) -> Line<FieldMap> {
    let process = Pid::Known(Incarnation::new(pid, id.as_ref().and_then(|id| id.start_ns)));
    let mut line = procfs_header(id);
    line.push("fd", Value::Null);
    // procfs shows an abstract name's leading NUL as `@`.
    let (path, abstract_name) = match socket.path.strip_prefix(b"@") {
        Some(rest) => (rest, true),
        None => (&socket.path[..], false),
    };
    push_socket(&mut line, path, abstract_name, socket.name);
    line.push("inode", socket.inode);
    let kind = Kind::Detection(EventKind::DotnetIpcSocket);
    Line::new(clock, monotonic_ns(), kind, Source::Procfs, process, line)
}

/// `addr` is where the mapping went (the syscall's result from a hook at its return, else read
/// from procfs), null when the mapping failed or did not show.
fn push_mapping(line: &mut FieldMap, map: &Mapping, addr: Option<u64>) {
    line.push("memfd", map.memfd_kind.name())
        .push("fd", map.fd)
        .push("addr", addr.map_or(Value::Null, hex))
        .push("len", map.len)
        .push("prot", names::prot_names(map.prot))
        .push("flags", names::map_flag_names(map.flags))
        .push("offset", map.offset);
}

/// The line of a mapping found by the start-up scan, stamped now. Fields the kernel path knows
/// but procfs cannot tell (tid of the mapping call, fd, CPU, sequence) are null.
pub fn procfs_mapping_line(
    m: &MemfdMapping,
    clock: &Clock,
    id: Option<ProcessIdentity>,
) -> Line<FieldMap> {
    let kind = match m.memfd_kind {
        MemfdKind::DotnetIpcCreated => EventKind::DotnetIpcReady,
        MemfdKind::DoubleMapper => EventKind::DotnetRuntimeSeen,
    };
    let process = Pid::Known(Incarnation::new(m.pid, id.as_ref().and_then(|id| id.start_ns)));
    let body = procfs_mapping_body(m, id);
    Line::new(clock, monotonic_ns(), Kind::Detection(kind), Source::Procfs, process, body)
}

/// The body of a procfs mapping line.
fn procfs_mapping_body(m: &MemfdMapping, id: Option<ProcessIdentity>) -> FieldMap {
    let mut line = procfs_header(id);
    line.push("memfd", m.memfd_kind.name())
        .push("fd", Value::Null)
        .push("addr", hex(m.start))
        .push("len", m.end.saturating_sub(m.start))
        .push("prot", names::prot_names(m.prot()))
        .push("flags", if m.is_shared() { "MAP_SHARED" } else { "MAP_PRIVATE" })
        .push("offset", m.offset)
        .push("path", m.path.as_str());
    line
}
