//! Sample ring records (the sampling programs' `SAMPLES`) are untrusted bytes: decoding any input
//! must return a sample or a typed error, never panic or read out of bounds; a decoded sample is
//! exactly one record with consistent fields: a CPU sample exactly its header and the frames it
//! says it has, an off-CPU stretch exactly one fixed-size record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_common::sampling::{CPU_SAMPLE_HEADER_BYTES, STACK_DEPTH};
use tracer_decode::profile_sample::{self, OFF_CPU_RECORD_LEN, ProfileSample, Stack};

fn check_errno<T>(stack: &Stack<T>) {
    if let Stack::Failed(errno) = stack {
        assert!((1..=4095).contains(errno), "errno {errno}");
    }
}

fn frames(stack: &Stack<Vec<u64>>) -> usize {
    check_errno(stack);
    match stack {
        Stack::Taken(frames) => {
            assert!(frames.len() <= STACK_DEPTH, "{} frames", frames.len());
            frames.len()
        }
        Stack::None | Stack::Failed(_) => 0,
    }
}

fuzz_target!(|data: &[u8]| {
    match profile_sample::decode(data) {
        Ok(ProfileSample::Cpu(sample)) => {
            let frames = frames(&sample.user_stack) + frames(&sample.kernel_stack);
            assert_eq!(data.len(), CPU_SAMPLE_HEADER_BYTES + 8 * frames, "{sample:?}");
            assert_ne!(sample.tid, 0, "{sample:?}");
        }
        Ok(ProfileSample::OffCpu(sample)) => {
            assert_eq!(data.len(), OFF_CPU_RECORD_LEN);
            assert_ne!(sample.tid, 0, "{sample:?}");
            check_errno(&sample.user_stack);
            check_errno(&sample.kernel_stack);
        }
        Err(_) => {}
    }
});
