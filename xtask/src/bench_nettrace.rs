//! nettrace parse throughput (part of `cargo xtask bench ipc`): builds the release example
//! `nettrace_throughput` and runs it on the verbose CoreCLR 8.0.4 capture replayed to 512 MB,
//! fed in 64 KiB chunks as a socket would deliver it. Target: ≥ 1 GB/s for the parser.
use crate::util;

pub const FIXTURE: &str = "tests/fixtures/nettrace/coreclr8_verbose.nettrace";

pub fn run() -> anyhow::Result<()> {
    util::cargo(&["build", "--release", "-p", "tracer", "--example", "nettrace_throughput"])?;
    let root = util::workspace_root();
    let bin = root.join("target/release/examples/nettrace_throughput");
    let fixture = root.join(FIXTURE);
    println!("nettrace parse throughput ({FIXTURE} replayed to 512 MB, 64 KiB chunks):");
    util::run_cmd(std::process::Command::new(bin).arg(fixture).args(["512", "65536"]))
}
