//! The ftrace reader against the real kernel (root, Linux ≥ 6.10 for the mmap path).
use std::time::Duration;

use tests::ftrace::*;
use tracer::kernel::ftrace_reader::{Event, FtraceReader, ReadMode, ReaderConfig};

const N: u32 = 3000;
const TEXT_LINES: usize = 50;

/// Writes N raw records and TEXT_LINES text markers, reads them back with `mode`, and checks
/// exact count, byte-identical payloads, order, and no loss. Returns (seq or text) in order.
async fn marker_roundtrip(mode: ReadMode, suffix: &str) -> Vec<(u32, String, Vec<u8>)> {
    let inst = instance(suffix, 1024);
    let mut reader = reader(&inst, marker_tracepoints(&inst), mode);
    assert_eq!(reader.mode(), mode);
    inst.set_tracing_on(true).unwrap();
    let lines: Vec<String> = (0..TEXT_LINES).map(|i| format!("tracer-test line {i}\n")).collect();
    write_raw(&inst, 0..N / 2);
    write_text(&inst, &lines);
    write_raw(&inst, N / 2..N);
    let want = N as usize + TEXT_LINES;
    let events =
        collect_until(&mut reader, Duration::from_secs(20), |e: &[Event]| e.len() >= want).await;
    assert_eq!(events.len(), want, "decoded records");
    let stats = reader.stats();
    assert_eq!(stats.lost(), 0, "{stats:?}");
    assert_eq!(stats.corrupt_pages(), 0);
    assert_eq!(stats.records(), want as u64);

    // Timestamps are CLOCK_MONOTONIC and the merge is by timestamp: the write order comes back.
    let mut out = Vec::new();
    let mut next_seq = 0;
    let mut next_line = 0;
    let mut last_ts_per_cpu = std::collections::HashMap::new();
    for e in &events {
        let last = last_ts_per_cpu.entry(e.cpu).or_insert(0u64);
        assert!(e.ts >= *last, "per-CPU order");
        *last = e.ts;
        match e.tracepoint.name.as_str() {
            "raw_data" => {
                let (seq, payload) = parse_raw_record(&e.record);
                assert_eq!(seq, next_seq, "raw records in write order");
                assert_eq!(payload, raw_payload(seq), "byte-identical payload {seq}");
                next_seq += 1;
                out.push((e.cpu, String::new(), payload));
            }
            "print" => {
                let fields = e.fields().unwrap();
                let buf = fields_json(&fields)["buf"].as_str().unwrap().to_string();
                assert_eq!(buf, lines[next_line]);
                // Text lines were written between the two raw halves.
                assert_eq!(next_seq, N / 2);
                next_line += 1;
                out.push((e.cpu, buf, Vec::new()));
            }
            other => panic!("unexpected event {other}"),
        }
    }
    assert_eq!((next_seq, next_line), (N, TEXT_LINES));
    out
}

#[tokio::test]
async fn marker_records_roundtrip_mmap() {
    marker_roundtrip(ReadMode::Mmap, "rt-mmap").await;
}

#[tokio::test]
async fn forced_read_mode_gives_identical_results() {
    let mapped = marker_roundtrip(ReadMode::Mmap, "same-mmap").await;
    let read = marker_roundtrip(ReadMode::Read, "same-read").await;
    let strip =
        |v: Vec<(u32, String, Vec<u8>)>| v.into_iter().map(|(_, s, p)| (s, p)).collect::<Vec<_>>();
    assert_eq!(strip(mapped), strip(read));
}

/// A burst into a small buffer that nobody drains: the ring overwrites, and every record is
/// either decoded or counted lost, by the kernel's overrun counter and by the page flags alike.
async fn overrun_accounting(mode: ReadMode, suffix: &str) {
    const BURST: u32 = 20_000;
    let inst = instance(suffix, 8);
    let mut reader = reader(&inst, marker_tracepoints(&inst), mode);
    inst.set_tracing_on(true).unwrap();
    let writer = inst.clone();
    std::thread::spawn(move || {
        pin_to_cpu(0);
        write_raw(&writer, 0..BURST);
    })
    .join()
    .unwrap();
    inst.set_tracing_on(false).unwrap();
    let events = reader.flush().unwrap();
    let stats = reader.stats();
    let cpu0 = stats.cpus[0];
    let seqs: Vec<u32> = events.iter().map(|e| parse_raw_record(&e.record).0).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "decoded records in order");
    assert!(cpu0.overrun > 0, "the burst must overrun the 8 KiB buffer: {cpu0:?}");
    assert_eq!(cpu0.dropped, 0);
    assert_eq!(cpu0.records, events.len() as u64);
    assert_eq!(events.len() as u64 + cpu0.overrun, u64::from(BURST), "{cpu0:?}");
    // A flagged page full to the byte has no room for the count (RB_MISSED_STORED unset).
    if cpu0.pages_with_unknown_loss == 0 {
        assert_eq!(cpu0.lost_on_pages, cpu0.overrun, "page flags add up to the overrun: {cpu0:?}");
    } else {
        assert!(cpu0.lost_on_pages < cpu0.overrun, "{cpu0:?}");
    }
    assert_eq!(stats.lost(), cpu0.overrun);
    // Overwrite mode loses the oldest records: what survives is the tail of the burst.
    assert_eq!(*seqs.last().unwrap(), BURST - 1);
    assert_eq!(seqs[0] as usize, BURST as usize - seqs.len());
}

#[tokio::test]
async fn overrun_is_fully_accounted_mmap() {
    overrun_accounting(ReadMode::Mmap, "ovr-mmap").await;
}

#[tokio::test]
async fn overrun_is_fully_accounted_read() {
    overrun_accounting(ReadMode::Read, "ovr-read").await;
}

/// Renders a decoded event the way the kernel's `trace` file does (after the timestamp).
fn kernel_text(e: &Event) -> String {
    let fields = e.fields().unwrap();
    let v = fields_json(&fields);
    match e.tracepoint.name.as_str() {
        "sched_process_exec" => format!(
            "sched_process_exec: filename={} pid={} old_pid={}",
            v["filename"].as_str().unwrap(),
            v["pid"],
            v["old_pid"]
        ),
        "sys_enter_openat" => {
            let hex = |n: &str| match v[n].as_u64().unwrap() {
                0 => "0".to_string(),
                x => format!("{x:#x}"),
            };
            format!(
                "sys_openat(dfd: {}, filename: {}, flags: {}, mode: {})",
                hex("dfd"),
                hex("filename"),
                hex("flags"),
                hex("mode")
            )
        }
        other => panic!("unexpected {other}"),
    }
}

/// `<comm>-<tid> [<cpu>] <flags> <secs>.<usecs>: <text>` → (cpu, usecs, tid, text).
fn parse_trace_line(line: &str) -> (u32, u64, i32, String) {
    let (head, rest) = line.split_once("] ").unwrap();
    let (task, cpu) = head.rsplit_once('[').unwrap();
    let tid = task.trim().rsplit_once('-').unwrap().1.parse().unwrap();
    let (_flags, rest) = rest.trim_start().split_once(' ').unwrap();
    let (ts, text) = rest.trim_start().split_once(": ").unwrap();
    let (secs, usecs) = ts.split_once('.').unwrap();
    let us = secs.parse::<u64>().unwrap() * 1_000_000 + usecs.parse::<u64>().unwrap();
    (cpu.parse().unwrap(), us, tid, text.to_string())
}

#[tokio::test]
async fn decoded_fields_match_the_kernels_text_rendering() {
    let inst = instance("text", 1024);
    let tid = unsafe { libc::gettid() };
    let tps = vec![
        inst.tracepoint("sched", "sched_process_exec").unwrap(),
        inst.tracepoint("syscalls", "sys_enter_openat").unwrap(),
    ];
    inst.enable(&"sched:sched_process_exec".parse().unwrap()).unwrap();
    inst.enable(&format!("syscalls:sys_enter_openat:common_pid == {tid}").parse().unwrap())
        .unwrap();
    inst.set_tracing_on(true).unwrap();
    for _ in 0..3 {
        assert!(std::process::Command::new("/bin/true").status().unwrap().success());
        drop(std::fs::File::open("/proc/self/status").unwrap());
    }
    inst.set_tracing_on(false).unwrap();
    // The `trace` file reads without consuming; read it before the reader drains the buffer.
    let text = std::fs::read_to_string(inst.path("trace")).unwrap();
    let want: Vec<_> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(parse_trace_line)
        .collect();
    let mut reader = reader(&inst, tps, ReadMode::Mmap);
    let events = reader.flush().unwrap();
    let got: Vec<_> =
        events.iter().map(|e| (e.cpu, (e.ts + 500) / 1000, e.common.pid, kernel_text(e))).collect();
    let execs = got.iter().filter(|g| g.3.starts_with("sched_process_exec")).count();
    let opens = got.iter().filter(|g| g.3.starts_with("sys_openat")).count();
    assert!(execs >= 3 && opens >= 3, "{execs} execs, {opens} opens in {got:#?}");
    // The merge sorts by timestamp; the text file too (ties can differ between CPUs).
    let mut want = want;
    let mut got = got;
    want.sort();
    got.sort();
    assert_eq!(got, want);
}

#[test]
fn tracer_check_on_this_host() {
    use tracer::kernel::detect::tracepoints;
    use tracer::pipeline::check::{Status, required_missing, run};
    let findings = run();
    let lines: Vec<String> = findings.iter().map(|f| f.to_string()).collect();
    let status_of = |what: &str| {
        findings.iter().find(|f| f.what == what).unwrap_or_else(|| panic!("{what}: {lines:#?}"))
    };
    assert_eq!(status_of("privileges").detail, "CAP_SYS_ADMIN (root)");
    assert_eq!(status_of("BPF syscall").status, Status::Ok);
    assert_eq!(status_of("tracefs").detail, "mounted at /sys/kernel/tracing");
    for (system, name) in tracepoints() {
        assert_eq!(status_of(&format!("tracepoint {system}:{name}")).status, Status::Ok);
    }
    assert_eq!(status_of("kernel version").status, Status::Ok);
    let mmap = status_of("trace_pipe_raw mmap");
    assert_eq!(mmap.status, Status::Ok);
    assert!(mmap.detail.starts_with("mapped cpu0 of a scratch instance"), "{}", mmap.detail);
    assert!(
        mmap.detail.ends_with(
            "; tracer reads with read() by default, which costs less than the mapping per record \
             under a few hundred bytes (.NET's records are smaller); --read-mode mmap for larger \
             ones"
        ),
        "{}",
        mmap.detail
    );
    // Whether this kernel lets root change the sub-buffer size, asked directly.
    let subbuf = status_of("ftrace sub-buffer size");
    if kernel_refuses_subbuf_size("check-probe", 8) {
        let dir =
            format!("/sys/kernel/tracing/instances/tracer-{}-check-subbuf", std::process::id());
        assert_eq!(
            (subbuf.status.clone(), subbuf.detail.clone()),
            (
                Status::MissingOptional,
                format!(
                    "the kernel refused to change the ftrace sub-buffer size to 8 KiB (writing \
                     {dir}/buffer_subbuf_size_kb: Operation not permitted (os error 1)): leave \
                     --subbuf-size-kb out to use one-page sub-buffers"
                )
            )
        );
    } else {
        assert_eq!(
            (subbuf.status.clone(), subbuf.detail.clone()),
            (
                Status::Ok,
                "a scratch instance took 8 KiB sub-buffers: `tracer ftrace --subbuf-size-kb` can \
                 be used"
                    .to_string()
            )
        );
    }
    // This host has no CONFIG_USER_EVENTS: reported, optional.
    let ue = status_of("user_events");
    assert_eq!(ue.status, Status::MissingOptional);
    assert!(
        lines.contains(
            &"MISSING (optional) user_events: /sys/kernel/tracing/user_events_data absent (kernel \
         built without CONFIG_USER_EVENTS): `tracer run` will use streaming (EventPipe) sessions \
         instead, and the ioctl hooks are not attached (no process can register user_events, \
         and every ioctl of the machine is spared them); rebuild with CONFIG_USER_EVENTS=y for \
         user_events sessions"
                .to_string()
        )
    );
    let btf = status_of("kernel BTF");
    assert_eq!(btf.status, Status::Ok);
    assert!(
        btf.detail.starts_with("/sys/kernel/btf/vmlinux: the memfd programs read"),
        "{}",
        btf.detail
    );
    // The detection hooks, lifecycle hooks and process exits findings are checked in
    // tests/detection_hooks.rs.
    assert_eq!(status_of("process exits").status, Status::Ok);
    // What a container runtime may take away: nothing, here (tests/container.rs takes each).
    for what in [
        "seccomp",
        "process access",
        "pid namespace",
        "tracefs writable",
        "cgroup hierarchy",
        "kernel symbols",
    ] {
        assert_eq!(status_of(what).status, Status::Ok, "{}", status_of(what));
    }
    assert_eq!(findings.len(), 13 + tracepoints().count() + 4);
    assert!(!required_missing(&findings));
    // The scratch instance is gone.
    let leftover = std::fs::read_dir("/sys/kernel/tracing/instances")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .any(|n| n.starts_with(&format!("tracer-{}-check", std::process::id())));
    assert!(!leftover);
}

/// `tracer ftrace` end to end with one-page sub-buffers (tests/src/ftrace.rs; the VM runs it
/// with larger ones, which this host's kernel may refuse).
#[test]
fn ftrace_pipeline_streams_json_lines() {
    pipeline_streams_json_lines(None);
}

/// `--subbuf-size-kb` is applied where the kernel allows a sub-buffer size change, and is an
/// error that says what to do where it forbids one (this host's kernel: `EPERM`, even to root).
/// Which of the two the kernel does is found by asking it directly, on a scratch instance.
#[test]
fn a_sub_buffer_size_is_applied_or_refused_with_what_to_do() {
    if !kernel_refuses_subbuf_size("subbuf-probe", 16) {
        pipeline_streams_json_lines(Some(16));
        return;
    }
    let err = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(tracer::pipeline::ftrace::run(
            pipeline_config(Some(16)),
            tracer::output::JsonLines::writer(std::io::sink()),
            std::future::pending(),
            None,
        ))
        .expect_err("a sub-buffer size the kernel refuses");
    let dir = format!("/sys/kernel/tracing/instances/tracer-{}", std::process::id());
    assert_eq!(
        format!("{err:#}"),
        format!(
            "the kernel refused to change the ftrace sub-buffer size to 16 KiB (writing \
             {dir}/buffer_subbuf_size_kb: Operation not permitted (os error 1)): leave \
             --subbuf-size-kb out to use one-page sub-buffers"
        )
    );
    assert!(!std::path::Path::new(&dir).exists(), "instance removed after the refusal");
}

#[tokio::test]
async fn concurrent_writer_is_drained_completely_mmap() {
    concurrent_writer_is_drained_completely(ReadMode::Mmap, "drain-mmap", None).await;
}

#[tokio::test]
async fn concurrent_writer_is_drained_completely_read() {
    concurrent_writer_is_drained_completely(ReadMode::Read, "drain-read", None).await;
}

/// With a poll interval that never comes, only the kernel's `buffer_percent` wake-ups pace the
/// reader: every round of writes past the watermark must wake it, not just the first (the
/// kernel arms the next wake-up only when a poll finds the watermark not reached, and epoll's
/// own poll, reporting a wake-up, finds it reached; docs/protocol/ftrace.md §9).
async fn every_watermark_crossing_wakes_the_reader(mode: ReadMode, suffix: &str) {
    /// Each round writes ≈ 40 % of the 512 KiB buffer (≈ 100 bytes a record), the watermark is
    /// 25 %: every round crosses it, and what a round leaves plus the next round fits.
    const PER_ROUND: u32 = 2000;
    const ROUNDS: u32 = 3;
    let inst = instance(suffix, 512);
    inst.set_buffer_percent(25).unwrap();
    let config = ReaderConfig {
        mode,
        poll_interval: Duration::from_secs(3600),
        reorder_window: Duration::ZERO,
        ..ReaderConfig::default()
    };
    let mut reader = FtraceReader::open(inst.clone(), marker_tracepoints(&inst), config).unwrap();
    inst.set_tracing_on(true).unwrap();
    let mut events = Vec::new();
    for round in 0..ROUNDS {
        let writer = {
            let inst = inst.clone();
            std::thread::spawn(move || {
                pin_to_cpu(0);
                write_raw(&inst, round * PER_ROUND..(round + 1) * PER_ROUND);
            })
        };
        let woken = tokio::time::timeout(Duration::from_secs(20), reader.next_batch()).await;
        events.extend(woken.unwrap_or_else(|_| panic!("round {round}: no wake-up")).unwrap());
        writer.join().unwrap();
    }
    inst.set_tracing_on(false).unwrap();
    events.extend(reader.flush().unwrap());
    let seqs: Vec<u32> = events.iter().map(|e| parse_raw_record(&e.record).0).collect();
    let stats = reader.stats();
    assert_eq!(stats.lost(), 0, "{stats:?}");
    assert_eq!(seqs, (0..ROUNDS * PER_ROUND).collect::<Vec<_>>());
}

#[tokio::test]
async fn every_watermark_crossing_wakes_the_reader_mmap() {
    every_watermark_crossing_wakes_the_reader(ReadMode::Mmap, "wake-mmap").await;
}

#[tokio::test]
async fn every_watermark_crossing_wakes_the_reader_read() {
    every_watermark_crossing_wakes_the_reader(ReadMode::Read, "wake-read").await;
}

/// A thread doing what every tracer does at its start — removing stale instances — in a loop,
/// until stopped.
struct Cleaner {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Cleaner {
    fn start(tracefs: &tracer::kernel::tracefs::Tracefs) -> Cleaner {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tracefs, stopped) = (tracefs.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stopped.load(Ordering::Relaxed) {
                tracer::kernel::tracefs::remove_stale_instances(&tracefs);
                rounds += 1;
            }
            rounds
        });
        Cleaner { stop, thread }
    }

    /// Stops it; returns how many rounds it made.
    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Tracers starting at once: one's clean-up of stale instances runs while another makes its
/// instance, which looks stale until its liveness file is open. The cleaner thread does what
/// every tracer does at its start, in a loop; every creation must succeed.
#[test]
fn an_instance_is_never_removed_by_a_concurrent_clean_up_before_it_is_held() {
    use tracer::kernel::tracefs::{Instance, Tracefs};
    const CREATIONS: u32 = 100;
    let tracefs = Tracefs::find_or_mount().expect("tracefs");
    let cleaner = Cleaner::start(&tracefs);
    let failed: Vec<String> = (0..CREATIONS)
        .filter_map(|i| {
            let instance = Instance::create_with_suffix(&tracefs, Some(&format!("race-{i}")));
            instance.err().map(|e| format!("{e:#}"))
        })
        .collect();
    let rounds = cleaner.stop();
    assert_eq!(failed, Vec::<String>::new(), "creations that failed");
    assert!(rounds >= u64::from(CREATIONS), "the cleaner ran alongside: {rounds} rounds");
}

/// Warnings logged by this test process: a logger that keeps them, installed at the first call.
fn logged_warnings() -> &'static std::sync::Mutex<Vec<String>> {
    struct Warnings(std::sync::Mutex<Vec<String>>);
    impl log::Log for Warnings {
        fn enabled(&self, metadata: &log::Metadata) -> bool {
            metadata.level() <= log::Level::Warn
        }
        fn log(&self, record: &log::Record) {
            if self.enabled(record.metadata()) {
                self.0.lock().unwrap().push(format!("{}: {}", record.target(), record.args()));
            }
        }
        fn flush(&self) {}
    }
    static WARNINGS: Warnings = Warnings(std::sync::Mutex::new(Vec::new()));
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&WARNINGS).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Warn);
    });
    &WARNINGS.0
}

/// A tracer's instance, once released at its drop, may be removed by another tracer's clean-up
/// before its own `rmdir`: that is no failure. Each instance here has an event enabled, so its
/// drop has writes to make; the cleaner thread runs tracer's start-up clean-up in a loop. No
/// drop may warn, and every instance must be gone. (With the drop's writes made after the
/// release and a gone directory taken for a failure, 21 of 100 drops warned.)
#[test]
fn dropping_an_instance_during_a_concurrent_clean_up_warns_of_nothing() {
    use tracer::kernel::tracefs::{Instance, Tracefs};
    const DROPS: u32 = 100;
    let warnings = logged_warnings();
    let tracefs = Tracefs::find_or_mount().expect("tracefs");
    let cleaner = Cleaner::start(&tracefs);
    let event = "sched:sched_switch".parse().unwrap();
    let dirs: Vec<std::path::PathBuf> = (0..DROPS)
        .map(|i| {
            let instance = Instance::create_with_suffix(&tracefs, Some(&format!("drop-{i}")))
                .expect("create instance");
            instance.enable(&event).expect("enable sched:sched_switch");
            instance.dir().to_path_buf()
        })
        .collect();
    let rounds = cleaner.stop();
    let ours: Vec<String> =
        warnings.lock().unwrap().iter().filter(|w| w.contains("-drop-")).cloned().collect();
    assert_eq!(ours, Vec::<String>::new(), "warnings about the dropped instances");
    let left: Vec<_> = dirs.iter().filter(|d| d.exists()).collect();
    assert_eq!(left, Vec::<&std::path::PathBuf>::new(), "instances left behind");
    assert!(rounds >= u64::from(DROPS), "the cleaner ran alongside: {rounds} rounds");
}

/// The clean-up removes an instance nobody holds and keeps one that is held. Here the stale
/// one is made by hand (tests/lifecycle.rs has a SIGKILLed tracer leave one, removed by the next
/// tracer's start); a concurrent tracer's clean-up may remove it first, to the same effect.
#[test]
fn the_clean_up_removes_an_unheld_instance_and_keeps_a_held_one() {
    use tracer::kernel::tracefs::{Instance, Tracefs, remove_stale_instances};
    let tracefs = Tracefs::find_or_mount().expect("tracefs");
    let held = Instance::create_with_suffix(&tracefs, Some("held")).expect("create instance");
    let stale = tracefs.path("instances").join(format!("tracer-{}-stale", std::process::id()));
    std::fs::create_dir(&stale).expect("an instance nobody holds");
    remove_stale_instances(&tracefs);
    assert!(!stale.exists(), "the unheld instance is removed");
    assert!(held.dir().exists(), "the held instance stays");
    assert_eq!(held.read("tracing_on").unwrap(), "0\n");
}

/// An idle reader wakes once per poll interval, it does not spin: with a non-zero
/// `buffer_percent` the non-waiting poll before each wait must not find drained buffers
/// readable, and with 0 (where no such poll is made) epoll must not keep reporting them.
#[tokio::test]
async fn an_idle_reader_waits_for_its_poll_interval() {
    const INTERVAL: Duration = Duration::from_millis(100);
    const IDLE: Duration = Duration::from_millis(500);
    for (mode, percent) in [(ReadMode::Mmap, 0), (ReadMode::Read, 0), (ReadMode::Mmap, 25)] {
        let inst = instance(&format!("idle-{}-{percent}", mode.name()), 1024);
        inst.set_buffer_percent(percent).unwrap();
        let config = ReaderConfig {
            mode,
            poll_interval: INTERVAL,
            reorder_window: Duration::ZERO,
            ..ReaderConfig::default()
        };
        let mut reader =
            FtraceReader::open(inst.clone(), marker_tracepoints(&inst), config).unwrap();
        inst.set_tracing_on(true).unwrap();
        let inst_ = inst.clone();
        std::thread::spawn(move || {
            pin_to_cpu(0);
            write_raw(&inst_, 0..3);
        })
        .join()
        .unwrap();
        let start = std::time::Instant::now();
        let (mut waits, mut events) = (0u32, 0);
        while start.elapsed() < IDLE {
            events += reader.next_batch().await.unwrap().len();
            waits += 1;
        }
        assert_eq!(events, 3, "{} percent {percent}", mode.name());
        // 5 intervals, and the drain of the three records; a late timer only makes fewer.
        assert!(waits <= 7, "{} percent {percent}: {waits} waits in {IDLE:?}", mode.name());
    }
}
