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

#[test]
fn runtime_counters_are_exposed_by_their_type() {
    use tracer_decode::counters::{CounterSample, Distribution, Reading};

    use crate::output::Incarnation;
    let shared = Shared::new();
    let counters = RuntimeCounters::default();
    Publisher::new(shared.clone()).serve_runtime_counters(counters.clone());
    let sample = |metric: &str, reading, labels: &[(&str, &str)]| {
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Ok(CounterSample {
            metric: metric.into(),
            help: format!("{metric} help").into(),
            instrument: Default::default(),
            reading,
            labels,
            tag_keys: Vec::new(),
            interval_secs: None,
        })
    };
    let histogram = |quantiles: Vec<(f64, f64)>, count_and_sum| {
        Reading::Distribution(Distribution { quantiles, count_and_sum })
    };
    let process = Incarnation::new(7, Some(9));
    counters.record_all(
        [
            (process, sample("shop_queue", Reading::Level(2.5), &[])),
            (process, sample("shop_orders", Reading::Added { amount: 5.0, total: None }, &[])),
            (process, sample("shop_orders", Reading::Added { amount: 2.0, total: None }, &[])),
            (
                process,
                sample("shop_sold_total", Reading::Added { amount: 1.0, total: Some(3.0) }, &[]),
            ),
            (
                process,
                sample(
                    "shop_wait_seconds",
                    histogram(vec![(0.5, 0.25), (0.99, 2.0)], Some((4, 3.5))),
                    &[("route", "/a")],
                ),
            ),
            (process, sample("shop_old_seconds", histogram(vec![(0.5, 1.0)], None), &[])),
        ],
        |_| None,
    );
    let text = shared.exposition().unwrap();
    let process = r#"pid="7",process_start_ns="9""#;
    let expected = [
        "# TYPE shop_queue gauge".to_string(),
        format!("shop_queue{{{process}}} 2.5"),
        "# TYPE shop_orders counter".to_string(),
        format!("shop_orders_total{{{process}}} 7.0"),
        "# TYPE shop_sold counter".to_string(),
        format!("shop_sold_total{{{process}}} 3.0"),
        "# HELP shop_wait_seconds shop_wait_seconds help".to_string(),
        "# TYPE shop_wait_seconds summary".to_string(),
        format!(r#"shop_wait_seconds{{{process},route="/a",quantile="0.5"}} 0.25"#),
        format!(r#"shop_wait_seconds{{{process},route="/a",quantile="0.99"}} 2"#),
        format!(r#"shop_wait_seconds_sum{{{process},route="/a"}} 3.5"#),
        format!(r#"shop_wait_seconds_count{{{process},route="/a"}} 4"#),
        "# TYPE shop_old_seconds summary".to_string(),
        format!(r#"shop_old_seconds{{{process},quantile="0.5"}} 1"#),
    ];
    for line in &expected {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
    assert!(!text.contains("shop_old_seconds_sum"), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    // The classic format keeps the summaries as they are.
    let classic = to_prometheus_text(&text);
    assert!(classic.contains("# TYPE shop_wait_seconds summary\n"), "{classic}");
    assert!(classic.contains("# TYPE shop_orders_total counter\n"), "{classic}");
}
