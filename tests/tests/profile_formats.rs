//! The profile files tracer writes, read by the real consumers: `go tool pprof` (Debian
//! golang-go) reads the pprof file; speedscope's published schema (checked with ajv) and
//! speedscope's own importer (its npm package's bundle, run under Node) read the speedscope
//! file; inferno's folded-stack reader reads the folded file; an XML parser reads the SVG. Each
//! must report exactly the stacks, weights, names and labels of the profile built here, whose
//! names include hostile ones (markup, quotes, control characters, separators, a number where a
//! reader expects a count, a name over the length limit).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use quick_xml::events::Event;
use serde_json::{Value, json};
use tests::scratch::ScratchDir;
use tests::tools::npm_modules;
use tracer::profile::format::Format;
use tracer::profile::model::{MAX_NAME_BYTES, NAME_CUT_MARKER};
use tracer::profile::{Frame, FrameKind, Mode, ProcessInfo, Profile};

const SPEEDSCOPE_IMPORT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/node/speedscope_import.mjs");

/// 2025-12-01T12:00:00Z.
const START_NS: u64 = 1_764_590_400_000_000_000;
const SHOP: &str = "dotnet /app/Shop.dll";
const CONTAINER_ID: &str = "abababababababababababababababababababababababababababababababab";
const POD_UID: &str = "0d6e2f2c-1b5a-4c2e-9f1e-2a3b4c5d6e7f";
const HOSTILE_PROCESS: &str = "<script>alert(\"x&y\")</script>\u{1b}[31m";
const HOSTILE_METHOD: &str = "<script>&\"'\u{7}; evil\nname";
const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
const CORECLR: &str = "/usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.4/libcoreclr.so";
const KERNEL: &str = "[kernel.kallsyms]";

/// A managed name far over [`MAX_NAME_BYTES`].
fn long_method() -> String {
    format!("Ns.{}.Run()", "Very".repeat(1500))
}

/// [`long_method`] as every file must show it: cut to the limit, with the marker.
fn long_method_cut() -> String {
    let kept = MAX_NAME_BYTES - NAME_CUT_MARKER.len();
    format!("{}{NAME_CUT_MARKER}", &long_method()[..kept])
}

/// Two processes; `weight` is the sample count on-CPU (100 Hz: 10 ms a sample).
///
/// | process | thread | stack, leaf first | weight |
/// |---|---|---|---|
/// | Shop (4242) | 10 | do_syscall_64 [k], write, Shop.Cart.Add [m] | 3 |
/// | Shop | 11 | the same | 2 |
/// | Shop | 10 | libcoreclr.so+0x1a2b3c, Shop.Cart.Add [m] | 1 |
/// | hostile (777) | 778 | [kernel.kallsyms]+0xffffffff81000000 [k], HOSTILE_METHOD [m], long [m] | 4 |
/// | hostile | 778 | `poll 12`, long [m] | 3 |
fn cpu_profile() -> Profile {
    let mut profile = Profile::new(Mode::Cpu { frequency_hz: 100.try_into().unwrap() }, START_NS);
    profile.set_duration_ns(2_000_000_000);
    let shop = profile.add_process(ProcessInfo {
        pid: 4242,
        process_start_ns: 123_450_000_000,
        name: SHOP.into(),
        container_id: Some(CONTAINER_ID.into()),
        pod_uid: Some(POD_UID.into()),
    });
    let hostile = profile.add_process(ProcessInfo {
        pid: 777,
        process_start_ns: 5,
        name: HOSTILE_PROCESS.into(),
        container_id: None,
        pod_uid: None,
    });
    let syscall =
        profile.intern_frame(Frame::named(FrameKind::Kernel, "do_syscall_64", Some(KERNEL)));
    let write = profile.intern_frame(Frame::named(FrameKind::Native, "write", Some(LIBC)));
    let add = profile.intern_frame(Frame::named(
        FrameKind::Managed,
        "Shop.Cart.Add(int32)",
        Some("Shop.dll"),
    ));
    let coreclr = profile.intern_frame(Frame::unnamed(FrameKind::Native, Some(CORECLR), 0x1a2b3c));
    let kernel = profile.intern_frame(Frame::unnamed(
        FrameKind::Kernel,
        Some(KERNEL),
        0xffff_ffff_8100_0000,
    ));
    let evil =
        profile.intern_frame(Frame::named(FrameKind::Managed, HOSTILE_METHOD, Some("Evil.dll")));
    let long =
        profile.intern_frame(Frame::named(FrameKind::Managed, &long_method(), Some("Evil.dll")));
    let poll = profile.intern_frame(Frame::named(FrameKind::Native, "poll 12", Some(LIBC)));
    assert!(profile.add_sample(shop, 10, &[syscall, write, add], 3));
    assert!(profile.add_sample(shop, 11, &[syscall, write, add], 2));
    assert!(profile.add_sample(shop, 10, &[coreclr, add], 1));
    assert!(profile.add_sample(hostile, 778, &[kernel, evil, long], 4));
    assert!(profile.add_sample(hostile, 778, &[poll, long], 3));
    profile
}

fn write_file(profile: &Profile, format: Format, dir: &Path) -> PathBuf {
    let path = dir.join(format!("profile{}", format.file_suffix()));
    let file = std::fs::File::create(&path).unwrap();
    format.write(profile, std::io::BufWriter::new(file)).unwrap();
    path
}

/// Runs a consumer; its stdout. `what_to_do` is said when it cannot be started.
#[track_caller]
fn consume(command: &mut Command, what_to_do: &str) -> String {
    let output =
        command.output().unwrap_or_else(|e| panic!("running {command:?}: {e}; {what_to_do}"));
    assert!(
        output.status.success(),
        "{command:?}: {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `go tool pprof -raw FILE`: the profile as pprof parsed it (times in UTC).
#[track_caller]
fn pprof_raw(file: &Path) -> String {
    consume(
        Command::new("go").args(["tool", "pprof", "-raw"]).arg(file).env("TZ", "UTC"),
        "run `cargo xtask setup` (it installs Debian's golang-go)",
    )
}

#[test]
fn go_tool_pprof_reads_the_stacks_weights_names_and_labels() {
    let dir = ScratchDir::new("profile-pprof");
    let raw = pprof_raw(&write_file(&cpu_profile(), Format::Pprof, dir.path()));
    let shop_labels = format!(
        "                container_id:[{CONTAINER_ID}] pod_uid:[{POD_UID}] process:[{SHOP}]\n"
    );
    // pprof has no escaping: the control characters are U+FFFD in the file.
    let hostile_labels = "                process:[<script>alert(\"x&y\")</script>\u{fffd}[31m]\n";
    let expected = [
        "PeriodType: cpu nanoseconds\n",
        "Period: 10000000\n",
        "Time: 2025-12-01 12:00:00 +0000 UTC\n",
        "Duration: 2s\n",
        "Samples:\n",
        "samples/count cpu/nanoseconds\n",
        "          3   30000000: 1 2 3 \n",
        &shop_labels,
        "                pid:[4242] process_start_ns:[123450000000] thread:[10]\n",
        "          2   20000000: 1 2 3 \n",
        &shop_labels,
        "                pid:[4242] process_start_ns:[123450000000] thread:[11]\n",
        "          1   10000000: 4 3 \n",
        &shop_labels,
        "                pid:[4242] process_start_ns:[123450000000] thread:[10]\n",
        "          4   40000000: 5 6 7 \n",
        hostile_labels,
        "                pid:[777] process_start_ns:[5] thread:[778]\n",
        "          3   30000000: 8 7 \n",
        hostile_labels,
        "                pid:[777] process_start_ns:[5] thread:[778]\n",
        "Locations\n",
        // Managed and unnamed frames have no system name (`s=0()`): pprof would otherwise
        // "simplify" managed names as if they were C++.
        "     1: 0x0 M=1 do_syscall_64 [kernel.kallsyms]:0 s=0\n",
        &format!("     2: 0x0 M=2 write {LIBC}:0 s=0\n"),
        "     3: 0x0 M=3 Shop.Cart.Add(int32) Shop.dll:0 s=0()\n",
        &format!("     4: 0x1a2b3c M=4 libcoreclr.so+0x1a2b3c {CORECLR}:0 s=0()\n"),
        "     5: 0xffffffff81000000 M=1 [kernel.kallsyms]+0xffffffff81000000 [kernel.kallsyms]:0 s=0()\n",
        "     6: 0x0 M=5 <script>&\"'\u{fffd}; evil\u{fffd}name Evil.dll:0 s=0()\n",
        &format!("     7: 0x0 M=5 {} Evil.dll:0 s=0()\n", long_method_cut()),
        &format!("     8: 0x0 M=2 poll 12 {LIBC}:0 s=0\n"),
        "Mappings\n",
        "1: 0x0/0x0/0x0 [kernel.kallsyms]  [FN]\n",
        &format!("2: 0x0/0x0/0x0 {LIBC}  [FN]\n"),
        "3: 0x0/0x0/0x0 Shop.dll  [FN]\n",
        &format!("4: 0x0/0x0/0x0 {CORECLR}  [FN]\n"),
        "5: 0x0/0x0/0x0 Evil.dll  [FN]\n",
    ]
    .concat();
    assert_eq!(raw, expected);
}

#[test]
fn go_tool_pprof_reads_off_cpu_time() {
    let mut profile = Profile::new(Mode::OffCpu, START_NS);
    profile.set_duration_ns(1_500_000_000);
    let process = profile.add_process(ProcessInfo {
        pid: 9,
        process_start_ns: 90,
        name: "dotnet w.dll".into(),
        container_id: None,
        pod_uid: None,
    });
    let schedule = profile.intern_frame(Frame::named(FrameKind::Kernel, "schedule", Some(KERNEL)));
    let wait = profile.intern_frame(Frame::named(
        FrameKind::Managed,
        "System.Threading.Monitor.Wait(object)",
        Some("System.Private.CoreLib.dll"),
    ));
    profile.add_sample(process, 10, &[schedule, wait], 1_500_000);
    profile.add_sample(process, 10, &[schedule, wait], 2_500_000);
    profile.add_sample(process, 11, &[schedule], 7);

    let dir = ScratchDir::new("profile-pprof-off-cpu");
    let raw = pprof_raw(&write_file(&profile, Format::Pprof, dir.path()));
    let expected = [
        "PeriodType: off_cpu nanoseconds\n",
        "Period: 1\n",
        "Time: 2025-12-01 12:00:00 +0000 UTC\n",
        "Duration: 1.5s\n",
        "Samples:\n",
        "samples/count off_cpu/nanoseconds\n",
        "          2    4000000: 1 2 \n",
        "                process:[dotnet w.dll]\n",
        "                pid:[9] process_start_ns:[90] thread:[10]\n",
        "          1          7: 1 \n",
        "                process:[dotnet w.dll]\n",
        "                pid:[9] process_start_ns:[90] thread:[11]\n",
        "Locations\n",
        "     1: 0x0 M=1 schedule [kernel.kallsyms]:0 s=0\n",
        "     2: 0x0 M=2 System.Threading.Monitor.Wait(object) System.Private.CoreLib.dll:0 s=0()\n",
        "Mappings\n",
        "1: 0x0/0x0/0x0 [kernel.kallsyms]  [FN]\n",
        "2: 0x0/0x0/0x0 System.Private.CoreLib.dll  [FN]\n",
    ]
    .concat();
    assert_eq!(raw, expected);
}

/// tests/node/speedscope_import.mjs on `file`: schema errors, and what speedscope imported.
#[track_caller]
fn speedscope_import(file: &Path) -> Value {
    let modules = npm_modules();
    let stdout = consume(
        Command::new("node").arg(SPEEDSCOPE_IMPORT).arg(&modules).arg(file),
        "run `cargo xtask setup` (it installs Debian's nodejs)",
    );
    serde_json::from_str(&stdout).unwrap()
}

fn frame(name: &str, file: &str) -> Value {
    json!({"name": name, "file": file})
}

#[test]
fn speedscope_file_passes_the_schema_and_speedscope_imports_its_stacks() {
    let dir = ScratchDir::new("profile-speedscope");
    let imported = speedscope_import(&write_file(&cpu_profile(), Format::Speedscope, dir.path()));
    let add = frame("Shop.Cart.Add(int32)", "Shop.dll");
    let long = frame(&long_method_cut(), "Evil.dll");
    assert_eq!(
        imported,
        json!({
            "schemaErrors": [],
            "name": "CPU samples at 100 Hz",
            // The heavier process opens first.
            "indexToView": 1,
            "profiles": [
                {
                    "name": "dotnet /app/Shop.dll (4242)",
                    "unit": "nanoseconds",
                    "totalWeight": 60_000_000,
                    "stacks": [
                        {"frames": [add, frame("write", LIBC), frame("do_syscall_64", KERNEL)],
                         "weight": 50_000_000},
                        {"frames": [add, frame("libcoreclr.so+0x1a2b3c", CORECLR)],
                         "weight": 10_000_000},
                    ],
                },
                {
                    // JSON escapes the names: speedscope gets them exactly.
                    "name": format!("{HOSTILE_PROCESS} (777)"),
                    "unit": "nanoseconds",
                    "totalWeight": 70_000_000,
                    "stacks": [
                        {"frames": [long, frame(HOSTILE_METHOD, "Evil.dll"),
                                    frame("[kernel.kallsyms]+0xffffffff81000000", KERNEL)],
                         "weight": 40_000_000},
                        {"frames": [long, frame("poll 12", LIBC)], "weight": 30_000_000},
                    ],
                },
            ],
        })
    );
}

#[test]
fn the_speedscope_schema_check_rejects_a_file_off_the_schema() {
    let dir = ScratchDir::new("profile-speedscope-bad");
    let file = dir.path().join("bad.speedscope.json");
    let mut bad: Value = serde_json::from_slice(&{
        let mut bytes = Vec::new();
        Format::Speedscope.write(&cpu_profile(), &mut bytes).unwrap();
        bytes
    })
    .unwrap();
    bad["profiles"][0]["unit"] = json!("samples");
    std::fs::write(&file, bad.to_string()).unwrap();
    let errors = &speedscope_import(&file)["schemaErrors"];
    let where_and_why: Vec<(&str, &str)> = errors
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["instancePath"].as_str().unwrap(), e["keyword"].as_str().unwrap()))
        .collect();
    // A profile is evented or sampled (`anyOf`): ajv says why it is neither.
    assert_eq!(
        where_and_why,
        [
            ("/profiles/0", "required"),
            ("/profiles/0/type", "const"),
            ("/profiles/0/unit", "enum"),
            ("/profiles/0/unit", "enum"),
            ("/profiles/0", "anyOf"),
        ],
        "{errors}"
    );
}

/// What every flame graph of [`cpu_profile`] must say on hover: `name (N samples, P%)`, by name.
fn expected_titles() -> BTreeMap<String, String> {
    let hostile_process = "<script>alert(\"x&y\")</script>\u{fffd}[31m (777)";
    [
        ("all", "all (13 samples, 100%)"),
        ("dotnet /app/Shop.dll (4242)", "dotnet /app/Shop.dll (4242) (6 samples, 46.15%)"),
        ("Shop.Cart.Add(int32)", "Shop.Cart.Add(int32) (6 samples, 46.15%)"),
        ("write", "write (5 samples, 38.46%)"),
        ("do_syscall_64", "do_syscall_64 (5 samples, 38.46%)"),
        ("libcoreclr.so+0x1a2b3c", "libcoreclr.so+0x1a2b3c (1 samples, 7.69%)"),
        (hostile_process, &format!("{hostile_process} (7 samples, 53.85%)")),
        (&long_method_cut(), &format!("{} (7 samples, 53.85%)", long_method_cut())),
        (
            "<script>&\"'\u{fffd}, evil\u{fffd}name",
            "<script>&\"'\u{fffd}, evil\u{fffd}name (4 samples, 30.77%)",
        ),
        (
            "[kernel.kallsyms]+0xffffffff81000000",
            "[kernel.kallsyms]+0xffffffff81000000 (4 samples, 30.77%)",
        ),
        // Read as a name, not as a second count column.
        ("poll_12", "poll_12 (3 samples, 23.08%)"),
    ]
    .into_iter()
    .map(|(name, title)| (name.to_owned(), title.to_owned()))
    .collect()
}

/// A frame of an SVG flame graph: its `<title>` (unescaped) and its rectangle's fill.
#[derive(Debug)]
struct SvgFrame {
    title: String,
    fill: String,
}

/// Parses `svg` as XML: every frame's title and fill, by name (the title before ` (`).
fn svg_frames(svg: &str) -> BTreeMap<String, SvgFrame> {
    let mut reader = quick_xml::Reader::from_str(svg);
    let mut frames = BTreeMap::new();
    let mut title: Option<String> = None;
    let mut last_title = None;
    loop {
        match reader.read_event().unwrap_or_else(|e| panic!("the SVG is not XML: {e}")) {
            Event::Start(e) if e.name().as_ref() == b"title" => title = Some(String::new()),
            Event::Text(text) if title.is_some() => {
                title.as_mut().unwrap().push_str(&text.decode().unwrap());
            }
            // Entity references come apart from the text around them.
            Event::GeneralRef(reference) if title.is_some() => {
                let raw = format!("&{};", reference.decode().unwrap());
                title.as_mut().unwrap().push_str(&quick_xml::escape::unescape(&raw).unwrap());
            }
            Event::End(e) if e.name().as_ref() == b"title" => last_title = title.take(),
            Event::Empty(e) if e.name().as_ref() == b"rect" => {
                if let Some(title) = last_title.take() {
                    let fill = e.try_get_attribute("fill").unwrap().expect("a frame's fill");
                    let fill = String::from_utf8(fill.value.into_owned()).unwrap();
                    let name = title[..title.rfind(" (").unwrap()].to_owned();
                    assert!(frames.insert(name, SvgFrame { title, fill }).is_none());
                }
            }
            Event::Eof => return frames,
            _ => {}
        }
    }
}

/// The characters XML 1.0 allows (even escaped ones must be among them).
fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
}

fn rgb(fill: &str) -> (u8, u8, u8) {
    let parts: Vec<u8> = fill
        .strip_prefix("rgb(")
        .and_then(|f| f.strip_suffix(')'))
        .unwrap_or_else(|| panic!("fill {fill}"))
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    (parts[0], parts[1], parts[2])
}

#[test]
fn svg_is_xml_with_a_title_per_frame_colours_per_kind_and_escaped_names() {
    let dir = ScratchDir::new("profile-svg");
    let svg = std::fs::read_to_string(write_file(&cpu_profile(), Format::Svg, dir.path())).unwrap();
    assert!(svg.chars().all(is_xml_char), "a character XML forbids");
    // inferno's own script element, and no other.
    assert_eq!(svg.matches("<script").count(), 1);
    let frames = svg_frames(&svg);
    let titles: BTreeMap<String, String> =
        frames.iter().map(|(name, frame)| (name.clone(), frame.title.clone())).collect();
    assert_eq!(titles, expected_titles());

    let kind_of = |name: &str| match name {
        "do_syscall_64" | "[kernel.kallsyms]+0xffffffff81000000" => "kernel",
        "write" | "libcoreclr.so+0x1a2b3c" | "poll_12" => "native",
        "all" => "all",
        n if n.ends_with("(4242)") || n.ends_with("(777)") => "process",
        _ => "managed",
    };
    for (name, frame) in &frames {
        let (r, g, b) = rgb(&frame.fill);
        let colour_fits = match kind_of(name) {
            "kernel" => r >= 190 && (90..156).contains(&g) && b == 0,
            "native" => r >= 200 && g == b && g < 131,
            "managed" => g >= 200 && r == b && r < 111,
            "process" => (r, g, b) == (110, 130, 220),
            _ => (r, g, b) == (200, 200, 200),
        };
        assert!(colour_fits, "{name}: {} is not a {} colour", frame.fill, kind_of(name));
    }
}

#[test]
fn folded_file_is_exact_and_inferno_reads_its_weights() {
    let dir = ScratchDir::new("profile-folded");
    let path = write_file(&cpu_profile(), Format::Folded, dir.path());
    let text = std::fs::read_to_string(&path).unwrap();
    let hostile = "<script>alert(\"x&y\")</script>\u{fffd}[31m (777)";
    let long = long_method_cut();
    let expected = [
        format!(
            "{hostile};{long}_[j];<script>&\"'\u{fffd}, evil\u{fffd}name_[j];\
             [kernel.kallsyms]+0xffffffff81000000_[k] 4\n"
        ),
        format!("{hostile};{long}_[j];poll_12 3\n"),
        "dotnet /app/Shop.dll (4242);Shop.Cart.Add(int32)_[j];libcoreclr.so+0x1a2b3c 1\n".into(),
        "dotnet /app/Shop.dll (4242);Shop.Cart.Add(int32)_[j];write;do_syscall_64_[k] 5\n".into(),
    ]
    .concat();
    assert_eq!(text, expected);

    // inferno's reader of folded files (what `inferno-flamegraph FILE` runs).
    let mut svg = Vec::new();
    let mut options = inferno::flamegraph::Options::default();
    inferno::flamegraph::from_files(&mut options, &[path], &mut svg).unwrap();
    let titles: BTreeMap<String, String> = svg_frames(&String::from_utf8(svg).unwrap())
        .into_iter()
        .map(|(name, frame)| (name, frame.title))
        .collect();
    assert_eq!(titles, expected_titles());
}
