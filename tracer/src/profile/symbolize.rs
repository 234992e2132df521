//! Names of native and kernel frames, read without writing into the target: ELF symbols of the
//! files a process maps (and of their separate debug files), and `/proc/kallsyms`
//! (docs/protocol/profiling.md, "Naming native and kernel frames").
//!
//! Every file read here may belong to a process tracer does not trust: files are opened as
//! `O_PATH` first and read only when they are regular files, paths of the target are resolved
//! inside its root (`openat2(RESOLVE_IN_ROOT)`: no symlink leads out), reads are bounded by the
//! constants below, decoding is `tracer_decode::symbols` (pure, fuzzed), and every file that
//! could not be read or named is counted in [`SymbolizeCounters`].
use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use tracer_decode::procfs::parse_maps_columns;
use tracer_decode::symbols::elf::{Ignored, LoadSegment, SymbolTable, file_offset_to_vaddr};
use tracer_decode::symbols::kallsyms::KallsymsStats;
use tracer_decode::symbols::{
    DebugLink, ElfError, ElfImage, KernelSymbol, KernelSymbolTable, demangle,
};
use tracer_decode::text::escape_control;

use crate::ipc::socket::{fstat, openat2};
use crate::kernel::procfs::read_bounded;

/// Bytes read from `/proc/kallsyms` (some 2×10^5 lines of ~40 bytes with modules loaded).
pub const MAX_KALLSYMS_BYTES: u64 = 64 << 20;
/// Bytes read from `/proc/<pid>/maps` (`vm.max_map_count`, 65530 by default, lines of at most
/// ~4 KiB each with a PATH_MAX path; typical lines are ~100 bytes). Lines past it are not seen.
pub const MAX_MAPS_BYTES: u64 = 16 << 20;
/// Size of an ELF file (mapped, or a separate debug file) read whole to name its frames. Larger
/// files (a debug file with much DWARF) are refused and counted.
pub const MAX_ELF_FILE_BYTES: u64 = 256 << 20;
/// Files whose symbols (or whose refusal) a [`NativeSymbolizer`] remembers. The oldest is
/// forgotten first.
pub const MAX_CACHED_FILES: usize = 1024;
/// Heap bytes of the symbol tables a [`NativeSymbolizer`] remembers, all files together.
pub const MAX_CACHED_SYMBOL_BYTES: usize = 512 << 20;
/// Where distributions install separate debug files (by build-id and by path).
const DEBUG_DIR: &str = "/usr/lib/debug";
/// Bytes that tell an ELF file from anything else: `e_ident`, which starts with `\x7fELF`.
const ELF_IDENT_LEN: usize = 16;
/// What procfs appends to the path of a mapped file that was unlinked.
const DELETED_SUFFIX: &str = " (deleted)";

/// Kernel symbols from `/proc/kallsyms`.
#[derive(Debug)]
pub struct KernelSymbols {
    table: KernelSymbolTable,
    truncated: bool,
}

impl KernelSymbols {
    /// Reads `/proc/kallsyms`; an error when its addresses are hidden (not root, or
    /// `kernel.kptr_restrict=2`) or it names no text.
    pub fn load() -> Result<KernelSymbols> {
        let path = Path::new("/proc/kallsyms");
        let (mut text, truncated) = read_bounded(path, MAX_KALLSYMS_BYTES)
            .with_context(|| format!("reading {}", path.display()))?;
        if truncated {
            // The last line is incomplete: a prefix of a name must not be taken for the name.
            text.truncate(text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1));
            log::warn!(
                "{} exceeds {MAX_KALLSYMS_BYTES} bytes: later symbols are unnamed",
                path.display()
            );
        }
        let table = KernelSymbolTable::parse(&text)
            .with_context(|| format!("reading kernel symbols from {}", path.display()))?;
        Ok(KernelSymbols { table, truncated })
    }

    /// The kernel function holding `addr`, with the offset into it and its module
    /// (`[kernel]` for the kernel image).
    pub fn lookup(&self, addr: u64) -> Option<KernelSymbol<'_>> {
        self.table.lookup(addr)
    }

    /// Lines left out.
    pub fn stats(&self) -> KallsymsStats {
        self.table.stats
    }

    /// `/proc/kallsyms` was longer than [`MAX_KALLSYMS_BYTES`]: symbols past it are unnamed.
    pub fn truncated(&self) -> bool {
        self.truncated
    }
}

/// A mapping of `/proc/<pid>/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    /// Exclusive.
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    /// 0 for anonymous memory.
    pub inode: u64,
    /// As the process sees it (in its mount namespace), or `[heap]`, `[stack]`, `[vdso]`; empty
    /// for anonymous memory.
    pub path: String,
}

impl Mapping {
    /// The module a frame in this mapping is reported in: its path, or `[anon]`.
    pub fn module(&self) -> &str {
        if self.path.is_empty() { "[anon]" } else { &self.path }
    }
}

/// The mappings of one process, sorted by address.
#[derive(Clone, Debug)]
pub struct ProcessMaps {
    pid: u32,
    mappings: Vec<Mapping>,
}

impl ProcessMaps {
    /// Reads `/proc/<pid>/maps` (at most [`MAX_MAPS_BYTES`]).
    pub fn read(pid: u32) -> Result<ProcessMaps> {
        let path = PathBuf::from(format!("/proc/{pid}/maps"));
        let (text, truncated) = read_bounded(&path, MAX_MAPS_BYTES)
            .with_context(|| format!("reading {}", path.display()))?;
        if truncated {
            log::warn!(
                "{} exceeds {MAX_MAPS_BYTES} bytes: later mappings are not seen",
                path.display()
            );
        }
        Ok(ProcessMaps::parse(pid, &String::from_utf8_lossy(&text)))
    }

    /// The mappings of a `maps` text (lines that do not parse are left out; a truncated last
    /// line does not parse).
    pub fn parse(pid: u32, maps: &str) -> ProcessMaps {
        let mut mappings: Vec<Mapping> = maps
            .lines()
            .filter_map(parse_maps_columns)
            .map(|m| Mapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                dev_major: m.dev_major,
                dev_minor: m.dev_minor,
                inode: m.inode,
                path: m.path.to_owned(),
            })
            .collect();
        mappings.sort_by_key(|m| m.start);
        ProcessMaps { pid, mappings }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The mapping holding `addr`.
    pub fn mapping(&self, addr: u64) -> Option<&Mapping> {
        let after = self.mappings.partition_point(|m| m.start <= addr);
        let mapping = self.mappings.get(after.checked_sub(1)?)?;
        (addr < mapping.end).then_some(mapping)
    }
}

/// A user-space frame as named by a [`NativeSymbolizer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeFrame {
    /// The demangled function name, or `<module>+0x<module_offset>` when it cannot be named.
    pub name: String,
    /// The mapped file as the process sees it, `[anon]`, `[heap]`, `[stack]`, `[vdso]`,
    /// `/memfd:doublemapper (deleted)`, … (`[unmapped]` for an address outside every mapping).
    pub module: String,
    /// Offset of the address in the module's file (for anonymous memory: from the mapping's
    /// start; for `[unmapped]`: the address itself).
    pub module_offset: u64,
    /// Offset of the address into the named function; `None` when unnamed.
    pub symbol_offset: Option<u64>,
}

impl NativeFrame {
    pub fn named(&self) -> bool {
        self.symbol_offset.is_some()
    }

    fn unnamed(module: &str, module_offset: u64) -> NativeFrame {
        NativeFrame {
            name: format!("{module}+{module_offset:#x}"),
            module: module.to_owned(),
            module_offset,
            symbol_offset: None,
        }
    }
}

/// Names and paths come from other processes: printed with control characters escaped.
impl fmt::Display for NativeFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", escape_control(&self.name), escape_control(&self.module))
    }
}

/// What a [`NativeSymbolizer`] could not read or name, for the profile summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolizeCounters {
    /// ELF files whose symbols were read (mapped files and debug files).
    pub files_loaded: u64,
    /// Separate debug files whose symbols named a stripped file's frames.
    pub debug_files_used: u64,
    /// Files larger than [`MAX_ELF_FILE_BYTES`].
    pub files_too_big: u64,
    /// Files that are not ELF (a PE `.dll`, a JIT memfd): expected, their frames are named
    /// elsewhere or not at all.
    pub files_not_elf: u64,
    /// ELF files that are not x86_64 64-bit little-endian executables or shared objects.
    pub files_unsupported: u64,
    /// ELF files whose headers or tables do not fit the file.
    pub files_malformed: u64,
    /// Mapped files that could be neither opened nor read (gone, not a regular file, denied).
    pub files_unreadable: u64,
    /// Mapped files reached by path whose path now names another file (replaced on disk).
    pub files_replaced: u64,
    /// Debug files found whose build-id or CRC did not match the stripped file.
    pub debug_files_mismatched: u64,
    /// Symbol tables cut at the decoder's bounds.
    pub symbol_tables_cut: u64,
    /// ELF files read with a malformed build-id note, debug link or note section left out.
    pub files_with_ignored_parts: u64,
    /// Files forgotten because the cache was full.
    pub cache_evictions: u64,
    pub frames_named: u64,
    pub frames_unnamed: u64,
}

impl SymbolizeCounters {
    /// The refusals, by name, with their counts (zero counts left out).
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        [
            ("file_too_big", self.files_too_big),
            ("not_elf", self.files_not_elf),
            ("unsupported_elf", self.files_unsupported),
            ("malformed_elf", self.files_malformed),
            ("unreadable", self.files_unreadable),
            ("replaced", self.files_replaced),
            ("debug_file_mismatch", self.debug_files_mismatched),
            ("symbol_table_cut", self.symbol_tables_cut),
            ("ignored_elf_parts", self.files_with_ignored_parts),
        ]
        .into_iter()
        .filter(|(_, count)| *count > 0)
        .collect()
    }
}

/// A mapped file, as procfs identifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileKey {
    dev_major: u32,
    dev_minor: u32,
    inode: u64,
}

/// What a file offers to name frames: its segments and symbols (perhaps of its debug file), or
/// nothing (remembered so that a refused file is not read again for every frame).
enum Module {
    Symbols { segments: Vec<LoadSegment>, symbols: SymbolTable },
    Unnamed,
}

impl Module {
    fn heap_bytes(&self) -> usize {
        match self {
            Module::Symbols { segments, symbols } => {
                symbols.heap_bytes() + segments.capacity() * size_of::<LoadSegment>()
            }
            Module::Unnamed => 0,
        }
    }
}

/// Names user-space addresses of processes from the ELF symbols of the files they map. Each file
/// is read once (by device and inode) and remembered within [`MAX_CACHED_FILES`] and
/// [`MAX_CACHED_SYMBOL_BYTES`].
#[derive(Default)]
pub struct NativeSymbolizer {
    modules: HashMap<FileKey, Module>,
    /// Keys in the order they were loaded: the first is forgotten first.
    loaded: VecDeque<FileKey>,
    cached_bytes: usize,
    counters: SymbolizeCounters,
}

impl NativeSymbolizer {
    pub fn new() -> NativeSymbolizer {
        NativeSymbolizer::default()
    }

    pub fn counters(&self) -> &SymbolizeCounters {
        &self.counters
    }

    /// Names the user-space address `addr` of the process `maps` was read from.
    pub fn symbolize(&mut self, maps: &ProcessMaps, addr: u64) -> NativeFrame {
        let frame = self.frame(maps, addr);
        if frame.named() {
            self.counters.frames_named += 1;
        } else {
            self.counters.frames_unnamed += 1;
        }
        frame
    }

    fn frame(&mut self, maps: &ProcessMaps, addr: u64) -> NativeFrame {
        let Some(mapping) = maps.mapping(addr) else {
            return NativeFrame::unnamed("[unmapped]", addr);
        };
        let module_offset = mapping.offset.wrapping_add(addr - mapping.start);
        if mapping.inode == 0 {
            return NativeFrame::unnamed(mapping.module(), module_offset);
        }
        let key = FileKey {
            dev_major: mapping.dev_major,
            dev_minor: mapping.dev_minor,
            inode: mapping.inode,
        };
        if !self.modules.contains_key(&key) {
            let module = self.load(maps.pid(), mapping);
            self.remember(key, module);
        }
        let Some(Module::Symbols { segments, symbols }) = self.modules.get(&key) else {
            return NativeFrame::unnamed(mapping.module(), module_offset);
        };
        let found = file_offset_to_vaddr(segments, module_offset).and_then(|v| symbols.lookup(v));
        match found {
            Some(symbol) => NativeFrame {
                name: demangle(&symbol.name).into_owned(),
                module: mapping.module().to_owned(),
                module_offset,
                symbol_offset: Some(symbol.offset),
            },
            None => NativeFrame::unnamed(mapping.module(), module_offset),
        }
    }

    fn remember(&mut self, key: FileKey, module: Module) {
        let bytes = module.heap_bytes();
        while self.modules.len() >= MAX_CACHED_FILES
            || self.cached_bytes + bytes > MAX_CACHED_SYMBOL_BYTES
        {
            let Some(oldest) = self.loaded.pop_front() else { break };
            if let Some(gone) = self.modules.remove(&oldest) {
                self.cached_bytes -= gone.heap_bytes();
                self.counters.cache_evictions += 1;
            }
        }
        self.cached_bytes += bytes;
        self.loaded.push_back(key);
        self.modules.insert(key, module);
    }

    fn load(&mut self, pid: u32, mapping: &Mapping) -> Module {
        match self.read_module(pid, mapping) {
            Ok(module) => module,
            Err(refusal) => {
                log::debug!(
                    "pid {pid}: no symbols for {}: {refusal}",
                    escape_control(&mapping.path)
                );
                self.count(&refusal);
                Module::Unnamed
            }
        }
    }

    fn count(&mut self, refusal: &Refusal) {
        let counter = match refusal {
            Refusal::TooBig { .. } => &mut self.counters.files_too_big,
            Refusal::Elf(ElfError::NotElf { .. }) => &mut self.counters.files_not_elf,
            Refusal::Elf(ElfError::Malformed { .. }) => &mut self.counters.files_malformed,
            Refusal::Elf(_) => &mut self.counters.files_unsupported,
            Refusal::Unreadable { .. } => &mut self.counters.files_unreadable,
            Refusal::Replaced { .. } => &mut self.counters.files_replaced,
        };
        *counter += 1;
    }

    fn read_module(&mut self, pid: u32, mapping: &Mapping) -> Result<Module, Refusal> {
        let file = open_mapped_file(pid, mapping)?;
        let image = self.read_elf(&file)?;
        let mut symbols = image.symbols;
        if symbols.stats.symtab_functions == 0
            && let Some(debug) = self.find_debug_symbols(
                pid,
                mapping,
                &file,
                image.build_id.as_deref(),
                image.debuglink.as_ref(),
            )
        {
            symbols = debug;
        }
        if symbols.stats.is_cut() {
            self.counters.symbol_tables_cut += 1;
        }
        Ok(Module::Symbols { segments: image.load_segments, symbols })
    }

    fn read_elf(&mut self, file: &OpenFile) -> Result<ElfImage, Refusal> {
        let bytes = file.read_all()?;
        let image = ElfImage::parse(&bytes).map_err(Refusal::Elf)?;
        self.counters.files_loaded += 1;
        self.count_ignored_parts(&image);
        Ok(image)
    }

    fn count_ignored_parts(&mut self, image: &ElfImage) {
        if image.ignored != Ignored::default() {
            self.counters.files_with_ignored_parts += 1;
        }
    }

    /// The symbols of the separate debug file of a file without `.symtab`: by build-id under
    /// `/usr/lib/debug/.build-id/`, then by its `.gnu_debuglink` name next to the file, in its
    /// `.debug/` directory and under `/usr/lib/debug/<its directory>/`; all inside the target's
    /// root. A candidate counts only when its build-id equals the file's, or (found by debug
    /// link) its CRC-32 is the one the link gives.
    fn find_debug_symbols(
        &mut self,
        pid: u32,
        mapping: &Mapping,
        binary: &OpenFile,
        build_id: Option<&[u8]>,
        debuglink: Option<&DebugLink>,
    ) -> Option<SymbolTable> {
        let root = open_root(pid).ok()?;
        let mut candidates: Vec<(PathBuf, Option<u32>)> = Vec::new();
        if let Some(id) = build_id {
            candidates.push((build_id_path(id), None));
        }
        if let Some(link) = debuglink {
            let name = OsStr::from_bytes(&link.file_name);
            let binary_path = mapping.path.strip_suffix(DELETED_SUFFIX).unwrap_or(&mapping.path);
            let dir = Path::new(binary_path).parent().unwrap_or(Path::new("/"));
            let under_debug_dir = Path::new(DEBUG_DIR).join(dir.strip_prefix("/").unwrap_or(dir));
            for dir in [dir.to_path_buf(), dir.join(".debug"), under_debug_dir] {
                candidates.push((dir.join(name), Some(link.crc32)));
            }
        }
        for (path, crc32) in candidates {
            let name = format!("{} in the root of {pid}", path.display());
            let file = match open_regular_in_root(&root, &path, &name) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    log::debug!("debug file {}: {e}", escape_control(&name));
                    continue;
                }
            };
            if file.same_file_as(binary) {
                continue;
            }
            let Ok(bytes) = file.read_all().inspect_err(|refusal| self.count(refusal)) else {
                continue;
            };
            let Ok(image) = ElfImage::parse(&bytes).map_err(|e| self.count(&Refusal::Elf(e)))
            else {
                continue;
            };
            self.count_ignored_parts(&image);
            let build_ids_match = build_id.is_some() && image.build_id.as_deref() == build_id;
            let build_ids_differ =
                build_id.is_some() && image.build_id.is_some() && !build_ids_match;
            let crc_matches = crc32.is_some_and(|crc| crc32fast::hash(&bytes) == crc);
            if build_ids_differ || !(build_ids_match || crc_matches) {
                self.counters.debug_files_mismatched += 1;
                continue;
            }
            self.counters.files_loaded += 1;
            if image.symbols.stats.symtab_functions > 0 {
                self.counters.debug_files_used += 1;
                return Some(image.symbols);
            }
        }
        None
    }
}

/// `/usr/lib/debug/.build-id/ab/cdef….debug` for build-id `abcdef…`.
fn build_id_path(id: &[u8]) -> PathBuf {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let (first, rest) = hex.split_at(2.min(hex.len()));
    Path::new(DEBUG_DIR).join(".build-id").join(first).join(format!("{rest}.debug"))
}

/// Why a file names no frames.
#[derive(Debug)]
enum Refusal {
    TooBig { size: u64 },
    Elf(ElfError),
    Unreadable { what: String, source: io::Error },
    Replaced { path: String, mapped_inode: u64, found_inode: u64 },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::TooBig { size } => {
                write!(f, "{size} bytes, more than the {MAX_ELF_FILE_BYTES} read")
            }
            Refusal::Elf(e) => write!(f, "{e}"),
            Refusal::Unreadable { what, source } => write!(f, "{}: {source}", escape_control(what)),
            Refusal::Replaced { path, mapped_inode, found_inode } => write!(
                f,
                "{} is now inode {found_inode}, the mapped file was inode {mapped_inode}",
                escape_control(path)
            ),
        }
    }
}

/// A regular file opened for reading, with what `fstat` said of it.
struct OpenFile {
    file: File,
    stat: libc::stat,
    /// How it was reached, for messages.
    name: String,
}

impl OpenFile {
    /// The whole file, at most [`MAX_ELF_FILE_BYTES`]; only its first bytes when they show it is
    /// not ELF (a JIT memfd may be large).
    fn read_all(&self) -> Result<Vec<u8>, Refusal> {
        let mut ident = [0u8; ELF_IDENT_LEN];
        let peeked = self
            .file
            .read_at(&mut ident, 0)
            .map_err(|source| Refusal::Unreadable { what: self.name.clone(), source })?;
        if let Err(not_elf @ ElfError::NotElf { .. }) = ElfImage::parse(&ident[..peeked]) {
            return Err(Refusal::Elf(not_elf));
        }
        let size = u64::try_from(self.stat.st_size).unwrap_or(0);
        if size > MAX_ELF_FILE_BYTES {
            return Err(Refusal::TooBig { size });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        // The file may grow after fstat: one byte more than the bound tells.
        (&self.file)
            .take(MAX_ELF_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| Refusal::Unreadable { what: self.name.clone(), source })?;
        if bytes.len() as u64 > MAX_ELF_FILE_BYTES {
            return Err(Refusal::TooBig { size: bytes.len() as u64 });
        }
        Ok(bytes)
    }

    fn same_file_as(&self, other: &OpenFile) -> bool {
        (self.stat.st_dev, self.stat.st_ino) == (other.stat.st_dev, other.stat.st_ino)
    }
}

/// The file behind `mapping`: through `/proc/<pid>/map_files/<start>-<end>` (the mapped file
/// itself, even deleted or in another mount namespace; root only), else by its path inside the
/// process's root, which must still be the mapped inode.
fn open_mapped_file(pid: u32, mapping: &Mapping) -> Result<OpenFile, Refusal> {
    let map_file = format!("/proc/{pid}/map_files/{:x}-{:x}", mapping.start, mapping.end);
    let map_file_error = match open_path(libc::AT_FDCWD, Path::new(&map_file), 0) {
        Ok(fd) => {
            return reopen_regular(fd, &map_file)
                .map_err(|source| Refusal::Unreadable { what: map_file, source });
        }
        Err(e) => e,
    };
    let path = &mapping.path;
    if !path.starts_with('/') || path.ends_with(DELETED_SUFFIX) {
        return Err(Refusal::Unreadable { what: map_file, source: map_file_error });
    }
    let name = format!("{path} in the root of {pid}");
    let unreadable = |source| Refusal::Unreadable { what: name.clone(), source };
    let root = open_root(pid).map_err(unreadable)?;
    let file = open_regular_in_root(&root, Path::new(path), &name).map_err(unreadable)?;
    if file.stat.st_ino != mapping.inode {
        return Err(Refusal::Replaced {
            path: path.clone(),
            mapped_inode: mapping.inode,
            found_inode: file.stat.st_ino,
        });
    }
    Ok(file)
}

/// `/proc/<pid>/root` as a directory fd for `RESOLVE_IN_ROOT`.
fn open_root(pid: u32) -> io::Result<OwnedFd> {
    let root = format!("/proc/{pid}/root");
    open_path(libc::AT_FDCWD, Path::new(&root), libc::O_DIRECTORY)
}

/// `path` resolved inside `root` (symlinks followed, but never out of it, and no magic links),
/// read only if it is a regular file; `name` says how it was reached.
fn open_regular_in_root(root: &OwnedFd, path: &Path, name: &str) -> io::Result<OpenFile> {
    let resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    let fd = openat2(root.as_raw_fd(), path, libc::O_PATH, resolve)?;
    reopen_regular(fd, name)
}

/// An `O_PATH` descriptor: opening one has no effect on what it names (a FIFO does not block,
/// a device is not opened).
fn open_path(dirfd: i32, path: &Path, flags: i32) -> io::Result<OwnedFd> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: c_path is NUL-terminated and outlives the call; the fd is owned below.
    let fd =
        unsafe { libc::openat(dirfd, c_path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the file an `O_PATH` descriptor names for reading, once `fstat` shows it is a regular
/// file (through `/proc/self/fd`, which reopens that very file, not a path).
fn reopen_regular(path_fd: OwnedFd, name: &str) -> io::Result<OpenFile> {
    let stat = fstat(&path_fd)?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    let file = File::open(format!("/proc/self/fd/{}", path_fd.as_raw_fd()))?;
    Ok(OpenFile { file, stat, name: name.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c6a00000-55d0c6a01000 r--p 00000000 08:01 1054 /usr/bin/app
55d0c6a01000-55d0c6a03000 r-xp 00001000 08:01 1054 /usr/bin/app
55d0c7000000-55d0c7021000 rw-p 00000000 00:00 0 [heap]
7f3a1d000000-7f3a1d400000 r-xs 00000000 00:01 2051 /memfd:doublemapper (deleted)
7f3a1e000000-7f3a1e001000 rw-p 00000000 00:00 0 
7ffd5e000000-7ffd5e021000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn addresses_find_their_mapping() {
        let maps = ProcessMaps::parse(7, MAPS);
        assert_eq!(maps.mappings.len(), 6);
        let module = |addr| maps.mapping(addr).map(Mapping::module);
        assert_eq!(module(0x55d0_c6a0_1000), Some("/usr/bin/app"));
        assert_eq!(maps.mapping(0x55d0_c6a0_2fff).map(|m| m.offset), Some(0x1000));
        assert_eq!(module(0x55d0_c6a0_3000), None, "between mappings");
        assert_eq!(module(0x7f3a_1e00_0010), Some("[anon]"));
        assert_eq!(module(0x7ffd_5e00_0000), Some("[stack]"));
        assert_eq!(module(0), None);
    }

    #[test]
    fn anonymous_memory_and_unmapped_addresses_are_unnamed_modules() {
        let maps = ProcessMaps::parse(std::process::id(), MAPS);
        let mut symbolizer = NativeSymbolizer::new();
        let heap = symbolizer.symbolize(&maps, 0x55d0_c700_0010);
        assert_eq!(
            heap,
            NativeFrame {
                name: "[heap]+0x10".to_owned(),
                module: "[heap]".to_owned(),
                module_offset: 0x10,
                symbol_offset: None,
            }
        );
        let outside = symbolizer.symbolize(&maps, 0x10);
        assert_eq!((outside.name.as_str(), outside.module_offset), ("[unmapped]+0x10", 0x10));
        assert_eq!(symbolizer.counters().frames_unnamed, 2);
        assert_eq!(symbolizer.counters().refusals(), []);
    }

    #[test]
    fn printed_frames_escape_what_other_processes_chose() {
        let frame = NativeFrame::unnamed("/tmp/x\u{1b}[2J", 4);
        assert_eq!(frame.to_string(), "/tmp/x\\u{1b}[2J+0x4 (/tmp/x\\u{1b}[2J)");
    }

    #[test]
    fn build_id_paths_split_the_first_byte() {
        assert_eq!(
            build_id_path(&[0xab, 0xcd, 0xef]),
            Path::new("/usr/lib/debug/.build-id/ab/cdef.debug")
        );
    }
}
