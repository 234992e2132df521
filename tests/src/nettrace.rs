//! Decoding a whole nettrace stream a test read from a runtime's session, with tracer's parser.

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use tracer_decode::nettrace::NettraceParser;

const RUNTIME_PROVIDER: &str = "Microsoft-Windows-DotNETRuntime";

/// `(Count, Reason)` of every GCStart in `stream`, in order. Fails unless the stream parses to
/// its end-of-stream tag and lost no event.
pub fn gc_starts(stream: &[u8]) -> Result<Vec<(u64, String)>> {
    let mut parser = NettraceParser::default();
    let mut events: Vec<Value> = Vec::new();
    parser.feed(stream, |e| {
        let mut json = Vec::new();
        e.output().write_json(&mut json);
        events.push(serde_json::from_slice(&json).expect("JSON"));
    })?;
    parser.finish()?;
    ensure!(parser.stats().lost_events == 0, "the stream lost events: {:?}", parser.stats());
    events
        .iter()
        .filter(|e| e["provider"] == RUNTIME_PROVIDER && e["event"] == "GCStart")
        .map(|e| {
            let count = e["fields"]["Count"].as_u64().with_context(|| format!("Count in {e}"))?;
            let reason =
                e["fields"]["Reason"].as_str().with_context(|| format!("Reason in {e}"))?;
            Ok((count, reason.to_owned()))
        })
        .collect()
}

/// `n` induced GCs after the runtime's `before`-th, as [`gc_starts`] reports them.
pub fn induced(before: u64, n: u64) -> Vec<(u64, String)> {
    (before + 1..=before + n).map(|count| (count, "Induced".to_owned())).collect()
}
