//! Project automation: `cargo xtask <command>`.
//!
//! * `setup`   — install what a fresh machine lacks (idempotent, fast when done).
//! * `test`    — setup, build, run every test (host integration tests as root, then VM tests).
//! * `run`     — setup, build release, run tracer with the given arguments.
//! * `bench`   — benchmarks that print numbers (see docs/benchmarks.md).
//! * `vm-test` — build/boot the user_events test kernel and run the VM tests.
mod bench;
mod bench_detect;
mod bench_ftrace;
mod bench_ipc;
mod bench_nettrace;
mod fuzz;
mod setup;
mod util;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install toolchain pieces and packages the build and tests need (idempotent).
    Setup,
    /// Run all tests: unit, host integration (root, real kernel), fuzz smoke runs and VM tests.
    Test {
        /// Extra arguments for the test runner (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Build tracer (release) and run it: `cargo xtask run -- run --providers gc`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build (once, cached) a user_events test kernel, boot it under qemu and run the `vm_*`
    /// integration tests inside it (see docs/vm-tests.md).
    VmTest {
        /// Run the `vm_bench*` binaries instead, with TRACER_VM_BENCH=1.
        #[arg(long)]
        bench: bool,
        /// Kill the VM after this long: seconds, or with an s/m suffix.
        #[arg(long, default_value = "20m", value_parser = vm::parse_timeout)]
        timeout: std::time::Duration,
        /// Run only this test binary (e.g. vm_user_events); repeatable.
        #[arg(long = "test", value_name = "NAME")]
        only: Vec<String>,
        /// Arguments for every test binary (e.g. a test name filter, --nocapture).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run every fuzz target (or the named ones) for a while each; fails on a crash.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u32,
        /// Only these targets (bpf_event, ipc_reply, nettrace, user_events_record, ftrace_page,
        /// proc_and_tracefs_text).
        targets: Vec<String>,
    },
    /// Benchmarks that print numbers and record them in docs/benchmarks.md:
    /// `detect`, `ipc`, `ftrace [METHOD..]`.
    Bench {
        name: String,
        /// Benchmark-specific arguments (ftrace: which of mmap, read, trace-cmd to run).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup => setup::run(),
        Command::Test { args } => test(&args),
        Command::Run { args } => run(&args),
        Command::VmTest { bench, timeout, only, args } => {
            setup::run().and_then(|()| vm::run(&vm::Options { bench, timeout, only, args }))
        }
        Command::Fuzz { seconds, targets } => {
            setup::run().and_then(|()| fuzz::run(seconds, &targets))
        }
        Command::Bench { name, args } => match name.as_str() {
            "detect" => bench_detect::run(),
            "ipc" => bench_ipc::run(),
            "ftrace" => bench_ftrace::run(&args),
            other => {
                Err(anyhow::anyhow!("unknown benchmark {other:?} (known: detect, ipc, ftrace)"))
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Seconds per fuzz target in `cargo xtask test`.
const FUZZ_SMOKE_SECONDS: u32 = 15;

fn test(args: &[String]) -> anyhow::Result<()> {
    util::require_root("the tests load BPF programs and use tracefs")?;
    setup::run()?;
    util::cargo(&["build", "--workspace", "--all-targets"])?;
    // vm_* tests need user_events, which the host kernel lacks: they run in the VM below.
    let host_only = format!("not binary(/^{}/)", vm::VM_TEST_PREFIX);
    let mut nextest = vec!["nextest", "run", "--workspace", "--no-fail-fast", "-E", &host_only];
    nextest.extend(args.iter().map(String::as_str));
    let host = util::cargo(&nextest);
    let vm = vm::run(&vm::Options {
        bench: false,
        timeout: std::time::Duration::from_secs(20 * 60),
        only: Vec::new(),
        args: Vec::new(),
    });
    // Short runs: they prove every fuzz target builds and survives its seeds plus fresh inputs.
    let fuzz = fuzz::run(FUZZ_SMOKE_SECONDS, &[]);
    let failed: Vec<String> = [("host tests", host), ("VM tests", vm), ("fuzz smoke runs", fuzz)]
        .into_iter()
        .filter_map(|(what, r)| r.err().map(|e| format!("{what}: {e:#}")))
        .collect();
    if failed.is_empty() { Ok(()) } else { Err(anyhow::anyhow!("{}", failed.join("\n"))) }
}

fn run(args: &[String]) -> anyhow::Result<()> {
    setup::run()?;
    util::cargo(&["build", "--release", "-p", "tracer"])?;
    let bin = util::workspace_root().join("target/release/tracer");
    util::exec(&bin, args)
}
