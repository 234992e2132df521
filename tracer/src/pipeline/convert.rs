//! `tracer convert`: a saved `.nettrace` (written by `tracer run --nettrace-dir`, or by
//! dotnet-trace) as the profile files `tracer profile` writes (docs/protocol/profiling.md,
//! "Converting a saved trace").
//!
//! The samples are the sample profiler's `ThreadSample` events (thread, time, stack), weight 1
//! each; their frames are named once the whole file is read, from the file's own method, module
//! and rundown events, each by the method whose code covered its address at the sample's time
//! ([`MethodTable::name_stack`], as `tracer profile` names JIT frames).
use std::collections::HashMap;
use std::fmt;
use std::io::Read as _;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use tracer_decode::nettrace::methods::MethodTable;
use tracer_decode::nettrace::runtime_events::{EVENTPIPE_PROVIDER, SAMPLE_PROFILER_PROVIDER};
use tracer_decode::nettrace::{Event, NettraceParser, NettraceStats, Value};

use crate::profile::format::Format;
use crate::profile::{Frame, FrameId, FrameKind, LimitCounts, Mode, ProcessSummary, Profile};
use crate::time::epoch_ns_of_utc_fields;

/// What a sample stands for: EventPipe's sample profiler takes one about every millisecond
/// (docs/protocol/runtime-events.md, "Sample profiler").
pub const SAMPLE_PROFILER_HZ: u32 = 1000;
/// Samples kept of a file (16 bytes each); past it, samples are refused and counted.
pub const MAX_SAMPLES: usize = 1 << 22;
/// Frames of the distinct stacks the kept samples name (8 bytes each); a sample with a new stack
/// past it is refused and counted.
pub const MAX_STACK_FRAMES: usize = 1 << 23;
/// How much of the file is read at a time.
const READ_CHUNK: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct ConvertConfig {
    /// The `.nettrace` file.
    pub input: PathBuf,
    /// The files to write.
    pub outputs: Vec<(Format, PathBuf)>,
}

/// What `tracer convert` did.
#[derive(Debug, Default)]
pub struct ConvertSummary {
    /// The process the file is about (its Trace object; 0 without one).
    pub pid: u32,
    /// Its command line (the file's ProcessInfo event), else the file's name.
    pub process_name: String,
    /// ThreadSample events in the file.
    pub samples: u64,
    /// Samples not kept: past [`MAX_SAMPLES`] or [`MAX_STACK_FRAMES`], or whose stack the
    /// parser did not keep (or the file never defined).
    pub samples_refused: u64,
    /// Method and module events taken; those whose payload did not decode.
    pub method_events: u64,
    pub undecodable: u64,
    /// How well the samples are named.
    pub summary: ProcessSummary,
    pub limits: LimitCounts,
    pub stream: NettraceStats,
    /// Why the file was not read to its end tag: the samples before are converted.
    pub stream_error: Option<String>,
    pub files: Vec<PathBuf>,
}

impl fmt::Display for ConvertSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let share = |n: u64, of: u64| if of == 0 { 0.0 } else { 100.0 * n as f64 / of as f64 };
        let s = &self.summary;
        writeln!(f, "tracer convert summary:")?;
        writeln!(
            f,
            "  pid {} ({}): {} samples, {} refused, named leaf {:.1} %, named frames {:.1} %, {} \
             method events ({} undecodable)",
            self.pid,
            tracer_decode::text::escape_control(&self.process_name),
            self.samples,
            self.samples_refused,
            share(s.leaf_named_samples, s.samples),
            share(s.named_frames, s.frames),
            self.method_events,
            self.undecodable,
        )?;
        if self.stream.stacks_refused > 0 {
            writeln!(f, "  stacks not kept: {}", self.stream.stacks_refused)?;
        }
        if let Some(e) = &self.stream_error {
            writeln!(f, "  the file ends early: {}", tracer_decode::text::escape_control(e))?;
        }
        for file in &self.files {
            writeln!(f, "  wrote {}", file.display())?;
        }
        Ok(())
    }
}

/// A sample kept until the file's method events are all in.
struct Stored {
    time: u64,
    thread: u32,
    stack: u32,
}

/// The samples of a file and the distinct stacks they name, within [`MAX_SAMPLES`] and
/// [`MAX_STACK_FRAMES`].
#[derive(Default)]
struct Samples {
    samples: Vec<Stored>,
    /// Each distinct stack once (leaf first): a thread's stack repeats while it waits.
    stacks: Vec<Box<[u64]>>,
    stack_ids: HashMap<Box<[u64]>, u32>,
    frames: usize,
    taken: u64,
    refused: u64,
}

impl Samples {
    fn take(&mut self, event: &Event<'_>) {
        self.taken += 1;
        let (Some(ips), true) = (event.stack, self.samples.len() < MAX_SAMPLES) else {
            self.refused += 1;
            return;
        };
        let stack = match self.stack_ids.get(ips) {
            Some(&id) => id,
            None if self.frames + ips.len() > MAX_STACK_FRAMES => {
                self.refused += 1;
                return;
            }
            None => {
                let id = self.stacks.len() as u32;
                self.frames += ips.len();
                self.stacks.push(ips.into());
                self.stack_ids.insert(ips.into(), id);
                id
            }
        };
        // Thread ids are the OS's (Linux: 32 bits); a larger one is clamped.
        let thread = u32::try_from(event.thread_id).unwrap_or(u32::MAX);
        self.samples.push(Stored { time: event.timestamp as u64, thread, stack });
    }
}

/// Reads the file, names its samples and writes the files.
pub fn run(config: &ConvertConfig) -> anyhow::Result<ConvertSummary> {
    anyhow::ensure!(!config.outputs.is_empty(), "no output format asked for");
    let path = &config.input;
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut parser = NettraceParser::default();
    let mut methods = MethodTable::default();
    let mut samples = Samples::default();
    let mut summary = ConvertSummary::default();
    let mut command_line = None;
    let mut span: Option<(u64, u64)> = None;
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = file.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            summary.stream_error = parser.finish().err().map(|e| e.to_string());
            break;
        }
        let fed = parser.feed(&buf[..n], |e| {
            let (meta, time) = (e.metadata, e.timestamp as u64);
            span =
                Some(span.map_or((time, time), |(first, last)| (first.min(time), last.max(time))));
            if let Some(decoded) =
                methods.take_event(&meta.provider, meta.event_id, e.payload, time)
            {
                summary.method_events += 1;
                summary.undecodable += u64::from(decoded.is_err());
            } else if is_thread_sample(e) {
                samples.take(e);
            } else if is_process_info(e) {
                command_line = process_command_line(e);
            }
        });
        if let Err(e) = fed {
            summary.stream_error = Some(e.to_string());
            break;
        }
    }
    if let Some(e) = &summary.stream_error {
        log::warn!(
            "{}: {} (the samples before it are converted)",
            path.display(),
            tracer_decode::text::escape_control(e)
        );
    }
    let trace = parser.trace().cloned();
    summary.pid = trace.as_ref().map_or(0, |t| t.process_id);
    summary.process_name = command_line.unwrap_or_else(|| file_name(path));
    let start_ns = trace
        .as_ref()
        .and_then(|t| epoch_ns_of_utc_fields(t.sync_time_utc))
        .and_then(|ns| u64::try_from(ns).ok())
        .unwrap_or(0);
    let mode = Mode::Cpu { frequency_hz: NonZeroU32::new(SAMPLE_PROFILER_HZ).expect("not 0") };
    let mut profile = Profile::new(mode, start_ns);
    let process = profile.add_process(crate::profile::ProcessInfo {
        pid: summary.pid,
        process_start_ns: 0,
        name: summary.process_name.clone(),
        container_id: None,
        pod_uid: None,
    });
    let mut stack: Vec<FrameId> = Vec::new();
    for sample in &samples.samples {
        stack.clear();
        let ips = &samples.stacks[sample.stack as usize];
        for (ip, method) in methods.name_stack(ips, sample.time) {
            // EventPipe walks managed frames only: one no method names is JIT or ReadyToRun
            // code whose method event is not in the file, or a stub.
            let frame = match method {
                Some(m) => Frame::named(FrameKind::Managed, &m.name, m.module.as_deref()),
                None => Frame::unnamed(FrameKind::Managed, None, ip),
            };
            stack.push(profile.intern_frame(frame));
        }
        profile.add_sample(process, sample.thread, &stack, 1);
    }
    let frequency = trace.as_ref().map_or(0, |t| t.qpc_frequency);
    profile.set_duration_ns(span.map_or(0, |(first, last)| ticks_to_ns(last - first, frequency)));
    summary.samples = samples.taken;
    summary.samples_refused = samples.refused;
    summary.summary = profile.summary(process);
    summary.limits = profile.limit_counts();
    summary.stream = parser.stats();
    for (format, output) in &config.outputs {
        format.write_file(&profile, output)?;
        summary.files.push(output.clone());
    }
    Ok(summary)
}

fn is_thread_sample(e: &Event<'_>) -> bool {
    e.metadata.event_id == 0 && e.metadata.provider.eq_ignore_ascii_case(SAMPLE_PROFILER_PROVIDER)
}

fn is_process_info(e: &Event<'_>) -> bool {
    e.metadata.event_id == 1 && e.metadata.provider.eq_ignore_ascii_case(EVENTPIPE_PROVIDER)
}

/// The `CommandLine` of EventPipe's ProcessInfo event, when it has one.
fn process_command_line(e: &Event<'_>) -> Option<String> {
    let decoded = e.decode();
    match decoded.fields.0.into_iter().find(|(name, _)| *name == "CommandLine")? {
        (_, Value::Str(text)) => Some(text),
        _ => None,
    }
}

/// `path`'s file name, what a process is called without a ProcessInfo event.
fn file_name(path: &Path) -> String {
    path.file_name().unwrap_or(path.as_os_str()).to_string_lossy().into_owned()
}

/// Timestamp ticks at `frequency` per second as nanoseconds (Linux: the ticks are ns).
fn ticks_to_ns(ticks: u64, frequency: i64) -> u64 {
    match u64::try_from(frequency) {
        Ok(0) | Err(_) => 0,
        Ok(frequency) => (u128::from(ticks) * 1_000_000_000 / u128::from(frequency))
            .try_into()
            .unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_decode::nettrace::EventMetadata;

    fn sample<'a>(metadata: &'a EventMetadata, stack: Option<&'a [u64]>) -> Event<'a> {
        Event {
            metadata,
            sequence: 1,
            thread_id: 7,
            capture_thread_id: 7,
            proc_num: 0,
            stack_id: 1,
            stack,
            timestamp: 100,
            activity_id: [0; 16],
            related_activity_id: [0; 16],
            is_sorted: false,
            payload: &[],
            pointer_size: 8,
            offset: 0,
        }
    }

    #[test]
    fn samples_and_their_distinct_stacks_are_bounded_and_refusals_counted() {
        let meta = EventMetadata::native(SAMPLE_PROFILER_PROVIDER, 0);
        let mut samples = Samples::default();
        samples.take(&sample(&meta, None));
        let half = vec![0x10u64; MAX_STACK_FRAMES / 2];
        let other = vec![0x20u64; MAX_STACK_FRAMES / 2];
        let third = vec![0x30u64; 1];
        for stack in [&half, &other, &third, &half] {
            samples.take(&sample(&meta, Some(stack)));
        }
        // No stack; the third distinct stack past the frames kept; a known stack still taken.
        assert_eq!((samples.taken, samples.refused, samples.samples.len()), (5, 2, 3));
        assert_eq!(samples.stacks.len(), 2);
        let small = [0x40u64];
        let mut samples = Samples::default();
        for _ in 0..=MAX_SAMPLES {
            samples.take(&sample(&meta, Some(&small)));
        }
        assert_eq!((samples.samples.len(), samples.refused), (MAX_SAMPLES, 1));
    }

    #[test]
    fn timestamps_convert_at_the_files_frequency() {
        assert_eq!(ticks_to_ns(1_500, 1_000_000_000), 1_500);
        assert_eq!(ticks_to_ns(3, 1_000), 3_000_000);
        assert_eq!(ticks_to_ns(u64::MAX, 1), u64::MAX, "saturates");
        assert_eq!((ticks_to_ns(5, 0), ticks_to_ns(5, -1)), (0, 0), "no frequency: no duration");
    }
}
