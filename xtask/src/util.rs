use std::path::{Path, PathBuf};
use std::process::Command;

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

pub fn cargo(args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_cmd(Command::new(cargo).args(args).current_dir(workspace_root()))
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
