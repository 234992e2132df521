//! Families from summaries, and the exposition they encode to.
use tracer_common::{EventKind, LossReason};

use super::*;
use crate::kernel::detect::{HookMechanism, Loss};
use crate::summary::AuditSummary;

fn audit_summary() -> AuditSummary {
    let mut s = AuditSummary::default();
    s.kernel_events.insert("process_exit", 2);
    s.procfs_events.insert("dotnet_ipc_ready", 1);
    for cpu in [0, 1] {
        s.losses.push(Loss {
            cpu,
            kind: EventKind::MemfdCreate,
            reason: LossReason::RingFull,
            count: 3,
        });
    }
    s.seq_gaps.push((1, EventKind::MemfdCreate, 4));
    s.recursion_misses.push(("sys_enter_mmap", 5));
    s.decode_errors = 6;
    s.hooks = Some(HookMechanism::Trampolines);
    s
}

#[test]
fn audit_families_are_the_summary_counters() {
    let f = Families::of_audit(&audit_summary());
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(f.events.get(&pair("kernel", "process_exit")), Some(&2));
    assert_eq!(f.events.get(&pair("procfs", "dotnet_ipc_ready")), Some(&1));
    assert_eq!(f.detections.get("dotnet_ipc_ready"), Some(&1));
    let lost: Vec<(&str, &str, u64)> =
        f.lost.iter().map(|((s, r), v)| (s.as_str(), r.as_str(), *v)).collect();
    assert_eq!(
        lost,
        // The summary's own loss counts; sequence gaps are the failed ring reservations, counted
        // once as `ring_full`.
        [
            ("kernel", "corrupt_record", 6),
            ("kernel", "map_full", 0),
            ("kernel", "read_failed", 0),
            ("kernel", "recursion_miss", 5),
            ("kernel", "registration_list_cut", 0),
            ("kernel", "ring_full", 6),
            ("output", "write_failed", 0),
        ]
    );
}

#[test]
fn exposition_and_health() {
    let shared = Shared::new();
    let publisher = Publisher::new(shared.clone());
    assert!(shared.health().problem().unwrap().starts_with("starting"));
    publisher.set_health(Health::Running);
    assert_eq!(shared.health().problem(), None);
    publisher.publish_audit(&audit_summary());
    let text = shared.exposition().unwrap();
    for line in [
        "# TYPE tracer_events counter",
        r#"tracer_events_total{source="kernel",kind="process_exit"} 2"#,
        "# TYPE tracer_lost_events counter",
        r#"tracer_lost_events_total{source="kernel",reason="ring_full"} 6"#,
        r#"tracer_lost_events_total{source="kernel",reason="map_full"} 0"#,
        r#"tracer_detections_total{kind="process_exit"} 2"#,
        "# TYPE tracer_sessions gauge",
        "# TYPE tracer_sessions_failed counter",
        "# TYPE tracer_detection_hooks gauge",
        r#"tracer_detection_hooks{mechanism="trampolines"} 1"#,
        "# TYPE tracer_build_info gauge",
        "# EOF",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
    let info = text.lines().find(|l| l.starts_with("tracer_build_info{")).unwrap();
    assert!(
        info.starts_with(&format!(
            r#"tracer_build_info{{version="{}",kernel=""#,
            env!("CARGO_PKG_VERSION")
        )),
        "{info}"
    );
    assert!(info.ends_with("\"} 1"), "{info}");
    // Metrics off: publishing does nothing.
    Publisher::default().publish_audit(&audit_summary());
}

#[test]
fn classic_text_names_counters_with_total() {
    let om = "# HELP a_b Help.\n# TYPE a_b counter\na_b_total{x=\"1\"} 2\n# HELP g G.\n# TYPE g gauge\ng 1\n# EOF\n";
    assert_eq!(
        to_prometheus_text(om),
        "# HELP a_b_total Help.\n# TYPE a_b_total counter\na_b_total{x=\"1\"} 2\n# HELP g G.\n# TYPE g gauge\ng 1\n"
    );
}
