//! The JSON of the most common payloads without the general decoder: a layout made only of
//! fixed-size integers (most runtime events, many EventSource events) is compiled once per
//! event metadata into its keys, rendered, and each field's size. Writing a payload is then a
//! copy of each key and the digits of each value.
//!
//! It writes only what the general decoder ([`super::payload::write_payload_json`]) would write
//! for the same payload, and only where that decoder would succeed without a tail: a payload of
//! another length, a layout over the cost budget or with anything but plain integers goes to the
//! general decoder, which then writes its tail or its error. The differential tests and the
//! `nettrace` fuzz target compare the two through the output.

use crate::json;

use super::metadata::{EventMetadata, FieldDef, FieldType};
use super::payload::{MAX_VALUES, VALUE_COST, cost_budget};
use super::runtime_events::{Count, Kind, RuntimeField};

/// One field's value: its size and how its bytes read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Integer {
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    /// The stream's pointer size (4 or 8), unsigned.
    Pointer,
    /// Four bytes: `true` when not zero.
    Bool32,
}

/// Keys up to this long are copied as this many bytes, one fixed-size move instead of a
/// `memcpy` call of their length; [`FlatLayout::keys`] is padded with as many after the last.
const KEY_COPY_BYTES: usize = 32;

#[derive(Debug, Clone, Copy)]
struct Field {
    /// Where the field's key ends in [`FlatLayout::keys`] (it starts where the previous ends).
    key_end: usize,
    value: Integer,
}

/// A payload layout of integers only, compiled for writing its JSON object.
#[derive(Debug)]
pub struct FlatLayout {
    /// The keys one after another, each with what comes before it: `{"A":`, `,"B":`, …, then
    /// [`KEY_COPY_BYTES`] of padding.
    keys: Box<[u8]>,
    fields: Box<[Field]>,
    /// Bytes of the fields that are not pointers.
    fixed_bytes: usize,
    pointers: usize,
    /// What the general decoder charges for these fields (metadata field lists only; runtime
    /// layouts are not charged): the layout is used only within the payload's budget.
    cost: usize,
}

impl FlatLayout {
    /// The layout the general decoder would use for `meta`'s payloads, when it is flat: the
    /// metadata's field list, else (with a version: nettrace) its runtime layout.
    pub fn of(meta: &EventMetadata) -> Option<FlatLayout> {
        if meta.field_error.is_some() {
            return None;
        }
        if !meta.fields.is_empty() {
            return Self::of_fields(&meta.fields);
        }
        Self::of_runtime(meta.runtime_event?.layout_for(meta.version?))
    }

    fn of_fields(defs: &[FieldDef]) -> Option<FlatLayout> {
        let mut layout = Builder::default();
        for def in defs {
            let value = match def.ty {
                FieldType::Boolean => Integer::Bool32,
                FieldType::SByte => Integer::I8,
                FieldType::Byte => Integer::U8,
                FieldType::Int16 => Integer::I16,
                FieldType::UInt16 => Integer::U16,
                FieldType::Int32 => Integer::I32,
                FieldType::UInt32 => Integer::U32,
                FieldType::Int64 | FieldType::DateTime => Integer::I64,
                FieldType::UInt64 => Integer::U64,
                _ => return None,
            };
            // As the general decoder charges: the name, then the value.
            layout.cost += def.name.len() + VALUE_COST;
            layout.push(&def.name, value);
        }
        layout.build()
    }

    fn of_runtime(fields: &[RuntimeField]) -> Option<FlatLayout> {
        let mut layout = Builder::default();
        for field in fields {
            if field.count != Count::One || field.map.is_some() {
                return None;
            }
            let value = match field.kind {
                Kind::U8 => Integer::U8,
                Kind::U16 => Integer::U16,
                Kind::U32 => Integer::U32,
                Kind::U64 => Integer::U64,
                Kind::I8 => Integer::I8,
                Kind::I16 => Integer::I16,
                Kind::I32 => Integer::I32,
                Kind::I64 => Integer::I64,
                Kind::Pointer => Integer::Pointer,
                Kind::Bool32 => Integer::Bool32,
                _ => return None,
            };
            layout.push(field.name, value);
        }
        layout.build()
    }

    /// Appends `payload` as its JSON object; `false` (and nothing written) when the payload is
    /// not exactly this layout's length or passes its cost budget: the general decoder's case.
    pub fn write_json(&self, payload: &[u8], pointer_size: u32, out: &mut Vec<u8>) -> bool {
        let pointer = match pointer_size {
            4 => 4,
            8 => 8,
            _ => return false,
        };
        if payload.len() != self.fixed_bytes + self.pointers * pointer
            || self.cost > cost_budget(payload.len())
        {
            return false;
        }
        // Keys, at most 20 digits or `false` a value, the closing brace.
        out.reserve(self.keys.len() + 20 * self.fields.len() + 1);
        let (mut key_start, mut at) = (0, 0);
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
                Integer::U8 => {
                    json::push_u64(out, u8::from_le_bytes(take(payload, &mut at)).into())
                }
                Integer::U16 => {
                    json::push_u64(out, u16::from_le_bytes(take(payload, &mut at)).into());
                }
                Integer::U32 => {
                    json::push_u64(out, u32::from_le_bytes(take(payload, &mut at)).into());
                }
                Integer::U64 => json::push_u64(out, u64::from_le_bytes(take(payload, &mut at))),
                Integer::I8 => {
                    json::push_i64(out, i8::from_le_bytes(take(payload, &mut at)).into())
                }
                Integer::I16 => {
                    json::push_i64(out, i16::from_le_bytes(take(payload, &mut at)).into());
                }
                Integer::I32 => {
                    json::push_i64(out, i32::from_le_bytes(take(payload, &mut at)).into());
                }
                Integer::I64 => json::push_i64(out, i64::from_le_bytes(take(payload, &mut at))),
                Integer::Pointer if pointer == 4 => {
                    json::push_u64(out, u32::from_le_bytes(take(payload, &mut at)).into());
                }
                Integer::Pointer => json::push_u64(out, u64::from_le_bytes(take(payload, &mut at))),
                Integer::Bool32 => {
                    json::push_bool(out, u32::from_le_bytes(take(payload, &mut at)) != 0);
                }
            }
        }
        out.push(b'}');
        true
    }

    /// The most bytes `meta`'s compiled layout can hold in memory, whether compiled yet or not
    /// (the metadata budgets charge it): every top-level field as a field, its key escaped (at
    /// most 6 bytes a byte) with its quotes, colon and separator, and the keys' padding.
    pub fn max_heap_bytes(meta: &EventMetadata) -> usize {
        let per_field = |name: &str| 6 * name.len() + 4 + size_of::<Field>();
        let fields: usize = if meta.fields.is_empty() {
            let layout = meta.runtime_event.zip(meta.version).map(|(e, v)| e.layout_for(v));
            layout.unwrap_or_default().iter().map(|f| per_field(f.name)).sum()
        } else {
            meta.fields.iter().map(|d| per_field(&d.name)).sum()
        };
        size_of::<FlatLayout>() + KEY_COPY_BYTES + fields
    }
}

/// The `N` bytes at `at` (the caller checked the payload's length), `at` moved past them.
fn take<const N: usize>(payload: &[u8], at: &mut usize) -> [u8; N] {
    let bytes = payload[*at..*at + N].try_into().expect("a slice of N bytes");
    *at += N;
    bytes
}

#[derive(Default)]
struct Builder {
    keys: Vec<u8>,
    fields: Vec<Field>,
    fixed_bytes: usize,
    pointers: usize,
    cost: usize,
}

impl Builder {
    fn push(&mut self, name: &str, value: Integer) {
        self.keys.push(if self.fields.is_empty() { b'{' } else { b',' });
        json::push_key(&mut self.keys, name);
        self.fields.push(Field { key_end: self.keys.len(), value });
        match value {
            Integer::U8 | Integer::I8 => self.fixed_bytes += 1,
            Integer::U16 | Integer::I16 => self.fixed_bytes += 2,
            Integer::U32 | Integer::I32 | Integer::Bool32 => self.fixed_bytes += 4,
            Integer::U64 | Integer::I64 => self.fixed_bytes += 8,
            Integer::Pointer => self.pointers += 1,
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
            cost: self.cost,
        })
    }
}
