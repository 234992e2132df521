//! The guest environment that `cargo xtask vm-test` promises VM test authors (docs/vm-tests.md):
//! mounts, writable scratch space, CPUs, Python with the test packages, namespaces.
use std::path::Path;
use std::process::Command;

use tests::user_events::tracefs_with_user_events;

const TMPFS_MAGIC: i64 = 0x0102_1994;

fn mount_types() -> Vec<(String, String)> {
    let mounts = std::fs::read_to_string("/proc/mounts").expect("reading /proc/mounts");
    mounts
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (fields[1].to_owned(), fields[2].to_owned())
        })
        .collect()
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

#[test]
fn kernel_filesystems_are_mounted() {
    assert_eq!(tracefs_with_user_events(), Path::new("/sys/kernel/tracing"));
    let mounts = mount_types();
    for (dir, fs_type) in [
        ("/", "9p"),
        ("/proc", "proc"),
        ("/sys", "sysfs"),
        ("/sys/kernel/tracing", "tracefs"),
        ("/sys/kernel/debug", "debugfs"),
        ("/sys/fs/bpf", "bpf"),
        ("/sys/fs/cgroup", "cgroup2"),
        ("/dev", "devtmpfs"),
        ("/dev/pts", "devpts"),
    ] {
        assert!(
            mounts.iter().any(|(d, t)| d == dir && t == fs_type),
            "{fs_type} is not mounted at {dir}: {mounts:?}"
        );
    }
}

#[test]
fn scratch_dirs_are_writable_tmpfs_and_the_host_is_read_only() {
    tracefs_with_user_events();
    for dir in ["/tmp", "/run", "/dev/shm"] {
        let path = std::ffi::CString::new(dir).unwrap();
        // SAFETY: statfs into a zeroed struct we own.
        let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statfs(path.as_ptr(), &mut stat) }, 0, "statfs {dir}");
        assert_eq!(stat.f_type, TMPFS_MAGIC, "{dir} is not a tmpfs");
        let file = Path::new(dir).join("vm_guest_probe");
        std::fs::write(&file, b"x").unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
        std::fs::remove_file(&file).unwrap();
    }
    let err = std::fs::write(Path::new(env!("CARGO_MANIFEST_DIR")).join("vm_guest_probe"), b"x")
        .expect_err("the host tree is shared read-only");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
}

#[test]
fn two_cpus_are_online() {
    tracefs_with_user_events();
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    assert_eq!(online.trim(), "0-1");
}

#[test]
fn python_has_the_test_packages() {
    tracefs_with_user_events();
    let out = stdout_of(
        Command::new("python3")
            .args(["-c", "import sys, dnv, clr_loader; print(sys.version_info[0])"]),
    );
    assert_eq!(out, "3\n");
}

#[test]
fn pid_and_mount_namespaces_work() {
    tracefs_with_user_events();
    let out = stdout_of(Command::new("unshare").args([
        "--pid",
        "--mount",
        "--fork",
        "--mount-proc",
        "sh",
        "-c",
        "echo $$; mount -t tmpfs none /mnt && echo mounted",
    ]));
    assert_eq!(out, "1\nmounted\n");
}
