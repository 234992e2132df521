//! `cargo xtask bench ftrace`: events/s consumed and consumer CPU per event for tracer's mmap
//! reader, its read() fallback, and `trace-cmd record`, on the same instance settings (4 MiB per
//! CPU, buffer_percent 50, producer pinned to CPU 0 writing 16-byte trace_marker_raw records);
//! then tracer's two transports again with 64 KiB sub-buffers and with 1 KiB records. Each run
//! is one `ftrace_bench` process (tests/src/bin/ftrace_bench.rs); results are printed as a
//! table. Record them in docs/benchmarks.md ("ftrace").
use std::process::Command;

use crate::util;

const METHODS: &[&str] = &["mmap", "read", "trace-cmd"];
/// Producer rates (records/s); 0 = as fast as one CPU can write.
const RATES: &[u64] = &[100_000, 200_000, 400_000, 800_000, 0];
const SECONDS: &str = "3";
/// (record bytes, sub-buffer KiB: `None` = the page) of the extra rows for tracer's transports,
/// at RATES_EXTRA.
const SHAPES_EXTRA: &[(u32, Option<u32>)] = &[(16, Some(64)), (1024, None), (1024, Some(64))];
const RATES_EXTRA: &[u64] = &[200_000, 0];

pub fn run(args: &[String]) -> anyhow::Result<()> {
    util::require_root("the benchmark creates ftrace instances")?;
    util::cargo(&["build", "--release", "-p", "tests", "--bin", "ftrace_bench"])?;
    let bin = util::workspace_root().join("target/release/ftrace_bench");
    let methods: Vec<&str> =
        if args.is_empty() { METHODS.to_vec() } else { args.iter().map(String::as_str).collect() };
    println!(
        "{:<10} {:>6} {:>7} {:>9} {:>10} {:>10} {:>9} {:>12} {:>12} {:>14}",
        "method",
        "record",
        "subbuf",
        "rate/s",
        "written",
        "consumed",
        "lost",
        "consumed/s",
        "cpu ns/ev",
        "ev/cpu-second"
    );
    let mut runs: Vec<(&str, u64, u32, Option<u32>)> = Vec::new();
    for &method in &methods {
        runs.extend(RATES.iter().map(|&rate| (method, rate, 16, None)));
    }
    for &method in methods.iter().filter(|m| **m != "trace-cmd") {
        for &(record, subbuf) in SHAPES_EXTRA {
            runs.extend(RATES_EXTRA.iter().map(|&rate| (method, rate, record, subbuf)));
        }
    }
    let mut failed_method = None;
    for (method, rate, record, subbuf) in runs {
        if failed_method == Some(method) {
            continue;
        }
        let mut command = Command::new(&bin);
        command.args([method, SECONDS, &rate.to_string(), &record.to_string()]);
        if let Some(kb) = subbuf {
            command.arg(kb.to_string());
        }
        let out = command.output()?;
        let subbuf = subbuf.map_or("page".to_string(), |kb| format!("{kb}K"));
        let line = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = match serde_json::from_str(line.trim()) {
            Ok(v) => v,
            Err(_) => {
                println!(
                    "{method:<10} {record:>6} {subbuf:>7} {rate:>9} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            }
        };
        if let Some(why) = v["refused"].as_str() {
            println!("{method:<10} {record:>6} {subbuf:>7} {rate:>9} refused: {why}");
            continue;
        }
        if let Some(err) = v["error"].as_str() {
            println!("{method:<10} {record:>6} {subbuf:>7} {rate:>9} {err}");
            failed_method = Some(method);
            continue;
        }
        let n = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let (consumed, cpu) = (n("consumed"), n("consumer_cpu_s"));
        println!(
            "{method:<10} {record:>6} {subbuf:>7} {:>9} {:>10} {:>10} {:>9} {:>12.0} {:>12.0} {:>14.0}",
            if rate == 0 { "max".to_string() } else { rate.to_string() },
            n("written"),
            consumed,
            n("lost"),
            consumed / n("wall_s"),
            cpu * 1e9 / consumed,
            consumed / cpu
        );
    }
    Ok(())
}
