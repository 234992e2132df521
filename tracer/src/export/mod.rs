//! Exports to other systems (`--otlp-endpoint`): the output lines as log records ([`otlp`]),
//! the runtime metrics ([`otlp_metrics`]), each process's resource ([`resource`]).
pub mod otlp;
pub mod otlp_metrics;
pub mod resource;
