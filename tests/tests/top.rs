//! `tracer top` end to end on this host's kernel, against real CoreCLR 8 runtimes with known
//! behaviour: one burning CPU in known methods (`burn`: `TracerWorkload.Hot.Inner` the hottest),
//! one allocating and throwing at known rates (`churn`, which counts what it did), and one whose
//! command line, process name and method names carry escape sequences and newlines. The screen
//! runs in a real terminal (tmux: keys typed, the screen read back); `--once` is read as JSON.
//! Other tests run at the same time: each top watches only its own runtimes (`--pid`).
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tests::coreclr::{CoreclrHost, HOSTILE_COMM, HOSTILE_INNER};
use tests::process::{tracer_binary, wait_child_exit, wait_gone};
use tests::scratch::ScratchDir;
use tests::tmux::Tmux;
use tracer_decode::text::screen_cell;

/// BPF loading, sessions, a rundown and two counter rounds, on a loaded 2-core machine.
const SCREEN_TIMEOUT: Duration = Duration::from_secs(120);
/// A shell's answer.
const SHELL_TIMEOUT: Duration = Duration::from_secs(30);
/// Longer than any test runs: the workload burns until the test ends (and kills it).
const BURN_SECONDS: u32 = 600;
/// What the churning runtime does a second.
const CHURN_BYTES: u64 = 8_000_000;
const CHURN_EXCEPTIONS: u64 = 100;
const HOT_METHOD: &str = "TracerWorkload.Hot.Inner";
/// The terminal's size: every column of the list and a long hot method fit.
const WIDTH: u16 = 220;
const HEIGHT: u16 = 40;
/// A width that leaves the hot method 22 columns.
const NARROW: u16 = 150;
/// From SIGHUP to tracer's exit: its sessions' drain (the IPC timeout) and a margin.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// The list's rows on `screen`: each line below the header that starts with a pid, with the
/// pid.
fn rows(screen: &str) -> Vec<(u32, &str)> {
    screen
        .lines()
        .skip_while(|line| !line.starts_with("PID "))
        .skip(1)
        .filter_map(|line| Some((line.split_whitespace().next()?.parse().ok()?, line)))
        .collect()
}

fn pids(screen: &str) -> Vec<u32> {
    rows(screen).iter().map(|(pid, _)| *pid).collect()
}

/// The column (in characters) where `name` ends on the header line.
fn header_column_end(screen: &str, name: &str) -> usize {
    let header = screen.lines().find(|l| l.starts_with("PID ")).expect("a header");
    let at = header.find(name).unwrap_or_else(|| panic!("no {name} in {header}"));
    header[..at].chars().count() + name.chars().count()
}

/// The characters of `line` in the `width` columns ending at `end`.
fn column(line: &str, end: usize, width: usize) -> String {
    line.chars().skip(end - width).take(width).collect::<String>().trim().to_owned()
}

/// A runtime burning CPU in the workload's methods, compiled optimized before top starts (so
/// only a rundown names them).
fn busy_runtime(tmp: &ScratchDir) -> CoreclrHost {
    let mut busy = CoreclrHost::spawn(tmp.path()).expect("a CoreCLR 8 runtime");
    busy.optimize_workload().expect("an optimized workload");
    busy.start_burn(BURN_SECONDS).expect("burning");
    busy
}

fn churning_runtime(tmp: &ScratchDir) -> CoreclrHost {
    let mut churner = CoreclrHost::spawn(tmp.path()).expect("a CoreCLR 8 runtime");
    churner.churn(CHURN_BYTES, CHURN_EXCEPTIONS).expect("churning");
    churner
}

/// Starts `tracer top --pid …` in `tmux`'s shell (its log in `log`), then `echo TOP-EXIT $?`.
fn start_top(tmux: &Tmux, pids: &[u32], log: &std::path::Path) {
    let pids: String = pids.iter().map(|p| format!(" --pid {p}")).collect();
    let command =
        format!("{} top{pids} 2>{}; echo TOP-EXIT $?", tracer_binary().display(), log.display());
    tmux.type_line(&command).expect("typing the command");
}

/// `tracer top --once --pid …`: its lines, each a JSON object.
fn once(pids: &[u32]) -> Vec<Value> {
    let mut command = Command::new(tracer_binary());
    command.args(["top", "--once"]);
    for pid in pids {
        command.args(["--pid", &pid.to_string()]);
    }
    let mut child = command.stdout(Stdio::piped()).spawn().expect("tracer top --once");
    let status = wait_child_exit(&mut child, SCREEN_TIMEOUT);
    assert!(status.success(), "tracer top --once: {status}");
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn line_of(lines: &[Value], pid: u32) -> &Value {
    let of_pid: Vec<&Value> = lines.iter().filter(|l| l["pid"] == pid).collect();
    assert_eq!(of_pid.len(), 1, "one line for pid {pid}: {lines:#?}");
    of_pid[0]
}

/// `actual` is `expected` within ±10 %.
fn within_10_percent(actual: &Value, expected: f64) -> bool {
    actual.as_f64().is_some_and(|a| (a - expected).abs() <= 0.1 * expected)
}

#[test]
fn top_ranks_the_busy_runtime_first_with_its_hot_method_and_gives_the_terminal_back() {
    let tmp = ScratchDir::new("top-screen");
    let busy = busy_runtime(&tmp);
    let mut churner = churning_runtime(&tmp);
    let (busy_pid, churner_pid) = (busy.host_pid, churner.host_pid);
    let tmux = Tmux::start(WIDTH, HEIGHT).expect("a tmux terminal");
    let stty = tmp.path().join("stty.before");
    tmux.type_line(&format!("echo BEFORE-TOP; stty -g > {}", stty.display())).unwrap();
    tmux.wait_for("the shell's echo", SHELL_TIMEOUT, |s| s.lines().any(|l| l == "BEFORE-TOP"))
        .unwrap();
    let log = tmp.path().join("top.log");
    start_top(&tmux, &[busy_pid, churner_pid], &log);

    // Both rows with their pids, and (by CPU, the default) the busy one first, named.
    let screen = tmux
        .wait_for("both runtimes, the busy one first with its hot method", SCREEN_TIMEOUT, |s| {
            let rows = rows(s);
            rows.len() == 2
                && rows[0].0 == busy_pid
                && rows[1].0 == churner_pid
                && rows[0].1.contains(HOT_METHOD)
                && s.contains("2 sending counters")
        })
        .unwrap();
    assert!(
        screen
            .starts_with("tracer top · 2 of 2 .NET processes · 2 sending counters · sorted by CPU"),
        "{screen}"
    );
    // Sorted by exceptions, the churning one comes first; by CPU again, the busy one.
    tmux.keys(&["e"]).unwrap();
    tmux.wait_for("the churning runtime first", SCREEN_TIMEOUT, |s| {
        s.contains("sorted by exceptions") && pids(s) == [churner_pid, busy_pid]
    })
    .unwrap();
    tmux.keys(&["c"]).unwrap();
    tmux.wait_for("the busy runtime first", SCREEN_TIMEOUT, |s| {
        s.contains("sorted by CPU") && pids(s) == [busy_pid, churner_pid]
    })
    .unwrap();

    // The first row is selected: its detail names its top method, and lists its threads.
    tmux.keys(&["Enter"]).unwrap();
    let detail = tmux
        .wait_for("the busy runtime's detail", SCREEN_TIMEOUT, |s| {
            s.starts_with(&format!("pid {busy_pid} · python3 · runtime 8.0.4"))
                && s.contains(" top methods on CPU (last 5 s")
                && s.lines().any(|l| l.contains(HOT_METHOD) && l.contains('%'))
        })
        .unwrap();
    assert!(detail.contains(" counters (last 60 s) ") && detail.contains(" threads ("), "{detail}");
    tmux.keys(&["Escape"]).unwrap();
    tmux.wait_for("the list again", SCREEN_TIMEOUT, |s| pids(s) == [busy_pid, churner_pid])
        .unwrap();

    // A process that exits leaves the list.
    churner.exit().expect("the churning runtime exits");
    tmux.wait_for("the list without the runtime that exited", SCREEN_TIMEOUT, |s| {
        s.contains("1 of 1 .NET processes") && pids(s) == [busy_pid]
    })
    .unwrap();

    // The screen follows a resize: the hot method is cut to what is left of the width.
    tmux.resize(NARROW, HEIGHT).unwrap();
    tmux.wait_for("the list at the new width", SCREEN_TIMEOUT, |s| {
        let rows = rows(s);
        // Cut (how far depends on the width its share takes), with the ellipsis.
        rows.len() == 1
            && rows[0].1.contains("TracerWorkload.H")
            && !s.contains(HOT_METHOD)
            && rows[0].1.contains('…')
    })
    .unwrap();

    // `q`: top ends (status 0) and the terminal is as it was: the shell's screen, its modes.
    tmux.keys(&["q"]).unwrap();
    let after = tmux
        .wait_for("top's exit status", SCREEN_TIMEOUT, |s| {
            s.lines().any(|l| l.starts_with("TOP-EXIT"))
        })
        .unwrap_or_else(|e| panic!("{e:#}\ntracer's log:\n{}", log_of(&log)));
    assert!(after.lines().any(|l| l == "TOP-EXIT 0"), "{after}");
    assert!(after.lines().any(|l| l == "BEFORE-TOP"), "the shell's screen is back: {after}");
    assert!(!after.contains("tracer top ·"), "top's screen is gone: {after}");
    tmux.type_line(&format!(
        "stty -g | cmp -s - {} && echo STTY-SAME || echo STTY-CHANGED",
        stty.display()
    ))
    .unwrap();
    let modes = tmux
        .wait_for("the terminal modes compared", SHELL_TIMEOUT, |s| {
            s.lines().any(|l| l == "STTY-SAME" || l == "STTY-CHANGED")
        })
        .unwrap();
    assert!(modes.lines().any(|l| l == "STTY-SAME"), "{modes}");
    let log = log_of(&log);
    assert!(!log.contains("still stopping"), "every session stopped in time: {log}");
}

#[test]
fn top_once_reports_the_rates_the_workload_counted_and_the_hot_method() {
    let tmp = ScratchDir::new("top-once");
    let mut churner = churning_runtime(&tmp);
    let busy = busy_runtime(&tmp);
    let lines = once(&[churner.host_pid, busy.host_pid]);
    assert_eq!(lines.len(), 2, "{lines:#?}");

    // The rates are over the counter intervals the line names: the workload's count over the
    // same time (a moment it lacked the CPU is then in both).
    let churning = line_of(&lines, churner.host_pid);
    let span = ["rates_from_ns", "rates_to_ns"].map(|f| churning[f].as_u64().expect(f));
    assert!(span[1] - span[0] >= 1_000_000_000, "a whole interval at least: {churning}");
    let counted = churner.churned_between(span[0], span[1]).expect("what the workload counted");
    assert_eq!(
        (&churning["kind"], &churning["session"]),
        (&"top_process".into(), &"tracing".into())
    );
    assert!(
        within_10_percent(&churning["alloc_bytes_per_sec"], counted.bytes_per_sec()),
        "allocations: top {} a second, the workload {:.0} ({counted:?})",
        churning["alloc_bytes_per_sec"],
        counted.bytes_per_sec()
    );
    assert!(
        within_10_percent(&churning["exceptions_per_sec"], counted.exceptions_per_sec()),
        "exceptions: top {} a second, the workload {:.1} ({counted:?})",
        churning["exceptions_per_sec"],
        counted.exceptions_per_sec()
    );
    assert_eq!(churning["runtime_version"].as_str().map(|v| &v[..5]), Some("8.0.4"));
    for reported in ["gc_heap_bytes", "gen0_gcs_per_sec", "gc_paused_percent", "threadpool_threads"]
    {
        assert!(churning[reported].is_number(), "{reported} reported: {churning}");
    }

    let burning = line_of(&lines, busy.host_pid);
    assert_eq!(burning["hot_method"], HOT_METHOD, "{burning}");
    // Its CPU share is the machine's to give (tests run side by side): that it is counted.
    assert!(burning["cpu_percent"].as_f64().is_some_and(|c| c > 0.0), "{burning}");
    assert!(burning["hot_method_percent"].as_f64().is_some_and(|p| p >= 30.0), "{burning}");
    assert_eq!(burning["exceptions_per_sec"], 0.0, "{burning}");
}

#[test]
fn names_with_escape_sequences_and_newlines_stay_in_their_columns() {
    let tmp = ScratchDir::new("top-hostile");
    let hostile_arg = "app\x1b[2J\x1b[31mEVIL\nsecond line";
    let mut evil = CoreclrHost::spawn_with_args(tmp.path(), &[], &[hostile_arg]).expect("runtime");
    evil.hostile_names().expect("hostile names");
    evil.optimize_workload().expect("an optimized workload");
    evil.start_burn(BURN_SECONDS).expect("burning");
    let plain = CoreclrHost::spawn(tmp.path()).expect("a second runtime");
    let (evil_pid, plain_pid) = (evil.host_pid, plain.host_pid);

    // JSON carries every string as it is.
    let lines = once(&[evil_pid, plain_pid]);
    let line = line_of(&lines, evil_pid);
    assert_eq!(line["name"], HOSTILE_COMM);
    assert!(line["command_line"].as_str().is_some_and(|c| c.ends_with(hostile_arg)), "{line}");
    let method = line["hot_method"].as_str().unwrap_or_else(|| panic!("a hot method: {line}"));
    assert!(method.ends_with(&format!(".{HOSTILE_INNER}")), "{method:?}");

    let tmux = Tmux::start(WIDTH, HEIGHT).expect("a tmux terminal");
    let log = tmp.path().join("top.log");
    start_top(&tmux, &[evil_pid, plain_pid], &log);
    let inner = screen_cell(HOSTILE_INNER, 100);
    let screen = tmux
        .wait_for("both runtimes, the hostile one named", SCREEN_TIMEOUT, |s| {
            let rows = rows(s);
            rows.len() == 2
                && rows[0].0 == evil_pid
                && rows[0].1.contains(&inner)
                && s.contains("2 sending counters")
                && !rows.iter().any(|(_, row)| row.contains("n/a"))
        })
        .unwrap();
    // The title and header rows are where they belong, and each process has one row.
    let lines: Vec<&str> = screen.lines().collect();
    assert!(lines[0].starts_with("tracer top · 2 of 2"), "{screen}");
    assert!(lines[1].starts_with("PID "), "{screen}");
    assert_eq!(pids(&screen), [evil_pid, plain_pid], "{screen}");
    let (evil_row, plain_row) = (lines[2], lines[3]);
    // The name, escaped and cut to its column; the columns after it where the header has them.
    assert!(evil_row.contains(&screen_cell(HOSTILE_COMM, 16)), "{evil_row}");
    for (name, width) in [("CPU%", 6), ("WS", 7), ("HEAP", 7)] {
        let end = header_column_end(&screen, name);
        for row in [evil_row, plain_row] {
            let cell = column(row, end, width);
            assert!(
                cell.parse::<f64>().is_ok() || cell.ends_with('M'),
                "{name}: {cell:?} in {row}"
            );
        }
    }
    assert!(!tmux.title().unwrap().contains("owned"), "the window title was not set");

    // The detail shows the command line on one line, escaped.
    tmux.keys(&["Enter"]).unwrap();
    let detail = tmux
        .wait_for("the hostile runtime's detail", SCREEN_TIMEOUT, |s| {
            s.starts_with(&format!("pid {evil_pid} · ")) && s.contains(&inner)
        })
        .unwrap();
    let command = detail.lines().nth(1).unwrap();
    assert!(command.starts_with("command: ") && command.ends_with(&screen_cell(hostile_arg, 80)));
    assert!(!detail.lines().any(|l| l.starts_with("second line") || l.starts_with("row")));

    // SIGTERM ends it as `q` does: status 0, the shell's screen back.
    let top_pid = top_in(&tmux);
    // SAFETY: kill takes a pid and a signal; the pid is the child of the test's shell, which
    // has not reaped it (it waits for it).
    assert_eq!(unsafe { libc::kill(top_pid as i32, libc::SIGTERM) }, 0);
    let after = tmux
        .wait_for("top's exit status", SCREEN_TIMEOUT, |s| {
            s.lines().any(|l| l.starts_with("TOP-EXIT"))
        })
        .unwrap_or_else(|e| panic!("{e:#}\ntracer's log:\n{}", log_of(&log)));
    assert!(after.lines().any(|l| l == "TOP-EXIT 0"), "{after}");
    assert!(!after.contains("tracer top ·") && !after.contains(" top methods on CPU"), "{after}");

    // A terminal that closes ends it too (SIGHUP), its sessions stopped as on `q`.
    start_top(&tmux, &[evil_pid, plain_pid], &log);
    tmux.wait_for("both runtimes again", SCREEN_TIMEOUT, |s| pids(s).len() == 2).unwrap();
    let top_pid = top_in(&tmux);
    tmux.close().expect("closing the terminal");
    wait_gone(top_pid, EXIT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}: top ends when its terminal closes\n{}", log_of(&log)));
}

/// What tracer logged (for a failure's message).
fn log_of(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("({e})"))
}

/// The pid of the `tracer top` the terminal's shell runs.
fn top_in(tmux: &Tmux) -> u32 {
    let shell = tmux.shell_pid().expect("the shell's pid");
    match tests::procfs::children(shell)[..] {
        [pid] => pid,
        ref other => panic!("the shell {shell} should run one program, runs {other:?}"),
    }
}
