//! Text from other processes (command lines, versions, paths, provider and event names) made safe
//! for a terminal or a log line: a peer must not be able to move the cursor, clear the screen or
//! start a line of its own.
use std::borrow::Cow;
use std::fmt::Write as _;

use unicode_width::UnicodeWidthChar as _;

/// `s` with every control character (C0, DEL, C1 — newlines and escapes included) written as a
/// Rust-style escape (`\n`, `\t`, `\u{1b}`). Backslashes stay as they are, so text that is
/// already escaped (a `{:?}` path) reads the same. Borrowed when there is nothing to escape.
pub fn escape_control(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `s` as one cell of a terminal table, at most `columns` wide: control characters as
/// [`escape_control`] writes them, and every character whose width is not one or two columns —
/// format characters (bidirectional overrides, zero-width spaces and joiners), combining marks,
/// variation selectors — as `\u{…}` too, so nothing reaches the terminal that moves the cursor,
/// reorders the line or makes the text wider or narrower than counted. Cut with `…` when wider.
pub fn screen_cell(s: &str, columns: usize) -> String {
    let mut out = String::with_capacity(s.len().min(4 * columns));
    let mut used = 0;
    // What `c` shows as, and its width: itself, or its escape (ASCII, one column a byte).
    let mut escape = String::new();
    for c in s.chars() {
        let shown: &str = match (c, c.width()) {
            ('\n', _) => "\\n",
            ('\r', _) => "\\r",
            ('\t', _) => "\\t",
            (c, Some(1 | 2)) if !c.is_control() => {
                escape.clear();
                escape.push(c);
                &escape
            }
            (c, _) => {
                escape.clear();
                let _ = write!(escape, "\\u{{{:x}}}", c as u32);
                &escape
            }
        };
        let width: usize = shown.chars().map(|c| c.width().unwrap_or(0)).sum();
        if used + width > columns {
            // The ellipsis takes the last column: drop what no longer leaves room for it.
            while used + 1 > columns {
                match out.pop() {
                    Some(c) => used -= c.width().unwrap_or(0),
                    None => return out,
                }
            }
            out.push('…');
            return out;
        }
        out.push_str(shown);
        used += width;
    }
    out
}

/// The columns [`screen_cell`]'s text takes.
pub fn screen_width(cell: &str) -> usize {
    cell.chars().map(|c| c.width().unwrap_or(0)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(escape_control("/tmp/dotnet ok"), Cow::Borrowed(_)));
        assert_eq!(escape_control("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(escape_control("x\n[ERROR forged] y"), "x\\n[ERROR forged] y");
        assert_eq!(escape_control("\r\t\u{7f}\u{9b}"), "\\r\\t\\u{7f}\\u{9b}");
        assert_eq!(escape_control("a\\nb"), "a\\nb", "already escaped text is kept");
    }

    #[test]
    fn screen_cells_escape_what_moves_the_cursor_and_fit_their_columns() {
        assert_eq!(screen_cell("python3", 10), "python3");
        assert_eq!(screen_cell("\u{1b}[2J\nx", 20), "\\u{1b}[2J\\nx");
        // Bidirectional override, zero-width joiner, combining acute: escaped, counted.
        assert_eq!(screen_cell("a\u{202e}b\u{200d}e\u{301}", 40), "a\\u{202e}b\\u{200d}e\\u{301}");
        // Wide characters count two columns; the cut leaves room for the ellipsis.
        assert_eq!(screen_cell("日本語", 6), "日本語");
        assert_eq!(screen_cell("日本語", 5), "日本…");
        assert_eq!(screen_cell("日本語", 4), "日…");
        assert_eq!(screen_cell("abcdef", 4), "abc…");
        assert_eq!(screen_cell("\u{1b}abc", 4), "…", "an escape is shown whole or not at all");
        assert_eq!(screen_cell("abc", 0), "");
        assert_eq!(screen_cell("abc", 1), "…");
        for (text, columns) in [("日本語x", 3), ("a\u{7f}日\n", 5), ("é\u{fe0f}", 2)] {
            let cell = screen_cell(text, columns);
            assert!(screen_width(&cell) <= columns, "{cell:?}");
            assert!(!cell.chars().any(char::is_control), "{cell:?}");
        }
    }
}
