//! Pure decoders of untrusted bytes. Nothing in here does I/O; every function takes byte slices
//! and returns typed errors with the offset of the problem instead of panicking.
pub mod bpf_event;
pub mod btf;
pub mod budget;
pub mod container;
pub mod counters;
pub mod ftrace;
pub mod names;

pub mod diagnostic_ipc;
pub mod json;
pub mod logging;
pub mod nettrace;
pub mod ordered;
pub mod otel_resource;
pub mod procfs;
pub mod profile_sample;
pub mod symbols;
pub mod text;
pub mod unix_socket;
pub mod user_events;
mod work;
