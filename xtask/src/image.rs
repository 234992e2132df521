//! `cargo xtask image`: the container image of tracer, built here without a registry.
//!
//! The release binary and exactly the shared libraries it links (as its loader resolves them) are
//! staged into a build context (`rootfs/`), which `deploy/container/Containerfile` copies onto
//! an empty image; buildah builds it into local container storage, where podman runs it. A CI
//! with another builder builds the same context (`--stage DIR`, then `docker build`): the
//! Containerfile is the one description of the image (docs/deploy.md).
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util::{cargo, output, run_cmd, workspace_root};

/// The image's description, relative to the workspace root.
pub const CONTAINERFILE: &str = "deploy/container/Containerfile";
/// Where the binary is in the image (the Containerfile's ENTRYPOINT).
const BINARY_IN_IMAGE: &str = "usr/local/bin/tracer";
/// The repository of the image in local container storage; the tag is tracer's version.
pub const LOCAL_REPOSITORY: &str = "localhost/tracer";
/// The default build context, under the workspace's target directory.
const DEFAULT_CONTEXT: &str = "target/image";

pub struct Options {
    /// Only stage the build context here (for another builder); build nothing.
    pub stage_only: Option<PathBuf>,
    /// The image name instead of `localhost/tracer:<version>`.
    pub tag: Option<String>,
}

pub fn run(options: &Options) -> anyhow::Result<()> {
    crate::setup::run()?;
    match &options.stage_only {
        Some(dir) => {
            let version = stage(dir)?;
            println!(
                "staged the build context of tracer {version} in {}; build it with e.g.\n  \
                 docker build -f {CONTAINERFILE} --build-arg VERSION={version} -t \
                 REGISTRY/tracer:{version} {}",
                dir.display(),
                dir.display()
            );
            Ok(())
        }
        None => build(options.tag.as_deref()).map(|name| println!("{name}")),
    }
}

/// Builds the image into local container storage and returns its name. The image a tag named
/// before is removed when the new one replaces it (rebuilt in every test run, they would pile
/// up), unless a container still uses it.
pub fn build(tag: Option<&str>) -> anyhow::Result<String> {
    crate::util::require_root("buildah writes the image into root's container storage")?;
    let context = workspace_root().join(DEFAULT_CONTEXT);
    let version = stage(&context)?;
    let name = tag.map_or_else(|| format!("{LOCAL_REPOSITORY}:{version}"), str::to_owned);
    let before = image_id(&name);
    run_cmd(
        Command::new("buildah")
            .args(["build", "--quiet", "--layers=false", "--file"])
            .arg(workspace_root().join(CONTAINERFILE))
            .args(["--build-arg", &format!("VERSION={version}"), "--tag", &name])
            // Every file's time is the epoch: the same binary gives the same image.
            .args(["--timestamp", "0"])
            .arg(&context),
    )
    .with_context(|| format!("building {name} with buildah from {}", context.display()))?;
    let after = image_id(&name);
    if let (Some(old), Some(new)) = (before, &after)
        && &old != new
    {
        // Best effort: a container of the old image keeps it.
        let _ = Command::new("buildah").args(["rmi", &old]).output();
    }
    let size = output(
        Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}"]).arg(&name),
    )
    .ok()
    .and_then(|s| s.trim().parse::<u64>().ok());
    match size {
        Some(bytes) => eprintln!("image: built {name} ({:.1} MB)", bytes as f64 / 1e6),
        None => eprintln!("image: built {name}"),
    }
    Ok(name)
}

fn image_id(name: &str) -> Option<String> {
    output(Command::new("podman").args(["image", "inspect", "--format", "{{.Id}}", name]))
        .ok()
        .map(|id| id.trim().to_owned())
}

/// Builds tracer (release) and stages the build context in `dir`: `rootfs/` with the binary
/// and its libraries. Returns tracer's version.
fn stage(dir: &Path) -> anyhow::Result<String> {
    cargo(&["build", "--release", "-p", "tracer"])?;
    let binary = workspace_root().join("target/release/tracer");
    let version = binary_version(&binary)?;
    let rootfs = dir.join("rootfs");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
    }
    copy_to_root(&binary, &rootfs, Path::new(BINARY_IN_IMAGE))?;
    let ldd = output(Command::new("ldd").arg(&binary)).context("listing tracer's libraries")?;
    for library in linked_libraries(&ldd)? {
        let in_image = library.strip_prefix("/").unwrap_or(&library).to_path_buf();
        copy_to_root(&library, &rootfs, &in_image)?;
    }
    Ok(version)
}

/// `tracer --version` prints `tracer 0.1.0`.
fn binary_version(binary: &Path) -> anyhow::Result<String> {
    let printed = output(Command::new(binary).arg("--version"))?;
    let version = printed.trim().strip_prefix("tracer ").context("`tracer --version`")?;
    Ok(version.to_owned())
}

/// Copies `from` (its content: a symbolic link is followed) to `relative` under `root`.
fn copy_to_root(from: &Path, root: &Path, relative: &Path) -> anyhow::Result<()> {
    let to = root.join(relative);
    fs::create_dir_all(to.parent().expect("a file under the root"))
        .with_context(|| format!("creating the directory of {}", to.display()))?;
    fs::copy(from, &to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// The files of the libraries `ldd` lists, each at the path the loader found it (the loader
/// itself at its `PT_INTERP` path); the vDSO, which the kernel maps, has none.
fn linked_libraries(ldd: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut libraries = Vec::new();
    for line in ldd.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (name, found) = match line.split_once(" => ") {
            Some((name, found)) => (name, found),
            None => (line, line),
        };
        if found.starts_with("not found") {
            bail!("ldd: tracer links {name}, which is not found");
        }
        let path = found.split(" (0x").next().unwrap_or(found).trim();
        if path.starts_with('/') {
            libraries.push(PathBuf::from(path));
        } else if !name.starts_with("linux-vdso") {
            bail!("ldd: cannot tell where {line:?} is");
        }
    }
    Ok(libraries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_are_read_from_ldd() {
        // As Debian 12's ldd prints tracer's libraries.
        let ldd = "\tlinux-vdso.so.1 (0x00007fdf83bd1000)\n\
            \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007fdf83ba0000)\n\
            \tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007fdf83ac0000)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fdf8301e000)\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007fdf83bd3000)\n";
        assert_eq!(
            linked_libraries(ldd).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libm.so.6",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2",
            ]
            .map(PathBuf::from)
        );
        let missing = linked_libraries("\tlibelf.so.1 => not found\n").unwrap_err();
        assert_eq!(missing.to_string(), "ldd: tracer links libelf.so.1, which is not found");
    }
}
