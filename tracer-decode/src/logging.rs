//! `Microsoft-Extensions-Logging`'s `MessageJson` events — an `ILogger` message of the traced
//! process, with its arguments and exception as JSON text — as a log record
//! (docs/protocol/logging.md). Every string comes from the traced process: each is cut to
//! [`MAX_TEXT`] bytes, at most [`MAX_ARGUMENTS`] arguments are kept, and what is cut or dropped
//! is said ([`LogRecord::cut`]).
use serde_json::Value as Json;
use thiserror::Error;

use crate::nettrace::DecodedEvent;
use crate::nettrace::payload::{Fields, Value};

/// The EventSource of `ILogger` messages (the EventSource logger provider).
pub const LOGGING_PROVIDER: &str = "Microsoft-Extensions-Logging";
/// The event of one message, its arguments and exception as JSON (keyword `0x8`).
pub const MESSAGE_JSON: &str = "MessageJson";
/// The keyword that enables [`MESSAGE_JSON`].
pub const JSON_MESSAGE_KEYWORD: u64 = 0x8;
/// Longest message, argument value, exception text, category or name kept (bytes); longer is
/// cut at a character boundary.
pub const MAX_TEXT: usize = 8192;
/// Arguments kept; more are dropped.
pub const MAX_ARGUMENTS: usize = 32;

/// `Microsoft.Extensions.Logging.LogLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Trace,
    Debug,
    Information,
    Warning,
    Error,
    Critical,
    None,
}

impl LogLevel {
    fn of(value: i64) -> Option<LogLevel> {
        Some(match value {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Information,
            3 => LogLevel::Warning,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            6 => LogLevel::None,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Trace => "Trace",
            LogLevel::Debug => "Debug",
            LogLevel::Information => "Information",
            LogLevel::Warning => "Warning",
            LogLevel::Error => "Error",
            LogLevel::Critical => "Critical",
            LogLevel::None => "None",
        }
    }

    /// OpenTelemetry's severity number: Trace 1, Debug 5, Information 9, Warning 13, Error 17,
    /// Critical 21 (`None` is no severity: 0).
    pub fn severity_number(self) -> i32 {
        match self {
            LogLevel::None => 0,
            level => level as i32 * 4 + 1,
        }
    }
}

/// The exception a message was logged with (`ExceptionJson`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogException {
    pub type_name: String,
    pub message: String,
    /// `VerboseMessage`: the exception's `ToString()`, its stack trace included.
    pub details: String,
    pub hresult: Option<i64>,
}

/// One `ILogger` message.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    pub level: LogLevel,
    /// The logger's category (`LoggerName`), e.g. `Shop.Orders`.
    pub category: String,
    pub event_id: i64,
    pub event_name: String,
    /// The formatted message.
    pub message: String,
    /// The message template (`{OriginalFormat}`), when the message had one.
    pub template: Option<String>,
    /// The message's arguments (values as text), in the order sent, the template left out.
    pub arguments: Vec<(String, String)>,
    pub exception: Option<LogException>,
    /// The current activity's W3C ids (.NET 9+; none without an activity): 32 and 16
    /// lowercase hex digits, the flags' sampled bit.
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub trace_flags: Option<u8>,
    /// Whether a string was cut or arguments dropped.
    pub cut: bool,
}

/// Why a `MessageJson` event gives no record.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LogError {
    #[error("MessageJson without a numeric `Level` from 0 to 6")]
    BadLevel,
    #[error("MessageJson without a string `{0}`")]
    MissingField(&'static str),
    #[error("MessageJson's `{field}` is not a JSON object: {error}")]
    BadJson { field: &'static str, error: String },
}

/// The record a `MessageJson` event carries; `None` for other events. Its fields are read at
/// the top level of the payload, or in the one unnamed object a `Write<T>` payload is wrapped in.
pub fn log_record(event: &DecodedEvent) -> Option<Result<LogRecord, LogError>> {
    if !event.provider.eq_ignore_ascii_case(LOGGING_PROVIDER) || event.event != MESSAGE_JSON {
        return None;
    }
    let fields = match event.fields.get("") {
        Some(Value::Object(inner)) if event.fields.get("Level").is_none() => inner,
        _ => &event.fields,
    };
    Some(record_of(fields))
}

fn record_of(fields: &Fields) -> Result<LogRecord, LogError> {
    let mut cut = false;
    let mut text = |name: &'static str| -> Result<String, LogError> {
        match fields.get(name) {
            Some(Value::Str(s)) => Ok(bounded(s, &mut cut)),
            _ => Err(LogError::MissingField(name)),
        }
    };
    let number = |name: &str| match fields.get(name) {
        Some(Value::I64(v)) => Some(*v),
        Some(Value::U64(v)) => i64::try_from(*v).ok(),
        Some(Value::Enum { value, .. }) => i64::try_from(*value).ok(),
        _ => None,
    };
    let level = number("Level").and_then(LogLevel::of).ok_or(LogError::BadLevel)?;
    let category = text("LoggerName")?;
    let event_name = text("EventName")?;
    let message = text("FormattedMessage")?;
    // Parsed whole (the event's size bounds them); what they hold is bounded after.
    let raw = |name: &'static str| match fields.get(name) {
        Some(Value::Str(s)) => Ok(s.as_str()),
        _ => Err(LogError::MissingField(name)),
    };
    let (arguments_json, exception_json) = (raw("ArgumentsJson")?, raw("ExceptionJson")?);
    // The .NET 9 activity fields: empty without a current activity.
    let optional = |name: &str| match fields.get(name) {
        Some(Value::Str(s)) if !s.is_empty() => Some(s.as_str()),
        _ => None,
    };
    let trace_id = optional("ActivityTraceId").filter(|id| is_hex(id, 32)).map(str::to_owned);
    let span_id = optional("ActivitySpanId").filter(|id| is_hex(id, 16)).map(str::to_owned);
    let trace_flags =
        optional("ActivityTraceFlags").and_then(|f| f.parse::<u8>().ok()).map(|f| f & 1);

    let (mut arguments, mut template) = (Vec::new(), None);
    for (key, value) in json_object("ArgumentsJson", arguments_json)? {
        let value = match value {
            Json::String(s) => s,
            other => other.to_string(),
        };
        if key == "{OriginalFormat}" {
            template = Some(bounded(&value, &mut cut));
        } else if arguments.len() < MAX_ARGUMENTS {
            arguments.push((bounded(&key, &mut cut), bounded(&value, &mut cut)));
        } else {
            cut = true;
        }
    }
    let exception = exception_of(&json_object("ExceptionJson", exception_json)?, &mut cut);
    Ok(LogRecord {
        level,
        category,
        event_id: number("EventId").unwrap_or(0),
        event_name,
        message,
        template,
        arguments,
        exception,
        trace_id,
        span_id,
        trace_flags: trace_flags.filter(|_| trace_id_present(fields)),
        cut,
    })
}

/// Flags mean something only beside a trace id.
fn trace_id_present(fields: &Fields) -> bool {
    matches!(fields.get("ActivityTraceId"), Some(Value::Str(s)) if is_hex(s, 32))
}

fn json_object(field: &'static str, text: &str) -> Result<serde_json::Map<String, Json>, LogError> {
    let bad = |error: String| LogError::BadJson { field, error };
    match serde_json::from_str::<Json>(text).map_err(|e| bad(e.to_string()))? {
        Json::Object(map) => Ok(map),
        other => Err(bad(format!("a JSON {}", json_kind(&other)))),
    }
}

fn json_kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

/// `{}` is no exception; else its type, message, `ToString()` and HResult.
fn exception_of(map: &serde_json::Map<String, Json>, cut: &mut bool) -> Option<LogException> {
    let text = |name: &str, cut: &mut bool| match map.get(name) {
        Some(Json::String(s)) => bounded(s, cut),
        _ => String::new(),
    };
    let type_name = text("TypeName", cut);
    let message = text("Message", cut);
    let details = text("VerboseMessage", cut);
    let hresult = match map.get("HResult") {
        Some(Json::String(s)) => s.parse().ok(),
        Some(Json::Number(n)) => n.as_i64(),
        _ => None,
    };
    let none = type_name.is_empty() && message.is_empty() && details.is_empty();
    (!none).then_some(LogException { type_name, message, details, hresult })
}

fn is_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `text` cut to [`MAX_TEXT`] bytes at a character boundary (noting it in `cut`).
fn bounded(text: &str, cut: &mut bool) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_owned();
    }
    *cut = true;
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::ordered::OrderedMap;

    fn event(fields: Vec<(&'static str, Value<'static>)>, wrapped: bool) -> DecodedEvent<'static> {
        let fields = if wrapped {
            OrderedMap(vec![("", Value::Object(OrderedMap(fields)))])
        } else {
            OrderedMap(fields)
        };
        DecodedEvent::with_fields(LOGGING_PROVIDER, MESSAGE_JSON, fields)
    }

    fn s(v: &str) -> Value<'static> {
        Value::Str(v.into())
    }

    /// As .NET 9 writes it.
    fn message_json(arguments: &str, exception: &str) -> Vec<(&'static str, Value<'static>)> {
        vec![
            ("Level", Value::I64(3)),
            ("FactoryID", Value::I64(1)),
            ("LoggerName", s("Shop.Orders")),
            ("EventId", Value::I64(7)),
            ("EventName", s("OrderRejected")),
            ("ExceptionJson", s(exception)),
            ("ArgumentsJson", s(arguments)),
            ("FormattedMessage", s("Order 42 rejected")),
            ("ActivityTraceId", s("4bf92f3577b34da6a3ce929d0e0e4736")),
            ("ActivitySpanId", s("00f067aa0ba902b7")),
            ("ActivityTraceFlags", s("1")),
        ]
    }

    #[test]
    fn a_message_with_its_arguments_exception_and_activity() {
        let arguments =
            r#"{"OrderId":"42","Reason":"stock","{OriginalFormat}":"Order {OrderId} rejected"}"#;
        let exception = r#"{"TypeName":"System.InvalidOperationException","Message":"no stock","HResult":"-2146233079","VerboseMessage":"System.InvalidOperationException: no stock\n   at Shop.Orders.Place()"}"#;
        for wrapped in [false, true] {
            let record = log_record(&event(message_json(arguments, exception), wrapped));
            assert_eq!(
                record,
                Some(Ok(LogRecord {
                    level: LogLevel::Warning,
                    category: "Shop.Orders".into(),
                    event_id: 7,
                    event_name: "OrderRejected".into(),
                    message: "Order 42 rejected".into(),
                    template: Some("Order {OrderId} rejected".into()),
                    arguments: vec![
                        ("OrderId".into(), "42".into()),
                        ("Reason".into(), "stock".into())
                    ],
                    exception: Some(LogException {
                        type_name: "System.InvalidOperationException".into(),
                        message: "no stock".into(),
                        details:
                            "System.InvalidOperationException: no stock\n   at Shop.Orders.Place()"
                                .into(),
                        hresult: Some(-2146233079),
                    }),
                    trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
                    span_id: Some("00f067aa0ba902b7".into()),
                    trace_flags: Some(1),
                    cut: false,
                })),
                "wrapped: {wrapped}"
            );
        }
        assert_eq!(LogLevel::Warning.severity_number(), 13);
        assert_eq!(LogLevel::Trace.severity_number(), 1);
        assert_eq!(LogLevel::Critical.severity_number(), 21);
    }

    #[test]
    fn without_an_activity_or_exception_and_before_net_9() {
        let mut fields = message_json("{}", "{}");
        fields.truncate(8);
        let record = log_record(&event(fields, false)).unwrap().unwrap();
        assert_eq!(
            (record.exception, record.template, record.trace_id, record.trace_flags),
            (None, None, None, None)
        );
        let mut empty_activity = message_json("{}", "{}");
        empty_activity[8].1 = s("");
        let record = log_record(&event(empty_activity, false)).unwrap().unwrap();
        assert_eq!(
            (record.trace_id, record.span_id.is_some(), record.trace_flags),
            (None, true, None)
        );
    }

    #[test]
    fn peer_text_is_bounded_and_malformed_json_is_refused() {
        let many: Vec<String> = (0..MAX_ARGUMENTS + 3).map(|i| format!(r#""k{i}":"v""#)).collect();
        let long = "é".repeat(MAX_TEXT);
        let arguments = format!("{{{},\"long\":\"{long}\"}}", many.join(","));
        let mut fields = message_json(&arguments, "{}");
        fields[7].1 = Value::Str(long.clone());
        let record = log_record(&event(fields, false)).unwrap().unwrap();
        assert_eq!(record.arguments.len(), MAX_ARGUMENTS);
        assert!(record.cut);
        assert!(record.message.len() <= MAX_TEXT && long.starts_with(&record.message));
        for (arguments, error) in
            [("[1]", "a JSON array"), ("{", "EOF while parsing an object at line 1 column 1")]
        {
            let record = log_record(&event(message_json(arguments, "{}"), false));
            let expected = LogError::BadJson { field: "ArgumentsJson", error: error.into() };
            assert_eq!(record, Some(Err(expected)));
        }
        let mut bad_level = message_json("{}", "{}");
        bad_level[0].1 = Value::I64(9);
        assert_eq!(log_record(&event(bad_level, false)), Some(Err(LogError::BadLevel)));
        let mut no_message = message_json("{}", "{}");
        no_message.remove(7);
        assert_eq!(
            log_record(&event(no_message, false)),
            Some(Err(LogError::MissingField("FormattedMessage")))
        );
        let other =
            DecodedEvent { event: Cow::Borrowed("FormattedMessage"), ..event(vec![], false) };
        assert_eq!(log_record(&other), None);
    }
}
