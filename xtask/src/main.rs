//! Project automation: `cargo xtask <command>`.
//!
//! * `setup`   — install what a fresh machine lacks (idempotent, fast when done).
//! * `test`    — setup, build, run every test (host integration tests as root, then VM tests).
//! * `run`     — setup, build release, run tracer with the given arguments.
//! * `bench`   — benchmarks that print numbers (see docs/benchmarks.md).
//! * `vm-test` — build/boot the user_events test kernel and run the VM tests.
mod bench_ftrace;
mod setup;
mod util;

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
    /// Benchmarks that print numbers (docs/benchmarks.md): `cargo xtask bench ftrace [METHOD..]`.
    Bench {
        /// Which benchmark: ftrace.
        name: String,
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
        Command::Bench { name, args } => match name.as_str() {
            "ftrace" => bench_ftrace::run(&args),
            other => Err(anyhow::anyhow!("unknown benchmark {other:?} (available: ftrace)")),
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

fn test(args: &[String]) -> anyhow::Result<()> {
    util::require_root("the tests load BPF programs and use tracefs")?;
    setup::run()?;
    util::cargo(&["build", "--workspace", "--all-targets"])?;
    let mut nextest = vec!["nextest", "run", "--workspace", "--no-fail-fast"];
    nextest.extend(args.iter().map(String::as_str));
    util::cargo(&nextest)?;
    Ok(())
}

fn run(args: &[String]) -> anyhow::Result<()> {
    setup::run()?;
    util::cargo(&["build", "--release", "-p", "tracer"])?;
    let bin = util::workspace_root().join("target/release/tracer");
    util::exec(&bin, args)
}
