//! .NET user_events records, "Tracepoint Format Version 1" (docs/protocol/user_events.md §7.2–7.5):
//! `u8 version; u16 event_id; __rel_loc u8[] extension; __rel_loc u8[] payload`.
//!
//! The field offsets come from the tracepoint's format file (parsed elsewhere) and are passed in
//! as a [`RecordLayout`]. Payloads are decoded by the nettrace metadata/payload code, so
//! EventSource events and native runtime events decode the same way in both session kinds.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use crate::nettrace::metadata::{self, EventMetadata, MetadataError, MetadataLimits};

/// Byte offsets of the four fields inside a trace record (common header included), as the
/// tracepoint's `format` file gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLayout {
    pub version: usize,
    pub event_id: usize,
    pub extension: usize,
    pub payload: usize,
}

impl RecordLayout {
    /// The offsets from a tracepoint's format (`version`, `event_id`, `extension`, `payload`);
    /// `None` when a field is missing or has another shape than the runtime's field list.
    pub fn from_format(format: &crate::ftrace::format::EventFormat) -> Option<RecordLayout> {
        use crate::ftrace::format::DynamicKind;
        let field = |name: &str, size: usize, dynamic: Option<DynamicKind>| {
            format.field(name).filter(|f| f.size == size && f.dynamic == dynamic).map(|f| f.offset)
        };
        Some(RecordLayout {
            version: field("version", 1, None)?,
            event_id: field("event_id", 2, None)?,
            extension: field("extension", 4, Some(DynamicKind::RelLoc))?,
            payload: field("payload", 4, Some(DynamicKind::RelLoc))?,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserEventsError {
    #[error("record byte {offset}: field {field} lies outside the {len}-byte record")]
    FieldOutsideRecord { field: &'static str, offset: usize, len: usize },
    #[error("record version {version} is not 1")]
    UnsupportedVersion { version: u8 },
    #[error("__rel_loc {field} points at bytes {start}..{end}, outside the {len}-byte record")]
    RelLocOutsideRecord { field: &'static str, start: usize, end: usize, len: usize },
    #[error("extension byte {at}: metadata: {source}")]
    Metadata { at: usize, source: MetadataError },
    #[error("extension byte {at}: metadata is for event {found}, the record is event {expected}")]
    MetadataEventMismatch { at: usize, found: u32, expected: u16 },
}

/// Why extension parsing stopped early (the record itself is still usable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtensionProblem {
    UnknownLabel {
        at: usize,
        label: u8,
    },
    TruncatedLabel {
        at: usize,
        label: u8,
    },
    /// More than the three labels the runtime writes.
    TooManyLabels {
        at: usize,
    },
}

/// A parsed record; `payload` borrows the record bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<'a> {
    pub event_id: u16,
    pub metadata: Option<EventMetadata>,
    /// The metadata label's bytes in the NetTrace form (provider name UTF-16Z, then the body
    /// from the event id on; the early form without the provider gets it prepended): what a
    /// `.nettrace` file of the session defines the event with.
    pub metadata_bytes: Option<Cow<'a, [u8]>>,
    pub activity_id: Option<[u8; 16]>,
    pub related_activity_id: Option<[u8; 16]>,
    pub extension_problem: Option<ExtensionProblem>,
    pub payload: &'a [u8],
}

const LABEL_METADATA: u8 = 0x01;
const LABEL_ACTIVITY: u8 = 0x02;
const LABEL_RELATED_ACTIVITY: u8 = 0x03;
const MAX_LABELS: usize = 3;

/// Parses one record. `provider` names the tracepoint's provider; it is used when the metadata
/// label is the early form without a provider name.
pub fn parse_record<'a>(
    layout: &RecordLayout,
    record: &'a [u8],
    provider: &str,
    limits: &MetadataLimits,
) -> Result<Record<'a>, UserEventsError> {
    let len = record.len();
    let field =
        |name: &'static str, offset: usize, size: usize| {
            record
                .get(offset..offset.saturating_add(size))
                .ok_or(UserEventsError::FieldOutsideRecord { field: name, offset, len })
        };
    let version = field("version", layout.version, 1)?[0];
    if version != 1 {
        return Err(UserEventsError::UnsupportedVersion { version });
    }
    let event_id =
        u16::from_le_bytes(field("event_id", layout.event_id, 2)?.try_into().expect("2 bytes"));
    let rel_loc = |name: &'static str, offset: usize| -> Result<&'a [u8], UserEventsError> {
        let raw = u32::from_le_bytes(field(name, offset, 4)?.try_into().expect("4 bytes"));
        // Low 16 bits: offset from the end of the 4-byte field; high 16 bits: length.
        let start = offset + 4 + (raw & 0xffff) as usize;
        let end = start + (raw >> 16) as usize;
        record.get(start..end).ok_or(UserEventsError::RelLocOutsideRecord {
            field: name,
            start,
            end,
            len,
        })
    };
    let extension = rel_loc("extension", layout.extension)?;
    let payload = rel_loc("payload", layout.payload)?;

    let mut parsed = Record {
        event_id,
        metadata: None,
        metadata_bytes: None,
        activity_id: None,
        related_activity_id: None,
        extension_problem: None,
        payload,
    };
    let mut at = 0;
    for index in 0.. {
        let Some(&label) = extension.get(at) else { break };
        if index == MAX_LABELS {
            parsed.extension_problem = Some(ExtensionProblem::TooManyLabels { at });
            break;
        }
        let data = &extension[at + 1..];
        let truncated = Some(ExtensionProblem::TruncatedLabel { at, label });
        match label {
            LABEL_METADATA => {
                let Some(size) = data.get(..4) else {
                    parsed.extension_problem = truncated;
                    break;
                };
                let size = u32::from_le_bytes(size.try_into().expect("4 bytes")) as usize;
                let Some(body) = data.get(4..4 + size) else {
                    parsed.extension_problem = truncated;
                    break;
                };
                let (meta, with_provider) =
                    parse_metadata(body, at + 5, event_id, provider, limits)?;
                parsed.metadata_bytes = Some(if with_provider {
                    Cow::Borrowed(body)
                } else {
                    let mut bytes = crate::nettrace::writer::utf16z(provider);
                    bytes.extend_from_slice(body);
                    Cow::Owned(bytes)
                });
                parsed.metadata = Some(meta);
                at += 1 + 4 + size;
            }
            LABEL_ACTIVITY | LABEL_RELATED_ACTIVITY => {
                let Some(guid) = data.get(..16) else {
                    parsed.extension_problem = truncated;
                    break;
                };
                let guid = Some(guid.try_into().expect("16 bytes"));
                if label == LABEL_ACTIVITY {
                    parsed.activity_id = guid;
                } else {
                    parsed.related_activity_id = guid;
                }
                at += 1 + 16;
            }
            _ => {
                parsed.extension_problem = Some(ExtensionProblem::UnknownLabel { at, label });
                break;
            }
        }
    }
    Ok(parsed)
}

/// Metadata label body: provider name UTF-16Z + NetTrace V5 body (since dotnet/runtime
/// PR #118294), or the body alone (PR #115265). The form whose event id matches the record wins;
/// also returns whether that was the form with the provider name.
fn parse_metadata(
    body: &[u8],
    at: usize,
    event_id: u16,
    provider: &str,
    limits: &MetadataLimits,
) -> Result<(EventMetadata, bool), UserEventsError> {
    let with_provider = metadata::parse_provider_prefix(body, limits)
        .and_then(|(name, used)| metadata::parse_metadata_body(&body[used..], name, limits));
    if let Ok(meta) = &with_provider
        && meta.event_id == u32::from(event_id)
    {
        return with_provider
            .map(|meta| (meta, true))
            .map_err(|source| UserEventsError::Metadata { at, source });
    }
    let bare = metadata::parse_metadata_body(body, provider.to_owned(), limits);
    match (bare, with_provider) {
        (Ok(meta), _) if meta.event_id == u32::from(event_id) => Ok((meta, false)),
        (Ok(meta), _) | (_, Ok(meta)) => Err(UserEventsError::MetadataEventMismatch {
            at,
            found: meta.event_id,
            expected: event_id,
        }),
        (Err(_), Err(source)) => Err(UserEventsError::Metadata { at, source }),
    }
}

/// Default of the cache's total byte bound ([`EventMetadata::heap_bytes`] summed).
pub const CACHE_MAX_BYTES: usize = 64 << 20;
/// Default of the cache's byte bound per process: one peer cannot fill the cache for others.
pub const CACHE_MAX_BYTES_PER_PROCESS: usize = 16 << 20;

/// Metadata per (pid, tracepoint, event id): the runtime sends it only with an event's first
/// record in a session, so it must outlive that record. Bounded in entries and in bytes (in
/// total and per process); refusals are counted.
#[derive(Debug)]
pub struct MetadataCache {
    by_tracepoint: HashMap<String, HashMap<(u32, u16), Arc<EventMetadata>>>,
    entries: usize,
    max_entries: usize,
    bytes: usize,
    max_bytes: usize,
    bytes_by_pid: HashMap<u32, usize>,
    max_bytes_per_process: usize,
    refused: u64,
}

impl MetadataCache {
    /// A cache of at most `max_entries`, [`CACHE_MAX_BYTES`] and [`CACHE_MAX_BYTES_PER_PROCESS`].
    pub fn new(max_entries: usize) -> Self {
        Self::with_byte_limits(max_entries, CACHE_MAX_BYTES, CACHE_MAX_BYTES_PER_PROCESS)
    }

    pub fn with_byte_limits(
        max_entries: usize,
        max_bytes: usize,
        max_bytes_per_process: usize,
    ) -> Self {
        MetadataCache {
            by_tracepoint: HashMap::new(),
            entries: 0,
            max_entries,
            bytes: 0,
            max_bytes,
            bytes_by_pid: HashMap::new(),
            max_bytes_per_process,
            refused: 0,
        }
    }

    /// Stores `meta`, replacing an earlier entry (the runtime may repeat metadata). Returns
    /// false, and counts a refusal, when the cache is full (entries, bytes, or the process's
    /// bytes); a refused replacement keeps the earlier entry.
    pub fn insert(
        &mut self,
        pid: u32,
        tracepoint: &str,
        event_id: u16,
        meta: EventMetadata,
    ) -> bool {
        let per_tracepoint = self.by_tracepoint.entry(tracepoint.to_owned()).or_default();
        let old = per_tracepoint.get(&(pid, event_id)).map(|m| m.heap_bytes());
        let size = meta.heap_bytes();
        let process = self.bytes_by_pid.get(&pid).copied().unwrap_or(0);
        let fits = (old.is_some() || self.entries < self.max_entries)
            && self.bytes - old.unwrap_or(0) + size <= self.max_bytes
            && process - old.unwrap_or(0) + size <= self.max_bytes_per_process;
        if !fits {
            self.refused += 1;
            self.by_tracepoint.retain(|_, m| !m.is_empty());
            return false;
        }
        self.entries += usize::from(old.is_none());
        self.bytes = self.bytes - old.unwrap_or(0) + size;
        self.bytes_by_pid.insert(pid, process - old.unwrap_or(0) + size);
        per_tracepoint.insert((pid, event_id), Arc::new(meta));
        true
    }

    /// Bytes held ([`EventMetadata::heap_bytes`] summed).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn get(&self, pid: u32, tracepoint: &str, event_id: u16) -> Option<&Arc<EventMetadata>> {
        self.by_tracepoint.get(tracepoint)?.get(&(pid, event_id))
    }

    /// Drops a process's entries (on exit or exec).
    pub fn forget_process(&mut self, pid: u32) {
        for per_tracepoint in self.by_tracepoint.values_mut() {
            let before = per_tracepoint.len();
            per_tracepoint.retain(|&(p, _), _| p != pid);
            self.entries -= before - per_tracepoint.len();
        }
        self.by_tracepoint.retain(|_, m| !m.is_empty());
        self.bytes -= self.bytes_by_pid.remove(&pid).unwrap_or(0);
    }

    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Insertions refused because the cache was full.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The metadata for `record`: its own (cached for later records), the cached one, or — for
    /// native runtime events, which never carry metadata — one built from provider and id.
    pub fn resolve(
        &mut self,
        pid: u32,
        tracepoint: &str,
        provider: &str,
        record: &mut Record<'_>,
    ) -> Arc<EventMetadata> {
        if let Some(meta) = record.metadata.take() {
            self.insert(pid, tracepoint, record.event_id, meta.clone());
            return self
                .get(pid, tracepoint, record.event_id)
                .cloned()
                .unwrap_or_else(|| Arc::new(meta));
        }
        if let Some(meta) = self.get(pid, tracepoint, record.event_id) {
            return meta.clone();
        }
        Arc::new(EventMetadata::native(provider, record.event_id.into()))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn layout_from_the_kernels_format_of_the_runtime_field_list() {
        use crate::ftrace::format::EventFormat;
        // As the 6.12 kernel prints `events/user_events/<name>/format` for the runtime's fields.
        let text = "name: tp\nID: 1600\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:u8 version;\toffset:8;\tsize:1;\tsigned:0;\n\tfield:u16 event_id;\toffset:9;\tsize:2;\tsigned:0;\n\tfield:__rel_loc u8[] extension;\toffset:11;\tsize:4;\tsigned:0;\n\tfield:__rel_loc u8[] payload;\toffset:15;\tsize:4;\tsigned:0;\n\nprint fmt: \"\"\n";
        let format = EventFormat::parse(text).unwrap();
        assert_eq!(RecordLayout::from_format(&format), Some(LAYOUT));
        let other =
            EventFormat::parse(&text.replace("__rel_loc u8[] payload", "u32 payload")).unwrap();
        assert_eq!(RecordLayout::from_format(&other), None);
    }
    use super::*;
    use crate::nettrace::{EventContext, OutputEvent, decode_payload};

    /// Offsets the kernel gives for the runtime's field string after the 8-byte common header.
    const LAYOUT: RecordLayout =
        RecordLayout { version: 8, event_id: 9, extension: 11, payload: 15 };
    const RUNTIME: &str = "Microsoft-Windows-DotNETRuntime";

    fn utf16z(s: &str) -> Vec<u8> {
        s.encode_utf16().chain([0]).flat_map(u16::to_le_bytes).collect()
    }

    /// A record as ftrace stores it: common header, the fixed fields, then extension + payload.
    fn record(event_id: u16, extension: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; 8];
        out.push(1);
        out.extend(event_id.to_le_bytes());
        out.extend(((extension.len() as u32) << 16 | 4).to_le_bytes());
        out.extend(((payload.len() as u32) << 16 | extension.len() as u32).to_le_bytes());
        out.extend(extension);
        out.extend(payload);
        out
    }

    /// Metadata body (no MetadataId) for event `id` "Work" with one UInt32 field `n`.
    fn body(id: u32) -> Vec<u8> {
        let mut out = id.to_le_bytes().to_vec();
        out.extend(utf16z("Work"));
        out.extend(0x10u64.to_le_bytes());
        out.extend(2u32.to_le_bytes());
        out.extend(4u32.to_le_bytes());
        out.extend(1u32.to_le_bytes());
        out.extend(10u32.to_le_bytes());
        out.extend(utf16z("n"));
        out
    }

    fn metadata_label(bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![LABEL_METADATA];
        out.extend((bytes.len() as u32).to_le_bytes());
        out.extend(bytes);
        out
    }

    #[test]
    fn metadata_with_provider_name_and_activity_ids() {
        let mut meta = utf16z("My-Source");
        meta.extend(body(12));
        let mut ext = metadata_label(&meta);
        ext.push(LABEL_ACTIVITY);
        ext.extend([0x11; 16]);
        ext.push(LABEL_RELATED_ACTIVITY);
        ext.extend([0x22; 16]);
        let rec = record(12, &ext, &77u32.to_le_bytes());
        let parsed = parse_record(&LAYOUT, &rec, "ignored", &MetadataLimits::default()).unwrap();
        let meta = parsed.metadata.as_ref().unwrap();
        assert_eq!(
            (meta.provider.as_str(), meta.event_id, meta.event_name.as_str()),
            ("My-Source", 12, "Work")
        );
        assert_eq!((meta.version, meta.level, meta.keywords), (Some(2), 4, 0x10));
        assert_eq!(parsed.activity_id, Some([0x11; 16]));
        assert_eq!(parsed.related_activity_id, Some([0x22; 16]));
        assert_eq!(parsed.extension_problem, None);
        let fields = decode_payload(meta, parsed.payload, 8).unwrap();
        assert_eq!(serde_json::to_string(&fields).unwrap(), r#"{"n":77}"#);
        let mut nettrace_form = utf16z("My-Source");
        nettrace_form.extend(body(12));
        assert_eq!(parsed.metadata_bytes.as_deref(), Some(&nettrace_form[..]), "as sent");
    }

    #[test]
    fn early_metadata_form_without_provider_name() {
        let rec = record(3, &metadata_label(&body(3)), &5u32.to_le_bytes());
        let parsed =
            parse_record(&LAYOUT, &rec, "Tp-Provider", &MetadataLimits::default()).unwrap();
        let mut nettrace_form = utf16z("Tp-Provider");
        nettrace_form.extend(body(3));
        assert_eq!(
            parsed.metadata_bytes.as_deref(),
            Some(&nettrace_form[..]),
            "provider prepended"
        );
        let meta = parsed.metadata.unwrap();
        assert_eq!((meta.provider.as_str(), meta.event_id), ("Tp-Provider", 3));
    }

    #[test]
    fn metadata_for_another_event_is_rejected() {
        let rec = record(4, &metadata_label(&body(3)), &[]);
        assert_eq!(
            parse_record(&LAYOUT, &rec, "P", &MetadataLimits::default()),
            Err(UserEventsError::MetadataEventMismatch { at: 5, found: 3, expected: 4 })
        );
    }

    #[test]
    fn native_event_without_metadata_uses_the_built_in_layout() {
        let mut payload = [2u32, 1, 1, 0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>();
        payload.extend(0u16.to_le_bytes());
        payload.extend(0u64.to_le_bytes());
        let rec = record(1, &[], &payload);
        let mut parsed = parse_record(&LAYOUT, &rec, RUNTIME, &MetadataLimits::default()).unwrap();
        let mut cache = MetadataCache::new(16);
        let meta = cache.resolve(77, "DotNETRuntime", RUNTIME, &mut parsed);
        let context = EventContext { thread: 78, timestamp: 5, ..Default::default() };
        let json = serde_json::to_value(
            OutputEvent {
                metadata: &meta,
                payload: parsed.payload,
                pointer_size: 8,
                context,
                stack: None,
                rendered_fields: None,
            }
            .decode(),
        )
        .unwrap();
        assert_eq!(json["event"], "GCStart");
        assert_eq!(json["fields"]["Reason"], "Induced");
        assert_eq!(json["fields"]["Count"], 2);
        assert_eq!(json["thread"], 78);
        assert!(json.get("sequence").is_none());
    }

    #[test]
    fn metadata_is_cached_per_process_tracepoint_and_event() {
        let mut cache = MetadataCache::new(2);
        let first = record(9, &metadata_label(&body(9)), &1u32.to_le_bytes());
        let later = record(9, &[], &2u32.to_le_bytes());
        let limits = MetadataLimits::default();
        let mut parsed = parse_record(&LAYOUT, &first, "P", &limits).unwrap();
        assert_eq!(cache.resolve(10, "tp", "P", &mut parsed).event_name, "Work");
        let mut parsed = parse_record(&LAYOUT, &later, "P", &limits).unwrap();
        assert_eq!(cache.resolve(10, "tp", "P", &mut parsed).event_name, "Work");
        // Another process or tracepoint has not sent its metadata: the event stays unnamed.
        let mut parsed = parse_record(&LAYOUT, &later, "P", &limits).unwrap();
        assert_eq!(cache.resolve(11, "tp", "P", &mut parsed).display_name(), "EventID(9)");
        assert_eq!(cache.get(10, "other", 9), None);
        assert_eq!(cache.len(), 1);
        let meta = parse_record(&LAYOUT, &first, "P", &limits).unwrap().metadata.unwrap();
        assert!(cache.insert(12, "tp", 9, meta.clone()));
        assert!(!cache.insert(13, "tp", 9, meta.clone()));
        assert_eq!(cache.refused(), 1);
        cache.forget_process(10);
        assert_eq!(cache.len(), 1);
        assert!(cache.insert(13, "tp", 9, meta));
    }

    #[test]
    fn metadata_cache_bytes_are_bounded_in_total_and_per_process() {
        let limits = MetadataLimits::default();
        let first = record(9, &metadata_label(&body(9)), &1u32.to_le_bytes());
        let meta = parse_record(&LAYOUT, &first, "P", &limits).unwrap().metadata.unwrap();
        let size = meta.heap_bytes();
        // Room for three entries in total, two per process.
        let mut cache = MetadataCache::with_byte_limits(100, 3 * size, 2 * size);
        assert!(cache.insert(1, "a", 9, meta.clone()));
        assert!(cache.insert(1, "b", 9, meta.clone()));
        assert!(!cache.insert(1, "c", 9, meta.clone()), "process 1 is at its bound");
        assert!(cache.insert(1, "a", 9, meta.clone()), "a replacement of equal size fits");
        assert!(cache.insert(2, "a", 9, meta.clone()));
        assert!(!cache.insert(3, "a", 9, meta.clone()), "the cache is at its total bound");
        assert_eq!((cache.len(), cache.bytes(), cache.refused()), (3, 3 * size, 2));
        cache.forget_process(1);
        assert_eq!((cache.len(), cache.bytes()), (1, size));
        assert!(cache.insert(3, "a", 9, meta));
    }

    #[test]
    fn bounds_are_checked() {
        let limits = MetadataLimits::default();
        let rec = record(1, &[], &[1, 2, 3]);
        assert_eq!(
            parse_record(&LAYOUT, &rec[..20], "P", &limits),
            Err(UserEventsError::RelLocOutsideRecord {
                field: "payload",
                start: 19,
                end: 22,
                len: 20
            })
        );
        assert_eq!(
            parse_record(&LAYOUT, &rec[..12], "P", &limits),
            Err(UserEventsError::FieldOutsideRecord { field: "extension", offset: 11, len: 12 })
        );
        let mut bad = rec.clone();
        bad[8] = 2;
        assert_eq!(
            parse_record(&LAYOUT, &bad, "P", &limits),
            Err(UserEventsError::UnsupportedVersion { version: 2 })
        );
        let far = RecordLayout { version: usize::MAX, ..LAYOUT };
        assert!(matches!(
            parse_record(&far, &rec, "P", &limits),
            Err(UserEventsError::FieldOutsideRecord { field: "version", .. })
        ));
    }

    #[test]
    fn label_parsing_stops_on_unknown_truncated_or_extra_labels() {
        let limits = MetadataLimits::default();
        let parse = |ext: &[u8]| {
            let rec = record(1, ext, &[]);
            parse_record(&LAYOUT, &rec, "P", &limits).unwrap().extension_problem
        };
        assert_eq!(parse(&[0x09, 1, 2]), Some(ExtensionProblem::UnknownLabel { at: 0, label: 9 }));
        assert_eq!(
            parse(&[0x02, 1, 2]),
            Some(ExtensionProblem::TruncatedLabel { at: 0, label: 2 })
        );
        assert_eq!(
            parse(&[0x01, 200, 0, 0, 0, 1]),
            Some(ExtensionProblem::TruncatedLabel { at: 0, label: 1 })
        );
        let mut four = Vec::new();
        for _ in 0..4 {
            four.push(0x02);
            four.extend([0; 16]);
        }
        assert_eq!(parse(&four), Some(ExtensionProblem::TooManyLabels { at: 51 }));
    }
}
