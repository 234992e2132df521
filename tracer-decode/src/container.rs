//! Container and pod identity from a cgroup v2 path (the `0::` line of `/proc/<pid>/cgroup`).
//!
//! The path is chosen by whoever creates the cgroup (a container runtime, systemd, or a process
//! with a delegated subtree), so it is untrusted text: nothing here allocates more than the input,
//! and only well-formed ids are returned (a container id is exactly 64 lowercase hex digits, a pod
//! uid a UUID or a 32-hex static-pod hash).
//!
//! Shapes recognised (docs/deploy.md lists them with examples):
//! * systemd driver scopes: `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
//!   `libpod-<id>.scope` (`crio-conmon-…`/`libpod-conmon-…` are the runtime's monitor process,
//!   not the container, and are not reported);
//! * cgroupfs driver: a path component that is the 64-hex id itself (`/docker/<id>`,
//!   `/kubepods/burstable/pod<uid>/<id>`, `/system.slice/containerd.service/…/<id>`);
//! * pods: `kubepods[-<qos>]-pod<uid with '_' for '-'>.slice` (systemd) and a `pod<uid>`
//!   component below a `kubepods` component (cgroupfs).
//!
//! The innermost container id wins (podman's `libpod-<id>.scope/container` and nested runtimes).

/// Length of a container id in hex digits (docker, containerd, CRI-O and podman all use 256-bit
/// ids).
pub const CONTAINER_ID_LEN: usize = 64;

/// Scope prefixes of container runtimes under the systemd cgroup driver.
const SCOPE_PREFIXES: &[&str] = &["docker-", "cri-containerd-", "crio-", "libpod-", "containerd-"];

/// What a cgroup path says about the container and pod a process runs in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupIdentity<'a> {
    /// The 64-hex container id (a slice of the input).
    pub container_id: Option<&'a str>,
    /// The pod's UID in its canonical form (dashes, as the Kubernetes API shows it).
    pub pod_uid: Option<String>,
}

/// Container id and pod uid in a cgroup v2 path such as
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`.
pub fn parse_cgroup_path(path: &str) -> CgroupIdentity<'_> {
    let mut identity = CgroupIdentity::default();
    let mut below_kubepods = false;
    for component in path.split('/') {
        if let Some(id) = container_id_of(component) {
            identity.container_id = Some(id);
        }
        if let Some(uid) = pod_uid_of(component, below_kubepods) {
            identity.pod_uid = Some(uid);
        }
        if component == "kubepods" || component.starts_with("kubepods.") {
            below_kubepods = true;
        }
    }
    identity
}

/// The container id named by one path component, if any.
fn container_id_of(component: &str) -> Option<&str> {
    if is_container_id(component) {
        return Some(component);
    }
    let stem = component.strip_suffix(".scope")?;
    if stem.contains("-conmon-") {
        return None;
    }
    SCOPE_PREFIXES
        .iter()
        .find_map(|prefix| stem.strip_prefix(prefix))
        .filter(|id| is_container_id(id))
}

/// The pod uid named by one component: `kubepods…-pod<uid>.slice` anywhere, or `pod<uid>` below
/// a `kubepods` component.
fn pod_uid_of(component: &str, below_kubepods: bool) -> Option<String> {
    let raw = if let Some(stem) = component.strip_suffix(".slice") {
        if !stem.starts_with("kubepods") {
            return None;
        }
        let at = stem.rfind("-pod")?;
        &stem[at + "-pod".len()..]
    } else if below_kubepods {
        component.strip_prefix("pod")?
    } else {
        return None;
    };
    let uid = raw.replace('_', "-");
    is_pod_uid(&uid).then_some(uid)
}

/// Exactly 64 lowercase hex digits.
pub fn is_container_id(s: &str) -> bool {
    s.len() == CONTAINER_ID_LEN && is_lower_hex(s)
}

/// A pod UID: a UUID (8-4-4-4-12 lowercase hex) or, for static pods, a 32-hex config hash.
pub fn is_pod_uid(s: &str) -> bool {
    let b = s.as_bytes();
    match b.len() {
        32 => is_lower_hex(s),
        36 => b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        }),
        _ => false,
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// `path` is `ancestor` or below it, component-wise (`/a/b` is below `/a`, `/ab` is not).
/// Both are cgroup paths as `/proc/<pid>/cgroup` prints them; trailing slashes are ignored.
pub fn cgroup_is_within(path: &str, ancestor: &str) -> bool {
    let ancestor = ancestor.trim_end_matches('/');
    if ancestor.is_empty() {
        return path.starts_with('/');
    }
    match path.strip_prefix(ancestor) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Whether a NUL-separated `environ` text has `NAME` (`value: None`) or `NAME=VALUE`.
pub fn environ_has(environ: &[u8], name: &[u8], value: Option<&[u8]>) -> bool {
    environ_values(environ, name).any(|v| value.is_none_or(|want| v == want))
}

/// The value of the first `NAME=` in a NUL-separated `environ` text (as `getenv` finds it).
pub fn environ_value<'e>(environ: &'e [u8], name: &[u8]) -> Option<&'e [u8]> {
    environ_values(environ, name).next()
}

fn environ_values<'e>(environ: &'e [u8], name: &[u8]) -> impl Iterator<Item = &'e [u8]> {
    environ.split(|&b| b == 0).filter_map(move |entry| entry.strip_prefix(name)?.strip_prefix(b"="))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e2c1b0a9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f";
    const UID: &str = "0c8f2a4e-5b1d-4c3a-9e7f-6d5b4a3c2e1f";
    const UID_: &str = "0c8f2a4e_5b1d_4c3a_9e7f_6d5b4a3c2e1f";

    /// (container id, pod uid)
    type Ids = (Option<String>, Option<String>);

    fn parsed(path: &str) -> Ids {
        let id = parse_cgroup_path(path);
        (id.container_id.map(str::to_string), id.pod_uid)
    }

    fn both() -> Ids {
        (Some(ID.to_string()), Some(UID.to_string()))
    }

    fn container() -> Ids {
        (Some(ID.to_string()), None)
    }

    #[test]
    fn real_path_shapes() {
        let table: Vec<(String, Ids)> = vec![
            // containerd (CRI), systemd driver, burstable / besteffort / guaranteed pods.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
                ),
                both(),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"
                ),
                both(),
            ),
            (format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"), both()),
            // CRI-O, systemd driver; its conmon is not the container.
            (format!("/kubepods.slice/kubepods-pod{UID_}.slice/crio-{ID}.scope"), both()),
            (
                format!("/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope"),
                (None, Some(UID.to_string())),
            ),
            // The pod's own cgroup (its pause/sandbox accounting), no container.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
                ),
                (None, Some(UID.to_string())),
            ),
            // cgroupfs driver.
            (format!("/kubepods/burstable/pod{UID}/{ID}"), both()),
            (format!("/kubepods/pod{UID}/{ID}"), both()),
            (format!("/kubepods/besteffort/pod{UID}"), (None, Some(UID.to_string()))),
            // Docker: systemd and cgroupfs drivers.
            (format!("/system.slice/docker-{ID}.scope"), container()),
            (format!("/docker/{ID}"), container()),
            // Podman (and its nested `container` cgroup).
            (format!("/machine.slice/libpod-{ID}.scope"), container()),
            (format!("/machine.slice/libpod-{ID}.scope/container"), container()),
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
                ),
                container(),
            ),
            (format!("/machine.slice/libpod-conmon-{ID}.scope"), (None, None)),
            // containerd without Kubernetes (nerdctl, systemd driver).
            (format!("/system.slice/containerd-{ID}.scope"), container()),
            // Static pod: a 32-hex config hash instead of a UUID.
            (
                format!(
                    "/kubepods.slice/kubepods-pod6d0e1b4a9c2f8e7d3b5a1c0f9e8d7c6b.slice/cri-containerd-{ID}.scope"
                ),
                (Some(ID.to_string()), Some("6d0e1b4a9c2f8e7d3b5a1c0f9e8d7c6b".to_string())),
            ),
            // Not containers.
            ("/user.slice/user-0.slice/session-3.scope".into(), (None, None)),
            ("/".into(), (None, None)),
            ("".into(), (None, None)),
            ("/system.slice/docker.service".into(), (None, None)),
            // Malformed ids: wrong length, uppercase, not hex.
            (format!("/docker/{}", &ID[1..]), (None, None)),
            (format!("/docker/{}", ID.to_uppercase()), (None, None)),
            (format!("/system.slice/docker-{}x.scope", &ID[1..]), (None, None)),
            (format!("/system.slice/docker-{ID}.scope.extra"), (None, None)),
            // A pod-looking directory outside kubepods is not a pod.
            (format!("/user.slice/pod{UID}/x"), (None, None)),
            (format!("/kubepods.slice/kubepods-podnot-a-uid.slice/crio-{ID}.scope"), container()),
        ];
        for (path, want) in table {
            assert_eq!(parsed(&path), want, "{path}");
        }
    }

    #[test]
    fn innermost_container_wins() {
        let outer = "a".repeat(64);
        let path = format!("/system.slice/docker-{outer}.scope/docker/{ID}");
        assert_eq!(parse_cgroup_path(&path).container_id, Some(ID));
    }

    #[test]
    fn ids_and_uids() {
        assert!(is_container_id(ID));
        assert!(!is_container_id(&ID[..63]));
        assert!(is_pod_uid(UID));
        assert!(!is_pod_uid(UID_));
        assert!(!is_pod_uid(&UID.replace('-', "x")));
        assert!(is_pod_uid(&"a".repeat(32)));
        assert!(!is_pod_uid(&"A".repeat(32)));
    }

    #[test]
    fn subtree() {
        assert!(cgroup_is_within("/kubepods.slice/a.slice", "/kubepods.slice"));
        assert!(cgroup_is_within("/kubepods.slice", "/kubepods.slice/"));
        assert!(!cgroup_is_within("/kubepods.slicex", "/kubepods.slice"));
        assert!(!cgroup_is_within("/other", "/kubepods.slice"));
        assert!(cgroup_is_within("/anything", "/"));
    }

    #[test]
    fn environ_values_are_found_as_getenv_finds_them() {
        let env = b"A=1\0OTEL_SERVICE_NAME=shop\0OTEL_SERVICE_NAME=later\0B";
        assert_eq!(environ_value(env, b"OTEL_SERVICE_NAME"), Some(&b"shop"[..]));
        assert_eq!(environ_value(env, b"OTEL"), None);
        assert_eq!(environ_value(env, b"B"), None);
    }

    #[test]
    fn environ_matches() {
        let env = b"PATH=/bin\0TRACER=1\0EMPTY=\0NOEQ\0";
        assert!(environ_has(env, b"TRACER", None));
        assert!(environ_has(env, b"TRACER", Some(b"1")));
        assert!(!environ_has(env, b"TRACER", Some(b"2")));
        assert!(environ_has(env, b"EMPTY", Some(b"")));
        assert!(!environ_has(env, b"NOEQ", None), "an entry without '=' is not a variable");
        assert!(!environ_has(env, b"TRACE", None), "names match whole");
        assert!(!environ_has(b"", b"X", None));
    }
}
