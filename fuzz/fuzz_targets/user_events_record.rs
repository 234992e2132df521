//! user_events record decoding on arbitrary bytes and field offsets: never a panic, and every
//! parsed record resolves and decodes (to fields or a reported error).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::decode::nettrace::{DecodedEvent, EventContext, MetadataLimits};
use tracer::decode::user_events::{MetadataCache, RecordLayout, parse_record};

fuzz_target!(|input: &[u8]| {
    let Some((offsets, record)) = input.split_first_chunk::<4>() else { return };
    let layout = RecordLayout {
        version: offsets[0].into(),
        event_id: offsets[1].into(),
        extension: offsets[2].into(),
        payload: offsets[3].into(),
    };
    let provider = "Microsoft-Windows-DotNETRuntime";
    let Ok(mut parsed) = parse_record(&layout, record, provider, &MetadataLimits::default()) else {
        return;
    };
    // The payload is a slice of the record itself.
    let (bounds, payload) = (record.as_ptr_range(), parsed.payload.as_ptr_range());
    assert!(bounds.start <= payload.start && payload.end <= bounds.end);
    let mut cache = MetadataCache::new(4);
    let meta = cache.resolve(1, "tp", provider, &mut parsed);
    // Whatever metadata the record carried, it describes the record's event.
    assert_eq!(meta.event_id, u32::from(parsed.event_id));
    let event = DecodedEvent::new(&meta, parsed.payload, 8, EventContext::default());
    serde_json::to_string(&event).unwrap();
});
