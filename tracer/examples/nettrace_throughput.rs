//! nettrace parse throughput: builds a large stream in memory from a captured fixture (its
//! prologue, Trace object, metadata and stack blocks once, then its event and sequence-point
//! blocks replayed, re-framed so block padding stays correct) and parses it.
//!
//! Usage: nettrace_throughput FIXTURE [MEGABYTES=256] [CHUNK_BYTES=65536]
//!        [parse|decode|json|otlp|counters|both]
//! Prints MB/s for the parser alone (events counted), with every payload decoded into a fields tree (`decode`: what counters and the stopping
//! event inspect), and
//! with every event rendered as the `dotnet_event` line a streaming session writes (`json`:
//! envelope, process labels, decoded event, into the batches a session hands on, each written
//! by the pipeline's writer to nowhere); `otlp`: `json` and each line's OTLP log record encoded
//! with it (`--otlp-endpoint`); `counters`: `json` with each counter event's sample read and kept
//! as the pipeline keeps it for `/metrics` (`--metrics-addr`, the node agent); `both` is `parse`
//! and `json`.
use std::sync::Arc;
use std::time::Instant;

use tracer::metrics::runtime::RuntimeCounters;
use tracer::output::{Incarnation, JsonLines, ProcessLabels, Source};
use tracer::session::{EVENT_LINES_BATCH_BYTES, EventLines, EventOrigin, LineExtras};
use tracer::time::Clock;
use tracer_decode::nettrace::NettraceParser;

/// Writes one block object with the padding its absolute offset needs.
fn push_block(out: &mut Vec<u8>, name: &[u8], content: &[u8]) {
    out.extend([5, 5, 1]);
    out.extend(2i32.to_le_bytes());
    out.extend(2i32.to_le_bytes());
    out.extend((name.len() as u32).to_le_bytes());
    out.extend(name);
    out.push(6);
    out.extend((content.len() as u32).to_le_bytes());
    out.resize(out.len().next_multiple_of(4), 0);
    out.extend(content);
    out.push(6);
}

/// (type name, content) of one block object.
type Block = (Vec<u8>, Vec<u8>);

/// Splits a well-formed capture into its head (prologue + Trace) and its blocks.
fn blocks(data: &[u8]) -> (Vec<u8>, Vec<Block>) {
    let u32_at = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
    let head_len = 32 + 16 + 5 + 48 + 1;
    let mut blocks = Vec::new();
    let mut at = head_len;
    while data[at] == 5 {
        let name_len = u32_at(at + 11);
        let name = data[at + 15..at + 15 + name_len].to_vec();
        let size_at = at + 16 + name_len;
        let size = u32_at(size_at);
        let content_at = (size_at + 4).next_multiple_of(4);
        blocks.push((name, data[content_at..content_at + size].to_vec()));
        at = content_at + size + 1;
    }
    (data[..head_len].to_vec(), blocks)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let fixture = std::fs::read(args.get(1).expect("usage: FIXTURE [MB] [CHUNK]")).unwrap();
    let target_mb: usize = args.get(2).map_or(256, |s| s.parse().unwrap());
    let chunk: usize = args.get(3).map_or(65536, |s| s.parse().unwrap());
    let modes: &[Mode] = match args.get(4).map_or("both", String::as_str) {
        "parse" => &[Mode::Parse],
        "decode" => &[Mode::Decode],
        "json" => &[Mode::Json],
        "otlp" => &[Mode::Otlp],
        "counters" => &[Mode::Counters],
        _ => &[Mode::Parse, Mode::Json],
    };

    let (head, blocks) = blocks(&fixture);
    let mut stream = head;
    let replayed: Vec<_> =
        blocks.iter().filter(|(n, _)| n == b"EventBlock" || n == b"SPBlock").collect();
    for (name, content) in blocks.iter().filter(|(n, _)| n == b"MetadataBlock") {
        push_block(&mut stream, name, content);
    }
    while stream.len() < target_mb << 20 {
        for (name, content) in &replayed {
            push_block(&mut stream, name, content);
        }
    }
    stream.push(1);
    let mb = stream.len() as f64 / (1 << 20) as f64;

    let clock = Clock::new();
    // A process of a systemd service: the cgroup is known, no container or pod.
    let labels = Some(Arc::new(ProcessLabels {
        cgroup: Some("/system.slice/dotnet-app.service".into()),
        ..ProcessLabels::default()
    }));
    for &mode in modes {
        let mut parser = NettraceParser::default();
        let mut events = 0u64;
        let mut json_bytes = 0usize;
        let start = Instant::now();
        // As tracer/src/session/streaming.rs renders each read's events and the pipeline
        // writes them (here to nowhere).
        let mut sink = JsonLines::writer(std::io::sink());
        // Counter samples only as with --metrics-addr.
        let extras = LineExtras {
            otlp_records: mode == Mode::Otlp,
            counter_samples: mode == Mode::Counters,
        };
        let runtime_counters = RuntimeCounters::default();
        let mut lines = EventLines::new(extras);
        let mut emit = |lines: &mut EventLines, json_bytes: &mut usize| {
            *json_bytes += lines.lines.len_bytes();
            let batch = lines.take();
            sink.emit_batch(&batch.lines);
            let samples = batch.counters.into_iter().map(|c| (c.process, c.sample));
            runtime_counters.record_all(samples, |_| labels.clone());
        };
        for piece in stream.chunks(chunk) {
            parser
                .feed(piece, |e| {
                    events += 1;
                    match mode {
                        Mode::Parse => {}
                        Mode::Decode => drop(std::hint::black_box(e.decode())),
                        Mode::Json | Mode::Otlp | Mode::Counters => {
                            let process = Incarnation::new(4242, Some(1_230_000_000));
                            lines.push_if(
                                &clock,
                                Source::Nettrace,
                                EventOrigin { process, session_id: 0x7f00_0000_1100 },
                                labels.as_ref(),
                                e.output(),
                                |_| true,
                            );
                            if lines.lines.len_bytes() >= EVENT_LINES_BATCH_BYTES {
                                emit(&mut lines, &mut json_bytes);
                            }
                        }
                    }
                })
                .unwrap();
            if !lines.lines.is_empty() {
                emit(&mut lines, &mut json_bytes);
            }
        }
        parser.finish().unwrap();
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{}: {mb:.0} MB in {secs:.3} s = {:.0} MB/s, {events} events = {:.1} M events/s{}",
            match mode {
                Mode::Parse => "parse (events delivered)",
                Mode::Decode => "parse + decode payloads into trees",
                Mode::Json => "parse + decode + dotnet_event lines",
                Mode::Otlp => "parse + decode + lines + OTLP records encoded with them",
                Mode::Counters => "parse + decode + lines + counter samples kept",
            },
            mb / secs,
            events as f64 / secs / 1e6,
            if mode != Mode::Parse && mode != Mode::Decode {
                format!(", {} MB of JSON", json_bytes >> 20)
            } else {
                String::new()
            },
        );
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Parse,
    Decode,
    Json,
    Otlp,
    Counters,
}
