//! The process filters of `run` and `audit`. Values of one flag are alternatives (any may match);
//! different flags must all match. A process no filter selects gets no session and no lines.
use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context as _, bail, ensure};
use tracer_decode::container::{
    CONTAINER_ID_LEN, cgroup_is_within, environ_has, is_container_id, is_pod_uid,
};

use super::ProcessLabels;

/// Shortest `--container` prefix accepted (docker's short ids are 12 hex digits).
pub const MIN_CONTAINER_PREFIX: usize = 12;

/// `--require-env NAME[=VALUE]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvRequirement {
    pub name: String,
    pub value: Option<String>,
}

impl std::str::FromStr for EnvRequirement {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<EnvRequirement> {
        let (name, value) = match s.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (s, None),
        };
        ensure!(!name.is_empty(), "--require-env {s:?}: the variable name is empty");
        ensure!(!s.contains('\0'), "--require-env {s:?}: NUL is not allowed");
        Ok(EnvRequirement { name: name.to_string(), value })
    }
}

/// One `--container` value: a full id, or a prefix that names exactly one container.
#[derive(Debug, Default)]
struct ContainerMatch {
    prefix: String,
    /// The full id the prefix stands for, once known (at start-up when that container runs, or
    /// at the first matching process). Other containers with the same prefix are refused.
    full: Mutex<Option<String>>,
}

impl Clone for ContainerMatch {
    fn clone(&self) -> ContainerMatch {
        let full = self.full.lock().map(|f| f.clone()).unwrap_or_default();
        ContainerMatch { prefix: self.prefix.clone(), full: Mutex::new(full) }
    }
}

impl PartialEq for ContainerMatch {
    fn eq(&self, other: &ContainerMatch) -> bool {
        self.prefix == other.prefix
    }
}

impl ContainerMatch {
    fn matches(&self, id: &str) -> bool {
        if !id.starts_with(&self.prefix) {
            return false;
        }
        let Ok(mut full) = self.full.lock() else { return false };
        match full.as_deref() {
            Some(pinned) if pinned == id => true,
            Some(pinned) => {
                log::warn!(
                    "--container {}: container {id} also has this prefix; only {pinned} is traced",
                    self.prefix
                );
                false
            }
            None => {
                *full = Some(id.to_string());
                true
            }
        }
    }
}

/// `--container`, `--pod-uid`, `--cgroup`, `--require-env`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessFilter {
    containers: Vec<ContainerMatch>,
    pod_uids: Vec<String>,
    cgroups: Vec<String>,
    require_env: Vec<EnvRequirement>,
}

impl ProcessFilter {
    /// Checks and normalises the values: container ids are hex (≥ 12 digits, lowercased), pod
    /// uids are UUIDs or static-pod hashes (`_` accepted for `-`, as systemd slice names write
    /// them), cgroups are absolute paths either as `/proc/<pid>/cgroup` prints them or under the
    /// cgroup v2 mount `cgroup_mount`.
    pub fn new(
        containers: &[String],
        pod_uids: &[String],
        cgroups: &[String],
        require_env: Vec<EnvRequirement>,
        cgroup_mount: Option<&Path>,
    ) -> anyhow::Result<ProcessFilter> {
        let containers = containers
            .iter()
            .map(|c| {
                let id = c.to_ascii_lowercase();
                ensure!(
                    (MIN_CONTAINER_PREFIX..=CONTAINER_ID_LEN).contains(&id.len())
                        && id.bytes().all(|b| b.is_ascii_hexdigit()),
                    "--container {c:?}: expected a container id, {MIN_CONTAINER_PREFIX} to \
                     {CONTAINER_ID_LEN} hex digits"
                );
                let full = is_container_id(&id).then(|| id.clone());
                Ok(ContainerMatch { prefix: id, full: Mutex::new(full) })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let pod_uids = pod_uids
            .iter()
            .map(|u| {
                let uid = u.to_ascii_lowercase().replace('_', "-");
                ensure!(
                    is_pod_uid(&uid),
                    "--pod-uid {u:?}: expected a pod UID (8-4-4-4-12 hex digits, or 32 hex digits \
                     for a static pod)"
                );
                Ok(uid)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let cgroups = cgroups
            .iter()
            .map(|c| {
                let under_mount = cgroup_mount
                    .and_then(|m| Path::new(c).strip_prefix(m).ok())
                    .map(|rest| format!("/{}", rest.display()));
                let path = under_mount.unwrap_or_else(|| c.clone());
                ensure!(path.starts_with('/'), "--cgroup {c:?}: expected an absolute cgroup path");
                let trimmed = path.trim_end_matches('/');
                Ok(if trimmed.is_empty() { "/".to_string() } else { trimmed.to_string() })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(ProcessFilter { containers, pod_uids, cgroups, require_env })
    }

    /// This filter with its containers narrowed to `containers` (a served profile's
    /// `container=`): the other flags stay. Each must be within what this filter selects: any
    /// container when it has no `--container`, else one whose id extends a `--container` prefix
    /// (or the container a prefix stands for).
    pub fn narrowed_to_containers(&self, containers: &[String]) -> anyhow::Result<ProcessFilter> {
        let asked = ProcessFilter::new(containers, &[], &[], Vec::new(), None)?.containers;
        let narrowed = if self.containers.is_empty() {
            asked
        } else {
            let within = |asked: &ContainerMatch| {
                self.containers.iter().find_map(|traced| {
                    let pinned = traced.full.lock().ok()?.clone();
                    match pinned {
                        Some(full) => full.starts_with(&asked.prefix).then(|| full.clone()),
                        None if asked.prefix.starts_with(&traced.prefix) => {
                            Some(asked.prefix.clone())
                        }
                        None => {
                            traced.prefix.starts_with(&asked.prefix).then(|| traced.prefix.clone())
                        }
                    }
                })
            };
            asked
                .iter()
                .map(|a| {
                    let prefix = within(a).with_context(|| {
                        format!("container {}: not among the containers this run traces", a.prefix)
                    })?;
                    let full = is_container_id(&prefix).then(|| prefix.clone());
                    Ok(ContainerMatch { prefix, full: Mutex::new(full) })
                })
                .collect::<anyhow::Result<Vec<_>>>()?
        };
        Ok(ProcessFilter { containers: narrowed, ..self.clone() })
    }

    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
            && self.pod_uids.is_empty()
            && self.cgroups.is_empty()
            && self.require_env.is_empty()
    }

    /// [`resolve_prefixes`](Self::resolve_prefixes) against the containers running now (which
    /// takes a look at every process's cgroup: skipped without `--container`).
    pub fn resolve_prefixes_now(&self) -> anyhow::Result<()> {
        if self.containers.is_empty() {
            return Ok(());
        }
        self.resolve_prefixes(&super::running_container_ids())
    }

    /// Pins every `--container` prefix to the one container of `running` it names; two or more
    /// is an error (the prefix is ambiguous). A prefix no running container has stays open and
    /// is pinned by the first process that matches it.
    pub fn resolve_prefixes(&self, running: &[String]) -> anyhow::Result<()> {
        for c in &self.containers {
            let mut full = c.full.lock().map_err(|_| anyhow::anyhow!("poisoned lock"))?;
            if full.is_some() {
                continue;
            }
            let matching: Vec<&String> =
                running.iter().filter(|id| id.starts_with(&c.prefix)).collect();
            match matching.as_slice() {
                [] => log::info!(
                    "--container {}: no running container has this prefix yet; the first that \
                     does will be traced",
                    c.prefix
                ),
                [one] => *full = Some(one.to_string()),
                many => bail!(
                    "--container {}: ambiguous prefix, it matches {} running containers: {}",
                    c.prefix,
                    many.len(),
                    many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
        Ok(())
    }

    /// Whether a process with these labels (and the environment `environ` reads, asked only
    /// when `--require-env` is given) is selected.
    pub fn matches(
        &self,
        labels: &ProcessLabels,
        environ: impl FnOnce() -> Option<Vec<u8>>,
    ) -> bool {
        if !self.containers.is_empty() {
            let Some(id) = labels.container_id.as_deref() else { return false };
            if !self.containers.iter().any(|c| c.matches(id)) {
                return false;
            }
        }
        if !self.pod_uids.is_empty() {
            let Some(uid) = labels.pod_uid.as_deref() else { return false };
            if !self.pod_uids.iter().any(|u| u == uid) {
                return false;
            }
        }
        if !self.cgroups.is_empty() {
            let Some(path) = labels.cgroup.as_deref() else { return false };
            if !self.cgroups.iter().any(|c| cgroup_is_within(path, c)) {
                return false;
            }
        }
        if !self.require_env.is_empty() {
            let Some(env) = environ() else { return false };
            if !self.require_env.iter().all(|r| {
                environ_has(&env, r.name.as_bytes(), r.value.as_deref().map(str::as_bytes))
            }) {
                return false;
            }
        }
        true
    }

    /// Parses `NAME[=VALUE]` values (clap gives them as strings).
    pub fn env_requirements(values: &[String]) -> anyhow::Result<Vec<EnvRequirement>> {
        values.iter().map(|v| v.parse().context("--require-env")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaa11111111111111111111111111111111111111111111111111aa";
    const A2: &str = "aaaaaaaaaaaa22222222222222222222222222222222222222222222222222aa";
    const UID: &str = "0c8f2a4e-5b1d-4c3a-9e7f-6d5b4a3c2e1f";

    fn labels(container: Option<&str>, pod: Option<&str>, cgroup: &str) -> ProcessLabels {
        ProcessLabels {
            cgroup: Some(cgroup.into()),
            container_id: container.map(Into::into),
            pod_uid: pod.map(Into::into),
            ..ProcessLabels::default()
        }
    }

    fn filter(containers: &[&str], pods: &[&str], cgroups: &[&str], env: &[&str]) -> ProcessFilter {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        ProcessFilter::new(
            &s(containers),
            &s(pods),
            &s(cgroups),
            ProcessFilter::env_requirements(&s(env)).unwrap(),
            Some(Path::new("/sys/fs/cgroup/unified")),
        )
        .unwrap()
    }

    fn no_env() -> Option<Vec<u8>> {
        panic!("environ read without --require-env")
    }

    #[test]
    fn validation() {
        let bad = |c: &[&str], p: &[&str], g: &[&str]| {
            let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            ProcessFilter::new(&s(c), &s(p), &s(g), Vec::new(), None).unwrap_err().to_string()
        };
        assert!(bad(&["abc"], &[], &[]).contains("12 to 64 hex digits"));
        assert!(bad(&["zzzzzzzzzzzzzz"], &[], &[]).contains("hex digits"));
        assert!(bad(&[&format!("{A}0")], &[], &[]).contains("hex digits"));
        assert!(bad(&[], &["nope"], &[]).contains("pod UID"));
        assert!(bad(&[], &[], &["relative/x"]).contains("absolute"));
        assert!("=x".parse::<EnvRequirement>().is_err());
        assert_eq!(
            "A=b=c".parse::<EnvRequirement>().unwrap(),
            EnvRequirement { name: "A".into(), value: Some("b=c".into()) }
        );
        // Upper case and systemd's underscores are normalised.
        let f = filter(&[&A.to_uppercase()], &[&UID.replace('-', "_")], &[], &[]);
        assert!(f.matches(&labels(Some(A), Some(UID), "/x"), no_env));
    }

    #[test]
    fn each_filter_includes_and_excludes() {
        let pod = labels(Some(A), Some(UID), "/kubepods.slice/p.slice/c.scope");
        let other = labels(Some(A2), None, "/system.slice/docker-x.scope");
        let bare = labels(None, None, "/user.slice");

        let f = filter(&[A], &[], &[], &[]);
        assert!(f.matches(&pod, no_env) && !f.matches(&other, no_env) && !f.matches(&bare, no_env));
        let f = filter(&[], &[UID], &[], &[]);
        assert!(f.matches(&pod, no_env) && !f.matches(&other, no_env));
        // Subtree: the cgroup and below, as /proc prints it or under the v2 mount.
        for g in ["/kubepods.slice", "/kubepods.slice/", "/sys/fs/cgroup/unified/kubepods.slice"] {
            let f = filter(&[], &[], &[g], &[]);
            assert!(f.matches(&pod, no_env), "{g}");
            assert!(!f.matches(&other, no_env), "{g}");
        }
        assert!(!filter(&[], &[], &["/kubepods"], &[]).matches(&pod, no_env), "not a component");
        assert!(filter(&[], &[], &["/"], &[]).matches(&bare, no_env));
        // Alternatives within a flag, all flags together.
        let f = filter(&[A, A2], &[], &[], &[]);
        assert!(f.matches(&pod, no_env) && f.matches(&other, no_env));
        let f = filter(&[A2], &[UID], &[], &[]);
        assert!(!f.matches(&pod, no_env) && !f.matches(&other, no_env));
        // Environment.
        let f = filter(&[], &[], &[], &["TRACE_ME=1", "OTHER"]);
        assert!(f.matches(&bare, || Some(b"OTHER=\0TRACE_ME=1\0".to_vec())));
        assert!(!f.matches(&bare, || Some(b"TRACE_ME=1\0".to_vec())));
        assert!(!f.matches(&bare, || None), "unreadable environ: not selected");
    }

    #[test]
    fn prefixes_resolve_uniquely() {
        let prefix = &A[..12];
        let f = filter(&[prefix], &[], &[], &[]);
        let err = f.resolve_prefixes(&[A.into(), A2.into()]).unwrap_err().to_string();
        assert!(err.contains("ambiguous prefix, it matches 2 running containers"), "{err}");
        f.resolve_prefixes(&[A2.into(), "b".repeat(64)]).unwrap();
        assert!(f.matches(&labels(Some(A2), None, "/"), no_env));
        assert!(!f.matches(&labels(Some(A), None, "/"), no_env), "pinned to A2");
        // Unresolved at start: the first matching container pins it.
        let f = filter(&[&A[..20]], &[], &[], &[]);
        f.resolve_prefixes(&[]).unwrap();
        assert!(f.matches(&labels(Some(A), None, "/"), no_env));
        assert!(f.matches(&labels(Some(A), None, "/"), no_env));
        assert!(!f.matches(&labels(Some(A2), None, "/"), no_env));
    }

    /// A served profile's `container=` narrows any run's filter: the other flags stay, and a
    /// run that names containers answers only for those.
    #[test]
    fn containers_narrow_a_filter_to_what_it_selects() {
        let pod = labels(Some(A), Some(UID), "/");
        let env = || Some(b"TRACE_ME=1\0".to_vec());
        let run = filter(&[], &[], &[], &["TRACE_ME=1"]);
        let narrowed = run.narrowed_to_containers(&[A2.into()]).unwrap();
        assert!(!narrowed.matches(&pod, env));
        assert!(narrowed.matches(&labels(Some(A2), None, "/"), env));
        assert!(!narrowed.matches(&labels(Some(A2), None, "/"), || None), "env still required");
        // A run of containers by prefix: a longer prefix or full id within one narrows to it;
        // a shorter one asked narrows to the run's own prefix.
        let run = filter(&[&A[..20]], &[UID], &[], &[]);
        let narrowed = run.narrowed_to_containers(&[A.into()]).unwrap();
        assert!(narrowed.matches(&pod, no_env));
        let narrowed = run.narrowed_to_containers(&[A[..12].into()]).unwrap();
        assert_eq!(narrowed, filter(&[&A[..20]], &[UID], &[], &[]));
        let error = run.narrowed_to_containers(&[A2.into()]).unwrap_err().to_string();
        assert_eq!(error, format!("container {A2}: not among the containers this run traces"));
        // A prefix pinned to its container: only that container's prefixes are within.
        let run = filter(&[&A[..12]], &[], &[], &[]);
        run.resolve_prefixes(&[A2.into()]).unwrap();
        assert!(run.narrowed_to_containers(&[A.into()]).is_err());
        let narrowed = run.narrowed_to_containers(&[A2[..16].into()]).unwrap();
        assert!(narrowed.matches(&labels(Some(A2), None, "/"), no_env));
        assert!(
            run.narrowed_to_containers(&["zz".into()]).unwrap_err().to_string().contains("hex")
        );
    }
}
