//! Which capabilities this process has, and a clear error naming the ones it lacks.
use std::fs;

use anyhow::Context as _;
use thiserror::Error;

/// What loading and attaching BPF programs needs of this process, checked before trying so the
/// error says what to do: CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN), and no seccomp filter
/// in front of `bpf` (a container runtime's default profile may refuse it whatever the
/// capabilities; the kernel's own refusal would look the same).
pub fn require_bpf_tracing() -> anyhow::Result<()> {
    Capabilities::current()
        .context("reading this process's capabilities from /proc/self/status")?
        .check_bpf_tracing()?;
    let bpf = super::bpf_probe::bpf_reach();
    if !bpf.reached_kernel() {
        anyhow::bail!(
            "a seccomp filter refuses bpf() ({}, where the kernel answers {}): tracer cannot load \
             its programs; run it with tracer's seccomp profile (`tracer check` says how)",
            bpf.answer,
            std::io::Error::from_raw_os_error(bpf.kernel_answer)
        );
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    DacOverride = 1,
    SysPtrace = 19,
    SysAdmin = 21,
    Syslog = 34,
    Perfmon = 38,
    Bpf = 39,
}

impl Capability {
    pub fn name(self) -> &'static str {
        match self {
            Capability::DacOverride => "CAP_DAC_OVERRIDE",
            Capability::SysPtrace => "CAP_SYS_PTRACE",
            Capability::SysAdmin => "CAP_SYS_ADMIN",
            Capability::Syslog => "CAP_SYSLOG",
            Capability::Perfmon => "CAP_PERFMON",
            Capability::Bpf => "CAP_BPF",
        }
    }

    /// The name without `CAP_`, as Kubernetes' `capabilities.add` lists it.
    pub fn short_name(self) -> &'static str {
        &self.name()["CAP_".len()..]
    }
}

/// The effective and bounding capability sets of this process.
#[derive(Clone, Copy, Debug)]
pub struct Capabilities {
    effective: u64,
    /// What the process could ever gain; a container runtime drops what it does not grant.
    bounding: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "insufficient privileges: loading BPF programs and attaching tracepoints needs root, or {} \
     (missing: {}); run tracer with sudo",
    "CAP_BPF and CAP_PERFMON",
    missing.join(", ")
)]
pub struct MissingPrivileges {
    pub missing: Vec<&'static str>,
}

impl Capabilities {
    pub fn current() -> std::io::Result<Capabilities> {
        let status = fs::read_to_string("/proc/self/status")?;
        Ok(Capabilities::from_status(&status)
            .unwrap_or(Capabilities { effective: 0, bounding: u64::MAX }))
    }

    /// Parses the `CapEff:` and `CapBnd:` lines of a `/proc/<pid>/status` text (a kernel without
    /// `CapBnd:` bounds nothing).
    pub fn from_status(status: &str) -> Option<Capabilities> {
        let effective = tracer_decode::procfs::parse_status_cap_eff(status)?;
        let bounding = tracer_decode::procfs::parse_status_cap_bnd(status).unwrap_or(u64::MAX);
        Some(Capabilities { effective, bounding })
    }

    /// `cap` is in the effective set.
    pub fn has(&self, cap: Capability) -> bool {
        self.effective & (1u64 << cap as u32) != 0
    }

    /// `cap` is in the bounding set: the process could have it (as root, or after exec with it
    /// granted); a container runtime that does not grant it drops it from this set.
    pub fn bounds(&self, cap: Capability) -> bool {
        self.bounding & (1u64 << cap as u32) != 0
    }

    /// BPF tracing needs CAP_BPF + CAP_PERFMON (5.8+), or CAP_SYS_ADMIN which implies both.
    pub fn check_bpf_tracing(&self) -> Result<(), MissingPrivileges> {
        if self.has(Capability::SysAdmin) {
            return Ok(());
        }
        let missing: Vec<&'static str> = [Capability::Bpf, Capability::Perfmon]
            .into_iter()
            .filter(|c| !self.has(*c))
            .map(Capability::name)
            .collect();
        if missing.is_empty() { Ok(()) } else { Err(MissingPrivileges { missing }) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_partial_capability_sets() {
        let root = Capabilities::from_status("Name:\tx\nCapEff:\t000001ffffffffff\n").unwrap();
        assert!(root.check_bpf_tracing().is_ok());
        let bpf_only =
            Capabilities::from_status(&format!("CapEff:\t{:016x}\n", 1u64 << 39)).unwrap();
        let err = bpf_only.check_bpf_tracing().unwrap_err();
        assert_eq!(err.missing, vec!["CAP_PERFMON"]);
        assert!(err.to_string().contains("missing: CAP_PERFMON"), "{err}");
        let none = Capabilities::from_status("CapEff:\t0000000000000000\n").unwrap();
        assert_eq!(none.check_bpf_tracing().unwrap_err().missing, vec!["CAP_BPF", "CAP_PERFMON"]);
        assert!(Capabilities::from_status("Name: x\n").is_none());
    }

    #[test]
    fn bounding_set_and_names() {
        // A container granted CAP_BPF only: the other capabilities are outside its bounds.
        let bpf = 1u64 << 39;
        let caps =
            Capabilities::from_status(&format!("CapEff:\t{bpf:016x}\nCapBnd:\t{bpf:016x}\n"))
                .unwrap();
        assert!(caps.has(Capability::Bpf) && caps.bounds(Capability::Bpf));
        assert!(!caps.bounds(Capability::Perfmon));
        // Without a CapBnd line, nothing is said to be out of bounds.
        let caps = Capabilities::from_status("CapEff:\t0000000000000000\n").unwrap();
        assert!(caps.bounds(Capability::Syslog) && !caps.has(Capability::Syslog));
        assert_eq!(Capability::DacOverride.short_name(), "DAC_OVERRIDE");
        assert_eq!(Capability::Syslog.name(), "CAP_SYSLOG");
    }
}
