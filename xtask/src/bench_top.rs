//! `cargo xtask bench top`: `tracer top`'s own cost on the node agent's host — 50 real CoreCLR
//! 8 runtimes (`bench agent`'s set-up), one of them burning CPU in managed code (so the sampler
//! samples, and a rundown names the hot method) — with its screen in a real terminal (tmux):
//! tracer's CPU (share of one core) and memory over a fixed window once every runtime sends its
//! counters, then how long `q` takes (every session stopped). Target: CPU ≤ 2 % of a core.
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::bench::{USER_HZ, context_line, cpu_ticks, usage, write_docs_section};
use crate::bench_agent::{RUNTIMES, SETTLE, WINDOW, start_runtimes};
use crate::util;

/// The terminal top draws in.
const WIDTH: u16 = 200;
const HEIGHT: u16 = 60;
/// Starting top and every session (BPF loading, 50 sessions) on a 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the screen is read while waiting.
const POLL: Duration = Duration::from_millis(200);

pub fn run() -> anyhow::Result<()> {
    util::require_root("the benchmark loads BPF programs")?;
    util::cargo(&["build", "--release", "-p", "tracer", "--bins"])?;
    let bin = util::workspace_root().join("target/release/tracer");
    let (mut runtimes, _) = start_runtimes(RUNTIMES)?;
    let busy = runtimes.first_mut().context("no runtime")?;
    let stdin = busy.0.stdin.as_mut().context("the runtime's stdin")?;
    std::io::Write::write_all(stdin, b"optimized\nburn 3600\n")?;

    // `exec`: the window's process is tracer itself (its pid is the pane's).
    let log = util::workspace_root().join("target/bench-top.log");
    let command = format!("exec {} top 2>{}", bin.display(), log.display());
    let terminal = Terminal::start(&command)?;
    let pid = terminal.pane_pid()?;
    let wanted = format!("{RUNTIMES} sending counters");
    let deadline = Instant::now() + READY_TIMEOUT;
    while terminal.screen()?.lines().next().map_or(0, sending) < RUNTIMES {
        if Instant::now() >= deadline {
            bail!("top did not show {wanted} within {READY_TIMEOUT:?}:\n{}", terminal.screen()?);
        }
        std::thread::sleep(POLL);
    }
    std::thread::sleep(SETTLE);
    let (ticks, start) = (cpu_ticks(pid)?, Instant::now());
    std::thread::sleep(WINDOW);
    let secs = start.elapsed().as_secs_f64();
    let cpu_percent = 100.0 * (cpu_ticks(pid)? - ticks) as f64 / USER_HZ / secs;
    let memory = usage(pid)?;
    let screen = terminal.screen()?;
    let quit = Instant::now();
    terminal.keys(&["q"])?;
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        if quit.elapsed() >= READY_TIMEOUT {
            bail!("top still running {READY_TIMEOUT:?} after q");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let quit_secs = quit.elapsed().as_secs_f64();
    drop(runtimes);
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let rundowns =
        logged.lines().filter(|l| l.contains("asking its runtime for a rundown")).count();

    let mut r = context_line("cargo xtask bench top");
    r += &format!(
        "`tracer top` in a {WIDTH}×{HEIGHT} tmux terminal beside {RUNTIMES} real CoreCLR 8.0.4 \
         runtimes (`bench agent`'s set-up: each sends its 27 System.Runtime counters every \
         1 s), one of them burning CPU in JIT-compiled methods; measured over {} s once every \
         runtime sent its counters and {} s had passed.\n\n\
         | row | tracer CPU (one core) | VmRSS | VmHWM | open fds | rundowns asked | `q` to exit |\n\
         |---|---:|---:|---:|---:|---:|---:|\n\
         | top | {cpu_percent:.2} % | {:.1} MiB | {:.1} MiB | {} | {rundowns} | {quit_secs:.2} s |\n\n\
         Target: CPU ≤ 2 % of one core. The screen at the end of the window (its first \
         lines):\n\n```\n{}\n```\n",
        WINDOW.as_secs(),
        SETTLE.as_secs(),
        memory.rss_kib as f64 / 1024.0,
        memory.hwm_kib as f64 / 1024.0,
        memory.fds,
        screen.lines().take(8).map(str::trim_end).collect::<Vec<_>>().join("\n"),
    );
    println!("{r}");
    write_docs_section("top", &r)
}

/// The `N sending counters` of top's title line (0 when it shows none yet).
fn sending(title: &str) -> usize {
    title
        .split(" · ")
        .find_map(|part| part.strip_suffix(" sending counters")?.parse().ok())
        .unwrap_or(0)
}

/// A tmux server of the benchmark's own running one program in its window; killed on drop.
struct Terminal {
    socket: String,
}

impl Terminal {
    fn start(command: &str) -> anyhow::Result<Terminal> {
        let terminal = Terminal { socket: format!("tracer-bench-top-{}", std::process::id()) };
        let (w, h) = (WIDTH.to_string(), HEIGHT.to_string());
        terminal.tmux(&["-f", "/dev/null", "new-session", "-d", "-x", &w, "-y", &h, command])?;
        Ok(terminal)
    }

    fn tmux(&self, args: &[&str]) -> anyhow::Result<String> {
        util::output(Command::new("tmux").arg("-L").arg(&self.socket).args(args))
            .context("running tmux (`cargo xtask setup` installs it)")
    }

    /// The pid of the program in the window.
    fn pane_pid(&self) -> anyhow::Result<u32> {
        let pid = self.tmux(&["display-message", "-p", "-t", "0", "#{pane_pid}"])?;
        pid.trim().parse().with_context(|| format!("a pane pid: {pid:?}"))
    }

    fn screen(&self) -> anyhow::Result<String> {
        self.tmux(&["capture-pane", "-p", "-t", "0"])
    }

    fn keys(&self, keys: &[&str]) -> anyhow::Result<()> {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        self.tmux(&args).map(drop)
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_title_says_how_many_send_counters() {
        let title = "tracer top · 50 of 51 .NET processes · 49 sending counters · sorted by CPU";
        assert_eq!(sending(title), 49);
        assert_eq!(sending("tracer top · 0 of 0 .NET processes"), 0);
    }
}
