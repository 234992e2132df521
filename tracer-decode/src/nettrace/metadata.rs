//! Event metadata (docs/protocol/nettrace.md §5): provider, event id, name, keywords, version,
//! level and the field list used to decode EventSource payloads. The same body is carried by
//! nettrace MetadataBlocks and by the user_events extension label 0x01
//! (docs/protocol/user_events.md §7.3), so both use this parser.

use std::borrow::Cow;

use super::cursor::{Cursor, Utf16Problem};
pub use super::fields::{FieldDef, FieldType};
use super::flat_layout::FlatLayout;
use super::runtime_events::{self, RuntimeEvent};
use crate::json::RenderedOnce;

/// Caps applied to metadata from untrusted peers.
#[derive(Debug, Clone, Copy)]
pub struct MetadataLimits {
    /// Fields per event, counting nested ones.
    pub max_fields: usize,
    /// Nesting depth of Object / Array field types.
    pub max_depth: usize,
    /// UTF-16 code units of provider, event and field names.
    pub max_name_units: usize,
}

impl Default for MetadataLimits {
    fn default() -> Self {
        MetadataLimits { max_fields: 1024, max_depth: 8, max_name_units: 1024 }
    }
}

/// Decoded metadata of one event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventMetadata {
    /// Id events refer to (nettrace); 0 for user_events metadata, which has none.
    pub metadata_id: u32,
    pub provider: String,
    pub event_id: u32,
    /// Empty for native runtime events unless a built-in layout names them.
    pub event_name: String,
    pub keywords: u64,
    /// `None` when the version was not transmitted (native events in user_events sessions).
    pub version: Option<u32>,
    pub level: u32,
    pub opcode: Option<u8>,
    /// Fields from the V1 list, or from the V2Params tag when present.
    pub fields: Vec<FieldDef>,
    /// Why the field list could not be read (the event keeps its name; payloads stay raw).
    pub field_error: Option<MetadataError>,
    /// Built-in layout for native runtime events that carry no field metadata.
    pub runtime_event: Option<&'static RuntimeEvent>,
    /// The members every output line of this event starts with (provider to keywords),
    /// rendered by the first ([`crate::nettrace::OutputEvent`]).
    pub json_head: RenderedOnce,
    /// Its payload layout compiled for writing JSON, when it is flat (integers, mapped
    /// integers and strings; compiled by the first payload written).
    pub flat_layout: RenderedOnce<Option<FlatLayout>>,
}

impl EventMetadata {
    /// The layout the general decoder would use for these payloads, compiled, when it is flat:
    /// the field list's, else (with a version: nettrace) the runtime event's.
    pub fn compiled_layout(&self) -> Option<FlatLayout> {
        if self.field_error.is_some() {
            return None;
        }
        if !self.fields.is_empty() {
            return FlatLayout::of_fields(&self.fields);
        }
        FlatLayout::of_runtime(self.runtime_event?.layout_for(self.version?))
    }

    /// [`FlatLayout::max_heap_bytes`] of the fields [`Self::compiled_layout`] would compile.
    fn max_layout_heap_bytes(&self) -> usize {
        if self.fields.is_empty() {
            let layout = self.runtime_event.zip(self.version).map(|(e, v)| e.layout_for(v));
            FlatLayout::max_heap_bytes(layout.unwrap_or_default().iter().map(|f| f.name))
        } else {
            FlatLayout::max_heap_bytes(self.fields.iter().map(|d| d.name.as_str()))
        }
    }

    /// Metadata for a native runtime event known only by provider and id (user_events sessions
    /// send no metadata for them). The event name comes from the built-in table when known.
    pub fn native(provider: &str, event_id: u32) -> Self {
        let mut meta = EventMetadata {
            metadata_id: 0,
            provider: provider.to_owned(),
            event_id,
            event_name: String::new(),
            keywords: 0,
            version: None,
            level: 0,
            opcode: None,
            fields: Vec::new(),
            field_error: None,
            runtime_event: None,
            json_head: RenderedOnce::default(),
            flat_layout: RenderedOnce::default(),
        };
        meta.resolve_runtime_event();
        meta
    }

    /// Whether the metadata or the built-in table names the event (else it shows as
    /// `EventID(<id>)`, counted as unnamed).
    pub fn is_named(&self) -> bool {
        !self.event_name.is_empty()
    }

    /// The name to show: the metadata's, the built-in table's, or `EventID(<id>)`.
    pub fn display_name(&self) -> Cow<'_, str> {
        if self.is_named() {
            Cow::Borrowed(&self.event_name)
        } else {
            Cow::Owned(format!("EventID({})", self.event_id))
        }
    }

    /// Approximate bytes this metadata holds in memory (the struct, its names, its field
    /// tree, its rendered [`json_head`](Self::json_head) and [`flat_layout`](Self::flat_layout)
    /// at their largest); what the metadata
    /// budgets ([`crate::nettrace::Limits::max_metadata_bytes`], the
    /// user_events cache's byte bounds) charge for it.
    pub fn heap_bytes(&self) -> usize {
        fn fields(defs: &[FieldDef]) -> usize {
            defs.iter().map(|d| size_of::<FieldDef>() + d.name.len() + ty(&d.ty)).sum()
        }
        fn ty(t: &FieldType) -> usize {
            match t {
                FieldType::Object(defs) => fields(defs),
                FieldType::Array(e) => size_of::<FieldType>() + ty(e),
                _ => 0,
            }
        }
        let names = self.provider.len() + self.event_name.len();
        // The head escapes both names (at most 6 bytes a byte) around ≤ 160 bytes of member
        // names, numbers and an unnamed event's `EventID(<id>)`.
        let head = 6 * names + 160;
        size_of::<Self>() + names + head + fields(&self.fields) + self.max_layout_heap_bytes()
    }

    fn resolve_runtime_event(&mut self) {
        if self.fields.is_empty() && self.field_error.is_none() {
            self.runtime_event = runtime_events::lookup(&self.provider, self.event_id);
            if let (Some(known), true) = (self.runtime_event, self.event_name.is_empty()) {
                self.event_name = known.name.to_owned();
            }
        }
    }
}

/// Why metadata bytes could not be parsed; `at` is the byte position inside the metadata blob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata byte {at}: truncated {what}")]
    Truncated { at: usize, what: &'static str },
    #[error("metadata byte {at}: unterminated {what} string")]
    UnterminatedString { at: usize, what: &'static str },
    #[error("metadata byte {at}: {what} string longer than {max} code units")]
    StringTooLong { at: usize, what: &'static str, max: usize },
    #[error("metadata byte {at}: unsupported field type code {code}")]
    UnsupportedType { at: usize, code: u32 },
    #[error("metadata byte {at}: more than {max} fields")]
    TooManyFields { at: usize, max: usize },
    #[error("metadata byte {at}: fields nested deeper than {max}")]
    TooDeep { at: usize, max: usize },
    #[error("metadata byte {at}: {what} size {size} out of bounds")]
    BadSize { at: usize, what: &'static str, size: u32 },
    /// An object type without fields: its values take no payload bytes, so a few bytes of
    /// payload (an array of them) could decode into any number of values.
    #[error("metadata byte {at}: object type without fields (zero-size values are refused)")]
    EmptyObject { at: usize },
}

/// Parses a nettrace metadata payload: `u32 MetadataId`, provider name, then the body.
pub fn parse_nettrace_metadata(
    bytes: &[u8],
    limits: &MetadataLimits,
) -> Result<EventMetadata, MetadataError> {
    let mut parser = Parser { cur: Cursor::new(bytes), limits, field_budget: limits.max_fields };
    let metadata_id = parser.u32("metadata id")?;
    let provider = parser.string("provider name")?;
    parser.body(metadata_id, provider)
}

/// Parses a metadata body that starts at the event id (user_events label 0x01,
/// docs/protocol/user_events.md §7.3), for `provider`. `bytes` must end where the metadata ends:
/// trailing bytes are read as tags.
pub fn parse_metadata_body(
    bytes: &[u8],
    provider: String,
    limits: &MetadataLimits,
) -> Result<EventMetadata, MetadataError> {
    let mut parser = Parser { cur: Cursor::new(bytes), limits, field_budget: limits.max_fields };
    parser.body(0, provider)
}

/// Reads a provider name (UTF-16Z) and returns it with the number of bytes it used.
pub(crate) fn parse_provider_prefix(
    bytes: &[u8],
    limits: &MetadataLimits,
) -> Result<(String, usize), MetadataError> {
    let mut parser = Parser { cur: Cursor::new(bytes), limits, field_budget: 0 };
    let name = parser.string("provider name")?;
    Ok((name, parser.cur.pos()))
}

const TAG_OPCODE: u8 = 1;
const TAG_V2_PARAMS: u8 = 2;
const TYPE_OBJECT: u32 = 1;
const TYPE_ARRAY: u32 = 19;

struct Parser<'a, 'l> {
    cur: Cursor<'a>,
    limits: &'l MetadataLimits,
    field_budget: usize,
}

impl Parser<'_, '_> {
    fn u32(&mut self, what: &'static str) -> Result<u32, MetadataError> {
        let at = self.cur.pos();
        self.cur.u32().ok_or(MetadataError::Truncated { at, what })
    }

    fn string(&mut self, what: &'static str) -> Result<String, MetadataError> {
        let at = self.cur.pos();
        let max = self.limits.max_name_units;
        self.cur.utf16z(max).map_err(|p| match p {
            Utf16Problem::Unterminated => MetadataError::UnterminatedString { at, what },
            Utf16Problem::TooLong => MetadataError::StringTooLong { at, what, max },
        })
    }

    fn body(&mut self, metadata_id: u32, provider: String) -> Result<EventMetadata, MetadataError> {
        let event_id = self.u32("event id")?;
        let event_name = self.string("event name")?;
        let at = self.cur.pos();
        let keywords = self.cur.u64().ok_or(MetadataError::Truncated { at, what: "keywords" })?;
        let version = self.u32("version")?;
        let level = self.u32("level")?;
        // A field list this parser cannot read leaves the event usable by name: its payloads
        // are then reported undecodable instead of failing the whole stream.
        let (fields, opcode, field_error) = match self.fields_and_tags() {
            Ok((fields, opcode)) => (fields, opcode, None),
            Err(e) => (Vec::new(), None, Some(e)),
        };
        let mut meta = EventMetadata {
            metadata_id,
            provider,
            event_id,
            event_name,
            keywords,
            version: Some(version),
            level,
            opcode,
            fields,
            field_error,
            runtime_event: None,
            json_head: RenderedOnce::default(),
            flat_layout: RenderedOnce::default(),
        };
        meta.resolve_runtime_event();
        Ok(meta)
    }

    fn fields_and_tags(&mut self) -> Result<(Vec<FieldDef>, Option<u8>), MetadataError> {
        let count = self.u32("field count")?;
        let mut fields = self.v1_fields(count, 0)?;
        let mut opcode = None;
        while self.cur.remaining() > 0 {
            let at = self.cur.pos();
            let size = self.u32("tag size")?;
            let kind = self.cur.u8().ok_or(MetadataError::Truncated { at, what: "tag kind" })?;
            let tag = self.cur.take(size as usize).ok_or(MetadataError::BadSize {
                at,
                what: "tag",
                size,
            })?;
            let base = self.cur.pos() - tag.len();
            match kind {
                TAG_OPCODE => opcode = tag.first().copied(),
                TAG_V2_PARAMS => {
                    let mut inner = Parser {
                        cur: Cursor::new(tag),
                        limits: self.limits,
                        field_budget: self.field_budget,
                    };
                    fields = inner.v2_params().map_err(|e| shift(e, base))?;
                    self.field_budget = inner.field_budget;
                }
                _ => {} // Unknown tags are optional by design: skip them.
            }
        }
        Ok((fields, opcode))
    }

    fn v2_params(&mut self) -> Result<Vec<FieldDef>, MetadataError> {
        let count = self.u32("V2 field count")?;
        self.v2_fields(count, 0)
    }

    fn spend_field(&mut self, depth: usize) -> Result<(), MetadataError> {
        let at = self.cur.pos();
        if depth >= self.limits.max_depth {
            return Err(MetadataError::TooDeep { at, max: self.limits.max_depth });
        }
        self.field_budget = self
            .field_budget
            .checked_sub(1)
            .ok_or(MetadataError::TooManyFields { at, max: self.limits.max_fields })?;
        Ok(())
    }

    fn v1_fields(&mut self, count: u32, depth: usize) -> Result<Vec<FieldDef>, MetadataError> {
        let mut fields = Vec::new();
        for _ in 0..count {
            self.spend_field(depth)?;
            let at = self.cur.pos();
            let code = self.u32("field type")?;
            let ty = if code == TYPE_OBJECT {
                let nested = self.u32("nested field count")?;
                FieldType::Object(non_empty(self.v1_fields(nested, depth + 1)?, at)?)
            } else if code == TYPE_ARRAY {
                // V1 field lists cannot say the element type; arrays come with V2Params.
                return Err(MetadataError::UnsupportedType { at, code });
            } else {
                scalar_type(code).ok_or(MetadataError::UnsupportedType { at, code })?
            };
            let name = self.string("field name")?;
            fields.push(FieldDef::new(name, ty));
        }
        Ok(fields)
    }

    fn v2_fields(&mut self, count: u32, depth: usize) -> Result<Vec<FieldDef>, MetadataError> {
        let mut fields = Vec::new();
        for _ in 0..count {
            self.spend_field(depth)?;
            let start = self.cur.pos();
            let size = self.u32("V2 field size")?;
            let end = start
                .checked_add(size as usize)
                .filter(|&end| end >= start + 4 && end <= start + 4 + self.cur.remaining())
                .ok_or(MetadataError::BadSize { at: start, what: "V2 field", size })?;
            let name = self.string("field name")?;
            let ty = self.v2_type(depth)?;
            if self.cur.pos() > end {
                return Err(MetadataError::BadSize { at: start, what: "V2 field", size });
            }
            self.cur.take(end - self.cur.pos()); // newer writers may append data: skip it
            fields.push(FieldDef::new(name, ty));
        }
        Ok(fields)
    }

    fn v2_type(&mut self, depth: usize) -> Result<FieldType, MetadataError> {
        let at = self.cur.pos();
        let code = self.u32("field type")?;
        match code {
            TYPE_OBJECT => {
                let nested = self.u32("nested field count")?;
                Ok(FieldType::Object(non_empty(self.v2_fields(nested, depth + 1)?, at)?))
            }
            TYPE_ARRAY => {
                if depth + 1 >= self.limits.max_depth {
                    return Err(MetadataError::TooDeep { at, max: self.limits.max_depth });
                }
                Ok(FieldType::Array(Box::new(self.v2_type(depth + 1)?)))
            }
            _ => scalar_type(code).ok_or(MetadataError::UnsupportedType { at, code }),
        }
    }
}

/// Refuses an object without fields (the type at `at`). Every other type takes at least one
/// payload byte per value (scalars their size, strings their NUL, arrays their count), so once
/// empty objects are refused every value decoded consumes payload bytes: the values of a
/// payload are at most `max_depth` × its length.
fn non_empty(fields: Vec<FieldDef>, at: usize) -> Result<Vec<FieldDef>, MetadataError> {
    if fields.is_empty() {
        return Err(MetadataError::EmptyObject { at });
    }
    Ok(fields)
}

fn scalar_type(code: u32) -> Option<FieldType> {
    Some(match code {
        3 => FieldType::Boolean,
        4 => FieldType::Char16,
        5 => FieldType::SByte,
        6 => FieldType::Byte,
        7 => FieldType::Int16,
        8 => FieldType::UInt16,
        9 => FieldType::Int32,
        10 => FieldType::UInt32,
        11 => FieldType::Int64,
        12 => FieldType::UInt64,
        13 => FieldType::Single,
        14 => FieldType::Double,
        16 => FieldType::DateTime,
        17 => FieldType::Guid,
        18 => FieldType::String,
        _ => return None,
    })
}

/// Re-bases an error position from a tag's own bytes to the whole metadata blob.
fn shift(e: MetadataError, base: usize) -> MetadataError {
    use MetadataError::*;
    match e {
        Truncated { at, what } => Truncated { at: at + base, what },
        UnterminatedString { at, what } => UnterminatedString { at: at + base, what },
        StringTooLong { at, what, max } => StringTooLong { at: at + base, what, max },
        UnsupportedType { at, code } => UnsupportedType { at: at + base, code },
        TooManyFields { at, max } => TooManyFields { at: at + base, max },
        TooDeep { at, max } => TooDeep { at: at + base, max },
        BadSize { at, what, size } => BadSize { at: at + base, what, size },
        EmptyObject { at } => EmptyObject { at: at + base },
    }
}
