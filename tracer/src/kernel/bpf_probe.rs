//! The smallest proof that the bpf() syscall works for this process, without loading programs.
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
