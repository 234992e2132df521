//! Streaming nettrace parser (docs/protocol/nettrace.md): the byte stream a runtime sends after
//! CollectTracing.
//!
//! Feed it chunks of any size with [`NettraceParser::feed`]; it calls back once per event, in
//! stream order, and gives identical results however the stream is split, for work linear in
//! the bytes fed even a byte at a time (a buffered object's header is read again only once
//! enough bytes came to tell more, not on every chunk). Memory is bounded: at most one top-level
//! object (one block, capped by [`Limits::max_block_size`]) is buffered, plus the metadata table
//! and per-thread sequence state, both capped.
//!
//! Every error carries the absolute stream offset of the problem. After an error the parser is
//! poisoned (a corrupt stream cannot be resynchronised) and returns the same error again.

mod cursor;
pub mod fields;
pub mod flat_layout;
pub mod metadata;
pub mod methods;
pub mod payload;
pub mod runtime_events;
mod scalar;
mod sequence;
pub mod stacks;
pub mod writer;

use crate::ordered::OrderedMap;
use std::borrow::Cow;

use serde::Serialize;

use crate::json;
use crate::work;
use cursor::Cursor;
pub use metadata::{EventMetadata, FieldDef, FieldType, MetadataError, MetadataLimits};
pub use payload::{Fields, PayloadError, Value, decode_payload, format_guid, write_payload_json};
use sequence::SequenceTracker;
use stacks::{NamedStack, StackBlockError, StackFrame, StackTable};

/// Caps on what an untrusted stream may make the parser hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest accepted block (the runtime flushes at about 100 KiB).
    pub max_block_size: u32,
    /// Largest metadata id, and so the most metadata entries kept.
    pub max_metadata_id: u32,
    /// Most capture threads tracked for sequence numbers.
    pub max_threads: usize,
    /// Bytes the metadata table may hold ([`EventMetadata::heap_bytes`] summed): with
    /// `max_metadata_id` alone, 100 000 entries of 1 024 long-named fields would be gigabytes.
    pub max_metadata_bytes: usize,
    pub metadata: MetadataLimits,
}

/// Default of [`Limits::max_metadata_bytes`]: a real runtime's metadata for every event of
/// every provider is a few MiB.
pub const MAX_METADATA_BYTES: usize = 16 << 20;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_block_size: 16 << 20,
            max_metadata_id: 100_000,
            max_threads: 65_536,
            max_metadata_bytes: MAX_METADATA_BYTES,
            metadata: MetadataLimits::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NettraceError {
    #[error("offset {offset}: not a nettrace stream (bad prologue)")]
    BadPrologue { offset: u64 },
    #[error("offset {offset}: unexpected serialization tag {tag:#04x}")]
    BadTag { offset: u64, tag: u8 },
    #[error("offset {offset}: object type name of {len} bytes is too long")]
    TypeNameTooLong { offset: u64, len: u32 },
    #[error("offset {offset}: unknown object type {name:?}")]
    UnknownObject { offset: u64, name: String },
    #[error(
        "offset {offset}: {name} needs reader version {min_reader}, this parser reads {supported}"
    )]
    UnsupportedVersion { offset: u64, name: &'static str, min_reader: i32, supported: i32 },
    #[error("offset {offset}: block of {size} bytes exceeds the {max}-byte limit")]
    BlockTooLarge { offset: u64, size: u32, max: u32 },
    #[error("offset {offset}: {what}")]
    Corrupt { offset: u64, what: &'static str },
    #[error("offset {offset}: StackBlock: {problem}")]
    BadStackBlock { offset: u64, problem: StackBlockError },
    #[error("offset {offset}: pointer size {size} is neither 4 nor 8")]
    BadPointerSize { offset: u64, size: u32 },
    #[error("offset {offset}: metadata id {id} is 0 or above the limit of {max}")]
    MetadataIdOutOfRange { offset: u64, id: u32, max: u32 },
    #[error("offset {offset}: metadata table would hold {bytes} bytes, above the limit of {max}")]
    MetadataBudget { offset: u64, bytes: usize, max: usize },
    #[error("offset {offset}: metadata id {id} defined twice")]
    DuplicateMetadata { offset: u64, id: u32 },
    #[error("offset {offset}: event refers to undefined metadata id {id}")]
    UnknownMetadata { offset: u64, id: u32 },
    #[error("offset {offset}: invalid metadata: {source}")]
    Metadata { offset: u64, source: MetadataError },
    #[error("offset {offset}: more than {max} capture threads")]
    TooManyThreads { offset: u64, max: usize },
    #[error("offset {offset}: data after the end-of-stream tag")]
    TrailingData { offset: u64 },
    #[error(
        "offset {offset}: stream ended without the end-of-stream tag ({pending} bytes of an \
         incomplete object); the runtime exited or the connection was cut"
    )]
    Truncated { offset: u64, pending: usize },
}

/// The Trace object (docs/protocol/nettrace.md §3.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceInfo {
    /// Year, Month, DayOfWeek, Day, Hour, Minute, Second, Millisecond (UTC).
    pub sync_time_utc: [u16; 8],
    pub sync_time_qpc: i64,
    pub qpc_frequency: i64,
    pub pointer_size: u32,
    pub process_id: u32,
    pub number_of_processors: u32,
    pub expected_cpu_sampling_rate: u32,
}

/// One event, borrowed from the parser for the duration of the callback.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    pub metadata: &'a EventMetadata,
    pub sequence: u32,
    pub thread_id: u64,
    pub capture_thread_id: u64,
    pub proc_num: u32,
    pub stack_id: u32,
    /// The instruction pointers of the stack `stack_id` names, leaf first; `None` without a
    /// stack, or when no stack of that id was kept ([`stacks`]).
    pub stack: Option<&'a [u64]>,
    /// QPC ticks; CLOCK_MONOTONIC ns on Linux (docs/protocol/nettrace.md §9).
    pub timestamp: i64,
    pub activity_id: [u8; 16],
    pub related_activity_id: [u8; 16],
    pub is_sorted: bool,
    pub payload: &'a [u8],
    pub pointer_size: u32,
    /// Absolute stream offset of the event's header.
    pub offset: u64,
}

/// An event with its payload decoded into fields, for code that inspects them (counters, the
/// stopping event, tests): [`OutputEvent::decode`]. Its serde derive (tests and fuzzing only)
/// is the reference [`OutputEvent::write_json_members`] is checked against.
#[derive(Debug, Clone)]
#[cfg_attr(any(test, feature = "serde-reference"), derive(Serialize))]
pub struct DecodedEvent<'a> {
    pub provider: &'a str,
    pub event: Cow<'a, str>,
    pub id: u32,
    #[cfg_attr(
        any(test, feature = "serde-reference"),
        serde(skip_serializing_if = "Option::is_none")
    )]
    pub version: Option<u32>,
    pub level: u32,
    /// Written in hex (`"0x1"`): u64 keywords do not fit a JSON double.
    #[cfg_attr(any(test, feature = "serde-reference"), serde(serialize_with = "hex_string"))]
    pub keywords: u64,
    pub thread: u64,
    #[cfg_attr(
        any(test, feature = "serde-reference"),
        serde(skip_serializing_if = "Option::is_none")
    )]
    pub sequence: Option<u32>,
    pub timestamp: i64,
    #[cfg_attr(
        any(test, feature = "serde-reference"),
        serde(skip_serializing_if = "Option::is_none")
    )]
    pub activity_id: Option<String>,
    #[cfg_attr(
        any(test, feature = "serde-reference"),
        serde(skip_serializing_if = "Option::is_none")
    )]
    pub related_activity_id: Option<String>,
    /// The stack the runtime captured with the event (its StackBlock id; nettrace only).
    #[cfg_attr(
        any(test, feature = "serde-reference"),
        serde(skip_serializing_if = "Option::is_none")
    )]
    pub stack_id: Option<u32>,
    /// The stack's frames named, leaf first (streaming sessions; see [`OutputEvent::stack`]).
    #[cfg_attr(
        any(test, feature = "serde-reference"),
        serde(skip_serializing_if = "Option::is_none")
    )]
    pub stack: Option<&'a [StackFrame]>,
    pub fields: Fields<'a>,
    /// Set when the payload did not match its layout; `fields` then holds `raw_payload`.
    #[cfg_attr(
        any(test, feature = "serde-reference"),
        serde(skip_serializing_if = "Option::is_none")
    )]
    pub decode_error: Option<String>,
}

#[cfg(test)]
impl<'a> DecodedEvent<'a> {
    /// An event of `provider` named `event` with `fields`, and nothing else of note (tests).
    pub(crate) fn with_fields(provider: &'a str, event: &'a str, fields: Fields<'a>) -> Self {
        DecodedEvent {
            provider,
            event: Cow::Borrowed(event),
            id: 0,
            version: None,
            level: 0,
            keywords: 0,
            thread: 1,
            sequence: None,
            timestamp: 0,
            activity_id: None,
            related_activity_id: None,
            stack_id: None,
            stack: None,
            fields,
            decode_error: None,
        }
    }
}

impl<'a> Event<'a> {
    /// The event on its way to output, its payload not decoded yet.
    pub fn output(&self) -> OutputEvent<'a> {
        OutputEvent {
            metadata: self.metadata,
            payload: self.payload,
            pointer_size: self.pointer_size,
            stack: None,
            rendered_fields: None,
            context: EventContext {
                thread: self.thread_id,
                sequence: Some(self.sequence),
                timestamp: self.timestamp,
                activity_id: self.activity_id,
                related_activity_id: self.related_activity_id,
                stack_id: self.stack_id,
            },
        }
    }

    /// Decodes the payload into fields to inspect (see [`OutputEvent::decode`]).
    pub fn decode(&self) -> DecodedEvent<'a> {
        self.output().decode()
    }
}

/// Per-event facts that come from the transport rather than the metadata.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventContext {
    pub thread: u64,
    pub sequence: Option<u32>,
    pub timestamp: i64,
    pub activity_id: [u8; 16],
    pub related_activity_id: [u8; 16],
    /// 0: no stack.
    pub stack_id: u32,
}

/// An event on its way to output (nettrace or user_events): its metadata, what the transport
/// said of it, and its payload, decoded as the event is written
/// ([`OutputEvent::write_json_members`]: straight into the line, no tree) or, for code that
/// inspects the fields, into a [`DecodedEvent`].
#[derive(Debug, Clone, Copy)]
pub struct OutputEvent<'a> {
    pub metadata: &'a EventMetadata,
    pub payload: &'a [u8],
    pub pointer_size: u32,
    /// The frames of the event's stack, named by the session that read it (written as `stack`,
    /// after `stack_id`); `None`: no `stack` member.
    pub stack: Option<&'a NamedStack>,
    /// The `fields` object, already rendered by a decode that also read some of them
    /// ([`crate::counters::CounterReader::read`]); `None`: decoded as the line is written.
    pub rendered_fields: Option<&'a [u8]>,
    pub context: EventContext,
}

impl<'a> OutputEvent<'a> {
    /// Decodes the payload into fields. A payload that does not fit its layout is kept as hex
    /// with the error, so no event disappears from the output.
    pub fn decode(&self) -> DecodedEvent<'a> {
        let (meta, context) = (self.metadata, &self.context);
        let (fields, decode_error) = match decode_payload(meta, self.payload, self.pointer_size) {
            Ok(fields) => (fields, None),
            Err(e) => {
                let raw = OrderedMap(vec![("raw_payload", Value::Bytes(self.payload.to_vec()))]);
                (raw, Some(e.to_string()))
            }
        };
        let guid = |g: &[u8; 16]| (*g != [0; 16]).then(|| format_guid(g));
        DecodedEvent {
            provider: &meta.provider,
            event: meta.display_name(),
            id: meta.event_id,
            version: meta.version,
            level: meta.level,
            keywords: meta.keywords,
            thread: context.thread,
            sequence: context.sequence,
            timestamp: context.timestamp,
            activity_id: guid(&context.activity_id),
            related_activity_id: guid(&context.related_activity_id),
            stack_id: (context.stack_id != 0).then_some(context.stack_id),
            stack: self.stack.map(NamedStack::frames),
            fields,
            decode_error,
        }
    }

    /// Appends the event as a JSON object of its own (without the envelope of a line).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let start = out.len();
        self.write_json_members(out, None);
        out[start] = b'{';
        out.push(b'}');
    }

    /// Appends the event's members to the object of its line, each after a comma (the
    /// envelope comes first): `,"provider":…,"fields":{…}`, in the order of docs/output.md's
    /// "Line kinds" table, optional members only when present. The same JSON as
    /// [`DecodedEvent`]'s serde form (a differential test checks it), decoded on the way.
    /// `written`: a number `out` already holds that the `timestamp` may repeat (a line's
    /// `mono_ns`), copied rather than formatted again.
    pub fn write_json_members(&self, out: &mut Vec<u8>, written: Option<&json::WrittenU64>) {
        let (meta, context) = (self.metadata, &self.context);
        out.extend_from_slice(meta.json_head.get_or_render(|head| write_json_head(meta, head)));
        // The names are ASCII letters and `_`: written as they are, without escaping.
        out.extend_from_slice(br#","thread":"#);
        json::push_u64(out, context.thread);
        if let Some(sequence) = context.sequence {
            out.extend_from_slice(br#","sequence":"#);
            json::push_u64(out, sequence.into());
        }
        out.extend_from_slice(br#","timestamp":"#);
        match (u64::try_from(context.timestamp), written) {
            (Ok(timestamp), Some(written)) => json::push_u64_again(out, timestamp, written),
            _ => json::push_i64(out, context.timestamp),
        }
        let ids = [
            (&br#","activity_id":"#[..], &context.activity_id),
            (br#","related_activity_id":"#, &context.related_activity_id),
        ];
        for (key, id) in ids {
            if *id != [0; 16] {
                out.extend_from_slice(key);
                payload::push_guid(out, id);
            }
        }
        if context.stack_id != 0 {
            out.extend_from_slice(br#","stack_id":"#);
            json::push_u64(out, context.stack_id.into());
        }
        if let Some(stack) = self.stack {
            stack.write_member(out);
        }
        out.extend_from_slice(br#","fields":"#);
        if let Some(fields) = self.rendered_fields {
            out.extend_from_slice(fields);
        } else if let Err(e) =
            payload::write_payload_json(meta, self.payload, self.pointer_size, out)
        {
            out.extend_from_slice(br#"{"raw_payload":"#);
            json::push_hex_string(out, self.payload);
            out.extend_from_slice(br#"},"decode_error":"#);
            json::push_str(out, &e.to_string());
        }
    }
}

/// The members an event's metadata gives every line of the event: `,"provider":…` to
/// `"keywords"`.
fn write_json_head(meta: &EventMetadata, out: &mut Vec<u8>) {
    // The names are ASCII letters: written as they are, without escaping.
    out.extend_from_slice(br#","provider":"#);
    json::push_str(out, &meta.provider);
    out.extend_from_slice(br#","event":"#);
    json::push_str(out, &meta.display_name());
    out.extend_from_slice(br#","id":"#);
    json::push_u64(out, meta.event_id.into());
    if let Some(version) = meta.version {
        out.extend_from_slice(br#","version":"#);
        json::push_u64(out, version.into());
    }
    out.extend_from_slice(br#","level":"#);
    json::push_u64(out, meta.level.into());
    out.extend_from_slice(br#","keywords":""#);
    json::push_hex_digits(out, meta.keywords);
    out.push(b'"');
}

/// The serde reference's `{:#x}` of a u64.
#[cfg(any(test, feature = "serde-reference"))]
fn hex_string<S: serde::Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{value:#x}"))
}

/// Counters of what the stream contained and lost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NettraceStats {
    pub bytes: u64,
    pub events: u64,
    pub metadata: u64,
    /// Metadata whose field list could not be read: those events keep raw payloads.
    pub metadata_field_errors: u64,
    pub event_blocks: u64,
    pub metadata_blocks: u64,
    pub stack_blocks: u64,
    /// Stacks the stream defined.
    pub stacks: u64,
    /// Stacks not kept ([`stacks::MAX_STACK_FRAMES`] and the table's bounds): events naming them
    /// carry no stack.
    pub stacks_refused: u64,
    pub sequence_points: u64,
    /// Events the runtime numbered but never sent (sequence gaps and sequence points).
    pub lost_events: u64,
}

const PROLOGUE: &[u8; 32] = b"Nettrace\x14\x00\x00\x00!FastSerialization.1";
const TAG_NULL: u8 = 0x01;
const TAG_BEGIN_PRIVATE: u8 = 0x05;
const TAG_END: u8 = 0x06;
/// `05` `05 01` version minReader nameLen — then the name and `06`.
const OBJECT_HEADER_FIXED: usize = 15;
const MAX_TYPE_NAME: u32 = 64;
const TRACE_PAYLOAD: usize = 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Event,
    Metadata,
    Stack,
    SequencePoint,
}

impl BlockKind {
    fn from_name(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"EventBlock" => BlockKind::Event,
            b"MetadataBlock" => BlockKind::Metadata,
            b"StackBlock" => BlockKind::Stack,
            b"SPBlock" => BlockKind::SequencePoint,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            BlockKind::Event => "EventBlock",
            BlockKind::Metadata => "MetadataBlock",
            BlockKind::Stack => "StackBlock",
            BlockKind::SequencePoint => "SPBlock",
        }
    }
}

/// A top-level unit found at the front of the buffered bytes.
#[derive(Debug, Clone, Copy)]
enum Unit {
    Prologue,
    End,
    Trace { payload_at: usize },
    Block { kind: BlockKind, content_at: usize, size: usize },
}

/// What the front of the buffered bytes is, as far as they tell.
#[derive(Debug, Clone, Copy)]
enum Found {
    /// Too short to say: nothing can be decided before `need` bytes are there (each check of a
    /// header decides at a fixed length), so a shorter buffer is not looked at again.
    Incomplete { need: usize },
    /// A unit of `len` bytes, which may be more than are there.
    Unit { len: usize, unit: Unit },
}

/// The most bytes [`NettraceParser::find_unit`] reads to learn a unit's length: an object's
/// fixed header, its longest type name, the end tag and a block's size.
const UNIT_HEADER_MAX: usize = OBJECT_HEADER_FIXED + MAX_TYPE_NAME as usize + 1 + 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Prologue,
    Objects,
    Ended,
}

/// Streaming nettrace parser; see the module documentation.
pub struct NettraceParser {
    limits: Limits,
    state: State,
    /// Absolute stream offset of `pending[0]` (or of the next byte when `pending` is empty).
    offset: u64,
    /// Bytes of an incomplete unit; never more than one unit.
    pending: Vec<u8>,
    /// How many bytes `pending` must hold before it is looked at again: the unit's length once
    /// its header was read (`pending_unit`), else the length at which more of the header can be
    /// checked. A chunk that does not reach it is only appended, so feeding a stream in small
    /// chunks reads each header a bounded number of times, not once per chunk.
    pending_need: usize,
    /// The unit `pending` starts, once its header was read.
    pending_unit: Option<Unit>,
    trace: Option<TraceInfo>,
    /// Indexed by metadata id (ids are dense, starting at 1).
    metadata: Vec<Option<Box<EventMetadata>>>,
    /// [`EventMetadata::heap_bytes`] of the table's entries.
    metadata_bytes: usize,
    sequences: SequenceTracker,
    /// The stacks defined since the last sequence point.
    stacks: StackTable,
    stats: NettraceStats,
    failed: Option<NettraceError>,
}

impl Default for NettraceParser {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl NettraceParser {
    pub fn new(limits: Limits) -> Self {
        NettraceParser {
            limits,
            state: State::Prologue,
            offset: 0,
            pending: Vec::new(),
            pending_need: 0,
            pending_unit: None,
            trace: None,
            metadata: Vec::new(),
            metadata_bytes: 0,
            sequences: SequenceTracker::new(limits.max_threads),
            stacks: StackTable::default(),
            stats: NettraceStats::default(),
            failed: None,
        }
    }

    /// The Trace object, once parsed.
    pub fn trace(&self) -> Option<&TraceInfo> {
        self.trace.as_ref()
    }

    pub fn stats(&self) -> NettraceStats {
        NettraceStats { lost_events: self.sequences.total_lost(), ..self.stats.clone() }
    }

    /// (capture thread id, lost events) for every thread that lost events.
    pub fn lost_by_thread(&self) -> Vec<(u64, u64)> {
        self.sequences.lost_by_thread()
    }

    /// Bytes the metadata table holds ([`EventMetadata::heap_bytes`] summed; at most
    /// [`Limits::max_metadata_bytes`]).
    pub fn metadata_bytes(&self) -> usize {
        self.metadata_bytes
    }

    /// Bytes the stack table holds (at most [`stacks::MAX_STACK_TABLE_FRAMES`] frames and
    /// [`stacks::MAX_STACKS`] ids).
    pub fn stack_bytes(&self) -> usize {
        self.stacks.heap_bytes()
    }

    /// Bytes held for an incomplete object (never more than one object).
    pub fn buffered(&self) -> usize {
        self.pending.len()
    }

    /// True once the end-of-stream tag was read.
    pub fn is_complete(&self) -> bool {
        self.state == State::Ended
    }

    /// Parses `data`, calling `on_event` for every complete event.
    pub fn feed(
        &mut self,
        mut data: &[u8],
        mut on_event: impl FnMut(&Event<'_>),
    ) -> Result<(), NettraceError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.stats.bytes += data.len() as u64;
        let result = self.feed_inner(&mut data, &mut on_event);
        if let Err(e) = &result {
            self.failed = Some(e.clone());
        }
        result
    }

    /// Call at end of input: an error when the stream ended before the end-of-stream tag.
    pub fn finish(&self) -> Result<(), NettraceError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.state {
            State::Ended => Ok(()),
            _ => Err(NettraceError::Truncated {
                offset: self.offset + self.pending.len() as u64,
                pending: self.pending.len(),
            }),
        }
    }

    fn feed_inner<F: FnMut(&Event<'_>)>(
        &mut self,
        data: &mut &[u8],
        on_event: &mut F,
    ) -> Result<(), NettraceError> {
        // Complete a unit started by an earlier chunk, copying only what it still needs.
        while !self.pending.is_empty() {
            let take = self.pending_need.saturating_sub(self.pending.len()).min(data.len());
            work::count(take);
            self.pending.extend_from_slice(&data[..take]);
            *data = &data[take..];
            if self.pending.len() < self.pending_need {
                return Ok(());
            }
            let found = match self.pending_unit {
                Some(unit) => Found::Unit { len: self.pending_need, unit },
                None => self.find_unit(&self.pending, self.offset)?,
            };
            match found {
                Found::Unit { len, unit } if self.pending.len() >= len => {
                    let pending = std::mem::take(&mut self.pending);
                    self.process(&pending[..len], unit, on_event)?;
                    self.pending = pending;
                    self.pending.drain(..len);
                    self.offset += len as u64;
                    (self.pending_need, self.pending_unit) = (0, None);
                }
                Found::Unit { len, unit } => {
                    (self.pending_need, self.pending_unit) = (len, Some(unit))
                }
                Found::Incomplete { need } => self.pending_need = need,
            }
        }
        // Fast path: whole units straight from the caller's buffer.
        while !data.is_empty() {
            match self.find_unit(data, self.offset)? {
                Found::Unit { len, unit } if data.len() >= len => {
                    self.process(&data[..len], unit, on_event)?;
                    *data = &data[len..];
                    self.offset += len as u64;
                }
                found => {
                    // The start of a unit: kept with what it needs.
                    (self.pending_need, self.pending_unit) = match found {
                        Found::Unit { len, unit } => (len, Some(unit)),
                        Found::Incomplete { need } => (need, None),
                    };
                    work::count(data.len());
                    self.pending.extend_from_slice(data);
                    *data = &[];
                }
            }
        }
        Ok(())
    }

    /// Finds the unit at the front of `buf` (at absolute offset `at`), from at most
    /// [`UNIT_HEADER_MAX`] of its bytes.
    fn find_unit(&self, buf: &[u8], at: u64) -> Result<Found, NettraceError> {
        work::count(buf.len().min(UNIT_HEADER_MAX));
        match self.state {
            State::Prologue => {
                let n = buf.len().min(PROLOGUE.len());
                if buf[..n] != PROLOGUE[..n] {
                    let bad = buf.iter().zip(PROLOGUE).position(|(a, b)| a != b).unwrap_or(0);
                    return Err(NettraceError::BadPrologue { offset: at + bad as u64 });
                }
                // Every byte of the prologue can be the wrong one.
                Ok(match n == PROLOGUE.len() {
                    true => Found::Unit { len: PROLOGUE.len(), unit: Unit::Prologue },
                    false => Found::Incomplete { need: n + 1 },
                })
            }
            State::Ended => match buf.is_empty() {
                true => Ok(Found::Incomplete { need: 1 }),
                false => Err(NettraceError::TrailingData { offset: at }),
            },
            State::Objects => self.find_object(buf, at),
        }
    }

    fn find_object(&self, buf: &[u8], at: u64) -> Result<Found, NettraceError> {
        let Some(&tag) = buf.first() else { return Ok(Found::Incomplete { need: 1 }) };
        match tag {
            TAG_NULL => return Ok(Found::Unit { len: 1, unit: Unit::End }),
            TAG_BEGIN_PRIVATE => {}
            _ => return Err(NettraceError::BadTag { offset: at, tag }),
        }
        for (i, expected) in [(1, TAG_BEGIN_PRIVATE), (2, TAG_NULL)] {
            match buf.get(i) {
                Some(&tag) if tag != expected => {
                    return Err(NettraceError::BadTag { offset: at + i as u64, tag });
                }
                Some(_) => {}
                None => return Ok(Found::Incomplete { need: i + 1 }),
            }
        }
        let Some(fixed) = buf.get(..OBJECT_HEADER_FIXED) else {
            return Ok(Found::Incomplete { need: OBJECT_HEADER_FIXED });
        };
        let name_len = u32::from_le_bytes(fixed[11..15].try_into().expect("4 bytes"));
        if name_len > MAX_TYPE_NAME {
            return Err(NettraceError::TypeNameTooLong { offset: at + 11, len: name_len });
        }
        let header_len = OBJECT_HEADER_FIXED + name_len as usize + 1;
        let Some(header) = buf.get(..header_len) else {
            return Ok(Found::Incomplete { need: header_len });
        };
        if header[header_len - 1] != TAG_END {
            let offset = at + header_len as u64 - 1;
            return Err(NettraceError::BadTag { offset, tag: header[header_len - 1] });
        }
        let name = &header[OBJECT_HEADER_FIXED..header_len - 1];
        let min_reader = i32::from_le_bytes(fixed[7..11].try_into().expect("4 bytes"));
        if name == b"Trace" {
            check_version(at + 7, "Trace", min_reader, 5)?;
            let unit = Unit::Trace { payload_at: header_len };
            return Ok(Found::Unit { len: header_len + TRACE_PAYLOAD + 1, unit });
        }
        let Some(kind) = BlockKind::from_name(name) else {
            let name = String::from_utf8_lossy(name).into_owned();
            return Err(NettraceError::UnknownObject { offset: at, name });
        };
        check_version(at + 7, kind.name(), min_reader, 2)?;
        let Some(size) = buf.get(header_len..header_len + 4) else {
            return Ok(Found::Incomplete { need: header_len + 4 });
        };
        let size = u32::from_le_bytes(size.try_into().expect("4 bytes"));
        if size > self.limits.max_block_size {
            let offset = at + header_len as u64;
            return Err(NettraceError::BlockTooLarge {
                offset,
                size,
                max: self.limits.max_block_size,
            });
        }
        // Block content is 4-byte aligned in the *stream*, prologue included
        // (docs/protocol/nettrace.md §4.1).
        let after_size = at + header_len as u64 + 4;
        let padding = (after_size.wrapping_neg() % 4) as usize;
        let content_at = header_len + 4 + padding;
        let size = size as usize;
        Ok(Found::Unit { len: content_at + size + 1, unit: Unit::Block { kind, content_at, size } })
    }

    /// Handles one complete unit; `unit_bytes` holds exactly its bytes, starting at `self.offset`.
    fn process<F: FnMut(&Event<'_>)>(
        &mut self,
        unit_bytes: &[u8],
        unit: Unit,
        on_event: &mut F,
    ) -> Result<(), NettraceError> {
        work::count(unit_bytes.len());
        let at = self.offset;
        let end_tag = |pos: usize| match unit_bytes[pos] {
            TAG_END => Ok(()),
            tag => Err(NettraceError::BadTag { offset: at + pos as u64, tag }),
        };
        match unit {
            Unit::Prologue => self.state = State::Objects,
            Unit::End => self.state = State::Ended,
            Unit::Trace { payload_at } => {
                end_tag(payload_at + TRACE_PAYLOAD)?;
                if self.trace.is_some() {
                    return Err(NettraceError::Corrupt { offset: at, what: "second Trace object" });
                }
                self.trace = Some(parse_trace(&unit_bytes[payload_at..], at + payload_at as u64)?);
            }
            Unit::Block { kind, content_at, size } => {
                end_tag(content_at + size)?;
                let Some(trace) = &self.trace else {
                    return Err(NettraceError::Corrupt { offset: at, what: "block before Trace" });
                };
                let pointer_size = trace.pointer_size;
                let content = &unit_bytes[content_at..content_at + size];
                let content_offset = at + content_at as u64;
                match kind {
                    BlockKind::Metadata => {
                        self.stats.metadata_blocks += 1;
                        self.metadata_block(content, content_offset)?;
                    }
                    BlockKind::Event => {
                        self.stats.event_blocks += 1;
                        self.event_block(content, content_offset, pointer_size, on_event)?;
                    }
                    BlockKind::Stack => {
                        self.stats.stack_blocks += 1;
                        let (defined, refused) =
                            self.stacks.block(content, content_offset, pointer_size)?;
                        self.stats.stacks += defined;
                        self.stats.stacks_refused += refused;
                    }
                    BlockKind::SequencePoint => {
                        self.stats.sequence_points += 1;
                        self.sequence_point(content, content_offset)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn metadata_block(&mut self, content: &[u8], base: u64) -> Result<(), NettraceError> {
        let limits = self.limits;
        let table = &mut self.metadata;
        let stats = &mut self.stats;
        let used = &mut self.metadata_bytes;
        for_each_blob(content, base, |_, payload, offset| {
            let meta = metadata::parse_nettrace_metadata(payload, &limits.metadata)
                .map_err(|source| NettraceError::Metadata { offset, source })?;
            let id = meta.metadata_id;
            if id == 0 || id > limits.max_metadata_id {
                return Err(NettraceError::MetadataIdOutOfRange {
                    offset,
                    id,
                    max: limits.max_metadata_id,
                });
            }
            let slot = id as usize;
            if table.len() <= slot {
                table.resize_with(slot + 1, || None);
            }
            if table[slot].is_some() {
                return Err(NettraceError::DuplicateMetadata { offset, id });
            }
            let bytes = used.saturating_add(meta.heap_bytes());
            if bytes > limits.max_metadata_bytes {
                let max = limits.max_metadata_bytes;
                return Err(NettraceError::MetadataBudget { offset, bytes, max });
            }
            *used = bytes;
            stats.metadata_field_errors += u64::from(meta.field_error.is_some());
            table[slot] = Some(Box::new(meta));
            stats.metadata += 1;
            Ok(())
        })
    }

    fn event_block<F: FnMut(&Event<'_>)>(
        &mut self,
        content: &[u8],
        base: u64,
        pointer_size: u32,
        on_event: &mut F,
    ) -> Result<(), NettraceError> {
        let table = &self.metadata;
        let stacks = &self.stacks;
        let sequences = &mut self.sequences;
        let events = &mut self.stats.events;
        for_each_blob(content, base, |header, payload, offset| {
            let id = header.metadata_id;
            let Some(metadata) = table.get(id as usize).and_then(|m| m.as_deref()) else {
                return Err(NettraceError::UnknownMetadata { offset, id });
            };
            sequences
                .observe(header.capture_thread_id, header.sequence)
                .map_err(|max| NettraceError::TooManyThreads { offset, max })?;
            *events += 1;
            on_event(&Event {
                metadata,
                sequence: header.sequence,
                thread_id: header.thread_id,
                capture_thread_id: header.capture_thread_id,
                proc_num: header.proc_num,
                stack_id: header.stack_id,
                stack: match header.stack_id {
                    0 => None,
                    id => stacks.get(id),
                },
                timestamp: header.timestamp,
                activity_id: header.activity_id,
                related_activity_id: header.related_activity_id,
                is_sorted: header.is_sorted,
                payload,
                pointer_size,
                offset,
            });
            Ok(())
        })
    }

    fn sequence_point(&mut self, content: &[u8], base: u64) -> Result<(), NettraceError> {
        let mut cur = Cursor::new(content);
        let corrupt =
            |cur: &Cursor, what| NettraceError::Corrupt { offset: base + cur.pos() as u64, what };
        cur.i64().ok_or_else(|| corrupt(&cur, "SPBlock: truncated timestamp"))?;
        let count = cur.u32().ok_or_else(|| corrupt(&cur, "SPBlock: truncated thread count"))?;
        for _ in 0..count {
            let offset = base + cur.pos() as u64;
            let thread = cur.u64().ok_or_else(|| corrupt(&cur, "SPBlock: truncated thread id"))?;
            let seq = cur.u32().ok_or_else(|| corrupt(&cur, "SPBlock: truncated sequence"))?;
            self.sequences
                .sequence_point(thread, seq)
                .map_err(|max| NettraceError::TooManyThreads { offset, max })?;
        }
        // Stack ids start over after a sequence point (docs/protocol/nettrace.md §4.7).
        self.stacks.clear();
        Ok(())
    }
}

fn check_version(
    offset: u64,
    name: &'static str,
    min_reader: i32,
    supported: i32,
) -> Result<(), NettraceError> {
    if min_reader > supported {
        return Err(NettraceError::UnsupportedVersion { offset, name, min_reader, supported });
    }
    Ok(())
}

fn parse_trace(bytes: &[u8], at: u64) -> Result<TraceInfo, NettraceError> {
    let mut cur = Cursor::new(bytes);
    let truncated = NettraceError::Corrupt { offset: at, what: "truncated Trace object" };
    let mut sync_time_utc = [0u16; 8];
    for v in &mut sync_time_utc {
        *v = cur.u16().ok_or(truncated.clone())?;
    }
    let sync_time_qpc = cur.i64().ok_or(truncated.clone())?;
    let qpc_frequency = cur.i64().ok_or(truncated.clone())?;
    let pointer_size = cur.u32().ok_or(truncated.clone())?;
    let process_id = cur.u32().ok_or(truncated.clone())?;
    let number_of_processors = cur.u32().ok_or(truncated.clone())?;
    let expected_cpu_sampling_rate = cur.u32().ok_or(truncated)?;
    if pointer_size != 4 && pointer_size != 8 {
        return Err(NettraceError::BadPointerSize { offset: at + 32, size: pointer_size });
    }
    Ok(TraceInfo {
        sync_time_utc,
        sync_time_qpc,
        qpc_frequency,
        pointer_size,
        process_id,
        number_of_processors,
        expected_cpu_sampling_rate,
    })
}

/// Header fields of one blob in an EventBlock or MetadataBlock (docs/protocol/nettrace.md §4.4,
/// §4.5).
#[derive(Debug, Clone, Copy, Default)]
struct BlobHeader {
    metadata_id: u32,
    sequence: u32,
    thread_id: u64,
    capture_thread_id: u64,
    proc_num: u32,
    stack_id: u32,
    timestamp: i64,
    activity_id: [u8; 16],
    related_activity_id: [u8; 16],
    is_sorted: bool,
    payload_size: u32,
}

const FLAG_COMPRESSED: u16 = 0x01;
const MIN_BLOCK_HEADER: u16 = 20;

/// Walks the blobs of an EventBlock or MetadataBlock, calling `f(header, payload, offset)`.
fn for_each_blob(
    content: &[u8],
    base: u64,
    mut f: impl FnMut(&BlobHeader, &[u8], u64) -> Result<(), NettraceError>,
) -> Result<(), NettraceError> {
    let mut cur = Cursor::new(content);
    let header_size =
        cur.u16().ok_or(NettraceError::Corrupt { offset: base, what: "block header truncated" })?;
    let flags =
        cur.u16().ok_or(NettraceError::Corrupt { offset: base, what: "block header truncated" })?;
    if header_size < MIN_BLOCK_HEADER || header_size as usize > content.len() {
        return Err(NettraceError::Corrupt {
            offset: base,
            what: "block header size out of range",
        });
    }
    cur.take(header_size as usize - 4);
    let compressed = flags & FLAG_COMPRESSED != 0;
    // Compressed headers are deltas against the previous blob: decode in place.
    let mut header = BlobHeader::default();
    while cur.remaining() > 0 {
        let offset = base + cur.pos() as u64;
        let payload = if compressed {
            read_compressed(&mut cur, &mut header)
        } else {
            read_uncompressed(&mut cur, &mut header)
        }
        .ok_or(NettraceError::Corrupt {
            offset,
            what: "event header or payload exceeds its block",
        })?;
        f(&header, payload, offset)?;
    }
    Ok(())
}

/// Reads one compressed header over `h`, which holds the previous blob's values
/// (docs/protocol/nettrace.md §4.4).
#[inline]
fn read_compressed<'a>(cur: &mut Cursor<'a>, h: &mut BlobHeader) -> Option<&'a [u8]> {
    let flags = cur.u8()?;
    if flags & 0x01 != 0 {
        h.metadata_id = cur.varuint32()?;
    }
    if flags & 0x02 != 0 {
        // The writer stores `seq - prev_seq - 1` (docs/protocol/nettrace.md §4.4).
        h.sequence = h.sequence.wrapping_add(cur.varuint32()?).wrapping_add(1);
        h.capture_thread_id = cur.varuint64()?;
        h.proc_num = cur.varuint32()?;
    } else if h.metadata_id != 0 {
        h.sequence = h.sequence.wrapping_add(1);
    }
    if flags & 0x04 != 0 {
        h.thread_id = cur.varuint64()?;
    }
    if flags & 0x08 != 0 {
        h.stack_id = cur.varuint32()?;
    }
    h.timestamp = h.timestamp.wrapping_add(cur.varuint64()? as i64);
    if flags & 0x10 != 0 {
        h.activity_id = cur.guid()?;
    }
    if flags & 0x20 != 0 {
        h.related_activity_id = cur.guid()?;
    }
    h.is_sorted = flags & 0x40 != 0;
    if flags & 0x80 != 0 {
        h.payload_size = cur.varuint32()?;
    }
    cur.take(h.payload_size as usize)
}

/// Fixed header size after EventSize (docs/protocol/nettrace.md §4.5).
const UNCOMPRESSED_FIXED: usize = 4 + 4 + 8 + 8 + 4 + 4 + 8 + 16 + 16 + 4;

fn read_uncompressed<'a>(cur: &mut Cursor<'a>, h: &mut BlobHeader) -> Option<&'a [u8]> {
    let size = cur.u32()? as usize;
    let mut blob = Cursor::new(cur.take(size)?);
    let raw_metadata_id = blob.u32()?;
    *h = BlobHeader {
        metadata_id: raw_metadata_id & 0x7fff_ffff,
        is_sorted: raw_metadata_id & 0x8000_0000 == 0,
        sequence: blob.u32()?,
        thread_id: blob.u64()?,
        capture_thread_id: blob.u64()?,
        proc_num: blob.u32()?,
        stack_id: blob.u32()?,
        timestamp: blob.i64()?,
        activity_id: blob.guid()?,
        related_activity_id: blob.guid()?,
        payload_size: blob.u32()?,
    };
    debug_assert_eq!(blob.pos(), UNCOMPRESSED_FIXED);
    blob.take(h.payload_size as usize) // the rest of EventSize is alignment padding
}

#[cfg(test)]
mod tests;
