//! What both objects' programs use: the detection programs (`programs.rs`) and the sampling
//! programs (`sampler/programs.rs`) are two binaries, so each includes this module.
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{helpers::bpf_probe_read_kernel, maps::RingBuf};

/// `bpf_ringbuf_submit` flags and the `bpf_ringbuf_query` selector of the bytes waiting.
pub const BPF_RB_NO_WAKEUP: u64 = 1;
pub const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// Submit flags of a record that need not reach user space at once: no wake-up — user space
/// drains the ring on a timer too — unless `wake_at_bytes` are waiting, then a forced one, so a
/// burst wakes the reader long before the ring is full. (Without a flag the kernel wakes the
/// reader only when the record is the first unread one: never behind lazy records;
/// docs/protocol/bpf-detection.md "Wake-ups".)
#[inline(always)]
pub fn lazy_wakeup(ring: &RingBuf, wake_at_bytes: u64) -> u64 {
    if ring.query(BPF_RB_AVAIL_DATA) >= wake_at_bytes {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Adds `delta` (wrapping) to a u64 that other CPUs, or interleaved runs on this one, update
/// too.
///
/// # Safety
/// `ptr` is a map value (a valid, 8-byte aligned u64) for the program's run.
#[inline(always)]
pub unsafe fn atomic_add(ptr: *mut u64, delta: u64) {
    // SAFETY: the caller's contract.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(ptr, delta) };
}

/// Reads a plain value of kernel memory at `base + offset`.
#[inline(always)]
pub fn kernel_value_at<T: Copy>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: the helper reads kernel memory without faulting; a bad address is an error.
    unsafe { bpf_probe_read_kernel(base.add(offset as usize).cast::<T>()) }.ok()
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
