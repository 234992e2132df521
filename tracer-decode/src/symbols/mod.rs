//! Names of native and kernel stack frames: function symbols of ELF files (with their sizes, so
//! an address is named only by the symbol that holds it), the build-id and debug link that lead
//! to a separate debug file, the load segments that turn a file offset into a symbol address,
//! demangling, and `/proc/kallsyms` (docs/protocol/profiling.md, "Naming native and kernel
//! frames").
pub mod demangle;
pub mod elf;
#[cfg(any(test, feature = "elf-encoder"))]
pub mod encode;
pub mod kallsyms;

pub use demangle::demangle;
pub use elf::{DebugLink, ElfError, ElfImage, FoundSymbol, LoadSegment, SymbolTable};
pub use kallsyms::{KallsymsError, KernelSymbol, KernelSymbolTable};
