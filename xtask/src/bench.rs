//! Pieces shared by the benchmarks: a tracer process whose output lines are timestamped on
//! arrival, percentiles, the docs/benchmarks.md section writer, and the processes benchmarks
//! start (killed on drop) with their resource usage.
use std::fs;
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::util;

pub const TIMEOUT: Duration = Duration::from_secs(60);

/// A running tracer whose stdout lines arrive timestamped (CLOCK_MONOTONIC) at reception.
pub struct Tracer {
    child: Child,
    pub lines: Receiver<(u64, String)>,
    stderr: Receiver<String>,
}

impl Tracer {
    /// Starts `tracer <args>` and waits for the stderr log line containing `ready`.
    pub fn start(bin: &Path, args: &[&str], ready: &str) -> anyhow::Result<Tracer> {
        let mut child = Command::new(bin)
            .args(args)
            .env("TRACER_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((mono_ns(), line)).is_err() {
                    break;
                }
            }
        });
        let (tx, stderr) = mpsc::channel();
        let err = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        loop {
            let line = stderr.recv_timeout(TIMEOUT).context("tracer did not become ready")?;
            if line.contains(ready) {
                break;
            }
            eprintln!("tracer: {line}");
        }
        Ok(Tracer { child, lines, stderr })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGINT, wait, and return what it printed on stderr (the summary).
    pub fn stop(mut self) -> anyhow::Result<String> {
        util::run_cmd(Command::new("kill").args(["-INT", &self.child.id().to_string()]))?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("tracer exited with {status}");
        }
        // Until its reader thread has seen the pipe close: the summary's last lines may still
        // be on their way when the process has been reaped.
        Ok(self.stderr.iter().collect::<Vec<_>>().join("\n"))
    }
}

/// A benchmark that fails midway leaves no tracer running.
impl Drop for Tracer {
    fn drop(&mut self) {
        // Once `stop` has reaped it, std knows it exited and sends no signal.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Median of a set of measurements.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `p`-th percentile (0..=1) of sorted samples (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// `Command: ... (release build; kernel ...; N CPUs; load average ...)` header of a section.
pub fn context_line(command: &str) -> String {
    let uname = util::output(Command::new("uname").arg("-r")).unwrap_or_default();
    let loadavg = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim()))
        .unwrap_or("unknown CPU");
    // Syscall and BPF dispatch costs depend on these mitigations more than on the clock rate.
    let spectre_v2 = fs::read_to_string("/sys/devices/system/cpu/vulnerabilities/spectre_v2")
        .ok()
        .and_then(|v| v.split(';').next().map(|m| m.trim().to_string()))
        .unwrap_or_default();
    format!(
        "Command: `{command}` (release build; kernel {}; {} CPUs, {model}, spectre_v2: {spectre_v2}; \
         load average at the end: {}).\n\n",
        uname.trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    )
}

/// Replaces the latest result of benchmark `name` in docs/benchmarks.md: the text between its
/// markers ([`result_markers`]), which sit under the benchmark's own section after the
/// description, target and verdict that people write and the benchmark leaves alone. A
/// benchmark with no markers yet gets a new `## <name>` section at the end.
pub fn write_docs_section(name: &str, report: &str) -> anyhow::Result<()> {
    let path = util::workspace_root().join("docs/benchmarks.md");
    let old = fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".to_string());
    let (start, end) = result_markers(name);
    let block = format!("{start}\n\n{}\n\n{end}", report.trim_end());
    let new = match (old.find(&start), old.find(&end)) {
        (Some(s), Some(e)) if s < e => format!("{}{block}{}", &old[..s], &old[e + end.len()..]),
        _ => format!("{}\n\n## {name}\n\n{block}\n", old.trim_end()),
    };
    fs::create_dir_all(path.parent().expect("docs dir"))?;
    fs::write(&path, new).with_context(|| format!("writing {}", path.display()))?;
    println!("(recorded in docs/benchmarks.md, the latest result of \"{name}\")");
    Ok(())
}

/// The comments around benchmark `name`'s latest result in docs/benchmarks.md.
fn result_markers(name: &str) -> (String, String) {
    (
        format!("<!-- latest result of `cargo xtask bench {name}`, written by it -->"),
        format!("<!-- end of the latest result of `cargo xtask bench {name}` -->"),
    )
}

/// Clock ticks per second of /proc/<pid>/stat's utime and stime (USER_HZ on Linux).
pub const USER_HZ: f64 = 100.0;

/// CPU time (utime + stime, clock ticks) a process has used, its exited threads included.
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    stat_cpu_ticks(&format!("/proc/{pid}/stat"))
}

/// CPU time (utime + stime, clock ticks) one thread of a process has used.
pub fn thread_cpu_ticks(pid: u32, tid: u32) -> anyhow::Result<u64> {
    stat_cpu_ticks(&format!("/proc/{pid}/task/{tid}/stat"))
}

fn stat_cpu_ticks(path: &str) -> anyhow::Result<u64> {
    let stat = fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').with_context(|| format!("{path}: {stat:?}"))?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> anyhow::Result<u64> {
        let value = fields.get(i).with_context(|| format!("{path}: {stat:?}"))?;
        value.parse().with_context(|| format!("{path}: field {}: {value:?}", i + 3))
    };
    Ok(field(11)? + field(12)?)
}

/// A process's resident memory, its peak, and its open files.
pub struct Usage {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub fds: usize,
}

pub fn usage(pid: u32) -> anyhow::Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> anyhow::Result<u64> {
        let line = status.lines().find(|l| l.starts_with(key)).context("status")?;
        Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok(Usage { rss_kib: kib("VmRSS:")?, hwm_kib: kib("VmHWM:")?, fds })
}

/// Killed on drop.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child whose first stdout line is `READY …`; the rest of its output is read and dropped.
pub fn spawn_ready(mut command: Command) -> anyhow::Result<(Process, String)> {
    let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut ready = String::new();
    stdout.read_line(&mut ready)?;
    if !ready.starts_with("READY") {
        bail!("expected READY, got {ready:?}");
    }
    std::thread::spawn(move || stdout.lines().map_while(Result::ok).for_each(drop));
    Ok((Process(child), ready))
}
