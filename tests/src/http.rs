//! A minimal HTTP/1.1 GET client over std's TcpStream for the metrics and Prometheus tests
//! (one request per connection, `Connection: close`).
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context as _, bail};

pub struct Response {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// `GET path` with extra request `headers` (`Name: value` lines).
pub fn get(addr: SocketAddr, path: &str, headers: &[&str]) -> anyhow::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).with_context(|| format!("reading the answer to GET {path}"))?;
    // Bodies that are not text (a gzip'd profile) are kept as text with replacement characters:
    // the head decides what a test reads of them.
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else { bail!("no header end: {text:?}") };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked { dechunk(body)? } else { body.to_string() };
    Ok(Response { status, content_type, body })
}

fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("chunk size")?;
        let size = usize::from_str_radix(size.trim(), 16).context("chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).context("short chunk")?);
        body = rest.get(size + 2..).context("chunk end")?;
    }
}

/// A port free on loopback right now (the OS picks it; released for the caller to bind).
pub fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding loopback");
    listener.local_addr().expect("local address")
}
