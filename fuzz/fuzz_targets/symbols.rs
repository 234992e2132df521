//! ELF files as a process may map them (any bytes: a PE `.dll`, a JIT memfd, a file crafted to
//! mislead tracer): never a panic, no unbounded work, and every name a lookup returns holds the
//! address it was asked for. Names found are demangled, as frames are.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::symbols::elf::MAX_SYMBOL_NAME_BYTES;
use tracer_decode::symbols::{ElfImage, demangle};

/// Segments whose addresses are looked up (a file may have thousands).
const SEGMENTS_LOOKED_UP: usize = 8;
/// Offsets into each segment looked up.
const OFFSETS: [u64; 5] = [0, 1, 0x40, 0x100, 0xfff];

fuzz_target!(|data: &[u8]| {
    let Ok(image) = ElfImage::parse(data) else { return };
    // Addresses near where the file says code is, and a few that the input's last bytes choose.
    let mut addresses: Vec<u64> = image
        .load_segments
        .iter()
        .take(SEGMENTS_LOOKED_UP)
        .flat_map(|s| OFFSETS.map(|o| s.vaddr.wrapping_add(o)))
        .collect();
    let chosen = data.rchunks_exact(8).take(4);
    addresses.extend(chosen.map(|c| u64::from_le_bytes(c.try_into().unwrap())));
    addresses.extend([0, u64::MAX]);
    let mut demangled = Vec::new();
    for addr in addresses {
        if let Some(symbol) = image.symbols.lookup(addr) {
            assert_eq!(symbol.start.checked_add(symbol.offset), Some(addr));
            assert!(!symbol.name.is_empty());
            // Bytes that are not UTF-8 become U+FFFD (3 bytes each).
            assert!(symbol.name.len() <= 3 * MAX_SYMBOL_NAME_BYTES);
            // Each symbol once: most lookups land in the same few.
            if !demangled.contains(&symbol.start) {
                demangled.push(symbol.start);
                let _ = demangle(&symbol.name);
            }
        }
    }
    for segment in image.load_segments.iter().take(SEGMENTS_LOOKED_UP) {
        if segment.file_size > 0 {
            assert!(image.file_offset_to_vaddr(segment.file_offset).is_some());
        }
    }
    if let Some(link) = &image.debuglink {
        assert!(!link.file_name.is_empty() && !link.file_name.contains(&b'/'));
    }
});
