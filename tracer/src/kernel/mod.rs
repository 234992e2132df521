//! Thin I/O layers over kernel interfaces (BPF, tracefs, procfs). Decoding lives in `decode`.
pub mod ftrace_reader;
pub mod privileges;
pub mod tracefs;
