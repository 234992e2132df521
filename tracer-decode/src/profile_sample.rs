//! Decoder for the records the sampling programs put on the `SAMPLES` BPF ring buffer
//! ([`SampleRecord`], docs/protocol/profiling.md "Sampling in the kernel"). The bytes are
//! untrusted: the length is checked before any read, the read is an unaligned copy, and every
//! field that can be inconsistent is checked, with a typed error naming its byte offset.
use std::mem::{offset_of, size_of};

use thiserror::Error;
use tracer_common::sampling::{NO_STACK, SampleKind, SampleRecord};

/// The size of every record.
pub const SAMPLE_RECORD_LEN: usize = size_of::<SampleRecord>();

/// The most negative errno (`-MAX_ERRNO`); a negative stack id below it is no errno.
const MIN_ERRNO: i32 = -4095;

/// One of a sample's two stacks, as the program left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StackRef {
    /// There was none to take: the kernel stack of a sample taken in user mode, the user stack
    /// of a kernel thread or an exiting one.
    None,
    /// Its id in the stack map of the record's epoch.
    Id(u32),
    /// `bpf_get_stackid` failed with this errno (positive): `EEXIST`, the bucket held another
    /// stack; `EFAULT`, no stack could be taken; `ENOMEM`, no free entry.
    Failed(i32),
}

/// A decoded [`SampleRecord`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileSample {
    pub kind: SampleKind,
    pub cpu: u32,
    /// CLOCK_MONOTONIC nanoseconds the stacks were taken at.
    pub time_ns: u64,
    /// 1 for a CPU sample; the nanoseconds of an off-CPU stretch.
    pub weight: u64,
    pub tgid: u32,
    pub tid: u32,
    pub user_stack: StackRef,
    pub kernel_stack: StackRef,
    /// The stack epoch the ids belong to.
    pub stack_epoch: u32,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SampleDecodeError {
    #[error("sample record has {len} bytes, expected {SAMPLE_RECORD_LEN}")]
    WrongLength { len: usize },
    #[error("unknown sample kind {value} at byte {offset}")]
    UnknownKind { value: u32, offset: usize },
    #[error("CPU sample with weight {weight} at byte {offset}, expected 1")]
    CpuWeight { weight: u64, offset: usize },
    #[error("sample of thread 0 (the idle task) at byte {offset}")]
    IdleThread { offset: usize },
    #[error("{which} stack id {value} at byte {offset} is neither an id nor an errno")]
    BadStackId { which: &'static str, value: i32, offset: usize },
}

/// Decodes one ring record.
pub fn decode(bytes: &[u8]) -> Result<ProfileSample, SampleDecodeError> {
    if bytes.len() != SAMPLE_RECORD_LEN {
        return Err(SampleDecodeError::WrongLength { len: bytes.len() });
    }
    // SAFETY: the length is checked above; `SampleRecord` is `#[repr(C)]` integers only, so
    // every bit pattern is a value; the read is unaligned.
    let record = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<SampleRecord>()) };
    let kind = SampleKind::from_u32(record.kind).ok_or(SampleDecodeError::UnknownKind {
        value: record.kind,
        offset: offset_of!(SampleRecord, kind),
    })?;
    if kind == SampleKind::Cpu && record.weight != 1 {
        return Err(SampleDecodeError::CpuWeight {
            weight: record.weight,
            offset: offset_of!(SampleRecord, weight),
        });
    }
    if record.tid == 0 {
        return Err(SampleDecodeError::IdleThread { offset: offset_of!(SampleRecord, tid) });
    }
    Ok(ProfileSample {
        kind,
        cpu: record.cpu,
        time_ns: record.time_ns,
        weight: record.weight,
        tgid: record.tgid,
        tid: record.tid,
        user_stack: stack_ref(
            "user",
            record.user_stack_id,
            offset_of!(SampleRecord, user_stack_id),
        )?,
        kernel_stack: stack_ref(
            "kernel",
            record.kernel_stack_id,
            offset_of!(SampleRecord, kernel_stack_id),
        )?,
        stack_epoch: record.stack_epoch,
    })
}

fn stack_ref(
    which: &'static str,
    value: i32,
    offset: usize,
) -> Result<StackRef, SampleDecodeError> {
    match value {
        NO_STACK => Ok(StackRef::None),
        0.. => Ok(StackRef::Id(value as u32)),
        MIN_ERRNO..0 => Ok(StackRef::Failed(-value)),
        _ => Err(SampleDecodeError::BadStackId { which, value, offset }),
    }
}

/// The wire bytes of `record` (what the programs write): for tests and fuzz seeds.
pub fn encode(record: &SampleRecord) -> [u8; SAMPLE_RECORD_LEN] {
    // SAFETY: `SampleRecord` is `#[repr(C)]` with explicit padding, integers only: all of its
    // bytes are initialized.
    unsafe { std::mem::transmute_copy(record) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_record() -> SampleRecord {
        SampleRecord {
            kind: SampleKind::Cpu as u32,
            cpu: 1,
            time_ns: 123_456_789,
            weight: 1,
            tgid: 4242,
            tid: 4243,
            user_stack_id: 17,
            kernel_stack_id: NO_STACK,
            stack_epoch: 3,
            _pad: 0,
        }
    }

    #[test]
    fn a_cpu_sample_decodes_field_by_field() {
        let sample = decode(&encode(&cpu_record())).unwrap();
        assert_eq!(
            sample,
            ProfileSample {
                kind: SampleKind::Cpu,
                cpu: 1,
                time_ns: 123_456_789,
                weight: 1,
                tgid: 4242,
                tid: 4243,
                user_stack: StackRef::Id(17),
                kernel_stack: StackRef::None,
                stack_epoch: 3,
            }
        );
    }

    #[test]
    fn an_off_cpu_stretch_keeps_its_weight_and_stack_errors() {
        let record = SampleRecord {
            kind: SampleKind::OffCpu as u32,
            weight: 50_000_000,
            user_stack_id: -17,
            kernel_stack_id: -14,
            ..cpu_record()
        };
        let sample = decode(&encode(&record)).unwrap();
        assert_eq!(sample.kind, SampleKind::OffCpu);
        assert_eq!(sample.weight, 50_000_000);
        assert_eq!(
            (sample.user_stack, sample.kernel_stack),
            (StackRef::Failed(17), StackRef::Failed(14))
        );
    }

    #[test]
    fn inconsistent_records_are_typed_errors_at_their_offsets() {
        let bytes = encode(&cpu_record());
        assert_eq!(decode(&bytes[..47]), Err(SampleDecodeError::WrongLength { len: 47 }));
        assert_eq!(
            decode(&[bytes.as_slice(), &[0]].concat()),
            Err(SampleDecodeError::WrongLength { len: 49 })
        );
        let bad = |record: SampleRecord| decode(&encode(&record)).unwrap_err();
        assert_eq!(
            bad(SampleRecord { kind: 3, ..cpu_record() }),
            SampleDecodeError::UnknownKind { value: 3, offset: 0 }
        );
        assert_eq!(
            bad(SampleRecord { weight: 2, ..cpu_record() }),
            SampleDecodeError::CpuWeight { weight: 2, offset: 16 }
        );
        assert_eq!(
            bad(SampleRecord { tid: 0, ..cpu_record() }),
            SampleDecodeError::IdleThread { offset: 28 }
        );
        assert_eq!(
            bad(SampleRecord { kernel_stack_id: -4096, ..cpu_record() }),
            SampleDecodeError::BadStackId { which: "kernel", value: -4096, offset: 36 }
        );
        assert_eq!(
            bad(SampleRecord { user_stack_id: i32::MIN + 1, ..cpu_record() }),
            SampleDecodeError::BadStackId { which: "user", value: i32::MIN + 1, offset: 32 }
        );
    }
}
