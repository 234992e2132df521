//! Exports of the output lines to other systems: `--otlp-endpoint` ([`otlp`]).
pub mod otlp;
