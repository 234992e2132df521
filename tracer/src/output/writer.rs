//! The JSON-lines writer: one [`Line`] per line to stdout or a file, flushed per line so a
//! consumer (or a test) sees each event as soon as it is decoded.
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use super::Line;

pub struct JsonLines {
    out: Box<dyn Write + Send>,
}

/// A line serialized ahead of writing (without its newline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedLine(Vec<u8>);

impl RenderedLine {
    pub(super) fn of(line: &impl Serialize) -> RenderedLine {
        // Serializing into memory fails only for maps with non-string keys, which no line has.
        RenderedLine(serde_json::to_vec(line).expect("output lines serialize to JSON"))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl JsonLines {
    pub fn stdout() -> JsonLines {
        JsonLines { out: Box::new(BufWriter::new(io::stdout())) }
    }

    /// Creates (truncates) `path`.
    pub fn file(path: &Path) -> anyhow::Result<JsonLines> {
        let f = File::create(path)
            .with_context(|| format!("creating output file {}", path.display()))?;
        Ok(JsonLines { out: Box::new(BufWriter::new(f)) })
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
        JsonLines { out: Box::new(w) }
    }

    pub fn emit<B: Serialize>(&mut self, line: &Line<B>) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, line)?;
        self.end_line()
    }

    pub fn emit_rendered(&mut self, line: &RenderedLine) -> io::Result<()> {
        self.out.write_all(line.as_bytes())?;
        self.end_line()
    }

    fn end_line(&mut self) -> io::Result<()> {
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}
