//! The pipeline harness turns a stuck pipeline into a failed test with a message: it must never
//! wait for a pipeline without a limit.
use std::time::Duration;

use tests::pipeline::Running;

/// This pipeline never gets ready: the harness gives up after this long.
const READY: Duration = Duration::from_millis(200);

/// A pipeline that waits for its stop signal without ever sending `ready` (the old harness then
/// joined its thread while still holding the stop sender, and hung).
#[test]
#[should_panic(expected = "pipeline not ready within 200ms (it stopped when told to)")]
fn a_pipeline_that_never_gets_ready_fails_the_test_instead_of_hanging() {
    Running::<()>::start(READY, |_sink, stop, _ready| async move {
        stop.await;
        Ok(())
    });
}

#[test]
#[should_panic(expected = "pipeline failed to start: no tracefs here")]
fn a_pipeline_error_before_ready_is_the_panic_message() {
    Running::<()>::start(READY, |_sink, _stop, _ready| async { anyhow::bail!("no tracefs here") });
}

#[test]
fn a_ready_pipeline_stops_when_told_and_returns_its_summary() {
    let running = Running::start(READY, |_sink, stop, ready| async move {
        ready.send(()).expect("the harness waits for ready");
        stop.await;
        Ok(42)
    });
    let (lines, summary) = running.stop();
    assert_eq!((lines.len(), summary), (0, 42));
}
