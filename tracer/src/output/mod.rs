//! Everything tracer writes, defined in one place. Every output line is a [`Line`]: the common
//! envelope `{ts, mono_ns, kind, source, pid}` followed by the body of its kind ([`LineBody`]),
//! written by [`JsonLines`] (or rendered ahead by a session task into a [`LineBatch`]). The
//! envelope and the runtime events' bodies are written straight into the line's buffer (one per
//! event: the output path's cost); the other bodies are serialized with serde. With
//! `--otlp-endpoint` each line is also encoded as an OTLP log record from the same typed
//! envelope and body ([`otlp`]). docs/output.md's "Line kinds" table lists the same kinds
//! and fields; a test below checks that they agree.
mod detection;
pub mod otlp;
mod writer;

use std::sync::Arc;

use serde::{Serialize, Serializer};
use tracer_common::EventKind;
use tracer_decode::diagnostic_ipc::ProviderConfig;
use tracer_decode::ftrace::record::Fields as FtraceFields;
use tracer_decode::json::{self, RenderedOnce, WriteJson, WrittenU64};
use tracer_decode::logging::LogRecord;
use tracer_decode::nettrace::OutputEvent;

pub use self::detection::{FieldMap, detection_line, procfs_mapping_line, procfs_socket_line};
use self::otlp::{EncodedRecords, RecordParts};
pub use self::writer::{
    Batch, JsonLines, LineBatch, LineTap, OUTPUT_FILE_MODE, OutputWait, ReopenRequest, private_file,
};
use crate::kernel::detect::{HookMechanism, LifecycleMechanism};
use crate::kernel::ftrace_reader::{CpuStats, ReaderStats};
use crate::registrations::RegistrationTable;
use crate::time::{Clock, monotonic_ns, write_iso8601};

/// What a line reports (`"kind"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A detection by the eBPF programs (or, with source `procfs`, by the start-up scan).
    Detection(EventKind),
    /// `tracer audit --registrations`: the per-process user_events table at exit.
    RegistrationTable,
    /// One runtime event of a tracing session.
    DotnetEvent,
    /// One `ILogger` message of a traced process (`Microsoft-Extensions-Logging`'s
    /// `MessageJson`).
    Log,
    SessionStarted,
    SessionEnded,
    SessionFailed,
    /// A name refused as a process's diagnostic socket (the session may go on looking).
    SocketRefused,
    /// One record of `tracer ftrace`.
    Ftrace,
    /// `tracer ps`: one .NET process on the host.
    DotnetProcess,
    /// `tracer top --once`: one .NET process, as the screen shows it.
    TopProcess,
    /// The last line of every pipeline: event and loss counts.
    Summary,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Detection(kind) => kind.name(),
            Kind::RegistrationTable => "registration_table",
            Kind::DotnetEvent => "dotnet_event",
            Kind::Log => "log",
            Kind::SessionStarted => "session_started",
            Kind::SessionEnded => "session_ended",
            Kind::SessionFailed => "session_failed",
            Kind::SocketRefused => "socket_refused",
            Kind::Ftrace => "ftrace",
            Kind::DotnetProcess => "dotnet_process",
            Kind::TopProcess => "top_process",
            Kind::Summary => "summary",
        }
    }
}

/// Where what a line reports was seen (`"source"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The eBPF programs, live.
    Kernel,
    /// The start-up scan of `/proc`.
    Procfs,
    /// A runtime's nettrace stream (streaming sessions).
    Nettrace,
    /// user_events tracepoints in tracer's ftrace instance (user_events sessions).
    UserEvents,
    /// A kernel tracepoint recorded by `tracer ftrace`.
    Ftrace,
    /// tracer itself: session lifecycle, tables at exit.
    Tracer,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Kernel => "kernel",
            Source::Procfs => "procfs",
            Source::Nettrace => "nettrace",
            Source::UserEvents => "user_events",
            Source::Ftrace => "ftrace",
            Source::Tracer => "tracer",
        }
    }
}

/// One process across pid reuse: its pid (as the host's pid namespace numbers it) and when it
/// started (`process_start_ns`: CLOCK_BOOTTIME nanoseconds rounded down to a clock tick, from
/// the kernel's task or `/proc/<pid>/stat`; docs/protocol/bpf-detection.md §11). A pid names
/// another process once reused; the pair does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Incarnation {
    pub pid: u32,
    /// `None` when tracer could not tell (the process was gone before it was read).
    pub start_ns: Option<u64>,
}

impl Incarnation {
    pub fn new(pid: u32, start_ns: Option<u64>) -> Incarnation {
        Incarnation { pid, start_ns }
    }
}

/// The process a line is about (`"pid"` and `"process_start_ns"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pid {
    Known(Incarnation),
    /// The line is about a process tracer could not identify (`null`), e.g. a thread that exited
    /// before `tracer ftrace` looked up its thread group.
    Unknown,
    /// The line is about no single process (no `pid` field).
    NotApplicable,
}

/// One output line: the envelope, then the kind's body.
#[derive(Debug)]
pub struct Line<B> {
    /// Wall-clock nanoseconds since the epoch of `mono_ns` (`ts`, written as ISO-8601 UTC).
    wall_ns: i128,
    /// CLOCK_MONOTONIC nanoseconds: the time the event happened (or tracer saw it).
    mono_ns: u64,
    kind: Kind,
    source: Source,
    /// Not written when [`Pid::NotApplicable`].
    pid: Pid,
    /// The process's cgroup, container and pod, when known (lines about a process only).
    labels: Option<Arc<ProcessLabels>>,
    body: B,
}

/// Where a process runs: its cgroup v2 path and the container and pod that path names. Each is
/// written only when known (`crate::identity` reads them from `/proc/<pid>/cgroup`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessLabels {
    pub cgroup: Option<String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// The labels as JSON members, rendered for the process's first line.
    pub rendered: RenderedOnce,
}

impl ProcessLabels {
    /// Appends the known labels as members after the envelope's `pid`.
    fn write_json_members(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.rendered.get_or_render(|members| self.render(members)));
    }

    fn render(&self, out: &mut Vec<u8>) {
        let labels: [(&[u8], _); 3] = [
            (br#","cgroup":"#, &self.cgroup),
            (br#","container_id":"#, &self.container_id),
            (br#","pod_uid":"#, &self.pod_uid),
        ];
        for (key, value) in labels {
            if let Some(value) = value {
                out.extend_from_slice(key);
                json::push_str(out, value);
            }
        }
    }
}

/// The fields a line's kind adds after the envelope, as JSON members and as the attributes of
/// the line's OTLP log record (`otlp`).
pub trait LineBody {
    /// Appends them as members of the line's object, each after a comma; `mono_ns` is where
    /// the envelope's `mono_ns` is in `out`, for a body that repeats it.
    fn write_json_members(&self, out: &mut Vec<u8>, mono_ns: &WrittenU64);

    /// Appends them as `LogRecord.attributes`, in the same order, under the same names
    /// ([`otlp::attribute_name`]), `null`s left out.
    fn write_otlp_attributes(&self, record: &mut Vec<u8>);

    /// Appends the record's severity and `EventName`: those of the line's `kind`
    /// ([`otlp::write_kind_naming`]), unless the body has its own (a runtime event).
    fn write_otlp_naming(&self, kind: Kind, record: &mut Vec<u8>) {
        otlp::write_kind_naming(kind, record);
    }

    /// The record's body: the line as written (`json`), unless the body has its own (a log
    /// message's text).
    fn otlp_body<'a>(&'a self, json: &'a [u8]) -> &'a [u8] {
        json
    }

    /// Appends the record's trace context, when the body has one (a log message's activity).
    fn write_otlp_trace_context(&self, _record: &mut Vec<u8>) {}
}

impl<B: LineBody> LineBody for &B {
    fn write_json_members(&self, out: &mut Vec<u8>, mono_ns: &WrittenU64) {
        (**self).write_json_members(out, mono_ns);
    }

    fn write_otlp_attributes(&self, record: &mut Vec<u8>) {
        (**self).write_otlp_attributes(record);
    }

    fn write_otlp_naming(&self, kind: Kind, record: &mut Vec<u8>) {
        (**self).write_otlp_naming(kind, record);
    }

    fn otlp_body<'a>(&'a self, json: &'a [u8]) -> &'a [u8] {
        (**self).otlp_body(json)
    }

    fn write_otlp_trace_context(&self, record: &mut Vec<u8>) {
        (**self).write_otlp_trace_context(record);
    }
}

/// Runtime events: decoded straight into the line (the line tracer writes most, one per
/// event).
impl LineBody for OutputEvent<'_> {
    fn write_json_members(&self, out: &mut Vec<u8>, mono_ns: &WrittenU64) {
        // A streaming session's line takes its `mono_ns` from the event's `timestamp`: the
        // digits are copied when the two are equal.
        OutputEvent::write_json_members(self, out, Some(mono_ns));
    }

    fn write_otlp_attributes(&self, record: &mut Vec<u8>) {
        otlp::write_event_attributes(self, record);
    }

    fn write_otlp_naming(&self, _: Kind, record: &mut Vec<u8>) {
        otlp::write_event_naming(self, record);
    }
}

/// An `ILogger` message of a traced process (`log`): its record, and the thread that logged it.
#[derive(Debug)]
pub struct LogLine<'a> {
    pub record: &'a LogRecord,
    pub thread: u64,
}

impl<'a> LogLine<'a> {
    pub fn new(record: &'a LogRecord, thread: u64) -> LogLine<'a> {
        LogLine { record, thread }
    }
}

/// A `log` line's members, as written.
#[derive(Serialize)]
struct LogMembers<'a> {
    thread: u64,
    category: &'a str,
    /// The level's name, `Trace` to `Critical`.
    level: &'static str,
    event_id: i64,
    event_name: &'a str,
    message: &'a str,
    template: Option<&'a str>,
    arguments: OrderedPairs<'a>,
    exception: Option<LogExceptionBody<'a>>,
    trace_id: Option<&'a str>,
    span_id: Option<&'a str>,
    trace_flags: Option<u8>,
    /// Whether a string was cut or arguments were dropped (tracer-decode's bounds).
    truncated: bool,
}

impl<'a> LogMembers<'a> {
    fn of(record: &'a LogRecord, thread: u64) -> LogMembers<'a> {
        LogMembers {
            thread,
            category: &record.category,
            level: record.level.name(),
            event_id: record.event_id,
            event_name: &record.event_name,
            message: &record.message,
            template: record.template.as_deref(),
            arguments: OrderedPairs(&record.arguments),
            exception: record.exception.as_ref().map(|e| LogExceptionBody {
                r#type: &e.type_name,
                message: &e.message,
                details: &e.details,
                hresult: e.hresult,
            }),
            trace_id: record.trace_id.as_deref(),
            span_id: record.span_id.as_deref(),
            trace_flags: record.trace_flags,
            truncated: record.cut,
        }
    }
}

/// A log message's exception, as its line writes it.
#[derive(Serialize)]
struct LogExceptionBody<'a> {
    r#type: &'a str,
    message: &'a str,
    /// Its `ToString()`: the stack trace included.
    details: &'a str,
    hresult: Option<i64>,
}

/// (key, value) pairs written as a JSON object in their order.
struct OrderedPairs<'a>(&'a [(String, String)]);

impl Serialize for OrderedPairs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl LineBody for LogLine<'_> {
    fn write_json_members(&self, out: &mut Vec<u8>, _: &WrittenU64) {
        write_serde_members(&LogMembers::of(self.record, self.thread), out);
    }

    fn write_otlp_attributes(&self, record: &mut Vec<u8>) {
        otlp::write_log_attributes(self.record, self.thread, record);
    }

    fn write_otlp_naming(&self, _: Kind, record: &mut Vec<u8>) {
        otlp::write_log_naming(self.record, record);
    }

    fn otlp_body<'a>(&'a self, _: &'a [u8]) -> &'a [u8] {
        self.record.message.as_bytes()
    }

    fn write_otlp_trace_context(&self, record: &mut Vec<u8>) {
        otlp::write_log_trace_context(self.record, record);
    }
}

impl LineBody for FtraceRecord<'_> {
    fn write_json_members(&self, out: &mut Vec<u8>, _: &WrittenU64) {
        // The names are ASCII letters: written as they are, without escaping.
        out.extend_from_slice(br#","system":"#);
        json::push_str(out, self.system);
        out.extend_from_slice(br#","event":"#);
        json::push_str(out, self.event);
        out.extend_from_slice(br#","cpu":"#);
        json::push_u64(out, self.cpu.into());
        out.extend_from_slice(br#","tid":"#);
        json::push_i64(out, self.tid.into());
        out.extend_from_slice(br#","fields":"#);
        self.fields.write_json(out);
    }

    fn write_otlp_attributes(&self, record: &mut Vec<u8>) {
        otlp::write_ftrace_attributes(self, record);
    }
}

/// Detections: their fields are JSON values already.
impl LineBody for FieldMap {
    fn write_json_members(&self, out: &mut Vec<u8>, _: &WrittenU64) {
        write_serde_members(self, out);
    }

    fn write_otlp_attributes(&self, record: &mut Vec<u8>) {
        for (name, value) in &self.0 {
            otlp::write_json_attribute(record, name, value);
        }
    }
}

/// Bodies written by serde_json: lines that are few (lifecycle, summaries).
macro_rules! serde_line_bodies {
    ($($body:ty),* $(,)?) => {$(
        impl LineBody for $body {
            fn write_json_members(&self, out: &mut Vec<u8>, _: &WrittenU64) {
                write_serde_members(self, out);
            }

            fn write_otlp_attributes(&self, record: &mut Vec<u8>) {
                otlp::write_serde_attributes(self, record);
            }
        }
    )*};
}

serde_line_bodies!(
    RegistrationTableBody<'_>,
    SessionStarted<'_>,
    SessionEnded<'_>,
    SessionFailed<'_>,
    SocketRefused<'_>,
    DotnetProcess,
    TopProcess,
    SummaryBody<'_>,
);

/// Serializes `body` (a struct or map: a JSON object) and keeps its members: `{"a":1}` becomes
/// `,"a":1`, `{}` nothing.
fn write_serde_members(body: &impl Serialize, out: &mut Vec<u8>) {
    let start = out.len();
    // Serializing into memory fails only for maps with non-string keys, which no body has.
    serde_json::to_writer(&mut *out, body).expect("line bodies serialize to JSON");
    debug_assert_eq!((out[start], out.last()), (b'{', Some(&b'}')), "a body is an object");
    if out.len() - start == 2 {
        out.truncate(start);
    } else {
        out[start] = b',';
        out.pop();
    }
}

impl<B: LineBody> Line<B> {
    pub fn new(clock: &Clock, mono_ns: u64, kind: Kind, source: Source, pid: Pid, body: B) -> Self {
        Line { wall_ns: clock.wall_ns(mono_ns), mono_ns, kind, source, pid, labels: None, body }
    }

    /// The same line with the process's cgroup, container and pod.
    pub fn with_labels(mut self, labels: Option<Arc<ProcessLabels>>) -> Self {
        self.labels = labels;
        self
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Appends the line's JSON object (no newline).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let mono_ns = write_times(out, self.wall_ns, self.mono_ns);
        write_identity(out, self.kind, self.source, self.pid, self.labels.as_deref());
        self.body.write_json_members(out, &mono_ns);
        out.push(b'}');
    }
}

/// A line's envelope up to `mono_ns`, from the opening brace; returns where `mono_ns` is.
/// Its names and values need no escaping: digits and fixed ASCII names.
fn write_times(out: &mut Vec<u8>, wall_ns: i128, mono_ns: u64) -> WrittenU64 {
    out.extend_from_slice(br#"{"ts":""#);
    write_iso8601(out, wall_ns);
    out.extend_from_slice(br#"","mono_ns":"#);
    json::push_u64_written(out, mono_ns)
}

/// The rest of a line's envelope: `kind`, `source`, `pid`, the labels.
fn write_identity(
    out: &mut Vec<u8>,
    kind: Kind,
    source: Source,
    pid: Pid,
    labels: Option<&ProcessLabels>,
) {
    out.extend_from_slice(br#","kind":""#);
    out.extend_from_slice(kind.name().as_bytes());
    out.extend_from_slice(br#"","source":""#);
    out.extend_from_slice(source.name().as_bytes());
    out.push(b'"');
    match pid {
        Pid::Known(Incarnation { pid, start_ns }) => {
            out.extend_from_slice(br#","pid":"#);
            json::push_u64(out, pid.into());
            out.extend_from_slice(br#","process_start_ns":"#);
            match start_ns {
                Some(ns) => json::push_u64(out, ns),
                None => out.extend_from_slice(b"null"),
            }
        }
        Pid::Unknown => out.extend_from_slice(br#","pid":null,"process_start_ns":null"#),
        Pid::NotApplicable => {}
    }
    if let Some(labels) = labels {
        labels.write_json_members(out);
    }
}

/// The envelope members after `mono_ns` (`kind`, `source`, `pid`, the labels) that every line
/// of one process from one source repeats, rendered once and copied into each of its lines (a
/// streaming session keeps one for all its batches): a session writes a line per runtime event,
/// and copying these bytes costs less than writing them.
///
/// `dotnet_event` lines also repeat their session's id (`session_id`, the body's first member).
#[derive(Debug)]
pub struct LineIdentity {
    kind: Kind,
    source: Source,
    pid: Pid,
    labels: Option<Arc<ProcessLabels>>,
    session_id: Option<u64>,
    rendered: Vec<u8>,
    /// The same members as OTLP record attributes, encoded for the first record that needs them.
    otlp: std::sync::OnceLock<Vec<u8>>,
}

impl LineIdentity {
    /// `session_id`: of a session's lines, followed by `"session_id"`.
    pub fn new(
        kind: Kind,
        source: Source,
        pid: Pid,
        labels: Option<Arc<ProcessLabels>>,
        session_id: Option<u64>,
    ) -> Self {
        let mut rendered = Vec::new();
        write_identity(&mut rendered, kind, source, pid, labels.as_deref());
        if let Some(id) = session_id {
            rendered.extend_from_slice(br#","session_id":""#);
            rendered.extend_from_slice(format!("{id:#x}").as_bytes());
            rendered.push(b'"');
        }
        LineIdentity { kind, source, pid, labels, session_id, rendered, otlp: Default::default() }
    }

    /// The envelope members after `mono_ns` as OTLP log record attributes (`output::otlp`).
    pub fn otlp_attributes(&self, clock: &Clock) -> &[u8] {
        self.otlp.get_or_init(|| {
            let labels = self.labels.as_deref();
            otlp::identity_attributes(
                self.kind,
                self.source,
                self.pid,
                labels,
                self.session_id,
                clock,
            )
        })
    }

    /// Whether this renders the envelope of these (the very same labels, not equal ones: the
    /// comparison is per line).
    #[inline]
    pub fn is_of(
        &self,
        kind: Kind,
        source: Source,
        pid: Pid,
        labels: Option<&Arc<ProcessLabels>>,
        session_id: Option<u64>,
    ) -> bool {
        let same_labels = match (&self.labels, labels) {
            (Some(mine), Some(theirs)) => Arc::ptr_eq(mine, theirs),
            (mine, theirs) => mine.is_none() && theirs.is_none(),
        };
        (self.kind, self.source, self.pid, self.session_id) == (kind, source, pid, session_id)
            && same_labels
    }

    /// The line of this process and source with `body`, at `mono_ns`: the same bytes as the
    /// [`Line`] of this kind, source, pid and labels.
    pub fn line<B: LineBody>(&self, clock: &Clock, mono_ns: u64, body: B) -> IdentifiedLine<'_, B> {
        IdentifiedLine { wall_ns: clock.wall_ns(mono_ns), mono_ns, identity: self, body }
    }
}

/// A line whose envelope members after `mono_ns` were rendered once ([`LineIdentity::line`]).
pub struct IdentifiedLine<'a, B> {
    wall_ns: i128,
    mono_ns: u64,
    identity: &'a LineIdentity,
    body: B,
}

/// A whole line: a [`Line`], or an [`IdentifiedLine`].
pub trait WriteLine {
    /// Appends the line as JSON (no newline).
    fn write_json(&self, out: &mut Vec<u8>);

    /// Appends the line's OTLP log record; `json` is the line as written.
    fn push_otlp_record(&self, json: &[u8], clock: &Clock, records: &mut EncodedRecords);
}

impl<B: LineBody> WriteLine for Line<B> {
    fn write_json(&self, out: &mut Vec<u8>) {
        Line::write_json(self, out);
    }

    fn push_otlp_record(&self, json: &[u8], clock: &Clock, records: &mut EncodedRecords) {
        let labels = self.labels.as_deref();
        let identity =
            otlp::identity_attributes(self.kind, self.source, self.pid, labels, None, clock);
        let parts = RecordParts {
            wall_ns: self.wall_ns,
            mono_ns: self.mono_ns,
            kind: self.kind,
            identity: &identity,
            json,
        };
        records.push_line(&parts, &self.body, crate::time::realtime_unix_ns());
    }
}

impl<B: LineBody> WriteLine for IdentifiedLine<'_, B> {
    fn write_json(&self, out: &mut Vec<u8>) {
        let mono_ns = write_times(out, self.wall_ns, self.mono_ns);
        out.extend_from_slice(&self.identity.rendered);
        self.body.write_json_members(out, &mono_ns);
        out.push(b'}');
    }

    fn push_otlp_record(&self, json: &[u8], clock: &Clock, records: &mut EncodedRecords) {
        let parts = RecordParts {
            wall_ns: self.wall_ns,
            mono_ns: self.mono_ns,
            kind: self.identity.kind,
            identity: self.identity.otlp_attributes(clock),
            json,
        };
        records.push_line(&parts, &self.body, crate::time::realtime_unix_ns());
    }
}

/// A diagnostic IPC session id, written in hex like the runtime's tools print it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionId(pub u64);

impl Serialize for SessionId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{:#x}", self.0))
    }
}

/// Body of `session_started`.
#[derive(Debug, Serialize)]
pub struct SessionStarted<'a> {
    pub session_id: SessionId,
    /// `streaming` or `user_events`.
    pub session: &'static str,
    /// The IPC command that started it, e.g. `CollectTracing2`.
    pub command: String,
    /// The runtime's version (ProcessInfo2+), null for runtimes that do not report it.
    pub runtime_version: Option<&'a str>,
    /// The command line the runtime reported, null without ProcessInfo.
    pub command_line: Option<&'a str>,
    /// The providers the session asked for, in the order sent.
    pub providers: Vec<SessionProvider<'a>>,
}

/// One provider a session asked for, as sent to the runtime.
#[derive(Debug, Serialize)]
pub struct SessionProvider<'a> {
    pub name: &'a str,
    /// Hexadecimal, `0x…`, as the runtime's tools print keywords.
    pub keywords: String,
    /// 0 (LogAlways) to 5 (Verbose).
    pub level: u32,
    /// The `key=value;…` arguments, null when none were sent.
    pub arguments: Option<&'a str>,
}

impl<'a> From<&'a ProviderConfig> for SessionProvider<'a> {
    fn from(p: &'a ProviderConfig) -> Self {
        SessionProvider {
            name: &p.name,
            keywords: format!("{:#x}", p.keywords),
            level: p.level as u32,
            arguments: p.arguments.as_deref(),
        }
    }
}

/// Body of `session_ended`.
#[derive(Debug, Serialize)]
pub struct SessionEnded<'a> {
    pub session_id: SessionId,
    pub reason: &'static str,
    /// Events of this process tracer wrote.
    pub events: u64,
    /// Streaming sessions: what the nettrace stream carried and lost.
    #[serde(flatten)]
    pub stream: Option<StreamTotals>,
    /// user_events sessions: what their records lost.
    #[serde(flatten)]
    pub records: Option<RecordTotals>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
}

/// What a nettrace stream carried and what the runtime numbered but never delivered.
#[derive(Debug, Serialize)]
pub struct StreamTotals {
    pub bytes: u64,
    pub lost_events: u64,
    pub lost_by_thread: Vec<ThreadLoss>,
    /// Events of providers the session did not ask for (dropped, not decoded).
    pub unrequested_events: u64,
    /// Bytes still queued on the socket when the drain timeout ended the session.
    pub unread_bytes: u64,
    /// Bytes queued on the socket, not decoded, when the process exited while another process
    /// held the session's connection open (written only then).
    #[serde(skip_serializing_if = "is_zero")]
    pub bytes_after_exit: u64,
    /// Events decoded but not written: the session passed a byte budget.
    pub unwritten_events: u64,
    /// Stacks of the stream not kept (too deep, or past the stack table's bounds): their events'
    /// lines have no `stack` (written only when not 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub stacks_refused: u64,
    /// Lines written without their `stack`: the session's stack budget was spent (written only
    /// when not 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub stacks_unwritten: u64,
    /// Why the runtime did not acknowledge StopTracing, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_error: Option<String>,
    /// `--nettrace-dir`: the session's copy of its stream.
    #[serde(flatten)]
    pub file: Option<NettraceFileTotals>,
}

/// A streaming session's `.nettrace` file (`--nettrace-dir`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NettraceFileTotals {
    pub nettrace_file: String,
    /// Bytes in the file.
    pub nettrace_file_bytes: u64,
    /// The file ends with the stream's end-of-stream tag; false: truncated (the session ended
    /// abnormally, or a write failed).
    pub nettrace_file_complete: bool,
    /// Stream bytes that are not in the file (after a failed write).
    pub nettrace_file_unwritten_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nettrace_file_error: Option<String>,
}

/// What a user_events session's records lost (and, with `--nettrace-dir`, their file).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct RecordTotals {
    /// Records written into its tracepoints by a process that is not its target (dropped).
    pub foreign_writer: u64,
    /// Records that did not decode (dropped).
    pub undecodable: u64,
    /// Records decoded but not written: the session passed its output budget (then ended).
    pub unwritten_events: u64,
    /// Records dropped because the session's start was never confirmed, or more than
    /// `MAX_RECORDS_BEFORE_START` came before it was (written only when not 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub not_started: u64,
    /// `--nettrace-dir`: the records written as a NetTrace stream.
    #[serde(flatten)]
    pub file: Option<NettraceFileTotals>,
    /// Records the shared ftrace buffer lost while the session ran; the buffer serves every
    /// user_events session, so these may be any session's.
    pub buffer_lost: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Serialize)]
pub struct ThreadLoss {
    pub thread: u64,
    pub lost: u64,
}

/// Body of `dotnet_process` (`tracer ps`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DotnetProcess {
    /// The command line the runtime reported (ProcessInfo), else `/proc/<pid>/cmdline`.
    pub command_line: Option<String>,
    pub runtime_version: Option<String>,
    /// Where the version came from: `process_info`, or `libcoreclr_path` (the directory of the
    /// `libcoreclr.so` it mapped: runtimes before .NET 5 answer no ProcessInfo).
    pub version_from: Option<&'static str>,
    /// Session kinds tracer can start with it: `streaming` (every runtime since .NET Core 3.0),
    /// `user_events` (.NET 10+ on a kernel with user_events), `buffering` (CollectTracing6's
    /// lossless sessions, .NET 11+); none when tracer could not talk to it.
    pub sessions: Vec<&'static str>,
    /// How it was found: its `dotnet_ipc_created` or `doublemapper` mapping, its listening
    /// diagnostic `socket`.
    pub found_by: Vec<&'static str>,
    /// Its diagnostic socket, when one was found and passed the checks.
    pub socket: Option<String>,
    /// Why tracer could not ask it for ProcessInfo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Body of `top_process` (`tracer top --once`): what the screen shows of one process. Every
/// value the runtime (or `/proc`) did not report is `null`, never 0. Rates are over every
/// counter interval its session reported (the screen shows each interval's).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopProcess {
    /// Its `comm` (set by the process: any text).
    pub name: String,
    /// `/proc/<pid>/cmdline`, its arguments joined by spaces (else the command line its
    /// runtime reported).
    pub command_line: Option<String>,
    pub runtime_version: Option<String>,
    /// Its counters session: `starting`, `tracing`, `ended`, `failed`.
    pub session: &'static str,
    /// Why it ended (a `session_ended` reason) or failed.
    pub session_detail: Option<String>,
    /// CPU time of all its threads over the last second, in percent of one CPU.
    pub cpu_percent: Option<f64>,
    /// Resident memory.
    pub working_set_bytes: Option<u64>,
    pub gc_heap_bytes: Option<f64>,
    pub gen0_gcs_per_sec: Option<f64>,
    pub gen1_gcs_per_sec: Option<f64>,
    pub gen2_gcs_per_sec: Option<f64>,
    /// Share of the time the runtime was paused in GC, in percent.
    pub gc_paused_percent: Option<f64>,
    pub alloc_bytes_per_sec: Option<f64>,
    pub exceptions_per_sec: Option<f64>,
    pub lock_contentions_per_sec: Option<f64>,
    pub threadpool_threads: Option<f64>,
    pub threadpool_queue_length: Option<f64>,
    /// When the counter intervals the rates are over began and ended (CLOCK_MONOTONIC ns, as
    /// `mono_ns`).
    pub rates_from_ns: Option<u64>,
    pub rates_to_ns: Option<u64>,
    /// The managed method most of its CPU samples were in (innermost managed frame), and its
    /// share of them in percent.
    pub hot_method: Option<String>,
    pub hot_method_percent: Option<f64>,
    /// Its CPU samples in the hot window.
    pub cpu_samples: u32,
}

/// Body of `session_failed`.
#[derive(Debug, Serialize)]
pub struct SessionFailed<'a> {
    /// The socket failed a safety check (not a runtime that merely was not ready).
    pub refused: bool,
    pub error: &'a str,
}

/// Body of `socket_refused`.
#[derive(Debug, Serialize)]
pub struct SocketRefused<'a> {
    /// The refused name, inside the process's root.
    pub path: &'a str,
    /// `owner_mismatch`, `peer_not_target`, … ([`crate::ipc::socket::Refusal::name`]).
    pub reason: &'static str,
    pub error: &'a str,
}

/// Body of an `ftrace` line (written directly: one line per record).
#[derive(Debug)]
pub struct FtraceRecord<'a> {
    pub system: &'a str,
    pub event: &'a str,
    pub cpu: u32,
    /// The writing thread (`common_pid`); `pid` in the envelope is its thread group.
    pub tid: i32,
    pub fields: FtraceFields<'a>,
}

impl<'a> FtraceRecord<'a> {
    /// The body of a record read from a ring buffer, with its decoded fields.
    pub fn of(record: &'a tracer_decode::ftrace::stream::Event, fields: FtraceFields<'a>) -> Self {
        FtraceRecord {
            system: &record.tracepoint.system,
            event: &record.tracepoint.name,
            cpu: record.cpu,
            tid: record.common.pid,
            fields,
        }
    }
}

/// Body of `registration_table`.
#[derive(Debug, Serialize)]
pub struct RegistrationTableBody<'a> {
    pub processes: Vec<ProcessRegistrations<'a>>,
}

#[derive(Debug, Serialize)]
pub struct ProcessRegistrations<'a> {
    pub pid: u32,
    pub registrations: &'a [crate::registrations::Registration],
}

impl<'a> RegistrationTableBody<'a> {
    pub fn of(table: &'a RegistrationTable) -> Self {
        RegistrationTableBody {
            processes: table
                .iter()
                .map(|(pid, registrations)| ProcessRegistrations { pid, registrations })
                .collect(),
        }
    }
}

/// Events (or pages, records, lines) lost one way, as the `summary` line and the stderr summary
/// report them. `source` is where the loss happened, `reason` how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LossCount {
    pub source: &'static str,
    pub reason: &'static str,
    pub count: u64,
}

/// Body of `summary`, the last line of `run`, `audit` and `ftrace`.
#[derive(Debug, Serialize)]
pub struct SummaryBody<'a> {
    /// The subcommand: `run`, `audit` or `ftrace`.
    pub command: &'static str,
    /// Lines of events written (detections, runtime events, records).
    pub events: u64,
    /// `run`: runtime events no metadata or table names (`EventID(<id>)`); other commands
    /// have no runtime events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unnamed_events: Option<u64>,
    /// `run` and `audit`: the mechanism the detection programs hooked syscalls with
    /// (`trampolines` or `syscall_tracepoints`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hooks: Option<&'static str>,
    /// `run` and `audit`: the mechanism of the process-lifecycle hooks (`btf_tracepoints` or
    /// `tracepoints`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle_hooks: Option<&'static str>,
    /// The sum of `losses`.
    pub lost: u64,
    /// Every kind of loss tracer counts, zero counts left out.
    pub losses: &'a [LossCount],
}

/// The `summary` line, stamped now.
pub fn summary_line<'a>(
    clock: &Clock,
    command: &'static str,
    events: u64,
    losses: &'a [LossCount],
) -> Line<SummaryBody<'a>> {
    let lost = losses.iter().map(|l| l.count).sum();
    let body = SummaryBody {
        command,
        events,
        unnamed_events: None,
        hooks: None,
        lifecycle_hooks: None,
        lost,
        losses,
    };
    Line::new(clock, monotonic_ns(), Kind::Summary, Source::Tracer, Pid::NotApplicable, body)
}

impl Line<SummaryBody<'_>> {
    /// `run`'s summary also says how many runtime events had no name.
    pub fn with_unnamed_events(mut self, unnamed: u64) -> Self {
        self.body.unnamed_events = Some(unnamed);
        self
    }

    /// `run`'s and `audit`'s summaries say how the syscalls and the process lifecycle were
    /// hooked (when they were).
    pub fn with_hooks(
        mut self,
        hooks: Option<&HookMechanism>,
        lifecycle: Option<&LifecycleMechanism>,
    ) -> Self {
        self.body.hooks = hooks.map(HookMechanism::name);
        self.body.lifecycle_hooks = lifecycle.map(LifecycleMechanism::name);
        self
    }
}

/// The loss counts of an ftrace reader (`source`: whose instance it reads).
pub fn ftrace_losses(source: &'static str, stats: &ReaderStats) -> Vec<LossCount> {
    let sum = |f: fn(&CpuStats) -> u64| stats.cpus.iter().map(f).sum::<u64>();
    vec![
        LossCount { source, reason: "ring_buffer_full", count: stats.lost() },
        LossCount {
            source,
            reason: "page_with_unknown_loss",
            count: sum(|c| c.pages_with_unknown_loss),
        },
        LossCount { source, reason: "corrupt_page", count: stats.corrupt_pages() },
        LossCount { source, reason: "bad_record", count: sum(|c| c.bad_records) },
        LossCount { source, reason: "unknown_event", count: sum(|c| c.unknown_events) },
    ]
}

/// Drops the zero counts.
pub fn nonzero(losses: impl IntoIterator<Item = LossCount>) -> Vec<LossCount> {
    losses.into_iter().filter(|l| l.count != 0).collect()
}

/// A session lifecycle line about `process`, stamped now.
pub fn session_line<B: LineBody>(
    clock: &Clock,
    kind: Kind,
    process: Incarnation,
    body: B,
) -> Line<B> {
    Line::new(clock, monotonic_ns(), kind, Source::Tracer, Pid::Known(process), body)
}

#[cfg(test)]
mod tests;
