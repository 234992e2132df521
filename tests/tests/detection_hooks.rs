//! The choice of hook mechanism on this host's real kernel, which refuses `fentry`/`fexit`
//! loads with EPERM (kernel policy) and loads `tp_btf`: `--hooks auto` falls back to syscall
//! tracepoints and says why while the lifecycle hooks run on BTF tracepoints, `--hooks
//! trampolines` fails saying what to do, and `tracer check` reports the same probe. The
//! trampoline path itself runs in the VM (`tests/vm_detection.rs`).
use std::process::Command;

use tests::process::tracer_binary;
use tracer::kernel::detect::{
    DetectOptions, Detector, HookChoice, HookMechanism, LifecycleMechanism,
};

/// The kernel's answer to loading the first trampoline program.
const REFUSAL: &str = "BPF trampolines refused: loading fexit_memfd_create for a trampoline on \
                       __x64_sys_memfd_create: the kernel refused to load program \
                       fexit_memfd_create: Operation not permitted (os error 1)";

#[tokio::test(flavor = "current_thread")]
async fn auto_falls_back_to_syscall_tracepoints_and_says_why() {
    let mut detector = Detector::attach(&DetectOptions::for_targets(&[])).expect("attach");
    assert_eq!(
        detector.mechanism(),
        &HookMechanism::SyscallTracepoints { why: REFUSAL.to_string() }
    );
    assert_eq!(detector.lifecycle(), &LifecycleMechanism::BtfTracepoints);
    // No user_events here: no ioctl hook; kernel BTF: the memfd hooks.
    assert_eq!(
        detector.attached(),
        [
            "sys_enter_memfd_create",
            "sys_enter_mmap",
            "sys_enter_bind",
            "btf_task_newtask",
            "btf_sched_process_fork",
            "btf_sched_process_exec",
            // 6.18's sched_process_exit passes group_dead.
            "btf_sched_process_exit_group"
        ]
    );
    // Detached, the programs stay loaded: the summary still reads each one's statistics.
    detector.detach();
    let stats = detector.program_stats().expect("program statistics");
    let names: Vec<&str> = stats.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, detector.attached());
}

#[tokio::test(flavor = "current_thread")]
async fn syscall_tracepoints_can_be_chosen() {
    let options =
        DetectOptions { hooks: HookChoice::SyscallTracepoints, ..DetectOptions::for_targets(&[]) };
    let detector = Detector::attach(&options).expect("attach");
    let why = "chosen with --hooks syscall-tracepoints".to_string();
    assert_eq!(detector.mechanism(), &HookMechanism::SyscallTracepoints { why: why.clone() });
    assert_eq!(detector.lifecycle(), &LifecycleMechanism::Tracepoints { why });
    assert_eq!(
        detector.attached(),
        [
            "sys_enter_memfd_create",
            "sys_enter_mmap",
            "sys_enter_bind",
            "task_newtask",
            "sched_process_fork",
            "sched_process_exec",
            "sched_process_exit"
        ]
    );
}

#[test]
fn insisting_on_trampolines_fails_and_says_what_to_do() {
    let output = Command::new(tracer_binary())
        .args(["audit", "--hooks", "trampolines", "--duration", "1s"])
        .output()
        .expect("running tracer");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains(
            "--hooks trampolines: the kernel refused the BPF trampolines (--hooks auto falls \
             back to syscall tracepoints)"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("fexit_memfd_create: Operation not permitted"), "{stderr}");
    assert!(output.stdout.is_empty(), "nothing was attached, nothing reported");
}

#[test]
fn check_reports_the_mechanism_auto_would_use() {
    let output = Command::new(tracer_binary()).arg("check").output().expect("running tracer");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("detection hooks:"))
        .unwrap_or_else(|| panic!("no detection hooks finding in:\n{stdout}"));
    assert_eq!(
        line,
        format!(
            "MISSING (optional) detection hooks: syscall tracepoints (every syscall of every \
             process pays a few tens of ns): {REFUSAL}; detection works the same (a kernel with \
             BTF, BPF trampolines and CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS costs less)"
        )
    );
    // 6.18's exit tracepoint says which thread ends a process.
    let exits = stdout.lines().find(|l| l.contains("process exits:"));
    assert_eq!(
        exits,
        Some(
            "OK                 process exits: sched_process_exit says which thread's exit ends \
             its process (group_dead)"
        ),
        "{stdout}"
    );
    let lifecycle = stdout.lines().find(|l| l.contains("lifecycle hooks:"));
    assert_eq!(
        lifecycle,
        Some(
            "OK                 lifecycle hooks: BTF tracepoints (tp_btf): the kernel loaded and \
             attached the tp_btf programs"
        ),
        "{stdout}"
    );
}
