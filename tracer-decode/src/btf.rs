//! Reads struct member offsets from BPF Type Format (BTF) bytes, such as the kernel's own
//! `/sys/kernel/btf/vmlinux`. The detection programs have no CO-RE relocations, so user space
//! finds the few offsets they follow (task → files → file → dentry name) here and passes them
//! in their configuration (docs/protocol/bpf-detection.md §7, which also gives the format).
//!
//! Only what an offset lookup needs is decoded: the header, the string section and each type's
//! kind, name, size and (for structs and unions) members. Every type record is walked once to
//! index it; the index is the only allocation (4 bytes per type) besides what a member lookup
//! remembers of the anonymous structs and unions it searched.
use std::collections::HashMap;
use std::fmt;

use crate::work;

/// `btf_header.magic`.
const BTF_MAGIC: u16 = 0xEB9F;
/// Byte length of `struct btf_header` (version 1).
const HEADER_LEN: usize = 24;
/// `struct btf_type`: name_off, info, size-or-type.
const TYPE_LEN: usize = 12;
/// Nested anonymous structs and unions followed when looking for a member (the kernel's deepest
/// is 3 or 4; the bound keeps a hostile, cyclic input from recursing without end).
const MAX_ANONYMOUS_DEPTH: usize = 8;
/// Modifiers and typedefs followed to reach a member's struct type (same reason).
const MAX_TYPE_CHAIN: usize = 16;

/// BTF kinds used here (`BTF_KIND_*` of `include/uapi/linux/btf.h`); public for `encode`.
pub const KIND_INT: u32 = 1;
pub const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
pub const KIND_STRUCT: u32 = 4;
pub const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
pub const KIND_FWD: u32 = 7;
pub const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
pub const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
pub const KIND_FUNC: u32 = 12;
pub const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;
const KIND_MAX: u32 = 19;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BtfError {
    /// Fewer bytes than a field at `offset` needs.
    Truncated {
        offset: usize,
    },
    BadMagic {
        magic: u16,
    },
    /// A section that does not lie inside the data (`offset` of the header field).
    BadSection {
        offset: usize,
    },
    /// A type record of a kind this format version does not define.
    UnknownKind {
        offset: usize,
        kind: u32,
    },
    /// No struct of that name.
    NoStruct {
        name: String,
    },
    /// The struct (or a struct it contains anonymously) has no member of that name.
    NoMember {
        structure: String,
        member: String,
    },
    /// A member that is a bitfield, or does not start on a byte.
    NotByteAligned {
        structure: String,
        member: String,
    },
    /// No typedef of that name.
    NoTypedef {
        name: String,
    },
    /// The typedef does not name a pointer to a function prototype.
    NotFunctionPointer {
        name: String,
    },
}

impl fmt::Display for BtfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BtfError::Truncated { offset } => write!(f, "BTF data ends at byte {offset}"),
            BtfError::BadMagic { magic } => write!(f, "not BTF (magic {magic:#06x})"),
            BtfError::BadSection { offset } => {
                write!(f, "BTF section at header byte {offset} lies outside the data")
            }
            BtfError::UnknownKind { offset, kind } => {
                write!(f, "unknown BTF kind {kind} at byte {offset}")
            }
            BtfError::NoStruct { name } => write!(f, "kernel BTF has no struct {name}"),
            BtfError::NoMember { structure, member } => {
                write!(f, "kernel BTF: struct {structure} has no member {member}")
            }
            BtfError::NotByteAligned { structure, member } => {
                write!(f, "kernel BTF: {structure}.{member} is not byte-aligned")
            }
            BtfError::NoTypedef { name } => write!(f, "kernel BTF has no typedef {name}"),
            BtfError::NotFunctionPointer { name } => {
                write!(f, "kernel BTF: typedef {name} is not a function pointer")
            }
        }
    }
}

impl std::error::Error for BtfError {}

/// Parsed BTF: the type and string sections and where each type record starts.
pub struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Byte offset in `types` of type id `i + 1` (id 0 is `void`).
    type_starts: Vec<u32>,
}

/// The fixed part of one type record.
#[derive(Clone, Copy)]
struct TypeRecord {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// Size (structs, unions, ints, enums) or the referenced type id (pointers, modifiers).
    size_or_type: u32,
    /// Offset in `types` of the record's kind-specific data.
    data: usize,
}

fn u16_at(data: &[u8], at: usize) -> Result<u16, BtfError> {
    let bytes = data.get(at..at + 2).ok_or(BtfError::Truncated { offset: at })?;
    Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    let bytes = data.get(at..at + 4).ok_or(BtfError::Truncated { offset: at })?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

/// `[start, start + len)` of a header-described section, checked against `data`.
fn section(data: &[u8], base: usize, header_field: usize) -> Result<&[u8], BtfError> {
    let start = u32_at(data, header_field)? as usize;
    let len = u32_at(data, header_field + 4)? as usize;
    let bad = BtfError::BadSection { offset: header_field };
    let begin = base.checked_add(start).ok_or(bad.clone())?;
    data.get(begin..begin.checked_add(len).ok_or(bad.clone())?).ok_or(bad)
}

/// Bytes of kind-specific data after the fixed part of a type record.
fn extra_len(kind: u32, vlen: usize) -> usize {
    match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        _ => 0,
    }
}

impl<'a> Btf<'a> {
    /// Parses little-endian BTF (the kernel's, on the machines tracer runs on).
    pub fn parse(data: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        let magic = u16_at(data, 0)?;
        if magic != BTF_MAGIC {
            return Err(BtfError::BadMagic { magic });
        }
        let header_len = u32_at(data, 4)? as usize;
        if header_len < HEADER_LEN {
            return Err(BtfError::BadSection { offset: 4 });
        }
        let types = section(data, header_len, 8)?;
        let strings = section(data, header_len, 16)?;
        let mut type_starts = Vec::new();
        let mut at = 0;
        while at < types.len() {
            let info = u32_at(types, at + 4)?;
            let kind = (info >> 24) & 0x1f;
            if kind == 0 || kind > KIND_MAX {
                return Err(BtfError::UnknownKind { offset: header_len + at, kind });
            }
            type_starts.push(at as u32);
            at += TYPE_LEN + extra_len(kind, (info & 0xffff) as usize);
        }
        if at != types.len() {
            return Err(BtfError::Truncated { offset: header_len + types.len() });
        }
        Ok(Btf { types, strings, type_starts })
    }

    fn record(&self, id: u32) -> Option<TypeRecord> {
        let at = *self.type_starts.get(id.checked_sub(1)? as usize)? as usize;
        let info = u32_at(self.types, at + 4).ok()?;
        Some(TypeRecord {
            name_off: u32_at(self.types, at).ok()?,
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 != 0,
            size_or_type: u32_at(self.types, at + 8).ok()?,
            data: at + TYPE_LEN,
        })
    }

    /// Whether the string at `name_off` is `name`: reads `name`'s length and the NUL after it,
    /// not the whole string, so looking a name up among many types that share one long string
    /// costs the name's length per type, not the string's.
    fn has_name(&self, name_off: u32, name: &str) -> bool {
        let at = name_off as usize;
        work::count(name.len() + 1);
        self.strings.get(at..at.saturating_add(name.len())) == Some(name.as_bytes())
            && self.strings.get(at.saturating_add(name.len())) == Some(&0)
    }

    /// Follows typedefs and modifiers to the struct or union a member's type names, if any.
    fn composite(&self, mut id: u32) -> Option<TypeRecord> {
        for _ in 0..MAX_TYPE_CHAIN {
            work::count(1);
            let record = self.record(id)?;
            match record.kind {
                KIND_STRUCT | KIND_UNION => return Some(record),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = record.size_or_type
                }
                _ => return None,
            }
        }
        None
    }

    /// Bit offset of `member` in the struct or union `record`, looking inside anonymous members,
    /// and whether it is a bitfield. `searched` holds, for each struct or union already searched
    /// in vain, the shallowest depth it was searched at: one that lacks the member there lacks it
    /// at any deeper depth, so each is searched at most once per depth. Without it, anonymous
    /// members that all name one struct (a hostile BTF's cycle) cost width^depth.
    fn member_bits(
        &self,
        record: TypeRecord,
        member: &str,
        depth: usize,
        searched: &mut HashMap<usize, usize>,
    ) -> Option<(u64, bool)> {
        if depth > MAX_ANONYMOUS_DEPTH || searched.get(&record.data).is_some_and(|&d| d <= depth) {
            return None;
        }
        let found = self.member_bits_here(record, member, depth, searched);
        if found.is_none() {
            searched.insert(record.data, depth);
        }
        found
    }

    /// [`member_bits`](Self::member_bits) for one struct or union not searched yet at `depth`.
    fn member_bits_here(
        &self,
        record: TypeRecord,
        member: &str,
        depth: usize,
        searched: &mut HashMap<usize, usize>,
    ) -> Option<(u64, bool)> {
        for i in 0..record.vlen {
            work::count(1);
            let at = record.data + 12 * i;
            let (Ok(name_off), Ok(ty), Ok(offset)) =
                (u32_at(self.types, at), u32_at(self.types, at + 4), u32_at(self.types, at + 8))
            else {
                return None;
            };
            // With kind_flag the low 24 bits are the offset, the high 8 a bitfield size.
            let (bits, bitfield) = if record.kind_flag {
                (u64::from(offset & 0x00ff_ffff), offset >> 24)
            } else {
                (u64::from(offset), 0)
            };
            if name_off == 0 {
                if let Some(inner) = self.composite(ty)
                    && let Some((inner_bits, inner_bitfield)) =
                        self.member_bits(inner, member, depth + 1, searched)
                {
                    return Some((bits + inner_bits, inner_bitfield));
                }
            } else if self.has_name(name_off, member) {
                return Some((bits, bitfield != 0));
            }
        }
        None
    }

    /// The first struct named `name`.
    fn find_struct(&self, name: &str) -> Result<TypeRecord, BtfError> {
        (1..=self.type_starts.len() as u32)
            .filter_map(|id| self.record(id))
            .find(|r| r.kind == KIND_STRUCT && self.has_name(r.name_off, name))
            .ok_or_else(|| BtfError::NoStruct { name: name.to_string() })
    }

    /// How many arguments the kernel passes a BTF-typed program on tracepoint `name`: the
    /// parameters of `btf_trace_<name>` (the typedef the kernel declares for every tracepoint:
    /// a pointer to a function prototype) after its leading `void *__data`.
    pub fn tracepoint_args(&self, name: &str) -> Result<usize, BtfError> {
        let typedef = format!("btf_trace_{name}");
        let record = (1..=self.type_starts.len() as u32)
            .filter_map(|id| self.record(id))
            .find(|r| r.kind == KIND_TYPEDEF && self.has_name(r.name_off, &typedef))
            .ok_or_else(|| BtfError::NoTypedef { name: typedef.clone() })?;
        let not_function = || BtfError::NotFunctionPointer { name: typedef.clone() };
        let pointer = self.record(record.size_or_type).filter(|r| r.kind == KIND_PTR);
        let proto = pointer
            .and_then(|p| self.record(p.size_or_type))
            .filter(|r| r.kind == KIND_FUNC_PROTO)
            .ok_or_else(not_function)?;
        proto.vlen.checked_sub(1).ok_or_else(not_function)
    }

    /// The id of the first type of `kind` named `name`: what a BTF-typed program attaches to
    /// (a `FUNC` for a trampoline or an iterator, the `btf_trace_*` `TYPEDEF` of a tracepoint).
    pub fn type_id(&self, name: &str, kind: u32) -> Option<u32> {
        (1..=self.type_starts.len() as u32).find(|&id| {
            self.record(id).is_some_and(|r| r.kind == kind && self.has_name(r.name_off, name))
        })
    }

    /// Byte offset of `member` in `struct structure`, also when the member sits in an
    /// anonymous struct or union inside it (as `dentry.d_name` does on recent kernels).
    pub fn member_offset(&self, structure: &str, member: &str) -> Result<u32, BtfError> {
        let record = self.find_struct(structure)?;
        let no_member =
            || BtfError::NoMember { structure: structure.to_string(), member: member.to_string() };
        let searched = &mut HashMap::new();
        let (bits, bitfield) =
            self.member_bits(record, member, 0, searched).ok_or_else(no_member)?;
        if bitfield || bits % 8 != 0 || bits / 8 > u64::from(u32::MAX) {
            return Err(BtfError::NotByteAligned {
                structure: structure.to_string(),
                member: member.to_string(),
            });
        }
        Ok((bits / 8) as u32)
    }
}

/// A type a stand-in holds at its id ([`stand_in`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandInType<'a> {
    pub id: u32,
    pub name: &'a str,
    /// [`KIND_FUNC`] or [`KIND_TYPEDEF`]: kinds whose record is the fixed part alone.
    pub kind: u32,
}

/// BTF with `types` at their ids and an unnamed forward declaration at every other id below
/// the highest: for a loader that only looks a type's id up by name and kind (a BTF-typed
/// program's load), at 12 bytes a type instead of the whole kernel's types and names. Types
/// of other kinds, and ids 0 or repeated, are left out.
pub fn stand_in(types: &[StandInType<'_>]) -> Vec<u8> {
    let mut wanted: Vec<StandInType<'_>> = types
        .iter()
        .copied()
        .filter(|t| t.id != 0 && matches!(t.kind, KIND_FUNC | KIND_TYPEDEF))
        .collect();
    wanted.sort_by_key(|t| t.id);
    wanted.dedup_by_key(|t| t.id);
    let last = wanted.last().map_or(0, |t| t.id);
    let mut strings = vec![0u8];
    let mut type_section = Vec::with_capacity(last as usize * TYPE_LEN);
    let mut next = wanted.iter().peekable();
    for id in 1..=last {
        let (name_off, kind) = match next.next_if(|t| t.id == id) {
            Some(t) => {
                let off = strings.len() as u32;
                strings.extend(t.name.as_bytes());
                strings.push(0);
                (off, t.kind)
            }
            None => (0, KIND_FWD),
        };
        for word in [name_off, kind << 24, 0] {
            type_section.extend(word.to_le_bytes());
        }
    }
    let mut out = Vec::with_capacity(HEADER_LEN + type_section.len() + strings.len());
    out.extend(BTF_MAGIC.to_le_bytes());
    out.extend([1, 0]);
    for word in [HEADER_LEN as u32, 0, type_section.len() as u32, type_section.len() as u32] {
        out.extend(word.to_le_bytes());
    }
    out.extend((strings.len() as u32).to_le_bytes());
    out.extend(type_section);
    out.extend(strings);
    out
}

/// Writes BTF, type by type: inputs for the unit tests and the fuzz seeds.
#[cfg(any(test, feature = "btf-encoder"))]
pub mod encode {
    use super::*;

    /// Builds BTF bytes type by type (ids count from 1 in push order).
    pub struct Builder {
        types: Vec<u8>,
        strings: Vec<u8>,
    }

    impl Builder {
        pub fn new() -> Builder {
            Builder { types: Vec::new(), strings: vec![0] }
        }

        /// Adds a name to the string section; its offset (0 for the empty name).
        pub fn string(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend(s.as_bytes());
            self.strings.push(0);
            off
        }

        /// One type record and its kind-specific words (structs and unions: 3 per member).
        pub fn push(&mut self, name: &str, kind: u32, flag: bool, size: u32, extra: &[u32]) {
            let name = self.string(name);
            let vlen = match kind {
                KIND_STRUCT | KIND_UNION => extra.len() / 3,
                KIND_FUNC_PROTO => extra.len() / 2,
                _ => 0,
            } as u32;
            let info = (u32::from(flag) << 31) | (kind << 24) | vlen;
            for w in [name, info, size].iter().chain(extra) {
                self.types.extend(w.to_le_bytes());
            }
        }

        /// A struct or union with (name, type id, bit offset) members.
        pub fn composite(
            &mut self,
            name: &str,
            kind: u32,
            size: u32,
            members: &[(&str, u32, u32)],
        ) {
            let mut extra = Vec::new();
            for (member, ty, bits) in members {
                extra.extend([self.string(member), *ty, *bits]);
            }
            self.push(name, kind, false, size, &extra);
        }

        /// Header, type section, string section.
        pub fn bytes(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend(BTF_MAGIC.to_le_bytes());
            out.extend([1, 0]);
            out.extend((HEADER_LEN as u32).to_le_bytes());
            out.extend(0u32.to_le_bytes());
            out.extend((self.types.len() as u32).to_le_bytes());
            out.extend((self.types.len() as u32).to_le_bytes());
            out.extend((self.strings.len() as u32).to_le_bytes());
            out.extend(&self.types);
            out.extend(&self.strings);
            out
        }
    }

    impl Default for Builder {
        fn default() -> Self {
            Builder::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::encode::Builder;
    use super::*;

    /// id 1: int; 2: struct qstr { u64 hash_len; name @ 64 bits }; 3: anonymous union
    /// { qstr d_name; qstr __d_name }; 4: const qstr; 5: struct dentry { int flags; union @ 128
    /// bits }.
    fn dentry_like() -> Vec<u8> {
        let mut b = Builder::new();
        b.push("int", KIND_INT, false, 4, &[32]);
        b.composite("qstr", KIND_STRUCT, 16, &[("hash_len", 1, 0), ("name", 1, 64)]);
        b.composite("", KIND_UNION, 16, &[("d_name", 4, 0), ("__d_name", 2, 0)]);
        b.push("", KIND_CONST, false, 2, &[]);
        b.composite("dentry", KIND_STRUCT, 32, &[("d_flags", 1, 0), ("", 3, 128)]);
        b.bytes()
    }

    #[test]
    fn finds_direct_and_anonymous_members() {
        let data = dentry_like();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.member_offset("qstr", "name"), Ok(8));
        assert_eq!(btf.member_offset("dentry", "d_flags"), Ok(0));
        assert_eq!(btf.member_offset("dentry", "d_name"), Ok(16));
        assert_eq!(btf.member_offset("dentry", "__d_name"), Ok(16));
    }

    #[test]
    fn missing_struct_and_member_are_named() {
        let data = dentry_like();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(
            btf.member_offset("file", "f_path"),
            Err(BtfError::NoStruct { name: "file".into() })
        );
        assert_eq!(
            btf.member_offset("dentry", "d_inode"),
            Err(BtfError::NoMember { structure: "dentry".into(), member: "d_inode".into() })
        );
        assert_eq!(
            btf.member_offset("dentry", "d_inode").unwrap_err().to_string(),
            "kernel BTF: struct dentry has no member d_inode"
        );
    }

    #[test]
    fn bitfields_and_unaligned_members_are_refused() {
        let mut b = Builder::new();
        b.push("int", KIND_INT, false, 4, &[32]);
        // kind_flag: bitfield of 3 bits at bit 4; a plain member at bit 12.
        let (flags, odd) = (b.string("flags"), b.string("odd"));
        b.push("s", KIND_STRUCT, true, 4, &[flags, 1, (3 << 24) | 4, odd, 1, 12]);
        let data = b.bytes();
        let btf = Btf::parse(&data).unwrap();
        let refused = |member: &str| BtfError::NotByteAligned {
            structure: "s".into(),
            member: member.into(),
        };
        assert_eq!(btf.member_offset("s", "flags"), Err(refused("flags")));
        assert_eq!(btf.member_offset("s", "odd"), Err(refused("odd")));
    }

    #[test]
    fn malformed_input_is_a_typed_error() {
        assert_eq!(Btf::parse(&[0x9f]).err(), Some(BtfError::Truncated { offset: 0 }));
        assert_eq!(Btf::parse(&[0, 0, 0, 0]).err(), Some(BtfError::BadMagic { magic: 0 }));
        let mut data = dentry_like();
        // Type section longer than the data.
        data[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Btf::parse(&data).err(), Some(BtfError::BadSection { offset: 8 }));
        let mut data = dentry_like();
        // First type's kind := 31.
        data[HEADER_LEN + 7] = 31;
        assert_eq!(
            Btf::parse(&data).err(),
            Some(BtfError::UnknownKind { offset: HEADER_LEN, kind: 31 })
        );
    }

    /// `typedef void (*btf_trace_x)(void *, struct task_struct *, bool)` and friends.
    #[test]
    fn tracepoint_arguments_come_from_their_typedef() {
        let mut b = Builder::new();
        b.push("int", KIND_INT, false, 4, &[32]); // 1
        b.push("", KIND_FUNC_PROTO, false, 0, &[0, 0, 0, 1, 0, 1]); // 2: (void *, int, int)
        b.push("", KIND_PTR, false, 2, &[]); // 3
        b.push("btf_trace_exit", KIND_TYPEDEF, false, 3, &[]); // 4
        b.push("btf_trace_not_pointer", KIND_TYPEDEF, false, 1, &[]); // 5
        b.push("", KIND_FUNC_PROTO, false, 0, &[]); // 6: ()
        b.push("", KIND_PTR, false, 6, &[]); // 7
        b.push("btf_trace_no_data", KIND_TYPEDEF, false, 7, &[]); // 8
        let data = b.bytes();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.tracepoint_args("exit"), Ok(2));
        assert_eq!(
            btf.tracepoint_args("fork"),
            Err(BtfError::NoTypedef { name: "btf_trace_fork".into() })
        );
        let not_function = |name: &str| BtfError::NotFunctionPointer { name: name.into() };
        assert_eq!(btf.tracepoint_args("not_pointer"), Err(not_function("btf_trace_not_pointer")));
        assert_eq!(btf.tracepoint_args("no_data"), Err(not_function("btf_trace_no_data")));
        assert_eq!(
            btf.tracepoint_args("no_data").unwrap_err().to_string(),
            "kernel BTF: typedef btf_trace_no_data is not a function pointer"
        );
    }

    #[test]
    fn self_containing_anonymous_union_ends() {
        let mut b = Builder::new();
        // id 1: anonymous union whose only member is itself.
        b.composite("", KIND_UNION, 8, &[("", 1, 0)]);
        b.composite("loop", KIND_STRUCT, 8, &[("", 1, 0)]);
        let data = b.bytes();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(
            btf.member_offset("loop", "x"),
            Err(BtfError::NoMember { structure: "loop".into(), member: "x".into() })
        );
    }

    #[test]
    fn anonymous_members_that_all_name_their_own_struct_are_searched_once_per_depth() {
        // id 1: struct dentry whose 8 members are all anonymous and of type dentry itself. Each
        // depth searches it once: 9 depths × 8 members, each member one step to its type. Every
        // path through it searched anew was 8^10 steps (minutes).
        let mut b = Builder::new();
        b.composite("dentry", KIND_STRUCT, 8, &[("", 1, 0); 8]);
        let data = b.bytes();
        let btf = Btf::parse(&data).unwrap();
        let (found, work) = crate::work::measure(|| btf.member_offset("dentry", "d_name"));
        let no_member = BtfError::NoMember { structure: "dentry".into(), member: "d_name".into() };
        assert_eq!((data.len(), found, work), (140, Err(no_member), 7 + 9 * 8 * 2));
    }

    #[test]
    fn a_name_many_types_share_costs_the_length_looked_for_not_its_own() {
        // 1 000 structs all named by one string of `len` bytes: looking for `task_struct` reads
        // 12 bytes of each name whatever its length (reading whole names made it 1 000 × len).
        let work_with_name_of = |len: usize| {
            let mut b = Builder::new();
            b.string(&"a".repeat(len));
            for _ in 0..1000 {
                b.push("", KIND_STRUCT, false, 8, &[]);
            }
            let mut data = b.bytes();
            for at in (HEADER_LEN..HEADER_LEN + 1000 * TYPE_LEN).step_by(TYPE_LEN) {
                data[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
            }
            let btf = Btf::parse(&data).unwrap();
            let (found, work) = crate::work::measure(|| btf.member_offset("task_struct", "files"));
            assert_eq!(found, Err(BtfError::NoStruct { name: "task_struct".into() }));
            work
        };
        assert_eq!(work_with_name_of(16), 12_000);
        assert_eq!(work_with_name_of(60_000), 12_000);
    }

    #[test]
    fn a_fuzzed_struct_whose_anonymous_members_lead_into_each_other_costs_linear_work() {
        // 512 bytes the `btf` fuzz target found: searching every path through the anonymous
        // members anew took 6 640 961 steps for this one lookup (0.6 s under the sanitizers).
        let data = include_bytes!("fixtures/btf/fuzzed_slow_lookups.btf");
        let btf = Btf::parse(data).unwrap();
        let (found, work) = crate::work::measure(|| btf.member_offset("qstr", "name"));
        let no_member = BtfError::NoMember { structure: "qstr".into(), member: "name".into() };
        assert_eq!((data.len(), found, work), (512, Err(no_member), 689));
    }

    #[test]
    fn types_are_found_by_name_and_kind() {
        let mut b = Builder::new();
        b.push("int", KIND_INT, false, 4, &[32]); // 1
        b.push("f", KIND_STRUCT, false, 0, &[]); // 2
        b.push("f", KIND_FUNC, false, 0, &[]); // 3
        b.push("btf_trace_x", KIND_TYPEDEF, false, 1, &[]); // 4
        b.push("f", KIND_FUNC, false, 0, &[]); // 5
        let data = b.bytes();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.type_id("f", KIND_FUNC), Some(3));
        assert_eq!(btf.type_id("f", KIND_STRUCT), Some(2));
        assert_eq!(btf.type_id("btf_trace_x", KIND_TYPEDEF), Some(4));
        assert_eq!(btf.type_id("f", KIND_TYPEDEF), None);
        assert_eq!(btf.type_id("btf_trace_", KIND_TYPEDEF), None);
    }

    #[test]
    fn a_stand_in_holds_its_types_at_their_ids_and_nothing_else() {
        let t = |id, name, kind| StandInType { id, name, kind };
        let data = stand_in(&[
            t(5, "g", KIND_FUNC),
            t(2, "btf_trace_y", KIND_TYPEDEF),
            t(0, "void", KIND_FUNC),
            t(5, "h", KIND_FUNC),
            t(9, "s", KIND_STRUCT),
        ]);
        assert_eq!(data.len(), HEADER_LEN + 5 * TYPE_LEN + "\0btf_trace_y\0g\0".len());
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.type_starts.len(), 5);
        assert_eq!(btf.type_id("g", KIND_FUNC), Some(5));
        assert_eq!(btf.type_id("btf_trace_y", KIND_TYPEDEF), Some(2));
        assert_eq!((btf.type_id("h", KIND_FUNC), btf.type_id("s", KIND_STRUCT)), (None, None));
        for id in [1, 3, 4] {
            let record = btf.record(id).unwrap();
            assert_eq!((record.kind, record.name_off, record.size_or_type), (KIND_FWD, 0, 0));
        }
        let empty = stand_in(&[]);
        assert_eq!(Btf::parse(&empty).unwrap().type_starts.len(), 0);
    }
}
