//! BPF ring-buffer records are untrusted bytes: decoding any input must return a value or a
//! typed error, never panic or read out of bounds; captured strings end at their NUL.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::bpf_event;

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = bpf_event::decode(data) {
        assert!(!event.meta.comm.contains('\0'), "{event:?}");
        // Exactly one record, of its kind's size.
        assert_eq!(data.len(), bpf_event::wire_size(event.meta.kind));
    }
});
