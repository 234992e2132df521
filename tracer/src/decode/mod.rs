//! Pure decoders of untrusted bytes. Nothing in here does I/O; every function takes byte slices
//! and returns typed errors with the offset of the problem instead of panicking.
pub mod nettrace;
pub mod user_events;
