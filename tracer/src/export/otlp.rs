//! `--otlp-endpoint URL`: every output line as an OpenTelemetry log record, sent over OTLP/HTTP
//! (protobuf, `POST <URL>/v1/logs`) to a collector.
//!
//! The hot path only copies a written line into a bounded queue ([`LineExport::offer`], never
//! waits); a task on tracer's runtime parses the JSON, converts it ([`log_record`]), batches up
//! to [`MAX_BATCH`] records (or what arrived within [`BATCH_DELAY`]) and posts them, retrying
//! with exponential backoff. A collector that is down or slow fills the queue, and the lines that
//! do not fit are dropped: memory stays at most [`QUEUE_CAPACITY`] lines plus the batch in
//! flight, and tracing never waits for the collector. Every record not accepted is counted as a
//! loss `("otlp", reason)` ([`ExportStats::losses`]): `queue_full`, `send_failed` (every attempt
//! failed), `rejected` (the collector refused it: a non-retryable status or a partial success),
//! `shutdown_timeout` (still queued or in flight when [`SHUTDOWN_TIMEOUT`] ran out at exit).
//!
//! A record: `Timestamp` = the line's `mono_ns` in wall-clock time (the same instant as `ts`),
//! `ObservedTimestamp` = when the exporter converted it, severity from the EventPipe level of a
//! `dotnet_event` ([`severity`]), `EventName` = `provider/event` of a `dotnet_event`, else the
//! `kind`; every field but `ts` as an attribute (`pid` as `process.pid`, `process_start_ns` as
//! `process.creation.time` in ISO-8601, `container_id` as `container.id`, `pod_uid` as
//! `k8s.pod.uid`; objects and arrays as OTLP maps and arrays); the
//! body is the JSON line itself. Resource: `service.name` = [`SERVICE_NAME`], `service.version`,
//! `host.name`, and `k8s.node.name` from the environment variable [`NODE_NAME_ENV`] (the
//! DaemonSet sets it from the downward API).
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::Uri;
use hyper::header::CONTENT_TYPE;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prost::Message as _;
use serde_json::{Map, Value as Json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::proto::{
    AnyValue, ArrayValue, ExportLogsServiceRequest, ExportLogsServiceResponse,
    InstrumentationScope, KeyValue, KeyValueList, LogRecord, Resource, ResourceLogs, ScopeLogs,
    Value,
};
use crate::output::{JsonLines, LineTap, LossCount};
use crate::time::{Clock, format_iso8601};

/// Lines waiting for the exporter; a line offered to a full queue is dropped (`queue_full`).
pub const QUEUE_CAPACITY: usize = 8192;
/// Most records in one request.
pub const MAX_BATCH: usize = 512;
/// Longest a line waits for its batch to fill before the batch is sent anyway.
pub const BATCH_DELAY: Duration = Duration::from_millis(200);
/// Attempts per batch (the first one included) before its records count as `send_failed`.
pub const MAX_ATTEMPTS: u32 = 4;
/// Wait before the second attempt; doubled after each failed attempt up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Time limit of one attempt: connect, send, and read the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read from the collector (an `ExportLogsServiceResponse` is a few bytes).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// At exit: how long the exporter may keep sending what is queued (the rest: `shutdown_timeout`).
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// The environment variable giving `k8s.node.name` (deploy/kubernetes/daemonset.yaml sets it).
pub const NODE_NAME_ENV: &str = "NODE_NAME";
/// `service.name` of every record.
pub const SERVICE_NAME: &str = "tracer";
/// Appended to the endpoint URL, as OTLP/HTTP exporters do.
pub const LOGS_PATH: &str = "/v1/logs";

/// Where to send and what to say about this node.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// `http://HOST:PORT[/PREFIX]`; records go to `<endpoint>/v1/logs`.
    pub endpoint: String,
    /// `k8s.node.name`, when known.
    pub node_name: Option<String>,
    /// `host.name`, when known.
    pub host_name: Option<String>,
    pub queue_capacity: usize,
}

impl OtlpConfig {
    /// The endpoint, with the node name from [`NODE_NAME_ENV`] and this host's name.
    pub fn new(endpoint: &str) -> anyhow::Result<OtlpConfig> {
        let config = OtlpConfig {
            endpoint: endpoint.to_owned(),
            node_name: std::env::var(NODE_NAME_ENV).ok().filter(|n| !n.is_empty()),
            host_name: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty()),
            queue_capacity: QUEUE_CAPACITY,
        };
        config.logs_uri()?;
        Ok(config)
    }

    /// `<endpoint>/v1/logs`; only `http://` (put a node-local collector in front for TLS).
    pub fn logs_uri(&self) -> anyhow::Result<Uri> {
        let url = format!("{}{LOGS_PATH}", self.endpoint.trim_end_matches('/'));
        let uri: Uri = url.parse().with_context(|| format!("--otlp-endpoint {}", self.endpoint))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            bail!(
                "--otlp-endpoint {}: expected http://HOST:PORT[/PATH] (OTLP/HTTP without TLS; \
                 send to a node-local collector for TLS)",
                self.endpoint
            );
        }
        Ok(uri)
    }

    fn resource(&self) -> Resource {
        let mut attributes = vec![
            KeyValue::new("service.name", AnyValue::string(SERVICE_NAME)),
            KeyValue::new("service.version", AnyValue::string(env!("CARGO_PKG_VERSION"))),
        ];
        if let Some(host) = &self.host_name {
            attributes.push(KeyValue::new("host.name", AnyValue::string(host)));
        }
        if let Some(node) = &self.node_name {
            attributes.push(KeyValue::new("k8s.node.name", AnyValue::string(node)));
        }
        Resource { attributes }
    }
}

/// Records by fate, as counted so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Accepted by the collector.
    pub exported: u64,
    pub queue_full: u64,
    pub send_failed: u64,
    pub rejected: u64,
    pub shutdown_timeout: u64,
}

impl ExportStats {
    /// Every loss the exporter counts, zero counts included.
    pub fn losses(&self) -> [LossCount; 4] {
        let loss = |reason, count| LossCount { source: "otlp", reason, count };
        [
            loss("queue_full", self.queue_full),
            loss("send_failed", self.send_failed),
            loss("rejected", self.rejected),
            loss("shutdown_timeout", self.shutdown_timeout),
        ]
    }

    pub fn lost(&self) -> u64 {
        self.losses().iter().map(|l| l.count).sum()
    }
}

#[derive(Debug, Default)]
struct Counters {
    queued: AtomicU64,
    exported: AtomicU64,
    queue_full: AtomicU64,
    send_failed: AtomicU64,
    rejected: AtomicU64,
    shutdown_timeout: AtomicU64,
}

impl Counters {
    fn stats(&self) -> ExportStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ExportStats {
            exported: get(&self.exported),
            queue_full: get(&self.queue_full),
            send_failed: get(&self.send_failed),
            rejected: get(&self.rejected),
            shutdown_timeout: get(&self.shutdown_timeout),
        }
    }
}

#[derive(Debug)]
enum Msg {
    Line(Vec<u8>),
    /// Answered once every line queued before it was sent (or given up).
    Flush(oneshot::Sender<()>),
}

/// The writer's end of the queue (held by [`crate::output::JsonLines`]).
#[derive(Clone, Debug)]
pub struct LineExport {
    tx: mpsc::Sender<Msg>,
    counters: Arc<Counters>,
}

impl LineTap for LineExport {
    /// Queues a copy of one line (JSON, no newline), or counts it as `queue_full`: never waits.
    fn offer(&self, json: &[u8]) {
        match self.tx.try_send(Msg::Line(json.to_vec())) {
            Ok(()) => self.counters.queued.fetch_add(1, Ordering::Relaxed),
            // Closed only if the exporter task is gone (it ends when the queue closes).
            Err(_) => self.counters.queue_full.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// The running exporter: its task, and the pipeline's handles on it.
pub struct Exporter {
    lines: LineExport,
    task: JoinHandle<()>,
}

impl Exporter {
    /// Spawns the exporter task on the current runtime; `clock` is the pipeline's (the one that
    /// stamped `ts`).
    pub fn start(config: &OtlpConfig, clock: Clock) -> anyhow::Result<Exporter> {
        let (lines, rx) = queue(config.queue_capacity);
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(REQUEST_TIMEOUT));
        let sender = Sender {
            client: Client::builder(TokioExecutor::new()).build(connector),
            uri: config.logs_uri()?,
            resource: config.resource(),
            clock,
            counters: lines.counters.clone(),
            failing: false,
        };
        log::info!("exporting lines as OTLP log records to {}", sender.uri);
        let task = tokio::spawn(export_loop(rx, sender));
        Ok(Exporter { lines, task })
    }

    /// The handle to give the writer ([`crate::output::JsonLines::export_to`]).
    pub fn lines(&self) -> LineExport {
        self.lines.clone()
    }

    pub fn stats(&self) -> ExportStats {
        self.lines.counters.stats()
    }

    /// Waits until every line offered so far was sent or given up, or until `deadline`.
    pub async fn flush(&self, deadline: Instant) {
        let (ack, done) = oneshot::channel();
        let flushed = async {
            if self.lines.tx.send(Msg::Flush(ack)).await.is_ok() {
                let _ = done.await;
            }
        };
        if tokio::time::timeout_at(deadline, flushed).await.is_err() {
            log::warn!("OTLP export: not flushed within {SHUTDOWN_TIMEOUT:?}");
        }
    }

    /// Sends what is queued until `deadline`, then stops; the writer must have let go of its
    /// handle ([`crate::output::JsonLines::stop_export`]). Records not sent by then count as
    /// `shutdown_timeout`.
    pub async fn finish(self, deadline: Instant) -> ExportStats {
        let Exporter { lines: LineExport { tx, counters }, mut task } = self;
        drop(tx);
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
            let s = counters.stats();
            let settled = s.exported + s.send_failed + s.rejected;
            let unsent = counters.queued.load(Ordering::Relaxed).saturating_sub(settled);
            counters.shutdown_timeout.store(unsent, Ordering::Relaxed);
            log::warn!("OTLP export: {unsent} records not sent within {SHUTDOWN_TIMEOUT:?}");
        }
        counters.stats()
    }
}

/// A pipeline's exporter when `--otlp-endpoint` is given (nothing otherwise). At exit the
/// pipeline flushes it before writing its `summary` line (which then reports the exporter's
/// losses so far), and finishes it after: the losses of the pipeline's summary struct (stderr,
/// metrics) also count the `summary` record itself.
#[derive(Default)]
pub struct PipelineExport(Option<Exporter>);

impl PipelineExport {
    /// Starts the exporter and makes `sink` offer it every line.
    pub fn start(
        config: Option<&OtlpConfig>,
        clock: Clock,
        sink: &mut JsonLines,
    ) -> anyhow::Result<PipelineExport> {
        let Some(config) = config else { return Ok(PipelineExport(None)) };
        let exporter = Exporter::start(config, clock)?;
        sink.export_to(exporter.lines());
        Ok(PipelineExport(Some(exporter)))
    }

    pub fn stats(&self) -> Option<ExportStats> {
        self.0.as_ref().map(Exporter::stats)
    }

    /// Flushes (until `deadline`); the counts after.
    pub async fn flush(&self, deadline: Instant) -> Option<ExportStats> {
        let exporter = self.0.as_ref()?;
        exporter.flush(deadline).await;
        Some(exporter.stats())
    }

    /// Detaches from `sink`, sends the rest (until `deadline`); the final counts.
    pub async fn finish(self, sink: &mut JsonLines, deadline: Instant) -> Option<ExportStats> {
        sink.stop_export();
        Some(self.0?.finish(deadline).await)
    }
}

fn queue(capacity: usize) -> (LineExport, mpsc::Receiver<Msg>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (LineExport { tx, counters: Arc::default() }, rx)
}

async fn export_loop(mut rx: mpsc::Receiver<Msg>, mut sender: Sender) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        let mut acks = Vec::new();
        match first {
            Msg::Line(line) => batch.push(line),
            Msg::Flush(ack) => acks.push(ack),
        }
        let full_at = Instant::now() + BATCH_DELAY;
        while acks.is_empty() && batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(full_at, rx.recv()).await {
                Ok(Some(Msg::Line(line))) => batch.push(line),
                Ok(Some(Msg::Flush(ack))) => acks.push(ack),
                Ok(None) | Err(_) => break,
            }
        }
        if !batch.is_empty() {
            sender.send(std::mem::take(&mut batch)).await;
        }
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

struct Sender {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    resource: Resource,
    clock: Clock,
    counters: Arc<Counters>,
    /// The last batch could not be sent (log the change, not every failure).
    failing: bool,
}

/// Why an attempt failed.
enum Failure {
    /// Worth another attempt: no connection, a timeout, 429 / 502 / 503 / 504.
    Retry(String),
    /// The collector refused the request.
    Rejected(String),
}

impl Sender {
    async fn send(&mut self, lines: Vec<Vec<u8>>) {
        let n = lines.len() as u64;
        let observed = u64::try_from(crate::time::realtime_ns()).unwrap_or(0);
        let records = lines.iter().map(|l| log_record(l, &self.clock, observed)).collect();
        let request = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(self.resource.clone()),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: SERVICE_NAME.into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    log_records: records,
                }],
            }],
        };
        let body = Bytes::from(request.encode_to_vec());
        drop(request);
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        let (counter, why) = loop {
            match self.post(body.clone()).await {
                Ok(rejected) => {
                    let rejected = rejected.min(n);
                    self.counters.exported.fetch_add(n - rejected, Ordering::Relaxed);
                    self.counters.rejected.fetch_add(rejected, Ordering::Relaxed);
                    if self.failing {
                        log::info!("OTLP export to {}: sending again", self.uri);
                        self.failing = false;
                    }
                    return;
                }
                Err(Failure::Rejected(why)) => break (&self.counters.rejected, why),
                Err(Failure::Retry(why)) if attempt >= MAX_ATTEMPTS => {
                    break (&self.counters.send_failed, why);
                }
                Err(Failure::Retry(_)) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    attempt += 1;
                }
            }
        };
        counter.fetch_add(n, Ordering::Relaxed);
        if !self.failing {
            log::warn!(
                "OTLP export to {}: {n} records dropped after {attempt} attempts: {why} \
                 (counted as otlp losses; further failures are not logged until a send succeeds)",
                self.uri
            );
            self.failing = true;
        }
    }

    /// One attempt; the records the collector rejected in a partial success.
    async fn post(&self, body: Bytes) -> Result<u64, Failure> {
        let request = hyper::Request::post(self.uri.clone())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(body))
            .map_err(|e| Failure::Rejected(format!("building the request: {e}")))?;
        let exchange = async {
            let answer = self.client.request(request).await.map_err(|e| {
                Failure::Retry(format!("{:#}", anyhow::Error::from(e).context("POST")))
            })?;
            let status = answer.status();
            let body = Limited::new(answer.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| Failure::Retry(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok((status, body))
        };
        let (status, body) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| Failure::Retry(format!("no answer within {REQUEST_TIMEOUT:?}")))??;
        match status.as_u16() {
            200..=299 => Ok(ExportLogsServiceResponse::decode(body)
                .ok()
                .and_then(|r| r.partial_success)
                .map_or(0, |p| u64::try_from(p.rejected_log_records).unwrap_or(0))),
            429 | 502 | 503 | 504 => Err(Failure::Retry(format!("HTTP {status}"))),
            _ => Err(Failure::Rejected(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ))),
        }
    }
}

/// OTLP `SeverityNumber` and text: of a `dotnet_event`, from its EventPipe level; of a
/// `session_failed` or `socket_refused`, WARN; of anything else, INFO.
pub fn severity(kind: &str, level: Option<u64>) -> (i32, &'static str) {
    const DEBUG: i32 = 5;
    const INFO: i32 = 9;
    const WARN: i32 = 13;
    const ERROR: i32 = 17;
    const FATAL: i32 = 21;
    match (kind, level) {
        ("dotnet_event", Some(0)) => (INFO, "LogAlways"),
        ("dotnet_event", Some(1)) => (FATAL, "Critical"),
        ("dotnet_event", Some(2)) => (ERROR, "Error"),
        ("dotnet_event", Some(3)) => (WARN, "Warning"),
        ("dotnet_event", Some(4)) => (INFO, "Informational"),
        ("dotnet_event", Some(_)) => (DEBUG, "Verbose"),
        ("session_failed" | "socket_refused", _) => (WARN, "WARN"),
        _ => (INFO, "INFO"),
    }
}

/// The log record of one output line (see the module documentation).
fn log_record(line: &[u8], clock: &Clock, observed_unix_nano: u64) -> LogRecord {
    let body = Some(AnyValue::string(String::from_utf8_lossy(line)));
    let Ok(fields) = serde_json::from_slice::<Map<String, Json>>(line) else {
        // Not produced by tracer's writer; sent as it is.
        return LogRecord {
            observed_time_unix_nano: observed_unix_nano,
            body,
            ..Default::default()
        };
    };
    let str_field = |k: &str| fields.get(k).and_then(Json::as_str).unwrap_or_default();
    let kind = str_field("kind");
    let (severity_number, severity_text) =
        severity(kind, fields.get("level").and_then(Json::as_u64));
    let event_name = if kind == "dotnet_event" {
        format!("{}/{}", str_field("provider"), str_field("event"))
    } else {
        kind.to_owned()
    };
    let time_unix_nano = fields
        .get("mono_ns")
        .and_then(Json::as_u64)
        .map_or(0, |mono| u64::try_from(clock.wall_ns(mono)).unwrap_or(0));
    let attributes = fields
        .iter()
        .filter(|(k, _)| *k != "ts")
        .filter_map(|(k, v)| match (k.as_str(), v.as_u64()) {
            // Semantic conventions give a process's start as an ISO-8601 time.
            ("process_start_ns", Some(boot_ns)) => Some(KeyValue::new(
                "process.creation.time",
                AnyValue::string(format_iso8601(clock.wall_of_boottime_ns(boot_ns))),
            )),
            _ => Some(KeyValue::new(attribute_name(k), any_value(v)?)),
        })
        .collect();
    LogRecord {
        time_unix_nano,
        observed_time_unix_nano: observed_unix_nano,
        severity_number,
        severity_text: severity_text.into(),
        body,
        attributes,
        event_name,
    }
}

/// OpenTelemetry semantic-convention names of the identity fields; other names as they are.
fn attribute_name(field: &str) -> &str {
    match field {
        "pid" => "process.pid",
        "container_id" => "container.id",
        "pod_uid" => "k8s.pod.uid",
        other => other,
    }
}

/// `null` is left out; integers beyond i64 (none today) go as strings to stay exact.
fn any_value(v: &Json) -> Option<AnyValue> {
    let value = match v {
        Json::Null => return None,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::Int(i),
            (None, Some(f)) if !n.is_u64() => Value::Double(f),
            _ => Value::String(n.to_string()),
        },
        Json::String(s) => Value::String(s.clone()),
        Json::Array(items) => Value::Array(ArrayValue {
            values: items.iter().map(|i| any_value(i).unwrap_or_default()).collect(),
        }),
        Json::Object(map) => Value::KvList(KeyValueList {
            values: map
                .iter()
                .filter_map(|(k, v)| Some(KeyValue::new(k.as_str(), any_value(v)?)))
                .collect(),
        }),
    };
    Some(AnyValue { value: Some(value) })
}

#[cfg(test)]
mod tests;
