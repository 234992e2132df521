//! One run of the ftrace consumer benchmark (driven by `cargo xtask bench ftrace`).
//!
//! `ftrace_bench <mmap|read|trace-cmd> <seconds> <rate per s, 0 = as fast as possible>
//! [record bytes, default 16] [sub-buffer KiB, default: the page]`:
//! a producer thread pinned to CPU 0 writes `trace_marker_raw` records (id, sequence number,
//! zero padding) into a private instance (4 MiB per CPU, buffer_percent 50, mono clock) while
//! the consumer runs on CPU 1.
//! tracer's consumer takes records through the zero-copy `FtraceReader::next_records` and checks
//! each one's id and sequence number. Prints one JSON object: written, consumed, lost, wall
//! seconds, consumer CPU seconds.
use std::fs::File;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tests::ftrace::{instance, pin_to_cpu};
use tracer::kernel::ftrace_reader::{FtraceReader, ReadMode, ReaderConfig, RecordRef};
use tracer::kernel::tracefs::Instance;

const BUFFER_KB: u64 = 4096;
const BUFFER_PERCENT: u32 = 50;
const RECORD_ID: u32 = 0x6265_6e63;

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn children_cpu_seconds() -> f64 {
    // SAFETY: a zeroed rusage out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Writes records for `seconds` at `rate` per second (0: flat out); returns how many.
fn produce(
    inst: Arc<Instance>,
    seconds: f64,
    rate: u64,
    record_len: usize,
    started: Arc<AtomicBool>,
) -> u64 {
    pin_to_cpu(0);
    let mut f = File::options().write(true).open(inst.path("trace_marker_raw")).unwrap();
    let mut record = vec![0u8; record_len];
    record[..4].copy_from_slice(&RECORD_ID.to_le_bytes());
    started.store(true, Ordering::Release);
    let start = Instant::now();
    let mut written = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..256 {
            record[4..12].copy_from_slice(&written.to_le_bytes());
            f.write_all(&record).unwrap();
            written += 1;
        }
        if rate > 0 {
            let due = Duration::from_secs_f64(written as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    written
}

/// trace-cmd 3.1.6 reads `set_ftrace_pid` and `set_ftrace_notrace_pid` and crashes (strcmp of
/// NULL) when they cannot be read — as on hosts where function tracing is locked down (reading
/// them gives EPERM). In a private mount namespace of trace-cmd's own, the unreadable ones are
/// covered with a file saying "no pid", what the kernel prints when no pid is set. Event
/// recording, which is what is measured, does not use them.
/// Returns the file to remove once trace-cmd has exited.
fn hide_unreadable_ftrace_pid_files(command: &mut Command, inst: &Instance) -> PathBuf {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt as _;
    let no_pid = std::env::temp_dir().join(format!("ftrace-bench-no-pid-{}", std::process::id()));
    std::fs::write(&no_pid, "no pid\n").unwrap();
    let unreadable: Vec<CString> = ["set_ftrace_pid", "set_ftrace_notrace_pid"]
        .iter()
        .flat_map(|f| [inst.tracefs().path(f), inst.path(f)])
        .filter(|p| p.exists() && std::fs::read(p).is_err())
        .map(|p| CString::new(p.as_os_str().as_bytes()).unwrap())
        .collect();
    if unreadable.is_empty() {
        return no_pid;
    }
    let source = CString::new(no_pid.as_os_str().as_bytes()).unwrap();
    let root = CString::new("/").unwrap();
    // SAFETY: only async-signal-safe calls (unshare, mount) on strings allocated before fork.
    unsafe {
        command.pre_exec(move || {
            let check = |rc: libc::c_int| {
                if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
            };
            check(libc::unshare(libc::CLONE_NEWNS))?;
            let private = libc::MS_REC | libc::MS_PRIVATE;
            check(libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                private,
                std::ptr::null(),
            ))?;
            for target in &unreadable {
                let bind = libc::MS_BIND;
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    bind,
                    std::ptr::null(),
                ))?;
            }
            Ok(())
        });
    }
    no_pid
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: ftrace_bench <mmap|read|trace-cmd> <seconds> <rate> [record bytes] \
                 [sub-buffer KiB]";
    let method = args.get(1).expect(usage).as_str();
    let seconds: f64 = args.get(2).expect(usage).parse().expect(usage);
    let rate: u64 = args.get(3).expect(usage).parse().expect(usage);
    let record_len: usize = args.get(4).map_or(16, |a| a.parse().expect(usage));
    assert!(record_len >= 12, "a record holds its id and sequence number: {usage}");
    pin_to_cpu(1);
    let inst = instance(&format!("bench-{method}"), BUFFER_KB);
    if let Some(kb) = args.get(5) {
        // A kernel that forbids the size (some do, by policy) makes this row a "refused" one.
        if let Err(e) = inst.set_subbuf_size_kb(kb.parse().expect(usage)) {
            println!("{}", serde_json::json!({ "refused": format!("{e:#}") }));
            return;
        }
    }
    inst.set_buffer_percent(BUFFER_PERCENT).unwrap();
    let started = Arc::new(AtomicBool::new(false));

    let (written, consumed, lost, wall, cpu) = match method {
        "mmap" | "read" => {
            let mode = if method == "mmap" { ReadMode::Mmap } else { ReadMode::Read };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let tps = vec![inst.tracepoint("ftrace", "raw_data").unwrap()];
                let config = ReaderConfig { mode, ..ReaderConfig::default() };
                let mut reader = FtraceReader::open(inst.clone(), tps, config).unwrap();
                inst.set_tracing_on(true).unwrap();
                let cpu0 = thread_cpu_seconds();
                let t0 = Instant::now();
                let producer = {
                    let (inst, started) = (inst.clone(), started.clone());
                    std::thread::spawn(move || produce(inst, seconds, rate, record_len, started))
                };
                // The consumer's work per record: check it is one of ours, in sequence.
                let mut consumed = 0u64;
                let mut out_of_sequence = 0u64;
                let mut next_seq = 0u64;
                let mut consume = |r: RecordRef<'_>| {
                    if r.record.get(8..12) != Some(&RECORD_ID.to_le_bytes()[..]) {
                        return;
                    }
                    let seq =
                        r.record.get(12..20).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
                    if seq != Some(next_seq) {
                        out_of_sequence += 1;
                    }
                    next_seq = seq.unwrap_or(next_seq) + 1;
                    consumed += 1;
                };
                while !producer.is_finished() {
                    reader.next_records(&mut consume).await.unwrap();
                }
                let written = producer.join().unwrap();
                // One more pass after the last write (a quiet buffer is drained on the poll timer).
                reader.next_records(&mut consume).await.unwrap();
                // Skipped sequence numbers are the lost records; anything else would be a bug.
                eprintln!("records out of sequence (after a loss): {out_of_sequence}");
                let wall = t0.elapsed().as_secs_f64();
                let cpu = thread_cpu_seconds() - cpu0;
                let stats = reader.stats();
                eprintln!("{stats:?}");
                (written, consumed, stats.lost(), wall, cpu)
            })
        }
        "trace-cmd" => {
            let out = std::env::temp_dir().join(format!("ftrace-bench-{}.dat", std::process::id()));
            // -d: do not touch the function tracer (/proc/sys/kernel/ftrace_enabled).
            let mut command = Command::new("trace-cmd");
            command
                .args(["record", "-d", "-B", inst.name(), "-b", &BUFFER_KB.to_string()])
                .args(["-e", "sched:sched_process_free", "-o"])
                .arg(&out)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                // Its own process group, so its per-CPU recorder children can be ended with it.
                .process_group(0);
            let no_pid = hide_unreadable_ftrace_pid_files(&mut command, &inst);
            let mut child = command.spawn().expect("trace-cmd (installed by `cargo xtask setup`)");
            let group = child.id() as i32;
            // trace-cmd turns tracing on once its recorders run.
            let t = Instant::now();
            while inst.read("tracing_on").unwrap().trim() != "1" {
                let exited = child.try_wait().unwrap();
                if exited.is_some() || t.elapsed() > Duration::from_secs(10) {
                    // SAFETY: ending the process group we created, by its id.
                    unsafe { libc::kill(-group, libc::SIGKILL) };
                    let _ = child.wait();
                    let why = match exited {
                        Some(status) => {
                            format!("trace-cmd record exited before recording: {status}")
                        }
                        None => "trace-cmd record did not start recording within 10 s".into(),
                    };
                    println!("{{\"method\":\"trace-cmd\",\"rate\":{rate},\"error\":\"{why}\"}}");
                    // Its recorders held the buffers open; let them go before removing the
                    // instance.
                    std::thread::sleep(Duration::from_millis(500));
                    drop(inst);
                    std::process::exit(2);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let t0 = Instant::now();
            let written = produce(inst.clone(), seconds, rate, record_len, started.clone());
            // SAFETY: signalling the process group of our own child, by its id.
            unsafe { libc::kill(-group, libc::SIGINT) };
            child.wait().unwrap();
            let wall = t0.elapsed().as_secs_f64();
            let cpu = children_cpu_seconds();
            let report =
                Command::new("trace-cmd").arg("report").arg("-i").arg(&out).output().unwrap();
            let needle = format!("{RECORD_ID:x}");
            let consumed = String::from_utf8_lossy(&report.stdout)
                .lines()
                .filter(|l| l.contains(&needle))
                .count() as u64;
            let _ = std::fs::remove_file(&out);
            let _ = std::fs::remove_file(&no_pid);
            (written, consumed, written - consumed.min(written), wall, cpu)
        }
        other => panic!("unknown method {other}; {usage}"),
    };
    let line = format!(
        "{{\"method\":\"{method}\",\"rate\":{rate},\"written\":{written},\"consumed\":{consumed},\
         \"lost\":{lost},\"wall_s\":{wall:.3},\"consumer_cpu_s\":{cpu:.4}}}\n"
    );
    std::io::stdout().write_all(line.as_bytes()).unwrap();
}
