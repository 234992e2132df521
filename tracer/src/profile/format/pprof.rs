//! pprof: a gzip'd `perftools.profiles.Profile` (google/pprof `proto/profile.proto`), as
//! `go tool pprof` and the continuous profilers read it.
//!
//! * Sample types: on-CPU `samples/count` and `cpu/nanoseconds` (samples × the sampling period),
//!   as Go's own CPU profiles; off-CPU `samples/count` (stretches) and `off_cpu/nanoseconds`. The
//!   last is the default. The period type is the nanoseconds one; the period is the sampling
//!   period on-CPU, 1 off-CPU (every stretch is counted).
//! * One function and one location per frame of the frame table: the function's `name` is the
//!   frame's display name (unnamed frames: `module+0xoffset`), `filename` the module, and the
//!   location's address the module offset of an unnamed frame. `system_name` is the name as
//!   given for kernel and native frames, so pprof demangles and simplifies C++ names as in any
//!   native profile; it is empty for managed frames (and unnamed ones), because pprof takes a
//!   function whose two names are equal for one still to demangle, and one whose name looks like
//!   C++ (any `<>[]` or `::`) loses its `(…)` and `<…>` parts: .NET generics (`List`1[T]`) and
//!   compiler-made names (`<Main>$`, `<>c.<Run>b__0_0`) would lose their parameters or vanish.
//! * pprof has no escaping and its text reports print names as they are: a control character in
//!   any string becomes U+FFFD, so a name cannot drive the terminal of whoever reads the report.
//! * One mapping per module, its file the module, marked as having functions so that pprof does
//!   not try to symbolize the addresses against a local file of the same name.
//! * One sample per (process, thread, stack) entry, leaf first, with numeric labels `pid`,
//!   `process_start_ns`, `thread` and string labels `process` (its name), `container_id` and
//!   `pod_uid` (when known).
use std::borrow::Cow;
use std::io::Write;

use anyhow::Context as _;
use flate2::Compression;
use flate2::write::GzEncoder;
use indexmap::{IndexMap, IndexSet};
use prost::Message as _;

use super::CONTROL_REPLACEMENT;
use crate::profile::model::{FrameKind, Mode, Profile};

/// The messages of profile.proto tracer writes, with `prost` derives: field numbers and types as
/// in the .proto file, only the fields tracer sets (no protoc at build time).
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// Sample type of the number of samples (on-CPU) or stretches (off-CPU): pprof's `count` type
/// goes first by convention.
pub const SAMPLES: (&str, &str) = ("samples", "count");
/// On-CPU time, as in Go's CPU profiles (`go tool pprof` shows it as `Type: cpu`).
pub const CPU_TIME: (&str, &str) = ("cpu", "nanoseconds");
/// Off-CPU time (`Type: off_cpu`).
pub const OFF_CPU_TIME: (&str, &str) = ("off_cpu", "nanoseconds");

/// Writes `profile` as a gzip'd pprof protobuf.
pub fn write(profile: &Profile, out: impl Write) -> anyhow::Result<()> {
    let mut gzip = GzEncoder::new(out, Compression::default());
    gzip.write_all(&to_proto(profile).encode_to_vec()).context("writing the pprof profile")?;
    gzip.finish().context("finishing the pprof profile's gzip stream")?;
    Ok(())
}

/// The string table: index 0 is "", every other string once.
struct Strings(IndexSet<String>);

impl Strings {
    fn new() -> Strings {
        Strings(IndexSet::from([String::new()]))
    }

    fn id(&mut self, text: &str) -> i64 {
        let text: Cow<'_, str> = if text.contains(char::is_control) {
            Cow::Owned(
                text.chars()
                    .map(|c| if c.is_control() { CONTROL_REPLACEMENT } else { c })
                    .collect(),
            )
        } else {
            Cow::Borrowed(text)
        };
        let index = match self.0.get_index_of(text.as_ref()) {
            Some(index) => index,
            None => self.0.insert_full(text.into_owned()).0,
        };
        index as i64
    }

    fn value_type(&mut self, (kind, unit): (&str, &str)) -> proto::ValueType {
        proto::ValueType { r#type: self.id(kind), unit: self.id(unit) }
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The protobuf message of `profile` (before gzip).
fn to_proto(profile: &Profile) -> proto::Profile {
    let mut strings = Strings::new();
    let time = match profile.mode() {
        Mode::Cpu { .. } => CPU_TIME,
        Mode::OffCpu => OFF_CPU_TIME,
    };
    let nanoseconds_per_weight = profile.mode().nanoseconds_per_weight();
    let sample_type = vec![strings.value_type(SAMPLES), strings.value_type(time)];
    let period_type = Some(strings.value_type(time));

    let mut mappings: IndexMap<&str, proto::Mapping> = IndexMap::new();
    let mut functions = Vec::with_capacity(profile.frames().len());
    let mut locations = Vec::with_capacity(profile.frames().len());
    for (index, frame) in profile.frames().enumerate() {
        // Ids are nonzero: a frame's are its index + 1.
        let id = index as u64 + 1;
        let module = frame.module.as_deref();
        let mapping_id = module.map_or(0, |module| {
            let next_id = mappings.len() as u64 + 1;
            let filename = strings.id(module);
            mappings
                .entry(module)
                .or_insert(proto::Mapping { id: next_id, filename, has_functions: true })
                .id
        });
        functions.push(proto::Function {
            id,
            name: strings.id(&frame.display_name()),
            system_name: match frame.kind {
                FrameKind::Managed => 0,
                FrameKind::Kernel | FrameKind::Native => {
                    strings.id(frame.name().unwrap_or_default())
                }
            },
            filename: strings.id(module.unwrap_or_default()),
        });
        locations.push(proto::Location {
            id,
            mapping_id,
            address: frame.module_offset().unwrap_or(0),
            line: vec![proto::Line { function_id: id }],
        });
    }

    let numeric = |strings: &mut Strings, key: &str, num: u64| proto::Label {
        key: strings.id(key),
        str: 0,
        num: saturating_i64(num),
    };
    let text = |strings: &mut Strings, key: &str, text: &str| proto::Label {
        key: strings.id(key),
        str: strings.id(text),
        num: 0,
    };
    let mut samples = Vec::new();
    for process in profile.processes() {
        let info = process.info();
        let mut process_labels = vec![
            numeric(&mut strings, "pid", info.pid.into()),
            numeric(&mut strings, "process_start_ns", info.process_start_ns),
            text(&mut strings, "process", &info.name),
        ];
        if let Some(container_id) = &info.container_id {
            process_labels.push(text(&mut strings, "container_id", container_id));
        }
        if let Some(pod_uid) = &info.pod_uid {
            process_labels.push(text(&mut strings, "pod_uid", pod_uid));
        }
        for sample in process.samples() {
            let time_ns = sample.weight.saturating_mul(nanoseconds_per_weight);
            let mut label = process_labels.clone();
            label.push(numeric(&mut strings, "thread", sample.thread.into()));
            samples.push(proto::Sample {
                location_id: sample.stack.iter().map(|frame| frame.index() as u64 + 1).collect(),
                value: vec![saturating_i64(sample.samples), saturating_i64(time_ns)],
                label,
            });
        }
    }

    proto::Profile {
        sample_type,
        sample: samples,
        mapping: mappings.into_values().collect(),
        location: locations,
        function: functions,
        string_table: strings.0.into_iter().collect(),
        time_nanos: saturating_i64(profile.start_ns()),
        duration_nanos: saturating_i64(profile.duration_ns()),
        period_type,
        period: saturating_i64(nanoseconds_per_weight),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::num::NonZeroU32;

    use flate2::read::GzDecoder;

    use super::*;
    use crate::profile::model::{Frame, FrameKind, ProcessInfo};

    fn decode(bytes: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        GzDecoder::new(bytes).read_to_end(&mut raw).unwrap();
        proto::Profile::decode(raw.as_slice()).unwrap()
    }

    /// The strings a message's indexes name.
    fn s(profile: &proto::Profile, index: i64) -> &str {
        &profile.string_table[index as usize]
    }

    #[test]
    fn cpu_profile_round_trips_through_gzip_and_protobuf() {
        let mut model = Profile::new(
            Mode::Cpu { frequency_hz: NonZeroU32::new(100).unwrap() },
            1_700_000_000_000_000_000,
        );
        model.set_duration_ns(5_000_000_000);
        let p = model.add_process(ProcessInfo {
            pid: 42,
            process_start_ns: 123,
            name: "dotnet app.dll".into(),
            container_id: Some("c0ffee".into()),
            pod_uid: None,
        });
        let leaf = model.intern_frame(Frame::unnamed(FrameKind::Native, Some("/l/x.so"), 0x40));
        let native = model.intern_frame(Frame::named(FrameKind::Native, "w\x1b[2J", None));
        let root = model.intern_frame(Frame::named(FrameKind::Managed, "App.Main()", Some("app")));
        model.add_sample(p, 43, &[leaf, native, root], 3);

        let mut file = Vec::new();
        write(&model, &mut file).unwrap();
        let profile = decode(&file);
        assert_eq!(profile, to_proto(&model));

        assert_eq!(s(&profile, 0), "");
        let types: Vec<_> = profile
            .sample_type
            .iter()
            .map(|t| (s(&profile, t.r#type), s(&profile, t.unit)))
            .collect();
        assert_eq!(types, [SAMPLES, CPU_TIME]);
        let period_type = profile.period_type.unwrap();
        assert_eq!((s(&profile, period_type.r#type), s(&profile, period_type.unit)), CPU_TIME);
        assert_eq!(profile.period, 10_000_000);
        assert_eq!(profile.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(profile.duration_nanos, 5_000_000_000);

        assert_eq!(profile.sample.len(), 1);
        let sample = &profile.sample[0];
        assert_eq!(sample.location_id, [1, 2, 3]);
        assert_eq!(sample.value, [3, 30_000_000]);
        let labels: Vec<_> =
            sample.label.iter().map(|l| (s(&profile, l.key), s(&profile, l.str), l.num)).collect();
        assert_eq!(
            labels,
            [
                ("pid", "", 42),
                ("process_start_ns", "", 123),
                ("process", "dotnet app.dll", 0),
                ("container_id", "c0ffee", 0),
                ("thread", "", 43),
            ]
        );

        let functions: Vec<_> = profile
            .function
            .iter()
            .map(|f| {
                (f.id, s(&profile, f.name), s(&profile, f.system_name), s(&profile, f.filename))
            })
            .collect();
        assert_eq!(
            functions,
            [
                (1, "x.so+0x40", "", "/l/x.so"),
                (2, "w\u{fffd}[2J", "w\u{fffd}[2J", ""),
                (3, "App.Main()", "", "app")
            ]
        );
        let locations: Vec<_> = profile
            .location
            .iter()
            .map(|l| (l.id, l.mapping_id, l.address, l.line.clone()))
            .collect();
        assert_eq!(
            locations,
            [
                (1, 1, 0x40, vec![proto::Line { function_id: 1 }]),
                (2, 0, 0, vec![proto::Line { function_id: 2 }]),
                (3, 2, 0, vec![proto::Line { function_id: 3 }])
            ]
        );
        let mappings: Vec<_> = profile
            .mapping
            .iter()
            .map(|m| (m.id, s(&profile, m.filename), m.has_functions))
            .collect();
        assert_eq!(mappings, [(1, "/l/x.so", true), (2, "app", true)]);
    }

    #[test]
    fn off_cpu_values_are_stretches_and_nanoseconds() {
        let mut model = Profile::new(Mode::OffCpu, 0);
        let p = model.add_process(ProcessInfo {
            pid: 1,
            process_start_ns: 2,
            name: "a".into(),
            container_id: None,
            pod_uid: Some("pod".into()),
        });
        let f = model.intern_frame(Frame::named(FrameKind::Kernel, "schedule", None));
        model.add_sample(p, 1, &[f], 700);
        model.add_sample(p, 1, &[f], 300);
        let profile = to_proto(&model);
        let types: Vec<_> = profile
            .sample_type
            .iter()
            .map(|t| (s(&profile, t.r#type), s(&profile, t.unit)))
            .collect();
        assert_eq!(types, [SAMPLES, OFF_CPU_TIME]);
        assert_eq!(profile.period, 1);
        assert_eq!(profile.sample[0].value, [2, 1_000]);
        assert_eq!(profile.location[0].mapping_id, 0);
        assert_eq!(profile.mapping, []);
        assert_eq!(s(&profile, profile.sample[0].label[3].key), "pod_uid");
    }
}
