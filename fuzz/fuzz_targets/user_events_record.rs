//! user_events record decoding on arbitrary bytes and field offsets: never a panic, every
//! parsed record resolves and decodes (to fields or a reported error) and is written as JSON
//! byte for byte as serde_json writes it (the reference of tracer's direct writer), and the JSON
//! of one record stays within what its bytes pay for (tracer-decode/src/budget.rs): the payload
//! decoder's charge bound and the session's `OutputBudget` (output ≤ 64 × record bytes +
//! allowance).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::budget::{OUTPUT_ALLOWANCE_BYTES, OUTPUT_BYTES_PER_INPUT_BYTE, OutputBudget};
use tracer_decode::nettrace::payload::cost_budget;
use tracer_decode::nettrace::{EventContext, MetadataLimits, OutputEvent};
use tracer_decode::user_events::{MetadataCache, RecordLayout, parse_record};

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
    let event = OutputEvent {
        metadata: &meta,
        payload: parsed.payload,
        pointer_size: 8,
        stack: None,
        rendered_fields: None,
        context: EventContext::default(),
    };
    // Decoded straight into JSON: the same bytes as serde_json over the fields tree.
    let mut written = Vec::new();
    event.write_json(&mut written);
    let json = serde_json::to_string(&event.decode()).unwrap();
    assert_eq!(String::from_utf8(written).unwrap(), json);
    // The metadata came in this record: its names are paid by the record's bytes.
    let field_name = 6 * 3 * MetadataLimits::default().max_name_units;
    let bound = 6 * (meta.provider.len() + meta.event_name.len() + 16)
        + (9 * cost_budget(parsed.payload.len())).max(2 * parsed.payload.len() + field_name + 256)
        + 512;
    assert!(json.len() <= bound, "{} > {bound}: {json}", json.len());
    let mut budget = OutputBudget::default();
    budget.earn(record.len() as u64);
    if budget.spend(json.len() as u64).is_ok() {
        assert!(
            budget.output()
                <= OUTPUT_BYTES_PER_INPUT_BYTE * record.len() as u64 + OUTPUT_ALLOWANCE_BYTES
        );
    }
});
