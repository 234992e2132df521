//! Parser for tracefs `format` files (`events/<sys>/<event>/format`, `events/header_page`).
//!
//! The text comes from the kernel but is still checked: offsets and sizes are what every record
//! decoder trusts for bounds, so a malformed line is an error with its line number.

use thiserror::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DynamicKind {
    /// `__data_loc`: u32 `len << 16 | offset`, offset from the start of the record.
    DataLoc,
    /// `__rel_loc`: u32 `len << 16 | offset`, offset from the end of the 4-byte field.
    RelLoc,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldFormat {
    pub name: String,
    /// Declared type without the field name, e.g. `unsigned long`, `__data_loc char[]`, `char`.
    pub type_name: String,
    /// `N` of a fixed array declaration `name[N]` (informative; `size` is authoritative).
    pub array_len: Option<usize>,
    pub offset: usize,
    pub size: usize,
    pub signed: bool,
    /// Part of the common header (`common_*`, before the blank line).
    pub common: bool,
    pub dynamic: Option<DynamicKind>,
    /// The element type of an array or dynamic field, read from `type_name` once here rather
    /// than for every record decoded.
    pub element: Element,
}

impl FieldFormat {
    /// One past the last byte of the field's fixed part.
    pub fn end(&self) -> usize {
        self.offset + self.size
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventFormat {
    pub name: String,
    pub id: u16,
    /// Common fields first, then the event's own fields, in file order. Read-only
    /// ([`fields`](Self::fields)): `fixed_size` is derived from them once.
    fields: Vec<FieldFormat>,
    /// The largest field end, worked out at parse: every record is checked against it.
    fixed_size: usize,
    pub print_fmt: String,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("format file has no `name:` line")]
    MissingName,
    #[error("format file has no `ID:` line")]
    MissingId,
    #[error("line {line}: invalid event id {value:?}")]
    BadId { line: usize, value: String },
    #[error("line {line}: invalid field line: {reason}")]
    BadField { line: usize, reason: &'static str },
}

impl EventFormat {
    pub fn parse(text: &str) -> Result<EventFormat, FormatError> {
        let mut name = None;
        let mut id = None;
        let mut fields = Vec::new();
        let mut print_fmt = String::new();
        // The blank line after the common fields separates them from the event's fields.
        let mut in_common = true;
        let mut seen_field = false;
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = raw.trim();
            if let Some(v) = line.strip_prefix("name:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("ID:") {
                let v = v.trim();
                id = Some(
                    v.parse::<u16>()
                        .map_err(|_| FormatError::BadId { line: line_no, value: v.to_string() })?,
                );
            } else if line.starts_with("field:") {
                let mut f = parse_field_line(line)
                    .map_err(|reason| FormatError::BadField { line: line_no, reason })?;
                f.common = in_common;
                fields.push(f);
                seen_field = true;
            } else if line.is_empty() && seen_field {
                in_common = false;
            } else if let Some(v) = line.strip_prefix("print fmt:") {
                print_fmt = v.trim().to_string();
            }
        }
        Ok(EventFormat {
            name: name.ok_or(FormatError::MissingName)?,
            id: id.ok_or(FormatError::MissingId)?,
            fixed_size: fields.iter().map(FieldFormat::end).max().unwrap_or(0),
            fields,
            print_fmt,
        })
    }

    /// Common fields first, then the event's own fields, in file order.
    pub fn fields(&self) -> &[FieldFormat] {
        &self.fields
    }

    pub fn field(&self, name: &str) -> Option<&FieldFormat> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The event's own fields (without `common_*`).
    pub fn event_fields(&self) -> impl Iterator<Item = &FieldFormat> {
        self.fields.iter().filter(|f| !f.common)
    }

    /// Size of the fixed part of a record (largest field end).
    pub fn fixed_size(&self) -> usize {
        self.fixed_size
    }
}

/// Parses `field:<decl>;\toffset:<o>;\tsize:<s>;\tsigned:<0|1>;` (the `signed` part is optional,
/// as in `header_page`). Returns the field with `common = false`.
pub fn parse_field_line(line: &str) -> Result<FieldFormat, &'static str> {
    let rest = line.trim().strip_prefix("field:").ok_or("missing `field:`")?;
    let mut parts = rest.split(';').map(str::trim).filter(|p| !p.is_empty());
    let decl = parts.next().ok_or("missing declaration")?;
    let (mut offset, mut size, mut signed) = (None, None, false);
    for part in parts {
        let (key, value) = part.split_once(':').ok_or("attribute without `:`")?;
        let value = value.trim();
        match key.trim() {
            "offset" => {
                offset = Some(value.parse::<usize>().map_err(|_| "offset is not a number")?)
            }
            "size" => size = Some(value.parse::<usize>().map_err(|_| "size is not a number")?),
            "signed" => signed = value == "1",
            _ => {}
        }
    }
    let (type_name, name, array_len) = split_declaration(decl)?;
    let dynamic = if type_name.starts_with("__data_loc") {
        Some(DynamicKind::DataLoc)
    } else if type_name.starts_with("__rel_loc") {
        Some(DynamicKind::RelLoc)
    } else {
        None
    };
    let offset = offset.ok_or("missing offset")?;
    let size = size.ok_or("missing size")?;
    if dynamic.is_some() && size != 4 {
        return Err("dynamic field whose size is not 4");
    }
    offset.checked_add(size).ok_or("offset + size overflows")?;
    let element = element_type(&type_name);
    Ok(FieldFormat {
        name,
        type_name,
        array_len,
        offset,
        size,
        signed,
        common: false,
        dynamic,
        element,
    })
}

/// What one element of an array or dynamic field is, from its declared type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    Char,
    Byte,
    Int { size: usize, signed: bool },
    Unknown,
}

/// The element type of an array or dynamic field from its declared type.
fn element_type(type_name: &str) -> Element {
    let base = type_name
        .trim_start_matches("__data_loc")
        .trim_start_matches("__rel_loc")
        .trim()
        .trim_end_matches("[]")
        .trim_start_matches("const ")
        .trim();
    if base.ends_with('*') {
        return Element::Int { size: 8, signed: false };
    }
    let (size, signed) = match base {
        "char" => return Element::Char,
        "u8" | "__u8" | "unsigned char" | "uint8_t" => return Element::Byte,
        "s8" | "__s8" | "signed char" | "int8_t" => (1, true),
        "u16" | "__u16" | "unsigned short" | "uint16_t" | "umode_t" => (2, false),
        "s16" | "__s16" | "short" | "int16_t" => (2, true),
        "u32" | "__u32" | "unsigned int" | "unsigned" | "uint32_t" | "gfp_t" => (4, false),
        "s32" | "__s32" | "int" | "int32_t" | "pid_t" => (4, true),
        "u64" | "__u64" | "unsigned long" | "unsigned long long" | "uint64_t" | "size_t" => {
            (8, false)
        }
        "s64" | "__s64" | "long" | "long long" | "int64_t" | "ssize_t" | "loff_t" => (8, true),
        _ => return Element::Unknown,
    };
    Element::Int { size, signed }
}

/// `unsigned char comm[16]` → (`unsigned char`, `comm`, Some(16)); `__data_loc char[] f` →
/// (`__data_loc char[]`, `f`, None).
fn split_declaration(decl: &str) -> Result<(String, String, Option<usize>), &'static str> {
    let decl = decl.trim();
    // The name starts after the last separator, which may be a multi-byte whitespace character.
    let (at, separator) = decl
        .char_indices()
        .rev()
        .find(|&(_, c)| c.is_whitespace() || c == '*')
        .ok_or("declaration without a type")?;
    let (ty, last) = decl.split_at(at + separator.len_utf8());
    let (name, array_len) = match last.split_once('[') {
        Some((n, rest)) => {
            let len = rest.strip_suffix(']').ok_or("unterminated array length")?;
            (n, if len.is_empty() { None } else { len.parse().ok() })
        }
        None => (last, None),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("invalid field name");
    }
    Ok((ty.trim().to_string(), name.to_string(), array_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from this kernel (6.18): /sys/kernel/tracing/events/sched/sched_process_fork/format
    const FORK: &str = "name: sched_process_fork
ID: 366
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;

print fmt: \"comm=%s pid=%d child_comm=%s child_pid=%d\", __get_str(parent_comm), REC->parent_pid, __get_str(child_comm), REC->child_pid
";

    #[test]
    fn parses_real_format_file() {
        let f = EventFormat::parse(FORK).unwrap();
        assert_eq!(f.name, "sched_process_fork");
        assert_eq!(f.id, 366);
        assert_eq!(f.fields.len(), 8);
        assert_eq!(f.fields.iter().filter(|f| f.common).count(), 4);
        let pid = f.field("common_pid").unwrap();
        assert_eq!((pid.offset, pid.size, pid.signed, pid.common), (4, 4, true, true));
        let comm = f.field("parent_comm").unwrap();
        assert_eq!(comm.type_name, "__data_loc char[]");
        assert_eq!(comm.dynamic, Some(DynamicKind::DataLoc));
        assert!(!comm.common);
        let child = f.field("child_pid").unwrap();
        assert_eq!((child.offset, child.size, child.type_name.as_str()), (20, 4, "pid_t"));
        assert_eq!(f.fixed_size(), 24);
        assert!(f.print_fmt.starts_with("\"comm=%s"));
        assert_eq!(f.event_fields().count(), 4);
    }

    #[test]
    fn parses_arrays_pointers_and_rel_loc() {
        let a = parse_field_line("field:char comm[16];\toffset:8;\tsize:16;\tsigned:0;").unwrap();
        assert_eq!(
            (a.type_name.as_str(), a.name.as_str(), a.array_len),
            ("char", "comm", Some(16))
        );
        let p =
            parse_field_line("field:const char * uname;\toffset:16;\tsize:8;\tsigned:0;").unwrap();
        assert_eq!((p.type_name.as_str(), p.name.as_str()), ("const char *", "uname"));
        let r = parse_field_line("field:__rel_loc u8[] payload;\toffset:15;\tsize:4;\tsigned:0;")
            .unwrap();
        assert_eq!(r.dynamic, Some(DynamicKind::RelLoc));
        // header_page lines carry no `signed:` before 3.x kernels; accept them.
        let h = parse_field_line("field: u64 timestamp;\toffset:0;\tsize:8;").unwrap();
        assert_eq!((h.name.as_str(), h.size, h.signed), ("timestamp", 8, false));
    }

    #[test]
    fn rejects_malformed_lines_with_line_numbers() {
        let bad = "name: x\nID: 5\nformat:\n\tfield:int a;\toffset:zz;\tsize:4;\tsigned:1;\n";
        assert_eq!(
            EventFormat::parse(bad),
            Err(FormatError::BadField { line: 4, reason: "offset is not a number" })
        );
        assert_eq!(
            EventFormat::parse("name: x\nID: 70000\n"),
            Err(FormatError::BadId { line: 2, value: "70000".into() })
        );
        assert_eq!(EventFormat::parse("ID: 1\n"), Err(FormatError::MissingName));
        assert_eq!(
            parse_field_line("field:__data_loc char[] f;\toffset:8;\tsize:8;\tsigned:0;"),
            Err("dynamic field whose size is not 4")
        );
        assert_eq!(
            parse_field_line("field:int;\toffset:8;\tsize:4;"),
            Err("declaration without a type")
        );
        assert_eq!(
            parse_field_line(&format!("field:int a;\toffset:{};\tsize:4;", usize::MAX)),
            Err("offset + size overflows")
        );
        // A multi-byte whitespace character (U+00A0) as the separator: split after it, whole
        // (found by the proc_and_tracefs_text fuzz target: a split inside it panicked).
        let nbsp = parse_field_line("field:u64\u{a0}ts;\toffset:0;\tsize:8;").unwrap();
        assert_eq!((nbsp.type_name.as_str(), nbsp.name.as_str()), ("u64", "ts"));
        assert_eq!(
            parse_field_line("field:u64\u{a0}\u{e9};\toffset:0;\tsize:8;"),
            Err("invalid field name")
        );
    }
}
