//! Runs a program as a process with a chosen pid: `spawn_at_pid <pid> <program> [args...]`.
//!
//! A pid reused by another process, made deterministic: `clone3` with `set_tid` (Linux 5.5+,
//! root) gives the child exactly `<pid>` in this pid namespace, or fails with `EEXIST` when the
//! pid is taken. The child execs `<program>` with this process's stdin, stdout and stderr and dies
//! with this process (`PR_SET_PDEATHSIG`); this process waits for it and exits with its status.
use std::ffi::CString;

use anyhow::{Context, Result, bail};

/// `struct clone_args` of linux/sched.h (the fields `clone3` reads up to `set_tid_size`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let pid: libc::pid_t =
        args.next().context("usage: spawn_at_pid <pid> <program> [args...]")?.parse()?;
    let argv: Vec<CString> = args.map(CString::new).collect::<Result<_, _>>()?;
    if argv.is_empty() {
        bail!("usage: spawn_at_pid <pid> <program> [args...]");
    }
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let tids = [pid];
    let clone_args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tids.as_ptr() as u64,
        set_tid_size: 1,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 with a valid, fully initialised clone_args of the size passed; without
    // CLONE_VM the child gets a copy of this single-threaded process, and it only calls
    // async-signal-safe functions (prctl, execvp, _exit) before exec.
    let child = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &clone_args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if child < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("clone3 with set_tid {pid} (is the pid taken? root?)"));
    }
    if child == 0 {
        // SAFETY: prctl and execvp with valid, NUL-terminated arguments that outlive the calls;
        // _exit ends the child if exec failed.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::execvp(argv_ptrs[0], argv_ptrs.as_ptr());
            libc::_exit(127);
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child; status is a valid out pointer.
    if unsafe { libc::waitpid(child as libc::pid_t, &mut status, 0) } < 0 {
        return Err(std::io::Error::last_os_error()).context("waitpid");
    }
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 };
    std::process::exit(code);
}
