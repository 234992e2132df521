//! Tracing sessions started over the diagnostic IPC (streaming nettrace, user_events).
pub mod streaming;
