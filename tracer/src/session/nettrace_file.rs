//! `tracer run --nettrace-dir DIR`: each streaming session's nettrace stream, byte for byte as
//! the runtime sent it, in a file of its own — what dotnet-trace writes, so PerfView, TraceEvent
//! and `dotnet-trace convert` open it — while tracer decodes the same bytes to JSON lines.
//!
//! The file is created like the JSON output (mode 0600, never through a symlink, never over an
//! existing file). It is complete (ends with the end-of-stream tag) when the session ended
//! normally; otherwise its `session_ended` says it is truncated. A failed write (disk full)
//! stops writing that file, counted and reported, while the session goes on.
//!
//! A user_events session has no stream: its records arrive through ftrace. [`RecordsFile`]
//! writes them as a NetTrace stream of their own (`tracer_decode::nettrace::writer`): the
//! metadata each event's first record carried (native runtime events get provider and id
//! only), one event per record with its thread, timestamp and payload bytes, a sequence point
//! and the end tag when the session ends.
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use tracer_decode::nettrace::payload::fitting_version;
use tracer_decode::nettrace::writer::{
    BlobEvent, NettraceWriter, TraceHeader, native_event_metadata,
};

use crate::output::{NettraceFileTotals, private_file};
use crate::time::{Clock, monotonic_ns, realtime_ns, utc_fields};

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
        let opened = private_file().create_new(true).open(&path);
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

    fn fail(&mut self, e: impl std::fmt::Display) {
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

/// Events of distinct (tracepoint, event id) and distinct threads a [`RecordsFile`] keeps track
/// of; a session past either stops its file (reported), its JSON lines go on.
pub const MAX_RECORDS_FILE_KEYS: usize = 65_536;

/// A user_events session's records as a NetTrace stream (see the module documentation).
pub struct RecordsFile {
    file: NettraceFile,
    writer: NettraceWriter,
    /// (tracepoint, event id) → its metadata id in the file.
    metadata_ids: HashMap<(String, u16), u32>,
    /// Capture thread → the last sequence number given to its events.
    sequences: HashMap<u64, u32>,
    /// The target's pointer size (native event templates have pointer-sized fields).
    pointer_size: u32,
}

/// One record of a [`RecordsFile`].
pub struct FileRecord<'a> {
    pub tracepoint: &'a str,
    pub provider: &'a str,
    pub event_id: u16,
    /// The metadata the record carried (provider name first), if any.
    pub metadata: Option<&'a [u8]>,
    pub thread: u64,
    pub timestamp: i64,
    pub activity_id: [u8; 16],
    pub related_activity_id: [u8; 16],
    pub payload: &'a [u8],
}

impl RecordsFile {
    /// Creates the file (named like a streaming session's, with `name_id` in the session id's
    /// place) and writes its prologue and Trace object: timestamps are CLOCK_MONOTONIC
    /// nanoseconds, like the records'.
    pub fn create(
        dir: &Path,
        pid: u32,
        name_id: u64,
        pointer_size: u32,
        clock: &Clock,
    ) -> RecordsFile {
        let mut file = NettraceFile::create(dir, pid, name_id, clock);
        let header = TraceHeader {
            sync_time_utc: utc_fields(i128::from(realtime_ns())),
            sync_timestamp: monotonic_ns() as i64,
            timestamp_frequency: 1_000_000_000,
            pointer_size,
            process_id: pid,
            processors: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            sampling_interval_ns: 1_000_000,
        };
        let (writer, start) = NettraceWriter::start(&header);
        file.write(&start);
        RecordsFile {
            file,
            writer,
            metadata_ids: HashMap::new(),
            sequences: HashMap::new(),
            pointer_size,
        }
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Appends one record (its metadata first, the first time its event appears).
    pub fn record(&mut self, r: &FileRecord<'_>) {
        if self.file.out.is_none() {
            return;
        }
        let key = (r.tracepoint.to_owned(), r.event_id);
        let metadata_id = match self.metadata_ids.get(&key) {
            Some(&id) => id,
            None if self.metadata_ids.len() >= MAX_RECORDS_FILE_KEYS => {
                return self
                    .file
                    .fail(format!("more than {MAX_RECORDS_FILE_KEYS} distinct events"));
            }
            None => {
                let id = self.metadata_ids.len() as u32 + 1;
                let metadata = r.metadata.map_or_else(
                    || {
                        let event_id = r.event_id.into();
                        let version =
                            fitting_version(r.provider, event_id, r.payload, self.pointer_size);
                        Cow::Owned(native_event_metadata(
                            r.provider,
                            event_id,
                            version.unwrap_or(0),
                        ))
                    },
                    Cow::Borrowed,
                );
                let block = self.writer.metadata_block(id, &metadata, r.timestamp);
                self.file.write(&block);
                self.metadata_ids.insert(key, id);
                id
            }
        };
        if !self.sequences.contains_key(&r.thread) && self.sequences.len() >= MAX_RECORDS_FILE_KEYS
        {
            return self.file.fail(format!("more than {MAX_RECORDS_FILE_KEYS} threads"));
        }
        let sequence = self.sequences.entry(r.thread).or_insert(0);
        *sequence += 1;
        let block = self.writer.event_block(&[BlobEvent {
            metadata_id,
            sequence: *sequence,
            thread_id: r.thread,
            capture_thread_id: r.thread,
            processor: 0,
            timestamp: r.timestamp,
            activity_id: r.activity_id,
            related_activity_id: r.related_activity_id,
            payload: r.payload,
        }]);
        self.file.write(&block);
    }

    /// Ends the stream (sequence point, end tag) and closes the file.
    pub fn finish(mut self) -> NettraceFileTotals {
        let mut threads: Vec<(u64, u32)> = self.sequences.into_iter().collect();
        threads.sort_unstable();
        let sequence_point = self.writer.sequence_point(monotonic_ns() as i64, &threads);
        self.file.write(&sequence_point);
        let end = self.writer.end();
        self.file.write(&end);
        self.file.finish(true)
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
