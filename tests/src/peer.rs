//! Driving `tests/src/bin/hostile_peer.rs` from a test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::process::LineProcess;

const TIMEOUT: Duration = Duration::from_secs(20);

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
        let mut command = Command::new(binary);
        command.args(args).env("TMPDIR", tmpdir);
        if ipc_memfd {
            command.env("HOSTILE_PEER_IPC_MEMFD", "1");
        }
        let mut process = LineProcess::spawn(&format!("hostile_peer {args:?}"), command)?;
        let path = PathBuf::from(process.expect_line("READY", TIMEOUT)?);
        Ok(HostilePeer { process, path })
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
