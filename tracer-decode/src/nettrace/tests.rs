use super::*;
use crate::json::WriteJson;
use crate::nettrace::methods::MethodTable;
use crate::nettrace::stacks::{NamedStack, StackBlockError, StackFrame};

/// The event as the JSON object tracer writes.
fn event_json(event: &OutputEvent) -> String {
    let mut out = Vec::new();
    event.write_json(&mut out);
    String::from_utf8(out).unwrap()
}

/// Fields as the JSON object tracer writes.
fn fields_json(fields: &Fields) -> String {
    let mut out = Vec::new();
    fields.write_json(&mut out);
    String::from_utf8(out).unwrap()
}

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/../tests/fixtures/nettrace/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

/// Every event as its JSON line after header facts (offset, capture thread, stack id, the
/// stack's addresses), so two runs can be compared exactly.
fn parse_chunked(
    data: &[u8],
    mut chunk: impl FnMut(usize) -> usize,
) -> (Vec<String>, NettraceParser) {
    let mut parser = NettraceParser::default();
    let mut lines = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < data.len() {
        let n = chunk(i).clamp(1, data.len() - at);
        parser
            .feed(&data[at..at + n], |e| {
                let json = event_json(&e.output());
                let stack = e.stack.map_or("-".to_owned(), |ips| {
                    format!(
                        "[{}]",
                        ips.iter().map(|ip| format!("{ip:x}")).collect::<Vec<_>>().join(",")
                    )
                });
                let (at, thread, id) = (e.offset, e.capture_thread_id, e.stack_id);
                lines.push(format!("{at} {thread} {id} {stack} {json}"));
            })
            .unwrap();
        at += n;
        i += 1;
    }
    (lines, parser)
}

fn parse_all(data: &[u8]) -> (Vec<String>, NettraceParser) {
    parse_chunked(data, |_| usize::MAX)
}

#[test]
fn gc_fixture_has_exactly_five_induced_gc_starts() {
    let data = fixture("coreclr8_gc_induced5.nettrace");
    let mut parser = NettraceParser::default();
    let mut starts = Vec::new();
    parser
        .feed(&data, |e| {
            if e.metadata.provider == runtime_events::RUNTIME_PROVIDER && e.metadata.event_id == 1 {
                let fields = decode_payload(e.metadata, e.payload, e.pointer_size).unwrap();
                let reason = match fields.get("Reason") {
                    Some(&Value::Enum { value, name }) => (value, name),
                    other => panic!("Reason {other:?}"),
                };
                let count = fields.get("Count").unwrap().as_u64().unwrap();
                starts.push((e.thread_id, count, reason, e.metadata.display_name().into_owned()));
            }
        })
        .unwrap();
    parser.finish().unwrap();
    let trace = parser.trace().unwrap();
    assert_eq!(trace.process_id, 12898, "the host pid the capture script printed");
    assert_eq!(trace.pointer_size, 8);
    assert_eq!(trace.qpc_frequency, 1_000_000_000);
    assert_eq!(starts.len(), 5, "{starts:?}");
    for (i, (thread, count, reason, name)) in starts.iter().enumerate() {
        // GC.Collect() runs on the host's main thread, whose tid is the process id.
        assert_eq!(*thread, u64::from(trace.process_id));
        assert_eq!(*count, i as u64 + 1);
        assert_eq!(*reason, (1, "Induced"));
        assert_eq!(name, "GCStart");
    }
    let stats = parser.stats();
    assert_eq!(stats.lost_events, 0);
    assert!(parser.lost_by_thread().is_empty());
    assert_eq!(stats.bytes, data.len() as u64);
    assert!(parser.is_complete());
}

#[test]
fn gc_fixture_json_shape() {
    let (lines, _) = parse_all(&fixture("coreclr8_gc_induced5.nettrace"));
    let start = lines.iter().find(|l| l.contains("\"GCStart\"")).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(start.splitn(5, ' ').nth(4).unwrap()).unwrap();
    assert_eq!(json["provider"], "Microsoft-Windows-DotNETRuntime");
    assert_eq!(json["event"], "GCStart");
    assert_eq!(json["id"], 1);
    assert_eq!(json["version"], 2);
    assert_eq!(json["level"], 4);
    assert_eq!(json["keywords"], "0x1");
    assert_eq!(json["fields"]["Reason"], "Induced");
    assert_eq!(json["fields"]["Type"], "NonConcurrentGC");
    assert_eq!(json["fields"]["Count"], 1);
    assert_eq!(json["fields"]["Depth"], 2);
}

#[test]
fn verbose_fixture_decodes_exceptions_allocation_ticks_and_eventsource_fields() {
    let (lines, parser) = parse_all(&fixture("coreclr8_verbose.nettrace"));
    parser.finish().unwrap();
    assert_eq!(parser.stats().lost_events, 0);
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l.splitn(5, ' ').nth(4).unwrap()).unwrap())
        .collect();
    assert!(events.iter().all(|e| e.get("decode_error").is_none()));

    let thrown: Vec<_> = events.iter().filter(|e| e["event"] == "ExceptionThrown").collect();
    let first = &thrown[0]["fields"];
    assert_eq!(first["ExceptionType"], "System.FormatException");
    assert_eq!(
        first["ExceptionMessage"],
        "The input string 'not a number' was not in a correct format."
    );
    assert_eq!(first["ExceptionHRESULT"], 0x8013_1537u32); // COR_E_FORMAT

    let ticks: Vec<_> = events.iter().filter(|e| e["event"] == "GCAllocationTick").collect();
    assert_eq!(ticks.len(), 23, "the GCAllocationTick events of the capture");
    assert!(ticks.iter().all(|t| t["version"] == 4 && t["fields"]["ObjectSize"].is_u64()));
    // byte[100000] is above the 85000-byte threshold: large object heap.
    let mut large = ticks.iter().filter(|t| t["fields"]["TypeName"] == "System.Byte[]");
    assert_eq!(large.clone().count(), 11, "byte[100000] ticks");
    assert!(large.all(|t| t["fields"]["AllocationKind"] == "Large"));

    let rented: Vec<_> = events.iter().filter(|e| e["event"] == "BufferRented").collect();
    assert_eq!(rented.len(), 63, "the BufferRented events of the capture");
    // Field order is the metadata's (serde_json::Value would sort keys: check the line).
    let line = lines.iter().find(|l| l.contains("\"BufferRented\"")).unwrap();
    assert!(
        line.contains(
            r#""fields":{"bufferId":44115416,"bufferSize":128,"poolId":61494432,"bucketId":3}"#
        ),
        "{line}"
    );
    assert_eq!(rented[0]["provider"], "System.Buffers.ArrayPoolEventSource");

    let info = events.iter().find(|e| e["event"] == "ProcessInfo").unwrap();
    assert_eq!(info["fields"]["OSInformation"], "Linux");
}

#[test]
fn any_chunking_gives_identical_results() {
    for (name, events) in [
        ("coreclr8_gc_induced5.nettrace", 98),
        ("coreclr8_verbose.nettrace", 694),
        ("coreclr8_threadpool.nettrace", 38),
        ("coreclr8_counters.nettrace", 56),
        ("coreclr8_thread_samples.nettrace", 1184),
    ] {
        let data = fixture(name);
        let (whole, whole_parser) = parse_all(&data);
        let (bytewise, byte_parser) = parse_chunked(&data, |_| 1);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let (random, random_parser) = parse_chunked(&data, |_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 300) as usize + 1
        });
        assert_eq!(whole.len(), events, "{name}");
        assert_eq!(whole, bytewise, "{name}");
        assert_eq!(whole, random, "{name}");
        assert_eq!(whole_parser.stats(), byte_parser.stats());
        assert_eq!(whole_parser.stats(), random_parser.stats());
        byte_parser.finish().unwrap();
    }
}

#[test]
fn truncated_real_stream_is_reported() {
    let data = fixture("coreclr8_gc_induced5.nettrace");
    let (_, parser) = parse_all(&data[..data.len() - 1]);
    assert_eq!(
        parser.finish(),
        Err(NettraceError::Truncated { offset: data.len() as u64 - 1, pending: 0 })
    );
    // Cut inside the first MetadataBlock (starts at 102): the partial object is reported.
    let (_, parser) = parse_all(&data[..200]);
    assert_eq!(parser.finish(), Err(NettraceError::Truncated { offset: 200, pending: 98 }));
}

// ---- hand-built streams ----

fn utf16z(s: &str) -> Vec<u8> {
    s.encode_utf16().chain([0]).flat_map(u16::to_le_bytes).collect()
}

fn varuint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

const PID: u32 = 4242;

struct Stream(Vec<u8>);

impl Stream {
    fn new() -> Self {
        Stream::with_pointer_size(8)
    }

    fn with_pointer_size(pointer_size: u32) -> Self {
        let mut s = Stream(PROLOGUE.to_vec());
        s.header("Trace", 4);
        for v in [2026u16, 11, 0, 29, 22, 0, 0, 0] {
            s.0.extend(v.to_le_bytes());
        }
        s.0.extend(1000i64.to_le_bytes());
        s.0.extend(1_000_000_000i64.to_le_bytes());
        for v in [pointer_size, PID, 2, 1_000_000] {
            s.0.extend(v.to_le_bytes());
        }
        s.0.push(TAG_END);
        s
    }

    fn header(&mut self, name: &str, version: i32) {
        self.0.extend([TAG_BEGIN_PRIVATE, TAG_BEGIN_PRIVATE, TAG_NULL]);
        self.0.extend(version.to_le_bytes());
        self.0.extend(version.to_le_bytes());
        self.0.extend((name.len() as u32).to_le_bytes());
        self.0.extend(name.as_bytes());
        self.0.push(TAG_END);
    }

    /// Appends a block object; returns the absolute offset of its content.
    fn block(&mut self, name: &str, content: &[u8]) -> usize {
        self.header(name, 2);
        self.0.extend((content.len() as u32).to_le_bytes());
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
        let at = self.0.len();
        self.0.extend(content);
        self.0.push(TAG_END);
        at
    }

    fn end(mut self) -> Vec<u8> {
        self.0.push(TAG_NULL);
        self.0
    }
}

fn blob_block(flags: u16, blobs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = 20u16.to_le_bytes().to_vec();
    out.extend(flags.to_le_bytes());
    out.extend([0; 16]);
    for b in blobs {
        out.extend(b);
    }
    out
}

/// A metadata payload: id, provider, event id, name, keywords, version, level, then `rest`
/// (field count + fields + tags).
fn metadata_payload(id: u32, provider: &str, event_id: u32, name: &str, rest: &[u8]) -> Vec<u8> {
    let mut out = id.to_le_bytes().to_vec();
    out.extend(utf16z(provider));
    out.extend(event_id.to_le_bytes());
    out.extend(utf16z(name));
    out.extend(0x30u64.to_le_bytes());
    out.extend(1u32.to_le_bytes());
    out.extend(4u32.to_le_bytes());
    out.extend(rest);
    out
}

/// A compressed metadata blob (metadata id 0, only the payload size flagged).
fn metadata_blob(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80, 0];
    out.extend(varuint(payload.len() as u64));
    out.extend(payload);
    out
}

/// One metadata entry: `Demo` event 7 with a single Int32 field `value`.
fn demo_metadata(id: u32) -> Vec<u8> {
    let mut fields = 1u32.to_le_bytes().to_vec();
    fields.extend(9u32.to_le_bytes());
    fields.extend(utf16z("value"));
    blob_block(1, &[metadata_blob(&metadata_payload(id, "Demo", 7, "Tick", &fields))])
}

/// A compressed event: metadata id 1, thread 100/capture 100, sequence `seq` given as a delta
/// from `prev_seq`, payload = i32 value.
fn demo_event(prev_seq: u32, seq: u32, capture_thread: u64, value: i32) -> Vec<u8> {
    let mut out = vec![0x01 | 0x02 | 0x04 | 0x80];
    out.extend(varuint(1));
    out.extend(varuint(u64::from(seq - prev_seq - 1)));
    out.extend(varuint(capture_thread));
    out.extend(varuint(0));
    out.extend(varuint(capture_thread));
    out.extend(varuint(10));
    out.extend(varuint(4));
    out.extend(value.to_le_bytes());
    out
}

/// (sequence, capture thread, timestamp, payload) of one event.
type Seen = (u32, u64, i64, Vec<u8>);

fn collect(data: &[u8]) -> (Result<(), NettraceError>, Vec<Seen>, NettraceParser) {
    let mut parser = NettraceParser::default();
    let mut events = Vec::new();
    let result = parser.feed(data, |e| {
        events.push((e.sequence, e.capture_thread_id, e.timestamp, e.payload.to_vec()))
    });
    (result.and_then(|()| parser.finish()), events, parser)
}

#[test]
fn trace_object_and_first_block_offsets_match_the_reference() {
    let mut s = Stream::new();
    assert_eq!(s.0.len(), 102, "Trace object spans 32..102");
    let content_at = s.block("MetadataBlock", &demo_metadata(1));
    assert_eq!(content_at, 136, "size at 131..135, one padding byte");
    let (result, _, parser) = collect(&s.end());
    result.unwrap();
    assert_eq!(parser.trace().unwrap().process_id, PID);
    assert_eq!(parser.stats().metadata, 1);
}

#[test]
fn padding_follows_the_absolute_stream_offset() {
    // Event blocks with 0–3 reserved header bytes shift the next block through all four
    // alignments.
    for extra in 0..4u16 {
        let mut s = Stream::new();
        s.block("MetadataBlock", &demo_metadata(1));
        let mut empty = (20 + extra).to_le_bytes().to_vec();
        empty.extend(1u16.to_le_bytes());
        empty.extend(vec![0; 16 + usize::from(extra)]);
        s.block("EventBlock", &empty);
        let content_at = s.block("EventBlock", &blob_block(1, &[demo_event(0, 1, 100, 5)]));
        assert!(content_at.is_multiple_of(4));
        let (result, events, _) = collect(&s.end());
        result.unwrap();
        assert_eq!(events.len(), 1, "extra {extra}");
        assert_eq!(events[0].3, 5i32.to_le_bytes());
    }
}

/// A StackBlock's content: its first id, the count, then each stack as its size and its
/// addresses of `pointer_size` bytes.
fn stack_block(first_id: u32, stacks: &[&[u64]], pointer_size: usize) -> Vec<u8> {
    let mut out = first_id.to_le_bytes().to_vec();
    out.extend((stacks.len() as u32).to_le_bytes());
    for stack in stacks {
        out.extend(((stack.len() * pointer_size) as u32).to_le_bytes());
        for ip in *stack {
            out.extend(&ip.to_le_bytes()[..pointer_size]);
        }
    }
    out
}

/// A compressed event naming stack `stack_id` (metadata 1, thread 100, payload an i32).
fn event_with_stack(first: bool, stack_id: u32, value: i32) -> Vec<u8> {
    let mut out = vec![0x08 | if first { 0x01 | 0x02 | 0x04 | 0x80 } else { 0 }];
    if first {
        out.extend(varuint(1));
        out.extend(varuint(0));
        out.extend(varuint(100));
        out.extend(varuint(0));
        out.extend(varuint(100));
    }
    out.extend(varuint(u64::from(stack_id)));
    out.extend(varuint(10));
    if first {
        out.extend(varuint(4));
    }
    out.extend(value.to_le_bytes());
    out
}

/// An event's stack id and the addresses the parser hands with it.
type EventStack = (u32, Option<Vec<u64>>);

/// The stack of every event of `data`, and how the stream ended.
fn event_stacks(data: &[u8]) -> (Result<(), NettraceError>, Vec<EventStack>) {
    let mut parser = NettraceParser::default();
    let mut stacks = Vec::new();
    let result = parser.feed(data, |e| stacks.push((e.stack_id, e.stack.map(<[u64]>::to_vec))));
    (result.and_then(|()| parser.finish()), stacks)
}

#[test]
fn events_carry_the_addresses_of_the_stack_they_name() {
    let leaf_first: &[u64] = &[0x7f00_0000_1010, 0x7f00_0000_2020, 0x7f00_0000_3030];
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    // Ids 5 and 6; then 6 again, redefined: an event names the latest definition.
    s.block("StackBlock", &stack_block(5, &[leaf_first, &[]], 8));
    let events = [
        event_with_stack(true, 5, 1),
        event_with_stack(false, 6, 2),
        event_with_stack(false, 0, 3),
        event_with_stack(false, 7, 4),
    ];
    s.block("EventBlock", &blob_block(1, &events));
    s.block("StackBlock", &stack_block(6, &[&[0xAA]], 8));
    s.block("EventBlock", &blob_block(1, &[event_with_stack(true, 6, 5)]));
    let (result, stacks) = event_stacks(&s.end());
    result.unwrap();
    assert_eq!(
        stacks,
        [
            (5, Some(leaf_first.to_vec())),
            (6, Some(vec![])),
            (0, None),
            (7, None),
            (6, Some(vec![0xAA])),
        ]
    );
}

#[test]
fn a_32_bit_stream_has_4_byte_addresses() {
    let mut s = Stream::with_pointer_size(4);
    s.block("MetadataBlock", &demo_metadata(1));
    s.block("StackBlock", &stack_block(1, &[&[0x0804_8000, 0xf7e0_1234]], 4));
    s.block("EventBlock", &blob_block(1, &[event_with_stack(true, 1, 1)]));
    let (result, stacks) = event_stacks(&s.end());
    result.unwrap();
    assert_eq!(stacks, [(1, Some(vec![0x0804_8000, 0xf7e0_1234]))]);
}

#[test]
fn stack_ids_are_forgotten_at_a_sequence_point() {
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    s.block("StackBlock", &stack_block(1, &[&[0x10]], 8));
    s.block("EventBlock", &blob_block(1, &[event_with_stack(true, 1, 1)]));
    let mut sp = 0i64.to_le_bytes().to_vec();
    sp.extend(0u32.to_le_bytes());
    s.block("SPBlock", &sp);
    s.block("EventBlock", &blob_block(1, &[event_with_stack(true, 1, 2)]));
    s.block("StackBlock", &stack_block(1, &[&[0x20]], 8));
    s.block("EventBlock", &blob_block(1, &[event_with_stack(true, 1, 3)]));
    let (result, stacks) = event_stacks(&s.end());
    result.unwrap();
    assert_eq!(stacks, [(1, Some(vec![0x10])), (1, None), (1, Some(vec![0x20]))]);
}

#[test]
fn malformed_stack_blocks_are_refused_with_their_offsets() {
    let bad = |content: &[u8]| {
        let mut s = Stream::new();
        let at = s.block("StackBlock", content) as u64;
        let (result, _) = event_stacks(&s.end());
        (at, result.unwrap_err())
    };
    let (at, e) = bad(&[1, 0, 0, 0, 1, 0]);
    let problem = StackBlockError::TruncatedHeader { len: 6 };
    assert_eq!(e, NettraceError::BadStackBlock { offset: at, problem });
    // Two stacks announced, one there: the second's size is cut by the block's end.
    let mut content = stack_block(1, &[&[0x10]], 8);
    content[4] = 2;
    content.extend([8, 0]);
    let (at, e) = bad(&content);
    let problem = StackBlockError::TruncatedSize { index: 1, count: 2 };
    assert_eq!(e, NettraceError::BadStackBlock { offset: at + 20, problem });
    // A size past the block.
    let mut content = stack_block(1, &[&[0x10]], 8);
    content[8] = 16;
    let (at, e) = bad(&content);
    let problem = StackBlockError::Overrun { index: 0, count: 1, size: 16, left: 8 };
    assert_eq!(e, NettraceError::BadStackBlock { offset: at + 8, problem });
    // 12 bytes of 8-byte addresses.
    let mut content = stack_block(1, &[&[0x10]], 8);
    content[8] = 12;
    content.extend([0; 4]);
    let (at, e) = bad(&content);
    let problem = StackBlockError::Ragged { index: 0, count: 1, size: 12, pointer_size: 8 };
    assert_eq!(e, NettraceError::BadStackBlock { offset: at + 8, problem });
    // Bytes after the last stack.
    let mut content = stack_block(1, &[&[0x10]], 8);
    content.extend([0xEE; 3]);
    let (at, e) = bad(&content);
    let problem = StackBlockError::TrailingBytes { left: 3 };
    assert_eq!(e, NettraceError::BadStackBlock { offset: at + 20, problem });
    assert_eq!(
        e.to_string(),
        format!("offset {}: StackBlock: 3 bytes after its last stack", at + 20)
    );
}

#[test]
fn stacks_past_the_bounds_are_refused_and_counted() {
    use super::stacks::{MAX_STACK_FRAMES, MAX_STACK_TABLE_FRAMES, MAX_STACKS};
    let deep = vec![0x10u64; MAX_STACK_FRAMES + 1];
    let longest = vec![0x20u64; MAX_STACK_FRAMES];
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    s.block("StackBlock", &stack_block(1, &[&deep, &longest], 8));
    let both = [event_with_stack(true, 1, 1), event_with_stack(false, 2, 2)];
    s.block("EventBlock", &blob_block(1, &both));
    // Stack 2 redefined too deep: its events name no stack, not the earlier definition.
    s.block("StackBlock", &stack_block(2, &[&deep], 8));
    s.block("EventBlock", &blob_block(1, &[event_with_stack(true, 2, 3)]));
    let data = s.end();
    let (result, stacks) = event_stacks(&data);
    result.unwrap();
    assert_eq!(stacks, [(1, None), (2, Some(longest.clone())), (2, None)]);
    let (_, parser) = parse_all(&data);
    assert_eq!((parser.stats().stacks, parser.stats().stacks_refused), (3, 2));

    // The table's frames: full at MAX_STACK_TABLE_FRAMES; and its ids at MAX_STACKS.
    let mut s = Stream::new();
    let per_block = (16 << 20) / (8 * MAX_STACK_FRAMES + 4) - 1;
    let (mut id, mut frames) = (1u32, 0);
    while frames < MAX_STACK_TABLE_FRAMES {
        let n = per_block.min((MAX_STACK_TABLE_FRAMES - frames) / MAX_STACK_FRAMES);
        s.block("StackBlock", &stack_block(id, &vec![&longest[..]; n], 8));
        (id, frames) = (id + n as u32, frames + n * MAX_STACK_FRAMES);
    }
    s.block("StackBlock", &stack_block(id, &[&[0x30], &[]], 8));
    let empties = vec![&[][..]; MAX_STACKS + 1];
    s.block("StackBlock", &stack_block(id + 2, &empties, 8));
    let (_, parser) = parse_all(&s.end());
    let defined = u64::from(id - 1) + 2 + MAX_STACKS as u64 + 1;
    let kept = MAX_STACKS as u64;
    assert_eq!(parser.stats().stacks, defined);
    // The stack with a frame does not fit; each empty one does, up to MAX_STACKS ids.
    assert_eq!(parser.stats().stacks_refused, defined - kept);
}

#[test]
fn every_compressed_header_flag() {
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    let activity: [u8; 16] = core::array::from_fn(|i| i as u8 + 1);
    let related: [u8; 16] = core::array::from_fn(|i| 0xF0 - i as u8);
    let mut first = vec![0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20 | 0x40 | 0x80];
    first.extend(varuint(1)); // metadata id
    first.extend(varuint(4)); // sequence delta → 0 + 4 + 1 = 5
    first.extend(varuint(300)); // capture thread
    first.extend(varuint(1)); // proc
    first.extend(varuint(301)); // thread
    first.extend(varuint(9)); // stack
    first.extend(varuint(1 << 40)); // timestamp delta
    first.extend(activity);
    first.extend(related);
    first.extend(varuint(4));
    first.extend(7i32.to_le_bytes());
    // No flags: everything carries over, sequence + 1, timestamp + delta, same payload size.
    let mut second = vec![0x00];
    second.extend(varuint(3));
    second.extend(8i32.to_le_bytes());
    s.block("EventBlock", &blob_block(1, &[first, second]));

    let mut seen = Vec::new();
    let mut parser = NettraceParser::default();
    parser
        .feed(&s.end(), |e| {
            seen.push((
                e.sequence,
                e.capture_thread_id,
                e.thread_id,
                e.proc_num,
                e.stack_id,
                e.timestamp,
                e.activity_id,
                e.related_activity_id,
                e.is_sorted,
                e.payload.to_vec(),
            ))
        })
        .unwrap();
    parser.finish().unwrap();
    let t = 1i64 << 40;
    assert_eq!(
        seen,
        [
            (5, 300, 301, 1, 9, t, activity, related, true, 7i32.to_le_bytes().to_vec()),
            (6, 300, 301, 1, 9, t + 3, activity, related, false, 8i32.to_le_bytes().to_vec()),
        ]
    );
    // Sequence 5 as the first number on a thread means 4 events were dropped before it.
    assert_eq!(parser.lost_by_thread(), [(300, 4)]);
}

#[test]
fn header_state_resets_at_each_block() {
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    s.block("EventBlock", &blob_block(1, &[demo_event(0, 1, 100, 1)]));
    // The next block starts from zero again: delta 1 from 0 means sequence 2.
    s.block("EventBlock", &blob_block(1, &[demo_event(0, 2, 100, 2)]));
    let (result, events, parser) = collect(&s.end());
    result.unwrap();
    assert_eq!(events.iter().map(|e| (e.0, e.2)).collect::<Vec<_>>(), [(1, 10), (2, 10)]);
    assert_eq!(parser.stats().lost_events, 0);
}

#[test]
fn uncompressed_event_headers() {
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    let mut blob = Vec::new();
    let mut body = (1u32 | 0x8000_0000).to_le_bytes().to_vec(); // not sorted
    body.extend(1u32.to_le_bytes()); // sequence
    body.extend(55u64.to_le_bytes()); // thread
    body.extend(56u64.to_le_bytes()); // capture thread
    body.extend(3u32.to_le_bytes()); // proc
    body.extend(0u32.to_le_bytes()); // stack
    body.extend(777i64.to_le_bytes());
    body.extend([0u8; 32]);
    body.extend(2u32.to_le_bytes());
    body.extend([0xAB, 0xCD, 0, 0]); // payload + padding to 4
    blob.extend((body.len() as u32).to_le_bytes());
    blob.extend(body);
    s.block("EventBlock", &blob_block(0, &[blob]));
    let mut seen = Vec::new();
    let mut parser = NettraceParser::default();
    parser
        .feed(&s.end(), |e| {
            seen.push((
                e.sequence,
                e.thread_id,
                e.capture_thread_id,
                e.timestamp,
                e.is_sorted,
                e.payload.to_vec(),
            ))
        })
        .unwrap();
    parser.finish().unwrap();
    assert_eq!(seen, [(1, 55, 56, 777, false, vec![0xAB, 0xCD])]);
}

#[test]
fn sequence_gaps_and_sequence_points_count_losses_per_thread() {
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    let events = [
        demo_event(0, 1, 7, 0),
        demo_event(1, 2, 7, 0),
        demo_event(2, 5, 7, 0), // 3 and 4 dropped
    ];
    s.block("EventBlock", &blob_block(1, &events));
    let mut sp = 0i64.to_le_bytes().to_vec();
    sp.extend(2u32.to_le_bytes());
    sp.extend(7u64.to_le_bytes());
    sp.extend(8u32.to_le_bytes()); // 6, 7, 8 dropped
    sp.extend(9u64.to_le_bytes());
    sp.extend(4u32.to_le_bytes()); // a thread never seen: 4 dropped
    s.block("SPBlock", &sp);
    s.block("EventBlock", &blob_block(1, &[demo_event(0, 9, 7, 0)])); // continues: no loss
    let (result, events, parser) = collect(&s.end());
    result.unwrap();
    assert_eq!(events.len(), 4);
    assert_eq!(parser.stats().lost_events, 9);
    assert_eq!(parser.stats().sequence_points, 1);
    assert_eq!(parser.lost_by_thread(), [(7, 5), (9, 4)]);
}

#[test]
fn block_larger_than_the_limit_is_rejected_with_its_offset() {
    let mut s = Stream::new();
    s.block("MetadataBlock", &[0; 24]);
    let mut data = s.end();
    data[131..135].copy_from_slice(&(17u32 << 20).to_le_bytes());
    let (result, _, _) = collect(&data);
    assert_eq!(
        result,
        Err(NettraceError::BlockTooLarge { offset: 131, size: 17 << 20, max: 16 << 20 })
    );
}

#[test]
fn payload_size_beyond_its_block_is_corrupt() {
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    let mut event = demo_event(0, 1, 100, 1);
    let size_at = event.len() - 5;
    event[size_at] = 40; // payload size 40, only 4 bytes present
    let content_at = s.block("EventBlock", &blob_block(1, &[event]));
    let (result, events, _) = collect(&s.end());
    assert!(events.is_empty());
    assert_eq!(
        result,
        Err(NettraceError::Corrupt {
            offset: content_at as u64 + 20,
            what: "event header or payload exceeds its block"
        })
    );
}

#[test]
fn framing_errors_are_typed() {
    let (result, _, _) = collect(b"Nettrace\x14\x00\x00\x00!FastSerializatioX.1");
    assert_eq!(result, Err(NettraceError::BadPrologue { offset: 29 }));

    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    let mut data = s.end();
    let last_block_end = data.len() - 2;
    data[last_block_end] = 0x07;
    let (result, _, _) = collect(&data);
    assert_eq!(result, Err(NettraceError::BadTag { offset: last_block_end as u64, tag: 7 }));

    let mut s = Stream::new();
    s.block("Surprise", &[]);
    let (result, _, _) = collect(&s.end());
    assert_eq!(result, Err(NettraceError::UnknownObject { offset: 102, name: "Surprise".into() }));

    let mut s = Stream::new();
    let content_at = s.block("EventBlock", &blob_block(1, &[demo_event(0, 1, 100, 1)]));
    let (result, _, _) = collect(&s.end());
    assert_eq!(
        result,
        Err(NettraceError::UnknownMetadata { offset: content_at as u64 + 20, id: 1 })
    );

    let mut data = Stream::new().end();
    data.push(0);
    let (result, _, mut parser) = collect(&data);
    assert_eq!(result, Err(NettraceError::TrailingData { offset: 103 }));
    // A poisoned parser keeps reporting the first error.
    assert_eq!(parser.feed(&[1], |_| {}), Err(NettraceError::TrailingData { offset: 103 }));
}

#[test]
fn metadata_with_nested_objects_v2_arrays_and_opcode() {
    // V1: Object { a: UInt16, s: String }, then a Boolean.
    let mut v1 = 2u32.to_le_bytes().to_vec();
    v1.extend(1u32.to_le_bytes());
    v1.extend(2u32.to_le_bytes());
    v1.extend(8u32.to_le_bytes());
    v1.extend(utf16z("a"));
    v1.extend(18u32.to_le_bytes());
    v1.extend(utf16z("s"));
    v1.extend(utf16z("inner"));
    v1.extend(3u32.to_le_bytes());
    v1.extend(utf16z("flag"));
    v1.extend(1u32.to_le_bytes()); // opcode tag: 1 byte payload
    v1.push(1);
    v1.push(10);
    let meta = metadata::parse_nettrace_metadata(
        &metadata_payload(3, "P", 1, "E", &v1),
        &MetadataLimits::default(),
    )
    .unwrap();
    assert_eq!(meta.opcode, Some(10));
    let mut payload = 0x1234u16.to_le_bytes().to_vec();
    payload.extend(utf16z("hé"));
    payload.extend(1u32.to_le_bytes());
    payload.extend([0xEE]); // longer payloads are tolerated
    let fields = decode_payload(&meta, &payload, 8).unwrap();
    assert_eq!(fields_json(&fields), r#"{"inner":{"a":4660,"s":"hé"},"flag":true}"#);

    // V2Params tag: an array of UInt32 and a Guid; the V1 list is empty.
    let def = |name: &str, types: &[u32]| {
        let mut body = utf16z(name);
        for t in types {
            body.extend(t.to_le_bytes());
        }
        let mut out = ((body.len() + 4) as u32).to_le_bytes().to_vec();
        out.extend(body);
        out
    };
    let mut tag = 2u32.to_le_bytes().to_vec();
    tag.extend(def("ids", &[19, 10]));
    tag.extend(def("g", &[17]));
    let mut v2 = 0u32.to_le_bytes().to_vec();
    v2.extend((tag.len() as u32).to_le_bytes());
    v2.push(2);
    v2.extend(tag);
    let meta = metadata::parse_nettrace_metadata(
        &metadata_payload(4, "P", 2, "E2", &v2),
        &MetadataLimits::default(),
    )
    .unwrap();
    let mut payload = 2u16.to_le_bytes().to_vec();
    payload.extend(5u32.to_le_bytes());
    payload.extend(6u32.to_le_bytes());
    payload.extend([0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 8, 9, 10, 11, 12, 13, 14, 15]);
    let fields = decode_payload(&meta, &payload, 8).unwrap();
    assert_eq!(fields_json(&fields), r#"{"ids":[5,6],"g":"00112233-4455-6677-0809-0a0b0c0d0e0f"}"#);
    let short = decode_payload(&meta, &payload[..5], 8).unwrap_err();
    assert_eq!(
        (short.field.as_str(), short.at, short.problem),
        ("ids", 2, payload::PayloadProblem::Short)
    );
}

#[test]
fn metadata_limits_are_enforced() {
    let limits = MetadataLimits { max_fields: 2, max_depth: 2, max_name_units: 8 };
    let mut three = 3u32.to_le_bytes().to_vec();
    for _ in 0..3 {
        three.extend(9u32.to_le_bytes());
        three.extend(utf16z("f"));
    }
    let meta =
        metadata::parse_nettrace_metadata(&metadata_payload(1, "P", 1, "E", &three), &limits)
            .unwrap();
    assert!(matches!(meta.field_error, Some(MetadataError::TooManyFields { max: 2, .. })));
    assert!(meta.fields.is_empty());
    let err = metadata::parse_nettrace_metadata(
        &metadata_payload(1, "ProviderNameTooLong", 1, "E", &0u32.to_le_bytes()),
        &limits,
    );
    assert_eq!(err, Err(MetadataError::StringTooLong { at: 4, what: "provider name", max: 8 }));
    let mut unterminated = 1u32.to_le_bytes().to_vec();
    unterminated.extend([b'P', 0]);
    assert_eq!(
        metadata::parse_nettrace_metadata(&unterminated, &MetadataLimits::default()),
        Err(MetadataError::UnterminatedString { at: 4, what: "provider name" })
    );
}

#[test]
fn runtime_layouts_reject_short_payloads_and_keep_the_rest_of_long_ones() {
    let mut meta = EventMetadata::native(runtime_events::RUNTIME_PROVIDER, 1);
    meta.version = Some(2);
    let mut payload = [1u32, 2, 1, 0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>();
    payload.extend(0u16.to_le_bytes());
    let err = decode_payload(&meta, &payload, 8).unwrap_err();
    assert_eq!(
        (err.field.as_str(), err.at, err.problem),
        ("ClientSequenceNumber", 18, payload::PayloadProblem::Short)
    );
    payload.extend(9u64.to_le_bytes());
    payload.extend([0xFF; 6]);
    // A newer runtime's fields beyond the table's template are kept, not dropped.
    let fields = decode_payload(&meta, &payload, 8).unwrap();
    assert_eq!(fields.get("ClientSequenceNumber"), Some(&Value::U64(9)));
    assert_eq!(fields.get("Reason"), Some(&Value::Enum { value: 1, name: "Induced" }));
    assert_eq!(fields.get("raw_tail"), Some(&Value::Bytes(vec![0xFF; 6])));

    // Without a version (user_events), the newest template the payload fills exactly is used,
    // else the newest that decodes, its extra bytes kept.
    let stats = EventMetadata::native(runtime_events::RUNTIME_PROVIDER, 4);
    assert_eq!(stats.event_name, "GCHeapStats");
    let names = |len| -> Vec<&str> {
        decode_payload(&stats, &vec![0; len], 8).unwrap().0.iter().map(|(n, _)| *n).collect()
    };
    assert_eq!(names(92).len(), 13, "V0: {:?}", names(92));
    assert_eq!(names(94).last(), Some(&"ClrInstanceID"));
    assert_eq!(names(110)[14..], ["GenerationSize4", "TotalPromotedSize4"]);
    assert_eq!(names(95)[14..], ["raw_tail"], "V1 and one byte more");
    assert!(decode_payload(&stats, &[0; 91], 8).is_err(), "shorter than every version");
}

#[test]
fn threadpool_fixture_adjustment_events_match_their_templates_exactly() {
    let data = fixture("coreclr8_threadpool.nettrace");
    let mut parser = NettraceParser::default();
    let mut seen = Vec::new();
    parser
        .feed(&data, |e| {
            if (54..=56).contains(&e.metadata.event_id) {
                let fields = decode_payload(e.metadata, e.payload, e.pointer_size).unwrap();
                let first = serde_json::to_value(&fields.0[0].1).unwrap();
                seen.push((e.metadata.event_id, e.payload.len(), fields.0.len(), first));
            }
        })
        .unwrap();
    parser.finish().unwrap();
    assert_eq!(parser.trace().unwrap().process_id, 3234, "the host pid the capture script printed");
    // Every payload is exactly its template's size: the layouts account for every byte.
    let sizes = |id| seen.iter().filter(move |s| s.0 == id).map(|s| (s.1, s.2));
    assert_eq!(sizes(54).count(), 3);
    assert_eq!(sizes(55).count(), 2);
    assert_eq!(sizes(56).count(), 3);
    assert!(sizes(54).all(|s| s == (10, 2)), "{seen:?}");
    assert!(sizes(55).all(|s| s == (18, 4)), "{seen:?}");
    assert!(sizes(56).all(|s| s == (76, 11)), "{seen:?}");
    // Throughput values are finite doubles (a wrong offset would give garbage exponents).
    assert!(seen.iter().all(|s| s.3.as_f64().is_some_and(|v| (0.0..1e7).contains(&v))));
}

#[test]
fn unreadable_field_metadata_keeps_the_stream_and_the_event_name() {
    // A V1 field list with an Array type code, which V1 cannot describe.
    let mut fields = 1u32.to_le_bytes().to_vec();
    fields.extend(19u32.to_le_bytes());
    fields.extend(utf16z("items"));
    let meta = metadata_blob(&metadata_payload(1, "Demo", 7, "Tick", &fields));
    let mut s = Stream::new();
    s.block("MetadataBlock", &blob_block(1, &[meta]));
    s.block("EventBlock", &blob_block(1, &[demo_event(0, 1, 100, 5)]));
    let mut decoded = Vec::new();
    let mut parser = NettraceParser::default();
    parser.feed(&s.end(), |e| decoded.push(serde_json::to_value(e.decode()).unwrap())).unwrap();
    parser.finish().unwrap();
    assert_eq!(parser.stats().metadata_field_errors, 1);
    assert_eq!(decoded.len(), 1);
    assert_eq!(decoded[0]["event"], "Tick");
    assert_eq!(decoded[0]["fields"]["raw_payload"], "05000000");
    assert!(decoded[0]["decode_error"].as_str().unwrap().contains("UnusableMetadata"));
}

#[test]
fn at_most_one_object_is_buffered() {
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    let events: Vec<_> = (1..=20_000).map(|i| demo_event(i - 1, i, 100, i as i32)).collect();
    let block_start = s.0.len();
    s.block("EventBlock", &blob_block(1, &events));
    let data = s.end();
    let mut parser = NettraceParser::default();
    let mut count = 0;
    let mut max_buffered = 0;
    for chunk in data.chunks(4096) {
        parser.feed(chunk, |_| count += 1).unwrap();
        max_buffered = max_buffered.max(parser.buffered());
    }
    parser.finish().unwrap();
    assert_eq!(count, 20_000);
    assert_eq!(parser.buffered(), 0);
    // The largest object is the EventBlock: everything from its first byte to its end tag.
    assert!(max_buffered <= data.len() - 1 - block_start, "{max_buffered}");
    assert!(max_buffered > 4096);
}

// ---- work and output bounded by input bytes (tracer-decode/src/budget.rs) ----

/// A V1 field: type code, then (objects) the nested fields, then the name.
fn v1_field(code: u32, nested: Option<&[Vec<u8>]>, name: &str) -> Vec<u8> {
    let mut out = code.to_le_bytes().to_vec();
    if let Some(nested) = nested {
        out.extend((nested.len() as u32).to_le_bytes());
        out.extend(nested.concat());
    }
    out.extend(utf16z(name));
    out
}

fn v1_list(fields: &[Vec<u8>]) -> Vec<u8> {
    let mut out = (fields.len() as u32).to_le_bytes().to_vec();
    out.extend(fields.concat());
    out
}

/// `metadata_payload(1, "P", 1, "E", rest)`: `rest` starts at byte 32.
const REST_AT: usize = 32;

#[test]
fn empty_struct_field_is_refused_with_its_offset() {
    let empty = v1_field(1, Some(&[]), "e");
    let rest = v1_list(&[v1_field(9, None, "n"), empty]);
    let meta = metadata::parse_nettrace_metadata(
        &metadata_payload(1, "P", 1, "E", &rest),
        &MetadataLimits::default(),
    )
    .unwrap();
    // count (4), Int32 "n" (4 + 4), then the object's type code.
    assert_eq!(meta.field_error, Some(MetadataError::EmptyObject { at: REST_AT + 12 }));
    assert!(meta.fields.is_empty());
    // An object holding only an empty object is refused at the inner one.
    let nested = v1_field(1, Some(&[v1_field(1, Some(&[]), "inner")]), "outer");
    let meta = metadata::parse_nettrace_metadata(
        &metadata_payload(1, "P", 1, "E", &v1_list(&[nested])),
        &MetadataLimits::default(),
    )
    .unwrap();
    assert_eq!(meta.field_error, Some(MetadataError::EmptyObject { at: REST_AT + 12 }));
    // A payload for such an event is never decoded into values.
    let err = decode_payload(&meta, &[0xff, 0xff], 8).unwrap_err();
    assert_eq!((err.at, err.problem), (0, payload::PayloadProblem::UnusableMetadata));
}

#[test]
fn array_of_empty_structs_is_refused_with_its_offset_and_yields_no_values() {
    // V2Params: "items": Array of Object with 0 fields (the 65 535-values-from-2-bytes shape).
    let mut body = utf16z("items");
    for t in [19u32, 1, 0] {
        body.extend(t.to_le_bytes());
    }
    let mut tag = 1u32.to_le_bytes().to_vec();
    tag.extend(((body.len() + 4) as u32).to_le_bytes());
    tag.extend(body);
    let mut rest = 0u32.to_le_bytes().to_vec();
    rest.extend((tag.len() as u32).to_le_bytes());
    rest.push(2);
    rest.extend(tag);
    let meta_bytes = metadata_payload(1, "P", 1, "E", &rest);
    let meta = metadata::parse_nettrace_metadata(&meta_bytes, &MetadataLimits::default()).unwrap();
    // V1 count (4), tag size (4), tag kind (1), V2 count (4), field size (4), "items\0" (12),
    // Array code (4): the Object code.
    let at = REST_AT + 4 + 4 + 1 + 4 + 4 + 12 + 4;
    assert_eq!(meta.field_error, Some(MetadataError::EmptyObject { at }));
    assert_eq!(&meta_bytes[at..at + 4], &1u32.to_le_bytes());

    // In a stream: the metadata is counted as unusable, the event keeps its 2 bytes as hex.
    let mut s = Stream::new();
    s.block("MetadataBlock", &blob_block(1, &[metadata_blob(&meta_bytes)]));
    let mut event = vec![0x01 | 0x80];
    event.extend(varuint(1));
    event.extend(varuint(10));
    event.extend(varuint(2));
    event.extend([0xff, 0xff]);
    s.block("EventBlock", &blob_block(1, &[event]));
    let mut parser = NettraceParser::default();
    let mut decoded = Vec::new();
    parser.feed(&s.end(), |e| decoded.push(serde_json::to_value(e.decode()).unwrap())).unwrap();
    parser.finish().unwrap();
    assert_eq!(parser.stats().metadata_field_errors, 1);
    assert_eq!(decoded.len(), 1);
    assert_eq!(decoded[0]["fields"], serde_json::json!({"raw_payload": "ffff"}));
    assert_eq!(
        decoded[0]["decode_error"],
        "payload byte 0: field : UnusableMetadata (payload is 2 bytes)"
    );
}

#[test]
fn long_name_v1_metadata_amplification_is_refused() {
    let long = "x".repeat(1000);
    // 1 024 empty fields with long names (~1 MB of JSON per empty event before): refused.
    let empties: Vec<Vec<u8>> = (0..1024).map(|_| v1_field(1, Some(&[]), &long)).collect();
    let meta = metadata::parse_nettrace_metadata(
        &metadata_payload(1, "P", 1, "E", &v1_list(&empties)),
        &MetadataLimits::default(),
    )
    .unwrap();
    assert_eq!(meta.field_error, Some(MetadataError::EmptyObject { at: REST_AT + 4 }));

    // 1 024 one-byte fields with long names: accepted, but each value pays for its name, so a
    // payload spends at most cost_budget(len) and the 37th field is refused.
    let bytes: Vec<Vec<u8>> = (0..1024).map(|_| v1_field(6, None, &long)).collect();
    let meta = metadata::parse_nettrace_metadata(
        &metadata_payload(1, "P", 1, "E", &v1_list(&bytes)),
        &MetadataLimits::default(),
    )
    .unwrap();
    assert_eq!(meta.field_error, None);
    let err = decode_payload(&meta, &[7; 1024], 8).unwrap_err();
    assert_eq!(payload::cost_budget(1024), 36_864);
    // Each field costs 1 000 (name) + 8: 36 fit (36 288), the 37th name does not.
    assert_eq!(
        (err.field.as_str(), err.at, err.len, err.problem),
        (long.as_str(), 36, 1024, payload::PayloadProblem::OverBudget)
    );
    // Short names on the same payload decode in full.
    let short: Vec<Vec<u8>> = (0..1024).map(|i| v1_field(6, None, &format!("f{i}"))).collect();
    let meta = metadata::parse_nettrace_metadata(
        &metadata_payload(1, "P", 1, "E", &v1_list(&short)),
        &MetadataLimits::default(),
    )
    .unwrap();
    assert_eq!(decode_payload(&meta, &[7; 1024], 8).unwrap().0.len(), 1024);
}

#[test]
fn metadata_table_bytes_are_bounded() {
    let limits = Limits { max_metadata_bytes: 1000, ..Limits::default() };
    let one = metadata::parse_nettrace_metadata(
        &metadata_payload(1, "Demo", 7, "Tick", &v1_list(&[v1_field(9, None, "value")])),
        &MetadataLimits::default(),
    )
    .unwrap()
    .heap_bytes();
    let fit = 1000 / one;
    let mut blobs = Vec::new();
    for id in 1..=fit as u32 + 1 {
        let fields = v1_list(&[v1_field(9, None, "value")]);
        blobs.push(metadata_blob(&metadata_payload(id, "Demo", 7, "Tick", &fields)));
    }
    let mut s = Stream::new();
    let content_at = s.block("MetadataBlock", &blob_block(1, &blobs));
    let mut parser = NettraceParser::new(limits);
    let err = parser.feed(&s.end(), |_| {}).unwrap_err();
    let offset = (content_at + 20 + blobs[..fit].iter().map(Vec::len).sum::<usize>()) as u64;
    assert_eq!(err, NettraceError::MetadataBudget { offset, bytes: one * (fit + 1), max: 1000 });
    assert_eq!(parser.metadata_bytes(), one * fit);
}

/// Bytes tracer's envelope adds to a decoded event (`ts`, `mono_ns`, `pid`, `kind`, `source`),
/// generously: the fuzz target and these tests charge it on top of the decoded JSON.
const ENVELOPE: u64 = 160;

/// What [`render_bounded`] wrote of a stream.
#[derive(Debug, Default)]
struct Rendered {
    /// Bytes spent from the line budget, and from the stack budget.
    output: u64,
    stack_output: u64,
    written: u64,
    /// Lines written without their stack: the stack budget refused it.
    stacks_unwritten: u64,
    refused: Option<crate::budget::BudgetExceeded>,
}

/// Feeds `data`, naming each event's stack from the stream's method events and spending each
/// line — its JSON and envelope from an [`OutputBudget`], its `stack` from the stack budget,
/// both earned by the bytes fed — as tracer's streaming session does; stops at the first
/// refusal of the line budget.
fn render_bounded(data: &[u8]) -> Rendered {
    let mut budget = crate::budget::OutputBudget::default();
    let mut stack_budget = crate::budget::OutputBudget::for_stacks();
    budget.earn(data.len() as u64);
    stack_budget.earn(data.len() as u64);
    let mut parser = NettraceParser::default();
    let (mut methods, mut named) = (MethodTable::default(), NamedStack::default());
    let mut rendered = Rendered::default();
    let _ = parser.feed(data, |e| {
        if rendered.refused.is_some() {
            return;
        }
        let time = e.timestamp as u64;
        methods.take_event(&e.metadata.provider, e.metadata.event_id, e.payload, time);
        let mut event = e.output();
        let mut stack_bytes = 0;
        if let Some(ips) = e.stack {
            match named.name_within(&mut stack_budget, ips, time, &mut methods) {
                true => (event.stack, stack_bytes) = (Some(&named), named.member_len()),
                false => rendered.stacks_unwritten += 1,
            }
        }
        let json = event_json(&event);
        match budget.spend((json.len() - stack_bytes) as u64 + ENVELOPE) {
            Ok(()) => rendered.written += 1,
            Err(e) => rendered.refused = Some(e),
        }
    });
    (rendered.output, rendered.stack_output) = (budget.output(), stack_budget.output());
    rendered
}

#[test]
fn long_provider_and_event_names_on_empty_events_exhaust_the_output_budget() {
    use crate::budget::{OUTPUT_ALLOWANCE_BYTES, OUTPUT_BYTES_PER_INPUT_BYTE};
    // 1 000 control characters each: 6 JSON bytes per character, per event.
    let name = "\u{1}".repeat(1000);
    let meta = metadata_blob(&metadata_payload(1, &name, 7, &name, &0u32.to_le_bytes()));
    let mut s = Stream::new();
    s.block("MetadataBlock", &blob_block(1, &[meta]));
    // 4-byte events: flags (metadata id), id, timestamp delta, payload size 0.
    let event = [0x01 | 0x80, 1, 10, 0];
    let events: Vec<Vec<u8>> = (0..2000).map(|_| event.to_vec()).collect();
    s.block("EventBlock", &blob_block(1, &events));
    let data = s.end();
    let Rendered { output, written, refused, .. } = render_bounded(&data);
    let limit = OUTPUT_BYTES_PER_INPUT_BYTE * data.len() as u64 + OUTPUT_ALLOWANCE_BYTES;
    let refused = refused.expect("the budget ends the stream");
    assert_eq!(data.len(), 12_246);
    assert_eq!(written, WRITTEN_BEFORE_REFUSAL);
    // Every line is over 12 000 bytes (two escaped names): written × 12 000 ≤ output ≤ limit.
    assert!(output >= written * 12_000 && output <= limit, "{output} {limit}");
    assert!(output + refused.spend > limit);
    assert_eq!(
        (refused.input, refused.output, refused.per_input_byte, refused.allowance),
        (data.len() as u64, output, OUTPUT_BYTES_PER_INPUT_BYTE, OUTPUT_ALLOWANCE_BYTES)
    );
}

/// (64 × 12 246 + 262 144) / ~12 320 bytes per line.
const WRITTEN_BEFORE_REFUSAL: u64 = 85;

#[test]
fn real_captures_stay_far_below_the_output_rate() {
    for (name, rates) in [
        ("coreclr8_gc_induced5.nettrace", 3.0..=10.0),
        ("coreclr8_threadpool.nettrace", 3.0..=10.0),
        ("coreclr8_verbose.nettrace", 3.0..=10.0),
        ("coreclr8_thread_samples.nettrace", 3.0..=10.0),
    ] {
        let data = fixture(name);
        let rendered = render_bounded(&data);
        assert_eq!((rendered.refused, rendered.stacks_unwritten), (None, 0), "{name}");
        let (_, parser) = parse_all(&data);
        assert_eq!(rendered.written, parser.stats().events, "{name}");
        // The documented 3.6–9.2 bytes per input byte, well under OUTPUT_BYTES_PER_INPUT_BYTE.
        let rate = rendered.output as f64 / data.len() as f64;
        assert!(rates.contains(&rate), "{name}: {rate:.2} output bytes per input byte");
        // Their named stacks: 0.4–2.3 bytes per input byte (in the thread samples' capture the
        // method events outweigh the samples).
        let stack_rate = rendered.stack_output as f64 / data.len() as f64;
        assert!(stack_rate <= 3.0, "{name}: {stack_rate:.2} stack bytes per input byte");
    }
}

/// A `MethodLoadVerbose` payload (version 0: no ClrInstanceID) of `size` bytes of code at
/// `start`, named `name`.
fn method_load_payload(start: u64, size: u32, name: &str) -> Vec<u8> {
    let mut p = Vec::new();
    for v in [1u64, 2, start] {
        p.extend(v.to_le_bytes());
    }
    for v in [size, 0x0600_0001, 0] {
        p.extend(v.to_le_bytes());
    }
    for text in ["", name, ""] {
        p.extend(utf16z(text));
    }
    p
}

/// One method of a 1 000-character name covering every frame of a 100-frame stack, named by
/// 2 000 events of 7 bytes: each line's stack is cut at 16 KiB, the stack budget pays for a
/// few hundred of them, and the others are written without it — the lines go on.
#[test]
fn deep_long_named_stacks_spend_the_stack_budget_and_not_the_lines() {
    use crate::budget::{STACK_OUTPUT_ALLOWANCE_BYTES, STACK_OUTPUT_BYTES_PER_INPUT_BYTE};
    let mut s = Stream::new();
    let method_meta =
        metadata_payload(2, runtime_events::RUNTIME_PROVIDER, 143, "", &0u32.to_le_bytes());
    s.block(
        "MetadataBlock",
        &blob_block(
            1,
            &[
                metadata_blob(&metadata_payload(1, "Demo", 7, "Tick", &{
                    let mut fields = 1u32.to_le_bytes().to_vec();
                    fields.extend(9u32.to_le_bytes());
                    fields.extend(utf16z("value"));
                    fields
                })),
                metadata_blob(&method_meta),
            ],
        ),
    );
    let load = method_load_payload(0x1000, 0x1000, &"N".repeat(1000));
    let mut method_event = vec![0x01 | 0x02 | 0x04 | 0x80];
    for v in [2, 0, 100, 0, 100, 1] {
        method_event.extend(varuint(v));
    }
    method_event.extend(varuint(load.len() as u64));
    method_event.extend(&load);
    s.block("EventBlock", &blob_block(1, &[method_event]));
    s.block("StackBlock", &stack_block(1, &[&[0x1010; 100]], 8));
    let mut events = vec![event_with_stack(true, 1, 0)];
    // Flags (payload size), timestamp delta, payload size, the i32.
    events.extend((1..2000).map(|i: i32| [&[0x80, 1, 4][..], &i.to_le_bytes()].concat()));
    s.block("EventBlock", &blob_block(1, &events));
    let data = s.end();
    let rendered = render_bounded(&data);
    assert_eq!(rendered.refused, None);
    assert_eq!(rendered.written, 2001);
    let stack_limit =
        STACK_OUTPUT_BYTES_PER_INPUT_BYTE * data.len() as u64 + STACK_OUTPUT_ALLOWANCE_BYTES;
    assert!(rendered.stack_output <= stack_limit);
    // Each stack costs 16 064 bytes (16 frames of 1 002, the marker) and 17 entries examined;
    // 616 fit in 512 × 17 328 + 1 MiB with room left for the most a next one may cost.
    assert_eq!((data.len(), rendered.stacks_unwritten), (17_328, 2000 - 616));
    assert_eq!(rendered.stack_output, 616 * (16_064 + 17));
    let left = stack_limit - rendered.stack_output;
    assert!(left < super::stacks::naming_cost_bound(100), "{left}");
}

/// Every event of the captured CoreCLR 8 streams (GC, exceptions, allocations, thread pool,
/// counters) has a name and decodes exactly: the table has each (id, version) the runtime sent.
#[test]
fn every_event_of_the_coreclr8_fixtures_is_named_and_decodes_exactly() {
    for name in FIXTURES {
        let mut parser = NettraceParser::default();
        let mut events = 0;
        parser
            .feed(&fixture(name), |e| {
                events += 1;
                assert!(
                    e.metadata.is_named(),
                    "{name}: {} {}",
                    e.metadata.provider,
                    e.metadata.event_id
                );
                let fields = decode_payload(e.metadata, e.payload, 8)
                    .unwrap_or_else(|err| panic!("{name}: {}: {err}", e.metadata.event_name));
                assert!(
                    fields.get("raw_tail").is_none(),
                    "{name}: {} has more bytes",
                    e.metadata.event_name
                );
                assert!(fields.get("raw_payload").is_none(), "{name}: {}", e.metadata.event_name);
            })
            .unwrap();
        assert!(events > 0, "{name}");
    }
}

/// BulkType: an array of structs counted by an earlier field, each with a bit map, a string and
/// an array of its own counted inside the struct — exact JSON.
#[test]
fn struct_arrays_counted_fields_and_bit_maps_decode_to_exact_json() {
    let meta = EventMetadata {
        version: Some(0),
        ..EventMetadata::native(runtime_events::RUNTIME_PROVIDER, 15)
    };
    let mut payload = Vec::new();
    payload.extend(2u32.to_le_bytes()); // Count
    payload.extend(7u16.to_le_bytes()); // ClrInstanceID
    for (type_id, flags, name, params) in
        [(0x10u64, 0x0Au32, "A", &[0x99u64][..]), (0x20, 0x4000, "Bc", &[][..])]
    {
        payload.extend(type_id.to_le_bytes());
        payload.extend(0x30u64.to_le_bytes()); // ModuleID
        payload.extend(5u32.to_le_bytes()); // TypeNameID
        payload.extend(flags.to_le_bytes());
        payload.push(0x12); // CorElementType
        payload.extend(writer::utf16z(name));
        payload.extend((params.len() as u32).to_le_bytes());
        params.iter().for_each(|p| payload.extend(p.to_le_bytes()));
    }
    let fields = decode_payload(&meta, &payload, 8).unwrap();
    assert_eq!(
        fields_json(&fields),
        concat!(
            r#"{"Count":2,"ClrInstanceID":7,"Values":["#,
            r#"{"TypeID":16,"ModuleID":48,"TypeNameID":5,"Flags":"Finalizable | Array","#,
            r#""CorElementType":18,"Name":"A","TypeParameterCount":1,"TypeParameters":[153]},"#,
            r#"{"TypeID":32,"ModuleID":48,"TypeNameID":5,"Flags":"0x4000","#,
            r#""CorElementType":18,"Name":"Bc","TypeParameterCount":0,"TypeParameters":[]}]}"#
        )
    );
    // A count the payload cannot hold ends at the first missing element, with its offset.
    let mut huge = payload.clone();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = decode_payload(&meta, &huge, 8).unwrap_err();
    assert_eq!(
        (err.field.as_str(), err.at, err.problem),
        ("TypeID", payload.len(), payload::PayloadProblem::Short)
    );
}

#[test]
fn a_records_version_is_the_newest_template_it_fills_exactly() {
    let version =
        |len| payload::fitting_version(runtime_events::RUNTIME_PROVIDER, 4, &vec![0; len], 8);
    assert_eq!((version(92), version(94), version(110)), (Some(0), Some(1), Some(2)));
    assert_eq!(version(93), None);
    assert_eq!(payload::fitting_version("Other", 4, &[0; 94], 8), None);
}

const FIXTURES: [&str; 5] = [
    "coreclr8_gc_induced5.nettrace",
    "coreclr8_verbose.nettrace",
    "coreclr8_threadpool.nettrace",
    "coreclr8_counters.nettrace",
    "coreclr8_thread_samples.nettrace",
];

/// The direct writer against its reference, serde_json over the decoded event's `Serialize`
/// derive.
fn assert_writes_like_serde(event: &OutputEvent) {
    let reference = serde_json::to_string(&event.decode()).unwrap();
    assert_eq!(event_json(event), reference);
}

#[test]
fn every_fixture_event_is_written_byte_for_byte_as_serde_json_writes_it() {
    for name in FIXTURES {
        let mut parser = NettraceParser::default();
        let (mut methods, mut named) = (MethodTable::default(), NamedStack::default());
        let mut events = 0;
        parser
            .feed(&fixture(name), |e| {
                assert_writes_like_serde(&e.output());
                if let Some(ips) = e.stack {
                    let time = e.timestamp as u64;
                    methods.take_event(&e.metadata.provider, e.metadata.event_id, e.payload, time);
                    named.name(ips, time, &mut methods);
                    assert_writes_like_serde(&OutputEvent { stack: Some(&named), ..e.output() });
                }
                events += 1;
            })
            .unwrap();
        assert!(events > 0, "{name}");
    }
}

/// A field of every metadata type, written with edge values: the bytes of each in a payload.
fn edge_payload() -> (Vec<FieldDef>, Vec<u8>) {
    let field = |name: &str, ty| FieldDef::new(name.into(), ty);
    let mut defs = Vec::new();
    let mut payload = Vec::new();
    let mut add = |name: &str, ty: FieldType, bytes: &[u8]| {
        defs.push(field(name, ty));
        payload.extend_from_slice(bytes);
    };
    add("s\"\u{1}key\u{2028}", FieldType::String, &writer::utf16z("quote \" backslash \\ /"));
    add(
        "controls",
        FieldType::String,
        &writer::utf16z("\u{7}\u{8}\t\n\u{b}\u{c}\r\u{1b}\u{1f}\u{7f}"),
    );
    add("separators", FieldType::String, &writer::utf16z("line\u{2028}para\u{2029}"));
    add("non_bmp", FieldType::String, &writer::utf16z("😀 𝄞 \u{fffd} é"));
    add("empty", FieldType::String, &writer::utf16z(""));
    add("bool", FieldType::Boolean, &7u32.to_le_bytes());
    add("false", FieldType::Boolean, &0u32.to_le_bytes());
    add("char", FieldType::Char16, &0x22u16.to_le_bytes());
    add("lone_surrogate", FieldType::Char16, &0xDC00u16.to_le_bytes());
    add("sbyte", FieldType::SByte, &[0x80]);
    add("byte", FieldType::Byte, &[0xff]);
    add("i16", FieldType::Int16, &i16::MIN.to_le_bytes());
    add("u16", FieldType::UInt16, &u16::MAX.to_le_bytes());
    add("i32", FieldType::Int32, &i32::MIN.to_le_bytes());
    add("u32", FieldType::UInt32, &u32::MAX.to_le_bytes());
    add("i64_min", FieldType::Int64, &i64::MIN.to_le_bytes());
    add("u64_max", FieldType::UInt64, &u64::MAX.to_le_bytes());
    add("date", FieldType::DateTime, &(-1i64).to_le_bytes());
    add(
        "guid",
        FieldType::Guid,
        &[0x33, 0x22, 0x11, 0, 0x55, 0x44, 0x77, 0x66, 8, 9, 10, 11, 12, 13, 14, 0xff],
    );
    for v in [0.1f32, f32::NAN, f32::INFINITY, -0.0, f32::MAX] {
        add("single", FieldType::Single, &v.to_le_bytes());
    }
    for v in [0.0, -0.0, 0.1, 1e21, 1e-7, 5e-324, f64::MAX, 1.0, -2.5, f64::NAN, f64::NEG_INFINITY]
    {
        add("double", FieldType::Double, &v.to_le_bytes());
    }
    add("no_items", FieldType::Array(Box::new(FieldType::Int32)), &0u16.to_le_bytes());
    let point = FieldType::Object(vec![
        field("x", FieldType::Int32),
        field("tags", FieldType::Array(Box::new(FieldType::String))),
    ]);
    let mut points = 2u16.to_le_bytes().to_vec();
    for (x, tags) in [(-1i32, &["a\"b", ""][..]), (2, &[][..])] {
        points.extend(x.to_le_bytes());
        points.extend((tags.len() as u16).to_le_bytes());
        tags.iter().for_each(|t| points.extend(writer::utf16z(t)));
    }
    add("points", FieldType::Array(Box::new(point)), &points);
    add("empty_object", FieldType::Object(Vec::new()), &[]);
    (defs, payload)
}

#[test]
fn edge_values_are_written_byte_for_byte_as_serde_json_writes_them() {
    let (fields, payload) = edge_payload();
    let meta = EventMetadata {
        event_name: "Edge \"cases\"\n".into(),
        version: Some(u32::MAX),
        keywords: u64::MAX,
        fields,
        ..EventMetadata::native("Provider\\with\u{1}controls", u32::MAX)
    };
    let context = EventContext {
        thread: u64::MAX,
        sequence: Some(u32::MAX),
        timestamp: i64::MIN,
        activity_id: [0x33, 0x22, 0x11, 0, 0x55, 0x44, 0x77, 0x66, 8, 9, 10, 11, 12, 13, 14, 0xff],
        related_activity_id: [0xff; 16],
        stack_id: u32::MAX,
    };
    let event = OutputEvent {
        metadata: &meta,
        payload: &payload,
        pointer_size: 8,
        context,
        stack: None,
        rendered_fields: None,
    };
    assert_eq!(event.decode().decode_error, None);
    assert_writes_like_serde(&event);
    // Cut short: the raw payload and the error.
    let short = OutputEvent { payload: &payload[..payload.len() - 3], ..event };
    assert!(short.decode().decode_error.is_some());
    assert_writes_like_serde(&short);
    // Every optional member absent, and a name only the id gives.
    let bare = EventMetadata::native("P", 4242);
    let bare_event = |payload| OutputEvent {
        metadata: &bare,
        payload,
        pointer_size: 8,
        stack: None,
        rendered_fields: None,
        context: EventContext::default(),
    };
    assert_writes_like_serde(&bare_event(&[]));
    let raw = bare_event(&[1, 2, 3]);
    assert_writes_like_serde(&raw);
    assert_eq!(
        event_json(&raw),
        r#"{"provider":"P","event":"EventID(4242)","id":4242,"level":0,"keywords":"0x0","thread":0,"timestamp":0,"fields":{"raw_payload":"010203"}}"#
    );
}

/// The tree's own writer (a field's JSON for `--stopping-event`) against serde_json, on values
/// no payload type yields as such: named enums and bit maps with odd names.
#[test]
fn a_value_tree_is_written_byte_for_byte_as_serde_json_writes_it() {
    let mut fields: Fields = OrderedMap::default();
    fields
        .push("enum", Value::Enum { value: 3, name: "Named \"enum\"" })
        .push("bytes", Value::Bytes(vec![0, 0x7f, 0x80, 0xff]))
        .push("no_bytes", Value::Bytes(Vec::new()))
        .push("empty_array", Value::Array(Vec::new()))
        .push("i64_min", Value::I64(i64::MIN))
        .push("nan", Value::F64(f64::NAN));
    for (names, unnamed) in
        [(vec![], 0), (vec![], 0x4000), (vec!["A"], 0), (vec!["A", "B\"c"], 0x8000_0000_0000_0000)]
    {
        fields.push("flags", Value::Flags { value: 0, names, unnamed });
    }
    let nested = Value::Array(vec![
        Value::Object(OrderedMap(vec![("a", Value::U64(1)), ("b", Value::Array(vec![]))])),
        Value::Array(vec![Value::Str("\\".into()), Value::Guid([0xab; 16])]),
    ]);
    fields.push("nested", nested);
    assert_eq!(fields_json(&fields), serde_json::to_string(&fields).unwrap());
}

/// UTF-16 payload strings with lone surrogates, unpaired halves at the end, embedded NULs after
/// the terminator: what the decoder makes of them is written as serde_json writes it.
#[test]
fn utf16_strings_with_lone_surrogates_are_written_as_serde_json_writes_them() {
    let meta = EventMetadata {
        event_name: "Strings".into(),
        fields: ["a", "b", "c", "d"]
            .map(|name| FieldDef::new(name.into(), FieldType::String))
            .into(),
        ..EventMetadata::native("P", 1)
    };
    let units: [&[u16]; 4] = [
        &[0xD800, 0x41, 0],
        &[0x41, 0xDC00, 0xD83D, 0xDE00, 0],
        &[0xDBFF, 0],
        &[0x2028, 0x22, 0x5C, 0x1, 0],
    ];
    let payload: Vec<u8> =
        units.iter().flat_map(|s| s.iter()).flat_map(|u| u.to_le_bytes()).collect();
    let event = OutputEvent {
        metadata: &meta,
        payload: &payload,
        pointer_size: 8,
        stack: None,
        rendered_fields: None,
        context: EventContext::default(),
    };
    assert_eq!(event.decode().decode_error, None);
    assert_writes_like_serde(&event);
    assert!(event_json(&event).contains("\"a\":\"\u{fffd}A\","), "{}", event_json(&event));
    // ASCII first, then not: the whole string decoded.
    assert!(event_json(&event).contains("\"b\":\"A\u{fffd}😀\","), "{}", event_json(&event));
}

/// Payloads of integers only are written from the compiled layout (`FlatLayout`); every case
/// where the general decoder writes something else (another length, a tail, over the cost
/// budget, an odd pointer size) goes to that decoder. Both against serde_json.
#[test]
fn a_flat_layout_writes_what_the_general_decoder_writes_and_leaves_it_the_rest() {
    let ints = [
        ("signed \"byte\"", FieldType::SByte, vec![0x80]),
        ("i16", FieldType::Int16, i16::MIN.to_le_bytes().to_vec()),
        ("i32", FieldType::Int32, (-2i32).to_le_bytes().to_vec()),
        ("i64", FieldType::Int64, i64::MIN.to_le_bytes().to_vec()),
        ("date", FieldType::DateTime, (-1i64).to_le_bytes().to_vec()),
        ("u8", FieldType::Byte, vec![0xff]),
        ("u16", FieldType::UInt16, u16::MAX.to_le_bytes().to_vec()),
        ("u32", FieldType::UInt32, u32::MAX.to_le_bytes().to_vec()),
        ("u64", FieldType::UInt64, u64::MAX.to_le_bytes().to_vec()),
        ("flag", FieldType::Boolean, 2u32.to_le_bytes().to_vec()),
    ];
    let fields = ints.iter().map(|(n, ty, _)| FieldDef::new((*n).into(), ty.clone()));
    let meta = EventMetadata { fields: fields.collect(), ..EventMetadata::native("P", 1) };
    assert!(meta.compiled_layout().is_some());
    let payload: Vec<u8> = ints.iter().flat_map(|(_, _, bytes)| bytes.clone()).collect();
    let event = |payload| OutputEvent {
        metadata: &meta,
        payload,
        pointer_size: 8,
        stack: None,
        rendered_fields: None,
        context: EventContext::default(),
    };
    assert_writes_like_serde(&event(&payload));
    assert!(event_json(&event(&payload)).contains(r#""signed \"byte\"":-128,"i16":-32768"#));
    assert!(event_json(&event(&payload)).contains(r#""u64":18446744073709551615,"flag":true}"#));
    let short = &payload[..payload.len() - 1];
    assert!(event(short).decode().decode_error.is_some());
    assert_writes_like_serde(&event(short));

    // A runtime layout (GCEnd v1: Count, Depth, ClrInstanceID), exact and with a tail.
    let gc_end = EventMetadata {
        version: Some(1),
        ..EventMetadata::native(runtime_events::RUNTIME_PROVIDER, 2)
    };
    assert!(gc_end.compiled_layout().is_some());
    let mut gc_payload = [7u32.to_le_bytes(), 2u32.to_le_bytes()].concat();
    gc_payload.extend(3u16.to_le_bytes());
    let gc = |payload| OutputEvent { metadata: &gc_end, ..event(payload) };
    assert!(
        event_json(&gc(&gc_payload))
            .ends_with(r#""fields":{"Count":7,"Depth":2,"ClrInstanceID":3}}"#)
    );
    let with_tail = [&gc_payload[..], &[0xab]].concat();
    assert!(event_json(&gc(&with_tail)).ends_with(r#""ClrInstanceID":3,"raw_tail":"ab"}}"#));
    assert_writes_like_serde(&gc(&with_tail));

    // Names longer than the budget allows for a one-byte payload: refused as the decoder does.
    let long = "n".repeat(payload::cost_budget(1));
    let over = EventMetadata {
        fields: vec![FieldDef::new(long, FieldType::Byte)],
        ..EventMetadata::native("P", 1)
    };
    let over_event = OutputEvent { metadata: &over, ..event(&[1]) };
    assert!(over_event.decode().decode_error.unwrap().contains("OverBudget"));
    assert_writes_like_serde(&over_event);
    // A pointer size the stream may not have: the decoder's error, not the layout's guess.
    let pointers = EventMetadata {
        version: Some(0),
        ..EventMetadata::native(runtime_events::RUNTIME_PROVIDER, 29)
    };
    let odd = OutputEvent { metadata: &pointers, pointer_size: 2, ..event(&[0; 6]) };
    assert!(odd.decode().decode_error.unwrap().contains("BadPointerSize"));
    assert_writes_like_serde(&odd);
}

/// Runtime fields with manifest maps are written from the compiled layout too, as the general
/// decoder maps them: a value map's name (the number when the map has none for it), a bit
/// map's bit names and its unnamed bits.
#[test]
fn a_flat_layout_writes_mapped_values_as_the_general_decoder_does() {
    let native = |id, version| EventMetadata {
        version: Some(version),
        ..EventMetadata::native(runtime_events::RUNTIME_PROVIDER, id)
    };
    fn event<'a>(metadata: &'a EventMetadata, payload: &'a [u8]) -> OutputEvent<'a> {
        OutputEvent {
            metadata,
            payload,
            pointer_size: 8,
            context: EventContext::default(),
            stack: None,
            rendered_fields: None,
        }
    }
    // GCStart v2: Count, Depth, Reason (value map), Type (value map), ClrInstanceID,
    // ClientSequenceNumber.
    let gc_start = native(1, 2);
    assert!(gc_start.compiled_layout().is_some());
    let gc = |reason: u32, ty: u32| {
        let mut p = [9u32, 1, reason, ty].map(u32::to_le_bytes).concat();
        p.extend(3u16.to_le_bytes());
        p.extend(5u64.to_le_bytes());
        p
    };
    let named = gc(1, 2);
    assert_writes_like_serde(&event(&gc_start, &named));
    assert!(event_json(&event(&gc_start, &named)).ends_with(
        r#""fields":{"Count":9,"Depth":1,"Reason":"Induced","Type":"ForegroundGC","ClrInstanceID":3,"ClientSequenceNumber":5}}"#
    ));
    // Values the maps do not name: numbers.
    let unnamed = gc(77, 3);
    assert_writes_like_serde(&event(&gc_start, &unnamed));
    assert!(event_json(&event(&gc_start, &unnamed)).contains(r#""Reason":77,"Type":3,"#));

    // ThreadCreated: ManagedThreadID, AppDomainID, Flags (bit map), ManagedThreadIndex,
    // OSThreadID, ClrInstanceID.
    let thread_created = native(85, 0);
    assert!(thread_created.compiled_layout().is_some());
    let thread = |flags: u32| {
        let mut p = [1u64, 2].map(u64::to_le_bytes).concat();
        p.extend([flags, 4, 5].map(u32::to_le_bytes).concat());
        p.extend(6u16.to_le_bytes());
        p
    };
    for (flags, shown) in [
        (0x5, r#""Flags":"GCSpecial | ThreadPoolWorker","#),
        (0x12, r#""Flags":"Finalizer | 0x10","#),
        (0, r#""Flags":"0x0","#),
    ] {
        let payload = thread(flags);
        assert_writes_like_serde(&event(&thread_created, &payload));
        let json = event_json(&event(&thread_created, &payload));
        assert!(json.contains(shown), "{json}");
    }
}

/// Runtime layouts with UTF-16 strings are written from the compiled layout too; a payload the
/// strings do not fill exactly (no NUL, bytes left, too short) goes to the general decoder.
#[test]
fn a_flat_layout_writes_strings_and_leaves_the_general_decoder_what_they_do_not_fill() {
    // GCAllocationTick v2: AllocationAmount, AllocationKind (value map), ClrInstanceID,
    // AllocationAmount64, TypeID (pointer), TypeName (UTF-16Z), HeapIndex.
    let tick = EventMetadata {
        version: Some(2),
        ..EventMetadata::native(runtime_events::RUNTIME_PROVIDER, 10)
    };
    assert!(tick.compiled_layout().is_some());
    let payload = |name: &[u8], pointer_size: usize| {
        let mut p = [100u32, 1].map(u32::to_le_bytes).concat();
        p.extend(2u16.to_le_bytes());
        p.extend(100u64.to_le_bytes());
        p.extend(&0x7f00_0000_1234u64.to_le_bytes()[..pointer_size]);
        p.extend(name);
        p.extend(3u32.to_le_bytes());
        p
    };
    fn event<'a>(
        metadata: &'a EventMetadata,
        payload: &'a [u8],
        pointer_size: u32,
    ) -> OutputEvent<'a> {
        OutputEvent {
            metadata,
            payload,
            pointer_size,
            context: EventContext::default(),
            stack: None,
            rendered_fields: None,
        }
    }
    let expected = |name: &str, type_id: u64| {
        format!(
            r#""fields":{{"AllocationAmount":100,"AllocationKind":"Large","ClrInstanceID":2,"AllocationAmount64":100,"TypeID":{type_id},"TypeName":{name},"HeapIndex":3}}}}"#
        )
    };
    for (name, shown) in [
        ("System.String", r#""System.String""#),
        ("", r#""""#),
        // Escaped, and decoded from more than one unit a character.
        ("a\"b\\c\u{1}é😀", r#""a\"b\\c\u0001é😀""#),
    ] {
        for pointer_size in [8, 4] {
            let bytes = payload(&utf16z(name), pointer_size);
            let e = event(&tick, &bytes, pointer_size as u32);
            assert_writes_like_serde(&e);
            let type_id = if pointer_size == 8 { 0x7f00_0000_1234 } else { 0x1234 };
            assert!(event_json(&e).ends_with(&expected(shown, type_id)), "{}", event_json(&e));
        }
    }
    let good = payload(&utf16z("T"), 8);
    // Unterminated: no NUL after the string's units (and no last field).
    let no_nul = [&good[..good.len() - 6], &[b'U', 0]].concat();
    // A byte left after the last field.
    let tail = [&good[..], &[0xab]].concat();
    // The string's NUL is there, the last field is not.
    let short = &good[..good.len() - 1];
    for (bytes, decoded) in [
        (&no_nul[..], "field TypeName: UnterminatedString"),
        (&tail[..], r#""HeapIndex":3,"raw_tail":"ab"}"#),
        (short, "Short"),
    ] {
        let e = event(&tick, bytes, 8);
        assert_writes_like_serde(&e);
        assert!(event_json(&e).contains(decoded), "{}", event_json(&e));
    }
}

// ---- work linear in the bytes fed (crate::work) ----

/// Work ([`crate::work`]) of parsing `data` fed in chunks whose sizes cycle through `chunks` and
/// writing every event's JSON, its stack named, as tracer does; panics unless the stream parses
/// to its end.
fn work_of(data: &[u8], chunks: &[usize]) -> u64 {
    let ((), work) = crate::work::measure(|| {
        let mut parser = NettraceParser::default();
        let (mut methods, mut named) = (MethodTable::default(), NamedStack::default());
        let mut stack_budget = crate::budget::OutputBudget::for_stacks();
        let mut json = Vec::new();
        let mut at = 0;
        for &size in chunks.iter().cycle() {
            if at == data.len() {
                break;
            }
            let n = size.min(data.len() - at);
            let piece = &data[at..at + n];
            stack_budget.earn(n as u64);
            parser
                .feed(piece, |e| {
                    let time = e.timestamp as u64;
                    methods.take_event(&e.metadata.provider, e.metadata.event_id, e.payload, time);
                    let mut event = e.output();
                    if let Some(ips) = e.stack
                        && named.name_within(&mut stack_budget, ips, time, &mut methods)
                    {
                        event.stack = Some(&named);
                    }
                    json.clear();
                    event.write_json(&mut json);
                })
                .unwrap();
            at += n;
        }
        parser.finish().unwrap();
    });
    work
}

/// Collects events and the outcome of `data` fed in chunks of `chunk` bytes, as [`collect`]
/// does for the whole stream.
fn collect_chunked(data: &[u8], chunk: usize) -> (Result<(), NettraceError>, Vec<Seen>) {
    let mut parser = NettraceParser::default();
    let mut events = Vec::new();
    let mut result = Ok(());
    for piece in data.chunks(chunk) {
        result = parser.feed(piece, |e| {
            events.push((e.sequence, e.capture_thread_id, e.timestamp, e.payload.to_vec()))
        });
        if result.is_err() {
            break;
        }
    }
    (result.and_then(|()| parser.finish()), events)
}

#[test]
fn a_stream_fed_a_byte_at_a_time_costs_about_what_it_costs_in_one_piece() {
    let data = fixture("coreclr8_counters.nettrace");
    let whole = work_of(&data, &[usize::MAX]);
    let bytewise = work_of(&data, &[1]);
    // Naming the events' stacks costs 6 256 of the work either way.
    assert_eq!((data.len(), whole, bytewise), (10_538, 31_918, 42_809));
    // Each byte is copied into the buffer once more, and each object's header is read at the
    // few lengths where it can tell more — not on every feed (that costs up to
    // 2 × UNIT_HEADER_MAX a byte: 1 718 553 here).
    assert_eq!(bytewise - whole, 10_891);
    assert!(bytewise - whole < 2 * data.len() as u64);
}

#[test]
fn a_header_cut_anywhere_gives_the_same_outcome_whole_and_a_byte_at_a_time() {
    let mut s = Stream::new();
    s.block("MetadataBlock", &demo_metadata(1));
    s.block("EventBlock", &blob_block(1, &[demo_event(0, 1, 100, 5)]));
    let data = s.end();
    let mut outcomes = std::collections::BTreeSet::new();
    // Every prefix; and a byte changed anywhere in the prologue, the Trace object and the first
    // block's header (what is read before a unit's length is known), with the stream whole or
    // cut within the next header's length (so a check may have too few bytes to run).
    let mut inputs: Vec<Vec<u8>> = (0..=data.len()).map(|n| data[..n].to_vec()).collect();
    for at in 0..140 {
        for value in [0x00, 0x01, 0x05, 0x06, 0x40, 0xff] {
            let mut changed = data.clone();
            changed[at] = value;
            for end in at + 1..=(at + 40).min(data.len()) {
                inputs.push(changed[..end].to_vec());
            }
            inputs.push(changed);
        }
    }
    for input in &inputs {
        let (result, events, _) = collect(input);
        assert_eq!(collect_chunked(input, 1), (result.clone(), events.clone()), "{input:02x?}");
        assert_eq!(collect_chunked(input, 3), (result.clone(), events), "{input:02x?}");
        outcomes.insert(format!("{result:?}").split(" {").next().unwrap().to_owned());
    }
    // The changed bytes reach every check of a header.
    let expected = [
        "Err(BadPointerSize",
        "Err(BadPrologue",
        "Err(BadTag",
        "Err(BlockTooLarge",
        "Err(Corrupt",
        "Err(Metadata",
        "Err(TrailingData",
        "Err(Truncated",
        "Err(TypeNameTooLong",
        "Err(UnknownObject",
        "Err(UnsupportedVersion",
        "Ok(())",
    ];
    assert_eq!(outcomes.iter().map(String::as_str).collect::<Vec<_>>(), expected);
}

/// Work per stream byte, whole or chunked as the fuzz target feeds it, that a real capture
/// stays under: the parser reads each byte about twice (walked once, copied into its buffer at
/// most once) and decoding charges well under 16 units per payload byte
/// (`COST_PER_PAYLOAD_BYTE` allows 32).
const SEED_WORK_PER_BYTE_MAX: u64 = 16;

#[test]
fn every_fuzz_seed_costs_work_linear_in_its_bytes() {
    let seeds = crate::work::fuzz_seeds("nettrace");
    let names: Vec<&str> = seeds.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "coreclr8_counters",
            "coreclr8_gc_induced5",
            "coreclr8_gc_induced5_chunked",
            "coreclr8_thread_samples_small_blocks",
            "coreclr8_threadpool",
            "coreclr8_verbose",
        ]
    );
    let mut runs = Vec::new();
    for (name, input) in &seeds {
        // fuzz/fuzz_targets/nettrace.rs: a count byte, that many chunk sizes (each + 1; none:
        // one byte at a time), then the stream, which it parses whole and in those chunks.
        let (&n, rest) = input.split_first().expect("a seed is not empty");
        let (chunks, stream) = rest.split_at(usize::from(n % 16).min(rest.len()));
        let chunks: Vec<usize> = match chunks {
            [] => vec![1],
            sizes => sizes.iter().map(|&s| usize::from(s) + 1).collect(),
        };
        for (feeding, chunks) in [("whole", vec![usize::MAX]), ("chunked", chunks)] {
            runs.push((format!("{name} {feeding}"), work_of(stream, &chunks), stream.len()));
        }
    }
    crate::work::assert_linear(&runs, SEED_WORK_PER_BYTE_MAX);
}

/// A real CoreCLR 8 capture of the sample profiler with the JIT and loader events at verbose
/// (`burn`: `TracerWorkload.Hot`, every method JIT-compiled while the session ran): every
/// sample names a stack the stream defined, and the stream's own method events name the
/// workload's frames as a streaming session names them, event by event.
#[test]
fn thread_samples_of_a_real_capture_name_their_stacks_from_the_streams_own_methods() {
    let data = fixture("coreclr8_thread_samples.nettrace");
    let mut parser = NettraceParser::default();
    let (mut methods, mut named) = (MethodTable::default(), NamedStack::default());
    let mut samples = 0;
    let mut by_leaf_and_caller = std::collections::BTreeMap::<(String, String), u64>::new();
    let frame_name = |frame: Option<&StackFrame>| match frame {
        Some(StackFrame::Method(name)) => name.trim_start_matches("TracerWorkload.Hot.").to_owned(),
        Some(StackFrame::Address(_)) => "0x…".to_owned(),
        Some(StackFrame::Cut) | None => "none".to_owned(),
    };
    parser
        .feed(&data, |e| {
            let time = e.timestamp as u64;
            methods.take_event(&e.metadata.provider, e.metadata.event_id, e.payload, time);
            let Some(ips) = e.stack else { return };
            named.name(ips, time, &mut methods);
            if e.metadata.provider == runtime_events::SAMPLE_PROFILER_PROVIDER {
                samples += 1;
                let frames = named.frames();
                let key = (frame_name(frames.first()), frame_name(frames.get(1)));
                *by_leaf_and_caller.entry(key).or_default() += 1;
            }
        })
        .unwrap();
    parser.finish().unwrap();
    let stats = parser.stats();
    assert_eq!(
        (stats.stack_blocks, stats.stacks, stats.stacks_refused, stats.lost_events),
        (6, 145, 0, 0)
    );
    assert_eq!((samples, methods.len()), (469, 236));
    let count =
        |leaf: &str, caller: &str| by_leaf_and_caller[&(leaf.to_owned(), caller.to_owned())];
    // Inner under CallerA and CallerB about 3:1, Inner : Other about 2:1.
    assert_eq!((count("Inner", "CallerA"), count("Inner", "CallerB")), (153, 57));
    assert_eq!(count("Other", "Run"), 124);
    // Code compiled moments before a sample whose method event comes later in the stream
    // (events are in order per thread only) is an address when the sample's line is written;
    // stubs and Python.Runtime's code, compiled before the session, are addresses too.
    assert_eq!((count("0x…", "CallerA"), count("0x…", "CallerB")), (31, 11));
    assert_eq!(count("0x…", "0x…"), 90);
    assert_eq!(
        by_leaf_and_caller.len(),
        9,
        "and three samples in Python.Runtime: {by_leaf_and_caller:?}"
    );
}
