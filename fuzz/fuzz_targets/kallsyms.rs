//! `/proc/kallsyms` text (the kernel's, but read as any file is): never a panic, and every name a
//! lookup returns holds the address it was asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::symbols::KernelSymbolTable;
use tracer_decode::symbols::kallsyms::KERNEL_MODULE;

fuzz_target!(|data: &[u8]| {
    let Ok(table) = KernelSymbolTable::parse(data) else { return };
    assert!(!table.is_empty());
    // Each address a line gives, and the byte after it.
    let addresses = data
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').next())
        .filter_map(|hex| u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
    for addr in addresses.flat_map(|a| [a, a.wrapping_add(1)]) {
        if let Some(symbol) = table.lookup(addr) {
            assert!(symbol.offset <= addr);
            assert!(!symbol.name.is_empty());
            assert!(symbol.module == KERNEL_MODULE || symbol.module.starts_with('['));
        }
    }
});
