//! `--metrics-addr`: Prometheus metrics and a health check for `run`, `audit` and `ftrace`.
//!
//! The pipelines own their counters (the summaries they print at exit). With metrics on, a
//! pipeline publishes its summary every [`PUBLISH_INTERVAL`] and once more at exit through a
//! [`Publisher`]; the families are computed from that summary (`families.rs`), so a scrape and
//! the summary report the same numbers. The traced processes' runtime counters (latest values,
//! not counts) are read when scraped, from the table the pipeline records them in. The
//! exposition is encoded with `prometheus-client` at scrape time and served by a minimal hyper
//! server (`server.rs`).
//!
//! Families (docs/metrics.md): `tracer_events_total{source,kind}`,
//! `tracer_lost_events_total{source,reason}`, `tracer_detections_total{kind}`,
//! `tracer_sessions{state}`, `tracer_sessions_failed_total{reason}`,
//! `tracer_detection_hooks{mechanism}`, `tracer_build_info{version,kernel}`. Label values come
//! from fixed sets (kinds, sources, loss reasons): no process can add series to them. `run` adds
//! the traced processes' runtime counters (`runtime.rs`), capped per process and in all.
mod families;
pub mod runtime;
mod server;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

pub use self::families::Families;
use self::runtime::{FamilyKind, RuntimeCounters, RuntimeFamilies, SeriesValue};
pub use self::server::{
    DEFAULT_PROFILE_SECONDS, MAX_CONNECTIONS, MAX_PROFILE_SECONDS, REQUEST_TIMEOUT, serve,
};
use crate::output::OutputWait;

/// How often a pipeline publishes its counters while it runs (and always once at exit).
pub const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// `GET /debug/pprof/profile`: a CPU profile of the processes a pipeline selects (`tracer run`
/// provides it; the endpoint knows it only through this).
pub trait ProfileSource: Send + Sync + std::fmt::Debug {
    /// A gzip'd pprof profile over `request.duration`; dropped before it ends, it stops
    /// sampling.
    fn profile(
        &self,
        request: ProfileRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Vec<u8>>> + Send>>;
}

/// What a profile request asks for (its query string).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfileRequest {
    pub duration: Duration,
    /// `pid=` (repeatable): only these processes; none: every selected one.
    pub pids: Vec<u32>,
    /// `container=` (repeatable): only processes of these containers.
    pub containers: Vec<String>,
}

/// What `/healthz` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Before the BPF programs (or the ftrace instance) are attached.
    Starting,
    /// Attached and consuming: 200.
    Running,
    /// Stop requested: detaching and draining.
    Stopping,
    /// The pipeline ended with an error.
    Failed(String),
}

impl Health {
    /// The reason given with a 503, `None` when healthy.
    pub fn problem(&self) -> Option<String> {
        match self {
            Health::Starting => Some("starting: the probes are not attached yet".into()),
            Health::Running => None,
            Health::Stopping => Some("stopping: detached, draining what is buffered".into()),
            Health::Failed(e) => Some(format!("failed: {e}")),
        }
    }
}

/// The endpoint's own counts (`tracer_endpoint_connections_total`,
/// `tracer_endpoint_connections_closed_total{reason}`).
#[derive(Debug, Default)]
pub(crate) struct ConnectionCounts {
    pub accepted: AtomicU64,
    /// Closed to make room for a new connection at [`MAX_CONNECTIONS`].
    pub evicted: AtomicU64,
    /// Closed after [`REQUEST_TIMEOUT`] without a whole request.
    pub timed_out: AtomicU64,
}

#[derive(Debug)]
struct State {
    health: Health,
    families: Families,
}

/// What the endpoint serves: the latest published families and the health.
#[derive(Debug)]
pub struct Shared {
    state: Mutex<State>,
    kernel: String,
    pub(crate) connections: ConnectionCounts,
    /// `run`'s runtime counters, read when scraped.
    runtime_counters: std::sync::OnceLock<RuntimeCounters>,
    /// `GET /debug/pprof/profile`, when the pipeline offers it, and whether one is being taken.
    profiles: std::sync::OnceLock<Arc<dyn ProfileSource>>,
    profiling: std::sync::atomic::AtomicBool,
    /// Profile requests answered 429 (one was being taken).
    profiles_refused: AtomicU64,
    /// How long the pipeline's write to its output has waited, read when scraped.
    output_wait: std::sync::OnceLock<OutputWait>,
}

impl Shared {
    pub fn new() -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(State { health: Health::Starting, families: Families::default() }),
            kernel: kernel_release(),
            connections: ConnectionCounts::default(),
            runtime_counters: std::sync::OnceLock::new(),
            profiles: std::sync::OnceLock::new(),
            profiling: std::sync::atomic::AtomicBool::new(false),
            profiles_refused: AtomicU64::new(0),
            output_wait: std::sync::OnceLock::new(),
        })
    }

    pub fn health(&self) -> Health {
        self.state.lock().map(|s| s.health.clone()).unwrap_or(Health::Failed("poisoned".into()))
    }

    pub fn families(&self) -> Families {
        let mut families = self.state.lock().map(|s| s.families.clone()).unwrap_or_default();
        if let Some(counters) = self.runtime_counters.get() {
            families.runtime = counters.families();
        }
        families
    }

    /// The Prometheus (OpenMetrics) text exposition of the latest families.
    pub fn exposition(self: &Arc<Shared>) -> anyhow::Result<String> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .map_err(|_| anyhow::anyhow!("encoding the metrics exposition"))?;
        if let Some(counters) = self.runtime_counters.get() {
            // prometheus_client has no summaries: they go before the end marker, by hand.
            let summaries = summaries_text(&counters.families());
            let end = out.rfind("# EOF").unwrap_or(out.len());
            out.insert_str(end, &summaries);
        }
        Ok(out)
    }
}

/// A counter family's name without the `_total` its series take (a counter instrument named
/// `requests_total` is not `requests_total_total`).
fn counter_family_name(metric: &str) -> &str {
    metric.strip_suffix("_total").filter(|base| !base.is_empty()).unwrap_or(metric)
}

/// The runtime families that are summaries, in the text both formats share: the last interval's
/// quantiles as series with a `quantile` label, then `_sum` and `_count` where the runtime sends
/// them (.NET 8+). Names and label values are the decoder's (valid names; values printable,
/// without `\` or `"`), so nothing needs escaping.
fn summaries_text(families: &RuntimeFamilies) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for (name, family) in families.iter().filter(|(_, f)| f.kind == FamilyKind::Summary) {
        let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} summary", family.help);
        for (labels, value) in &family.series {
            let SeriesValue::Summary { quantiles, count_and_sum } = value else { continue };
            let mut set = String::new();
            for (k, v) in labels {
                let _ = write!(set, "{k}=\"{v}\",");
            }
            for (q, v) in quantiles {
                let _ = writeln!(out, "{name}{{{set}quantile=\"{q}\"}} {v}");
            }
            if let Some((count, sum)) = count_and_sum {
                let set = set.trim_end_matches(',');
                let _ = writeln!(out, "{name}_sum{{{set}}} {sum}\n{name}_count{{{set}}} {count}");
            }
        }
    }
    out
}

/// The classic Prometheus text format (0.0.4) of an OpenMetrics exposition, for clients that do
/// not ask for OpenMetrics (`promtool check metrics`, curl): a counter family is named with its
/// `_total` suffix in HELP and TYPE, and there is no `# EOF`.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 64);
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(&name).then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(meta.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// A pipeline's handle on the endpoint; the default one (metrics off) does nothing.
#[derive(Clone, Debug, Default)]
pub struct Publisher(Option<Arc<Shared>>);

impl Publisher {
    pub fn new(shared: Arc<Shared>) -> Publisher {
        Publisher(Some(shared))
    }

    pub fn is_enabled(&self) -> bool {
        self.0.is_some()
    }

    pub fn set_health(&self, health: Health) {
        if let Some(shared) = &self.0
            && let Ok(mut s) = shared.state.lock()
        {
            s.health = health;
        }
    }

    pub fn publish(&self, families: Families) {
        if let Some(shared) = &self.0
            && let Ok(mut s) = shared.state.lock()
        {
            s.families = families;
        }
    }

    /// Serves the latest values of `counters` with every scrape (once; later calls change
    /// nothing).
    pub fn serve_runtime_counters(&self, counters: RuntimeCounters) {
        if let Some(shared) = &self.0 {
            let _ = shared.runtime_counters.set(counters);
        }
    }

    /// Serves how long the pipeline's write to its output has waited, read with every scrape
    /// (once; later calls change nothing).
    pub fn serve_output_wait(&self, wait: OutputWait) {
        if let Some(shared) = &self.0 {
            let _ = shared.output_wait.set(wait);
        }
    }

    /// Serves `GET /debug/pprof/profile` from `source` (once; later calls change nothing).
    pub fn serve_profiles(&self, source: Arc<dyn ProfileSource>) {
        if let Some(shared) = &self.0 {
            let _ = shared.profiles.set(source);
        }
    }

    pub fn publish_audit(&self, summary: &crate::summary::AuditSummary) {
        if self.is_enabled() {
            self.publish(Families::of_audit(summary));
        }
    }

    pub fn publish_run(&self, summary: &crate::summary::RunSummary) {
        if self.is_enabled() {
            self.publish(Families::of_run(summary));
        }
    }

    pub fn publish_ftrace(&self, summary: &crate::summary::FtraceSummary) {
        if self.is_enabled() {
            self.publish(Families::of_ftrace(summary));
        }
    }
}

/// Ticks every [`PUBLISH_INTERVAL`] when metrics are on; never otherwise.
pub struct PublishTick(Option<tokio::time::Interval>);

impl PublishTick {
    pub async fn tick(&mut self) {
        match &mut self.0 {
            Some(i) => {
                i.tick().await;
            }
            None => std::future::pending().await,
        }
    }
}

pub fn publish_interval(enabled: bool) -> PublishTick {
    PublishTick(enabled.then(|| {
        let mut i = tokio::time::interval(PUBLISH_INTERVAL);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    }))
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

type Labels<'a> = Vec<(&'a str, &'a str)>;

fn label_refs(labels: &[(String, String)]) -> Labels<'_> {
    labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

fn encode_family<'a, M: prometheus_client::encoding::EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: MetricType,
    series: impl Iterator<Item = (Labels<'a>, M)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counters2<'a>(
    map: &'a BTreeMap<(String, String), u64>,
    keys: [&'static str; 2],
) -> impl Iterator<Item = (Labels<'a>, ConstCounter<u64>)> {
    map.iter().map(move |((a, b), v)| {
        (vec![(keys[0], a.as_str()), (keys[1], b.as_str())], ConstCounter::new(*v))
    })
}

impl Collector for Shared {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let f = self.families();
        encode_family(
            &mut encoder,
            "tracer_events",
            "Lines written, by where the event was seen and its kind.",
            MetricType::Counter,
            counters2(&f.events, ["source", "kind"]),
        )?;
        encode_family(
            &mut encoder,
            "tracer_lost_events",
            "Every loss tracer counts, by where it happened and why (alert on any increase).",
            MetricType::Counter,
            counters2(&f.lost, ["source", "reason"]),
        )?;
        encode_family(
            &mut encoder,
            "tracer_detections",
            "Detections reported (.NET runtimes and IPC, user_events, process lifecycle), by kind.",
            MetricType::Counter,
            f.detections.iter().map(|(k, v)| (vec![("kind", k.as_str())], ConstCounter::new(*v))),
        )?;
        encode_family(
            &mut encoder,
            "tracer_sessions",
            "Tracing sessions by state (active now; ended since start).",
            MetricType::Gauge,
            f.sessions
                .iter()
                .map(|(k, v)| (vec![("state", k.as_str())], ConstGauge::new(*v as i64))),
        )?;
        encode_family(
            &mut encoder,
            "tracer_sessions_failed",
            "Sessions that could not be started, by reason.",
            MetricType::Counter,
            f.sessions_failed
                .iter()
                .map(|(k, v)| (vec![("reason", k.as_str())], ConstCounter::new(*v))),
        )?;
        for (name, family) in &f.runtime {
            match family.kind {
                FamilyKind::Gauge => encode_family(
                    &mut encoder,
                    name,
                    &family.help,
                    MetricType::Gauge,
                    family.series.iter().filter_map(|(l, value)| match value {
                        SeriesValue::Gauge(v) => Some((label_refs(l), ConstGauge::new(*v))),
                        _ => None,
                    }),
                )?,
                FamilyKind::Counter => encode_family(
                    &mut encoder,
                    counter_family_name(name),
                    &family.help,
                    MetricType::Counter,
                    family.series.iter().filter_map(|(l, value)| match value {
                        SeriesValue::Counter(v) => Some((label_refs(l), ConstCounter::new(*v))),
                        _ => None,
                    }),
                )?,
                // Written by `summaries_text`.
                FamilyKind::Summary => {}
            }
        }
        encode_family(
            &mut encoder,
            "tracer_detection_hooks",
            "The mechanism the detection programs hook syscalls with (1 for the one in use): \
             trampolines cost only the hooked syscalls, syscall_tracepoints every syscall.",
            MetricType::Gauge,
            f.detection_hooks.iter().map(|m| (vec![("mechanism", *m)], ConstGauge::new(1i64))),
        )?;
        if let Some(wait) = self.output_wait.get() {
            encode_family(
                &mut encoder,
                "tracer_output_blocked_seconds",
                "How long the write under way to the output (stdout or --output) has waited; 0 \
                 when none is. While it rises nothing reads the output, the other families are \
                 not updated, and sessions hold their lines within their bounds.",
                MetricType::Gauge,
                std::iter::once((vec![], ConstGauge::new(wait.seconds()))),
            )?;
        }
        let connections = &self.connections;
        encode_family(
            &mut encoder,
            "tracer_endpoint_connections",
            "Connections the metrics endpoint accepted.",
            MetricType::Counter,
            std::iter::once((
                vec![],
                ConstCounter::new(connections.accepted.load(Ordering::Relaxed)),
            )),
        )?;
        encode_family(
            &mut encoder,
            "tracer_endpoint_connections_closed",
            "Connections the metrics endpoint closed before they sent a whole request: evicted \
             (the oldest, when a new one came at the limit of open connections) or timed_out (no \
             whole request head in time).",
            MetricType::Counter,
            [("evicted", &connections.evicted), ("timed_out", &connections.timed_out)]
                .into_iter()
                .map(|(reason, n)| {
                    (vec![("reason", reason)], ConstCounter::new(n.load(Ordering::Relaxed)))
                }),
        )?;
        if self.profiles.get().is_some() {
            encode_family(
                &mut encoder,
                "tracer_endpoint_profiling",
                "1 while a profile for /debug/pprof/profile is being taken.",
                MetricType::Gauge,
                std::iter::once((
                    vec![],
                    ConstGauge::new(i64::from(self.profiling.load(Ordering::Acquire))),
                )),
            )?;
            encode_family(
                &mut encoder,
                "tracer_endpoint_profiles_refused",
                "Profile requests answered 429 because another profile was being taken.",
                MetricType::Counter,
                std::iter::once((
                    vec![],
                    ConstCounter::new(self.profiles_refused.load(Ordering::Relaxed)),
                )),
            )?;
        }
        let version = env!("CARGO_PKG_VERSION");
        encode_family(
            &mut encoder,
            "tracer_build_info",
            "tracer's version and the kernel it runs on (always 1).",
            MetricType::Gauge,
            std::iter::once((
                vec![("version", version), ("kernel", self.kernel.as_str())],
                ConstGauge::new(1i64),
            )),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
