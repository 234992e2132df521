use super::*;

const CLOCK_OFFSET: i128 = 1_800_000_000_000_000_000;

/// A configuration for `endpoint` without the node and host names `OtlpConfig::new` reads
/// from this machine.
fn unlabelled(endpoint: &str, queue_capacity: usize) -> OtlpConfig {
    OtlpConfig { endpoint: endpoint.into(), node_name: None, host_name: None, queue_capacity }
}

fn attrs(record: &LogRecord) -> Vec<(&str, &Value)> {
    record
        .attributes
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_ref().unwrap().value.as_ref().unwrap()))
        .collect()
}

#[test]
fn a_dotnet_event_becomes_a_record_with_its_time_severity_name_and_fields() {
    let line = br#"{"ts":"x","mono_ns":5,"kind":"dotnet_event","source":"nettrace","pid":42,"container_id":"c1","pod_uid":"p1","provider":"Microsoft-Windows-DotNETRuntime","event":"GCStart","level":4,"fields":{"Count":3,"Reason":"AllocSmall","Ok":true,"Ratio":0.5,"List":[1,null]}}"#;
    let record = log_record(line, &Clock::with_offset(CLOCK_OFFSET), 7);
    assert_eq!(record.time_unix_nano, 1_800_000_000_000_000_005);
    assert_eq!(record.observed_time_unix_nano, 7);
    assert_eq!((record.severity_number, record.severity_text.as_str()), (9, "Informational"));
    assert_eq!(record.event_name, "Microsoft-Windows-DotNETRuntime/GCStart");
    assert_eq!(record.body, Some(AnyValue::string(std::str::from_utf8(line).unwrap())));
    let s = |v: &str| Value::String(v.into());
    let kv = |k: &str, v: Value| KeyValue::new(k, AnyValue { value: Some(v) });
    assert_eq!(
        attrs(&record),
        vec![
            ("mono_ns", &Value::Int(5)),
            ("kind", &s("dotnet_event")),
            ("source", &s("nettrace")),
            ("process.pid", &Value::Int(42)),
            ("container.id", &s("c1")),
            ("k8s.pod.uid", &s("p1")),
            ("provider", &s("Microsoft-Windows-DotNETRuntime")),
            ("event", &s("GCStart")),
            ("level", &Value::Int(4)),
            (
                "fields",
                &Value::KvList(KeyValueList {
                    values: vec![
                        kv("Count", Value::Int(3)),
                        kv("Reason", s("AllocSmall")),
                        kv("Ok", Value::Bool(true)),
                        kv("Ratio", Value::Double(0.5)),
                        kv(
                            "List",
                            Value::Array(ArrayValue {
                                values: vec![
                                    AnyValue { value: Some(Value::Int(1)) },
                                    AnyValue { value: None }
                                ]
                            })
                        ),
                    ]
                })
            ),
        ]
    );
}

#[test]
fn other_lines_are_named_by_kind_and_leave_out_nulls() {
    let line = br#"{"ts":"x","mono_ns":1,"kind":"session_failed","source":"tracer","pid":null,"big":18446744073709551615}"#;
    let record = log_record(line, &Clock::with_offset(0), 0);
    assert_eq!(record.event_name, "session_failed");
    assert_eq!((record.severity_number, record.severity_text.as_str()), (13, "WARN"));
    assert_eq!(
        attrs(&record),
        vec![
            ("mono_ns", &Value::Int(1)),
            ("kind", &Value::String("session_failed".into())),
            ("source", &Value::String("tracer".into())),
            ("big", &Value::String("18446744073709551615".into())),
        ]
    );
}

#[test]
fn eventpipe_levels_map_to_otlp_severities() {
    let levels: Vec<_> = (0..=6).map(|l| severity("dotnet_event", Some(l))).collect();
    assert_eq!(
        levels,
        [
            (9, "LogAlways"),
            (21, "Critical"),
            (17, "Error"),
            (13, "Warning"),
            (9, "Informational"),
            (5, "Verbose"),
            (5, "Verbose"),
        ]
    );
    assert_eq!(severity("process_exit", None), (9, "INFO"));
}

#[test]
fn a_full_queue_drops_and_counts_without_waiting() {
    let (lines, _rx) = queue(2);
    for _ in 0..5 {
        lines.offer(b"{}");
    }
    assert_eq!(lines.counters.queued.load(Ordering::Relaxed), 2);
    assert_eq!(lines.counters.stats(), ExportStats { queue_full: 3, ..Default::default() });
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
        let exporter = Exporter::start(&config, Clock::with_offset(0)).unwrap();
        let lines = exporter.lines();
        // Offering never waits: the queue takes 4 (the task may already have taken some out).
        for _ in 0..3 {
            lines.offer(br#"{"mono_ns":1,"kind":"process_exit"}"#);
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
        let exporter = Exporter::start(&config, Clock::with_offset(0)).unwrap();
        let lines = exporter.lines();
        for _ in 0..3 {
            lines.offer(br#"{"mono_ns":1,"kind":"process_exit"}"#);
        }
        drop(lines);
        // Far below REQUEST_TIMEOUT: the batch is still waiting for an answer.
        exporter.finish(Instant::now() + Duration::from_millis(300)).await
    });
    assert_eq!(stats, ExportStats { shutdown_timeout: 3, ..Default::default() });
}

#[test]
fn the_readme_documents_every_limit() {
    let readme = include_str!("../../../../README.md");
    let section = readme.split("### OTLP export").nth(1).expect("README has an OTLP section");
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
        assert!(section.contains(&value), "README: {name} = {value}");
    }
    assert!(section.contains(&format!("${NODE_NAME_ENV}")));
    for loss in ExportStats::default().losses() {
        assert!(section.contains(&format!("`{}`", loss.reason)), "README: {}", loss.reason);
    }
}
