//! Plays the processes `tracer audit` must detect, and reports exactly what it did as JSON lines
//! on stdout so tests can compare tracer's output field by field. Steps wait for a line on stdin
//! so a test decides when each one happens.
//!
//! Modes:
//! * `sequence` — prints `started`; on a stdin line: `memfd_create("dotnet_ipc_created")` +
//!   `mmap(PROT_NONE, MAP_PRIVATE)`, `memfd_create("unrelated")` + mmap, then
//!   `ioctl(/dev/null, DIAG_IOCSREG, &user_reg)` (fails with ENOTTY), prints `registered`;
//!   on the next line: fork, the child execs /bin/true, waits for it, prints `done`, exits.
//! * `map-and-hold` — creates and maps the `dotnet_ipc_created` memfd, prints `mapped`, then
//!   holds the mapping until stdin closes.
//! * `map-fails` — creates the `dotnet_ipc_created` memfd sealed against writing and asks for a
//!   shared writable mapping of it, which the kernel refuses (`EPERM`), prints
//!   `{"phase":"refused","pid":…,"fd":…,"errno":…}`, then holds until stdin closes.
//! * `map-fixed` — reserves two pages, maps the `dotnet_ipc_created` memfd shared and read-only
//!   with `MAP_FIXED` over the second one, prints `{"phase":"mapped","pid":…,"addr":…}` and holds
//!   until stdin closes (a fixed mapping takes no address search in the kernel).
//! * `leader-exits-first` — maps the `dotnet_ipc_created` memfd, prints `mapped`, starts a
//!   second thread and ends the main (leader) thread alone; the second thread waits for that exit,
//!   maps a `doublemapper` memfd, prints `leader_gone` with its tid, and on a stdin line exits the
//!   process. The process ends with that thread, not with its leader.
//! * `mmap-loop N`, `ioctl-loop N`, `getppid-loop N`, `fork-loop N` — what every process on the
//!   machine pays for: N mmap+munmap of an unrelated memfd / N `FIONREAD` ioctls on /dev/null /
//!   N getppid() (a syscall tracer hooks nothing of) / N fork+exit+wait (the lifecycle hooks),
//!   pinned to the last CPU; prints `{"ns_per_op":…}` (benchmarks).
//! * `latency N` — N children one after another, each mapping a fresh `dotnet_ipc_created`
//!   memfd and printing `{"mapped_mono_ns":…,"addr":…,"pid":…}` with CLOCK_MONOTONIC read right after
//!   mmap returned.
//! * `bind NAME…` — binds an `AF_UNIX` stream socket to each NAME in order (`@x` = the abstract
//!   name `x`; addrlen = family + name, no NUL, as CPython passes it; `full:NAME` passes
//!   `sizeof(struct sockaddr_un)` instead), prints `{"phase":"bound","pid":…,"fds":[…]}` with
//!   each socket's fd (-errno when its bind failed), and holds until stdin closes.
//! * `fork-burst N` — creates a `dotnet_ipc_created` memfd (so the kernel programs track it),
//!   prints `{"phase":"tracked","pid":…}`; on a stdin line forks N children one after another,
//!   each exiting at once, reaps them, and prints `{"phase":"forked","children":[…]}`.
//! * `map-repeat N` — maps its `dotnet_ipc_created` memfd N times, then a second such memfd once,
//!   prints `{"phase":"mapped","pid":…,"times":N}` and holds until stdin closes.
use std::ffi::CStr;
use std::io::{BufRead as _, Write as _};
use std::time::Instant;

use serde_json::json;
use tests::user_events::{DIAG_IOCSREG, UserReg};

const PAGE: usize = 4096;
const NAME_ARGS: &CStr = c"tracer_test_event u32 count; char[8] tag";

fn check<T: PartialOrd + Default>(ret: T, what: &str) -> T {
    if ret < T::default() {
        panic!("{what}: {}", std::io::Error::last_os_error());
    }
    ret
}

/// `memfd_create` with its name copied to the heap first. The kernel's entry program cannot
/// fault a page in: a literal on a `.rodata` page this process has not touched yet is a name
/// it cannot read, a counted loss (docs/protocol/bpf-detection.md §7) that the tests counting
/// each creation must not see. A page just written is resident.
fn memfd_create(name: &CStr, flags: libc::c_uint) -> i32 {
    let resident = name.to_owned();
    // SAFETY: valid NUL-terminated name.
    check(unsafe { libc::memfd_create(resident.as_ptr(), flags) }, "memfd_create")
}

fn memfd(name: &CStr) -> i32 {
    let fd = memfd_create(name, libc::MFD_CLOEXEC);
    // SAFETY: fd is ours.
    check(unsafe { libc::ftruncate(fd, PAGE as libc::off_t) }, "ftruncate");
    fd
}

fn map(fd: i32, prot: i32) -> u64 {
    // SAFETY: a fresh mapping of our own fd; nothing else refers to the address.
    let addr = unsafe { libc::mmap(std::ptr::null_mut(), PAGE, prot, libc::MAP_PRIVATE, fd, 0) };
    assert_ne!(addr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    addr as u64
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn say(value: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}").unwrap();
    out.flush().unwrap();
}

/// Blocks until the test sends a line (or closes stdin).
fn wait_for_go() {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
}

/// DIAG_IOCSREG on a non-user_events fd; returns (ret, errno).
fn register(fd: i32, enable_word: &mut u32) -> (i32, i32) {
    let mut reg = UserReg {
        size: size_of::<UserReg>() as u32,
        enable_bit: 7,
        enable_size: 4,
        flags: 0,
        enable_addr: enable_word as *mut u32 as u64,
        name_args: NAME_ARGS.as_ptr() as u64,
        write_index: 0,
    };
    // SAFETY: the argument is a valid user_reg whose pointers outlive the call.
    let ret = unsafe { libc::ioctl(fd, DIAG_IOCSREG, &mut reg as *mut UserReg) };
    (ret, std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

fn sequence() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    say(json!({"phase": "started", "pid": pid}));
    wait_for_go();

    let ipc_fd = memfd(c"dotnet_ipc_created");
    let ipc_addr = map(ipc_fd, libc::PROT_NONE);
    let unrelated_fd = memfd(c"unrelated");
    let unrelated_addr = map(unrelated_fd, libc::PROT_READ);
    // SAFETY: valid path.
    let null_fd = check(unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) }, "open");
    let mut enable_word = Box::new(0u32);
    let (ioctl_ret, ioctl_errno) = register(null_fd, &mut enable_word);
    say(json!({
        "phase": "registered",
        "pid": pid,
        "ipc_fd": ipc_fd,
        "ipc_addr": format!("{ipc_addr:#x}"),
        "unrelated_fd": unrelated_fd,
        "unrelated_addr": format!("{unrelated_addr:#x}"),
        "ioctl_fd": null_fd,
        "ioctl_ret": ioctl_ret,
        "ioctl_errno": ioctl_errno,
        "name_args": NAME_ARGS.to_str().unwrap(),
        "enable_addr": format!("{:#x}", &*enable_word as *const u32 as u64),
        "enable_bit": 7,
        "enable_size": 4,
    }));
    wait_for_go();

    // SAFETY: the child only calls async-signal-safe functions (execv, _exit).
    let child = check(unsafe { libc::fork() }, "fork");
    if child == 0 {
        let argv = [c"/bin/true".as_ptr(), std::ptr::null()];
        // SAFETY: NUL-terminated argv.
        unsafe {
            libc::execv(c"/bin/true".as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    check(unsafe { libc::waitpid(child, &mut status, 0) }, "waitpid");
    say(json!({"phase": "done", "pid": pid, "child_pid": child, "child_status": status}));
}

fn map_and_hold() {
    let fd = memfd(c"dotnet_ipc_created");
    let addr = map(fd, libc::PROT_NONE);
    // SAFETY: getpid has no preconditions.
    say(json!({"phase": "mapped", "pid": unsafe { libc::getpid() }, "addr": format!("{addr:#x}")}));
    wait_for_go();
}

fn map_fixed() {
    let fd = memfd(c"dotnet_ipc_created");
    let anonymous = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a fresh reservation; nothing else refers to it.
    let reserved =
        unsafe { libc::mmap(std::ptr::null_mut(), 2 * PAGE, libc::PROT_NONE, anonymous, -1, 0) };
    assert_ne!(reserved, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    let want = reserved as usize + PAGE;
    let flags = libc::MAP_SHARED | libc::MAP_FIXED;
    // SAFETY: MAP_FIXED over the second page of our own reservation, which nothing uses.
    let addr =
        unsafe { libc::mmap(want as *mut libc::c_void, PAGE, libc::PROT_READ, flags, fd, 0) };
    assert_eq!(addr as usize, want, "mmap: {}", std::io::Error::last_os_error());
    // SAFETY: getpid has no preconditions.
    say(json!({"phase": "mapped", "pid": unsafe { libc::getpid() }, "addr": format!("{want:#x}")}));
    wait_for_go();
}

fn map_fails() {
    let name = c"dotnet_ipc_created";
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    let fd = memfd_create(name, flags);
    // SAFETY: fd is ours.
    check(unsafe { libc::ftruncate(fd, PAGE as libc::off_t) }, "ftruncate");
    // SAFETY: sealing our own memfd.
    check(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_WRITE) }, "F_ADD_SEALS");
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a mapping request the kernel refuses; nothing is mapped.
    let addr = unsafe { libc::mmap(std::ptr::null_mut(), PAGE, prot, libc::MAP_SHARED, fd, 0) };
    assert_eq!(addr, libc::MAP_FAILED, "a write-sealed memfd cannot be mapped shared writable");
    let errno = std::io::Error::last_os_error().raw_os_error();
    // SAFETY: getpid has no preconditions.
    say(json!({"phase": "refused", "pid": unsafe { libc::getpid() }, "fd": fd, "errno": errno}));
    wait_for_go();
}

fn bind_names(names: Vec<String>) {
    let mut fds = Vec::new();
    for name in names {
        let (full, name) = match name.strip_prefix("full:") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, name),
        };
        // SAFETY: sockaddr_un is plain data; zero is a valid value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes: Vec<u8> = match name.strip_prefix('@') {
            Some(abstract_name) => [&[0u8][..], abstract_name.as_bytes()].concat(),
            None => name.into_bytes(),
        };
        assert!(bytes.len() <= addr.sun_path.len(), "name too long");
        for (dst, &b) in addr.sun_path.iter_mut().zip(&bytes) {
            *dst = b as libc::c_char;
        }
        let len = if full { size_of::<libc::sockaddr_un>() } else { 2 + bytes.len() };
        // SAFETY: plain socket/bind calls with a valid sockaddr of at least `len` bytes.
        let fd = check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) }, "socket");
        let rc = unsafe { libc::bind(fd, (&raw const addr).cast(), len as libc::socklen_t) };
        fds.push(if rc == 0 {
            fd
        } else {
            -std::io::Error::last_os_error().raw_os_error().unwrap()
        });
    }
    // SAFETY: getpid has no preconditions.
    say(json!({"phase": "bound", "pid": unsafe { libc::getpid() }, "fds": fds}));
    wait_for_go();
}

fn leader_exits_first() {
    use std::sync::atomic::{AtomicU32, Ordering};
    // The kernel zeroes this word and wakes its futex when the leader thread has exited
    // (set_tid_address), as it does for pthread_join.
    static LEADER_TID: AtomicU32 = AtomicU32::new(0);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let fd = memfd(c"dotnet_ipc_created");
    let addr = map(fd, libc::PROT_NONE);
    say(json!({"phase": "mapped", "pid": pid, "addr": format!("{addr:#x}")}));
    LEADER_TID.store(pid as u32, Ordering::SeqCst);
    // SAFETY: the word is a static that outlives the thread.
    unsafe { libc::syscall(libc::SYS_set_tid_address, LEADER_TID.as_ptr()) };
    std::thread::spawn(move || {
        loop {
            let tid = LEADER_TID.load(Ordering::SeqCst);
            if tid == 0 {
                break;
            }
            // SAFETY: waits on a valid static word while it still holds `tid`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    LEADER_TID.as_ptr(),
                    libc::FUTEX_WAIT,
                    tid,
                    std::ptr::null::<libc::timespec>(),
                )
            };
        }
        let fd = memfd(c"doublemapper");
        map(fd, libc::PROT_READ);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        say(json!({"phase": "leader_gone", "pid": pid, "tid": tid}));
        wait_for_go();
        std::process::exit(0);
    });
    // SAFETY: ends only this thread (SYS_exit, not exit_group), without unwinding; the process
    // goes on in the thread above.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
}

/// Runs `op` `n` times pinned to the machine's last CPU (a loop that migrates between CPUs
/// measures the migrations too) and prints `{"ns_per_op":…}`.
fn timed_loop(n: u64, mut op: impl FnMut()) {
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    tests::ftrace::pin_to_cpu(cpus - 1);
    let start = Instant::now();
    for _ in 0..n {
        op();
    }
    say(json!({"ns_per_op": start.elapsed().as_nanos() as f64 / n as f64}));
}

fn mmap_loop(n: u64) {
    let fd = memfd(c"unrelated");
    timed_loop(n, || {
        let addr = map(fd, libc::PROT_NONE);
        // SAFETY: unmapping the mapping just created.
        unsafe { libc::munmap(addr as *mut libc::c_void, PAGE) };
    });
}

fn getppid_loop(n: u64) {
    // SAFETY: getppid has no preconditions; the raw syscall (not a cached libc value).
    timed_loop(n, || unsafe {
        libc::syscall(libc::SYS_getppid);
    });
}

/// fork, the child exits at once, the parent reaps it: what the lifecycle hooks (task_newtask,
/// sched_process_fork, sched_process_exit) cost a process tracer does not track.
fn fork_loop(n: u64) {
    timed_loop(n, || {
        // SAFETY: the child only calls _exit; this helper is single-threaded.
        let child = check(unsafe { libc::fork() }, "fork");
        if child == 0 {
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: reaps the child just forked.
        check(unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) }, "waitpid");
    });
}

fn ioctl_loop(n: u64) {
    // SAFETY: valid path.
    let fd = check(unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) }, "open");
    let mut pending = 0 as libc::c_int;
    // SAFETY: FIONREAD writes one int.
    timed_loop(n, || unsafe {
        libc::ioctl(fd, libc::FIONREAD, &mut pending);
    });
}

/// A mapping of each memfd kind is reported once per process: a fresh child per sample.
fn latency(n: u64) {
    for _ in 0..n {
        // SAFETY: this helper is single-threaded; the child only maps, prints and exits.
        let child = check(unsafe { libc::fork() }, "fork");
        if child == 0 {
            let fd = memfd(c"dotnet_ipc_created");
            let addr = map(fd, libc::PROT_NONE);
            let mapped = mono_ns();
            // SAFETY: getpid has no preconditions.
            let pid = unsafe { libc::getpid() };
            say(json!({"mapped_mono_ns": mapped, "addr": format!("{addr:#x}"), "pid": pid}));
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        check(unsafe { libc::waitpid(child, &mut status, 0) }, "waitpid");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Maps its `dotnet_ipc_created` memfd `n` times (and a second one once), as a process
/// flooding detection would; prints `{"phase":"mapped","pid":…,"times":n}` and holds until stdin
/// closes.
fn map_repeat(n: u64) {
    let fd = memfd(c"dotnet_ipc_created");
    for _ in 0..n {
        let addr = map(fd, libc::PROT_NONE);
        // SAFETY: our own mapping.
        unsafe { libc::munmap(addr as *mut libc::c_void, PAGE) };
    }
    map(memfd(c"dotnet_ipc_created"), libc::PROT_NONE);
    // SAFETY: getpid has no preconditions.
    say(json!({"phase": "mapped", "pid": unsafe { libc::getpid() }, "times": n}));
    let _ = std::io::stdin().lock().lines().count();
}

fn fork_burst(n: u64) {
    memfd(c"dotnet_ipc_created");
    // SAFETY: getpid has no preconditions.
    say(json!({"phase": "tracked", "pid": unsafe { libc::getpid() }}));
    wait_for_go();
    let mut children = Vec::new();
    for _ in 0..n {
        // SAFETY: the child only calls _exit.
        let child = check(unsafe { libc::fork() }, "fork");
        if child == 0 {
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        check(unsafe { libc::waitpid(child, &mut status, 0) }, "waitpid");
        children.push(child);
    }
    say(json!({"phase": "forked", "children": children}));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let count = || args.get(1).and_then(|n| n.parse().ok()).expect("a count argument");
    match args.first().map(String::as_str) {
        Some("sequence") => sequence(),
        Some("map-and-hold") => map_and_hold(),
        Some("map-fails") => map_fails(),
        Some("map-fixed") => map_fixed(),
        Some("leader-exits-first") => leader_exits_first(),
        Some("mmap-loop") => mmap_loop(count()),
        Some("ioctl-loop") => ioctl_loop(count()),
        Some("getppid-loop") => getppid_loop(count()),
        Some("fork-loop") => fork_loop(count()),
        Some("latency") => latency(count()),
        Some("map-repeat") => map_repeat(count()),
        Some("fork-burst") => fork_burst(count()),
        Some("bind") => bind_names(std::env::args().skip(2).collect()),
        _ => {
            eprintln!(
                "usage: detect_helper sequence|map-and-hold|map-fails|map-fixed|leader-exits-first|mmap-loop N|\
                 getppid-loop N|fork-loop N|map-repeat N|fork-burst N|bind NAME...|\
                 ioctl-loop N|latency N"
            );
            std::process::exit(2);
        }
    }
}
