//! Decoder for the records the sampling programs put on the `SAMPLES` BPF ring buffer
//! (docs/protocol/profiling.md "Sampling in the kernel"): a CPU sample ([`CpuSampleHeader`]
//! followed by its stacks' frames) or an off-CPU stretch ([`OffCpuRecord`], stack ids), told
//! apart by their first field, the kind. The bytes are untrusted: every length is checked before
//! any read, the fixed parts are read with unaligned copies, and every field that can be
//! inconsistent is checked, with a typed error naming its byte offset.
use std::mem::{offset_of, size_of};

use thiserror::Error;
use tracer_common::sampling::{
    CPU_SAMPLE_HEADER_BYTES, CpuSampleHeader, NO_STACK, OffCpuRecord, STACK_BYTES, SampleKind,
};

/// The size of every off-CPU record.
pub const OFF_CPU_RECORD_LEN: usize = size_of::<OffCpuRecord>();

/// The most negative errno (`-MAX_ERRNO`); a negative stack field below it is no errno.
const MIN_ERRNO: i32 = -4095;

/// Bytes of one frame: a u64 address.
const FRAME_BYTES: usize = size_of::<u64>();

/// One of a sample's two stacks, as the program left it: `T` is its id in a stack map
/// (off-CPU) or its frames (CPU).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stack<T> {
    /// There was none to take: the kernel stack of a sample taken in user mode, the user stack
    /// of a kernel thread or an exiting one.
    None,
    Taken(T),
    /// The helper failed with this errno (positive): `EFAULT`, no stack could be taken;
    /// off-CPU also `EEXIST`, the bucket held another stack, and `ENOMEM`, no free entry.
    Failed(i32),
}

/// A decoded CPU sample: weight 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuSample {
    pub cpu: u32,
    /// CLOCK_MONOTONIC nanoseconds of the tick.
    pub time_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// Addresses, innermost first.
    pub user_stack: Stack<Vec<u64>>,
    pub kernel_stack: Stack<Vec<u64>>,
}

/// A decoded [`OffCpuRecord`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffCpuSample {
    pub cpu: u32,
    /// CLOCK_MONOTONIC nanoseconds the thread switched out at.
    pub time_ns: u64,
    /// The stretch's nanoseconds.
    pub weight: u64,
    pub tgid: u32,
    pub tid: u32,
    /// Stack ids in the stack map of `stack_epoch`.
    pub user_stack: Stack<u32>,
    pub kernel_stack: Stack<u32>,
    pub stack_epoch: u32,
}

/// One record of the sample ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProfileSample {
    Cpu(CpuSample),
    OffCpu(OffCpuSample),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SampleDecodeError {
    #[error("sample record has {len} bytes, too few for its kind")]
    NoKind { len: usize },
    #[error("unknown sample kind {value} at byte {offset}")]
    UnknownKind { value: u32, offset: usize },
    #[error("{kind:?} sample record has {len} bytes, expected {expected}")]
    WrongLength { kind: SampleKind, len: usize, expected: usize },
    #[error("sample of thread 0 (the idle task) at byte {offset}")]
    IdleThread { offset: usize },
    #[error("{which} stack id {value} at byte {offset} is neither an id nor an errno")]
    BadStackId { which: &'static str, value: i32, offset: usize },
    #[error(
        "{which} stack length {value} at byte {offset} is neither whole frames up to \
         {STACK_BYTES} bytes nor an errno"
    )]
    BadStackLength { which: &'static str, value: i32, offset: usize },
}

/// Decodes one ring record.
pub fn decode(bytes: &[u8]) -> Result<ProfileSample, SampleDecodeError> {
    let Some(kind) = bytes.first_chunk::<4>() else {
        return Err(SampleDecodeError::NoKind { len: bytes.len() });
    };
    // Both layouts start with the kind.
    const _: () = assert!(offset_of!(CpuSampleHeader, kind) == offset_of!(OffCpuRecord, kind));
    let value = u32::from_ne_bytes(*kind);
    match SampleKind::from_u32(value) {
        Some(SampleKind::Cpu) => decode_cpu(bytes).map(ProfileSample::Cpu),
        Some(SampleKind::OffCpu) => decode_off_cpu(bytes).map(ProfileSample::OffCpu),
        None => Err(SampleDecodeError::UnknownKind { value, offset: 0 }),
    }
}

fn decode_cpu(bytes: &[u8]) -> Result<CpuSample, SampleDecodeError> {
    let wrong_length = |expected| SampleDecodeError::WrongLength {
        kind: SampleKind::Cpu,
        len: bytes.len(),
        expected,
    };
    if bytes.len() < CPU_SAMPLE_HEADER_BYTES {
        return Err(wrong_length(CPU_SAMPLE_HEADER_BYTES));
    }
    // SAFETY: the length is checked above; `CpuSampleHeader` is `#[repr(C)]` integers only, so
    // every bit pattern is a value; the read is unaligned.
    let header = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<CpuSampleHeader>()) };
    if header.tid == 0 {
        return Err(SampleDecodeError::IdleThread { offset: offset_of!(CpuSampleHeader, tid) });
    }
    let user = stack_length("user", header.user_stack, offset_of!(CpuSampleHeader, user_stack))?;
    let kernel =
        stack_length("kernel", header.kernel_stack, offset_of!(CpuSampleHeader, kernel_stack))?;
    let frame_bytes = |stack: &Stack<usize>| match stack {
        Stack::Taken(n) => *n,
        Stack::None | Stack::Failed(_) => 0,
    };
    let (user_bytes, kernel_bytes) = (frame_bytes(&user), frame_bytes(&kernel));
    let expected = CPU_SAMPLE_HEADER_BYTES + user_bytes + kernel_bytes;
    if bytes.len() != expected {
        return Err(wrong_length(expected));
    }
    let (user_frames, kernel_frames) = bytes[CPU_SAMPLE_HEADER_BYTES..].split_at(user_bytes);
    Ok(CpuSample {
        cpu: header.cpu,
        time_ns: header.time_ns,
        tgid: header.tgid,
        tid: header.tid,
        user_stack: with_frames(user, user_frames),
        kernel_stack: with_frames(kernel, kernel_frames),
    })
}

/// A CPU sample's stack field: the bytes of frames that follow, an errno, or none.
fn stack_length(
    which: &'static str,
    value: i32,
    offset: usize,
) -> Result<Stack<usize>, SampleDecodeError> {
    match value {
        NO_STACK => Ok(Stack::None),
        0.. if value as usize <= STACK_BYTES && (value as usize).is_multiple_of(FRAME_BYTES) => {
            Ok(Stack::Taken(value as usize))
        }
        MIN_ERRNO..0 => Ok(Stack::Failed(-value)),
        _ => Err(SampleDecodeError::BadStackLength { which, value, offset }),
    }
}

/// `stack` with the frames of `bytes` (whole frames, as long as it says).
fn with_frames(stack: Stack<usize>, bytes: &[u8]) -> Stack<Vec<u64>> {
    match stack {
        Stack::None => Stack::None,
        Stack::Failed(errno) => Stack::Failed(errno),
        Stack::Taken(_) => Stack::Taken(
            bytes
                .chunks_exact(FRAME_BYTES)
                .map(|frame| u64::from_ne_bytes(frame.try_into().expect("8-byte chunks")))
                .collect(),
        ),
    }
}

fn decode_off_cpu(bytes: &[u8]) -> Result<OffCpuSample, SampleDecodeError> {
    if bytes.len() != OFF_CPU_RECORD_LEN {
        return Err(SampleDecodeError::WrongLength {
            kind: SampleKind::OffCpu,
            len: bytes.len(),
            expected: OFF_CPU_RECORD_LEN,
        });
    }
    // SAFETY: the length is checked above; `OffCpuRecord` is `#[repr(C)]` integers only, so
    // every bit pattern is a value; the read is unaligned.
    let record = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<OffCpuRecord>()) };
    if record.tid == 0 {
        return Err(SampleDecodeError::IdleThread { offset: offset_of!(OffCpuRecord, tid) });
    }
    Ok(OffCpuSample {
        cpu: record.cpu,
        time_ns: record.time_ns,
        weight: record.weight,
        tgid: record.tgid,
        tid: record.tid,
        user_stack: stack_id(
            "user",
            record.user_stack_id,
            offset_of!(OffCpuRecord, user_stack_id),
        )?,
        kernel_stack: stack_id(
            "kernel",
            record.kernel_stack_id,
            offset_of!(OffCpuRecord, kernel_stack_id),
        )?,
        stack_epoch: record.stack_epoch,
    })
}

fn stack_id(
    which: &'static str,
    value: i32,
    offset: usize,
) -> Result<Stack<u32>, SampleDecodeError> {
    match value {
        NO_STACK => Ok(Stack::None),
        0.. => Ok(Stack::Taken(value as u32)),
        MIN_ERRNO..0 => Ok(Stack::Failed(-value)),
        _ => Err(SampleDecodeError::BadStackId { which, value, offset }),
    }
}

/// The wire bytes of a CPU sample (what the program writes): `header`, then `frames` (the user
/// stack's, then the kernel stack's; their lengths are the header's to say). For tests and fuzz
/// seeds.
pub fn encode_cpu(header: &CpuSampleHeader, frames: &[u64]) -> Vec<u8> {
    // SAFETY: `CpuSampleHeader` is `#[repr(C)]` integers without padding: all of its bytes are
    // initialized.
    let fixed: [u8; CPU_SAMPLE_HEADER_BYTES] = unsafe { std::mem::transmute_copy(header) };
    let mut bytes = fixed.to_vec();
    bytes.extend(frames.iter().flat_map(|frame| frame.to_ne_bytes()));
    bytes
}

/// The wire bytes of `record` (what the program writes): for tests and fuzz seeds.
pub fn encode_off_cpu(record: &OffCpuRecord) -> [u8; OFF_CPU_RECORD_LEN] {
    // SAFETY: `OffCpuRecord` is `#[repr(C)]` with explicit padding, integers only: all of its
    // bytes are initialized.
    unsafe { std::mem::transmute_copy(record) }
}

#[cfg(test)]
mod tests {
    use tracer_common::sampling::{CPU_SAMPLE_MAX_BYTES, STACK_DEPTH};

    use super::*;

    const USER: [u64; 3] = [0x5555_0000_1234, 0x5555_0000_2000, 0x7f00_0000_0100];
    const KERNEL: [u64; 2] = [0xffff_ffff_8100_0010, 0xffff_ffff_8100_2020];

    /// A sample in the kernel with both stacks: USER, then KERNEL.
    fn cpu_header() -> CpuSampleHeader {
        CpuSampleHeader {
            kind: SampleKind::Cpu as u32,
            cpu: 1,
            time_ns: 123_456_789,
            tgid: 4242,
            tid: 4243,
            user_stack: (USER.len() * 8) as i32,
            kernel_stack: (KERNEL.len() * 8) as i32,
        }
    }

    fn both_stacks() -> Vec<u64> {
        [USER.as_slice(), &KERNEL].concat()
    }

    fn off_cpu_record() -> OffCpuRecord {
        OffCpuRecord {
            kind: SampleKind::OffCpu as u32,
            cpu: 1,
            time_ns: 123_456_789,
            weight: 50_000_000,
            tgid: 4242,
            tid: 4243,
            user_stack_id: 17,
            kernel_stack_id: -14,
            stack_epoch: 3,
            _pad: 0,
        }
    }

    #[test]
    fn a_cpu_sample_decodes_field_by_field_with_its_frames() {
        let bytes = encode_cpu(&cpu_header(), &both_stacks());
        assert_eq!(bytes.len(), 32 + 5 * 8);
        assert_eq!(
            decode(&bytes).unwrap(),
            ProfileSample::Cpu(CpuSample {
                cpu: 1,
                time_ns: 123_456_789,
                tgid: 4242,
                tid: 4243,
                user_stack: Stack::Taken(USER.to_vec()),
                kernel_stack: Stack::Taken(KERNEL.to_vec()),
            })
        );
    }

    #[test]
    fn a_cpu_sample_without_a_stack_or_with_an_error_has_no_frames_for_it() {
        let header = CpuSampleHeader { kernel_stack: NO_STACK, ..cpu_header() };
        let ProfileSample::Cpu(sample) = decode(&encode_cpu(&header, &USER)).unwrap() else {
            panic!("not a CPU sample")
        };
        assert_eq!(
            (sample.user_stack, sample.kernel_stack),
            (Stack::Taken(USER.to_vec()), Stack::None)
        );

        let header = CpuSampleHeader { user_stack: -14, ..cpu_header() };
        let ProfileSample::Cpu(sample) = decode(&encode_cpu(&header, &KERNEL)).unwrap() else {
            panic!("not a CPU sample")
        };
        assert_eq!(
            (sample.user_stack, sample.kernel_stack),
            (Stack::Failed(14), Stack::Taken(KERNEL.to_vec()))
        );

        // A stack taken with no frames is no error.
        let header = CpuSampleHeader { user_stack: 0, kernel_stack: NO_STACK, ..cpu_header() };
        let ProfileSample::Cpu(sample) = decode(&encode_cpu(&header, &[])).unwrap() else {
            panic!("not a CPU sample")
        };
        assert_eq!(sample.user_stack, Stack::Taken(Vec::new()));
    }

    #[test]
    fn the_longest_cpu_sample_fits_both_stacks_at_their_deepest() {
        let header = CpuSampleHeader {
            user_stack: STACK_BYTES as i32,
            kernel_stack: STACK_BYTES as i32,
            ..cpu_header()
        };
        let frames: Vec<u64> = (0..2 * STACK_DEPTH as u64).collect();
        let bytes = encode_cpu(&header, &frames);
        assert_eq!(bytes.len(), CPU_SAMPLE_MAX_BYTES);
        let ProfileSample::Cpu(sample) = decode(&bytes).unwrap() else {
            panic!("not a CPU sample")
        };
        assert_eq!(sample.user_stack, Stack::Taken(frames[..STACK_DEPTH].to_vec()));
        assert_eq!(sample.kernel_stack, Stack::Taken(frames[STACK_DEPTH..].to_vec()));
    }

    #[test]
    fn an_off_cpu_stretch_keeps_its_weight_ids_and_stack_errors() {
        assert_eq!(
            decode(&encode_off_cpu(&off_cpu_record())).unwrap(),
            ProfileSample::OffCpu(OffCpuSample {
                cpu: 1,
                time_ns: 123_456_789,
                weight: 50_000_000,
                tgid: 4242,
                tid: 4243,
                user_stack: Stack::Taken(17),
                kernel_stack: Stack::Failed(14),
                stack_epoch: 3,
            })
        );
    }

    #[test]
    fn inconsistent_cpu_samples_are_typed_errors_at_their_offsets() {
        let bytes = encode_cpu(&cpu_header(), &both_stacks());
        let wrong_length =
            |len, expected| SampleDecodeError::WrongLength { kind: SampleKind::Cpu, len, expected };
        assert_eq!(decode(&bytes[..3]), Err(SampleDecodeError::NoKind { len: 3 }));
        assert_eq!(decode(&bytes[..31]), Err(wrong_length(31, 32)));
        // A frame missing, or one too many.
        assert_eq!(decode(&bytes[..bytes.len() - 8]), Err(wrong_length(64, 72)));
        assert_eq!(decode(&[bytes.as_slice(), &[0; 8]].concat()), Err(wrong_length(80, 72)));
        let bad =
            |header: CpuSampleHeader| decode(&encode_cpu(&header, &both_stacks())).unwrap_err();
        assert_eq!(
            bad(CpuSampleHeader { tid: 0, ..cpu_header() }),
            SampleDecodeError::IdleThread { offset: 20 }
        );
        // Not whole frames, more than a stack holds, or below the errnos.
        for (value, which, offset) in [(12, "user", 24), (STACK_BYTES as i32 + 8, "kernel", 28)] {
            let header = match which {
                "user" => CpuSampleHeader { user_stack: value, ..cpu_header() },
                _ => CpuSampleHeader { kernel_stack: value, ..cpu_header() },
            };
            assert_eq!(bad(header), SampleDecodeError::BadStackLength { which, value, offset });
        }
        assert_eq!(
            bad(CpuSampleHeader { kernel_stack: -4096, ..cpu_header() }),
            SampleDecodeError::BadStackLength { which: "kernel", value: -4096, offset: 28 }
        );
    }

    #[test]
    fn inconsistent_off_cpu_records_are_typed_errors_at_their_offsets() {
        let bytes = encode_off_cpu(&off_cpu_record());
        let wrong_length =
            |len| SampleDecodeError::WrongLength { kind: SampleKind::OffCpu, len, expected: 48 };
        assert_eq!(decode(&bytes[..47]), Err(wrong_length(47)));
        assert_eq!(decode(&[bytes.as_slice(), &[0]].concat()), Err(wrong_length(49)));
        let bad = |record: OffCpuRecord| decode(&encode_off_cpu(&record)).unwrap_err();
        assert_eq!(
            bad(OffCpuRecord { kind: 3, ..off_cpu_record() }),
            SampleDecodeError::UnknownKind { value: 3, offset: 0 }
        );
        assert_eq!(
            bad(OffCpuRecord { tid: 0, ..off_cpu_record() }),
            SampleDecodeError::IdleThread { offset: 28 }
        );
        assert_eq!(
            bad(OffCpuRecord { kernel_stack_id: -4096, ..off_cpu_record() }),
            SampleDecodeError::BadStackId { which: "kernel", value: -4096, offset: 36 }
        );
        assert_eq!(
            bad(OffCpuRecord { user_stack_id: i32::MIN + 1, ..off_cpu_record() }),
            SampleDecodeError::BadStackId { which: "user", value: i32::MIN + 1, offset: 32 }
        );
    }
}
