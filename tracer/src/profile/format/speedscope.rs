//! speedscope's JSON file format (<https://www.speedscope.app/file-format-schema.json>).
//!
//! * `shared.frames`: the frame table, each frame with its display `name` and its module as
//!   `file` (when known).
//! * One `sampled` profile per process, named `name (pid)`, its stacks merged over the process's
//!   threads: an aggregated profile has no time order, so per-thread profiles would only split
//!   the left-heavy and sandwich views of a thread pool into as many pieces as it has threads.
//!   The heaviest process is the one speedscope opens first.
//! * Weights are nanoseconds in both modes: off-CPU the nanoseconds blocked, on-CPU samples ×
//!   the sampling period (the `cpu/nanoseconds` of the pprof file), so speedscope shows times.
//! * Each sample's frames go root first (the model's stacks are leaf first).
//!
//! serde writes the JSON, so every name is escaped as a JSON string.
use std::borrow::Cow;
use std::io::Write;

use anyhow::Context as _;
use indexmap::IndexMap;
use serde::Serialize;

use super::process_title;
use crate::profile::model::{FrameId, Mode, ProcessProfile, Profile};

/// The `$schema` value by which speedscope recognises its format.
pub const SCHEMA_URL: &str = "https://www.speedscope.app/file-format-schema.json";
/// speedscope's unit of every weight tracer writes.
pub const UNIT: &str = "nanoseconds";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    name: String,
    exporter: String,
    active_profile_index: usize,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<Frame<'a>>,
}

#[derive(Serialize)]
struct Frame<'a> {
    name: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    start_value: u64,
    end_value: u64,
    /// Frame indexes, root first.
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// Writes `profile` as a speedscope JSON file.
pub fn write(profile: &Profile, mut out: impl Write) -> anyhow::Result<()> {
    let nanoseconds_per_weight = profile.mode().nanoseconds_per_weight();
    let profiles: Vec<SampledProfile> = profile
        .processes()
        .iter()
        .map(|process| sampled_profile(process, nanoseconds_per_weight))
        .collect();
    let heaviest = profiles
        .iter()
        .enumerate()
        .max_by_key(|(index, p)| (p.end_value, std::cmp::Reverse(*index)))
        .map_or(0, |(index, _)| index);
    let file = File {
        schema: SCHEMA_URL,
        name: match profile.mode() {
            Mode::Cpu { frequency_hz } => format!("CPU samples at {frequency_hz} Hz"),
            Mode::OffCpu => "Off-CPU time".to_owned(),
        },
        exporter: format!("tracer {}", env!("CARGO_PKG_VERSION")),
        active_profile_index: heaviest,
        shared: Shared {
            frames: profile
                .frames()
                .map(|frame| Frame { name: frame.display_name(), file: frame.module.as_deref() })
                .collect(),
        },
        profiles,
    };
    serde_json::to_writer(&mut out, &file).context("writing the speedscope file")?;
    out.flush().context("writing the speedscope file")
}

/// One process's stacks, merged over its threads, in the order they were first seen.
fn sampled_profile(process: &ProcessProfile, nanoseconds_per_weight: u64) -> SampledProfile {
    let mut stacks: IndexMap<&[FrameId], u64> = IndexMap::new();
    for sample in process.samples() {
        let weight = stacks.entry(sample.stack).or_default();
        *weight = weight.saturating_add(sample.weight.saturating_mul(nanoseconds_per_weight));
    }
    let end_value = stacks.values().fold(0u64, |sum, weight| sum.saturating_add(*weight));
    let (samples, weights) = stacks
        .into_iter()
        .map(|(stack, weight)| (stack.iter().rev().map(|frame| frame.index()).collect(), weight))
        .unzip();
    SampledProfile {
        kind: "sampled",
        name: process_title(process.info(), &process.info().name),
        unit: UNIT,
        start_value: 0,
        end_value,
        samples,
        weights,
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use serde_json::json;

    use super::*;
    use crate::profile::model::{Frame, FrameKind, ProcessInfo};

    fn process(pid: u32, name: &str) -> ProcessInfo {
        ProcessInfo {
            pid,
            process_start_ns: 0,
            name: name.into(),
            container_id: None,
            pod_uid: None,
        }
    }

    #[test]
    fn one_sampled_profile_per_process_root_first_in_nanoseconds() {
        let mut model = Profile::new(Mode::Cpu { frequency_hz: NonZeroU32::new(1000).unwrap() }, 0);
        let small = model.add_process(process(1, "small"));
        let big = model.add_process(process(2, "big \"<x>\"\n"));
        let leaf = model.intern_frame(Frame::named(FrameKind::Kernel, "leaf", Some("[k]")));
        let root = model.intern_frame(Frame::unnamed(FrameKind::Native, None, 0x10));
        model.add_sample(small, 1, &[leaf, root], 1);
        model.add_sample(big, 2, &[leaf, root], 2);
        model.add_sample(big, 3, &[leaf, root], 1);
        model.add_sample(big, 2, &[root], 1);

        let mut file = Vec::new();
        write(&model, &mut file).unwrap();
        let parsed: serde_json::Value = serde_json::from_slice(&file).unwrap();
        assert_eq!(
            parsed,
            json!({
                "$schema": SCHEMA_URL,
                "name": "CPU samples at 1000 Hz",
                "exporter": format!("tracer {}", env!("CARGO_PKG_VERSION")),
                "activeProfileIndex": 1,
                "shared": {"frames": [
                    {"name": "leaf", "file": "[k]"},
                    {"name": "[unknown]+0x10"},
                ]},
                "profiles": [
                    {"type": "sampled", "name": "small (1)", "unit": "nanoseconds",
                     "startValue": 0, "endValue": 1_000_000,
                     "samples": [[1, 0]], "weights": [1_000_000]},
                    {"type": "sampled", "name": "big \"<x>\"\n (2)", "unit": "nanoseconds",
                     "startValue": 0, "endValue": 4_000_000,
                     "samples": [[1, 0], [1]], "weights": [3_000_000, 1_000_000]},
                ],
            })
        );
    }

    #[test]
    fn off_cpu_weights_are_the_nanoseconds_blocked() {
        let mut model = Profile::new(Mode::OffCpu, 0);
        let p = model.add_process(process(1, "a"));
        let f = model.intern_frame(Frame::named(FrameKind::Kernel, "schedule", None));
        model.add_sample(p, 1, &[f], 1_234);
        let mut file = Vec::new();
        write(&model, &mut file).unwrap();
        let parsed: serde_json::Value = serde_json::from_slice(&file).unwrap();
        assert_eq!(parsed["name"], "Off-CPU time");
        assert_eq!(parsed["profiles"][0]["weights"], json!([1_234]));
        assert_eq!(parsed["profiles"][0]["endValue"], 1_234);
    }
}
