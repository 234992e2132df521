//! One pipeline per subcommand: detection → sessions → decode → sinks, in one direction.
pub mod check;
pub mod ftrace;

use std::time::Duration;

/// Why a pipeline stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Duration,
}

/// Resolves on SIGINT, SIGTERM, or after `duration`.
pub async fn stop_requested(duration: Option<Duration>) -> anyhow::Result<StopReason> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let timer = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    Ok(tokio::select! {
        _ = int.recv() => StopReason::Signal,
        _ = term.recv() => StopReason::Signal,
        _ = timer => StopReason::Duration,
    })
}
