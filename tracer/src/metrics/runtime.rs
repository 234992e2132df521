//! Runtime counters as metrics of their kind: every counter (and, for the Meter API, every tag
//! set) of every traced process, labelled with the process (`pid`, `process_start_ns`, and
//! `container_id`, `pod_uid` where known) and the tags. Gauges show their latest value,
//! counters their running total, histograms a summary (the last interval's quantiles, the count
//! and sum of every interval seen). A process's series go when its session ends. Counter names
//! come from the traced processes, so the number of series is capped per process and in all;
//! what the caps refuse is counted.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tracer_decode::counters::{
    CounterError, CounterSample, Distribution, Instrument, MeterLoss, Reading,
};

use crate::output::{Incarnation, ProcessLabels};

/// Series one process may have (the runtime's own `System.Runtime` counters are ~20).
pub const MAX_SERIES_PER_PROCESS: usize = 128;
/// Series of all processes together.
pub const MAX_SERIES: usize = 16_384;

/// What a series shows when scraped.
#[derive(Debug, Clone, PartialEq)]
pub enum SeriesValue {
    Gauge(f64),
    /// The running total: the runtime's own where it sends one (.NET 8+ Meter counters), else
    /// what the intervals tracer saw added up to.
    Counter(f64),
    /// The last interval's quantiles; the count and sum of the values of every interval seen.
    Summary {
        quantiles: Vec<(f64, f64)>,
        count_and_sum: Option<(u64, f64)>,
    },
}

impl SeriesValue {
    /// The series' value after `reading`, from what it was (`None`: a new series).
    fn after(known: Option<&SeriesValue>, reading: Reading) -> SeriesValue {
        match (known, reading) {
            (_, Reading::Level(value)) => SeriesValue::Gauge(value),
            (_, Reading::Added { total: Some(total), .. }) => SeriesValue::Counter(total),
            (Some(SeriesValue::Counter(so_far)), Reading::Added { amount, total: None }) => {
                SeriesValue::Counter(so_far + amount)
            }
            (_, Reading::Added { amount, total: None }) => SeriesValue::Counter(amount),
            (known, Reading::Distribution(Distribution { quantiles, count_and_sum })) => {
                let before = match known {
                    Some(SeriesValue::Summary { count_and_sum: before, .. }) => *before,
                    _ => None,
                };
                let count_and_sum = match (before, count_and_sum) {
                    (Some((c0, s0)), Some((c, s))) => Some((c0.saturating_add(c), s0 + s)),
                    (_, interval) => interval,
                };
                SeriesValue::Summary { quantiles, count_and_sum }
            }
        }
    }

    fn kind(&self) -> FamilyKind {
        match self {
            SeriesValue::Gauge(_) => FamilyKind::Gauge,
            SeriesValue::Counter(_) => FamilyKind::Counter,
            SeriesValue::Summary { .. } => FamilyKind::Summary,
        }
    }
}

/// The type of a metric family: every series of one name has the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyKind {
    Gauge,
    Counter,
    Summary,
}

#[derive(Debug, Clone, PartialEq)]
struct Latest {
    help: Arc<str>,
    instrument: Arc<Instrument>,
    value: SeriesValue,
    /// When tracer first saw the series (Unix ns): where a cumulative sum starts.
    start_unix_ns: u64,
    /// The tags' own keys, in the labels' order (`CounterSample::tag_keys`).
    tag_keys: Vec<String>,
}

/// A process's resource attributes for OTLP, as its session found them (opaque here).
pub type ResourceAttributes = Arc<[(String, String)]>;

/// What an OTLP exporter reads of one process ([`RuntimeCounters::snapshot`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessSnapshot {
    /// `pid`, `process_start_ns`, `container_id`, `pod_uid` (those known), as on its series.
    pub labels: Vec<(String, String)>,
    pub resource: Option<ResourceAttributes>,
    pub series: Vec<SeriesSnapshot>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSnapshot {
    pub instrument: Arc<Instrument>,
    pub help: Arc<str>,
    /// The instrument's tags, with their own keys.
    pub tags: Vec<(String, String)>,
    pub value: SeriesValue,
    pub start_unix_ns: u64,
}

/// A series of one process: its metric name and its own labels (tags).
type SeriesKey = (Arc<str>, Vec<(String, String)>);

#[derive(Debug, Default, Clone)]
struct ProcessSeries {
    labels: Vec<(String, String)>,
    resource: Option<ResourceAttributes>,
    /// Looked up for every sample (the exposition orders the series itself).
    latest: foldhash::HashMap<SeriesKey, Latest>,
}

/// Every counter family, by metric name: its HELP text and its series.
pub type RuntimeFamilies = BTreeMap<String, RuntimeFamily>;

#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeFamily {
    /// The HELP of the first series seen (processes may disagree).
    pub help: String,
    pub kind: FamilyKind,
    /// (labels, value): the process's, then the series' own.
    pub series: Vec<(Vec<(String, String)>, SeriesValue)>,
}

/// The counters of the traced processes: recorded by the pipeline as their events are written,
/// read by the endpoint when it is scraped (the families are built then, not for every
/// publication). A handle: its clones share one table.
#[derive(Debug, Default, Clone)]
pub struct RuntimeCounters(Arc<Mutex<Table>>);

impl RuntimeCounters {
    /// An empty table; `resources`: its processes are to be described ([`Self::describe`]) for
    /// an OTLP export.
    pub fn new(resources: bool) -> RuntimeCounters {
        RuntimeCounters(Arc::new(Mutex::new(Table { resources, ..Table::default() })))
    }

    /// Whether processes are to be described ([`Self::new`]).
    pub fn wants_resources(&self) -> bool {
        self.table().resources
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding it leaves the table whole (each update is one insert or remove).
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records what counter events said, each with its process, under one lock. `labels_of` is
    /// asked for a process's labels only when it has no series yet.
    pub fn record_all(
        &self,
        samples: impl IntoIterator<Item = (Incarnation, Result<CounterSample, CounterError>)>,
        labels_of: impl Fn(u32) -> Option<Arc<ProcessLabels>>,
    ) {
        let mut table = self.table();
        for (process, sample) in samples {
            table.record(process, &labels_of, sample);
        }
    }

    /// Drops the series of `process` (its session ended).
    pub fn remove(&self, process: Incarnation) {
        self.table().remove(process);
    }

    /// Series in all.
    pub fn len(&self) -> usize {
        self.table().series
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// New series the caps refused.
    pub fn refused(&self) -> u64 {
        self.table().refused
    }

    /// Counter events that gave no sample (malformed, a name tracer will not expose, or a name
    /// another series has with another type).
    pub fn bad_samples(&self) -> u64 {
        self.table().bad_samples
    }

    /// Notices of values the runtimes did not publish, by why (zero counts included).
    pub fn runtime_losses(&self) -> [(MeterLoss, u64); MeterLoss::ALL.len()] {
        let table = self.table();
        MeterLoss::ALL.map(|loss| (loss, table.runtime_losses[loss as usize]))
    }

    /// The families for the exposition, each series labelled with its process.
    pub fn families(&self) -> RuntimeFamilies {
        self.table().families()
    }

    /// Gives `process` (labelled `labels`) its OTLP resource, for the series it has and will
    /// have.
    pub fn describe(
        &self,
        process: Incarnation,
        labels: Option<&ProcessLabels>,
        resource: ResourceAttributes,
    ) {
        let mut table = self.table();
        let entry = table.processes.entry(process).or_insert_with(|| ProcessSeries {
            labels: series_labels(process, labels),
            ..ProcessSeries::default()
        });
        entry.resource = Some(resource);
    }

    /// Every process's series as they are now, and the last ones of the processes whose
    /// sessions ended since the previous call (taken: each is exported once), for an OTLP
    /// export; processes without series left out.
    pub fn take_snapshot(&self) -> Vec<ProcessSnapshot> {
        let mut table = self.table();
        let mut out = std::mem::take(&mut table.departed);
        table.departed_series = 0;
        out.extend(table.processes.values().filter(|p| !p.latest.is_empty()).map(snapshot_of));
        out
    }
}

#[derive(Debug, Default)]
struct Table {
    /// Looked up for every counter sample: a fast hasher, seeded per process.
    processes: foldhash::HashMap<Incarnation, ProcessSeries>,
    /// Each metric name's type and how many series have it: a name is one family, of one type.
    kinds: foldhash::HashMap<Arc<str>, (FamilyKind, usize)>,
    series: usize,
    refused: u64,
    bad_samples: u64,
    /// Notices of each [`MeterLoss`], by its discriminant.
    runtime_losses: [u64; MeterLoss::ALL.len()],
    /// Whether processes are described for an OTLP export.
    resources: bool,
    /// With `resources`: the last series of processes whose sessions ended, until the next
    /// export takes them (at most [`MAX_SERIES`] series; beyond, they go unexported).
    departed: Vec<ProcessSnapshot>,
    departed_series: usize,
}

impl Table {
    fn record(
        &mut self,
        process: Incarnation,
        labels_of: impl Fn(u32) -> Option<Arc<ProcessLabels>>,
        sample: Result<CounterSample, CounterError>,
    ) {
        let pid = process.pid;
        let sample = match sample {
            Ok(s) => s,
            Err(CounterError::Runtime { loss, message }) => {
                let seen = &mut self.runtime_losses[loss as usize];
                *seen += 1;
                if seen.is_power_of_two() {
                    log::warn!("pid {pid}: {loss} ({message}); {seen} such notices so far");
                }
                return;
            }
            Err(e) => {
                self.bad_samples += 1;
                if self.bad_samples.is_power_of_two() {
                    log::warn!("pid {pid}: counter not exposed as a metric: {e}");
                }
                return;
            }
        };
        let process = self.processes.entry(process).or_insert_with(|| ProcessSeries {
            labels: series_labels(process, labels_of(pid).as_deref()),
            ..ProcessSeries::default()
        });
        let key = (sample.metric, sample.labels);
        let value = SeriesValue::after(process.latest.get(&key).map(|l| &l.value), sample.reading);
        if let Some(&(kind, _)) = self.kinds.get(&key.0)
            && kind != value.kind()
        {
            self.bad_samples += 1;
            if self.bad_samples.is_power_of_two() {
                log::warn!(
                    "pid {pid}: counter not exposed as a metric: {} has series of type {kind:?}, \
                     this one is a {:?}",
                    key.0,
                    value.kind()
                );
            }
            return;
        }
        if let Some(known) = process.latest.get_mut(&key) {
            (known.help, known.instrument, known.value) = (sample.help, sample.instrument, value);
            return;
        }
        if process.latest.len() >= MAX_SERIES_PER_PROCESS || self.series >= MAX_SERIES {
            self.refused += 1;
            if self.refused.is_power_of_two() {
                log::warn!(
                    "pid {pid}: counter {} not exposed: at most {MAX_SERIES_PER_PROCESS} series \
                     per process and {MAX_SERIES} in all",
                    key.0
                );
            }
            return;
        }
        self.kinds.entry(key.0.clone()).or_insert((value.kind(), 0)).1 += 1;
        let latest = Latest {
            help: sample.help,
            instrument: sample.instrument,
            value,
            start_unix_ns: crate::time::realtime_unix_ns(),
            tag_keys: sample.tag_keys,
        };
        process.latest.insert(key, latest);
        self.series += 1;
    }

    fn remove(&mut self, process: Incarnation) {
        let Some(process) = self.processes.remove(&process) else { return };
        self.series -= process.latest.len();
        for (metric, _) in process.latest.keys() {
            forget_kind(&mut self.kinds, metric);
        }
        let n = process.latest.len();
        if self.resources && n > 0 && self.departed_series + n <= MAX_SERIES {
            self.departed_series += n;
            self.departed.push(snapshot_of(&process));
        }
    }

    fn families(&self) -> RuntimeFamilies {
        let mut families = RuntimeFamilies::new();
        for process in self.processes.values() {
            for ((metric, tags), latest) in &process.latest {
                let labels = process.labels.iter().chain(tags).cloned().collect();
                families
                    .entry(metric.to_string())
                    .or_insert_with(|| RuntimeFamily {
                        help: latest.help.to_string(),
                        kind: latest.value.kind(),
                        series: Vec::new(),
                    })
                    .series
                    .push((labels, latest.value.clone()));
            }
        }
        // Processes come from a hash map: order the series for a stable exposition.
        for family in families.values_mut() {
            family.series.sort_by(|a, b| a.0.cmp(&b.0));
        }
        families
    }
}

fn snapshot_of(process: &ProcessSeries) -> ProcessSnapshot {
    let series = process.latest.iter().map(|((_, tags), latest)| SeriesSnapshot {
        instrument: latest.instrument.clone(),
        help: latest.help.clone(),
        tags: own_keys(tags, &latest.tag_keys),
        value: latest.value.clone(),
        start_unix_ns: latest.start_unix_ns,
    });
    ProcessSnapshot {
        labels: process.labels.clone(),
        resource: process.resource.clone(),
        series: series.collect(),
    }
}

/// `labels` with the tags' own keys where the sample had them.
fn own_keys(labels: &[(String, String)], keys: &[String]) -> Vec<(String, String)> {
    if keys.len() != labels.len() {
        return labels.to_vec();
    }
    keys.iter().zip(labels).map(|(key, (_, value))| (key.clone(), value.clone())).collect()
}

/// One series fewer of `metric`'s type.
fn forget_kind(kinds: &mut foldhash::HashMap<Arc<str>, (FamilyKind, usize)>, metric: &Arc<str>) {
    if let Some((_, series)) = kinds.get_mut(metric) {
        *series -= 1;
        if *series == 0 {
            kinds.remove(metric);
        }
    }
}

/// `pid` and `process_start_ns` (where known), then where the process runs.
fn series_labels(process: Incarnation, labels: Option<&ProcessLabels>) -> Vec<(String, String)> {
    let mut out = vec![("pid".to_string(), process.pid.to_string())];
    out.extend(process.start_ns.map(|ns| ("process_start_ns".to_string(), ns.to_string())));
    if let Some(l) = labels {
        out.extend(l.container_id.clone().map(|id| ("container_id".to_string(), id)));
        out.extend(l.pod_uid.clone().map(|uid| ("pod_uid".to_string(), uid)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(metric: &str, value: f64) -> Result<CounterSample, CounterError> {
        tagged(metric, &[], value)
    }

    fn tagged(
        metric: &str,
        tags: &[(&str, &str)],
        value: f64,
    ) -> Result<CounterSample, CounterError> {
        let labels = tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Ok(CounterSample {
            metric: metric.into(),
            help: format!("{metric} help").into(),
            instrument: Default::default(),
            reading: Reading::Level(value),
            labels,
            tag_keys: Vec::new(),
            interval_secs: None,
        })
    }

    fn l(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// One counter event's sample, recorded as the pipeline records a batch.
    fn record(
        c: &RuntimeCounters,
        process: Incarnation,
        labels: Option<&ProcessLabels>,
        sample: Result<CounterSample, CounterError>,
    ) {
        let labels = labels.cloned().map(Arc::new);
        c.record_all([(process, sample)], |_| labels.clone());
    }

    /// Process `pid`, started at `pid` seconds.
    fn p(pid: u32) -> Incarnation {
        Incarnation::new(pid, Some(u64::from(pid) * 1_000_000_000))
    }

    fn labels(container: &str) -> ProcessLabels {
        ProcessLabels {
            cgroup: Some("/system.slice/x.scope".into()),
            container_id: Some(container.into()),
            pod_uid: None,
            ..ProcessLabels::default()
        }
    }

    #[test]
    fn latest_value_per_process_with_its_labels() {
        let c = RuntimeCounters::default();
        record(&c, p(7), Some(&labels("c7")), sample("m_a", 1.0));
        record(&c, p(7), Some(&labels("c7")), sample("m_a", 2.0));
        record(&c, p(3), None, sample("m_a", 5.0));
        record(&c, p(3), None, sample("m_b", 6.0));
        let families = c.families();
        assert_eq!(families.keys().collect::<Vec<_>>(), ["m_a", "m_b"]);
        assert_eq!(
            families["m_a"],
            RuntimeFamily {
                help: "m_a help".into(),
                kind: FamilyKind::Gauge,
                series: vec![
                    (
                        l(&[("pid", "3"), ("process_start_ns", "3000000000")]),
                        SeriesValue::Gauge(5.0)
                    ),
                    (
                        l(&[
                            ("pid", "7"),
                            ("process_start_ns", "7000000000"),
                            ("container_id", "c7")
                        ]),
                        SeriesValue::Gauge(2.0)
                    ),
                ],
            }
        );
        assert_eq!(c.len(), 3);
        c.remove(p(7));
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.families()["m_a"].series,
            vec![(l(&[("pid", "3"), ("process_start_ns", "3000000000")]), SeriesValue::Gauge(5.0))]
        );
        c.remove(p(3));
        assert!(c.is_empty() && c.families().is_empty());
        // A pid reused by another process has series of its own; one not known has no start.
        record(&c, p(3), None, sample("m_a", 1.0));
        record(&c, Incarnation::new(3, Some(9)), None, sample("m_a", 2.0));
        record(&c, Incarnation::new(4, None), None, sample("m_a", 3.0));
        assert_eq!(
            c.families()["m_a"].series,
            vec![
                (l(&[("pid", "3"), ("process_start_ns", "3000000000")]), SeriesValue::Gauge(1.0)),
                (l(&[("pid", "3"), ("process_start_ns", "9")]), SeriesValue::Gauge(2.0)),
                (l(&[("pid", "4")]), SeriesValue::Gauge(3.0)),
            ]
        );
    }

    #[test]
    fn a_batch_asks_for_the_labels_of_each_new_process_once() {
        let c = RuntimeCounters::default();
        let asked = std::cell::RefCell::new(Vec::new());
        let labels_of = |pid: u32| {
            asked.borrow_mut().push(pid);
            Some(Arc::new(labels(&format!("c{pid}"))))
        };
        c.record_all([(p(7), sample("m_a", 1.0)), (p(7), sample("m_b", 2.0))], labels_of);
        c.record_all([(p(7), sample("m_a", 3.0)), (p(8), sample("m_a", 4.0))], labels_of);
        assert_eq!(*asked.borrow(), [7, 8]);
        let container_of = |series: &(Vec<(String, String)>, SeriesValue)| series.0[2].1.clone();
        let m_a = &c.families()["m_a"].series;
        assert_eq!(m_a.iter().map(container_of).collect::<Vec<_>>(), ["c7", "c8"]);
        assert_eq!(
            (&m_a[0].1, &m_a[1].1, c.len()),
            (&SeriesValue::Gauge(3.0), &SeriesValue::Gauge(4.0), 3)
        );
    }

    #[test]
    fn each_tag_set_is_a_series() {
        let c = RuntimeCounters::default();
        record(&c, p(1), None, tagged("m", &[("route", "/a")], 1.0));
        record(&c, p(1), None, tagged("m", &[("route", "/b")], 2.0));
        record(&c, p(1), None, tagged("m", &[("route", "/a")], 3.0));
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.families()["m"].series,
            vec![
                (
                    l(&[("pid", "1"), ("process_start_ns", "1000000000"), ("route", "/a")]),
                    SeriesValue::Gauge(3.0)
                ),
                (
                    l(&[("pid", "1"), ("process_start_ns", "1000000000"), ("route", "/b")]),
                    SeriesValue::Gauge(2.0)
                ),
            ]
        );
    }

    fn reading(metric: &str, reading: Reading) -> Result<CounterSample, CounterError> {
        Ok(CounterSample { reading, ..sample(metric, 0.0).unwrap() })
    }

    fn added(amount: f64, total: Option<f64>) -> Reading {
        Reading::Added { amount, total }
    }

    #[test]
    fn counters_are_running_totals_and_histograms_summaries() {
        let c = RuntimeCounters::default();
        // Without the runtime's total: the increments added up; with it: the runtime's.
        record(&c, p(1), None, reading("sum", added(3.0, None)));
        record(&c, p(1), None, reading("sum", added(4.0, None)));
        record(&c, p(1), None, reading("total", added(3.0, Some(10.0))));
        record(&c, p(1), None, reading("total", added(4.0, Some(14.0))));
        let distribution = |quantiles: Vec<(f64, f64)>, count_and_sum| {
            Reading::Distribution(Distribution { quantiles, count_and_sum })
        };
        record(&c, p(1), None, reading("h", distribution(vec![(0.5, 1.0)], Some((2, 3.0)))));
        record(&c, p(1), None, reading("h", distribution(vec![(0.5, 2.0)], Some((5, 9.5)))));
        record(&c, p(1), None, reading("h6", distribution(vec![(0.99, 7.0)], None)));
        let families = c.families();
        let only = |name: &str| {
            let family = &families[name];
            assert_eq!(family.series.len(), 1, "{name}");
            (family.kind, family.series[0].1.clone())
        };
        assert_eq!(only("sum"), (FamilyKind::Counter, SeriesValue::Counter(7.0)));
        assert_eq!(only("total"), (FamilyKind::Counter, SeriesValue::Counter(14.0)));
        assert_eq!(
            only("h"),
            (
                FamilyKind::Summary,
                SeriesValue::Summary {
                    quantiles: vec![(0.5, 2.0)],
                    count_and_sum: Some((7, 12.5))
                }
            )
        );
        assert_eq!(
            only("h6"),
            (
                FamilyKind::Summary,
                SeriesValue::Summary { quantiles: vec![(0.99, 7.0)], count_and_sum: None }
            )
        );
    }

    #[test]
    fn the_last_series_of_a_departed_process_are_exported_once() {
        let c = RuntimeCounters::new(true);
        record(&c, p(1), None, sample("m", 1.0));
        record(&c, p(2), None, sample("m", 2.0));
        c.remove(p(1));
        let exported = |c: &RuntimeCounters| -> Vec<(String, SeriesValue)> {
            let mut all: Vec<_> = c
                .take_snapshot()
                .into_iter()
                .map(|s| (s.labels[0].1.clone(), s.series[0].value.clone()))
                .collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            all
        };
        let both =
            vec![("1".into(), SeriesValue::Gauge(1.0)), ("2".into(), SeriesValue::Gauge(2.0))];
        assert_eq!(exported(&c), both);
        assert_eq!(exported(&c), vec![("2".into(), SeriesValue::Gauge(2.0))]);
        // Without an OTLP export, nothing is kept.
        let c = RuntimeCounters::new(false);
        record(&c, p(1), None, sample("m", 1.0));
        c.remove(p(1));
        assert_eq!(exported(&c), vec![]);
    }

    #[test]
    fn a_name_is_one_family_of_one_type() {
        let c = RuntimeCounters::default();
        record(&c, p(1), None, reading("m", added(1.0, None)));
        // Another process's gauge of the same name would make the exposition invalid.
        record(&c, p(2), None, sample("m", 5.0));
        // And so would the same series turning into a gauge.
        record(&c, p(1), None, sample("m", 5.0));
        assert_eq!((c.len(), c.bad_samples()), (1, 2));
        assert_eq!(c.families()["m"].series[0].1, SeriesValue::Counter(1.0));
        // Once the counter's process is gone, the name is free for a gauge.
        c.remove(p(1));
        record(&c, p(2), None, sample("m", 5.0));
        assert_eq!((c.families()["m"].kind, c.len()), (FamilyKind::Gauge, 1));
    }

    #[test]
    fn caps_refuse_new_series_and_count_them() {
        let c = RuntimeCounters::default();
        for i in 0..MAX_SERIES_PER_PROCESS + 10 {
            record(&c, p(1), None, sample(&format!("m_{i}"), 1.0));
        }
        assert_eq!((c.len(), c.refused()), (MAX_SERIES_PER_PROCESS, 10));
        // Known series still update at the cap.
        record(&c, p(1), None, sample("m_0", 9.0));
        assert_eq!(c.families()["m_0"].series[0].1, SeriesValue::Gauge(9.0));
        assert_eq!(c.refused(), 10);
        // The total cap holds across processes.
        let processes = MAX_SERIES / MAX_SERIES_PER_PROCESS;
        for pid in 2..=processes as u32 + 1 {
            for i in 0..MAX_SERIES_PER_PROCESS {
                record(&c, p(pid), None, sample(&format!("m_{i}"), 1.0));
            }
        }
        assert_eq!(c.len(), MAX_SERIES);
        assert_eq!(c.refused(), 10 + MAX_SERIES_PER_PROCESS as u64);
        record(&c, p(1), None, Err(CounterError::NoPayload));
        assert_eq!(c.bad_samples(), 1);
    }
}
