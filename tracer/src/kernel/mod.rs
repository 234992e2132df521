//! Thin I/O layers over kernel interfaces (BPF, tracefs, procfs). Decoding lives in the
//! `tracer-decode` crate.
pub mod bpf_probe;
pub mod bpf_programs;
pub mod btf;
pub mod detect;
pub mod ftrace_reader;
pub mod privileges;
pub mod procfs;
pub mod sampler;
pub mod threads;
pub mod tracefs;
pub mod user_events;

/// Allocations of this size and larger get their own mapping, unmapped when freed. Fixed,
/// because glibc's default threshold rises after a large allocation is freed (up to 32 MiB),
/// and then the transient buffers of start-up and of each served profile (kernel BTF, kernel
/// symbols: megabytes each) stay resident in the malloc arena that held them for the rest of
/// the run; tracer runs for weeks next to the workloads. Above what tracer allocates over and
/// over (a batch of lines, an OTLP request, a scrape), so those do not pay a mapping each.
pub const MALLOC_MMAP_THRESHOLD_BYTES: i32 = 1 << 20;
/// Free memory at the top of a malloc arena beyond this is handed back to the kernel.
pub const MALLOC_TRIM_THRESHOLD_BYTES: i32 = 4 << 20;
/// Malloc arenas: one for every thread. glibc gives threads arenas of their own, and each keeps
/// the free memory of its own peaks (the OTLP exporter's requests, a scrape's exposition, a
/// burst's batches of lines, on whichever worker ran them): with the node agent's 50 runtimes
/// and OTLP export that was 5–8 MiB more resident, and it moved with how the work fell on the
/// threads. tracer's threads allocate a few thousand times a second: one arena's lock costs
/// nothing measurable (each thread's small-allocation cache stays its own).
pub const MALLOC_ARENAS: i32 = 1;

/// Makes the heap hand back what tracer frees ([`MALLOC_MMAP_THRESHOLD_BYTES`],
/// [`MALLOC_TRIM_THRESHOLD_BYTES`], [`MALLOC_ARENAS`]); called first thing in `main`.
pub fn return_freed_memory() {
    // SAFETY: mallopt sets allocator parameters; it touches no allocation.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES);
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Hands the heap's free pages back to the kernel (every malloc arena's, the worker threads'
/// too): after work that allocates much and briefly — loading BPF objects, whose loader parses
/// the kernel's BTF; naming a profile's kernel frames — the resident size returns to what it
/// was, instead of keeping the peak for reuse.
pub fn release_free_heap() {
    // SAFETY: malloc_trim only returns free heap pages to the kernel; no allocation is touched.
    unsafe { libc::malloc_trim(0) };
}

/// Raises the soft limit of open files to the hard limit: every session holds sockets and a
/// pidfd, every connection to the metrics endpoint a socket: running out would leave real
/// runtimes untraced and probes unanswered.
pub fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                log::warn!("cannot raise the open-file limit: {}", std::io::Error::last_os_error());
            }
        }
    }
}

/// How often a forced exit points instance files away and removes the instances before it
/// gives up (and says which instance is left).
const FORCED_EXIT_REMOVE_ATTEMPTS: u32 = 5;

/// Points every descriptor of an instance file of this process at `/dev/null` and replaces every
/// ring-buffer mapping by anonymous memory: the kernel then lets the instances go.
fn release_instance_files() {
    let instances = tracefs::live_instance_dirs();
    if let Ok(null) = std::fs::File::open("/dev/null") {
        use std::os::fd::AsRawFd as _;
        for entry in std::fs::read_dir("/proc/self/fd").into_iter().flatten().flatten() {
            let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(target) = std::fs::read_link(entry.path()) else { continue };
            if instances.iter().any(|dir| target.starts_with(dir)) {
                // SAFETY: dup3 onto an fd this process owns; it stays open (now /dev/null).
                unsafe { libc::dup3(null.as_raw_fd(), fd, libc::O_CLOEXEC) };
            }
        }
    }
    ftrace_reader::release_all_mappings();
}

/// Ends the process at once (a second Ctrl-C) yet leaves no ftrace instance behind. The kernel
/// refuses to remove an instance while a file of it is open or mapped, and other threads are
/// still running: so this process's instances are switched off (while their liveness files are
/// still held, see [`tracefs::Instance`]), every descriptor of an instance file is pointed at
/// `/dev/null` (it stays a valid descriptor for whoever owns it) and every ring-buffer mapping is
/// replaced by anonymous memory; then the instances are removed and it exits with `status`.
pub fn exit_now(status: i32) -> ! {
    tracefs::stop_live_instances();
    // Other threads go on while this one works: one may open an instance file (its statistics)
    // after the descriptors were pointed away; then the removal is refused (EBUSY) and tried again.
    for attempt in 1..=FORCED_EXIT_REMOVE_ATTEMPTS {
        release_instance_files();
        if tracefs::remove_live_instances(attempt == FORCED_EXIT_REMOVE_ATTEMPTS) == 0 {
            break;
        }
    }
    // SAFETY: _exit has no preconditions; it skips destructors on purpose (they would wait).
    unsafe { libc::_exit(status) }
}
