//! Support for the ftrace reader tests: a private instance set up like `tracer ftrace` does, and
//! self-checking binary payloads written through `trace_marker_raw`.
use std::fs::File;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracer::kernel::ftrace_reader::{Event, FtraceReader, ReadMode, ReaderConfig, Tracepoint};
use tracer::kernel::procfs::process_start_ns;
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
    // Past the payload: alignment (< 4 bytes), plus 4 on kernels that reserve the tag id twice
    // (6.12's `tracing_mark_raw_write` reserves `sizeof(*entry) + cnt` and copies `cnt` bytes
    // from `entry->id` on).
    let slack = payload.len().checked_sub(total);
    assert!(slack.is_some_and(|slack| slack < 8), "record length {}", payload.len());
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

/// Whether this kernel refuses root a sub-buffer size of `kb` KiB (`EPERM`, a policy some kernels
/// have), asked directly by writing a scratch instance's `buffer_subbuf_size_kb`; any other
/// failure panics.
pub fn kernel_refuses_subbuf_size(suffix: &str, kb: u64) -> bool {
    let probe = instance(suffix, 1024);
    let file = probe.path("buffer_subbuf_size_kb");
    match std::fs::write(&file, kb.to_string()) {
        Ok(()) => false,
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => true,
        Err(e) => panic!("writing {}: {e}", file.display()),
    }
}

/// What [`pipeline_streams_json_lines`] records: both marker events, 1 MiB per CPU, a wake-up
/// for every record, strict integrity.
pub fn pipeline_config(subbuf_size_kb: Option<u64>) -> tracer::pipeline::ftrace::FtraceConfig {
    tracer::pipeline::ftrace::FtraceConfig {
        events: vec!["ftrace:raw_data".parse().unwrap(), "ftrace:print".parse().unwrap()],
        buffer_size_kb: 1024,
        subbuf_size_kb,
        buffer_percent: 0,
        read_mode: ReadMode::Auto,
        integrity: tracer::kernel::ftrace_reader::Integrity::Strict,
        metrics: None,
    }
}

/// `tracer ftrace` end to end (library entry point), in sub-buffers of `subbuf_size_kb` (`None`:
/// the kernel's page): JSON lines with the common envelope, the summary's exact counts, and the
/// private instance is gone afterwards.
pub fn pipeline_streams_json_lines(subbuf_size_kb: Option<u64>) {
    use crate::pipeline::Running;
    use tracer::pipeline::ftrace::run;
    let config = pipeline_config(subbuf_size_kb);
    let mut pipeline = Running::start(Duration::from_secs(30), move |sink, stop, ready| {
        run(config, sink, stop, Some(ready))
    });
    // Ready: the instance records with the mono clock from now on.
    let dir = std::path::PathBuf::from(format!(
        "/sys/kernel/tracing/instances/tracer-{}",
        std::process::id()
    ));
    assert!(std::fs::read_to_string(dir.join("trace_clock")).unwrap().contains("[mono]"));
    // SAFETY: sysconf has no preconditions.
    let page_kb = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64 / 1024;
    assert_eq!(
        std::fs::read_to_string(dir.join("buffer_subbuf_size_kb")).unwrap(),
        format!("{}\n", subbuf_size_kb.unwrap_or(page_kb))
    );
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    std::fs::write(dir.join("trace_marker"), "pipeline line\n").unwrap();
    let mut raw = std::fs::File::options().write(true).open(dir.join("trace_marker_raw")).unwrap();
    std::io::Write::write_all(&mut raw, &raw_payload(5)).unwrap();
    drop(raw);
    pipeline.wait_for("the raw_data line", Duration::from_secs(20), |l| l["event"] == "raw_data");
    let (lines, summary) = pipeline.stop();
    assert!(!dir.exists(), "instance removed on exit");
    assert_eq!(lines.len(), 3, "two records and the summary: {lines:#?}");
    assert_eq!(lines[2]["kind"], "summary");
    assert_eq!((lines[2]["events"].clone(), lines[2]["lost"].clone()), (2.into(), 0.into()));
    assert_eq!((summary.reader.records(), summary.reader.lost(), summary.bad_fields), (2, 0, 0));
    let print = &lines[0];
    let keys: Vec<&str> = print.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "ts",
            "mono_ns",
            "kind",
            "source",
            "pid",
            "process_start_ns",
            "system",
            "event",
            "cpu",
            "tid",
            "fields"
        ]
    );
    let me = std::process::id();
    assert_eq!(
        (&print["pid"], &print["process_start_ns"]),
        (&me.into(), &process_start_ns(me).into())
    );
    assert_eq!(print["kind"], "ftrace");
    assert_eq!(print["source"], "ftrace");
    assert_eq!(print["system"], "ftrace");
    assert_eq!(print["event"], "print");
    assert_eq!(print["tid"], tid);
    assert_eq!(print["pid"], std::process::id());
    assert_eq!(print["fields"]["buf"], "pipeline line\n");
    assert!(print["ts"].as_str().unwrap().ends_with('Z'));
    let mono = print["mono_ns"].as_u64().unwrap();
    assert!(mono < tracer::time::monotonic_ns(), "mono_ns is CLOCK_MONOTONIC");
    let raw = &lines[1];
    assert_eq!(raw["event"], "raw_data");
    assert_eq!(raw["fields"]["id"], RAW_ID);
    let hex: String = raw_payload(5)[4..].iter().map(|b| format!("{b:02x}")).collect();
    assert!(raw["fields"]["buf"].as_str().unwrap().starts_with(&hex));
}

/// A writer appending while the reader drains (the reader page is often the writer's page, so
/// GET_READER sometimes only advances the kernel's read position): every record is decoded in
/// order, nothing is lost, and the kernel buffer is empty afterwards. With `subbuf_kb`, in
/// sub-buffers of that size (`buffer_subbuf_size_kb`) instead of pages.
pub async fn concurrent_writer_is_drained_completely(
    mode: ReadMode,
    suffix: &str,
    subbuf_kb: Option<u64>,
) {
    // About 2 MiB of events: hundreds of sub-buffers, all fitting in the 8 MiB buffer.
    const RECORDS: u32 = 20_000;
    let inst = instance(suffix, 8192);
    if let Some(kb) = subbuf_kb {
        inst.set_subbuf_size_kb(kb).unwrap();
        assert_eq!(inst.subbuf_size().unwrap(), Some(kb as usize * 1024));
        assert_eq!(inst.page_layout().unwrap().subbuf_size(), kb as usize * 1024);
    }
    // Rare wake-ups: many sub-buffers pile up between drains while the writer keeps appending.
    inst.set_buffer_percent(50).unwrap();
    let config =
        ReaderConfig { mode, poll_interval: Duration::from_millis(50), ..ReaderConfig::default() };
    let mut reader = FtraceReader::open(inst.clone(), marker_tracepoints(&inst), config).unwrap();
    inst.set_tracing_on(true).unwrap();
    let writer = {
        let inst = inst.clone();
        std::thread::spawn(move || {
            pin_to_cpu(0);
            for chunk in 0..RECORDS / 100 {
                write_raw(&inst, chunk * 100..(chunk + 1) * 100);
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };
    let mut events = Vec::new();
    while !writer.is_finished() {
        events.extend(reader.next_batch().await.unwrap());
    }
    writer.join().unwrap();
    inst.set_tracing_on(false).unwrap();
    events.extend(reader.flush().unwrap());
    let seqs: Vec<u32> = events.iter().map(|e| parse_raw_record(&e.record).0).collect();
    let stats = reader.stats();
    assert!(stats.cpus.iter().all(|c| c.entries == 0), "kernel buffer left non-empty: {stats:?}");
    assert_eq!(stats.lost(), 0, "{stats:?}");
    assert_eq!(seqs, (0..RECORDS).collect::<Vec<_>>());
}
