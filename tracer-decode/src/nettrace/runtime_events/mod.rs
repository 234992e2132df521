//! Payload layouts of the runtime's native events, which carry no field metadata on the wire:
//! every event and version of `Microsoft-Windows-DotNETRuntime`, `…Rundown`, `…Private` and
//! Mono's `Microsoft-DotNETRuntimeMonoProfiler` (`generated.rs`, generated from the runtime's
//! event manifest by
//! `cargo xtask gen-runtime-events`), and the EventPipe sample profiler's thread samples.
//! docs/protocol/runtime-events.md has the facts and where the manifests come from.

mod generated;

pub const RUNTIME_PROVIDER: &str = "Microsoft-Windows-DotNETRuntime";
/// Where the events of a session's rundown (requested by keyword) come from.
pub const RUNDOWN_PROVIDER: &str = "Microsoft-Windows-DotNETRuntimeRundown";
/// EventPipe's own provider: its `ProcessInfo` event (with field metadata) starts every stream.
pub const EVENTPIPE_PROVIDER: &str = "Microsoft-DotNETCore-EventPipe";
pub const SAMPLE_PROFILER_PROVIDER: &str = "Microsoft-DotNETCore-SampleProfiler";

/// How one manifest field is laid out in the payload (little-endian, no padding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F32,
    F64,
    /// Four bytes, zero or not.
    Bool32,
    /// Pointer-sized (Trace object PointerSize).
    Pointer,
    Guid,
    Utf16Z,
    /// NUL-terminated 8-bit text.
    AnsiZ,
    /// Bytes; their number is the field's [`Count`].
    Binary,
    /// A group of fields, repeated [`Count`] times.
    Struct(&'static [RuntimeField]),
}

/// How many times a field occurs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    One,
    Fixed(u16),
    /// As many as the value of the earlier field at this index (same level).
    Field(usize),
}

/// A manifest value map (one name per value) or bit map (one name per bit).
#[derive(Debug, PartialEq, Eq)]
pub struct ValueMap {
    pub bitmap: bool,
    /// Sorted by value.
    pub entries: &'static [(u64, &'static str)],
}

impl ValueMap {
    /// The name of `value` in a value map.
    pub fn name(&self, value: u64) -> Option<&'static str> {
        let i = self.entries.binary_search_by_key(&value, |&(v, _)| v).ok()?;
        Some(self.entries[i].1)
    }

    /// The names of the bits of `value` in a bit map, and the bits without a name.
    pub fn flags(&self, value: u64) -> (Vec<&'static str>, u64) {
        (self.bit_names(value).collect(), self.unnamed(value))
    }

    /// The names of the bits (or groups of bits) of `value` in a bit map.
    pub fn bit_names(&self, value: u64) -> impl Iterator<Item = &'static str> + use<'_> {
        self.entries
            .iter()
            .filter(move |&&(bits, _)| bits != 0 && value & bits == bits)
            .map(|&(_, name)| name)
    }

    /// The bits of `value` no entry of a bit map names.
    pub fn unnamed(&self, value: u64) -> u64 {
        self.entries
            .iter()
            .filter(|&&(bits, _)| bits != 0 && value & bits == bits)
            .fold(value, |rest, &(bits, _)| rest & !bits)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct RuntimeField {
    pub name: &'static str,
    pub kind: Kind,
    pub count: Count,
    pub map: Option<&'static ValueMap>,
}

/// One native event with its template versions, oldest first.
#[derive(Debug)]
pub struct RuntimeEvent {
    pub id: u32,
    pub name: &'static str,
    versions: &'static [(u32, &'static [RuntimeField])],
}

impl RuntimeEvent {
    /// Every template, newest first: what a record without a version (user_events) may have
    /// been written with (the decoder prefers one that the payload fills exactly).
    pub(crate) fn layouts_newest_first(&self) -> impl Iterator<Item = &'static [RuntimeField]> {
        self.versions.iter().rev().map(|(_, fields)| *fields)
    }

    /// The newest template not newer than `version` (the oldest for a version before them all).
    pub(crate) fn layout_for(&self, version: u32) -> &'static [RuntimeField] {
        let versions = self.versions;
        versions.iter().rev().find(|(tv, _)| *tv <= version).unwrap_or(&versions[0]).1
    }

    /// Template versions, oldest first.
    pub(crate) fn versions(&self) -> &'static [(u32, &'static [RuntimeField])] {
        self.versions
    }
}

/// Events are identified by their id (each provider's table holds each id once).
impl PartialEq for RuntimeEvent {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

/// One provider's events, sorted by id.
#[derive(Debug)]
pub struct RuntimeProvider {
    pub name: &'static str,
    events: &'static [RuntimeEvent],
}

/// What the EventPipe sample profiler writes for each sampled thread: one 32-bit sample type
/// (docs/protocol/runtime-events.md "Sample profiler"); the stack is the event's stack id.
static SAMPLE_TYPE: ValueMap =
    ValueMap { bitmap: false, entries: &[(0, "Error"), (1, "External"), (2, "Managed")] };
static SAMPLE_PROFILER: RuntimeProvider = RuntimeProvider {
    name: SAMPLE_PROFILER_PROVIDER,
    events: &[RuntimeEvent {
        id: 0,
        name: "ThreadSample",
        versions: &[(
            0,
            &[RuntimeField {
                name: "Type",
                kind: Kind::U32,
                count: Count::One,
                map: Some(&SAMPLE_TYPE),
            }],
        )],
    }],
};

/// Every provider the table knows.
fn providers() -> impl Iterator<Item = &'static RuntimeProvider> {
    generated::PROVIDERS.iter().chain([&SAMPLE_PROFILER])
}

/// The layouts of `provider`'s event `event_id` (provider names compare without regard to
/// case, as EventPipe's do).
pub fn lookup(provider: &str, event_id: u32) -> Option<&'static RuntimeEvent> {
    let p = providers().find(|p| p.name.eq_ignore_ascii_case(provider))?;
    let i = p.events.binary_search_by_key(&event_id, |e| e.id).ok()?;
    Some(&p.events[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_is_sorted_by_id_and_every_count_names_an_earlier_field() {
        fn check(fields: &[RuntimeField], at: &str) {
            for (i, f) in fields.iter().enumerate() {
                // Written as JSON keys without escaping.
                assert!(
                    !f.name.is_empty()
                        && f.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
                    "{at}: field name {:?} is not plain",
                    f.name
                );
                if let Count::Field(n) = f.count {
                    assert!(n < i, "{at}.{}: count field {n} is not before it", f.name);
                    assert!(
                        n < crate::nettrace::payload::COUNTED_FIELDS
                            && fields[n].count == Count::One,
                        "{at}.{}: count field {n} is not one the decoder keeps",
                        f.name
                    );
                    assert!(
                        matches!(fields[n].kind, Kind::U8 | Kind::U16 | Kind::U32 | Kind::U64),
                        "{at}.{}: counted by a non-integer",
                        f.name
                    );
                }
                if let Kind::Struct(members) = f.kind {
                    assert!(!members.is_empty(), "{at}.{}: empty struct", f.name);
                    check(members, &format!("{at}.{}", f.name));
                }
            }
        }
        let names: Vec<&str> = providers().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "Microsoft-DotNETRuntimeMonoProfiler",
                "Microsoft-Windows-DotNETRuntime",
                "Microsoft-Windows-DotNETRuntimePrivate",
                RUNDOWN_PROVIDER,
                SAMPLE_PROFILER_PROVIDER,
            ]
        );
        for p in providers() {
            assert!(p.events.windows(2).all(|w| w[0].id < w[1].id), "{} not sorted", p.name);
            for e in p.events {
                assert!(!e.versions.is_empty(), "{}/{}", p.name, e.name);
                assert!(e.versions.windows(2).all(|w| w[0].0 < w[1].0), "{}", e.name);
                for (v, fields) in e.versions {
                    check(fields, &format!("{}/{} v{v}", p.name, e.name));
                }
            }
        }
    }

    #[test]
    fn maps_name_values_and_bits() {
        let gc_start = lookup(RUNTIME_PROVIDER, 1).unwrap();
        assert_eq!(gc_start.name, "GCStart");
        let reason = gc_start.layout_for(2)[2].map.unwrap();
        assert_eq!(reason.name(1), Some("Induced"));
        assert_eq!(reason.name(999), None);
        let bits = ValueMap { bitmap: true, entries: &[(0x1, "A"), (0x4, "C")] };
        assert_eq!(bits.flags(0x15), (vec!["A", "C"], 0x10));
        assert_eq!(lookup("microsoft-dotnetcore-sampleprofiler", 0).unwrap().name, "ThreadSample");
        assert!(lookup(RUNTIME_PROVIDER, 65_000).is_none());
    }
}
