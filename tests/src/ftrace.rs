//! Support for the ftrace reader tests: a private instance set up like `tracer ftrace` does, and
//! self-checking binary payloads written through `trace_marker_raw`.
use std::fs::File;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracer::kernel::ftrace_reader::{Event, FtraceReader, ReadMode, ReaderConfig, Tracepoint};
use tracer::kernel::tracefs::{Instance, Tracefs};

/// A record's fields as tracer writes them, parsed.
pub fn fields_json(fields: &tracer_decode::ftrace::record::Fields) -> serde_json::Value {
    let mut json = Vec::new();
    tracer_decode::json::WriteJson::write_json(fields, &mut json);
    serde_json::from_slice(&json).expect("tracer writes JSON")
}

/// Marker in the `id` field of every record the tests write.
pub const RAW_ID: u32 = 0x7472_6331;

/// A fresh private instance `tracer-<pid>-<suffix>` with the mono clock.
pub fn instance(suffix: &str, buffer_kb: u64) -> Arc<Instance> {
    let tracefs = Tracefs::find_or_mount().expect("tracefs");
    let inst = Instance::create_with_suffix(&tracefs, Some(suffix)).expect("create instance");
    inst.set_tracing_on(false).unwrap();
    inst.set_buffer_size_kb(buffer_kb).unwrap();
    inst.set_trace_clock("mono").unwrap();
    inst.set_buffer_percent(0).unwrap();
    Arc::new(inst)
}

pub fn marker_tracepoints(inst: &Instance) -> Vec<Tracepoint> {
    vec![
        inst.tracepoint("ftrace", "raw_data").unwrap(),
        inst.tracepoint("ftrace", "print").unwrap(),
    ]
}

pub fn reader(inst: &Arc<Instance>, tps: Vec<Tracepoint>, mode: ReadMode) -> FtraceReader {
    let config = ReaderConfig {
        mode,
        poll_interval: Duration::from_millis(20),
        reorder_window: Duration::from_millis(50),
        ..ReaderConfig::default()
    };
    FtraceReader::open(inst.clone(), tps, config).expect("open reader")
}

fn checksum(bytes: &[u8]) -> u32 {
    // FNV-1a
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// Payload number `seq`: `RAW_ID, seq, len, data[len], fnv(seq ‖ data)`; lengths vary so both
/// small and large ring-buffer events occur.
pub fn raw_payload(seq: u32) -> Vec<u8> {
    let len = (seq as usize * 7) % 150;
    let data: Vec<u8> = (0..len).map(|i| (seq as usize * 31 + i) as u8).collect();
    let mut p = RAW_ID.to_le_bytes().to_vec();
    p.extend(seq.to_le_bytes());
    p.extend((len as u32).to_le_bytes());
    p.extend(&data);
    let mut summed = seq.to_le_bytes().to_vec();
    summed.extend(&data);
    p.extend(checksum(&summed).to_le_bytes());
    p
}

/// Checks a decoded raw_data record against its checksum; returns (seq, the written payload
/// as found in the record, without alignment padding).
pub fn parse_raw_record(record: &[u8]) -> (u32, Vec<u8>) {
    let payload = &record[8..];
    let u32_at = |o: usize| u32::from_le_bytes(payload[o..o + 4].try_into().unwrap());
    assert_eq!(u32_at(0), RAW_ID);
    let (seq, len) = (u32_at(4), u32_at(8) as usize);
    let total = 12 + len + 4;
    assert!(payload.len() >= total && payload.len() - total < 4, "record length {}", payload.len());
    let mut summed = seq.to_le_bytes().to_vec();
    summed.extend(&payload[12..12 + len]);
    assert_eq!(u32_at(12 + len), checksum(&summed), "checksum of record {seq}");
    (seq, payload[..total].to_vec())
}

/// Writes raw payloads `seqs` through the instance's trace_marker_raw, one write each.
pub fn write_raw(inst: &Instance, seqs: std::ops::Range<u32>) {
    let mut f = File::options().write(true).open(inst.path("trace_marker_raw")).unwrap();
    for seq in seqs {
        f.write_all(&raw_payload(seq)).unwrap();
    }
}

pub fn write_text(inst: &Instance, lines: &[String]) {
    let mut f = File::options().write(true).open(inst.path("trace_marker")).unwrap();
    for l in lines {
        f.write_all(l.as_bytes()).unwrap();
    }
}

/// Reads batches until `done(events)` holds or `timeout` passes, then flushes.
pub async fn collect_until(
    reader: &mut FtraceReader,
    timeout: Duration,
    done: impl Fn(&[Event]) -> bool,
) -> Vec<Event> {
    let start = Instant::now();
    let mut events = Vec::new();
    while !done(&events) && start.elapsed() < timeout {
        events.extend(reader.next_batch().await.expect("next_batch"));
    }
    events.extend(reader.flush().expect("flush"));
    events
}

/// Pins the calling thread to `cpu` so all its trace writes land in that CPU's buffer.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, applied to the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set), 0);
    }
}
