//! .NET diagnostic IPC: locating a runtime's socket safely and sending commands.

pub mod client;
pub mod providers;
pub mod socket;
