//! `tracer profile`: where .NET processes spend CPU and wait, sampled in the kernel, every frame
//! named without writing into the target (docs/protocol/profiling.md).
pub mod methods;
