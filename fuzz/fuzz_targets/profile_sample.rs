//! Sample ring records (the sampling programs' `SAMPLES`) are untrusted bytes: decoding any input
//! must return a sample or a typed error, never panic or read out of bounds; a decoded sample is
//! exactly one record with consistent fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_common::sampling::SampleKind;
use tracer_decode::profile_sample::{self, SAMPLE_RECORD_LEN, StackRef};

fuzz_target!(|data: &[u8]| {
    if let Ok(sample) = profile_sample::decode(data) {
        assert_eq!(data.len(), SAMPLE_RECORD_LEN);
        assert!(sample.kind == SampleKind::OffCpu || sample.weight == 1, "{sample:?}");
        assert_ne!(sample.tid, 0, "{sample:?}");
        for stack in [sample.user_stack, sample.kernel_stack] {
            if let StackRef::Failed(errno) = stack {
                assert!((1..=4095).contains(&errno), "{sample:?}");
            }
        }
    }
});
