//! What both payload decoders (the general one, `payload`, and the compiled layouts,
//! `flat_layout`) share: how a fixed-size integer field reads, the values that are not arrays
//! or objects and how they are written, and what decoding may cost.

use crate::json;

use super::cursor::Cursor;
use super::fields::FieldType;
use super::runtime_events::{Kind, ValueMap};

/// Cap on values decoded from one payload, so nested arrays cannot multiply work. Metadata
/// refuses zero-size types, so every value also consumes payload bytes (values ≤ max_depth ×
/// payload length).
pub const MAX_VALUES: usize = 65_536;
/// Code units a payload string may have: no limit of its own (the payload's length bounds it),
/// so a string ends only at its NUL or as `UnterminatedString`.
pub(crate) const MAX_STRING_UNITS: usize = usize::MAX / 2;

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

/// One decoded value that is not an array or object, handed to a sink (`payload::Sink`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scalar<'v> {
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(&'v str),
    Guid([u8; 16]),
    /// A manifest value map's name for the value.
    Enum {
        value: u64,
        name: &'static str,
    },
    /// A value of a manifest bit map.
    Flags {
        value: u64,
        map: &'static ValueMap,
    },
    Bytes(&'v [u8]),
}

impl<'v> Scalar<'v> {
    /// The integer behind an integer value (as [`Value::as_u64`] reads it).
    pub(crate) fn integer(self) -> Option<u64> {
        match self {
            Scalar::U64(v) => Some(v),
            Scalar::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a field with manifest map `map` shows it: a bit map's bits, a value map's
    /// name; a value without a name (or not an integer) as it is.
    pub(crate) fn mapped(self, map: &'static ValueMap) -> Scalar<'v> {
        match self.integer() {
            Some(value) if map.bitmap => Scalar::Flags { value, map },
            Some(value) => match map.name(value) {
                Some(name) => Scalar::Enum { value, name },
                None => self,
            },
            None => self,
        }
    }

    pub(crate) fn write_json(self, out: &mut Vec<u8>) {
        match self {
            Scalar::Bool(v) => json::push_bool(out, v),
            Scalar::I64(v) => json::push_i64(out, v),
            Scalar::U64(v) => json::push_u64(out, v),
            Scalar::F64(v) => json::push_f64(out, v),
            Scalar::Str(v) => json::push_str(out, v),
            Scalar::Guid(g) => push_guid(out, &g),
            Scalar::Enum { name, .. } => json::push_str(out, name),
            Scalar::Flags { value, map } => {
                push_flags(out, map.bit_names(value), map.unnamed(value))
            }
            Scalar::Bytes(bytes) => json::push_hex_string(out, bytes),
        }
    }
}

/// A GUID as a JSON string (hex digits and dashes: nothing to escape).
pub(crate) fn push_guid(out: &mut Vec<u8>, g: &[u8; 16]) {
    out.push(b'"');
    out.extend_from_slice(&guid_text(g));
    out.push(b'"');
}

/// A bit map's value as one string: the names joined by ` | `, then the unnamed bits in hex
/// (also when no bit has a name).
pub(crate) fn push_flags<'n>(
    out: &mut Vec<u8>,
    names: impl Iterator<Item = &'n str>,
    unnamed: u64,
) {
    out.push(b'"');
    let mut named = false;
    for name in names {
        if named {
            out.extend_from_slice(b" | ");
        }
        json::push_escaped(out, name);
        named = true;
    }
    if unnamed != 0 || !named {
        if named {
            out.extend_from_slice(b" | ");
        }
        json::push_hex_digits(out, unnamed);
    }
    out.push(b'"');
}

/// A fixed-size integer field (or a 4-byte boolean), as both decoders read it: this one and
/// the compiled layouts ([`FlatLayout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Integer {
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

impl Integer {
    /// How a metadata field of type `ty` reads, when it is an integer.
    pub(crate) fn of_field_type(ty: &FieldType) -> Option<Integer> {
        Some(match ty {
            FieldType::Boolean => Integer::Bool32,
            FieldType::SByte => Integer::I8,
            FieldType::Byte => Integer::U8,
            FieldType::Int16 => Integer::I16,
            FieldType::UInt16 => Integer::U16,
            FieldType::Int32 => Integer::I32,
            FieldType::UInt32 => Integer::U32,
            FieldType::Int64 | FieldType::DateTime => Integer::I64,
            FieldType::UInt64 => Integer::U64,
            FieldType::Object(_)
            | FieldType::Array(_)
            | FieldType::String
            | FieldType::Char16
            | FieldType::Single
            | FieldType::Double
            | FieldType::Guid => return None,
        })
    }

    /// How a runtime field of `kind` reads, when it is an integer.
    pub(crate) fn of_kind(kind: Kind) -> Option<Integer> {
        Some(match kind {
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
            Kind::F32
            | Kind::F64
            | Kind::Guid
            | Kind::Utf16Z
            | Kind::AnsiZ
            | Kind::Binary
            | Kind::Struct(_) => return None,
        })
    }

    /// Its size in bytes; `None` for [`Integer::Pointer`] (the stream's).
    pub(crate) fn size(self) -> Option<usize> {
        match self {
            Integer::U8 | Integer::I8 => Some(1),
            Integer::U16 | Integer::I16 => Some(2),
            Integer::U32 | Integer::I32 | Integer::Bool32 => Some(4),
            Integer::U64 | Integer::I64 => Some(8),
            Integer::Pointer => None,
        }
    }

    /// The value at the cursor (a pointer of `pointer` bytes: 4, else 8); `None` past the end.
    #[inline(always)]
    pub(crate) fn read(self, cur: &mut Cursor<'_>, pointer: usize) -> Option<Scalar<'static>> {
        Some(match self {
            Integer::U8 => Scalar::U64(cur.u8()?.into()),
            Integer::U16 => Scalar::U64(cur.u16()?.into()),
            Integer::U32 => Scalar::U64(cur.u32()?.into()),
            Integer::U64 => Scalar::U64(cur.u64()?),
            Integer::I8 => Scalar::I64(i8::from_le_bytes(cur.array()?).into()),
            Integer::I16 => Scalar::I64(i16::from_le_bytes(cur.array()?).into()),
            Integer::I32 => Scalar::I64(i32::from_le_bytes(cur.array()?).into()),
            Integer::I64 => Scalar::I64(cur.i64()?),
            Integer::Pointer if pointer == 4 => Scalar::U64(cur.u32()?.into()),
            Integer::Pointer => Scalar::U64(cur.u64()?),
            Integer::Bool32 => Scalar::Bool(cur.u32()? != 0),
        })
    }
}
