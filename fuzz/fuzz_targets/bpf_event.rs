//! BPF ring-buffer records and the task iterator's output are untrusted bytes: decoding any
//! input must return a value or a typed error, never panic or read out of bounds; captured
//! strings end at their NUL.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::bpf_event;

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = bpf_event::decode(data) {
        assert!(!event.meta.comm.contains('\0'), "{event:?}");
        // Exactly one record, of its kind's size.
        assert_eq!(data.len(), bpf_event::wire_size(event.meta.kind));
    }
    if let Ok(found) = bpf_event::decode_enablers(data) {
        let records = found.enablers.len() + found.truncated.len();
        assert_eq!(records * bpf_event::ENABLER_RECORD_LEN, data.len());
        for e in &found.enablers {
            assert!(e.enable_bit < 64 && matches!(e.enable_size, 4 | 8), "{e:?}");
        }
    }
});
