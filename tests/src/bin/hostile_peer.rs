//! Plays a misbehaving owner of a .NET diagnostic socket, for tracer's IPC tests.
//!
//! `hostile_peer <mode> [arg]`, socket directory `$TMPDIR` (default `/tmp`):
//! * `garbage` — binds this process's runtime socket name and answers every request with bytes
//!   that are not an IPC reply;
//! * `short` — answers with a valid header announcing a 60 000-byte reply, sends 10 bytes, then
//!   nothing more (connection kept open);
//! * `short-close` — the same 10 bytes, then closes the connection;
//! * `silent` — accepts and never answers;
//! * `symlink <path>` — creates this process's runtime socket name as a symlink to `<path>`;
//! * `listen <path>` — binds a plain socket at `<path>` that only records what it receives;
//! * `squat <pid>` — binds the runtime socket name of *another* process `<pid>`;
//! * `plant <pid> <key>` — binds `dotnet-diagnostic-<nspid of pid>-<key>-socket`, a name
//!   tracer's fallback could take for `<pid>`'s socket.
//!
//! With `HOSTILE_PEER_IPC_MEMFD=1` it then maps a `dotnet_ipc_created` memfd, as a .NET runtime
//! does once its diagnostic server listens, so tracer's detection finds it.
//! With `HOSTILE_PEER_AS_NOBODY=1` it first drops to uid/gid 65534 (`nobody`), as another user
//! sharing `/tmp` would be. With `HOSTILE_PEER_WAIT=1` it maps the memfd (when asked for) first,
//! prints `WAITING` and creates the name only once it reads `go` on stdin (a runtime whose
//! socket appears after it was detected).
//!
//! Prints `READY <path>` once the name exists (and the mapping, when asked for). On stdin, `report <n>` answers
//! `RECEIVED <connections> <bytes>` once at least `n` connections were accepted and every one of
//! them was closed by its client (so bytes in flight are counted), or after 10 s; `bytes <n>`
//! answers the same line once at least `n` bytes arrived (connections may still be open), or
//! after 10 s; EOF exits and removes the name.

use std::io::{BufRead, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tests::procfs;

#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    Garbage,
    Short,
    ShortClose,
    Silent,
}

#[derive(Default)]
struct Tally {
    connections: usize,
    open: usize,
    bytes: usize,
}

type Shared = Arc<(Mutex<Tally>, Condvar)>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(
        std::env::var("TMPDIR").ok().filter(|d| !d.is_empty()).unwrap_or("/tmp".into()),
    );
    let own_name = || procfs::runtime_socket_name(std::process::id()).map(|n| dir.join(n));
    if std::env::var_os("HOSTILE_PEER_AS_NOBODY").is_some_and(|v| v == "1") {
        become_nobody()?;
    }
    let wait = std::env::var_os("HOSTILE_PEER_WAIT").is_some_and(|v| v == "1");
    let ipc_memfd = std::env::var_os("HOSTILE_PEER_IPC_MEMFD").is_some_and(|v| v == "1");
    if wait {
        if ipc_memfd {
            map_ipc_memfd()?;
        }
        println!("WAITING");
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        if line.trim() != "go" {
            bail!("expected go, read {line:?}");
        }
    }
    let tally: Shared = Arc::default();
    let created = match (args.first().map(String::as_str), args.get(1)) {
        (Some("garbage"), None) => serve(own_name()?, Behaviour::Garbage, &tally)?,
        (Some("short"), None) => serve(own_name()?, Behaviour::Short, &tally)?,
        (Some("short-close"), None) => serve(own_name()?, Behaviour::ShortClose, &tally)?,
        (Some("silent"), None) => serve(own_name()?, Behaviour::Silent, &tally)?,
        (Some("listen"), Some(path)) => serve(PathBuf::from(path), Behaviour::Silent, &tally)?,
        (Some("squat"), Some(pid)) => {
            let name = procfs::runtime_socket_name(pid.parse().context("squat <pid>")?)?;
            serve(dir.join(name), Behaviour::Silent, &tally)?
        }
        (Some("plant"), Some(pid)) => {
            let pid: u32 = pid.parse().context("plant <pid> <key>")?;
            let key: u64 = args.get(2).context("plant <pid> <key>")?.parse()?;
            let name = format!("dotnet-diagnostic-{}-{key}-socket", procfs::ns_pid(pid)?);
            serve(dir.join(name), Behaviour::Silent, &tally)?
        }
        (Some("symlink"), Some(target)) => {
            let link = own_name()?;
            std::os::unix::fs::symlink(target, &link)?;
            link
        }
        _ => bail!(
            "usage: hostile_peer garbage|short|silent|symlink <path>|listen <path>|squat <pid>|\
             plant <pid> <key>"
        ),
    };
    if ipc_memfd && !wait {
        map_ipc_memfd()?;
    }
    println!("READY {}", created.display());
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let (connections, bytes) = if let Some(min) = line.strip_prefix("report ") {
            settled(&tally, min.trim().parse()?)
        } else if let Some(min) = line.strip_prefix("bytes ") {
            arrived(&tally, min.trim().parse()?)
        } else {
            bail!("unknown command {line:?}");
        };
        println!("RECEIVED {connections} {bytes}");
    }
    let _ = std::fs::remove_file(&created);
    Ok(())
}

/// Drops every group and becomes uid/gid 65534 for good.
fn become_nobody() -> Result<()> {
    // SAFETY: plain syscalls without pointers (setgroups with an empty list); the process is
    // single-threaded here, so every thread drops its credentials.
    let failed = unsafe {
        libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(65534) != 0
            || libc::setuid(65534) != 0
    };
    if failed {
        bail!("dropping to nobody: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// `memfd_create("dotnet_ipc_created")` + a read-only shared mapping kept for the process's life.
fn map_ipc_memfd() -> Result<()> {
    // SAFETY: plain syscalls on a fresh fd; the mapping is intentionally never unmapped.
    unsafe {
        let fd = libc::memfd_create(c"dotnet_ipc_created".as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 || libc::ftruncate(fd, 4096) != 0 {
            bail!("memfd_create/ftruncate: {}", std::io::Error::last_os_error());
        }
        let addr = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, fd, 0);
        if addr == libc::MAP_FAILED {
            bail!("mmap: {}", std::io::Error::last_os_error());
        }
        libc::close(fd);
    }
    Ok(())
}

fn serve(path: PathBuf, behaviour: Behaviour, tally: &Shared) -> Result<PathBuf> {
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    let tally = tally.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let (lock, changed) = &*tally;
            let mut t = lock.lock().unwrap();
            t.connections += 1;
            t.open += 1;
            drop(t);
            changed.notify_all();
            let tally = tally.clone();
            std::thread::spawn(move || handle(stream, behaviour, &tally));
        }
    });
    Ok(path)
}

fn handle(mut stream: UnixStream, behaviour: Behaviour, tally: &Shared) {
    let mut buf = [0u8; 65536];
    let mut answered = behaviour == Behaviour::Silent;
    loop {
        let n = stream.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        tally.0.lock().unwrap().bytes += n;
        tally.1.notify_all();
        if !answered {
            answered = true;
            let _ = stream.write_all(&reply(behaviour));
            if behaviour == Behaviour::ShortClose {
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
        }
    }
    let (lock, changed) = &**tally;
    lock.lock().unwrap().open -= 1;
    changed.notify_all();
}

fn reply(behaviour: Behaviour) -> Vec<u8> {
    match behaviour {
        Behaviour::Garbage => b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec(),
        Behaviour::Short | Behaviour::ShortClose => {
            let mut r = b"DOTNET_IPC_V1\0".to_vec();
            r.extend_from_slice(&60_000u16.to_le_bytes());
            r.extend_from_slice(&[0xFF, 0x00, 0, 0]);
            r.extend_from_slice(&[0xAB; 10]);
            r
        }
        Behaviour::Silent => Vec::new(),
    }
}

/// How long `report` and `bytes` wait for what they were asked to see.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections and bytes once `min` connections came and all are closed.
fn settled(tally: &Shared, min: usize) -> (usize, usize) {
    wait_until(tally, |t| t.connections >= min && t.open == 0)
}

/// Connections and bytes once at least `min` bytes arrived.
fn arrived(tally: &Shared, min: usize) -> (usize, usize) {
    wait_until(tally, |t| t.bytes >= min)
}

/// Connections and bytes once `done` holds (at most [`SETTLE_TIMEOUT`]).
fn wait_until(tally: &Shared, done: impl Fn(&Tally) -> bool) -> (usize, usize) {
    let (lock, changed) = &**tally;
    let guard = lock.lock().unwrap();
    let (guard, _) = changed.wait_timeout_while(guard, SETTLE_TIMEOUT, |t| !done(t)).unwrap();
    (guard.connections, guard.bytes)
}
