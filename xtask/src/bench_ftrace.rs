//! `cargo xtask bench ftrace`: events/s consumed and consumer CPU per event for tracer's mmap
//! reader, its read() fallback, and `trace-cmd record`, on the same instance settings (4 MiB per
//! CPU, buffer_percent 50, producer pinned to CPU 0 writing 16-byte trace_marker_raw records).
//! Each run is one `ftrace_bench` process (tests/src/bin/ftrace_bench.rs); results are printed
//! as a table. Record them in docs/benchmarks.md ("ftrace").
use std::process::Command;

use crate::util;

const METHODS: &[&str] = &["mmap", "read", "trace-cmd"];
/// Producer rates (records/s); 0 = as fast as one CPU can write.
const RATES: &[u64] = &[100_000, 200_000, 400_000, 800_000, 0];
const SECONDS: &str = "3";

pub fn run(args: &[String]) -> anyhow::Result<()> {
    util::require_root("the benchmark creates ftrace instances")?;
    util::cargo(&["build", "--release", "-p", "tests", "--bin", "ftrace_bench"])?;
    let bin = util::workspace_root().join("target/release/ftrace_bench");
    let methods: Vec<&str> =
        if args.is_empty() { METHODS.to_vec() } else { args.iter().map(String::as_str).collect() };
    println!(
        "{:<10} {:>9} {:>10} {:>10} {:>9} {:>12} {:>12} {:>14}",
        "method",
        "rate/s",
        "written",
        "consumed",
        "lost",
        "consumed/s",
        "cpu ns/ev",
        "ev/cpu-second"
    );
    for method in methods {
        for rate in RATES {
            let out = Command::new(&bin).args([method, SECONDS, &rate.to_string()]).output()?;
            let line = String::from_utf8_lossy(&out.stdout);
            let v: serde_json::Value = match serde_json::from_str(line.trim()) {
                Ok(v) => v,
                Err(_) => {
                    println!(
                        "{method:<10} {rate:>9} failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    continue;
                }
            };
            if let Some(err) = v["error"].as_str() {
                println!("{method:<10} {rate:>9} {err}");
                break;
            }
            let n = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            let (consumed, cpu) = (n("consumed"), n("consumer_cpu_s"));
            println!(
                "{method:<10} {:>9} {:>10} {:>10} {:>9} {:>12.0} {:>12.0} {:>14.0}",
                if *rate == 0 { "max".to_string() } else { rate.to_string() },
                n("written"),
                consumed,
                n("lost"),
                consumed / n("wall_s"),
                cpu * 1e9 / consumed,
                consumed / cpu
            );
        }
    }
    Ok(())
}
