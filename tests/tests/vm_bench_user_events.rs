//! `cargo xtask vm-test --bench`: events/s from the .NET 10 test double through a CollectTracing5
//! user_events session → tracer's mapped ftrace buffer → decoded JSON lines, with zero loss.
//! Inside the VM, under TCG software emulation: the absolute numbers are far below what the same
//! path does on hardware; compare runs with each other, not with host benchmarks.
//! `cargo xtask test` runs it too, shortened (`TRACER_VM_BENCH_SHORT=1`), for its zero-loss
//! assertions rather than its numbers.
use std::time::{Duration, Instant};

use tests::double::Dotnet10Double;
use tests::pipeline::{Running, run_config, start_run};
use tests::scratch::ScratchDir;
use tests::user_events::tracefs_with_user_events;
use tracer::pipeline::run::RunSummary;
use tracer::session::SessionMode;

const BATCHES: u32 = 10;
/// Batches of the shortened run.
const SHORT_BATCHES: u32 = 1;
const PER_BATCH: u32 = 2000;
const TIMEOUT: Duration = Duration::from_secs(600);

#[test]
fn user_events_session_throughput() {
    tracefs_with_user_events();
    let config = run_config("TestDouble", SessionMode::UserEvents, Duration::from_secs(30), 8192);
    let mut tracer: Running<RunSummary> = start_run(TIMEOUT, config);
    let tmp = ScratchDir::new("vm-bench-ue");
    let mut double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let pid = double.pid();
    tracer.wait_for("session_started", TIMEOUT, |l| {
        l["kind"] == "session_started" && l["pid"] == pid
    });

    let batches =
        if std::env::var_os("TRACER_VM_BENCH_SHORT").is_some() { SHORT_BATCHES } else { BATCHES };
    let total = (batches * PER_BATCH) as usize;
    let start = Instant::now();
    let mut written = 0;
    for _ in 0..batches {
        let (w, skipped) = double.emit(PER_BATCH).expect("emit");
        assert_eq!(skipped, 0);
        written += w;
    }
    let emitted_in = start.elapsed();
    tracer
        .wait_for_count("Tick events", TIMEOUT, total, |l| l["pid"] == pid && l["event"] == "Tick");
    let elapsed = start.elapsed();
    let (_, summary) = tracer.stop();
    assert_eq!(written, total as u64);
    assert_eq!(summary.losses(), vec![], "zero loss");
    println!(
        "@@BENCH user_events session: {total} events written by the double in {:.2} s \
         ({:.0} ev/s, the producer's own limit under TCG); all {total} decoded to JSON after \
         {:.2} s → {:.0} events/s end to end, lost {}",
        emitted_in.as_secs_f64(),
        total as f64 / emitted_in.as_secs_f64(),
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        summary.lost()
    );
}
