//! The kernel-free half of consuming an ftrace ring buffer: page bytes become checked records of
//! known tracepoints with per-CPU accounting ([`StreamDecoder`]), and per-CPU record queues are
//! merged in time order ([`ReorderWindow`]). The transports that fetch the pages (mapped
//! sub-buffers, `read()` of `trace_pipe_raw`) live in tracer's kernel layer and share this.
use std::collections::VecDeque;
use std::sync::Arc;

use serde::Serialize;
use thiserror::Error;

use super::format::EventFormat;
use super::page::{Corruption, Missed, PageCursor, PageLayout, RawEvent, parse_header};
use super::record::{CommonFields, Fields, RecordError, common_fields, decode_fields};

/// A tracepoint the reader decodes: its system, name and parsed format (which holds the id).
#[derive(Clone, Debug)]
pub struct Tracepoint {
    pub system: String,
    pub name: String,
    pub format: EventFormat,
}

/// One decoded record.
#[derive(Clone, Debug)]
pub struct Event {
    pub cpu: u32,
    /// Timestamp in the instance's `trace_clock` (CLOCK_MONOTONIC ns with `mono`).
    pub ts: u64,
    pub tracepoint: Arc<Tracepoint>,
    pub common: CommonFields,
    /// The record from `common_type` on, including the ring buffer's alignment padding.
    pub record: Vec<u8>,
}

impl Event {
    /// The format's fields (without `common_*`).
    pub fn fields(&self) -> Result<Fields<'_>, RecordError> {
        decode_fields(&self.tracepoint.format, &self.record)
    }
}

/// One decoded record, borrowed from the ring-buffer page it was read from: with the mmap
/// transport that is the kernel's sub-buffer itself, so nothing has been copied. Its fields:
/// `decode_fields(&record.tracepoint.format, record.record)`.
#[derive(Clone, Copy, Debug)]
pub struct RecordRef<'a> {
    pub cpu: u32,
    /// Timestamp in the instance's `trace_clock`.
    pub ts: u64,
    pub tracepoint: &'a Arc<Tracepoint>,
    pub common: CommonFields,
    /// The record from `common_type` on, including the ring buffer's alignment padding.
    pub record: &'a [u8],
}

impl RecordRef<'_> {
    pub fn to_event(&self) -> Event {
        Event {
            cpu: self.cpu,
            ts: self.ts,
            tracepoint: self.tracepoint.clone(),
            common: self.common,
            record: self.record.to_vec(),
        }
    }
}

/// A page that failed an integrity check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CorruptionReport {
    pub cpu: u32,
    /// mmap: the sub-buffer id; read(): the index of the page read from this CPU.
    pub subbuf_id: u64,
    /// Byte offset within the sub-buffer.
    pub offset: usize,
    pub reason: String,
}

impl std::fmt::Display for CorruptionReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "corrupt ring-buffer page: cpu {} sub-buffer {} byte {}: {}",
            self.cpu, self.subbuf_id, self.offset, self.reason
        )
    }
}

/// Per-CPU counters: what was decoded, and every way events were lost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CpuStats {
    pub cpu: u32,
    /// Records decoded and handed out.
    pub records: u64,
    /// Sum of the lost counts stored on pages (RB_MISSED_STORED).
    pub lost_on_pages: u64,
    /// Pages flagged RB_MISSED_EVENTS without a stored count.
    pub pages_with_unknown_loss: u64,
    /// Kernel: entries overwritten (overwrite mode), from the stats file.
    pub overrun: u64,
    /// Kernel: entries dropped because the buffer was full (no-overwrite mode).
    pub dropped: u64,
    /// Kernel: entries still in the buffer.
    pub entries: u64,
    pub corrupt_pages: u64,
    /// Records whose size is below their format's fixed size.
    pub bad_records: u64,
    /// Records of event ids not in the reader's tracepoint set.
    pub unknown_events: u64,
}

impl CpuStats {
    /// Events lost on this CPU. Page flags and the overrun counter describe the same overwritten
    /// events (the flags only once a later page is read), so the larger one counts.
    pub fn lost(&self) -> u64 {
        self.overrun.max(self.lost_on_pages) + self.dropped
    }
}

/// Why decoding pages stopped.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StreamError {
    /// A corrupt page under strict integrity.
    #[error("{0} (--integrity strict)")]
    Corrupt(CorruptionReport),
    #[error("cpu {0} is not read by this reader")]
    UnknownCpu(u32),
}

/// Events in the reorder window, one queue per CPU (each already in time order).
#[derive(Default)]
pub struct ReorderWindow {
    per_cpu: Vec<VecDeque<Event>>,
    len: usize,
}

impl ReorderWindow {
    pub fn new(nr_cpus: usize) -> ReorderWindow {
        ReorderWindow { per_cpu: (0..nr_cpus).map(|_| VecDeque::new()).collect(), len: 0 }
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Holds a copy of `record`, read from the CPU at index `idx`.
    pub fn push(&mut self, idx: usize, record: RecordRef<'_>) {
        self.per_cpu[idx].push_back(record.to_event());
        self.len += 1;
    }

    /// Merges the per-CPU queues: releases, oldest first, every event at or before `horizon`
    /// (and more while more than `max_held` are held).
    pub fn release(&mut self, horizon: u64, max_held: usize) -> Vec<Event> {
        let mut out = Vec::new();
        loop {
            let oldest = self
                .per_cpu
                .iter()
                .enumerate()
                .filter_map(|(i, q)| q.front().map(|e| (e.ts, i)))
                .min();
            let Some((ts, idx)) = oldest else { break };
            if ts > horizon && self.len <= max_held {
                break;
            }
            out.push(self.per_cpu[idx].pop_front().expect("front exists"));
            self.len -= 1;
        }
        out
    }
}

/// The tracepoints being decoded, sorted by event id: every record is looked up here, and a
/// binary search over a few (or a few hundred) ids costs less than hashing each one.
#[derive(Default)]
struct TracepointsById(Vec<(u16, Arc<Tracepoint>)>);

impl TracepointsById {
    fn insert(&mut self, tracepoint: Arc<Tracepoint>) {
        let id = tracepoint.format.id;
        match self.0.binary_search_by_key(&id, |(i, _)| *i) {
            Ok(at) => self.0[at].1 = tracepoint,
            Err(at) => self.0.insert(at, (id, tracepoint)),
        }
    }

    fn remove(&mut self, id: u16) {
        if let Ok(at) = self.0.binary_search_by_key(&id, |(i, _)| *i) {
            self.0.remove(at);
        }
    }

    fn get(&self, id: u16) -> Option<&Arc<Tracepoint>> {
        let at = self.0.binary_search_by_key(&id, |(i, _)| *i).ok()?;
        Some(&self.0[at].1)
    }
}

/// Turns page bytes into records and reports; shared by every transport.
pub struct StreamDecoder {
    layout: PageLayout,
    by_id: TracepointsById,
    stats: Vec<CpuStats>,
    strict: bool,
    /// The latest corrupt page (each is logged and counted; only the latest is kept).
    last_corruption: Option<CorruptionReport>,
}

impl StreamDecoder {
    /// A decoder of the CPUs `cpus` (their index in this slice is the `idx` of every call and
    /// of the records handed out). `strict`: a corrupt page is an error instead of a report.
    pub fn new(
        layout: PageLayout,
        tracepoints: Vec<Tracepoint>,
        cpus: &[u32],
        strict: bool,
    ) -> StreamDecoder {
        let stats = cpus.iter().map(|&cpu| CpuStats { cpu, ..Default::default() }).collect();
        let mut decoder = StreamDecoder {
            layout,
            by_id: TracepointsById::default(),
            stats,
            strict,
            last_corruption: None,
        };
        tracepoints.into_iter().for_each(|tp| decoder.add_tracepoint(tp));
        decoder
    }

    /// Decodes records of one more tracepoint from now on.
    pub fn add_tracepoint(&mut self, tracepoint: Tracepoint) {
        self.by_id.insert(Arc::new(tracepoint));
    }

    /// Stops decoding the tracepoint with this id: its records count as unknown events.
    pub fn remove_tracepoint(&mut self, id: u16) {
        self.by_id.remove(id);
    }

    pub fn layout(&self) -> &PageLayout {
        &self.layout
    }

    /// Counters per CPU, in the order of `cpus` given to [`new`](Self::new).
    pub fn stats(&self) -> &[CpuStats] {
        &self.stats
    }

    /// The latest corrupt page seen, if any.
    pub fn last_corruption(&self) -> Option<&CorruptionReport> {
        self.last_corruption.as_ref()
    }

    pub fn cpu_index(&self, cpu: u32) -> Result<usize, StreamError> {
        self.stats.iter().position(|s| s.cpu == cpu).ok_or(StreamError::UnknownCpu(cpu))
    }

    pub fn missed(&mut self, idx: usize, missed: Missed) {
        match missed {
            Missed::None => {}
            Missed::Unknown => self.stats[idx].pages_with_unknown_loss += 1,
            Missed::Count(n) => self.stats[idx].lost_on_pages += n,
        }
    }

    /// Records a corrupt page; fatal in strict mode.
    pub fn corrupt(
        &mut self,
        idx: usize,
        cpu: u32,
        subbuf_id: u64,
        c: Corruption,
    ) -> Result<(), StreamError> {
        self.stats[idx].corrupt_pages += 1;
        let report =
            CorruptionReport { cpu, subbuf_id, offset: c.offset, reason: c.reason.to_string() };
        if self.strict {
            return Err(StreamError::Corrupt(report));
        }
        log::warn!("{report}; page skipped");
        self.last_corruption = Some(report);
        Ok(())
    }

    /// Decodes a complete page (the read() transport, saved captures). Returns the length of
    /// its committed data (how full the writer left it), or `None` for a page whose header is
    /// corrupt (counted as such).
    pub fn whole_page(
        &mut self,
        idx: usize,
        cpu: u32,
        subbuf_id: u64,
        page: &[u8],
        sink: &mut impl FnMut(usize, RecordRef<'_>),
    ) -> Result<Option<usize>, StreamError> {
        let header = match parse_header(page, &self.layout) {
            Ok(h) => h,
            Err(c) => return self.corrupt(idx, cpu, subbuf_id, c).map(|()| None),
        };
        self.missed(idx, header.missed);
        let mut cursor = PageCursor::new(&self.layout, &header);
        self.parse(
            idx,
            cpu,
            subbuf_id,
            page,
            &mut cursor,
            self.layout.data_offset + header.commit_len,
            sink,
        )?;
        Ok(Some(header.commit_len))
    }

    /// Parses `page[cursor.pos..end]`. Events before a corruption are kept (each passed every
    /// check); the rest of the page is skipped.
    #[allow(clippy::too_many_arguments)]
    pub fn parse(
        &mut self,
        idx: usize,
        cpu: u32,
        subbuf_id: u64,
        page: &[u8],
        cursor: &mut PageCursor,
        end: usize,
        sink: &mut impl FnMut(usize, RecordRef<'_>),
    ) -> Result<(), StreamError> {
        let (stats, by_id) = (&mut self.stats[idx], &self.by_id);
        let result = cursor.parse(page, end, |raw| {
            if let Some(record) = checked_record(stats, by_id, cpu, raw) {
                sink(idx, record);
            }
        });
        if let Err(c) = result {
            cursor.ended = true;
            self.corrupt(idx, cpu, subbuf_id, c)?;
        }
        Ok(())
    }
}

/// The record of `raw` when it is of a known tracepoint and long enough for its format;
/// otherwise counted in `stats`. Inlined into the page loop: it runs for every record.
#[inline]
fn checked_record<'a>(
    stats: &mut CpuStats,
    by_id: &'a TracepointsById,
    cpu: u32,
    raw: RawEvent<'a>,
) -> Option<RecordRef<'a>> {
    let Ok(common) = common_fields(raw.data) else {
        stats.bad_records += 1;
        return None;
    };
    let Some(tracepoint) = by_id.get(common.common_type) else {
        stats.unknown_events += 1;
        return None;
    };
    let fixed_size = tracepoint.format.fixed_size();
    if raw.data.len() < fixed_size {
        stats.bad_records += 1;
        warn_short_record(cpu, &raw, tracepoint, fixed_size);
        return None;
    }
    stats.records += 1;
    Some(RecordRef { cpu, ts: raw.ts, tracepoint, common, record: raw.data })
}

/// Out of [`checked_record`]'s line: formatting a warning is not part of every record's cost.
#[cold]
#[inline(never)]
fn warn_short_record(cpu: u32, raw: &RawEvent<'_>, tracepoint: &Tracepoint, fixed_size: usize) {
    log::warn!(
        "cpu {cpu} byte {}: {}:{} record of {} bytes is shorter than its format's {fixed_size}",
        raw.offset,
        tracepoint.system,
        tracepoint.name,
        raw.data.len(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ftrace::page::build::PageBuilder;

    const RAW_DATA_FORMAT: &str = include_str!("../../../tests/fixtures/ftrace/raw_data.format");

    fn raw_data() -> Tracepoint {
        Tracepoint {
            system: "ftrace".into(),
            name: "raw_data".into(),
            format: EventFormat::parse(RAW_DATA_FORMAT).unwrap(),
        }
    }

    /// A raw_data record: common fields (type 19, pid 1234), then `id` = `seq`.
    fn record(seq: u32) -> Vec<u8> {
        let mut r = 19u16.to_le_bytes().to_vec();
        r.extend([0, 0]);
        r.extend(1234i32.to_le_bytes());
        r.extend(seq.to_le_bytes());
        r
    }

    fn decode(decoder: &mut StreamDecoder, cpu: u32, page: &[u8]) -> Result<Vec<u32>, StreamError> {
        let idx = decoder.cpu_index(cpu)?;
        let mut seqs = Vec::new();
        decoder.whole_page(idx, cpu, 77, page, &mut |_, r| {
            seqs.push(u32::from_le_bytes(r.record[8..12].try_into().unwrap()))
        })?;
        Ok(seqs)
    }

    /// A page with record 1000, then a record whose length field claims 5000 bytes; returns it
    /// with the offset of the bad record and the bytes left after it.
    fn corrupt_page(layout: PageLayout) -> (Vec<u8>, usize, usize) {
        let mut b = PageBuilder::new(layout, 1_000);
        b.data(0, &record(1000));
        let bad_at = b.pos();
        // Over 112 bytes: a type_len 0 event with its length at bad_at + 4.
        let mut long = record(1001);
        long.resize(120, 0);
        b.data(3, &long);
        let mut page = b.finish(Missed::None);
        page[bad_at + 4..bad_at + 8].copy_from_slice(&5000u32.to_le_bytes());
        let left = b.pos() - bad_at;
        (page, bad_at, left)
    }

    #[test]
    fn corrupt_page_is_reported_and_decoding_continues() {
        let layout = PageLayout::for_subbuf_size(4096);
        let mut decoder = StreamDecoder::new(layout, vec![raw_data()], &[0, 1], false);
        let (page, bad_at, left) = corrupt_page(layout);
        assert_eq!(decode(&mut decoder, 0, &page), Ok(vec![1000]), "the record before it stays");
        assert_eq!(
            decoder.last_corruption(),
            Some(&CorruptionReport {
                cpu: 0,
                subbuf_id: 77,
                offset: bad_at,
                reason: format!("event length 5004 runs past commit ({left} bytes left)"),
            })
        );
        let mut b = PageBuilder::new(layout, 2_000);
        b.data(0, &record(1)).data(5, &record(2));
        assert_eq!(decode(&mut decoder, 0, &b.finish(Missed::Count(3))), Ok(vec![1, 2]));
        let cpu0 = decoder.stats()[0];
        assert_eq!((cpu0.records, cpu0.corrupt_pages, cpu0.lost_on_pages), (3, 1, 3));
        assert_eq!(decoder.stats()[1], CpuStats { cpu: 1, ..Default::default() });
    }

    #[test]
    fn a_whole_page_reports_how_much_data_it_held() {
        let layout = PageLayout::for_subbuf_size(4096);
        let mut decoder = StreamDecoder::new(layout, vec![raw_data()], &[0], false);
        let mut b = PageBuilder::new(layout, 1);
        b.data(0, &record(1)).data(0, &record(2));
        // Two 12-byte records, each after a 4-byte event header.
        let page = b.finish(Missed::None);
        assert_eq!(decoder.whole_page(0, 0, 1, &page, &mut |_, _| {}), Ok(Some(32)));
        let mut bad = vec![0u8; 4096];
        bad[8..16].copy_from_slice(&5000u64.to_le_bytes());
        assert_eq!(decoder.whole_page(0, 0, 2, &bad, &mut |_, _| {}), Ok(None), "corrupt header");
        assert_eq!(decoder.stats()[0].corrupt_pages, 1);
    }

    #[test]
    fn strict_integrity_makes_a_corrupt_page_fatal() {
        let layout = PageLayout::for_subbuf_size(4096);
        let mut decoder = StreamDecoder::new(layout, vec![raw_data()], &[0, 1], true);
        let mut page = vec![0u8; 4096];
        page[8..16].copy_from_slice(&5000u64.to_le_bytes());
        let err = decode(&mut decoder, 1, &page).unwrap_err();
        assert_eq!(
            err.to_string(),
            "corrupt ring-buffer page: cpu 1 sub-buffer 77 byte 8: commit length 5000 exceeds the \
             sub-buffer's data size 4080 (--integrity strict)"
        );
        assert_eq!(decode(&mut decoder, 5, &page), Err(StreamError::UnknownCpu(5)));
    }

    #[test]
    fn unknown_and_short_records_are_counted_not_handed_out() {
        let layout = PageLayout::for_subbuf_size(4096);
        let mut decoder = StreamDecoder::new(layout, vec![raw_data()], &[0], false);
        let mut other = record(1);
        other[0] = 20; // an event id the decoder was not given
        let short = record(2)[..8].to_vec(); // common fields only: below raw_data's 12 bytes
        let mut b = PageBuilder::new(layout, 1);
        b.data(0, &other).data(0, &short).data(0, &record(3));
        assert_eq!(decode(&mut decoder, 0, &b.finish(Missed::Unknown)), Ok(vec![3]));
        let s = decoder.stats()[0];
        assert_eq!(
            (s.records, s.unknown_events, s.bad_records, s.pages_with_unknown_loss),
            (1, 1, 1, 1)
        );
        decoder.remove_tracepoint(19);
        let mut b = PageBuilder::new(layout, 1);
        b.data(0, &record(4));
        assert_eq!(decode(&mut decoder, 0, &b.finish(Missed::None)), Ok(vec![]));
        assert_eq!(decoder.stats()[0].unknown_events, 2);
    }

    #[test]
    fn reorder_window_merges_cpus_in_time_order_and_bounds_what_it_holds() {
        let tp = Arc::new(raw_data());
        let rec = record(0);
        let push = |w: &mut ReorderWindow, idx: usize, ts: u64| {
            let common = common_fields(&rec).unwrap();
            w.push(idx, RecordRef { cpu: idx as u32, ts, tracepoint: &tp, common, record: &rec });
        };
        let mut w = ReorderWindow::new(2);
        for ts in [10, 30, 50] {
            push(&mut w, 0, ts);
        }
        for ts in [20, 40] {
            push(&mut w, 1, ts);
        }
        let ts = |events: Vec<Event>| events.iter().map(|e| (e.cpu, e.ts)).collect::<Vec<_>>();
        assert_eq!(ts(w.release(35, 100)), vec![(0, 10), (1, 20), (0, 30)]);
        assert_eq!(w.len(), 2);
        // Over the bound, the oldest leave even past the horizon.
        assert_eq!(ts(w.release(0, 1)), vec![(1, 40)]);
        assert_eq!(ts(w.release(u64::MAX, 100)), vec![(0, 50)]);
        assert!(w.is_empty());
    }
}
