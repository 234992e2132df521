//! Plays a user_events producer for `vm_audit`: it issues the user_events ioctls on
//! `user_events_data` on command and reports what it passed and what the kernel answered, so a
//! test can compare tracer's view field by field.
//!
//! `user_events_helper [--commands FD] [--child-commands FD]` prints
//! `{"op":"ready","image":"spawn",…}` and then reads one command per line from FD (default
//! stdin), answering each with one JSON line on stdout:
//! * `reg SLOT BIT SIZE FLAGS NAME_ARGS…` — `DIAG_IOCSREG` with the enable word `SLOT` (0–3, each
//!   8-byte aligned) of a static array;
//! * `unreg ADDR BIT` — `DIAG_IOCSUNREG` (ADDR in hex);
//! * `del NAME` — `DIAG_IOCSDEL`;
//! * `burst N` — N `DIAG_IOCSREG` of distinct events (`burst_<pid>_<i> u32 v`, each with an
//!   enable word of its own) as fast as possible; answers `{"op":"burst","registered":…}` (the
//!   events go when the process exits);
//! * `fork` — the child answers (`{"op":"ready","image":"fork",…}`) and from then on reads its
//!   commands from the `--child-commands` fd, so the test drives both processes separately;
//! * `exec` — re-executes this program, which keeps reading the same command fd and answers
//!   `{"op":"ready","image":"exec",…}`;
//! * `exit` or end of input — exits with status 0.
//!
//! `user_events_data` is opened on first use (so an exec'd image opens its own). Replies carry
//! `ret` (the syscall's return value) and `errno` (0 on success), the fd, and `arg` (the address
//! of the argument the kernel read).
use std::ffi::CString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, RawFd};
use std::os::unix::process::CommandExt as _;
use std::sync::atomic::AtomicU64;

use serde_json::{Value, json};
use tests::user_events::{
    DIAG_IOCSDEL, DIAG_IOCSREG, DIAG_IOCSUNREG, UserReg, UserUnreg, open_data,
    tracefs_with_user_events,
};

/// Enable words the kernel may set bits in; 8-byte aligned so either enable size fits.
static WORDS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

struct Helper {
    data: Option<File>,
    /// Where a forked child reads its commands.
    child_commands: Option<RawFd>,
}

fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

fn say(value: Value) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}").and_then(|()| out.flush()).expect("writing stdout");
}

fn ready(image: &str) {
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() };
    let argv0 = std::env::args().next().unwrap_or_default();
    say(json!({"op": "ready", "image": image, "pid": pid(), "ppid": ppid, "argv0": argv0}));
}

/// `(ret, errno)` of a raw syscall result.
fn outcome(ret: libc::c_int) -> (libc::c_int, i32) {
    let errno =
        if ret < 0 { std::io::Error::last_os_error().raw_os_error().unwrap_or(0) } else { 0 };
    (ret, errno)
}

impl Helper {
    fn data_fd(&mut self) -> RawFd {
        self.data.get_or_insert_with(|| open_data(&tracefs_with_user_events())).as_raw_fd()
    }

    fn register(&mut self, args: &str) -> Value {
        let mut words = args.splitn(5, ' ');
        let mut number = |what: &str| -> u64 {
            let text = words.next().unwrap_or_else(|| panic!("reg: missing {what}"));
            text.parse().unwrap_or_else(|e| panic!("reg: {what} {text:?}: {e}"))
        };
        let (slot, bit, size, flags) =
            (number("slot"), number("bit"), number("size"), number("flags"));
        let name_args = words.next().expect("reg: missing name_args");
        let name = CString::new(name_args).expect("name_args without NUL");
        let fd = self.data_fd();
        let mut reg = UserReg {
            size: size_of::<UserReg>() as u32,
            enable_bit: bit as u8,
            enable_size: size as u8,
            flags: flags as u16,
            enable_addr: WORDS[slot as usize].as_ptr() as u64,
            name_args: name.as_ptr() as u64,
            write_index: u32::MAX,
        };
        // SAFETY: reg and the name outlive the call; the kernel validates enable_addr.
        let (ret, errno) = outcome(unsafe { libc::ioctl(fd, DIAG_IOCSREG, &mut reg) });
        let (enable_addr, write_index) = (reg.enable_addr, reg.write_index);
        json!({
            "op": "reg", "pid": pid(), "fd": fd, "ret": ret, "errno": errno,
            "arg": format!("{:#x}", &raw const reg as u64),
            "enable_addr": format!("{enable_addr:#x}"),
            "enable_bit": bit, "enable_size": size, "flags": flags, "name_args": name_args,
            "write_index": write_index,
        })
    }

    fn unregister(&mut self, args: &str) -> Value {
        let (addr, bit) = args.split_once(' ').expect("unreg ADDR BIT");
        let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16).expect("hex address");
        let bit: u8 = bit.parse().expect("bit number");
        let fd = self.data_fd();
        let mut unreg = UserUnreg {
            size: size_of::<UserUnreg>() as u32,
            disable_bit: bit,
            disable_addr: addr,
            ..Default::default()
        };
        // SAFETY: the argument is a live, correctly sized user_unreg.
        let (ret, errno) = outcome(unsafe { libc::ioctl(fd, DIAG_IOCSUNREG, &mut unreg) });
        json!({
            "op": "unreg", "pid": pid(), "fd": fd, "ret": ret, "errno": errno,
            "arg": format!("{:#x}", &raw const unreg as u64),
            "disable_addr": format!("{addr:#x}"), "disable_bit": bit,
        })
    }

    fn delete(&mut self, name: &str) -> Value {
        let c_name = CString::new(name).expect("name without NUL");
        let fd = self.data_fd();
        // SAFETY: the argument is a NUL-terminated string that outlives the call.
        let (ret, errno) = outcome(unsafe { libc::ioctl(fd, DIAG_IOCSDEL, c_name.as_ptr()) });
        json!({
            "op": "del", "pid": pid(), "fd": fd, "ret": ret, "errno": errno,
            "arg": format!("{:#x}", c_name.as_ptr() as u64), "name": name,
        })
    }

    fn burst(&mut self, args: &str) -> Value {
        let n: usize = args.trim().parse().expect("burst N");
        let fd = self.data_fd();
        // Leaked: the kernel writes the enable bits until the process exits.
        let words: &'static [AtomicU64] = Vec::from_iter((0..n).map(|_| AtomicU64::new(0))).leak();
        let mut registered = 0;
        for (i, word) in words.iter().enumerate() {
            let name = CString::new(format!("burst_{}_{i} u32 v", pid())).expect("no NUL");
            let mut reg = UserReg {
                size: size_of::<UserReg>() as u32,
                enable_bit: 0,
                enable_size: 8,
                flags: 0,
                enable_addr: word.as_ptr() as u64,
                name_args: name.as_ptr() as u64,
                write_index: u32::MAX,
            };
            // SAFETY: reg and the name outlive the call; the word lives until exit.
            let (ret, _) = outcome(unsafe { libc::ioctl(fd, DIAG_IOCSREG, &mut reg) });
            registered += usize::from(ret == 0);
        }
        json!({"op": "burst", "pid": pid(), "registered": registered})
    }

    /// Serves commands from `input` until `exit` or its end.
    fn serve(&mut self, input: impl BufRead, commands_fd: RawFd) {
        for line in input.lines() {
            let line = line.expect("reading commands");
            let (op, args) = line.split_once(' ').unwrap_or((line.as_str(), ""));
            match op {
                "reg" => say(self.register(args)),
                "unreg" => say(self.unregister(args)),
                "del" => say(self.delete(args)),
                "burst" => say(self.burst(args)),
                "fork" => self.fork(),
                "exec" => exec_self(commands_fd),
                "exit" => return,
                _ => panic!("unknown command {line:?}"),
            }
        }
    }

    fn fork(&mut self) {
        let fd = self.child_commands.expect("fork needs --child-commands");
        // SAFETY: this program is single-threaded, so the child may go on running normally.
        match unsafe { libc::fork() } {
            -1 => panic!("fork: {}", std::io::Error::last_os_error()),
            0 => {
                ready("fork");
                // SAFETY: the fd was handed to us for exactly this and nothing else owns it.
                let input = BufReader::new(unsafe { File::from_raw_fd(fd) });
                self.child_commands = None;
                self.serve(input, fd);
                std::process::exit(0);
            }
            _ => {}
        }
    }
}

/// Replaces this image by a fresh one of the same program reading commands from `commands_fd`.
fn exec_self(commands_fd: RawFd) {
    // SAFETY: plain fcntl on our own fd; the new image must inherit it.
    if unsafe { libc::fcntl(commands_fd, libc::F_SETFD, 0) } < 0 {
        panic!("clearing FD_CLOEXEC: {}", std::io::Error::last_os_error());
    }
    let exe = std::env::current_exe().expect("current_exe");
    let err = std::process::Command::new(exe).arg("--commands").arg(commands_fd.to_string()).exec();
    panic!("exec: {err}");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fd_option = |name: &str| -> Option<RawFd> {
        let i = args.iter().position(|a| a == name)?;
        Some(args.get(i + 1).and_then(|n| n.parse().ok()).expect("a file descriptor number"))
    };
    let commands = fd_option("--commands");
    let mut helper = Helper { data: None, child_commands: fd_option("--child-commands") };
    match commands {
        Some(fd) => {
            ready("exec");
            // SAFETY: the fd was inherited for exactly this and nothing else owns it.
            helper.serve(BufReader::new(unsafe { File::from_raw_fd(fd) }), fd);
        }
        None => {
            ready("spawn");
            helper.serve(std::io::stdin().lock(), 0);
        }
    }
}
