//! The metrics endpoint: `GET /metrics` and `GET /healthz` over HTTP/1.1 (hyper), on the
//! pipeline's tokio runtime. Anyone who can reach the address can connect, so connections are
//! capped and each request must arrive within a timeout; bodies are never read.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::Shared;

/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 16;
/// Time a client has to send its request headers (slowloris bound).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Prometheus asks for OpenMetrics in `Accept`; other clients get the classic text format.
fn accepts_openmetrics(req: &Request<Incoming>) -> bool {
    req.headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("application/openmetrics-text")))
}

/// Binds `addr` now (so a bad address fails the command at start) and serves until the runtime
/// ends. Returns the bound address (port 0 picks a free one).
pub async fn serve(addr: SocketAddr, shared: Arc<Shared>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-addr {addr}: binding the metrics endpoint"))?;
    let local = listener.local_addr().context("metrics endpoint address")?;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else { return };
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("metrics endpoint: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| respond(req, shared.clone()));
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(REQUEST_TIMEOUT)
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(e) = conn.await {
                    log::debug!("metrics endpoint: connection from {peer}: {e}");
                }
                drop(permit);
            });
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
