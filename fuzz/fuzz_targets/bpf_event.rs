//! BPF ring-buffer records are untrusted bytes: decoding any input must return a value or a
//! typed error, never panic or read out of bounds; a decoded event must render as output.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::decode::bpf_event;
use tracer::pipeline::audit::event_line;
use tracer::sink::Clock;

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = bpf_event::decode(data) {
        // Exactly one record, of its kind's size.
        assert_eq!(data.len(), bpf_event::wire_size(event.meta.kind));
        let line = event_line(&event, &Clock::with_offset(0), None);
        let json = serde_json::to_value(&line).expect("an event line always serialises");
        // The line reports the record's own header.
        assert_eq!(json["kind"], bpf_event::kind_name(event.meta.kind));
        assert_eq!(json["pid"], event.meta.pid);
        assert_eq!(json["seq"], event.meta.seq);
    }
});
