//! JSON text written straight into a byte buffer, byte for byte as serde_json writes it (its
//! compact formatter: the same escapes, the same integer and float digits), for the lines tracer
//! writes per event: no serializer and no `String` per value, since the output path bounds every
//! end-to-end event rate.

use std::mem::MaybeUninit;
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

/// Appends the first `len` of `bytes` (`len` ≤ `N`) by copying all `N` into the spare
/// capacity: one fixed-size move where a copy of `len` bytes would be a `memcpy` call, for
/// short pieces whose source has `N` bytes to read (a padded buffer).
#[inline(always)]
pub fn push_prefix<const N: usize>(out: &mut Vec<u8>, bytes: &[u8; N], len: usize) {
    assert!(len <= N, "{len} bytes of {N}");
    out.reserve(N);
    let start = out.len();
    // SAFETY: `N` bytes fit in the capacity reserved above, after the `start` initialised ones,
    // and a borrowed array cannot overlap the vector's spare capacity; the first `len` (≤ N)
    // of them are then initialised.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().add(start), N);
        out.set_len(start + len);
    }
}

/// Decimal digits already in a buffer: `value` written by [`push_u64`] at `out[at]`. A line
/// repeats some of its numbers (a runtime event's `timestamp` is its envelope's `mono_ns`), and
/// copying the digits costs less than formatting them again ([`push_u64_again`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenU64 {
    pub value: u64,
    pub at: std::ops::Range<usize>,
}

/// Appends `value` as [`push_u64`] does and says where its digits are.
#[inline(always)]
pub fn push_u64_written(out: &mut Vec<u8>, value: u64) -> WrittenU64 {
    let start = out.len();
    push_u64(out, value);
    WrittenU64 { value, at: start..out.len() }
}

/// Appends `value`'s digits, copied from where `written` has them when it is the same value
/// and its range is in `out` (else formatted as [`push_u64`] does).
#[inline(always)]
pub fn push_u64_again(out: &mut Vec<u8>, value: u64, written: &WrittenU64) {
    /// At most 20 digits: copied as one fixed-size move from the bytes that follow them too.
    const COPY: usize = 24;
    let at = &written.at;
    if written.value == value
        && at.len() <= COPY
        && let Some(digits) = out.get(at.start..at.start + COPY)
    {
        let digits: [u8; COPY] = digits.try_into().expect("COPY bytes");
        debug_assert_eq!(digits[..at.len()], *value.to_string().as_bytes());
        push_prefix(out, &digits, at.len());
        return;
    }
    push_u64(out, value);
}

/// Appends `value`'s decimal digits (no leading zeros), as serde_json and `{}` write them.
///
/// Written in place, eight digits at a time ([`eight_digits`]): a line has about ten integers,
/// and formatting each into a buffer of its own and copying it was the largest part of a line's
/// cost.
#[inline(always)]
pub fn push_u64(out: &mut Vec<u8>, value: u64) {
    const E8: u64 = 100_000_000;
    // Every 8-byte group is stored whole: room for three of them, whatever the value.
    out.reserve(24);
    let start = out.len();
    let spare = &mut out.spare_capacity_mut()[..24];
    let written = if value < 100 {
        // Counts, levels, ids, sequence numbers: one or two digits are common enough for their
        // own path.
        let (tens, ones) = (value as u8 / 10, value as u8 % 10);
        spare[0].write(if tens == 0 { b'0' + ones } else { b'0' + tens });
        spare[1].write(b'0' + ones);
        1 + usize::from(tens != 0)
    } else if value < E8 {
        store_leading(spare, value as u32)
    } else if value < E8 * E8 {
        let leading = store_leading(spare, (value / E8) as u32);
        store(&mut spare[leading..], eight_digits((value % E8) as u32));
        leading + 8
    } else {
        let rest = value % (E8 * E8);
        let leading = store_leading(spare, (value / (E8 * E8)) as u32);
        store(&mut spare[leading..], eight_digits((rest / E8) as u32));
        store(&mut spare[leading + 8..], eight_digits((rest % E8) as u32));
        leading + 16
    };
    // SAFETY: the first `written` bytes after `start` were just initialised (each path writes
    // at least its digits), within the capacity reserved above.
    unsafe { out.set_len(start + written) };
}

#[inline(always)]
pub fn push_i64(out: &mut Vec<u8>, value: i64) {
    if value < 0 {
        out.push(b'-');
    }
    push_u64(out, value.unsigned_abs());
}

/// The eight decimal digits of `value` (< 10^8, zero-padded) as digit values 0–9, one per byte,
/// the most significant in the lowest byte (first in memory when stored little-endian).
/// After one division by 10 000, the divisions by 100 and by 10 are done in parallel lanes of
/// one `u64`, by multiplying with a rounded-up reciprocal and shifting, which is exact for
/// every value a lane holds (below 10 000, then below 100): no loop and no table.
#[inline]
fn eight_digits(value: u32) -> u64 {
    debug_assert!(value < 100_000_000);
    let value = u64::from(value);
    // The first four digits in the low 32-bit lane, the last four in the high one.
    let fours = (value / 10_000) | ((value % 10_000) << 32);
    // x / 100 = x * 10486 >> 20 for x < 10 000; the lanes' quotients stay below 128.
    let hundreds = ((fours * 10_486) >> 20) & 0x0000_007f_0000_007f;
    let twos = hundreds | ((fours - hundreds * 100) << 16);
    // x / 10 = x * 103 >> 10 for x < 100; the lanes' quotients stay below 16.
    let tens = ((twos * 103) >> 10) & 0x000f_000f_000f_000f;
    tens | ((twos - tens * 10) << 8)
}

/// The eight decimal digits of `value` (< 10^8, zero-padded) as ASCII.
#[inline]
pub fn ascii_digits(value: u32) -> [u8; 8] {
    ascii(eight_digits(value))
}

/// `digits` (from [`eight_digits`]) as ASCII, in writing order.
#[inline]
fn ascii(digits: u64) -> [u8; 8] {
    (digits + 0x3030_3030_3030_3030).to_le_bytes()
}

/// Stores `digits` (from [`eight_digits`]) as ASCII in the first eight bytes of `to`.
#[inline]
fn store(to: &mut [MaybeUninit<u8>], digits: u64) {
    for (byte, digit) in to[..8].iter_mut().zip(ascii(digits)) {
        byte.write(digit);
    }
}

/// Stores `value` (< 10^8) without leading zeros at the start of `to` (eight bytes written,
/// the rest of them past the digits); returns how many digits it has.
#[inline]
fn store_leading(to: &mut [MaybeUninit<u8>], value: u32) -> usize {
    let digits = eight_digits(value);
    // Zero digits are zero bytes, the leading ones the lowest; `0` keeps its last digit.
    let leading_zeros = ((digits.trailing_zeros() / 8) as usize).min(7);
    store(to, digits >> (8 * leading_zeros));
    8 - leading_zeros
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

    /// A repeated number is copied where its digits are followed by enough bytes, formatted
    /// otherwise: the same text either way.
    #[test]
    fn a_number_written_again_is_the_same_digits() {
        for value in [0, 7, 1_733_000_000_123_456_789, u64::MAX] {
            let mut out = b"x".to_vec();
            let written = push_u64_written(&mut out, value);
            assert_eq!(out[written.at.clone()], *value.to_string().as_bytes());
            // Too few bytes after the digits to copy them in one move: formatted.
            push_u64_again(&mut out, value, &written);
            out.extend_from_slice(b",\"kind\":\"dotnet_event\",\"pid\":4242,");
            // Copied.
            push_u64_again(&mut out, value, &written);
            // Another value: formatted.
            push_u64_again(&mut out, value / 3, &written);
            // A range past the end: formatted.
            let beyond = WrittenU64 { value, at: out.len()..out.len() + 3 };
            push_u64_again(&mut out, value, &beyond);
            let d = value.to_string();
            let expected =
                format!("x{d}{d},\"kind\":\"dotnet_event\",\"pid\":4242,{d}{}{d}", value / 3);
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
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
    fn a_prefix_appends_only_its_length() {
        let padded = *b"abcdefgh";
        for len in 0..=8 {
            let mut out = b"x".to_vec();
            push_prefix(&mut out, &padded, len);
            assert_eq!(out, [b"x", &padded[..len]].concat());
        }
    }

    #[test]
    #[should_panic(expected = "9 bytes of 8")]
    fn a_prefix_longer_than_its_source_is_refused() {
        push_prefix(&mut Vec::new(), b"abcdefgh", 9);
    }

    #[test]
    fn eight_digits_are_those_of_format() {
        let text = |value: u32| String::from_utf8(ascii_digits(value).to_vec()).unwrap();
        // Each 4-digit lane through all its values, with the other lane at its extremes and
        // at the mirror value (the lanes are computed side by side in one word).
        for lane in 0..10_000 {
            for value in [lane, lane * 10_000, lane * 10_000 + 9_999, lane * 10_000 + 9_999 - lane]
            {
                assert_eq!(text(value), format!("{value:08}"));
            }
        }
    }

    #[test]
    fn numbers_are_written_like_serde_json() {
        let mut unsigned = vec![0, 1, 9, 4242, u64::MAX, u64::MAX - 1];
        // Both sides of every power of ten (each digit count and group boundary).
        for power in (1..=19).map(|p| 10u64.pow(p)) {
            unsigned.extend([power - 1, power, power + 1, power / 2 * 3]);
        }
        for &v in &unsigned {
            // At an offset, after other bytes: the digits are appended, nothing overwritten.
            let mut out = b"x".to_vec();
            push_u64(&mut out, v);
            assert_eq!(out[1..], serde_json::to_vec(&v).unwrap(), "{v}");
            assert_eq!(out[0], b'x');
        }
        let mut signed = vec![0, -1, i64::MIN, i64::MIN + 1, i64::MAX];
        for &v in unsigned.iter().filter(|&&v| v <= i64::MAX as u64) {
            signed.extend([v as i64, -(v as i64)]);
        }
        for v in signed {
            let mut out = Vec::new();
            push_i64(&mut out, v);
            assert_eq!(out, serde_json::to_vec(&v).unwrap(), "{v}");
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
