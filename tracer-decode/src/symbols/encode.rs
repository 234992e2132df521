//! Writes small x86_64 ELF files with chosen symbols, notes, debug link and segments: for the
//! unit tests and the fuzz seeds (never in tracer itself). Section data is laid out one part
//! after another, each 8-byte aligned, then the section headers.
use object::elf;

use super::elf::LoadSegment;

/// `sizeof(Elf64_Ehdr)`, `sizeof(Elf64_Phdr)`, `sizeof(Elf64_Shdr)`, `sizeof(Elf64_Sym)`.
const EHDR_LEN: usize = 64;
const PHDR_LEN: usize = 56;
const SHDR_LEN: usize = 64;
const SYM_LEN: usize = 24;
/// Section index of `.text`, which every function symbol is defined in.
pub const TEXT_SECTION: u16 = 1;

/// One symbol table entry.
#[derive(Clone, Debug)]
pub struct Symbol {
    pub name: String,
    pub value: u64,
    pub size: u64,
    /// `STT_*`.
    pub kind: u8,
    /// `STB_*`.
    pub bind: u8,
    /// `st_shndx` ([`TEXT_SECTION`], or `SHN_UNDEF` for an import).
    pub section: u16,
}

impl Symbol {
    /// A global function in `.text`.
    pub fn function(name: &str, value: u64, size: u64) -> Symbol {
        Symbol {
            name: name.to_owned(),
            value,
            size,
            kind: elf::STT_FUNC,
            bind: elf::STB_GLOBAL,
            section: TEXT_SECTION,
        }
    }
}

/// What the written file holds; empty parts are left out (no `.symtab` section at all when
/// `symtab` is empty, as in a stripped file).
#[derive(Clone, Debug)]
pub struct ElfBuilder {
    pub e_type: u16,
    pub machine: u16,
    pub symtab: Vec<Symbol>,
    pub dynsym: Vec<Symbol>,
    pub build_id: Option<Vec<u8>>,
    /// File name and CRC-32.
    pub debuglink: Option<(Vec<u8>, u32)>,
    pub segments: Vec<LoadSegment>,
}

impl Default for ElfBuilder {
    fn default() -> Self {
        ElfBuilder {
            e_type: elf::ET_DYN,
            machine: elf::EM_X86_64,
            symtab: Vec::new(),
            dynsym: Vec::new(),
            build_id: None,
            debuglink: None,
            segments: Vec::new(),
        }
    }
}

struct Section {
    name: &'static str,
    kind: u32,
    data: Vec<u8>,
    /// Section index (in the order sections are pushed) of the linked string table.
    link: u32,
    entsize: u64,
    align: u64,
}

impl ElfBuilder {
    pub fn bytes(&self) -> Vec<u8> {
        // Index 0 is the null section, 1 `.text` (no bytes: symbols only need it to exist).
        let mut sections = vec![Section {
            name: ".text",
            kind: elf::SHT_PROGBITS,
            data: Vec::new(),
            link: 0,
            entsize: 0,
            align: 16,
        }];
        for (symbols, kind, name, strings) in [
            (&self.symtab, elf::SHT_SYMTAB, ".symtab", ".strtab"),
            (&self.dynsym, elf::SHT_DYNSYM, ".dynsym", ".dynstr"),
        ] {
            if symbols.is_empty() {
                continue;
            }
            let (table, names) = symbol_table(symbols);
            let link = sections.len() as u32 + 2;
            sections.push(Section { name, kind, data: table, link, entsize: 24, align: 8 });
            let data = names;
            sections.push(Section {
                name: strings,
                kind: elf::SHT_STRTAB,
                data,
                link: 0,
                entsize: 0,
                align: 1,
            });
        }
        if let Some(id) = &self.build_id {
            let data = note(b"GNU\0", elf::NT_GNU_BUILD_ID, id);
            let name = ".note.gnu.build-id";
            sections.push(Section {
                name,
                kind: elf::SHT_NOTE,
                data,
                link: 0,
                entsize: 0,
                align: 4,
            });
        }
        if let Some((file_name, crc)) = &self.debuglink {
            let mut data = file_name.clone();
            data.push(0);
            data.resize(data.len().next_multiple_of(4), 0);
            data.extend_from_slice(&crc.to_le_bytes());
            let name = ".gnu_debuglink";
            sections.push(Section {
                name,
                kind: elf::SHT_PROGBITS,
                data,
                link: 0,
                entsize: 0,
                align: 4,
            });
        }
        let mut shstrtab = vec![0u8];
        let mut name_offsets = Vec::new();
        for section in &sections {
            name_offsets.push(shstrtab.len() as u32);
            shstrtab.extend_from_slice(section.name.as_bytes());
            shstrtab.push(0);
        }
        name_offsets.push(shstrtab.len() as u32);
        shstrtab.extend_from_slice(b".shstrtab\0");
        sections.push(Section {
            name: ".shstrtab",
            kind: elf::SHT_STRTAB,
            data: shstrtab,
            link: 0,
            entsize: 0,
            align: 1,
        });

        let phoff = EHDR_LEN;
        let mut out = vec![0u8; phoff + PHDR_LEN * self.segments.len()];
        let mut offsets = Vec::new();
        for section in &sections {
            out.resize(out.len().next_multiple_of(8), 0);
            offsets.push(out.len() as u64);
            out.extend_from_slice(&section.data);
        }
        out.resize(out.len().next_multiple_of(8), 0);
        let shoff = out.len();
        out.extend_from_slice(&[0; SHDR_LEN]);
        for ((section, offset), name) in sections.iter().zip(&offsets).zip(&name_offsets) {
            let mut h = Vec::with_capacity(SHDR_LEN);
            h.extend_from_slice(&name.to_le_bytes());
            h.extend_from_slice(&section.kind.to_le_bytes());
            h.extend_from_slice(&0u64.to_le_bytes()); // sh_flags
            h.extend_from_slice(&0u64.to_le_bytes()); // sh_addr
            h.extend_from_slice(&offset.to_le_bytes());
            h.extend_from_slice(&(section.data.len() as u64).to_le_bytes());
            h.extend_from_slice(&section.link.to_le_bytes());
            // sh_info of a symbol table: one past the last local symbol (the null one).
            let info: u32 = if section.entsize > 0 { 1 } else { 0 };
            h.extend_from_slice(&info.to_le_bytes());
            h.extend_from_slice(&section.align.to_le_bytes());
            h.extend_from_slice(&section.entsize.to_le_bytes());
            out.extend_from_slice(&h);
        }

        let mut ehdr = Vec::with_capacity(EHDR_LEN);
        ehdr.extend_from_slice(&[0x7f, b'E', b'L', b'F', elf::ELFCLASS64, elf::ELFDATA2LSB, 1, 0]);
        ehdr.extend_from_slice(&[0; 8]);
        ehdr.extend_from_slice(&self.e_type.to_le_bytes());
        ehdr.extend_from_slice(&self.machine.to_le_bytes());
        ehdr.extend_from_slice(&1u32.to_le_bytes()); // e_version
        ehdr.extend_from_slice(&0u64.to_le_bytes()); // e_entry
        let phoff = if self.segments.is_empty() { 0 } else { phoff as u64 };
        ehdr.extend_from_slice(&phoff.to_le_bytes());
        ehdr.extend_from_slice(&(shoff as u64).to_le_bytes());
        ehdr.extend_from_slice(&0u32.to_le_bytes()); // e_flags
        ehdr.extend_from_slice(&(EHDR_LEN as u16).to_le_bytes());
        ehdr.extend_from_slice(&(PHDR_LEN as u16).to_le_bytes());
        ehdr.extend_from_slice(&(self.segments.len() as u16).to_le_bytes());
        ehdr.extend_from_slice(&(SHDR_LEN as u16).to_le_bytes());
        ehdr.extend_from_slice(&(sections.len() as u16 + 1).to_le_bytes());
        ehdr.extend_from_slice(&(sections.len() as u16).to_le_bytes()); // .shstrtab is last
        out[..EHDR_LEN].copy_from_slice(&ehdr);

        for (i, s) in self.segments.iter().enumerate() {
            let at = EHDR_LEN + i * PHDR_LEN;
            let mut p = Vec::with_capacity(PHDR_LEN);
            p.extend_from_slice(&elf::PT_LOAD.to_le_bytes());
            p.extend_from_slice(&s.flags.to_le_bytes());
            p.extend_from_slice(&s.file_offset.to_le_bytes());
            p.extend_from_slice(&s.vaddr.to_le_bytes());
            p.extend_from_slice(&s.vaddr.to_le_bytes()); // p_paddr
            p.extend_from_slice(&s.file_size.to_le_bytes());
            p.extend_from_slice(&s.file_size.to_le_bytes()); // p_memsz
            p.extend_from_slice(&0x1000u64.to_le_bytes());
            out[at..at + PHDR_LEN].copy_from_slice(&p);
        }
        out
    }
}

/// The entries (after the null symbol) and their string table.
fn symbol_table(symbols: &[Symbol]) -> (Vec<u8>, Vec<u8>) {
    let mut table = vec![0u8; SYM_LEN];
    let mut names = vec![0u8];
    for s in symbols {
        let name = if s.name.is_empty() {
            0
        } else {
            names.extend_from_slice(s.name.as_bytes());
            names.push(0);
            (names.len() - s.name.len() - 1) as u32
        };
        table.extend_from_slice(&name.to_le_bytes());
        table.push((s.bind << 4) | s.kind);
        table.push(0); // st_other
        table.extend_from_slice(&s.section.to_le_bytes());
        table.extend_from_slice(&s.value.to_le_bytes());
        table.extend_from_slice(&s.size.to_le_bytes());
    }
    (table, names)
}

fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(name);
    out.resize(out.len().next_multiple_of(4), 0);
    out.extend_from_slice(desc);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}
