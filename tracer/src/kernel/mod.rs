//! Thin I/O layers over kernel interfaces (BPF, tracefs, procfs). Decoding lives in the
//! `tracer-decode` crate.
pub mod bpf_probe;
pub mod detect;
pub mod ftrace_reader;
pub mod privileges;
pub mod procfs;
pub mod tracefs;
pub mod user_events;
