//! `cargo xtask bench agent`: tracer as a node agent. `tracer run --profile counters` with its
//! metrics endpoint on, next to 50 real CoreCLR 8 runtimes that each report their 27
//! `System.Runtime` counters every second and [`INSTRUMENTS`] Meter instruments every 5 s
//! (`--meters`); a scraper reads `/metrics` every 5 s. Three rows,
//! each over a fixed window once every runtime is traced: without OTLP export; with every line
//! exported to a loopback OTLP/HTTP collector that takes every record; and with export under
//! process churn (a driver starting [`CHURN_RATE`] short-lived processes a second: fork, exec
//! and exit of `/bin/true`, while [`CHURN_RUNTIMES`] new runtimes start among them: each must be
//! detected, and the kernel's detection losses stay 0). Each row: tracer's CPU (share of one
//! core), resident memory and its peak, the series served, the lines written per second
//! (targets: RSS ≤ 32 MiB; CPU ≤ 1 % without export, ≤ 2 % with it, ≤ 5 % under churn).
//! Then the export's throughput: a .NET 10 test double emits a burst of events, and the
//! collector counts the records that reach it and how fast.
//!
//! `--against BIN [--rounds N]`: the row without export only, for this build and another
//! tracer binary in alternating windows beside the same runtimes: a change's effect apart from
//! the machine's drift, which moves this row by more than most changes do.
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::bench::{
    Process, TIMEOUT, Tracer, USER_HZ, context_line, cpu_ticks, spawn_ready, usage,
    write_docs_section,
};
use crate::util;

pub const RUNTIMES: usize = 50;
/// Meter instruments of each runtime (`instruments` of tests/dotnet/coreclr_host.py).
pub const INSTRUMENTS: usize = 20;
/// `--meters`: the default ones and the runtimes' own.
const METERS: &str = "TracerBench.App,System.Runtime,System.Net.Http,System.Net.NameResolution,\
                      Microsoft.AspNetCore.Hosting,Microsoft.AspNetCore.Server.Kestrel";
const HOST: &str = "tests/dotnet/coreclr_host.py";
const SCRAPE_INTERVAL: Duration = Duration::from_secs(5);
/// Runtimes settle (JIT, first counters) before the window starts.
pub const SETTLE: Duration = Duration::from_secs(10);
pub const WINDOW: Duration = Duration::from_secs(60);
/// Short-lived processes started per second during the churn row, and for how long.
const CHURN_RATE: u32 = 1000;
const CHURN_WINDOW: Duration = Duration::from_secs(30);
/// Threads of the churn driver (each starts and reaps its share of the processes).
const CHURN_THREADS: u32 = 4;
/// Runtimes started during the churn row: each must be detected and traced.
const CHURN_RUNTIMES: usize = 5;
const DOUBLE: &str = "tests/dotnet/dotnet10_double.py";
/// Events of the export throughput burst, in event blocks of [`BURST_BLOCK`] (a runtime's blocks
/// are small: one block of everything would pass a session's pending-line budget).
const BURST: u64 = 100_000;
const BURST_BLOCK: u64 = 1_000;

/// Rounds of `--against` unless told: each one window of either build.
const COMPARE_ROUNDS: usize = 3;

pub fn run(args: &[String]) -> anyhow::Result<()> {
    util::require_root("the benchmark loads BPF programs")?;
    let against = parse_against(args)?;
    util::cargo(&["build", "--release", "-p", "tracer", "--bins"])?;
    let bin = util::workspace_root().join("target/release/tracer");
    let (runtimes, pids) = start_runtimes(RUNTIMES)?;

    let metrics = TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
    let plain_args = ["run", "--profile", "counters", "--session", "streaming", "--meters", METERS];
    let mut args = plain_args.to_vec();
    args.extend(["--metrics-addr", &metrics]);
    // The row without export of `bin`: its measurement and its summary at exit.
    let without = |bin: &std::path::Path| -> anyhow::Result<(Measured, String)> {
        let tracer = Tracer::start(bin, &args, "watching for .NET processes")?;
        let measured = measure(&tracer, metrics.parse()?, &pids, None);
        Ok((measured?, tracer.stop()?))
    };
    if let Some((other, rounds)) = against {
        return compare(&other, &bin, rounds, without);
    }
    let without = without(&bin)?;

    let collector = Collector::start()?;
    let otlp_arg = format!("http://{}", collector.addr);
    args.extend(["--otlp-endpoint", &otlp_arg]);
    let tracer = Tracer::start(&bin, &args, "watching for .NET processes")?;
    let with = measure(&tracer, metrics.parse()?, &pids, Some(&collector));
    let churn = with.and_then(|with| Ok((with, churn(&tracer, metrics.parse()?)?)));
    let summary = tracer.stop();
    let (with, churn) = churn?;
    let summary = summary?;
    drop(runtimes);
    let line = |summary: &str, key: &str| {
        summary.lines().find(|l| l.contains(key)).map(str::trim).unwrap_or("?").to_string()
    };
    // The kernel's detection losses by reason, e.g. `kernel ringbuf_full: 0`.
    let detection_losses = summary
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kernel ") || l.starts_with("detection cpu"))
        .collect::<Vec<_>>();
    if detection_losses.iter().any(|l| !l.ends_with(": 0")) {
        bail!("detections lost under churn: {detection_losses:?}");
    }

    let burst = export_burst(&bin)?;

    let mut r = context_line("cargo xtask bench agent");
    r += &format!(
        "`tracer run --profile counters --session streaming --meters … --metrics-addr …` with \
         {RUNTIMES} real CoreCLR 8.0.4 runtimes (each its 27 System.Runtime counters every 1 s \
         and {INSTRUMENTS} Meter instruments every 5 s: counters, gauges, up-down counters, \
         histograms), \
         `/metrics` scraped every {} s; each row measured over {} s once all were traced and \
         had settled {} s. \"OTLP\": with `--otlp-endpoint …`, every line and (every 10 s) \
         every runtime's metrics exported to a loopback OTLP/HTTP collector that answers 200 \
         at once. \"churn\": the same tracer \
         right after, for {} s, beside a driver starting `/bin/true` (fork + exec + exit) \
         from {CHURN_THREADS} threads at up to {CHURN_RATE} a second, while {CHURN_RUNTIMES} \
         new runtimes started (each was detected and traced).\n\n\
         | row | tracer CPU (one core) | VmRSS | VmHWM | open fds | series served | scrape size | lines per second | OTLP requests per second | processes started per second |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n\
         {}{}{}\n\
         Targets: RSS ≤ 32 MiB; CPU ≤ 1 % of one core without export, ≤ 2 % with it, ≤ 5 % \
         under churn. Summary at exit without export: {}; {}. With export and churn: {}; {}; \
         {}; {}; detection losses: {}.\n\n\
         Export throughput: `tracer run --providers TestDouble --session streaming \
         --otlp-endpoint …`, a .NET 10 test double emitting {BURST} events at once (blocks of \
         {BURST_BLOCK}): {} of them \
         reached the collector as records, the last {:.2} s after the burst was asked for \
         ({:.0} records/s); tracer's summary: {}.\n",
        SCRAPE_INTERVAL.as_secs(),
        WINDOW.as_secs(),
        SETTLE.as_secs(),
        CHURN_WINDOW.as_secs(),
        without.0.row("without OTLP", None),
        with.row("OTLP", None),
        churn.measured.row("OTLP + churn", Some(churn.started_per_sec)),
        line(&without.1, "sessions:"),
        line(&without.1, "losses:"),
        line(&summary, "processes detected"),
        line(&summary, "sessions:"),
        line(&summary, "OTLP records sent"),
        line(&summary, "losses:"),
        if detection_losses.is_empty() { "none".to_string() } else { detection_losses.join(", ") },
        burst.records,
        burst.secs,
        burst.records as f64 / burst.secs,
        burst.losses,
    );
    println!("{r}");
    write_docs_section("agent", &r)
}

struct Measured {
    cpu_percent: f64,
    rss_kib: u64,
    hwm_kib: u64,
    fds: usize,
    series: usize,
    scrape_bytes: usize,
    lines_per_sec: f64,
    requests_per_sec: Option<f64>,
}

impl Measured {
    fn row(&self, name: &str, started_per_sec: Option<f64>) -> String {
        let or_dash = |v: Option<f64>, precision: usize| {
            v.map_or("–".to_string(), |v| format!("{v:.precision$}"))
        };
        format!(
            "| {name} | {:.2} % | {:.1} MiB | {:.1} MiB | {} | {} | {:.0} KiB | {:.0} | {} | {} |\n",
            self.cpu_percent,
            self.rss_kib as f64 / 1024.0,
            self.hwm_kib as f64 / 1024.0,
            self.fds,
            self.series,
            self.scrape_bytes as f64 / 1024.0,
            self.lines_per_sec,
            or_dash(self.requests_per_sec, 1),
            or_dash(started_per_sec, 0),
        )
    }
}

/// `--against BIN [--rounds N]`, when given.
fn parse_against(args: &[String]) -> anyhow::Result<Option<(std::path::PathBuf, usize)>> {
    let mut against = None;
    let mut rounds = COMPARE_ROUNDS;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--against" => against = Some(std::path::PathBuf::from(value()?)),
            "--rounds" => rounds = value()?.parse().context("--rounds takes a count")?,
            other => {
                bail!("bench agent: unknown argument {other:?} (known: --against BIN, --rounds N)")
            }
        }
    }
    match against {
        _ if rounds == 0 => bail!("--rounds 0 measures nothing: give 1 or more"),
        Some(bin) if bin.is_file() => Ok(Some((bin, rounds))),
        Some(bin) => {
            bail!("--against {}: no such file (a tracer binary built elsewhere)", bin.display())
        }
        None if rounds != COMPARE_ROUNDS => bail!("--rounds goes with --against BIN"),
        None => Ok(None),
    }
}

/// `other` and this build `ours`, one window each per round, alternating; prints each window
/// and the means (nothing is written to docs/benchmarks.md).
fn compare(
    other: &std::path::Path,
    ours: &std::path::Path,
    rounds: usize,
    without: impl Fn(&std::path::Path) -> anyhow::Result<(Measured, String)>,
) -> anyhow::Result<()> {
    let mut cpu: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=rounds {
        for (i, bin) in [other, ours].into_iter().enumerate() {
            let (measured, _) = without(bin)?;
            eprintln!(
                "bench agent: round {round}/{rounds}: {}: {:.2} %",
                bin.display(),
                measured.cpu_percent
            );
            cpu[i].push(measured.cpu_percent);
        }
    }
    let row = |name: String, cpu: &[f64]| {
        let each: Vec<String> = cpu.iter().map(|c| format!("{c:.2} %")).collect();
        let mean = cpu.iter().sum::<f64>() / cpu.len() as f64;
        format!("| {name} | {} | {mean:.2} % |\n", each.join(", "))
    };
    println!(
        "`cargo xtask bench agent --against {} --rounds {rounds}`: tracer CPU (one core) without \
         export, {} s windows alternating, beside the same {RUNTIMES} runtimes.\n\n\
         | build | each window | mean |\n|---|---|---:|\n{}{}",
        other.display(),
        WINDOW.as_secs(),
        row(format!("`{}`", other.display()), &cpu[0]),
        row("this build".into(), &cpu[1]),
    );
    Ok(())
}

/// `count` CoreCLR hosts, and their pids.
pub fn start_runtimes(
    count: usize,
) -> anyhow::Result<(Vec<Process>, std::collections::HashSet<u64>)> {
    let host = util::workspace_root().join(HOST);
    let mut runtimes: Vec<Process> = Vec::with_capacity(count);
    let mut pids = std::collections::HashSet::new();
    for _ in 0..count {
        let mut command = Command::new("python3");
        command.arg(&host);
        let (mut process, ready) = spawn_ready(command)?;
        pids.insert(ready.split_whitespace().nth(1).context("READY <pid>")?.parse::<u64>()?);
        // Its reply is read and dropped with the rest; the instruments exist before the window.
        let stdin = process.0.stdin.as_mut().context("the runtime's stdin")?;
        writeln!(stdin, "instruments {INSTRUMENTS}")?;
        runtimes.push(process);
    }
    Ok((runtimes, pids))
}

/// Reads `tracer`'s lines until each of `pids` has a session (or `TIMEOUT` passes between two
/// lines); a failed session of one of them is an error.
fn await_sessions(tracer: &Tracer, pids: &std::collections::HashSet<u64>) -> anyhow::Result<()> {
    let mut traced = std::collections::HashSet::new();
    while traced.len() < pids.len() {
        let (_, line) = tracer.lines.recv_timeout(TIMEOUT).context("runtimes not all traced")?;
        let v: Value = serde_json::from_str(&line)?;
        let pid = v["pid"].as_u64().unwrap_or(0);
        match v["kind"].as_str() {
            Some("session_started") if pids.contains(&pid) => drop(traced.insert(pid)),
            Some("session_failed") if pids.contains(&pid) => bail!("no session: {line}"),
            _ => {}
        }
    }
    Ok(())
}

/// Lines that arrive until `until`.
fn drain(tracer: &Tracer, until: Instant) -> u64 {
    let mut n = 0u64;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if tracer.lines.recv_timeout(left).is_ok() {
            n += 1;
        }
    }
    n
}

/// A thread scraping `/metrics` every [`SCRAPE_INTERVAL`] until stopped.
struct Scrapes {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<(usize, usize)>>,
}

impl Scrapes {
    fn start(metrics: SocketAddr) -> Scrapes {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || -> anyhow::Result<(usize, usize)> {
            let mut last = (0, 0);
            while !stopped.load(Ordering::Relaxed) {
                let body = scrape(metrics)?;
                // The traced processes' series: every one is labelled with its pid.
                let series =
                    body.lines().filter(|l| !l.starts_with('#') && l.contains("{pid=\"")).count();
                last = (series, body.len());
                std::thread::sleep(SCRAPE_INTERVAL);
            }
            Ok(last)
        });
        Scrapes { stop, thread }
    }

    /// The last scrape's series and size.
    fn stop(self) -> anyhow::Result<(usize, usize)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the scraper does not panic")
    }
}

/// One row: once every runtime in `pids` is traced and has settled, tracer's cost over
/// [`WINDOW`].
fn measure(
    tracer: &Tracer,
    metrics: SocketAddr,
    pids: &std::collections::HashSet<u64>,
    collector: Option<&Collector>,
) -> anyhow::Result<Measured> {
    await_sessions(tracer, pids)?;
    let scrapes = Scrapes::start(metrics);
    drain(tracer, Instant::now() + SETTLE);
    let requests = || collector.map(|c| c.requests.load(Ordering::Relaxed));
    let (window, requests0) = (Window::start(tracer)?, requests());
    let lines = drain(tracer, window.start + WINDOW);
    let mut measured = window.finish(tracer, lines, scrapes)?;
    measured.requests_per_sec = requests()
        .zip(requests0)
        .map(|(now, before)| (now - before) as f64 / window.start.elapsed().as_secs_f64());
    Ok(measured)
}

/// A measurement window: tracer's CPU time and the clock at its start.
struct Window {
    start: Instant,
    cpu_ticks: u64,
}

impl Window {
    fn start(tracer: &Tracer) -> anyhow::Result<Window> {
        Ok(Window { cpu_ticks: cpu_ticks(tracer.pid())?, start: Instant::now() })
    }

    /// tracer's cost since the start, `lines` having arrived; stops `scrapes`.
    fn finish(&self, tracer: &Tracer, lines: u64, scrapes: Scrapes) -> anyhow::Result<Measured> {
        let secs = self.start.elapsed().as_secs_f64();
        let cpu = (cpu_ticks(tracer.pid())? - self.cpu_ticks) as f64 / USER_HZ;
        let u = usage(tracer.pid())?;
        let (series, scrape_bytes) = scrapes.stop()?;
        Ok(Measured {
            cpu_percent: 100.0 * cpu / secs,
            rss_kib: u.rss_kib,
            hwm_kib: u.hwm_kib,
            fds: u.fds,
            series,
            scrape_bytes,
            lines_per_sec: lines as f64 / secs,
            requests_per_sec: None,
        })
    }
}

struct Churn {
    measured: Measured,
    started_per_sec: f64,
}

/// The churn row: [`CHURN_WINDOW`] of short-lived processes beside the runtimes, with
/// [`CHURN_RUNTIMES`] new runtimes started halfway, each of which must get a session.
fn churn(tracer: &Tracer, metrics: SocketAddr) -> anyhow::Result<Churn> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let per_thread = Duration::from_secs(1) / (CHURN_RATE / CHURN_THREADS);
    let drivers = (0..CHURN_THREADS)
        .map(|_| {
            let (stop, started) = (stop.clone(), started.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let mut child = Command::new("/bin/true")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .spawn()
                        .context("starting /bin/true")?;
                    child.wait()?;
                    started.fetch_add(1, Ordering::Relaxed);
                    next += per_thread;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
                Ok(())
            })
        })
        .collect::<Vec<_>>();
    let scrapes = Scrapes::start(metrics);
    let (window, started0) = (Window::start(tracer)?, started.load(Ordering::Relaxed));
    let mut lines = drain(tracer, window.start + CHURN_WINDOW / 2);
    let (new_runtimes, new_pids) = start_runtimes(CHURN_RUNTIMES)?;
    await_sessions(tracer, &new_pids).context("runtimes started during the churn")?;
    lines += drain(tracer, window.start + CHURN_WINDOW);
    let started = started.load(Ordering::Relaxed) - started0;
    let measured = window.finish(tracer, lines, scrapes)?;
    let started_per_sec = started as f64 / window.start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for driver in drivers {
        driver.join().expect("a churn driver does not panic")?;
    }
    drop(new_runtimes);
    Ok(Churn { measured, started_per_sec })
}

struct Burst {
    records: u64,
    secs: f64,
    losses: String,
}

/// A second tracer exporting a burst of [`BURST`] events of the test double: how many records
/// reach the collector, how fast (first to last), and what tracer counted as lost.
fn export_burst(bin: &std::path::Path) -> anyhow::Result<Burst> {
    let collector = Collector::start()?;
    let otlp = format!("http://{}", collector.addr);
    let args =
        ["run", "--providers", "TestDouble", "--session", "streaming", "--otlp-endpoint", &otlp];
    let tracer = Tracer::start(bin, &args, "watching for .NET processes")?;
    let mut command = Command::new("python3");
    command.arg(util::workspace_root().join(DOUBLE));
    let (mut double, ready) = spawn_ready(command)?;
    let pid: u64 = ready.split_whitespace().nth(1).context("READY <pid>")?.parse()?;
    loop {
        let (_, line) = tracer.lines.recv_timeout(TIMEOUT).context("the double not traced")?;
        let v: Value = serde_json::from_str(&line)?;
        if v["kind"] == "session_started" && v["pid"].as_u64() == Some(pid) {
            break;
        }
    }
    let before = collector.records.load(Ordering::Relaxed);
    let stdin = double.0.stdin.as_mut().context("the double's stdin")?;
    let emitted_at = Instant::now();
    for _ in 0..BURST / BURST_BLOCK {
        writeln!(stdin, "emit {BURST_BLOCK}")?;
    }
    stdin.flush()?;
    // Every event written as a line first (the exporter gets what its queue takes)...
    let mut ticks = 0;
    while ticks < BURST {
        let (_, line) = tracer.lines.recv_timeout(TIMEOUT).context("the burst's lines")?;
        ticks += u64::from(line.contains(r#""event":"Tick""#));
    }
    // ...then the records until they stop coming (a second without one).
    let (mut last, mut last_at) = (before, Instant::now());
    while last_at.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(10));
        let now = collector.records.load(Ordering::Relaxed);
        if now != last {
            (last, last_at) = (now, Instant::now());
        }
    }
    let secs = last_at.duration_since(emitted_at).as_secs_f64();
    // Other lines (detection, session) are records too: count only the burst's window.
    let records = last - before;
    drop(double);
    let summary = tracer.stop()?;
    let losses = ["  events:", "OTLP records sent", "losses:", "otlp "]
        .iter()
        .flat_map(|key| summary.lines().filter(move |l| l.contains(key)))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ");
    Ok(Burst { records, secs, losses })
}

/// utime + stime of a process, in clock ticks.
/// `GET /metrics` (classic text), the body.
fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: tracer\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (_, body) = response.split_once("\r\n\r\n").context("an HTTP response")?;
    Ok(body.to_string())
}

/// A loopback OTLP/HTTP collector that answers every request 200 with an empty
/// ExportLogsServiceResponse (full success) and counts requests and log records.
struct Collector {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    records: Arc<AtomicU64>,
}

impl Collector {
    fn start() -> anyhow::Result<Collector> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let (requests, records) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let counters = (requests.clone(), records.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let counters = counters.clone();
                std::thread::spawn(move || drop(serve(stream, &counters.0, &counters.1)));
            }
        });
        Ok(Collector { addr, requests, records })
    }
}

/// HTTP/1.1 keep-alive: headers, a `Content-Length` body, an empty 200; until the peer closes.
fn serve(stream: TcpStream, requests: &AtomicU64, records: &AtomicU64) -> anyhow::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            if line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse()?;
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        requests.fetch_add(1, Ordering::Relaxed);
        records.fetch_add(log_records(&body), Ordering::Relaxed);
        writer.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        )?;
    }
}

/// Log records in an ExportLogsServiceRequest: resource_logs (1) → scope_logs (2) →
/// log_records (2), each a length-delimited protobuf field.
fn log_records(request: &[u8]) -> u64 {
    submessages(request, 1)
        .flat_map(|resource| submessages(resource, 2))
        .map(|scope| submessages(scope, 2).count() as u64)
        .sum()
}

/// The length-delimited fields numbered `field` of a protobuf message (stops at malformed data).
fn submessages(mut msg: &[u8], field: u64) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        loop {
            let key = varint(&mut msg)?;
            let len = match key & 7 {
                0 => {
                    varint(&mut msg)?;
                    continue;
                }
                1 => 8,
                5 => 4,
                2 => usize::try_from(varint(&mut msg)?).ok()?,
                _ => return None,
            };
            let (value, rest) = (msg.get(..len)?, msg.get(len..)?);
            msg = rest;
            if key & 7 == 2 && key >> 3 == field {
                return Some(value);
            }
        }
    })
}

fn varint(msg: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = msg.split_first()?;
        *msg = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u8, value: &[u8]) -> Vec<u8> {
        [&[number << 3 | 2, value.len() as u8][..], value].concat()
    }

    #[test]
    fn log_records_are_counted_through_resources_and_scopes() {
        let record = field(9, b"body");
        let scope =
            [field(1, b"scope"), field(2, &record), vec![0x08, 0x96, 0x01], field(2, &[])].concat();
        let resource = [field(1, b"res"), field(2, &scope), field(2, &field(2, &record))].concat();
        let request = [field(1, &resource), field(1, &field(2, &scope))].concat();
        assert_eq!(log_records(&request), 5);
        assert_eq!(log_records(&request[..request.len() - 1]), 3, "a cut message stops counting");
    }
}
