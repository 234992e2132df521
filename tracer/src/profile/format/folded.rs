//! Folded stacks, the input of flamegraph.pl and inferno: one line per distinct stack, its
//! frames root first joined by `;`, a space, and its weight (samples on-CPU, nanoseconds
//! off-CPU). Lines are sorted.
//!
//! * The root frame is the process, `name (pid)`; the stacks of a process's threads are merged.
//! * The kind of a frame shows as flamegraph.pl's annotations, which its `java` palette (and
//!   inferno's `java` and `js`) colours and which the flame graph's labels hide: `_[k]` after a
//!   kernel frame, `_[j]` (JIT) after a managed one, nothing after a native one.
//! * Names are made safe for the format ([`sanitize`]): a `;` becomes `,`; a control character
//!   (newline, tab, …) or one of the two characters XML forbids (U+FFFE, U+FFFF) becomes
//!   U+FFFD; trailing spaces go; and a name ending in a space and a number gets `_` for that
//!   space (a reader would take the number for a count). A process name also loses leading
//!   spaces and `#`s (a reader trims a line, and skips one starting with `# ` as a comment).
use std::io::Write;

use anyhow::Context as _;
use indexmap::IndexMap;

use super::{CONTROL_REPLACEMENT, process_title};
use crate::profile::model::{Frame, FrameKind, ProcessInfo, Profile};

/// Appended to a kernel frame's name.
pub const KERNEL_ANNOTATION: &str = "_[k]";
/// Appended to a managed frame's name (flamegraph.pl's JIT annotation).
pub const MANAGED_ANNOTATION: &str = "_[j]";
/// What a `;` in a name becomes.
pub const SEPARATOR_REPLACEMENT: char = ',';

/// A profile in folded form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Folded {
    /// The label of each frame of the frame table, in [`crate::profile::FrameId`] order.
    pub frame_labels: Vec<String>,
    /// The root frame of each process, in the profile's order.
    pub process_labels: Vec<String>,
    /// The lines (without newline), sorted.
    pub lines: Vec<String>,
}

/// The folded form of `profile`.
pub fn fold(profile: &Profile) -> Folded {
    let frame_labels: Vec<String> = profile.frames().map(frame_label).collect();
    let process_labels: Vec<String> =
        profile.processes().iter().map(|process| process_label(process.info())).collect();
    let mut stacks: IndexMap<String, u64> = IndexMap::new();
    for (process, root) in profile.processes().iter().zip(&process_labels) {
        for sample in process.samples() {
            let mut line = root.clone();
            for frame in sample.stack.iter().rev() {
                line.push(';');
                line.push_str(&frame_labels[frame.index()]);
            }
            // Distinct frames may share a label: their stacks are one line.
            let weight = stacks.entry(line).or_default();
            *weight = weight.saturating_add(sample.weight);
        }
    }
    let mut lines: Vec<String> =
        stacks.into_iter().map(|(stack, weight)| format!("{stack} {weight}")).collect();
    lines.sort_unstable();
    Folded { frame_labels, process_labels, lines }
}

/// Writes `profile` as folded stacks, one line each.
pub fn write(profile: &Profile, mut out: impl Write) -> anyhow::Result<()> {
    for line in fold(profile).lines {
        writeln!(out, "{line}").context("writing folded stacks")?;
    }
    out.flush().context("writing folded stacks")
}

/// A frame's name, sanitized, with its kind's annotation.
pub fn frame_label(frame: &Frame) -> String {
    let mut label = sanitize(&frame.display_name());
    label.push_str(match frame.kind {
        FrameKind::Kernel => KERNEL_ANNOTATION,
        FrameKind::Managed => MANAGED_ANNOTATION,
        FrameKind::Native => "",
    });
    label
}

/// The root frame of a process: `name (pid)`.
pub fn process_label(process: &ProcessInfo) -> String {
    let name = process.name.trim_start_matches(|c: char| c.is_whitespace() || c == '#');
    process_title(process, &sanitize(name))
}

/// `name` without the characters that would split or end a line, or be read as a count.
pub fn sanitize(name: &str) -> String {
    let mut safe: String = name
        .chars()
        .map(|c| match c {
            ';' => SEPARATOR_REPLACEMENT,
            // XML 1.0 forbids U+FFFE and U+FFFF even escaped, and the SVG is made from these.
            c if c.is_control() || c == '\u{fffe}' || c == '\u{ffff}' => CONTROL_REPLACEMENT,
            c => c,
        })
        .collect();
    safe.truncate(safe.trim_end().len());
    if let Some(space) = safe.rfind(' ') {
        let last_word = &safe[space + 1..];
        if last_word.chars().all(|c| c.is_ascii_digit() || c == '.') {
            safe.replace_range(space..=space, "_");
        }
    }
    safe
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::profile::model::Mode;

    #[test]
    fn lines_are_root_first_annotated_merged_over_threads_and_sorted() {
        let mut model = Profile::new(Mode::Cpu { frequency_hz: NonZeroU32::new(99).unwrap() }, 0);
        let p = model.add_process(ProcessInfo {
            pid: 7,
            process_start_ns: 1,
            name: "dotnet app.dll".into(),
            container_id: None,
            pod_uid: None,
        });
        let kernel = model.intern_frame(Frame::named(FrameKind::Kernel, "do_syscall_64", None));
        let native = model.intern_frame(Frame::named(FrameKind::Native, "write", Some("libc")));
        let managed = model.intern_frame(Frame::named(FrameKind::Managed, "App.Run()", None));
        let unnamed = model.intern_frame(Frame::unnamed(FrameKind::Native, Some("/x/l.so"), 0xf));
        model.add_sample(p, 8, &[kernel, native, managed], 2);
        model.add_sample(p, 9, &[kernel, native, managed], 1);
        model.add_sample(p, 8, &[unnamed, managed], 4);
        model.add_sample(p, 8, &[], 1);
        let mut text = Vec::new();
        write(&model, &mut text).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "dotnet app.dll (7) 1\n\
             dotnet app.dll (7);App.Run()_[j];l.so+0xf 4\n\
             dotnet app.dll (7);App.Run()_[j];write;do_syscall_64_[k] 3\n"
        );
    }

    #[test]
    fn names_cannot_split_a_line_or_pass_for_a_count() {
        assert_eq!(
            sanitize("a;b\nc\td\u{7f}e\u{85}f\u{ffff}"),
            "a,b\u{fffd}c\u{fffd}d\u{fffd}e\u{fffd}f\u{fffd}"
        );
        assert_eq!(sanitize("f 12"), "f_12");
        assert_eq!(sanitize("f  1.5  "), "f _1.5");
        assert_eq!(
            sanitize("operator new(unsigned long, int)"),
            "operator new(unsigned long, int)"
        );
        assert_eq!(sanitize("f 1x"), "f 1x");
        assert_eq!(sanitize(" "), "");
        let process = |name: &str| ProcessInfo {
            pid: 3,
            process_start_ns: 0,
            name: name.into(),
            container_id: None,
            pod_uid: None,
        };
        assert_eq!(process_label(&process("# not a comment")), "not a comment (3)");
        assert_eq!(process_label(&process(" \u{a0}x;y")), "x,y (3)");
    }

    #[test]
    fn frames_with_the_same_label_make_one_line() {
        let mut model = Profile::new(Mode::OffCpu, 0);
        let p = model.add_process(ProcessInfo {
            pid: 1,
            process_start_ns: 0,
            name: "p".into(),
            container_id: None,
            pod_uid: None,
        });
        let semicolon = model.intern_frame(Frame::named(FrameKind::Native, "a;b", None));
        let comma = model.intern_frame(Frame::named(FrameKind::Native, "a,b", None));
        model.add_sample(p, 1, &[semicolon], 10);
        model.add_sample(p, 1, &[comma], 5);
        assert_eq!(fold(&model).lines, ["p (1);a,b 15"]);
    }
}
