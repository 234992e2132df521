//! nettrace parser on arbitrary bytes, fed in arbitrary chunks: it must never panic, must give
//! the same events and the same outcome however the input is split, and every event it yields
//! must decode (to fields or to a reported error) without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::decode::nettrace::{NettraceError, NettraceParser};

/// Parses `data` in chunks whose sizes (each + 1) cycle through `chunks`, or in one piece when
/// `chunks` is empty; returns each event's JSON line and the outcome.
fn run(data: &[u8], chunks: &[u8]) -> (Vec<String>, Result<(), NettraceError>) {
    let whole = [u8::MAX];
    let (chunks, scale) = if chunks.is_empty() { (&whole[..], data.len()) } else { (chunks, 1) };
    let mut parser = NettraceParser::default();
    let mut lines = Vec::new();
    let mut at = 0;
    let mut result = Ok(());
    for size in chunks.iter().cycle() {
        if at >= data.len() || result.is_err() {
            break;
        }
        let n = ((usize::from(*size) + 1) * scale).min(data.len() - at);
        let fed = (at + n) as u64;
        result = parser.feed(&data[at..at + n], |e| {
            // An event (header at `offset`, then its payload) lies inside the bytes fed so far.
            assert!(e.offset + e.payload.len() as u64 <= fed, "event at {} beyond {fed}", e.offset);
            lines.push(format!("{} {}", e.offset, serde_json::to_string(&e.decode()).unwrap()));
        });
        at += n;
    }
    // Every byte fed is counted, also after an error.
    assert_eq!(parser.stats().bytes, at as u64);
    (lines, result.and_then(|()| parser.finish()))
}

fuzz_target!(|input: &[u8]| {
    // First byte: how many chunk-size bytes follow; the rest is the stream.
    let Some((&n, rest)) = input.split_first() else { return };
    let (chunks, data) = rest.split_at(usize::from(n % 16).min(rest.len()));
    let whole = run(data, &[]);
    let chunked = run(data, if chunks.is_empty() { &[0] } else { chunks });
    assert_eq!(whole, chunked);
});
