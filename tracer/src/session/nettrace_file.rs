//! `tracer run --nettrace-dir DIR`: each streaming session's nettrace stream, byte for byte as
//! the runtime sent it, in a file of its own — what dotnet-trace writes, so PerfView, TraceEvent
//! and `dotnet-trace convert` open it — while tracer decodes the same bytes to JSON lines.
//!
//! The file is created like the JSON output (mode 0600, never through a symlink, never over an
//! existing file). It is complete (ends with the end-of-stream tag) when the session ended
//! normally; otherwise its `session_ended` says it is truncated. A failed write (disk full)
//! stops writing that file, counted and reported, while the session goes on.
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crate::output::{NettraceFileTotals, OUTPUT_FILE_MODE};
use crate::time::Clock;

/// Characters of a process name kept in a file name.
const MAX_NAME_IN_FILE_NAME: usize = 32;

/// One session's file while the session runs.
pub struct NettraceFile {
    path: PathBuf,
    /// `None` once a write failed: nothing more is written.
    out: Option<BufWriter<File>>,
    /// The file after a failed write (for its final size).
    failed: Option<File>,
    /// Stream bytes handed to [`write`](Self::write).
    received: u64,
    error: Option<String>,
}

impl NettraceFile {
    /// Creates `DIR/<pid>_<process name>_<UTC now, YYYYMMDD_HHMMSS>_<session id>.nettrace`; when
    /// it cannot be created, the error is kept (and reported at the end) and nothing is written.
    pub fn create(dir: &Path, pid: u32, session_id: u64, clock: &Clock) -> NettraceFile {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let path = dir.join(file_name(pid, comm.trim_end(), session_id, clock));
        let opened = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(OUTPUT_FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path);
        let mut file = NettraceFile { path, out: None, failed: None, received: 0, error: None };
        match opened {
            Ok(f) => file.out = Some(BufWriter::with_capacity(64 << 10, f)),
            Err(e) => {
                log::error!(
                    "creating {}: {e}; this session's stream is not saved",
                    file.path.display()
                );
                file.error = Some(e.to_string());
            }
        }
        file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends bytes of the stream (after a failed write, they are only counted).
    pub fn write(&mut self, bytes: &[u8]) {
        self.received += bytes.len() as u64;
        if let Some(out) = &mut self.out
            && let Err(e) = out.write_all(bytes)
        {
            self.fail(e);
        }
    }

    fn fail(&mut self, e: std::io::Error) {
        log::error!(
            "writing {}: {e}; the file stays incomplete, tracing goes on",
            self.path.display()
        );
        self.error = Some(e.to_string());
        // What the buffer still holds never reaches the file.
        self.failed = self.out.take().map(|out| out.into_parts().0);
    }

    /// Flushes and closes the file; `complete` when the stream ended with its end tag.
    pub fn finish(mut self, complete: bool) -> NettraceFileTotals {
        let file = match self.out.take().map(BufWriter::into_inner) {
            Some(Ok(file)) => Some(file),
            Some(Err(e)) => {
                let (error, out) = e.into_parts();
                self.out = Some(out);
                self.fail(error);
                self.failed.take()
            }
            None => self.failed.take(),
        };
        let bytes = file.and_then(|f| f.metadata().ok()).map_or(0, |m| m.len());
        NettraceFileTotals {
            nettrace_file: self.path.to_string_lossy().into_owned(),
            nettrace_file_bytes: bytes,
            nettrace_file_complete: complete && self.error.is_none(),
            nettrace_file_unwritten_bytes: self.received.saturating_sub(bytes),
            nettrace_file_error: self.error,
        }
    }
}

/// The file name; the process name (which the process controls) keeps only `[A-Za-z0-9._-]`.
fn file_name(pid: u32, comm: &str, session_id: u64, clock: &Clock) -> String {
    let name: String = comm
        .chars()
        .take(MAX_NAME_IN_FILE_NAME)
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .collect();
    let name = if name.is_empty() || name.starts_with('.') { format!("_{name}") } else { name };
    let now = clock.iso8601(crate::time::monotonic_ns());
    // 2026-12-01T23:19:41.443Z → 20261201_231941
    let stamp: String = now.chars().take(19).filter(char::is_ascii_digit).collect();
    let (date, time) = stamp.split_at(stamp.len().min(8));
    format!("{pid}_{name}_{date}_{time}_{session_id:x}.nettrace")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_keep_only_safe_characters() {
        let clock = Clock::with_offset(0);
        let name = file_name(42, "../\u{1b}[2Jevil/name", 0x7f00, &clock);
        assert!(name.starts_with("42__.._"), "a leading dot is prefixed: {name}");
        let rest = name.strip_prefix("42_").unwrap();
        assert!(!rest.contains('/') && !rest.contains('\u{1b}'), "{name}");
        assert!(name.ends_with("_7f00.nettrace"), "{name}");
        assert_eq!(file_name(1, "", 1, &clock).split('_').nth(1), Some(""));
        assert!(file_name(1, ".hidden", 1, &clock).starts_with("1__.hidden_"));
    }
}
