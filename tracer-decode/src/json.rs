//! JSON text written straight into a byte buffer, byte for byte as serde_json writes it (its
//! compact formatter: the same escapes, the same integer and float digits), for the lines tracer
//! writes per event: no serializer and no `String` per value, since the output path bounds every
//! end-to-end event rate.

use std::sync::OnceLock;

use crate::ordered::OrderedMap;

/// A JSON fragment rendered once and kept with what it renders (an event metadata's constant
/// members, a process's labels; or, as `RenderedOnce<T>`, what writing it needs, such as a
/// compiled payload layout), so the lines that repeat it copy bytes instead of escaping and
/// formatting again. It is no part of its owner's identity (any two are equal), and a clone
/// starts empty: the clone may be changed before it is first rendered.
pub struct RenderedOnce<T = Box<[u8]>>(OnceLock<T>);

impl<T> Default for RenderedOnce<T> {
    fn default() -> Self {
        RenderedOnce(OnceLock::new())
    }
}

impl RenderedOnce {
    /// The fragment, rendered by `render` the first time.
    pub fn get_or_render(&self, render: impl FnOnce(&mut Vec<u8>)) -> &[u8] {
        self.get_or_init(|| {
            let mut out = Vec::new();
            render(&mut out);
            out.into_boxed_slice()
        })
    }
}

impl<T> RenderedOnce<T> {
    /// The value, made by `init` the first time.
    pub fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        self.0.get_or_init(init)
    }
}

impl<T> Clone for RenderedOnce<T> {
    fn clone(&self) -> Self {
        RenderedOnce::default()
    }
}

impl<T> PartialEq for RenderedOnce<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> Eq for RenderedOnce<T> {}

impl<T> std::fmt::Debug for RenderedOnce<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "RenderedOnce(rendered)" } else { "RenderedOnce" })
    }
}

/// A value written as JSON straight into a buffer.
pub trait WriteJson {
    /// Appends the value as JSON.
    fn write_json(&self, out: &mut Vec<u8>);
}

/// An array of the values.
impl<V: WriteJson> WriteJson for [V] {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        for (i, item) in self.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            item.write_json(out);
        }
        out.push(b']');
    }
}

/// An object of the named values, in their order.
impl<K: AsRef<str>, V: WriteJson> WriteJson for OrderedMap<K, V> {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        for (i, (name, value)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            push_key(out, name.as_ref());
            value.write_json(out);
        }
        out.push(b'}');
    }
}

/// `ESCAPE[b]`: the letter of the two-byte escape `\<letter>` for `b`, `u` for `\u00XX`, 0 when
/// `b` is written as is. serde_json escapes only `"`, `\` and the C0 controls; everything else
/// (DEL, non-ASCII, U+2028) is copied.
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

const LOW_BITS: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);

/// Whether any byte of `word` is below 0x20, `"` or `\`: eight bytes per test, so the runs of
/// plain text that make up nearly all of a line are found without a lookup per byte.
fn needs_escape(word: u64) -> bool {
    // A byte below `n` (n ≤ 0x80) sets its high bit in `(x - n) & !x`; `x ^ c` is zero where x
    // has byte c.
    let below = |x: u64, n: u8| x.wrapping_sub(LOW_BITS * u64::from(n)) & !x;
    let quote = word ^ (LOW_BITS * u64::from(b'"'));
    let backslash = word ^ (LOW_BITS * u64::from(b'\\'));
    (below(word, 0x20) | below(quote, 1) | below(backslash, 1)) & HIGH_BITS != 0
}

/// Appends `text` as a JSON string, quotes included.
pub fn push_str(out: &mut Vec<u8>, text: &str) {
    out.reserve(text.len() + 2);
    out.push(b'"');
    push_escaped(out, text);
    out.push(b'"');
}

/// Appends `text` escaped for the inside of a JSON string (a string made of several pieces):
/// the runs between escapes copied whole.
pub fn push_escaped(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    let (mut run_start, mut at) = (0, 0);
    while at < bytes.len() {
        if let Some(word) = bytes.get(at..at + 8)
            && !needs_escape(u64::from_ne_bytes(word.try_into().expect("8 bytes")))
        {
            at += 8;
            continue;
        }
        let byte = bytes[at];
        let letter = ESCAPE[usize::from(byte)];
        at += 1;
        if letter == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[run_start..at - 1]);
        run_start = at;
        if letter == b'u' {
            let (high, low) = hex_pair(byte);
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', high, low]);
        } else {
            out.extend_from_slice(&[b'\\', letter]);
        }
    }
    out.extend_from_slice(&bytes[run_start..]);
}

/// Appends `"name":`.
pub fn push_key(out: &mut Vec<u8>, name: &str) {
    push_str(out, name);
    out.push(b':');
}

/// Appends `"name":` for a name known to need no escaping (tracer's own names: ASCII letters,
/// digits and `_`), without looking for escapes.
pub fn push_plain_key(out: &mut Vec<u8>, name: &str) {
    debug_assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "{name:?}");
    out.reserve(name.len() + 3);
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
}

pub fn push_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

pub fn push_i64(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// Appends a float the way serde_json does: shortest round-trip digits, `null` for NaN and the
/// infinities (JSON has neither).
pub fn push_f64(out: &mut Vec<u8>, value: f64) {
    if value.is_finite() {
        out.extend_from_slice(zmij::Buffer::new().format_finite(value).as_bytes());
    } else {
        out.extend_from_slice(b"null");
    }
}

pub fn push_bool(out: &mut Vec<u8>, value: bool) {
    out.extend_from_slice(if value { b"true" } else { b"false" });
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The two lowercase hex digits of `byte`.
pub fn hex_pair(byte: u8) -> (u8, u8) {
    (HEX_DIGITS[usize::from(byte >> 4)], HEX_DIGITS[usize::from(byte & 0xf)])
}

/// Appends `bytes` as a string of lowercase hex, two digits a byte.
pub fn push_hex_string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() * 2 + 2);
    out.push(b'"');
    for &b in bytes {
        let (high, low) = hex_pair(b);
        out.extend_from_slice(&[high, low]);
    }
    out.push(b'"');
}

/// Appends `value` as `0x…` in lowercase hex without leading zeros (`{:#x}`), unquoted.
pub fn push_hex_digits(out: &mut Vec<u8>, value: u64) {
    let mut digits = [0u8; 18];
    let mut at = digits.len();
    let mut rest = value;
    loop {
        at -= 1;
        digits[at] = HEX_DIGITS[(rest & 0xf) as usize];
        rest >>= 4;
        if rest == 0 {
            break;
        }
    }
    at -= 2;
    digits[at..at + 2].copy_from_slice(b"0x");
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        push_str(&mut out, text);
        out
    }

    #[test]
    fn strings_are_escaped_like_serde_json() {
        let mut cases: Vec<String> = [
            "",
            "plain",
            "quote \" and backslash \\ and slash /",
            "\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f} \u{7f}",
            "é – \u{2028}\u{2029} 😀 \u{fffd}",
            "\"\"\\\\",
            "exactly8\"more than eight bytes before the escape\n",
        ]
        .map(String::from)
        .into();
        // Every byte value at every position of an 8-byte word and across word boundaries.
        for b in 0u8..0x80 {
            for at in 0..17 {
                let mut s = "a".repeat(at);
                s.push(char::from(b));
                s.push_str("tail-bytes");
                cases.push(s);
            }
        }
        for case in &cases {
            assert_eq!(string(case), serde_json::to_vec(case).unwrap(), "{case:?}");
        }
    }

    #[test]
    fn numbers_are_written_like_serde_json() {
        for v in [0, 1, 9, 10, 4242, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, serde_json::to_vec(&v).unwrap());
        }
        for v in [0, -1, i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            push_i64(&mut out, v);
            assert_eq!(out, serde_json::to_vec(&v).unwrap());
        }
        let floats = [0.0, -0.0, 1.0, 0.1, 1e21, 1e-7, 1.5e300, f64::MIN_POSITIVE, 5e-324];
        let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MAX, f64::from(0.1f32)];
        for v in floats.into_iter().chain(specials) {
            let mut out = Vec::new();
            push_f64(&mut out, v);
            assert_eq!(out, serde_json::to_vec(&v).unwrap(), "{v}");
        }
    }

    #[test]
    fn hex_digits_are_those_of_format() {
        for v in [0, 1, 0xf, 0x10, 0xdead_beef, u64::MAX] {
            let mut out = Vec::new();
            push_hex_digits(&mut out, v);
            assert_eq!(out, format!("{v:#x}").into_bytes());
        }
    }
}
