//! One pipeline per subcommand: detection → sessions → decode → output, in one direction. Each
//! takes its configuration, a sink, a stop future and an optional ready sender, and returns its
//! summary: `audit::run`, `run::run`, `ftrace::run` (`check` only reads the machine).
pub mod audit;
pub mod check;
pub mod ftrace;
pub mod run;

use std::future::Future;
use std::time::Duration;

/// Why a pipeline was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Duration,
}

impl StopReason {
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Signal => "signal",
            StopReason::Duration => "duration",
        }
    }
}

/// Installs SIGINT/SIGTERM handlers now; the future resolves on either signal, or after
/// `duration`. Call inside a tokio runtime.
pub fn stop_requested(
    duration: Option<Duration>,
) -> anyhow::Result<impl Future<Output = StopReason> + Send> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        let timer = async {
            match duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = int.recv() => StopReason::Signal,
            _ = term.recv() => StopReason::Signal,
            _ = timer => StopReason::Duration,
        }
    })
}

/// Sends the ready signal, if a caller asked for one (tests, embedders).
fn signal_ready(ready: Option<tokio::sync::oneshot::Sender<()>>) {
    if let Some(ready) = ready {
        let _ = ready.send(());
    }
}
