//! `cargo xtask bench hostile`: tracer next to thousands of fake runtimes.
//!
//! 2 000 processes of `nobody` look like .NET runtimes (a `dotnet_ipc_created` mapping and a
//! listening diagnostic socket in a shared temp dir) and never answer: each holds a session as
//! long as tracer lets it. Then a real-looking runtime of root (the .NET 10 test double) starts.
//! Measured: the time from its detection to its session starting, and tracer's resident memory
//! and open files with every fake present (targets: the runtime is traced; RSS and fds bounded by
//! the admission limits, not by the number of fakes).
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::bench::{TIMEOUT, Tracer, Usage, context_line, spawn_ready, usage, write_docs_section};
use crate::util;

const FAKES: usize = 2_000;
/// The uid of the fakes (`nobody`).
const NOBODY: u32 = 65_534;
const DOUBLE: &str = "tests/dotnet/dotnet10_double.py";
/// The IPC timeout tracer runs with: the fakes keep their sessions for the whole measurement.
const IPC_TIMEOUT: &str = "120s";

pub fn run() -> anyhow::Result<()> {
    util::require_root("the benchmark loads BPF programs and starts processes as nobody")?;
    util::cargo(&["build", "--release", "-p", "tracer", "--bins"])?;
    util::cargo(&["build", "--release", "-p", "tests", "--bin", "hostile_peer"])?;
    let root = util::workspace_root();
    let dir = std::env::temp_dir().join(format!("tracer-bench-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // A shared temp dir, as /tmp is.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777))?;
    let bin = root.join("target/release/tracer");
    let tracer = Tracer::start(
        &bin,
        &["run", "--session", "streaming", "--ipc-timeout", IPC_TIMEOUT],
        "watching for .NET processes",
    )?;
    let result = measure(&tracer, &root.join("target/release/hostile_peer"), &dir);
    let summary = tracer.stop();
    let _ = std::fs::remove_dir_all(&dir);
    let (traced_after_ms, idle, loaded) = result?;
    let summary = summary?;

    let mut r = context_line("cargo xtask bench hostile");
    r += &format!(
        "{FAKES} fake runtimes of `nobody` (dotnet_ipc_created mapping + listening socket, never \
         answering), tracer run with the default admission limits (512 sessions, 64 per uid, 256 \
         waiting) and --ipc-timeout {IPC_TIMEOUT}, then a .NET 10 test double of root:\n\n\
         | | tracer VmRSS | VmHWM | open fds |\n|---|---:|---:|---:|\n\
         | before the fakes | {:.1} MiB | {:.1} MiB | {} |\n\
         | with {FAKES} fakes | {:.1} MiB | {:.1} MiB | {} |\n\n\
         The real runtime's session started {traced_after_ms:.1} ms after its detection.\n\n\
         Summary lines: {}\n",
        idle.rss_kib as f64 / 1024.0,
        idle.hwm_kib as f64 / 1024.0,
        idle.fds,
        loaded.rss_kib as f64 / 1024.0,
        loaded.hwm_kib as f64 / 1024.0,
        loaded.fds,
        summary
            .lines()
            .filter(|l| l.contains("sessions:") || l.contains("admission:"))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!("{r}");
    write_docs_section("hostile", &r)
}

/// (ms from the double's detection to its session, usage before the fakes, usage with them).
fn measure(
    tracer: &Tracer,
    peer: &std::path::Path,
    dir: &std::path::Path,
) -> anyhow::Result<(f64, Usage, Usage)> {
    let idle = usage(tracer.pid())?;
    let mut fakes = Vec::with_capacity(FAKES);
    for _ in 0..FAKES {
        let mut command = Command::new(peer);
        command
            .arg("silent")
            .env("TMPDIR", dir)
            .env("HOSTILE_PEER_IPC_MEMFD", "1")
            .uid(NOBODY)
            .gid(NOBODY);
        fakes.push(spawn_ready(command)?.0);
    }
    let mut command = Command::new("python3");
    command.arg(util::workspace_root().join(DOUBLE)).env("TMPDIR", dir);
    let (_double, ready) = spawn_ready(command)?;
    let pid: u64 = ready.split_whitespace().nth(1).context("READY <pid>")?.parse()?;
    let mut detected = None;
    let traced_after_ms = loop {
        let (_, line) = tracer.lines.recv_timeout(TIMEOUT).context("the double was not traced")?;
        let v: Value = serde_json::from_str(&line)?;
        if v["pid"].as_u64() != Some(pid) {
            continue;
        }
        match v["kind"].as_str() {
            Some("dotnet_ipc_ready") => detected = v["mono_ns"].as_u64(),
            Some("session_started") => {
                let at = detected.context("session before detection")?;
                break (v["mono_ns"].as_u64().context("mono_ns")? - at) as f64 / 1e6;
            }
            Some("session_failed") => bail!("the double's session failed: {line}"),
            _ => {}
        }
    };
    let loaded = usage(tracer.pid())?;
    drop(fakes);
    Ok((traced_after_ms, idle, loaded))
}
