//! The JSON of the most common payloads without the general decoder: a layout made only of
//! integers, manifest-mapped integers and UTF-16 strings (most runtime events, many EventSource
//! events) is compiled once per event metadata into its keys, rendered, and how each field
//! reads. Writing a payload is then a copy of each key and each value's digits, name or text.
//!
//! It writes only what the general decoder ([`super::payload::write_payload_json`]) would write
//! for the same payload, and only where that decoder would succeed without a tail: a payload of
//! another length, a string without its NUL, a layout over the cost budget or with anything
//! else goes to the general decoder, which then writes its tail or its error. The differential
//! tests and the `nettrace` fuzz target compare the two through the output.

use crate::json;
use crate::work;

use super::cursor::Cursor;
use super::fields::FieldDef;
use super::runtime_events::{Count, Kind, RuntimeField, ValueMap};
use super::scalar::{Integer, MAX_STRING_UNITS, MAX_VALUES, Scalar, VALUE_COST, cost_budget};

/// How one field's value is written.
#[derive(Debug, Clone, Copy)]
enum Value {
    Plain(Integer),
    /// A runtime field with a manifest value or bit map: its name(s), as the general decoder
    /// maps it.
    Mapped(Integer, &'static ValueMap),
    /// A NUL-terminated UTF-16 string (runtime layouts only: metadata field lists charge
    /// their strings' length, which is known only once read).
    Utf16Z,
}

/// Keys up to this long are copied as this many bytes, one fixed-size move instead of a
/// `memcpy` call of their length; [`FlatLayout::keys`] is padded with as many after the last.
const KEY_COPY_BYTES: usize = 32;

#[derive(Debug, Clone, Copy)]
struct Field {
    /// Where the field's key ends in [`FlatLayout::keys`] (it starts where the previous ends).
    key_end: usize,
    value: Value,
}

/// A payload layout compiled for writing its JSON object.
#[derive(Debug)]
pub struct FlatLayout {
    /// The keys one after another, each with what comes before it: `{"A":`, `,"B":`, …, then
    /// [`KEY_COPY_BYTES`] of padding.
    keys: Box<[u8]>,
    fields: Box<[Field]>,
    /// Bytes of the integer fields that are not pointers.
    fixed_bytes: usize,
    pointers: usize,
    /// String fields: each takes at least its two-byte NUL, and makes the length variable.
    strings: usize,
    /// What the general decoder charges for these fields (metadata field lists only; runtime
    /// layouts are not charged): the layout is used only within the payload's budget.
    cost: usize,
}

impl FlatLayout {
    /// The layout of a metadata field list, when it is flat.
    pub(crate) fn of_fields(defs: &[FieldDef]) -> Option<FlatLayout> {
        let mut layout = Builder::default();
        for def in defs {
            let value = Integer::of_field_type(&def.ty)?;
            // As the general decoder charges: the name, then the value.
            layout.cost += def.name.len() + VALUE_COST;
            layout.push(&def.name, Value::Plain(value));
        }
        layout.build()
    }

    /// The layout of a runtime event's built-in fields, when it is flat.
    pub(crate) fn of_runtime(fields: &[RuntimeField]) -> Option<FlatLayout> {
        let mut layout = Builder::default();
        for field in fields {
            if field.count != Count::One {
                return None;
            }
            if field.kind == Kind::Utf16Z {
                layout.push(field.name, Value::Utf16Z);
                continue;
            }
            let integer = Integer::of_kind(field.kind)?;
            let value = match field.map {
                Some(map) => Value::Mapped(integer, map),
                None => Value::Plain(integer),
            };
            layout.push(field.name, value);
        }
        layout.build()
    }

    /// Appends `payload` as its JSON object; `false` (and nothing written) when the payload
    /// does not fill this layout exactly or passes its cost budget: the general decoder's case.
    pub fn write_json(&self, payload: &[u8], pointer_size: u32, out: &mut Vec<u8>) -> bool {
        let pointer = match pointer_size {
            4 => 4,
            8 => 8,
            _ => return false,
        };
        let fixed = self.fixed_bytes + self.pointers * pointer;
        let fits = match self.strings {
            0 => payload.len() == fixed,
            strings => payload.len() >= fixed + 2 * strings,
        };
        if !fits || self.cost > cost_budget(payload.len()) {
            return false;
        }
        work::count(self.cost);
        let start = out.len();
        if self.write_fields(payload, pointer, out) {
            return true;
        }
        out.truncate(start);
        false
    }

    /// [`write_json`](Self::write_json) after its checks; `false` when a value is past the
    /// end, a string has no NUL or bytes are left (possible only with strings).
    #[inline(always)]
    fn write_fields(&self, payload: &[u8], pointer: usize, out: &mut Vec<u8>) -> bool {
        // Keys, at most 20 digits or `false` a value (names and text reserve their own), the
        // closing brace.
        out.reserve(self.keys.len() + 20 * self.fields.len() + 1);
        let mut cur = Cursor::new(payload);
        // Filled only for a string (the general decoder reads them into one too).
        let mut text = String::new();
        let mut key_start = 0;
        for field in &self.fields {
            // The key and at least `KEY_COPY_BYTES` more: the buffer is padded after the last.
            let key = &self.keys[key_start..];
            let key_len = field.key_end - key_start;
            if key_len <= KEY_COPY_BYTES {
                let padded: &[u8; KEY_COPY_BYTES] =
                    key[..KEY_COPY_BYTES].try_into().expect("padded");
                json::push_prefix(out, padded, key_len);
            } else {
                out.extend_from_slice(&key[..key_len]);
            }
            key_start = field.key_end;
            match field.value {
                Value::Plain(integer) => match integer.read(&mut cur, pointer) {
                    Some(Scalar::U64(v)) => json::push_u64(out, v),
                    Some(Scalar::I64(v)) => json::push_i64(out, v),
                    Some(Scalar::Bool(v)) => json::push_bool(out, v),
                    Some(_) => unreachable!("an integer reads as an integer or a boolean"),
                    None => return false,
                },
                Value::Mapped(integer, map) => match integer.read(&mut cur, pointer) {
                    Some(value) => value.mapped(map).write_json(out),
                    None => return false,
                },
                Value::Utf16Z => {
                    if cur.utf16z_into(MAX_STRING_UNITS, &mut text).is_err() {
                        return false;
                    }
                    json::push_str(out, &text);
                }
            }
        }
        out.push(b'}');
        cur.remaining() == 0
    }

    /// The most bytes a compiled layout of fields named `names` can hold in memory, whether
    /// compiled yet or not (the metadata budgets charge it): every top-level field as a field,
    /// its key escaped (at most 6 bytes a byte) with its quotes, colon and separator, and the
    /// keys' padding.
    pub(crate) fn max_heap_bytes<'n>(names: impl Iterator<Item = &'n str>) -> usize {
        let fields: usize = names.map(|name| 6 * name.len() + 4 + size_of::<Field>()).sum();
        size_of::<FlatLayout>() + KEY_COPY_BYTES + fields
    }
}

#[derive(Default)]
struct Builder {
    keys: Vec<u8>,
    fields: Vec<Field>,
    fixed_bytes: usize,
    pointers: usize,
    strings: usize,
    cost: usize,
}

impl Builder {
    fn push(&mut self, name: &str, value: Value) {
        self.keys.push(if self.fields.is_empty() { b'{' } else { b',' });
        json::push_key(&mut self.keys, name);
        self.fields.push(Field { key_end: self.keys.len(), value });
        match value {
            Value::Plain(integer) | Value::Mapped(integer, _) => match integer.size() {
                Some(bytes) => self.fixed_bytes += bytes,
                None => self.pointers += 1,
            },
            Value::Utf16Z => self.strings += 1,
        }
    }

    /// `None` for no fields (an empty payload's object, or a payload where none is expected:
    /// the general decoder's) and for more values than the decoder allows.
    fn build(mut self) -> Option<FlatLayout> {
        self.keys.extend([0; KEY_COPY_BYTES]);
        (!self.fields.is_empty() && self.fields.len() <= MAX_VALUES).then(|| FlatLayout {
            keys: self.keys.into_boxed_slice(),
            fields: self.fields.into_boxed_slice(),
            fixed_bytes: self.fixed_bytes,
            pointers: self.pointers,
            strings: self.strings,
            cost: self.cost,
        })
    }
}
