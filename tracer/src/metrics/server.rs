//! The metrics endpoint: `GET /metrics` and `GET /healthz` over HTTP/1.1 (hyper), on the
//! pipeline's tokio runtime.
//!
//! Anyone who can reach the address can connect (a DaemonSet binds every interface, and its
//! liveness probe asks `/healthz`), so no client may hold up another: every connection is
//! served by a task of its own as soon as it is accepted, and the accept loop never waits for a
//! slot. What a neighbour can take is bounded instead: at most [`MAX_CONNECTIONS`] connections
//! are open, and at the limit a new one closes the oldest (a probe or a scrape is answered
//! within milliseconds of connecting, so the connections old enough to be closed are those that
//! sit idle); a request head must arrive whole within [`REQUEST_TIMEOUT`] (slow senders, and
//! keep-alive connections idle that long, are closed) and fit in [`MAX_REQUEST_HEAD_BYTES`]
//! (431 otherwise); bodies are never read. Memory is thus at most [`MAX_CONNECTIONS`] read
//! buffers. Connections closed by either bound before they sent a whole request are counted
//! (`tracer_endpoint_connections_closed_total{reason="evicted"|"timed_out"}`).
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::AbortHandle;

use super::{ProfileRequest, Shared};

/// Connections open at once; at the limit, accepting one closes the oldest.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections the kernel queues until they are accepted (the kernel caps it at
/// `net.core.somaxconn`). The usual 128 overflows when a neighbour opens connections in a burst,
/// and a probe whose connection does not fit waits for its SYN to be sent again, a second later.
pub const LISTEN_BACKLOG: u32 = 1024;
/// Time a client has to send a whole request head, from its first byte or from the end of the
/// previous response on a kept-alive connection (slowloris bound, idle keep-alive bound).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read (hyper's read buffer of a connection; its smallest allowed size
/// is 8 KiB). A bigger head is answered 431.
pub const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;

/// `GET /debug/pprof/profile` without `seconds`: Go's `net/http/pprof` default.
pub const DEFAULT_PROFILE_SECONDS: u64 = 30;
/// Longest profile one request may ask for (`seconds`); longer asks are answered 400.
pub const MAX_PROFILE_SECONDS: u64 = 300;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Prometheus asks for OpenMetrics in `Accept`; other clients get the classic text format.
fn accepts_openmetrics(req: &Request<Incoming>) -> bool {
    req.headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("application/openmetrics-text")))
}

/// The open connections by age (ids increase with each accept): the first is the oldest.
#[derive(Default)]
struct OpenConnections(Mutex<BTreeMap<u64, AbortHandle>>);

impl OpenConnections {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, AbortHandle>> {
        // A panic while holding the lock leaves a map that is still consistent.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A listening socket with room for [`LISTEN_BACKLOG`] connections not yet accepted.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds `addr` now (so a bad address fails the command at start) and serves until the runtime
/// ends. Returns the bound address (port 0 picks a free one).
pub async fn serve(addr: SocketAddr, shared: Arc<Shared>) -> anyhow::Result<SocketAddr> {
    let listener = listen(addr)
        .with_context(|| format!("--metrics-addr {addr}: binding the metrics endpoint"))?;
    let local = listener.local_addr().context("metrics endpoint address")?;
    // Room for MAX_CONNECTIONS sockets beside the pipeline's own files.
    crate::kernel::raise_open_file_limit();
    let open = Arc::new(OpenConnections::default());
    tokio::spawn(async move {
        for id in 0u64.. {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and the like: what frees a descriptor is a connection ending.
                    log::warn!("metrics endpoint: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            shared.connections.accepted.fetch_add(1, Ordering::Relaxed);
            // Held until the task is recorded: the task's own removal waits for it.
            let mut connections = open.lock();
            if connections.len() >= MAX_CONNECTIONS
                && let Some((_, oldest)) = connections.pop_first()
            {
                oldest.abort();
                shared.connections.evicted.fetch_add(1, Ordering::Relaxed);
            }
            let (shared, open) = (shared.clone(), open.clone());
            let task = tokio::spawn(async move {
                // A kept-alive connection that answered a request and then idles out is a
                // normal close; one that never sent a whole request is counted.
                let answered = Arc::new(AtomicBool::new(false));
                let service = {
                    let (shared, answered) = (shared.clone(), answered.clone());
                    service_fn(move |req| {
                        answered.store(true, Ordering::Relaxed);
                        respond(req, shared.clone())
                    })
                };
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(REQUEST_TIMEOUT)
                    .max_buf_size(MAX_REQUEST_HEAD_BYTES)
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service);
                match conn.await {
                    Err(e) if e.is_timeout() && !answered.load(Ordering::Relaxed) => {
                        shared.connections.timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => log::debug!("metrics endpoint: connection from {peer}: {e}"),
                    Ok(()) => {}
                }
                open.lock().remove(&id);
            });
            connections.insert(id, task.abort_handle());
        }
    });
    Ok(local)
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

async fn respond(
    req: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "only GET\n".into()));
    }
    Ok(match req.uri().path() {
        "/metrics" => match shared.exposition() {
            Ok(body) if accepts_openmetrics(&req) => text(StatusCode::OK, OPENMETRICS, body),
            Ok(body) => text(StatusCode::OK, PROMETHEUS_TEXT, super::to_prometheus_text(&body)),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, PLAIN, format!("{e:#}\n")),
        },
        "/debug/pprof/profile" => profile(&req, &shared).await,
        "/healthz" => match shared.health().problem() {
            None => text(StatusCode::OK, PLAIN, "ok\n".into()),
            Some(reason) => text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, format!("{reason}\n")),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: try /metrics, /healthz or /debug/pprof/profile\n".into(),
        ),
    })
}

/// Clears the one-profile-at-a-time flag when the profile ends, or when its request is dropped
/// (the client went away: the profile's future is dropped with it, and sampling stops).
struct ProfileSlot<'a>(&'a AtomicBool);

impl Drop for ProfileSlot<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// `GET /debug/pprof/profile?seconds=N[&pid=P…][&container=ID…]`: a gzip'd pprof CPU profile of
/// the selected processes over the next N seconds, one at a time.
async fn profile(req: &Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    let Some(source) = shared.profiles.get() else {
        let why = "not found: profiles are served by `tracer run --metrics-addr`\n";
        return text(StatusCode::NOT_FOUND, PLAIN, why.into());
    };
    let request = match profile_request(req.uri().query().unwrap_or_default()) {
        Ok(r) => r,
        Err(why) => return text(StatusCode::BAD_REQUEST, PLAIN, format!("{why}\n")),
    };
    if shared.profiling.swap(true, Ordering::AcqRel) {
        shared.profiles_refused.fetch_add(1, Ordering::Relaxed);
        let why = "a profile is being taken: one at a time, ask again when it is done\n";
        return text(StatusCode::TOO_MANY_REQUESTS, PLAIN, why.into());
    }
    let _slot = ProfileSlot(&shared.profiling);
    match source.profile(request).await {
        Ok(pprof) => {
            let mut response = Response::new(Full::new(Bytes::from(pprof)));
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            headers.insert(
                hyper::header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment; filename=\"profile\""),
            );
            response
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, PLAIN, format!("{e:#}\n")),
    }
}

/// The query of a profile request: `seconds` (1 to [`MAX_PROFILE_SECONDS`], default
/// [`DEFAULT_PROFILE_SECONDS`]), `pid` and `container` (each repeatable).
fn profile_request(query: &str) -> Result<ProfileRequest, String> {
    let mut request = ProfileRequest {
        duration: Duration::from_secs(DEFAULT_PROFILE_SECONDS),
        ..ProfileRequest::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "seconds" => match value.parse::<u64>() {
                Ok(s @ 1..=MAX_PROFILE_SECONDS) => request.duration = Duration::from_secs(s),
                _ => {
                    return Err(format!(
                        "seconds={value}: expected a whole number of seconds from 1 to \
                         {MAX_PROFILE_SECONDS}"
                    ));
                }
            },
            "pid" => request
                .pids
                .push(value.parse().map_err(|_| format!("pid={value}: expected a process id"))?),
            "container" if !value.is_empty() => request.containers.push(value.to_owned()),
            _ => return Err(format!("{pair}: expected seconds=N, pid=P or container=ID")),
        }
    }
    Ok(request)
}
