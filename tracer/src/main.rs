use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Linux observability for .NET diagnostics and user_events, from the kernel up.
///
/// tracer detects, inside the kernel (eBPF on syscall tracepoints), .NET processes whose
/// diagnostic IPC is ready and processes registering Linux user_events; it starts .NET tracing
/// sessions and reads kernel trace data from the memory-mapped ftrace ring buffer.
/// Needs root (or CAP_BPF + CAP_PERFMON + tracefs access); `tracer check` tells what is missing.
#[derive(Parser)]
#[command(name = "tracer", version, propagate_version = true)]
struct Cli {
    /// Log verbosity for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "info", env = "TRACER_LOG")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Audit(tracer::pipeline::audit::AuditArgs),
    Run(tracer::pipeline::run::RunArgs),
    Ftrace(tracer::pipeline::ftrace::FtraceArgs),
    Check(tracer::pipeline::check::CheckArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // On a terminal, `tracer run` keeps a live status on the current stderr line: a log line
    // clears it first so it stands alone (the status is redrawn on its next tick).
    let clear_line = std::io::stderr().is_terminal();
    env_logger::Builder::new()
        .parse_filters(&cli.log_level)
        .format(move |buf, record| {
            if clear_line {
                write!(buf, "\r\x1b[2K")?;
            }
            let (ts, level, target) = (buf.timestamp_millis(), record.level(), record.target());
            writeln!(buf, "[{ts} {level:<5} {target}] {}", record.args())
        })
        .init();
    match cli.command {
        Command::Audit(args) => tracer::pipeline::audit::main(args),
        Command::Run(args) => tracer::pipeline::run::main(args),
        Command::Ftrace(args) => tracer::pipeline::ftrace::main(args),
        Command::Check(args) => tracer::pipeline::check::main(args),
    }
}
