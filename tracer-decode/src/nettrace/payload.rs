//! Payload decoding into named, typed values: from metadata field lists (EventSource events) or
//! from the built-in layouts of native runtime events. Shared by nettrace and user_events.

use crate::json::{self, WriteJson};
use crate::ordered::OrderedMap;

use super::cursor::{Cursor, Utf16Problem};
use super::metadata::{EventMetadata, FieldDef, FieldType};
use super::runtime_events::{Count, Kind, RuntimeField};

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
            Value::Guid(g) => {
                // Hex digits and dashes: nothing to escape.
                out.push(b'"');
                out.extend_from_slice(&guid_text(g));
                out.push(b'"');
            }
            Value::Array(items) => items.write_json(out),
            Value::Object(fields) => fields.write_json(out),
            Value::Enum { name, .. } => json::push_str(out, name),
            Value::Flags { names, unnamed, .. } => {
                // Names joined by ` | `, then the unnamed bits (also when no bit has a name).
                out.push(b'"');
                for (i, name) in names.iter().enumerate() {
                    if i > 0 {
                        out.extend_from_slice(b" | ");
                    }
                    json::push_escaped(out, name);
                }
                if *unnamed != 0 || names.is_empty() {
                    if !names.is_empty() {
                        out.extend_from_slice(b" | ");
                    }
                    json::push_hex_digits(out, *unnamed);
                }
                out.push(b'"');
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

/// A GUID stored in Windows memory layout (u32, u16, u16 little-endian, then 8 bytes) as
/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn guid_text(g: &[u8; 16]) -> [u8; 36] {
    // The byte order of the text: the three little-endian groups reversed, the rest as stored.
    const ORDER: [usize; 16] = [3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15];
    let mut text = [b'-'; 36];
    let mut at = 0;
    for (i, &byte_index) in ORDER.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            at += 1;
        }
        (text[at], text[at + 1]) = json::hex_pair(g[byte_index]);
        at += 2;
    }
    text
}

/// Formats a GUID stored in Windows memory layout (see [`guid_text`]).
pub fn format_guid(g: &[u8; 16]) -> String {
    String::from_utf8(guid_text(g).to_vec()).expect("hex digits and dashes are ASCII")
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

/// Cap on values decoded from one payload, so nested arrays cannot multiply work. Metadata
/// refuses zero-size types, so every value also consumes payload bytes (values ≤ max_depth ×
/// payload length).
pub const MAX_VALUES: usize = 65_536;

/// Cost units one payload byte pays for when decoding with metadata field lists. A decoded
/// value costs [`VALUE_COST`] plus the bytes of its field name (objects: of every nested name)
/// plus, for strings, their UTF-8 length — about the JSON bytes it renders to (escaping makes
/// at most 6 bytes of one). Real events spend well under 16 per byte (names of 5–30
/// characters on 1–8 byte values).
pub const COST_PER_PAYLOAD_BYTE: usize = 32;
/// Cost every payload may spend whatever its length (small events with long field names).
pub const COST_ALLOWANCE: usize = 4096;
/// Cost of one value besides its name: separators and a number's digits.
pub const VALUE_COST: usize = 8;

/// What decoding a payload of `len` bytes may cost: `COST_PER_PAYLOAD_BYTE × len +
/// COST_ALLOWANCE`. Beyond it the payload is reported [`PayloadProblem::OverBudget`] (and shown
/// as hex, 2 bytes per byte), so the JSON of one event's fields is O(payload bytes).
pub fn cost_budget(len: usize) -> usize {
    COST_PER_PAYLOAD_BYTE.saturating_mul(len).saturating_add(COST_ALLOWANCE)
}

/// Decodes `payload` using the event's metadata fields, else its built-in runtime layout.
/// Events with neither and a non-empty payload yield one `raw_payload` field (hex).
/// `pointer_size` comes from the Trace object (nettrace) or the target process (user_events).
pub fn decode_payload<'m>(
    meta: &'m EventMetadata,
    payload: &[u8],
    pointer_size: u32,
) -> Result<Fields<'m>, PayloadError> {
    let mut decoder = Decoder::new(payload, pointer_size);
    if meta.field_error.is_some() {
        return Err(decoder.error("", 0, PayloadProblem::UnusableMetadata));
    }
    if !meta.fields.is_empty() {
        return decoder.fields(&meta.fields);
    }
    if let Some(runtime) = meta.runtime_event {
        // A layout the payload fills exactly wins; else the first that decodes (its extra bytes
        // kept as `raw_tail`); else the first error.
        let mut first_decoded = None;
        let mut first_error = None;
        for layout in runtime.layouts_for(meta.version) {
            let mut attempt = Decoder::new(payload, pointer_size);
            match attempt.runtime_fields(layout) {
                Ok(fields) if fields.get("raw_tail").is_none() => return Ok(fields),
                Ok(fields) => {
                    first_decoded.get_or_insert(fields);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        return match (first_decoded, first_error) {
            (Some(fields), _) => Ok(fields),
            (None, Some(e)) => Err(e),
            (None, None) => unreachable!("every runtime event has a layout"),
        };
    }
    if payload.is_empty() {
        return Ok(Fields::default());
    }
    Ok(OrderedMap(vec![("raw_payload", Value::Bytes(payload.to_vec()))]))
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
        let mut decoder = Decoder::new(payload, pointer_size);
        decoder.runtime_group(layout).ok().filter(|_| decoder.cur.remaining() == 0).map(|_| version)
    })
}

struct Decoder<'p> {
    cur: Cursor<'p>,
    len: usize,
    pointer_size: u32,
    /// Values still allowed ([`MAX_VALUES`]).
    budget: usize,
    /// Cost units still allowed ([`cost_budget`]).
    cost: usize,
}

impl<'p> Decoder<'p> {
    fn new(payload: &'p [u8], pointer_size: u32) -> Self {
        Decoder {
            cur: Cursor::new(payload),
            len: payload.len(),
            pointer_size,
            budget: MAX_VALUES,
            cost: cost_budget(payload.len()),
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
        Ok(())
    }

    fn fields<'m>(&mut self, defs: &'m [FieldDef]) -> Result<Fields<'m>, PayloadError> {
        let mut out = Vec::with_capacity(defs.len());
        for def in defs {
            self.charge(&def.name, self.cur.pos(), def.name.len())?;
            let value = self.value(&def.name, &def.ty)?;
            out.push((def.name.as_str(), value));
        }
        Ok(OrderedMap(out))
    }

    fn take(&mut self, field: &str, n: usize) -> Result<&'p [u8], PayloadError> {
        let at = self.cur.pos();
        self.cur.take(n).ok_or_else(|| self.error(field, at, PayloadProblem::Short))
    }

    fn fixed<const N: usize>(&mut self, field: &str) -> Result<[u8; N], PayloadError> {
        Ok(self.take(field, N)?.try_into().expect("take returned N bytes"))
    }

    fn string(&mut self, field: &str) -> Result<String, PayloadError> {
        let at = self.cur.pos();
        self.cur.utf16z(usize::MAX / 2).map_err(|p| {
            debug_assert_eq!(p, Utf16Problem::Unterminated);
            self.error(field, at, PayloadProblem::UnterminatedString)
        })
    }

    fn pointer(&mut self, field: &str) -> Result<u64, PayloadError> {
        match self.pointer_size {
            4 => Ok(u32::from_le_bytes(self.fixed(field)?).into()),
            8 => Ok(u64::from_le_bytes(self.fixed(field)?)),
            _ => Err(self.error(field, self.cur.pos(), PayloadProblem::BadPointerSize)),
        }
    }

    fn value<'m>(&mut self, field: &str, ty: &'m FieldType) -> Result<Value<'m>, PayloadError> {
        let at = self.cur.pos();
        self.budget = self
            .budget
            .checked_sub(1)
            .ok_or_else(|| self.error(field, at, PayloadProblem::TooManyValues))?;
        self.charge(field, at, VALUE_COST)?;
        Ok(match ty {
            FieldType::Object(defs) => Value::Object(self.fields(defs)?),
            FieldType::Boolean => Value::Bool(u32::from_le_bytes(self.fixed(field)?) != 0),
            FieldType::Char16 => {
                let unit = u16::from_le_bytes(self.fixed(field)?);
                Value::Str(char::decode_utf16([unit]).map(|c| c.unwrap_or('\u{fffd}')).collect())
            }
            FieldType::SByte => Value::I64(i8::from_le_bytes(self.fixed(field)?).into()),
            FieldType::Byte => Value::U64(u8::from_le_bytes(self.fixed(field)?).into()),
            FieldType::Int16 => Value::I64(i16::from_le_bytes(self.fixed(field)?).into()),
            FieldType::UInt16 => Value::U64(u16::from_le_bytes(self.fixed(field)?).into()),
            FieldType::Int32 => Value::I64(i32::from_le_bytes(self.fixed(field)?).into()),
            FieldType::UInt32 => Value::U64(u32::from_le_bytes(self.fixed(field)?).into()),
            FieldType::Int64 | FieldType::DateTime => {
                Value::I64(i64::from_le_bytes(self.fixed(field)?))
            }
            FieldType::UInt64 => Value::U64(u64::from_le_bytes(self.fixed(field)?)),
            FieldType::Single => Value::F64(f32::from_le_bytes(self.fixed(field)?).into()),
            FieldType::Double => Value::F64(f64::from_le_bytes(self.fixed(field)?)),
            FieldType::Guid => Value::Guid(self.fixed(field)?),
            FieldType::String => {
                let s = self.string(field)?;
                self.charge(field, at, s.len())?;
                Value::Str(s)
            }
            FieldType::Array(element) => {
                let count = u16::from_le_bytes(self.fixed(field)?);
                let mut items = Vec::new();
                for _ in 0..count {
                    items.push(self.value(field, element)?);
                }
                Value::Array(items)
            }
        })
    }

    /// Decodes `layout` (a manifest template); bytes left after it are kept as `raw_tail`.
    fn runtime_fields(
        &mut self,
        layout: &'static [RuntimeField],
    ) -> Result<Fields<'static>, PayloadError> {
        let mut fields = self.runtime_group(layout)?;
        if self.cur.remaining() > 0 {
            let rest = self.take("raw_tail", self.cur.remaining())?;
            fields.0.push(("raw_tail", Value::Bytes(rest.to_vec())));
        }
        Ok(fields)
    }

    fn runtime_group(
        &mut self,
        layout: &'static [RuntimeField],
    ) -> Result<Fields<'static>, PayloadError> {
        let mut out: Vec<(&'static str, Value<'static>)> = Vec::with_capacity(layout.len());
        for field in layout {
            let count = match field.count {
                Count::One => None,
                Count::Fixed(n) => Some(u64::from(n)),
                // The generator and its test guarantee an earlier integer field.
                Count::Field(i) => Some(out[i].1.as_u64().unwrap_or(0)),
            };
            let value = match (count, field.kind) {
                (None, _) => self.runtime_value(field)?,
                (Some(n), Kind::Binary) => {
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    Value::Bytes(self.take(field.name, n)?.to_vec())
                }
                (Some(n), _) => {
                    // Every element takes payload bytes, so a huge count ends at `Short` (or at
                    // the value budget) long before it costs memory.
                    let mut items = Vec::new();
                    for _ in 0..n {
                        items.push(self.runtime_value(field)?);
                    }
                    Value::Array(items)
                }
            };
            out.push((field.name, value));
        }
        Ok(OrderedMap(out))
    }

    fn runtime_value(
        &mut self,
        field: &'static RuntimeField,
    ) -> Result<Value<'static>, PayloadError> {
        let name = field.name;
        let at = self.cur.pos();
        self.budget = self
            .budget
            .checked_sub(1)
            .ok_or_else(|| self.error(name, at, PayloadProblem::TooManyValues))?;
        let raw = match field.kind {
            Kind::U8 => Value::U64(self.fixed::<1>(name)?[0].into()),
            Kind::U16 => Value::U64(u16::from_le_bytes(self.fixed(name)?).into()),
            Kind::U32 => Value::U64(u32::from_le_bytes(self.fixed(name)?).into()),
            Kind::U64 => Value::U64(u64::from_le_bytes(self.fixed(name)?)),
            Kind::I8 => Value::I64(i8::from_le_bytes(self.fixed(name)?).into()),
            Kind::I16 => Value::I64(i16::from_le_bytes(self.fixed(name)?).into()),
            Kind::I32 => Value::I64(i32::from_le_bytes(self.fixed(name)?).into()),
            Kind::I64 => Value::I64(i64::from_le_bytes(self.fixed(name)?)),
            Kind::F32 => Value::F64(f32::from_le_bytes(self.fixed(name)?).into()),
            Kind::F64 => Value::F64(f64::from_le_bytes(self.fixed(name)?)),
            Kind::Bool32 => Value::Bool(u32::from_le_bytes(self.fixed(name)?) != 0),
            Kind::Pointer => Value::U64(self.pointer(name)?),
            Kind::Guid => Value::Guid(self.fixed(name)?),
            Kind::Utf16Z => Value::Str(self.string(name)?),
            Kind::AnsiZ => Value::Str(self.ansi_string(name)?),
            Kind::Binary => Value::Bytes(self.take(name, 1)?.to_vec()),
            Kind::Struct(members) => Value::Object(self.runtime_group(members)?),
        };
        let Some(map) = field.map else { return Ok(raw) };
        let Some(value) = raw.as_u64() else { return Ok(raw) };
        Ok(if map.bitmap {
            let (names, unnamed) = map.flags(value);
            Value::Flags { value, names, unnamed }
        } else {
            match map.name(value) {
                Some(name) => Value::Enum { value, name },
                None => raw,
            }
        })
    }

    fn ansi_string(&mut self, field: &str) -> Result<String, PayloadError> {
        let at = self.cur.pos();
        let bytes = self
            .cur
            .nul_terminated()
            .ok_or_else(|| self.error(field, at, PayloadProblem::UnterminatedString))?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
}
