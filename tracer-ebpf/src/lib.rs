#![no_std]
// The programs are the `tracer-ebpf` binary (src/main.rs, src/programs.rs), built for
// bpfel-unknown-none by tracer's build.rs. This empty library only lets the crate take part in
// workspace-wide commands such as `cargo metadata`.
