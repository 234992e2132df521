//! `cargo xtask bench ipc`: the .NET session path.
//!
//! 1. Detection → session-started latency: 50 .NET 10 test doubles started one after another;
//!    for each, the `session_started` line's time minus the kernel timestamp of its
//!    `dotnet_ipc_ready` detection (both CLOCK_MONOTONIC) — target p99 ≤ 10 ms.
//! 2. tracer's resident memory with those 50 sessions live (after each double emitted GCs into
//!    its session) — target ≤ 20 MiB.
//! 3. nettrace parse throughput on a large captured stream (see `bench_nettrace`).
use std::collections::HashMap;
use std::io::{BufRead as _, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::bench::{TIMEOUT, Tracer, context_line, percentile, write_docs_section};
use crate::{bench_nettrace, util};

const SESSIONS: usize = 50;
const GCS_PER_DOUBLE: usize = 4;
const DOUBLE: &str = "tests/dotnet/dotnet10_double.py";

pub fn run() -> anyhow::Result<()> {
    util::require_root("the benchmark loads BPF programs")?;
    util::cargo(&["build", "--release", "-p", "tracer", "--bins"])?;
    let bin = util::workspace_root().join("target/release/tracer");
    let tracer = Tracer::start(&bin, &["run", "--profile", "gc"], "watching for .NET processes")?;
    let measured = measure(&tracer);
    let summary = tracer.stop()?;
    let (latencies_ms, rss_kib, hwm_kib) = measured?;
    if !summary.contains(&format!("sessions: {SESSIONS} started, 0 failed")) {
        bail!("not every session started:\n{summary}");
    }

    let mut r = context_line("cargo xtask bench ipc");
    r += &format!(
        "(1) Detection → session started, {} .NET 10 test doubles started one after another \
         (kernel timestamp of the `dotnet_ipc_ready` mmap to the `session_started` line: socket \
         lookup, SO_PEERCRED check, ProcessInfo3 probe, CollectTracing2): p50 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms (target p99 ≤ 10 ms).\n\n",
        latencies_ms.len(),
        percentile(&latencies_ms, 0.50),
        percentile(&latencies_ms, 0.99),
        latencies_ms.last().copied().unwrap_or(0.0),
    );
    r += &format!(
        "(2) tracer's memory with {SESSIONS} live streaming sessions, after {GCS_PER_DOUBLE} GCs \
         each (every GCStart/GCEnd decoded and written): VmRSS {:.1} MiB, VmHWM {:.1} MiB \
         (target ≤ 20 MiB).\n\n",
        rss_kib as f64 / 1024.0,
        hwm_kib as f64 / 1024.0
    );
    r += "(3) nettrace parse throughput: see \"nettrace parse throughput\" below.\n";
    println!("{r}");
    write_docs_section("ipc", &r)?;
    bench_nettrace::run()
}

/// A running double; killed on drop (its stdin closing makes it exit too).
struct Double {
    child: Child,
    stdin: ChildStdin,
}

impl Drop for Double {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_double() -> anyhow::Result<(u32, Double)> {
    let mut child = Command::new("python3")
        .arg(util::workspace_root().join(DOUBLE))
        .env("TMPDIR", "/tmp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the .NET 10 test double")?;
    let stdin = child.stdin.take().expect("piped");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut ready = String::new();
    stdout.read_line(&mut ready)?;
    let pid = ready
        .strip_prefix("READY ")
        .and_then(|r| r.split_whitespace().next())
        .with_context(|| format!("expected READY <pid> <socket>, got {ready:?}"))?
        .parse()?;
    // Keep reading what it prints: a closed pipe would kill its server thread.
    std::thread::spawn(move || stdout.lines().map_while(Result::ok).for_each(drop));
    Ok((pid, Double { child, stdin }))
}

/// (sorted latencies in ms, VmRSS KiB, VmHWM KiB).
fn measure(tracer: &Tracer) -> anyhow::Result<(Vec<f64>, u64, u64)> {
    let mut doubles = Vec::new();
    let mut detected: HashMap<u32, u64> = HashMap::new();
    let mut latencies = Vec::new();
    for _ in 0..SESSIONS {
        let (pid, double) = spawn_double()?;
        doubles.push(double);
        loop {
            let (_, line) = tracer.lines.recv_timeout(TIMEOUT).context("no session started")?;
            let v: Value = serde_json::from_str(&line)?;
            let (Some(p), Some(t)) = (v["pid"].as_u64(), v["mono_ns"].as_u64()) else { continue };
            match v["kind"].as_str() {
                Some("dotnet_ipc_ready") => {
                    detected.insert(p as u32, t);
                }
                Some("session_started") if p as u32 == pid => {
                    let at = detected.get(&pid).context("session before detection")?;
                    latencies.push((t - at) as f64 / 1e6);
                    break;
                }
                // Other processes on the machine may fail; only ours must not.
                Some("session_failed") if p as u32 == pid => bail!("session failed: {line}"),
                _ => {}
            }
        }
    }
    for d in &mut doubles {
        use std::io::Write as _;
        writeln!(d.stdin, "gc {GCS_PER_DOUBLE}")?;
    }
    let mut gc_starts = 0;
    while gc_starts < SESSIONS * GCS_PER_DOUBLE {
        let (_, line) = tracer.lines.recv_timeout(TIMEOUT).context("GC events missing")?;
        if line.contains("\"event\":\"GCStart\"") {
            gc_starts += 1;
        }
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", tracer.pid()))?;
    let kib = |key: &str| -> anyhow::Result<u64> {
        let line = status.lines().find(|l| l.starts_with(key)).context("status")?;
        Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
    };
    latencies.sort_by(f64::total_cmp);
    Ok((latencies, kib("VmRSS:")?, kib("VmHWM:")?))
}
