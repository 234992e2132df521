//! What each pipeline counted while it ran: the numbers of its stderr summary, its `summary`
//! line and its metrics. Below both the pipelines that fill them and the metrics that publish
//! them, so neither has to reach into the other.
pub mod audit;
pub mod ftrace;
pub mod run;

pub use self::audit::AuditSummary;
pub use self::ftrace::FtraceSummary;
pub use self::run::RunSummary;
