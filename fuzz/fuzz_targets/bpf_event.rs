//! BPF ring-buffer records are untrusted bytes: decoding any input must return a value or a
//! typed error, never panic or read out of bounds; a decoded event must render as output.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::decode::bpf_event;
use tracer::pipeline::audit::event_line;
use tracer::sink::Clock;

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = bpf_event::decode(data) {
        let line = event_line(&event, &Clock::with_offset(0), None);
        serde_json::to_string(&line).expect("an event line always serialises");
    }
});
