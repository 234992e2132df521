//! Lines of every kind, field by field, and docs/output.md's table of them.
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};
use tracer_common::{DIAG_IOCSDEL, DIAG_IOCSREG, DIAG_IOCSUNREG, EventKind, MemfdKind};
use tracer_decode::bpf_event::IpcSocket;
use tracer_decode::bpf_event::{
    DetectionEvent, EventBody, EventMeta, Mapping, MemfdCreate, UserEventsIoctl, UserEventsOp,
    UserReg, UserUnreg,
};
use tracer_decode::nettrace::methods::MethodTable;
use tracer_decode::nettrace::stacks::{NamedStack, StackFrame};
use tracer_decode::nettrace::{DecodedEvent, EventContext, EventMetadata, FieldDef, FieldType};
use tracer_decode::procfs::parse_maps_line;
use tracer_decode::unix_socket::{DiagnosticSocketName, listening_diagnostic_sockets};

use super::*;
use crate::kernel::procfs::DetectionChecks;

fn meta(kind: EventKind) -> EventMeta {
    EventMeta {
        kind,
        cpu: 1,
        seq: 3,
        ktime_ns: 1_000_000_000,
        pid: 100,
        tid: 101,
        uid: 0,
        gid: 0,
        cgroup_id: 55,
        comm: "helper".into(),
        process_start_ns: Some(1_234_567_890),
    }
}

/// The process of the session lines built here.
const PROCESS: Incarnation = Incarnation { pid: 5, start_ns: Some(1_230_000_000) };

/// A `struct user_reg` as a process passes it to `DIAG_IOCSREG`.
fn user_reg() -> UserReg {
    UserReg {
        size: 28,
        enable_bit: 5,
        enable_size: 4,
        flags: 0,
        enable_addr: 0x2000,
        name_args_ptr: 0x3000,
        write_index: 9,
    }
}

/// The runtime's `dotnet_ipc_created` mapping, as the eBPF program reports it.
fn ipc_mapping() -> Mapping {
    Mapping {
        memfd_kind: MemfdKind::DotnetIpcCreated,
        fd: 4,
        addr_hint: 0,
        len: 4096,
        prot: 0,
        flags: 2,
        offset: 0,
        ret: None,
    }
}

// Tests build session lines from bodies turned into JSON values.
serde_line_bodies!(Value);

/// The line as tracer writes it (without its newline).
fn text_of(line: &impl WriteLine) -> String {
    let mut out = Vec::new();
    line.write_json(&mut out);
    String::from_utf8(out).unwrap()
}

/// The line as written, parsed (keys in the written order).
fn json_of(line: &impl WriteLine) -> Value {
    serde_json::from_str(&text_of(line)).unwrap()
}

#[test]
fn a_line_identity_is_reused_only_for_the_very_same_process_source_and_labels() {
    let labels = Arc::new(ProcessLabels { cgroup: Some("/a".into()), ..Default::default() });
    let equal_labels = Arc::new((*labels).clone());
    let process = Incarnation::new(7, Some(20_000_000));
    let (kind, source, pid) = (Kind::DotnetEvent, Source::Nettrace, Pid::Known(process));
    let session = Some(0x1f);
    let identity = LineIdentity::new(kind, source, pid, Some(labels.clone()), session);
    assert!(identity.is_of(kind, source, pid, Some(&labels), session));
    // Equal labels of another process record (another Arc) render again: compared per line,
    // by pointer.
    assert!(!identity.is_of(kind, source, pid, Some(&equal_labels), session));
    assert!(!identity.is_of(kind, source, pid, None, session));
    assert!(!identity.is_of(kind, Source::UserEvents, pid, Some(&labels), session));
    let other = |pid, start_ns| Pid::Known(Incarnation { pid, start_ns });
    assert!(!identity.is_of(kind, source, other(8, Some(20_000_000)), Some(&labels), session));
    // The same pid, another process (the pid reused), or another session of the process.
    assert!(!identity.is_of(kind, source, other(7, Some(30_000_000)), Some(&labels), session));
    assert!(!identity.is_of(kind, source, pid, Some(&labels), Some(0x20)));
    assert!(!identity.is_of(Kind::Ftrace, source, pid, Some(&labels), session));
    let unlabelled = LineIdentity::new(kind, source, pid, None, session);
    assert!(unlabelled.is_of(kind, source, pid, None, session));
    assert!(!unlabelled.is_of(kind, source, pid, Some(&labels), session));
    assert_eq!(
        text_of(&identity.line(&Clock::with_offset(0), 1, FieldMap::default())),
        r#"{"ts":"1970-01-01T00:00:00.000000001Z","mono_ns":1,"kind":"dotnet_event","source":"nettrace","pid":7,"process_start_ns":20000000,"cgroup":"/a","session_id":"0x1f"}"#
    );
}

#[test]
fn ipc_socket_lines() {
    let clock = Clock::with_offset(0);
    let ev = DetectionEvent {
        meta: meta(EventKind::DotnetIpcSocket),
        body: EventBody::DotnetIpcSocket(IpcSocket {
            fd: 7,
            addrlen: 41,
            abstract_name: false,
            path: b"/tmp/dotnet-diagnostic-5-6-socket".to_vec(),
            name: DiagnosticSocketName { pid: 5, key: 6 },
        }),
    };
    let v = json_of(&detection_line(&ev, &clock, DetectionChecks::default()));
    assert_eq!(v["kind"], "dotnet_ipc_socket");
    assert_eq!(v["source"], "kernel");
    assert_eq!(v["fd"], 7);
    assert_eq!(v["path"], "/tmp/dotnet-diagnostic-5-6-socket");
    assert_eq!(v["abstract"], false);
    assert_eq!((v["socket_pid"].as_u64(), v["key"].as_u64()), (Some(5), Some(6)));
    let text =
        b"0000000000000000: 00000002 00000000 00010000 0001 01 51234 @dotnet-diagnostic-5-6-socket";
    let socket = &listening_diagnostic_sockets(text)[0];
    let v = json_of(&procfs_socket_line(9, socket, &clock, None));
    assert_eq!(v["source"], "procfs");
    assert_eq!(v["pid"], 9);
    assert_eq!(v["fd"], Value::Null);
    assert_eq!(v["path"], "dotnet-diagnostic-5-6-socket");
    assert_eq!(v["abstract"], true);
    assert_eq!(v["inode"], 51234);
}

#[test]
fn envelope_order_and_fields() {
    let clock = Clock::with_offset(0);
    let ev = DetectionEvent {
        meta: meta(EventKind::DotnetIpcReady),
        body: EventBody::DotnetIpcReady(ipc_mapping()),
    };
    let checks = DetectionChecks {
        user_events_data: None,
        mapped_addr: Some(0x7f00_0000_1000),
        process_start_ns: Some(1_230_000_000),
    };
    let line = detection_line(&ev, &clock, checks);
    let text = text_of(&line);
    assert!(
            text.starts_with(r#"{"ts":"1970-01-01T00:00:01.000000000Z","mono_ns":1000000000,"kind":"dotnet_ipc_ready","source":"kernel","pid":100,"process_start_ns":1230000000,"tid":101,"comm":"helper","uid":0,"cgroup_id":55,"cpu":1,"seq":3,"#),
            "{text}"
        );
    let v = json_of(&line);
    assert_eq!(v["addr"], "0x7f0000001000");
    assert_eq!(v["prot"], "PROT_NONE");
    assert_eq!(v["flags"], "MAP_PRIVATE");
    assert_eq!(v["memfd"], "dotnet_ipc_created");
    assert_eq!(v["fd"], 4);
}

#[test]
fn register_line() {
    let clock = Clock::with_offset(0);
    let mut ioctl = UserEventsIoctl {
        fd: 3,
        ret: -25,
        cmd: DIAG_IOCSREG as u64,
        arg: 0x10,
        op: UserEventsOp::Register {
            reg: Ok(user_reg()),
            name_args: Some(Ok(b"ev u32 a".to_vec())),
        },
    };
    let ev = |ioctl: &UserEventsIoctl| DetectionEvent {
        meta: meta(EventKind::UserEventsRegister),
        body: EventBody::UserEvents(ioctl.clone()),
    };
    let v = json_of(&detection_line(
        &ev(&ioctl),
        &clock,
        DetectionChecks { user_events_data: Some(false), ..DetectionChecks::default() },
    ));
    assert_eq!(v["kind"], "user_events_register");
    assert_eq!(v["ret"], -25);
    assert_eq!(v["error"], "ENOTTY");
    assert_eq!(v["cmd"], "0xc0082a00");
    assert_eq!(v["name_args"], "ev u32 a");
    assert_eq!(v["enable_addr"], "0x2000");
    assert_eq!(v["enable_bit"], 5);
    assert_eq!(v["user_events_data"], false);
    assert!(v.get("write_index").is_none(), "write_index only on success");
    ioctl.ret = 0;
    let v = json_of(&detection_line(&ev(&ioctl), &clock, DetectionChecks::default()));
    assert_eq!(v["write_index"], 9);
    assert_eq!(v["error"], Value::Null);
    assert_eq!(v["user_events_data"], Value::Null);
}

#[test]
fn memfd_lifecycle_and_procfs_lines() {
    let clock = Clock::with_offset(0);
    let ev = DetectionEvent {
        meta: meta(EventKind::MemfdCreate),
        body: EventBody::MemfdCreate(MemfdCreate {
            memfd_kind: MemfdKind::DoubleMapper,
            flags: 1,
            name: Err(-14),
        }),
    };
    let v = json_of(&detection_line(&ev, &clock, DetectionChecks::default()));
    assert_eq!(v["name"], Value::Null);
    assert_eq!(v["name_error"], "EFAULT");
    assert_eq!(v["flags"], "MFD_CLOEXEC");
    assert_eq!(v.get("ret"), None, "memfd_create is seen at entry: no result");
    let fork = DetectionEvent {
        meta: meta(EventKind::ProcessFork),
        body: EventBody::ProcessFork { child_pid: 7, clone_flags: 17 },
    };
    let v = json_of(&detection_line(&fork, &clock, DetectionChecks::default()));
    assert_eq!((v["child_pid"].clone(), v["clone_flags"].clone()), (json!(7), json!("SIGCHLD")));

    let m = tracer_decode::procfs::parse_maps_line(
        9,
        "1000-3000 r-xs 00000000 00:01 5 /memfd:doublemapper (deleted)",
    )
    .unwrap();
    let v = json_of(&procfs_mapping_line(&m, &clock, None));
    assert_eq!(v["kind"], "dotnet_runtime_seen");
    assert_eq!(v["source"], "procfs");
    assert_eq!(v["pid"], 9);
    assert_eq!(v["len"], 0x2000);
    assert_eq!(v["prot"], "PROT_READ|PROT_EXEC");
    assert_eq!(v["flags"], "MAP_SHARED");
    assert_eq!(v["memfd"], "doublemapper");
}

/// `(kind, fields after the envelope)` from the table of docs/output.md's "Line kinds". A field
/// written `name?` appears only on some lines of its kind.
fn documented_kinds() -> BTreeMap<String, Vec<String>> {
    let page = include_str!("../../../docs/output.md");
    let table =
        page.split("\n## Line kinds\n").nth(1).expect("docs/output.md has a Line kinds section");
    let mut kinds = BTreeMap::new();
    let rows = table.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|'));
    // The header and the separator row first.
    for row in rows.skip(2) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let names = |cell: &str| -> Vec<String> {
            cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
        };
        let (kinds_cell, fields_cell) = (cells[1], cells[3]);
        for kind in names(kinds_cell) {
            kinds.insert(kind, names(fields_cell));
        }
    }
    kinds
}

/// docs/output.md's envelope fields, in order.
fn documented_envelope() -> Vec<String> {
    let page = include_str!("../../../docs/output.md");
    let start = page.find("\nEnvelope:").expect("docs/output.md names the envelope");
    // The names run up to the dash that starts their description.
    let names = page[start..].split(" —").next().unwrap();
    names.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// One line of every kind, several where fields depend on the event.
fn one_of_each_kind() -> Vec<Value> {
    let clock = Clock::with_offset(0);
    let detection = |kind, body| {
        json_of(&detection_line(
            &DetectionEvent { meta: meta(kind), body },
            &clock,
            DetectionChecks {
                user_events_data: Some(true),
                mapped_addr: Some(0x1000),
                ..DetectionChecks::default()
            },
        ))
    };
    let mapping = ipc_mapping();
    let reg = user_reg();
    let ioctl = |cmd: u32, ret, op| {
        EventBody::UserEvents(UserEventsIoctl { fd: 3, ret, cmd: cmd as u64, arg: 0x10, op })
    };
    let maps = "1000-3000 r-xs 00000000 00:01 5 /memfd:doublemapper (deleted)";
    let ipc_maps = "1000-2000 ---p 00000000 00:01 6 /memfd:dotnet_ipc_created (deleted)";
    let mut lines = vec![
        detection(
            EventKind::MemfdCreate,
            EventBody::MemfdCreate(MemfdCreate {
                memfd_kind: MemfdKind::DoubleMapper,
                flags: 1,
                name: Ok(b"doublemapper".to_vec()),
            }),
        ),
        detection(
            EventKind::MemfdCreate,
            EventBody::MemfdCreate(MemfdCreate {
                memfd_kind: MemfdKind::DoubleMapper,
                flags: 1,
                name: Err(-14),
            }),
        ),
        detection(EventKind::DotnetIpcReady, EventBody::DotnetIpcReady(mapping.clone())),
        detection(EventKind::DotnetRuntimeSeen, EventBody::DotnetRuntimeSeen(mapping)),
        json_of(&procfs_mapping_line(&parse_maps_line(9, maps).unwrap(), &clock, None)),
        json_of(&procfs_mapping_line(&parse_maps_line(9, ipc_maps).unwrap(), &clock, None)),
        detection(
            EventKind::UserEventsRegister,
            ioctl(
                DIAG_IOCSREG,
                0,
                UserEventsOp::Register { reg: Ok(reg), name_args: Some(Err(-14)) },
            ),
        ),
        detection(
            EventKind::UserEventsRegister,
            ioctl(DIAG_IOCSREG, -14, UserEventsOp::Register { reg: Err(-14), name_args: None }),
        ),
        detection(
            EventKind::UserEventsDelete,
            ioctl(DIAG_IOCSDEL, 0, UserEventsOp::Delete { name: Some(Err(-14)) }),
        ),
        detection(
            EventKind::UserEventsUnregister,
            ioctl(
                DIAG_IOCSUNREG,
                0,
                UserEventsOp::Unregister {
                    unreg: Ok(UserUnreg {
                        size: 16,
                        disable_bit: 5,
                        reserved: 0,
                        reserved2: 0,
                        disable_addr: 0x2000,
                    }),
                },
            ),
        ),
        detection(
            EventKind::UserEventsUnregister,
            ioctl(DIAG_IOCSUNREG, -14, UserEventsOp::Unregister { unreg: Err(-14) }),
        ),
        detection(EventKind::ProcessFork, EventBody::ProcessFork { child_pid: 7, clone_flags: 17 }),
        detection(
            EventKind::ProcessExec,
            EventBody::ProcessExec { old_tid: 1, filename: Err(-14) },
        ),
        detection(EventKind::ProcessExit, EventBody::ProcessExit),
        detection(
            EventKind::DotnetIpcSocket,
            EventBody::DotnetIpcSocket(IpcSocket {
                fd: 7,
                addrlen: 110,
                abstract_name: false,
                path: b"/tmp/dotnet-diagnostic-5-6-socket".to_vec(),
                name: DiagnosticSocketName { pid: 5, key: 6 },
            }),
        ),
    ];
    let net_unix =
        b"0000000000000000: 00000002 00000000 00010000 0001 01 51234 @dotnet-diagnostic-5-6-socket";
    for socket in listening_diagnostic_sockets(net_unix) {
        lines.push(json_of(&procfs_socket_line(9, &socket, &clock, None)));
    }
    // Lines about a process with its labels: all of them, or only what is known.
    let all = ProcessLabels {
        cgroup: Some("/kubepods/pod0c8f2a4e-5b1d-4c3a-9e7f-6d5b4a3c2e1f/c".into()),
        container_id: Some("c".repeat(64)),
        pod_uid: Some("0c8f2a4e-5b1d-4c3a-9e7f-6d5b4a3c2e1f".into()),
        ..ProcessLabels::default()
    };
    let cgroup_only = ProcessLabels { cgroup: Some("/user.slice".into()), ..Default::default() };
    let docker = ProcessLabels { container_id: Some("d".repeat(64)), ..all.clone() };
    for labels in [all, cgroup_only, ProcessLabels { pod_uid: None, ..docker }] {
        let line = detection_line(
            &DetectionEvent { meta: meta(EventKind::ProcessExit), body: EventBody::ProcessExit },
            &clock,
            DetectionChecks::default(),
        );
        lines.push(json_of(&line.with_labels(Some(std::sync::Arc::new(labels)))));
    }
    let table = crate::registrations::RegistrationTable::new();
    lines.push(json_of(&Line::new(
        &clock,
        1,
        Kind::RegistrationTable,
        Source::Tracer,
        Pid::NotApplicable,
        RegistrationTableBody::of(&table),
    )));
    // Every optional member: a version, activity ids, a stack, a payload too short for its
    // field (so a decode error).
    let meta = EventMetadata {
        event_name: "E".into(),
        version: Some(1),
        level: 4,
        keywords: 1,
        fields: vec![FieldDef::new("x".into(), FieldType::Int32)],
        ..EventMetadata::native("P", 1)
    };
    let context = EventContext {
        thread: 2,
        sequence: Some(3),
        timestamp: 4,
        activity_id: [0xa; 16],
        related_activity_id: [0xb; 16],
        stack_id: 6,
    };
    let mut stack = NamedStack::default();
    stack.push(StackFrame::Method("Ns.Type.Method".into()));
    stack.push(StackFrame::Address(0x7f00_1234));
    let event = OutputEvent {
        metadata: &meta,
        payload: &[1],
        pointer_size: 8,
        context,
        stack: Some(&stack),
        rendered_fields: None,
    };
    let identity =
        LineIdentity::new(Kind::DotnetEvent, Source::Nettrace, Pid::Known(PROCESS), None, Some(6));
    lines.push(json_of(&identity.line(&clock, 1, event)));
    let log = tracer_decode::logging::LogRecord {
        level: tracer_decode::logging::LogLevel::Error,
        category: "Shop.Orders".into(),
        event_id: 7,
        event_name: "OrderFailed".into(),
        message: "Order 42 failed".into(),
        template: Some("Order {OrderId} failed".into()),
        arguments: vec![("OrderId".into(), "42".into())],
        exception: Some(tracer_decode::logging::LogException {
            type_name: "System.Exception".into(),
            message: "boom".into(),
            details: "System.Exception: boom".into(),
            hresult: Some(-2146233088),
        }),
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        span_id: Some("00f067aa0ba902b7".into()),
        trace_flags: Some(1),
        cut: false,
    };
    let identity =
        LineIdentity::new(Kind::Log, Source::Nettrace, Pid::Known(PROCESS), None, Some(6));
    lines.push(json_of(&identity.line(&clock, 1, LogLine::new(&log, 9))));
    let session = |kind, body: &dyn ErasedSerialize| session_line(&clock, kind, body);
    lines.push(session(
        Kind::SessionStarted,
        &SessionStarted {
            session_id: SessionId(0x10),
            session: "streaming",
            command: "CollectTracing2".into(),
            runtime_version: Some("8.0.4"),
            command_line: Some("app"),
            providers: vec![SessionProvider {
                name: "System.Diagnostics.Metrics",
                keywords: "0x2".into(),
                level: 4,
                arguments: Some("Metrics=\"A,B\""),
            }],
        },
    ));
    lines.push(session(
        Kind::SessionEnded,
        &SessionEnded {
            session_id: SessionId(0x10),
            reason: "stopped",
            events: 3,
            stream: Some(StreamTotals {
                bytes: 100,
                lost_events: 1,
                lost_by_thread: vec![ThreadLoss { thread: 2, lost: 1 }],
                unrequested_events: 4,
                unread_bytes: 0,
                bytes_after_exit: 7,
                unwritten_events: 0,
                stacks_refused: 2,
                stacks_unwritten: 3,
                stop_error: Some("timed out".into()),
                file: Some(NettraceFileTotals {
                    nettrace_file: "/d/1_app_20261201_000000_10.nettrace".into(),
                    nettrace_file_bytes: 90,
                    nettrace_file_complete: false,
                    nettrace_file_unwritten_bytes: 10,
                    nettrace_file_error: Some("No space left on device".into()),
                }),
            }),
            records: None,
            error: Some("x"),
        },
    ));
    lines.push(session(
        Kind::SessionEnded,
        &SessionEnded {
            session_id: SessionId(0x11),
            reason: "budget_exceeded",
            events: 3,
            stream: None,
            records: Some(RecordTotals {
                foreign_writer: 1,
                undecodable: 2,
                unwritten_events: 3,
                not_started: 5,
                file: Some(NettraceFileTotals {
                    nettrace_file: "/d/1_app_20261201_000000_11.nettrace".into(),
                    nettrace_file_bytes: 100,
                    nettrace_file_complete: true,
                    nettrace_file_unwritten_bytes: 0,
                    nettrace_file_error: None,
                }),
                buffer_lost: 4,
            }),
            error: None,
        },
    ));
    lines.push(session(Kind::SessionFailed, &SessionFailed { refused: true, error: "x" }));
    lines.push(session(
        Kind::SocketRefused,
        &SocketRefused { path: "/tmp/s", reason: "owner_mismatch", error: "x" },
    ));
    let process = DotnetProcess {
        command_line: Some("app".into()),
        runtime_version: Some("3.1.23".into()),
        version_from: Some("libcoreclr_path"),
        sessions: vec!["streaming"],
        found_by: vec!["socket"],
        socket: Some("/tmp/s".into()),
        error: Some("x".into()),
    };
    lines.push(json_of(&Line::new(
        &clock,
        1,
        Kind::DotnetProcess,
        Source::Procfs,
        Pid::Known(PROCESS),
        process,
    )));
    let top = TopProcess {
        name: "app".into(),
        command_line: Some("app --serve".into()),
        runtime_version: Some("8.0.4".into()),
        session: "failed",
        session_detail: Some("x".into()),
        cpu_percent: Some(1.5),
        working_set_bytes: Some(1 << 20),
        gc_heap_bytes: None,
        gen0_gcs_per_sec: None,
        gen1_gcs_per_sec: None,
        gen2_gcs_per_sec: None,
        gc_paused_percent: None,
        alloc_bytes_per_sec: None,
        exceptions_per_sec: None,
        lock_contentions_per_sec: None,
        threadpool_threads: None,
        threadpool_queue_length: None,
        rates_from_ns: Some(1),
        rates_to_ns: Some(2),
        hot_method: Some("App.Main".into()),
        hot_method_percent: Some(50.0),
        cpu_samples: 2,
    };
    lines.push(json_of(&Line::new(
        &clock,
        1,
        Kind::TopProcess,
        Source::Tracer,
        Pid::Known(PROCESS),
        top,
    )));
    let ftrace = FtraceRecord {
        system: "sched",
        event: "sched_process_exec",
        cpu: 0,
        tid: 9,
        fields: tracer_decode::ordered::OrderedMap(Vec::new()),
    };
    lines.push(json_of(&Line::new(&clock, 1, Kind::Ftrace, Source::Ftrace, Pid::Unknown, ftrace)));
    let losses = [LossCount { source: "output", reason: "write_failed", count: 2 }];
    lines.push(json_of(
        &summary_line(&clock, "run", 5, &losses).with_unnamed_events(2).with_hooks(
            Some(&crate::kernel::detect::HookMechanism::Trampolines),
            Some(&crate::kernel::detect::LifecycleMechanism::BtfTracepoints),
        ),
    ));
    lines
}

/// Session bodies of different types through one closure.
trait ErasedSerialize {
    fn to_value(&self) -> Value;
}

impl<T: Serialize> ErasedSerialize for T {
    fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap()
    }
}

fn session_line(clock: &Clock, kind: Kind, body: &dyn ErasedSerialize) -> Value {
    json_of(&Line::new(clock, 1, kind, Source::Tracer, Pid::Known(PROCESS), body.to_value()))
}

#[test]
fn every_kind_has_exactly_the_fields_docs_output_md_documents() {
    let documented = documented_kinds();
    let envelope = documented_envelope();
    assert_eq!(
        envelope,
        [
            "ts",
            "mono_ns",
            "kind",
            "source",
            "pid",
            "process_start_ns",
            "cgroup?",
            "container_id?",
            "pod_uid?"
        ]
    );
    let mut labelled = 0;
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for mut line in one_of_each_kind() {
        // The process labels end the envelope, in docs/output.md's order, each only when known.
        let object = line.as_object_mut().unwrap();
        let labels = ["cgroup", "container_id", "pod_uid"];
        let keys: Vec<&String> = object.keys().collect();
        if let Some(first) = keys.iter().position(|k| labels.contains(&k.as_str())) {
            assert_eq!(keys[first - 1], "process_start_ns", "labels follow: {object:?}");
            let present: Vec<&str> = keys[first..]
                .iter()
                .take_while(|k| labels.contains(&k.as_str()))
                .map(|k| k.as_str())
                .collect();
            let order: Vec<&str> = labels.iter().copied().filter(|l| present.contains(l)).collect();
            assert_eq!(present, order, "{object:?}");
            for l in labels {
                object.shift_remove(l);
            }
            labelled += 1;
        }
        let keys: Vec<String> = line.as_object().unwrap().keys().cloned().collect();
        let kind = line["kind"].as_str().unwrap().to_string();
        let fields =
            documented.get(&kind).unwrap_or_else(|| panic!("{kind} is not in docs/output.md"));
        let names: Vec<&str> = fields.iter().map(|f| f.trim_end_matches('?')).collect();
        // The envelope first (the process is absent only where it cannot apply), then the
        // kind's fields in docs/output.md's order.
        let head = if line.get("pid").is_some() { 6 } else { 4 };
        let want_head: Vec<&String> = envelope[..6]
            .iter()
            .filter(|f| head == 6 || !["pid", "process_start_ns"].contains(&f.as_str()))
            .collect();
        assert_eq!(keys[..head].iter().collect::<Vec<_>>(), want_head, "{kind}: {line}");
        let body = &keys[head..];
        let positions: Vec<usize> = body
            .iter()
            .map(|k| {
                names
                    .iter()
                    .position(|n| n == k)
                    .unwrap_or_else(|| panic!("{kind}: {k} is not documented"))
            })
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{kind}: order differs: {body:?}");
        for (field, name) in fields.iter().zip(&names) {
            if !field.ends_with('?') {
                assert!(body.iter().any(|k| k == name), "{kind}: {name} missing in {line}");
            }
        }
        seen.entry(kind).or_default().extend(body.iter().cloned());
    }
    for (kind, fields) in &documented {
        let seen = seen.get(kind).unwrap_or_else(|| panic!("no line of kind {kind} was built"));
        for f in fields {
            let name = f.trim_end_matches('?');
            assert!(seen.iter().any(|k| k == name), "{kind}: documented {name} never written");
        }
    }
    assert_eq!(seen.len(), documented.len());
    assert_eq!(labelled, 3, "lines with process labels were checked");
}

#[test]
fn labels_are_written_only_when_known() {
    let clock = Clock::with_offset(0);
    let exit = DetectionEvent { meta: meta(EventKind::ProcessExit), body: EventBody::ProcessExit };
    let labels = ProcessLabels {
        cgroup: Some("/system.slice/docker-x.scope".into()),
        container_id: Some("e".repeat(64)),
        pod_uid: None,
        ..ProcessLabels::default()
    };
    let text = text_of(
        &detection_line(&exit, &clock, DetectionChecks::default())
            .with_labels(Some(std::sync::Arc::new(labels))),
    );
    let want = format!(
        r#""pid":100,"process_start_ns":null,"cgroup":"/system.slice/docker-x.scope","container_id":"{}","tid":101,"#,
        "e".repeat(64)
    );
    assert!(text.contains(&want), "{text}");
    let bare = text_of(&detection_line(&exit, &clock, DetectionChecks::default()));
    assert!(bare.contains(r#""pid":100,"process_start_ns":null,"tid":101,"#), "{bare}");
}

#[test]
fn summary_line_sums_its_losses() {
    let losses = [
        LossCount { source: "kernel", reason: "ring_full", count: 3 },
        LossCount { source: "output", reason: "write_failed", count: 2 },
    ];
    let line = json_of(&summary_line(&Clock::with_offset(0), "audit", 7, &losses));
    assert_eq!(line["kind"], "summary");
    assert_eq!(line.get("pid"), None);
    assert_eq!((line["command"].clone(), line["events"].clone()), (json!("audit"), json!(7)));
    assert_eq!(line["lost"], 5);
    assert_eq!(
        line["losses"],
        json!([
            {"source": "kernel", "reason": "ring_full", "count": 3},
            {"source": "output", "reason": "write_failed", "count": 2}
        ])
    );
}

#[test]
fn kind_and_source_names() {
    assert_eq!(Kind::Detection(EventKind::ProcessExit).name(), "process_exit");
    assert_eq!(Kind::DotnetEvent.name(), "dotnet_event");
    assert_eq!(Source::UserEvents.name(), "user_events");
    assert_eq!(serde_json::to_string(&SessionId(0xabc)).unwrap(), r#""0xabc""#);
}

/// Every loss `run` and `audit` count (zero or not) has its row in docs/output.md's table of
/// losses, so a consumer of the `summary` line knows what each means.
#[test]
fn docs_output_md_lists_every_loss() {
    let page = include_str!("../../../docs/output.md");
    let table = page
        .split("| `source` | `reason` | what was lost |")
        .nth(1)
        .expect("docs/output.md has the table of losses");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    let run = crate::summary::RunSummary {
        otlp: Some(Default::default()),
        runtime_counters: Some(Default::default()),
        ..Default::default()
    };
    let mut losses = run.all_losses();
    losses.extend(crate::summary::AuditSummary::default().all_loss_counts());
    assert!(losses.len() > 20, "{losses:?}");
    for l in losses {
        let (source, reason) = (format!("`{}`", l.source), format!("`{}`", l.reason));
        assert!(
            rows.iter().any(|r| r[1].contains(&source) && r[2].contains(&reason)),
            "docs/output.md's table of losses lacks {source} {reason}"
        );
    }
}

/// A `dotnet_event` line as serde_json wrote it before the direct writer (the derive `Line`
/// had): the reference the writer's bytes are compared with.
#[derive(Serialize)]
struct ReferenceEventLine<'a> {
    ts: String,
    mono_ns: u64,
    kind: &'static str,
    source: &'static str,
    pid: u32,
    process_start_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cgroup: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_uid: Option<&'a str>,
    session_id: SessionId,
    #[serde(flatten)]
    event: &'a DecodedEvent<'a>,
}

fn reference_line(
    clock: &Clock,
    mono_ns: u64,
    source: Source,
    origin: (Incarnation, u64),
    labels: Option<&ProcessLabels>,
    event: &DecodedEvent,
) -> String {
    let label = |f: fn(&ProcessLabels) -> &Option<String>| labels.and_then(|l| f(l).as_deref());
    serde_json::to_string(&ReferenceEventLine {
        ts: clock.iso8601(mono_ns),
        mono_ns,
        kind: "dotnet_event",
        source: source.name(),
        pid: origin.0.pid,
        process_start_ns: origin.0.start_ns,
        cgroup: label(|l| &l.cgroup),
        container_id: label(|l| &l.container_id),
        pod_uid: label(|l| &l.pod_uid),
        session_id: SessionId(origin.1),
        event,
    })
    .unwrap()
}

/// Every event of the captured streams, as a `dotnet_event` line of either source, with and
/// without process labels (escapes in them too), at clocks before and after 1970 and now: the
/// written bytes are serde_json's.
#[test]
fn dotnet_event_lines_are_written_byte_for_byte_as_serde_json_writes_them() {
    use tracer_decode::nettrace::NettraceParser;
    let all_labels = ProcessLabels {
        cgroup: Some("/kubepods.slice/pod\"quote\\\u{1}\u{2028}.slice".into()),
        container_id: Some("e".repeat(64)),
        pod_uid: Some("0b7c3a0e-1111-2222-3333-444455556666".into()),
        ..ProcessLabels::default()
    };
    let cgroup_only =
        ProcessLabels { cgroup: Some("/system.slice/a.service".into()), ..all_labels.clone() };
    let pod_only = ProcessLabels { pod_uid: Some("p".into()), ..ProcessLabels::default() };
    let labels =
        [None, Some(all_labels), Some(cgroup_only), Some(pod_only)].map(|l| l.map(Arc::new));
    let clocks = [Clock::with_offset(0), Clock::with_offset(-5_000_000_000_123), Clock::new()];
    let dir = format!("{}/../tests/fixtures/nettrace", env!("CARGO_MANIFEST_DIR"));
    let mut lines = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "nettrace") {
            continue;
        }
        let mut parser = NettraceParser::default();
        let (mut methods, mut named) = (MethodTable::default(), NamedStack::default());
        parser
            .feed(&std::fs::read(&path).unwrap(), |e| {
                let i = lines;
                let time = e.timestamp as u64;
                methods.take_event(&e.metadata.provider, e.metadata.event_id, e.payload, time);
                let mut event = e.output();
                if let Some(ips) = e.stack {
                    named.name(ips, time, &mut methods);
                    event.stack = Some(&named);
                }
                let (clock, labels) = (&clocks[i % clocks.len()], &labels[i % labels.len()]);
                let source = if i % 2 == 0 { Source::Nettrace } else { Source::UserEvents };
                let mono_ns = if i == 0 { u64::MAX } else { e.timestamp as u64 };
                let process = match i % 3 {
                    0 => Incarnation::new(4242, Some(u64::MAX)),
                    1 => Incarnation::new(u32::MAX, None),
                    _ => Incarnation::new(4242, Some(1_230_000_000)),
                };
                let session_id = if i == 2 { u64::MAX } else { 0x7f00_0000_1100 };
                let decoded = event.decode();
                let origin = (process, session_id);
                let want =
                    reference_line(clock, mono_ns, source, origin, labels.as_deref(), &decoded);
                // The envelope rendered once for the process's lines, then each event.
                let (kind, pid) = (Kind::DotnetEvent, Pid::Known(process));
                let identity =
                    LineIdentity::new(kind, source, pid, labels.clone(), Some(session_id));
                assert_eq!(
                    text_of(&identity.line(clock, mono_ns, event)),
                    want,
                    "{}",
                    path.display()
                );
                lines += 1;
            })
            .unwrap();
    }
    assert!(lines > 800, "{lines} lines");
}

#[test]
fn a_pid_tracer_could_not_tell_is_null_and_one_that_does_not_apply_is_absent() {
    let clock = Clock::with_offset(0);
    let body = FieldMap::default();
    let unknown = Line::new(&clock, 1, Kind::Ftrace, Source::Ftrace, Pid::Unknown, body.clone());
    assert_eq!(
        text_of(&unknown),
        r#"{"ts":"1970-01-01T00:00:00.000000001Z","mono_ns":1,"kind":"ftrace","source":"ftrace","pid":null,"process_start_ns":null}"#
    );
    let none = Line::new(&clock, 1, Kind::Summary, Source::Tracer, Pid::NotApplicable, body);
    assert_eq!(
        text_of(&none),
        r#"{"ts":"1970-01-01T00:00:00.000000001Z","mono_ns":1,"kind":"summary","source":"tracer"}"#
    );
}

/// An `ftrace` line as serde_json wrote it before the direct writer: the reference.
#[derive(Serialize)]
struct ReferenceFtraceLine<'a> {
    ts: String,
    mono_ns: u64,
    kind: &'static str,
    source: &'static str,
    pid: Option<u32>,
    process_start_ns: Option<u64>,
    system: &'a str,
    event: &'a str,
    cpu: u32,
    tid: i32,
    fields: &'a tracer_decode::ftrace::record::Fields<'a>,
}

#[test]
fn ftrace_lines_are_written_byte_for_byte_as_serde_json_writes_them() {
    use tracer_decode::ftrace::record::FieldValue;
    let clock = Clock::with_offset(1_795_991_400_000_000_000);
    let mut fields = tracer_decode::ordered::OrderedMap::default();
    fields
        .push("filename", FieldValue::Str("/tmp/\"odd\"\\name\n\u{2028}é".into()))
        .push("ret", FieldValue::Signed(i64::MIN))
        .push("addr", FieldValue::Unsigned(u64::MAX))
        .push("buf", FieldValue::Bytes(vec![0, 0xff]))
        .push("args", FieldValue::Array(vec![FieldValue::Unsigned(1), FieldValue::Signed(-2)]));
    let max = Incarnation::new(u32::MAX, Some(u64::MAX));
    for (pid, want) in [(Pid::Known(max), Some(max)), (Pid::Unknown, None)] {
        let record =
            FtraceRecord { system: "sys\"x", event: "ev", cpu: 1, tid: -3, fields: fields.clone() };
        let want = serde_json::to_string(&ReferenceFtraceLine {
            ts: clock.iso8601(77),
            mono_ns: 77,
            kind: "ftrace",
            source: "ftrace",
            pid: want.map(|p| p.pid),
            process_start_ns: want.and_then(|p| p.start_ns),
            system: record.system,
            event: record.event,
            cpu: record.cpu,
            tid: record.tid,
            fields: &record.fields,
        })
        .unwrap();
        let line = Line::new(&clock, 77, Kind::Ftrace, Source::Ftrace, pid, record);
        assert_eq!(text_of(&line), want);
    }
}
