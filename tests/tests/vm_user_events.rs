//! The user_events behaviour of the test kernel that tracer's user_events support relies on,
//! checked with raw syscalls: registration, enable bit, tracefs status, a record in a private
//! instance's trace, unregistration, and how registrations follow fork and exec.
//!
//! Runs inside the VM (`cargo xtask vm-test`); fails on a kernel without user_events.
use std::ffi::CStr;
use std::fs::{self, File};
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tests::user_events::{DIAG_IOCSREG, UserReg, open_data, tracefs_with_user_events, unregister};

const ENABLE_BIT: u8 = 31;
const ENABLED: u32 = 1 << ENABLE_BIT;

/// Registers `name_args` on `fd` with `enable` as the enable word (bit 31, 4 bytes).
fn register(fd: &File, name_args: &'static CStr, enable: &AtomicU32) -> Result<UserReg, i32> {
    register_raw(fd.as_raw_fd(), name_args, enable.as_ptr() as u64)
}

/// `register` on a raw fd and address; allocation-free, so a forked child may call it.
fn register_raw(fd: RawFd, name_args: &'static CStr, enable_addr: u64) -> Result<UserReg, i32> {
    let mut reg = UserReg {
        size: size_of::<UserReg>() as u32,
        enable_bit: ENABLE_BIT,
        enable_size: 4,
        flags: 0,
        enable_addr,
        name_args: name_args.as_ptr() as u64,
        write_index: u32::MAX,
    };
    // SAFETY: reg and the name outlive the call; the kernel checks enable_addr.
    let ret = unsafe { libc::ioctl(fd, DIAG_IOCSREG, &mut reg) };
    if ret == 0 { Ok(reg) } else { Err(errno()) }
}

/// A private tracefs instance, removed on drop.
struct Instance(PathBuf);

impl Instance {
    fn create(tracefs: &Path, name: &str) -> Self {
        let dir = tracefs.join("instances").join(name);
        if dir.exists() {
            fs::remove_dir(&dir).expect("removing a stale instance");
        }
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Self(dir)
    }

    fn set_enabled(&self, event: &str, on: bool) {
        let path = self.0.join("events/user_events").join(event).join("enable");
        fs::write(&path, if on { "1" } else { "0" })
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// The event lines of the instance's `trace` file (comment header dropped).
    fn trace_lines(&self) -> Vec<String> {
        let text = fs::read_to_string(self.0.join("trace")).expect("reading trace");
        text.lines().filter(|l| !l.starts_with('#')).map(str::to_owned).collect()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.0);
    }
}

fn status_line(tracefs: &Path, event: &str) -> Option<String> {
    let status = fs::read_to_string(tracefs.join("user_events_status")).expect("reading status");
    status.lines().find(|l| l.split(' ').next() == Some(event)).map(str::to_owned)
}

/// The kernel may update the enable word from a work item (after a fault), so wait for it.
fn wait_for_word(word: &AtomicU32, want: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = word.load(Ordering::SeqCst);
        if now == want || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

#[test]
fn register_enable_write_trace_and_unregister() {
    let tracefs = tracefs_with_user_events();
    let data = open_data(&tracefs);
    let enable = Box::new(AtomicU32::new(0));
    let addr = enable.as_ptr() as u64;

    let reg = register(&data, c"tracer_vm_smoke u32 a", &enable).expect("DIAG_IOCSREG");
    assert_eq!({ reg.write_index }, 0, "first event on a fresh fd");
    assert_eq!(enable.load(Ordering::SeqCst), 0, "no consumer yet");
    assert_eq!(status_line(&tracefs, "tracer_vm_smoke").as_deref(), Some("tracer_vm_smoke"));
    let format = fs::read_to_string(tracefs.join("events/user_events/tracer_vm_smoke/format"))
        .expect("the event has a format file");
    assert!(format.contains("\tfield:u32 a;\toffset:8;\tsize:4;\tsigned:0;"), "{format}");

    let record = [reg.write_index.to_ne_bytes(), 42u32.to_ne_bytes()].concat();
    // SAFETY: writing a live buffer.
    let written = unsafe { libc::write(data.as_raw_fd(), record.as_ptr().cast(), record.len()) };
    assert_eq!((written, errno()), (-1, libc::EBADF), "writing a disabled event");

    let instance = Instance::create(&tracefs, "vm_smoke");
    instance.set_enabled("tracer_vm_smoke", true);
    assert_eq!(wait_for_word(&enable, ENABLED), ENABLED, "enable bit 31 set by the kernel");
    assert_eq!(
        status_line(&tracefs, "tracer_vm_smoke").as_deref(),
        Some("tracer_vm_smoke # Used by ftrace")
    );

    // SAFETY: as above.
    let written = unsafe { libc::write(data.as_raw_fd(), record.as_ptr().cast(), record.len()) };
    assert_eq!(written, 8);
    let lines = instance.trace_lines();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let (task, event) = lines[0].split_once(" [").expect("a trace line");
    assert!(task.trim().ends_with(&format!("-{tid}")), "{task:?} is not thread {tid}");
    assert!(event.ends_with(": tracer_vm_smoke: a=0x2a (42)"), "{event:?}");

    instance.set_enabled("tracer_vm_smoke", false);
    assert_eq!(wait_for_word(&enable, 0), 0, "disabling clears the bit");
    instance.set_enabled("tracer_vm_smoke", true);
    assert_eq!(wait_for_word(&enable, ENABLED), ENABLED);

    assert_eq!(unregister(&data, addr, ENABLE_BIT), Ok(()));
    assert_eq!(enable.load(Ordering::SeqCst), 0, "DIAG_IOCSUNREG force-clears the bit");
    assert_eq!(unregister(&data, addr, ENABLE_BIT), Err(libc::ENOENT), "already gone");
    assert_eq!(unregister(&data, addr, 30), Err(libc::ENOENT), "never registered");
    instance.set_enabled("tracer_vm_smoke", false);
}

#[test]
fn registration_rejections() {
    let tracefs = tracefs_with_user_events();
    let data = open_data(&tracefs);
    let enable = Box::new(AtomicU32::new(0));
    register(&data, c"tracer_vm_reject u32 a", &enable).expect("first registration");
    assert_eq!(
        register(&data, c"tracer_vm_reject u32 a", &enable).map(|_| ()),
        Err(libc::EADDRINUSE),
        "same address and bit twice in one process"
    );
    let other = Box::new(AtomicU32::new(0));
    assert_eq!(
        register(&data, c"tracer_vm_reject u64 a", &other).map(|_| ()),
        Err(libc::EADDRINUSE),
        "same name, different fields"
    );
    let again = register(&data, c"tracer_vm_reject u32 a", &other).expect("identical definition");
    assert_eq!({ again.write_index }, 0, "an identical definition on the same fd shares its index");
    let third = Box::new(AtomicU32::new(0));
    let next = register(&data, c"tracer_vm_reject_next u32 b", &third).expect("second event");
    assert_eq!({ next.write_index }, 1, "indexes count the fd's distinct events");
    // SAFETY: ioctl with an invalid command on a valid fd.
    let ret = unsafe { libc::ioctl(data.as_raw_fd(), 0x4008_2A1F as libc::c_ulong, 0) };
    assert_eq!((ret, errno()), (-1, libc::ENOTTY));
    assert_eq!(unregister(&data, enable.as_ptr() as u64, ENABLE_BIT), Ok(()));
    assert_eq!(unregister(&data, other.as_ptr() as u64, ENABLE_BIT), Ok(()));
    assert_eq!(unregister(&data, third.as_ptr() as u64, ENABLE_BIT), Ok(()));
}

#[test]
fn registrations_are_inherited_by_fork_and_dropped_by_exec() {
    let tracefs = tracefs_with_user_events();
    let data = open_data(&tracefs);
    let enable = Box::new(AtomicU32::new(0));
    let addr = enable.as_ptr() as u64;
    register(&data, c"tracer_vm_fork u32 a", &enable).expect("DIAG_IOCSREG");

    // Fork without exec: the child owns a copy of the registration and can unregister it, once.
    // SAFETY: the child only makes raw syscalls (ioctl, _exit) before exiting.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        let first = unregister(&data, addr, ENABLE_BIT);
        let second = unregister(&data, addr, ENABLE_BIT);
        let code = match (first, second) {
            (Ok(()), Err(libc::ENOENT)) => 0,
            (Ok(()), _) => 3,
            _ => 4,
        };
        // SAFETY: leaving the forked child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "child: 0 = unregistered once then ENOENT, 3 = second unregister did not fail, \
         4 = nothing inherited"
    );

    // Fork + exec: before exec the child still holds the registration (registering the same
    // address and bit again is refused); the exec'd image has none left to unregister. The
    // pre_exec hook also makes std use a real fork() rather than posix_spawn's shared-VM clone.
    let fd = data.as_raw_fd();
    let mut probe = std::process::Command::new(env!("CARGO_BIN_EXE_user_events_unreg"));
    probe.arg(&tracefs).arg(format!("{addr:x}")).arg(ENABLE_BIT.to_string());
    // SAFETY: the hook only makes an ioctl and builds errors without allocating.
    unsafe {
        probe.pre_exec(move || match register_raw(fd, c"tracer_vm_fork u32 a", addr) {
            Err(libc::EADDRINUSE) => Ok(()),
            Ok(_) => Err(std::io::Error::from_raw_os_error(libc::EPROTO)),
            Err(errno) => Err(std::io::Error::from_raw_os_error(errno)),
        });
    }
    let probe = probe.output().expect("the forked child did not inherit the registration");
    assert!(probe.status.success(), "{probe:?}");
    assert_eq!(String::from_utf8_lossy(&probe.stdout), format!("errno {}\n", libc::ENOENT));

    // Neither child touched the parent's own registration.
    assert_eq!(unregister(&data, addr, ENABLE_BIT), Ok(()));
}

#[test]
fn close_keeps_the_enabler_until_unregister() {
    let tracefs = tracefs_with_user_events();
    let enable = Box::new(AtomicU32::new(0));
    let addr = enable.as_ptr() as u64;
    {
        let data = open_data(&tracefs);
        register(&data, c"tracer_vm_close u32 a", &enable).expect("DIAG_IOCSREG");
    }
    // The enabler belongs to the mm, not the fd: a new fd can still unregister it.
    let data = open_data(&tracefs);
    assert_eq!(unregister(&data, addr, ENABLE_BIT), Ok(()));
}

/// Registering a name twice: registering a name again through tracer's `UserEventsData` would replace (and
/// free) the enable word the kernel still writes: it is refused, and the first word keeps
/// working until it is unregistered.
#[test]
fn tracer_refuses_a_second_registration_of_one_name() {
    use tracer::kernel::tracefs::Tracefs;
    use tracer::kernel::user_events::UserEventsData;
    let tracefs = Tracefs::at(tracefs_with_user_events());
    let data = UserEventsData::open(&tracefs).expect("user_events_data");
    let name = format!("tracer_vm_dup_{}", std::process::id());
    data.register(&name, "u32 a").expect("first registration");
    let again = data.register(&name, "u32 a").expect_err("a second registration of one name");
    assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists, "{again}");
    data.unregister(&name).expect("unregistering the first");
    data.register(&name, "u32 a").expect("registering again after unregistering");
    data.unregister(&name).expect("unregistering");
}
