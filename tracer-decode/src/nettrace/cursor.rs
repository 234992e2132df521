//! Bounds-checked little-endian reads over a byte slice. Every read returns `None` when the slice
//! is too short, so callers turn a short read into a typed error carrying the position.

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Why a UTF-16Z string could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Utf16Problem {
    /// No terminating NUL code unit before the end of the data.
    Unterminated,
    /// More code units than the caller allows.
    TooLong,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let bytes = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(bytes)
    }

    /// Bytes up to a NUL byte (which is consumed, not returned); `None` without one.
    pub(crate) fn nul_terminated(&mut self) -> Option<&'a [u8]> {
        let rest = &self.buf[self.pos..];
        let end = rest.iter().position(|&b| b == 0)?;
        self.pos += end + 1;
        Some(&rest[..end])
    }

    #[inline]
    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).map(|b| b.try_into().expect("take returned N bytes"))
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Option<u8> {
        let byte = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(byte)
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    pub(crate) fn i64(&mut self) -> Option<i64> {
        self.array().map(i64::from_le_bytes)
    }

    pub(crate) fn guid(&mut self) -> Option<[u8; 16]> {
        self.array()
    }

    /// LEB128, at most `max_bytes` bytes; `None` when short or when the value overflows u64.
    #[inline]
    fn varuint(&mut self, max_bytes: usize) -> Option<u64> {
        // Most header fields (flags-driven deltas, ids) fit one byte.
        let first = self.u8()?;
        if first < 0x80 {
            return Some(first.into());
        }
        self.varuint_continued(first, max_bytes)
    }

    fn varuint_continued(&mut self, first: u8, max_bytes: usize) -> Option<u64> {
        let mut value = u64::from(first & 0x7f);
        for i in 1..max_bytes {
            let byte = self.u8()?;
            value |= u64::from(byte & 0x7f).checked_shl(7 * i as u32)?;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    #[inline]
    pub(crate) fn varuint32(&mut self) -> Option<u32> {
        self.varuint(5).and_then(|v| u32::try_from(v).ok())
    }

    #[inline]
    pub(crate) fn varuint64(&mut self) -> Option<u64> {
        self.varuint(10)
    }

    /// A NUL-terminated UTF-16LE string of at most `max_units` code units (terminator excluded).
    /// Unpaired surrogates become U+FFFD rather than an error: the text is for humans.
    pub(crate) fn utf16z(&mut self, max_units: usize) -> Result<String, Utf16Problem> {
        let mut text = String::new();
        self.utf16z_into(max_units, &mut text)?;
        Ok(text)
    }

    /// Reads a UTF-16Z string into `text` (cleared first), unpaired surrogates replaced.
    pub(crate) fn utf16z_into(
        &mut self,
        max_units: usize,
        text: &mut String,
    ) -> Result<(), Utf16Problem> {
        let rest = &self.buf[self.pos..];
        let units = rest.len() / 2;
        let unit_of = |pair: &[u8]| u16::from_le_bytes([pair[0], pair[1]]);
        // Nearly every name and message is ASCII: known while looking for the NUL, then copied
        // a byte a unit without decoding.
        let searched = &rest[..2 * units.min(max_units + 1)];
        // Four units a word until a word holds the NUL, then a unit at a time.
        let (mut skipped, mut ascii) = (0, true);
        for word in searched.chunks_exact(8) {
            let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            if has_zero_unit(word) {
                break;
            }
            ascii &= word & NON_ASCII_UNITS == 0;
            skipped += 4;
        }
        let nul = searched[2 * skipped..]
            .chunks_exact(2)
            .position(|pair| {
                let unit = unit_of(pair);
                ascii &= unit < 0x80;
                unit == 0
            })
            .map(|at| skipped + at)
            .ok_or(if units > max_units {
                Utf16Problem::TooLong
            } else {
                Utf16Problem::Unterminated
            })?;
        let string = rest[..2 * nul].chunks_exact(2);
        text.clear();
        if ascii {
            // SAFETY: every unit of the string was checked to be below 0x80 (`ascii`, over the
            // words and units up to the NUL), so each low byte pushed is an ASCII character and
            // the text stays UTF-8.
            unsafe { text.as_mut_vec() }.extend(string.map(|pair| pair[0]));
        } else {
            text.extend(
                char::decode_utf16(string.map(unit_of))
                    .map(|r| r.unwrap_or(char::REPLACEMENT_CHARACTER)),
            );
        }
        self.pos += 2 * nul + 2;
        Ok(())
    }
}

/// The bits of four little-endian UTF-16 units in a word that are set only outside ASCII.
const NON_ASCII_UNITS: u64 = 0xff80_ff80_ff80_ff80;

/// Whether one of the four little-endian UTF-16 units in `word` is zero: a unit's top bit
/// survives `- 1` and `& !word` only for a zero unit or, through the borrow, one above a zero
/// unit, so the test is exact for whether any is.
fn has_zero_unit(word: u64) -> bool {
    const ONES: u64 = 0x0001_0001_0001_0001;
    const TOPS: u64 = 0x8000_8000_8000_8000;
    word.wrapping_sub(ONES) & !word & TOPS != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the units up to the first NUL decode to, unpaired surrogates replaced.
    fn reference(units: &[u16]) -> Option<String> {
        let nul = units.iter().position(|&u| u == 0)?;
        Some(
            char::decode_utf16(units[..nul].iter().copied())
                .map(|r| r.unwrap_or('\u{fffd}'))
                .collect(),
        )
    }

    #[test]
    fn utf16z_strings_read_word_at_a_time_are_those_decoded_unit_by_unit() {
        // The NUL, a non-ASCII unit and a surrogate at every position of the first words.
        for len in 0..20 {
            for odd in [None, Some(0x80u16), Some(0xe9), Some(0x100), Some(0xd800), Some(0xff00)] {
                for odd_at in 0..len.max(1) {
                    let mut units: Vec<u16> = (0..len).map(|i| 0x41 + i as u16 % 26).collect();
                    if let Some(unit) = odd.filter(|_| odd_at < len) {
                        units[odd_at] = unit;
                    }
                    units.extend([0, 0x42, 0]);
                    let bytes: Vec<u8> = units.iter().flat_map(|u| u.to_le_bytes()).collect();
                    let mut cursor = Cursor::new(&bytes);
                    let mut text = String::from("stale");
                    assert_eq!(cursor.utf16z_into(usize::MAX / 2, &mut text), Ok(()));
                    assert_eq!(Some(text), reference(&units), "{units:x?}");
                    assert_eq!(cursor.pos, 2 * len + 2);
                }
            }
        }
    }

    #[test]
    fn utf16z_strings_without_a_nul_in_reach_are_refused() {
        let bytes: Vec<u8> = [0x41u16; 9].iter().flat_map(|u| u.to_le_bytes()).collect();
        let mut text = String::new();
        assert_eq!(
            Cursor::new(&bytes).utf16z_into(100, &mut text),
            Err(Utf16Problem::Unterminated)
        );
        assert_eq!(Cursor::new(&bytes).utf16z_into(8, &mut text), Err(Utf16Problem::TooLong));
        let terminated = [&bytes[..16], &[0, 0]].concat();
        assert_eq!(Cursor::new(&terminated).utf16z_into(8, &mut text), Ok(()));
        assert_eq!(text, "A".repeat(8));
        assert_eq!(Cursor::new(&terminated).utf16z_into(7, &mut text), Err(Utf16Problem::TooLong));
    }
}
