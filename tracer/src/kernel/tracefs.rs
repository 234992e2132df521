//! Locating (and if needed mounting) tracefs, and reading event descriptions from it.
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::decode::ftrace::format::EventFormat;

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
