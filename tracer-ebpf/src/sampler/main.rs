//! tracer's sampling programs for `tracer profile`; see `programs.rs`. A binary of its own — a
//! second BPF object — so that `tracer run` and `audit`, which load the detection object, never
//! create its stack maps (docs/protocol/profiling.md "Sampling in the kernel"). Built for
//! `bpfel-unknown-none` by tracer's build.rs; on the host an empty binary.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Atomic adds on map values (the loss counters): the BPF target exposes no `AtomicU64`.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod programs;
#[cfg(target_arch = "bpf")]
#[path = "../shared.rs"]
mod shared;

#[cfg(not(target_arch = "bpf"))]
fn main() {}
