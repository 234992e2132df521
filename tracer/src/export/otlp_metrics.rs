//! `--otlp-endpoint`: the traced processes' runtime metrics as OTLP metrics (protobuf,
//! `POST <URL>/v1/metrics`), every `--otlp-metrics-interval` and once more at exit.
//!
//! One `ResourceMetrics` per process with its resource (`super::resource`, and the node's
//! `host.name` and `k8s.node.name`), one `ScopeMetrics` per meter (an EventCounters counter's
//! EventSource), each series a data point of its type: a cumulative monotonic `Sum` for a
//! counter (from when tracer first saw the series), a `Gauge`, a `Summary` for a histogram
//! (the last interval's quantiles; count and sum since the start). The attributes are the
//! instrument's tags with their own keys. Sent as the logs are (`super::otlp::Poster`:
//! attempts, backoff, time limits); data points not taken are counted, as losses
//! `("otlp_metrics", reason)`: `send_failed`, `rejected`, `shutdown_timeout`. A request holds
//! at most [`MAX_POINTS_PER_REQUEST`] data points (a process's series are not split).
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    Summary, SummaryDataPoint, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::otlp::{Delivery, Items, OtlpConfig, Poster};
use crate::metrics::runtime::{ProcessSnapshot, RuntimeCounters, SeriesSnapshot, SeriesValue};
use crate::output::LossCount;

/// Appended to the endpoint URL, as OTLP/HTTP exporters do.
pub const METRICS_PATH: &str = "/v1/metrics";
/// How often the metrics go out by default (`--otlp-metrics-interval`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Data points one request holds at most, whole processes at a time (one process's series
/// are at most `MAX_SERIES_PER_PROCESS`).
pub const MAX_POINTS_PER_REQUEST: usize = 4096;

/// Data points by fate, as counted so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsExportStats {
    pub exported: u64,
    pub send_failed: u64,
    pub rejected: u64,
    pub shutdown_timeout: u64,
}

impl MetricsExportStats {
    /// Every loss the exporter counts, zero counts included.
    pub fn losses(&self) -> [LossCount; 3] {
        let loss = |reason, count| LossCount { source: "otlp_metrics", reason, count };
        [
            loss("send_failed", self.send_failed),
            loss("rejected", self.rejected),
            loss("shutdown_timeout", self.shutdown_timeout),
        ]
    }
}

#[derive(Debug, Default)]
struct Counters {
    delivery: Delivery,
    shutdown_timeout: AtomicU64,
    /// Data points of the export under way not delivered yet (the unsent, if it is cut short).
    pending: AtomicU64,
}

impl Counters {
    fn stats(&self) -> MetricsExportStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsExportStats {
            exported: get(&self.delivery.exported),
            send_failed: get(&self.delivery.send_failed),
            rejected: get(&self.delivery.rejected),
            shutdown_timeout: get(&self.shutdown_timeout),
        }
    }
}

/// The running metrics exporter.
pub struct MetricsExporter {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    counters: Arc<Counters>,
}

impl MetricsExporter {
    /// Spawns the exporter task on the current runtime: `counters` every `interval`.
    pub fn start(
        config: &OtlpConfig,
        counters: RuntimeCounters,
        interval: Duration,
    ) -> anyhow::Result<MetricsExporter> {
        let poster = Poster::new(config.uri(METRICS_PATH)?);
        log::info!("exporting runtime metrics over OTLP to {} every {interval:?}", poster.uri);
        let stats = Arc::new(Counters::default());
        let (stop, stopped) = watch::channel(false);
        let node = config.node_attributes();
        let sender = Sender { poster, node, counters: stats.clone() };
        let task = tokio::spawn(export_loop(counters, interval, stopped, sender));
        Ok(MetricsExporter { stop, task, counters: stats })
    }

    pub fn stats(&self) -> MetricsExportStats {
        self.counters.stats()
    }

    /// Sends the metrics once more, then stops; what is not sent by `deadline` counts as
    /// `shutdown_timeout`.
    pub async fn finish(self, deadline: Instant, counters: &RuntimeCounters) -> MetricsExportStats {
        let MetricsExporter { stop, mut task, counters: stats } = self;
        let _ = stop.send(true);
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
            // The export cut short, and what it had not taken yet.
            let untaken: usize = counters.take_snapshot().iter().map(|p| p.series.len()).sum();
            let unsent = stats.pending.swap(0, Ordering::Relaxed) + untaken as u64;
            stats.shutdown_timeout.fetch_add(unsent, Ordering::Relaxed);
            log::warn!("OTLP metrics export: the last export was not sent in time");
        }
        stats.stats()
    }
}

async fn export_loop(
    counters: RuntimeCounters,
    interval: Duration,
    mut stopped: watch::Receiver<bool>,
    mut sender: Sender,
) {
    let mut next = Instant::now() + interval;
    loop {
        let stopping = tokio::select! {
            () = tokio::time::sleep_until(next) => false,
            _ = stopped.changed() => true,
        };
        next += interval;
        sender.export(&counters.take_snapshot(), crate::time::realtime_unix_ns()).await;
        // An export allocates every series' copy and its request at once, every interval:
        // handed back, so the resident size does not keep that peak between exports.
        crate::kernel::release_free_heap();
        if stopping {
            return;
        }
    }
}

struct Sender {
    poster: Poster,
    /// `host.name`, `k8s.node.name`, `service.instance.id`-free: the node's.
    node: Vec<(String, String)>,
    counters: Arc<Counters>,
}

impl Sender {
    async fn export(&mut self, processes: &[ProcessSnapshot], now_unix_ns: u64) {
        let requests = requests(processes, &self.node, now_unix_ns);
        let points: u64 = requests.iter().map(|(_, n)| n).sum();
        self.counters.pending.store(points, Ordering::Relaxed);
        for (request, points) in requests {
            let body = Bytes::from(request.encode_to_vec());
            let rejected_of = |answer: Bytes| {
                let response = ExportMetricsServiceResponse::decode(answer).ok();
                let partial = response.and_then(|r| r.partial_success);
                partial.map_or(0, |p| u64::try_from(p.rejected_data_points).unwrap_or(0))
            };
            let items = Items { n: points, what: "data points", source: "otlp_metrics" };
            self.poster.deliver(body, items, &self.counters.delivery, rejected_of).await;
            self.counters.pending.fetch_sub(points, Ordering::Relaxed);
        }
    }
}

/// The requests for `processes` at `now_unix_ns`, each with how many data points it holds.
fn requests(
    processes: &[ProcessSnapshot],
    node: &[(String, String)],
    now_unix_ns: u64,
) -> Vec<(ExportMetricsServiceRequest, u64)> {
    let mut out: Vec<(ExportMetricsServiceRequest, u64)> = Vec::new();
    for process in processes {
        let points = process.series.len() as u64;
        let resource_metrics = resource_metrics(process, node, now_unix_ns);
        match out.last_mut() {
            Some((request, n)) if *n + points <= MAX_POINTS_PER_REQUEST as u64 => {
                request.resource_metrics.push(resource_metrics);
                *n += points;
            }
            _ => out.push((
                ExportMetricsServiceRequest { resource_metrics: vec![resource_metrics] },
                points,
            )),
        }
    }
    out
}

fn resource_metrics(
    process: &ProcessSnapshot,
    node: &[(String, String)],
    now_unix_ns: u64,
) -> ResourceMetrics {
    let label = |key: &str| process.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    // Without a session's resource (not described yet): what the series' labels say.
    let fallback: Vec<(String, String)> = [
        ("process.pid", label("pid")),
        ("container.id", label("container_id")),
        ("k8s.pod.uid", label("pod_uid")),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k.to_owned(), v?.clone())))
    .collect();
    let own = process.resource.as_deref().unwrap_or(&fallback);
    let attributes = own.iter().chain(node).map(|(k, v)| attribute(k, v)).collect();
    // Meters in name order, each instrument one metric of its data points.
    let mut scopes: BTreeMap<&str, BTreeMap<(&str, &str), Vec<&SeriesSnapshot>>> = BTreeMap::new();
    for series in &process.series {
        let i = &series.instrument;
        let instruments = scopes.entry(i.scope.as_str()).or_default();
        instruments.entry((i.name.as_str(), i.unit.as_str())).or_default().push(series);
    }
    let scope_metrics = scopes
        .into_iter()
        .map(|(scope, instruments)| ScopeMetrics {
            scope: Some(InstrumentationScope { name: scope.to_owned(), ..Default::default() }),
            metrics: instruments
                .into_iter()
                .filter_map(|((name, unit), series)| metric_of(name, unit, &series, now_unix_ns))
                .collect(),
            ..Default::default()
        })
        .collect();
    ResourceMetrics {
        resource: Some(Resource { attributes, ..Default::default() }),
        scope_metrics,
        ..Default::default()
    }
}

/// One instrument's series as a metric of their type (the first series' type: a name is one
/// family of one type, `RuntimeCounters` sees to it).
fn metric_of(name: &str, unit: &str, series: &[&SeriesSnapshot], now: u64) -> Option<Metric> {
    let first = series.first()?;
    let attributes = |s: &SeriesSnapshot| s.tags.iter().map(|(k, v)| attribute(k, v)).collect();
    let number = |s: &SeriesSnapshot, value: f64, start: u64| NumberDataPoint {
        attributes: attributes(s),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    };
    let data = match first.value {
        SeriesValue::Gauge(_) => metric::Data::Gauge(Gauge {
            data_points: series
                .iter()
                .filter_map(|s| match s.value {
                    SeriesValue::Gauge(v) => Some(number(s, v, 0)),
                    _ => None,
                })
                .collect(),
        }),
        SeriesValue::Counter(_) => metric::Data::Sum(Sum {
            data_points: series
                .iter()
                .filter_map(|s| match s.value {
                    SeriesValue::Counter(v) => Some(number(s, v, s.start_unix_ns)),
                    _ => None,
                })
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        }),
        SeriesValue::Summary { .. } => metric::Data::Summary(Summary {
            data_points: series
                .iter()
                .filter_map(|s| match &s.value {
                    SeriesValue::Summary { quantiles, count_and_sum } => {
                        let (count, sum) = count_and_sum.unwrap_or((0, 0.0));
                        Some(SummaryDataPoint {
                            attributes: attributes(s),
                            start_time_unix_nano: s.start_unix_ns,
                            time_unix_nano: now,
                            count,
                            sum,
                            quantile_values: quantiles
                                .iter()
                                .map(|&(quantile, value)| ValueAtQuantile { quantile, value })
                                .collect(),
                            ..Default::default()
                        })
                    }
                    _ => None,
                })
                .collect(),
        }),
    };
    Some(Metric {
        name: name.to_owned(),
        description: first.help.to_string(),
        unit: unit.to_owned(),
        data: Some(data),
        ..Default::default()
    })
}

fn attribute(key: &str, value: &str) -> KeyValue {
    // A process id is an int in OpenTelemetry's semantic conventions.
    let value = match (key, value.parse::<i64>()) {
        ("process.pid", Ok(pid)) => Value::IntValue(pid),
        _ => Value::StringValue(value.to_owned()),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use tracer_decode::counters::Instrument;

    use super::*;

    fn series(
        scope: &str,
        name: &str,
        value: SeriesValue,
        tags: &[(&str, &str)],
    ) -> SeriesSnapshot {
        SeriesSnapshot {
            instrument: Arc::new(Instrument {
                scope: scope.into(),
                name: name.into(),
                unit: "s".into(),
            }),
            help: format!("{name} help").into(),
            tags: tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            value,
            start_unix_ns: 5,
        }
    }

    #[test]
    fn each_series_is_a_data_point_of_its_type_under_its_process_and_meter() {
        let process = ProcessSnapshot {
            labels: vec![("pid".into(), "42".into()), ("container_id".into(), "c0ffee".into())],
            resource: None,
            series: vec![
                series("Shop", "orders", SeriesValue::Counter(7.0), &[("route", "/a")]),
                series("Shop", "orders", SeriesValue::Counter(2.0), &[("route", "/b")]),
                series("Shop", "queue", SeriesValue::Gauge(1.5), &[]),
                series(
                    "System.Net.Http",
                    "http.client.request.duration",
                    SeriesValue::Summary {
                        quantiles: vec![(0.5, 0.25), (0.99, 2.0)],
                        count_and_sum: Some((40, 27.5)),
                    },
                    &[("http.request.method", "GET")],
                ),
            ],
        };
        let node = vec![("host.name".to_owned(), "node-1".to_owned())];
        let requests = requests(&[process], &node, 100);
        assert_eq!(requests.len(), 1);
        let (request, points) = &requests[0];
        assert_eq!(*points, 4);
        let rm = &request.resource_metrics[0];
        let resource: Vec<(&str, &Value)> = rm
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_ref().unwrap().value.as_ref().unwrap()))
            .collect();
        assert_eq!(
            resource,
            [
                ("process.pid", &Value::IntValue(42)),
                ("container.id", &Value::StringValue("c0ffee".into())),
                ("host.name", &Value::StringValue("node-1".into())),
            ]
        );
        let scopes: Vec<&str> =
            rm.scope_metrics.iter().map(|s| s.scope.as_ref().unwrap().name.as_str()).collect();
        assert_eq!(scopes, ["Shop", "System.Net.Http"]);
        let shop = &rm.scope_metrics[0].metrics;
        assert_eq!((shop[0].name.as_str(), shop[0].unit.as_str()), ("orders", "s"));
        let Some(metric::Data::Sum(sum)) = &shop[0].data else { panic!("{:?}", shop[0]) };
        assert!(sum.is_monotonic);
        assert_eq!(sum.aggregation_temporality, AggregationTemporality::Cumulative as i32);
        let values: Vec<_> = sum
            .data_points
            .iter()
            .map(|p| (p.start_time_unix_nano, p.time_unix_nano, p.value))
            .collect();
        let double = |v| Some(number_data_point::Value::AsDouble(v));
        assert_eq!(values, [(5, 100, double(7.0)), (5, 100, double(2.0))]);
        let Some(metric::Data::Gauge(gauge)) = &shop[1].data else { panic!("{:?}", shop[1]) };
        assert_eq!(gauge.data_points[0].value, double(1.5));
        let http = &rm.scope_metrics[1].metrics[0];
        let Some(metric::Data::Summary(summary)) = &http.data else { panic!("{http:?}") };
        let point = &summary.data_points[0];
        assert_eq!((point.count, point.sum, point.quantile_values.len()), (40, 27.5, 2));
        assert_eq!(point.attributes[0].key, "http.request.method");
    }

    #[test]
    fn requests_hold_whole_processes_up_to_the_bound() {
        let process = |n: usize| ProcessSnapshot {
            labels: vec![("pid".into(), "1".into())],
            resource: Some(vec![("service.name".to_owned(), "a".to_owned())].into()),
            series: (0..n)
                .map(|i| series("M", &format!("g{i}"), SeriesValue::Gauge(1.0), &[]))
                .collect(),
        };
        let processes = [process(3000), process(1000), process(200), process(5000)];
        let sizes: Vec<u64> = requests(&processes, &[], 1).iter().map(|(_, n)| *n).collect();
        assert_eq!(sizes, [4000, 200, 5000]);
    }
}
