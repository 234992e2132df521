//! One pipeline per subcommand: detection → sessions → decode → output, in one direction. Each
//! takes its configuration, a sink, a stop future and an optional ready sender, and returns its
//! summary: `audit::run`, `run::run`, `ftrace::run` (`check` only reads the machine).
pub mod admission;
pub mod audit;
pub mod check;
pub mod ftrace;
pub mod run;

/// Sends the ready signal, if a caller asked for one (tests, embedders).
fn signal_ready(ready: Option<tokio::sync::oneshot::Sender<()>>) {
    if let Some(ready) = ready {
        let _ = ready.send(());
    }
}
