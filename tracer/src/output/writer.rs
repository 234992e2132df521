//! The JSON-lines writer: one [`Line`] per line to stdout or a file, flushed per line so a
//! consumer (or a test) sees each event as soon as it is decoded — or, for the lines a pipeline
//! has at hand at once (a [`Batch`]: the events sessions have sent, a ring buffer's records),
//! flushed once for all of them: one `write` per batch instead of one per line.
//!
//! The output holds command lines and payloads of other users' processes: a file is created
//! `0600` and never through a symlink. `SIGHUP` (see [`ReopenRequest`]) reopens the file after
//! log rotation. A failed write (`EPIPE` from `tracer run | head -1`, `ENOSPC`) does not stop the
//! caller mid-line: the writer keeps the first error, counts every line it could not write from
//! then on, and the pipeline ends as if stopped (see [`JsonLines::failure`]). A write that does
//! not return (a pipe nobody reads, a hung filesystem) is timed ([`OutputWait`]): the metrics
//! endpoint, on another thread, says how long it has waited.
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Context as _;

use super::otlp::EncodedRecords;
use super::{Line, LineBody, WriteLine};
use crate::time::{Clock, monotonic_ns};

/// Mode of a new output file: it holds other users' command lines and event payloads.
pub const OUTPUT_FILE_MODE: u32 = 0o600;

/// Bytes buffered before a write: a batch of lines up to this size leaves in one `write`.
const OUTPUT_BUFFER_BYTES: usize = 256 * 1024;

pub struct JsonLines {
    out: Box<dyn Write + Send>,
    /// The file, when writing to one (reopened on request).
    path: Option<PathBuf>,
    reopen: ReopenRequest,
    /// The first write error; nothing is written after it.
    failure: Option<io::Error>,
    /// Lines not written because of `failure` (the failed one included).
    unwritten: u64,
    /// Lines handed to `out` since it was last flushed (lost with it if the flush fails).
    unflushed: u64,
    /// Inside a [`Batch`]: lines are flushed when it ends, not one by one.
    batching: bool,
    /// `--otlp-endpoint`: every line's record is also offered to the exporter (never waits).
    export: Option<Export>,
    /// Times the writes that reach stdout or the file.
    wait: OutputWait,
}

/// How long the write under way to the output has waited, read from another thread (the
/// metrics endpoint's): while a pipeline is blocked in a write it publishes nothing, and this
/// is what says so. A handle: clones share one clock.
#[derive(Debug, Clone, Default)]
pub struct OutputWait(Arc<AtomicU64>);

impl OutputWait {
    /// Seconds the write under way has waited; 0 when none is.
    pub fn seconds(&self) -> f64 {
        match self.0.load(Ordering::Relaxed) {
            0 => 0.0,
            since => monotonic_ns().saturating_sub(since) as f64 / 1e9,
        }
    }

    fn timing<T>(&self, write: impl FnOnce() -> T) -> T {
        // 0 means no write under way; CLOCK_MONOTONIC is never 0 after boot.
        self.0.store(monotonic_ns().max(1), Ordering::Relaxed);
        let done = write();
        self.0.store(0, Ordering::Relaxed);
        done
    }
}

/// The output under the line buffer: each write and flush that reaches it is timed.
struct Timed<W> {
    inner: W,
    wait: OutputWait,
}

impl<W: Write> Write for Timed<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.wait.timing(|| self.inner.write(bytes))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.wait.timing(|| self.inner.flush())
    }
}

/// The buffered writer of stdout or a file, its writes timed into `wait`.
fn buffered(out: impl Write + Send + 'static, wait: &OutputWait) -> Box<dyn Write + Send> {
    Box::new(BufWriter::with_capacity(
        OUTPUT_BUFFER_BYTES,
        Timed { inner: out, wait: wait.clone() },
    ))
}

/// Another consumer of every written line (the OTLP exporter's queue): offered the OTLP log
/// records of the lines as they are written. It must not wait: the writer is on the pipeline's
/// path.
pub trait LineTap: Send {
    fn offer_records(&self, records: &EncodedRecords);
    /// Counts lines that came without their records (a batch rendered without them).
    fn count_unencoded(&self, lines: u64);
}

/// Where [`JsonLines`] sends records, and the clock their lines were stamped with.
struct Export {
    tap: Box<dyn LineTap>,
    clock: Clock,
}

/// Set (by the SIGHUP handler) to make the writer reopen its file before the next line.
#[derive(Clone, Debug, Default)]
pub struct ReopenRequest(Arc<AtomicBool>);

impl ReopenRequest {
    pub fn request(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn take(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }
}

/// Lines rendered one after another into one buffer, each with its newline: written with one
/// copy, not one allocation and one write per line (a session's runtime events, handed to the
/// pipeline together). With `--otlp-endpoint`, each line's OTLP log record is encoded as the
/// line is rendered, so the exporter never reads the lines back.
#[derive(Debug, Default)]
pub struct LineBatch {
    bytes: Vec<u8>,
    lines: u64,
    /// The lines' records, when asked for.
    records: Option<EncodedRecords>,
}

impl LineBatch {
    /// An empty batch with room for `bytes` of lines; `otlp_records`: with the lines' records.
    pub fn with_capacity(bytes: usize, otlp_records: bool) -> LineBatch {
        LineBatch {
            bytes: Vec::with_capacity(bytes),
            lines: 0,
            records: otlp_records.then(EncodedRecords::default),
        }
    }

    /// Renders `line` at the end (and its record, when the batch has them; `clock` stamped
    /// the line), unless `keep` (told the bytes it takes, newline included) refuses it: then
    /// the batch is left as it was. Returns whether the line was kept.
    pub fn push_if(
        &mut self,
        line: &impl WriteLine,
        clock: &Clock,
        keep: impl FnOnce(usize) -> bool,
    ) -> bool {
        let start = self.bytes.len();
        line.write_json(&mut self.bytes);
        self.bytes.push(b'\n');
        if !keep(self.bytes.len() - start) {
            self.bytes.truncate(start);
            return false;
        }
        self.lines += 1;
        if let Some(records) = &mut self.records {
            line.push_otlp_record(&self.bytes[start..self.bytes.len() - 1], clock, records);
        }
        true
    }

    #[cfg(test)]
    pub fn records(&self) -> Option<&EncodedRecords> {
        self.records.as_ref()
    }

    /// The JSON text of the last line kept, without its newline (empty when none was).
    #[cfg(test)]
    pub fn last_line(&self) -> &[u8] {
        self.iter().last().unwrap_or_default()
    }

    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Bytes of the lines, newlines included.
    pub fn len_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines == 0
    }

    /// Each line's JSON text, without its newline (JSON text holds no raw newline).
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.bytes.split_inclusive(|&b| b == b'\n').map(|line| &line[..line.len() - 1])
    }
}

impl JsonLines {
    pub fn stdout() -> JsonLines {
        let mut sink = JsonLines::writer(io::sink());
        sink.out = buffered(io::stdout(), &sink.wait);
        sink
    }

    /// Creates (or truncates) `path`: mode 0600 when new, refused when `path` is a symlink.
    pub fn file(path: &Path) -> anyhow::Result<JsonLines> {
        let file = open_output(path, true)?;
        let mut sink = JsonLines::writer(io::sink());
        sink.out = buffered(file, &sink.wait);
        sink.path = Some(path.to_path_buf());
        Ok(sink)
    }

    /// `--output FILE` if given, else stdout.
    pub fn open(path: Option<&Path>) -> anyhow::Result<JsonLines> {
        match path {
            Some(p) => JsonLines::file(p),
            None => Ok(JsonLines::stdout()),
        }
    }

    /// Any writer (tests, in-memory sinks).
    pub fn writer(w: impl Write + Send + 'static) -> JsonLines {
        JsonLines {
            out: Box::new(w),
            path: None,
            reopen: ReopenRequest::default(),
            failure: None,
            unwritten: 0,
            unflushed: 0,
            batching: false,
            export: None,
            wait: OutputWait::default(),
        }
    }

    /// How long the write under way to stdout or the file has waited (writers given to
    /// [`JsonLines::writer`] are not timed).
    pub fn output_wait(&self) -> OutputWait {
        self.wait.clone()
    }

    /// The handle that makes this writer reopen its file (no effect on other writers).
    pub fn reopen_request(&self) -> ReopenRequest {
        self.reopen.clone()
    }

    /// Writes one line (or counts it as unwritten once the output has failed).
    pub fn emit<B: LineBody>(&mut self, line: &Line<B>) {
        let mut bytes = Vec::with_capacity(512);
        line.write_json(&mut bytes);
        if let Some(Export { tap, clock }) = &self.export {
            let mut record = EncodedRecords::default();
            line.push_otlp_record(&bytes, clock, &mut record);
            tap.offer_records(&record);
        }
        bytes.push(b'\n');
        self.write_lines(&bytes, 1);
    }

    /// Writes a batch's lines with one copy (or counts them unwritten once the output has
    /// failed), and offers the exporter their records.
    pub fn emit_batch(&mut self, batch: &LineBatch) {
        if let Some(export) = &self.export {
            match &batch.records {
                Some(records) => export.tap.offer_records(records),
                None => export.tap.count_unencoded(batch.lines),
            }
        }
        self.write_lines(&batch.bytes, batch.lines);
    }

    /// `bytes`: `lines` whole lines with their newlines.
    fn write_lines(&mut self, bytes: &[u8], lines: u64) {
        if self.failure.is_some() {
            self.unwritten += lines;
            return;
        }
        let written = self.before_line().and_then(|()| {
            self.unflushed += lines;
            // Lines and their newlines in one piece.
            self.out.write_all(bytes)
        });
        match written {
            Err(e) => self.fail(e),
            Ok(()) if !self.batching => self.flush(),
            Ok(()) => {}
        }
    }

    /// Lines written until the batch is dropped leave together, in one flush.
    pub fn batch(&mut self) -> Batch<'_> {
        self.batching = true;
        Batch(self)
    }

    fn flush(&mut self) {
        if self.failure.is_some() {
            return;
        }
        match self.out.flush() {
            Ok(()) => self.unflushed = 0,
            Err(e) => self.fail(e),
        }
    }

    /// Keeps the first error; the lines not flushed yet count as unwritten.
    fn fail(&mut self, e: io::Error) {
        self.failure = Some(e);
        self.unwritten += self.unflushed;
        self.unflushed = 0;
    }

    /// From now on every line's record is also offered to `tap` (`--otlp-endpoint`); `clock`
    /// is the one the pipeline stamps its lines with.
    pub fn export_to(&mut self, tap: impl LineTap + 'static, clock: Clock) {
        self.export = Some(Export { tap: Box::new(tap), clock });
    }

    /// Lets go of the exporter's queue, so that it can finish.
    pub fn stop_export(&mut self) {
        self.export = None;
    }

    /// The first write error, once the output has failed.
    pub fn failure(&self) -> Option<&io::Error> {
        self.failure.as_ref()
    }

    /// Lines that could not be written.
    pub fn unwritten(&self) -> u64 {
        self.unwritten
    }

    fn before_line(&mut self) -> io::Result<()> {
        if let Some(path) = &self.path
            && self.reopen.take()
        {
            self.out.flush()?;
            self.unflushed = 0;
            // Appends: after rotation the name is new (or truncated by the rotator).
            let file = open_output(path, false).map_err(io::Error::other)?;
            self.out = buffered(file, &self.wait);
            log::info!("reopened {}", path.display());
        }
        Ok(())
    }
}

/// Lines a pipeline writes together (see [`JsonLines::batch`]); flushed when dropped.
pub struct Batch<'a>(&'a mut JsonLines);

impl Deref for Batch<'_> {
    type Target = JsonLines;

    fn deref(&self) -> &JsonLines {
        self.0
    }
}

impl DerefMut for Batch<'_> {
    fn deref_mut(&mut self) -> &mut JsonLines {
        self.0
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.0.batching = false;
        self.0.flush();
    }
}

/// How tracer opens every file it writes about other processes: for writing, mode
/// [`OUTPUT_FILE_MODE`] when created, never through a symlink.
pub fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.write(true).mode(OUTPUT_FILE_MODE).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    options
}

fn open_output(path: &Path, truncate: bool) -> anyhow::Result<File> {
    private_file().create(true).truncate(truncate).append(!truncate).open(path).with_context(|| {
        format!(
            "opening output file {} (a symlink is refused: the output holds other users' \
                 data)",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::output::{FieldMap, Kind, Pid, Source};
    use crate::time::Clock;

    /// Records each `write` it gets; fails every write once `fail` is set.
    #[derive(Clone, Default)]
    struct Writes {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        fail: Arc<AtomicBool>,
    }

    impl Write for Writes {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if self.fail.load(Ordering::Relaxed) {
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
            self.writes.lock().unwrap().push(bytes.to_vec());
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// An empty summary line stamped `mono_ns`: lines that differ only in their time.
    fn summary(clock: &Clock, mono_ns: u64) -> Line<FieldMap> {
        Line::new(
            clock,
            mono_ns,
            Kind::Summary,
            Source::Tracer,
            Pid::NotApplicable,
            FieldMap::default(),
        )
    }

    /// The bytes written of the summary line stamped `mono_ns`, newline included.
    fn line(mono_ns: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        summary(&Clock::with_offset(0), mono_ns).write_json(&mut bytes);
        bytes.push(b'\n');
        bytes
    }

    fn emit(sink: &mut JsonLines, mono_ns: u64) {
        sink.emit(&summary(&Clock::with_offset(0), mono_ns));
    }

    /// An output that, in each write, waits until the writer's clock says a write has waited,
    /// and records what it said.
    struct Slow {
        wait: OutputWait,
        seen: Arc<Mutex<Vec<f64>>>,
    }

    impl Write for Slow {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let deadline = monotonic_ns() + 1_000_000_000;
            while self.wait.seconds() == 0.0 {
                assert!(monotonic_ns() < deadline, "the write under way was never timed");
                std::hint::spin_loop();
            }
            self.seen.lock().unwrap().push(self.wait.seconds());
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_under_way_says_how_long_it_has_waited_and_none_says_zero() {
        let mut sink = JsonLines::writer(io::sink());
        let seen = Arc::new(Mutex::new(Vec::new()));
        sink.out = buffered(Slow { wait: sink.output_wait(), seen: seen.clone() }, &sink.wait);
        let wait = sink.output_wait();
        assert_eq!(wait.seconds(), 0.0);
        emit(&mut sink, 1);
        emit(&mut sink, 2);
        let seen = seen.lock().unwrap().clone();
        assert!(seen.len() == 2 && seen.iter().all(|s| *s > 0.0 && *s < 1.0), "{seen:?}");
        assert_eq!((wait.seconds(), sink.failure().is_none()), (0.0, true));
    }

    #[test]
    fn a_batch_leaves_in_one_write_and_single_lines_at_once() {
        let writes = Writes::default();
        let mut sink = JsonLines::writer(BufWriter::new(writes.clone()));
        emit(&mut sink, 1);
        assert_eq!(writes.writes.lock().unwrap().len(), 1, "a line outside a batch is written");
        {
            let mut batch = sink.batch();
            for mono_ns in 2..=4 {
                emit(&mut batch, mono_ns);
            }
            assert_eq!(writes.writes.lock().unwrap().len(), 1, "held until the batch ends");
        }
        let writes = writes.writes.lock().unwrap();
        let want: Vec<u8> = (2..=4).flat_map(line).collect();
        assert_eq!(*writes, [line(1), want]);
    }

    #[test]
    fn a_line_batch_leaves_in_one_write_and_a_refused_line_leaves_no_trace() {
        let clock = Clock::with_offset(0);
        let summary = |mono_ns| summary(&clock, mono_ns);
        let mut batch = LineBatch::with_capacity(0, false);
        assert!(batch.push_if(&summary(1), &clock, |_| true));
        let mut offered = 0;
        assert!(!batch.push_if(&summary(2), &clock, |len| {
            offered = len;
            false
        }));
        assert!(batch.push_if(&summary(3), &clock, |_| true));
        assert_eq!(offered, line(2).len(), "the refused line's bytes, newline included");
        assert_eq!((batch.lines(), batch.len_bytes()), (2, line(1).len() + line(3).len()));
        assert_eq!(batch.last_line(), &line(3)[..line(3).len() - 1]);
        let writes = Writes::default();
        let mut sink = JsonLines::writer(BufWriter::new(writes.clone()));
        sink.emit_batch(&batch);
        assert_eq!(*writes.writes.lock().unwrap(), [[line(1), line(3)].concat()]);
        writes.fail.store(true, Ordering::Relaxed);
        sink.emit_batch(&batch);
        assert_eq!(sink.unwritten(), 2, "each line of the failed batch");
    }

    #[test]
    fn a_failed_batch_counts_its_lines_unwritten() {
        let writes = Writes::default();
        let mut sink = JsonLines::writer(BufWriter::new(writes.clone()));
        emit(&mut sink, 1);
        writes.fail.store(true, Ordering::Relaxed);
        {
            let mut batch = sink.batch();
            emit(&mut batch, 2);
            emit(&mut batch, 3);
        }
        assert_eq!(sink.failure().map(io::Error::kind), Some(io::ErrorKind::BrokenPipe));
        emit(&mut sink, 4);
        assert_eq!(sink.unwritten(), 3);
        assert_eq!(writes.writes.lock().unwrap().len(), 1);
    }
}
