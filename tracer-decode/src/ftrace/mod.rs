//! ftrace formats: `events/<sys>/<event>/format` files, ring-buffer pages and records, the
//! per-CPU stats text, and the stream logic shared by every ring-buffer transport.
pub mod format;
pub mod page;
pub mod record;
pub mod stats;
pub mod stream;
