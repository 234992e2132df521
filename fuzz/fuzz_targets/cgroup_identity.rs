//! Cgroup paths (any process with a delegated cgroup subtree names its cgroups) and `environ`
//! texts (a process chooses its environment): container/pod identity, subtree checks and the
//! `--require-env` match. Never a panic; anything returned is well-formed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::container::{
    CONTAINER_ID_LEN, cgroup_is_within, environ_has, is_container_id, is_pod_uid, parse_cgroup_path,
};
use tracer_decode::procfs::cgroup_v2_path;

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input);
    let path = cgroup_v2_path(&text).unwrap_or(&text);
    let identity = parse_cgroup_path(path);
    if let Some(id) = identity.container_id {
        assert_eq!(id.len(), CONTAINER_ID_LEN);
        assert!(is_container_id(id) && path.contains(id), "{id}");
    }
    if let Some(uid) = &identity.pod_uid {
        assert!(is_pod_uid(uid), "{uid}");
    }
    // Every absolute path is within itself and within the root; the first half of the input as
    // an ancestor must not panic whatever it is.
    if path.starts_with('/') {
        assert!(cgroup_is_within(path, path) && cgroup_is_within(path, "/"), "{path:?}");
    }
    let (a, b) = text.split_at(text.floor_char_boundary(text.len() / 2));
    let _ = cgroup_is_within(b, a);
    let (name, value) = input.split_at(input.len().min(8));
    let _ = environ_has(value, name, None);
    let _ = environ_has(value, name, Some(b"1"));
});
