//! nettrace parser on arbitrary bytes, fed in arbitrary chunks: it must never panic, must give
//! the same events and the same outcome however the input is split, and every event it yields
//! must decode (to fields or to a reported error) without panicking, be written as JSON byte for
//! byte as serde_json writes it (the reference of tracer's direct writer), and any runtime
//! counter sample it carries must be fit for the metrics exposition as it is, and a log message
//! it carries within its bounds; method and module events go into a method table, which names
//! the stacks of the events that carry one, as a streaming session names them (within the
//! stack budget and the per-line bound).
//!
//! Work and output are bounded by input bytes (tracer-decode/src/budget.rs): each event's JSON is within the
//! bound the payload decoder's charges promise ([`event_json_bound`]), and the lines written as
//! tracer's streaming session writes them (JSON + envelope, spent from an `OutputBudget` earned
//! by the bytes fed) never pass `OUTPUT_BYTES_PER_INPUT_BYTE × input + OUTPUT_ALLOWANCE_BYTES`,
//! nor their named stacks `STACK_OUTPUT_BYTES_PER_INPUT_BYTE × input +
//! STACK_OUTPUT_ALLOWANCE_BYTES`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::budget::{
    OUTPUT_ALLOWANCE_BYTES, OUTPUT_BYTES_PER_INPUT_BYTE, OutputBudget,
    STACK_OUTPUT_ALLOWANCE_BYTES, STACK_OUTPUT_BYTES_PER_INPUT_BYTE,
};
use tracer_decode::counters::{
    CounterReader, CounterSample, MAX_HELP, MAX_LABEL_VALUE, MAX_METRIC_NAME, MAX_QUANTILES,
    MAX_TAGS, PROCESS_LABELS, RESERVED_PREFIX, Reading, counter_sample,
};
use tracer_decode::logging::{LogRecord, MAX_ARGUMENTS, MAX_TEXT, log_record};
use tracer_decode::nettrace::methods::MethodTable;
use tracer_decode::nettrace::payload::cost_budget;
use tracer_decode::nettrace::stacks::{MAX_STACK_JSON_BYTES, NamedStack};
use tracer_decode::nettrace::{
    EventMetadata, MetadataLimits, NettraceError, NettraceParser, OutputEvent,
};

/// Bytes tracer's envelope adds to an event (`ts`, `mono_ns`, `pid`, `kind`, `source`).
const ENVELOPE: u64 = 160;

/// The most JSON one event may render: escaped names (≤ 6 bytes per UTF-8 byte), fields within
/// 9 × their cost budget (6× escaping of what was charged + ≤ 24 digits per value charged ≥ 8),
/// or the hex fallback with an error naming one field, plus fixed header fields.
fn event_json_bound(meta: &EventMetadata, payload_len: usize) -> usize {
    let field_name = 6 * 3 * MetadataLimits::default().max_name_units;
    6 * (meta.provider.len() + meta.event_name.len() + 16)
        + (9 * cost_budget(payload_len)).max(2 * payload_len + field_name + 256)
        + 512
}

/// A counter sample from peer bytes can go into the exposition as it is: a valid metric name
/// of bounded length outside tracer's own prefix, HELP without characters needing escapes, and
/// a finite value.
fn assert_sample_is_exposable(sample: &CounterSample) {
    let name = sample.metric.as_bytes();
    assert!(!name.is_empty() && name.len() <= MAX_METRIC_NAME, "{sample:?}");
    assert!(name[0].is_ascii_alphabetic() || name[0] == b'_', "{sample:?}");
    assert!(name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_'), "{sample:?}");
    assert!(!sample.metric.starts_with(RESERVED_PREFIX), "{sample:?}");
    assert!(sample.help.len() <= MAX_HELP, "{sample:?}");
    assert!(sample.help.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'\\' && b != b'"'));
    let finite = match &sample.reading {
        Reading::Level(v) => v.is_finite(),
        Reading::Added { amount, total } => amount.is_finite() && total.is_none_or(f64::is_finite),
        Reading::Distribution(d) => {
            d.quantiles.len() <= MAX_QUANTILES
                && d.quantiles.iter().all(|(q, v)| (0.0..=1.0).contains(q) && v.is_finite())
                && d.count_and_sum.is_none_or(|(_, sum)| sum.is_finite())
        }
    };
    assert!(finite, "{sample:?}");
    assert!(sample.labels.len() <= MAX_TAGS, "{sample:?}");
    for (i, (name, value)) in sample.labels.iter().enumerate() {
        assert!(sample.labels[..i].iter().all(|(seen, _)| seen != name), "{sample:?}");
        let name = name.as_bytes();
        assert!(!name.is_empty() && (name[0].is_ascii_alphabetic() || name[0] == b'_'));
        assert!(name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_'), "{sample:?}");
        assert!(
            !name.starts_with(b"__") && !PROCESS_LABELS.contains(&&*String::from_utf8_lossy(name))
        );
        assert!(value.len() <= MAX_LABEL_VALUE, "{sample:?}");
        assert!(value.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'\\' && b != b'"'));
    }
}

/// A log message from peer bytes keeps within the decoder's bounds.
fn assert_log_is_bounded(log: &LogRecord) {
    let texts = [&log.category, &log.event_name, &log.message];
    assert!(texts.iter().all(|t| t.len() <= MAX_TEXT), "{log:?}");
    assert!(log.template.as_ref().is_none_or(|t| t.len() <= MAX_TEXT), "{log:?}");
    assert!(log.arguments.len() <= MAX_ARGUMENTS, "{log:?}");
    for (key, value) in &log.arguments {
        assert!(key.len() <= MAX_TEXT && value.len() <= MAX_TEXT, "{log:?}");
    }
    assert!(log.trace_id.as_ref().is_none_or(|id| id.len() == 32), "{log:?}");
    assert!(log.span_id.as_ref().is_none_or(|id| id.len() == 16), "{log:?}");
    assert!(log.trace_flags.is_none_or(|f| f <= 1), "{log:?}");
}

/// Parses `data` in chunks whose sizes (each + 1) cycle through `chunks`, or in one piece when
/// `chunks` is empty; returns each event's JSON line (tracer's direct writer) and the outcome.
/// With `reference`, each event is also decoded and checked against the serde reference, its
/// counter sample and its JSON bound: once per input is enough, since the lines of both runs
/// must be equal.
fn run(data: &[u8], chunks: &[u8], reference: bool) -> (Vec<String>, Result<(), NettraceError>) {
    let whole = [u8::MAX];
    let (chunks, scale) = if chunks.is_empty() { (&whole[..], data.len()) } else { (chunks, 1) };
    let mut parser = NettraceParser::default();
    let mut budget = OutputBudget::default();
    let mut stack_budget = OutputBudget::for_stacks();
    let mut lines = Vec::new();
    let mut at = 0;
    let mut result = Ok(());
    let mut over_budget = false;
    let (mut methods, mut named) = (MethodTable::default(), NamedStack::default());
    // One for the stream, as a session has: the names it keeps give the samples built afresh.
    let mut counters = CounterReader::default();
    for size in chunks.iter().cycle() {
        if at >= data.len() || result.is_err() {
            break;
        }
        let n = ((usize::from(*size) + 1) * scale).min(data.len() - at);
        budget.earn(n as u64);
        stack_budget.earn(n as u64);
        let fed = (at + n) as u64;
        result = parser.feed(&data[at..at + n], |e| {
            // An event (header at `offset`, then its payload) lies inside the bytes fed so far.
            assert!(e.offset + e.payload.len() as u64 <= fed, "event at {} beyond {fed}", e.offset);
            // The stream's method events name the stacks of the events after them.
            let time = e.timestamp as u64;
            let _ = methods.take_event(&e.metadata.provider, e.metadata.event_id, e.payload, time);
            let mut event = e.output();
            let mut stack_bytes = 0;
            if let Some(ips) = e.stack
                && named.name_within(&mut stack_budget, ips, time, &mut methods)
            {
                assert!(named.member_len() <= r#","stack":"#.len() + MAX_STACK_JSON_BYTES);
                (event.stack, stack_bytes) = (Some(&named), named.member_len());
            }
            let mut written = Vec::new();
            event.write_json(&mut written);
            let json = String::from_utf8(written).unwrap();
            if reference {
                let decoded = event.decode();
                if let Some(Ok(log)) = log_record(&decoded) {
                    assert_log_is_bounded(&log);
                }
                let sample = counter_sample(&decoded);
                // Sessions decode only the events whose names may carry a sample, once for
                // the line's fields and the sample: the same line, the same sample.
                let mut fields = Vec::new();
                assert_eq!(counters.read(&event, &mut fields), sample);
                if !fields.is_empty() {
                    let mut rendered = Vec::new();
                    OutputEvent { rendered_fields: Some(&fields), ..event }
                        .write_json(&mut rendered);
                    assert_eq!(String::from_utf8(rendered).unwrap(), json);
                }
                if let Some(Ok(sample)) = sample {
                    assert_sample_is_exposable(&sample);
                }
                // Decoded straight into JSON: the same bytes as serde_json over the fields tree.
                assert_eq!(json, serde_json::to_string(&decoded).unwrap());
                let bound = event_json_bound(e.metadata, e.payload.len()) + stack_bytes;
                assert!(json.len() <= bound, "{} > {bound}: {json}", json.len());
            }
            over_budget |= budget.spend((json.len() - stack_bytes) as u64 + ENVELOPE).is_err();
            lines.push(format!("{} {}", e.offset, json));
        });
        at += n;
        // What tracer would have written stays within the bound of what it was sent.
        assert!(
            budget.output() <= OUTPUT_BYTES_PER_INPUT_BYTE * at as u64 + OUTPUT_ALLOWANCE_BYTES
        );
        assert!(
            stack_budget.output()
                <= STACK_OUTPUT_BYTES_PER_INPUT_BYTE * at as u64 + STACK_OUTPUT_ALLOWANCE_BYTES
        );
    }
    let _ = over_budget;
    // Every byte fed is counted, also after an error.
    assert_eq!(parser.stats().bytes, at as u64);
    (lines, result.and_then(|()| parser.finish()))
}

fuzz_target!(|input: &[u8]| {
    // First byte: how many chunk-size bytes follow; the rest is the stream.
    let Some((&n, rest)) = input.split_first() else { return };
    let (chunks, data) = rest.split_at(usize::from(n % 16).min(rest.len()));
    let whole = run(data, &[], true);
    let chunked = run(data, if chunks.is_empty() { &[0] } else { chunks }, false);
    assert_eq!(whole, chunked);
});
