//! One pipeline per subcommand: detection → sessions → decode → output, in one direction. Each
//! takes its configuration, a sink, a stop future and an optional ready sender, and returns its
//! summary: `audit::run`, `run::run`, `ftrace::run` (`check` only reads the machine; `top::run`
//! shows what it gathers).
pub mod admission;
pub mod audit;
pub mod check;
pub mod convert;
pub mod ftrace;
pub mod kernel_events;
pub mod profile;
pub mod ps;
pub mod run;
pub mod top;

use crate::kernel::procfs::{Scan, process_identity};
use crate::output::{self, FieldMap, Line};
use crate::time::Clock;

/// Sends the ready signal, if a caller asked for one (tests, embedders).
fn signal_ready(ready: Option<tokio::sync::oneshot::Sender<()>>) {
    if let Some(ready) = ready {
        let _ = ready.send(());
    }
}

/// The start-up scan's detections (mappings, then listening sockets) as `procfs` lines, each
/// with its process's pid and real uid (0 when unreadable).
fn scan_lines(scan: &Scan, clock: &Clock) -> Vec<(u32, u32, Line<FieldMap>)> {
    let identified = |pid: u32| {
        let id = process_identity(pid);
        (id.as_ref().map_or(0, |id| id.uid), id)
    };
    let mappings = scan.mappings.iter().map(|m| {
        let (uid, id) = identified(m.pid);
        (m.pid, uid, output::procfs_mapping_line(m, clock, id))
    });
    let sockets = scan.sockets.iter().map(|f| {
        let (uid, id) = identified(f.pid);
        (f.pid, uid, output::procfs_socket_line(f.pid, &f.socket, clock, id))
    });
    mappings.chain(sockets).collect()
}
