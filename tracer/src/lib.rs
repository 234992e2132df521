//! tracer: in-kernel detection of .NET diagnostic IPC and Linux user_events, .NET diagnostic
//! sessions, and a memory-mapped ftrace ring-buffer consumer.
//!
//! Layout (one room per concern; the pure decoders of untrusted bytes are the `tracer-decode`
//! crate, the wire types shared with the eBPF programs `tracer-common`):
//! * [`kernel`] — thin I/O layers: BPF loading/attach, tracefs, the ftrace reader, procfs.
//! * [`ipc`] — locating and talking to a runtime's diagnostic socket.
//! * [`session`] — tracing sessions (streaming nettrace, user_events).
//! * [`registrations`] — the per-process user_events registration table.
//! * [`pipeline`] — one per subcommand, wiring detection → sessions → decode → output.
//! * [`output`] — every output line's schema and the JSON-lines writer.
//! * [`identity`] — a process's cgroup, container and pod, and the `run`/`audit` filters.
//! * [`export`] — `--otlp-endpoint`: output lines as OTLP log records.
//! * [`metrics`] — `--metrics-addr`: the Prometheus endpoint and health check.
//! * [`profile`] — sampled stack profiles, the names of their frames, and the files profilers
//!   open (pprof, speedscope, folded stacks, SVG flame graphs).
//! * [`top`] — `tracer top`'s model of each process, its screen and the terminal it takes.
//! * [`time`] — clock reads and monotonic → wall-clock conversion.
//! * [`cli`] — arguments of each subcommand and how a subcommand runs.
pub mod cli;
pub mod export;
pub mod identity;
pub mod ipc;
pub mod kernel;
pub mod metrics;
pub mod output;
pub mod pipeline;
pub mod profile;
pub mod registrations;
pub mod session;
pub mod summary;
pub mod time;
pub mod top;

/// The detection programs' eBPF object, built from `tracer-ebpf` by build.rs.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

/// The sampling programs' eBPF object (`tracer profile`), built from `tracer-ebpf` by build.rs.
pub static SAMPLER_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-sampler"));
