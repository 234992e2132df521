//! Ring-buffer sub-buffers (random and mutated real pages): the page decoder, the incremental
//! cursor and the record decoder must never panic or read out of bounds, what they accept must
//! be self-consistent, and decoded fields are written as JSON byte for byte as serde_json writes
//! them (the reference of tracer's direct writer).
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use tracer_decode::ftrace::format::EventFormat;
use tracer_decode::ftrace::page::{PageCursor, PageLayout, decode_page, parse_header};
use tracer_decode::ftrace::record::{common_fields, decode_fields};
use tracer_decode::json::WriteJson;

/// sched_process_fork on Linux 6.18: two `__data_loc` strings and two ints.
const FORK: &str = include_str!("../../tests/fixtures/ftrace/sched_process_fork.format");
/// Parsed once: parsing it for every input cost more than decoding most inputs.
static FORMAT: LazyLock<EventFormat> =
    LazyLock::new(|| EventFormat::parse(FORK).expect("fixture format parses"));

fuzz_target!(|page: &[u8]| {
    let format = &*FORMAT;
    // The real 4 KiB layout, and one sized to the input so commit limits are hit too (a 4 KiB
    // input, as most are, has the one layout: decoding it twice would find nothing new).
    let (real, sized) =
        (PageLayout::for_subbuf_size(4096), PageLayout::for_subbuf_size(page.len()));
    let layouts: &[PageLayout] = if sized == real { &[real] } else { &[real, sized] };
    // Reused by every record: growing new buffers each time was a good part of the cost.
    let (mut written, mut reference) = (Vec::new(), Vec::new());
    for &layout in layouts {
        let Ok(decoded) = decode_page(page, &layout) else { continue };
        let end = layout.data_offset + decoded.header.commit_len;
        assert!(end <= page.len() && end <= layout.subbuf_size());
        let mut last_ts = decoded.header.timestamp;
        for e in &decoded.events {
            assert!(e.ts >= last_ts, "timestamps monotone within a page");
            last_ts = e.ts;
            assert!(e.offset >= layout.data_offset && e.offset + e.data.len() <= end);
            if common_fields(e.data).is_ok() {
                if let Ok(fields) = decode_fields(format, e.data) {
                    assert_eq!(fields.0.len(), format.event_fields().count());
                    (written.clear(), reference.clear());
                    fields.write_json(&mut written);
                    serde_json::to_writer(&mut reference, &fields).unwrap();
                    assert_eq!(written, reference);
                }
            }
        }
        // Parsing in two steps (a writer committing more later) yields the same events.
        let header = parse_header(page, &layout).expect("header decoded above");
        let mut cursor = PageCursor::new(&layout, &header);
        let seed = usize::from(page.first().copied().unwrap_or(0)) * 16;
        let split = layout.data_offset + seed % (decoded.header.commit_len + 1);
        let mut again = Vec::new();
        let first = cursor.parse(page, split, |e| again.push(e));
        if first.is_ok() {
            cursor.parse(page, end, |e| again.push(e)).expect("the whole page parsed");
            assert_eq!(again, decoded.events);
        }
    }
});
