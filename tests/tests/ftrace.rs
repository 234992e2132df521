//! The ftrace reader against the real kernel (root, Linux ≥ 6.10 for the mmap path).
use std::time::Duration;

use tests::ftrace::*;
use tracer::kernel::ftrace_reader::{Event, ReadMode};

const N: u32 = 3000;
const TEXT_LINES: usize = 50;

/// Writes N raw records and TEXT_LINES text markers, reads them back with `mode`, and checks
/// exact count, byte-identical payloads, order, and no loss. Returns (seq or text) in order.
async fn marker_roundtrip(mode: ReadMode, suffix: &str) -> Vec<(u32, String, Vec<u8>)> {
    let inst = instance(suffix, 1024);
    let mut reader = reader(&inst, marker_tracepoints(&inst), mode);
    assert_eq!(reader.mode(), mode);
    inst.set_tracing_on(true).unwrap();
    let lines: Vec<String> = (0..TEXT_LINES).map(|i| format!("tracer-test line {i}\n")).collect();
    write_raw(&inst, 0..N / 2);
    write_text(&inst, &lines);
    write_raw(&inst, N / 2..N);
    let want = N as usize + TEXT_LINES;
    let events =
        collect_until(&mut reader, Duration::from_secs(20), |e: &[Event]| e.len() >= want).await;
    assert_eq!(events.len(), want, "decoded records");
    let stats = reader.stats();
    assert_eq!(stats.lost(), 0, "{stats:?}");
    assert_eq!(stats.corrupt_pages(), 0);
    assert_eq!(stats.records(), want as u64);

    // Timestamps are CLOCK_MONOTONIC and the merge is by timestamp: the write order comes back.
    let mut out = Vec::new();
    let mut next_seq = 0;
    let mut next_line = 0;
    let mut last_ts_per_cpu = std::collections::HashMap::new();
    for e in &events {
        let last = last_ts_per_cpu.entry(e.cpu).or_insert(0u64);
        assert!(e.ts >= *last, "per-CPU order");
        *last = e.ts;
        match e.tracepoint.name.as_str() {
            "raw_data" => {
                let (seq, payload) = parse_raw_record(&e.record);
                assert_eq!(seq, next_seq, "raw records in write order");
                assert_eq!(payload, raw_payload(seq), "byte-identical payload {seq}");
                next_seq += 1;
                out.push((e.cpu, String::new(), payload));
            }
            "print" => {
                let fields = e.fields().unwrap();
                let buf =
                    serde_json::to_value(&fields).unwrap()["buf"].as_str().unwrap().to_string();
                assert_eq!(buf, lines[next_line]);
                // Text lines were written between the two raw halves.
                assert_eq!(next_seq, N / 2);
                next_line += 1;
                out.push((e.cpu, buf, Vec::new()));
            }
            other => panic!("unexpected event {other}"),
        }
    }
    assert_eq!((next_seq, next_line), (N, TEXT_LINES));
    out
}

#[tokio::test]
async fn marker_records_roundtrip_mmap() {
    marker_roundtrip(ReadMode::Mmap, "rt-mmap").await;
}

#[tokio::test]
async fn forced_read_mode_gives_identical_results() {
    let mapped = marker_roundtrip(ReadMode::Mmap, "same-mmap").await;
    let read = marker_roundtrip(ReadMode::Read, "same-read").await;
    let strip =
        |v: Vec<(u32, String, Vec<u8>)>| v.into_iter().map(|(_, s, p)| (s, p)).collect::<Vec<_>>();
    assert_eq!(strip(mapped), strip(read));
}
