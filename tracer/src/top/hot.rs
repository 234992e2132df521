//! The methods each process runs on CPU "now": the kernel sampler's CPU samples of the last
//! [`HOT_WINDOW`], each named by its innermost managed frame as `tracer profile` names frames
//! (the runtime's own method events, `MethodTable::lookup` at the sample's time).
//!
//! A runtime lists its methods only in a rundown, when a session stops. So a process is asked
//! for one only when it needs it: when enough of its recent samples are in code that may be
//! managed (JIT memory, a ReadyToRun image) and that no method it listed covers — at most once
//! every [`RUNDOWN_INTERVAL`], a few processes at a time. A process that runs no unnamed
//! managed code is never asked anything beyond its counters.
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracer_decode::nettrace::methods::{MethodTable, code_address};

use super::model::HotMethods;
use crate::kernel::sampler::RawSample;
use crate::pipeline::profile::{MAPS_REFRESH, holds_jit_code};
use crate::profile::symbolize::ProcessMaps;

/// CPU samples per second and CPU: low, so watching every runtime costs little; a process busy
/// on one CPU still gives ~250 samples a window.
pub const SAMPLE_HZ: u64 = 49;
/// The samples the hottest methods are counted over.
pub const HOT_WINDOW: Duration = Duration::from_secs(5);
/// User frames kept of a sample, leaf first: its innermost managed frame is among the first
/// few (native helpers of the runtime sit below it).
pub const MAX_KEPT_FRAMES: usize = 32;
/// Samples kept, all processes together (the window at [`SAMPLE_HZ`] on 64 CPUs holds ~16 000):
/// past it, samples are refused and counted.
pub const MAX_WINDOW_SAMPLES: usize = 16_384;
/// The least time between two rundowns of one process.
pub const RUNDOWN_INTERVAL: Duration = Duration::from_secs(30);
/// Rundowns under way at once, all processes together.
pub const MAX_CONCURRENT_RUNDOWNS: usize = 4;
/// A process is asked for a rundown once this many of its window's samples are in unnamed code
/// that may be managed, and they are at least a tenth of its samples.
pub const MIN_UNNAMED_FOR_RUNDOWN: u32 = 3;
/// Bytes of method tables kept, all processes together (each table is bounded by
/// `MAX_METHOD_TABLE_BYTES`): a table that would pass it is not kept (counted).
pub const MAX_TABLE_BYTES: usize = 256 << 20;

/// What a sample's stack says about managed code.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Leaf {
    /// Its innermost frame a method covers.
    Method(Arc<str>),
    /// No method covers any frame, but one lies in code that may be managed.
    Unnamed,
    /// Every frame is native (or the stack is empty: a kernel thread, an unreadable stack).
    Native,
}

struct Sample {
    time_ns: u64,
    /// The addresses to name the user frames by (`code_address`), leaf first.
    frames: Box<[u64]>,
    /// The leaf as named with the table of this generation.
    named: Option<(u64, Leaf)>,
}

/// One sampled process.
struct Sampled {
    table: MethodTable,
    /// Counts the tables received: samples named with an older one are named again.
    generation: u64,
    maps: Option<ProcessMaps>,
    maps_read: Option<Instant>,
    samples: VecDeque<Sample>,
    rundown_started: Option<Instant>,
    rundown_in_flight: bool,
    hot: HotMethods,
    unnamed: u32,
}

/// Counts of what was not kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotLosses {
    /// Samples refused past [`MAX_WINDOW_SAMPLES`].
    pub samples_refused: u64,
    /// Method tables not kept past [`MAX_TABLE_BYTES`].
    pub tables_refused: u64,
}

/// The samples and method tables of every sampled process.
#[derive(Default)]
pub struct HotSampling {
    processes: HashMap<u32, Sampled>,
    kept: usize,
    table_bytes: usize,
    in_flight: usize,
    pub losses: HotLosses,
}

impl HotSampling {
    pub fn add(&mut self, pid: u32) {
        self.processes.entry(pid).or_insert_with(|| Sampled {
            table: MethodTable::default(),
            generation: 0,
            maps: None,
            maps_read: None,
            samples: VecDeque::new(),
            rundown_started: None,
            rundown_in_flight: false,
            hot: HotMethods::default(),
            unnamed: 0,
        });
    }

    pub fn remove(&mut self, pid: u32) {
        if let Some(p) = self.processes.remove(&pid) {
            self.kept -= p.samples.len();
            self.table_bytes -= p.table.heap_bytes();
        }
    }

    /// Keeps a CPU sample of a sampled process (others are ignored).
    pub fn take(&mut self, sample: &RawSample) {
        let Some(process) = self.processes.get_mut(&sample.tgid) else { return };
        if self.kept >= MAX_WINDOW_SAMPLES {
            self.losses.samples_refused += 1;
            return;
        }
        let first_user = sample.kernel_frames.len();
        let frames = sample.user_frames.iter().take(MAX_KEPT_FRAMES).enumerate();
        process.samples.push_back(Sample {
            time_ns: sample.time_ns,
            frames: frames.map(|(i, &address)| code_address(first_user + i, address)).collect(),
            named: None,
        });
        self.kept += 1;
    }

    /// Drops samples older than the window before `now_ns` (CLOCK_MONOTONIC, the samples'
    /// clock), names the others, and counts each process's hot methods. Returns the processes
    /// to ask for a rundown now (each marked as under way).
    pub fn refresh(&mut self, now_ns: u64) -> Vec<u32> {
        let since = now_ns.saturating_sub(HOT_WINDOW.as_nanos() as u64);
        let mut rundowns = Vec::new();
        for (&pid, process) in &mut self.processes {
            while process.samples.front().is_some_and(|s| s.time_ns < since) {
                process.samples.pop_front();
                self.kept -= 1;
            }
            process.count(pid);
            let unnamed = process.unnamed;
            let due = process.rundown_started.is_none_or(|at| at.elapsed() >= RUNDOWN_INTERVAL);
            if !process.rundown_in_flight
                && due
                && unnamed >= MIN_UNNAMED_FOR_RUNDOWN
                && unnamed * 10 >= process.hot.samples
                && self.in_flight < MAX_CONCURRENT_RUNDOWNS
            {
                process.rundown_in_flight = true;
                process.rundown_started = Some(Instant::now());
                self.in_flight += 1;
                rundowns.push(pid);
            }
        }
        rundowns
    }

    /// The hot methods of `pid` as of the last [`refresh`](Self::refresh).
    pub fn hot(&self, pid: u32) -> Option<&HotMethods> {
        self.processes.get(&pid).map(|p| &p.hot)
    }

    /// Whether a rundown of `pid` is under way.
    pub fn rundown_in_flight(&self, pid: u32) -> bool {
        self.processes.get(&pid).is_some_and(|p| p.rundown_in_flight)
    }

    /// A rundown of `pid` ended: its methods (`None`: it gave none) name the samples from now on.
    pub fn rundown_done(&mut self, pid: u32, table: Option<MethodTable>) {
        let Some(process) = self.processes.get_mut(&pid) else { return };
        if process.rundown_in_flight {
            process.rundown_in_flight = false;
            self.in_flight -= 1;
        }
        let Some(table) = table else { return };
        let bytes = self.table_bytes - process.table.heap_bytes() + table.heap_bytes();
        if bytes > MAX_TABLE_BYTES {
            self.losses.tables_refused += 1;
            log::warn!(
                "pid {pid}: its method table is not kept: tables would take more than \
                 {MAX_TABLE_BYTES} bytes"
            );
            return;
        }
        self.table_bytes = bytes;
        process.table = table;
        process.generation += 1;
    }
}

impl Sampled {
    /// Names the samples not named with the current table, and counts them by leaf.
    fn count(&mut self, pid: u32) {
        let mut counts: HashMap<Arc<str>, u32> = HashMap::new();
        let (mut unnamed, generation) = (0, self.generation);
        for i in 0..self.samples.len() {
            let leaf = match &self.samples[i].named {
                Some((g, leaf)) if *g == generation => leaf.clone(),
                _ => {
                    // Taken out while the process's table and maps name them.
                    let frames = std::mem::take(&mut self.samples[i].frames);
                    let leaf = self.name(pid, &frames, self.samples[i].time_ns);
                    let sample = &mut self.samples[i];
                    (sample.frames, sample.named) = (frames, Some((generation, leaf.clone())));
                    leaf
                }
            };
            match leaf {
                Leaf::Method(name) => *counts.entry(name).or_default() += 1,
                Leaf::Unnamed => unnamed += 1,
                Leaf::Native => {}
            }
        }
        let mut methods: Vec<(Arc<str>, u32)> = counts.into_iter().collect();
        methods.sort_by(|(a, na), (b, nb)| nb.cmp(na).then_with(|| a.cmp(b)));
        self.hot = HotMethods { samples: self.samples.len() as u32, methods };
        self.unnamed = unnamed;
    }

    fn name(&mut self, pid: u32, frames: &[u64], time_ns: u64) -> Leaf {
        if let Some(method) = frames.iter().find_map(|&a| self.table.lookup(a, time_ns)) {
            return Leaf::Method(method.name);
        }
        if frames.iter().any(|&a| self.may_be_managed(pid, a)) {
            Leaf::Unnamed
        } else {
            Leaf::Native
        }
    }

    /// Whether `address` lies where managed code runs: JIT memory, or a ReadyToRun image (a
    /// mapped `.dll`). The mappings are read when first needed and again, at most every
    /// [`MAPS_REFRESH`], when an address lies outside them.
    fn may_be_managed(&mut self, pid: u32, address: u64) -> bool {
        let stale = self.maps_read.is_none_or(|at| at.elapsed() >= MAPS_REFRESH);
        if stale && self.maps.as_ref().is_none_or(|m| m.mapping(address).is_none()) {
            self.maps_read = Some(Instant::now());
            if let Ok(maps) = ProcessMaps::read(pid) {
                self.maps = Some(maps);
            }
        }
        let Some(mapping) = self.maps.as_ref().and_then(|m| m.mapping(address)) else {
            return false;
        };
        let module = mapping.module();
        holds_jit_code(module) || module.to_ascii_lowercase().ends_with(".dll")
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::sampling::SampleKind;
    use tracer_decode::nettrace::methods::{CodeEvent, MethodCode};

    use super::*;

    fn sample(pid: u32, time_ns: u64, frames: Vec<u64>) -> RawSample {
        RawSample {
            kind: SampleKind::Cpu,
            time_ns,
            tgid: pid,
            tid: pid,
            cpu: 0,
            kernel_frames: Vec::new(),
            user_frames: frames,
            weight: 1,
            kernel_stack_error: None,
            user_stack_error: None,
        }
    }

    fn table(methods: &[(&str, u64, u32)]) -> MethodTable {
        let mut table = MethodTable::default();
        for (i, &(name, start, size)) in methods.iter().enumerate() {
            let code = MethodCode {
                method_id: i as u64 + 1,
                module_id: 0,
                start,
                size,
                flags: 0,
                namespace: "App".into(),
                name: name.into(),
                signature: String::new(),
            };
            table.method(CodeEvent::Listed, &code, 0);
        }
        table
    }

    const SECOND: u64 = 1_000_000_000;
    /// Above any pid_max: its `/proc` entry (the maps read for unnamed frames) never exists.
    const PID: u32 = 4_000_000_000;

    #[test]
    fn samples_are_counted_by_their_innermost_method_in_the_window() {
        let mut hot = HotSampling::default();
        hot.add(PID);
        hot.rundown_done(PID, Some(table(&[("Inner", 0x1000, 0x100), ("Outer", 0x2000, 0x100)])));
        // Leaf in Inner; leaf in native code (not named) called from Outer; a sample only
        // native; one of another process (ignored).
        hot.take(&sample(PID, 10 * SECOND, vec![0x1010, 0x2010]));
        hot.take(&sample(PID, 10 * SECOND, vec![0x1020]));
        hot.take(&sample(PID, 11 * SECOND, vec![0x9000, 0x2011]));
        hot.take(&sample(PID, 11 * SECOND, vec![0x9000]));
        hot.take(&sample(8, 11 * SECOND, vec![0x1010]));
        assert!(hot.refresh(12 * SECOND).is_empty(), "no rundown needed: no managed code unnamed");
        let methods = vec![("App.Inner".into(), 2), ("App.Outer".into(), 1)];
        assert_eq!(hot.hot(PID), Some(&HotMethods { samples: 4, methods }));
        // Past the window the first two are gone.
        hot.refresh(10 * SECOND + HOT_WINDOW.as_nanos() as u64 + 1);
        let methods = vec![("App.Outer".into(), 1)];
        assert_eq!(hot.hot(PID), Some(&HotMethods { samples: 2, methods }));
        assert_eq!(hot.kept, 2);
        hot.remove(PID);
        assert_eq!((hot.kept, hot.hot(PID)), (0, None));
    }

    #[test]
    fn samples_are_named_again_when_a_table_arrives_and_the_kept_samples_are_bounded() {
        let mut hot = HotSampling::default();
        hot.add(PID);
        hot.take(&sample(PID, SECOND, vec![0x1010]));
        hot.refresh(SECOND);
        assert_eq!(hot.hot(PID).unwrap().methods, []);
        hot.rundown_done(PID, Some(table(&[("Inner", 0x1000, 0x100)])));
        hot.refresh(SECOND);
        assert_eq!(hot.hot(PID).unwrap().methods, [("App.Inner".into(), 1)]);
        for _ in 1..MAX_WINDOW_SAMPLES {
            hot.take(&sample(PID, SECOND, vec![0x1010]));
        }
        hot.take(&sample(PID, SECOND, vec![0x1010]));
        assert_eq!(hot.losses.samples_refused, 1);
    }
}
