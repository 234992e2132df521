//! JSON-lines writer: one object per line to stdout or a file, flushed per line so a consumer
//! (or a test) sees each event as soon as it is decoded.
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

pub struct JsonLines {
    out: Box<dyn Write + Send>,
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

    pub fn emit(&mut self, value: &impl Serialize) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}
