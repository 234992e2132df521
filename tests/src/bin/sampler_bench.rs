//! One run of the sampler benchmark (driven by `cargo xtask bench sampler`).
//!
//! `sampler_bench <frequency Hz, 0 = no sampling> <milliseconds>`: runs tests/native/busy_helper.c
//! in its `throughput` mode (one spinning thread per online CPU) for that long, with tracer's CPU
//! sampler attached to it at that frequency (or not), reading samples as `tracer profile` would.
//! Prints one JSON object: the helper's work units per second, the samples read, the sampler's
//! own CPU time while it ran (this process: its reads and decoding), the programs'
//! run statistics (run time only with `kernel.bpf_stats_enabled`) and the losses.
use std::io::Read as _;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use tests::native::NativeHelper;
use tracer::kernel::sampler::{Sampler, SamplerOptions, Targets};

/// CPU time this process has used.
fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The helper's `UNITS_PER_SECOND <n>` line.
fn units_per_second(output: &str) -> Result<f64> {
    output
        .lines()
        .find_map(|l| l.strip_prefix("UNITS_PER_SECOND "))
        .with_context(|| format!("busy_helper printed {output:?}"))?
        .trim()
        .parse()
        .context("UNITS_PER_SECOND")
}

async fn run(frequency_hz: u64, millis: u64) -> Result<serde_json::Value> {
    let helper = NativeHelper::compile("busy_helper");
    let mut sampler = match frequency_hz {
        0 => None,
        hz => Some(Sampler::attach(&SamplerOptions::cpu(hz, Targets::Processes(vec![])))?),
    };
    let cpu_before = process_cpu_seconds();
    let mut child = Command::new(helper.path())
        .args(["throughput", &millis.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting busy_helper")?;
    let mut samples = Vec::new();
    let mut read = 0u64;
    if let Some(sampler) = sampler.as_mut() {
        sampler.add_target(child.id())?;
        while child.try_wait()?.is_none() {
            sampler.read(&mut samples).await?;
            read += samples.len() as u64;
            samples.clear();
        }
        sampler.drain(&mut samples);
        read += samples.len() as u64;
    }
    let status = child.wait()?;
    let sampler_cpu = process_cpu_seconds() - cpu_before;
    let mut output = String::new();
    child.stdout.take().context("piped")?.read_to_string(&mut output)?;
    if !status.success() {
        bail!("busy_helper exited with {status}");
    }
    let (run_time_ns, run_cnt, losses) = match &sampler {
        Some(sampler) => {
            let stats = sampler.program_stats()?;
            let (run_time, runs) =
                stats.iter().fold((0, 0), |(t, n), (_, s)| (t + s.run_time_ns, n + s.run_cnt));
            (run_time, runs, sampler.losses()?.total())
        }
        None => (0, 0, 0),
    };
    Ok(serde_json::json!({
        "frequency_hz": frequency_hz,
        "units_per_second": units_per_second(&output)?,
        "samples": read,
        "sampler_cpu_seconds": sampler_cpu,
        "bpf_run_time_ns": run_time_ns,
        "bpf_runs": run_cnt,
        "losses": losses,
    }))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, frequency_hz, millis] = &args[..] else {
        bail!("usage: sampler_bench <frequency Hz, 0 = no sampling> <milliseconds>");
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = runtime.block_on(run(frequency_hz.parse()?, millis.parse()?))?;
    println!("{result}");
    Ok(())
}
