//! What `tracer top` knows of each .NET process: its identity, the runtime counters its session
//! sends (turned into levels and rates), its CPU and memory from `/proc`, its hottest methods;
//! and how the list is ordered and filtered. Pure: the pipeline feeds it, the view and the
//! snapshot read it.
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use tracer_decode::counters::CounterSample;

use crate::output::{Incarnation, ProcessLabels, TopProcess};

/// Values each sparkline keeps: a minute of one-second values.
pub const HISTORY_POINTS: usize = 60;

/// The runtime counters `tracer top` shows, as `System.Runtime` reports them
/// (docs/protocol/counters.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    GcHeap,
    Gen0Gcs,
    Gen1Gcs,
    Gen2Gcs,
    GcPaused,
    Allocations,
    Exceptions,
    LockContentions,
    PoolThreads,
    PoolQueue,
}

/// How a counter's value becomes what is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reading {
    /// A level (a gauge): shown as it is.
    Level,
    /// What was added during the counter's interval: shown per second.
    PerInterval,
    /// Milliseconds added during the counter's interval: shown as their share of it, in
    /// percent.
    MsPerInterval,
}

/// Each counter with the metric its `System.Runtime` counter is named as (dotnet-monitor's
/// naming, `tracer_decode::counters::metric_name`) and how it is read.
const COUNTERS: [(Counter, &str, Reading); 10] = [
    (Counter::GcHeap, "systemruntime_gc_heap_size_bytes", Reading::Level),
    (Counter::Gen0Gcs, "systemruntime_gen_0_gc_count", Reading::PerInterval),
    (Counter::Gen1Gcs, "systemruntime_gen_1_gc_count", Reading::PerInterval),
    (Counter::Gen2Gcs, "systemruntime_gen_2_gc_count", Reading::PerInterval),
    (Counter::GcPaused, "systemruntime_total_pause_time_by_gc_ms", Reading::MsPerInterval),
    (Counter::Allocations, "systemruntime_alloc_rate_bytes", Reading::PerInterval),
    (Counter::Exceptions, "systemruntime_exception_count", Reading::PerInterval),
    (Counter::LockContentions, "systemruntime_monitor_lock_contention_count", Reading::PerInterval),
    (Counter::PoolThreads, "systemruntime_threadpool_thread_count", Reading::Level),
    (Counter::PoolQueue, "systemruntime_threadpool_queue_length", Reading::Level),
];

impl Reading {
    /// A rate's `amount` over `secs` as shown: per second, or (milliseconds) a percentage of
    /// the time.
    fn per_second(self, amount: f64, secs: f64) -> f64 {
        match self {
            Reading::MsPerInterval => (amount / (secs * 1000.0) * 100.0).min(100.0),
            Reading::Level | Reading::PerInterval => amount / secs,
        }
    }
}

impl Counter {
    pub const ALL: [Counter; 10] = [
        Counter::GcHeap,
        Counter::Gen0Gcs,
        Counter::Gen1Gcs,
        Counter::Gen2Gcs,
        Counter::GcPaused,
        Counter::Allocations,
        Counter::Exceptions,
        Counter::LockContentions,
        Counter::PoolThreads,
        Counter::PoolQueue,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn of_metric(metric: &str) -> Option<(Counter, Reading)> {
        COUNTERS.iter().find(|(_, m, _)| *m == metric).map(|&(c, _, r)| (c, r))
    }

    /// The counter's metric name.
    pub fn metric(self) -> &'static str {
        COUNTERS[self.index()].1
    }
}

/// The last values of a series, oldest first, at most [`HISTORY_POINTS`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History(VecDeque<f64>);

impl History {
    pub fn push(&mut self, value: f64) {
        if self.0.len() == HISTORY_POINTS {
            self.0.pop_front();
        }
        self.0.push_back(value);
    }

    pub fn values(&self) -> impl ExactSizeIterator<Item = f64> + '_ {
        self.0.iter().copied()
    }
}

/// What a counter added over the intervals it covered: a rate over all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Added {
    amount: f64,
    secs: f64,
}

/// The counters of one process's session, as shown: each `None` until the runtime reports it
/// (and again once the session has ended), never a made-up 0.
#[derive(Clone, Debug, Default)]
pub struct RuntimeCounters {
    latest: [Option<f64>; Counter::ALL.len()],
    history: [History; Counter::ALL.len()],
    /// What each rate added since the session started.
    added: [Option<Added>; Counter::ALL.len()],
    /// When the intervals of those rates began and ended (CLOCK_MONOTONIC ns).
    rates_span: Option<(u64, u64)>,
    /// The metric a session sends first in each round: seeing it again starts the next round.
    round_start: Option<Arc<str>>,
    rounds: u32,
}

impl RuntimeCounters {
    /// Takes one counter value of the process's session, written by the runtime at `time_ns`
    /// (CLOCK_MONOTONIC); counters `tracer top` does not show are left alone.
    pub fn record(&mut self, sample: &CounterSample, time_ns: u64) {
        match &self.round_start {
            Some(first) if **first == *sample.metric => self.rounds += 1,
            Some(_) => {}
            None => {
                self.round_start = Some(sample.metric.clone());
                self.rounds = 1;
            }
        }
        let Some((counter, reading)) = Counter::of_metric(&sample.metric) else { return };
        let i = counter.index();
        // What was added, over how many seconds.
        let added = match (reading, sample.interval_secs) {
            (Reading::Level, _) | (_, None) => None,
            (Reading::PerInterval | Reading::MsPerInterval, Some(secs)) => {
                sample.value().map(|amount| (amount, secs))
            }
        };
        if let Some((amount, secs)) = added.filter(|(a, _)| a.is_finite()) {
            let so_far = self.added[i].get_or_insert_default();
            so_far.amount += amount;
            so_far.secs += secs;
            let began = time_ns.saturating_sub((secs * 1e9) as u64);
            let (from, _) = *self.rates_span.get_or_insert((began, time_ns));
            self.rates_span = Some((from.min(began), time_ns));
        }
        let shown = match reading {
            Reading::Level => sample.value(),
            Reading::PerInterval | Reading::MsPerInterval => {
                added.map(|(amount, secs)| reading.per_second(amount, secs))
            }
        };
        if let Some(value) = shown.filter(|v| v.is_finite()) {
            self.latest[i] = Some(value);
            self.history[i].push(value);
        }
    }

    /// The counter's last value (a rate: over its last interval).
    pub fn get(&self, counter: Counter) -> Option<f64> {
        self.latest[counter.index()]
    }

    /// The counter over the whole session: a level's last value, a rate over every interval
    /// reported (a process's moment of contention for the CPU moves work across one interval's
    /// end, not out of the session).
    pub fn over_session(&self, counter: Counter) -> Option<f64> {
        let (_, _, reading) = COUNTERS[counter.index()];
        match reading {
            Reading::Level => self.get(counter),
            Reading::PerInterval | Reading::MsPerInterval => self.added[counter.index()]
                .filter(|a| a.secs > 0.0)
                .map(|a| reading.per_second(a.amount, a.secs)),
        }
    }

    pub fn history(&self, counter: Counter) -> &History {
        &self.history[counter.index()]
    }

    /// When the intervals [`over_session`](Self::over_session)'s rates cover began and ended
    /// (CLOCK_MONOTONIC ns).
    pub fn rates_span(&self) -> Option<(u64, u64)> {
        self.rates_span
    }

    /// Whole rounds of counters received (a round is whole once the next one begins): the first
    /// may cover less than an interval.
    pub fn whole_rounds(&self) -> u32 {
        self.rounds.saturating_sub(1)
    }

    /// The session ended: its last values no longer describe the process.
    pub fn clear(&mut self) {
        self.latest = Default::default();
        self.added = Default::default();
        self.rates_span = None;
    }
}

/// Where a process's session is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// Looking for its socket, or waiting for a session slot.
    Starting,
    Tracing,
    /// Ended with this reason (`session_ended`'s).
    Ended(&'static str),
    /// No session: why.
    Failed(String),
}

impl SessionState {
    pub fn name(&self) -> &'static str {
        match self {
            SessionState::Starting => "starting",
            SessionState::Tracing => "tracing",
            SessionState::Ended(_) => "ended",
            SessionState::Failed(_) => "failed",
        }
    }

    /// The reason or error, when it ended or failed.
    pub fn detail(&self) -> Option<&str> {
        match self {
            SessionState::Ended(reason) => Some(reason),
            SessionState::Failed(error) => Some(error),
            SessionState::Starting | SessionState::Tracing => None,
        }
    }
}

/// The managed methods a process ran on CPU over the hot window, from the kernel's samples.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HotMethods {
    /// Samples of the process in the window (any code).
    pub samples: u32,
    /// Each method with the samples whose innermost managed frame it was, most first.
    pub methods: Vec<(Arc<str>, u32)>,
}

impl HotMethods {
    /// The hottest method and its share of the process's samples (percent).
    pub fn hottest(&self) -> Option<(&str, f64)> {
        let (name, n) = self.methods.first()?;
        Some((name, f64::from(*n) * 100.0 / f64::from(self.samples.max(1))))
    }
}

/// One .NET process, as `tracer top` shows it.
#[derive(Clone, Debug)]
pub struct ProcessRow {
    pub process: Incarnation,
    /// Its `comm`: set by the process itself, any bytes.
    pub name: String,
    /// `/proc/<pid>/cmdline` (else the command line its runtime reported).
    pub command_line: Option<String>,
    pub labels: Option<Arc<ProcessLabels>>,
    pub runtime_version: Option<String>,
    pub session: SessionState,
    /// All its threads' CPU time over the last refresh, in percent of one CPU.
    pub cpu_percent: Option<f64>,
    pub cpu_history: History,
    /// Resident memory (`/proc/<pid>/stat`'s rss).
    pub working_set_bytes: Option<u64>,
    pub working_set_history: History,
    pub counters: RuntimeCounters,
    pub hot: HotMethods,
    /// CPU ticks (user + system, all threads) and when they were read (monotonic ns).
    last_cpu: Option<(u64, u64)>,
}

impl ProcessRow {
    pub fn new(process: Incarnation, name: String, labels: Option<Arc<ProcessLabels>>) -> Self {
        ProcessRow {
            process,
            name,
            command_line: None,
            labels,
            runtime_version: None,
            session: SessionState::Starting,
            cpu_percent: None,
            cpu_history: History::default(),
            working_set_bytes: None,
            working_set_history: History::default(),
            counters: RuntimeCounters::default(),
            hot: HotMethods::default(),
            last_cpu: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid
    }

    pub fn container_id(&self) -> Option<&str> {
        self.labels.as_deref().and_then(|l| l.container_id.as_deref())
    }

    pub fn pod_uid(&self) -> Option<&str> {
        self.labels.as_deref().and_then(|l| l.pod_uid.as_deref())
    }

    /// Takes a read of the process's CPU time (`ticks` of `ns_per_tick` each, all threads) and
    /// resident memory at `now_ns`: the CPU share is over the time since the previous read.
    pub fn take_usage(&mut self, ticks: u64, ns_per_tick: u64, rss_bytes: u64, now_ns: u64) {
        if let Some((before, at)) = self.last_cpu
            && now_ns > at
        {
            let busy_ns = ticks.saturating_sub(before).saturating_mul(ns_per_tick);
            let percent = busy_ns as f64 * 100.0 / (now_ns - at) as f64;
            self.cpu_percent = Some(percent);
            self.cpu_history.push(percent);
        }
        self.last_cpu = Some((ticks, now_ns));
        self.working_set_bytes = Some(rss_bytes);
        self.working_set_history.push(rss_bytes as f64);
    }

    /// The line `tracer top --once` writes for it: what the screen shows, `null` where the
    /// runtime reports nothing; rates over every interval its session reported.
    pub fn snapshot(&self) -> TopProcess {
        let c = |counter| self.counters.over_session(counter);
        let hottest = self.hot.hottest();
        TopProcess {
            name: self.name.clone(),
            command_line: self.command_line.clone(),
            runtime_version: self.runtime_version.clone(),
            session: self.session.name(),
            session_detail: self.session.detail().map(str::to_owned),
            cpu_percent: self.cpu_percent,
            working_set_bytes: self.working_set_bytes,
            gc_heap_bytes: c(Counter::GcHeap),
            gen0_gcs_per_sec: c(Counter::Gen0Gcs),
            gen1_gcs_per_sec: c(Counter::Gen1Gcs),
            gen2_gcs_per_sec: c(Counter::Gen2Gcs),
            gc_paused_percent: c(Counter::GcPaused),
            alloc_bytes_per_sec: c(Counter::Allocations),
            exceptions_per_sec: c(Counter::Exceptions),
            lock_contentions_per_sec: c(Counter::LockContentions),
            threadpool_threads: c(Counter::PoolThreads),
            threadpool_queue_length: c(Counter::PoolQueue),
            rates_from_ns: self.counters.rates_span().map(|(from, _)| from),
            rates_to_ns: self.counters.rates_span().map(|(_, to)| to),
            hot_method: hottest.map(|(name, _)| name.to_owned()),
            hot_method_percent: hottest.map(|(_, share)| share),
            cpu_samples: self.hot.samples,
        }
    }
}

/// What the list is ordered by, most first (`c`, `m`, `g`, `a`, `e`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    #[default]
    Cpu,
    Memory,
    /// The share of time paused in GC.
    Gc,
    Allocations,
    Exceptions,
}

impl SortKey {
    pub const ALL: [SortKey; 5] =
        [SortKey::Cpu, SortKey::Memory, SortKey::Gc, SortKey::Allocations, SortKey::Exceptions];

    pub fn name(self) -> &'static str {
        match self {
            SortKey::Cpu => "CPU",
            SortKey::Memory => "memory",
            SortKey::Gc => "GC",
            SortKey::Allocations => "allocations",
            SortKey::Exceptions => "exceptions",
        }
    }

    /// The key that selects it.
    pub fn key(self) -> char {
        match self {
            SortKey::Cpu => 'c',
            SortKey::Memory => 'm',
            SortKey::Gc => 'g',
            SortKey::Allocations => 'a',
            SortKey::Exceptions => 'e',
        }
    }

    fn value(self, row: &ProcessRow) -> Option<f64> {
        match self {
            SortKey::Cpu => row.cpu_percent,
            SortKey::Memory => row.working_set_bytes.map(|b| b as f64),
            SortKey::Gc => row.counters.get(Counter::GcPaused),
            SortKey::Allocations => row.counters.get(Counter::Allocations),
            SortKey::Exceptions => row.counters.get(Counter::Exceptions),
        }
    }
}

/// Every process shown, by pid.
#[derive(Debug, Default)]
pub struct Model {
    rows: BTreeMap<u32, ProcessRow>,
}

impl Model {
    pub fn insert(&mut self, row: ProcessRow) {
        self.rows.insert(row.pid(), row);
    }

    pub fn remove(&mut self, pid: u32) -> Option<ProcessRow> {
        self.rows.remove(&pid)
    }

    /// The row of this process (not of another that has its pid now).
    pub fn get_mut(&mut self, process: Incarnation) -> Option<&mut ProcessRow> {
        self.rows.get_mut(&process.pid).filter(|r| r.process == process)
    }

    pub fn by_pid(&self, pid: u32) -> Option<&ProcessRow> {
        self.rows.get(&pid)
    }

    pub fn contains(&self, pid: u32) -> bool {
        self.rows.contains_key(&pid)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn rows(&self) -> impl Iterator<Item = &ProcessRow> {
        self.rows.values()
    }

    pub fn rows_mut(&mut self) -> impl Iterator<Item = &mut ProcessRow> {
        self.rows.values_mut()
    }

    /// The rows `filter` keeps, ordered by `sort`: most first, those without a value last,
    /// equal ones by pid.
    pub fn visible(&self, sort: SortKey, filter: &str) -> Vec<&ProcessRow> {
        let mut rows: Vec<&ProcessRow> = self.rows().filter(|r| matches(r, filter)).collect();
        rows.sort_by(|a, b| {
            use std::cmp::Ordering;
            let order = match (sort.value(a), sort.value(b)) {
                (Some(x), Some(y)) => y.partial_cmp(&x).unwrap_or(Ordering::Equal),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            };
            order.then(a.pid().cmp(&b.pid()))
        });
        rows
    }
}

/// Whether `row` shows under `filter`: its text, ignoring case, in the process's name, command
/// line, container id or pod uid (an empty filter keeps every row).
pub fn matches(row: &ProcessRow, filter: &str) -> bool {
    if filter.is_empty() {
        return true;
    }
    let filter = filter.to_lowercase();
    [Some(row.name.as_str()), row.command_line.as_deref(), row.container_id(), row.pod_uid()]
        .into_iter()
        .flatten()
        .any(|text| text.to_lowercase().contains(&filter))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn sample(metric: &str, value: f64, interval_secs: Option<f64>) -> CounterSample {
        CounterSample {
            metric: metric.into(),
            help: "".into(),
            instrument: Default::default(),
            reading: match interval_secs {
                Some(_) => tracer_decode::counters::Reading::Added { amount: value, total: None },
                None => tracer_decode::counters::Reading::Level(value),
            },
            labels: Vec::new(),
            tag_keys: Vec::new(),
            interval_secs,
        }
    }

    #[test]
    fn the_metric_names_are_those_of_the_runtime_counters() {
        use tracer_decode::counters::{event_counter_unit_suffix, metric_name};
        let runtime = [
            (Counter::GcHeap, "gc-heap-size", "MB"),
            (Counter::Gen0Gcs, "gen-0-gc-count", ""),
            (Counter::Gen1Gcs, "gen-1-gc-count", ""),
            (Counter::Gen2Gcs, "gen-2-gc-count", ""),
            (Counter::GcPaused, "total-pause-time-by-gc", "ms"),
            (Counter::Allocations, "alloc-rate", "B"),
            (Counter::Exceptions, "exception-count", ""),
            (Counter::LockContentions, "monitor-lock-contention-count", ""),
            (Counter::PoolThreads, "threadpool-thread-count", ""),
            (Counter::PoolQueue, "threadpool-queue-length", ""),
        ];
        for (counter, name, units) in runtime {
            let metric = metric_name("System.Runtime", name, event_counter_unit_suffix(units));
            assert_eq!(counter.metric(), metric, "{name}");
        }
        assert_eq!(Counter::ALL.map(Counter::index), std::array::from_fn(|i| i));
    }

    #[test]
    fn rates_are_per_second_of_the_interval_and_unreported_counters_stay_none() {
        let mut c = RuntimeCounters::default();
        assert_eq!(c.get(Counter::Allocations), None);
        c.record(&sample("systemruntime_alloc_rate_bytes", 2_000_000.0, Some(2.0)), 10 * SECOND);
        c.record(&sample("systemruntime_exception_count", 105.0, Some(1.05)), 10 * SECOND);
        c.record(&sample("systemruntime_gc_heap_size_bytes", 7.5e6, Some(1.0)), 10 * SECOND);
        assert_eq!(c.rates_span(), Some((8 * SECOND, 10 * SECOND)));
        assert_eq!(c.get(Counter::Allocations), Some(1_000_000.0));
        assert_eq!(c.get(Counter::Exceptions), Some(100.0));
        assert_eq!(c.get(Counter::GcHeap), Some(7.5e6));
        // A rate without its interval says nothing; a counter not sent stays unknown.
        c.record(&sample("systemruntime_monitor_lock_contention_count", 3.0, None), 10 * SECOND);
        assert_eq!(c.get(Counter::LockContentions), None);
        assert_eq!(c.get(Counter::PoolQueue), None);
        assert_eq!(c.history(Counter::Allocations).values().collect::<Vec<_>>(), [1_000_000.0]);
        // Over the session: what every interval added, over their seconds.
        c.record(&sample("systemruntime_alloc_rate_bytes", 4_000_000.0, Some(1.0)), 11 * SECOND);
        assert_eq!(c.get(Counter::Allocations), Some(4_000_000.0));
        assert_eq!(c.over_session(Counter::Allocations), Some(2_000_000.0));
        assert_eq!(c.rates_span(), Some((8 * SECOND, 11 * SECOND)));
        assert_eq!(c.over_session(Counter::GcHeap), Some(7.5e6));
        assert_eq!(c.over_session(Counter::LockContentions), None);
        c.clear();
        assert_eq!(c.get(Counter::GcHeap), None);
    }

    #[test]
    fn pause_share_is_the_milliseconds_an_interval_added_and_rounds_are_counted() {
        let mut c = RuntimeCounters::default();
        let round = |c: &mut RuntimeCounters, paused_ms, secs| {
            c.record(&sample("systemruntime_cpu_usage_ratio", 1.0, Some(secs)), SECOND);
            c.record(
                &sample("systemruntime_total_pause_time_by_gc_ms", paused_ms, Some(secs)),
                SECOND,
            );
        };
        round(&mut c, 10.0, 1.0);
        assert_eq!((c.get(Counter::GcPaused), c.whole_rounds()), (Some(1.0), 0));
        round(&mut c, 50.0, 2.0);
        assert_eq!((c.get(Counter::GcPaused), c.whole_rounds()), (Some(2.5), 1));
        assert_eq!(c.over_session(Counter::GcPaused), Some(2.0));
        round(&mut c, 0.0, 1.0);
        assert_eq!((c.get(Counter::GcPaused), c.whole_rounds()), (Some(0.0), 2));
        // A share is at most the whole interval.
        round(&mut c, 5000.0, 1.0);
        assert_eq!(c.get(Counter::GcPaused), Some(100.0));
    }

    fn row(pid: u32, cpu: Option<f64>, name: &str) -> ProcessRow {
        let mut r = ProcessRow::new(Incarnation::new(pid, Some(1)), name.into(), None);
        r.cpu_percent = cpu;
        r
    }

    #[test]
    fn rows_sort_most_first_unknown_last_and_filter_by_name_or_container() {
        let mut model = Model::default();
        model.insert(row(30, Some(5.0), "api"));
        model.insert(row(10, None, "worker"));
        model.insert(row(20, Some(80.0), "Batch"));
        model.insert(row(40, Some(5.0), "api"));
        let labels =
            ProcessLabels { container_id: Some("abcdef0123".into()), ..Default::default() };
        let mut contained = row(50, None, "svc");
        contained.labels = Some(Arc::new(labels));
        model.insert(contained);
        let pids = |rows: Vec<&ProcessRow>| rows.iter().map(|r| r.pid()).collect::<Vec<_>>();
        assert_eq!(pids(model.visible(SortKey::Cpu, "")), [20, 30, 40, 10, 50]);
        assert_eq!(pids(model.visible(SortKey::Cpu, "BATCH")), [20]);
        assert_eq!(pids(model.visible(SortKey::Cpu, "abcdef")), [50]);
        assert_eq!(pids(model.visible(SortKey::Exceptions, "")), [10, 20, 30, 40, 50]);
    }

    #[test]
    fn cpu_share_is_over_the_time_between_two_reads() {
        let mut r = row(1, None, "x");
        r.take_usage(100, 10_000_000, 4096, 1_000_000_000);
        assert_eq!((r.cpu_percent, r.working_set_bytes), (None, Some(4096)));
        // 150 ticks of 10 ms in 2 s: 1.5 s of CPU, 75 %.
        r.take_usage(250, 10_000_000, 8192, 3_000_000_000);
        assert_eq!(r.cpu_percent, Some(75.0));
    }

    #[test]
    fn the_hottest_method_has_its_share_of_the_samples() {
        let hot = HotMethods { samples: 40, methods: vec![("A.B".into(), 30), ("C.D".into(), 5)] };
        assert_eq!(hot.hottest(), Some(("A.B", 75.0)));
        assert_eq!(HotMethods::default().hottest(), None);
    }
}
