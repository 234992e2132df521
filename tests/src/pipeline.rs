//! Runs one of tracer's pipelines (`audit::run`, `run::run`, …) in-process on its own thread and
//! runtime, collecting its JSON lines so a test can await the line it expects (with a timeout,
//! never a sleep) and then stop the pipeline the way a signal would. Every wait is bounded: a
//! pipeline that never gets ready or never stops fails the test with a message, it does not hang.

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::oneshot;
use tracer::output::JsonLines;

/// Resolves when the test asks the pipeline to stop.
pub type StopSignal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Forwards complete lines written to it over a channel.
pub struct LineSink {
    buf: Vec<u8>,
    tx: Sender<String>,
}

impl LineSink {
    pub fn new(tx: Sender<String>) -> LineSink {
        LineSink { buf: Vec::new(), tx }
    }
}

impl Write for LineSink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        while let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            let _ = self.tx.send(String::from_utf8_lossy(&line[..nl]).into_owned());
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How long a pipeline may take to return once told to stop (it drains its sessions first).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// What the pipeline thread reports: `Ready` once, then its result (nothing if it panicked).
enum Progress<S> {
    Ready,
    Done(anyhow::Result<S>),
}

/// A pipeline running on its own thread; `S` is its summary.
pub struct Running<S> {
    lines: Receiver<String>,
    seen: Vec<Value>,
    stop: Option<oneshot::Sender<()>>,
    progress: Receiver<Progress<S>>,
}

impl<S: Send + 'static> Running<S> {
    /// Starts `pipeline(sink, stop, ready)` and returns once it sent `ready` (it has attached and
    /// reported what already existed), or panics with its error. A pipeline not ready within
    /// `ready_timeout` is told to stop, and the panic says whether it did.
    #[track_caller]
    pub fn start<F, Fut>(ready_timeout: Duration, pipeline: F) -> Running<S>
    where
        F: FnOnce(JsonLines, StopSignal, oneshot::Sender<()>) -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<S>>,
    {
        let (line_tx, lines) = mpsc::channel();
        let (progress_tx, progress) = mpsc::channel();
        let (stop, stop_rx) = oneshot::channel::<()>();
        std::thread::spawn(move || {
            let result = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| {
                    rt.block_on(async {
                        let (ready, ready_signal) = oneshot::channel();
                        let sink = JsonLines::writer(LineSink::new(line_tx));
                        let stop: StopSignal = Box::pin(async { drop(stop_rx.await) });
                        let run = pipeline(sink, stop, ready);
                        tokio::pin!(run);
                        tokio::select! {
                            result = &mut run => return result,
                            // A dropped `ready` sender is not readiness.
                            Ok(()) = ready_signal => { let _ = progress_tx.send(Progress::Ready); }
                        }
                        run.await
                    })
                });
            let _ = progress_tx.send(Progress::Done(result));
        });
        let mut running = Running { lines, seen: Vec::new(), stop: Some(stop), progress };
        match running.progress.recv_timeout(ready_timeout) {
            Ok(Progress::Ready) => running,
            Ok(Progress::Done(Err(e))) => panic!("pipeline failed to start: {e:#}"),
            Ok(Progress::Done(Ok(_))) => panic!("pipeline ended before it was ready"),
            Err(RecvTimeoutError::Disconnected) => panic!("pipeline panicked before it was ready"),
            Err(RecvTimeoutError::Timeout) => {
                let stopped = match running.stop_and_wait() {
                    Ok(_) => "it stopped when told to".to_owned(),
                    Err(why) => why,
                };
                panic!("pipeline not ready within {ready_timeout:?} ({stopped})")
            }
        }
    }

    /// Sends the stop signal and waits (at most [`STOP_TIMEOUT`]) for the pipeline's result.
    fn stop_and_wait(&mut self) -> Result<S, String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        loop {
            match self.progress.recv_timeout(STOP_TIMEOUT) {
                Ok(Progress::Ready) => continue,
                Ok(Progress::Done(Ok(summary))) => return Ok(summary),
                Ok(Progress::Done(Err(e))) => return Err(format!("pipeline failed: {e:#}")),
                Err(RecvTimeoutError::Disconnected) => return Err("pipeline panicked".into()),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("pipeline did not stop within {STOP_TIMEOUT:?}"));
                }
            }
        }
    }

    fn collect_pending(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(parse(&line));
        }
    }

    /// Waits for (and returns) the first line, already seen or new, matching `pred`.
    #[track_caller]
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        self.wait_for_count(what, timeout, 1, pred).pop().expect("one line")
    }

    /// Waits until `count` lines matching `pred` were received; returns them in order.
    #[track_caller]
    pub fn wait_for_count(
        &mut self,
        what: &str,
        timeout: Duration,
        count: usize,
        pred: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        self.collect_pending();
        let mut found: Vec<Value> = self.seen.iter().filter(|v| pred(v)).cloned().collect();
        // Only new lines are checked from here on: waiting for many lines stays linear.
        while found.len() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let v = parse(&line);
                    if pred(&v) {
                        found.push(v.clone());
                    }
                    self.seen.push(v);
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "{} of {count} {what} within {timeout:?}; lines so far:\n{}",
                    found.len(),
                    self.seen.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")
                ),
                Err(RecvTimeoutError::Disconnected) => panic!("pipeline ended before {what}"),
            }
        }
        found
    }

    /// Stops the pipeline (as SIGINT would) and returns every line and its summary; panics if
    /// it fails or does not stop within [`STOP_TIMEOUT`].
    #[track_caller]
    pub fn stop(mut self) -> (Vec<Value>, S) {
        let summary = match self.stop_and_wait() {
            Ok(summary) => summary,
            Err(why) => panic!("{why}"),
        };
        self.collect_pending();
        (std::mem::take(&mut self.seen), summary)
    }
}

impl<S> Drop for Running<S> {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn parse(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("invalid JSON line {line:?}: {e}"))
}

/// Whether `line` is a `kind` line about process `pid`.
pub fn is(line: &Value, kind: &str, pid: impl Into<u64>) -> bool {
    line["kind"] == kind && line["pid"] == pid.into()
}

/// Whether `line` is the runtime event `event` of process `pid`.
pub fn is_event(line: &Value, pid: impl Into<u64>, event: &str) -> bool {
    is(line, "dotnet_event", pid) && line["event"] == event
}

/// How many of `lines` satisfy `pred`.
pub fn count(lines: &[Value], pred: impl Fn(&Value) -> bool) -> usize {
    lines.iter().filter(|l| pred(l)).count()
}

/// `line[key]` as u64 (panics with the line when absent: tests want exact fields).
pub fn u64_field(line: &Value, key: &str) -> u64 {
    line[key].as_u64().unwrap_or_else(|| panic!("no numeric {key:?} in {line}"))
}

/// A `tracer run` configuration for tests: `providers` in dotnet-trace syntax, a 64 MB runtime
/// buffer, default IPC timeouts, no live status.
pub fn run_config(
    providers: &str,
    mode: tracer::session::SessionMode,
    locate_for: Duration,
    buffer_size_kb: u64,
) -> tracer::pipeline::run::RunConfig {
    let providers = tracer::ipc::providers::parse_providers(providers).expect("provider spec");
    tracer::pipeline::run::RunConfig {
        admission: Default::default(),
        session: tracer::session::SessionConfig {
            request: tracer_decode::diagnostic_ipc::TracingRequest {
                circular_buffer_mb: 64,
                providers: providers.clone(),
                rundown_keyword: 0,
                request_stackwalk: true,
                buffering_mode: None,
            },
            mode,
            timeouts: tracer::ipc::client::Timeouts::default(),
            locate_for,
            drain_timeout: Duration::from_secs(10),
            user_events_grant: Default::default(),
            nettrace_dir: None,
            stopping_event: None,
            meters: None,
        },
        providers,
        target_pids: Vec::new(),
        hooks: Default::default(),
        live_status: false,
        buffer_size_kb,
        filter: Default::default(),
        metrics: None,
        otlp: None,
        kernel_events: Vec::new(),
    }
}

/// `config` asking for `providers` (a profile's) instead of its own: the sessions' request and
/// what the pipeline reports as requested.
pub fn with_providers(
    mut config: tracer::pipeline::run::RunConfig,
    providers: Vec<tracer_decode::diagnostic_ipc::FilteredProvider>,
) -> tracer::pipeline::run::RunConfig {
    config.session.request.providers = providers.clone();
    config.providers = providers;
    config
}

/// Starts `tracer run` in-process with `config`.
pub fn start_run(
    ready_timeout: Duration,
    config: tracer::pipeline::run::RunConfig,
) -> Running<tracer::pipeline::run::RunSummary> {
    Running::start(ready_timeout, move |sink, stop, ready| {
        tracer::pipeline::run::run(config, sink, stop, Some(ready))
    })
}
