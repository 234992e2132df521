//! `--otlp-endpoint` on the real kernel (root): `tracer audit` sends its lines to a real OTLP/HTTP
//! receiver (tests/fixtures/otlp_receiver.py, decoding with the reference protobuf bindings from
//! PyPI `opentelemetry-proto`); the records are checked against the JSON lines field by field;
//! then the receiver stops mid-run, tracing goes on, and every record not received is counted.
//! `tracer run` sends a runtime's events and its threads' syscalls (`--kernel-event`) the same
//! way, a real runtime's Meter instruments as OTLP metrics of their type, and its ILogger
//! messages as `log` lines and log records.
use std::process::Command;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tests::audit_scenarios::{drive_sequence, helper};
use tests::pipeline::Running;
use tests::process::LineProcess;
use tracer::export::otlp::{ExportStats, OtlpConfig};
use tracer::pipeline::audit::{self, AuditConfig};

const HELPER: &str = env!("CARGO_BIN_EXE_detect_helper");
const RECEIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/otlp_receiver.py");
const TIMEOUT: Duration = Duration::from_secs(20);
const NODE: &str = "node-under-test";

struct Receiver(LineProcess);

impl Receiver {
    fn start() -> (Receiver, u16) {
        let mut command = Command::new("python3");
        command.arg(RECEIVER);
        let mut process = LineProcess::spawn("otlp receiver", command).unwrap();
        let first: Value = serde_json::from_str(&process.next_line(TIMEOUT).unwrap()).unwrap();
        let port = first["port"].as_u64().expect("the receiver's port") as u16;
        (Receiver(process), port)
    }

    fn next(&mut self) -> Value {
        let v: Value = serde_json::from_str(&self.0.next_line(TIMEOUT).unwrap()).unwrap();
        assert!(v.get("error").is_none(), "receiver: {v}");
        v
    }

    /// Records until (and with) the first that matches `pred`.
    fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut records = Vec::new();
        loop {
            let r = self.next();
            let done = pred(&r);
            records.push(r);
            if done {
                return records;
            }
        }
    }
}

/// `2026-12-01T11:33:16.123456789Z` → nanoseconds since the epoch.
fn epoch_ns(ts: &str) -> u64 {
    let n = |r: std::ops::Range<usize>| ts[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
    (secs * 1_000_000_000 + n(20..29)) as u64
}

/// What the record of `line` must be: every field but `ts` as an attribute (identity fields
/// under their OpenTelemetry names, nulls left out; the process start apart, see
/// [`creation_time_ns`]), the line as the body.
fn expected_attributes(line: &Value) -> Value {
    let mut attrs = Map::new();
    for (k, v) in line.as_object().unwrap() {
        let key = match k.as_str() {
            "ts" | "process_start_ns" => continue,
            "pid" => "process.pid",
            "container_id" => "container.id",
            "pod_uid" => "k8s.pod.uid",
            other => other,
        };
        if !v.is_null() {
            attrs.insert(key.to_owned(), v.clone());
        }
    }
    Value::Object(attrs)
}

/// A record's `process.creation.time` (ISO-8601, the semantic conventions' form) as epoch
/// nanoseconds.
fn creation_time_ns(attributes: &mut Value) -> u64 {
    let time = attributes.as_object_mut().unwrap().remove("process.creation.time");
    epoch_ns(time.as_ref().and_then(Value::as_str).expect("process.creation.time"))
}

/// The wall-clock time of a CLOCK_BOOTTIME time, by this process's own reading of both clocks.
fn boottime_as_epoch_ns(boot_ns: u64) -> u64 {
    let now = |clock| {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid clock id and out-pointer.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
    };
    (boot_ns as i128 + now(libc::CLOCK_REALTIME) - now(libc::CLOCK_BOOTTIME)) as u64
}

fn otlp_losses(summary_line: &Value) -> Vec<(String, u64)> {
    summary_line["losses"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["source"] == "otlp")
        .map(|l| (l["reason"].as_str().unwrap().to_owned(), l["count"].as_u64().unwrap()))
        .collect()
}

#[test]
fn audit_lines_arrive_as_log_records_and_a_stopped_collector_costs_counted_records() {
    let (mut receiver, port) = Receiver::start();
    let mut otlp = OtlpConfig::new(&format!("http://127.0.0.1:{port}")).unwrap();
    otlp.node_name = Some(NODE.into());
    let host_name = otlp.host_name.clone().expect("a host name");
    let config = AuditConfig { otlp: Some(otlp), ..Default::default() };
    let mut audit = Running::start(TIMEOUT, move |sink, stop, ready| async move {
        audit::run(config, sink, stop, Some(ready)).await
    });

    // Collector up: the helper's lines arrive as records.
    let pid = drive_sequence(Some(&mut audit), helper(HELPER, &["sequence"])).pid;
    let is_exit =
        |r: &Value| r["event_name"] == "process_exit" && r["attributes"]["process.pid"] == pid;
    let mut received = receiver.until(is_exit);
    for kind in ["dotnet_ipc_ready", "process_exit"] {
        let line = audit.wait_for(kind, TIMEOUT, |v| v["kind"] == kind && v["pid"] == pid);
        let record = received
            .iter()
            .find(|r| r["event_name"] == kind && r["attributes"]["process.pid"] == pid)
            .unwrap_or_else(|| panic!("no {kind} record of {pid} in {received:#?}"));
        assert_eq!(
            record["resource"],
            json!({
                "service.name": "tracer",
                "service.version": env!("CARGO_PKG_VERSION"),
                "host.name": host_name,
                "k8s.node.name": NODE,
            })
        );
        assert_eq!(
            record["scope"],
            json!({"name": "tracer", "version": env!("CARGO_PKG_VERSION")})
        );
        assert_eq!(record["time_unix_nano"], epoch_ns(line["ts"].as_str().unwrap()), "{line}");
        assert!(
            record["observed_time_unix_nano"].as_u64().unwrap()
                >= record["time_unix_nano"].as_u64().unwrap()
        );
        assert_eq!(
            (&record["severity_number"], &record["severity_text"]),
            (&json!(9), &json!("INFO"))
        );
        let mut attributes = record["attributes"].clone();
        // The start, converted by tracer's clock offsets sampled at its start and by this
        // test's now: the same instant up to the two samplings.
        let created = creation_time_ns(&mut attributes);
        let want = boottime_as_epoch_ns(line["process_start_ns"].as_u64().expect("a start"));
        assert!(created.abs_diff(want) < 1_000_000, "{created} vs {want}: {line}");
        assert_eq!(attributes, expected_attributes(&line), "{line}");
        let body: Value = serde_json::from_str(record["body"].as_str().unwrap()).unwrap();
        assert_eq!(body, line);
    }

    // Collector gone: tracing goes on, and what is not received is counted.
    receiver.0.send_line("stop").unwrap();
    loop {
        let r = receiver.next();
        if r.get("stopped").is_some() {
            break;
        }
        received.push(r);
    }
    let after = drive_sequence(Some(&mut audit), helper(HELPER, &["sequence"])).pid;
    let (lines, summary) = audit.stop();
    receiver.0.wait_exit(TIMEOUT).unwrap();

    let total = lines.len() as u64;
    let got = received.len() as u64;
    assert!(received.iter().all(|r| r["attributes"]["process.pid"] != after), "{received:#?}");
    // The second helper's lines (at least its dotnet_ipc_ready and process_exit) are lost.
    assert!(lines.iter().filter(|l| l["pid"] == after).count() >= 2);
    // Every line was received or counted as lost, the summary record included.
    assert_eq!(
        summary.otlp,
        Some(ExportStats { exported: got, send_failed: total - got, ..Default::default() })
    );
    // The summary line counts what was lost before it.
    let summary_line = lines.last().unwrap();
    assert_eq!(summary_line["kind"], "summary");
    assert_eq!(otlp_losses(summary_line), vec![("send_failed".to_owned(), total - 1 - got)]);
    let all = summary.all_loss_counts();
    let otlp: Vec<_> =
        all.iter().filter(|l| l.source == "otlp").map(|l| (l.reason, l.count)).collect();
    assert_eq!(
        otlp,
        [
            ("queue_full", 0),
            ("send_failed", total - got),
            ("rejected", 0),
            ("shutdown_timeout", 0),
            ("unencoded", 0)
        ]
    );
}

/// What the record of a runtime event's line must carry as attributes: the envelope (identity
/// fields under their OpenTelemetry names, the start apart as above) and the event's identity;
/// its payload stays in the body (tracer/src/output/otlp.rs).
fn expected_event_attributes(line: &Value) -> Value {
    const EVENT_IDENTITY: [&str; 8] =
        ["provider", "event", "id", "version", "level", "keywords", "thread", "sequence"];
    let mut all = expected_attributes(line);
    let all = all.as_object_mut().unwrap();
    all.retain(|k, _| {
        [
            "mono_ns",
            "kind",
            "source",
            "process.pid",
            "cgroup",
            "container.id",
            "k8s.pod.uid",
            "session_id",
        ]
        .contains(&k.as_str())
            || EVENT_IDENTITY.contains(&k.as_str())
    });
    Value::Object(all.clone())
}

/// `tracer run --kernel-event` exporting a runtime's events and its threads' syscalls: each
/// `dotnet_event` line arrives as a record encoded with the line (no conversion from its JSON),
/// decoded by the reference bindings: the same instant, name and body as the line, the envelope
/// and the event's identity as attributes; each `ftrace` line's record carries all its fields.
#[test]
fn runtime_and_kernel_events_arrive_as_records_encoded_with_their_lines() {
    use tests::double::Dotnet10Double;
    use tests::pipeline::{run_config, start_run};
    use tests::scratch::ScratchDir;
    const THREADS: u32 = 2;
    const TICKS_PER_THREAD: u32 = 10;
    const TICKS: usize = (THREADS * TICKS_PER_THREAD) as usize;
    let (mut receiver, port) = Receiver::start();
    let mut config = run_config(
        "TestDouble",
        tracer::session::SessionMode::Streaming,
        Duration::from_secs(10),
        1024,
    );
    let tmp = ScratchDir::new("otlp-double");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    config.otlp = Some(OtlpConfig::new(&format!("http://127.0.0.1:{port}")).unwrap());
    // Only this double: other tests' runtimes are theirs to trace.
    config.target_pids = vec![pid];
    config.kernel_events = vec!["syscalls:sys_enter_sendto".parse().unwrap()];
    let mut tracer = start_run(Duration::from_secs(60), config);
    let started = tracer.wait_for("session_started", TIMEOUT * 3, |l| {
        l["kind"] == "session_started" && l["pid"] == pid
    });
    // Writer threads that send their events and end.
    double.threads(THREADS, TICKS_PER_THREAD).expect("threads");
    let of_double = |r: &Value| r["attributes"]["process.pid"] == pid;
    let is_tick = |r: &Value| r["event_name"] == "TestDouble/Tick" && of_double(r);
    let is_sendto = |r: &Value| {
        r["event_name"] == "ftrace"
            && r["attributes"]["event"] == "sys_enter_sendto"
            && of_double(r)
    };
    let mut records: Vec<Value> = Vec::new();
    while records.iter().filter(|r| is_tick(r)).count() < TICKS {
        records.push(receiver.next());
    }
    let (lines, summary) = tracer.stop();
    let tick_lines: Vec<&Value> =
        lines.iter().filter(|l| l["event"] == "Tick" && l["pid"] == pid).collect();
    assert_eq!(tick_lines.len(), TICKS);
    let ticks = records.iter().filter(|r| is_tick(r));
    for (record, line) in ticks.zip(tick_lines) {
        let body: Value = serde_json::from_str(record["body"].as_str().unwrap()).unwrap();
        assert_eq!(&body, line);
        assert_eq!(record["time_unix_nano"], epoch_ns(line["ts"].as_str().unwrap()), "{line}");
        // TestDouble's Tick is an Informational (4) event.
        assert_eq!(line["level"], 4);
        assert_eq!(
            (&record["severity_number"], &record["severity_text"]),
            (&json!(9), &json!("Informational"))
        );
        let mut attributes = record["attributes"].clone();
        let created = creation_time_ns(&mut attributes);
        let want = boottime_as_epoch_ns(line["process_start_ns"].as_u64().expect("a start"));
        assert!(created.abs_diff(want) < 1_000_000, "{created} vs {want}: {line}");
        assert_eq!(attributes, expected_event_attributes(line), "{line}");
        assert_eq!(attributes["session_id"], started["session_id"]);
    }
    // Every record was sent before `stop` returned: the receiver has the rest.
    let sendto_lines: Vec<&Value> = lines
        .iter()
        .filter(|l| l["kind"] == "ftrace" && l["event"] == "sys_enter_sendto" && l["pid"] == pid)
        .collect();
    assert!(sendto_lines.len() >= THREADS as usize, "{} sendto lines", sendto_lines.len());
    while records.iter().filter(|r| is_sendto(r)).count() < sendto_lines.len() {
        records.push(receiver.next());
    }
    for (record, line) in records.iter().filter(|r| is_sendto(r)).zip(sendto_lines) {
        let body: Value = serde_json::from_str(record["body"].as_str().unwrap()).unwrap();
        assert_eq!(&body, line);
        assert_eq!(record["time_unix_nano"], epoch_ns(line["ts"].as_str().unwrap()), "{line}");
        assert_eq!(
            (&record["severity_text"], &line["fields"]["fd"].is_u64()),
            (&json!("INFO"), &true)
        );
        let mut attributes = record["attributes"].clone();
        creation_time_ns(&mut attributes);
        assert_eq!(attributes, expected_attributes(line), "{line}");
    }
    assert_eq!(summary.otlp.map(|s| s.lost()), Some(0));
}

/// A real CoreCLR 8 (with `env`) whose `TracerTest.Shop` meter a `run` of it alone exports over
/// OTLP every `interval` to a receiver, once its session started.
struct MeterExport {
    receiver: Receiver,
    host: tests::coreclr::CoreclrHost,
    pid: u32,
    tracer: Running<tracer::pipeline::run::RunSummary>,
}

impl MeterExport {
    fn start(
        tmp: &tests::scratch::ScratchDir,
        env: &[(&str, &str)],
        interval: Duration,
    ) -> MeterExport {
        use tests::pipeline::{run_config, start_run, with_providers};
        use tracer::ipc::providers::MeterRequest;
        let (receiver, port) = Receiver::start();
        let mut host = tests::coreclr::CoreclrHost::spawn_with(tmp.path(), env).expect("CoreCLR");
        let pid = host.host_pid;
        host.meter().expect("meter");
        let streaming = tracer::session::SessionMode::Streaming;
        let base = run_config("unused", streaming, Duration::from_secs(10), 1024);
        let mut config = with_providers(base, Vec::new());
        config.target_pids = vec![pid];
        config.session.meters =
            Some(MeterRequest { meters: vec!["TracerTest.Shop".into()], refresh_secs: 1 });
        let mut otlp = OtlpConfig::new(&format!("http://127.0.0.1:{port}")).unwrap();
        otlp.metrics_interval = interval;
        config.otlp = Some(otlp);
        let mut tracer = start_run(Duration::from_secs(60), config);
        tracer.wait_for("session_started", TIMEOUT * 3, |l| {
            l["kind"] == "session_started" && l["pid"] == pid
        });
        MeterExport { receiver, host, pid, tracer }
    }
}

/// A real CoreCLR 8's Meter instruments (`--meters`) as OTLP metrics, decoded by the reference
/// bindings: a cumulative monotonic sum, a gauge and a summary, under the process's resource
/// (its own `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, and what tracer knows of it)
/// and the meter's scope.
#[test]
fn a_runtimes_meter_instruments_arrive_as_otlp_metrics_of_their_type() {
    use tests::scratch::ScratchDir;
    let env = [
        ("OTEL_SERVICE_NAME", "shop-api"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,process.pid=1"),
    ];
    let tmp = ScratchDir::new("otlp-meters");
    let MeterExport { mut receiver, mut host, pid, mut tracer } =
        MeterExport::start(&tmp, &env, Duration::from_secs(1));
    let waits: Vec<f64> = [0.25; 30].into_iter().chain([2.0; 10]).collect();
    host.shop(3, 2, &waits).expect("shop");
    // Until one export has all three at their values.
    let value = |m: &Value| m["points"][0]["value"].as_f64();
    let (mut orders, mut active, mut wait) = (None, None, None);
    while orders.is_none() || active.is_none() || wait.is_none() {
        let m = receiver.next();
        let Some(name) = m["metric"].as_str() else { continue };
        match name {
            "orders" if value(&m) == Some(3.0) => orders = Some(m),
            "active" if value(&m) == Some(2.0) => active = Some(m),
            "wait" if m["points"][0]["count"] == 40 => wait = Some(m),
            _ => {}
        }
    }
    let (orders, active, wait) = (orders.unwrap(), active.unwrap(), wait.unwrap());
    let resource = &orders["resource"];
    assert_eq!(resource["service.name"], "shop-api");
    assert_eq!(resource["deployment.environment"], "test");
    assert_eq!(resource["process.pid"], pid, "tracer's, not the one the process claims");
    assert_eq!(resource["process.runtime.name"], ".NET");
    assert!(
        resource["process.runtime.version"].as_str().unwrap().starts_with("8.0."),
        "{resource}"
    );
    assert!(resource["host.name"].is_string(), "{resource}");
    assert_eq!(orders["scope"], "TracerTest.Shop");
    assert_eq!(
        (&orders["type"], &orders["unit"], &orders["is_monotonic"], &orders["temporality"]),
        (&json!("sum"), &json!("{order}"), &json!(true), &json!(2)),
        "cumulative: {orders}"
    );
    let point = &orders["points"][0];
    assert!(point["start_time_unix_nano"].as_u64() < point["time_unix_nano"].as_u64(), "{point}");
    assert_eq!((&active["type"], &active["unit"]), (&json!("gauge"), &json!("{request}")));
    assert_eq!((&wait["type"], &wait["unit"]), (&json!("summary"), &json!("s")));
    let wait_point = &wait["points"][0];
    assert_eq!(wait_point["sum"], 27.5);
    let quantiles = wait_point["quantiles"].as_array().unwrap();
    let median = quantiles.iter().find(|q| q[0] == 0.5).expect("the median")[1].as_f64().unwrap();
    assert!((median - 0.25).abs() <= 0.25 * 0.05, "{wait_point}");
    host.exit().expect("the runtime exits");
    tracer.wait_for("session_ended", TIMEOUT, |l| l["kind"] == "session_ended" && l["pid"] == pid);
    let (_, summary) = tracer.stop();
    let stats = summary.otlp_metrics.expect("metrics exported");
    assert!(stats.exported >= 3, "{stats:?}");
    assert_eq!((stats.send_failed, stats.rejected, stats.shutdown_timeout), (0, 0, 0));
    assert_eq!(summary.resource_attributes_dropped, 0);
}

/// A process whose session ends between two exports still has its last values sent: at the
/// next export (here at exit, the interval being a minute).
#[test]
fn the_last_metrics_of_a_process_gone_between_exports_are_sent() {
    use tests::scratch::ScratchDir;
    let tmp = ScratchDir::new("otlp-meters-gone");
    let MeterExport { mut receiver, mut host, pid, mut tracer } =
        MeterExport::start(&tmp, &[], Duration::from_secs(60));
    host.shop(3, 0, &[]).expect("shop");
    tracer.wait_for("the orders' total", TIMEOUT, |l| {
        l["pid"] == pid && l["event"] == "CounterRateValuePublished" && l["fields"]["value"] == "3"
    });
    host.exit().expect("the runtime exits");
    tracer.wait_for("session_ended", TIMEOUT, |l| l["kind"] == "session_ended" && l["pid"] == pid);
    let (_, summary) = tracer.stop();
    let orders = receiver.until(|m| m["metric"] == "orders");
    let orders = orders.last().unwrap();
    assert_eq!(orders["resource"]["process.pid"], pid);
    assert_eq!(orders["points"][0]["value"], 3.0, "{orders}");
    let stats = summary.otlp_metrics.expect("metrics exported");
    assert_eq!((stats.send_failed, stats.rejected, stats.shutdown_timeout), (0, 0, 0));
}

/// `ILogger` messages (`Microsoft-Extensions-Logging`'s `MessageJson`, written by a real CoreCLR
/// 8 with the logger provider's event shape) are `log` lines with every field, and log records
/// with the level's severity, the message as the body, the arguments, template and exception
/// as attributes and the activity as the trace context.
#[test]
fn ilogger_messages_are_log_lines_and_log_records() {
    use tests::coreclr::CoreclrHost;
    use tests::pipeline::{run_config, start_run, with_providers};
    use tests::scratch::ScratchDir;
    const MESSAGES: u32 = 3;
    let (mut receiver, port) = Receiver::start();
    let tmp = ScratchDir::new("otlp-logs");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR");
    let pid = host.host_pid;
    let providers = tracer::ipc::providers::parse_providers(
        r#"Microsoft-Extensions-Logging:0x8:5:FilterSpecs="TracerTest.*:Information""#,
    )
    .unwrap();
    let base = run_config(
        "unused",
        tracer::session::SessionMode::Streaming,
        Duration::from_secs(10),
        1024,
    );
    let mut config = with_providers(base, providers);
    config.target_pids = vec![pid];
    config.otlp = Some(OtlpConfig::new(&format!("http://127.0.0.1:{port}")).unwrap());
    let mut tracer = start_run(Duration::from_secs(60), config);
    tracer.wait_for("session_started", TIMEOUT * 3, |l| {
        l["kind"] == "session_started" && l["pid"] == pid
    });
    host.log(MESSAGES).expect("log");
    let is_log = |l: &Value| l["kind"] == "log" && l["pid"] == pid;
    let lines = tracer.wait_for_count("log lines", TIMEOUT, MESSAGES as usize, is_log);
    for (i, line) in lines.iter().enumerate() {
        let mut fields = line.as_object().unwrap().clone();
        for envelope in ["ts", "mono_ns", "process_start_ns", "cgroup", "session_id", "thread"] {
            assert!(fields.remove(envelope).is_some(), "{envelope}: {line}");
        }
        assert_eq!(
            Value::Object(fields),
            json!({
                "kind": "log",
                "source": "nettrace",
                "pid": pid,
                "category": "TracerTest.Orders",
                "level": "Warning",
                "event_id": 7,
                "event_name": "OrderRejected",
                "message": format!("Order {i} rejected"),
                "template": "Order {OrderId} rejected",
                "arguments": {"OrderId": i.to_string()},
                "exception": {
                    "type": "System.InvalidOperationException",
                    "message": "out of stock",
                    "details": "System.InvalidOperationException: out of stock",
                    "hresult": -2146233079,
                },
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                "span_id": "00f067aa0ba902b7",
                "trace_flags": 1,
                "truncated": false,
            })
        );
    }
    let records = receiver.until(|r| r["body"] == format!("Order {} rejected", MESSAGES - 1));
    let records: Vec<&Value> =
        records.iter().filter(|r| r["attributes"]["category"] == "TracerTest.Orders").collect();
    assert_eq!(records.len(), MESSAGES as usize);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record["body"], format!("Order {i} rejected"));
        assert_eq!(
            (&record["severity_number"], &record["severity_text"]),
            (&json!(13), &json!("Warning"))
        );
        assert_eq!(
            (&record["trace_id"], &record["span_id"], &record["flags"]),
            (&json!("4bf92f3577b34da6a3ce929d0e0e4736"), &json!("00f067aa0ba902b7"), &json!(1))
        );
        let a = &record["attributes"];
        assert_eq!(a["process.pid"], pid);
        assert_eq!(
            (&a["log.record.id"], &a["log.record.name"]),
            (&json!(7), &json!("OrderRejected"))
        );
        assert_eq!(a["log.record.original"], "Order {OrderId} rejected");
        assert_eq!(a["OrderId"], i.to_string());
        assert_eq!(a["exception.type"], "System.InvalidOperationException");
        assert_eq!(a["exception.message"], "out of stock");
        assert_eq!(a["exception.stacktrace"], "System.InvalidOperationException: out of stock");
    }
    let (_, summary) = tracer.stop();
    assert_eq!(summary.unparsed_log_messages, 0);
    assert_eq!(summary.otlp.map(|s| s.lost()), Some(0));
}
