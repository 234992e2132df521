//! `--metrics-addr` on the real kernel (root): the endpoint while `tracer audit` runs, its
//! numbers against the summary at exit, `promtool check metrics` on the exposition, a real
//! Prometheus server (Debian `prometheus`) scraping tracer, and `tracer run`'s runtime counters
//! of a real CoreCLR 8 (and of a hostile peer making up counters) as series per process; the
//! endpoint under a flood of connections and while `tracer run`'s output is stalled.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::audit_scenarios::{drive_sequence, helper};
use tests::cgroups::{CgroupTree, container_id};
use tests::coreclr::CoreclrHost;
use tests::double::Dotnet10Double;
use tests::http::{free_port, get};
use tests::pipeline::{Running, run_config, with_providers};
use tests::scratch::ScratchDir;
use tracer::ipc::providers::MeterRequest;
use tracer::metrics::runtime::MAX_SERIES_PER_PROCESS;
use tracer::metrics::{Health, Publisher, Shared};
use tracer::pipeline::audit::{self, AuditConfig, AuditSummary};
use tracer::pipeline::run::{self, RunSummary};
use tracer::session::SessionMode;

const HELPER: &str = env!("CARGO_BIN_EXE_detect_helper");
const TIMEOUT: Duration = Duration::from_secs(20);
/// Prometheus start-up plus a few 1 s scrapes on a loaded 2-core machine.
const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(90);
const OPENMETRICS: &str = "Accept: application/openmetrics-text; version=1.0.0";
/// CoreCLR start-up and its first counters on a loaded 2-core machine.
const SESSION: Duration = Duration::from_secs(120);

/// `tracer audit` with its metrics endpoint on a free loopback port.
fn start_audit() -> (Running<AuditSummary>, SocketAddr, Arc<Shared>) {
    let addr = free_port();
    let shared = Shared::new();
    let config =
        AuditConfig { metrics: Some(Publisher::new(shared.clone())), ..Default::default() };
    let endpoint = shared.clone();
    let audit = Running::start(TIMEOUT, move |sink, stop, ready| async move {
        tracer::metrics::serve(addr, endpoint).await?;
        audit::run(config, sink, stop, Some(ready)).await
    });
    (audit, addr, shared)
}

/// `name{labels} value` lines of an exposition, by `name{labels}`.
fn samples(exposition: &str) -> BTreeMap<String, f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// `promtool check metrics`: the exposition parses and passes every lint.
fn promtool_check(exposition: &str) {
    let (code, problems) = promtool(exposition);
    assert!(code == Some(0), "promtool check metrics: {problems}\n{exposition}");
}

/// promtool's exit status and its report. It exits 1 when the exposition does not parse, 3 when
/// it parses but breaks a naming lint.
fn promtool(exposition: &str) -> (Option<i32>, String) {
    use std::io::Write as _;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian prometheus; `cargo xtask setup` installs it)");
    child.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), report)
}

#[test]
fn scrape_matches_the_summary_and_promtool_accepts_it() {
    let (mut audit, addr, shared) = start_audit();
    let health = get(addr, "/healthz", &[]).unwrap();
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    drive_sequence(Some(&mut audit), helper(HELPER, &["sequence"]));

    let classic = get(addr, "/metrics", &[]).unwrap();
    assert_eq!(classic.status, 200);
    assert_eq!(classic.content_type, "text/plain; version=0.0.4; charset=utf-8");
    promtool_check(&classic.body);
    let om = get(addr, "/metrics", &[OPENMETRICS]).unwrap();
    assert!(om.content_type.starts_with("application/openmetrics-text"), "{}", om.content_type);
    assert!(om.body.ends_with("# EOF\n"), "{}", om.body);
    assert_eq!(get(addr, "/nope", &[]).unwrap().status, 404);

    let (_, summary) = audit.stop();
    assert_eq!(shared.health(), Health::Stopping);
    // The last publication is the summary at exit: the same numbers, series by series.
    let s = samples(&shared.exposition().unwrap());
    let value = |series: &str| *s.get(series).unwrap_or_else(|| panic!("no {series} in {s:#?}"));
    for (kind, n) in &summary.kernel_events {
        assert_eq!(
            value(&format!(r#"tracer_events_total{{source="kernel",kind="{kind}"}}"#)),
            *n as f64
        );
        assert!(value(&format!(r#"tracer_detections_total{{kind="{kind}"}}"#)) >= *n as f64);
    }
    assert!(summary.kernel_events["process_exit"] >= 1);
    // The mechanism this host falls back to (it refuses BPF trampolines).
    assert_eq!(value(r#"tracer_detection_hooks{mechanism="syscall_tracepoints"}"#), 1.0);
    // Every loss the summary counts is a series with the same number.
    let losses = summary.all_loss_counts();
    assert_eq!(losses.len(), 7, "{losses:?}");
    for l in &losses {
        let series =
            format!(r#"tracer_lost_events_total{{source="{}",reason="{}"}}"#, l.source, l.reason);
        assert_eq!(value(&series), l.count as f64, "{series}");
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let info = format!(
        r#"tracer_build_info{{version="{}",kernel="{}"}}"#,
        env!("CARGO_PKG_VERSION"),
        kernel.trim()
    );
    assert_eq!(value(&info), 1.0);
}

#[test]
fn healthz_says_why_it_is_unavailable() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let shared = Shared::new();
    let addr = runtime.block_on(tracer::metrics::serve(free_port(), shared.clone())).unwrap();
    let publisher = Publisher::new(shared);
    let health = get(addr, "/healthz", &[]).unwrap();
    assert_eq!(health.status, 503);
    assert_eq!(health.body, "starting: the probes are not attached yet\n");
    publisher.set_health(Health::Running);
    assert_eq!(get(addr, "/healthz", &[]).unwrap().status, 200);
    publisher.set_health(Health::Failed("reading the BPF ring buffer: EIO".into()));
    let health = get(addr, "/healthz", &[]).unwrap();
    assert_eq!(
        (health.status, health.body.as_str()),
        (503, "failed: reading the BPF ring buffer: EIO\n")
    );
}

/// Prometheus's answer to an instant query: (labels, value) per series.
fn query(prometheus: SocketAddr, promql: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let path = format!(
        "/api/v1/query?query={}",
        promql
            .replace('{', "%7B")
            .replace('}', "%7D")
            .replace('"', "%22")
            .replace('=', "%3D")
            .replace(',', "%2C")
    );
    let answer = get(prometheus, &path, &[]).unwrap();
    let v: Value = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("{promql}: {e}: {}", answer.body));
    assert_eq!(v["status"], "success", "{promql}: {v}");
    v["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let labels = serde_json::from_value(r["metric"].clone()).unwrap();
            (labels, r["value"][1].as_str().unwrap().parse().unwrap())
        })
        .collect()
}

/// Polls Prometheus (it has no event to wait on) until `promql` answers what `done` wants.
fn await_query(
    prometheus: SocketAddr,
    promql: &str,
    done: impl Fn(&[(BTreeMap<String, String>, f64)]) -> bool,
) -> Vec<(BTreeMap<String, String>, f64)> {
    let deadline = Instant::now() + PROMETHEUS_TIMEOUT;
    loop {
        let result = if get(prometheus, "/-/ready", &[]).is_ok_and(|r| r.status == 200) {
            query(prometheus, promql)
        } else {
            Vec::new()
        };
        if done(&result) {
            return result;
        }
        assert!(Instant::now() < deadline, "{promql}: last answer {result:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Kills a child (Prometheus, tracer) when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A Prometheus server scraping `tracer_addr` every second, up and scraping; killed (and its
/// data removed) when the returned guard drops.
fn start_prometheus(tracer_addr: SocketAddr) -> (SocketAddr, (Killed, ScratchDir)) {
    let dir = ScratchDir::new("prometheus");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: tracer\n    static_configs:\n      - targets: ['{tracer_addr}']\n"
        ),
    )
    .unwrap();
    let prometheus = free_port();
    let server = Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={prometheus}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian prometheus; `cargo xtask setup` installs it)"),
    );
    let up = await_query(prometheus, "up", |r| r.iter().any(|(_, v)| *v == 1.0));
    assert_eq!(up[0].0["instance"], tracer_addr.to_string());
    (prometheus, (server, dir))
}

#[test]
fn a_prometheus_server_scrapes_tracer() {
    let (mut audit, tracer_addr, _) = start_audit();
    let (prometheus, _server) = start_prometheus(tracer_addr);
    drive_sequence(Some(&mut audit), helper(HELPER, &["sequence"]));
    // Every kernel loss reason is a series from the start (0 until it happens).
    let lost =
        await_query(prometheus, r#"tracer_lost_events_total{source="kernel"}"#, |r| r.len() == 6);
    let reasons: Vec<&str> = lost
        .iter()
        .map(|(l, _)| l["reason"].as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(
        reasons,
        [
            "corrupt_record",
            "map_full",
            "read_failed",
            "recursion_miss",
            "registration_list_cut",
            "ring_full"
        ]
    );
    let exits = await_query(
        prometheus,
        r#"tracer_events_total{source="kernel",kind="process_exit"}"#,
        |r| r.first().is_some_and(|(_, v)| *v >= 1.0),
    );
    assert_eq!(exits.len(), 1);
    let info = await_query(prometheus, "tracer_build_info", |r| !r.is_empty());
    assert_eq!(info[0].0["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(info[0].1, 1.0);
    let (_, summary) = audit.stop();
    assert!(summary.kernel_events["process_exit"] >= exits[0].1 as u64);
}

/// `tracer run` with `providers` (a profile's, or dotnet-trace syntax), streaming sessions and
/// its metrics endpoint on a free loopback port.
fn start_run_with_metrics(
    providers: Vec<tracer_decode::diagnostic_ipc::FilteredProvider>,
) -> (Running<RunSummary>, SocketAddr, Arc<Shared>) {
    let base = run_config("unused", SessionMode::Streaming, Duration::from_secs(10), 1024);
    start_run_with_metrics_of(with_providers(base, providers))
}

/// A `run` of `pid` alone, asking for `meters` (`--meters`) and nothing else.
fn start_meter_run(pid: u32, meters: MeterRequest) -> (Running<RunSummary>, SocketAddr) {
    let mut config = with_providers(
        run_config("unused", SessionMode::Streaming, Duration::from_secs(10), 1024),
        Vec::new(),
    );
    config.target_pids = vec![pid];
    config.session.meters = Some(meters);
    let (run, addr, _) = start_run_with_metrics_of(config);
    (run, addr)
}

fn start_run_with_metrics_of(
    mut config: tracer::pipeline::run::RunConfig,
) -> (Running<RunSummary>, SocketAddr, Arc<Shared>) {
    let addr = free_port();
    let shared = Shared::new();
    config.metrics = Some(Publisher::new(shared.clone()));
    let endpoint = shared.clone();
    let run = Running::start(TIMEOUT, move |sink, stop, ready| async move {
        tracer::metrics::serve(addr, endpoint).await?;
        run::run(config, sink, stop, Some(ready)).await
    });
    (run, addr, shared)
}

/// The `EventCounters` line of `pid` for counter `name`.
fn is_counter(line: &Value, pid: u32, name: &str) -> bool {
    line["kind"] == "dotnet_event"
        && line["pid"] == pid
        && line["event"] == "EventCounters"
        && line["fields"][""]["Payload"]["Name"] == name
}

/// Polls tracer's own endpoint (published every second; no event to wait on) until its
/// exposition satisfies `done`.
fn await_exposition(addr: SocketAddr, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + PROMETHEUS_TIMEOUT;
    loop {
        let body = get(addr, "/metrics", &[]).unwrap().body;
        if done(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "exposition never as expected:\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `--profile counters` against a real CoreCLR 8.0.4 in a docker-named cgroup: every counter
/// the runtime sends is a series with its pid and container id, Prometheus stores the value
/// the runtime sent (in bytes for an MB counter), and the series go when the process exits.
#[test]
fn a_real_runtimes_counters_are_series_of_its_container_until_it_exits() {
    let mut tree = CgroupTree::new("counters").expect("cgroup tree");
    let id = container_id("d0cce7", 9);
    let cgroup = tree.create(&format!("system.slice/docker-{id}.scope")).unwrap();
    let (mut run, addr, shared) =
        start_run_with_metrics(tracer::ipc::providers::profile("counters").unwrap());
    let (prometheus, _server) = start_prometheus(addr);
    let tmp = ScratchDir::new("counters-coreclr");
    let mut host = CoreclrHost::spawn_in_cgroup(tmp.path(), &tree, &cgroup).expect("CoreCLR");
    let pid = host.host_pid;

    let heap = run.wait_for("gc-heap-size", SESSION, |l| is_counter(l, pid, "gc-heap-size"));
    assert_eq!(heap["provider"], "System.Runtime");
    assert_eq!(heap["container_id"], id.as_str());
    assert_eq!(heap["fields"][""]["Payload"]["DisplayUnits"], "MB");
    let promql = format!(r#"systemruntime_gc_heap_size_bytes{{pid="{pid}"}}"#);
    let series = await_query(prometheus, &promql, |r| r.len() == 1);
    let (labels, stored) = &series[0];
    let names: Vec<&str> = labels.keys().map(String::as_str).collect();
    let want = ["__name__", "container_id", "instance", "job", "pid", "process_start_ns"];
    assert_eq!(names, want, "{labels:?}");
    assert_eq!(labels["container_id"], id);
    assert_eq!(labels["pid"], pid.to_string());
    let start = tracer::kernel::procfs::process_start_ns(pid).expect("the runtime's start");
    assert_eq!(labels["process_start_ns"], start.to_string());
    assert_eq!(heap["process_start_ns"], start, "the same start as its lines: {heap}");

    // The classic text with runtime series parses. promtool's naming lints object to exactly
    // what dotnet-monitor's names do (`…_count` gauges, `…_ms`); tracer's own families pass.
    let classic = get(addr, "/metrics", &[]).unwrap().body;
    let (code, report) = promtool(&classic);
    assert_eq!(code, Some(3), "parses, with lint problems only: {report}");
    for problem in report.lines() {
        let (metric, lint) = problem.split_once(' ').unwrap();
        assert!(metric.starts_with("systemruntime_"), "{problem}");
        assert!(
            lint == r#"non-histogram and non-summary metrics should not have "_count" suffix"#
                || lint == "metric names should not contain abbreviated units",
            "{problem}"
        );
    }
    let of_pid = format!(r#"{{pid="{pid}",process_start_ns="{start}",container_id="{id}"}}"#);
    let exposed: Vec<&str> =
        classic.lines().filter_map(|l| l.split_once(' ')?.0.strip_suffix(&of_pid)).collect();
    assert!(exposed.contains(&"systemruntime_cpu_usage_ratio"), "{exposed:?}");
    assert!(exposed.contains(&"systemruntime_gen_0_gc_count_total"), "{exposed:?}");

    host.exit().expect("the runtime exits");
    run.wait_for("session_ended", SESSION, |l| l["kind"] == "session_ended" && l["pid"] == pid);
    // Gone from the exposition, so Prometheus marks them stale at its next scrape.
    await_query(prometheus, &promql, |r| r.is_empty());
    let (lines, summary) = run.stop();

    // Prometheus stored a value the runtime sent, converted from MB to bytes.
    let sent: Vec<f64> = lines
        .iter()
        .filter(|l| is_counter(l, pid, "gc-heap-size"))
        .map(|l| l["fields"][""]["Payload"]["Mean"].as_f64().unwrap() * 1e6)
        .collect();
    assert!(sent.contains(stored), "{stored} not among {sent:?}");
    // Every counter the runtime named was exposed: none refused, none malformed.
    let named: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter(|l| l["pid"] == pid && l["event"] == "EventCounters")
        .map(|l| l["fields"][""]["Payload"]["Name"].as_str().unwrap())
        .collect();
    assert_eq!(named.len(), 27, "the counters of System.Runtime in 8.0.4: {named:?}");
    let counters = summary.runtime_counters.expect("metrics on");
    assert_eq!((counters.len(), counters.refused(), counters.bad_samples()), (0, 0, 0));
    assert!(!shared.exposition().unwrap().contains(&format!(r#"pid="{pid}""#)));
}

/// An application's own `System.Diagnostics.Metrics` instruments on a real CoreCLR 8: each
/// instrument and tag set is a series of the process, with the tags as labels.
#[test]
fn a_real_applications_meter_instruments_are_series_of_their_type() {
    // Two meters in one quoted argument, as dotnet-trace takes it.
    let arguments = r#"SessionId=tracer-test;Metrics="TracerTest.App,TracerTest.Shop";RefreshInterval=1;MaxTimeSeries=100;MaxHistograms=10"#;
    let spec = format!("System.Diagnostics.Metrics:0x2:5:{arguments}");
    let providers = tracer::ipc::providers::parse_providers(&spec).unwrap();
    let tmp = ScratchDir::new("meter-coreclr");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR");
    let pid = host.host_pid;
    // Its own runtime only: a non-shared Meter session is refused where another runs.
    let base = run_config("unused", SessionMode::Streaming, Duration::from_secs(10), 1024);
    let mut config = with_providers(base, providers);
    config.target_pids = vec![pid];
    let (mut run, addr, _) = start_run_with_metrics_of(config);
    let started = run.wait_for("session_started", SESSION, |l| {
        l["kind"] == "session_started" && l["pid"] == pid
    });
    assert_eq!(
        started["providers"],
        serde_json::json!([{
            "name": "System.Diagnostics.Metrics",
            "keywords": "0x2",
            "level": 5,
            "arguments": arguments,
        }])
    );
    host.meter().expect("meter");
    host.add_requests(5, "/a").expect("add");
    // 40 waits: 30 of 0.25 s, 10 of 2 s (the median 0.25, the 0.99 quantile 2).
    let waits: Vec<f64> = [0.25; 30].into_iter().chain([2.0; 10]).collect();
    host.shop(3, 2, &waits).expect("shop");
    let rate = run.wait_for("the requests rate", SESSION, |l| {
        l["pid"] == pid && l["event"] == "CounterRateValuePublished" && l["fields"]["rate"] == "5"
    });
    assert_eq!(rate["fields"]["tags"], "route=/a");
    let start = rate["process_start_ns"].as_u64().expect("the runtime's start");
    let process = format!(r#"pid="{pid}",process_start_ns="{start}""#);
    let gauge = format!(r#"tracertestapp_queue_length_items{{{process}}}"#);
    let requests = format!(r#"tracertestapp_requests_total{{{process},route="/a"}}"#);
    let orders = format!(r#"tracertestshop_orders_total{{{process}}}"#);
    let active = format!(r#"tracertestshop_active{{{process}}}"#);
    let wait = "tracertestshop_wait_seconds";
    let (count, sum) = (format!("{wait}_count{{{process}}}"), format!("{wait}_sum{{{process}}}"));
    let body = await_exposition(addr, |b| {
        let s = samples(b);
        s.get(&requests) == Some(&5.0)
            && s.get(&orders) == Some(&3.0)
            && s.get(&count) == Some(&40.0)
    });
    let s = samples(&body);
    assert_eq!((s.get(&gauge), s.get(&active)), (Some(&42.5), Some(&2.0)), "{body}");
    assert_eq!(s.get(&sum), Some(&27.5), "{body}");
    // The runtime's quantiles are estimates (its buckets are a few percent wide).
    for (quantile, expected) in [("0.5", 0.25), ("0.99", 2.0)] {
        let series = format!(r#"{wait}{{{process},quantile="{quantile}"}}"#);
        let got = s.get(&series).copied().unwrap_or_else(|| panic!("{series}:\n{body}"));
        assert!((got - expected).abs() <= expected * 0.05, "{series} = {got}");
    }
    for line in [
        "# TYPE tracertestapp_requests_total counter",
        "# TYPE tracertestapp_queue_length_items gauge",
        "# TYPE tracertestshop_active gauge",
        "# TYPE tracertestshop_wait_seconds summary",
        "# HELP tracertestapp_queue_length_items queue-length of meter TracerTest.App (items)",
    ] {
        assert!(body.lines().any(|l| l == line), "{line} missing in\n{body}");
    }
    // And both formats pass promtool's checks (classic text when not asked for OpenMetrics).
    promtool_check(&get(addr, "/metrics", &[]).unwrap().body);
    host.exit().expect("the runtime exits");
    run.wait_for("session_ended", SESSION, |l| l["kind"] == "session_ended" && l["pid"] == pid);
    let (_, summary) = run.stop();
    let counters = summary.runtime_counters.expect("metrics on");
    assert_eq!((counters.len(), counters.refused(), counters.bad_samples()), (0, 0, 0));
}

/// `--meters` makes each session a client of the runtime's shared Meter session (.NET 8), with
/// a `ClientId` of its own: two tracers beside each other both get every value, and when one
/// ends its session the other keeps getting them (the runtime counts clients). A third asking
/// for another interval is refused by the runtime: one `metrics/session_refused` loss, its own.
#[test]
fn clients_of_the_shared_meter_session_keep_working_beside_each_other() {
    let tmp = ScratchDir::new("meter-shared");
    let mut host = CoreclrHost::spawn(tmp.path()).expect("CoreCLR");
    let pid = host.host_pid;
    host.meter().expect("meter");
    let meters =
        |refresh_secs| MeterRequest { meters: vec!["TracerTest.Shop".into()], refresh_secs };
    let started = |l: &serde_json::Value| l["kind"] == "session_started" && l["pid"] == pid;
    let orders = |addr: SocketAddr, total: f64| {
        await_exposition(addr, |b| {
            samples(b)
                .iter()
                .any(|(k, v)| k.starts_with("tracertestshop_orders_total{") && *v == total)
        });
    };
    let (mut first, first_addr) = start_meter_run(pid, meters(1));
    let line = first.wait_for("session_started", SESSION, started);
    let arguments = line["providers"][0]["arguments"].as_str().unwrap().to_owned();
    let first_client = format!("tracer-{}-{pid}-", std::process::id());
    assert!(arguments.starts_with("SessionId=SHARED;Metrics=TracerTest.Shop;RefreshInterval=1;"));
    assert!(arguments.contains(&format!(";ClientId={first_client}")), "{arguments}");
    host.shop(3, 1, &[0.5]).expect("shop");
    orders(first_addr, 3.0);
    let (mut second, second_addr) = start_meter_run(pid, meters(1));
    second.wait_for("session_started", SESSION, started);
    host.shop(2, 0, &[]).expect("shop");
    orders(first_addr, 5.0);
    orders(second_addr, 5.0);

    let (mut third, _) = start_meter_run(pid, meters(2));
    third.wait_for("session_started", SESSION, started);
    let refusal = third.wait_for("the refusal", SESSION, |l| {
        l["pid"] == pid && l["event"] == "MultipleSessionsConfiguredIncorrectlyError"
    });
    assert_eq!(refusal["fields"]["actualRefreshInterval"], "2", "{refusal}");
    let (_, third_summary) = third.stop();
    let refused = |summary: &RunSummary| {
        summary.all_losses().iter().find(|l| l.reason == "session_refused").map(|l| l.count)
    };
    assert_eq!(refused(&third_summary), Some(1));
    let (_, first_summary) = first.stop();
    assert_eq!(refused(&first_summary), Some(0), "the refusal named the third's client");
    // The first client's session ended; the runtime still publishes for the second.
    host.shop(4, 0, &[]).expect("shop");
    orders(second_addr, 9.0);
    host.exit().expect("the runtime exits");
    let (_, second_summary) = second.stop();
    assert_eq!(refused(&second_summary), Some(0));
    let counters = second_summary.runtime_counters.expect("metrics on");
    assert_eq!((counters.refused(), counters.bad_samples()), (0, 0));
}

/// A peer naming a new counter in every event gets at most MAX_SERIES_PER_PROCESS series; the
/// rest are refused and counted as a `metrics` loss, and its series go with its session.
#[test]
fn a_peer_making_up_counters_is_capped_and_counted() {
    const EXTRA: usize = 72;
    let providers =
        tracer::ipc::providers::parse_providers("TestDouble:0:5:EventCounterIntervalSec=1")
            .unwrap();
    let (mut run, addr, _) = start_run_with_metrics(providers);
    let tmp = ScratchDir::new("counters-hostile");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    run.wait_for("session_started", SESSION, |l| l["kind"] == "session_started" && l["pid"] == pid);
    let n = (MAX_SERIES_PER_PROCESS + EXTRA) as u32;
    assert_eq!(double.counters(n).expect("counters"), u64::from(n));
    run.wait_for_count("EventCounters", TIMEOUT, n as usize, |l| {
        l["kind"] == "dotnet_event" && l["pid"] == pid && l["event"] == "EventCounters"
    });
    let limit = r#"tracer_lost_events_total{source="metrics",reason="series_limit"}"#;
    let body = await_exposition(addr, |b| samples(b).get(limit) == Some(&(EXTRA as f64)));
    let s = samples(&body);
    let of_pid = format!(r#"pid="{pid}""#);
    let got: BTreeMap<String, f64> = s
        .iter()
        .filter_map(|(k, v)| {
            let (name, labels) = k.split_once('{')?;
            labels.starts_with(&of_pid).then(|| (name.to_owned(), *v))
        })
        .collect();
    let expected: BTreeMap<String, f64> =
        (0..MAX_SERIES_PER_PROCESS).map(|k| (format!("testdouble_c{k}"), k as f64)).collect();
    assert_eq!(got, expected, "the first {MAX_SERIES_PER_PROCESS} counters");
    assert_eq!(s[r#"tracer_lost_events_total{source="metrics",reason="bad_counter"}"#], 0.0);

    double.exit().expect("double exits");
    run.wait_for("session_ended", TIMEOUT, |l| l["kind"] == "session_ended" && l["pid"] == pid);
    let (lines, summary) = run.stop();
    let counters = summary.runtime_counters.expect("metrics on");
    assert_eq!((counters.len(), counters.refused()), (0, EXTRA as u64));
    let last = lines.last().unwrap();
    assert_eq!(last["kind"], "summary");
    let loss = last["losses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["source"] == "metrics")
        .expect("a metrics loss in the summary line");
    assert_eq!(
        *loss,
        serde_json::json!({"source":"metrics","reason":"series_limit","count":EXTRA})
    );
}

/// The endpoint on a runtime of its own, as the pipelines run it (one worker), healthy.
fn start_endpoint() -> (tokio::runtime::Runtime, SocketAddr, Arc<Shared>) {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let shared = Shared::new();
    let addr = runtime.block_on(tracer::metrics::serve(free_port(), shared.clone())).unwrap();
    Publisher::new(shared.clone()).set_health(Health::Running);
    (runtime, addr, shared)
}

/// The endpoint's own counters: accepted, evicted, timed out.
fn connection_counts(shared: &Arc<Shared>) -> (f64, f64, f64) {
    let s = samples(&shared.exposition().unwrap());
    let value = |series: &str| *s.get(series).unwrap_or_else(|| panic!("no {series} in {s:#?}"));
    (
        value("tracer_endpoint_connections_total"),
        value(r#"tracer_endpoint_connections_closed_total{reason="evicted"}"#),
        value(r#"tracer_endpoint_connections_closed_total{reason="timed_out"}"#),
    )
}

/// Polls the counters until `done` holds (each poll is a read of memory, not a request).
fn await_counts(shared: &Arc<Shared>, done: impl Fn((f64, f64, f64)) -> bool) -> (f64, f64, f64) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let counts = connection_counts(shared);
        if done(counts) {
            return counts;
        }
        assert!(Instant::now() < deadline, "counts stuck at {counts:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Probes and scrapes, alternately, each on a new connection; their latencies.
fn probe_latencies(addr: SocketAddr, count: usize) -> Vec<Duration> {
    (0..count)
        .map(|i| {
            let (path, expected) = if i % 2 == 0 { ("/healthz", "ok\n") } else { ("/metrics", "") };
            let start = Instant::now();
            let answer = get(addr, path, &[]).unwrap();
            let took = start.elapsed();
            assert_eq!(answer.status, 200, "{path}: {}", answer.body);
            assert!(answer.body.starts_with(expected), "{path}: {}", answer.body);
            took
        })
        .collect()
}

const IDLE: usize = 500;
const DRIBBLING: usize = 500;

/// A neighbour holding 1 000 connections — half of them silent, half sending a request head a
/// byte a second (slowloris) — does not hold up a probe or a scrape: each is answered at once,
/// while every one of the 1 000 is still open. Served in turn by a few slots (as the endpoint
/// once was) the first probe waited for the silent ones to time out: seconds, not milliseconds.
#[test]
fn probes_and_scrapes_are_answered_beside_a_thousand_idle_and_dribbling_connections() {
    use std::io::Write as _;
    let (_runtime, addr, shared) = start_endpoint();
    let mut held: Vec<std::net::TcpStream> =
        (0..IDLE + DRIBBLING).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
    for stream in &mut held[IDLE..] {
        stream.write_all(b"G").unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dribbler = {
        let mut dribbling: Vec<_> = held[IDLE..].iter().map(|s| s.try_clone().unwrap()).collect();
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                for stream in &mut dribbling {
                    let _ = stream.write_all(b"E");
                }
            }
        })
    };
    let total = (IDLE + DRIBBLING) as f64;
    assert_eq!(await_counts(&shared, |(accepted, ..)| accepted == total), (total, 0.0, 0.0));

    let mut latencies = probe_latencies(addr, 10);
    // None of the 1 000 was closed meanwhile (they time out only after REQUEST_TIMEOUT).
    assert_eq!(connection_counts(&shared), (total + 10.0, 0.0, 0.0));
    latencies.sort();
    let (median, max) = (latencies[latencies.len() / 2], latencies[latencies.len() - 1]);
    eprintln!("probe and scrape latencies beside 1 000 held connections: {latencies:?}");
    assert!(median < Duration::from_millis(100), "median {median:?} of {latencies:?}");
    // A margin for a loaded 2-CPU machine; waiting for a slot takes REQUEST_TIMEOUT or more.
    assert!(max < tracer::metrics::REQUEST_TIMEOUT / 5, "slowest {max:?} of {latencies:?}");

    // Then each of the 1 000 is closed for sending no whole request in time, and counted.
    assert_eq!(
        await_counts(&shared, |(.., timed_out)| timed_out == total),
        (total + 10.0, 0.0, total)
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    dribbler.join().unwrap();
    for mut stream in held {
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(std::io::Read::read(&mut stream, &mut buf).unwrap(), 0, "closed by tracer");
    }
}

/// Past MAX_CONNECTIONS, each new connection closes the oldest one: a neighbour cannot fill
/// the endpoint, the oldest of its connections go first, and each eviction is counted.
#[test]
fn connections_past_the_limit_close_the_oldest_and_are_counted() {
    use std::io::Read as _;
    const EXTRA: usize = 50;
    let (_runtime, addr, shared) = start_endpoint();
    let n = tracer::metrics::MAX_CONNECTIONS + EXTRA;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(std::net::TcpStream::connect(addr).unwrap());
    }
    let counts = await_counts(&shared, |(accepted, ..)| accepted == n as f64);
    assert_eq!(counts, (n as f64, EXTRA as f64, 0.0));
    // The EXTRA oldest are closed; the others are open (a read would block).
    for (i, stream) in held.iter_mut().enumerate() {
        let mut buf = [0u8; 64];
        if i < EXTRA {
            stream.set_read_timeout(Some(TIMEOUT)).unwrap();
            assert_eq!(stream.read(&mut buf).unwrap(), 0, "connection {i} closed");
        } else {
            stream.set_nonblocking(true).unwrap();
            let e = stream.read(&mut buf).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "connection {i} open");
        }
    }
    // A probe still gets its answer, at the cost of the oldest connection left.
    let health = get(addr, "/healthz", &[]).unwrap();
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    assert_eq!(connection_counts(&shared), (n as f64 + 1.0, EXTRA as f64 + 1.0, 0.0));
}

/// `tracer run --metrics-addr` tracing only `pid`, whose endpoint also serves its profiles.
fn start_run_serving_profiles(pid: u32) -> (Running<RunSummary>, SocketAddr) {
    let addr = free_port();
    let shared = Shared::new();
    let base = run_config(
        "Microsoft-Windows-DotNETRuntime:0x1:4",
        SessionMode::Streaming,
        Duration::from_secs(10),
        1024,
    );
    let mut config = base;
    config.target_pids = vec![pid];
    config.metrics = Some(Publisher::new(shared.clone()));
    let run = Running::start(TIMEOUT, move |sink, stop, ready| async move {
        tracer::metrics::serve(addr, shared).await?;
        run::run(config, sink, stop, Some(ready)).await
    });
    (run, addr)
}

/// The hot method of tests/dotnet/coreclr_host.py's `burn` workload.
const HOT_METHOD: &str = "TracerWorkload.Hot.Inner";

/// `go tool pprof` fetches a CPU profile from a running `tracer run`'s endpoint, as Parca and
/// Pyroscope scrape Go programs, and names the hot method of a real CoreCLR 8 workload; each
/// sample is labelled with its process.
#[test]
fn go_tool_pprof_fetches_a_profile_from_tracer_run_and_names_the_hot_method() {
    const SECONDS: u32 = 4;
    let tmp = ScratchDir::new("pprof-endpoint");
    let mut runtime = CoreclrHost::spawn(tmp.path()).expect("CoreCLR");
    let pid = runtime.host_pid;
    runtime.burn(2).expect("warm up");
    let (mut run, addr) = start_run_serving_profiles(pid);
    run.wait_for("session_started", SESSION, |l| l["kind"] == "session_started" && l["pid"] == pid);
    let url = format!("http://{addr}/debug/pprof/profile?seconds={SECONDS}&pid={pid}");
    let pprof = |args: &[&str]| {
        Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .env("PPROF_TMPDIR", tmp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("go tool pprof (run `cargo xtask setup`: it installs golang-go)")
    };
    let saved = tmp.path().join("fetched.pb.gz");
    let fetch = pprof(&["-proto", &format!("-output={}", saved.display()), &url]);
    // Burning while the profile is taken (the burn answers when it is done).
    runtime.burn(SECONDS + 2).expect("burn");
    let out = fetch.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read = |report: &str| {
        let out = pprof(&[report, &saved.display().to_string()]).wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    let text = read("-top");
    let top = text
        .lines()
        .find(|l| l.contains("TracerWorkload.Hot."))
        .unwrap_or_else(|| panic!("no workload method in:\n{text}"));
    assert!(top.ends_with(HOT_METHOD), "{HOT_METHOD} is the hottest: {top}\n{text}");
    // `-tags`: every sample of this process, labelled with its pid.
    let text = read("-tags");
    let pid_tag = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("pid:"))
        .nth(1)
        .unwrap_or_else(|| panic!("no pid label in:\n{text}"));
    assert!(
        pid_tag.ends_with(&format!("(  100%): {pid}")),
        "every sample is of {pid}: {pid_tag}\n{text}"
    );
    runtime.exit().expect("exit");
    run.stop();
}

/// One profile at a time: a request meanwhile is answered 429; bad queries 400; a client that
/// goes away mid-profile stops it (the next request is taken at once, not after the first's
/// 60 s).
#[test]
fn profile_requests_are_one_at_a_time_bounded_and_stop_with_their_client() {
    use std::io::Write as _;
    let tmp = ScratchDir::new("pprof-bounds");
    let mut runtime = CoreclrHost::spawn(tmp.path()).expect("CoreCLR");
    let pid = runtime.host_pid;
    let (mut run, addr) = start_run_serving_profiles(pid);
    run.wait_for("session_started", SESSION, |l| l["kind"] == "session_started" && l["pid"] == pid);
    for (query, why) in [
        ("seconds=0", "seconds=0: expected a whole number of seconds from 1 to 300\n"),
        ("seconds=301", "seconds=301: expected a whole number of seconds from 1 to 300\n"),
        ("seconds=1&pid=me", "pid=me: expected a process id\n"),
        ("hz=999", "hz=999: expected seconds=N, pid=P or container=ID\n"),
    ] {
        let answer = get(addr, &format!("/debug/pprof/profile?{query}"), &[]).unwrap();
        assert_eq!((answer.status, answer.body.as_str()), (400, why), "{query}");
    }

    // A client asks for 60 s...
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    write!(client, "GET /debug/pprof/profile?seconds=60&pid={pid} HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let profiling = |on: f64| {
        await_exposition(addr, |b| samples(b).get("tracer_endpoint_profiling") == Some(&on))
    };
    profiling(1.0);
    let busy = get(addr, &format!("/debug/pprof/profile?seconds=1&pid={pid}"), &[]).unwrap();
    assert_eq!(
        (busy.status, busy.body.as_str()),
        (429, "a profile is being taken: one at a time, ask again when it is done\n")
    );
    let refused = samples(&get(addr, "/metrics", &[]).unwrap().body);
    assert_eq!(refused.get("tracer_endpoint_profiles_refused_total"), Some(&1.0));
    // ...and goes away: its profile stops at once, not after 60 s, and the next is taken.
    drop(client);
    let left = Instant::now();
    profiling(0.0);
    assert!(left.elapsed() < Duration::from_secs(30), "stopped {:?} after", left.elapsed());
    let next = get(addr, &format!("/debug/pprof/profile?seconds=1&pid={pid}"), &[]).unwrap();
    assert_eq!((next.status, next.content_type.as_str()), (200, "application/octet-stream"));
    assert!(next.body.starts_with('\u{1f}'), "gzip'd: {:?}", &next.body[..8]);
    runtime.exit().expect("exit");
    run.stop();
}

/// A log pipe nobody drains (a stalled container log) blocks `tracer run`'s output loop in
/// its write, but not the endpoint: the liveness probe and a scrape are still answered at once,
/// so a stalled log does not get the agent restarted in a loop. (With the output loop run as a
/// task on the runtime's workers, the blocked write held one and the probe went unanswered.)
#[test]
fn probes_are_answered_while_the_output_is_stalled() {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    let tmp = ScratchDir::new("stalled-output");
    let runtime = CoreclrHost::spawn(tmp.path()).expect("CoreCLR");
    let pid = runtime.host_pid;
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are fresh descriptors that nothing else owns.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // One page: the runtime's 27 counters a second fill it at once.
    // SAFETY: F_SETPIPE_SZ takes an int size on a pipe descriptor we own.
    let size = unsafe { libc::fcntl(write_end.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    assert!(size >= 4096, "F_SETPIPE_SZ: {}", std::io::Error::last_os_error());
    let addr = free_port();
    let tracer = Killed(
        Command::new(tests::process::tracer_binary())
            .args(["run", "--pid", &pid.to_string(), "--profile", "counters"])
            .args(["--session", "streaming", "--metrics-addr", &addr.to_string()])
            .stdout(Stdio::from(write_end))
            .stderr(Stdio::null())
            .spawn()
            .expect("tracer run"),
    );
    // Until a thread of tracer sleeps in a pipe write: the output loop is stalled (no event
    // says so; the kernel's wait channel does).
    let tid_dir = format!("/proc/{}/task", tracer.0.id());
    let deadline = Instant::now() + SESSION;
    let in_pipe_write = || {
        std::fs::read_dir(&tid_dir).unwrap().flatten().any(|task| {
            let wchan = std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default();
            wchan.contains("pipe_write")
        })
    };
    while !in_pipe_write() {
        assert!(Instant::now() < deadline, "tracer's output never stalled");
        std::thread::sleep(Duration::from_millis(50));
    }
    let blocked =
        || samples(&get(addr, "/metrics", &[]).unwrap().body)["tracer_output_blocked_seconds"];
    let waited = blocked();
    let took = probe_latencies(addr, 4);
    assert!(took.iter().all(|t| *t < Duration::from_secs(1)), "probes took {took:?}");
    assert!(in_pipe_write(), "still stalled while the probes were answered");
    // The scrape says how long the write under way has waited, and it goes on waiting.
    let later = blocked();
    assert!(waited > 0.0 && later > waited, "{waited} s, then {later} s");
    // The read end stays open until here: a write blocks rather than failing with EPIPE.
    drop((tracer, read_end, runtime));
}
