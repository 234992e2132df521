//! `tracer ps` against a mix of real and fake runtimes on the real host: CoreCLR 3.1.23 (no
//! ProcessInfo, no memfd), CoreCLR 8.0.4 with W^X on (`doublemapper`) and off (socket only), the
//! .NET 10 test double (`dotnet_ipc_created`), a CoreCLR 8 in its own pid + mount namespaces,
//! and a fake runtime whose socket name was planted by another user. Other tests run at the
//! same time: every assertion is about the processes this test started.
use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tests::coreclr::CoreclrHost;
use tests::double::Dotnet10Double;
use tests::peer::{HostilePeer, PeerOptions};
use tests::process::tracer_binary;
use tests::scratch::ScratchDir;
use tracer::ipc::client::Timeouts;
use tracer::output::DotnetProcess;
use tracer::pipeline::ps::{self, Listed, PsConfig};

const PEER: &str = env!("CARGO_BIN_EXE_hostile_peer");
const IPC: Duration = Duration::from_secs(5);

fn listed_with(ipc: Duration, deadline: Duration) -> Vec<Listed> {
    let config = PsConfig { timeouts: Timeouts { connect: ipc, write: ipc, read: ipc }, deadline };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(ps::list(&config)).expect("tracer ps")
}

fn listed() -> Vec<Listed> {
    listed_with(IPC, Duration::from_secs(60))
}

fn of(listed: &[Listed], pid: u32) -> &DotnetProcess {
    &listed.iter().find(|l| l.pid == pid).unwrap_or_else(|| panic!("pid {pid} not listed")).process
}

#[test]
fn ps_lists_every_runtime_with_its_version_sessions_and_socket() {
    let tmp = ScratchDir::new("ps");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let dir = tmp.path().to_str().unwrap().to_owned();
    // runtime_socket_name already uses the pid the runtime sees.
    let socket_of =
        |pid: u32, dir: &str| format!("{dir}/{}", tests::procfs::runtime_socket_name(pid).unwrap());
    let core31 =
        CoreclrHost::spawn_with(tmp.path(), &[("CORECLR_HOST_RUNTIME", "3.1")]).expect("3.1");
    assert_eq!(core31.version, "3.1.23");
    let core8 = CoreclrHost::spawn(tmp.path()).expect("CoreCLR 8");
    let core8_wx_off =
        CoreclrHost::spawn_with(tmp.path(), &[("DOTNET_EnableWriteXorExecute", "0")]).expect("8");
    let double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let contained = CoreclrHost::spawn_in_namespaces("/tmp/app-tmp", true).expect("namespaced");
    // A fake runtime (mapping only) and a name for its pid planted by nobody.
    let waiting = PeerOptions { ipc_memfd: true, wait: true, ..PeerOptions::default() };
    let fake = HostilePeer::spawn_opts(PEER, tmp.path(), &["garbage"], waiting).expect("fake");
    let nobody = PeerOptions { as_nobody: true, ..PeerOptions::default() };
    let planted =
        HostilePeer::spawn_opts(PEER, tmp.path(), &["plant", &fake.pid().to_string(), "7"], nobody)
            .expect("planted name");

    let listed = listed();

    let p = of(&listed, core31.host_pid);
    assert_eq!(p.runtime_version.as_deref(), Some("3.1.23"));
    assert_eq!(p.version_from, Some("libcoreclr_path"), "3.1 answers no ProcessInfo");
    assert_eq!((p.found_by.clone(), p.sessions.clone()), (vec!["socket"], vec!["streaming"]));
    assert_eq!(p.socket, Some(socket_of(core31.host_pid, &dir)));
    assert!(p.command_line.as_deref().is_some_and(|c| c.contains("coreclr_host.py")), "{p:?}");
    assert_eq!(p.error, None);

    for (host, found_by) in
        [(&core8, vec!["doublemapper", "socket"]), (&core8_wx_off, vec!["socket"])]
    {
        let p = of(&listed, host.host_pid);
        assert!(p.runtime_version.as_deref().is_some_and(|v| v.starts_with("8.0.4")), "{p:?}");
        assert_eq!(p.version_from, Some("process_info"));
        assert_eq!(p.found_by, found_by);
        assert_eq!(p.sessions, vec!["streaming"]);
        assert_eq!(p.socket, Some(socket_of(host.host_pid, &dir)));
        assert!(p.command_line.as_deref().is_some_and(|c| c.contains("python3")), "{p:?}");
    }

    let p = of(&listed, double.pid());
    assert_eq!(p.runtime_version.as_deref(), Some("10.0.0+test-double"));
    assert_eq!(p.found_by, vec!["dotnet_ipc_created", "socket"]);
    // This host's kernel has no user_events, and the double is not .NET 11.
    assert_eq!(p.sessions, vec!["streaming"]);
    assert_eq!(p.socket.as_deref(), Some(double.socket.as_str()));

    // Its socket is inside its mount namespace, under the pid its namespace gives it.
    let p = of(&listed, contained.host_pid);
    assert_eq!(p.found_by, vec!["doublemapper", "socket"]);
    assert_eq!(p.sessions, vec!["streaming"]);
    assert_eq!(
        p.socket,
        Some(socket_of(contained.host_pid, "/tmp/app-tmp")),
        "the path as the runtime sees it"
    );

    // The planted name is refused, not asked.
    let p = of(&listed, fake.pid());
    assert_eq!(p.found_by, vec!["dotnet_ipc_created"]);
    assert_eq!((p.socket.clone(), p.sessions.clone()), (None, Vec::<&str>::new()));
    let error = p.error.as_deref().unwrap_or_default();
    assert!(
        error.contains(planted.path.to_str().unwrap()) && error.contains("owned by uid 65534"),
        "{error}"
    );
    drop((fake, planted));

    // The binary: JSON lines when stdout is not a terminal, then the summary.
    let out = Command::new(tracer_binary()).arg("ps").output().expect("tracer ps");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let line = lines
        .iter()
        .find(|l| l["kind"] == "dotnet_process" && l["pid"] == core8.host_pid)
        .expect("the CoreCLR 8 line");
    assert_eq!(line["source"], "procfs");
    assert_eq!(line["sessions"], serde_json::json!(["streaming"]));
    let last = lines.last().unwrap();
    assert_eq!((last["kind"].as_str(), last["command"].as_str()), (Some("summary"), Some("ps")));
    assert_eq!(last["events"], lines.len() - 1);
    // ProcessInfo only: the runtimes still run managed code, with no session started.
    for mut host in [core31, core8, core8_wx_off, contained] {
        host.ping().expect("runtime healthy");
    }
    drop(double);
}

/// Fake runtimes that accept and never answer cannot hold `tracer ps` past its `--timeout`:
/// each is listed with that reason (not after its own 30 s exchange limit), and a runtime asked
/// at the same time is listed with its answer.
#[test]
fn silent_fakes_are_listed_at_the_deadline() {
    const FAKES: usize = 10;
    let tmp = ScratchDir::new("ps-silent");
    let fakes: Vec<HostilePeer> = (0..FAKES)
        .map(|_| HostilePeer::spawn_with(PEER, tmp.path(), &["silent"], true).expect("fake"))
        .collect();
    let double = Dotnet10Double::spawn(tmp.path()).expect("double");
    let listed = listed_with(Duration::from_secs(30), Duration::from_secs(2));
    for fake in &fakes {
        let p = of(&listed, fake.pid());
        assert_eq!(p.error.as_deref(), Some("no answer within the listing's 2 s (--timeout)"));
        assert_eq!((p.socket.clone(), p.sessions.clone()), (None, Vec::<&str>::new()));
    }
    let p = of(&listed, double.pid());
    assert_eq!(p.runtime_version.as_deref(), Some("10.0.0+test-double"));
    assert_eq!(p.error, None);
}
