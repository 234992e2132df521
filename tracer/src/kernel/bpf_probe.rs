//! The smallest proofs that the system calls tracer's programs need work for this process,
//! without loading programs: a BPF map created, and whether `bpf` and `perf_event_open` reach
//! the kernel at all (a seccomp filter answers before the kernel looks at the arguments).
use std::io;

/// Creates (and closes) a one-entry BPF array map.
pub fn create_array_map() -> io::Result<()> {
    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries, rest zero.
    let mut attr = [0u32; 32];
    attr[..4].copy_from_slice(&[2 /* BPF_MAP_TYPE_ARRAY */, 4, 4, 1]);
    // SAFETY: attr is a valid, zero-padded bpf_attr of the size passed.
    let fd = unsafe {
        libc::syscall(libc::SYS_bpf, 0 /* BPF_MAP_CREATE */, attr.as_ptr(), size_of_val(&attr))
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: closing the fd just returned by the kernel.
    unsafe { libc::close(fd as i32) };
    Ok(())
}

/// A system call made with arguments the kernel itself refuses with a known error: that error
/// means the call reached the kernel; any other answer came from in front of it (a seccomp
/// filter answers with the error its profile names, EPERM or ENOSYS).
#[derive(Debug)]
pub struct Reach {
    pub syscall: &'static str,
    /// The kernel's own answer to these arguments.
    pub kernel_answer: i32,
    pub answer: io::Error,
}

impl Reach {
    pub fn reached_kernel(&self) -> bool {
        self.answer.raw_os_error() == Some(self.kernel_answer)
    }
}

/// A `bpf` command no kernel has: the kernel answers EINVAL once it looks at the command.
const UNKNOWN_BPF_COMMAND: libc::c_long = i32::MAX as libc::c_long;

/// `bpf` with an unknown command and no attributes.
pub fn bpf_reach() -> Reach {
    // SAFETY: a zero-sized attribute is never read; the command does nothing.
    let ret = unsafe {
        libc::syscall(libc::SYS_bpf, UNKNOWN_BPF_COMMAND, std::ptr::null::<u8>(), 0usize)
    };
    reach("bpf", libc::EINVAL, ret)
}

/// `perf_event_open` without an attribute: the kernel answers EFAULT reading its size.
pub fn perf_event_open_reach() -> Reach {
    // SAFETY: the kernel reads the attribute through copy_from_user, which fails on NULL; no
    // event is opened.
    let ret =
        unsafe { libc::syscall(libc::SYS_perf_event_open, std::ptr::null::<u8>(), 0, -1, -1, 0) };
    reach("perf_event_open", libc::EFAULT, ret)
}

fn reach(syscall: &'static str, kernel_answer: i32, ret: libc::c_long) -> Reach {
    let answer = if ret < 0 {
        io::Error::last_os_error()
    } else {
        // SAFETY: a descriptor the kernel should never have returned for these arguments;
        // closed so it does not leak.
        unsafe { libc::close(ret as i32) };
        io::Error::other(format!("{syscall} returned {ret}"))
    };
    Reach { syscall, kernel_answer, answer }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_the_kernel_s_only_when_it_is_its_error() {
        let kernel = Reach {
            syscall: "bpf",
            kernel_answer: libc::EINVAL,
            answer: io::Error::from_raw_os_error(libc::EINVAL),
        };
        assert!(kernel.reached_kernel());
        let filtered = Reach { answer: io::Error::from_raw_os_error(libc::EPERM), ..kernel };
        assert!(!filtered.reached_kernel());
    }
}
