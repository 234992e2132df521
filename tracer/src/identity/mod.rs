//! Who a process is beyond its pid: its cgroup v2 path and the container and pod that path
//! names (read from `/proc/<pid>/cgroup`), and whether the `run`/`audit` filters (`--container`,
//! `--pod-uid`, `--cgroup`, `--require-env`) select it.
//!
//! Every byte read here belongs to another process: reads are bounded by the constants below,
//! parsing is `tracer_decode::container` (pure, fuzzed), and a process that vanished is simply
//! unknown (no labels; excluded when a filter is active, since it cannot be proven to match).
mod filter;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tracer_decode::container::parse_cgroup_path;
use tracer_decode::procfs::cgroup_v2_path;

pub use self::filter::{EnvRequirement, ProcessFilter};
pub use crate::kernel::procfs::cgroup_v2_mount;
use crate::kernel::procfs::read_bounded;
pub use crate::output::ProcessLabels;

/// Bytes read from `/proc/<pid>/cgroup`: one line per v1 hierarchy plus the v2 `0::` line, each
/// path at most PATH_MAX (the kernel's limit when it prints them). A file cut at this bound
/// loses only its last, incomplete line.
pub const MAX_PROC_CGROUP_BYTES: u64 = 64 * 1024;
/// Bytes read from `/proc/<pid>/environ` for `--require-env` (a variable past this bound is not
/// seen; Linux itself bounds one string at 128 KiB and the whole block by the stack limit).
pub const MAX_ENVIRON_BYTES: u64 = 256 * 1024;
/// Processes whose identity a pipeline remembers (pid → labels and filter verdict). When full the
/// memory is dropped and rebuilt from /proc on demand; entries leave on exit events.
pub const MAX_TRACKED_PROCESSES: usize = 32 * 1024;
/// Cgroup ids a pipeline remembers with the labels of the cgroup they name (for processes gone
/// before their `/proc` entry was read). When full the memory is dropped.
pub const MAX_CGROUP_IDS: usize = 4096;
/// Cgroup directories one look-up of a cgroup id may examine in the cgroup2 hierarchy.
pub const MAX_CGROUP_WALK: usize = 65_536;

/// The cgroup path, container id and pod uid of `pid`, or `None` when it is gone.
pub fn read_labels(pid: u32) -> Option<ProcessLabels> {
    let (mut text, truncated) =
        read_bounded(&PathBuf::from(format!("/proc/{pid}/cgroup")), MAX_PROC_CGROUP_BYTES).ok()?;
    if truncated {
        // The last line is incomplete: a prefix of a path must not be taken for the path.
        let end = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        text.truncate(end);
    }
    Some(labels_of(&String::from_utf8_lossy(&text)))
}

/// Labels from a `/proc/<pid>/cgroup` text (no v2 line: no labels).
pub fn labels_of(proc_cgroup: &str) -> ProcessLabels {
    cgroup_v2_path(proc_cgroup).map(labels_of_path).unwrap_or_default()
}

/// Labels of the cgroup v2 `path` (as `/proc/<pid>/cgroup` shows it).
fn labels_of_path(path: &str) -> ProcessLabels {
    let identity = parse_cgroup_path(path);
    ProcessLabels {
        cgroup: Some(path.to_string()),
        container_id: identity.container_id.map(str::to_string),
        pod_uid: identity.pod_uid,
        ..ProcessLabels::default()
    }
}

/// `environ` of `pid`, bounded; `None` when it cannot be read.
pub fn read_environ(pid: u32) -> Option<Vec<u8>> {
    read_bounded(&PathBuf::from(format!("/proc/{pid}/environ")), MAX_ENVIRON_BYTES)
        .ok()
        .map(|(env, _)| env)
}

/// Labels of the processes that have sessions, shared with the session tasks that render their
/// events (`dotnet_event` lines carry the same labels as the detection that started them).
#[derive(Clone, Debug, Default)]
pub struct LabelRegistry(Arc<RwLock<HashMap<u32, Arc<ProcessLabels>>>>);

impl LabelRegistry {
    pub fn get(&self, pid: u32) -> Option<Arc<ProcessLabels>> {
        self.0.read().ok()?.get(&pid).cloned()
    }

    pub fn insert(&self, pid: u32, labels: Arc<ProcessLabels>) {
        if let Ok(mut map) = self.0.write() {
            map.insert(pid, labels);
        }
    }

    pub fn remove(&self, pid: u32) {
        if let Ok(mut map) = self.0.write() {
            map.remove(&pid);
        }
    }

    pub fn len(&self) -> usize {
        self.0.read().map_or(0, |m| m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a pipeline knows about one process.
#[derive(Clone, Debug)]
pub struct Tracked {
    /// `None`: the process was gone before tracer could read its cgroup.
    pub labels: Option<Arc<ProcessLabels>>,
    /// The filters select it (always true without filters).
    pub included: bool,
    /// The cgroup id the kernel reported when the entry was made: a different one later means
    /// the process moved and is looked up again.
    cgroup_id: Option<u64>,
}

/// A pipeline's memory of process identities and filter verdicts.
#[derive(Debug, Default)]
pub struct ProcessTracker {
    filter: ProcessFilter,
    processes: HashMap<u32, Tracked>,
    /// Cgroup id → the labels of the cgroup it names (`None`: not found).
    cgroups: HashMap<u64, Option<Arc<ProcessLabels>>>,
}

impl ProcessTracker {
    pub fn new(filter: ProcessFilter) -> ProcessTracker {
        ProcessTracker { filter, processes: HashMap::new(), cgroups: HashMap::new() }
    }

    pub fn filter(&self) -> &ProcessFilter {
        &self.filter
    }

    /// The identity and verdict of `pid`, from memory or /proc. `cgroup_id` is the kernel's
    /// (BPF events), `None` where it is not known (procfs findings).
    pub fn lookup(&mut self, pid: u32, cgroup_id: Option<u64>) -> Tracked {
        // An entry made without the kernel's cgroup id (the procfs scan) cannot tell a reused
        // pid or a move: the first kernel event reads /proc again.
        if let Some(t) = self.processes.get(&pid)
            && (cgroup_id.is_none() || t.cgroup_id == cgroup_id)
        {
            return t.clone();
        }
        match self.read(pid, cgroup_id) {
            Some(tracked) => {
                self.remember(pid, tracked.clone());
                tracked
            }
            // Gone before it could be read (a short-lived process while tracer is behind): not
            // remembered (its pid may be reused), but the kernel's cgroup id still tells where it
            // ran — enough for every filter but --require-env, whose environment is gone.
            None => {
                let labels = cgroup_id.and_then(|id| self.labels_of_cgroup(id));
                let included = self.filter.is_empty()
                    || labels.as_deref().is_some_and(|l| self.filter.matches(l, || None));
                Tracked { labels, included, cgroup_id }
            }
        }
    }

    /// The labels of the cgroup whose id is `id`, remembered; found by walking the cgroup2
    /// hierarchy (at most [`MAX_CGROUP_WALK`] directories) for the directory of that inode.
    fn labels_of_cgroup(&mut self, id: u64) -> Option<Arc<ProcessLabels>> {
        if let Some(known) = self.cgroups.get(&id) {
            return known.clone();
        }
        let found = cgroup_v2_mount()
            .and_then(|mount| find_cgroup(&mount, id))
            .map(|path| Arc::new(labels_of_path(&path)));
        if self.cgroups.len() >= MAX_CGROUP_IDS {
            self.cgroups.clear();
        }
        self.cgroups.insert(id, found.clone());
        found
    }

    /// After an exec: a new program image and environment, read again; when the process is
    /// already gone, what it had before the exec (same cgroup, inherited environment).
    pub fn refresh(&mut self, pid: u32, cgroup_id: Option<u64>) -> Tracked {
        match self.read(pid, cgroup_id) {
            Some(fresh) => {
                self.remember(pid, fresh.clone());
                fresh
            }
            None => self.lookup(pid, cgroup_id),
        }
    }

    /// A fork: the child starts in its parent's cgroup with its parent's environment, so it
    /// inherits what is known of the parent (a child that exits at once is still identified).
    pub fn inherit(&mut self, parent: u32, child: u32) {
        if let Some(t) = self.processes.get(&parent).cloned() {
            self.remember(child, t);
        }
    }

    /// `None` when the process is gone, or its environment is needed but gone (an exited
    /// process's `environ` reads empty while its `cgroup` still reads).
    fn read(&self, pid: u32, cgroup_id: Option<u64>) -> Option<Tracked> {
        let labels = Arc::new(read_labels(pid)?);
        let mut environ_gone = false;
        let included = self.filter.is_empty()
            || self.filter.matches(&labels, || {
                let env = read_environ(pid).filter(|e| !e.is_empty());
                environ_gone = env.is_none();
                env
            });
        if environ_gone {
            return None;
        }
        Some(Tracked { labels: Some(labels), included, cgroup_id })
    }

    fn remember(&mut self, pid: u32, tracked: Tracked) {
        if self.processes.len() >= MAX_TRACKED_PROCESSES {
            self.processes.clear();
        }
        self.processes.insert(pid, tracked);
    }

    /// Drops what is known of `pid` (it exited, or exec'd into a new environment).
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }

    pub fn len(&self) -> usize {
        self.processes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }
}

/// The path (as `/proc/<pid>/cgroup` shows it, `/` for the root) of the cgroup under `mount`
/// whose directory has inode `id` — the cgroup id BPF's `bpf_get_current_cgroup_id` reports.
fn find_cgroup(mount: &Path, id: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    if std::fs::metadata(mount).ok()?.ino() == id {
        return Some("/".into());
    }
    let mut pending = vec![mount.to_path_buf()];
    let mut examined = 0;
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            examined += 1;
            if examined > MAX_CGROUP_WALK {
                return None;
            }
            if entry.metadata().is_ok_and(|m| m.ino() == id) {
                let relative =
                    entry.path().strip_prefix(mount).ok()?.to_string_lossy().into_owned();
                return Some(format!("/{relative}"));
            }
            pending.push(entry.path());
        }
    }
    None
}

/// Container ids of every process now running (for resolving `--container` prefixes).
pub(super) fn running_container_ids() -> Vec<String> {
    let mut ids: Vec<String> = crate::kernel::procfs::pids()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|pid| read_labels(pid)?.container_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_from_a_hybrid_hosts_cgroup_file() {
        let id = "ab".repeat(32);
        let text = format!(
            "12:pids:/\n1:name=systemd:/\n0::/kubepods/besteffort/pod0c8f2a4e-5b1d-4c3a-9e7f-6d5b4a3c2e1f/{id}\n"
        );
        let l = labels_of(&text);
        assert_eq!(l.container_id.as_deref(), Some(id.as_str()));
        assert_eq!(l.pod_uid.as_deref(), Some("0c8f2a4e-5b1d-4c3a-9e7f-6d5b4a3c2e1f"));
        assert_eq!(
            l.cgroup.as_deref(),
            Some(
                format!("/kubepods/besteffort/pod0c8f2a4e-5b1d-4c3a-9e7f-6d5b4a3c2e1f/{id}")
                    .as_str()
            )
        );
        assert_eq!(labels_of("1:name=systemd:/\n"), ProcessLabels::default());
    }

    #[test]
    fn own_process() {
        let me = std::process::id();
        let labels = read_labels(me).expect("own cgroup file");
        assert!(labels.cgroup.as_deref().is_some_and(|c| c.starts_with('/')), "{labels:?}");
        let env = read_environ(me).unwrap();
        assert!(tracer_decode::container::environ_has(&env, b"PATH", None));
        assert_eq!(read_labels(u32::MAX), None);
    }
}
