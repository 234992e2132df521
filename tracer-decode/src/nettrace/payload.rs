//! Payload decoding into named, typed values: from metadata field lists (EventSource events) or
//! from the built-in layouts of native runtime events. Shared by nettrace and user_events.

use crate::json::{self, WriteJson};
use crate::ordered::OrderedMap;
use crate::work;

use super::cursor::{Cursor, Utf16Problem};
use super::fields::{FieldDef, FieldType};
use super::metadata::EventMetadata;
use super::runtime_events::{Count, Kind, RuntimeField};
pub use super::scalar::{
    COST_ALLOWANCE, COST_PER_PAYLOAD_BYTE, MAX_VALUES, VALUE_COST, cost_budget, format_guid,
};
use super::scalar::{Integer, MAX_STRING_UNITS, push_flags};
pub(crate) use super::scalar::{Scalar, push_guid};

/// One decoded value. Written as plain JSON ([`WriteJson`]): numbers, strings, arrays, objects.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'m> {
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(String),
    /// A GUID in Windows memory layout; shown as `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    Guid([u8; 16]),
    Array(Vec<Value<'m>>),
    Object(Fields<'m>),
    /// A value with a name from a manifest value map; shown as the name.
    Enum {
        value: u64,
        name: &'static str,
    },
    /// A value of a manifest bit map; shown as its bit names joined by ` | ` (and the
    /// unnamed bits in hex, if any).
    Flags {
        value: u64,
        names: Vec<&'static str>,
        unnamed: u64,
    },
    /// Bytes no layout describes; shown as lowercase hex.
    Bytes(Vec<u8>),
}

/// Named values in payload order; written as a JSON object keeping that order.
pub type Fields<'m> = OrderedMap<&'m str, Value<'m>>;

impl Value<'_> {
    /// The integer behind an integer or mapped value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U64(v) | Value::Enum { value: v, .. } | Value::Flags { value: v, .. } => Some(v),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

impl WriteJson for Value<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Value::Bool(v) => json::push_bool(out, *v),
            Value::I64(v) => json::push_i64(out, *v),
            Value::U64(v) => json::push_u64(out, *v),
            Value::F64(v) => json::push_f64(out, *v),
            Value::Str(v) => json::push_str(out, v),
            Value::Guid(g) => push_guid(out, g),
            Value::Array(items) => items.write_json(out),
            Value::Object(fields) => fields.write_json(out),
            Value::Enum { name, .. } => json::push_str(out, name),
            Value::Flags { names, unnamed, .. } => {
                push_flags(out, names.iter().copied(), *unnamed);
            }
            Value::Bytes(bytes) => json::push_hex_string(out, bytes),
        }
    }
}

/// serde_json's rendering of a [`Value`]: the reference the direct writer is tested against.
#[cfg(any(test, feature = "serde-reference"))]
impl serde::Serialize for Value<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq as _;
        match self {
            Value::Bool(v) => s.serialize_bool(*v),
            Value::I64(v) => s.serialize_i64(*v),
            Value::U64(v) => s.serialize_u64(*v),
            Value::F64(v) => s.serialize_f64(*v),
            Value::Str(v) => s.serialize_str(v),
            Value::Guid(g) => s.serialize_str(&format!(
                "{:08x}-{:04x}-{:04x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
                u32::from_le_bytes([g[0], g[1], g[2], g[3]]),
                u16::from_le_bytes([g[4], g[5]]),
                u16::from_le_bytes([g[6], g[7]]),
                g[8],
                g[9],
                g[10],
                g[11],
                g[12],
                g[13],
                g[14],
                g[15]
            )),
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Object(fields) => fields.serialize(s),
            Value::Enum { name, .. } => s.serialize_str(name),
            Value::Flags { names, unnamed, .. } => {
                let mut text = names.join(" | ");
                if *unnamed != 0 || names.is_empty() {
                    let sep = if text.is_empty() { "" } else { " | " };
                    text = format!("{text}{sep}{unnamed:#x}");
                }
                s.serialize_str(&text)
            }
            Value::Bytes(bytes) => {
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                s.serialize_str(&hex)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadProblem {
    /// The payload ends before this field.
    Short,
    UnterminatedString,
    /// More decoded values than [`MAX_VALUES`].
    TooManyValues,
    /// The decoded fields would cost more than [`cost_budget`] allows for the payload's length
    /// (field names repeated by every value: long names on many small values).
    OverBudget,
    /// The pointer size is neither 4 nor 8.
    BadPointerSize,
    /// The event's field metadata could not be read (see `EventMetadata::field_error`).
    UnusableMetadata,
}

/// Why a payload could not be decoded; `at` is the byte position inside the payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("payload byte {at}: field {field}: {problem:?} (payload is {len} bytes)")]
pub struct PayloadError {
    pub field: String,
    pub at: usize,
    pub len: usize,
    pub problem: PayloadProblem,
}

/// Decodes `payload` into a [`Value`] tree, for code that inspects the fields (counters, the
/// stopping event, tests). Output lines skip the tree: [`write_payload_json`].
///
/// The event's metadata fields are used, else its built-in runtime layout; events with neither
/// and a non-empty payload yield one `raw_payload` field (hex). `pointer_size` comes from the
/// Trace object (nettrace) or the target process (user_events).
pub fn decode_payload<'m>(
    meta: &'m EventMetadata,
    payload: &[u8],
    pointer_size: u32,
) -> Result<Fields<'m>, PayloadError> {
    let mut tree = TreeSink::default();
    decode_into(meta, payload, pointer_size, &mut tree)?;
    Ok(OrderedMap(tree.top))
}

/// Decodes `payload` as [`decode_payload`] does, straight into `out` as a JSON object: no
/// tree, no `String` per value. On an error `out` is left as it was.
pub fn write_payload_json(
    meta: &EventMetadata,
    payload: &[u8],
    pointer_size: u32,
    out: &mut Vec<u8>,
) -> Result<(), PayloadError> {
    let flat = meta.flat_layout.get_or_init(|| meta.compiled_layout());
    if let Some(flat) = flat
        && flat.write_json(payload, pointer_size, out)
    {
        return Ok(());
    }
    write_json_and(meta, payload, pointer_size, out, &mut NoSink)
}

/// The fields as a JSON object into `out` ([`write_payload_json`] without its flat-layout path),
/// `also` fed by the same decode: for events whose line is written and a few of whose members
/// are read (counters, every second from every traced process), without a tree. On an error
/// `out` is left as it was (`also` may have seen part of it).
pub(crate) fn write_json_and<'m, S: Sink<'m>>(
    meta: &'m EventMetadata,
    payload: &[u8],
    pointer_size: u32,
    out: &mut Vec<u8>,
    also: &mut S,
) -> Result<(), PayloadError> {
    let start = out.len();
    out.push(b'{');
    let mut sinks = Both(JsonSink { out, comma: false }, also);
    let decoded = decode_into(meta, payload, pointer_size, &mut sinks);
    match decoded {
        Ok(()) => out.push(b'}'),
        Err(_) => out.truncate(start),
    }
    decoded
}

/// The one decoder behind [`decode_payload`] and [`write_payload_json`].
fn decode_into<'m, S: Sink<'m>>(
    meta: &'m EventMetadata,
    payload: &[u8],
    pointer_size: u32,
    sink: &mut S,
) -> Result<(), PayloadError> {
    let mut decoder = Decoder::new(payload, pointer_size, sink);
    if meta.field_error.is_some() {
        return Err(decoder.error("", 0, PayloadProblem::UnusableMetadata));
    }
    if !meta.fields.is_empty() {
        return decoder.fields(&meta.fields);
    }
    if let Some(runtime) = meta.runtime_event {
        // With a version (nettrace) there is one layout: decoded straight, its extra bytes kept
        // as `raw_tail`.
        if let Some(version) = meta.version {
            let layout = runtime.layout_for(version);
            return Decoder::new(payload, pointer_size, sink).runtime_fields(layout).map(drop);
        }
        // Without (user_events): a layout the payload fills exactly wins; else the first that
        // decodes (its extra bytes kept as `raw_tail`); else the first error.
        let mark = sink.mark();
        let mut first_decoded = None;
        let mut first_error = None;
        for layout in runtime.layouts_newest_first() {
            match Decoder::new(payload, pointer_size, sink).runtime_fields(layout) {
                Ok(Fill::Exact) => return Ok(()),
                Ok(Fill::WithTail) => {
                    first_decoded.get_or_insert(layout);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            sink.rewind(mark);
        }
        return match (first_decoded, first_error) {
            // Decoding is deterministic: the layout decodes again.
            (Some(layout), _) => {
                Decoder::new(payload, pointer_size, sink).runtime_fields(layout).map(drop)
            }
            (None, Some(e)) => Err(e),
            (None, None) => unreachable!("every runtime event has a layout"),
        };
    }
    if !payload.is_empty() {
        sink.plain_key("raw_payload");
        sink.scalar(Scalar::Bytes(payload));
    }
    Ok(())
}

/// The newest template version of a native event that `payload` fills exactly: the version a
/// record without one (user_events) was most likely written with. `None` for events the table
/// lacks or payloads no template fits.
pub fn fitting_version(
    provider: &str,
    event_id: u32,
    payload: &[u8],
    pointer_size: u32,
) -> Option<u32> {
    let runtime = super::runtime_events::lookup(provider, event_id)?;
    runtime.versions().iter().rev().find_map(|&(version, layout)| {
        let mut fits = NoSink;
        let mut decoder = Decoder::new(payload, pointer_size, &mut fits);
        decoder.runtime_group(layout).ok().filter(|_| decoder.cur.remaining() == 0).map(|_| version)
    })
}

/// Arrays and objects.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Nest {
    Array,
    Object,
}

/// Where the decoder puts what it decodes, in payload order: a [`Value`] tree ([`TreeSink`]),
/// JSON text ([`JsonSink`]), or the few members a counter sample is read from
/// ([`crate::counters::CounterReader`]). One decoder serves them all, so the line tracer writes
/// and the fields tracer inspects cannot disagree.
pub(crate) trait Sink<'m> {
    /// Where the sink is, to go back to (a runtime layout that did not fit).
    type Mark: Copy;
    /// The name of the next member of the object being written.
    fn key(&mut self, name: &'m str);
    /// [`Sink::key`] for the runtime table's names, which need no escaping (a test checks).
    fn plain_key(&mut self, name: &'static str) {
        self.key(name);
    }
    /// [`Sink::key`] of a metadata field, which knows whether its name needs escaping.
    fn field_key(&mut self, def: &'m FieldDef) {
        self.key(&def.name);
    }
    fn scalar(&mut self, value: Scalar<'_>);
    fn open(&mut self, nest: Nest);
    fn close(&mut self, nest: Nest);
    /// Only between the top-level fields.
    fn mark(&self) -> Self::Mark;
    /// Drops everything after `mark`, also arrays and objects left open by an error.
    fn rewind(&mut self, mark: Self::Mark);
}

/// Builds the [`Fields`] tree.
#[derive(Default)]
struct TreeSink<'m> {
    top: Vec<(&'m str, Value<'m>)>,
    /// Arrays and objects being filled, each with its name in its parent (none in an array).
    open: Vec<(Option<&'m str>, Open<'m>)>,
    key: Option<&'m str>,
}

enum Open<'m> {
    Array(Vec<Value<'m>>),
    Object(Vec<(&'m str, Value<'m>)>),
}

impl<'m> TreeSink<'m> {
    fn put(&mut self, value: Value<'m>) {
        // The decoder names every member before its value.
        let key = self.key.take();
        let key = || key.expect("a member's name comes before its value");
        match self.open.last_mut() {
            Some((_, Open::Array(items))) => items.push(value),
            Some((_, Open::Object(members))) => members.push((key(), value)),
            None => self.top.push((key(), value)),
        }
    }
}

impl<'m> Sink<'m> for TreeSink<'m> {
    type Mark = usize;

    fn key(&mut self, name: &'m str) {
        self.key = Some(name);
    }

    fn scalar(&mut self, value: Scalar<'_>) {
        self.put(match value {
            Scalar::Bool(v) => Value::Bool(v),
            Scalar::I64(v) => Value::I64(v),
            Scalar::U64(v) => Value::U64(v),
            Scalar::F64(v) => Value::F64(v),
            Scalar::Str(v) => Value::Str(v.to_owned()),
            Scalar::Guid(g) => Value::Guid(g),
            Scalar::Enum { value, name } => Value::Enum { value, name },
            Scalar::Flags { value, map } => Value::Flags {
                value,
                names: map.bit_names(value).collect(),
                unnamed: map.unnamed(value),
            },
            Scalar::Bytes(v) => Value::Bytes(v.to_vec()),
        });
    }

    fn open(&mut self, nest: Nest) {
        let open = match nest {
            Nest::Array => Open::Array(Vec::new()),
            Nest::Object => Open::Object(Vec::new()),
        };
        self.open.push((self.key.take(), open));
    }

    fn close(&mut self, _: Nest) {
        let (key, open) = self.open.pop().expect("close follows open");
        self.key = key;
        self.put(match open {
            Open::Array(items) => Value::Array(items),
            Open::Object(members) => Value::Object(OrderedMap(members)),
        });
    }

    fn mark(&self) -> usize {
        self.top.len()
    }

    fn rewind(&mut self, mark: usize) {
        self.open.clear();
        self.key = None;
        self.top.truncate(mark);
    }
}

/// Writes JSON into the line's buffer (the object's braces are the caller's).
struct JsonSink<'o> {
    out: &'o mut Vec<u8>,
    /// The next member or element follows another.
    comma: bool,
}

impl JsonSink<'_> {
    fn separate(&mut self) {
        if std::mem::replace(&mut self.comma, true) {
            self.out.push(b',');
        }
    }
}

impl<'m> Sink<'m> for JsonSink<'_> {
    type Mark = (usize, bool);

    fn key(&mut self, name: &'m str) {
        self.separate();
        json::push_key(self.out, name);
        // The value follows the colon.
        self.comma = false;
    }

    fn plain_key(&mut self, name: &'static str) {
        self.separate();
        json::push_plain_key(self.out, name);
        self.comma = false;
    }

    fn field_key(&mut self, def: &'m FieldDef) {
        self.separate();
        match def.plain_name {
            true => json::push_plain_key(self.out, &def.name),
            false => json::push_key(self.out, &def.name),
        }
        self.comma = false;
    }

    // Inlined, so that where the decoder knows the kind (an integer, nearly always) it writes
    // the digits without building and matching a `Scalar` in a call.
    #[inline]
    fn scalar(&mut self, value: Scalar<'_>) {
        self.separate();
        match value {
            Scalar::U64(v) => json::push_u64(self.out, v),
            Scalar::I64(v) => json::push_i64(self.out, v),
            other => other.write_json(self.out),
        }
    }

    fn open(&mut self, nest: Nest) {
        self.separate();
        self.out.push(match nest {
            Nest::Array => b'[',
            Nest::Object => b'{',
        });
        self.comma = false;
    }

    fn close(&mut self, nest: Nest) {
        self.out.push(match nest {
            Nest::Array => b']',
            Nest::Object => b'}',
        });
        self.comma = true;
    }

    fn mark(&self) -> (usize, bool) {
        (self.out.len(), self.comma)
    }

    fn rewind(&mut self, (len, comma): (usize, bool)) {
        self.out.truncate(len);
        self.comma = comma;
    }
}

/// Two sinks fed by one decode (a line's JSON and the members read from it).
struct Both<'b, A, B>(A, &'b mut B);

impl<'m, A: Sink<'m>, B: Sink<'m>> Sink<'m> for Both<'_, A, B> {
    type Mark = (A::Mark, B::Mark);

    #[inline]
    fn key(&mut self, name: &'m str) {
        self.0.key(name);
        self.1.key(name);
    }

    #[inline]
    fn plain_key(&mut self, name: &'static str) {
        self.0.plain_key(name);
        self.1.plain_key(name);
    }

    #[inline]
    fn field_key(&mut self, def: &'m FieldDef) {
        self.0.field_key(def);
        self.1.field_key(def);
    }

    #[inline]
    fn scalar(&mut self, value: Scalar<'_>) {
        self.0.scalar(value);
        self.1.scalar(value);
    }

    fn open(&mut self, nest: Nest) {
        self.0.open(nest);
        self.1.open(nest);
    }

    fn close(&mut self, nest: Nest) {
        self.0.close(nest);
        self.1.close(nest);
    }

    fn mark(&self) -> Self::Mark {
        (self.0.mark(), self.1.mark())
    }

    fn rewind(&mut self, (a, b): Self::Mark) {
        self.0.rewind(a);
        self.1.rewind(b);
    }
}

/// Keeps nothing: for trying whether a layout fits.
struct NoSink;

impl<'m> Sink<'m> for NoSink {
    type Mark = ();

    fn key(&mut self, _: &'m str) {}
    fn scalar(&mut self, _: Scalar<'_>) {}
    fn open(&mut self, _: Nest) {}
    fn close(&mut self, _: Nest) {}
    fn mark(&self) {}
    fn rewind(&mut self, (): ()) {}
}

/// How a runtime layout fitted its payload.
enum Fill {
    Exact,
    /// Bytes were left after the layout (kept as `raw_tail`).
    WithTail,
}

/// Fields of one runtime layout level whose values a later field's [`Count::Field`] may name
/// (a test checks the generated table against it).
pub(crate) const COUNTED_FIELDS: usize = 16;

/// Bytes a decoder's text buffer starts with (it grows for longer strings).
const TEXT_CAPACITY: usize = 64;

struct Decoder<'p, 's, S> {
    cur: Cursor<'p>,
    len: usize,
    pointer_size: u32,
    /// Values still allowed ([`MAX_VALUES`]).
    budget: usize,
    /// Cost units still allowed ([`cost_budget`]).
    cost: usize,
    sink: &'s mut S,
    /// Where UTF-16 text is turned into UTF-8 on its way to the sink (kept between strings).
    text: String,
}

impl<'p, 's, 'm, S: Sink<'m>> Decoder<'p, 's, S> {
    fn new(payload: &'p [u8], pointer_size: u32, sink: &'s mut S) -> Self {
        Decoder {
            cur: Cursor::new(payload),
            len: payload.len(),
            pointer_size,
            budget: MAX_VALUES,
            cost: cost_budget(payload.len()),
            sink,
            // Allocated by the first string (layouts are tried on payloads without any).
            text: String::new(),
        }
    }

    fn error(&self, field: &str, at: usize, problem: PayloadProblem) -> PayloadError {
        PayloadError { field: field.to_owned(), at, len: self.len, problem }
    }

    /// Charges `units` of cost for `field` (at payload byte `at`).
    fn charge(&mut self, field: &str, at: usize, units: usize) -> Result<(), PayloadError> {
        self.cost = self
            .cost
            .checked_sub(units)
            .ok_or_else(|| self.error(field, at, PayloadProblem::OverBudget))?;
        work::count(units);
        Ok(())
    }

    /// Counts one more value against [`MAX_VALUES`].
    fn count_value(&mut self, field: &str, at: usize) -> Result<(), PayloadError> {
        self.budget = self
            .budget
            .checked_sub(1)
            .ok_or_else(|| self.error(field, at, PayloadProblem::TooManyValues))?;
        Ok(())
    }

    fn fields(&mut self, defs: &'m [FieldDef]) -> Result<(), PayloadError> {
        for def in defs {
            self.charge(&def.name, self.cur.pos(), def.name.len())?;
            self.sink.field_key(def);
            self.value(&def.name, &def.ty)?;
        }
        Ok(())
    }

    fn take(&mut self, field: &str, n: usize) -> Result<&'p [u8], PayloadError> {
        let at = self.cur.pos();
        self.cur.take(n).ok_or_else(|| self.error(field, at, PayloadProblem::Short))
    }

    fn fixed<const N: usize>(&mut self, field: &str) -> Result<[u8; N], PayloadError> {
        Ok(self.take(field, N)?.try_into().expect("take returned N bytes"))
    }

    /// Reads a UTF-16Z string into `self.text`.
    fn string(&mut self, field: &str) -> Result<(), PayloadError> {
        // Room for the usual name or message: one allocation, not one per longer string.
        if self.text.capacity() == 0 {
            self.text.reserve(TEXT_CAPACITY);
        }
        let at = self.cur.pos();
        self.cur.utf16z_into(MAX_STRING_UNITS, &mut self.text).map_err(|p| {
            debug_assert_eq!(p, Utf16Problem::Unterminated);
            self.error(field, at, PayloadProblem::UnterminatedString)
        })
    }

    /// One integer value of `field`.
    #[inline(always)]
    fn integer(&mut self, field: &str, integer: Integer) -> Result<Scalar<'p>, PayloadError> {
        let at = self.cur.pos();
        if integer == Integer::Pointer && !matches!(self.pointer_size, 4 | 8) {
            return Err(self.error(field, at, PayloadProblem::BadPointerSize));
        }
        integer
            .read(&mut self.cur, self.pointer_size as usize)
            .ok_or_else(|| self.error(field, at, PayloadProblem::Short))
    }

    fn value(&mut self, field: &str, ty: &'m FieldType) -> Result<(), PayloadError> {
        let at = self.cur.pos();
        self.count_value(field, at)?;
        self.charge(field, at, VALUE_COST)?;
        let scalar = match ty {
            FieldType::Object(defs) => {
                self.sink.open(Nest::Object);
                self.fields(defs)?;
                self.sink.close(Nest::Object);
                return Ok(());
            }
            FieldType::Array(element) => {
                let count = u16::from_le_bytes(self.fixed(field)?);
                self.sink.open(Nest::Array);
                for _ in 0..count {
                    self.value(field, element)?;
                }
                self.sink.close(Nest::Array);
                return Ok(());
            }
            FieldType::String => {
                self.string(field)?;
                self.charge(field, at, self.text.len())?;
                self.sink.scalar(Scalar::Str(&self.text));
                return Ok(());
            }
            FieldType::Char16 => {
                let unit = u16::from_le_bytes(self.fixed(field)?);
                let c = char::decode_utf16([unit]).next().and_then(Result::ok);
                let mut utf8 = [0; 4];
                let text = c.unwrap_or(char::REPLACEMENT_CHARACTER).encode_utf8(&mut utf8);
                self.sink.scalar(Scalar::Str(text));
                return Ok(());
            }
            FieldType::Boolean
            | FieldType::SByte
            | FieldType::Byte
            | FieldType::Int16
            | FieldType::UInt16
            | FieldType::Int32
            | FieldType::UInt32
            | FieldType::Int64
            | FieldType::DateTime
            | FieldType::UInt64 => {
                self.integer(field, Integer::of_field_type(ty).expect("an integer type"))?
            }
            FieldType::Single => Scalar::F64(f32::from_le_bytes(self.fixed(field)?).into()),
            FieldType::Double => Scalar::F64(f64::from_le_bytes(self.fixed(field)?)),
            FieldType::Guid => Scalar::Guid(self.fixed(field)?),
        };
        self.sink.scalar(scalar);
        Ok(())
    }

    /// Decodes `layout` (a manifest template); bytes left after it are kept as `raw_tail`.
    fn runtime_fields(&mut self, layout: &'static [RuntimeField]) -> Result<Fill, PayloadError> {
        self.runtime_group(layout)?;
        if self.cur.remaining() == 0 {
            return Ok(Fill::Exact);
        }
        let rest = self.take("raw_tail", self.cur.remaining())?;
        self.sink.plain_key("raw_tail");
        self.sink.scalar(Scalar::Bytes(rest));
        Ok(Fill::WithTail)
    }

    fn runtime_group(&mut self, layout: &'static [RuntimeField]) -> Result<(), PayloadError> {
        // The integers of this level's fields, for the counts that name them.
        let mut integers = [0u64; COUNTED_FIELDS];
        for (i, field) in layout.iter().enumerate() {
            let count = match field.count {
                Count::One => None,
                Count::Fixed(n) => Some(u64::from(n)),
                // The generator and its test guarantee an earlier integer field.
                Count::Field(earlier) => Some(integers.get(earlier).copied().unwrap_or(0)),
            };
            self.sink.plain_key(field.name);
            match (count, field.kind) {
                (None, _) => {
                    let integer = self.runtime_value(field)?;
                    if let Some(slot) = integers.get_mut(i) {
                        *slot = integer.unwrap_or(0);
                    }
                }
                (Some(n), Kind::Binary) => {
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    let bytes = self.take(field.name, n)?;
                    self.sink.scalar(Scalar::Bytes(bytes));
                }
                (Some(n), _) => {
                    // Every element takes payload bytes, so a huge count ends at `Short` (or at
                    // the value budget) long before it costs memory.
                    self.sink.open(Nest::Array);
                    for _ in 0..n {
                        self.runtime_value(field)?;
                    }
                    self.sink.close(Nest::Array);
                }
            }
        }
        Ok(())
    }

    /// Decodes one value of `field`; returns its integer (as [`Value::as_u64`] reads it), the
    /// count a later field may take from it.
    fn runtime_value(&mut self, field: &'static RuntimeField) -> Result<Option<u64>, PayloadError> {
        let name = field.name;
        self.count_value(name, self.cur.pos())?;
        let raw = match field.kind {
            Kind::U8
            | Kind::U16
            | Kind::U32
            | Kind::U64
            | Kind::I8
            | Kind::I16
            | Kind::I32
            | Kind::I64
            | Kind::Bool32
            | Kind::Pointer => {
                self.integer(name, Integer::of_kind(field.kind).expect("an integer kind"))?
            }
            Kind::F32 => Scalar::F64(f32::from_le_bytes(self.fixed(name)?).into()),
            Kind::F64 => Scalar::F64(f64::from_le_bytes(self.fixed(name)?)),
            Kind::Guid => Scalar::Guid(self.fixed(name)?),
            Kind::Utf16Z => {
                self.string(name)?;
                self.sink.scalar(Scalar::Str(&self.text));
                return Ok(None);
            }
            Kind::AnsiZ => {
                let at = self.cur.pos();
                let bytes = self
                    .cur
                    .nul_terminated()
                    .ok_or_else(|| self.error(name, at, PayloadProblem::UnterminatedString))?;
                self.sink.scalar(Scalar::Str(&String::from_utf8_lossy(bytes)));
                return Ok(None);
            }
            Kind::Binary => Scalar::Bytes(self.take(name, 1)?),
            Kind::Struct(members) => {
                self.sink.open(Nest::Object);
                self.runtime_group(members)?;
                self.sink.close(Nest::Object);
                return Ok(None);
            }
        };
        let integer = raw.integer();
        self.sink.scalar(match field.map {
            Some(map) => raw.mapped(map),
            None => raw,
        });
        Ok(integer)
    }
}
