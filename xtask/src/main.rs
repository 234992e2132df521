//! Project automation: `cargo xtask <command>`.
//!
//! * `setup`   — install what a fresh machine lacks (idempotent, fast when done).
//! * `test`    — setup, build, run every test (host tests as root, doctests, VM tests, fuzz smoke
//!   runs) and end with a summary line and `N passed, N failed`.
//! * `run`     — setup, build release, run tracer with the given arguments.
//! * `bench`   — benchmarks that print numbers (see docs/benchmarks.md).
//! * `image`   — build the container image (deploy/container/Containerfile) with buildah.
//! * `vm-test` — build/boot the user_events test kernel and run the VM tests.
//! * `gen-runtime-events` — regenerate the runtime-event layout table from the manifests.
mod bench;
mod bench_agent;
mod bench_detect;
mod bench_ftrace;
mod bench_hostile;
mod bench_ipc;
mod bench_nettrace;
mod bench_profile;
mod bench_sampler;
mod bench_top;
mod fuzz;
mod gen_events;
mod image;
mod libtest;
mod setup;
mod test;
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
    /// Build the container image `localhost/tracer:<version>` with buildah (release binary and
    /// the libraries it links, deploy/container/Containerfile); docs/deploy.md.
    Image {
        /// Only stage the build context in DIR (for `docker build -f
        /// deploy/container/Containerfile DIR`); build no image.
        #[arg(long, value_name = "DIR")]
        stage: Option<std::path::PathBuf>,
        /// The image's name instead of localhost/tracer:<version>.
        #[arg(long)]
        tag: Option<String>,
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
        /// Arguments for every test binary (e.g. a test name filter, --nocapture). Without a
        /// filter every binary must run all its tests; with one, binaries may run fewer.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run every fuzz target (or the named ones) for a while each; fails on a crash.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u32,
        /// Only these targets (the `[[bin]]` names of fuzz/Cargo.toml).
        targets: Vec<String>,
    },
    /// Benchmarks that print numbers and record them in docs/benchmarks.md:
    /// `agent [--against BIN [--rounds N]]`, `detect`, `ipc`, `ftrace [METHOD..]`, `hostile`,
    /// `sampler`, `profile [--rounds N] [--seconds S]`, `top`.
    Bench {
        name: String,
        /// Benchmark-specific arguments (ftrace: which of mmap, read, trace-cmd to run; profile:
        /// its rounds and seconds per run; agent: another tracer binary to compare with).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Regenerate the runtime-event layout table (tracer-decode/src/nettrace/runtime_events/
    /// generated.rs) from ClrEtwAll.man and the overlays in xtask/data (later ones win; see
    /// docs/protocol/runtime-events.md).
    GenRuntimeEvents {
        /// The manifests, base first.
        #[arg(required = true)]
        manifests: Vec<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup => setup::run(),
        // Prints its own closing lines, failures included.
        Command::Test { args } => return test::run(&args),
        Command::Run { args } => run(&args),
        Command::Image { stage, tag } => image::run(&image::Options { stage_only: stage, tag }),
        Command::VmTest { bench, timeout, only, args } => {
            let opts = vm::Options { bench, short_benches: false, timeout, only, args };
            setup::run().and_then(|()| vm::run_checked(&opts))
        }
        Command::Fuzz { seconds, targets } => {
            setup::run().and_then(|()| fuzz::run_checked(seconds, &targets))
        }
        Command::GenRuntimeEvents { manifests } => gen_events::run(&manifests),
        Command::Bench { name, args } => match name.as_str() {
            "agent" => bench_agent::run(&args),
            "detect" => bench_detect::run(),
            "ipc" => bench_ipc::run(),
            "hostile" => bench_hostile::run(),
            "ftrace" => bench_ftrace::run(&args),
            "sampler" => bench_sampler::run(),
            "profile" => bench_profile::run(&args),
            "top" => bench_top::run(),
            other => Err(anyhow::anyhow!(
                "unknown benchmark {other:?} (known: agent, detect, ipc, ftrace, hostile, \
                 sampler, profile, top)"
            )),
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

fn run(args: &[String]) -> anyhow::Result<()> {
    setup::run()?;
    util::cargo(&["build", "--release", "-p", "tracer"])?;
    let bin = util::workspace_root().join("target/release/tracer");
    util::exec(&bin, args)
}
