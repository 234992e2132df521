//! Driving `tests/src/bin/hostile_peer.rs` from a test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::process::LineProcess;

const TIMEOUT: Duration = Duration::from_secs(20);

/// How [`HostilePeer::spawn_opts`] starts the peer.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerOptions {
    /// Map a `dotnet_ipc_created` memfd, so tracer's detection takes it for a .NET runtime.
    pub ipc_memfd: bool,
    /// Run as uid/gid 65534 (`nobody`): another user sharing the temp dir.
    pub as_nobody: bool,
    /// Create the name only on [`HostilePeer::go`] (the memfd, if any, is mapped at once).
    pub wait: bool,
    /// Run in a new time namespace whose boottime clock is ahead by this many seconds.
    pub boottime_offset_s: Option<i64>,
}

pub struct HostilePeer {
    process: LineProcess,
    /// The socket (or symlink) it created.
    pub path: PathBuf,
}

impl HostilePeer {
    /// `binary` is `env!("CARGO_BIN_EXE_hostile_peer")`; `tmpdir` becomes its `TMPDIR`.
    pub fn spawn(binary: &str, tmpdir: &Path, args: &[&str]) -> Result<HostilePeer> {
        Self::spawn_with(binary, tmpdir, args, false)
    }

    /// Like [`HostilePeer::spawn`]; with `ipc_memfd` the peer also maps a `dotnet_ipc_created`
    /// memfd, so tracer's detection takes it for a .NET runtime.
    pub fn spawn_with(
        binary: &str,
        tmpdir: &Path,
        args: &[&str],
        ipc_memfd: bool,
    ) -> Result<HostilePeer> {
        let options = PeerOptions { ipc_memfd, ..PeerOptions::default() };
        Self::spawn_opts(binary, tmpdir, args, options)
    }

    /// Like [`HostilePeer::spawn`], with [`PeerOptions`]. With `wait`, `path` is empty until
    /// [`HostilePeer::go`].
    pub fn spawn_opts(
        binary: &str,
        tmpdir: &Path,
        args: &[&str],
        options: PeerOptions,
    ) -> Result<HostilePeer> {
        let mut command = match options.boottime_offset_s {
            Some(offset) => {
                // unshare(1) execs the peer in a new time namespace: same pid.
                let mut c = Command::new("unshare");
                c.args(["--time", &format!("--boottime={offset}"), binary]);
                c
            }
            None => Command::new(binary),
        };
        command.args(args).env("TMPDIR", tmpdir);
        for (set, var) in [
            (options.ipc_memfd, "HOSTILE_PEER_IPC_MEMFD"),
            (options.as_nobody, "HOSTILE_PEER_AS_NOBODY"),
            (options.wait, "HOSTILE_PEER_WAIT"),
        ] {
            if set {
                command.env(var, "1");
            }
        }
        let mut process = LineProcess::spawn(&format!("hostile_peer {args:?}"), command)?;
        if options.wait {
            process.expect_line("WAITING", TIMEOUT)?;
            return Ok(HostilePeer { process, path: PathBuf::new() });
        }
        let path = PathBuf::from(process.expect_line("READY", TIMEOUT)?);
        Ok(HostilePeer { process, path })
    }

    /// Tells a peer started with `wait` to create its name now; returns once it exists.
    pub fn go(&mut self) -> Result<&Path> {
        self.path = PathBuf::from(self.process.request("go", "READY", TIMEOUT)?);
        Ok(&self.path)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// (connections accepted, bytes received) once at least `min_connections` came and all
    /// of them were closed by the client.
    pub fn received(&mut self, min_connections: usize) -> Result<(usize, usize)> {
        self.tally(&format!("report {min_connections}"))
    }

    /// (connections accepted, bytes received) once at least `min_bytes` arrived, while the
    /// connections may still be open.
    pub fn received_bytes(&mut self, min_bytes: usize) -> Result<(usize, usize)> {
        self.tally(&format!("bytes {min_bytes}"))
    }

    fn tally(&mut self, command: &str) -> Result<(usize, usize)> {
        let line = self.process.request(command, "RECEIVED", TIMEOUT)?;
        let (connections, bytes) = line.split_once(' ').context("RECEIVED <n> <bytes>")?;
        Ok((connections.parse()?, bytes.parse()?))
    }
}
