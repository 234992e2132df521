//! The pure page and record decoders on sub-buffers captured from this kernel (Linux 6.18,
//! x86_64) with `read()` of `per_cpu/cpu1/trace_pipe_raw`, checked against the kernel's own text
//! rendering of the same buffer (`per_cpu/cpu1/trace`, captured just before).
use std::collections::HashMap;

use tracer_decode::ftrace::format::EventFormat;
use tracer_decode::ftrace::page::{Missed, PageLayout, decode_page};
use tracer_decode::ftrace::record::{common_fields, decode_fields};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/ftrace");

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DIR}/{name}")).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

fn text(name: &str) -> String {
    String::from_utf8(fixture(name)).unwrap()
}

fn layout() -> PageLayout {
    PageLayout::check_header_event(&text("header_event")).unwrap();
    PageLayout::parse_header_page(&text("header_page")).unwrap()
}

fn formats() -> HashMap<u16, EventFormat> {
    ["sched_process_exec", "sched_process_fork", "print", "raw_data"]
        .iter()
        .map(|n| EventFormat::parse(&text(&format!("{n}.format"))).unwrap())
        .map(|f| (f.id, f))
        .collect()
}

/// The kernel's rendering of each event type in this capture.
fn render(format: &EventFormat, record: &[u8]) -> String {
    let v = tests::ftrace::fields_json(&decode_fields(format, record).unwrap());
    let s = |k: &str| v[k].as_str().unwrap().to_string();
    match format.name.as_str() {
        "sched_process_exec" => format!(
            "sched_process_exec: filename={} pid={} old_pid={}",
            s("filename"),
            v["pid"],
            v["old_pid"]
        ),
        "sched_process_fork" => format!(
            "sched_process_fork: comm={} pid={} child_comm={} child_pid={}",
            s("parent_comm"),
            v["parent_pid"],
            s("child_comm"),
            v["child_pid"]
        ),
        "print" => format!("tracing_mark_write: {}", s("buf").trim_end_matches('\n')),
        "raw_data" => {
            let hex = s("buf");
            let bytes: Vec<&str> = (0..hex.len()).step_by(2).map(|i| &hex[i..i + 2]).collect();
            format!("# {:x} buf: {}", v["id"].as_u64().unwrap(), bytes.join(" "))
        }
        other => panic!("no rendering for {other}"),
    }
}

#[test]
fn captured_pages_decode_like_the_kernel_renders_them() {
    let pages = fixture("cpu1.pages.bin");
    let formats = formats();
    let layout = layout();
    let mut got = Vec::new();
    let mut last_ts = 0;
    for page in pages.chunks(layout.subbuf_size()) {
        let p = decode_page(page, &layout).unwrap();
        assert_eq!(p.header.missed, Missed::None);
        for e in p.events {
            assert!(e.ts >= last_ts);
            last_ts = e.ts;
            let common = common_fields(e.data).unwrap();
            let format = &formats[&common.common_type];
            got.push(format!(
                "[{:03}] {}.{:06}: {}",
                1,
                (e.ts + 500) / 1000 / 1_000_000,
                (e.ts + 500) / 1000 % 1_000_000,
                render(format, e.data)
            ));
            assert!(common.pid > 0);
        }
    }
    let want: Vec<String> = text("cpu1.trace.txt")
        .lines()
        .map(|l| {
            let at = l.find('[').unwrap();
            let (cpu, rest) = l[at..].split_at(5);
            // Drop the flags column ("....." / "...1.").
            let rest = rest.trim_start();
            let rest = rest.split_once(' ').unwrap().1.trim_start();
            format!("{cpu} {rest}")
        })
        .collect();
    assert_eq!(got.len(), 89);
    assert_eq!(got, want);
}

#[test]
fn captured_overrun_pages_carry_the_missed_flag() {
    // 5000 raw records of 8 bytes into an 8 KiB buffer: the kernel kept 512 (its stats said
    // `entries: 512`, `overrun: 4488`); the first page read is flagged. It is full to the byte,
    // so the count could not be stored: RB_MISSED_EVENTS without RB_MISSED_STORED.
    let pages = fixture("cpu1.overrun.pages.bin");
    let layout = layout();
    let mut seqs = Vec::new();
    let mut missed = Vec::new();
    for page in pages.chunks(layout.subbuf_size()) {
        let p = decode_page(page, &layout).unwrap();
        missed.push(p.header.missed);
        for e in p.events {
            assert_eq!(u32::from_le_bytes(e.data[8..12].try_into().unwrap()), 7);
            seqs.push(u32::from_le_bytes(e.data[12..16].try_into().unwrap()));
        }
    }
    assert_eq!(missed, vec![Missed::Unknown, Missed::None, Missed::None]);
    assert_eq!(seqs, (4488..5000).collect::<Vec<u32>>());
}
