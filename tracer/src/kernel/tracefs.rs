//! Locating (and if needed mounting) tracefs, and reading event descriptions from it.
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use tracer_decode::ftrace::format::EventFormat;
use tracer_decode::ftrace::stream::Tracepoint;

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

#[derive(Clone, Debug)]
pub struct Tracefs {
    root: PathBuf,
}

impl Tracefs {
    /// Finds the tracefs mount from /proc/mounts; mounts it on /sys/kernel/tracing when absent
    /// (a fresh boot often has none), falling back to debugfs's `tracing` directory.
    pub fn find_or_mount() -> anyhow::Result<Tracefs> {
        if let Some(root) = Self::find()? {
            return Ok(Tracefs { root });
        }
        match mount_tracefs(Path::new(TRACEFS)) {
            Ok(()) => Ok(Tracefs { root: PathBuf::from(TRACEFS) }),
            Err(mount_err) => {
                if Path::new(DEBUGFS_TRACING).join("events").is_dir() {
                    return Ok(Tracefs { root: PathBuf::from(DEBUGFS_TRACING) });
                }
                Err(mount_err).context(
                    "tracefs is not mounted and mounting it failed; mount it with \
                     `mount -t tracefs nodev /sys/kernel/tracing` (needs root and CONFIG_TRACING)",
                )
            }
        }
    }

    /// The mounted tracefs, if any.
    pub fn find() -> anyhow::Result<Option<PathBuf>> {
        let mounts = fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
        Ok(mounts.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            let (_dev, dir, fstype) = (it.next()?, it.next()?, it.next()?);
            (fstype == "tracefs").then(|| PathBuf::from(dir))
        }))
    }

    pub fn at(root: impl Into<PathBuf>) -> Tracefs {
        Tracefs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.root.join(rel)
    }

    pub fn event_dir(&self, system: &str, event: &str) -> PathBuf {
        self.root.join("events").join(system).join(event)
    }

    /// Reads and parses `events/<system>/<event>/format`.
    pub fn event_format(&self, system: &str, event: &str) -> anyhow::Result<EventFormat> {
        let path = self.event_dir(system, event).join("format");
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "tracepoint {system}:{event} is not available ({} cannot be read)",
                path.display()
            )
        })?;
        EventFormat::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }
}

fn mount_tracefs(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_dir() {
        bail!("{} does not exist", dir.display());
    }
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(c"nodev".as_ptr(), target.as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null())
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("mount -t tracefs {}", dir.display()));
    }
    log::info!("mounted tracefs on {}", dir.display());
    Ok(())
}

/// An event selection: `system:name` or `system:*`, with an optional filter expression
/// (`sched:sched_process_exec:pid > 100`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub system: String,
    /// `None` selects every event of the system.
    pub name: Option<String>,
    pub filter: Option<String>,
}

impl std::str::FromStr for EventSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<EventSpec, String> {
        let mut parts = s.splitn(3, ':');
        let (system, name) = (parts.next().unwrap_or("").trim(), parts.next().map(str::trim));
        let filter = parts.next().map(str::trim).filter(|f| !f.is_empty()).map(str::to_string);
        let valid =
            |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        match name {
            Some(n) if valid(system) && (n == "*" || valid(n)) => Ok(EventSpec {
                system: system.to_string(),
                name: (n != "*").then(|| n.to_string()),
                filter,
            }),
            _ => Err(format!(
                "invalid event {s:?}: expected SYSTEM:NAME or SYSTEM:* with an optional :FILTER, \
                 e.g. sched:sched_process_exec or syscalls:sys_enter_openat:filename != 0"
            )),
        }
    }
}

const INSTANCE_PREFIX: &str = "tracer-";
/// How many names creating an instance tries: `tracer-<pid>[-<suffix>]`, then numbered variants
/// of it while the name is taken (by a live tracer with the same pid number in another pid
/// namespace).
const INSTANCE_NAME_ATTEMPTS: u32 = 16;

/// A private ftrace instance `instances/tracer-<pid>[-<suffix>]`: its own ring buffer, clock and
/// event switches, so tracer never disturbs the top-level buffer or other tracing users.
/// Dropping it switches it off and disables what it enabled while still holding its liveness
/// file, then releases that file and removes the directory (unmap readers first).
#[derive(Debug)]
pub struct Instance {
    tracefs: Tracefs,
    name: String,
    dir: PathBuf,
    enabled: std::sync::Mutex<Vec<PathBuf>>,
    /// An open file of the instance: while it is open the kernel refuses to remove the
    /// instance (EBUSY), which is how other tracers tell a live instance from a stale one.
    /// `None` once released, right before the `rmdir` at drop.
    liveness: Option<fs::File>,
}

impl Instance {
    /// Creates `instances/tracer-<pid>` after removing stale instances of dead tracer processes.
    /// It starts with tracing off: configure it, open readers, then [`Instance::set_tracing_on`].
    pub fn create(tracefs: &Tracefs) -> anyhow::Result<Instance> {
        Self::create_with_suffix(tracefs, None)
    }

    /// Like [`Instance::create`], named `tracer-<pid>-<suffix>` (several instances per process:
    /// `tracer check`'s scratch instance, parallel tests).
    ///
    /// The directory is made and its liveness file opened under the `InstancesLock`: until
    /// that file is open the instance looks stale, and another tracer's clean-up, which removes
    /// only under the same lock, cannot remove it in that state (docs/protocol/ftrace.md §1.2).
    pub fn create_with_suffix(tracefs: &Tracefs, suffix: Option<&str>) -> anyhow::Result<Instance> {
        remove_stale(tracefs).context("removing stale ftrace instances before creating one")?;
        let pid = std::process::id();
        let base = match suffix {
            Some(s) => format!("{INSTANCE_PREFIX}{pid}-{s}"),
            None => format!("{INSTANCE_PREFIX}{pid}"),
        };
        let lock = InstancesLock::acquire(tracefs)?;
        // The name is taken only by a live tracer with the same pid number in another pid
        // namespace (a stale one was just removed): then a numbered variant is used.
        let mut attempt = 0;
        let (name, dir) = loop {
            let name = if attempt == 0 { base.clone() } else { format!("{base}.{attempt}") };
            let dir = tracefs.path("instances").join(&name);
            match fs::create_dir(&dir) {
                Ok(()) => break (name, dir),
                Err(e)
                    if e.kind() == std::io::ErrorKind::AlreadyExists
                        && attempt + 1 < INSTANCE_NAME_ATTEMPTS =>
                {
                    attempt += 1;
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "creating ftrace instance {} (needs root and tracefs instances)",
                            dir.display()
                        )
                    });
                }
            }
        };
        let tracing_on = dir.join("tracing_on");
        let liveness = match fs::File::open(&tracing_on) {
            Ok(file) => file,
            Err(e) => {
                // Ours and not held: removed now rather than left to the next clean-up.
                let _ = fs::remove_dir(&dir);
                return Err(e).with_context(|| format!("opening {}", tracing_on.display()));
            }
        };
        // Held from here on: other tracers' clean-ups get EBUSY.
        drop(lock);
        // A new instance records at once; nothing should land before the caller has set the
        // clock (which resets the buffer) and its readers. Written before the `Instance`
        // exists: one that failed here would warn from its drop, whose writes fail too.
        if let Err(e) = fs::write(&tracing_on, "0") {
            drop(liveness);
            let _ = fs::remove_dir(&dir);
            return Err(e).with_context(|| format!("writing \"0\" to {}", tracing_on.display()));
        }
        LIVE_INSTANCES.lock().expect("not poisoned").push(dir.clone());
        Ok(Instance {
            tracefs: tracefs.clone(),
            name,
            dir,
            enabled: Default::default(),
            liveness: Some(liveness),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn tracefs(&self) -> &Tracefs {
        &self.tracefs
    }

    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn write(&self, rel: &str, value: &str) -> anyhow::Result<()> {
        let path = self.dir.join(rel);
        fs::write(&path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
    }

    pub fn read(&self, rel: &str) -> anyhow::Result<String> {
        let path = self.dir.join(rel);
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Per-CPU buffer size; must be set before any CPU buffer is mapped.
    pub fn set_buffer_size_kb(&self, kb: u64) -> anyhow::Result<()> {
        self.write("buffer_size_kb", &kb.to_string())
    }

    /// Sub-buffer size (Linux ≥ 6.8: `buffer_subbuf_size_kb`, a power of two of pages; the
    /// kernel rounds up). Each `read()` or `GET_READER` then hands over this much: fewer
    /// syscalls per record. Resets the buffer: set it before any CPU buffer is opened.
    pub fn set_subbuf_size_kb(&self, kb: u64) -> anyhow::Result<()> {
        if !self.path(SUBBUF_SIZE_FILE).exists() {
            bail!(
                "this kernel cannot change the ftrace sub-buffer size (no {SUBBUF_SIZE_FILE}, \
                 Linux ≥ 6.8): leave it at the page size"
            );
        }
        let path = self.path(SUBBUF_SIZE_FILE);
        match fs::write(&path, kb.to_string()) {
            // Some kernels forbid it by policy, even to root (seen on a 6.18 host).
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => bail!(
                "the kernel refused to change the ftrace sub-buffer size to {kb} KiB (writing \
                 {}: {e}): leave --subbuf-size-kb out to use one-page sub-buffers",
                path.display()
            ),
            result => result.with_context(|| format!("writing {kb} to {}", path.display())),
        }
    }

    /// The sub-buffer size in bytes: the page size on kernels without `buffer_subbuf_size_kb`.
    pub fn subbuf_size(&self) -> anyhow::Result<Option<usize>> {
        if !self.path(SUBBUF_SIZE_FILE).exists() {
            return Ok(None);
        }
        let text = self.read(SUBBUF_SIZE_FILE)?;
        let kb: usize = text
            .trim()
            .parse()
            .with_context(|| format!("{SUBBUF_SIZE_FILE} reads {text:?}, not a number"))?;
        Ok(Some(kb << 10))
    }

    /// Fill level (0–100) at which readers are woken.
    pub fn set_buffer_percent(&self, percent: u32) -> anyhow::Result<()> {
        self.write("buffer_percent", &percent.to_string())
    }

    /// `mono` makes record timestamps CLOCK_MONOTONIC, comparable with BPF and nettrace events.
    pub fn set_trace_clock(&self, clock: &str) -> anyhow::Result<()> {
        self.write("trace_clock", clock)
    }

    /// The selected clock (the bracketed entry of `trace_clock`).
    pub fn trace_clock(&self) -> anyhow::Result<String> {
        let text = self.read("trace_clock")?;
        text.split_whitespace()
            .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("no selected clock in trace_clock: {text:?}"))
    }

    pub fn set_tracing_on(&self, on: bool) -> anyhow::Result<()> {
        self.write("tracing_on", if on { "1" } else { "0" })
    }

    /// CPU numbers that have a `per_cpu/cpuN` directory, ascending.
    pub fn cpus(&self) -> anyhow::Result<Vec<u32>> {
        let dir = self.dir.join("per_cpu");
        let mut cpus: Vec<u32> = fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("cpu")?.parse().ok())
            .collect();
        cpus.sort_unstable();
        Ok(cpus)
    }

    pub fn cpu_stats(
        &self,
        cpu: u32,
    ) -> anyhow::Result<tracer_decode::ftrace::stats::CpuBufferStats> {
        Ok(tracer_decode::ftrace::stats::CpuBufferStats::parse(
            &self.read(&format!("per_cpu/cpu{cpu}/stats"))?,
        ))
    }

    /// Enables the selected events (with the filter, if any) and returns `(system, name)` of
    /// each. Events without an `enable` switch (`ftrace:print`, `ftrace:raw_data`: always
    /// recorded when written) are returned as is.
    pub fn enable(&self, spec: &EventSpec) -> anyhow::Result<Vec<(String, String)>> {
        let sys_dir = self.dir.join("events").join(&spec.system);
        if !sys_dir.is_dir() {
            bail!(
                "event system {:?} does not exist in tracefs (see {}/available_events)",
                spec.system,
                self.tracefs.root().display()
            );
        }
        let names = match &spec.name {
            Some(n) => {
                if !sys_dir.join(n).join("format").is_file() {
                    bail!(
                        "tracepoint {}:{n} does not exist on this kernel (no {}/{n}/format)",
                        spec.system,
                        sys_dir.display()
                    );
                }
                vec![n.clone()]
            }
            None => {
                let mut v: Vec<String> = fs::read_dir(&sys_dir)
                    .with_context(|| format!("listing {}", sys_dir.display()))?
                    .filter_map(|e| {
                        let e = e.ok()?;
                        e.path()
                            .join("format")
                            .is_file()
                            .then(|| e.file_name().into_string().ok())?
                    })
                    .collect();
                v.sort();
                v
            }
        };
        // `system:*` uses the system-wide switches; a name uses the event's own.
        let target = match &spec.name {
            Some(n) => sys_dir.join(n),
            None => sys_dir.clone(),
        };
        if let Some(filter) = &spec.filter {
            fs::write(target.join("filter"), filter).with_context(|| {
                // The kernel explains the rejection in error_log (gone with the instance).
                let log = fs::read_to_string(self.dir.join("error_log")).unwrap_or_default();
                let why: Vec<&str> = log.lines().rev().take(3).collect::<Vec<_>>();
                let why: Vec<&str> = why.into_iter().rev().map(str::trim).collect();
                format!(
                    "the kernel rejected filter {filter:?} on {}:{}: {}",
                    spec.system,
                    spec.name.as_deref().unwrap_or("*"),
                    why.join(" | ")
                )
            })?;
        }
        let enable = target.join("enable");
        if enable.is_file() {
            fs::write(&enable, "1").with_context(|| format!("enabling {}", enable.display()))?;
            self.enabled.lock().expect("not poisoned").push(target);
        }
        Ok(names.into_iter().map(|n| (spec.system.clone(), n)).collect())
    }

    /// Format of an event (the same text as the top-level `events/` tree).
    /// Stops recording `system:name` in this instance.
    pub fn disable(&self, system: &str, name: &str) -> anyhow::Result<()> {
        self.write(&format!("events/{system}/{name}/enable"), "0")
    }

    /// A tracepoint of this instance with its parsed format, ready for a reader.
    pub fn tracepoint(&self, system: &str, name: &str) -> anyhow::Result<Tracepoint> {
        Ok(Tracepoint {
            system: system.to_string(),
            name: name.to_string(),
            format: self.event_format(system, name)?,
        })
    }

    pub fn event_format(&self, system: &str, event: &str) -> anyhow::Result<EventFormat> {
        self.tracefs.event_format(system, event)
    }

    /// Sub-buffer layout from `events/header_page`, checked against `events/header_event`, and
    /// sized as this instance's sub-buffers (`header_page` always describes one page).
    pub fn page_layout(&self) -> anyhow::Result<tracer_decode::ftrace::page::PageLayout> {
        use tracer_decode::ftrace::page::PageLayout;
        let read = |name: &str| read_in_one_go(&self.tracefs.path("events").join(name));
        PageLayout::check_header_event(&read("header_event")?)?;
        let page = PageLayout::parse_header_page(&read("header_page")?)?;
        Ok(match self.subbuf_size()? {
            Some(size) => page.with_subbuf_size(size),
            None => page,
        })
    }

    /// Switches the instance off and disables what it enabled while the liveness file is still
    /// held, so no other tracer's clean-up can remove the instance under these writes; then
    /// releases that file (the kernel refuses to remove an instance with an open file) and
    /// removes the instance.
    fn cleanup(&mut self) -> anyhow::Result<()> {
        self.set_tracing_on(false)?;
        for target in self.enabled.get_mut().expect("not poisoned").drain(..) {
            let _ = fs::write(target.join("enable"), "0");
            if target.join("filter").is_file() {
                let _ = fs::write(target.join("filter"), "0");
            }
        }
        self.liveness = None;
        remove_released(&self.dir).with_context(|| format!("removing {}", self.dir.display()))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        LIVE_INSTANCES.lock().expect("not poisoned").retain(|d| *d != self.dir);
        if let Err(e) = self.cleanup() {
            log::warn!("ftrace instance clean-up: {e:#}");
        }
    }
}

/// `rmdir` of an instance of this process whose files it has released. From the release on,
/// another tracer's clean-up may remove the instance first, which is as good: the directory
/// being gone already (ENOENT), or its removal under way (ENODEV), counts as removed.
fn remove_released(dir: &Path) -> std::io::Result<()> {
    match fs::remove_dir(dir) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV)) => Ok(()),
        result => result,
    }
}

/// An instance's sub-buffer size file (Linux ≥ 6.8).
const SUBBUF_SIZE_FILE: &str = "buffer_subbuf_size_kb";

/// Reads a tracefs file with one large read: `events/header_event` and `header_page` return
/// only their first chunk to a small first read (the probe read of `read_to_string`).
fn read_in_one_go(path: &Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut buf = vec![0u8; 64 << 10];
    let mut len = 0;
    let mut f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    loop {
        let n = f.read(&mut buf[len..]).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 || len + n == buf.len() {
            len += n;
            break;
        }
        len += n;
    }
    buf.truncate(len);
    String::from_utf8(buf).with_context(|| format!("{} is not UTF-8", path.display()))
}

/// Directories of this process's instances, for [`crate::kernel::exit_now`].
static LIVE_INSTANCES: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// This process's instance directories.
pub(crate) fn live_instance_dirs() -> Vec<PathBuf> {
    LIVE_INSTANCES.lock().map(|d| d.clone()).unwrap_or_default()
}

/// Switches this process's instances off, before their files are released: until then no
/// other tracer's clean-up can remove them under the write.
pub(crate) fn stop_live_instances() {
    for dir in live_instance_dirs() {
        let _ = fs::write(dir.join("tracing_on"), "0");
    }
}

/// Removes this process's instances; the caller has released every file and mapping of them.
/// Returns the instances still there and why; `report` prints them.
pub(crate) fn remove_live_instances(report: bool) -> usize {
    let mut left = 0;
    for dir in live_instance_dirs() {
        if let Err(e) = remove_released(&dir) {
            left += 1;
            if report {
                eprintln!("tracer: could not remove ftrace instance {}: {e}", dir.display());
            }
        }
    }
    left
}

/// How long creating an instance, or removing a stale one, waits for the [`InstancesLock`].
/// A holder keeps it for one `mkdir` and `open`, or one `rmdir` (milliseconds; tens of them for
/// an `rmdir`, which waits for the kernel to retire the instance's buffers), so a wait this long
/// means a holder is stuck.
const INSTANCES_LOCK_WAIT: Duration = Duration::from_secs(10);
/// Pause between two tries of the [`InstancesLock`] while another process holds it.
const INSTANCES_LOCK_RETRY: Duration = Duration::from_millis(1);

/// An exclusive advisory lock (`flock`) on the tracefs `instances` directory, released on drop
/// (and by the kernel when its holder dies). Tracers take it around the two steps that must not
/// interleave: making an instance and opening its liveness file (until then it looks stale),
/// and removing an instance that looks stale. Every tracer on the host, in any mount or pid
/// namespace, locks the same inode (tracefs has one superblock, wherever it is mounted).
struct InstancesLock {
    dir: fs::File,
}

impl InstancesLock {
    /// Takes the lock, waiting at most [`INSTANCES_LOCK_WAIT`].
    fn acquire(tracefs: &Tracefs) -> anyhow::Result<InstancesLock> {
        use std::os::fd::AsRawFd as _;
        use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
        let path = tracefs.path("instances");
        // Read-only and close-on-exec: only the lock matters, and no child may keep it.
        let dir = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&path)
            .with_context(|| {
                format!("opening {} (needs root and tracefs instances)", path.display())
            })?;
        let deadline = Instant::now() + INSTANCES_LOCK_WAIT;
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is passed.
            if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(InstancesLock { dir });
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(e).with_context(|| format!("locking {} (flock)", path.display()));
            }
            if Instant::now() >= deadline {
                // How /proc/locks names the inode: hex major and minor, decimal inode number.
                let inode = dir.metadata().map_or_else(
                    |_| "?".to_string(),
                    |m| {
                        format!(
                            "{:02x}:{:02x}:{}",
                            libc::major(m.dev()),
                            libc::minor(m.dev()),
                            m.ino()
                        )
                    },
                );
                bail!(
                    "waited {INSTANCES_LOCK_WAIT:?} for the lock of {}, which tracers hold only \
                     while they create an ftrace instance or remove a stale one: its holder seems \
                     stuck; find its pid on the FLOCK line of `grep {inode} /proc/locks` (on the \
                     host) and end it",
                    path.display()
                );
            }
            std::thread::sleep(INSTANCES_LOCK_RETRY);
        }
    }
}

impl Drop for InstancesLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd as _;
        // Explicit, so a copy of the descriptor in a child forked meanwhile (before its exec
        // closes it) does not keep the lock.
        // SAFETY: flock on a descriptor this lock owns; no memory is passed.
        unsafe { libc::flock(self.dir.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Removes `tracer-*` instances whose owner is gone (a crash or SIGKILL). A live tracer keeps a
/// file of its instance open, so the kernel refuses to remove it (EBUSY): unlike a pid in the
/// name, this cannot be fooled by pid reuse or pid namespaces. Each `rmdir` is made under the
/// `InstancesLock`, so it never meets an instance whose creator has not opened that file yet.
pub fn remove_stale_instances(tracefs: &Tracefs) {
    if let Err(e) = remove_stale(tracefs) {
        log::warn!("not removing stale ftrace instances: {e:#}");
    }
}

/// [`remove_stale_instances`], failing when the [`InstancesLock`] cannot be taken.
fn remove_stale(tracefs: &Tracefs) -> anyhow::Result<()> {
    // Unreadable without root: nothing this process could remove either.
    let Ok(entries) = fs::read_dir(tracefs.path("instances")) else { return Ok(()) };
    for entry in entries.flatten() {
        if !entry.file_name().to_str().is_some_and(|n| n.starts_with(INSTANCE_PREFIX)) {
            continue;
        }
        let _lock = InstancesLock::acquire(tracefs)?;
        match fs::remove_dir(entry.path()) {
            Ok(()) => log::info!("removed stale ftrace instance {}", entry.path().display()),
            // Held by a live tracer (EBUSY); being removed by its owner, which needs no lock
            // for that (ENODEV); or gone already (ENOENT).
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ENODEV | libc::ENOENT)) => {}
            Err(e) => log::warn!("cannot remove stale instance {}: {e}", entry.path().display()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_specs() {
        let s: EventSpec = "sched:sched_process_exec".parse().unwrap();
        assert_eq!(
            (s.system.as_str(), s.name.as_deref(), s.filter),
            ("sched", Some("sched_process_exec"), None)
        );
        let s: EventSpec = "syscalls:*".parse().unwrap();
        assert_eq!(s.name, None);
        let s: EventSpec = "syscalls:sys_enter_openat:flags & 0x40 && dfd != 3".parse().unwrap();
        assert_eq!(s.filter.as_deref(), Some("flags & 0x40 && dfd != 3"));
        assert!("sched".parse::<EventSpec>().unwrap_err().contains("SYSTEM:NAME"));
        assert!("sch ed:x".parse::<EventSpec>().is_err());
    }
}
