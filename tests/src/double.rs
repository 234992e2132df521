//! The .NET 10 runtime test double (`tests/dotnet/dotnet10_double.py`) driven over its line
//! protocol: it binds its diagnostic socket, then maps the `dotnet_ipc_created` memfd.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use crate::process::LineProcess;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dotnet/dotnet10_double.py");
const TIMEOUT: Duration = Duration::from_secs(30);

pub struct Dotnet10Double {
    process: LineProcess,
    /// Its diagnostic socket.
    pub socket: String,
}

impl Dotnet10Double {
    /// Starts the double with `TMPDIR=tmpdir`.
    pub fn spawn(tmpdir: &Path) -> Result<Dotnet10Double> {
        Dotnet10Double::spawn_with(tmpdir, &[])
    }

    /// Starts the double with `TMPDIR=tmpdir` and extra environment (its hostile modes:
    /// `DOUBLE_IGNORE_STOP`, `DOUBLE_ALL_PROVIDERS`).
    pub fn spawn_with(tmpdir: &Path, env: &[(&str, &str)]) -> Result<Dotnet10Double> {
        let mut command = Command::new("python3");
        command.arg(SCRIPT).env("TMPDIR", tmpdir).envs(env.iter().copied());
        Dotnet10Double::ready(command)
    }

    /// Starts the double as uid/gid 65534 (`nobody`, no supplementary groups) with
    /// `TMPDIR=tmpdir` (which nobody must be able to write).
    pub fn spawn_as_nobody(tmpdir: &Path) -> Result<Dotnet10Double> {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "python3", SCRIPT])
            .env("TMPDIR", tmpdir);
        Dotnet10Double::ready(command)
    }

    fn ready(command: Command) -> Result<Dotnet10Double> {
        let mut process = LineProcess::spawn("dotnet10_double", command)?;
        let ready = process.wait_line("READY", TIMEOUT)?;
        let (pid, socket) = ready.split_once(' ').context("READY <pid> <socket>")?;
        ensure!(pid.parse::<u32>()? == process.pid(), "READY pid {pid} is not the child");
        Ok(Dotnet10Double { process, socket: socket.to_owned() })
    }

    /// Starts the double with `TMPDIR=tmpdir` and `DOUBLE_LISTEN_ON_LINE=1` (and `env`): it has
    /// bound its socket but does not listen until [`listen`](Self::listen).
    pub fn spawn_bound(tmpdir: &Path, env: &[(&str, &str)]) -> Result<Dotnet10Double> {
        let mut command = Command::new("python3");
        command
            .arg(SCRIPT)
            .env("TMPDIR", tmpdir)
            .env("DOUBLE_LISTEN_ON_LINE", "1")
            .envs(env.iter().copied());
        let mut process = LineProcess::spawn("dotnet10_double", command)?;
        let bound = process.wait_line("BOUND", TIMEOUT)?;
        let (pid, socket) = bound.split_once(' ').context("BOUND <pid> <socket>")?;
        ensure!(pid.parse::<u32>()? == process.pid(), "BOUND pid {pid} is not the child");
        Ok(Dotnet10Double { process, socket: socket.to_owned() })
    }

    /// Lets a double started with [`spawn_bound`](Self::spawn_bound) listen; waits for READY.
    pub fn listen(&mut self) -> Result<()> {
        self.process.send_line("listen")?;
        let ready = self.process.wait_line("READY", TIMEOUT)?;
        ensure!(ready.ends_with(&self.socket), "READY for another socket: {ready}");
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// With `DOUBLE_HAND_OFF=1`: the pid of the child that took over the listener.
    pub fn handed_off(&mut self) -> Result<u32> {
        self.process.wait_line("HANDED_OFF", TIMEOUT)?.parse().context("HANDED_OFF <pid>")
    }

    /// Waits for `SESSION_STARTED <id> <type>` of session `id` (as tracer printed it, e.g.
    /// `0x7f0000001100`; other tracers may hold sessions too); returns its type.
    pub fn expect_session_started(&mut self, id: &str) -> Result<String> {
        loop {
            let rest = self.process.wait_line("SESSION_STARTED", TIMEOUT)?;
            if let Some(kind) = rest.strip_prefix(id) {
                return Ok(kind.trim().to_owned());
            }
        }
    }

    /// Waits for `SESSION_ENDED <id>` of session `id`.
    pub fn expect_session_ended(&mut self, id: &str) -> Result<()> {
        while self.process.wait_line("SESSION_ENDED", TIMEOUT)? != id {}
        Ok(())
    }

    /// `gc n`: one GCStart (reason Induced) + GCEnd per GC; returns the double's GC total.
    pub fn gc(&mut self, n: u32) -> Result<u64> {
        self.process.send_line(&format!("gc {n}"))?;
        let reply = self.process.wait_line("GC_DONE", TIMEOUT)?;
        reply.split_whitespace().nth(1).context("GC_DONE n total")?.parse().context("GC total")
    }

    /// `emit n` TestDouble/Tick events; returns (written, skipped because not enabled) summed
    /// over its sessions.
    pub fn emit(&mut self, n: u32) -> Result<(u64, u64)> {
        self.start_emit(n)?;
        self.emitted(n)
    }

    /// Asks for `emit n` without waiting for it to finish (see [`emitted`](Self::emitted)).
    pub fn start_emit(&mut self, n: u32) -> Result<()> {
        self.process.send_line(&format!("emit {n}"))
    }

    /// Waits for the `emit n` asked for with [`start_emit`](Self::start_emit).
    pub fn emitted(&mut self, n: u32) -> Result<(u64, u64)> {
        let reply = self.process.wait_line("EMITTED", TIMEOUT)?;
        let f: Vec<u64> = reply.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
        ensure!(f.len() == 3 && f[0] == u64::from(n), "unexpected reply EMITTED {reply}");
        Ok((f[1], f[2]))
    }

    /// `threads k n`: k threads each write n Tick events and end; returns (events written,
    /// the threads' ids) once every one has ended.
    pub fn threads(&mut self, k: u32, n: u32) -> Result<(u64, Vec<u32>)> {
        self.process.send_line(&format!("threads {k} {n}"))?;
        let reply = self.process.wait_line("THREADS_EMITTED", TIMEOUT)?;
        let mut fields = reply.split_whitespace().map(str::parse::<u64>);
        let written = fields.next().context("THREADS_EMITTED <written> <tids>")??;
        let tids = fields.map(|t| Ok(u32::try_from(t?)?)).collect::<Result<Vec<u32>>>()?;
        ensure!(tids.len() == k as usize, "unexpected reply THREADS_EMITTED {reply}");
        Ok((written, tids))
    }

    /// `counters n` (hostile): `EventCounters` events for n distinct counters `c0`..; returns
    /// the events written, summed over its sessions.
    pub fn counters(&mut self, n: u32) -> Result<u64> {
        self.process.send_line(&format!("counters {n}"))?;
        let reply = self.process.wait_line("COUNTERS", TIMEOUT)?;
        let f: Vec<u64> = reply.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
        ensure!(f.len() == 2 && f[0] == u64::from(n), "unexpected reply COUNTERS {reply}");
        Ok(f[1])
    }

    /// `amplify <id> e n` (hostile): the amplifying stream into streaming session `id` (as
    /// tracer printed it); returns (events written, bytes the double sent on that session's
    /// stream so far).
    pub fn amplify(
        &mut self,
        id: &str,
        empty_events: u32,
        named_events: u32,
    ) -> Result<(u64, u64)> {
        self.process.send_line(&format!("amplify {id} {empty_events} {named_events}"))?;
        let reply = self.process.wait_line("AMPLIFIED", TIMEOUT)?;
        let f: Vec<u64> = reply.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
        ensure!(f.len() == 2, "unexpected reply AMPLIFIED {reply}");
        Ok((f[0], f[1]))
    }

    /// `forge n` (hostile): `n` records into every write index 0..63 of each of its
    /// user_events sessions' fds; returns the writes that succeeded.
    pub fn forge(&mut self, n: u32) -> Result<u64> {
        self.process.send_line(&format!("forge {n}"))?;
        let reply = self.process.wait_line("FORGED", TIMEOUT)?;
        reply.trim().parse().context("FORGED <writes>")
    }

    /// `fork_write n` (hostile): a forked child writes `n` Tick records into each session's
    /// TestDouble tracepoint; returns (writes, child pid).
    pub fn fork_write(&mut self, n: u32) -> Result<(u64, u32)> {
        self.process.send_line(&format!("fork_write {n}"))?;
        let reply = self.process.wait_line("FORK_WROTE", TIMEOUT)?;
        let (writes, child) = reply.split_once(' ').context("FORK_WROTE <writes> <pid>")?;
        Ok((writes.parse()?, child.trim().parse()?))
    }

    /// `ue_amplify n` (hostile): n records of a long-named event into each of its user_events
    /// sessions; returns the records written (while enabled).
    pub fn ue_amplify(&mut self, n: u32) -> Result<u64> {
        self.process.send_line(&format!("ue_amplify {n}"))?;
        let reply = self.process.wait_line("UE_AMPLIFIED", TIMEOUT)?;
        reply.trim().parse().context("UE_AMPLIFIED <records>")
    }

    /// `pin n` (hostile): registers n more tracepoints through each user_events session's fd
    /// and keeps them; returns how many registered.
    pub fn pin(&mut self, n: u32) -> Result<u64> {
        self.process.send_line(&format!("pin {n}"))?;
        let reply = self.process.wait_line("PINNED", TIMEOUT)?;
        reply.trim().parse().context("PINNED <registered>")
    }

    /// Asks the double to exit and waits for it.
    pub fn exit(&mut self) -> Result<()> {
        self.process.send_line("exit")?;
        self.process.wait_exit(TIMEOUT)
    }
}
