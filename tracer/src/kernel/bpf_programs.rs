//! Loading and attaching tracer's BPF programs, for every part that has some (the detection
//! programs, the sampler): classic tracepoints once their tracepoints are known to exist,
//! BTF-typed programs (trampolines, `tp_btf`) against a stand-in for the kernel's BTF, each set
//! whole or not at all, the links that hold them attached, the verifier's verdict when the
//! kernel refuses one, the programs' run statistics, and the tracepoint field offsets the
//! programs are told.
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use anyhow::{Context as _, anyhow, bail};
use aya::Ebpf;
use aya::programs::{
    BtfTracePoint, FExit, ProgramError, TracePoint, fexit::FExitLink, perf_event::PerfEventLink,
    tp_btf::BtfTracePointLink, trace_point::TracePointLink,
};
use tracer_decode::ftrace::format::{DynamicKind, EventFormat};

use crate::kernel::btf::{AttachTarget, attach_btf};
use crate::kernel::tracefs::Tracefs;

/// Lines of the verifier log shown when the kernel rejects a program (the reason is at the end).
const VERIFIER_LOG_TAIL: usize = 30;

/// An attached program, held for its `Drop`, which detaches it (the sampler's too).
pub(crate) enum Link {
    Tracepoint { _link: TracePointLink },
    Trampoline { _link: FExitLink },
    BtfTracepoint { _link: BtfTracePointLink },
    PerfEvent { _link: PerfEventLink },
}

/// Run statistics of one program (`bpf_prog_info`); run time and count need
/// `kernel.bpf_stats_enabled`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramStats {
    pub run_time_ns: u64,
    pub run_cnt: u64,
    /// Invocations the kernel skipped because another BPF program was running on the CPU.
    pub recursion_misses: u64,
}

pub(crate) fn loaded_program_stats(
    ebpf: &Ebpf,
    names: &[&'static str],
) -> anyhow::Result<Vec<(&'static str, ProgramStats)>> {
    let mut out = Vec::with_capacity(names.len());
    for &prog_name in names {
        let program = ebpf.program(prog_name).ok_or_else(|| anyhow!("no {prog_name}"))?;
        let fd = program.fd().with_context(|| format!("{prog_name} is not loaded"))?;
        let stats = program_stats(fd.as_fd())
            .with_context(|| format!("BPF_OBJ_GET_INFO_BY_FD for {prog_name}"))?;
        out.push((prog_name, stats));
    }
    Ok(out)
}

/// Attaches classic tracepoint programs, each (program, category, tracepoint), once every one
/// of those tracepoints is known to exist (a missing one fails, with `why` they are needed).
pub(crate) fn attach_classic(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    programs: Vec<(&'static str, &'static str, &'static str)>,
    why: impl FnOnce() -> String,
) -> anyhow::Result<Vec<(&'static str, Link)>> {
    require_tracepoints(tracefs, programs.iter().map(|&(_, category, name)| (category, name)))
        .with_context(why)?;
    let mut links = Vec::with_capacity(programs.len());
    for (program, category, name) in programs {
        links.push((program, attach_tracepoint(ebpf, program, category, name)?));
    }
    Ok(links)
}

/// The kinds of BTF-typed program tracer attaches: loaded against a kernel function or
/// tracepoint found by name in kernel BTF, attached with no further argument.
pub(crate) trait BtfTypedProgram {
    fn load_against(&mut self, target: &str, btf: &aya::Btf) -> Result<(), ProgramError>;
    fn attach_link(&mut self) -> anyhow::Result<Link>;
}

impl BtfTypedProgram for FExit {
    fn load_against(&mut self, function: &str, btf: &aya::Btf) -> Result<(), ProgramError> {
        self.load(function, btf)
    }

    fn attach_link(&mut self) -> anyhow::Result<Link> {
        let id = self.attach()?;
        Ok(Link::Trampoline { _link: self.take_link(id).context("taking the link")? })
    }
}

impl BtfTypedProgram for BtfTracePoint {
    fn load_against(&mut self, tracepoint: &str, btf: &aya::Btf) -> Result<(), ProgramError> {
        self.load(tracepoint, btf)
    }

    fn attach_link(&mut self) -> anyhow::Result<Link> {
        let id = self.attach()?;
        Ok(Link::BtfTracepoint { _link: self.take_link(id).context("taking the link")? })
    }
}

/// Loads and attaches each (program, target) as a `P`; on the first refusal the ones attached
/// so far are detached (dropped) and the error names the program and its target (`what`
/// describes the target in messages).
pub(crate) fn attach_btf_typed<P: BtfTypedProgram>(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    programs: impl Iterator<Item = (&'static str, &'static str)>,
    what: &str,
) -> anyhow::Result<Vec<(&'static str, Link)>>
where
    for<'a> &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let mut links = Vec::new();
    for (prog_name, target) in programs {
        let program: &mut P = ebpf
            .program_mut(prog_name)
            .ok_or_else(|| anyhow!("the BPF object has no program {prog_name}"))?
            .try_into()?;
        program
            .load_against(target, btf)
            .map_err(|e| load_error(prog_name, e))
            .with_context(|| format!("loading {prog_name} for {what} {target}"))?;
        let link = program
            .attach_link()
            .with_context(|| format!("attaching {prog_name} to {what} {target}"))?;
        links.push((prog_name, link));
    }
    Ok(links)
}

/// Runs `f` with a stand-in for the kernel's BTF holding `targets` (loading a BTF-typed
/// program needs its target's type id: `crate::kernel::btf::attach_btf`), then frees it and
/// hands the freed heap back to the kernel, so tracer's resident memory does not keep it.
pub(crate) fn with_kernel_btf<T>(
    what: &str,
    targets: &[AttachTarget],
    f: impl FnOnce(&aya::Btf) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let result = match attach_btf(targets) {
        Ok(btf) => f(&btf),
        Err(e) => Err(e.context(format!("reading kernel BTF for {what}"))),
    };
    crate::kernel::release_free_heap();
    result
}

fn attach_tracepoint(
    ebpf: &mut Ebpf,
    prog_name: &'static str,
    category: &str,
    name: &str,
) -> anyhow::Result<Link> {
    let program: &mut TracePoint = ebpf
        .program_mut(prog_name)
        .ok_or_else(|| anyhow!("the BPF object has no program {prog_name}"))?
        .try_into()?;
    program.load().map_err(|e| load_error(prog_name, e))?;
    let id = program.attach(category, name).with_context(|| {
        format!("attaching program {prog_name} to tracepoint {category}:{name}")
    })?;
    Ok(Link::Tracepoint { _link: program.take_link(id).context("taking the link")? })
}

pub(crate) fn map_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> anyhow::Result<&'a mut aya::maps::Map> {
    ebpf.map_mut(name).ok_or_else(|| anyhow!("the BPF object has no map {name}"))
}

/// Fails naming the first of `tracepoints` this kernel lacks, and what to do.
fn require_tracepoints<'a>(
    tracefs: &Tracefs,
    tracepoints: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> anyhow::Result<()> {
    for (category, name) in tracepoints {
        let dir = tracefs.event_dir(category, name);
        if !dir.is_dir() {
            bail!(
                "tracepoint {category}:{name} is missing from this kernel ({} does not exist): {}",
                dir.display(),
                missing_tracepoint_hint(category)
            );
        }
    }
    Ok(())
}

fn missing_tracepoint_hint(category: &str) -> &'static str {
    match category {
        "syscalls" => "per-syscall tracepoints need a kernel built with CONFIG_FTRACE_SYSCALLS=y",
        _ => "scheduler/task tracepoints need CONFIG_TRACEPOINTS=y and a readable tracefs",
    }
}

/// Turns a load failure into an error that shows the verifier's verdict.
pub(crate) fn load_error(prog_name: &str, err: ProgramError) -> anyhow::Error {
    match err {
        ProgramError::LoadError { io_error, verifier_log } => {
            let log = verifier_log.to_string();
            if log.trim().is_empty() {
                // Refused before verification (e.g. EPERM from kernel policy).
                return anyhow!("the kernel refused to load program {prog_name}: {io_error}");
            }
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(VERIFIER_LOG_TAIL)..].join("\n");
            anyhow!(
                "the kernel's BPF verifier rejected program {prog_name} ({io_error}); \
                 last lines of the verifier log:\n{tail}"
            )
        }
        other => anyhow::Error::new(other).context(format!("loading BPF program {prog_name}")),
    }
}

/// Offset of `field` in `format`, which must have `size` bytes and lie within the record.
pub fn field_offset(
    format: &EventFormat,
    field: &str,
    size: usize,
    dynamic: Option<DynamicKind>,
) -> anyhow::Result<u32> {
    let event = &format.name;
    let f = format
        .field(field)
        .ok_or_else(|| anyhow!("tracepoint {event} has no field {field}: unsupported kernel"))?;
    if f.size != size || f.dynamic != dynamic {
        bail!(
            "tracepoint {event} field {field} is {} ({} bytes), expected {size} bytes{}: \
             unsupported kernel",
            f.type_name,
            f.size,
            if dynamic.is_some() { " of __data_loc" } else { "" }
        );
    }
    if f.end() > format.fixed_size() || f.end() > u16::MAX as usize {
        bail!("tracepoint {event} field {field} at {}+{} is outside the record", f.offset, f.size);
    }
    Ok(f.offset as u32)
}

/// `BPF_OBJ_GET_INFO_BY_FD` for a program (aya 0.14 does not expose `recursion_misses`).
fn program_stats(fd: BorrowedFd<'_>) -> io::Result<ProgramStats> {
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    // SAFETY: bpf_prog_info is plain data; all-zero is its valid "nothing requested" state.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: &mut info as *mut _ as u64,
    };
    // SAFETY: attr points to a valid struct of the size passed; the kernel writes at most
    // info_len bytes into `info`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ProgramStats {
        run_time_ns: info.run_time_ns,
        run_cnt: info.run_cnt,
        recursion_misses: info.recursion_misses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_offsets_are_checked() {
        let text = "name: sched_process_exec\nID: 1\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \n\
            \tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n\
            \tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;\n\
            \tfield:pid_t old_pid;\toffset:16;\tsize:4;\tsigned:1;\n\
            \nprint fmt: \"x\"\n";
        let f = EventFormat::parse(text).unwrap();
        assert_eq!(field_offset(&f, "old_pid", 4, None).unwrap(), 16);
        assert_eq!(field_offset(&f, "filename", 4, Some(DynamicKind::DataLoc)).unwrap(), 8);
        let e = field_offset(&f, "filename", 4, None).unwrap_err().to_string();
        assert!(e.contains("unsupported kernel"), "{e}");
        let e = field_offset(&f, "old_pid", 8, None).unwrap_err().to_string();
        assert!(e.contains("expected 8 bytes"), "{e}");
        let e = field_offset(&f, "child_pid", 4, None).unwrap_err().to_string();
        assert!(e.contains("has no field child_pid"), "{e}");
    }
}
