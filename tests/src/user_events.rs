//! Raw user_events ABI (include/uapi/linux/user_events.h) for tests that exercise the kernel
//! directly, and the guard every `vm_*` test starts with.
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;

/// `_IOWR('*', 0, struct user_reg *)` on 64-bit.
pub const DIAG_IOCSREG: libc::c_ulong = 0xC008_2A00;
/// `_IOW('*', 1, char *)` on 64-bit.
pub const DIAG_IOCSDEL: libc::c_ulong = 0x4008_2A01;
/// `_IOW('*', 2, struct user_unreg *)` on 64-bit.
pub const DIAG_IOCSUNREG: libc::c_ulong = 0x4008_2A02;

pub use tracer_common::{UserReg, UserUnreg};

/// The tracefs mount that has `user_events_data`, if any.
fn user_events_tracefs() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").expect("reading /proc/mounts");
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_, mount_point, fs_type) = (fields.next(), fields.next()?, fields.next()?);
            (fs_type == "tracefs").then(|| PathBuf::from(mount_point))
        })
        .find(|dir| dir.join("user_events_data").exists())
}

/// The tracefs mount of a kernel with CONFIG_USER_EVENTS. Panics (so the test FAILS, never
/// skips) with what to do when the running kernel has no user_events, as on the host.
pub fn tracefs_with_user_events() -> PathBuf {
    user_events_tracefs().unwrap_or_else(|| {
        panic!(
            "this kernel ({}) has no user_events (no tracefs mount with user_events_data): \
             vm_* tests need the test kernel, run them with `cargo xtask vm-test`",
            std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()
        )
    })
}

/// Whether the running kernel has user_events (tracer attaches its ioctl hooks only then).
pub fn kernel_has_user_events() -> bool {
    user_events_tracefs().is_some()
}

/// Opens `user_events_data` read-write.
pub fn open_data(tracefs: &std::path::Path) -> File {
    let path = tracefs.join("user_events_data");
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

/// `DIAG_IOCSUNREG` of (`addr`, `bit`) on `fd`: Ok(()) or the errno.
pub fn unregister(fd: &File, addr: u64, bit: u8) -> Result<(), i32> {
    let mut unreg = UserUnreg {
        size: size_of::<UserUnreg>() as u32,
        disable_bit: bit,
        disable_addr: addr,
        ..Default::default()
    };
    // SAFETY: the argument points at a live, correctly sized user_unreg.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), DIAG_IOCSUNREG, &mut unreg) };
    if ret == 0 { Ok(()) } else { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) }
}
