//! Real cgroup v2 directories named like container runtimes name theirs, for the container and
//! pod identity tests: created under the cgroup2 mount in a per-test parent, processes moved in
//! by writing `cgroup.procs`, everything moved out and removed on drop.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// A fake but well-formed 64-hex container id: `prefix`, then `seed`'s low 24 bits (so the
/// 12-digit short ids of seeds that differ there differ too, after a 6-digit prefix), then its
/// digits repeated (ids of one prefix and seed share every prefix).
pub fn container_id(prefix: &str, seed: u32) -> String {
    let tail = format!("{:06x}{}", seed & 0xff_ffff, format!("{seed:08x}").repeat(8));
    format!("{prefix}{}", &tail[..64 - prefix.len()])
}

/// A test's own cgroup subtree; every cgroup it made is removed on drop (deepest first), after
/// moving what still runs there back to the root.
pub struct CgroupTree {
    mount: PathBuf,
    /// `/<name>`: the tree's root as `/proc/<pid>/cgroup` shows it.
    root: String,
    made: Vec<PathBuf>,
}

impl CgroupTree {
    /// A new `/tracer-test-<pid>-<name>` below the cgroup2 mount. Fails (never skips) when the
    /// machine has no cgroup v2 hierarchy.
    pub fn new(name: &str) -> anyhow::Result<CgroupTree> {
        let Some(mount) = tracer::identity::cgroup_v2_mount() else {
            bail!("no cgroup2 mount in /proc/self/mounts: these tests need cgroup v2");
        };
        let mut tree = CgroupTree {
            mount,
            root: format!("/tracer-test-{}-{name}", std::process::id()),
            made: Vec::new(),
        };
        let root = tree.root.clone();
        tree.mkdir(&root)?;
        Ok(tree)
    }

    /// The tree's root cgroup path (as /proc shows it).
    pub fn root(&self) -> &str {
        &self.root
    }

    fn mkdir(&mut self, cgroup: &str) -> anyhow::Result<()> {
        let dir = self.mount.join(cgroup.trim_start_matches('/'));
        if !dir.exists() {
            std::fs::create_dir(&dir)
                .with_context(|| format!("creating cgroup {}", dir.display()))?;
            self.made.push(dir);
        }
        Ok(())
    }

    /// Creates `<root>/<relative>` and its parents; returns its cgroup path.
    pub fn create(&mut self, relative: &str) -> anyhow::Result<String> {
        let mut path = self.root.clone();
        for component in relative.split('/').filter(|c| !c.is_empty()) {
            path = format!("{path}/{component}");
            self.mkdir(&path)?;
        }
        Ok(path)
    }

    /// Moves `pid` into `cgroup` (a path from [`CgroupTree::create`]).
    pub fn enter(&self, cgroup: &str, pid: u32) -> anyhow::Result<()> {
        let procs = self.mount.join(cgroup.trim_start_matches('/')).join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .with_context(|| format!("moving {pid} into {}", procs.display()))
    }

    fn evacuate(&self, dir: &Path) {
        let root_procs = self.mount.join("cgroup.procs");
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(&root_procs, pid);
            }
        }
    }
}

impl Drop for CgroupTree {
    fn drop(&mut self) {
        for dir in self.made.iter().rev() {
            self.evacuate(dir);
            if let Err(e) = std::fs::remove_dir(dir) {
                eprintln!("removing cgroup {}: {e}", dir.display());
            }
        }
    }
}
