//! `cargo xtask bench hostile`: tracer next to thousands of fake runtimes.
//!
//! 2 000 processes of `nobody` look like .NET runtimes (a `dotnet_ipc_created` mapping and a
//! listening diagnostic socket in a shared temp dir) and never answer: each holds a session as
//! long as tracer lets it. Then a real-looking runtime of root (the .NET 10 test double) starts.
//! Measured: the time from its detection to its session starting, and tracer's resident memory
//! and open files with every fake present (targets: the runtime is traced; RSS and fds bounded by
//! the admission limits, not by the number of fakes).
//!
//! Then, with the fakes gone, the amplification stream: a double of root sends the stream of
//! `amplify` (metadata naming 1 024 empty objects and a 1 000-control-character event, then
//! empty events of 2 bytes each) while another double starts: its time to be traced, and tracer's
//! memory and fds during the stream (targets: the hostile session ends `budget_exceeded`; RSS
//! stays bounded by the byte budgets, not by the stream).
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
/// The runtime's GC events and the provider the amplifying stream names (a hostile stream can
/// name any provider the operator asked for; unrequested ones are dropped undecoded).
const PROVIDERS: &str = "Microsoft-Windows-DotNETRuntime:0x1:4,Amplifier";
/// Empty events of each kind the amplifying double sends (`amplify <session> E N`).
const AMPLIFY_EVENTS: u32 = 50_000;

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
        &["run", "--session", "streaming", "--ipc-timeout", IPC_TIMEOUT, "--providers", PROVIDERS],
        "watching for .NET processes",
    )?;
    let result = measure(&tracer, &root.join("target/release/hostile_peer"), &dir);
    let summary = tracer.stop();
    let _ = std::fs::remove_dir_all(&dir);
    let (traced_after_ms, idle, loaded, amplified) = result?;
    let summary = summary?;

    let mut r = context_line("cargo xtask bench hostile");
    r += &format!(
        "{FAKES} fake runtimes of `nobody` (dotnet_ipc_created mapping + listening socket, never \
         answering), tracer run with the default admission limits (512 sessions, 64 per uid, 256 \
         waiting), --ipc-timeout {IPC_TIMEOUT} and --providers {PROVIDERS}, then a .NET 10 test \
         double of root:\n\n\
         | | tracer VmRSS | VmHWM | open fds |\n|---|---:|---:|---:|\n\
         | before the fakes | {:.1} MiB | {:.1} MiB | {} |\n\
         | with {FAKES} fakes | {:.1} MiB | {:.1} MiB | {} |\n\n\
         The real runtime's session started {traced_after_ms:.1} ms after its detection.\n\n\
         Then, the fakes gone, a double of root sends the amplifying stream (`amplify <session> \
         {AMPLIFY_EVENTS} {AMPLIFY_EVENTS}`; tracer read {} bytes of it before cutting it) while another \
         double starts:\n\n\
         | | tracer VmRSS | VmHWM | open fds |\n|---|---:|---:|---:|\n\
         | before the stream | {:.1} MiB | {:.1} MiB | {} |\n\
         | after the stream | {:.1} MiB | {:.1} MiB | {} |\n\n\
         The hostile session ended `{}` ({} events decoded but not written); the other double's \
         session started {:.1} ms after its detection.\n\n\
         Summary lines: {}\n",
        idle.rss_kib as f64 / 1024.0,
        idle.hwm_kib as f64 / 1024.0,
        idle.fds,
        loaded.rss_kib as f64 / 1024.0,
        loaded.hwm_kib as f64 / 1024.0,
        loaded.fds,
        amplified.bytes,
        amplified.before.rss_kib as f64 / 1024.0,
        amplified.before.hwm_kib as f64 / 1024.0,
        amplified.before.fds,
        amplified.after.rss_kib as f64 / 1024.0,
        amplified.after.hwm_kib as f64 / 1024.0,
        amplified.after.fds,
        amplified.reason,
        amplified.unwritten,
        amplified.traced_after_ms,
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

/// What the amplification phase measured.
struct Amplified {
    /// Bytes of the hostile stream tracer read before it cut the session.
    bytes: u64,
    before: Usage,
    after: Usage,
    reason: String,
    unwritten: u64,
    traced_after_ms: f64,
}

/// (ms from the double's detection to its session, usage before the fakes, usage with them,
/// the amplification phase).
fn measure(
    tracer: &Tracer,
    peer: &std::path::Path,
    dir: &std::path::Path,
) -> anyhow::Result<(f64, Usage, Usage, Amplified)> {
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
    let (_double, pid) = spawn_double(dir)?;
    let (traced_after_ms, _) = time_to_trace(tracer, pid)?;
    let loaded = usage(tracer.pid())?;
    drop(fakes);
    let amplified = measure_amplification(tracer, dir)?;
    Ok((traced_after_ms, idle, loaded, amplified))
}

/// The amplification phase (see the module documentation).
fn measure_amplification(tracer: &Tracer, dir: &std::path::Path) -> anyhow::Result<Amplified> {
    use std::io::Write as _;
    let (mut hostile, hostile_pid) = spawn_double(dir)?;
    let (_, session) = time_to_trace(tracer, hostile_pid)?;
    let before = usage(tracer.pid())?;
    let stdin = hostile.0.stdin.as_mut().context("piped stdin")?;
    writeln!(stdin, "amplify {session} {AMPLIFY_EVENTS} {AMPLIFY_EVENTS}")?;
    let (_good, good_pid) = spawn_double(dir)?;
    let mut traced_after_ms = None;
    let mut ended = None;
    let mut detected = None;
    while traced_after_ms.is_none() || ended.is_none() {
        let (_, line) = tracer.lines.recv_timeout(TIMEOUT).context("no end of the phase")?;
        let v: Value = serde_json::from_str(&line)?;
        match (v["pid"].as_u64(), v["kind"].as_str()) {
            (Some(p), Some("dotnet_ipc_ready")) if p == good_pid => {
                detected = v["mono_ns"].as_u64()
            }
            (Some(p), Some("session_started")) if p == good_pid => {
                let at = detected.context("session before detection")?;
                traced_after_ms =
                    Some((v["mono_ns"].as_u64().context("mono_ns")? - at) as f64 / 1e6);
            }
            (Some(p), Some("session_ended")) if p == hostile_pid => ended = Some(v),
            _ => {}
        }
    }
    let ended = ended.expect("loop ends with it");
    Ok(Amplified {
        bytes: ended["bytes"].as_u64().unwrap_or(0),
        before,
        after: usage(tracer.pid())?,
        reason: ended["reason"].as_str().unwrap_or("?").to_string(),
        unwritten: ended["unwritten_events"].as_u64().unwrap_or(0),
        traced_after_ms: traced_after_ms.expect("loop ends with it"),
    })
}

/// A .NET 10 test double of root with `TMPDIR=dir`, and its pid.
fn spawn_double(dir: &std::path::Path) -> anyhow::Result<(crate::bench::Process, u64)> {
    let mut command = Command::new("python3");
    command.arg(util::workspace_root().join(DOUBLE)).env("TMPDIR", dir);
    let (double, ready) = spawn_ready(command)?;
    let pid = ready.split_whitespace().nth(1).context("READY <pid>")?.parse()?;
    Ok((double, pid))
}

/// Waits for `pid`'s session: (ms from its detection to its session starting, session id).
fn time_to_trace(tracer: &Tracer, pid: u64) -> anyhow::Result<(f64, String)> {
    let mut detected = None;
    loop {
        let (_, line) = tracer.lines.recv_timeout(TIMEOUT).context("the double was not traced")?;
        let v: Value = serde_json::from_str(&line)?;
        if v["pid"].as_u64() != Some(pid) {
            continue;
        }
        match v["kind"].as_str() {
            Some("dotnet_ipc_ready") => detected = v["mono_ns"].as_u64(),
            Some("session_started") => {
                let at = detected.context("session before detection")?;
                let ms = (v["mono_ns"].as_u64().context("mono_ns")? - at) as f64 / 1e6;
                let id = v["session_id"].as_str().context("session_id")?.to_string();
                return Ok((ms, id));
            }
            Some("session_failed") => bail!("the double's session failed: {line}"),
            _ => {}
        }
    }
}
