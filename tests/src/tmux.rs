//! A real terminal for full-screen programs: a tmux server of the test's own (its own socket, no
//! configuration), one window running `sh`, typed into with `send-keys` and read with
//! `capture-pane`. The server is killed on drop.
//!
//! A screen has no event to wait for: [`Tmux::wait_for`] reads it again every
//! [`SCREEN_POLL`] until it shows what the test waits for, within a named limit, and fails with
//! the last screen otherwise.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// How often a screen is read again while waiting for it to show something.
pub const SCREEN_POLL: Duration = Duration::from_millis(100);
/// A shell's start, on a loaded machine.
pub const SHELL_START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// A terminal of `width` × `height` cells running `sh` with the prompt `$ `.
    pub fn start(width: u16, height: u16) -> Result<Tmux> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmux = Tmux { socket: format!("tracer-test-{}-{n}", std::process::id()) };
        let (w, h) = (width.to_string(), height.to_string());
        tmux.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            &w,
            "-y",
            &h,
            "env",
            "PS1=$ ",
            "sh",
        ])?;
        // What is typed before the shell reads its terminal is echoed ahead of its prompt, and
        // its output then follows the prompt on one line. (A screen's lines lose their trailing
        // spaces.)
        tmux.wait_for("the shell's prompt", SHELL_START_TIMEOUT, |s| {
            s.lines().next() == Some("$")
        })?;
        Ok(tmux)
    }

    fn run(&self, args: &[&str]) -> Result<Output> {
        let output = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .context("running tmux (missing? `cargo xtask setup` installs it)")?;
        ensure!(
            output.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(output)
    }

    /// Types `line` and Enter.
    pub fn type_line(&self, line: &str) -> Result<()> {
        self.run(&["send-keys", "-t", "0", "-l", line])?;
        self.keys(&["Enter"])
    }

    /// Presses keys by tmux's names (`q`, `Enter`, `Escape`, `Home`, `Down`).
    pub fn keys(&self, keys: &[&str]) -> Result<()> {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        self.run(&args).map(drop)
    }

    /// The screen as text, one line a row (attributes and colours left out).
    pub fn screen(&self) -> Result<String> {
        let output = self.run(&["capture-pane", "-p", "-t", "0"])?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The pane's title (escape sequences in the program's output may set it).
    pub fn title(&self) -> Result<String> {
        let output = self.run(&["display-message", "-p", "-t", "0", "#{pane_title}"])?;
        Ok(String::from_utf8_lossy(&output.stdout).trim_end().to_owned())
    }

    /// The pid of the program the window started (its shell).
    pub fn shell_pid(&self) -> Result<u32> {
        let output = self.run(&["display-message", "-p", "-t", "0", "#{pane_pid}"])?;
        let pid = String::from_utf8_lossy(&output.stdout);
        pid.trim().parse().with_context(|| format!("a pane pid: {pid:?}"))
    }

    /// Makes the window `width` × `height` cells (the program in it gets SIGWINCH).
    pub fn resize(&self, width: u16, height: u16) -> Result<()> {
        let (w, h) = (width.to_string(), height.to_string());
        self.run(&["resize-window", "-t", "0", "-x", &w, "-y", &h]).map(drop)
    }

    /// Closes the terminal: the server and its window go, the programs in it get SIGHUP.
    pub fn close(self) -> Result<()> {
        self.run(&["kill-server"]).map(drop)
    }

    /// Reads the screen until `shows` holds for it, at most `limit`; returns that screen. The
    /// error names `what` and holds the last screen.
    pub fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        shows: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + limit;
        loop {
            let screen = self.screen()?;
            if shows(&screen) {
                return Ok(screen);
            }
            if Instant::now() >= deadline {
                bail!("the screen did not show {what} within {limit:?}; it shows:\n{screen}");
            }
            std::thread::sleep(SCREEN_POLL);
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}
