//! `--otlp-endpoint URL`: every output line as an OpenTelemetry log record, sent over OTLP/HTTP
//! (protobuf, `POST <URL>/v1/logs`) to a collector.
//!
//! The hot path only copies records into a bounded queue ([`LineExport`]'s [`LineTap`] side,
//! never waits); a task on tracer's runtime batches up to [`MAX_BATCH`]
//! records (or what arrived within [`BATCH_DELAY`]) and posts them, retrying with exponential
//! backoff. A collector that is down or slow fills the queue, and the records that do not fit
//! are dropped: memory stays at most [`QUEUE_CAPACITY`] records plus the batch in flight, and
//! tracing never waits for the collector. Every record not accepted is counted as a
//! loss `("otlp", reason)` ([`ExportStats::losses`]): `queue_full`, `send_failed` (every attempt
//! failed), `rejected` (the collector refused it: a non-retryable status or a partial success),
//! `shutdown_timeout` (still queued or in flight when [`SHUTDOWN_TIMEOUT`] ran out at exit),
//! `unencoded` (lines a session rendered without their records: none expected, every session
//! is asked for them).
//!
//! What a record holds is the output schema's business (`crate::output::otlp`): records arrive
//! encoded with their lines. The queue counts records. Resource: `service.name` =
//! [`SERVICE_NAME`], `service.version`, `host.name`, and `k8s.node.name` from the environment
//! variable [`NODE_NAME_ENV`] (the DaemonSet sets it from the downward API).
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
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::output::otlp::EncodedRecords;
use crate::output::{JsonLines, LineTap, LossCount};
use crate::time::Clock;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// Records waiting for the exporter; records offered to a full queue are dropped
/// (`queue_full`).
pub const QUEUE_CAPACITY: usize = 8192;
/// Records that make a request full: it is sent once it holds this many (the records of one
/// batch of runtime events are not split, so a request may hold up to a batch more).
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
    /// How often `run` sends the runtime metrics (`--otlp-metrics-interval`).
    pub metrics_interval: std::time::Duration,
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
            metrics_interval: crate::export::otlp_metrics::DEFAULT_INTERVAL,
        };
        config.logs_uri()?;
        Ok(config)
    }

    /// `<endpoint>/v1/logs`.
    pub fn logs_uri(&self) -> anyhow::Result<Uri> {
        self.uri(LOGS_PATH)
    }

    /// `<endpoint><path>`; only `http://` (put a node-local collector in front for TLS).
    pub fn uri(&self, path: &str) -> anyhow::Result<Uri> {
        let url = format!("{}{path}", self.endpoint.trim_end_matches('/'));
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

    /// `host.name` and `k8s.node.name`, those known.
    pub fn node_attributes(&self) -> Vec<(String, String)> {
        let host = self.host_name.clone().map(|h| ("host.name".to_owned(), h));
        let node = self.node_name.clone().map(|n| ("k8s.node.name".to_owned(), n));
        host.into_iter().chain(node).collect()
    }

    /// The resource of tracer's own records (its lines).
    fn resource(&self) -> Resource {
        let attribute = |key: &str, value: &str| KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(Value::StringValue(value.into())) }),
            ..Default::default()
        };
        let mut attributes = vec![
            attribute("service.name", SERVICE_NAME),
            attribute("service.version", env!("CARGO_PKG_VERSION")),
        ];
        attributes.extend(self.node_attributes().iter().map(|(k, v)| attribute(k, v)));
        Resource { attributes, ..Default::default() }
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
    pub unencoded: u64,
}

impl ExportStats {
    /// Every loss the exporter counts, zero counts included.
    pub fn losses(&self) -> [LossCount; 5] {
        let loss = |reason, count| LossCount { source: "otlp", reason, count };
        [
            loss("queue_full", self.queue_full),
            loss("send_failed", self.send_failed),
            loss("rejected", self.rejected),
            loss("shutdown_timeout", self.shutdown_timeout),
            loss("unencoded", self.unencoded),
        ]
    }

    pub fn lost(&self) -> u64 {
        self.losses().iter().map(|l| l.count).sum()
    }
}

#[derive(Debug, Default)]
struct Counters {
    /// Records offered and taken into the queue, in all.
    queued: AtomicU64,
    /// Records in the queue now (at most the queue's capacity).
    waiting: AtomicU64,
    delivery: Delivery,
    queue_full: AtomicU64,
    shutdown_timeout: AtomicU64,
    unencoded: AtomicU64,
}

impl Counters {
    fn stats(&self) -> ExportStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ExportStats {
            exported: get(&self.delivery.exported),
            queue_full: get(&self.queue_full),
            send_failed: get(&self.delivery.send_failed),
            rejected: get(&self.delivery.rejected),
            shutdown_timeout: get(&self.shutdown_timeout),
            unencoded: get(&self.unencoded),
        }
    }
}

#[derive(Debug)]
enum Msg {
    /// Records encoded with their lines.
    Records(EncodedRecords),
    /// Answered once every line queued before it was sent (or given up).
    Flush(oneshot::Sender<()>),
}

/// The writer's end of the queue (held by [`crate::output::JsonLines`]).
#[derive(Clone, Debug)]
pub struct LineExport {
    tx: mpsc::Sender<Msg>,
    counters: Arc<Counters>,
    /// Records the queue holds at most.
    capacity: u64,
}

impl LineTap for LineExport {
    /// Queues a copy of records encoded with their lines, or counts them as `queue_full`:
    /// never waits. The writer is the only producer, so the room checked is still there when
    /// the records are added.
    fn offer_records(&self, records: &EncodedRecords) {
        let (counters, n) = (&self.counters, records.count());
        let fits = counters.waiting.load(Ordering::Relaxed) + n <= self.capacity;
        // Closed only if the exporter task is gone (it ends when the queue closes).
        if fits && self.tx.try_send(Msg::Records(records.clone())).is_ok() {
            counters.waiting.fetch_add(n, Ordering::Relaxed);
            counters.queued.fetch_add(n, Ordering::Relaxed);
        } else {
            counters.queue_full.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn count_unencoded(&self, lines: u64) {
        self.counters.unencoded.fetch_add(lines, Ordering::Relaxed);
    }
}

/// The running exporter: its task, and the pipeline's handles on it.
pub struct Exporter {
    lines: LineExport,
    task: JoinHandle<()>,
}

impl Exporter {
    /// Spawns the exporter task on the current runtime.
    pub fn start(config: &OtlpConfig) -> anyhow::Result<Exporter> {
        let (lines, rx) = queue(config.queue_capacity);
        let sender = Sender {
            poster: Poster::new(config.logs_uri()?),
            resource: config.resource().encode_to_vec(),
            scope: InstrumentationScope {
                name: SERVICE_NAME.into(),
                version: env!("CARGO_PKG_VERSION").into(),
                ..Default::default()
            }
            .encode_to_vec(),
            counters: lines.counters.clone(),
        };
        log::info!("exporting lines as OTLP log records to {}", sender.poster.uri);
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
        let Exporter { lines: LineExport { tx, counters, .. }, mut task } = self;
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
        let exporter = Exporter::start(config)?;
        sink.export_to(exporter.lines(), clock);
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
    // Each message holds at least one record: the channel never fills before the count does.
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (LineExport { tx, counters: Arc::default(), capacity: capacity as u64 }, rx)
}

async fn export_loop(mut rx: mpsc::Receiver<Msg>, mut sender: Sender) {
    let mut batch = EncodedRecords::default();
    while let Some(first) = rx.recv().await {
        let mut acks = Vec::new();
        sender.take(first, &mut batch, &mut acks);
        let full_at = Instant::now() + BATCH_DELAY;
        while acks.is_empty() && batch.count() < MAX_BATCH as u64 {
            match tokio::time::timeout_at(full_at, rx.recv()).await {
                Ok(Some(msg)) => sender.take(msg, &mut batch, &mut acks),
                Ok(None) | Err(_) => break,
            }
        }
        if !batch.is_empty() {
            // One buffer for every batch: a few hundred KiB each, not a new one grown each time.
            sender.send(&batch).await;
            batch.clear();
        }
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

struct Sender {
    poster: Poster,
    /// The `Resource` and `InstrumentationScope` messages, encoded once.
    resource: Vec<u8>,
    scope: Vec<u8>,
    counters: Arc<Counters>,
}

impl Sender {
    /// Adds a message's records to `batch`, or its acknowledgement to `acks`.
    fn take(&self, msg: Msg, batch: &mut EncodedRecords, acks: &mut Vec<oneshot::Sender<()>>) {
        match msg {
            Msg::Records(records) => {
                batch.append(&records);
                self.counters.waiting.fetch_sub(records.count(), Ordering::Relaxed);
            }
            Msg::Flush(ack) => acks.push(ack),
        }
    }

    /// An `ExportLogsServiceRequest` of one resource and scope with `records`: the nested
    /// messages written once, into a buffer of their exact size (a request is a few hundred KiB).
    fn request(&self, records: &EncodedRecords) -> Vec<u8> {
        use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
        let field_len = |tag: u32, len: usize| key_len(tag) + encoded_len_varint(len as u64) + len;
        let head = |tag: u32, len: usize, out: &mut Vec<u8>| {
            encode_key(tag, WireType::LengthDelimited, out);
            encode_varint(len as u64, out);
        };
        // ExportLogsServiceRequest { 1: ResourceLogs { 1: resource, 2: ScopeLogs { 1: scope,
        // 2: records… } } }
        let scope_logs = field_len(1, self.scope.len()) + records.as_bytes().len();
        let resource_logs = field_len(1, self.resource.len()) + field_len(2, scope_logs);
        let mut request = Vec::with_capacity(field_len(1, resource_logs));
        head(1, resource_logs, &mut request);
        head(1, self.resource.len(), &mut request);
        request.extend_from_slice(&self.resource);
        head(2, scope_logs, &mut request);
        head(1, self.scope.len(), &mut request);
        request.extend_from_slice(&self.scope);
        request.extend_from_slice(records.as_bytes());
        debug_assert_eq!(request.len(), request.capacity());
        request
    }

    async fn send(&mut self, records: &EncodedRecords) {
        let body = Bytes::from(self.request(records));
        let rejected_of = |answer: Bytes| {
            let partial =
                ExportLogsServiceResponse::decode(answer).ok().and_then(|r| r.partial_success);
            partial.map_or(0, |p| u64::try_from(p.rejected_log_records).unwrap_or(0))
        };
        let items = Items { n: records.count(), what: "records", source: "otlp" };
        self.poster.deliver(body, items, &self.counters.delivery, rejected_of).await;
    }
}

/// What became of the items (log records, data points) a [`Poster`] was given.
#[derive(Debug, Default)]
pub(super) struct Delivery {
    pub(super) exported: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) send_failed: AtomicU64,
}

/// The items of one request: how many, what they are and whose losses they are, for the log.
pub(super) struct Items {
    pub(super) n: u64,
    pub(super) what: &'static str,
    pub(super) source: &'static str,
}

/// Why a request was not taken: the collector refused it, or every attempt failed.
enum Failed {
    Rejected(String),
    Unsent(String),
}

/// Why one attempt failed.
enum Failure {
    /// Worth another attempt: no connection, a timeout, 429 / 502 / 503 / 504.
    Retry(String),
    /// The collector refused the request.
    Rejected(String),
}

/// Posts protobuf requests to one OTLP/HTTP path (`/v1/logs`, `/v1/metrics`): up to
/// [`MAX_ATTEMPTS`] attempts with exponential backoff, each within [`REQUEST_TIMEOUT`].
pub(super) struct Poster {
    client: Client<HttpConnector, Full<Bytes>>,
    pub(super) uri: Uri,
    /// The last request could not be sent (log the change, not every failure).
    failing: bool,
}

impl Poster {
    pub(super) fn new(uri: Uri) -> Poster {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(REQUEST_TIMEOUT));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Poster { client, uri, failing: false }
    }

    /// Posts `body`, which holds `items`, and counts them in `delivery`: exported, rejected
    /// (the collector refused the request, or those `rejected_of` its answer says it refused in
    /// a partial success) or send_failed. The first failure after a success is logged.
    pub(super) async fn deliver(
        &mut self,
        body: Bytes,
        items: Items,
        delivery: &Delivery,
        rejected_of: impl FnOnce(Bytes) -> u64,
    ) {
        let Items { n, what, source } = items;
        let (counter, why) = match self.post(body).await {
            Ok(answer) => {
                let rejected = rejected_of(answer).min(n);
                delivery.exported.fetch_add(n - rejected, Ordering::Relaxed);
                delivery.rejected.fetch_add(rejected, Ordering::Relaxed);
                if self.failing {
                    log::info!("OTLP export to {}: sending again", self.uri);
                    self.failing = false;
                }
                return;
            }
            Err(Failed::Rejected(why)) => (&delivery.rejected, why),
            Err(Failed::Unsent(why)) => (&delivery.send_failed, why),
        };
        counter.fetch_add(n, Ordering::Relaxed);
        if !self.failing {
            log::warn!(
                "OTLP export to {}: {n} {what} dropped: {why} (counted as {source} losses; \
                 further failures are not logged until a send succeeds)",
                self.uri
            );
            self.failing = true;
        }
    }

    /// Posts `body` until the collector takes it (its answer's body), refuses it, or the
    /// attempts run out.
    async fn post(&self, body: Bytes) -> Result<Bytes, Failed> {
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            match self.attempt(body.clone()).await {
                Ok(answer) => return Ok(answer),
                Err(Failure::Rejected(why)) => return Err(Failed::Rejected(why)),
                Err(Failure::Retry(why)) if attempt >= MAX_ATTEMPTS => {
                    return Err(Failed::Unsent(format!("{why}, after {attempt} attempts")));
                }
                Err(Failure::Retry(_)) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    attempt += 1;
                }
            }
        }
    }

    /// One attempt; the answer's body on a 2xx status.
    async fn attempt(&self, body: Bytes) -> Result<Bytes, Failure> {
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
            200..=299 => Ok(body),
            429 | 502 | 503 | 504 => Err(Failure::Retry(format!("HTTP {status}"))),
            _ => Err(Failure::Rejected(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
