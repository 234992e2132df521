//! The seed inputs of the fuzz targets, committed as `fuzz/corpus/<target>/*.seed`, built from
//! known-good encodings: real captures (ftrace sub-buffers and formats of Linux 6.18, nettrace
//! streams and IPC replies of CoreCLR 8.0.4 in `tests/fixtures/`) and records laid out as the BPF
//! programs, the kernel and the runtime write them. Each seed is in its target's input format
//! (e.g. the leading chunking or split byte) and must decode without an error, so fuzzing starts
//! deep inside each decoder. `cargo run -p tests --bin fuzz_seeds` rewrites them;
//! `tests/tests/fuzz_seeds.rs` checks that the committed files are exactly these.
//!
//! `ipc_reply`'s seeds are verbatim copies of captured replies (they need no framing), so they
//! are not generated: [`check_ipc_reply_seed`] checks each decodes as the reply it was.

use std::path::{Path, PathBuf};

use tracer_common::{
    DIAG_IOCSDEL, DIAG_IOCSREG, DIAG_IOCSUNREG, ENABLER_NAME_LEN, EXEC_FILENAME_LEN, EnablerRecord,
    EnablerRecordKind, EventHeader, EventKind, IpcBindEvent, MEMFD_NAME_LEN, MemfdCreateEvent,
    MemfdKind, MmapEvent, ProcessExecEvent, ProcessExitEvent, ProcessForkEvent, SOCKADDR_BUF_LEN,
    TASK_COMM_LEN, USER_EVENT_NAME_LEN, UserEventsIoctlEvent,
};
use tracer_decode::ftrace::stats::CpuBufferStats;
use tracer_decode::procfs::{
    cgroup_v2_path, memfd_mappings, parse_ns_pid, parse_start_time, parse_status_uid,
    parse_task_stat, parse_tmpdir,
};
use tracer_decode::unix_socket::listening_diagnostic_sockets;
use tracer_decode::{
    bpf_event,
    diagnostic_ipc::{ReplyShape, decode_reply},
    ftrace::format::EventFormat,
    ftrace::page::{PageLayout, decode_page},
    ftrace::record::{common_fields, decode_fields},
    nettrace::{MetadataLimits, NettraceParser},
    user_events::{RecordLayout, parse_record},
};

/// File name extension of committed seeds (what libFuzzer adds to the corpus is ignored by git).
pub const EXTENSION: &str = "seed";
/// Targets whose seeds are generated here.
pub const GENERATED_TARGETS: [&str; 9] = [
    "bpf_event",
    "btf",
    "nettrace",
    "user_events_record",
    "ftrace_page",
    "proc_and_tracefs_text",
    "symbols",
    "kallsyms",
    "profile_sample",
];

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");
/// Sub-buffer size of the captured ftrace pages.
const PAGE_SIZE: usize = 4096;
const RUNTIME_PROVIDER: &str = "Microsoft-Windows-DotNETRuntime";
const SAMPLE_PROFILER_PROVIDER: &str = "Microsoft-DotNETCore-SampleProfiler";
/// GCStart and GCEnd of the runtime provider.
const GC_START: u32 = 1;
const GC_END: u32 = 2;
/// Field offsets of the runtime's user_events tracepoints after the 8-byte common header, as
/// Linux 6.12 lays out `u8 version; u16 event_id; __rel_loc u8[] extension; __rel_loc u8[] payload`.
const USER_EVENTS_LAYOUT: [u8; 4] = [8, 9, 11, 15];

pub struct Seed {
    pub target: &'static str,
    pub name: String,
    pub bytes: Vec<u8>,
}

/// `fuzz/corpus`, where cargo-fuzz looks for each target's corpus.
pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

/// Every generated seed, each checked to decode.
pub fn generated() -> Vec<Seed> {
    let mut seeds = Vec::new();
    seeds.extend(bpf_event_seeds());
    seeds.push(btf_seed());
    seeds.extend(nettrace_seeds());
    seeds.extend(user_events_seeds());
    seeds.extend(ftrace_page_seeds());
    seeds.extend(proc_and_tracefs_text_seeds());
    seeds.extend(symbols_seeds());
    seeds.push(kallsyms_seed());
    seeds.extend(profile_sample_seeds());
    seeds
}

/// Sample ring records as the sampling programs write them: CPU samples with their frames — in
/// user mode (user stack only), in the kernel (both stacks), one whose user stack could not be
/// taken — and off-CPU stretches naming stack ids, one with a kernel stack whose bucket was
/// taken.
fn profile_sample_seeds() -> Vec<Seed> {
    use tracer_common::sampling::{CpuSampleHeader, NO_STACK, OffCpuRecord, SampleKind};
    use tracer_decode::profile_sample::{self, ProfileSample, Stack};
    // A .NET thread in JIT'd code called from the runtime's native frames, as frame pointers
    // show it.
    let user: Vec<u64> = (0..40u64)
        .map(|i| match i {
            0..20 => 0x7f3a_8c41_0000 + i * 0x1a4,
            _ => 0x7f3b_1250_0000 + i * 0x3c8,
        })
        .collect();
    let kernel: Vec<u64> = (0..12u64).map(|i| 0xffff_ffff_8b20_0000 + i * 0x4e8).collect();
    let bytes = |frames: &[u64]| (frames.len() * 8) as i32;
    let cpu = CpuSampleHeader {
        kind: SampleKind::Cpu as u32,
        cpu: 1,
        time_ns: 3_745_768_180_449,
        tgid: 31_896,
        tid: 31_896,
        user_stack: bytes(&user),
        kernel_stack: NO_STACK,
    };
    let cpu_samples = [
        ("cpu_user_mode", cpu, user.clone(), (Stack::Taken(user.clone()), Stack::None)),
        (
            "cpu_kernel_mode",
            CpuSampleHeader { kernel_stack: bytes(&kernel), ..cpu },
            [user.as_slice(), &kernel].concat(),
            (Stack::Taken(user.clone()), Stack::Taken(kernel.clone())),
        ),
        (
            "cpu_user_unreadable",
            CpuSampleHeader { user_stack: -libc::EFAULT, kernel_stack: bytes(&kernel), ..cpu },
            kernel.clone(),
            (Stack::Failed(libc::EFAULT), Stack::Taken(kernel.clone())),
        ),
    ];
    let off_cpu = OffCpuRecord {
        kind: SampleKind::OffCpu as u32,
        cpu: 1,
        time_ns: 3_745_768_180_449,
        weight: 50_083_054,
        tgid: 31_896,
        tid: 31_900,
        user_stack_id: 77,
        kernel_stack_id: 6_310,
        stack_epoch: 2,
        _pad: 0,
    };
    let stretches = [
        ("off_cpu", off_cpu, (Stack::Taken(77), Stack::Taken(6_310))),
        (
            "off_cpu_kernel_collision",
            OffCpuRecord { kernel_stack_id: -libc::EEXIST, stack_epoch: 3, ..off_cpu },
            (Stack::Taken(77), Stack::Failed(libc::EEXIST)),
        ),
    ];
    let mut seeds = Vec::new();
    for (name, header, frames, stacks) in cpu_samples {
        let bytes = profile_sample::encode_cpu(&header, &frames);
        match profile_sample::decode(&bytes) {
            Ok(ProfileSample::Cpu(s)) => {
                assert_eq!((s.user_stack, s.kernel_stack), stacks, "{name}")
            }
            other => panic!("profile_sample {name}: {other:?}"),
        }
        seeds.push(seed("profile_sample", name, bytes));
    }
    for (name, record, stacks) in stretches {
        let bytes = profile_sample::encode_off_cpu(&record).to_vec();
        match profile_sample::decode(&bytes) {
            Ok(ProfileSample::OffCpu(s)) => {
                assert_eq!((s.user_stack, s.kernel_stack), stacks, "{name}")
            }
            other => panic!("profile_sample {name}: {other:?}"),
        }
        seeds.push(seed("profile_sample", name, bytes));
    }
    seeds
}

/// The structs tracer reads from kernel BTF, shaped as Linux 6.18 lays them out where it matters
/// (`dentry.d_name` inside an anonymous union, `const struct qstr`), with 64-bit members.
fn btf_seed() -> Seed {
    use tracer_decode::btf::encode::Builder;
    use tracer_decode::btf::{Btf, KIND_CONST, KIND_INT, KIND_STRUCT, KIND_UNION};
    let mut b = Builder::new();
    b.push("long", KIND_INT, false, 8, &[64]); // 1
    b.composite("qstr", KIND_STRUCT, 16, &[("hash_len", 1, 0), ("name", 1, 64)]); // 2
    b.push("", KIND_CONST, false, 2, &[]); // 3
    b.composite("", KIND_UNION, 16, &[("d_name", 3, 0), ("__d_name", 2, 0)]); // 4
    b.composite("dentry", KIND_STRUCT, 64, &[("d_flags", 1, 0), ("", 4, 256)]); // 5
    b.composite("path", KIND_STRUCT, 16, &[("mnt", 1, 0), ("dentry", 1, 64)]); // 6
    b.composite("file", KIND_STRUCT, 96, &[("f_count", 1, 0), ("f_path", 6, 512)]); // 7
    b.composite("fdtable", KIND_STRUCT, 40, &[("max_fds", 1, 0), ("fd", 1, 64)]); // 8
    b.composite("files_struct", KIND_STRUCT, 64, &[("count", 1, 0), ("fdt", 1, 256)]); // 9
    b.composite("task_struct", KIND_STRUCT, 4096, &[("state", 1, 0), ("files", 1, 15360)]); // 10
    let bytes = b.bytes();
    let btf = Btf::parse(&bytes).expect("the seed parses");
    assert_eq!(btf.member_offset("dentry", "d_name"), Ok(32));
    assert_eq!(btf.member_offset("task_struct", "files"), Ok(1920));
    seed("btf", "kernel_structs", bytes)
}

fn fixture(path: &str) -> Vec<u8> {
    std::fs::read(format!("{FIXTURES}/{path}")).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

fn text_fixture(path: &str) -> String {
    String::from_utf8(fixture(path)).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

fn seed(target: &'static str, name: &str, bytes: Vec<u8>) -> Seed {
    Seed { target, name: format!("{name}.{EXTENSION}"), bytes }
}

/// Checks a committed `ipc_reply` seed: named after the capture it copies, it must decode as
/// that reply.
pub fn check_ipc_reply_seed(name: &str, bytes: &[u8]) {
    let shape = match name.split('_').next() {
        Some("processinfo") => ReplyShape::ProcessInfo,
        Some("processinfo2") => ReplyShape::ProcessInfo2,
        Some("processinfo3") => ReplyShape::ProcessInfo3,
        Some("disableperfmap") => ReplyShape::Status,
        Some("collecttracing2" | "collecttracing3" | "stoptracing") => ReplyShape::SessionId,
        _ => panic!("ipc_reply seed {name} is not named after a captured reply"),
    };
    decode_reply(shape, bytes).unwrap_or_else(|e| panic!("ipc_reply seed {name}: {e}"));
}

// ---- bpf_event: ring-buffer records as tracer-common's structs lay them out ----

/// A wire struct's bytes, as the BPF program submits them to the ring buffer.
fn wire_bytes<T: Copy>(value: &T) -> Vec<u8> {
    // SAFETY: tracer-common's event structs are #[repr(C)] with explicit padding fields, so
    // every byte is initialised; they are viewed, not modified.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn c_array<const N: usize>(text: &[u8]) -> [u8; N] {
    let mut array = [0; N];
    array[..text.len()].copy_from_slice(text);
    array
}

fn header(kind: EventKind, seq: u64) -> EventHeader {
    EventHeader {
        kind: kind as u32,
        cpu: 1,
        seq,
        ktime_ns: 1_487_508_594_000,
        pid: 31_896,
        tid: 31_896,
        uid: 0,
        gid: 0,
        cgroup_id: 4_242,
        comm: c_array::<TASK_COMM_LEN>(b"dotnet"),
        process_start_ns: 1_487_400_000_000,
    }
}

fn memfd_create(name: &[u8], kind: MemfdKind) -> MemfdCreateEvent {
    MemfdCreateEvent {
        header: header(EventKind::MemfdCreate, 1),
        memfd_kind: kind as u32,
        flags: libc::MFD_CLOEXEC,
        name_len: name.len() as i32,
        _pad: 0,
        name: c_array::<MEMFD_NAME_LEN>(name),
    }
}

fn mmap(kind: EventKind, memfd_kind: MemfdKind) -> MmapEvent {
    MmapEvent {
        header: header(kind, 2),
        memfd_kind: memfd_kind as u32,
        fd: 5,
        addr_hint: 0,
        len: 4096,
        prot: libc::PROT_READ as u64,
        flags: libc::MAP_SHARED as u64,
        offset: 0,
        ret: 0x7f3a_1c00_0000,
        ret_known: 1,
        _pad: 0,
    }
}

fn user_events_ioctl(kind: EventKind, cmd: u32, name: &[u8]) -> UserEventsIoctlEvent {
    UserEventsIoctlEvent {
        header: header(kind, 3),
        fd: 7,
        arg_read: 0,
        ret: 0,
        cmd: u64::from(cmd),
        arg: 0x7ffd_5e00_1000,
        reg_size: 28,
        reg_enable_bit: 31,
        reg_enable_size: 4,
        reg_flags: 0,
        reg_enable_addr: 0x7f3a_1d00_0040,
        reg_name_args: if name.is_empty() { 0 } else { 0x7f3a_1d00_1000 },
        reg_write_index: if cmd == DIAG_IOCSREG { 3 } else { 0 },
        name_len: name.len() as i32,
        name: c_array::<USER_EVENT_NAME_LEN>(name),
    }
}

fn bpf_event_seeds() -> Vec<Seed> {
    let name_args = b"DotNETRuntime_GC u8 version; u16 event_id; __rel_loc u8[] extension; \
                      __rel_loc u8[] payload";
    let records = [
        (
            "memfd_create",
            wire_bytes(&memfd_create(b"dotnet_ipc_created", MemfdKind::DotnetIpcCreated)),
        ),
        (
            "memfd_create_doublemapper",
            wire_bytes(&memfd_create(b"doublemapper", MemfdKind::DoubleMapper)),
        ),
        (
            "dotnet_ipc_ready",
            wire_bytes(&mmap(EventKind::DotnetIpcReady, MemfdKind::DotnetIpcCreated)),
        ),
        (
            "dotnet_runtime_seen",
            wire_bytes(&mmap(EventKind::DotnetRuntimeSeen, MemfdKind::DoubleMapper)),
        ),
        (
            "user_events_register",
            wire_bytes(&user_events_ioctl(EventKind::UserEventsRegister, DIAG_IOCSREG, name_args)),
        ),
        (
            "user_events_delete",
            wire_bytes(&user_events_ioctl(
                EventKind::UserEventsDelete,
                DIAG_IOCSDEL,
                b"DotNETRuntime_GC",
            )),
        ),
        (
            "user_events_unregister",
            wire_bytes(&user_events_ioctl(EventKind::UserEventsUnregister, DIAG_IOCSUNREG, b"")),
        ),
        (
            "process_fork",
            wire_bytes(&ProcessForkEvent {
                header: header(EventKind::ProcessFork, 4),
                child_pid: 31_900,
                _pad: 0,
                clone_flags: libc::SIGCHLD as u64,
            }),
        ),
        (
            "process_exec",
            wire_bytes(&ProcessExecEvent {
                header: header(EventKind::ProcessExec, 5),
                old_tid: 31_896,
                filename_len: 15,
                filename: c_array::<EXEC_FILENAME_LEN>(b"/usr/bin/dotnet"),
            }),
        ),
        (
            "process_exit",
            wire_bytes(&ProcessExitEvent { header: header(EventKind::ProcessExit, 6) }),
        ),
        (
            "dotnet_ipc_socket",
            wire_bytes(&IpcBindEvent {
                header: header(EventKind::DotnetIpcSocket, 7),
                fd: 9,
                addrlen: 110,
                abstract_name: 0,
                path_len: NET_UNIX_SOCKET.len() as u32,
                path: c_array::<SOCKADDR_BUF_LEN>(NET_UNIX_SOCKET.as_bytes()),
            }),
        ),
    ];
    let mut seeds: Vec<Seed> = records
        .into_iter()
        .map(|(name, bytes)| {
            let event =
                bpf_event::decode(&bytes).unwrap_or_else(|e| panic!("bpf_event {name}: {e}"));
            assert!(name.starts_with(event.meta.kind.name()), "{name}");
            seed("bpf_event", name, bytes)
        })
        .collect();
    // The task iterator's output (the same target decodes it): two enablers of one process,
    // a 4-byte word at bit 31 and an 8-byte one at bit 63, then a truncation record.
    let enabler = |kind: EnablerRecordKind, values: u64, name: &[u8]| EnablerRecord {
        kind: kind as u32,
        pid: 31_896,
        enable_addr: 0x7f3a_1d00_0040,
        values,
        name_len: name.len() as i32,
        _pad: 0,
        name: c_array::<ENABLER_NAME_LEN>(name),
    };
    let output: Vec<u8> = [
        enabler(EnablerRecordKind::Enabler, 31 | 1 << 8, b"DotNETRuntime_GC"),
        enabler(EnablerRecordKind::Enabler, 63, b"tracer_test_event"),
        enabler(EnablerRecordKind::Truncated, 0, b""),
    ]
    .iter()
    .flat_map(wire_bytes)
    .collect();
    let found = bpf_event::decode_enablers(&output).expect("iterator output");
    assert_eq!((found.enablers.len(), found.truncated.len()), (2, 1));
    seeds.push(seed("bpf_event", "user_events_enablers", output));
    seeds
}

// ---- nettrace: whole captured streams, in one piece and in odd chunks ----

/// Parses a whole stream, fed in chunks of `chunks` sizes (each + 1) in turn; panics unless it
/// ends complete. Returns the payloads of the runtime events with id `event_id`.
fn nettrace_events(stream: &[u8], chunks: &[u8], event_id: u32) -> Vec<Vec<u8>> {
    let mut parser = NettraceParser::default();
    let mut payloads = Vec::new();
    let mut at = 0;
    for size in chunks.iter().cycle() {
        let n = (usize::from(*size) + 1).min(stream.len() - at);
        parser
            .feed(&stream[at..at + n], |e| {
                if e.metadata.provider == RUNTIME_PROVIDER && e.metadata.event_id == event_id {
                    payloads.push(e.payload.to_vec());
                }
            })
            .expect("a captured stream parses");
        at += n;
        if at == stream.len() {
            break;
        }
    }
    parser.finish().expect("a captured stream ends with its end-of-stream tag");
    payloads
}

fn nettrace_seeds() -> Vec<Seed> {
    // The target reads a count byte, that many chunk sizes, then the stream.
    let mut seeds = Vec::new();
    for name in
        ["coreclr8_gc_induced5", "coreclr8_threadpool", "coreclr8_verbose", "coreclr8_counters"]
    {
        let stream = fixture(&format!("nettrace/{name}.nettrace"));
        nettrace_events(&stream, &[u8::MAX], GC_START);
        seeds.push(seed("nettrace", name, [&[0u8][..], &stream].concat()));
    }
    let chunks = [0u8, 6, 63, 255];
    let stream = fixture("nettrace/coreclr8_gc_induced5.nettrace");
    assert_eq!(nettrace_events(&stream, &chunks, GC_START).len(), 5, "the five induced GCs");
    let input = [&[chunks.len() as u8][..], &chunks, &stream].concat();
    seeds.push(seed("nettrace", "coreclr8_gc_induced5_chunked", input));
    seeds.push(thread_samples_seed());
    seeds
}

/// The thread samples capture without its large EventBlocks (the target's inputs stay under
/// 64 KiB): its metadata, every StackBlock, the sequence point, and the event blocks under
/// 10 KB, which hold sample profiler events naming stacks and JIT events naming methods.
fn thread_samples_seed() -> Seed {
    const SMALL_BLOCK: usize = 10_000;
    let stream = fixture("nettrace/coreclr8_thread_samples.nettrace");
    let mut kept = stream[..TRACE_OBJECT_END].to_vec();
    for (name, content) in nettrace_blocks(&stream) {
        if name != b"EventBlock" || content.len() < SMALL_BLOCK {
            push_block(&mut kept, name, content);
        }
    }
    kept.push(NULL_REFERENCE);
    let mut parser = NettraceParser::default();
    let (mut samples, mut stacks) = (0, 0);
    parser
        .feed(&kept, |e| {
            samples += u64::from(e.metadata.provider == SAMPLE_PROFILER_PROVIDER);
            stacks += u64::from(e.stack.is_some());
        })
        .expect("the blocks kept parse");
    parser.finish().expect("ended with its end-of-stream tag");
    let stats = parser.stats();
    assert_eq!((kept.len(), stats.stack_blocks, samples, stacks), (34_138, 6, 234, 337));
    seed("nettrace", "coreclr8_thread_samples_small_blocks", [&[0u8][..], &kept].concat())
}

/// Where a NetTrace stream's first block starts: the prologue and the Trace object
/// (docs/protocol/nettrace.md §3.4).
const TRACE_OBJECT_END: usize = 102;
const NULL_REFERENCE: u8 = 0x01;

/// (type name, content) of each block of a captured stream, in order (its framing trusted:
/// docs/protocol/nettrace.md §3.2, §4.1).
fn nettrace_blocks(stream: &[u8]) -> Vec<(&[u8], &[u8])> {
    let u32_at = |at: usize| u32::from_le_bytes(stream[at..at + 4].try_into().unwrap()) as usize;
    let mut blocks = Vec::new();
    let mut at = TRACE_OBJECT_END;
    while stream[at] != NULL_REFERENCE {
        // `05 05 01`, version, minimum reader version, name length, name, `06`, block size.
        let name_len = u32_at(at + 11);
        let name = &stream[at + 15..at + 15 + name_len];
        let size_at = at + 15 + name_len + 1;
        let content_at = (size_at + 4).next_multiple_of(4);
        blocks.push((name, &stream[content_at..content_at + u32_at(size_at)]));
        at = content_at + u32_at(size_at) + 1;
    }
    blocks
}

/// Appends a block object of version 2, padded for where it lands in `stream`.
fn push_block(stream: &mut Vec<u8>, name: &[u8], content: &[u8]) {
    stream.extend([0x05, 0x05, 0x01]);
    stream.extend(2i32.to_le_bytes());
    stream.extend(2i32.to_le_bytes());
    stream.extend((name.len() as u32).to_le_bytes());
    stream.extend(name);
    stream.push(0x06);
    stream.extend((content.len() as u32).to_le_bytes());
    stream.resize(stream.len().next_multiple_of(4), 0);
    stream.extend(content);
    stream.push(0x06);
}

// ---- user_events_record: records as the runtime writes them into its tracepoints ----

fn utf16z(text: &str) -> Vec<u8> {
    text.encode_utf16().chain([0]).flat_map(u16::to_le_bytes).collect()
}

/// A record as ftrace stores it: common header (type, flags, preempt count, pid), version 1, the
/// event id, the two `__rel_loc` words, then extension and payload.
fn user_events_record(event_id: u16, extension: &[u8], payload: &[u8]) -> Vec<u8> {
    let rel_loc = |len: usize, after_field: usize| (len as u32) << 16 | after_field as u32;
    let mut record = Vec::new();
    record.extend(1_600u16.to_le_bytes());
    record.extend([0, 1]);
    record.extend(31_896i32.to_le_bytes());
    record.push(1);
    record.extend(event_id.to_le_bytes());
    // Offsets count from the end of each 4-byte field: the extension follows the payload word.
    record.extend(rel_loc(extension.len(), 4).to_le_bytes());
    record.extend(rel_loc(payload.len(), extension.len()).to_le_bytes());
    record.extend(extension);
    record.extend(payload);
    record
}

/// The metadata label of an EventSource event (provider name, then the NetTrace V5 metadata
/// body: id, name, keywords, version, level, fields), then an activity id label.
fn event_source_extension(event_id: u32) -> Vec<u8> {
    let mut body = utf16z("System.Buffers.ArrayPoolEventSource");
    body.extend(event_id.to_le_bytes());
    body.extend(utf16z("BufferRented"));
    body.extend(0u64.to_le_bytes());
    body.extend(0u32.to_le_bytes());
    body.extend(4u32.to_le_bytes());
    // Four Int32 fields (TypeCode 9).
    body.extend(4u32.to_le_bytes());
    for field in ["bufferId", "bufferSize", "poolId", "bucketId"] {
        body.extend(9u32.to_le_bytes());
        body.extend(utf16z(field));
    }
    let mut extension = vec![0x01];
    extension.extend((body.len() as u32).to_le_bytes());
    extension.extend(body);
    extension.push(0x02);
    extension.extend([0x5a; 16]);
    extension
}

fn user_events_seeds() -> Vec<Seed> {
    let gc = fixture("nettrace/coreclr8_gc_induced5.nettrace");
    let payload_of = |event_id| nettrace_events(&gc, &[u8::MAX], event_id).swap_remove(0);
    let rented: Vec<u8> = [7i32, 4096, 1, 8].iter().flat_map(|v| v.to_le_bytes()).collect();
    let records = [
        ("gc_start", user_events_record(GC_START as u16, &[], &payload_of(GC_START))),
        ("gc_end", user_events_record(GC_END as u16, &[], &payload_of(GC_END))),
        ("event_source_with_metadata", user_events_record(1, &event_source_extension(1), &rented)),
    ];
    let layout = RecordLayout {
        version: USER_EVENTS_LAYOUT[0].into(),
        event_id: USER_EVENTS_LAYOUT[1].into(),
        extension: USER_EVENTS_LAYOUT[2].into(),
        payload: USER_EVENTS_LAYOUT[3].into(),
    };
    records
        .into_iter()
        .map(|(name, record)| {
            let parsed =
                parse_record(&layout, &record, RUNTIME_PROVIDER, &MetadataLimits::default())
                    .unwrap_or_else(|e| panic!("user_events record {name}: {e}"));
            assert_eq!(parsed.extension_problem, None, "{name}");
            seed("user_events_record", name, [&USER_EVENTS_LAYOUT[..], &record].concat())
        })
        .collect()
}

// ---- ftrace_page: captured sub-buffers ----

fn pages(name: &str) -> Vec<Vec<u8>> {
    let data = fixture(&format!("ftrace/{name}"));
    assert_eq!(data.len() % PAGE_SIZE, 0, "{name} holds whole pages");
    data.chunks(PAGE_SIZE).map(<[u8]>::to_vec).collect()
}

fn ftrace_page_seeds() -> Vec<Seed> {
    let layout = PageLayout::for_subbuf_size(PAGE_SIZE);
    let mut seeds = Vec::new();
    for (file, prefix) in [("cpu1.pages.bin", "pages"), ("cpu1.overrun.pages.bin", "overrun")] {
        for (i, page) in pages(file).into_iter().enumerate() {
            let decoded = decode_page(&page, &layout).expect("a captured page decodes");
            assert!(!decoded.events.is_empty(), "{file} page {i} holds events");
            seeds.push(seed("ftrace_page", &format!("{prefix}-{i}"), page));
        }
    }
    seeds
}

// ---- proc_and_tracefs_text: text, then record bytes, split by the leading byte ----

/// The target's input: a byte `cut` such that the text ends after `cut × len / 256` of the
/// remaining bytes, the text, then the record (zero-padded until some `cut` splits exactly).
fn split_input(text: &str, record: &[u8]) -> Vec<u8> {
    let mut record = record.to_vec();
    loop {
        let rest = text.len() + record.len();
        if let Some(cut) = (0..=u8::MAX).find(|&c| usize::from(c) * rest / 256 == text.len()) {
            return [&[cut][..], text.as_bytes(), &record].concat();
        }
        record.push(0);
    }
}

/// Samples of the /proc files another process controls, shaped like Linux 6.18 prints them.
const PROC_MAPS: &str = "\
55d0c6a00000-55d0c6a01000 r--p 00000000 08:01 1054 /usr/bin/dotnet
7f3a1c000000-7f3a1c001000 r--s 00000000 00:01 2050 /memfd:dotnet_ipc_created (deleted)
7f3a1d000000-7f3a1d400000 rw-s 00000000 00:01 2051 /memfd:doublemapper (deleted)
7ffd5e000000-7ffd5e021000 rw-p 00000000 00:00 0 [stack]
";
const PROC_STATUS: &str = "\
Name:\tdotnet
Umask:\t0022
State:\tS (sleeping)
Tgid:\t31896
NSpid:\t31896\t7
PPid:\t31890
Uid:\t1000\t1000\t1000\t1000
Gid:\t1000\t1000\t1000\t1000
CapEff:\t0000000000000000
";
const PROC_STAT: &str = "31896 (dotnet) S 31890 31896 31890 0 -1 4194560 2515 0 0 0 12 4 0 0 20 \
                         0 9 0 148750 3051737088 6656 18446744073709551615 1 1 0 0 0 0 0 4096 \
                         17646 0 0 0 17 1 0 0 0 0 0\n";
const NET_UNIX_SOCKET: &str = "/tmp/app-tmp/dotnet-diagnostic-7-148750-socket";
const PROC_NET_UNIX: &str = "\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 51234 /tmp/app-tmp/dotnet-diagnostic-7-148750-socket
0000000000000000: 00000003 00000000 00000000 0001 03 51240 /run/systemd/journal/stdout
0000000000000000: 00000002 00000000 00010000 0001 01  7001 @dotnet-diagnostic-8-1-socket
0000000000000000: 00000003 00000000 00000000 0001 03 51241
";
const PROC_CGROUP: &str = "0::/system.slice/app.service\n";
const PROC_ENVIRON: &str = "PATH=/usr/bin:/bin\0HOME=/root\0TMPDIR=/tmp/app-tmp\0";
const CPU_STATS: &str = "entries: 12\noverrun: 3\ncommit overrun: 0\nbytes: 1024\n\
                         oldest event ts:  1487.508594\nnow ts:  1490.120000\n\
                         dropped events: 0\nread events: 9\n";

fn proc_and_tracefs_text_seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    let page_layout = PageLayout::for_subbuf_size(PAGE_SIZE);
    let first_page = pages("cpu1.pages.bin").swap_remove(0);
    let records = decode_page(&first_page, &page_layout).expect("a captured page decodes").events;
    // Each captured format with the first record of its event in the captured page.
    for name in ["sched_process_fork", "sched_process_exec", "print", "raw_data"] {
        let text = text_fixture(&format!("ftrace/{name}.format"));
        let format = EventFormat::parse(&text).expect("a captured format parses");
        let record = records
            .iter()
            .find(|e| common_fields(e.data).is_ok_and(|c| c.common_type == format.id))
            .unwrap_or_else(|| panic!("no {name} record in the captured page"))
            .data;
        decode_fields(&format, record).unwrap_or_else(|e| panic!("{name} record: {e}"));
        seeds.push(seed(
            "proc_and_tracefs_text",
            &format!("format_{name}"),
            split_input(&text, record),
        ));
    }
    let header_page = text_fixture("ftrace/header_page");
    let layout = PageLayout::parse_header_page(&header_page).expect("header_page parses");
    decode_page(&first_page, &layout).expect("the captured page decodes with its header_page");
    seeds.push(seed(
        "proc_and_tracefs_text",
        "header_page",
        split_input(&header_page, &first_page),
    ));
    let header_event = text_fixture("ftrace/header_event");
    PageLayout::check_header_event(&header_event).expect("header_event is the known one");
    seeds.push(seed("proc_and_tracefs_text", "header_event", split_input(&header_event, &[])));

    assert_eq!(memfd_mappings(31_896, PROC_MAPS).len(), 2);
    assert_eq!(parse_status_uid(PROC_STATUS), Some(1000));
    assert_eq!(listening_diagnostic_sockets(PROC_NET_UNIX.as_bytes()).len(), 2);
    assert_eq!(parse_ns_pid(PROC_STATUS), Some(7));
    assert_eq!(cgroup_v2_path(PROC_CGROUP), Some("/system.slice/app.service"));
    assert_eq!(CpuBufferStats::parse(CPU_STATS).overrun, 3);
    assert_eq!(parse_start_time(PROC_STAT), Some(148_750));
    assert_eq!(parse_task_stat(PROC_STAT).map(|s| (s.utime_ticks, s.rss_pages)), Some((12, 6656)));
    assert_eq!(parse_tmpdir(PROC_ENVIRON.as_bytes()), Path::new("/tmp/app-tmp"));
    for (name, text) in [
        ("proc_maps", PROC_MAPS),
        ("proc_status", PROC_STATUS),
        ("proc_stat", PROC_STAT),
        ("proc_cgroup", PROC_CGROUP),
        ("proc_net_unix", PROC_NET_UNIX),
        ("proc_environ", PROC_ENVIRON),
        ("cpu_stats", CPU_STATS),
    ] {
        seeds.push(seed("proc_and_tracefs_text", name, split_input(text, &[])));
    }
    seeds
}

// ---- symbols, kallsyms: ELF files as linkers lay them out, kallsyms as Linux 6.18 prints it ----

/// A shared object as GNU ld or lld lays one out: headers, text (whose virtual addresses run
/// ahead of its file offsets under lld), data.
fn elf_library() -> tracer_decode::symbols::encode::ElfBuilder {
    use tracer_decode::symbols::LoadSegment;
    use tracer_decode::symbols::encode::{ElfBuilder, Symbol};
    let segment =
        |file_offset, vaddr, file_size, flags| LoadSegment { file_offset, vaddr, file_size, flags };
    ElfBuilder {
        symtab: vec![
            Symbol { bind: 0, ..Symbol::function("static_helper", 0x2100, 0x40) },
            Symbol::function("coreclr_initialize", 0x2200, 0x2b8),
            Symbol::function("_ZN6Thread23RareDisablePreemptiveGCEv", 0x2500, 0x60),
            Symbol::function("_ZN4core3ptr13drop_in_place17h0123456789abcdefE", 0x2600, 0x10),
        ],
        dynsym: vec![Symbol::function("coreclr_initialize", 0x2200, 0x2b8)],
        build_id: Some((0..20).collect()),
        debuglink: Some((b"libdemo.so.dbg".to_vec(), 0x0c5e_2101)),
        segments: vec![
            segment(0, 0, 0x1000, 4),
            segment(0x1000, 0x2000, 0x1000, 5),
            segment(0x2000, 0x4000, 0x100, 6),
        ],
        ..ElfBuilder::default()
    }
}

fn symbols_seeds() -> Vec<Seed> {
    use tracer_decode::symbols::{ElfImage, demangle};
    let library = elf_library();
    let stripped =
        tracer_decode::symbols::encode::ElfBuilder { symtab: Vec::new(), ..elf_library() };
    let mut seeds = Vec::new();
    for (name, elf, symbols) in [("library", library, 4), ("stripped", stripped, 1)] {
        let bytes = elf.bytes();
        let image = ElfImage::parse(&bytes).expect("the seed parses");
        assert_eq!(image.symbols.len(), symbols);
        let found = image.file_offset_to_vaddr(0x1205).and_then(|v| image.symbols.lookup(v));
        assert_eq!(
            found.map(|s| (demangle(&s.name).into_owned(), s.offset)),
            Some(("coreclr_initialize".to_owned(), 5))
        );
        seeds.push(seed("symbols", name, bytes));
    }
    seeds
}

const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81001000 T __x64_sys_getpid
ffffffff81001040 t do_getpid_helper
ffffffff810010c0 D some_data
ffffffff82000000 T _etext
0000000000000000 A fixed_percpu_data
ffffffffc0a01000 t ext4_fill_super\t[ext4]
ffffffffc0a03000 d ext4_fs_type\t[ext4]
ffffffffc0b00000 t bpf_prog_6deef7357e7b4530_detect\t[bpf]
";

fn kallsyms_seed() -> Seed {
    use tracer_decode::symbols::KernelSymbolTable;
    let table = KernelSymbolTable::parse(KALLSYMS.as_bytes()).expect("the seed parses");
    assert_eq!(
        table.lookup(0xffff_ffff_8100_1004).map(|s| (s.name, s.offset)),
        Some(("__x64_sys_getpid", 4))
    );
    seed("kallsyms", "kallsyms", KALLSYMS.as_bytes().to_vec())
}
