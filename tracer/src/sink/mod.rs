//! Output side of the pipeline: timestamps and JSON-lines writers.
pub mod clock;
pub mod json;

pub use clock::Clock;
pub use json::JsonLines;
