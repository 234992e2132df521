//! A real CoreCLR 8.0.4 process (`tests/dotnet/coreclr_host.py`) driven over its line protocol.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use crate::process::LineProcess;
use crate::procfs;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dotnet/coreclr_host.py");

/// A process name that would clear the screen, start a row of its own and turn on reverse
/// video (15 bytes: what `comm` holds).
pub const HOSTILE_COMM: &str = "\x1b[2J\n\x1b[7mEVIL";
/// A type name that would clear the screen, move the cursor home and start a row.
pub const HOSTILE_TYPE: &str = "Evil\x1b[2J\x1b[H\nType";
/// A method name that would set the window title, turn the text red and start a row.
pub const HOSTILE_INNER: &str = "\x1b]0;owned\x07\x1b[31mInner\nrow";
/// Loading CoreCLR into Python takes a few seconds on a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(90);
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

pub struct CoreclrHost {
    process: LineProcess,
    /// Pid in tracer's (the host's) pid namespace.
    pub host_pid: u32,
    /// Pid the runtime sees (`READY <pid>`), the one in its socket name.
    pub ns_pid: u32,
    /// `Environment.Version`, e.g. `8.0.4`.
    pub version: String,
}

impl CoreclrHost {
    /// Starts the runtime with `TMPDIR=tmpdir`, so its socket lands in a directory of the test's.
    pub fn spawn(tmpdir: &Path) -> Result<CoreclrHost> {
        CoreclrHost::spawn_with(tmpdir, &[])
    }

    /// [`spawn`](Self::spawn) with extra environment (e.g. `DOTNET_EnableWriteXorExecute=0`).
    pub fn spawn_with(tmpdir: &Path, env: &[(&str, &str)]) -> Result<CoreclrHost> {
        CoreclrHost::spawn_with_args(tmpdir, env, &[])
    }

    /// [`spawn_with`](Self::spawn_with), with `args` after the script on its command line
    /// (which the script ignores).
    pub fn spawn_with_args(
        tmpdir: &Path,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Result<CoreclrHost> {
        let mut command = Command::new("python3");
        command.arg(SCRIPT).args(args).env("TMPDIR", tmpdir).envs(env.iter().copied());
        let mut process = LineProcess::spawn("coreclr_host", command)?;
        let host_pid = process.pid();
        let (ns_pid, version) = wait_ready(&mut process)?;
        ensure!(ns_pid == host_pid, "READY pid {ns_pid} is not the child's pid {host_pid}");
        Ok(CoreclrHost { process, host_pid, ns_pid, version })
    }

    /// [`spawn`](Self::spawn) as the process with pid `pid` (free now: an earlier holder has
    /// exited), through `helper` (`env!("CARGO_BIN_EXE_spawn_at_pid")`): a pid reused by a
    /// real runtime.
    pub fn spawn_at_pid(tmpdir: &Path, pid: u32, helper: &str) -> Result<CoreclrHost> {
        let mut command = Command::new(helper);
        command.arg(pid.to_string()).args(["python3", SCRIPT]).env("TMPDIR", tmpdir);
        let mut process = LineProcess::spawn("coreclr_host at a chosen pid", command)?;
        let (ns_pid, version) = wait_ready(&mut process)?;
        ensure!(ns_pid == pid, "READY pid {ns_pid} is not the pid {pid} asked for");
        Ok(CoreclrHost { process, host_pid: pid, ns_pid, version })
    }

    /// [`spawn`](Self::spawn) inside `cgroup` of `tree`: the process is moved there before the
    /// runtime loads (so tracer sees it in its container from the first detection).
    pub fn spawn_in_cgroup(
        tmpdir: &Path,
        tree: &crate::cgroups::CgroupTree,
        cgroup: &str,
    ) -> Result<CoreclrHost> {
        let mut command = Command::new("sh");
        command.args(["-c", r#"read go && exec python3 "$0""#, SCRIPT]).env("TMPDIR", tmpdir);
        let mut process = LineProcess::spawn("coreclr_host in a cgroup", command)?;
        let host_pid = process.pid();
        tree.enter(cgroup, host_pid)?;
        process.send_line("go")?;
        let (ns_pid, version) = wait_ready(&mut process)?;
        ensure!(ns_pid == host_pid, "READY pid {ns_pid} is not the child's pid {host_pid}");
        Ok(CoreclrHost { process, host_pid, ns_pid, version })
    }

    /// Starts the runtime as a container would: new pid and mount namespaces
    /// (`unshare --pid --mount --fork`), a private tmpfs on `/tmp`, and `TMPDIR=inner_tmpdir`
    /// (a path inside that tmpfs). `own_proc` mounts a /proc of the new pid namespace, as
    /// container runtimes do.
    pub fn spawn_in_namespaces(inner_tmpdir: &str, own_proc: bool) -> Result<CoreclrHost> {
        CoreclrHost::spawn_in_namespaces_with(inner_tmpdir, own_proc, &[])
    }

    /// [`spawn_in_namespaces`](Self::spawn_in_namespaces) with extra environment.
    pub fn spawn_in_namespaces_with(
        inner_tmpdir: &str,
        own_proc: bool,
        env: &[(&str, &str)],
    ) -> Result<CoreclrHost> {
        let mut command = Command::new("unshare");
        command.envs(env.iter().copied());
        command.args(["--pid", "--mount", "--fork", "--kill-child"]);
        if own_proc {
            command.arg("--mount-proc");
        }
        // The checkout itself may live under /tmp, which the private tmpfs hides: read the
        // script first and leave the working directory before mounting.
        command.args(["sh", "-c"]).arg(
            r#"code=$(cat "$1") && cd / && mount -t tmpfs tracer-test-tmp /tmp && mkdir -p "$0" && TMPDIR="$0" exec python3 -c "$code""#,
        );
        command.args([inner_tmpdir, SCRIPT]);
        let mut process = LineProcess::spawn("coreclr_host in namespaces", command)?;
        let (ns_pid, version) = wait_ready(&mut process)?;
        let unshare_pid = process.pid();
        let host_pid = match procfs::children(unshare_pid)[..] {
            [pid] => pid,
            ref other => bail!("unshare {unshare_pid} should have one child, has {other:?}"),
        };
        ensure!(
            procfs::ns_pid(host_pid)? == ns_pid,
            "host pid {host_pid} is not the runtime that printed READY {ns_pid}"
        );
        Ok(CoreclrHost { process, host_pid, ns_pid, version })
    }

    /// Induces `n` garbage collections; returns `GC.CollectionCount(0)` afterwards.
    pub fn gc(&mut self, n: u32) -> Result<u64> {
        let reply = self.process.request(&format!("gc {n}"), "GC_DONE", REPLY_TIMEOUT)?;
        let mut fields = reply.split_whitespace();
        ensure!(fields.next() == Some(&n.to_string()[..]), "GC_DONE for another count: {reply}");
        fields.next().context("GC_DONE without a count")?.parse().context("GC count")
    }

    /// Creates the Meter `TracerTest.App` (a counter `requests`, a gauge `queue-length` = 42.5)
    /// and the Meter `TracerTest.Shop` (see [`CoreclrHost::shop`]).
    pub fn meter(&mut self) -> Result<()> {
        self.process.request("meter", "METER", REPLY_TIMEOUT).map(drop)
    }

    /// `TracerTest.Shop`: adds `orders` to its counter and `active` to its up-down counter, and
    /// records each of `waits` (seconds) in its histogram.
    pub fn shop(&mut self, orders: u32, active: i32, waits: &[f64]) -> Result<()> {
        let waits: Vec<String> = waits.iter().map(f64::to_string).collect();
        let line = format!("shop {orders} {active} {}", waits.join(" "));
        let reply = self.process.request(line.trim_end(), "SHOP", REPLY_TIMEOUT)?;
        ensure!(reply == format!("{orders} {active} {}", waits.len()), "SHOP for another: {reply}");
        Ok(())
    }

    /// Writes `n` ILogger messages as the EventSource logger provider writes them (see
    /// `log` in tests/dotnet/coreclr_host.py).
    pub fn log(&mut self, n: u32) -> Result<()> {
        let reply = self.process.request(&format!("log {n}"), "LOGGED", REPLY_TIMEOUT)?;
        ensure!(reply == n.to_string(), "LOGGED for another count: {reply}");
        Ok(())
    }

    /// Adds `n` to the `requests` counter with the tag `route=<route>`.
    pub fn add_requests(&mut self, n: u32, route: &str) -> Result<()> {
        self.process.request(&format!("add {n} {route}"), "ADDED", REPLY_TIMEOUT).map(drop)
    }

    /// Runs the CPU workload (`burn`: `TracerWorkload.Hot`'s methods) for `seconds`; returns
    /// its rounds.
    pub fn burn(&mut self, seconds: u32) -> Result<u64> {
        let timeout = REPLY_TIMEOUT + Duration::from_secs(seconds.into());
        let reply = self.process.request(&format!("burn {seconds}"), "BURNED", timeout)?;
        reply.parse().context("BURNED rounds")
    }

    /// Starts the CPU workload for `seconds` and returns at once: the runtime answers nothing
    /// else until [`CoreclrHost::burned`] has read its end.
    pub fn start_burn(&mut self, seconds: u32) -> Result<()> {
        self.process.send_line(&format!("burn {seconds}"))
    }

    /// Waits for the end of the workload [`CoreclrHost::start_burn`] started (at most `seconds`
    /// after it started, and the reply timeout); returns its rounds.
    pub fn burned(&mut self, seconds: u32) -> Result<u64> {
        let timeout = REPLY_TIMEOUT + Duration::from_secs(seconds.into());
        self.process.expect_line("BURNED", timeout)?.parse().context("BURNED rounds")
    }

    /// Names the process [`HOSTILE_COMM`], the workload's type [`HOSTILE_TYPE`] and its
    /// `Inner` [`HOSTILE_INNER`] (before the first burn).
    pub fn hostile_names(&mut self) -> Result<()> {
        let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        let line =
            format!("hostile {} {} {}", hex(HOSTILE_COMM), hex(HOSTILE_TYPE), hex(HOSTILE_INNER));
        self.process.request(&line, "HOSTILE", REPLY_TIMEOUT).map(drop)
    }

    /// Starts a thread that allocates `bytes_per_sec` and throws `throws_per_sec` exceptions a
    /// second in managed code, until the process exits.
    pub fn churn(&mut self, bytes_per_sec: u64, throws_per_sec: u64) -> Result<()> {
        let line = format!("churn {bytes_per_sec} {throws_per_sec}");
        self.process.request(&line, "CHURNING", REPLY_TIMEOUT).map(drop)
    }

    /// What the churn thread did so far: bytes allocated on it, exceptions thrown, seconds.
    pub fn churned(&mut self) -> Result<Churned> {
        self.churned_reply("churned")
    }

    /// What the churn thread did between two CLOCK_MONOTONIC instants (`mono_ns`), as of its
    /// 10 ms ticks.
    pub fn churned_between(&mut self, from_ns: u64, to_ns: u64) -> Result<Churned> {
        self.churned_reply(&format!("churned {from_ns} {to_ns}"))
    }

    fn churned_reply(&mut self, request: &str) -> Result<Churned> {
        let reply = self.process.request(request, "CHURNED", REPLY_TIMEOUT)?;
        let mut fields = reply.split_whitespace();
        let mut next = |what| fields.next().with_context(|| format!("CHURNED without {what}"));
        Ok(Churned {
            bytes: next("bytes")?.parse()?,
            exceptions: next("exceptions")?.parse()?,
            seconds: next("seconds")?.parse()?,
        })
    }

    /// Makes the workload of the first [`CoreclrHost::burn`] fully optimized code from its
    /// first call (no tier-0 code, on-stack replacement or tier-up, whose speeds differ).
    pub fn optimize_workload(&mut self) -> Result<()> {
        self.process.request("optimized", "OPTIMIZED", REPLY_TIMEOUT).map(drop)
    }

    /// Asks the runtime to exit and waits until it has.
    pub fn exit(&mut self) -> Result<()> {
        self.process.send_line("exit")?;
        self.process.wait_exit(REPLY_TIMEOUT)
    }

    /// Proves the runtime still runs managed code; returns `GC.CollectionCount(0)`.
    pub fn ping(&mut self) -> Result<u64> {
        let reply = self.process.request("ping", "PONG", REPLY_TIMEOUT)?;
        reply.parse().context("PONG count")
    }
}

/// What the churn thread of [`CoreclrHost::churn`] counted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Churned {
    /// Allocated on the thread (`GC.GetAllocatedBytesForCurrentThread`), exceptions included.
    pub bytes: u64,
    pub exceptions: u64,
    pub seconds: f64,
}

impl Churned {
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.seconds
    }

    pub fn exceptions_per_sec(&self) -> f64 {
        self.exceptions as f64 / self.seconds
    }
}

fn wait_ready(process: &mut LineProcess) -> Result<(u32, String)> {
    let ready = process.expect_line("READY", START_TIMEOUT)?;
    let mut fields = ready.split_whitespace();
    let pid = fields.next().context("READY without pid")?.parse()?;
    let version = fields.next().context("READY without version")?.to_owned();
    Ok((pid, version))
}
