use std::io::{BufRead as _, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

use anyhow::{Context as _, bail};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Runs a command to completion; fails with its exit status.
pub fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs a command and returns its stdout; fails with its stderr.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command, showing its stdout and stderr on our stderr as they come, and returns its
/// exit status with every line it printed (so a runner's own counts can be read from them).
pub fn run_tee(cmd: &mut Command) -> anyhow::Result<(ExitStatus, Vec<String>)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {cmd:?}"))?;
    let (tx, lines) = mpsc::channel();
    let readers = [
        forward_lines(child.stdout.take().expect("piped"), tx.clone()),
        forward_lines(child.stderr.take().expect("piped"), tx),
    ];
    let mut printed = Vec::new();
    // Ends when both pipes are closed.
    for line in lines {
        let line = line.trim_end_matches(['\n', '\r']).to_owned();
        eprintln!("{line}");
        printed.push(line);
    }
    for reader in readers {
        let _ = reader.join();
    }
    let status = child.wait().with_context(|| format!("waiting for {cmd:?}"))?;
    Ok((status, printed))
}

/// Sends each line read from `stream` (lossily decoded, line ending kept) until EOF.
pub fn forward_lines(stream: impl Read + Send + 'static, tx: Sender<String>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            if tx.send(String::from_utf8_lossy(&line).into_owned()).is_err() {
                break;
            }
            line.clear();
        }
    })
}

pub fn cargo_command() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

pub fn cargo(args: &[&str]) -> anyhow::Result<()> {
    run_cmd(cargo_command().args(args))
}

/// Replaces the current process (so signals reach the program directly).
pub fn exec(bin: &Path, args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let err = Command::new(bin).args(args).exec();
    Err(err).with_context(|| format!("executing {}", bin.display()))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

pub fn require_root(why: &str) -> anyhow::Result<()> {
    if !is_root() {
        bail!("must run as root: {why} (try `sudo -E cargo xtask ...`)");
    }
    Ok(())
}
