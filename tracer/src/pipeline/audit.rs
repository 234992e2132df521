//! `tracer audit`: attach the detection programs and print every detection as a JSON line.
//!
//! Order of work: attach (so nothing that happens from now on is missed), scan /proc for
//! mappings that already existed (`"source":"procfs"`; a process mapping between the attach and
//! the scan is reported by both), signal readiness, stream live events (`"source":"kernel"`)
//! until stopped, detach, drain the ring, and summarise every kind of loss.
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use serde::ser::SerializeMap as _;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tracer_common::{EventKind, MemfdKind};

use crate::decode::bpf_event::{
    Captured, DetectionEvent, EventBody, Mapping, UserEventsOp, kind_name, memfd_name,
};
use crate::decode::names;
use crate::kernel::detect::{DetectOptions, Detector, Loss, ProgramStats};
use crate::kernel::procfs::{self, MemfdMapping};
use crate::pipeline::registrations::RegistrationTable;
use crate::sink::{Clock, JsonLines, clock::monotonic_ns};

/// Detect .NET processes and user_events registrations, printing one JSON object per line.
///
/// Every line has `ts` (ISO-8601 wall clock), `mono_ns` (CLOCK_MONOTONIC), `kind`, `source`
/// (`kernel` for live events, `procfs` for mappings found at start-up), the process (`pid`,
/// `tid`, `comm`, `uid`, `cgroup_id`), `cpu` and `seq` (per-CPU sequence; gaps are losses), and
/// the kind's fields. Kinds: memfd_create, dotnet_ipc_ready, dotnet_runtime_seen,
/// user_events_register, user_events_delete, user_events_unregister, process_fork,
/// process_exec, process_exit (fork/exec/exit only for processes that did one of the others).
///
/// Stop with Ctrl-C / SIGTERM or --duration: tracer detaches, drains what is buffered and prints
/// a summary to stderr (events per kind; losses per CPU, kind and reason; sequence gaps).
///
/// Needs root, or CAP_BPF + CAP_PERFMON and read access to tracefs.
/// Example: `tracer audit --pid 1234 --registrations --duration 30s -o audit.jsonl`
#[derive(clap::Args, Debug, Clone)]
pub struct AuditArgs {
    /// Write the JSON lines to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Stop after this long (e.g. 30s, 500ms, 2m); default: until SIGINT/SIGTERM.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub duration: Option<Duration>,
    /// Only report this process and its descendants (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Keep the per-process user_events registration table (inherited on fork, dropped on exec
    /// and exit) and print it at exit: a `registration_table` JSON line and a table on stderr.
    #[arg(long)]
    pub registrations: bool,
}

#[derive(Clone, Debug, Default)]
pub struct AuditConfig {
    pub target_pids: Vec<u32>,
    pub registrations: bool,
}

/// What happened during a run; `Display` is the stderr summary.
#[derive(Debug, Default)]
pub struct AuditSummary {
    /// Live events per kind name.
    pub kernel_events: BTreeMap<&'static str, u64>,
    /// Start-up procfs findings per kind name.
    pub procfs_events: BTreeMap<&'static str, u64>,
    pub losses: Vec<Loss>,
    /// (cpu, kind, missing events)
    pub seq_gaps: Vec<(u32, EventKind, u64)>,
    pub decode_errors: u64,
    /// (program, skipped invocations), nonzero only.
    pub recursion_misses: Vec<(&'static str, u64)>,
    /// Run statistics per program; run counts and times stay 0 unless
    /// `kernel.bpf_stats_enabled` is 1.
    pub program_stats: Vec<(&'static str, ProgramStats)>,
    /// The table at exit, when `registrations` was requested.
    pub registrations: Option<RegistrationTable>,
}

impl AuditSummary {
    pub fn total_lost(&self) -> u64 {
        self.losses.iter().map(|l| l.count).sum::<u64>()
            + self.recursion_misses.iter().map(|r| r.1).sum::<u64>()
    }
}

impl fmt::Display for AuditSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "tracer audit summary")?;
        let counts = |m: &BTreeMap<&str, u64>| {
            if m.is_empty() {
                "none".to_string()
            } else {
                m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
            }
        };
        writeln!(f, "  kernel events: {}", counts(&self.kernel_events))?;
        writeln!(f, "  procfs events: {}", counts(&self.procfs_events))?;
        if self.losses.is_empty() {
            writeln!(f, "  losses: none")?;
        } else {
            writeln!(f, "  losses:")?;
            for l in &self.losses {
                writeln!(
                    f,
                    "    cpu {} {} {}: {}",
                    l.cpu,
                    kind_name(l.kind),
                    loss_reason_name(l.reason),
                    l.count
                )?;
            }
        }
        if self.seq_gaps.is_empty() {
            writeln!(f, "  sequence gaps: none")?;
        } else {
            writeln!(f, "  sequence gaps:")?;
            for (cpu, kind, missing) in &self.seq_gaps {
                writeln!(f, "    cpu {cpu} {}: {missing} missing", kind_name(*kind))?;
            }
        }
        if self.recursion_misses.is_empty() {
            writeln!(f, "  skipped invocations (recursion_misses): none")?;
        } else {
            for (prog, n) in &self.recursion_misses {
                writeln!(f, "  skipped invocations of {prog} (recursion_misses): {n}")?;
            }
        }
        writeln!(f, "  corrupt ring records: {}", self.decode_errors)?;
        if self.program_stats.iter().any(|(_, s)| s.run_cnt != 0) {
            writeln!(f, "  program run time (kernel.bpf_stats_enabled):")?;
            for (prog, s) in &self.program_stats {
                let avg =
                    if s.run_cnt == 0 { 0.0 } else { s.run_time_ns as f64 / s.run_cnt as f64 };
                writeln!(f, "    {prog}: runs={} avg_ns={avg:.1}", s.run_cnt)?;
            }
        }
        if let Some(table) = &self.registrations {
            writeln!(f, "user_events registrations at exit:")?;
            write!(f, "{}", table.render())?;
        }
        Ok(())
    }
}

fn loss_reason_name(r: tracer_common::LossReason) -> &'static str {
    match r {
        tracer_common::LossReason::RingFull => "ring_full",
        tracer_common::LossReason::ReadFailed => "read_failed",
        tracer_common::LossReason::MapFull => "map_full",
    }
}

/// Runs the audit until `stop` resolves. `ready` is sent once the programs are attached and the
/// procfs findings are written: from then on every event of interest is reported.
pub async fn run(
    config: AuditConfig,
    mut sink: JsonLines,
    stop: impl Future<Output = ()>,
    ready: Option<oneshot::Sender<()>>,
) -> anyhow::Result<AuditSummary> {
    for pid in &config.target_pids {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            anyhow::bail!("--pid {pid}: no such process");
        }
    }
    let mut detector =
        Detector::attach(&DetectOptions { target_pids: config.target_pids.clone() })?;
    let clock = Clock::new();
    let mut summary = AuditSummary::default();
    let mut table = RegistrationTable::new();

    let me = std::process::id();
    let targets = config.target_pids.clone();
    let mappings = procfs::scan_memfd_mappings(|pid| {
        pid != me && (targets.is_empty() || targets.contains(&pid))
    })
    .context("scanning /proc for existing .NET mappings")?;
    for m in &mappings {
        let line = procfs_line(m, &clock, procfs::process_identity(m.pid));
        *summary.procfs_events.entry(line.kind).or_default() += 1;
        sink.emit(&line).context("writing output")?;
    }
    log::info!(
        "attached {} detection programs; {} existing .NET mapping(s) found in /proc",
        crate::kernel::detect::PROGRAMS.len(),
        mappings.len()
    );
    if let Some(ready) = ready {
        let _ = ready.send(());
    }

    let mut batch = Vec::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            res = detector.read(&mut batch) => res.context("reading the BPF ring buffer")?,
        }
        emit_events(&mut batch, &clock, &mut sink, &mut table, &mut summary)?;
    }

    detector.detach()?;
    detector.drain(&mut batch);
    emit_events(&mut batch, &clock, &mut sink, &mut table, &mut summary)?;

    summary.losses = detector.losses()?;
    summary.seq_gaps = detector.seq_gaps().gaps();
    summary.decode_errors = detector.decode_errors();
    summary.program_stats = detector.program_stats()?;
    summary.recursion_misses = summary
        .program_stats
        .iter()
        .filter(|(_, s)| s.recursion_misses != 0)
        .map(|(p, s)| (*p, s.recursion_misses))
        .collect();
    if config.registrations {
        sink.emit(&registration_table_line(&table, &clock)).context("writing output")?;
        summary.registrations = Some(table);
    }
    Ok(summary)
}

fn emit_events(
    batch: &mut Vec<DetectionEvent>,
    clock: &Clock,
    sink: &mut JsonLines,
    table: &mut RegistrationTable,
    summary: &mut AuditSummary,
) -> anyhow::Result<()> {
    for event in batch.drain(..) {
        // Checked now, while the process most likely still holds the fd.
        let user_events_data = match &event.body {
            EventBody::UserEvents(ioctl) => procfs::is_user_events_data(event.meta.pid, ioctl.fd),
            _ => None,
        };
        table.apply(&event);
        let line = event_line(&event, clock, user_events_data);
        *summary.kernel_events.entry(line.kind).or_default() += 1;
        sink.emit(&line).context("writing output")?;
    }
    Ok(())
}

/// One output line: the common envelope, then the kind's fields in a fixed order.
#[derive(Debug, Clone)]
pub struct Line {
    pub kind: &'static str,
    fields: Vec<(&'static str, Value)>,
}

impl Line {
    fn new(clock: &Clock, mono_ns: u64, kind: &'static str, source: &'static str) -> Line {
        let fields = vec![
            ("ts", json!(clock.iso8601(mono_ns))),
            ("mono_ns", json!(mono_ns)),
            ("kind", json!(kind)),
            ("source", json!(source)),
        ];
        Line { kind, fields }
    }

    fn push(&mut self, key: &'static str, value: impl Into<Value>) -> &mut Line {
        self.fields.push((key, value.into()));
        self
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

impl Serialize for Line {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.fields.len()))?;
        for (k, v) in &self.fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

fn hex(v: u64) -> Value {
    json!(format!("{v:#x}"))
}

fn text(bytes: &[u8]) -> Value {
    json!(String::from_utf8_lossy(bytes))
}

/// Adds `<key>` (the string, or null) and, when the read failed, `<key>_error` (errno name).
fn push_captured(line: &mut Line, key: &'static str, error_key: &'static str, c: &Captured) {
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
fn push_ret(line: &mut Line, ret: i64) {
    line.push("ret", ret).push("error", names::syscall_error_name(ret));
}

/// The JSON line of a live event. `user_events_data` is the /proc fd check for ioctl events.
pub fn event_line(event: &DetectionEvent, clock: &Clock, user_events_data: Option<bool>) -> Line {
    let m = &event.meta;
    let mut line = Line::new(clock, m.ktime_ns, kind_name(m.kind), "kernel");
    line.push("pid", m.pid)
        .push("tid", m.tid)
        .push("comm", m.comm.as_str())
        .push("uid", m.uid)
        .push("cgroup_id", m.cgroup_id)
        .push("cpu", m.cpu)
        .push("seq", m.seq);
    match &event.body {
        EventBody::MemfdCreate(mc) => {
            line.push("memfd", memfd_name(mc.memfd_kind));
            push_captured(&mut line, "name", "name_error", &mc.name);
            line.push("flags", names::memfd_flag_names(mc.flags.into()));
            push_ret(&mut line, mc.ret);
        }
        EventBody::DotnetIpcReady(map) | EventBody::DotnetRuntimeSeen(map) => {
            push_mapping(&mut line, map);
        }
        EventBody::UserEvents(ioctl) => {
            line.push("fd", ioctl.fd);
            push_ret(&mut line, ioctl.ret);
            line.push("cmd", hex(ioctl.cmd))
                .push("arg", hex(ioctl.arg))
                .push("user_events_data", user_events_data);
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
    }
    line
}

fn push_mapping(line: &mut Line, map: &Mapping) {
    line.push("memfd", memfd_name(map.memfd_kind))
        .push("fd", map.fd)
        .push("addr", hex(map.addr))
        .push("len", map.len)
        .push("prot", names::prot_names(map.prot))
        .push("flags", names::map_flag_names(map.flags))
        .push("offset", map.offset);
}

/// The JSON line of a mapping found by the start-up scan. Fields the kernel path knows but
/// procfs cannot tell (tid of the mapping call, fd, CPU, sequence) are null.
pub fn procfs_line(m: &MemfdMapping, clock: &Clock, id: Option<procfs::ProcessIdentity>) -> Line {
    let kind = match m.memfd_kind {
        MemfdKind::DotnetIpcCreated => kind_name(EventKind::DotnetIpcReady),
        MemfdKind::DoubleMapper => kind_name(EventKind::DotnetRuntimeSeen),
    };
    let mut line = Line::new(clock, monotonic_ns(), kind, "procfs");
    let id = id.unwrap_or_default();
    line.push("pid", m.pid)
        .push("tid", Value::Null)
        .push("comm", id.comm)
        .push("uid", id.uid)
        .push("cgroup_id", id.cgroup_id)
        .push("cpu", Value::Null)
        .push("seq", Value::Null)
        .push("memfd", memfd_name(m.memfd_kind))
        .push("fd", Value::Null)
        .push("addr", hex(m.start))
        .push("len", m.end.saturating_sub(m.start))
        .push("prot", names::prot_names(perms_prot(&m.perms)))
        .push("flags", if m.perms.ends_with('s') { "MAP_SHARED" } else { "MAP_PRIVATE" })
        .push("offset", m.offset)
        .push("path", m.path.as_str());
    line
}

/// `r-xp` → PROT_READ|PROT_EXEC.
fn perms_prot(perms: &str) -> u64 {
    let b = perms.as_bytes();
    let bit = |i: usize, c: u8, v: u64| if b.get(i) == Some(&c) { v } else { 0 };
    bit(0, b'r', 1) | bit(1, b'w', 2) | bit(2, b'x', 4)
}

fn registration_table_line(table: &RegistrationTable, clock: &Clock) -> Line {
    let mut line = Line::new(clock, monotonic_ns(), "registration_table", "tracer");
    let processes: Vec<Value> =
        table.iter().map(|(pid, regs)| json!({ "pid": pid, "registrations": regs })).collect();
    line.push("processes", processes);
    line
}

/// `tracer audit` from the command line: exit code 0 after a clean stop.
pub fn main(args: AuditArgs) -> ExitCode {
    match cli(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tracer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn cli(args: AuditArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let sink = JsonLines::open(args.output.as_deref())?;
        // Signal handlers are installed before attaching so an early Ctrl-C is not lost.
        let stop = super::stop_requested(args.duration);
        let config = AuditConfig { target_pids: args.pids, registrations: args.registrations };
        let stop = async {
            match stop.await {
                Ok(reason) => log::info!("stopping ({reason:?})"),
                Err(e) => log::error!("signal handling failed, stopping: {e}"),
            }
        };
        let summary = run(config, sink, stop, None).await?;
        eprint!("{summary}");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use tracer_common::{DIAG_IOCSREG, MemfdKind};

    use super::*;
    use crate::decode::bpf_event::{EventMeta, MemfdCreate, UserEventsIoctl, UserReg};

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
        }
    }

    fn json_of(line: &Line) -> Value {
        serde_json::to_value(line).unwrap()
    }

    #[test]
    fn envelope_order_and_fields() {
        let clock = Clock::with_offset(0);
        let ev = DetectionEvent {
            meta: meta(EventKind::DotnetIpcReady),
            body: EventBody::DotnetIpcReady(Mapping {
                memfd_kind: MemfdKind::DotnetIpcCreated,
                fd: 4,
                addr: 0x7f00_0000_1000,
                len: 4096,
                prot: 0,
                flags: 2,
                offset: 0,
            }),
        };
        let line = event_line(&ev, &clock, None);
        let text = serde_json::to_string(&line).unwrap();
        assert!(
            text.starts_with(r#"{"ts":"1970-01-01T00:00:01.000000000Z","mono_ns":1000000000,"kind":"dotnet_ipc_ready","source":"kernel","pid":100,"tid":101,"comm":"helper","uid":0,"cgroup_id":55,"cpu":1,"seq":3,"#),
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
                reg: Ok(UserReg {
                    size: 28,
                    enable_bit: 5,
                    enable_size: 4,
                    flags: 0,
                    enable_addr: 0x2000,
                    name_args_ptr: 0x3000,
                    write_index: 9,
                }),
                name_args: Some(Ok(b"ev u32 a".to_vec())),
            },
        };
        let ev = |ioctl: &UserEventsIoctl| DetectionEvent {
            meta: meta(EventKind::UserEventsRegister),
            body: EventBody::UserEvents(ioctl.clone()),
        };
        let v = json_of(&event_line(&ev(&ioctl), &clock, Some(false)));
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
        let v = json_of(&event_line(&ev(&ioctl), &clock, None));
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
                ret: -24,
                name: Err(-14),
            }),
        };
        let v = json_of(&event_line(&ev, &clock, None));
        assert_eq!(v["name"], Value::Null);
        assert_eq!(v["name_error"], "EFAULT");
        assert_eq!(v["flags"], "MFD_CLOEXEC");
        assert_eq!(v["error"], "EMFILE");
        let fork = DetectionEvent {
            meta: meta(EventKind::ProcessFork),
            body: EventBody::ProcessFork { child_pid: 7, clone_flags: 17 },
        };
        let v = json_of(&event_line(&fork, &clock, None));
        assert_eq!(
            (v["child_pid"].clone(), v["clone_flags"].clone()),
            (json!(7), json!("SIGCHLD"))
        );

        let m = procfs::parse_maps_line(
            9,
            "1000-3000 r-xs 00000000 00:01 5 /memfd:doublemapper (deleted)",
        )
        .unwrap();
        let v = json_of(&procfs_line(&m, &clock, None));
        assert_eq!(v["kind"], "dotnet_runtime_seen");
        assert_eq!(v["source"], "procfs");
        assert_eq!(v["pid"], 9);
        assert_eq!(v["len"], 0x2000);
        assert_eq!(v["prot"], "PROT_READ|PROT_EXEC");
        assert_eq!(v["flags"], "MAP_SHARED");
        assert_eq!(v["memfd"], "doublemapper");
    }

    #[test]
    fn summary_text() {
        let mut s = AuditSummary::default();
        s.kernel_events.insert("process_exit", 2);
        s.losses.push(Loss {
            cpu: 1,
            kind: EventKind::DotnetIpcReady,
            reason: tracer_common::LossReason::RingFull,
            count: 4,
        });
        s.seq_gaps.push((1, EventKind::DotnetIpcReady, 4));
        s.program_stats.push(("sys_enter_mmap", ProgramStats::default()));
        assert!(!s.to_string().contains("program run time"), "hidden while stats are off");
        s.program_stats[0].1.run_cnt = 4;
        s.program_stats[0].1.run_time_ns = 100;
        let text = s.to_string();
        assert!(text.contains("sys_enter_mmap: runs=4 avg_ns=25.0"), "{text}");
        assert!(text.contains("kernel events: process_exit=2"), "{text}");
        assert!(text.contains("cpu 1 dotnet_ipc_ready ring_full: 4"), "{text}");
        assert!(text.contains("cpu 1 dotnet_ipc_ready: 4 missing"), "{text}");
        assert_eq!(s.total_lost(), 4);
    }
}
