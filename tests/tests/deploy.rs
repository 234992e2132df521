//! The deployment files are tested, not just written: the Kubernetes manifests validate offline
//! against a pinned Kubernetes version (PyPI `kubernetes-validate`, strict: no unknown fields),
//! the systemd units pass `systemd-analyze verify` with the built binary in their ExecStart, and
//! the DaemonSet's arguments are ones `tracer` accepts.
use std::path::{Path, PathBuf};
use std::process::Command;

use tests::process::tracer_binary;
use tests::scratch::ScratchDir;

/// The Kubernetes version the manifests are validated against.
const KUBERNETES_VERSION: &str = "1.33.0";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn run(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

#[test]
fn kubernetes_manifests_validate() {
    let dir = deploy_dir().join("kubernetes");
    let out = run(Command::new("kubernetes-validate")
        .args(["-k", KUBERNETES_VERSION, "--strict"])
        .arg(dir.join("daemonset.yaml"))
        .arg(dir.join("otel-collector.yaml"))
        .arg(dir.join("profiles.yaml")));
    for resource in [
        "namespace/tracer",
        "daemonset/tracer",
        "configmap/otel-collector-config",
        "configmap/parca-config",
        "configmap/alloy-profiles-config",
    ] {
        assert!(
            out.contains(&format!("passed for resource {resource} against version 1.33")),
            "{out}"
        );
    }
}

#[test]
fn daemonset_arguments_are_accepted_by_tracer() {
    let text = std::fs::read_to_string(deploy_dir().join("kubernetes/daemonset.yaml")).unwrap();
    let args: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim() != "args:")
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .take_while(|l| l.starts_with("- "))
        .map(|l| &l[2..])
        .collect();
    assert_eq!(args[0], "run", "{args:?}");
    assert!(args.iter().any(|a| a.starts_with("--metrics-addr=")), "{args:?}");
    assert!(args.contains(&"--profile=counters"), "the agent serves runtime counters: {args:?}");
    assert!(text.contains("fieldPath: spec.nodeName"));
    assert!(text.contains("path: /healthz"));
    // tracer knows these flags and values (clap rejects unknown ones before it reaches --help).
    let help = run(Command::new(tracer_binary()).args(&args).arg("--help"));
    assert!(help.contains("--require-env"), "{help}");
}

#[test]
fn systemd_units_verify() {
    let scratch = ScratchDir::new("systemd-units");
    let binary = tracer_binary();
    for unit in ["tracer-audit.service", "tracer-run.service"] {
        let text = std::fs::read_to_string(deploy_dir().join("systemd").join(unit)).unwrap();
        assert!(text.contains("ExecStart=/usr/local/bin/tracer "), "{unit}");
        // `systemctl reload` is log rotation: tracer reopens its output on SIGHUP.
        assert!(text.contains("\nExecReload=/bin/kill -HUP $MAINPID\n"), "{unit}");
        // The unit as installed, with the binary where this build put it.
        let installed = text.replace("/usr/local/bin/tracer", &binary.display().to_string());
        std::fs::write(scratch.path().join(unit), installed).unwrap();
    }
    let out = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(scratch.path().join("tracer-audit.service"))
        .arg(scratch.path().join("tracer-run.service"))
        .env("SYSTEMD_LOG_LEVEL", "notice"));
    assert_eq!(out, "", "systemd-analyze verify warned");
}
