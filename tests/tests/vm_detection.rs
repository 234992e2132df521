//! The detection scenarios of `tests/audit.rs` in the VM, whose kernel has BTF and BPF
//! trampolines (`xtask/vm/kernel.config`): each runs once with the trampoline programs and once
//! with the syscall tracepoints, insisting on the mechanism (`--hooks trampolines` fails when
//! the kernel refuses it), and both must report exactly the same.
//! Runs inside the VM (`cargo xtask vm-test --test vm_detection`).
use tests::audit_scenarios::*;
use tracer::kernel::detect::{DetectOptions, Detector, HookMechanism, LifecycleMechanism};

tests::test_with_both_mechanisms! {
    helper_sequence_is_reported_exactly;
    refused_mapping_is_reported_without_an_address;
    fixed_mapping_is_reported_at_its_address;
    process_exit_comes_with_the_last_thread_not_the_leader;
    diagnostic_socket_binds_are_matched_in_the_kernel_once_per_process;
    coreclr_runtime_is_seen_live;
    // 40 children in all: TCG forks slowly.
    concurrent_runs_on_one_cpu_get_distinct_sequence_numbers(10);
}

/// `auto` takes the trampolines here, for every hook this kernel has (user_events included),
/// and the BTF tracepoints for the lifecycle: it attaches no classic tracepoint.
#[tokio::test(flavor = "current_thread")]
async fn auto_uses_trampolines_for_every_syscall_hook() {
    let detector = Detector::attach(&DetectOptions::for_targets(&[])).expect("attach");
    assert_eq!(detector.mechanism(), &HookMechanism::Trampolines);
    assert_eq!(detector.lifecycle(), &LifecycleMechanism::BtfTracepoints);
    assert_eq!(
        detector.attached(),
        [
            "fexit_memfd_create",
            "fexit_mmap",
            "fexit_bind",
            "fexit_ioctl",
            "btf_task_newtask",
            "btf_sched_process_fork",
            "btf_sched_process_exec",
            // 6.12's sched_process_exit passes no group_dead.
            "btf_sched_process_exit"
        ]
    );
}

/// 6.12's exit tracepoint has no `group_dead`: `tracer check` says the thread group's live count
/// tells which exit ends a process (what the exit scenarios above check in the kernel).
#[test]
fn check_says_the_live_count_tells_which_exit_ends_a_process() {
    let output = std::process::Command::new(tests::process::tracer_binary())
        .arg("check")
        .output()
        .expect("running tracer check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().find(|l| l.contains("process exits:"));
    assert_eq!(
        line,
        Some(
            "OK                 process exits: sched_process_exit has no group_dead: the exit \
             that leaves no live thread ends the process (signal_struct.live, at its offset from \
             kernel BTF)"
        ),
        "{stdout}"
    );
}
