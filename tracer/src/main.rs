use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use clap::Parser as _;
use tracer::cli::Cli;
use tracer_decode::text::escape_control;

fn main() -> ExitCode {
    tracer::kernel::return_freed_memory();
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
            // Log lines carry strings from other processes (paths, versions, errors): escaped,
            // so a peer can neither drive the terminal nor start a line of its own.
            let message = record.args().to_string();
            writeln!(buf, "[{ts} {level:<5} {target}] {}", escape_control(&message))
        })
        .init();
    cli.command.execute()
}
