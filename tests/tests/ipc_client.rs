//! tracer's IPC client against a real CoreCLR 8.0.4 runtime: socket resolution, version probe,
//! a CollectTracing2 GC session with StopTracing on a new connection, runtime still healthy.

use std::time::Duration;

use anyhow::{Context, Result};
use tests::coreclr::CoreclrHost;
use tests::nettrace::{gc_starts, induced};
use tests::procfs;
use tests::scratch::ScratchDir;
use tokio::io::AsyncReadExt;
use tracer::ipc::client::{ClientError, DiagnosticClient, RuntimeInfo, Timeouts};
use tracer::ipc::{providers, socket};
use tracer_decode::diagnostic_ipc::{
    CommandCode, ServerError, TracingRequest, oldest_collect_tracing,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_runtime_probe_and_gc_session() -> Result<()> {
    let dir = ScratchDir::new("ipc-real");
    let mut host = CoreclrHost::spawn(dir.path())?;
    assert_eq!(host.version, "8.0.4");

    let located = socket::locate(host.host_pid)?;
    assert_eq!(located.host_pid, host.host_pid);
    assert_eq!(located.ns_pid, host.host_pid);
    assert_eq!(located.dir, dir.path());
    assert_eq!(located.file_name, procfs::runtime_socket_name(host.host_pid)?);
    assert!(located.exact_key);
    let client = DiagnosticClient::new(located, Timeouts::default());

    let RuntimeInfo::Known { info, answered_by } = client.probe().await? else {
        panic!("8.0.4 answered no ProcessInfo command");
    };
    assert_eq!(answered_by, CommandCode::ProcessInfo3);
    assert_eq!(info.process_id, u64::from(host.host_pid));
    let exe = std::fs::read_link(format!("/proc/{}/exe", host.host_pid))?;
    // A hosted runtime (no managed Main) reports only the executable's full path.
    assert_eq!(info.command_line, exe.display().to_string());
    assert_eq!(info.os, "Linux");
    assert_eq!(info.arch, "x64");
    let version = info.clr_product_version.context("ProcessInfo3 without product version")?;
    assert!(version.starts_with("8.0.4"), "clrProductVersion {version:?}");
    assert_eq!(info.info_version, Some(1));
    assert_eq!(info.portable_rid.as_deref(), Some("linux-x64"));

    // Stack walking off needs CollectTracing3 (9.0+): 8.0.4 does not know it.
    let without_stacks = oldest_collect_tracing(&TracingRequest {
        circular_buffer_mb: 64,
        providers: providers::profile("gc")?,
        rundown_keyword: 0,
        request_stackwalk: false,
        buffering_mode: None,
    });
    assert_eq!(without_stacks.code(), CommandCode::CollectTracing3);
    match client.start_streaming_session(&without_stacks).await {
        Err(ClientError::Server { error: ServerError::UnknownCommand, command, .. }) => {
            assert_eq!(command, CommandCode::CollectTracing3);
        }
        other => panic!("expected UNKNOWN_COMMAND from 8.0.4, got {other:?}"),
    }

    // GC keyword at Informational, no rundown, stacks on: CollectTracing2 expresses it.
    let command = oldest_collect_tracing(&TracingRequest {
        circular_buffer_mb: 64,
        providers: providers::profile("gc")?,
        rundown_keyword: 0,
        request_stackwalk: true,
        buffering_mode: None,
    });
    assert_eq!(command.code(), CommandCode::CollectTracing2);
    let session = client.start_streaming_session(&command).await?;
    assert_ne!(session.session_id, 0);
    let mut stream = session.stream;
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.map(|_| all)
    });

    let gc_before = host.ping()?;
    assert_eq!(host.gc(3)?, gc_before + 3);
    client.stop_session(session.session_id).await?;
    let stream_bytes = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .context("nettrace stream did not end (EOF) within 30 s of StopTracing")???;
    // The whole stream decodes, to its end-of-stream tag, and holds exactly the induced GCs.
    assert_eq!(gc_starts(&stream_bytes)?, induced(gc_before, 3));

    // The runtime keeps running managed code and answers IPC after the session.
    assert_eq!(host.ping()?, gc_before + 3);
    assert!(matches!(client.probe().await?, RuntimeInfo::Known { .. }));
    Ok(())
}
