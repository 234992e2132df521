//! Reading tracer's detection ring directly (a [`Detector`] in the test process), for tests of
//! what reaches user space and when.
use std::time::Duration;

use tracer::kernel::detect::Detector;
use tracer_decode::bpf_event::DetectionEvent;

/// Reads the ring into `seen` until `done(seen)`; panics (saying how many events came) when
/// that takes longer than `timeout`, also while a read waits.
pub async fn read_until(
    detector: &mut Detector,
    seen: &mut Vec<DetectionEvent>,
    timeout: Duration,
    done: impl Fn(&[DetectionEvent]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut batch = Vec::new();
    while !done(seen) {
        let read = tokio::time::timeout_at(deadline, detector.read(&mut batch)).await;
        let Ok(read) = read else { panic!("not within {timeout:?}: {} events so far", seen.len()) };
        read.expect("reading the detection ring");
        seen.append(&mut batch);
    }
}
