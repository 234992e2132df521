#![no_std]
// The programs live in main.rs (the `tracer` binary of this crate); this stub lets the crate
// take part in workspace-wide commands such as `cargo metadata`.
