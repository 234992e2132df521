//! tracer's detection programs; see `programs.rs` (the sampling programs are the other binary,
//! `sampler/main.rs`). Built for `bpfel-unknown-none` by tracer's build.rs. On the host (e.g.
//! `cargo build --workspace`) this is an empty binary.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Atomic RMW on map values: the BPF target exposes no `AtomicU64::fetch_add`.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]
// The one atomic fetch-and-add (per-CPU sequence numbers): LLVM emits it only for BPF ISA v3,
// while these programs are generated for the default ISA.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
mod programs;
#[cfg(target_arch = "bpf")]
mod shared;

#[cfg(not(target_arch = "bpf"))]
fn main() {}
