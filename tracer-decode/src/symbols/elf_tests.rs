use object::elf as abi;

use super::*;
use crate::symbols::encode::{ElfBuilder, Symbol, TEXT_SECTION};

const BUILD_ID: [u8; 20] = [
    0x1f, 0x8b, 0x42, 0xc0, 0x3e, 0x7a, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa,
    0xbb, 0xcc, 0xdd, 0xee,
];

/// A shared object as a linker lays one out: read-only headers, then text, then data.
fn segments() -> Vec<LoadSegment> {
    vec![
        LoadSegment { file_offset: 0, vaddr: 0, file_size: 0x1000, flags: abi::PF_R },
        LoadSegment {
            file_offset: 0x1000,
            vaddr: 0x1000,
            file_size: 0x3000,
            flags: abi::PF_R | abi::PF_X,
        },
        LoadSegment {
            file_offset: 0x4000,
            vaddr: 0x5000,
            file_size: 0x800,
            flags: abi::PF_R | abi::PF_W,
        },
    ]
}

fn library() -> ElfBuilder {
    ElfBuilder {
        symtab: vec![
            Symbol { bind: abi::STB_LOCAL, ..Symbol::function("static_helper", 0x1100, 0x40) },
            Symbol::function("exported", 0x1200, 0x80),
            Symbol::function("_ZN5space3fooEibc", 0x1300, 0x20),
        ],
        dynsym: vec![Symbol::function("exported", 0x1200, 0x80)],
        build_id: Some(BUILD_ID.to_vec()),
        debuglink: Some((b"libdemo.so.debug".to_vec(), 0xdead_beef)),
        segments: segments(),
        ..ElfBuilder::default()
    }
}

#[test]
fn symbols_name_only_the_addresses_they_hold() {
    let image = ElfImage::parse(&library().bytes()).unwrap();
    let table = &image.symbols;
    assert_eq!(table.len(), 3, "`exported` of .dynsym is an alias of .symtab's");
    assert_eq!(
        table.stats,
        SymbolTableStats {
            symtab_functions: 3,
            dynsym_functions: 1,
            aliases: 1,
            ..Default::default()
        }
    );
    let named = |vaddr| table.lookup(vaddr).map(|s| (s.name.into_owned(), s.offset));
    assert_eq!(named(0x1100), Some(("static_helper".to_owned(), 0)));
    assert_eq!(named(0x113f), Some(("static_helper".to_owned(), 0x3f)));
    assert_eq!(named(0x1140), None, "one past the end of static_helper");
    assert_eq!(named(0x1205), Some(("exported".to_owned(), 5)));
    assert_eq!(named(0x127f), Some(("exported".to_owned(), 0x7f)));
    assert_eq!(named(0x1280), None);
    assert_eq!(named(0x1310), Some(("_ZN5space3fooEibc".to_owned(), 0x10)));
    assert_eq!(named(0x10ff), None);
    assert_eq!(named(0), None);
    assert_eq!(named(u64::MAX), None);
    let found = table.lookup(0x1205).unwrap();
    assert_eq!(found.start, 0x1200);
}

#[test]
fn a_stripped_library_does_not_lend_an_exported_name_to_its_internal_neighbour() {
    // Only .dynsym: `static_helper` at 0x1100 is gone, `exported` at 0x1200 stays.
    let stripped = ElfBuilder { symtab: Vec::new(), ..library() };
    let image = ElfImage::parse(&stripped.bytes()).unwrap();
    assert_eq!(image.symbols.stats.symtab_functions, 0);
    assert_eq!(image.symbols.stats.dynsym_functions, 1);
    assert_eq!(image.symbols.len(), 1);
    assert_eq!(image.symbols.lookup(0x1100), None);
    assert_eq!(image.symbols.lookup(0x1290), None, "past `exported`, inside a stripped function");
    assert_eq!(image.symbols.lookup(0x1201).unwrap().name, "exported");
}

#[test]
fn build_id_debuglink_and_segments_are_read() {
    let image = ElfImage::parse(&library().bytes()).unwrap();
    assert_eq!(image.build_id.as_deref(), Some(&BUILD_ID[..]));
    assert_eq!(
        image.debuglink,
        Some(DebugLink { file_name: b"libdemo.so.debug".to_vec(), crc32: 0xdead_beef })
    );
    assert_eq!(image.load_segments, segments());
    assert_eq!(image.ignored, Ignored::default());
    // Text: offset = vaddr; data: vaddr 0x1000 above its offset; past every segment: none.
    assert_eq!(image.file_offset_to_vaddr(0x1234), Some(0x1234));
    assert_eq!(image.file_offset_to_vaddr(0x4010), Some(0x5010));
    assert_eq!(image.file_offset_to_vaddr(0x47ff), Some(0x57ff));
    assert_eq!(image.file_offset_to_vaddr(0x4800), None);
    let bare = ElfImage::parse(&ElfBuilder::default().bytes()).unwrap();
    assert_eq!((bare.build_id, bare.debuglink, bare.symbols.len()), (None, None, 0));
}

#[test]
fn a_debuglink_that_is_not_a_plain_file_name_is_ignored() {
    for name in [&b"../../etc/passwd"[..], b"..", b"."] {
        let elf = ElfBuilder { debuglink: Some((name.to_vec(), 1)), ..library() };
        let image = ElfImage::parse(&elf.bytes()).unwrap();
        assert_eq!(image.debuglink, None, "{name:?}");
        assert!(image.ignored.debuglink, "{name:?}");
    }
    assert_eq!(parse_debuglink(b"a.debug\0"), None, "no CRC");
    assert_eq!(
        parse_debuglink(b"abc\0\x01\x02\x03\x04"),
        Some(DebugLink { file_name: b"abc".to_vec(), crc32: 0x0403_0201 })
    );
    let long = [vec![b'x'; MAX_DEBUGLINK_NAME_BYTES + 1], vec![0; 4], vec![1; 4]].concat();
    assert_eq!(parse_debuglink(&long), None);
}

#[test]
fn symbols_that_cannot_name_an_address_are_counted() {
    let undefined = Symbol { section: abi::SHN_UNDEF, ..Symbol::function("imported", 0, 0) };
    let object = Symbol { kind: abi::STT_OBJECT, ..Symbol::function("a_variable", 0x5000, 8) };
    let ifunc = Symbol { kind: abi::STT_GNU_IFUNC, ..Symbol::function("memcpy", 0x1400, 0x10) };
    let elf = ElfBuilder {
        symtab: vec![
            undefined,
            object,
            ifunc,
            Symbol::function("_start", 0x1000, 0),
            Symbol::function("", 0x1500, 0x10),
            Symbol { bind: abi::STB_WEAK, ..Symbol::function("weak_alias", 0x1600, 0x10) },
            Symbol { bind: abi::STB_LOCAL, ..Symbol::function("local_alias", 0x1600, 0x10) },
            Symbol::function("global_name", 0x1600, 0x10),
        ],
        segments: segments(),
        ..ElfBuilder::default()
    };
    let image = ElfImage::parse(&elf.bytes()).unwrap();
    assert_eq!(
        image.symbols.stats,
        SymbolTableStats {
            symtab_functions: 6,
            zero_size: 1,
            unnamed: 1,
            aliases: 2,
            ..Default::default()
        }
    );
    assert_eq!(image.symbols.len(), 2);
    assert_eq!(image.symbols.lookup(0x1408).unwrap().name, "memcpy");
    assert_eq!(image.symbols.lookup(0x1000), None, "zero-size _start names nothing");
    assert_eq!(image.symbols.lookup(0x1601).unwrap().name, "global_name", "global before weak");
}

#[test]
fn an_overlapping_symbol_is_cut_at_the_next_one() {
    let elf = ElfBuilder {
        symtab: vec![
            Symbol::function("outer", 0x1000, 0x100),
            Symbol::function("inner", 0x1040, 0x10),
        ],
        ..ElfBuilder::default()
    };
    let image = ElfImage::parse(&elf.bytes()).unwrap();
    let name = |vaddr| image.symbols.lookup(vaddr).map(|s| s.name.into_owned());
    assert_eq!(name(0x103f).as_deref(), Some("outer"));
    assert_eq!(name(0x1045).as_deref(), Some("inner"));
    assert_eq!(name(0x1080), None, "the rest of outer stays unnamed rather than wrong");
}

#[test]
fn long_names_are_cut_and_counted() {
    let long = "f".repeat(MAX_SYMBOL_NAME_BYTES + 10);
    let elf =
        ElfBuilder { symtab: vec![Symbol::function(&long, 0x1000, 4)], ..ElfBuilder::default() };
    let image = ElfImage::parse(&elf.bytes()).unwrap();
    assert_eq!(image.symbols.stats.names_cut, 1);
    assert!(image.symbols.stats.is_cut());
    assert_eq!(image.symbols.lookup(0x1000).unwrap().name, &long[..MAX_SYMBOL_NAME_BYTES]);
    // A name running off the end of its table.
    assert_eq!(bounded_name(b"\0abc", 1), Some((1, 3, true)));
    assert_eq!(bounded_name(b"\0abc\0", 1), Some((1, 3, false)));
    assert_eq!(bounded_name(b"\0abc\0", 0), None, "empty");
    assert_eq!(bounded_name(b"\0abc\0", 9), None, "outside");
}

#[test]
fn other_files_are_refused_with_what_they_are() {
    let parse = |bytes: &[u8]| ElfImage::parse(bytes).unwrap_err();
    assert_eq!(parse(b"MZ\x90\0rest of a PE file"), ElfError::NotElf { first_bytes: *b"MZ\x90\0" });
    assert_eq!(parse(b"\x7fEL"), ElfError::NotElf { first_bytes: *b"\x7fEL\0" });
    let mut elf = library().bytes();
    elf[EI_CLASS] = abi::ELFCLASS32;
    assert_eq!(parse(&elf), ElfError::Not64Bit { class: 1 });
    let mut elf = library().bytes();
    elf[EI_DATA] = abi::ELFDATA2MSB;
    assert_eq!(parse(&elf), ElfError::NotLittleEndian { encoding: 2 });
    let arm = ElfBuilder { machine: abi::EM_AARCH64, ..library() };
    assert_eq!(parse(&arm.bytes()), ElfError::NotX86_64 { machine: abi::EM_AARCH64 });
    let relocatable = ElfBuilder { e_type: abi::ET_REL, ..library() };
    assert_eq!(parse(&relocatable.bytes()), ElfError::NotLoadable { e_type: abi::ET_REL });
    let elf = library().bytes();
    let cut = &elf[..elf.len() - 10];
    assert!(matches!(parse(cut), ElfError::Malformed { part: "section headers", .. }));
    assert_eq!(
        parse(cut).to_string(),
        format!(
            "malformed ELF section headers at file offset {:#x}: Invalid ELF section header \
             offset/size/alignment",
            u64::from_le_bytes(elf[0x28..0x30].try_into().unwrap())
        )
    );
}

#[test]
fn a_table_past_the_limit_is_cut_and_counted() {
    let mut builder = TableBuilder::default();
    let sym = |value: u64| abi::Sym64::<LittleEndian> {
        st_name: object::U32::new(LittleEndian, 1),
        st_info: (abi::STB_GLOBAL << 4) | abi::STT_FUNC,
        st_other: 0,
        st_shndx: object::U16::new(LittleEndian, TEXT_SECTION),
        st_value: object::U64::new(LittleEndian, value),
        st_size: object::U64::new(LittleEndian, 1),
    };
    let symbols: Vec<_> = (0..MAX_SYMBOLS as u64 + 3).map(sym).collect();
    builder.add(Source::Symtab, &symbols, b"\0f\0");
    let table = builder.build();
    assert_eq!(table.len(), MAX_SYMBOLS);
    assert_eq!(table.stats.past_limit, 3);
    assert!(table.stats.is_cut());
    assert_eq!(table.lookup(MAX_SYMBOLS as u64 - 1).unwrap().name, "f");
    assert_eq!(table.lookup(MAX_SYMBOLS as u64), None);
}
