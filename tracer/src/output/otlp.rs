//! The OTLP log record of a line (`--otlp-endpoint`): the other form of the line schema this
//! module owns, encoded here as protobuf (`opentelemetry.proto.logs.v1.LogRecord`) and sent by
//! `crate::export::otlp`.
//!
//! A record: `Timestamp` = the line's `mono_ns` in wall-clock time (the instant of `ts`),
//! `ObservedTimestamp` = when the record was encoded, severity from the EventPipe level of a
//! `dotnet_event` ([`severity`]), `EventName` = `provider/event` of a `dotnet_event`, else the
//! `kind`; the body is the JSON line itself. Attributes, under OpenTelemetry's names where it
//! has one ([`attribute_name`]: `pid` as `process.pid`, `process_start_ns` as
//! `process.creation.time` in ISO-8601, `container_id` as `container.id`, `pod_uid` as
//! `k8s.pod.uid`; `null` left out):
//! * of a runtime event (`dotnet_event`, the line written by the thousand): the envelope
//!   (`mono_ns`, `kind`, `source`, the process and its labels, `session_id`) and the event's
//!   identity (`provider`, `event`, `id`, `version`, `level`, `keywords`, `thread`,
//!   `sequence`), encoded from the decoded event as its line is rendered ([`EventRecord`]; the
//!   envelope's attributes once per session). Its payload (`fields`), stack and activity ids
//!   are in the body only: a collector that wants them as attributes parses the body (the
//!   Collector's `transform` processor: `ParseJSON(body)`). Copying every payload field into
//!   attributes, through a parse of the line, cost more than everything else tracer did for it.
//! * of every other line (detections, session lifecycle, summaries: a few per process): every
//!   field but `ts`, objects and arrays as OTLP maps and arrays, from the line's JSON
//!   ([`EncodedRecords::push_json_line`]).
use prost::encoding::{encode_varint, encoded_len_varint};
use serde_json::{Map, Value as Json};
use tracer_decode::nettrace::OutputEvent;

use super::{Incarnation, Kind, LineIdentity, Pid};
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
const RECORD_OBSERVED_TIME: u32 = 11;
const RECORD_EVENT_NAME: u32 = 12;
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

fn int_attribute(out: &mut Vec<u8>, name: &str, value: u64) {
    // Integers beyond i64 (none of these) go as strings to stay exact.
    match i64::try_from(value) {
        Ok(i) => attribute(out, name, Scalar::Int(i)),
        Err(_) => attribute(out, name, Scalar::Str(value.to_string().as_bytes())),
    }
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

/// The envelope attributes after `mono_ns` that every record of one [`LineIdentity`] repeats
/// (encoded once per identity).
pub(super) fn identity_attributes(identity: &LineIdentity, clock: &Clock) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    attribute(&mut out, "kind", Scalar::Str(identity.kind.name().as_bytes()));
    attribute(&mut out, "source", Scalar::Str(identity.source.name().as_bytes()));
    if let Pid::Known(Incarnation { pid, start_ns }) = identity.pid {
        int_attribute(&mut out, "process.pid", pid.into());
        if let Some(boot_ns) = start_ns {
            let time = creation_time(clock, boot_ns);
            attribute(&mut out, "process.creation.time", Scalar::Str(time.as_bytes()));
        }
    }
    if let Some(labels) = &identity.labels {
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
    if let Some(id) = identity.session_id {
        attribute(&mut out, "session_id", Scalar::Str(format!("{id:#x}").as_bytes()));
    }
    out
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

    /// Moves `other`'s records after these.
    pub fn append(&mut self, other: &EncodedRecords) {
        self.bytes.extend_from_slice(&other.bytes);
        self.count += other.count;
    }

    /// Appends a record whose fields are in `record`.
    fn push_record(&mut self, record: &[u8]) {
        len_field(&mut self.bytes, SCOPE_LOG_RECORDS, record);
        self.count += 1;
    }

    /// Appends the record of one JSON line of tracer's (a line that is not a runtime event: see
    /// the module documentation); `json` not from tracer's writer is sent as its body alone.
    pub fn push_json_line(&mut self, json: &[u8], clock: &Clock, observed_unix_nano: u64) {
        let mut record = Vec::with_capacity(json.len() * 2 + 64);
        let Ok(fields) = serde_json::from_slice::<Map<String, Json>>(json) else {
            fixed64(&mut record, RECORD_OBSERVED_TIME, observed_unix_nano);
            body(&mut record, json);
            return self.push_record(&record);
        };
        let str_field = |k: &str| fields.get(k).and_then(Json::as_str).unwrap_or_default();
        let kind = str_field("kind");
        let time = fields.get("mono_ns").and_then(Json::as_u64).map(|mono| clock.wall_ns(mono));
        fixed64(&mut record, RECORD_TIME, time.map_or(0, |t| u64::try_from(t).unwrap_or(0)));
        fixed64(&mut record, RECORD_OBSERVED_TIME, observed_unix_nano);
        let level = fields.get("level").and_then(Json::as_u64);
        severity_fields(&mut record, severity(kind, level));
        body(&mut record, json);
        for (name, value) in fields.iter().filter(|(name, _)| *name != "ts") {
            match (name.as_str(), value.as_u64()) {
                ("process_start_ns", Some(boot_ns)) => {
                    let time = creation_time(clock, boot_ns);
                    attribute(&mut record, "process.creation.time", Scalar::Str(time.as_bytes()));
                }
                _ => {
                    if let Some(any) = any_value(value) {
                        let mut kv = Vec::with_capacity(name.len() + any.len() + 8);
                        len_field(&mut kv, KEY, attribute_name(name).as_bytes());
                        len_field(&mut kv, VALUE, &any);
                        len_field(&mut record, RECORD_ATTRIBUTES, &kv);
                    }
                }
            }
        }
        let event_name = match kind {
            "dotnet_event" => format!("{}/{}", str_field("provider"), str_field("event")),
            other => other.to_owned(),
        };
        len_field(&mut record, RECORD_EVENT_NAME, event_name.as_bytes());
        self.push_record(&record);
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

/// The body: the JSON line as a string `AnyValue`.
fn body(out: &mut Vec<u8>, json: &[u8]) {
    key(out, RECORD_BODY, LEN);
    encode_varint(len_field_len(json.len()) as u64, out);
    len_field(out, STRING_VALUE, json);
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
                let mut kv = Vec::new();
                len_field(&mut kv, KEY, name.as_bytes());
                len_field(&mut kv, VALUE, &any);
                len_field(&mut list, VALUES, &kv);
            }
            len_field(&mut out, KVLIST_VALUE, &list);
        }
    }
    Some(out)
}

/// The record of a runtime event whose line was just rendered (see the module documentation).
pub struct EventRecord<'a> {
    pub mono_ns: u64,
    /// The line's envelope attributes after `mono_ns` ([`LineIdentity::otlp_attributes`]).
    pub identity: &'a [u8],
    pub event: &'a OutputEvent<'a>,
    /// The line's JSON, without its newline.
    pub json: &'a [u8],
}

impl EventRecord<'_> {
    /// Appends the record to `records`, its fields first assembled in `scratch`.
    pub fn encode(
        &self,
        clock: &Clock,
        observed_unix_nano: u64,
        scratch: &mut Vec<u8>,
        records: &mut EncodedRecords,
    ) {
        let (meta, context) = (self.event.metadata, &self.event.context);
        let record = scratch;
        record.clear();
        let time = u64::try_from(clock.wall_ns(self.mono_ns)).unwrap_or(0);
        fixed64(record, RECORD_TIME, time);
        fixed64(record, RECORD_OBSERVED_TIME, observed_unix_nano);
        severity_fields(record, severity(Kind::DotnetEvent.name(), Some(meta.level.into())));
        body(record, self.json);
        int_attribute(record, "mono_ns", self.mono_ns);
        record.extend_from_slice(self.identity);
        let event = meta.display_name();
        attribute(record, "provider", Scalar::Str(meta.provider.as_bytes()));
        attribute(record, "event", Scalar::Str(event.as_bytes()));
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
        key(record, RECORD_EVENT_NAME, LEN);
        encode_varint((meta.provider.len() + 1 + event.len()) as u64, record);
        record.extend_from_slice(meta.provider.as_bytes());
        record.push(b'/');
        record.extend_from_slice(event.as_bytes());
        records.push_record(record);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ScopeLogs};
    use prost::Message as _;
    use tracer_decode::nettrace::EventContext;
    use tracer_decode::nettrace::metadata::EventMetadata;
    use tracer_decode::nettrace::runtime_events::RUNTIME_PROVIDER;

    use super::*;
    use crate::output::{LineBatch, ProcessLabels, Source};

    const CLOCK_OFFSET: i128 = 1_800_000_000_000_000_000;

    /// The records of `records`, as a collector decodes them.
    fn decoded(records: &EncodedRecords) -> Vec<LogRecord> {
        let records_of_a_scope = ScopeLogs::decode(records.as_bytes()).unwrap();
        assert_eq!(records_of_a_scope.log_records.len() as u64, records.count());
        records_of_a_scope.log_records
    }

    fn log_record(line: &[u8], clock: &Clock, observed: u64) -> LogRecord {
        let mut records = EncodedRecords::default();
        records.push_json_line(line, clock, observed);
        decoded(&records).remove(0)
    }

    fn string(s: &str) -> AnyValue {
        AnyValue { value: Some(Value::StringValue(s.into())) }
    }

    fn attrs(record: &LogRecord) -> Vec<(&str, &Value)> {
        record
            .attributes
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_ref().unwrap().value.as_ref().unwrap()))
            .collect()
    }

    #[test]
    fn a_dotnet_event_becomes_a_record_with_its_time_severity_name_and_fields() {
        let line = br#"{"ts":"x","mono_ns":5,"kind":"dotnet_event","source":"nettrace","pid":42,"container_id":"c1","pod_uid":"p1","provider":"Microsoft-Windows-DotNETRuntime","event":"GCStart","level":4,"fields":{"Count":3,"Reason":"AllocSmall","Ok":true,"Ratio":0.5,"List":[1,null]}}"#;
        let record = log_record(line, &Clock::with_offset(CLOCK_OFFSET), 7);
        assert_eq!(record.time_unix_nano, 1_800_000_000_000_000_005);
        assert_eq!(record.observed_time_unix_nano, 7);
        assert_eq!((record.severity_number, record.severity_text.as_str()), (9, "Informational"));
        assert_eq!(record.event_name, "Microsoft-Windows-DotNETRuntime/GCStart");
        assert_eq!(record.body, Some(string(std::str::from_utf8(line).unwrap())));
        let s = |v: &str| Value::StringValue(v.into());
        let kv = |k: &str, v: Value| KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        };
        assert_eq!(
            attrs(&record),
            vec![
                ("mono_ns", &Value::IntValue(5)),
                ("kind", &s("dotnet_event")),
                ("source", &s("nettrace")),
                ("process.pid", &Value::IntValue(42)),
                ("container.id", &s("c1")),
                ("k8s.pod.uid", &s("p1")),
                ("provider", &s("Microsoft-Windows-DotNETRuntime")),
                ("event", &s("GCStart")),
                ("level", &Value::IntValue(4)),
                (
                    "fields",
                    &Value::KvlistValue(KeyValueList {
                        values: vec![
                            kv("Count", Value::IntValue(3)),
                            kv("Reason", s("AllocSmall")),
                            kv("Ok", Value::BoolValue(true)),
                            kv("Ratio", Value::DoubleValue(0.5)),
                            kv(
                                "List",
                                Value::ArrayValue(ArrayValue {
                                    values: vec![
                                        AnyValue { value: Some(Value::IntValue(1)) },
                                        AnyValue { value: None }
                                    ]
                                })
                            ),
                        ]
                    })
                ),
            ]
        );
    }

    #[test]
    fn other_lines_are_named_by_kind_and_leave_out_nulls() {
        let line = br#"{"ts":"x","mono_ns":1,"kind":"session_failed","source":"tracer","pid":null,"big":18446744073709551615}"#;
        let record = log_record(line, &Clock::with_offset(0), 0);
        assert_eq!(record.event_name, "session_failed");
        assert_eq!((record.severity_number, record.severity_text.as_str()), (13, "WARN"));
        assert_eq!(
            attrs(&record),
            vec![
                ("mono_ns", &Value::IntValue(1)),
                ("kind", &Value::StringValue("session_failed".into())),
                ("source", &Value::StringValue("tracer".into())),
                ("big", &Value::StringValue("18446744073709551615".into())),
            ]
        );
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

    /// A runtime event of a labelled process, its line rendered as a session renders it, and
    /// its record encoded with the line.
    fn runtime_event_record(level: u8) -> (Vec<u8>, LogRecord) {
        let clock = Clock::with_offset(CLOCK_OFFSET);
        let mut meta = EventMetadata::native(RUNTIME_PROVIDER, 1);
        (meta.level, meta.version, meta.keywords) = (level.into(), Some(2), 1);
        let event = OutputEvent {
            metadata: &meta,
            payload: &[],
            pointer_size: 8,
            stack: None,
            context: EventContext {
                timestamp: 5,
                thread: 77,
                sequence: Some(3),
                ..EventContext::default()
            },
        };
        let labels = ProcessLabels {
            cgroup: Some("/kubepods/pod1/c1".into()),
            container_id: Some("c1".into()),
            pod_uid: Some("p1".into()),
            ..ProcessLabels::default()
        };
        let pid = Pid::Known(Incarnation::new(42, Some(2_000_000_000)));
        let identity = LineIdentity::new(
            Kind::DotnetEvent,
            Source::Nettrace,
            pid,
            Some(std::sync::Arc::new(labels)),
            Some(0x42),
        );
        let mut batch = LineBatch::with_capacity(4096);
        assert!(batch.push_if(&identity.line(&clock, 5, event), |_| true));
        let (mut records, mut scratch) = (EncodedRecords::default(), Vec::new());
        let record = EventRecord {
            mono_ns: 5,
            identity: identity.otlp_attributes(&clock),
            event: &event,
            json: batch.last_line(),
        };
        record.encode(&clock, 7, &mut scratch, &mut records);
        (batch.last_line().to_vec(), decoded(&records).remove(0))
    }

    #[test]
    fn a_runtime_events_record_is_encoded_from_the_decoded_event() {
        let (line, record) = runtime_event_record(4);
        assert_eq!(record.time_unix_nano, 1_800_000_000_000_000_005);
        assert_eq!(record.observed_time_unix_nano, 7);
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

    /// The record encoded with a runtime event's line says what the line says: each of its
    /// attributes is the one the line's JSON converts to, and only the event's payload and
    /// the like (members that are objects or arrays) are left to the body.
    #[test]
    fn a_runtime_events_record_agrees_with_its_line() {
        let (line, record) = runtime_event_record(4);
        let from_json = log_record(&line, &Clock::with_offset(CLOCK_OFFSET), 7);
        assert_eq!(
            (record.time_unix_nano, record.severity_number, &record.event_name, &record.body),
            (
                from_json.time_unix_nano,
                from_json.severity_number,
                &from_json.event_name,
                &from_json.body
            )
        );
        let json_attrs = attrs(&from_json);
        for attribute in attrs(&record) {
            assert!(json_attrs.contains(&attribute), "{attribute:?} not in {json_attrs:?}");
        }
        let left_to_the_body: Vec<&str> = json_attrs
            .iter()
            .filter(|a| !attrs(&record).contains(a))
            .map(|(key, _)| *key)
            .collect();
        let line: serde_json::Value = serde_json::from_slice(&line).unwrap();
        for key in &left_to_the_body {
            assert!(!line[key].is_null(), "{key} is in the body");
        }
        assert!(
            left_to_the_body
                .iter()
                .all(|k| ["timestamp", "fields", "decode_error", "raw_payload"].contains(k)),
            "{left_to_the_body:?}"
        );
    }
}
