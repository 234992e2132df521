//! `tracer profile`: where .NET processes spend CPU and wait, sampled in the kernel, every frame
//! named without writing into the target (docs/protocol/profiling.md): the model ([`model`]),
//! the files profilers open ([`format`]), the names of native and kernel frames
//! ([`symbolize`]) and the runtime's own record of its methods ([`methods`]).
pub mod format;
pub mod methods;
pub mod model;
pub mod symbolize;

pub use self::model::{
    Frame, FrameId, FrameKind, LimitCounts, Mode, ProcessId, ProcessInfo, ProcessProfile,
    ProcessSummary, Profile, Sample, Symbol,
};
