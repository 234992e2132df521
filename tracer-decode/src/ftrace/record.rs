//! Trace records (`struct trace_entry` + event fields) decoded with their `format` file.
//!
//! Offsets and sizes come from the format; every access is bounds-checked against the record,
//! including the targets of `__data_loc` / `__rel_loc` dynamic fields.

use crate::json::{self, WriteJson};
use crate::ordered::OrderedMap;
use crate::work;
use thiserror::Error;

use super::format::{DynamicKind, Element, EventFormat, FieldFormat};

/// Size of `struct trace_entry` (common_type, common_flags, common_preempt_count, common_pid).
pub const COMMON_HEADER_SIZE: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonFields {
    /// Event id (`events/<sys>/<name>/id`).
    pub common_type: u16,
    pub flags: u8,
    pub preempt_count: u8,
    /// Thread id of the writer.
    pub pid: i32,
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RecordError {
    #[error("record of {len} bytes is shorter than {need} bytes ({what})")]
    TooShort { len: usize, need: usize, what: &'static str },
    #[error(
        "dynamic field `{field}` points at {start}..{end}, outside the {record_len}-byte record"
    )]
    DynamicOutOfRecord { field: String, start: usize, end: usize, record_len: usize },
}

pub fn common_fields(record: &[u8]) -> Result<CommonFields, RecordError> {
    let h: &[u8; COMMON_HEADER_SIZE] = record
        .get(..COMMON_HEADER_SIZE)
        .and_then(|s| s.try_into().ok())
        .ok_or(RecordError::TooShort {
            len: record.len(),
            need: COMMON_HEADER_SIZE,
            what: "common header",
        })?;
    Ok(CommonFields {
        common_type: u16::from_le_bytes([h[0], h[1]]),
        flags: h[2],
        preempt_count: h[3],
        pid: i32::from_le_bytes([h[4], h[5], h[6], h[7]]),
    })
}

/// A decoded field value; written as plain JSON ([`WriteJson`]: numbers, strings, arrays; byte
/// arrays as a lowercase hex string).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldValue {
    Signed(i64),
    Unsigned(u64),
    Str(String),
    Bytes(Vec<u8>),
    Array(Vec<FieldValue>),
}

impl WriteJson for FieldValue {
    fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            FieldValue::Signed(v) => json::push_i64(out, *v),
            FieldValue::Unsigned(v) => json::push_u64(out, *v),
            FieldValue::Str(v) => json::push_str(out, v),
            FieldValue::Bytes(bytes) => json::push_hex_string(out, bytes),
            FieldValue::Array(items) => items.write_json(out),
        }
    }
}

/// serde_json's rendering of a [`FieldValue`]: the reference the direct writer is tested against.
#[cfg(any(test, feature = "serde-reference"))]
impl serde::Serialize for FieldValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FieldValue::Signed(v) => s.serialize_i64(*v),
            FieldValue::Unsigned(v) => s.serialize_u64(*v),
            FieldValue::Str(v) => s.serialize_str(v),
            FieldValue::Bytes(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                s.serialize_str(&hex)
            }
            FieldValue::Array(items) => serde::Serialize::serialize(items, s),
        }
    }
}

/// The event's own fields in format order; written as a JSON object in that order.
pub type Fields<'f> = OrderedMap<&'f str, FieldValue>;

/// Decodes the event's own fields (not `common_*`) of `record` with `format`.
/// `record` may carry trailing alignment padding (the ring buffer rounds to 4 bytes).
pub fn decode_fields<'f>(
    format: &'f EventFormat,
    record: &[u8],
) -> Result<Fields<'f>, RecordError> {
    let need = format.fixed_size();
    if record.len() < need {
        return Err(RecordError::TooShort { len: record.len(), need, what: "format's fixed size" });
    }
    let mut out = Vec::new();
    for field in format.event_fields() {
        let value = match field.dynamic {
            Some(kind) => {
                let bytes = dynamic_bytes(field, kind, record)?;
                work::count(bytes.len());
                array_value(field, field.element, bytes, None)
            }
            // A flexible array member (`char buf[]`, size 0): the rest of the record.
            None if field.size == 0 => {
                work::count(record.len() - field.offset);
                array_value(field, field.element, &record[field.offset..], None)
            }
            None => {
                let bytes = &record[field.offset..field.end()];
                match field.array_len {
                    Some(n) => array_value(field, field.element, bytes, Some(n)),
                    None => scalar(bytes, field.signed)
                        .unwrap_or_else(|| FieldValue::Bytes(bytes.to_vec())),
                }
            }
        };
        // The field's fixed part; what a dynamic or flexible field points at is counted above.
        work::count(1 + field.size);
        out.push((field.name.as_str(), value));
    }
    Ok(OrderedMap(out))
}

/// The bytes a `__data_loc` / `__rel_loc` field points at.
pub fn dynamic_bytes<'r>(
    field: &FieldFormat,
    kind: DynamicKind,
    record: &'r [u8],
) -> Result<&'r [u8], RecordError> {
    let loc = record
        .get(field.offset..field.offset + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or(RecordError::TooShort {
            len: record.len(),
            need: field.offset + 4,
            what: "dynamic field",
        })?;
    let (offset, len) = ((loc & 0xffff) as usize, (loc >> 16) as usize);
    let start = match kind {
        DynamicKind::DataLoc => offset,
        DynamicKind::RelLoc => field.offset + 4 + offset,
    };
    let end = start + len;
    record.get(start..end).ok_or_else(|| RecordError::DynamicOutOfRecord {
        field: field.name.clone(),
        start,
        end,
        record_len: record.len(),
    })
}

fn array_value(
    field: &FieldFormat,
    element: Element,
    bytes: &[u8],
    declared_len: Option<usize>,
) -> FieldValue {
    match element {
        Element::Char => match text(bytes, declared_len.is_none()) {
            Some(s) => FieldValue::Str(s),
            None => FieldValue::Bytes(bytes.to_vec()),
        },
        Element::Byte | Element::Unknown if declared_len.is_none() => {
            FieldValue::Bytes(bytes.to_vec())
        }
        _ => {
            // Fixed arrays: the element size is authoritative from size / N.
            let size = match (element, declared_len) {
                (_, Some(n)) if n > 0 && field.size.is_multiple_of(n) => field.size / n,
                (Element::Int { size, .. }, _) => size,
                _ => 1,
            };
            let signed = matches!(element, Element::Int { signed: true, .. });
            if size == 1 && !signed {
                return FieldValue::Bytes(bytes.to_vec());
            }
            FieldValue::Array(
                bytes
                    .chunks_exact(size)
                    .map(|c| scalar(c, signed).unwrap_or_else(|| FieldValue::Bytes(c.to_vec())))
                    .collect(),
            )
        }
    }
}

/// A C string (up to the first NUL) when it is valid UTF-8. Variable-length char data (dynamic
/// fields, flexible arrays) is text only when NULs follow its first NUL, up to the last 3 bytes
/// (alignment padding, not zeroed in mapped pages); otherwise it is binary (e.g.
/// `ftrace:raw_data`'s buf).
fn text(bytes: &[u8], variable: bool) -> Option<String> {
    let nul = bytes.iter().position(|&b| b == 0);
    let end = match nul {
        Some(i)
            if variable
                && bytes[i..bytes.len().saturating_sub(3).max(i)].iter().any(|&b| b != 0) =>
        {
            return None;
        }
        Some(i) => i,
        None if variable => return None,
        None => bytes.len(),
    };
    std::str::from_utf8(&bytes[..end]).ok().map(str::to_string)
}

fn scalar(b: &[u8], signed: bool) -> Option<FieldValue> {
    let v = match b.len() {
        1 => u64::from(b[0]),
        2 => u64::from(u16::from_le_bytes(b.try_into().ok()?)),
        4 => u64::from(u32::from_le_bytes(b.try_into().ok()?)),
        8 => u64::from_le_bytes(b.try_into().ok()?),
        _ => return None,
    };
    Some(if signed {
        let bits = 64 - 8 * b.len() as u32;
        FieldValue::Signed(((v << bits) as i64) >> bits)
    } else {
        FieldValue::Unsigned(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields as tracer writes them.
    fn json_of(fields: &Fields) -> String {
        let mut out = Vec::new();
        fields.write_json(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_are_written_byte_for_byte_as_serde_json_writes_them() {
        let strings = ["", "plain", "q\"b\\\u{0}\u{1f}\n\u{7f}", "\u{2028}😀\u{fffd}"];
        let mut fields: Fields = OrderedMap(
            strings.iter().map(|s| ("s\"\u{1}", FieldValue::Str((*s).into()))).collect(),
        );
        fields
            .push("i", FieldValue::Signed(i64::MIN))
            .push("u", FieldValue::Unsigned(u64::MAX))
            .push("bytes", FieldValue::Bytes(vec![0, 0x7f, 0x80, 0xff]))
            .push("no_bytes", FieldValue::Bytes(Vec::new()))
            .push("empty", FieldValue::Array(Vec::new()))
            .push(
                "nested",
                FieldValue::Array(vec![
                    FieldValue::Array(vec![FieldValue::Signed(-1)]),
                    FieldValue::Str("\\".into()),
                ]),
            );
        assert_eq!(json_of(&fields), serde_json::to_string(&fields).unwrap());
        assert_eq!(json_of(&Fields::default()), "{}");
    }

    const COMMON: &str = "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;
";

    fn format(name: &str, id: u16, fields: &str) -> EventFormat {
        EventFormat::parse(&format!(
            "name: {name}\nID: {id}\nformat:\n{COMMON}\n{fields}\nprint fmt: \"\"\n"
        ))
        .unwrap()
    }

    fn header(id: u16, pid: i32) -> Vec<u8> {
        let mut r = id.to_le_bytes().to_vec();
        r.extend([0x01, 0x02]);
        r.extend(pid.to_le_bytes());
        r
    }

    #[test]
    fn data_loc_string_and_signed_ints() {
        // sched_process_exec on 6.18.
        let f = format(
            "sched_process_exec",
            365,
            "\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:pid_t old_pid;\toffset:16;\tsize:4;\tsigned:1;
",
        );
        let mut r = header(365, 77);
        r.extend(((10u32 << 16) | 20).to_le_bytes());
        r.extend(77i32.to_le_bytes());
        r.extend((-1i32).to_le_bytes());
        r.extend(b"/bin/true\0\0\0\0\0");
        let c = common_fields(&r).unwrap();
        assert_eq!(c, CommonFields { common_type: 365, flags: 1, preempt_count: 2, pid: 77 });
        let fields = decode_fields(&f, &r).unwrap();
        assert_eq!(json_of(&fields), r#"{"filename":"/bin/true","pid":77,"old_pid":-1}"#);
    }

    #[test]
    fn rel_loc_arrays_and_flex_buffers() {
        // The user_events layout of the .NET runtime (docs/protocol/user_events.md §7.2).
        let f = format(
            "dotnet",
            1000,
            "\tfield:u8 version;\toffset:8;\tsize:1;\tsigned:0;
\tfield:u16 event_id;\toffset:9;\tsize:2;\tsigned:0;
\tfield:__rel_loc u8[] extension;\toffset:11;\tsize:4;\tsigned:0;
\tfield:__rel_loc u8[] payload;\toffset:15;\tsize:4;\tsigned:0;
",
        );
        let mut r = header(1000, 5);
        r.push(1);
        r.extend(513u16.to_le_bytes());
        r.extend(((2u32 << 16) | 4).to_le_bytes()); // extension at 15 + 4 = 19, 2 bytes
        r.extend(((3u32 << 16) | 2).to_le_bytes()); // payload at 19 + 2 = 21, 3 bytes
        r.extend([0xaa, 0xbb, 1, 2, 3]);
        let fields = decode_fields(&f, &r).unwrap();
        assert_eq!(fields.get("event_id"), Some(&FieldValue::Unsigned(513)));
        assert_eq!(fields.get("extension"), Some(&FieldValue::Bytes(vec![0xaa, 0xbb])));
        assert_eq!(fields.get("payload"), Some(&FieldValue::Bytes(vec![1, 2, 3])));

        // ftrace:raw_data (trace_marker_raw): `char buf[]` of size 0 takes the rest.
        let raw = format(
            "raw_data",
            19,
            "\tfield:unsigned int id;\toffset:8;\tsize:4;\tsigned:0;
\tfield:char buf[];\toffset:12;\tsize:0;\tsigned:0;
",
        );
        let mut r = header(19, 5);
        r.extend(7u32.to_le_bytes());
        r.extend([0xff, 0x00, 0x10, 0x20]);
        let fields = decode_fields(&raw, &r).unwrap();
        assert_eq!(json_of(&fields), r#"{"id":7,"buf":"ff001020"}"#);
    }

    #[test]
    fn fixed_arrays_and_wide_fields() {
        let f = format(
            "sys_enter",
            21,
            "\tfield:long id;\toffset:8;\tsize:8;\tsigned:1;
\tfield:unsigned long args[2];\toffset:16;\tsize:16;\tsigned:0;
\tfield:char comm[8];\toffset:32;\tsize:8;\tsigned:0;
\tfield:int dfd;\toffset:40;\tsize:8;\tsigned:0;
",
        );
        let mut r = header(21, 1);
        r.extend((-2i64).to_le_bytes());
        r.extend(u64::MAX.to_le_bytes());
        r.extend(3u64.to_le_bytes());
        r.extend(b"bash\0\0\0\0");
        r.extend(0xffff_ff9cu64.to_le_bytes());
        let fields = decode_fields(&f, &r).unwrap();
        assert_eq!(
            json_of(&fields),
            r#"{"id":-2,"args":[18446744073709551615,3],"comm":"bash","dfd":4294967196}"#
        );
    }

    #[test]
    fn short_records_and_bad_locations_are_errors() {
        let f = format(
            "e",
            1,
            "\tfield:__data_loc char[] s;\toffset:8;\tsize:4;\tsigned:0;
",
        );
        assert_eq!(
            decode_fields(&f, &[0; 10]),
            Err(RecordError::TooShort { len: 10, need: 12, what: "format's fixed size" })
        );
        let mut r = header(1, 1);
        r.extend(((100u32 << 16) | 12).to_le_bytes());
        assert_eq!(
            decode_fields(&f, &r),
            Err(RecordError::DynamicOutOfRecord {
                field: "s".into(),
                start: 12,
                end: 112,
                record_len: 12
            })
        );
        assert!(common_fields(&[0; 7]).is_err());
    }
}
