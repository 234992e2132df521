//! The parts of an x86_64 ELF file (executable or shared object) that name sampled addresses:
//! function symbols of `.symtab` and `.dynsym` with their sizes, the GNU build-id, the
//! `.gnu_debuglink` of a separate debug file, and the `PT_LOAD` segments that turn an offset in
//! the file into the virtual address symbols use.
//!
//! The bytes belong to files other processes control. Headers and tables are read through the
//! `object` crate, which checks every offset and size against the data; what it hands back is
//! bounded again here: at most [`MAX_SYMBOLS`] symbols, names of at most
//! [`MAX_SYMBOL_NAME_BYTES`], and what was cut is counted in [`SymbolTableStats`].
use std::borrow::Cow;

use object::LittleEndian;
use object::elf::{self, FileHeader64};
use object::read::SectionIndex;
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _, Sym as _};
use thiserror::Error;

/// Function symbols kept from one file (`.symtab` and `.dynsym` together). A large native
/// library has some 10^5; a table past this is cut (and says so) rather than grown without end.
pub const MAX_SYMBOLS: usize = 1 << 21;
/// Bytes of one symbol name kept. Mangled C++ template names run to a few KiB at most; a longer
/// name is cut to this (and counted), and finding its end costs no more than this many bytes.
pub const MAX_SYMBOL_NAME_BYTES: usize = 4096;
/// Bytes of a GNU build-id kept (linkers write 16 or 20); a longer one is ignored.
pub const MAX_BUILD_ID_BYTES: usize = 64;
/// Bytes of a `.gnu_debuglink` file name (a single path component: NAME_MAX).
pub const MAX_DEBUGLINK_NAME_BYTES: usize = 255;

/// `ELFMAG`, the first four bytes of every ELF file.
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
/// Offsets in `e_ident` (System V ABI).
const EI_CLASS: usize = 4;
const EI_DATA: usize = 5;
/// Bytes of `e_ident` checked before the header is handed to `object`.
const EI_NIDENT: usize = 16;

type Header = FileHeader64<LittleEndian>;

/// Why a file yields no symbols at all.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum ElfError {
    /// Shorter than an ELF identification, or without the ELF magic (a PE `.dll`, a JIT
    /// memfd, a data file).
    #[error("not an ELF file (first bytes {first_bytes:02x?})")]
    NotElf { first_bytes: [u8; 4] },
    /// `e_ident[EI_CLASS]` is not ELFCLASS64.
    #[error("ELF class {class} is not 64-bit (only x86_64 ELF is read)")]
    Not64Bit { class: u8 },
    /// `e_ident[EI_DATA]` is not ELFDATA2LSB.
    #[error("ELF data encoding {encoding} is not little-endian (only x86_64 ELF is read)")]
    NotLittleEndian { encoding: u8 },
    #[error("ELF machine {machine} is not x86_64 (62)")]
    NotX86_64 { machine: u16 },
    /// Relocatable objects and core files have no load addresses to name.
    #[error("ELF type {e_type} is neither an executable (2) nor a shared object (3)")]
    NotLoadable { e_type: u16 },
    /// A header or table that does not fit the data: `part` names it, `offset` is where the
    /// file says it starts.
    #[error("malformed ELF {part} at file offset {offset:#x}: {source}")]
    Malformed {
        part: &'static str,
        offset: u64,
        #[source]
        source: object::Error,
    },
}

/// A `PT_LOAD` program header: file bytes `[file_offset, file_offset + file_size)` are mapped at
/// virtual address `vaddr` (before the load bias a shared object gets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
    /// `PF_X` (1), `PF_W` (2), `PF_R` (4).
    pub flags: u32,
}

/// The `.gnu_debuglink` section: the file name of a separate debug file and the CRC-32 (as
/// zlib computes it) of that whole file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugLink {
    /// A single path component: not empty, no `/`, not `.` or `..`.
    pub file_name: Vec<u8>,
    pub crc32: u32,
}

/// What one ELF file offers to name addresses.
#[derive(Debug)]
pub struct ElfImage {
    /// `NT_GNU_BUILD_ID` descriptor bytes.
    pub build_id: Option<Vec<u8>>,
    pub debuglink: Option<DebugLink>,
    /// In program header order.
    pub load_segments: Vec<LoadSegment>,
    pub symbols: SymbolTable,
    /// Notes and sections that were present but malformed, and so ignored.
    pub ignored: Ignored,
}

/// Parts of a file that were present but could not be used (the rest of the file still was).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ignored {
    /// A `.gnu_debuglink` too short for its CRC, or whose name is not a plain file name.
    pub debuglink: bool,
    /// A build-id note longer than [`MAX_BUILD_ID_BYTES`] or empty.
    pub build_id: bool,
    /// Note sections or segments whose notes did not parse.
    pub notes: u32,
}

impl ElfImage {
    /// Parses an x86_64 ELF executable or shared object (or a separate debug file of one).
    pub fn parse(data: &[u8]) -> Result<ElfImage, ElfError> {
        let header = check_header(data)?;
        let endian = LittleEndian;
        let malformed = |part, offset| move |source| ElfError::Malformed { part, offset, source };
        let shoff = header.e_shoff.get(endian);
        let sections =
            header.sections(endian, data).map_err(malformed("section headers", shoff))?;
        let phoff = header.e_phoff.get(endian);
        let program_headers =
            header.program_headers(endian, data).map_err(malformed("program headers", phoff))?;

        let load_segments = program_headers
            .iter()
            .filter(|p| p.p_type(endian) == elf::PT_LOAD)
            .map(|p| LoadSegment {
                file_offset: p.p_offset(endian),
                vaddr: p.p_vaddr(endian),
                file_size: p.p_filesz(endian),
                flags: p.p_flags(endian),
            })
            .collect();

        let mut ignored = Ignored::default();
        let mut builder = TableBuilder::default();
        for (kind, source) in [(elf::SHT_SYMTAB, Source::Symtab), (elf::SHT_DYNSYM, Source::Dynsym)]
        {
            let table = sections.symbols(endian, data, kind).map_err(|e| {
                let offset = sections.iter().find(|s| s.sh_type(endian) == kind);
                malformed(source.part(), offset.map_or(0, |s| s.sh_offset(endian)))(e)
            })?;
            let strings_header = sections.section(table.string_section());
            let strings = match strings_header {
                // An empty table links to section 0, which has no data.
                Ok(s) if table.string_section() != SectionIndex(0) => {
                    s.data(endian, data).map_err(malformed("string table", s.sh_offset(endian)))?
                }
                _ => &[],
            };
            builder.add(source, table.symbols(), strings);
        }

        let mut build_id = None;
        let section_notes = sections.iter().map(|s| s.notes(endian, data));
        let segment_notes = program_headers.iter().map(|p| p.notes(endian, data));
        // Sections first; a file without section headers still has its PT_NOTE segments.
        for notes in section_notes.chain(segment_notes) {
            if build_id.is_some() {
                break;
            }
            let Ok(Some(mut notes)) = notes else {
                ignored.notes += u32::from(notes.is_err());
                continue;
            };
            loop {
                match notes.next() {
                    Ok(Some(note)) => {
                        let is_build_id = note.name() == elf::ELF_NOTE_GNU
                            && note.n_type(endian) == elf::NT_GNU_BUILD_ID;
                        if !is_build_id {
                            continue;
                        }
                        let desc = note.desc();
                        if desc.is_empty() || desc.len() > MAX_BUILD_ID_BYTES {
                            ignored.build_id = true;
                        } else {
                            build_id = Some(desc.to_vec());
                        }
                        break;
                    }
                    Ok(None) => break,
                    Err(_) => {
                        ignored.notes += 1;
                        break;
                    }
                }
            }
        }

        // Names are compared in place (bounded by the name looked for), not read to their NUL.
        let section_names = header
            .shstrndx(endian, data)
            .ok()
            .and_then(|index| sections.section(SectionIndex(index as usize)).ok())
            .and_then(|names| names.data(endian, data).ok())
            .unwrap_or_default();
        let debuglink_data = sections
            .iter()
            .find(|s| {
                let at = s.sh_name(endian) as usize;
                section_names.get(at..).is_some_and(|name| name.starts_with(DEBUGLINK_SECTION))
            })
            .map(|s| s.data(endian, data));
        let debuglink = match debuglink_data {
            Some(Ok(bytes)) => {
                let link = parse_debuglink(bytes);
                ignored.debuglink = link.is_none();
                link
            }
            Some(Err(_)) => {
                ignored.debuglink = true;
                None
            }
            None => None,
        };

        Ok(ElfImage { build_id, debuglink, load_segments, symbols: builder.build(), ignored })
    }

    /// The virtual address (as symbols give it) of the byte at `file_offset`: through the first
    /// `PT_LOAD` segment whose file bytes hold it. `None` when no segment maps that byte.
    pub fn file_offset_to_vaddr(&self, file_offset: u64) -> Option<u64> {
        file_offset_to_vaddr(&self.load_segments, file_offset)
    }
}

/// [`ElfImage::file_offset_to_vaddr`] over a file's segments (kept apart from its symbols when
/// those come from a separate debug file).
pub fn file_offset_to_vaddr(segments: &[LoadSegment], file_offset: u64) -> Option<u64> {
    segments.iter().find_map(|s| {
        let into = file_offset.checked_sub(s.file_offset)?;
        (into < s.file_size).then(|| s.vaddr.wrapping_add(into))
    })
}

/// The section name of a debug link, with its terminating NUL (a name that merely starts with
/// it does not match).
const DEBUGLINK_SECTION: &[u8] = b".gnu_debuglink\0";

/// `.gnu_debuglink`: a NUL-terminated file name, padding to a multiple of 4, a 4-byte CRC.
fn parse_debuglink(bytes: &[u8]) -> Option<DebugLink> {
    let window = &bytes[..bytes.len().min(MAX_DEBUGLINK_NAME_BYTES + 1)];
    let name_len = window.iter().position(|&b| b == 0)?;
    let file_name = &bytes[..name_len];
    let plain = !file_name.is_empty()
        && !file_name.contains(&b'/')
        && file_name != b"."
        && file_name != b"..";
    let crc_at = (name_len + 1).next_multiple_of(4);
    let crc = bytes.get(crc_at..crc_at + 4)?;
    plain.then(|| DebugLink {
        file_name: file_name.to_vec(),
        crc32: u32::from_le_bytes(crc.try_into().expect("4 bytes")),
    })
}

fn check_header(data: &[u8]) -> Result<&Header, ElfError> {
    let ident = data.get(..EI_NIDENT);
    let first_bytes = |d: &[u8]| {
        let mut first = [0; 4];
        let n = d.len().min(4);
        first[..n].copy_from_slice(&d[..n]);
        first
    };
    let Some(ident) = ident.filter(|i| i[..4] == ELF_MAGIC) else {
        return Err(ElfError::NotElf { first_bytes: first_bytes(data) });
    };
    if ident[EI_CLASS] != elf::ELFCLASS64 {
        return Err(ElfError::Not64Bit { class: ident[EI_CLASS] });
    }
    if ident[EI_DATA] != elf::ELFDATA2LSB {
        return Err(ElfError::NotLittleEndian { encoding: ident[EI_DATA] });
    }
    let header = Header::parse(data).map_err(|source| ElfError::Malformed {
        part: "file header",
        offset: 0,
        source,
    })?;
    let machine = header.e_machine(LittleEndian);
    if machine != elf::EM_X86_64 {
        return Err(ElfError::NotX86_64 { machine });
    }
    let e_type = header.e_type(LittleEndian);
    if e_type != elf::ET_EXEC && e_type != elf::ET_DYN {
        return Err(ElfError::NotLoadable { e_type });
    }
    Ok(header)
}

/// Which table a symbol came from.
#[derive(Clone, Copy)]
enum Source {
    Symtab,
    Dynsym,
}

impl Source {
    fn part(self) -> &'static str {
        match self {
            Source::Symtab => ".symtab",
            Source::Dynsym => ".dynsym",
        }
    }
}

/// Counts of what a [`SymbolTable`] was built from and what it left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolTableStats {
    /// Defined function symbols (`STT_FUNC`, `STT_GNU_IFUNC`) read from `.symtab`.
    pub symtab_functions: u64,
    /// The same, from `.dynsym`.
    pub dynsym_functions: u64,
    /// Function symbols of size 0 (hand-written assembly without `.size`): their extent is
    /// unknown, and a neighbouring symbol does not bound it soundly (a stripped static function
    /// may lie between), so they name nothing.
    pub zero_size: u64,
    /// Function symbols with an empty name or a name offset outside their string table.
    pub unnamed: u64,
    /// Symbols at an address another symbol already names (aliases; one name is kept).
    pub aliases: u64,
    /// Function symbols past [`MAX_SYMBOLS`], not kept.
    pub past_limit: u64,
    /// Names longer than [`MAX_SYMBOL_NAME_BYTES`] (or running off their string table), kept cut.
    pub names_cut: u64,
}

impl SymbolTableStats {
    /// Symbols were dropped or names shortened by a bound.
    pub fn is_cut(&self) -> bool {
        self.past_limit > 0 || self.names_cut > 0
    }
}

/// Function symbols sorted by address, without overlaps, for O(log n) lookups that name an
/// address only when it lies inside a symbol's `[value, value + size)`.
#[derive(Debug, Default)]
pub struct SymbolTable {
    entries: Vec<Entry>,
    /// The string tables the names point into, copied once (a name is not copied per symbol,
    /// so memory stays within the file's own size however many symbols share a string).
    names: Vec<u8>,
    pub stats: SymbolTableStats,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    start: u64,
    /// Exclusive; never past the next entry's start.
    end: u64,
    name_at: usize,
    name_len: usize,
}

/// A symbol that holds a looked-up address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundSymbol<'a> {
    /// As the file spells it (mangled; see [`super::demangle`]); bytes that are not UTF-8 are
    /// replaced.
    pub name: Cow<'a, str>,
    /// Address of the symbol's first byte.
    pub start: u64,
    /// Bytes from `start` to the looked-up address.
    pub offset: u64,
}

impl SymbolTable {
    /// The symbol whose extent holds `vaddr`, with the offset into it.
    pub fn lookup(&self, vaddr: u64) -> Option<FoundSymbol<'_>> {
        let after = self.entries.partition_point(|e| e.start <= vaddr);
        let entry = self.entries.get(after.checked_sub(1)?)?;
        (vaddr < entry.end).then(|| FoundSymbol {
            name: String::from_utf8_lossy(&self.names[entry.name_at..][..entry.name_len]),
            start: entry.start,
            offset: vaddr - entry.start,
        })
    }

    /// Symbols kept (aliases counted once).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Heap bytes held (what a cache of tables accounts for).
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * size_of::<Entry>() + self.names.capacity()
    }
}

#[derive(Default)]
struct TableBuilder {
    /// With a rank per entry: which of several symbols at one address names it.
    entries: Vec<(Entry, u8)>,
    names: Vec<u8>,
    stats: SymbolTableStats,
}

impl TableBuilder {
    fn add(&mut self, source: Source, symbols: &[elf::Sym64<LittleEndian>], strings: &[u8]) {
        let endian = LittleEndian;
        let base = self.names.len();
        let mut used_strings = false;
        for sym in symbols {
            let is_function = matches!(sym.st_type(), elf::STT_FUNC | elf::STT_GNU_IFUNC);
            if !is_function || sym.st_shndx(endian) == elf::SHN_UNDEF {
                continue;
            }
            match source {
                Source::Symtab => self.stats.symtab_functions += 1,
                Source::Dynsym => self.stats.dynsym_functions += 1,
            }
            let size = sym.st_size(endian);
            if size == 0 {
                self.stats.zero_size += 1;
                continue;
            }
            let Some((name_at, name_len, cut)) = bounded_name(strings, sym.st_name(endian)) else {
                self.stats.unnamed += 1;
                continue;
            };
            if self.entries.len() == MAX_SYMBOLS {
                self.stats.past_limit += 1;
                continue;
            }
            self.stats.names_cut += u64::from(cut);
            let start = sym.st_value(endian);
            let end = start.saturating_add(size);
            let name_at = base + name_at;
            self.entries
                .push((Entry { start, end, name_at, name_len }, binding_rank(sym.st_bind())));
            used_strings = true;
        }
        if used_strings {
            self.names.extend_from_slice(strings);
        }
    }

    fn build(mut self) -> SymbolTable {
        // Stable: among symbols at one address, the best-ranked, then the first read, names it.
        self.entries.sort_by_key(|(e, rank)| (e.start, *rank));
        let before = self.entries.len();
        self.entries.dedup_by_key(|(e, _)| e.start);
        self.stats.aliases = (before - self.entries.len()) as u64;
        let mut entries: Vec<Entry> = self.entries.into_iter().map(|(e, _)| e).collect();
        // A symbol that runs into the next one is cut there: a nested or overlapping symbol
        // names its own bytes, and the rest of the outer one stays unnamed rather than wrong.
        for i in 1..entries.len() {
            let next_start = entries[i].start;
            let previous = &mut entries[i - 1];
            previous.end = previous.end.min(next_start);
        }
        SymbolTable { entries, names: self.names, stats: self.stats }
    }
}

/// Global symbols name an address before weak ones, weak ones before local ones.
fn binding_rank(bind: u8) -> u8 {
    match bind {
        elf::STB_GLOBAL => 0,
        elf::STB_WEAK => 1,
        elf::STB_LOCAL => 2,
        _ => 3,
    }
}

/// Where the name at `offset` of a string table lies: (start, length, cut). Only
/// [`MAX_SYMBOL_NAME_BYTES`] + 1 bytes are looked at. `None` for an empty name or an offset
/// outside the table.
fn bounded_name(strings: &[u8], offset: u32) -> Option<(usize, usize, bool)> {
    let start = usize::try_from(offset).ok()?;
    let rest = strings.get(start..)?;
    let window = &rest[..rest.len().min(MAX_SYMBOL_NAME_BYTES + 1)];
    let (len, cut) = match window.iter().position(|&b| b == 0) {
        Some(len) => (len, false),
        None => (window.len().min(MAX_SYMBOL_NAME_BYTES), true),
    };
    (len > 0).then_some((start, len, cut))
}

#[cfg(test)]
#[path = "elf_tests.rs"]
mod tests;
