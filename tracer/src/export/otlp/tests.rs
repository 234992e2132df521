use super::*;
use crate::output::WriteLine as _;

/// A configuration for `endpoint` without the node and host names `OtlpConfig::new` reads
/// from this machine.
fn unlabelled(endpoint: &str, queue_capacity: usize) -> OtlpConfig {
    OtlpConfig {
        endpoint: endpoint.into(),
        node_name: None,
        host_name: None,
        queue_capacity,
        metrics_interval: crate::export::otlp_metrics::DEFAULT_INTERVAL,
    }
}

/// `n` records (of a summary line).
fn records(n: usize) -> EncodedRecords {
    let clock = Clock::with_offset(0);
    let line = crate::output::summary_line(&clock, "run", 0, &[]);
    let mut records = EncodedRecords::default();
    (0..n).for_each(|_| line.push_otlp_record(b"{}", &clock, &mut records));
    records
}

#[test]
fn a_full_queue_drops_and_counts_without_waiting() {
    let (lines, _rx) = queue(2);
    for _ in 0..5 {
        lines.offer_records(&records(1));
    }
    assert_eq!(lines.counters.queued.load(Ordering::Relaxed), 2);
    assert_eq!(lines.counters.stats(), ExportStats { queue_full: 3, ..Default::default() });
}

/// Records count against the queue's capacity one by one: a batch that does not fit is
/// dropped whole, and counted record by record.
#[test]
fn records_take_queue_room_by_the_record() {
    let (lines, _rx) = queue(5);
    lines.offer_records(&records(3));
    lines.offer_records(&records(3));
    lines.offer_records(&records(1));
    lines.offer_records(&records(1));
    lines.offer_records(&records(1));
    let counters = &lines.counters;
    assert_eq!(counters.queued.load(Ordering::Relaxed), 5);
    assert_eq!(counters.waiting.load(Ordering::Relaxed), 5);
    assert_eq!(counters.stats(), ExportStats { queue_full: 4, ..Default::default() });
}

#[test]
fn lines_without_their_records_are_counted_lost() {
    let (lines, _rx) = queue(5);
    lines.count_unencoded(2);
    assert_eq!(lines.counters.stats(), ExportStats { unencoded: 2, ..Default::default() });
    assert_eq!(lines.counters.stats().lost(), 2);
}

#[test]
fn endpoints_must_be_plain_http() {
    let config = |endpoint| unlabelled(endpoint, 1);
    assert_eq!(
        config("http://127.0.0.1:4318").logs_uri().unwrap(),
        "http://127.0.0.1:4318/v1/logs"
    );
    assert_eq!(
        config("http://collector:4318/otlp/").logs_uri().unwrap(),
        "http://collector:4318/otlp/v1/logs"
    );
    for bad in ["https://collector:4318", "collector:4318", "http://"] {
        assert!(config(bad).logs_uri().is_err(), "{bad}");
    }
}

#[test]
fn an_unreachable_collector_costs_counted_records_not_the_pipeline() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = unlabelled(&format!("http://127.0.0.1:{port}"), 4);
    let stats = runtime.block_on(async {
        let exporter = Exporter::start(&config).unwrap();
        let lines = exporter.lines();
        // Offering never waits: the queue takes 4 (the task may already have taken some out).
        for _ in 0..3 {
            lines.offer_records(&records(1));
        }
        exporter.flush(Instant::now() + SHUTDOWN_TIMEOUT).await;
        drop(lines);
        exporter.finish(Instant::now() + SHUTDOWN_TIMEOUT).await
    });
    assert_eq!(stats, ExportStats { send_failed: 3, ..Default::default() });
}

#[test]
fn a_collector_that_never_answers_costs_at_most_the_shutdown_deadline() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Listening but never accepting: connections complete in the backlog, no answer comes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = unlabelled(&format!("http://{}", silent.local_addr().unwrap()), 4);
    let stats = runtime.block_on(async {
        let exporter = Exporter::start(&config).unwrap();
        let lines = exporter.lines();
        for _ in 0..3 {
            lines.offer_records(&records(1));
        }
        drop(lines);
        // Far below REQUEST_TIMEOUT: the batch is still waiting for an answer.
        exporter.finish(Instant::now() + Duration::from_millis(300)).await
    });
    assert_eq!(stats, ExportStats { shutdown_timeout: 3, ..Default::default() });
}

#[test]
fn docs_otlp_md_documents_every_limit() {
    let page = include_str!("../../../../docs/otlp.md");
    let section = page.split("# OTLP export").nth(1).expect("docs/otlp.md has its OTLP section");
    let ms = |d: Duration| format!("{} ms", d.as_millis());
    let s = |d: Duration| format!("{} s", d.as_secs());
    for (name, value) in [
        ("QUEUE_CAPACITY", QUEUE_CAPACITY.to_string()),
        ("MAX_BATCH", MAX_BATCH.to_string()),
        ("BATCH_DELAY", ms(BATCH_DELAY)),
        ("REQUEST_TIMEOUT", s(REQUEST_TIMEOUT)),
        ("MAX_ATTEMPTS", MAX_ATTEMPTS.to_string()),
        ("FIRST_BACKOFF", ms(FIRST_BACKOFF)),
        ("MAX_BACKOFF", s(MAX_BACKOFF)),
        ("SHUTDOWN_TIMEOUT", s(SHUTDOWN_TIMEOUT)),
    ] {
        assert!(section.contains(&value), "docs/otlp.md: {name} = {value}");
    }
    assert!(section.contains(&format!("${NODE_NAME_ENV}")));
    for loss in ExportStats::default().losses() {
        assert!(section.contains(&format!("`{}`", loss.reason)), "docs/otlp.md: {}", loss.reason);
    }
}
