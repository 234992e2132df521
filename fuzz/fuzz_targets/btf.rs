//! The BTF decoder on arbitrary bytes (as if `/sys/kernel/btf/vmlinux` were corrupt): never a
//! panic, and no endless walk through cyclic or deeply nested anonymous members.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::btf::{Btf, KIND_FUNC, KIND_TYPEDEF};

/// The lookups tracer makes (tracer/src/kernel/btf.rs).
const MEMBERS: [(&str, &str); 8] = [
    ("task_struct", "files"),
    ("files_struct", "fdt"),
    ("fdtable", "max_fds"),
    ("fdtable", "fd"),
    ("file", "f_path"),
    ("path", "dentry"),
    ("dentry", "d_name"),
    ("qstr", "name"),
];

fuzz_target!(|data: &[u8]| {
    let Ok(btf) = Btf::parse(data) else { return };
    for (structure, member) in MEMBERS {
        let _ = btf.member_offset(structure, member);
    }
    for tracepoint in ["sched_process_exit", "task_newtask"] {
        let _ = btf.tracepoint_args(tracepoint);
    }
    for (name, kind) in [("btf_trace_sched_switch", KIND_TYPEDEF), ("bpf_iter_task", KIND_FUNC)] {
        let _ = btf.type_id(name, kind);
    }
});
