//! `tracer top`'s pieces (the pipeline that feeds them is `pipeline::top`; docs/top.md): the
//! model of each process and the list's order ([`model`]), the methods its CPU samples are in
//! ([`hot`]), what `/proc` says of it ([`procstat`]), the screen and its keys ([`view`]), and
//! the terminal, taken and given back ([`terminal`]).
pub mod hot;
pub mod model;
pub mod procstat;
pub mod terminal;
pub mod view;
