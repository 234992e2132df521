//! A real runtime in its own pid and mount namespaces (private tmpfs `/tmp`, its own `TMPDIR`)
//! is found and talked to from the host: NSpid's innermost pid in the name, the directory
//! resolved inside `/proc/<pid>/root`.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use tests::coreclr::CoreclrHost;
use tests::nettrace::{gc_starts, induced};
use tokio::io::AsyncReadExt;
use tracer::ipc::client::{DiagnosticClient, RuntimeInfo, Timeouts};
use tracer::ipc::{providers, socket};
use tracer_decode::diagnostic_ipc::{TracingRequest, oldest_collect_tracing};

const INNER_TMPDIR: &str = "/tmp/tracer-container-tmp";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_in_namespaces_with_its_own_proc_is_found_by_exact_key() -> Result<()> {
    let mut host = CoreclrHost::spawn_in_namespaces(INNER_TMPDIR, true)?;
    assert_ne!(host.host_pid, host.ns_pid);
    let located = socket::locate(host.host_pid)?;
    assert_eq!(located.ns_pid, host.ns_pid);
    assert_eq!(located.dir, Path::new(INNER_TMPDIR));
    assert!(located.exact_key, "key from the host's view of the start time must match");
    let client = DiagnosticClient::new(located, Timeouts::default());
    let RuntimeInfo::Known { info, .. } = client.probe().await? else {
        panic!("8.0.4 answered no ProcessInfo command");
    };
    assert_eq!(info.process_id, u64::from(host.ns_pid));
    host.ping()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_in_pid_and_mount_namespaces_is_found_from_the_host() -> Result<()> {
    let mut host = CoreclrHost::spawn_in_namespaces(INNER_TMPDIR, false)?;
    assert_ne!(host.host_pid, host.ns_pid, "the runtime must run in its own pid namespace");

    let located = socket::locate(host.host_pid)?;
    assert_eq!(located.ns_pid, host.ns_pid);
    assert_eq!(located.dir, Path::new(INNER_TMPDIR));
    assert!(located.file_name.starts_with(&format!("dotnet-diagnostic-{}-", host.ns_pid)));
    // The socket exists only in the namespace's private /tmp, and it is the one we picked.
    let inside = format!("/proc/{}/root{INNER_TMPDIR}", host.host_pid);
    let names: Vec<String> = std::fs::read_dir(&inside)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| name.as_ref().map_or(true, |n| n.starts_with("dotnet-diagnostic-")))
        .collect::<Result<_, _>>()?;
    assert_eq!(names, std::slice::from_ref(&located.file_name));
    // Without its own /proc mount the runtime reads the key from /proc/<nspid>/stat of the host's
    // proc (another process), so the name's key is not the target's start time and only the
    // newest-mtime fallback finds it.
    assert!(!located.exact_key);
    assert!(!Path::new(INNER_TMPDIR).join(&located.file_name).exists());

    let client = DiagnosticClient::new(located, Timeouts::default());
    let RuntimeInfo::Known { info, .. } = client.probe().await? else {
        panic!("8.0.4 answered no ProcessInfo command");
    };
    assert_eq!(info.process_id, u64::from(host.ns_pid));
    assert!(info.clr_product_version.unwrap_or_default().starts_with("8.0.4"));

    let command = oldest_collect_tracing(&TracingRequest {
        circular_buffer_mb: 16,
        providers: providers::profile("gc")?,
        rundown_keyword: 0,
        request_stackwalk: true,
        buffering_mode: None,
    });
    let session = client.start_streaming_session(&command).await?;
    let mut stream = session.stream;
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.map(|_| all)
    });
    let gc_before = host.ping()?;
    assert_eq!(host.gc(1)?, gc_before + 1);
    client.stop_session(session.session_id).await?;
    let bytes = tokio::time::timeout(Duration::from_secs(30), reader).await???;
    assert_eq!(gc_starts(&bytes)?, induced(gc_before, 1));
    assert_eq!(host.ping()?, gc_before + 1);
    Ok(())
}
