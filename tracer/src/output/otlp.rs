//! The OTLP log record of a line (`--otlp-endpoint`): the other form of the line schema this
//! module owns, encoded here as protobuf (`opentelemetry.proto.logs.v1.LogRecord`) and sent by
//! `crate::export::otlp`. Every record is encoded from the line's typed envelope and body as
//! the line is rendered ([`LineBody::write_otlp_attributes`]): the export path never parses a
//! line back.
//!
//! A record: `Timestamp` = the line's `mono_ns` in wall-clock time (the instant of `ts`),
//! `ObservedTimestamp` = when the record was encoded, severity from the EventPipe level of a
//! `dotnet_event` ([`severity`]), `EventName` = `provider/event` of a `dotnet_event`, else the
//! `kind`; the body is the JSON line itself. Attributes, under OpenTelemetry's names where it
//! has one ([`attribute_name`]: `pid` as `process.pid`, `process_start_ns` as
//! `process.creation.time` in ISO-8601, `container_id` as `container.id`, `pod_uid` as
//! `k8s.pod.uid`; `null` left out), in the line's order:
//! * of a runtime event (`dotnet_event`, the line written by the thousand): the envelope
//!   (`mono_ns`, `kind`, `source`, the process and its labels, `session_id`; encoded once per
//!   session) and the event's identity (`provider`, `event`, `id`, `version`, `level`,
//!   `keywords`, `thread`, `sequence`). Its payload (`fields`), stack and activity ids are in
//!   the body only: a collector that wants them as attributes parses the body (the Collector's
//!   `transform` processor: `ParseJSON(body)`). Copying every payload field into attributes
//!   cost more than everything else tracer did for the event.
//! * of every other line (detections, session lifecycle, `ftrace` records and `run
//!   --kernel-event` lines, summaries): every field but `ts`, objects and arrays as OTLP maps
//!   and arrays.
use prost::encoding::{encode_varint, encoded_len_varint};
use serde::Serialize;
use serde_json::Value as Json;
use tracer_decode::ftrace::record::FieldValue;
use tracer_decode::logging::LogRecord;
use tracer_decode::nettrace::OutputEvent;

use super::{FtraceRecord, Incarnation, Kind, LineBody, Pid, ProcessLabels};
use crate::time::{Clock, format_iso8601};

/// Protobuf wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

/// `LogRecord` field numbers.
const RECORD_TIME: u32 = 1;
const RECORD_SEVERITY_NUMBER: u32 = 2;
const RECORD_SEVERITY_TEXT: u32 = 3;
const RECORD_BODY: u32 = 5;
const RECORD_ATTRIBUTES: u32 = 6;
const RECORD_FLAGS: u32 = 8;
const RECORD_TRACE_ID: u32 = 9;
const RECORD_SPAN_ID: u32 = 10;
const RECORD_OBSERVED_TIME: u32 = 11;
const RECORD_EVENT_NAME: u32 = 12;
const FIXED32: u32 = 5;
/// `ScopeLogs.log_records`.
const SCOPE_LOG_RECORDS: u32 = 2;
/// `KeyValue` and `AnyValue` field numbers.
const KEY: u32 = 1;
const VALUE: u32 = 2;
const STRING_VALUE: u32 = 1;
const BOOL_VALUE: u32 = 2;
const INT_VALUE: u32 = 3;
const DOUBLE_VALUE: u32 = 4;
const ARRAY_VALUE: u32 = 5;
const KVLIST_VALUE: u32 = 6;
/// `ArrayValue.values`, `KeyValueList.values`.
const VALUES: u32 = 1;

fn key(out: &mut Vec<u8>, field: u32, wire_type: u32) {
    encode_varint(u64::from(field << 3 | wire_type), out);
}

fn len_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(out, field, LEN);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// Bytes of a length-delimited field with a one-byte key (every field number here is < 16).
fn len_field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// An `AnyValue` of a scalar, as it is written inside a `KeyValue`.
#[derive(Clone, Copy)]
enum Scalar<'a> {
    Str(&'a [u8]),
    Int(i64),
}

impl Scalar<'_> {
    fn encoded_len(self) -> usize {
        match self {
            Scalar::Str(s) => len_field_len(s.len()),
            Scalar::Int(i) => 1 + encoded_len_varint(i as u64),
        }
    }

    fn encode(self, out: &mut Vec<u8>) {
        match self {
            Scalar::Str(s) => len_field(out, STRING_VALUE, s),
            Scalar::Int(i) => {
                key(out, INT_VALUE, VARINT);
                encode_varint(i as u64, out);
            }
        }
    }
}

/// Appends one `LogRecord.attributes` entry: a `KeyValue` of `name` and a scalar.
fn attribute(out: &mut Vec<u8>, name: &str, value: Scalar<'_>) {
    let any_len = value.encoded_len();
    let kv_len = len_field_len(name.len()) + len_field_len(any_len);
    key(out, RECORD_ATTRIBUTES, LEN);
    encode_varint(kv_len as u64, out);
    len_field(out, KEY, name.as_bytes());
    key(out, VALUE, LEN);
    encode_varint(any_len as u64, out);
    value.encode(out);
}

/// Hands `f` the scalar of an unsigned value: an `Int`, or beyond i64 a decimal `Str` (OTLP's
/// integer is signed; a string keeps the value exact, as the JSON line has it).
fn with_unsigned<R>(value: u64, f: impl FnOnce(Scalar<'_>) -> R) -> R {
    match i64::try_from(value) {
        Ok(i) => f(Scalar::Int(i)),
        Err(_) => f(Scalar::Str(value.to_string().as_bytes())),
    }
}

fn int_attribute(out: &mut Vec<u8>, name: &str, value: u64) {
    with_unsigned(value, |scalar| attribute(out, name, scalar));
}

/// OpenTelemetry semantic-convention names of the identity fields; other names as they are.
pub fn attribute_name(field: &str) -> &str {
    match field {
        "pid" => "process.pid",
        "container_id" => "container.id",
        "pod_uid" => "k8s.pod.uid",
        other => other,
    }
}

/// OTLP `SeverityNumber` and text: of a `dotnet_event`, from its EventPipe level; of a
/// `session_failed` or `socket_refused`, WARN; of anything else, INFO.
pub fn severity(kind: &str, level: Option<u64>) -> (i32, &'static str) {
    const DEBUG: i32 = 5;
    const INFO: i32 = 9;
    const WARN: i32 = 13;
    const ERROR: i32 = 17;
    const FATAL: i32 = 21;
    match (kind, level) {
        ("dotnet_event", Some(0)) => (INFO, "LogAlways"),
        ("dotnet_event", Some(1)) => (FATAL, "Critical"),
        ("dotnet_event", Some(2)) => (ERROR, "Error"),
        ("dotnet_event", Some(3)) => (WARN, "Warning"),
        ("dotnet_event", Some(4)) => (INFO, "Informational"),
        ("dotnet_event", Some(_)) => (DEBUG, "Verbose"),
        ("session_failed" | "socket_refused", _) => (WARN, "WARN"),
        _ => (INFO, "INFO"),
    }
}

/// `process.creation.time`: a process's start (CLOCK_BOOTTIME) as the ISO-8601 wall-clock time
/// the semantic conventions give it.
fn creation_time(clock: &Clock, boot_ns: u64) -> String {
    format_iso8601(clock.wall_of_boottime_ns(boot_ns))
}

/// The envelope attributes after `mono_ns`: `kind`, `source`, the process, its labels and a
/// `dotnet_event`'s `session_id` (encoded once per [`super::LineIdentity`]).
pub(super) fn identity_attributes(
    kind: Kind,
    source: super::Source,
    pid: Pid,
    labels: Option<&ProcessLabels>,
    session_id: Option<u64>,
    clock: &Clock,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    attribute(&mut out, "kind", Scalar::Str(kind.name().as_bytes()));
    attribute(&mut out, "source", Scalar::Str(source.name().as_bytes()));
    if let Pid::Known(Incarnation { pid, start_ns }) = pid {
        int_attribute(&mut out, "process.pid", pid.into());
        if let Some(boot_ns) = start_ns {
            let time = creation_time(clock, boot_ns);
            attribute(&mut out, "process.creation.time", Scalar::Str(time.as_bytes()));
        }
    }
    if let Some(labels) = labels {
        let known = [
            ("cgroup", &labels.cgroup),
            ("container.id", &labels.container_id),
            ("k8s.pod.uid", &labels.pod_uid),
        ];
        for (name, value) in known {
            if let Some(value) = value {
                attribute(&mut out, name, Scalar::Str(value.as_bytes()));
            }
        }
    }
    if let Some(id) = session_id {
        attribute(&mut out, "session_id", Scalar::Str(format!("{id:#x}").as_bytes()));
    }
    out
}

/// What a line's record is made of besides its body's fields.
pub(super) struct RecordParts<'a> {
    /// The line's `ts`, in nanoseconds since the epoch.
    pub wall_ns: i128,
    pub mono_ns: u64,
    pub kind: Kind,
    /// The envelope's attributes after `mono_ns` ([`identity_attributes`]).
    pub identity: &'a [u8],
    /// The line's JSON, without its newline.
    pub json: &'a [u8],
}

/// Log records encoded one after another, each as a `ScopeLogs.log_records` field: the records
/// of a request, as they go on the wire.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EncodedRecords {
    bytes: Vec<u8>,
    count: u64,
}

impl EncodedRecords {
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The records, each a `ScopeLogs.log_records` field.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Drops the records, keeping the buffer.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.count = 0;
    }

    /// Moves `other`'s records after these.
    pub fn append(&mut self, other: &EncodedRecords) {
        self.bytes.extend_from_slice(&other.bytes);
        self.count += other.count;
    }

    /// Appends the record of a line (see the module documentation), observed at
    /// `observed_unix_nano`.
    pub(super) fn push_line(
        &mut self,
        parts: &RecordParts<'_>,
        body: &impl LineBody,
        observed_unix_nano: u64,
    ) {
        let start = self.bytes.len();
        let record = &mut self.bytes;
        fixed64(record, RECORD_TIME, u64::try_from(parts.wall_ns).unwrap_or(0));
        fixed64(record, RECORD_OBSERVED_TIME, observed_unix_nano);
        body.write_otlp_naming(parts.kind, record);
        let body_text = body.otlp_body(parts.json);
        key(record, RECORD_BODY, LEN);
        encode_varint(len_field_len(body_text.len()) as u64, record);
        len_field(record, STRING_VALUE, body_text);
        body.write_otlp_trace_context(record);
        int_attribute(record, "mono_ns", parts.mono_ns);
        record.extend_from_slice(parts.identity);
        body.write_otlp_attributes(record);
        // The record was written in place: its field key and length go in front of it.
        let mut prefix = Vec::with_capacity(6);
        key(&mut prefix, SCOPE_LOG_RECORDS, LEN);
        encode_varint((record.len() - start) as u64, &mut prefix);
        record.extend_from_slice(&prefix);
        record[start..].rotate_right(prefix.len());
        self.count += 1;
    }
}

fn fixed64(out: &mut Vec<u8>, field: u32, value: u64) {
    key(out, field, FIXED64);
    out.extend_from_slice(&value.to_le_bytes());
}

fn severity_fields(out: &mut Vec<u8>, (number, text): (i32, &str)) {
    key(out, RECORD_SEVERITY_NUMBER, VARINT);
    encode_varint(number as u64, out);
    len_field(out, RECORD_SEVERITY_TEXT, text.as_bytes());
}

/// The encoded `AnyValue` of a JSON value; `null` is left out, integers beyond i64 go as
/// strings to stay exact.
fn any_value(v: &Json) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match v {
        Json::Null => return None,
        Json::Bool(b) => {
            key(&mut out, BOOL_VALUE, VARINT);
            encode_varint(u64::from(*b), &mut out);
        }
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Scalar::Int(i).encode(&mut out),
            (None, Some(f)) if !n.is_u64() => {
                key(&mut out, DOUBLE_VALUE, FIXED64);
                out.extend_from_slice(&f.to_le_bytes());
            }
            _ => Scalar::Str(n.to_string().as_bytes()).encode(&mut out),
        },
        Json::String(s) => Scalar::Str(s.as_bytes()).encode(&mut out),
        Json::Array(items) => {
            let mut array = Vec::new();
            for item in items {
                len_field(&mut array, VALUES, &any_value(item).unwrap_or_default());
            }
            len_field(&mut out, ARRAY_VALUE, &array);
        }
        Json::Object(map) => {
            let mut list = Vec::new();
            for (name, value) in map {
                let Some(any) = any_value(value) else { continue };
                key_value(&mut list, VALUES, name, &any);
            }
            len_field(&mut out, KVLIST_VALUE, &list);
        }
    }
    Some(out)
}

/// Severity and `EventName` of a line named by its kind.
pub fn write_kind_naming(kind: Kind, record: &mut Vec<u8>) {
    severity_fields(record, severity(kind.name(), None));
    len_field(record, RECORD_EVENT_NAME, kind.name().as_bytes());
}

/// Severity (from its level) and `EventName` (`provider/event`) of a runtime event's record.
pub fn write_event_naming(event: &OutputEvent<'_>, record: &mut Vec<u8>) {
    let meta = event.metadata;
    severity_fields(record, severity(Kind::DotnetEvent.name(), Some(meta.level.into())));
    let name = meta.display_name();
    key(record, RECORD_EVENT_NAME, LEN);
    encode_varint((meta.provider.len() + 1 + name.len()) as u64, record);
    record.extend_from_slice(meta.provider.as_bytes());
    record.push(b'/');
    record.extend_from_slice(name.as_bytes());
}

/// A log message's severity, from its level (`LogLevel × 4 + 1`, the level's name as text).
pub fn write_log_naming(log: &LogRecord, record: &mut Vec<u8>) {
    severity_fields(record, (log.level.severity_number(), log.level.name()));
}

/// A log message's category, event, template, exception and arguments as attributes (the
/// formatted message is the body): the names OpenTelemetry's semantic conventions and
/// dotnet-monitor give them, each argument under its own name.
pub fn write_log_attributes(log: &LogRecord, thread: u64, record: &mut Vec<u8>) {
    let text = |record: &mut Vec<u8>, name: &str, value: &str| {
        attribute(record, name, Scalar::Str(value.as_bytes()));
    };
    text(record, "category", &log.category);
    attribute(record, "log.record.id", Scalar::Int(log.event_id));
    if !log.event_name.is_empty() {
        text(record, "log.record.name", &log.event_name);
    }
    if let Some(template) = &log.template {
        text(record, "log.record.original", template);
    }
    if let Some(e) = &log.exception {
        text(record, "exception.type", &e.type_name);
        text(record, "exception.message", &e.message);
        text(record, "exception.stacktrace", &e.details);
    }
    int_attribute(record, "thread", thread);
    for (name, value) in &log.arguments {
        text(record, name, value);
    }
}

/// A log message's activity as the record's trace context: trace id, span id, and the
/// sampled flag.
pub fn write_log_trace_context(log: &LogRecord, record: &mut Vec<u8>) {
    let bytes = |hex: &str| -> Option<Vec<u8>> {
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
    };
    if let Some(flags) = log.trace_flags {
        key(record, RECORD_FLAGS, FIXED32);
        record.extend_from_slice(&u32::from(flags).to_le_bytes());
    }
    if let Some(id) = log.trace_id.as_deref().and_then(bytes) {
        len_field(record, RECORD_TRACE_ID, &id);
    }
    if let Some(id) = log.span_id.as_deref().and_then(bytes) {
        len_field(record, RECORD_SPAN_ID, &id);
    }
}

/// A runtime event's identity as attributes (its payload stays in the body).
pub fn write_event_attributes(event: &OutputEvent<'_>, record: &mut Vec<u8>) {
    let (meta, context) = (event.metadata, &event.context);
    attribute(record, "provider", Scalar::Str(meta.provider.as_bytes()));
    attribute(record, "event", Scalar::Str(meta.display_name().as_bytes()));
    int_attribute(record, "id", meta.event_id.into());
    if let Some(version) = meta.version {
        int_attribute(record, "version", version.into());
    }
    int_attribute(record, "level", meta.level.into());
    let keywords = format!("{:#x}", meta.keywords);
    attribute(record, "keywords", Scalar::Str(keywords.as_bytes()));
    int_attribute(record, "thread", context.thread);
    if let Some(sequence) = context.sequence {
        int_attribute(record, "sequence", sequence.into());
    }
}

/// An ftrace record's names, CPU, thread and fields (a map, in format order).
pub fn write_ftrace_attributes(ftrace: &FtraceRecord<'_>, record: &mut Vec<u8>) {
    attribute(record, "system", Scalar::Str(ftrace.system.as_bytes()));
    attribute(record, "event", Scalar::Str(ftrace.event.as_bytes()));
    int_attribute(record, "cpu", ftrace.cpu.into());
    attribute(record, "tid", Scalar::Int(ftrace.tid.into()));
    let mut list = Vec::new();
    for (name, value) in &ftrace.fields.0 {
        key_value(&mut list, VALUES, name, &field_value(value));
    }
    let mut any = Vec::with_capacity(list.len() + 4);
    len_field(&mut any, KVLIST_VALUE, &list);
    keyed_attribute(record, "fields", &any);
}

/// The encoded `AnyValue` of an ftrace field: as its JSON is (bytes as a hex string).
fn field_value(value: &FieldValue) -> Vec<u8> {
    let mut out = Vec::new();
    match value {
        FieldValue::Signed(i) => Scalar::Int(*i).encode(&mut out),
        FieldValue::Unsigned(u) => with_unsigned(*u, |scalar| scalar.encode(&mut out)),
        FieldValue::Str(s) => Scalar::Str(s.as_bytes()).encode(&mut out),
        FieldValue::Bytes(bytes) => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            Scalar::Str(hex.as_bytes()).encode(&mut out);
        }
        FieldValue::Array(items) => {
            let mut array = Vec::new();
            for item in items {
                len_field(&mut array, VALUES, &field_value(item));
            }
            len_field(&mut out, ARRAY_VALUE, &array);
        }
    }
    out
}

/// Appends one attribute whose `AnyValue` is encoded already.
fn keyed_attribute(record: &mut Vec<u8>, name: &str, any: &[u8]) {
    key_value(record, RECORD_ATTRIBUTES, attribute_name(name), any);
}

/// Appends a `KeyValue` of `name` and an encoded `AnyValue` as field `field` of `out`.
fn key_value(out: &mut Vec<u8>, field: u32, name: &str, any: &[u8]) {
    let mut kv = Vec::with_capacity(name.len() + any.len() + 8);
    len_field(&mut kv, KEY, name.as_bytes());
    len_field(&mut kv, VALUE, any);
    len_field(out, field, &kv);
}

/// Appends a JSON member as an attribute (`null`: left out).
pub fn write_json_attribute(record: &mut Vec<u8>, name: &str, value: &Json) {
    if let Some(any) = any_value(value) {
        keyed_attribute(record, name, &any);
    }
}

/// Appends a serde body's members as attributes: its JSON value, never its text.
pub fn write_serde_attributes(body: &impl Serialize, record: &mut Vec<u8>) {
    // Serializing into a value fails only for maps with non-string keys, which no body has.
    let value = serde_json::to_value(body).expect("line bodies serialize to JSON");
    debug_assert!(value.is_object(), "a body is an object");
    if let Json::Object(members) = value {
        for (name, value) in &members {
            write_json_attribute(record, name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ScopeLogs};
    use prost::Message as _;
    use serde_json::{Map, json};
    use tracer_common::EventKind;
    use tracer_decode::nettrace::EventContext;
    use tracer_decode::nettrace::metadata::EventMetadata;
    use tracer_decode::nettrace::runtime_events::RUNTIME_PROVIDER;
    use tracer_decode::ordered::OrderedMap;

    use super::*;
    use crate::output::{
        FieldMap, Line, LineBatch, LineIdentity, LossCount, SessionFailed, Source, WriteLine,
        summary_line,
    };

    const CLOCK_OFFSET: i128 = 1_800_000_000_000_000_000;

    /// The records of `records`, as a collector decodes them.
    fn decoded(records: &EncodedRecords) -> Vec<LogRecord> {
        let records_of_a_scope = ScopeLogs::decode(records.as_bytes()).unwrap();
        assert_eq!(records_of_a_scope.log_records.len() as u64, records.count());
        records_of_a_scope.log_records
    }

    fn string(s: &str) -> AnyValue {
        AnyValue { value: Some(Value::StringValue(s.into())) }
    }

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    fn attrs(record: &LogRecord) -> Vec<(&str, &Value)> {
        record
            .attributes
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_ref().unwrap().value.as_ref().unwrap()))
            .collect()
    }

    /// The `AnyValue` of a JSON value as the module documentation describes it.
    fn any_of_json(value: &Json) -> Option<AnyValue> {
        let value = match value {
            Json::Null => return None,
            Json::Bool(b) => Value::BoolValue(*b),
            Json::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Value::IntValue(i),
                (None, Some(f)) if !n.is_u64() => Value::DoubleValue(f),
                _ => Value::StringValue(n.to_string()),
            },
            Json::String(s) => Value::StringValue(s.clone()),
            Json::Array(items) => Value::ArrayValue(ArrayValue {
                values: items
                    .iter()
                    .map(|item| any_of_json(item).unwrap_or(AnyValue { value: None }))
                    .collect(),
            }),
            Json::Object(members) => Value::KvlistValue(KeyValueList {
                values: members
                    .iter()
                    .filter_map(|(k, v)| {
                        Some(KeyValue {
                            key: k.clone(),
                            value: any_of_json(v),
                            ..Default::default()
                        })
                        .filter(|kv| kv.value.is_some())
                    })
                    .collect(),
            }),
        };
        Some(AnyValue { value: Some(value) })
    }

    /// The record a written line says it has: every member but `ts` as an attribute, read back
    /// from the line's JSON. The reference the typed encoders are checked against.
    fn record_of_json(line: &[u8], clock: &Clock, observed: u64) -> LogRecord {
        let members: Map<String, Json> = serde_json::from_slice(line).unwrap();
        let text = |k: &str| members[k].as_str().unwrap();
        let kind = text("kind");
        let (severity_number, severity_text) =
            severity(kind, members.get("level").and_then(Json::as_u64));
        let attributes = members
            .iter()
            .filter(|(name, _)| *name != "ts")
            .filter_map(|(name, value)| match (name.as_str(), value.as_u64()) {
                ("process_start_ns", Some(boot_ns)) => Some(kv(
                    "process.creation.time",
                    Value::StringValue(creation_time(clock, boot_ns)),
                )),
                _ => any_of_json(value).map(|any| KeyValue {
                    key: attribute_name(name).into(),
                    value: Some(any),
                    ..Default::default()
                }),
            })
            .collect();
        let mono_ns = members["mono_ns"].as_u64().unwrap();
        LogRecord {
            time_unix_nano: clock.wall_ns(mono_ns) as u64,
            observed_time_unix_nano: observed,
            severity_number,
            severity_text: severity_text.into(),
            body: Some(string(std::str::from_utf8(line).unwrap())),
            attributes,
            event_name: match kind {
                "dotnet_event" => format!("{}/{}", text("provider"), text("event")),
                other => other.into(),
            },
            ..Default::default()
        }
    }

    /// A line's JSON and its record, encoded as the writer encodes it.
    fn written(line: &impl WriteLine, clock: &Clock) -> (Vec<u8>, LogRecord) {
        let mut json = Vec::new();
        line.write_json(&mut json);
        let mut records = EncodedRecords::default();
        line.push_otlp_record(&json, clock, &mut records);
        (json, decoded(&records).remove(0))
    }

    /// Checks that `line`'s record is the one its JSON says; returns it.
    fn agrees_with_its_json(line: &impl WriteLine, clock: &Clock) -> LogRecord {
        let (json, record) = written(line, clock);
        let expected = record_of_json(&json, clock, record.observed_time_unix_nano);
        assert_eq!(record, expected, "{}", String::from_utf8_lossy(&json));
        record
    }

    fn labels() -> Arc<ProcessLabels> {
        Arc::new(ProcessLabels {
            cgroup: Some("/kubepods/pod1/c1".into()),
            container_id: Some("c1".into()),
            pod_uid: Some("p1".into()),
            ..ProcessLabels::default()
        })
    }

    #[test]
    fn the_reference_names_by_kind_and_leaves_out_nulls() {
        let line = br#"{"ts":"x","mono_ns":1,"kind":"session_failed","source":"tracer","pid":null,"big":18446744073709551615,"ok":true,"ratio":0.5,"list":[1,null],"map":{"a":"b","n":null}}"#;
        let record = record_of_json(line, &Clock::with_offset(0), 0);
        assert_eq!(record.event_name, "session_failed");
        assert_eq!((record.severity_number, record.severity_text.as_str()), (13, "WARN"));
        let list = ArrayValue {
            values: vec![AnyValue { value: Some(Value::IntValue(1)) }, AnyValue { value: None }],
        };
        let map = KeyValueList { values: vec![kv("a", Value::StringValue("b".into()))] };
        assert_eq!(
            attrs(&record),
            vec![
                ("mono_ns", &Value::IntValue(1)),
                ("kind", &Value::StringValue("session_failed".into())),
                ("source", &Value::StringValue("tracer".into())),
                ("big", &Value::StringValue("18446744073709551615".into())),
                ("ok", &Value::BoolValue(true)),
                ("ratio", &Value::DoubleValue(0.5)),
                ("list", &Value::ArrayValue(list)),
                ("map", &Value::KvlistValue(map)),
            ]
        );
    }

    /// Detections, lifecycle lines, summaries and ftrace records: each record, encoded from
    /// the typed line, is the one its JSON says.
    #[test]
    fn every_other_lines_record_is_the_one_its_json_says() {
        let clock = Clock::with_offset(CLOCK_OFFSET);
        let started = Pid::Known(Incarnation::new(42, Some(2_000_000_000)));
        let mut detection = FieldMap::default();
        detection
            .push("tid", 43)
            .push("name", Json::Null)
            .push("name_error", "EFAULT")
            .push("flags", json!(["MFD_CLOEXEC", "MFD_EXEC"]))
            .push("user_events_data", json!({"fd": 3, "path": null}))
            .push("arg", u64::MAX)
            .push("ok", true);
        let detection = Line::new(
            &clock,
            5,
            Kind::Detection(EventKind::MemfdCreate),
            Source::Kernel,
            started,
            detection,
        )
        .with_labels(Some(labels()));
        let record = agrees_with_its_json(&detection, &clock);
        assert_eq!(
            (record.event_name.as_str(), record.severity_text.as_str()),
            ("memfd_create", "INFO")
        );
        assert_eq!(record.time_unix_nano, 1_800_000_000_000_000_005);

        let failed = SessionFailed { refused: true, error: "owner mismatch" };
        let failed =
            Line::new(&clock, 6, Kind::SessionFailed, Source::Tracer, Pid::Unknown, failed);
        let record = agrees_with_its_json(&failed, &clock);
        assert_eq!((record.event_name.as_str(), record.severity_number), ("session_failed", 13));

        let losses = [LossCount { source: "otlp", reason: "queue_full", count: 3 }];
        agrees_with_its_json(
            &summary_line(&clock, "run", 7, &losses).with_unnamed_events(2),
            &clock,
        );

        let fields = OrderedMap(vec![
            ("prev_comm", FieldValue::Str("dotnet".into())),
            ("prev_pid", FieldValue::Signed(-1)),
            ("flags", FieldValue::Unsigned(u64::MAX)),
            ("raw", FieldValue::Bytes(vec![0xde, 0xad])),
            ("args", FieldValue::Array(vec![FieldValue::Unsigned(1), FieldValue::Signed(-2)])),
        ]);
        let ftrace =
            FtraceRecord { system: "sched", event: "sched_switch", cpu: 1, tid: 44, fields };
        let ftrace = Line::new(&clock, 8, Kind::Ftrace, Source::Ftrace, started, ftrace)
            .with_labels(Some(labels()));
        let record = agrees_with_its_json(&ftrace, &clock);
        let creation = format_iso8601(CLOCK_OFFSET + 2_000_000_000);
        assert_eq!(
            attrs(&record)[..5],
            [
                ("mono_ns", &Value::IntValue(8)),
                ("kind", &Value::StringValue("ftrace".into())),
                ("source", &Value::StringValue("ftrace".into())),
                ("process.pid", &Value::IntValue(42)),
                ("process.creation.time", &Value::StringValue(creation)),
            ]
        );
    }

    /// A runtime event of a labelled process, its line and record rendered into a batch as a
    /// session renders them.
    fn runtime_event_record(level: u8) -> (Vec<u8>, LogRecord) {
        let clock = Clock::with_offset(CLOCK_OFFSET);
        let mut meta = EventMetadata::native(RUNTIME_PROVIDER, 1);
        (meta.level, meta.version, meta.keywords) = (level.into(), Some(2), 1);
        let event = OutputEvent {
            metadata: &meta,
            payload: &[],
            pointer_size: 8,
            stack: None,
            rendered_fields: None,
            context: EventContext {
                timestamp: 5,
                thread: 77,
                sequence: Some(3),
                ..EventContext::default()
            },
        };
        let pid = Pid::Known(Incarnation::new(42, Some(2_000_000_000)));
        let identity =
            LineIdentity::new(Kind::DotnetEvent, Source::Nettrace, pid, Some(labels()), Some(0x42));
        let mut batch = LineBatch::with_capacity(4096, true);
        assert!(batch.push_if(&identity.line(&clock, 5, event), &clock, |_| true));
        (batch.last_line().to_vec(), decoded(batch.records().unwrap()).remove(0))
    }

    #[test]
    fn a_runtime_events_record_is_encoded_from_the_decoded_event() {
        let (line, record) = runtime_event_record(4);
        assert_eq!(record.time_unix_nano, 1_800_000_000_000_000_005);
        assert_eq!((record.severity_number, record.severity_text.as_str()), (9, "Informational"));
        assert_eq!(record.event_name, "Microsoft-Windows-DotNETRuntime/GCStart");
        assert_eq!(record.body, Some(string(std::str::from_utf8(&line).unwrap())));
        let s = |v: &str| Value::StringValue(v.into());
        let creation = format_iso8601(CLOCK_OFFSET + 2_000_000_000);
        assert_eq!(
            attrs(&record),
            vec![
                ("mono_ns", &Value::IntValue(5)),
                ("kind", &s("dotnet_event")),
                ("source", &s("nettrace")),
                ("process.pid", &Value::IntValue(42)),
                ("process.creation.time", &s(&creation)),
                ("cgroup", &s("/kubepods/pod1/c1")),
                ("container.id", &s("c1")),
                ("k8s.pod.uid", &s("p1")),
                ("session_id", &s("0x42")),
                ("provider", &s("Microsoft-Windows-DotNETRuntime")),
                ("event", &s("GCStart")),
                ("id", &Value::IntValue(1)),
                ("version", &Value::IntValue(2)),
                ("level", &Value::IntValue(4)),
                ("keywords", &s("0x1")),
                ("thread", &Value::IntValue(77)),
                ("sequence", &Value::IntValue(3)),
            ]
        );
        let (_, verbose) = runtime_event_record(5);
        assert_eq!((verbose.severity_number, verbose.severity_text.as_str()), (5, "Verbose"));
    }

    /// The record encoded with a runtime event's line says what the line says, but for the
    /// event's payload and the like (members that are objects or arrays), left to the body.
    #[test]
    fn a_runtime_events_record_agrees_with_its_line() {
        let (line, record) = runtime_event_record(4);
        let clock = Clock::with_offset(CLOCK_OFFSET);
        let from_json = record_of_json(&line, &clock, record.observed_time_unix_nano);
        let left_to_the_body: Vec<String> = attrs(&from_json)
            .into_iter()
            .filter(|a| !attrs(&record).contains(a))
            .map(|(key, _)| key.to_owned())
            .collect();
        assert!(
            left_to_the_body
                .iter()
                .all(|k| ["timestamp", "fields", "decode_error", "raw_payload"]
                    .contains(&k.as_str())),
            "{left_to_the_body:?}"
        );
        let only_in_the_body = |a: &KeyValue| left_to_the_body.contains(&a.key);
        let mut expected = from_json;
        expected.attributes.retain(|a| !only_in_the_body(a));
        assert_eq!(record, expected);
    }

    #[test]
    fn eventpipe_levels_map_to_otlp_severities() {
        let levels: Vec<_> = (0..=6).map(|l| severity("dotnet_event", Some(l))).collect();
        assert_eq!(
            levels,
            [
                (9, "LogAlways"),
                (21, "Critical"),
                (17, "Error"),
                (13, "Warning"),
                (9, "Informational"),
                (5, "Verbose"),
                (5, "Verbose"),
            ]
        );
        assert_eq!(severity("process_exit", None), (9, "INFO"));
    }
}
