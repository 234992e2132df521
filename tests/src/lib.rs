//! Support code shared by the integration tests in `tests/tests/` and the helper programs in
//! `tests/src/bin/` that play the processes tracer observes.

pub mod audit_scenarios;
pub mod cgroups;
pub mod container;
pub mod coreclr;
pub mod detection;
pub mod double;
pub mod ftrace;
pub mod fuzz_seeds;
pub mod http;
pub mod native;
pub mod nettrace;
pub mod peer;
pub mod pipeline;
pub mod process;
pub mod procfs;
pub mod scratch;
pub mod tmux;
pub mod tools;
pub mod user_events;
