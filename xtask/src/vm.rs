//! `cargo xtask vm-test`: runs the `vm_*` integration tests inside a user_events-enabled kernel.
//!
//! The host kernel lacks CONFIG_USER_EVENTS and refuses BPF trampolines, so this builds a small
//! kernel (with user_events, BTF and ftrace direct calls) from Debian trixie's
//! `linux-source-6.12` (config: tinyconfig + `xtask/vm/kernel.config`), boots it under qemu TCG with
//! the host root shared read-only over 9p, and runs the host-built test binaries in a chroot of it.
//! Every expensive step is cached under `~/.cache/tracer` (or `$TRACER_CACHE_DIR`); see
//! docs/vm-tests.md.
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use crate::libtest::TestResult;
use crate::util::{forward_lines, output, run_cmd, workspace_root};

/// The kernel config fragment; part of the kernel cache key.
const KERNEL_FRAGMENT: &str = include_str!("../vm/kernel.config");
/// The guest's /init, with `@@ENV@@` and `@@TESTS@@` placeholders.
const INIT_TEMPLATE: &str = include_str!("../vm/init.sh");
const SOURCE_PACKAGE: &str = "linux-source-6.12";
const DEBIAN_SUITE: &str = "trixie";
const MARKER: &str = "@@TRACER-VM ";
/// Test binaries whose name starts with this run in the VM (and are excluded from host runs).
pub const VM_TEST_PREFIX: &str = "vm_";
const VM_BENCH_PREFIX: &str = "vm_bench";

pub struct Options {
    /// Run only `vm_bench*` binaries, with TRACER_VM_BENCH=1.
    pub bench: bool,
    /// Also run the `vm_bench*` binaries, shortened (TRACER_VM_BENCH_SHORT=1): `cargo xtask test`
    /// wants their assertions (zero loss), not their numbers.
    pub short_benches: bool,
    /// Wall-clock limit for the whole guest run; qemu is killed after it.
    pub timeout: Duration,
    /// Run only these test binaries (names without the hash suffix); empty = all.
    pub only: Vec<String>,
    /// Arguments passed to every test binary (e.g. a test name filter, `--nocapture`).
    pub args: Vec<String>,
}

/// Set in the guest for [`Options::short_benches`].
const SHORT_BENCH_ENV: &str = "TRACER_VM_BENCH_SHORT=1";

/// What the VM run proved: counts from each binary's libtest result line, and every reason it
/// failed (empty when it passed).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub binaries: usize,
    pub totals: TestResult,
    /// Failed tests, plus each failing binary or guest problem no failed test accounts for.
    pub failed: u64,
    pub failures: Vec<String>,
}

/// `cargo xtask vm-test`: fails unless every selected binary passed.
pub fn run_checked(opts: &Options) -> anyhow::Result<()> {
    let report = run(opts)?;
    if !report.failures.is_empty() {
        bail!("VM tests failed:\n  {}", report.failures.join("\n  "));
    }
    Ok(())
}

/// Builds, boots and runs the selected binaries; an error only when the guest could not be
/// started (a test failure is in the report).
pub fn run(opts: &Options) -> anyhow::Result<Report> {
    crate::util::require_root("qemu must read the whole host root to share it with the guest")?;
    let started = Instant::now();
    let tests = build_test_binaries(opts)?;
    let cache = cache_dir()?;
    let kernel = {
        let _lock = CacheLock::acquire(&cache)?;
        let source = fetch_source(&cache)?;
        build_kernel(&cache, &source)?
    };
    let vm_dir = workspace_root().join("target/vm");
    fs::create_dir_all(&vm_dir)?;
    let initrd = vm_dir.join("initrd.gz");
    write_initramfs(&initrd, &init_script(&tests, opts)?)?;
    let console_log = vm_dir.join("console.log");
    eprintln!(
        "vm-test: booting {} with {} test binar{} (timeout {}s, console log {})",
        kernel.display(),
        tests.len(),
        if tests.len() == 1 { "y" } else { "ies" },
        opts.timeout.as_secs(),
        console_log.display()
    );
    let outcome = boot(&kernel, &initrd, &console_log, opts.timeout)?;
    let report = report(&tests, &outcome, selects_tests(&opts.args));
    if let Some(booted) = outcome.booted_after {
        eprintln!("vm-test: guest booted in {:.1}s", booted.as_secs_f64());
    }
    eprintln!(
        "vm-test: total {:.1}s (console log: {})",
        started.elapsed().as_secs_f64(),
        console_log.display()
    );
    Ok(report)
}

/// A `vm_*` integration test executable built on the host.
struct TestBinary {
    name: String,
    path: PathBuf,
}

/// Builds the workspace binaries (tracer) the tests start and the `vm_*` test executables, and returns the
/// selected executables (found through cargo's JSON messages, as their names carry a hash).
fn build_test_binaries(opts: &Options) -> anyhow::Result<Vec<TestBinary>> {
    // Benchmarks measure optimised code; tests use the debug build like `cargo test`.
    let profile: &[&str] = if opts.bench { &["--release"] } else { &[] };
    // Default members only: tracer-ebpf's bin is also named `tracer` and builds for BPF.
    crate::util::cargo(&[&["build", "--bins"], profile].concat())?;
    let messages = output(
        crate::util::cargo_command()
            .args(["test", "-p", "tests", "--no-run", "--message-format=json"])
            .args(profile)
            .stderr(Stdio::inherit()),
    )?;
    let mut tests = Vec::new();
    for line in messages.lines() {
        let message: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("cargo printed a line that is not JSON: {line}"))?;
        let target = &message["target"];
        let is_test = target["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "test"));
        let (Some(name), Some(path)) = (target["name"].as_str(), message["executable"].as_str())
        else {
            continue;
        };
        if message["reason"] != "compiler-artifact" || !is_test || !name.starts_with(VM_TEST_PREFIX)
        {
            continue;
        }
        let wanted = if name.starts_with(VM_BENCH_PREFIX) {
            opts.bench || opts.short_benches
        } else {
            !opts.bench
        };
        if !wanted {
            continue;
        }
        if !opts.only.is_empty() && !opts.only.iter().any(|o| o == name) {
            continue;
        }
        tests.push(TestBinary { name: name.to_owned(), path: PathBuf::from(path) });
    }
    tests.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(missing) = opts.only.iter().find(|o| !tests.iter().any(|t| &t.name == *o)) {
        bail!("no test binary named {missing} (VM tests are tests/tests/{VM_TEST_PREFIX}*.rs)");
    }
    if tests.is_empty() {
        let prefix = if opts.bench { VM_BENCH_PREFIX } else { VM_TEST_PREFIX };
        bail!("no test binaries to run: add tests/tests/{prefix}*.rs");
    }
    Ok(tests)
}

/// `$TRACER_CACHE_DIR`, else `~/.cache/tracer`: what outlives a `cargo clean` (created if missing).
pub(crate) fn cache_dir() -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("TRACER_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home =
                std::env::var_os("HOME").context("neither TRACER_CACHE_DIR nor HOME is set")?;
            PathBuf::from(home).join(".cache/tracer")
        }
    };
    fs::create_dir_all(&dir).with_context(|| format!("creating cache dir {}", dir.display()))?;
    Ok(dir)
}

/// Exclusive lock on the cache directory, so concurrent vm-test runs (other worktrees) do not
/// download or build into the same directories at once. Held while the file is open.
struct CacheLock {
    _file: File,
}

impl CacheLock {
    fn acquire(cache: &Path) -> anyhow::Result<Self> {
        let file = File::create(cache.join("lock"))?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            eprintln!("vm-test: waiting for another vm-test using {}", cache.display());
            // SAFETY: as above.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(std::io::Error::last_os_error()).context("locking the cache dir");
            }
        }
        Ok(Self { _file: file })
    }
}

/// An extracted kernel source tree and the Debian package version it came from.
struct KernelSource {
    version: String,
    tree: PathBuf,
}

/// Downloads `linux-source-6.12` from trixie with a private apt configuration (the system's
/// sources stay untouched) and extracts it. Skips both steps when already done.
fn fetch_source(cache: &Path) -> anyhow::Result<KernelSource> {
    let apt_dir = cache.join("apt");
    let debs = apt_dir.join("debs");
    let deb = match find_deb(&debs)? {
        Some(deb) => deb,
        None => {
            eprintln!("vm-test: downloading {SOURCE_PACKAGE} from Debian {DEBIAN_SUITE} (~150 MB)");
            // Downloads land in `downloading/` and move to `debs/` only once complete, so an
            // interrupted download is never mistaken for the package.
            let downloading = apt_dir.join("downloading");
            if downloading.exists() {
                fs::remove_dir_all(&downloading)?;
            }
            for dir in ["lists/partial", "cache/archives/partial", "debs", "downloading"] {
                fs::create_dir_all(apt_dir.join(dir))?;
            }
            let sources = apt_dir.join("sources.list");
            fs::write(
                &sources,
                format!(
                    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                     http://deb.debian.org/debian {DEBIAN_SUITE} main\n"
                ),
            )?;
            let apt_options = [
                format!("Dir::Etc::sourcelist={}", sources.display()),
                "Dir::Etc::sourceparts=/dev/null".into(),
                format!("Dir::State::Lists={}", apt_dir.join("lists").display()),
                format!("Dir::Cache={}", apt_dir.join("cache").display()),
                // Files live in root's cache dir, which the _apt sandbox user cannot write.
                "APT::Sandbox::User=root".into(),
            ];
            let apt = |action: &[&str]| {
                let mut cmd = Command::new("apt-get");
                cmd.arg("-q");
                for option in &apt_options {
                    cmd.args(["-o", option]);
                }
                run_cmd(cmd.args(action).current_dir(&downloading))
            };
            apt(&["update"])?;
            apt(&["download", SOURCE_PACKAGE])?;
            let downloaded =
                find_deb(&downloading)?.context("apt-get download succeeded but left no .deb")?;
            let deb = debs.join(downloaded.file_name().expect("a file"));
            fs::rename(&downloaded, &deb)?;
            deb
        }
    };
    let version =
        output(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Version"))?.trim().to_owned();
    let src_dir = cache.join(format!("src-{version}"));
    let tree = src_dir.join(SOURCE_PACKAGE);
    if !tree.join("Makefile").exists() {
        eprintln!("vm-test: extracting {SOURCE_PACKAGE} {version}");
        let partial = cache.join(format!("src-{version}.partial"));
        if partial.exists() {
            fs::remove_dir_all(&partial)?;
        }
        fs::create_dir_all(&partial)?;
        let tarball = format!("./usr/src/{SOURCE_PACKAGE}.tar.xz");
        let script = "dpkg-deb --fsys-tarfile \"$1\" | tar -xO \"$2\" | tar -xJ";
        run_cmd(
            Command::new("bash")
                .args(["-euo", "pipefail", "-c", script, "extract"])
                .arg(&deb)
                .arg(&tarball)
                .current_dir(&partial),
        )?;
        if src_dir.exists() {
            fs::remove_dir_all(&src_dir)?;
        }
        fs::rename(&partial, &src_dir)?;
    }
    Ok(KernelSource { version, tree })
}

fn find_deb(dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    if !dir.exists() {
        return Ok(None);
    }
    let prefix = format!("{SOURCE_PACKAGE}_");
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".deb") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Returns `kernel-<hash>/bzImage`, building it first unless cached. The hash covers the source
/// package version and the config fragment.
fn build_kernel(cache: &Path, source: &KernelSource) -> anyhow::Result<PathBuf> {
    let mut hasher = Sha256::new();
    hasher.update(source.version.as_bytes());
    hasher.update(b"\n");
    hasher.update(KERNEL_FRAGMENT.as_bytes());
    let key: String = hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    let dir = cache.join(format!("kernel-{key}"));
    let image = dir.join("bzImage");
    if image.exists() {
        eprintln!("vm-test: using cached kernel {}", image.display());
        return Ok(image);
    }
    let build = dir.join("build");
    fs::create_dir_all(&build)?;
    let make = |targets: &[&str]| {
        run_cmd(
            Command::new("make")
                .arg("-s")
                .arg(format!("O={}", build.display()))
                .args(targets)
                .env("KBUILD_BUILD_USER", "tracer")
                .env("KBUILD_BUILD_HOST", "vm-test")
                .current_dir(&source.tree),
        )
    };
    eprintln!("vm-test: configuring kernel {} in {}", source.version, build.display());
    make(&["tinyconfig"])?;
    let config_path = build.join(".config");
    let tiny = fs::read_to_string(&config_path)?;
    fs::write(&config_path, merge_fragment(&tiny))?;
    make(&["olddefconfig"])?;
    verify_config(&fs::read_to_string(&config_path)?)
        .with_context(|| format!("checking {}", config_path.display()))?;

    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "vm-test: building the kernel with {jobs} jobs (once per config; ~11 min on 2 cores)"
    );
    let started = Instant::now();
    make(&[&format!("-j{jobs}"), "bzImage"])?;
    eprintln!("vm-test: kernel built in {}s", started.elapsed().as_secs());
    let partial = dir.join("bzImage.partial");
    fs::copy(build.join("arch/x86/boot/bzImage"), &partial)?;
    fs::rename(&partial, &image)?;
    Ok(image)
}

/// The symbol a config line sets (`CONFIG_X=..` or `# CONFIG_X is not set`), if any.
fn config_symbol(line: &str) -> Option<&str> {
    let line = line.trim();
    match line.strip_prefix("# ") {
        Some(off) => off.strip_suffix(" is not set"),
        None => line.split_once('=').map(|(symbol, _)| symbol),
    }
    .filter(|symbol| symbol.starts_with("CONFIG_"))
}

/// `base` with the fragment's settings replacing its own lines for the same symbols (appending
/// alone works too, but makes kconfig warn about every override).
fn merge_fragment(base: &str) -> String {
    let overridden: std::collections::HashSet<&str> =
        KERNEL_FRAGMENT.lines().filter_map(config_symbol).collect();
    let mut merged: String = base
        .lines()
        .filter(|line| config_symbol(line).is_none_or(|s| !overridden.contains(s)))
        .flat_map(|line| [line, "\n"])
        .collect();
    merged.push_str(KERNEL_FRAGMENT);
    merged
}

/// Fails with the list of fragment options that `olddefconfig` dropped (unmet dependencies or
/// misspelt names), and of options the fragment turns off that ended up on.
fn verify_config(config: &str) -> anyhow::Result<()> {
    let lines: std::collections::HashSet<&str> = config.lines().collect();
    let mut wrong = Vec::new();
    for line in KERNEL_FRAGMENT.lines().map(str::trim) {
        let turned_off = line.strip_prefix("# ").and_then(|l| l.strip_suffix(" is not set"));
        if let Some(option) = line.strip_suffix("=y") {
            if !lines.contains(line) {
                wrong.push(format!("{option} is not =y"));
            }
        } else if let Some(option) = turned_off
            && lines.contains(format!("{option}=y").as_str())
        {
            wrong.push(format!("{option} is =y but the fragment turns it off"));
        }
    }
    if !wrong.is_empty() {
        bail!("the kernel config fragment did not apply:\n  {}", wrong.join("\n  "));
    }
    Ok(())
}

/// Quotes a string for a POSIX shell command line.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn init_script(tests: &[TestBinary], opts: &Options) -> anyhow::Result<String> {
    let mut env = vec![
        "HOME=/root".to_owned(),
        format!("PATH={}", guest_path()),
        "RUST_BACKTRACE=1".to_owned(),
        "TRACER_VM=1".to_owned(),
    ];
    if opts.bench {
        env.push("TRACER_VM_BENCH=1".to_owned());
    }
    if opts.short_benches {
        env.push(SHORT_BENCH_ENV.to_owned());
    }
    let env: Vec<String> = env.iter().map(|e| shell_quote(e)).collect();
    // Integration tests run from their package directory, as under `cargo test`.
    let cwd = workspace_root().join("tests");
    let mut commands = String::new();
    for test in tests {
        let mut words = vec![&test.name[..], path_str(&cwd)?, path_str(&test.path)?];
        words.extend(opts.args.iter().map(String::as_str));
        let words: Vec<String> = words.iter().map(|w| shell_quote(w)).collect();
        writeln!(commands, "run_test {}", words.join(" "))?;
    }
    let workspace = shell_quote(path_str(&workspace_root())?);
    Ok(INIT_TEMPLATE
        .replace("@@WORKSPACE@@", &workspace)
        .replace("@@ENV@@", &env.join(" "))
        .replace("@@TESTS@@", &commands))
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str().with_context(|| format!("{} is not UTF-8", path.display()))
}

/// PATH inside the guest: the Python that `cargo xtask setup` installed packages into first (the
/// .NET tests run it), then the usual system directories.
fn guest_path() -> String {
    let mut dirs = Vec::new();
    let python_prefix =
        output(Command::new("python3").args(["-c", "import sys; print(sys.prefix)"]));
    if let Ok(prefix) = python_prefix {
        dirs.push(format!("{}/bin", prefix.trim()));
    }
    if let Some(home) = std::env::var_os("HOME") {
        let home = home.to_string_lossy();
        dirs.push(format!("{home}/.pyenv/shims"));
        dirs.push(format!("{home}/.cargo/bin"));
    }
    dirs.extend(
        ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .map(String::from),
    );
    dirs.join(":")
}

/// Writes a gzip-compressed newc cpio archive with busybox, /init and /dev/console. Written in
/// Rust (not with cpio(1)) so the console device node needs no mknod privileges on the host.
fn write_initramfs(path: &Path, init: &str) -> anyhow::Result<()> {
    let busybox_path = Path::new("/bin/busybox");
    let busybox = fs::read(busybox_path).with_context(|| {
        format!("reading {} (Debian package busybox-static)", busybox_path.display())
    })?;
    let mut archive = Newc::default();
    for dir in ["bin", "dev", "proc", "sys", "host"] {
        archive.entry(dir, libc::S_IFDIR | 0o755, 0, &[]);
    }
    // The kernel opens /dev/console for init's stdio before anything is mounted.
    archive.entry("dev/console", libc::S_IFCHR | 0o600, libc::makedev(5, 1), &[]);
    archive.entry("bin/busybox", libc::S_IFREG | 0o755, 0, &busybox);
    archive.entry("init", libc::S_IFREG | 0o755, 0, init.as_bytes());
    let data = archive.finish();

    let partial = path.with_extension("partial");
    let mut gzip = Command::new("gzip")
        .arg("-c")
        .stdin(Stdio::piped())
        .stdout(File::create(&partial)?)
        .spawn()
        .context("spawning gzip")?;
    gzip.stdin.take().expect("piped").write_all(&data)?;
    let status = gzip.wait()?;
    if !status.success() {
        bail!("gzip failed: {status}");
    }
    fs::rename(&partial, path)?;
    Ok(())
}

/// The "new ASCII" cpio format the kernel unpacks initramfs archives from.
#[derive(Default)]
struct Newc {
    data: Vec<u8>,
    next_inode: u32,
}

impl Newc {
    fn entry(&mut self, name: &str, mode: u32, rdev: libc::dev_t, contents: &[u8]) {
        self.next_inode += 1;
        let name_len = name.len() + 1;
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime: fixed, so the archive is reproducible
            u32::try_from(contents.len()).expect("initramfs file under 4 GiB"),
            0, // dev major
            0, // dev minor
            libc::major(rdev),
            libc::minor(rdev),
            u32::try_from(name_len).expect("short name"),
            0, // check
        ];
        self.data.extend_from_slice(b"070701");
        for field in fields {
            self.data.extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.data.extend_from_slice(name.as_bytes());
        self.data.push(0);
        self.pad();
        self.data.extend_from_slice(contents);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.data.len().is_multiple_of(4) {
            self.data.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, 0, &[]);
        self.data
    }
}

/// What the guest reported.
#[derive(Default)]
struct Outcome {
    booted_after: Option<Duration>,
    /// The binaries that started, in start order.
    results: Vec<BinaryRun>,
    done: bool,
    setup_failure: Option<String>,
    kernel_panic: bool,
    timed_out: bool,
    qemu_status: Option<std::process::ExitStatus>,
}

/// One test binary's run in the guest.
#[derive(Debug, Default, PartialEq, Eq)]
struct BinaryRun {
    name: String,
    /// Exit status; `None` = started but no END marker.
    status: Option<i32>,
    /// Its libtest `test result:` line.
    result: Option<TestResult>,
}

/// Boots the guest, streams its console to stderr and `console_log`, and parses the markers.
fn boot(
    kernel: &Path,
    initrd: &Path,
    console_log: &Path,
    timeout: Duration,
) -> anyhow::Result<Outcome> {
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(["-accel", "tcg", "-cpu", "max", "-m", "2048", "-smp", "2"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .args([
            "-virtfs",
            "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
        ])
        .args(["-device", "virtio-rng-pci"])
        // No network card: the tests need none, and its option ROM only slows the boot.
        .args(["-nic", "none"])
        .args(["-nographic", "-no-reboot"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child =
        qemu.spawn().context("starting qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    let (lines_tx, lines) = mpsc::channel::<String>();
    let mut log =
        File::create(console_log).with_context(|| format!("creating {}", console_log.display()))?;
    let stdout_reader = forward_lines(child.stdout.take().expect("piped"), lines_tx.clone());
    let stderr_reader = forward_lines(child.stderr.take().expect("piped"), lines_tx);

    let mut outcome = Outcome::default();
    let deadline = started + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let text = &printable(&line);
                eprintln!("{text}");
                writeln!(log, "{text}")?;
                outcome.observe(text, started.elapsed());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                outcome.timed_out = true;
                eprintln!("vm-test: timeout after {}s: killing qemu", timeout.as_secs());
                child.kill().context("killing qemu")?;
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    outcome.qemu_status = Some(child.wait()?);
    // After a kill the readers see EOF; the channel may still hold lines worth logging.
    let _ = stdout_reader.join();
    let _ = stderr_reader.join();
    for line in lines.try_iter() {
        let text = &printable(&line);
        writeln!(log, "{text}")?;
        outcome.observe(text, started.elapsed());
    }
    Ok(outcome)
}

/// A console line without its line ending, escape sequences and control characters: the
/// firmware's terminal resets and screen clears must not reach the user's terminal.
fn printable(line: &str) -> String {
    let mut text = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            // CSI: ESC [ parameters... final byte in @..~; other escapes: ESC + one character.
            '\x1b' if chars.next_if_eq(&'[').is_some() => {
                while chars.next().is_some_and(|c| !('@'..='~').contains(&c)) {}
            }
            '\x1b' => {
                chars.next();
            }
            '\t' => text.push(c),
            c if c.is_control() => {}
            c => text.push(c),
        }
    }
    text
}

impl Outcome {
    fn observe(&mut self, line: &str, elapsed: Duration) {
        if line.contains("Kernel panic") {
            self.kernel_panic = true;
        }
        // The result line belongs to the binary running now (started, not yet ended).
        if let Some(result) = TestResult::parse(line)
            && let Some(run) = self.results.last_mut().filter(|run| run.status.is_none())
        {
            run.result = Some(result);
        }
        // A test's output may lack a final newline, so a marker can follow other text.
        let Some(at) = line.find(MARKER) else { return };
        let marker = &line[at + MARKER.len()..];
        let (word, rest) = marker.split_once(' ').unwrap_or((marker, ""));
        match word {
            "BOOTED" => self.booted_after = Some(elapsed),
            "START" => {
                self.results.push(BinaryRun { name: rest.to_owned(), ..BinaryRun::default() })
            }
            "END" => {
                let status = rest.rsplit_once(" status=").and_then(|(_, s)| s.parse().ok());
                let name = rest.rsplit_once(" status=").map_or(rest, |(n, _)| n);
                if let Some(run) = self.results.iter_mut().rev().find(|run| run.name == name) {
                    run.status = status;
                }
            }
            "DONE" => self.done = true,
            "SETUP-FAILED" => self.setup_failure = Some(rest.to_owned()),
            _ => {}
        }
    }
}

/// Whether libtest arguments choose which tests run (a name filter, `--skip`, `--ignored`), so
/// a binary may rightly run fewer than all of its tests. `--nocapture` or `--test-threads=1`
/// do not.
fn selects_tests(args: &[String]) -> bool {
    args.iter().any(|a| !a.starts_with('-') || a == "--skip" || a == "--ignored")
}

/// A binary's verdict: its counts, or why it failed. Exit status 0 is not enough: the binary
/// must have printed its result line, run at least one test, and (without a filter given on
/// purpose) ignored and filtered out none.
fn verdict(run: Option<&BinaryRun>, filtered: bool) -> Result<TestResult, String> {
    let run = run.ok_or("NOT RUN")?;
    let counts = |r: &TestResult| {
        format!(
            "{} passed, {} failed, {} ignored, {} filtered out",
            r.passed, r.failed, r.ignored, r.filtered_out
        )
    };
    let result = match (run.status, run.result) {
        (None, _) => {
            return Err("started, no END marker: hung, crashed the guest or timed out".into());
        }
        (Some(0), None) => return Err("exit status 0 but no libtest `test result:` line".into()),
        (Some(status), None) => return Err(format!("exit status {status}, no test result line")),
        (Some(0), Some(result)) => result,
        (Some(status), Some(result)) => {
            return Err(format!("exit status {status}: {}", counts(&result)));
        }
    };
    if filtered {
        return Ok(result);
    }
    if result.passed == 0 {
        return Err(format!("ran no test ({})", counts(&result)));
    }
    if result.ignored > 0 || result.filtered_out > 0 {
        return Err(format!("skipped tests ({})", counts(&result)));
    }
    Ok(result)
}

/// Prints the PASS/FAIL table and sums up the run. `filtered`: arguments (a test name filter)
/// were given on purpose, so binaries may run fewer tests, but not none at all.
fn report(tests: &[TestBinary], outcome: &Outcome, filtered: bool) -> Report {
    eprintln!("\nvm-test: results");
    let mut report = Report { binaries: tests.len(), ..Report::default() };
    // Failures no failed test accounts for (a hang, a binary that ran no test).
    let mut unexplained = 0;
    for test in tests {
        let run = outcome.results.iter().find(|run| run.name == test.name);
        let line = match verdict(run, filtered) {
            Ok(result) => {
                report.totals += result;
                if filtered {
                    format!(
                        "PASS ({} passed; filter given: {} filtered out)",
                        result.passed, result.filtered_out
                    )
                } else {
                    format!("PASS ({} passed)", result.passed)
                }
            }
            Err(why) => {
                let result = run.and_then(|run| run.result).unwrap_or_default();
                report.totals += result;
                unexplained += u64::from(result.failed == 0);
                report.failures.push(format!("{}: {why}", test.name));
                format!("FAIL ({why})")
            }
        };
        eprintln!("  {:<32} {line}", test.name);
    }
    if filtered && report.failures.is_empty() && report.totals.passed == 0 {
        report.failures.push("the filter given matched no test in any binary".into());
        unexplained += 1;
    }
    let mut guest_problems = Vec::new();
    if let Some(what) = &outcome.setup_failure {
        guest_problems.push(format!("guest set-up failed: {what}"));
    }
    if outcome.kernel_panic {
        guest_problems.push("the guest kernel panicked".into());
    }
    if outcome.timed_out {
        guest_problems.push("timed out (raise it with --timeout SECONDS)".into());
    } else if !outcome.done {
        let status = outcome.qemu_status.map_or("unknown".into(), |s| s.to_string());
        guest_problems.push(format!("the guest stopped before its DONE marker (qemu {status})"));
    }
    report.failed = report.totals.failed + unexplained;
    // A guest problem after every binary passed still fails the run.
    if report.failed == 0 && !guest_problems.is_empty() {
        report.failed = 1;
    }
    report.failures.extend(guest_problems);
    report
}

/// Parses `--timeout`: seconds, or a number with an `s`/`m` suffix.
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    let (number, scale) = match text.strip_suffix('m') {
        Some(minutes) => (minutes, 60),
        None => (text.strip_suffix('s').unwrap_or(text), 1),
    };
    let number: u64 = number.parse().map_err(|_| format!("`{text}` is not like 90, 90s or 20m"))?;
    if number == 0 {
        return Err("the timeout must be positive".into());
    }
    Ok(Duration::from_secs(number * scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSED: &str = "test result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.5s";

    fn run(name: &str, status: Option<i32>, result: Option<TestResult>) -> BinaryRun {
        BinaryRun { name: name.into(), status, result }
    }

    fn counts(passed: u64, failed: u64, ignored: u64, filtered_out: u64) -> Option<TestResult> {
        Some(TestResult { passed, failed, ignored, measured: 0, filtered_out })
    }

    #[test]
    fn markers_and_result_lines_are_parsed_even_after_unterminated_test_output() {
        let mut outcome = Outcome::default();
        let t = Duration::from_secs(1);
        outcome.observe("@@TRACER-VM BOOTED kernel=6.12.117 cpus=2", t);
        outcome.observe("@@TRACER-VM START vm_a", t);
        outcome.observe(&format!("no newline{PASSED}"), t);
        outcome.observe("test result: ok@@TRACER-VM END vm_a status=0", t);
        outcome.observe("@@TRACER-VM START vm_b", t);
        outcome.observe("@@TRACER-VM END vm_b status=101", t);
        // Not vm_b's: it ended already.
        outcome.observe(PASSED, t);
        outcome.observe("@@TRACER-VM START vm_c", t);
        assert_eq!(
            outcome.results,
            [
                run("vm_a", Some(0), counts(4, 0, 0, 0)),
                run("vm_b", Some(101), None),
                run("vm_c", None, None)
            ]
        );
        assert_eq!(outcome.booted_after, Some(t));
        assert!(!outcome.done);
        outcome.observe("@@TRACER-VM DONE", t);
        assert!(outcome.done);
    }

    #[test]
    fn exit_status_zero_passes_only_with_tests_run_and_none_skipped() {
        assert_eq!(
            verdict(Some(&run("a", Some(0), counts(4, 0, 0, 0))), false),
            Ok(counts(4, 0, 0, 0).unwrap())
        );
        assert_eq!(
            verdict(Some(&run("a", Some(0), counts(0, 0, 3, 0))), false),
            Err("ran no test (0 passed, 0 failed, 3 ignored, 0 filtered out)".into())
        );
        assert_eq!(
            verdict(Some(&run("a", Some(0), counts(2, 0, 1, 0))), false),
            Err("skipped tests (2 passed, 0 failed, 1 ignored, 0 filtered out)".into())
        );
        assert_eq!(
            verdict(Some(&run("a", Some(0), None)), false),
            Err("exit status 0 but no libtest `test result:` line".into())
        );
        assert_eq!(
            verdict(Some(&run("a", Some(101), counts(3, 1, 0, 0))), false),
            Err("exit status 101: 3 passed, 1 failed, 0 ignored, 0 filtered out".into())
        );
        assert_eq!(verdict(None, false), Err("NOT RUN".into()));
        // A filter given on purpose may leave a binary with nothing to run.
        assert_eq!(
            verdict(Some(&run("a", Some(0), counts(0, 0, 0, 4))), true),
            Ok(counts(0, 0, 0, 4).unwrap())
        );
    }

    fn binaries(names: &[&str]) -> Vec<TestBinary> {
        names.iter().map(|n| TestBinary { name: (*n).into(), path: PathBuf::new() }).collect()
    }

    fn finished(results: Vec<BinaryRun>) -> Outcome {
        Outcome { results, done: true, ..Outcome::default() }
    }

    #[test]
    fn report_counts_failed_tests_and_failing_binaries_once_each() {
        let outcome = finished(vec![
            run("vm_a", Some(0), counts(4, 0, 0, 0)),
            run("vm_b", Some(101), counts(3, 2, 0, 0)),
            run("vm_c", Some(0), counts(0, 0, 5, 0)),
            run("vm_d", None, None),
        ]);
        let report = report(&binaries(&["vm_a", "vm_b", "vm_c", "vm_d"]), &outcome, false);
        assert_eq!(report.binaries, 4);
        assert_eq!(report.totals, counts(7, 2, 5, 0).unwrap());
        // vm_b's two failed tests, plus vm_c (no test run) and vm_d (no END).
        assert_eq!(report.failed, 4);
        assert_eq!(report.failures.len(), 3, "{:?}", report.failures);
        assert!(report.failures[1].starts_with("vm_c: ran no test"), "{:?}", report.failures);
    }

    #[test]
    fn report_of_a_clean_run_has_no_failures() {
        let outcome = finished(vec![run("vm_a", Some(0), counts(4, 0, 0, 0))]);
        let report = report(&binaries(&["vm_a"]), &outcome, false);
        assert_eq!(
            report,
            Report {
                binaries: 1,
                totals: counts(4, 0, 0, 0).unwrap(),
                failed: 0,
                failures: vec![]
            }
        );
    }

    #[test]
    fn only_filters_and_skips_select_tests() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(!selects_tests(&args(&[])));
        assert!(!selects_tests(&args(&["--nocapture", "--test-threads=1"])));
        assert!(selects_tests(&args(&["fork", "--nocapture"])));
        assert!(selects_tests(&args(&["--skip", "fork"])));
        assert!(selects_tests(&args(&["--ignored"])));
    }

    #[test]
    fn guest_problems_and_empty_filters_fail_the_run() {
        let mut outcome = finished(vec![run("vm_a", Some(0), counts(4, 0, 0, 0))]);
        outcome.kernel_panic = true;
        let panicked = report(&binaries(&["vm_a"]), &outcome, false);
        assert_eq!(
            (panicked.failed, panicked.failures),
            (1, vec!["the guest kernel panicked".into()])
        );

        let outcome = finished(vec![run("vm_a", Some(0), counts(0, 0, 0, 4))]);
        let unmatched = report(&binaries(&["vm_a"]), &outcome, true);
        assert_eq!(
            (unmatched.failed, unmatched.failures),
            (1, vec!["the filter given matched no test in any binary".into()])
        );
    }

    #[test]
    fn kernel_panics_are_noticed() {
        let mut outcome = Outcome::default();
        outcome.observe("Kernel panic - not syncing: Attempted to kill init!", Duration::ZERO);
        assert!(outcome.kernel_panic);
    }

    #[test]
    fn console_lines_lose_escape_sequences_and_control_characters() {
        assert_eq!(printable("\x1bc\x1b[?7l\x1b[2JBooting from ROM..\r\n"), "Booting from ROM..");
        assert_eq!(printable("\x1b[0mSeaBIOS\tok\x07"), "SeaBIOS\tok");
    }

    #[test]
    fn fragment_verification_lists_dropped_options() {
        let err = verify_config("CONFIG_64BIT=y\nCONFIG_MODULES=y\n").unwrap_err().to_string();
        assert!(err.contains("USER_EVENTS is not =y"), "{err}");
        assert!(err.contains("MODULES is =y but the fragment turns it off"), "{err}");
        assert!(!err.contains("CONFIG_64BIT "), "{err}");
    }

    #[test]
    fn merging_replaces_the_base_settings_of_fragment_symbols() {
        let merged = merge_fragment(
            "CONFIG_64BIT=y\n# CONFIG_USER_EVENTS is not set\nCONFIG_MODULES=y\nCONFIG_X=3\n",
        );
        assert!(merged.starts_with("CONFIG_X=3\n"), "{merged}");
        assert_eq!(merged.matches("CONFIG_64BIT=y").count(), 1);
        assert!(!merged.contains("USER_EVENTS is not set"));
        assert!(!merged.contains("CONFIG_MODULES=y"));
        assert!(merged.contains("CONFIG_USER_EVENTS=y\n"));
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout("20m"), Ok(Duration::from_secs(1200)));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("1h").is_err());
    }

    #[test]
    fn shell_quoting_survives_single_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
