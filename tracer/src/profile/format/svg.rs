//! An SVG flame graph, rendered by inferno (flamegraph.pl's Rust port) from the folded stacks
//! ([`super::folded`]): self-contained (its script and style inline), with a `<title>` per frame
//! that a browser shows on hover (`name (N samples, P%)`), click to zoom, Ctrl-F to search.
//!
//! Colours tell the kinds apart, flamegraph.pl's way: kernel frames orange, native red, managed
//! (JIT) green, the process root frames blue, the `all` frame under them grey; the shade within a kind comes from a hash of the
//! name, so one function has one colour. inferno hides the `_[k]`/`_[j]` annotations in the
//! labels and escapes every name as XML text; the folded names carry no character XML forbids.
use std::io::{ErrorKind, Write};

use anyhow::Context as _;
use inferno::flamegraph::color::{Color, PaletteMap};
use inferno::flamegraph::{self, Options};

use super::folded;
use crate::profile::model::{FrameKind, Mode, Profile};

/// The colour of a process's root frame.
pub const PROCESS_COLOR: Color = Color { r: 110, g: 130, b: 220 };
/// The colour of inferno's `all` frame under the processes (its name is empty).
pub const ALL_COLOR: Color = Color { r: 200, g: 200, b: 200 };

/// Writes `profile` as an SVG flame graph. A profile without samples gives an SVG saying so.
pub fn write(profile: &Profile, mut out: impl Write) -> anyhow::Result<()> {
    let folded = folded::fold(profile);
    let mut palette = PaletteMap::default();
    for (label, frame) in folded.frame_labels.iter().zip(profile.frames()) {
        palette.insert(label, kind_color(frame.kind, label));
    }
    for label in &folded.process_labels {
        palette.insert(label, PROCESS_COLOR);
    }
    palette.insert("", ALL_COLOR);
    let mut options = Options::default();
    let (title, count_name) = match profile.mode() {
        Mode::Cpu { frequency_hz } => (format!("CPU samples at {frequency_hz} Hz"), "samples"),
        Mode::OffCpu => ("Off-CPU time".to_owned(), "ns"),
    };
    options.title = title;
    options.count_name = count_name.to_owned();
    options.subtitle =
        Some("kernel: orange, native: red, managed (.NET): green, process: blue".to_owned());
    options.palette_map = Some(&mut palette);
    let rendered =
        flamegraph::from_lines(&mut options, folded.lines.iter().map(String::as_str), &mut out);
    match rendered {
        // Without stacks inferno writes an SVG saying "No valid input" and reports InvalidData:
        // that SVG is the answer.
        Err(e) if folded.lines.is_empty() && e.kind() == ErrorKind::InvalidData => {}
        rendered => rendered.context("writing the SVG flame graph")?,
    }
    out.flush().context("writing the SVG flame graph")
}

/// flamegraph.pl's colour of a kind (`orange` kernel, `red` system, `green` JIT), its shade
/// picked by a hash of the label.
fn kind_color(kind: FrameKind, label: &str) -> Color {
    // FNV-1a: stable across runs and platforms, unlike std's RandomState.
    let hash = label
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let shade = (hash % 1024) as f64 / 1024.0;
    let scale = |base: u8, span: f64| base + (span * shade) as u8;
    match kind {
        FrameKind::Kernel => Color { r: scale(190, 65.0), g: scale(90, 65.0), b: 0 },
        FrameKind::Native => {
            let gb = scale(50, 80.0);
            Color { r: scale(200, 55.0), g: gb, b: gb }
        }
        FrameKind::Managed => {
            let rb = scale(50, 60.0);
            Color { r: rb, g: scale(200, 55.0), b: rb }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_get_their_flamegraph_colours() {
        for label in ["a", "b", "System.String.Concat()_[j]", ""] {
            let kernel = kind_color(FrameKind::Kernel, label);
            assert!(kernel.r >= 190 && kernel.g >= 90 && kernel.g < 156 && kernel.b == 0);
            let native = kind_color(FrameKind::Native, label);
            assert!(native.r >= 200 && native.g == native.b && native.g < 131);
            let managed = kind_color(FrameKind::Managed, label);
            assert!(managed.g >= 200 && managed.r == managed.b && managed.r < 111);
        }
        assert_eq!(kind_color(FrameKind::Native, "x"), kind_color(FrameKind::Native, "x"));
    }

    #[test]
    fn the_same_profile_gives_the_same_svg() {
        let mut profile = Profile::new(Mode::OffCpu, 0);
        let p = profile.add_process(crate::profile::ProcessInfo {
            pid: 1,
            process_start_ns: 0,
            name: "p".into(),
            container_id: None,
            pod_uid: None,
        });
        let f = profile.intern_frame(crate::profile::Frame::named(FrameKind::Native, "f", None));
        let g = profile.intern_frame(crate::profile::Frame::named(FrameKind::Managed, "g", None));
        profile.add_sample(p, 1, &[f, g], 10);
        profile.add_sample(p, 1, &[g], 5);
        let render = || {
            let mut svg = Vec::new();
            write(&profile, &mut svg).unwrap();
            svg
        };
        // Every colour comes from the palette: nothing is left to inferno's random choice.
        assert_eq!(render(), render());
    }

    #[test]
    fn an_empty_profile_is_an_svg_that_says_so() {
        let profile = Profile::new(Mode::OffCpu, 0);
        let mut svg = Vec::new();
        write(&profile, &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.starts_with("<?xml"), "{svg}");
        assert!(svg.contains("ERROR: No valid input provided to flamegraph"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    }
}
