//! Ring-buffer sub-buffer ("page") decoder: `struct buffer_data_page` header, compressed event
//! headers (type_len 0 / 1–28 / PADDING / TIME_EXTEND / TIME_STAMP) and timestamp reconstruction.
//!
//! The bytes come from a kernel mapping or a `read()` of `trace_pipe_raw` and are untrusted: every
//! length is checked against the committed data and the sub-buffer, timestamps must not go
//! backwards within a page, and any violation yields a [`Corruption`] with the byte offset instead
//! of a panic or an out-of-bounds read.

use thiserror::Error;

use crate::work;

use super::format::parse_field_line;

/// Bits 0–26 of the commit word hold the committed length (libtraceevent's mask).
pub const COMMIT_LEN_MASK: u64 = (1 << 27) - 1;
/// Commit bit 31: events were lost between the previous page and this one.
pub const RB_MISSED_EVENTS: u64 = 1 << 31;
/// Commit bit 30: the lost count (u64 on 64-bit) is stored right after the data.
pub const RB_MISSED_STORED: u64 = 1 << 30;

const TYPE_DATA_MAX: u32 = 28;
const TYPE_PADDING: u32 = 29;
const TYPE_TIME_EXTEND: u32 = 30;
const TYPE_TIME_STAMP: u32 = 31;
const TS_SHIFT: u32 = 27;
/// The 5 top timestamp bits a TIME_STAMP event does not store (`rb_fix_abs_ts`).
const TS_MSB: u64 = 0xf8 << 56;

/// Where the header fields and the data live in a sub-buffer, from `events/header_page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLayout {
    /// Offset of the data area (16 on 64-bit kernels).
    pub data_offset: usize,
    /// Size of the data area (`subbuf_size − data_offset`).
    pub data_size: usize,
    /// Size of the `commit` word (8 on 64-bit: `local_t`), also the size of a stored lost count.
    pub commit_size: usize,
}

impl PageLayout {
    /// The 64-bit layout for a sub-buffer of `subbuf_size` bytes.
    pub fn for_subbuf_size(subbuf_size: usize) -> PageLayout {
        PageLayout { data_offset: 16, data_size: subbuf_size.saturating_sub(16), commit_size: 8 }
    }

    /// The same header fields in sub-buffers of `subbuf_size` bytes.
    pub fn with_subbuf_size(self, subbuf_size: usize) -> PageLayout {
        PageLayout { data_size: subbuf_size.saturating_sub(self.data_offset), ..self }
    }

    pub fn subbuf_size(&self) -> usize {
        self.data_offset + self.data_size
    }

    /// Parses the text of `events/header_page`. Only 64-bit layouts (8-byte timestamp at 0 and an
    /// 8-byte commit at 8) are accepted: that is what every reader in tracer assumes.
    pub fn parse_header_page(text: &str) -> Result<PageLayout, HeaderError> {
        let mut fields = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| l.starts_with("field:")) {
            fields.push(parse_field_line(line).map_err(HeaderError::BadLine)?);
        }
        let get = |name: &str| {
            fields.iter().find(|f| f.name == name).ok_or(HeaderError::MissingField(name.into()))
        };
        let (ts, commit, data) = (get("timestamp")?, get("commit")?, get("data")?);
        if ts.offset != 0 || ts.size != 8 || commit.offset != 8 || commit.size != 8 {
            return Err(HeaderError::Unsupported(format!(
                "timestamp at {}+{}, commit at {}+{} (need 0+8 and 8+8)",
                ts.offset, ts.size, commit.offset, commit.size
            )));
        }
        if data.offset != 16 || data.size == 0 {
            return Err(HeaderError::Unsupported(format!(
                "data at {} with size {}",
                data.offset, data.size
            )));
        }
        Ok(PageLayout { data_offset: data.offset, data_size: data.size, commit_size: commit.size })
    }

    /// Checks `events/header_event` describes the event header this decoder implements.
    pub fn check_header_event(text: &str) -> Result<(), HeaderError> {
        let squeezed: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for expected in [
            "type_len : 5 bits",
            "time_delta : 27 bits",
            "padding : type == 29",
            "time_extend : type == 30",
            "time_stamp : type == 31",
            "data max type_len == 28",
        ] {
            if !squeezed.contains(expected) {
                return Err(HeaderError::Unsupported(format!("header_event lacks `{expected}`")));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("invalid line in header_page: {0}")]
    BadLine(&'static str),
    #[error("header_page has no `{0}` field")]
    MissingField(String),
    #[error("unsupported ring-buffer layout: {0}")]
    Unsupported(String),
}

/// Events lost before a page, from its commit flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missed {
    None,
    /// RB_MISSED_EVENTS without RB_MISSED_STORED: some events were lost, count unknown.
    Unknown,
    Count(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    pub timestamp: u64,
    /// Committed bytes of data (commit word masked).
    pub commit_len: usize,
    pub missed: Missed,
}

/// One data event of a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEvent<'a> {
    /// Reconstructed timestamp in `trace_clock` units.
    pub ts: u64,
    /// Byte offset of the event header within the sub-buffer.
    pub offset: usize,
    /// The record (starting with `common_type`); may end with alignment padding.
    pub data: &'a [u8],
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum CorruptReason {
    #[error("page shorter than its {need}-byte header ({len} bytes)")]
    ShortPage { len: usize, need: usize },
    #[error("commit length {commit_len} exceeds the sub-buffer's data size {data_size}")]
    CommitBeyondSubbuf { commit_len: usize, data_size: usize },
    #[error("event header needs {need} bytes but only {left} remain before commit")]
    TruncatedHeader { need: usize, left: usize },
    #[error("event length {len} runs past commit ({left} bytes left)")]
    LengthOutOfPage { len: u64, left: usize },
    #[error("event length {len} is too small")]
    LengthTooSmall { len: u64 },
    #[error("timestamp went backwards from {prev} to {ts}")]
    TimestampBackwards { prev: u64, ts: u64 },
    #[error("timestamp overflow")]
    TimestampOverflow,
}

/// A page that failed an integrity check: where and why.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("at byte {offset}: {reason}")]
pub struct Corruption {
    /// Byte offset within the sub-buffer.
    pub offset: usize,
    pub reason: CorruptReason,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

/// Restores the top bits of an absolute TIME_STAMP from the running timestamp (`rb_fix_abs_ts`).
pub fn fix_abs(abs: u64, prev: u64) -> u64 {
    if prev & TS_MSB == 0 {
        return abs;
    }
    let abs = abs | (prev & TS_MSB);
    if abs < prev { abs.wrapping_add(1 << 59) } else { abs }
}

/// Reads the page header. `page` must hold at least the header; the committed length is checked
/// against the layout's data size.
pub fn parse_header(page: &[u8], layout: &PageLayout) -> Result<PageHeader, Corruption> {
    let need = layout.data_offset;
    let short =
        || Corruption { offset: 0, reason: CorruptReason::ShortPage { len: page.len(), need } };
    let timestamp = u64_at(page, 0).ok_or_else(short)?;
    let commit = u64_at(page, 8).ok_or_else(short)?;
    if page.len() < need {
        return Err(short());
    }
    header_from_words(page, layout, timestamp, commit)
}

/// Builds the header from an already loaded commit word (the mmap reader loads it atomically).
pub fn header_from_words(
    page: &[u8],
    layout: &PageLayout,
    timestamp: u64,
    commit: u64,
) -> Result<PageHeader, Corruption> {
    let commit_len = (commit & COMMIT_LEN_MASK) as usize;
    if commit_len > layout.data_size {
        return Err(Corruption {
            offset: 8,
            reason: CorruptReason::CommitBeyondSubbuf { commit_len, data_size: layout.data_size },
        });
    }
    let missed = if commit & RB_MISSED_EVENTS == 0 {
        Missed::None
    } else if commit & RB_MISSED_STORED != 0 {
        // The kernel stores the count only when it fits after the data.
        let at = layout.data_offset + commit_len;
        match (at + layout.commit_size <= layout.subbuf_size()).then(|| u64_at(page, at)).flatten()
        {
            Some(n) => Missed::Count(n),
            None => Missed::Unknown,
        }
    } else {
        Missed::Unknown
    };
    Ok(PageHeader { timestamp, commit_len, missed })
}

/// Incremental event parser over one sub-buffer. The mmap reader keeps one per reader page and
/// resumes it as the writer commits more data; the read() path runs it once per page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCursor {
    /// Next byte to parse, as an offset within the sub-buffer.
    pub pos: usize,
    /// Running timestamp.
    pub ts: u64,
    /// A PADDING event with delta 0 ended the page.
    pub ended: bool,
}

impl PageCursor {
    pub fn new(layout: &PageLayout, header: &PageHeader) -> PageCursor {
        PageCursor { pos: layout.data_offset, ts: header.timestamp, ended: false }
    }

    /// Parses events from `pos` up to `end` (= data_offset + commit_len), calling `emit` for each
    /// data event. `page` must hold at least `end` bytes (and the caller guarantees `end` lies
    /// within the sub-buffer). The cursor advances only over fully valid events; on corruption
    /// the cursor is left at the bad event and the error names its offset.
    pub fn parse<'a>(
        &mut self,
        page: &'a [u8],
        end: usize,
        mut emit: impl FnMut(RawEvent<'a>),
    ) -> Result<(), Corruption> {
        let end = end.min(page.len());
        while !self.ended && self.pos < end {
            let pos = self.pos;
            let left = end - pos;
            let corrupt = |reason| Corruption { offset: pos, reason };
            let word = u32_at(page, pos)
                .filter(|_| left >= 4)
                .ok_or_else(|| corrupt(CorruptReason::TruncatedHeader { need: 4, left }))?;
            let type_len = word & 0x1f;
            let delta = u64::from(word >> 5);
            let array0 = || {
                u32_at(page, pos + 4)
                    .filter(|_| left >= 8)
                    .ok_or_else(|| corrupt(CorruptReason::TruncatedHeader { need: 8, left }))
            };
            let mut data = None;
            let size = match type_len {
                0 => {
                    // array[0] counts itself: payload = array[1..], total 4 + array[0].
                    let len = u64::from(array0()?);
                    if len < 4 {
                        return Err(corrupt(CorruptReason::LengthTooSmall { len }));
                    }
                    let size = check_len(4 + len, left).map_err(corrupt)?;
                    data = Some(&page[pos + 8..pos + size]);
                    size
                }
                1..=TYPE_DATA_MAX => {
                    let size = check_len(4 + 4 * u64::from(type_len), left).map_err(corrupt)?;
                    data = Some(&page[pos + 4..pos + size]);
                    size
                }
                TYPE_PADDING if delta == 0 => {
                    self.ended = true;
                    break;
                }
                // A discarded event: skipped, its delta ignored as the kernel does.
                TYPE_PADDING => check_len(4 + u64::from(array0()?), left).map_err(corrupt)?,
                TYPE_TIME_EXTEND => {
                    let ext = (u64::from(array0()?) << TS_SHIFT) + delta;
                    self.ts = self
                        .ts
                        .checked_add(ext)
                        .ok_or_else(|| corrupt(CorruptReason::TimestampOverflow))?;
                    8
                }
                _ => {
                    debug_assert_eq!(type_len, TYPE_TIME_STAMP);
                    let abs = fix_abs((u64::from(array0()?) << TS_SHIFT) + delta, self.ts);
                    if abs < self.ts {
                        return Err(corrupt(CorruptReason::TimestampBackwards {
                            prev: self.ts,
                            ts: abs,
                        }));
                    }
                    self.ts = abs;
                    8
                }
            };
            if let Some(data) = data {
                self.ts = self
                    .ts
                    .checked_add(delta)
                    .ok_or_else(|| corrupt(CorruptReason::TimestampOverflow))?;
                emit(RawEvent { ts: self.ts, offset: pos, data });
            }
            work::count(size);
            self.pos = pos + size;
        }
        Ok(())
    }
}

fn check_len(size: u64, left: usize) -> Result<usize, CorruptReason> {
    if size > left as u64 {
        return Err(CorruptReason::LengthOutOfPage { len: size, left });
    }
    Ok(size as usize)
}

/// A fully decoded sub-buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<'a> {
    pub header: PageHeader,
    pub events: Vec<RawEvent<'a>>,
}

/// Decodes a whole sub-buffer (the read() path, tests and fuzzing). All-or-nothing: a page with
/// any corruption yields only the [`Corruption`], so no event of a damaged page is trusted.
pub fn decode_page<'a>(page: &'a [u8], layout: &PageLayout) -> Result<Page<'a>, Corruption> {
    let header = parse_header(page, layout)?;
    let mut cursor = PageCursor::new(layout, &header);
    let end = layout.data_offset + header.commit_len;
    if page.len() < end {
        return Err(Corruption {
            offset: 8,
            reason: CorruptReason::CommitBeyondSubbuf {
                commit_len: header.commit_len,
                data_size: page.len().saturating_sub(layout.data_offset),
            },
        });
    }
    let mut events = Vec::new();
    cursor.parse(page, end, |e| events.push(e))?;
    Ok(Page { header, events })
}

/// Builds sub-buffers byte by byte, for tests and fuzz seeds.
pub mod build {
    use super::*;

    pub struct PageBuilder {
        page: Vec<u8>,
        pos: usize,
        layout: PageLayout,
    }

    impl PageBuilder {
        pub fn new(layout: PageLayout, timestamp: u64) -> PageBuilder {
            let mut page = vec![0u8; layout.subbuf_size()];
            page[0..8].copy_from_slice(&timestamp.to_le_bytes());
            PageBuilder { page, pos: layout.data_offset, layout }
        }

        fn word(&mut self, w: u32) {
            self.page[self.pos..self.pos + 4].copy_from_slice(&w.to_le_bytes());
            self.pos += 4;
        }

        /// A data event, small (type_len 1–28) when it fits, else type_len 0. `record` is padded
        /// to 4 bytes as the kernel does.
        pub fn data(&mut self, delta: u32, record: &[u8]) -> &mut Self {
            let padded = record.len().div_ceil(4) * 4;
            if padded <= 4 * TYPE_DATA_MAX as usize && padded > 0 {
                self.word((delta << 5) | (padded / 4) as u32);
            } else {
                self.word(delta << 5);
                self.word(padded as u32 + 4);
            }
            self.page[self.pos..self.pos + record.len()].copy_from_slice(record);
            self.pos += padded;
            self
        }

        pub fn time_extend(&mut self, delta: u64) -> &mut Self {
            self.word(((delta as u32 & ((1 << TS_SHIFT) - 1)) << 5) | TYPE_TIME_EXTEND);
            self.word((delta >> TS_SHIFT) as u32);
            self
        }

        pub fn time_stamp(&mut self, abs: u64) -> &mut Self {
            self.word(((abs as u32 & ((1 << TS_SHIFT) - 1)) << 5) | TYPE_TIME_STAMP);
            self.word((abs >> TS_SHIFT) as u32);
            self
        }

        /// A discarded event occupying `len` bytes after its header word.
        pub fn discarded(&mut self, delta: u32, len: u32) -> &mut Self {
            self.word((delta << 5) | TYPE_PADDING);
            self.word(len);
            self.pos += len as usize - 4;
            self
        }

        /// Padding to the end of the page (delta 0); committed like the kernel does.
        pub fn end_padding(&mut self) -> &mut Self {
            self.word(TYPE_PADDING);
            self
        }

        /// Offset of the next byte to be written.
        pub fn pos(&self) -> usize {
            self.pos
        }

        /// Sets the commit to what was written, with optional missed flags.
        pub fn finish(&mut self, missed: Missed) -> Vec<u8> {
            let len = (self.pos - self.layout.data_offset) as u64;
            let commit = match missed {
                Missed::None => len,
                Missed::Unknown => len | RB_MISSED_EVENTS,
                Missed::Count(n) => {
                    self.page[self.pos..self.pos + 8].copy_from_slice(&n.to_le_bytes());
                    len | RB_MISSED_EVENTS | RB_MISSED_STORED
                }
            };
            self.page[8..16].copy_from_slice(&commit.to_le_bytes());
            self.page.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::build::PageBuilder;
    use super::*;

    const HEADER_PAGE: &str = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;
";
    const HEADER_EVENT: &str = "# compressed entry header
\ttype_len    :    5 bits
\ttime_delta  :   27 bits
\tarray       :   32 bits

\tpadding     : type == 29
\ttime_extend : type == 30
\ttime_stamp : type == 31
\tdata max type_len  == 28
";

    fn layout() -> PageLayout {
        PageLayout::parse_header_page(HEADER_PAGE).unwrap()
    }

    #[test]
    fn parses_header_files_of_this_kernel() {
        assert_eq!(layout(), PageLayout { data_offset: 16, data_size: 4080, commit_size: 8 });
        assert_eq!(layout(), PageLayout::for_subbuf_size(4096));
        PageLayout::check_header_event(HEADER_EVENT).unwrap();
        assert!(matches!(
            PageLayout::check_header_event("type_len : 4 bits"),
            Err(HeaderError::Unsupported(_))
        ));
        assert_eq!(
            PageLayout::parse_header_page("\tfield: u64 timestamp;\toffset:0;\tsize:8;"),
            Err(HeaderError::MissingField("commit".into()))
        );
    }

    #[test]
    fn small_large_extend_stamp_and_discarded_events() {
        let big = vec![0xabu8; 200];
        let mut b = PageBuilder::new(layout(), 1_000);
        b.data(0, &[1, 2, 3, 4, 5, 6, 7, 8])
            .data(10, &big)
            .time_extend(1 << 30)
            .data(5, &[9; 4])
            .discarded(7, 12)
            .time_stamp(5_000_000_000)
            .data(3, &[7; 16])
            .end_padding();
        let page = b.finish(Missed::None);
        let p = decode_page(&page, &layout()).unwrap();
        assert_eq!(p.header.missed, Missed::None);
        let ts: Vec<u64> = p.events.iter().map(|e| e.ts).collect();
        assert_eq!(ts, vec![1_000, 1_010, 1_010 + (1 << 30) + 5, 5_000_000_003]);
        assert_eq!(p.events[0].data, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(p.events[0].offset, 16);
        assert_eq!(p.events[1].data, &big[..]);
        assert_eq!(p.events[1].offset, 28);
        assert_eq!(p.events[2].data, &[9; 4]);
        assert_eq!(p.events[3].data, &[7; 16]);
    }

    #[test]
    fn padding_ends_the_page() {
        let mut b = PageBuilder::new(layout(), 0);
        b.data(0, &[1; 8]).end_padding().data(0, &[2; 8]);
        let page = b.finish(Missed::None);
        assert_eq!(decode_page(&page, &layout()).unwrap().events.len(), 1);
    }

    #[test]
    fn missed_flags_with_and_without_count() {
        let mut b = PageBuilder::new(layout(), 0);
        b.data(0, &[1; 8]);
        let stored = b.finish(Missed::Count(42));
        assert_eq!(decode_page(&stored, &layout()).unwrap().header.missed, Missed::Count(42));
        let unknown = b.finish(Missed::Unknown);
        assert_eq!(decode_page(&unknown, &layout()).unwrap().header.missed, Missed::Unknown);
        // STORED with no room after the data: the count cannot be there.
        let full = layout().data_size as u64 | RB_MISSED_EVENTS | RB_MISSED_STORED;
        let mut page = vec![0u8; 4096];
        page[8..16].copy_from_slice(&full.to_le_bytes());
        page[16] = TYPE_PADDING as u8;
        assert_eq!(parse_header(&page, &layout()).unwrap().missed, Missed::Unknown);
    }

    #[test]
    fn fix_abs_restores_top_bits() {
        let prev = (0x08u64 << 56) | 100;
        let stored = 200; // low 59 bits
        assert_eq!(fix_abs(stored, prev), (0x08 << 56) | 200);
        // Stored value below prev's low bits: the top part wrapped once.
        assert_eq!(fix_abs(50, prev), ((0x08u64 << 56) | 50) + (1 << 59));
        assert_eq!(fix_abs(7, 3), 7);
    }

    #[test]
    fn flipped_commit_is_reported_at_offset_8() {
        let mut b = PageBuilder::new(layout(), 0);
        b.data(0, &[1; 8]);
        let mut page = b.finish(Missed::None);
        page[10] ^= 0x40; // commit length gains 0x400000
        assert_eq!(
            decode_page(&page, &layout()),
            Err(Corruption {
                offset: 8,
                reason: CorruptReason::CommitBeyondSubbuf { commit_len: 0x40000c, data_size: 4080 }
            })
        );
    }

    #[test]
    fn bad_length_is_reported_at_the_event() {
        let mut b = PageBuilder::new(layout(), 0);
        b.data(0, &[1; 8]).data(1, &[2; 200]);
        let mut page = b.finish(Missed::None);
        // Second event (offset 28) is a large one: array[0] at 32.
        page[32..36].copy_from_slice(&5000u32.to_le_bytes());
        assert_eq!(
            decode_page(&page, &layout()),
            Err(Corruption {
                offset: 28,
                reason: CorruptReason::LengthOutOfPage { len: 5004, left: 208 }
            })
        );
        page[32..36].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(
            decode_page(&page, &layout()).unwrap_err().reason,
            CorruptReason::LengthTooSmall { len: 2 }
        );
    }

    #[test]
    fn backwards_time_stamp_and_truncated_header() {
        let mut b = PageBuilder::new(layout(), 1_000_000);
        b.data(0, &[1; 8]).time_stamp(10).data(0, &[1; 8]);
        assert_eq!(
            decode_page(&b.finish(Missed::None), &layout()),
            Err(Corruption {
                offset: 28,
                reason: CorruptReason::TimestampBackwards { prev: 1_000_000, ts: 10 }
            })
        );
        let mut b = PageBuilder::new(layout(), 0);
        b.data(0, &[1; 8]);
        let mut page = b.finish(Missed::None);
        // Commit ends two bytes into a following header word.
        page[8..16].copy_from_slice(&14u64.to_le_bytes());
        assert_eq!(
            decode_page(&page, &layout()),
            Err(Corruption {
                offset: 28,
                reason: CorruptReason::TruncatedHeader { need: 4, left: 2 }
            })
        );
        assert_eq!(
            decode_page(&[0u8; 10], &layout()).unwrap_err().reason,
            CorruptReason::ShortPage { len: 10, need: 16 }
        );
    }

    #[test]
    fn cursor_resumes_as_commit_grows() {
        let mut b = PageBuilder::new(layout(), 100);
        b.data(0, &[1; 8]);
        let first_end = b.pos();
        b.data(4, &[2; 8]);
        let page = b.finish(Missed::None);
        let header = parse_header(&page, &layout()).unwrap();
        let mut cursor = PageCursor::new(&layout(), &header);
        let mut got = Vec::new();
        cursor.parse(&page, first_end, |e| got.push(e.ts)).unwrap();
        assert_eq!(got, vec![100]);
        cursor.parse(&page, 16 + header.commit_len, |e| got.push(e.ts)).unwrap();
        assert_eq!(got, vec![100, 104]);
        assert_eq!(cursor.pos, 16 + header.commit_len);
    }

    /// Work per page byte a captured page stays under with all the fuzz target does to it: one or
    /// two layouts, each walking the page at most three times (decoded, then parsed again in two
    /// steps), plus each record's fields.
    const SEED_WORK_PER_BYTE_MAX: u64 = 8;

    #[test]
    fn every_fuzz_seed_costs_work_linear_in_its_bytes() {
        use crate::ftrace::format::EventFormat;
        use crate::ftrace::record::{common_fields, decode_fields};
        let fork = include_str!("../../../tests/fixtures/ftrace/sched_process_fork.format");
        let format = EventFormat::parse(fork).unwrap();
        let seeds = crate::work::fuzz_seeds("ftrace_page");
        let names: Vec<&str> = seeds.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["overrun-0", "overrun-1", "overrun-2", "pages-0", "pages-1"]);
        let mut runs = Vec::new();
        for (name, page) in &seeds {
            // What fuzz/fuzz_targets/ftrace_page.rs runs, without its checks.
            let ((), work) = crate::work::measure(|| {
                let real = PageLayout::for_subbuf_size(4096);
                let sized = PageLayout::for_subbuf_size(page.len());
                let layouts: &[PageLayout] = if sized == real { &[real] } else { &[real, sized] };
                for &layout in layouts {
                    let Ok(decoded) = decode_page(page, &layout) else { continue };
                    for e in decoded.events.iter().filter(|e| common_fields(e.data).is_ok()) {
                        let _ = decode_fields(&format, e.data);
                    }
                    let mut cursor = PageCursor::new(&layout, &decoded.header);
                    let commit = decoded.header.commit_len;
                    let split = layout.data_offset + usize::from(page[0]) * 16 % (commit + 1);
                    if cursor.parse(page, split, |_| {}).is_ok() {
                        cursor.parse(page, layout.data_offset + commit, |_| {}).unwrap();
                    }
                }
            });
            runs.push((name.clone(), work, page.len()));
        }
        crate::work::assert_linear(&runs, SEED_WORK_PER_BYTE_MAX);
    }
}
