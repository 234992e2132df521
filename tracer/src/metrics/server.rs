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

use super::Shared;

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
        "/healthz" => match shared.health().problem() {
            None => text(StatusCode::OK, PLAIN, "ok\n".into()),
            Some(reason) => text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, format!("{reason}\n")),
        },
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found: try /metrics or /healthz\n".into()),
    })
}
