//! Writing a NetTrace V4 stream (docs/protocol/nettrace.md): the prologue and Trace object,
//! MetadataBlocks, EventBlocks with uncompressed blob headers (§4.5), sequence points and the
//! end tag — what tracer saves for a user_events session, whose records arrive through ftrace
//! rather than as a stream. Pure: each call returns the bytes to append; the writer only tracks
//! the stream offset, which block padding depends on.

/// The Trace object's fields (§3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceHeader {
    /// year, month, day of week, day, hour, minute, second, millisecond (UTC).
    pub sync_time_utc: [u16; 8],
    /// The timestamp that `sync_time_utc` stands for.
    pub sync_timestamp: i64,
    /// Timestamp units per second.
    pub timestamp_frequency: i64,
    pub pointer_size: u32,
    pub process_id: u32,
    pub processors: u32,
    pub sampling_interval_ns: u32,
}

/// One event of an EventBlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobEvent<'a> {
    pub metadata_id: u32,
    pub sequence: u32,
    pub thread_id: u64,
    pub capture_thread_id: u64,
    pub processor: u32,
    pub timestamp: i64,
    pub activity_id: [u8; 16],
    pub related_activity_id: [u8; 16],
    pub payload: &'a [u8],
}

/// Bytes of the prologue (§2).
const PROLOGUE: &[u8] = b"Nettrace\x14\x00\x00\x00!FastSerialization.1";
const BEGIN_OBJECT: u8 = 0x05;
const NULL_REFERENCE: u8 = 0x01;
const END_OBJECT: u8 = 0x06;
/// EventBlock / MetadataBlock header size (§4.3).
const BLOCK_HEADER_SIZE: u16 = 20;

/// Tracks the absolute stream offset across the pieces it returns.
#[derive(Debug)]
pub struct NettraceWriter {
    offset: u64,
}

impl NettraceWriter {
    /// The stream's first bytes: the prologue and the Trace object.
    pub fn start(header: &TraceHeader) -> (NettraceWriter, Vec<u8>) {
        let mut out = PROLOGUE.to_vec();
        object_start(&mut out, "Trace", 4, 4);
        for v in header.sync_time_utc {
            out.extend(v.to_le_bytes());
        }
        out.extend(header.sync_timestamp.to_le_bytes());
        out.extend(header.timestamp_frequency.to_le_bytes());
        for v in
            [header.pointer_size, header.process_id, header.processors, header.sampling_interval_ns]
        {
            out.extend(v.to_le_bytes());
        }
        out.push(END_OBJECT);
        (NettraceWriter { offset: out.len() as u64 }, out)
    }

    /// A MetadataBlock defining `metadata_id` with `metadata` (the provider name UTF-16Z, then
    /// the metadata body from the event id on: the form user_events records carry, §5.1).
    pub fn metadata_block(&mut self, metadata_id: u32, metadata: &[u8], timestamp: i64) -> Vec<u8> {
        let mut payload = metadata_id.to_le_bytes().to_vec();
        payload.extend(metadata);
        let blob = BlobEvent {
            metadata_id: 0,
            sequence: 0,
            thread_id: 0,
            capture_thread_id: 0,
            processor: 0,
            timestamp,
            activity_id: [0; 16],
            related_activity_id: [0; 16],
            payload: &payload,
        };
        self.block("MetadataBlock", &[blob])
    }

    /// An EventBlock of `events` (uncompressed headers; each event marked sorted).
    pub fn event_block(&mut self, events: &[BlobEvent<'_>]) -> Vec<u8> {
        self.block("EventBlock", events)
    }

    /// A sequence point: each capture thread's last sequence number (§4.7).
    pub fn sequence_point(&mut self, timestamp: i64, threads: &[(u64, u32)]) -> Vec<u8> {
        let mut content = timestamp.to_le_bytes().to_vec();
        content.extend((threads.len() as u32).to_le_bytes());
        for (thread, sequence) in threads {
            content.extend(thread.to_le_bytes());
            content.extend(sequence.to_le_bytes());
        }
        self.framed("SPBlock", &content)
    }

    /// The end-of-stream tag (§8).
    pub fn end(&mut self) -> Vec<u8> {
        self.offset += 1;
        vec![NULL_REFERENCE]
    }

    fn block(&mut self, name: &str, blobs: &[BlobEvent<'_>]) -> Vec<u8> {
        let min = blobs.iter().map(|b| b.timestamp).min().unwrap_or(0);
        let max = blobs.iter().map(|b| b.timestamp).max().unwrap_or(0);
        let mut content = BLOCK_HEADER_SIZE.to_le_bytes().to_vec();
        content.extend(0u16.to_le_bytes()); // flags: uncompressed blob headers
        content.extend(min.to_le_bytes());
        content.extend(max.to_le_bytes());
        for blob in blobs {
            let padding = (4 - blob.payload.len() % 4) % 4;
            // The fixed fields after the blob size (§4.5), the payload and its padding.
            let size = 76 + blob.payload.len() + padding;
            content.extend((size as u32).to_le_bytes());
            content.extend(blob.metadata_id.to_le_bytes()); // bit 31 clear: sorted
            content.extend(blob.sequence.to_le_bytes());
            content.extend(blob.thread_id.to_le_bytes());
            content.extend(blob.capture_thread_id.to_le_bytes());
            content.extend(blob.processor.to_le_bytes());
            content.extend(0u32.to_le_bytes()); // stack id: none
            content.extend(blob.timestamp.to_le_bytes());
            content.extend(blob.activity_id);
            content.extend(blob.related_activity_id);
            content.extend((blob.payload.len() as u32).to_le_bytes());
            content.extend(blob.payload);
            content.extend(std::iter::repeat_n(0u8, padding));
        }
        self.framed(name, &content)
    }

    /// A block object: framing, block size, padding to a 4-aligned stream offset, content.
    fn framed(&mut self, name: &str, content: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(content.len() + 40);
        object_start(&mut out, name, 2, 2);
        out.extend((content.len() as u32).to_le_bytes());
        let after_size = self.offset + out.len() as u64;
        out.extend(std::iter::repeat_n(0u8, ((4 - after_size % 4) % 4) as usize));
        out.extend(content);
        out.push(END_OBJECT);
        self.offset += out.len() as u64;
        out
    }
}

/// `s` as UTF-16LE with its terminating NUL (how NetTrace writes names).
pub fn utf16z(s: &str) -> Vec<u8> {
    s.encode_utf16().chain([0]).flat_map(u16::to_le_bytes).collect()
}

/// The metadata of a native runtime event, which user_events records never carry: provider,
/// event id, no name, no keywords, `version` (not transmitted either: the caller infers it from
/// the payload, [`super::payload::fitting_version`]), no level, no fields — as the runtime's own
/// streams define them.
pub fn native_event_metadata(provider: &str, event_id: u32, version: u32) -> Vec<u8> {
    let mut bytes = utf16z(provider);
    bytes.extend(event_id.to_le_bytes());
    bytes.extend(utf16z(""));
    bytes.extend(0u64.to_le_bytes()); // keywords
    bytes.extend([version, 0, 0].iter().flat_map(|v| v.to_le_bytes())); // version, level, fields
    bytes
}

/// `05 05 01 <version> <min version> <name length> <name> 06` (§3.2).
fn object_start(out: &mut Vec<u8>, name: &str, version: i32, min_version: i32) {
    out.extend([BEGIN_OBJECT, BEGIN_OBJECT, NULL_REFERENCE]);
    out.extend(version.to_le_bytes());
    out.extend(min_version.to_le_bytes());
    out.extend((name.len() as u32).to_le_bytes());
    out.extend(name.as_bytes());
    out.push(END_OBJECT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nettrace::NettraceParser;

    /// What the writer writes, the project's parser reads back: events with their metadata,
    /// payload bytes, threads, timestamps and sequence numbers, and a clean end.
    #[test]
    fn a_written_stream_parses_back_to_the_same_events() {
        let header = TraceHeader {
            sync_time_utc: [2026, 12, 2, 1, 0, 0, 0, 0],
            sync_timestamp: 1_000,
            timestamp_frequency: 1_000_000_000,
            pointer_size: 8,
            process_id: 42,
            processors: 2,
            sampling_interval_ns: 1_000_000,
        };
        let (mut w, mut stream) = NettraceWriter::start(&header);
        // TestDouble/Tick: Int32 Sequence, String Message (type codes 9 and 18).
        let mut meta = utf16z("TestDouble");
        meta.extend(1u32.to_le_bytes());
        meta.extend(utf16z("Tick"));
        meta.extend(0u64.to_le_bytes());
        meta.extend([0u32, 4, 2].iter().flat_map(|v| v.to_le_bytes()));
        meta.extend(9u32.to_le_bytes());
        meta.extend(utf16z("Sequence"));
        meta.extend(18u32.to_le_bytes());
        meta.extend(utf16z("Message"));
        stream.extend(w.metadata_block(1, &meta, 1_000));
        let payloads: Vec<Vec<u8>> = (1..=3)
            .map(|k: i32| {
                let mut p = k.to_le_bytes().to_vec();
                p.extend(utf16z(&format!("tick {k}")));
                p
            })
            .collect();
        let events: Vec<BlobEvent> = payloads
            .iter()
            .enumerate()
            .map(|(i, payload)| BlobEvent {
                metadata_id: 1,
                sequence: i as u32 + 1,
                thread_id: 7,
                capture_thread_id: 7,
                processor: 0,
                timestamp: 2_000 + i as i64,
                activity_id: [0; 16],
                related_activity_id: [i as u8; 16],
                payload,
            })
            .collect();
        stream.extend(w.event_block(&events[..1]));
        stream.extend(w.event_block(&events[1..]));
        stream.extend(w.sequence_point(3_000, &[(7, 3)]));
        stream.extend(w.end());

        let mut parser = NettraceParser::default();
        let mut seen = Vec::new();
        parser
            .feed(&stream, |ev| {
                let decoded = ev.decode();
                seen.push((
                    decoded.event.to_string(),
                    ev.payload.to_vec(),
                    ev.thread_id,
                    ev.timestamp,
                    ev.sequence,
                    serde_json::to_string(&decoded.fields).unwrap(),
                ));
            })
            .unwrap();
        assert_eq!(parser.finish(), Ok(()));
        assert_eq!(parser.stats().lost_events, 0);
        let expected: Vec<_> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let k = i + 1;
                (
                    "Tick".to_string(),
                    p.clone(),
                    7,
                    2_000 + i as i64,
                    k as u32,
                    format!(r#"{{"Sequence":{k},"Message":"tick {k}"}}"#),
                )
            })
            .collect();
        assert_eq!(seen, expected);
    }
}
