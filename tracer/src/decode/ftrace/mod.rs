//! ftrace binary formats: `events/<sys>/<event>/format` files, ring-buffer pages and records.
pub mod format;
pub mod page;
pub mod record;
