//! `--metrics-addr` on the real kernel (root): the endpoint while `tracer audit` runs, its
//! numbers against the summary at exit, `promtool check metrics` on the exposition, and a real
//! Prometheus server (Debian `prometheus`) scraping tracer.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::http::{free_port, get};
use tests::pipeline::Running;
use tests::process::LineProcess;
use tests::scratch::ScratchDir;
use tracer::metrics::{Health, Publisher, Shared};
use tracer::pipeline::audit::{self, AuditConfig, AuditSummary};

const HELPER: &str = env!("CARGO_BIN_EXE_detect_helper");
const TIMEOUT: Duration = Duration::from_secs(20);
/// Prometheus start-up plus a few 1 s scrapes on a loaded 2-core machine.
const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(90);
const OPENMETRICS: &str = "Accept: application/openmetrics-text; version=1.0.0";

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

/// `detect_helper sequence` to its end, with tracer's report of its exit.
fn helper_sequence(audit: &mut Running<AuditSummary>) {
    let mut helper = LineProcess::spawn(HELPER, {
        let mut c = Command::new(HELPER);
        c.arg("sequence");
        c
    })
    .unwrap();
    for phase in ["started", "registered", "done"] {
        let v: Value = serde_json::from_str(&helper.next_line(TIMEOUT).unwrap()).unwrap();
        assert_eq!(v["phase"], phase);
        if phase != "done" {
            helper.send_line("go").unwrap();
        }
    }
    let pid = helper.pid();
    helper.close_stdin();
    helper.wait_exit(TIMEOUT).unwrap();
    audit
        .wait_for("the helper's exit", TIMEOUT, |v| v["kind"] == "process_exit" && v["pid"] == pid);
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

fn promtool_check(exposition: &str) {
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
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{exposition}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn scrape_matches_the_summary_and_promtool_accepts_it() {
    let (mut audit, addr, shared) = start_audit();
    let health = get(addr, "/healthz", &[]).unwrap();
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    helper_sequence(&mut audit);

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
    // Every loss the summary counts is a series with the same number.
    let losses = summary.all_loss_counts();
    assert_eq!(losses.len(), 6, "{losses:?}");
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

/// Kills Prometheus when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_prometheus_server_scrapes_tracer() {
    let (mut audit, tracer_addr, _) = start_audit();
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
    let _server = Killed(
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
    helper_sequence(&mut audit);
    // Every kernel loss reason is a series from the start (0 until it happens).
    let lost =
        await_query(prometheus, r#"tracer_lost_events_total{source="kernel"}"#, |r| r.len() == 5);
    let reasons: Vec<&str> = lost
        .iter()
        .map(|(l, _)| l["reason"].as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(
        reasons,
        ["corrupt_record", "map_full", "read_failed", "recursion_miss", "ring_full"]
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
