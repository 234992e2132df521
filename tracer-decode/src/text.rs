//! Text from other processes (command lines, versions, paths, provider and event names) made safe
//! for a terminal or a log line: a peer must not be able to move the cursor, clear the screen or
//! start a line of its own.
use std::borrow::Cow;
use std::fmt::Write as _;

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
}
