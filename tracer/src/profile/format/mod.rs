//! The files a [`Profile`] is written as. Each writer escapes the untrusted names for its own
//! syntax; the model has already bounded their length.
//!
//! * [`pprof`] — gzip'd `perftools.profiles.Profile` protobuf (`go tool pprof`, Pyroscope,
//!   Parca, Datadog, speedscope);
//! * [`speedscope`] — speedscope's JSON file format, one sampled profile per process;
//! * [`folded`] — folded stacks, one line per distinct stack (flamegraph.pl, inferno);
//! * [`svg`] — a flame graph to open in a browser, rendered by inferno from the folded stacks.
use std::io::Write;
use std::path::Path;

use anyhow::Context as _;

use super::model::{ProcessInfo, Profile};

pub mod folded;
pub mod pprof;
pub mod speedscope;
pub mod svg;

/// One of the files a profile can be written as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Pprof,
    Speedscope,
    Folded,
    Svg,
}

impl Format {
    /// How a file of this format is conventionally named: speedscope recognises its own files by
    /// `.speedscope.json`, pprof files are `.pb.gz`.
    pub fn file_suffix(self) -> &'static str {
        match self {
            Format::Pprof => ".pb.gz",
            Format::Speedscope => ".speedscope.json",
            Format::Folded => ".folded",
            Format::Svg => ".svg",
        }
    }

    /// Writes `profile` as this format to the file `path`, created mode 0600 and never through
    /// a symlink (its names come from the traced processes).
    pub fn write_file(self, profile: &Profile, path: &Path) -> anyhow::Result<()> {
        let file = crate::output::private_file()
            .create(true)
            .truncate(true)
            .open(path)
            .with_context(|| format!("creating {} (a symlink is refused)", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        self.write(profile, &mut out).with_context(|| format!("writing {}", path.display()))?;
        out.flush().with_context(|| format!("writing {}", path.display()))
    }

    /// Writes `profile` as this format to `out` (unbuffered writes are many and small: give a
    /// `BufWriter` for a file).
    pub fn write(self, profile: &Profile, out: impl Write) -> anyhow::Result<()> {
        match self {
            Format::Pprof => pprof::write(profile, out),
            Format::Speedscope => speedscope::write(profile, out),
            Format::Folded => folded::write(profile, out),
            Format::Svg => svg::write(profile, out),
        }
    }
}

/// What a control character in a name becomes where the format has no escape for it.
pub const CONTROL_REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

/// How speedscope's profile list and the folded root frame call a process: `name (pid)`.
fn process_title(process: &ProcessInfo, name: &str) -> String {
    format!("{name} ({})", process.pid)
}
