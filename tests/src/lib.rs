//! Support code shared by the integration tests in `tests/tests/` and the helper programs in
//! `tests/src/bin/` that play the processes tracer observes.
pub mod ftrace;
