//! `/proc/kallsyms`: one `address type name [module]` line per kernel symbol. It gives no sizes,
//! so a text symbol's extent runs to the next symbol of any type (data symbols bound it too);
//! an address past the last symbol is not named.
//!
//! Readers without `CAP_SYSLOG` (or any reader with `kernel.kptr_restrict=2`) see every address
//! as zero: such a table is an error, not a table that names nothing.
use std::collections::HashMap;

use thiserror::Error;

/// Symbols kept (a distribution kernel with its modules loaded has some 2×10^5).
pub const MAX_KERNEL_SYMBOLS: usize = 1 << 21;
/// Bytes of a symbol name (the kernel's `KSYM_NAME_LEN`); a longer line is malformed.
pub const MAX_KERNEL_SYMBOL_NAME_BYTES: usize = 512;
/// Bytes of a module name between its brackets (`MODULE_NAME_LEN` is 56; BPF programs and
/// ftrace trampolines use `[bpf]` and `[__builtin__ftrace]`).
pub const MAX_KERNEL_MODULE_NAME_BYTES: usize = 64;
/// The module of symbols of the kernel image itself, as kallsyms-reading tools print it.
pub const KERNEL_MODULE: &str = "[kernel]";

#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum KallsymsError {
    /// Every address reads as zero: tracer is not root (lacks `CAP_SYSLOG`), or
    /// `kernel.kptr_restrict` is 2.
    #[error(
        "every /proc/kallsyms address reads as 0 ({symbols} symbols): run as root with \
         CAP_SYSLOG, and with kernel.kptr_restrict below 2"
    )]
    AddressesHidden { symbols: usize },
    #[error("/proc/kallsyms has no text symbol ({malformed_lines} malformed lines)")]
    NoTextSymbols { malformed_lines: u64 },
}

/// Counts of lines a [`KernelSymbolTable`] left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KallsymsStats {
    /// Lines without an address, type and name, or with a name or module past the bounds.
    pub malformed_lines: u64,
    /// Symbols past [`MAX_KERNEL_SYMBOLS`], not kept.
    pub past_limit: u64,
}

/// Kernel symbols sorted by address, for O(log n) lookups.
#[derive(Debug)]
pub struct KernelSymbolTable {
    entries: Vec<KernelEntry>,
    /// Every kept name, one after another.
    names: String,
    /// Module names in brackets; index 0 is [`KERNEL_MODULE`].
    modules: Vec<String>,
    pub stats: KallsymsStats,
}

#[derive(Clone, Copy, Debug)]
struct KernelEntry {
    addr: u64,
    name_at: usize,
    name_len: u16,
    module: u32,
    /// Only text symbols name addresses; the others only bound the extent of those before them.
    is_text: bool,
    /// Which of several symbols at one address is kept (see [`kind_rank`]).
    rank: u8,
}

/// A kernel symbol that holds a looked-up address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSymbol<'a> {
    pub name: &'a str,
    /// Bytes from the symbol's address to the looked-up one.
    pub offset: u64,
    /// [`KERNEL_MODULE`] or the module's name in brackets (`[ext4]`).
    pub module: &'a str,
}

impl KernelSymbolTable {
    /// Parses kallsyms text. Lines that do not parse are counted and skipped.
    pub fn parse(text: &[u8]) -> Result<KernelSymbolTable, KallsymsError> {
        let mut table = KernelSymbolTable {
            entries: Vec::new(),
            names: String::new(),
            modules: vec![KERNEL_MODULE.to_owned()],
            stats: KallsymsStats::default(),
        };
        let mut module_index: HashMap<String, u32> = HashMap::new();
        let mut parsed = 0usize;
        for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let Some(symbol) = parse_line(line) else {
                table.stats.malformed_lines += 1;
                continue;
            };
            parsed += 1;
            // Absolute symbols (per-CPU offsets) and undefined ones are no places in the text.
            if matches!(symbol.kind, b'a' | b'A' | b'U' | b'u') {
                continue;
            }
            if table.entries.len() == MAX_KERNEL_SYMBOLS {
                table.stats.past_limit += 1;
                continue;
            }
            let module = match symbol.module {
                None => 0,
                Some(name) => {
                    let next = table.modules.len() as u32;
                    *module_index.entry(name.to_owned()).or_insert_with(|| {
                        table.modules.push(format!("[{name}]"));
                        next
                    })
                }
            };
            table.entries.push(KernelEntry {
                addr: symbol.addr,
                name_at: table.names.len(),
                name_len: symbol.name.len() as u16,
                module,
                is_text: matches!(symbol.kind, b't' | b'T' | b'w' | b'W'),
                rank: kind_rank(symbol.kind),
            });
            table.names.push_str(symbol.name);
        }
        if parsed > 0 && table.entries.iter().all(|e| e.addr == 0) {
            return Err(KallsymsError::AddressesHidden { symbols: parsed });
        }
        if !table.entries.iter().any(|e| e.is_text) {
            return Err(KallsymsError::NoTextSymbols {
                malformed_lines: table.stats.malformed_lines,
            });
        }
        // Stable: at one address the best-ranked symbol, then the first listed, is kept.
        table.entries.sort_by_key(|e| (e.addr, e.rank));
        table.entries.dedup_by_key(|e| e.addr);
        Ok(table)
    }

    /// The text symbol holding `addr`: the last symbol at or below it, if that is a text symbol
    /// and another symbol follows it (which bounds it).
    pub fn lookup(&self, addr: u64) -> Option<KernelSymbol<'_>> {
        let after = self.entries.partition_point(|e| e.addr <= addr);
        let entry = self.entries.get(after.checked_sub(1)?)?;
        let bounded = after < self.entries.len();
        (entry.is_text && bounded).then(|| KernelSymbol {
            name: &self.names[entry.name_at..][..usize::from(entry.name_len)],
            offset: addr - entry.addr,
            module: &self.modules[entry.module as usize],
        })
    }

    /// Symbols kept (several at one address counted once).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Aliases are common (`__do_sys_getpid`, `__ia32_sys_getpid` and `__x64_sys_getpid` share an
/// address): global text names an address before weak text, weak before local, and text before
/// anything else, as in ELF symbol tables.
fn kind_rank(kind: u8) -> u8 {
    match kind {
        b'T' => 0,
        b'W' => 1,
        b't' => 2,
        b'w' => 3,
        _ => 4,
    }
}

struct Line<'a> {
    addr: u64,
    kind: u8,
    name: &'a str,
    module: Option<&'a str>,
}

/// `ffffffff81000000 T _stext` or `ffffffffc0a01000 t ext4_fill_super\t[ext4]`.
fn parse_line(line: &[u8]) -> Option<Line<'_>> {
    let line = std::str::from_utf8(line).ok()?;
    let mut fields = line.split([' ', '\t']).filter(|f| !f.is_empty());
    let addr = fields.next()?;
    let kind = fields.next()?;
    let name = fields.next()?;
    let module = match fields.next() {
        Some(module) => Some(module.strip_prefix('[')?.strip_suffix(']')?),
        None => None,
    };
    let valid_kind = kind.len() == 1 && kind.as_bytes()[0].is_ascii_alphabetic();
    let valid_module =
        module.is_none_or(|m| !m.is_empty() && m.len() <= MAX_KERNEL_MODULE_NAME_BYTES);
    if fields.next().is_some()
        || addr.len() > 16
        || !valid_kind
        || name.len() > MAX_KERNEL_SYMBOL_NAME_BYTES
        || !valid_module
    {
        return None;
    }
    Some(Line { addr: u64::from_str_radix(addr, 16).ok()?, kind: kind.as_bytes()[0], name, module })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81001000 t __do_sys_getpid
ffffffff81001000 T __x64_sys_getpid
ffffffff81001000 T __ia32_sys_getpid
ffffffff81001040 t do_getpid_helper
ffffffff81001080 W arch_weak_hook
ffffffff810010c0 D some_data
ffffffff82000000 T _etext
0000000000000000 A fixed_percpu_data
ffffffffc0a01000 t ext4_fill_super\t[ext4]
ffffffffc0a02000 t ext4_put_super\t[ext4]
ffffffffc0a03000 d ext4_fs_type\t[ext4]
ffffffffc0b00000 t bpf_prog_6deef7357e7b4530_detect\t[bpf]
";

    #[test]
    fn text_symbols_are_bounded_by_the_next_symbol() {
        let table = KernelSymbolTable::parse(KALLSYMS.as_bytes()).unwrap();
        assert_eq!(table.stats, KallsymsStats::default());
        // Symbols that share an address are one entry: the first global one names it.
        assert_eq!(table.len(), 10);
        let at = |addr| table.lookup(addr);
        assert_eq!(
            at(0xffff_ffff_8100_1007),
            Some(KernelSymbol { name: "__x64_sys_getpid", offset: 7, module: KERNEL_MODULE })
        );
        assert_eq!(at(0xffff_ffff_8100_1040).unwrap().name, "do_getpid_helper");
        assert_eq!(at(0xffff_ffff_8100_1090).unwrap().name, "arch_weak_hook");
        assert_eq!(at(0xffff_ffff_8100_0fff).unwrap().name, "_stext");
        // Inside a data symbol, before the first symbol, after the last one: unnamed.
        assert_eq!(at(0xffff_ffff_8100_10c8), None);
        assert_eq!(at(0xffff_ffff_80ff_ffff), None);
        assert_eq!(at(0xffff_ffff_c0b0_0010), None);
        assert_eq!(
            at(0xffff_ffff_c0a0_1010),
            Some(KernelSymbol { name: "ext4_fill_super", offset: 0x10, module: "[ext4]" })
        );
        assert_eq!(at(0xffff_ffff_c0a0_2fff).unwrap().module, "[ext4]");
        assert_eq!(at(0xffff_ffff_c0a0_3000), None, "ext4_fs_type is data");
    }

    #[test]
    fn zero_addresses_mean_the_reader_may_not_see_them() {
        let hidden =
            KALLSYMS.lines().map(|l| format!("0000000000000000{}\n", &l[16..])).collect::<String>();
        assert_eq!(
            KernelSymbolTable::parse(hidden.as_bytes()).unwrap_err(),
            KallsymsError::AddressesHidden { symbols: 14 }
        );
    }

    #[test]
    fn malformed_lines_are_counted_and_skipped() {
        let long_name = "x".repeat(MAX_KERNEL_SYMBOL_NAME_BYTES + 1);
        let text = format!(
            "ffffffff81000000 T start\n\
             not-hex T bad\n\
             ffffffff81000010 TT bad_kind\n\
             ffffffff81000020 t {long_name}\n\
             ffffffff81000030 t no_bracket\text4\n\
             ffffffff81000040 t one two three four\n\
             ffffffff81000050\n\
             ffffffff81000060 T end\n"
        );
        let table = KernelSymbolTable::parse(text.as_bytes()).unwrap();
        assert_eq!(table.stats, KallsymsStats { malformed_lines: 6, past_limit: 0 });
        assert_eq!(table.len(), 2);
        assert_eq!(table.lookup(0xffff_ffff_8100_0050).unwrap().offset, 0x50);
        assert_eq!(
            KernelSymbolTable::parse(b"garbage\n").unwrap_err(),
            KallsymsError::NoTextSymbols { malformed_lines: 1 }
        );
        assert_eq!(
            KernelSymbolTable::parse(b"").unwrap_err(),
            KallsymsError::NoTextSymbols { malformed_lines: 0 }
        );
    }
}
