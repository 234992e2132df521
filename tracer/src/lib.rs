//! tracer: in-kernel detection of .NET diagnostic IPC and Linux user_events, .NET diagnostic
//! sessions, and a memory-mapped ftrace ring-buffer consumer.
//!
//! Layout (one room per concern):
//! * [`decode`] — pure decoders of untrusted bytes (no I/O): BPF events, IPC codec, nettrace,
//!   ftrace pages and format files, user_events records. Unit-tested and fuzzed on slices.
//! * [`kernel`] — thin I/O layers: BPF loading/attach, tracefs, the mapped ftrace reader, procfs.
//! * [`ipc`] — locating and talking to a runtime's diagnostic socket.
//! * [`session`] — tracing sessions (streaming nettrace, user_events).
//! * [`pipeline`] — one per subcommand, wiring detection → sessions → decode → sinks.
//! * [`sink`] — output (JSON lines) and timestamps.
pub mod cli;
pub mod decode;
pub mod ipc;
pub mod kernel;
pub mod pipeline;
pub mod session;
pub mod sink;

/// The eBPF object built from `tracer-ebpf` by build.rs.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));
