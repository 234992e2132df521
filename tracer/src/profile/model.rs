//! The in-memory profile: what was sampled (on-CPU samples or off-CPU stretches), a deduplicated
//! table of the frames the stacks name, and per process the distinct (thread, stack) entries with
//! their summed weights. The writers of [`super::format`] read it; the sampler fills it.
//!
//! Every string here comes from a traced process (method and module names, command lines), so
//! each is cut at [`MAX_NAME_BYTES`], and the tables are bounded ([`MAX_FRAMES`],
//! [`MAX_DISTINCT_STACKS`], [`MAX_STACK_DEPTH`]); what a bound refused is counted
//! ([`LimitCounts`]). Escaping is the writers' business: the model keeps names as given.
use std::borrow::Cow;
use std::collections::HashMap;
use std::num::NonZeroU32;

use indexmap::{Equivalent, IndexMap, IndexSet};

/// Longest frame name, module and process name (command line) kept, in bytes; a longer one is
/// cut at a character boundary and ends with [`NAME_CUT_MARKER`] (the marker included in the
/// bound). Long enough for the longest generic .NET method names seen in practice.
pub const MAX_NAME_BYTES: usize = 1024;
/// Ends a name that [`MAX_NAME_BYTES`] cut.
pub const NAME_CUT_MARKER: &str = "…";
/// Distinct frames in a profile. Once full, each new frame is replaced by the one frame named
/// [`FRAMES_OVER_LIMIT_NAME`] (counted in [`LimitCounts::frames_refused`]).
pub const MAX_FRAMES: usize = 1 << 20;
/// Name of the frame that stands for every frame refused by [`MAX_FRAMES`].
pub const FRAMES_OVER_LIMIT_NAME: &str = "[frames over the limit]";
/// Distinct (process, thread, stack) entries in a profile. A sample that would add one more is
/// refused and counted ([`ProcessSummary::refused_samples`]); samples of known entries still add.
pub const MAX_DISTINCT_STACKS: usize = 200_000;
/// Frames kept of one stack: a deeper stack keeps its leaf-most frames (the kernel cuts its own
/// stacks the same way, at `kernel.perf_event_max_stack`) and is counted
/// ([`LimitCounts::stacks_cut`]).
pub const MAX_STACK_DEPTH: usize = 512;
/// How an unnamed frame without a module shows its offset (`[unknown]+0x1a2b`).
pub const UNKNOWN_MODULE: &str = "[unknown]";

/// What was sampled, and so what a weight is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// On-CPU stacks sampled `frequency_hz` times a second per CPU: a weight is a sample count,
    /// each sample standing for [`Mode::sample_period_ns`] of CPU time.
    Cpu { frequency_hz: NonZeroU32 },
    /// Off-CPU stretches (dotnet-trace's `thread-time`): a weight is nanoseconds blocked.
    OffCpu,
}

impl Mode {
    /// The CPU time one sample stands for, 1/frequency in nanoseconds (rounded down); `None`
    /// off-CPU, where nothing is sampled.
    pub fn sample_period_ns(self) -> Option<u64> {
        match self {
            Mode::Cpu { frequency_hz } => Some(1_000_000_000 / u64::from(frequency_hz.get())),
            Mode::OffCpu => None,
        }
    }

    /// The nanoseconds a weight of 1 stands for: the sampling period on-CPU, 1 off-CPU.
    pub fn nanoseconds_per_weight(self) -> u64 {
        self.sample_period_ns().unwrap_or(1)
    }
}

/// Where the code of a frame runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Kernel,
    /// Native user-space code (the runtime, libc, other shared objects).
    Native,
    /// JIT-compiled or ReadyToRun .NET code.
    Managed,
}

/// What a frame is called, if it could be named.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Symbol {
    Named(String),
    /// Not named: the address as an offset into its module (or the absolute address when the
    /// module is unknown). Distinct offsets are distinct frames.
    Unnamed {
        module_offset: u64,
    },
}

/// One frame of the frame table. Named frames are deduplicated by (kind, module, name), so every
/// address within one function is the same frame; unnamed ones by (kind, module, offset).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub kind: FrameKind,
    /// The module's path (a shared object, `[kernel.kallsyms]`) or a managed assembly's name;
    /// `None` when unknown.
    pub module: Option<String>,
    pub symbol: Symbol,
}

impl Frame {
    pub fn named(kind: FrameKind, name: &str, module: Option<&str>) -> Frame {
        Frame { kind, module: module.map(str::to_owned), symbol: Symbol::Named(name.to_owned()) }
    }

    pub fn unnamed(kind: FrameKind, module: Option<&str>, module_offset: u64) -> Frame {
        Frame { kind, module: module.map(str::to_owned), symbol: Symbol::Unnamed { module_offset } }
    }

    pub fn is_named(&self) -> bool {
        matches!(self.symbol, Symbol::Named(_))
    }

    /// The name as given; `None` for an unnamed frame.
    pub fn name(&self) -> Option<&str> {
        match &self.symbol {
            Symbol::Named(name) => Some(name),
            Symbol::Unnamed { .. } => None,
        }
    }

    pub fn module_offset(&self) -> Option<u64> {
        match self.symbol {
            Symbol::Named(_) => None,
            Symbol::Unnamed { module_offset } => Some(module_offset),
        }
    }

    /// The name every format shows: the name, or for an unnamed frame its module's file name and
    /// the offset (`libcoreclr.so+0x1a2b`, `[unknown]+0x7f00deadbeef`), as perf shows them.
    pub fn display_name(&self) -> Cow<'_, str> {
        match &self.symbol {
            Symbol::Named(name) => Cow::Borrowed(name),
            Symbol::Unnamed { module_offset } => {
                let module = self.module.as_deref().map_or(UNKNOWN_MODULE, |m| {
                    m.rsplit('/').next().filter(|file| !file.is_empty()).unwrap_or(m)
                });
                Cow::Owned(format!("{module}+{module_offset:#x}"))
            }
        }
    }
}

/// Index of a frame in its profile's frame table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(u32);

impl FrameId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Index of a process in its profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId(u32);

impl ProcessId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Who a process is. (`pid`, `process_start_ns`) names one process even after its pid is reused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    /// When it started, CLOCK_BOOTTIME nanoseconds (as on tracer's output lines).
    pub process_start_ns: u64,
    /// What to call it: its command line, or its `comm`.
    pub name: String,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

/// Key of one aggregated entry of a process: samples of the same thread and stack add up.
#[derive(Debug, PartialEq, Eq, Hash)]
struct EntryKey {
    thread: u32,
    stack: Box<[FrameId]>,
}

/// [`EntryKey`] borrowed, to find an entry without allocating. Its derived `Hash` hashes the same
/// values in the same order as `EntryKey`'s (a `&[T]` hashes as the `Box<[T]>` does).
#[derive(Hash)]
struct EntryKeyRef<'a> {
    thread: u32,
    stack: &'a [FrameId],
}

impl Equivalent<EntryKey> for EntryKeyRef<'_> {
    fn equivalent(&self, key: &EntryKey) -> bool {
        self.thread == key.thread && *self.stack == *key.stack
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct EntryTotals {
    samples: u64,
    weight: u64,
}

/// The samples of one aggregated entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample<'a> {
    pub thread: u32,
    /// Leaf first, as the kernel gives stacks.
    pub stack: &'a [FrameId],
    /// Samples taken: on-CPU the weight itself, off-CPU the stretches added.
    pub samples: u64,
    /// Samples on-CPU, nanoseconds off-CPU.
    pub weight: u64,
}

/// One process and its entries, in the order they were first seen.
#[derive(Debug)]
pub struct ProcessProfile {
    info: ProcessInfo,
    entries: IndexMap<EntryKey, EntryTotals>,
    refused_samples: u64,
}

impl ProcessProfile {
    pub fn info(&self) -> &ProcessInfo {
        &self.info
    }

    pub fn samples(&self) -> impl ExactSizeIterator<Item = Sample<'_>> {
        self.entries.iter().map(|(key, totals)| Sample {
            thread: key.thread,
            stack: &key.stack,
            samples: totals.samples,
            weight: totals.weight,
        })
    }

    /// Sum of the weights of its samples.
    pub fn total_weight(&self) -> u64 {
        self.entries.values().fold(0, |sum, totals| sum.saturating_add(totals.weight))
    }
}

/// How well a process's samples are named.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessSummary {
    /// Samples taken (on-CPU samples, or off-CPU stretches).
    pub samples: u64,
    /// Samples whose leaf frame is named.
    pub leaf_named_samples: u64,
    /// Frames in all samples' stacks, each stack counted once per sample.
    pub frames: u64,
    /// Those of them that are named.
    pub named_frames: u64,
    /// Samples refused because the profile held [`MAX_DISTINCT_STACKS`] entries.
    pub refused_samples: u64,
}

impl ProcessSummary {
    /// `named_frames / frames`, `None` without frames.
    pub fn named_frame_share(&self) -> Option<f64> {
        (self.frames > 0).then(|| self.named_frames as f64 / self.frames as f64)
    }
}

/// What the bounds of the model refused or cut, over the whole profile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitCounts {
    /// Names, modules and process names cut at [`MAX_NAME_BYTES`].
    pub names_cut: u64,
    /// Frames replaced by [`FRAMES_OVER_LIMIT_NAME`] because the table held [`MAX_FRAMES`].
    pub frames_refused: u64,
    /// Stacks cut at [`MAX_STACK_DEPTH`] frames.
    pub stacks_cut: u64,
    /// Samples refused by [`MAX_DISTINCT_STACKS`], all processes together.
    pub samples_refused: u64,
}

/// A whole profile: its mode and time span, the frame table and the processes.
#[derive(Debug)]
pub struct Profile {
    mode: Mode,
    start_ns: u64,
    duration_ns: u64,
    frames: IndexSet<Frame>,
    processes: Vec<ProcessProfile>,
    process_ids: HashMap<(u32, u64), ProcessId>,
    distinct_stacks: usize,
    names_cut: u64,
    frames_refused: u64,
    stacks_cut: u64,
}

impl Profile {
    /// An empty profile that started at `start_ns` (wall clock, nanoseconds since the epoch).
    pub fn new(mode: Mode, start_ns: u64) -> Profile {
        Profile {
            mode,
            start_ns,
            duration_ns: 0,
            frames: IndexSet::new(),
            processes: Vec::new(),
            process_ids: HashMap::new(),
            distinct_stacks: 0,
            names_cut: 0,
            frames_refused: 0,
            stacks_cut: 0,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Wall-clock nanoseconds since the epoch when sampling started.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    pub fn duration_ns(&self) -> u64 {
        self.duration_ns
    }

    pub fn set_duration_ns(&mut self, duration_ns: u64) {
        self.duration_ns = duration_ns;
    }

    /// The id of `frame` in the frame table, adding it if new (its name and module cut at
    /// [`MAX_NAME_BYTES`]). Once the table holds [`MAX_FRAMES`], a new frame gets the id of the
    /// [`FRAMES_OVER_LIMIT_NAME`] frame.
    pub fn intern_frame(&mut self, mut frame: Frame) -> FrameId {
        if let Symbol::Named(name) = &mut frame.symbol {
            self.names_cut += u64::from(cut_name(name));
        }
        if let Some(module) = &mut frame.module {
            self.names_cut += u64::from(cut_name(module));
        }
        if let Some(index) = self.frames.get_index_of(&frame) {
            return FrameId(index as u32);
        }
        if self.frames.len() >= MAX_FRAMES {
            self.frames_refused += 1;
            frame = Frame::named(FrameKind::Native, FRAMES_OVER_LIMIT_NAME, None);
        }
        // MAX_FRAMES + 1 entries at most (the placeholder), well within u32.
        FrameId(self.frames.insert_full(frame).0 as u32)
    }

    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id.index()]
    }

    /// The frame table, in [`FrameId`] order.
    pub fn frames(&self) -> impl ExactSizeIterator<Item = &Frame> {
        self.frames.iter()
    }

    /// The id of the process (`info.pid`, `info.process_start_ns`), adding it if new; a known
    /// process keeps the information it was added with. Its strings are cut at
    /// [`MAX_NAME_BYTES`].
    pub fn add_process(&mut self, mut info: ProcessInfo) -> ProcessId {
        let key = (info.pid, info.process_start_ns);
        if let Some(&id) = self.process_ids.get(&key) {
            return id;
        }
        for text in [Some(&mut info.name), info.container_id.as_mut(), info.pod_uid.as_mut()]
            .into_iter()
            .flatten()
        {
            self.names_cut += u64::from(cut_name(text));
        }
        let id = ProcessId(u32::try_from(self.processes.len()).expect("fewer than 2^32 processes"));
        self.processes.push(ProcessProfile { info, entries: IndexMap::new(), refused_samples: 0 });
        self.process_ids.insert(key, id);
        id
    }

    pub fn process(&self, id: ProcessId) -> &ProcessProfile {
        &self.processes[id.index()]
    }

    /// The processes, in the order they were added.
    pub fn processes(&self) -> &[ProcessProfile] {
        &self.processes
    }

    /// Adds one sample of `thread` of `process` with `stack` (leaf first; ids of this profile's
    /// [`Profile::intern_frame`]): on-CPU a weight of n is n samples (1 for one timer sample),
    /// off-CPU one call is one stretch and the weight its nanoseconds. Identical (thread, stack)
    /// entries add up; a stack deeper than [`MAX_STACK_DEPTH`] keeps its leaf-most frames.
    /// Returns false when the sample was refused ([`MAX_DISTINCT_STACKS`]).
    ///
    /// Panics when `process` or a frame id is not of this profile.
    pub fn add_sample(
        &mut self,
        process: ProcessId,
        thread: u32,
        stack: &[FrameId],
        weight: u64,
    ) -> bool {
        assert!(
            stack.iter().all(|frame| frame.index() < self.frames.len()),
            "a frame id of another profile"
        );
        let stack = if stack.len() > MAX_STACK_DEPTH {
            self.stacks_cut += 1;
            &stack[..MAX_STACK_DEPTH]
        } else {
            stack
        };
        let samples = match self.mode {
            Mode::Cpu { .. } => weight,
            Mode::OffCpu => 1,
        };
        let process = &mut self.processes[process.index()];
        let index = match process.entries.get_index_of(&EntryKeyRef { thread, stack }) {
            Some(index) => index,
            None if self.distinct_stacks >= MAX_DISTINCT_STACKS => {
                process.refused_samples = process.refused_samples.saturating_add(samples);
                return false;
            }
            None => {
                self.distinct_stacks += 1;
                let key = EntryKey { thread, stack: stack.into() };
                process.entries.insert_full(key, EntryTotals::default()).0
            }
        };
        let totals = &mut process.entries[index];
        totals.samples = totals.samples.saturating_add(samples);
        totals.weight = totals.weight.saturating_add(weight);
        true
    }

    /// Samples, leaf naming and frame naming of one process.
    pub fn summary(&self, process: ProcessId) -> ProcessSummary {
        let process = self.process(process);
        let mut summary =
            ProcessSummary { refused_samples: process.refused_samples, ..Default::default() };
        for sample in process.samples() {
            let named = sample.stack.iter().filter(|&&id| self.frame(id).is_named()).count();
            let leaf_named = sample.stack.first().is_some_and(|&id| self.frame(id).is_named());
            summary.samples = summary.samples.saturating_add(sample.samples);
            if leaf_named {
                summary.leaf_named_samples =
                    summary.leaf_named_samples.saturating_add(sample.samples);
            }
            summary.frames = summary
                .frames
                .saturating_add(sample.samples.saturating_mul(sample.stack.len() as u64));
            summary.named_frames =
                summary.named_frames.saturating_add(sample.samples.saturating_mul(named as u64));
        }
        summary
    }

    pub fn limit_counts(&self) -> LimitCounts {
        LimitCounts {
            names_cut: self.names_cut,
            frames_refused: self.frames_refused,
            stacks_cut: self.stacks_cut,
            samples_refused: self
                .processes
                .iter()
                .fold(0, |sum, process| sum.saturating_add(process.refused_samples)),
        }
    }
}

/// Cuts `name` to [`MAX_NAME_BYTES`] (at a character boundary, ending with
/// [`NAME_CUT_MARKER`]); true when it was cut.
fn cut_name(name: &mut String) -> bool {
    if name.len() <= MAX_NAME_BYTES {
        return false;
    }
    let mut end = MAX_NAME_BYTES - NAME_CUT_MARKER.len();
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name.push_str(NAME_CUT_MARKER);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu() -> Mode {
        Mode::Cpu { frequency_hz: NonZeroU32::new(99).unwrap() }
    }

    fn process(pid: u32) -> ProcessInfo {
        ProcessInfo {
            pid,
            process_start_ns: 1_000 + u64::from(pid),
            name: format!("app{pid}"),
            container_id: None,
            pod_uid: None,
        }
    }

    #[test]
    fn frames_are_deduplicated_by_kind_module_and_name_or_offset() {
        let mut profile = Profile::new(cpu(), 0);
        let a = profile.intern_frame(Frame::named(FrameKind::Managed, "A.M()", Some("a.dll")));
        let a_again =
            profile.intern_frame(Frame::named(FrameKind::Managed, "A.M()", Some("a.dll")));
        let a_native =
            profile.intern_frame(Frame::named(FrameKind::Native, "A.M()", Some("a.dll")));
        let a_other_module = profile.intern_frame(Frame::named(FrameKind::Managed, "A.M()", None));
        let off1 = profile.intern_frame(Frame::unnamed(FrameKind::Native, Some("/l/x.so"), 0x10));
        let off1_again =
            profile.intern_frame(Frame::unnamed(FrameKind::Native, Some("/l/x.so"), 0x10));
        let off2 = profile.intern_frame(Frame::unnamed(FrameKind::Native, Some("/l/x.so"), 0x20));
        assert_eq!(a, a_again);
        assert_eq!(off1, off1_again);
        assert_eq!([a, a_native, a_other_module, off1, off2].map(FrameId::index), [0, 1, 2, 3, 4]);
        assert_eq!(profile.frames().len(), 5);
        assert_eq!(profile.frame(off2).display_name(), "x.so+0x20");
        assert_eq!(profile.frame(off2).module_offset(), Some(0x20));
        assert_eq!(profile.frame(a).module_offset(), None);
        assert_eq!(profile.frame(a).name(), Some("A.M()"));
        assert!(!profile.frame(off2).is_named());
    }

    #[test]
    fn unnamed_frames_show_module_file_and_offset() {
        let show = |module: Option<&str>, offset| {
            Frame::unnamed(FrameKind::Kernel, module, offset).display_name().into_owned()
        };
        assert_eq!(show(Some("[kernel.kallsyms]"), 0xabc), "[kernel.kallsyms]+0xabc");
        assert_eq!(show(Some("/usr/lib/libc.so.6"), 0), "libc.so.6+0x0");
        assert_eq!(show(Some("dir/"), 1), "dir/+0x1");
        assert_eq!(show(None, 0x7f00), "[unknown]+0x7f00");
    }

    #[test]
    fn identical_thread_and_stack_add_up_in_first_seen_order() {
        let mut profile = Profile::new(cpu(), 0);
        let p = profile.add_process(process(7));
        let leaf = profile.intern_frame(Frame::named(FrameKind::Kernel, "leaf", None));
        let root = profile.intern_frame(Frame::named(FrameKind::Native, "root", None));
        assert!(profile.add_sample(p, 70, &[leaf, root], 1));
        assert!(profile.add_sample(p, 71, &[leaf, root], 1));
        assert!(profile.add_sample(p, 70, &[root], 1));
        assert!(profile.add_sample(p, 70, &[leaf, root], 2));
        let samples: Vec<_> = profile.process(p).samples().collect();
        assert_eq!(
            samples,
            [
                Sample { thread: 70, stack: &[leaf, root], samples: 3, weight: 3 },
                Sample { thread: 71, stack: &[leaf, root], samples: 1, weight: 1 },
                Sample { thread: 70, stack: &[root], samples: 1, weight: 1 },
            ]
        );
        assert_eq!(profile.process(p).total_weight(), 5);
    }

    #[test]
    fn off_cpu_counts_one_sample_per_stretch_and_sums_nanoseconds() {
        let mut profile = Profile::new(Mode::OffCpu, 0);
        let p = profile.add_process(process(7));
        let f = profile.intern_frame(Frame::named(FrameKind::Kernel, "schedule", None));
        profile.add_sample(p, 1, &[f], 1_500);
        profile.add_sample(p, 1, &[f], 2_500);
        let samples: Vec<_> = profile.process(p).samples().collect();
        assert_eq!(samples, [Sample { thread: 1, stack: &[f], samples: 2, weight: 4_000 }]);
        assert_eq!(profile.summary(p).samples, 2);
    }

    #[test]
    fn a_process_is_known_by_pid_and_start_time() {
        let mut profile = Profile::new(cpu(), 0);
        let first = profile.add_process(process(7));
        let renamed = profile.add_process(ProcessInfo { name: "other".into(), ..process(7) });
        let reused_pid = profile.add_process(ProcessInfo { process_start_ns: 5, ..process(7) });
        assert_eq!(first, renamed);
        assert_ne!(first, reused_pid);
        assert_eq!(profile.processes().len(), 2);
        assert_eq!(profile.process(first).info().name, "app7");
    }

    #[test]
    fn summary_counts_named_leaves_and_named_frames() {
        let mut profile = Profile::new(cpu(), 0);
        let p = profile.add_process(process(7));
        let named = profile.intern_frame(Frame::named(FrameKind::Managed, "M", None));
        let unnamed = profile.intern_frame(Frame::unnamed(FrameKind::Native, None, 1));
        profile.add_sample(p, 1, &[named, unnamed], 3);
        profile.add_sample(p, 1, &[unnamed, named, named], 1);
        profile.add_sample(p, 1, &[], 1);
        let summary = profile.summary(p);
        assert_eq!(
            summary,
            ProcessSummary {
                samples: 5,
                leaf_named_samples: 3,
                frames: 9,
                named_frames: 5,
                refused_samples: 0
            }
        );
        assert_eq!(summary.named_frame_share(), Some(5.0 / 9.0));
        assert_eq!(ProcessSummary::default().named_frame_share(), None);
    }

    #[test]
    fn long_names_are_cut_at_a_character_boundary_with_the_marker() {
        let mut profile = Profile::new(cpu(), 0);
        // 'é' is two bytes: the cut point falls inside one of them.
        let long = "é".repeat(MAX_NAME_BYTES);
        let id = profile.intern_frame(Frame::named(FrameKind::Managed, &long, Some(&long)));
        let cut = format!("{}{NAME_CUT_MARKER}", "é".repeat(510));
        assert_eq!(cut.len(), MAX_NAME_BYTES - 1);
        let frame = profile.frame(id);
        assert_eq!(frame.name(), Some(cut.as_str()));
        assert_eq!(frame.module.as_deref(), Some(cut.as_str()));
        let p = profile.add_process(ProcessInfo { name: long.clone(), ..process(1) });
        assert_eq!(profile.process(p).info().name, cut);
        let exact = "x".repeat(MAX_NAME_BYTES);
        profile.intern_frame(Frame::named(FrameKind::Native, &exact, None));
        assert_eq!(profile.frames().last().unwrap().name(), Some(exact.as_str()));
        assert_eq!(profile.limit_counts().names_cut, 3);
    }

    #[test]
    fn deep_stacks_keep_their_leaf_most_frames() {
        let mut profile = Profile::new(cpu(), 0);
        let p = profile.add_process(process(1));
        let leaf = profile.intern_frame(Frame::named(FrameKind::Kernel, "leaf", None));
        let other = profile.intern_frame(Frame::named(FrameKind::Native, "other", None));
        let mut stack = vec![other; MAX_STACK_DEPTH + 10];
        stack[0] = leaf;
        profile.add_sample(p, 1, &stack, 1);
        let sample = profile.process(p).samples().next().unwrap();
        assert_eq!(sample.stack, &stack[..MAX_STACK_DEPTH]);
        assert_eq!(profile.limit_counts().stacks_cut, 1);
    }

    #[test]
    fn distinct_stacks_are_bounded_and_refusals_counted() {
        let mut profile = Profile::new(Mode::OffCpu, 0);
        let p = profile.add_process(process(1));
        let q = profile.add_process(process(2));
        let f = profile.intern_frame(Frame::named(FrameKind::Kernel, "f", None));
        for thread in 0..MAX_DISTINCT_STACKS as u32 {
            assert!(profile.add_sample(p, thread, &[f], 1));
        }
        assert!(!profile.add_sample(q, 0, &[f], 1));
        assert!(!profile.add_sample(p, u32::MAX, &[f], 1));
        // A known entry still adds.
        assert!(profile.add_sample(p, 0, &[f], 1));
        assert_eq!(profile.process(p).samples().len(), MAX_DISTINCT_STACKS);
        assert_eq!(profile.summary(q).refused_samples, 1);
        assert_eq!(profile.summary(p).refused_samples, 1);
        assert_eq!(profile.limit_counts().samples_refused, 2);
    }

    #[test]
    fn frames_over_the_limit_share_one_placeholder() {
        let mut profile = Profile::new(Mode::OffCpu, 0);
        for offset in 0..MAX_FRAMES as u64 {
            profile.intern_frame(Frame::unnamed(FrameKind::Native, None, offset));
        }
        let first_refused = profile.intern_frame(Frame::unnamed(FrameKind::Native, None, u64::MAX));
        let second_refused = profile.intern_frame(Frame::named(FrameKind::Kernel, "k", None));
        let known = profile.intern_frame(Frame::unnamed(FrameKind::Native, None, 5));
        assert_eq!(first_refused, second_refused);
        assert_eq!(first_refused.index(), MAX_FRAMES);
        assert_eq!(profile.frame(first_refused).name(), Some(FRAMES_OVER_LIMIT_NAME));
        assert_eq!(known.index(), 5);
        assert_eq!(profile.limit_counts().frames_refused, 2);
    }

    #[test]
    fn cpu_period_is_one_over_the_frequency() {
        let at = |hz| Mode::Cpu { frequency_hz: NonZeroU32::new(hz).unwrap() }.sample_period_ns();
        assert_eq!(at(100), Some(10_000_000));
        assert_eq!(at(99), Some(10_101_010));
        assert_eq!(Mode::OffCpu.sample_period_ns(), None);
        assert_eq!(
            Mode::Cpu { frequency_hz: NonZeroU32::new(99).unwrap() }.nanoseconds_per_weight(),
            10_101_010
        );
        assert_eq!(Mode::OffCpu.nanoseconds_per_weight(), 1);
    }
}
