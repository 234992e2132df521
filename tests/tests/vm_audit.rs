//! tracer's in-kernel user_events detection against REAL user_events activity: `tracer audit`
//! (its library entry point) watches `user_events_helper` issue `DIAG_IOCSREG`, `DIAG_IOCSUNREG`
//! and `DIAG_IOCSDEL` on `user_events_data`, fork, exec and exit, and its reports and its
//! per-process registration table are compared with what the helper passed, what the kernel
//! returned, and the kernel's own `user_events_status`.
//!
//! Runs inside the VM (`cargo xtask vm-test --test vm_audit`); fails on a kernel without
//! user_events. Kernel behaviour relied on (6.12, `kernel/trace/trace_events_user.c`):
//! registrations belong to the mm, are copied on fork and dropped on exec and exit; an event
//! without `USER_EVENT_REG_PERSIST` is deleted by a work item once its last reference goes, so
//! `DIAG_IOCSDEL` answers `EBUSY` while it is referenced and `ENOENT` once it is gone; a
//! persistent event outlives its users until `DIAG_IOCSDEL`, which then succeeds.
use std::collections::HashMap;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::pipeline::Running;
use tests::process::LineProcess;
use tests::user_events::tracefs_with_user_events;
use tracer::kernel::detect::HookChoice;
use tracer::pipeline::audit::{self, AuditConfig, AuditSummary};

const HELPER: &str = env!("CARGO_BIN_EXE_user_events_helper");
/// Every wait: TCG runs the guest 5–20× slower than the host.
const TIMEOUT: Duration = Duration::from_secs(60);
/// The helper's `comm`: its file name cut to TASK_COMM_LEN − 1 bytes.
const HELPER_COMM: &str = "user_events_hel";
/// `USER_EVENT_REG_PERSIST`.
const PERSIST: u16 = 1;
/// glibc's fork() is `clone(CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD)`; the kernel
/// moves the exit signal out of the flags (`kernel_clone_args.exit_signal`) before the
/// `task_newtask` tracepoint tracer reads them.
const FORK_CLONE_FLAGS: &str = "CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID";

/// A `user_events_helper` process (and, after `fork`, its child), answering each command with
/// one JSON line on the shared stdout.
struct Producer {
    process: LineProcess,
    pid: u64,
    /// Write end of the pipe the forked child (and its exec'd image) reads commands from.
    child_commands: File,
}

impl Producer {
    fn spawn() -> Producer {
        let mut fds = [0; 2];
        // SAFETY: a valid two-int out-array.
        let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(ret, 0, "pipe2: {}", std::io::Error::last_os_error());
        // SAFETY: two fresh fds nothing else owns.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let read_fd = read.as_raw_fd();
        let mut command = Command::new(HELPER);
        command.arg("--child-commands").arg(read_fd.to_string());
        // SAFETY: the hook only calls fcntl (async-signal-safe) so the helper inherits the fd.
        unsafe {
            command.pre_exec(move || match libc::fcntl(read_fd, libc::F_SETFD, 0) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            });
        }
        let process = LineProcess::spawn("user_events_helper", command).expect("spawning");
        drop(read);
        let mut producer = Producer { process, pid: 0, child_commands: write };
        let ready = producer.reply();
        assert_eq!((&ready["op"], &ready["image"]), (&json!("ready"), &json!("spawn")), "{ready}");
        producer.pid = u64_of(&ready, "pid");
        producer
    }

    fn reply(&mut self) -> Value {
        let line = self.process.next_line(TIMEOUT).expect("a reply from user_events_helper");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("helper line {line:?}: {e}"))
    }

    /// A command to the parent process.
    fn request(&mut self, command: &str) -> Value {
        self.process.send_line(command).expect("commanding the helper");
        self.reply()
    }

    /// A command to the forked child (or its exec'd image).
    fn child_request(&mut self, command: &str) -> Value {
        self.child_send(command);
        self.reply()
    }

    fn child_send(&mut self, command: &str) {
        writeln!(self.child_commands, "{command}").expect("commanding the helper's child");
    }

    /// `DIAG_IOCSREG` of `name_args` with enable word `slot`; returns the helper's report.
    fn register(&mut self, slot: u8, bit: u8, size: u8, flags: u16, name_args: &str) -> Value {
        let reply = self.request(&format!("reg {slot} {bit} {size} {flags} {name_args}"));
        assert_eq!((&reply["op"], &reply["pid"]), (&json!("reg"), &json!(self.pid)), "{reply}");
        reply
    }

    /// Forks; returns the child's pid once it serves commands.
    fn fork(&mut self) -> u64 {
        let ready = self.request("fork");
        assert_eq!((&ready["op"], &ready["image"]), (&json!("ready"), &json!("fork")), "{ready}");
        assert_eq!(ready["ppid"], self.pid, "{ready}");
        u64_of(&ready, "pid")
    }
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no numeric {key:?} in {v}"))
}

/// `audit::run` with the registration table, restricted to `pid` and its descendants.
struct Audit {
    running: Running<AuditSummary>,
    /// Lines consumed so far per (kind, pid): reports are matched to requests in order.
    consumed: HashMap<(&'static str, u64), usize>,
    hooks: HookChoice,
}

impl Audit {
    fn start(pid: u64, hooks: HookChoice) -> Audit {
        let config = AuditConfig {
            target_pids: vec![pid as u32],
            hooks,
            registrations: true,
            ..AuditConfig::default()
        };
        let running = Running::start(TIMEOUT, move |sink, stop, ready| {
            audit::run(config, sink, stop, Some(ready))
        });
        Audit { running, consumed: HashMap::new(), hooks }
    }

    /// The next (not yet consumed) line of `kind` about `pid`.
    fn next(&mut self, kind: &'static str, pid: u64) -> Value {
        let n = self.consumed.entry((kind, pid)).or_default();
        *n += 1;
        let n = *n;
        let lines = self.running.wait_for_count(&format!("{kind} of {pid}"), TIMEOUT, n, |l| {
            l["kind"] == kind && l["pid"] == pid
        });
        lines.into_iter().nth(n - 1).expect("n lines")
    }

    /// Waits for tracer's report of the ioctl the helper described in `reply` and checks that it
    /// has exactly what the helper passed and what the kernel returned.
    fn expect_ioctl(&mut self, reply: &Value) -> Value {
        let pid = u64_of(reply, "pid");
        let (kind, cmd) = match reply["op"].as_str() {
            Some("reg") => ("user_events_register", "0xc0082a00"),
            Some("unreg") => ("user_events_unregister", "0x40082a02"),
            Some("del") => ("user_events_delete", "0x40082a01"),
            _ => panic!("not an ioctl report: {reply}"),
        };
        let errno = u64_of(reply, "errno") as i32;
        let (ret, error) = match reply["ret"].as_i64() {
            Some(0) => (0, Value::Null),
            Some(-1) => (-i64::from(errno), json!(errno_name(errno))),
            _ => panic!("unexpected ioctl return value in {reply}"),
        };
        let line = self.next(kind, pid);
        let mut expected = json!({
            "source": "kernel", "pid": pid, "tid": pid, "comm": HELPER_COMM, "uid": 0,
            "fd": reply["fd"], "ret": ret, "error": error, "cmd": cmd, "arg": reply["arg"],
            "user_events_data": true,
        });
        let fields = expected.as_object_mut().expect("an object");
        match kind {
            "user_events_register" => {
                for key in ["enable_addr", "enable_bit", "enable_size", "name_args"] {
                    fields.insert(key.into(), reply[key].clone());
                }
                fields.insert("size".into(), json!(28));
                fields.insert("reg_flags".into(), reply["flags"].clone());
                if ret == 0 {
                    fields.insert("write_index".into(), reply["write_index"].clone());
                } else {
                    assert!(line.get("write_index").is_none(), "a refused REG has none: {line}");
                }
            }
            "user_events_unregister" => {
                fields.insert("size".into(), json!(16));
                fields.insert("disable_addr".into(), reply["disable_addr"].clone());
                fields.insert("disable_bit".into(), reply["disable_bit"].clone());
            }
            _ => {
                fields.insert("name".into(), reply["name"].clone());
            }
        }
        for (key, want) in fields.iter() {
            assert_eq!(&line[key], want, "{key} of {line}\nhelper: {reply}");
        }
        line
    }

    /// Stops tracer; returns its lines, the `registration_table` line's processes (which the
    /// summary's table must equal) and how many registrations were found at start.
    fn stop(self) -> (Vec<Value>, Value, u64) {
        let (lines, summary) = self.running.stop();
        let [.., last, summary_line] = lines.as_slice() else { panic!("{lines:#?}") };
        assert_eq!(last["kind"], "registration_table", "the table, then the summary: {last}");
        assert_eq!(summary_line["kind"], "summary");
        let processes = last["processes"].clone();
        let table = summary.registrations.as_ref().expect("the table was requested");
        let from_summary: Vec<Value> =
            table.iter().map(|(pid, regs)| json!({"pid": pid, "registrations": regs})).collect();
        assert_eq!(json!(from_summary), processes, "summary and registration_table line differ");
        tests::audit_scenarios::assert_hooks(&summary, self.hooks);
        assert_eq!(summary.decode_errors, 0);
        assert_eq!(summary.total_lost(), 0, "{:?}", summary.losses);
        assert!(summary.seq_gaps.is_empty(), "{:?}", summary.seq_gaps);
        (lines, processes, summary.registrations_at_start)
    }
}

/// The errno names tracer must print for the errors these tests provoke.
fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::ENOENT => "ENOENT",
        libc::EBUSY => "EBUSY",
        libc::EINVAL => "EINVAL",
        libc::EADDRINUSE => "EADDRINUSE",
        _ => panic!("errno {errno} not expected by these tests"),
    }
}

/// The table entry tracer must hold for a successful registration the helper reported.
fn table_entry(reg: &Value) -> Value {
    json!({
        "name_args": reg["name_args"], "enable_addr": reg["enable_addr"],
        "enable_bit": reg["enable_bit"], "enable_size": reg["enable_size"],
        "flags": reg["flags"], "write_index": reg["write_index"], "fd": reg["fd"],
        "at_start": false,
    })
}

/// The kinds tracer reported about `pid`, in order.
fn kinds_of(lines: &[Value], pid: u64) -> Vec<&str> {
    lines.iter().filter(|l| l["pid"] == pid).map(|l| l["kind"].as_str().unwrap_or("?")).collect()
}

/// `ret`/`errno` of a helper report.
fn outcome(reply: &Value) -> (i64, i64) {
    (reply["ret"].as_i64().unwrap_or(i64::MIN), reply["errno"].as_i64().unwrap_or(i64::MIN))
}

fn ok() -> (i64, i64) {
    (0, 0)
}

fn failed(errno: i32) -> (i64, i64) {
    (-1, i64::from(errno))
}

/// The kernel's `user_events_status`: one line per event, a blank line, `Active:`, `Busy:`.
#[derive(Debug)]
struct Status {
    events: Vec<String>,
    active: usize,
    busy: usize,
}

impl Status {
    fn read(tracefs: &Path) -> Status {
        let path = tracefs.join("user_events_status");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let (events, totals) = text.split_once("\n\n").map_or(("", text.as_str()), |(e, t)| (e, t));
        let events: Vec<String> = events.lines().map(str::to_owned).collect();
        let total = |key: &str| -> usize {
            totals
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {key:?} in {text:?}"))
        };
        let status = Status { active: total("Active:"), busy: total("Busy:"), events };
        assert_eq!(
            status.active,
            status.events.len(),
            "Active counts the listed events: {status:?}"
        );
        let used = status.events.iter().filter(|l| l.contains(" # Used by")).count();
        assert_eq!(status.busy, used, "Busy counts the events in use: {status:?}");
        status
    }

    /// The line of `name` (the event name, then ` # Used by …` when a consumer enabled it).
    fn line(&self, name: &str) -> Option<&str> {
        self.events.iter().find(|l| l.split(' ').next() == Some(name)).map(String::as_str)
    }

    /// The lines of the events whose names start with `prefix` (each test uses its own), sorted.
    fn events_of(&self, prefix: &str) -> Vec<&str> {
        let mut lines: Vec<&str> =
            self.events.iter().filter(|l| l.starts_with(prefix)).map(String::as_str).collect();
        lines.sort_unstable();
        lines
    }

    /// Polls (the kernel deletes unreferenced events from a work item) until `pred` holds.
    fn wait(tracefs: &Path, what: &str, pred: impl Fn(&Status) -> bool) -> Status {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let status = Status::read(tracefs);
            if pred(&status) {
                return status;
            }
            assert!(Instant::now() < deadline, "{what}: not within {TIMEOUT:?}: {status:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The event name of a registration's `name_args`.
/// The prefix of the event names a test registers: its own per mechanism, as both run at once.
fn prefix(test: &str, hooks: HookChoice) -> String {
    let mechanism = match hooks {
        HookChoice::Trampolines => "t",
        _ => "s",
    };
    format!("tracer_vm_audit_{mechanism}_{test}_")
}

fn event_name(name_args: &Value) -> &str {
    name_args.as_str().and_then(|s| s.split(' ').next()).expect("name_args")
}

tests::test_with_both_mechanisms! {
    registrations_are_reported_as_made_and_fork_copies_them;
    refused_registrations_are_reported_with_their_errno_and_not_tabled;
    exec_and_exit_drop_registrations_and_delete_follows_the_references;
    a_burst_of_registrations_with_the_consumer_paused_loses_nothing;
    registrations_made_before_tracer_started_are_in_the_table;
}

/// The task iterator reads what the helper registered before tracer started (the kernel's
/// enablers: name, address, bit, size; fd, write_index and flags are not kept there), and the
/// table follows the live unregistration of one of them.
fn registrations_made_before_tracer_started_are_in_the_table(hooks: HookChoice) {
    let tracefs = tracefs_with_user_events();
    let prefix = prefix("before", hooks);
    let mut parent = Producer::spawn();
    let a = parent.register(0, 7, 4, 0, &format!("{prefix}a u32 x"));
    let b = parent.register(1, 40, 8, 0, &format!("{prefix}b u64 y"));
    assert_eq!((outcome(&a), outcome(&b)), (ok(), ok()), "{a} {b}");
    let mut audit = Audit::start(parent.pid, hooks);
    let unreg_b = parent.request(&format!("unreg {} 40", b["enable_addr"].as_str().unwrap()));
    assert_eq!(outcome(&unreg_b), ok(), "{unreg_b}");
    audit.expect_ioctl(&unreg_b);
    let (lines, processes, at_start) = audit.stop();
    assert_eq!(at_start, 2, "both found");
    assert_eq!(
        processes,
        json!([{"pid": parent.pid, "registrations": [{
            "name_args": format!("{prefix}a"), "enable_addr": a["enable_addr"], "enable_bit": 7,
            "enable_size": 4, "flags": null, "write_index": null, "fd": null, "at_start": true,
        }]}])
    );
    assert_eq!(kinds_of(&lines, parent.pid), ["user_events_unregister"]);
    assert_eq!(
        outcome(&parent.request(&format!("unreg {} 7", a["enable_addr"].as_str().unwrap()))),
        ok()
    );
    parent.process.send_line("exit").expect("commanding the helper");
    parent.process.wait_exit(TIMEOUT).expect("the helper exits");
    Status::wait(&tracefs, "auto-deletion of the event", |s| s.events_of(&prefix).is_empty());
}

fn registrations_are_reported_as_made_and_fork_copies_them(hooks: HookChoice) {
    let tracefs = tracefs_with_user_events();
    let prefix = prefix("fork", hooks);
    let (name_a, name_b) = (format!("{prefix}a"), format!("{prefix}b"));
    assert_eq!(Status::read(&tracefs).events_of(&prefix), Vec::<&str>::new(), "a fresh kernel");
    let mut parent = Producer::spawn();
    let mut audit = Audit::start(parent.pid, hooks);

    let a = parent.register(0, 3, 4, 0, &format!("{name_a} u32 x"));
    let b = parent.register(1, 63, 8, 0, &format!("{name_b} u64 y; u32 z"));
    assert_eq!(outcome(&a), ok(), "{a}");
    assert_eq!(outcome(&b), ok(), "{b}");
    assert_eq!((&a["write_index"], &b["write_index"]), (&json!(0), &json!(1)), "a fresh fd");
    audit.expect_ioctl(&a);
    audit.expect_ioctl(&b);

    // Listed, and used by no consumer.
    let status = Status::read(&tracefs);
    assert_eq!(status.events_of(&prefix), [name_a.as_str(), name_b.as_str()]);

    let child = parent.fork();
    let fork = audit.next("process_fork", parent.pid);
    assert_eq!(
        (&fork["child_pid"], &fork["clone_flags"]),
        (&json!(child), &json!(FORK_CLONE_FLAGS))
    );

    // The child's inherited copy of `a` is its own: unregistering it works once.
    let unreg = |reg: &Value| {
        format!("unreg {} {}", reg["enable_addr"].as_str().unwrap(), reg["enable_bit"])
    };
    let child_unreg_a = parent.child_request(&unreg(&a));
    assert_eq!((outcome(&child_unreg_a), &child_unreg_a["pid"]), (ok(), &json!(child)));
    let child_unreg_a_again = parent.child_request(&unreg(&a));
    assert_eq!(outcome(&child_unreg_a_again), failed(libc::ENOENT), "{child_unreg_a_again}");
    audit.expect_ioctl(&child_unreg_a);
    audit.expect_ioctl(&child_unreg_a_again);

    let (lines, processes, _) = audit.stop();
    let mut expected = vec![
        json!({"pid": parent.pid, "registrations": [table_entry(&a), table_entry(&b)]}),
        json!({"pid": child, "registrations": [table_entry(&b)]}),
    ];
    expected.sort_by_key(|p| u64_of(p, "pid"));
    assert_eq!(processes, json!(expected));
    assert_eq!(
        kinds_of(&lines, parent.pid),
        ["user_events_register", "user_events_register", "process_fork"]
    );
    assert_eq!(kinds_of(&lines, child), ["user_events_unregister", "user_events_unregister"]);
    // Every event tracer holds a registration of is one the kernel lists.
    let status = Status::read(&tracefs);
    for registration in processes
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["registrations"].as_array().unwrap().iter())
    {
        let name = event_name(&registration["name_args"]);
        assert!(status.line(name).is_some(), "{name} not in {status:?}");
    }

    // The kernel agrees with the table: the child holds `b` only, the parent both.
    assert_eq!(outcome(&parent.child_request(&unreg(&b))), ok(), "child still had b");
    assert_eq!(outcome(&parent.request(&unreg(&a))), ok(), "parent still had a");
    assert_eq!(outcome(&parent.request(&unreg(&b))), ok(), "parent still had b");
    parent.child_send("exit");
    parent.process.send_line("exit").expect("commanding the helper");
    parent.process.wait_exit(TIMEOUT).expect("the helper exits");
    // With every reference gone the kernel deletes both events by itself.
    Status::wait(&tracefs, "auto-deletion of both events", |s| s.events_of(&prefix).is_empty());
}

fn refused_registrations_are_reported_with_their_errno_and_not_tabled(hooks: HookChoice) {
    let tracefs = tracefs_with_user_events();
    let mut parent = Producer::spawn();
    let mut audit = Audit::start(parent.pid, hooks);

    let prefix = prefix("refuse", hooks);
    let (good_name, bad_name) = (format!("{prefix}good"), format!("{prefix}bad"));
    let good = parent.register(0, 0, 4, 0, &format!("{good_name} u32 x"));
    assert_eq!(outcome(&good), ok(), "{good}");
    let bad_size = parent.register(1, 0, 3, 0, &format!("{bad_name} u32 x"));
    assert_eq!(outcome(&bad_size), failed(libc::EINVAL), "enable_size 3: {bad_size}");
    let same_bit = parent.register(0, 0, 4, 0, &format!("{bad_name} u32 x"));
    assert_eq!(outcome(&same_bit), failed(libc::EADDRINUSE), "address and bit in use: {same_bit}");
    let other_fields = parent.register(2, 0, 4, 0, &format!("{good_name} u64 x"));
    assert_eq!(outcome(&other_fields), failed(libc::EADDRINUSE), "same name, other fields");
    for reply in [&good, &bad_size, &same_bit, &other_fields] {
        audit.expect_ioctl(reply);
    }
    let status = Status::read(&tracefs);
    assert_eq!(status.events_of(&prefix), [good_name.as_str()], "refusals create none");

    let (lines, processes, _) = audit.stop();
    assert_eq!(
        processes,
        json!([{"pid": parent.pid, "registrations": [table_entry(&good)]}]),
        "only the accepted registration"
    );
    assert_eq!(kinds_of(&lines, parent.pid), ["user_events_register"; 4]);
    parent.process.send_line("exit").expect("commanding the helper");
    parent.process.wait_exit(TIMEOUT).expect("the helper exits");
    Status::wait(&tracefs, "auto-deletion of the event", |s| s.events_of(&prefix).is_empty());
}

fn exec_and_exit_drop_registrations_and_delete_follows_the_references(hooks: HookChoice) {
    let tracefs = tracefs_with_user_events();
    let prefix = prefix("exec", hooks);
    let (ephemeral_name, persistent_name) =
        (format!("{prefix}ephemeral"), format!("{prefix}persistent"));
    let mut parent = Producer::spawn();
    let mut audit = Audit::start(parent.pid, hooks);

    let ephemeral = parent.register(0, 5, 4, 0, &format!("{ephemeral_name} u32 x"));
    let persistent = parent.register(1, 40, 8, PERSIST, &format!("{persistent_name} u64 y; u32 z"));
    assert_eq!(outcome(&ephemeral), ok(), "{ephemeral}");
    assert_eq!(outcome(&persistent), ok(), "{persistent}");
    audit.expect_ioctl(&ephemeral);
    audit.expect_ioctl(&persistent);
    assert_eq!(
        Status::read(&tracefs).events_of(&prefix),
        [ephemeral_name.as_str(), persistent_name.as_str()]
    );

    // Referenced events cannot be deleted.
    for name in [ephemeral_name.as_str(), persistent_name.as_str()] {
        let del = parent.request(&format!("del {name}"));
        assert_eq!(outcome(&del), failed(libc::EBUSY), "{del}");
        audit.expect_ioctl(&del);
    }

    let child = parent.fork();
    let fork = audit.next("process_fork", parent.pid);
    assert_eq!(fork["child_pid"], child);
    let exec = parent.child_request("exec");
    assert_eq!(
        (&exec["op"], &exec["image"], &exec["pid"]),
        (&json!("ready"), &json!("exec"), &json!(child))
    );
    let exec_line = audit.next("process_exec", child);
    assert_eq!(
        (&exec_line["filename"], &exec_line["old_tid"], &exec_line["comm"]),
        (&exec["argv0"], &json!(child), &json!(HELPER_COMM))
    );
    // The exec'd image holds nothing the kernel could unregister.
    let unreg = format!("unreg {} 5", ephemeral["enable_addr"].as_str().unwrap());
    let gone = parent.child_request(&unreg);
    assert_eq!((outcome(&gone), &gone["pid"]), (failed(libc::ENOENT), &json!(child)), "{gone}");
    audit.expect_ioctl(&gone);

    parent.process.send_line("exit").expect("commanding the helper");
    parent.process.wait_exit(TIMEOUT).expect("the helper exits");
    audit.next("process_exit", parent.pid);

    // The parent's exit dropped its references and the exec its child's (which is still
    // running): the kernel deletes the ephemeral event; the persistent one stays.
    let status = Status::wait(&tracefs, "auto-deletion of the ephemeral event", |s| {
        s.line(&ephemeral_name).is_none()
    });
    assert_eq!(status.events_of(&prefix), [persistent_name.as_str()]);

    let del_ephemeral = parent.child_request(&format!("del {ephemeral_name}"));
    assert_eq!(outcome(&del_ephemeral), failed(libc::ENOENT), "already deleted: {del_ephemeral}");
    let del_persistent = parent.child_request(&format!("del {persistent_name}"));
    assert_eq!(outcome(&del_persistent), ok(), "unreferenced persistent event: {del_persistent}");
    audit.expect_ioctl(&del_ephemeral);
    audit.expect_ioctl(&del_persistent);
    assert_eq!(
        Status::read(&tracefs).events_of(&prefix),
        Vec::<&str>::new(),
        "DIAG_IOCSDEL deleted it"
    );

    let (lines, processes, _) = audit.stop();
    assert_eq!(processes, json!([]), "exec and exit left no registration");
    assert_eq!(
        kinds_of(&lines, parent.pid),
        [
            "user_events_register",
            "user_events_register",
            "user_events_delete",
            "user_events_delete",
            "process_fork",
            "process_exit"
        ]
    );
    assert_eq!(
        kinds_of(&lines, child),
        ["process_exec", "user_events_unregister", "user_events_delete", "user_events_delete"]
    );
    parent.child_send("exit");
}

/// 1 000 registrations as fast as a process can make them, with tracer not reading the ring
/// (the consumer paused): every one arrives — registrations are submitted without waking the
/// reader, so what carries them is the forced wake-up past the fill threshold and the drain
/// timer (docs/protocol/bpf-detection.md §6) — and nothing is lost.
fn a_burst_of_registrations_with_the_consumer_paused_loses_nothing(hooks: HookChoice) {
    use tests::detection::read_until;
    use tracer::kernel::detect::{DetectOptions, Detector};
    use tracer_decode::bpf_event::EventBody;
    const BURST: u64 = 1000;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let options = DetectOptions { hooks, ..DetectOptions::for_targets(&[]) };
        let mut detector = Detector::attach(&options).expect("attach");
        let mut helper = LineProcess::spawn("user_events_helper", Command::new(HELPER)).unwrap();
        let ready: Value = serde_json::from_str(&helper.next_line(TIMEOUT).unwrap()).unwrap();
        let pid = ready["pid"].as_u64().unwrap() as u32;
        let reply = helper.request(&format!("burst {BURST}"), "", TIMEOUT).unwrap();
        let reply: Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(reply["registered"], BURST, "{reply}");
        // The consumer stays paused a while longer after the burst: 10 ms, the case to survive.
        std::thread::sleep(Duration::from_millis(10));
        let registered = |events: &[tracer_decode::bpf_event::DetectionEvent]| {
            events
                .iter()
                .filter(|e| e.meta.pid == pid)
                .filter(|e| matches!(&e.body, EventBody::UserEvents(io) if io.cmd == tests::user_events::DIAG_IOCSREG && io.ret == 0))
                .count() as u64
        };
        let mut seen = Vec::new();
        read_until(&mut detector, &mut seen, TIMEOUT, |events| registered(events) == BURST).await;
        assert_eq!(registered(&seen), BURST);
        assert_eq!(detector.losses().expect("losses"), vec![], "nothing lost");
        helper.send_line("exit").unwrap();
        helper.wait_exit(TIMEOUT).unwrap();
    });
}
