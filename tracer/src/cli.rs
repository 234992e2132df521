//! The command line: every subcommand's arguments (clap stays in this layer), their conversion
//! into pipeline configurations, and the one way a subcommand runs (runtime, signals, errors,
//! exit status).
use std::future::Future;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tracer_decode::diagnostic_ipc::{DEFAULT_RUNDOWN_KEYWORD, TracingRequest};

use crate::identity::ProcessFilter;
use crate::ipc::client::Timeouts;
use crate::ipc::providers::{
    DEFAULT_METER_REFRESH_SECS, DEFAULT_METERS, MeterRequest, PROFILE_NAMES, parse_providers,
    profiles, profiles_rundown_keyword, provider_key,
};
use crate::kernel::detect::HookChoice;
use crate::kernel::ftrace_reader::{Integrity, ReadMode};
use tracer_decode::diagnostic_ipc::{EventLevel, FilteredProvider, ProviderConfig};
use tracer_decode::logging::{JSON_MESSAGE_KEYWORD, LOGGING_PROVIDER};
use tracer_decode::text::escape_control;

use crate::export::otlp::OtlpConfig;
use crate::kernel::tracefs::{EventSpec, Tracefs, remove_stale_instances};
use crate::metrics::{Publisher, Shared};
use crate::output::{JsonLines, ReopenRequest};
use crate::pipeline::admission::AdmissionLimits;
use crate::pipeline::{audit, check, convert, ftrace, profile, run, top};
use crate::session::{SessionConfig, SessionMode};

/// Linux observability for .NET diagnostics and user_events, from the kernel up.
///
/// tracer detects, inside the kernel (eBPF on syscall tracepoints), .NET processes whose
/// diagnostic IPC is ready and processes registering Linux user_events; it starts .NET tracing
/// sessions and reads kernel trace data from the ftrace ring buffer (whole sub-buffers, or
/// memory-mapped).
/// Needs root (or CAP_BPF + CAP_PERFMON + tracefs access); `tracer check` tells what is missing.
#[derive(Parser)]
#[command(name = "tracer", version, propagate_version = true)]
pub struct Cli {
    /// Log verbosity for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "info", env = "TRACER_LOG")]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
// Parsed once per process: the size of `RunArgs` costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    Audit(AuditArgs),
    Run(RunArgs),
    Profile(ProfileArgs),
    Convert(ConvertArgs),
    Ftrace(FtraceArgs),
    Ps(PsArgs),
    Top(TopArgs),
    Check(CheckArgs),
}

/// Exit status when the output stopped taking lines (`EPIPE`, `ENOSPC`): every session was
/// stopped and the summary printed, but the output is incomplete.
pub const EXIT_OUTPUT_FAILED: u8 = 3;
/// Exit status after a second SIGINT/SIGTERM forced a prompt exit (128 + SIGINT, as shells do).
pub const EXIT_FORCED: i32 = 130;

/// How a pipeline ended, for the exit status.
pub struct Ended {
    /// The output failed before the end (the summary says why).
    pub output_failed: bool,
}

impl Command {
    /// Runs the subcommand to its end; errors are printed as `tracer <name>: error: ...`.
    pub fn execute(self) -> ExitCode {
        // Converting a file touches nothing of the machine's tracing state.
        if !matches!(self, Command::Convert(_))
            && let Ok(tracefs) = Tracefs::find_or_mount()
        {
            // Instances left by a tracer that was killed (SIGKILL, OOM) go at any start.
            remove_stale_instances(&tracefs);
        }
        match self {
            Command::Audit(args) => {
                run_pipeline("audit", args.duration, args.output.clone(), |sink, stop| async move {
                    let config = audit::AuditConfig {
                        target_pids: args.pids,
                        hooks: args.hooks.hooks,
                        registrations: args.registrations,
                        filter: args.filter.filter()?,
                        metrics: args.metrics.start(&sink).await?,
                        otlp: args.otlp.config()?,
                    };
                    let summary = audit::run(config, sink, stop, None).await?;
                    eprint!("{summary}");
                    Ok(Ended { output_failed: summary.output_error.is_some() })
                })
            }
            Command::Run(args) => {
                run_pipeline("run", args.duration, args.output.clone(), |sink, stop| async move {
                    let mut config = run_config(&args)?;
                    config.metrics = args.metrics.start(&sink).await?;
                    let summary = run::run(config, sink, stop, None).await?;
                    summary.print();
                    Ok(Ended { output_failed: summary.output_error.is_some() })
                })
            }
            Command::Profile(args) => {
                run_pipeline("profile", args.duration, None, |_, stop| async move {
                    let config = args.config()?;
                    let summary = profile::run(config, stop, None).await?;
                    eprint!("{summary}");
                    Ok(Ended { output_failed: false })
                })
            }
            Command::Ftrace(args) => run_pipeline(
                "ftrace",
                args.duration,
                args.output.clone(),
                |sink, stop| async move {
                    let config = ftrace::FtraceConfig {
                        events: args.events,
                        buffer_size_kb: args.buffer_size_kb,
                        subbuf_size_kb: args.subbuf_size_kb,
                        buffer_percent: args.buffer_percent,
                        read_mode: args.read_mode.into(),
                        integrity: args.integrity.into(),
                        metrics: args.metrics.start(&sink).await?,
                    };
                    let summary = ftrace::run(config, sink, stop, None).await?;
                    eprint!("{summary}");
                    Ok(Ended { output_failed: summary.output_error.is_some() })
                },
            ),
            Command::Ps(args) => ps_main(args),
            Command::Top(args) => top_main(args),
            Command::Check(CheckArgs {}) => check::main(),
            Command::Convert(args) => convert_main(&args),
        }
    }
}

/// The tokio runtime every subcommand runs on. Two workers: session tasks and the output loop
/// progress side by side on small hosts.
fn async_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// What a pipeline gets to stop on.
pub type StopSignal = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs a pipeline writing to `output` (stdout when `None`) on a tokio runtime, until it ends or
/// is asked to stop: SIGINT, SIGTERM or `duration`. A second SIGINT/SIGTERM exits at once (still
/// removing tracer's ftrace instances); SIGHUP reopens the output file (log rotation). The
/// handlers are installed before the pipeline starts, so an early Ctrl-C is not lost.
fn run_pipeline<F, Fut>(
    name: &str,
    duration: Option<Duration>,
    output: Option<PathBuf>,
    pipeline: F,
) -> ExitCode
where
    F: FnOnce(JsonLines, StopSignal) -> Fut,
    Fut: Future<Output = anyhow::Result<Ended>>,
{
    let result = async_runtime().and_then(|runtime| {
        runtime.block_on(async {
            let sink = JsonLines::open(output.as_deref())?;
            let stop = handle_signals(duration, Some(sink.reopen_request()))?;
            pipeline(sink, stop).await
        })
    });
    match result {
        Ok(Ended { output_failed: false }) => ExitCode::SUCCESS,
        Ok(Ended { output_failed: true }) => ExitCode::from(EXIT_OUTPUT_FAILED),
        Err(e) => {
            eprintln!("tracer {name}: error: {}", escape_control(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Installs the signal handlers now (inside the runtime) and returns what the pipeline stops on.
/// SIGHUP reopens the output (`reopen`); without one (a screen), it stops like SIGINT: the
/// terminal went away.
fn handle_signals(
    duration: Option<Duration>,
    reopen: Option<ReopenRequest>,
) -> anyhow::Result<StopSignal> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut hangup_stops = None;
    match reopen {
        Some(reopen) => drop(tokio::spawn(async move {
            while hup.recv().await.is_some() {
                reopen.request();
            }
        })),
        None => hangup_stops = Some(hup),
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let timer = async {
            match duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let why = tokio::select! {
            _ = int.recv() => "signal",
            _ = term.recv() => "signal",
            Some(_) = async {
                match &mut hangup_stops {
                    Some(hup) => hup.recv().await,
                    None => std::future::pending().await,
                }
            } => "the terminal closed",
            () = timer => "duration",
        };
        log::info!("stopping ({why}); a second Ctrl-C exits at once");
        let _ = stop_tx.send(());
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        crate::top::terminal::give_back();
        eprintln!("tracer: second signal: exiting without draining");
        crate::kernel::exit_now(EXIT_FORCED);
    });
    Ok(Box::pin(async {
        let _ = stop_rx.await;
    }))
}

/// Detect .NET processes and trace them: one session per process, decoded events as JSON lines.
///
/// Every .NET process that becomes ready while tracer runs (detected in the kernel through its
/// `dotnet_ipc_created` or `doublemapper` memfd mapping), and every one already running at start
/// (found in /proc), gets a session with the selected providers. Each output line is one event:
/// {"ts","mono_ns","kind":"dotnet_event","pid","provider","event","id","level","keywords",
/// "thread","stack_id","stack":["Ns.Type.Method","0x7f…",...],"fields":{...}} (`stack`: the
/// frames of the event's stack, leaf first, named from the session's own method events, else
/// their address); session_started / session_ended / session_failed lines report the
/// sessions themselves. Stop with Ctrl-C (SIGINT) or SIGTERM: every session is stopped with
/// StopTracing, drained, and a summary goes to stderr.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Providers in dotnet-trace syntax: `Name[:KeywordsHex[:Level[:Args]]]`, comma-separated,
    /// e.g. 'Microsoft-Windows-DotNETRuntime:0x1:4,MyEventSource'. An argument value holding
    /// commas goes in double quotes: 'System.Diagnostics.Metrics:0x2:4:SessionId=t;Metrics="MyApp,System.Net.Http";RefreshInterval=1'.
    /// Overrides --profile.
    #[arg(long)]
    pub providers: Option<String>,
    /// Named provider sets used when --providers is absent, comma-separated (their providers
    /// together, each once): `gc` (GC events at Informational), `default` (the runtime's
    /// events at Informational: GC, loader, JIT, exceptions, contention, thread pool; no
    /// sampling — `tracer profile` samples CPU in the kernel), `counters` (the System.Runtime counters
    /// every second; with --metrics-addr also Prometheus series per process, e.g.
    /// systemruntime_gc_heap_size_bytes{pid,container_id,pod_uid}), and dotnet-trace's own,
    /// with its providers: `dotnet-common` (lightweight runtime events: GC, loader, JIT,
    /// exceptions, threading), `dotnet-sampled-thread-time` (every managed thread's stack about
    /// every millisecond), `gc-verbose` (GC, GC handles, exceptions at Verbose: allocation
    /// samples), `gc-collect` (GC collections only) and `database` (ADO.NET and Entity Framework
    /// Core commands). dotnet-trace's current default is
    /// `dotnet-common,dotnet-sampled-thread-time`. The profile that samples stacks
    /// (`dotnet-sampled-thread-time`) also asks for the runtime's JIT and loader events at Verbose
    /// (Microsoft-Windows-DotNETRuntime keywords 0x18, level 5; merged into a runtime provider
    /// the profiles have, whose events then all come at Verbose) and the full rundown: they name
    /// the frames of each event's `stack`, and of the stacks of a saved .nettrace (`tracer
    /// convert`). (`gc-collect` also asks for the GC-only rundown, on .NET 9+; --rundown asks
    /// for the full one.)
    #[arg(long, default_value = "default", value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(PROFILE_NAMES))]
    pub profile: Vec<String>,
    /// Trace these processes (repeatable; dotnet-trace's `-p`) and their children; default:
    /// every .NET process. A PID without a diagnostic socket after the locate window gets a
    /// `session_failed` line saying why.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Stop after this long (e.g. 30s, 5m); default: until SIGINT/SIGTERM.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Write JSON lines to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Time limit for each step of a diagnostic IPC command (connect, write, read reply).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub ipc_timeout: Duration,
    /// Runtime-side session buffer (circularBufferMB).
    #[arg(long, default_value_t = 64)]
    pub buffer_mb: u32,
    /// Request rundown events at session end (method/module names for symbolization).
    #[arg(long)]
    pub rundown: bool,
    /// Also save each streaming session's nettrace stream, byte for byte as the runtime sent
    /// it, in DIR/<pid>_<process name>_<UTC start>_<session id>.nettrace (what dotnet-trace
    /// writes: PerfView, TraceEvent and `dotnet-trace convert` open it). Files are created mode
    /// 0600, never over an existing file or through a symlink; a session that ends abnormally
    /// leaves a truncated file and its session_ended says so (nettrace_file_complete: false);
    /// a failed write (disk full) stops that file, reported, while tracing goes on.
    /// A user_events session's records are written as a NetTrace stream of their own
    /// (their metadata, one event per record, a sequence point and the end tag).
    #[arg(long, value_name = "DIR", value_parser = existing_dir)]
    pub nettrace_dir: Option<PathBuf>,
    /// Stop a process's session after the first event that matches
    /// PROVIDER[/EVENT][:FIELD=VALUE[,FIELD=VALUE...]] (dotnet-trace's --stopping-event-*
    /// options), e.g. 'Microsoft-Windows-DotNETRuntime/GCStart:Reason=Induced'. The provider
    /// compares ignoring case and must be one the session asks for; a value compares as the
    /// JSON output shows it. Events already in flight still arrive after the match; the
    /// session ends with reason `stopping_event`, and the process is not traced again.
    #[arg(long, value_name = "SPEC")]
    pub stopping_event: Option<crate::session::stopping::StoppingEvent>,
    /// What a .NET 11+ runtime does when the session's buffers are full (CollectTracing6):
    /// `block` makes the writing threads wait, so nothing is lost — older runtimes cannot do
    /// that, and their sessions fail saying so; `drop` drops events as every older command
    /// does (on older runtimes tracer falls back to the older commands and says so). Applies
    /// to streaming sessions (with `--session auto` they are chosen). Default: the runtime's
    /// own (drop), with the oldest command that carries the request.
    #[arg(long, value_enum)]
    pub buffering_mode: Option<BufferingArg>,
    /// Session kind: `auto` uses CollectTracing5 user_events sessions when the kernel has
    /// user_events and the runtime is .NET 10+, streaming (nettrace over the socket) otherwise.
    #[arg(long, value_enum, default_value = "auto")]
    pub session: SessionArg,
    /// Per-CPU ftrace buffer of the user_events instance (and of the --kernel-event one), in
    /// KiB.
    #[arg(long, default_value_t = 4096)]
    pub buffer_size_kb: u64,
    /// Also write the records of a kernel tracepoint, SYSTEM:NAME or SYSTEM:* with an optional
    /// :FILTER (as `tracer ftrace --event`), that the traced processes' threads write — e.g.
    /// sched:sched_switch or syscalls:sys_enter_openat — in the same envelope (pid,
    /// process_start_ns, labels) and clock as their runtime events (kind `ftrace`). Filtered
    /// in the kernel by the traced threads (set_event_pid, following the threads they create).
    /// Repeatable.
    #[arg(long = "kernel-event", value_name = "SYSTEM:NAME[:FILTER]")]
    pub kernel_events: Vec<EventSpec>,
    /// Which processes may be granted a `user_events_data` fd (user_events sessions):
    /// `all`, or comma-separated uids that a process's real, effective, saved and filesystem
    /// uids must all be in. Default: root and tracer's own uid (processes that could open the
    /// file themselves); every other process gets a streaming session. See docs/security.md.
    #[arg(long, value_name = "UIDS|all")]
    pub user_events_uids: Option<crate::session::UserEventsGrant>,
    /// Most sessions at once. Processes beyond a cap wait for a slot (see
    /// --max-waiting-sessions): any local process can pose as a .NET runtime.
    #[arg(long, default_value_t = AdmissionLimits::default().max_sessions)]
    pub max_sessions: usize,
    /// Most sessions at once with processes of one uid, so one user faking runtimes cannot take
    /// every slot.
    #[arg(long, default_value_t = AdmissionLimits::default().max_per_uid)]
    pub max_sessions_per_uid: usize,
    /// Most processes waiting for a session slot; beyond, a process is not traced (counted).
    #[arg(long, default_value_t = AdmissionLimits::default().max_waiting)]
    pub max_waiting_sessions: usize,
    #[command(flatten)]
    pub hooks: HookArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub otlp: OtlpArgs,
    /// Meters whose instruments become metrics (the System.Diagnostics.Metrics API),
    /// comma-separated: `Meter`, `Meter\instrument`, `*` (every meter) or `Prefix*` (those two
    /// on .NET 9+), or `none`. Asked of every runtime when --metrics-addr or --otlp-endpoint is
    /// given. Default: System.Runtime (the runtime's meter on .NET 9+; its System.Runtime
    /// EventCounters are asked of older runtimes), System.Net.Http, System.Net.NameResolution,
    /// Microsoft.AspNetCore.Hosting, Microsoft.AspNetCore.Server.Kestrel. Each session is a
    /// client of the runtime's shared Meter session (.NET 8+) beside dotnet-counters or
    /// dotnet-monitor; not added when --providers names System.Diagnostics.Metrics itself.
    #[arg(long, value_delimiter = ',')]
    pub meters: Option<Vec<String>>,
    /// Seconds between two publications of the meters' instruments (`RefreshInterval`). A
    /// shared Meter session keeps its first client's interval and refuses other clients'
    /// (counted as metrics/session_refused): the default is dotnet-monitor's.
    #[arg(
        long,
        default_value_t = DEFAULT_METER_REFRESH_SECS,
        value_parser = clap::value_parser!(u32).range(1..=3600)
    )]
    pub meter_interval: u32,
    /// Every traced process's ILogger messages as `log` lines (and, with --otlp-endpoint, OTLP
    /// log records with their severity, message and arguments): the filter of the
    /// Microsoft-Extensions-Logging provider, `Category[*][:Level];…` with the levels Trace,
    /// Debug, Information, Warning, Error, Critical — e.g. 'Shop.*:Debug;Microsoft.*:Warning'.
    /// `--logs` alone: every category from Information. Only applications whose logging has
    /// the EventSource logger provider send any (the default host builders add it).
    #[arg(long, num_args = 0..=1, default_missing_value = DEFAULT_LOG_FILTERS, value_name = "FILTERS")]
    pub logs: Option<String>,
    /// With --otlp-endpoint: how often the runtime metrics are sent as OTLP metrics (POST
    /// URL/v1/metrics; once more at exit), e.g. 10s, 1m.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub otlp_metrics_interval: Duration,
}

impl RunArgs {
    /// `--meters` as asked, or its default when metrics are exported.
    fn meter_request(&self) -> Option<MeterRequest> {
        let exported = self.metrics.metrics_addr.is_some() || self.otlp.otlp_endpoint.is_some();
        let meters = match &self.meters {
            Some(list) if list.iter().any(|m| m.trim().eq_ignore_ascii_case("none")) => None,
            Some(list) => Some(list.iter().map(|m| m.trim().to_owned()).collect()),
            None => exported.then(|| DEFAULT_METERS.map(str::to_owned).to_vec()),
        };
        meters.map(|meters| MeterRequest { meters, refresh_secs: self.meter_interval })
    }
}

/// `--hooks`, of `run` and `audit`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct HookArgs {
    /// How the detection programs hook the kernel. `auto`: the syscall hooks on BPF trampolines
    /// (fexit on the kernel's syscall functions: only those syscalls pay) where the kernel
    /// loads them, else on syscall tracepoints (while attached, every syscall of every process
    /// pays a few tens of ns); the fork/exec/exit hooks on BTF tracepoints (tp_btf) where the
    /// kernel loads them, else on the classic sched/task tracepoints. `trampolines`: the
    /// BTF-typed programs or fail; `syscall-tracepoints`: classic tracepoints only. The
    /// start-up log, the summary, `tracer check` and (for the syscall hooks) the
    /// tracer_detection_hooks metric say which run.
    #[arg(long, value_enum, default_value_t = HookChoice::Auto)]
    pub hooks: HookChoice,
}

/// `--hooks` values: the kernel module's choice, named and explained here with the other flags.
impl clap::ValueEnum for HookChoice {
    fn value_variants<'a>() -> &'a [Self] {
        &[HookChoice::Auto, HookChoice::Trampolines, HookChoice::SyscallTracepoints]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use clap::builder::PossibleValue;
        Some(match self {
            HookChoice::Auto => PossibleValue::new("auto").help(
                "BPF trampolines for the syscall hooks and BTF tracepoints (tp_btf) for the \
                 process lifecycle where the kernel loads and attaches them, else classic \
                 tracepoints (each set on its own)",
            ),
            HookChoice::Trampolines => PossibleValue::new("trampolines").help(
                "BTF-typed programs only (trampolines and tp_btf): fail when the kernel refuses \
                 them",
            ),
            HookChoice::SyscallTracepoints => PossibleValue::new("syscall-tracepoints")
                .help("Classic tracepoints only (syscall and scheduler tracepoints)"),
        })
    }
}

/// Which processes `run` and `audit` report: every flag given must match (values of one flag
/// are alternatives). Processes not selected get no session and no lines.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct FilterArgs {
    /// Only processes in this container: its full 64-hex id or a unique prefix of at least 12
    /// hex digits, as read from the process's cgroup path (docker, containerd/CRI, CRI-O,
    /// podman). Repeatable.
    #[arg(long = "container", value_name = "ID")]
    pub containers: Vec<String>,
    /// Only processes of this Kubernetes pod (its UID, from the `kubepods…pod<uid>` cgroup).
    /// Repeatable.
    #[arg(long = "pod-uid", value_name = "UID")]
    pub pod_uids: Vec<String>,
    /// Only processes in this cgroup v2 or below it: the path as /proc/<pid>/cgroup shows it
    /// (e.g. /kubepods.slice) or under the cgroup2 mount. Repeatable.
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,
    /// Only processes whose environment (/proc/<pid>/environ, read up to 256 KiB) has NAME, or
    /// NAME=VALUE exactly: lets a node-wide agent trace only pods that ask for it. Repeatable
    /// (all must hold).
    #[arg(long = "require-env", value_name = "NAME[=VALUE]")]
    pub require_env: Vec<String>,
}

impl FilterArgs {
    pub fn filter(&self) -> anyhow::Result<ProcessFilter> {
        ProcessFilter::new(
            &self.containers,
            &self.pod_uids,
            &self.cgroups,
            ProcessFilter::env_requirements(&self.require_env)?,
            crate::identity::cgroup_v2_mount().as_deref(),
        )
    }
}

/// `--metrics-addr`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics on http://ADDR/metrics and a health check on /healthz (200
    /// while the probes are attached and read, 503 with the reason otherwise). Off by default.
    /// Bind to loopback (127.0.0.1:9464) unless the endpoint must be reachable from elsewhere,
    /// e.g. by a Prometheus outside the host: it is unauthenticated. `run` also serves every
    /// runtime counter its sessions receive (`--profile counters`, or any provider with
    /// EventCounterIntervalSec=N) as a gauge per process, named as dotnet-monitor names them,
    /// and CPU profiles at /debug/pprof/profile?seconds=N (pprof, as Parca, Pyroscope and
    /// `go tool pprof` fetch them; one at a time).
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_addr: Option<SocketAddr>,
}

impl MetricsArgs {
    /// Binds the endpoint (inside the runtime) when asked; the pipeline publishes through the
    /// returned handle, and the endpoint says how long a write to `output` has waited.
    pub async fn start(&self, output: &JsonLines) -> anyhow::Result<Option<Publisher>> {
        let Some(addr) = self.metrics_addr else { return Ok(None) };
        let shared = Shared::new();
        let local = crate::metrics::serve(addr, shared.clone()).await?;
        log::info!("metrics on http://{local}/metrics, health on http://{local}/healthz");
        let publisher = Publisher::new(shared);
        publisher.serve_output_wait(output.output_wait());
        Ok(Some(publisher))
    }
}

/// `--otlp-endpoint`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OtlpArgs {
    /// Also send every output line as an OpenTelemetry log record to an OTLP/HTTP collector:
    /// protobuf POSTs to URL/v1/logs, e.g. http://127.0.0.1:4318 (no TLS: use a node-local
    /// collector). Batched behind a bounded queue with retries; records that cannot be sent
    /// are dropped and counted (`otlp` losses), tracing never waits for the collector.
    /// `k8s.node.name` comes from $NODE_NAME.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

impl OtlpArgs {
    pub fn config(&self) -> anyhow::Result<Option<OtlpConfig>> {
        self.otlp_endpoint.as_deref().map(OtlpConfig::new).transpose()
    }
}

/// `--session`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SessionArg {
    /// user_events when the kernel has it and the runtime is .NET 10+, else streaming.
    Auto,
    /// nettrace streamed over the diagnostic socket (every runtime since .NET Core 3.0).
    Streaming,
    /// CollectTracing5 user_events sessions (Linux with CONFIG_USER_EVENTS, .NET 10+).
    UserEvents,
}

impl From<SessionArg> for SessionMode {
    fn from(arg: SessionArg) -> SessionMode {
        match arg {
            SessionArg::Auto => SessionMode::Auto,
            SessionArg::Streaming => SessionMode::Streaming,
            SessionArg::UserEvents => SessionMode::UserEvents,
        }
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum BufferingArg {
    Drop,
    Block,
}

impl From<BufferingArg> for tracer_decode::diagnostic_ipc::BufferingMode {
    fn from(arg: BufferingArg) -> Self {
        match arg {
            BufferingArg::Drop => Self::Drop,
            BufferingArg::Block => Self::Block,
        }
    }
}

/// The shortest `--otlp-metrics-interval`.
pub const MIN_OTLP_METRICS_INTERVAL: Duration = Duration::from_secs(1);

/// Adds the `Microsoft-Extensions-Logging` provider asking for `ILogger` messages as JSON
/// (`MessageJson`) with `filters` as its `FilterSpecs`, unless `providers` name it already.
fn with_log_messages(providers: &mut Vec<FilteredProvider>, filters: &str) -> anyhow::Result<()> {
    if filters.contains('"') {
        anyhow::bail!("--logs {filters:?}: a filter cannot hold '\"' (`Category[*][:Level];…`)");
    }
    let key = provider_key(LOGGING_PROVIDER);
    if providers.iter().any(|p| provider_key(&p.provider.name) == key) {
        return Ok(());
    }
    providers.push(FilteredProvider {
        provider: ProviderConfig {
            name: LOGGING_PROVIDER.to_owned(),
            keywords: JSON_MESSAGE_KEYWORD,
            // The filter decides each category's level.
            level: EventLevel::Verbose,
            arguments: Some(format!("FilterSpecs=\"{filters}\"")),
        },
        filter: None,
    });
    Ok(())
}

/// `--logs` without filters: every category, from Information up.
pub const DEFAULT_LOG_FILTERS: &str = "*:Information";

/// The configuration of `tracer run` with these arguments.
pub fn run_config(args: &RunArgs) -> anyhow::Result<run::RunConfig> {
    let mut providers = match &args.providers {
        Some(spec) => parse_providers(spec)?,
        None => profiles(&args.profile)?,
    };
    if let Some(filters) = &args.logs {
        with_log_messages(&mut providers, filters)?;
    }
    if args.buffering_mode.is_some() && matches!(args.session, SessionArg::UserEvents) {
        anyhow::bail!(
            "--buffering-mode applies to streaming sessions (CollectTracing6): use --session \
             streaming or auto"
        );
    }
    if let Some(stopping) = &args.stopping_event
        && !providers.iter().any(|p| p.provider.name.eq_ignore_ascii_case(&stopping.provider))
    {
        anyhow::bail!(
            "--stopping-event names provider {:?}, which the sessions do not ask for: add it to \
             --providers",
            stopping.provider
        );
    }
    if args.otlp_metrics_interval < MIN_OTLP_METRICS_INTERVAL {
        anyhow::bail!(
            "--otlp-metrics-interval {:?} is shorter than {MIN_OTLP_METRICS_INTERVAL:?}: every \
             export sends every series",
            args.otlp_metrics_interval
        );
    }
    let timeouts =
        Timeouts { connect: args.ipc_timeout, write: args.ipc_timeout, read: args.ipc_timeout };
    Ok(run::RunConfig {
        admission: AdmissionLimits {
            max_sessions: args.max_sessions,
            max_per_uid: args.max_sessions_per_uid,
            max_waiting: args.max_waiting_sessions,
        },
        session: SessionConfig {
            request: TracingRequest {
                circular_buffer_mb: args.buffer_mb,
                providers: providers.clone(),
                rundown_keyword: match (args.rundown, &args.providers) {
                    (true, _) => DEFAULT_RUNDOWN_KEYWORD,
                    (false, None) => profiles_rundown_keyword(&args.profile),
                    (false, Some(_)) => 0,
                },
                request_stackwalk: true,
                buffering_mode: args.buffering_mode.map(Into::into),
            },
            mode: args.session.into(),
            timeouts,
            locate_for: run::LOCATE_WINDOW,
            drain_timeout: args.ipc_timeout,
            user_events_grant: args.user_events_uids.clone().unwrap_or_default(),
            nettrace_dir: args.nettrace_dir.clone(),
            stopping_event: args.stopping_event.clone(),
            meters: args.meter_request(),
        },
        providers,
        target_pids: args.pids.clone(),
        hooks: args.hooks.hooks,
        live_status: std::io::stderr().is_terminal(),
        buffer_size_kb: args.buffer_size_kb,
        filter: args.filter.filter()?,
        metrics: None,
        otlp: args
            .otlp
            .config()?
            .map(|otlp| OtlpConfig { metrics_interval: args.otlp_metrics_interval, ..otlp }),
        kernel_events: args.kernel_events.clone(),
    })
}

/// Detect .NET processes and user_events registrations, printing one JSON object per line.
///
/// Every line has `ts` (ISO-8601 wall clock), `mono_ns` (CLOCK_MONOTONIC), `kind`, `source`
/// (`kernel` for live events, `procfs` for mappings found at start-up), the process (`pid`,
/// `tid`, `comm`, `uid`, `cgroup_id`), `cpu` and `seq` (per-CPU sequence; gaps are losses), and
/// the kind's fields. Kinds: memfd_create, dotnet_ipc_ready, dotnet_runtime_seen,
/// user_events_register, user_events_delete, user_events_unregister, process_fork,
/// process_exec, process_exit, dotnet_ipc_socket (a bind of a diagnostic server socket)
/// (fork/exec/exit only for processes that did one of the others).
///
/// Stop with Ctrl-C / SIGTERM or --duration: tracer detaches, drains what is buffered and prints
/// a summary to stderr (events per kind; losses per CPU, kind and reason; sequence gaps).
///
/// Needs root, or CAP_BPF + CAP_PERFMON and read access to tracefs.
/// Example: `tracer audit --pid 1234 --registrations --duration 30s -o audit.jsonl`
#[derive(clap::Args, Debug, Clone)]
pub struct AuditArgs {
    /// Write the JSON lines to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Stop after this long (e.g. 30s, 500ms, 2m); default: until SIGINT/SIGTERM.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Only report this process and its descendants (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Keep the per-process user_events registration table (inherited on fork, dropped on exec
    /// and exit) and print it at exit: a `registration_table` JSON line and a table on stderr.
    /// Registrations made before tracer started are read from the kernel at start by a BPF
    /// task iterator (`at_start: true`, with the event name, address, bit and size) where the
    /// kernel has BTF for its user_events structs; elsewhere the table starts empty (the log
    /// says why).
    #[arg(long)]
    pub registrations: bool,
    #[command(flatten)]
    pub hooks: HookArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub otlp: OtlpArgs,
}

/// Sample where .NET processes spend CPU (or wait), and write files profilers open.
///
/// On-CPU stacks (`--mode cpu`) are sampled in the kernel on a per-CPU software clock at
/// `--frequency` (kernel and user stacks by frame pointers); off-CPU (`--mode off-cpu`,
/// dotnet-trace's `thread-time`) weights each stretch a thread spent blocked by its length,
/// with the stack where it blocked. Every frame is named without writing into the target:
/// managed (JIT-compiled, also code compiled before tracer started, with W^X on or off) from
/// the runtime's own method events over its diagnostic socket, native ones from the ELF symbols
/// of the mapped files (and their debug files), kernel ones from kallsyms; what cannot be named
/// stays `module+offset`, and the summary says how much of each process was named.
/// Needs root. Files: pprof (`go tool pprof`, Pyroscope, Parca), speedscope JSON, folded stacks
/// (flamegraph.pl, inferno) and a self-contained SVG flame graph.
///
/// Example: tracer profile --pid 4242 --duration 30s --format pprof,svg -o app
#[derive(clap::Args, Debug, Clone)]
pub struct ProfileArgs {
    /// Profile this process (repeatable; dotnet-trace's `-p`); default: every .NET process
    /// detected (those running at start and those that start), as the filters select.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Stop after this long (e.g. 30s, 5m); default: until SIGINT/SIGTERM.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// What to sample: `cpu` (on-CPU stacks) or `off-cpu` (blocked stretches, weighted by their
    /// nanoseconds).
    #[arg(long, value_enum, default_value = "cpu")]
    pub mode: ModeArg,
    /// On-CPU samples per second and CPU (perf's -F); at most the kernel's
    /// kernel.perf_event_max_sample_rate.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..))]
    pub frequency: u64,
    /// File formats, comma-separated or repeated: pprof (gzip'd profile.proto, `.pb.gz`),
    /// speedscope (`.speedscope.json`), folded (`.folded`), svg (a flame graph, `.svg`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "pprof")]
    pub format: Vec<FormatArg>,
    /// Where to write: with one format, this file; with several, this path with each format's
    /// suffix appended. Default: `profile` with each format's suffix, in the current directory.
    /// Created mode 0600, never through a symlink.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Time limit for each step of a diagnostic IPC command.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub ipc_timeout: Duration,
    #[command(flatten)]
    pub hooks: HookArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// `--mode` of `profile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    Cpu,
    OffCpu,
}

/// `--format` of `profile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    Pprof,
    Speedscope,
    Folded,
    Svg,
}

impl From<FormatArg> for crate::profile::format::Format {
    fn from(arg: FormatArg) -> Self {
        use crate::profile::format::Format;
        match arg {
            FormatArg::Pprof => Format::Pprof,
            FormatArg::Speedscope => Format::Speedscope,
            FormatArg::Folded => Format::Folded,
            FormatArg::Svg => Format::Svg,
        }
    }
}

impl ProfileArgs {
    /// The pipeline's configuration: each format with the file it goes to.
    pub fn config(&self) -> anyhow::Result<profile::ProfileConfig> {
        use crate::kernel::sampler::SampleMode;
        let outputs = output_files(&self.format, self.output.as_deref(), Path::new("profile"));
        Ok(profile::ProfileConfig {
            mode: match self.mode {
                ModeArg::Cpu => SampleMode::Cpu { frequency_hz: self.frequency },
                ModeArg::OffCpu => SampleMode::OffCpu,
            },
            target_pids: self.pids.clone(),
            filter: self.filter.filter()?,
            hooks: self.hooks.hooks,
            outputs,
            timeouts: Timeouts {
                connect: self.ipc_timeout,
                write: self.ipc_timeout,
                read: self.ipc_timeout,
            },
            locate_for: run::LOCATE_WINDOW,
            drain_timeout: Duration::from_secs(30),
        })
    }
}

/// Each format with the file it goes to: with one format, `output`; with several, `output`
/// with each format's suffix appended; without `output`, `default_base` with the suffixes.
fn output_files(
    formats: &[FormatArg],
    output: Option<&Path>,
    default_base: &Path,
) -> Vec<(crate::profile::format::Format, PathBuf)> {
    let mut formats: Vec<crate::profile::format::Format> =
        formats.iter().map(|&f| f.into()).collect();
    formats.dedup();
    let count = formats.len();
    formats
        .into_iter()
        .map(|format| {
            let path = match output {
                Some(path) if count == 1 => path.to_owned(),
                base => {
                    let mut name = base.unwrap_or(default_base).as_os_str().to_owned();
                    name.push(format.file_suffix());
                    PathBuf::from(name)
                }
            };
            (format, path)
        })
        .collect()
}

/// Convert a saved .nettrace file into profile files (pprof, speedscope, folded, svg).
///
/// Reads a file written by `tracer run --nettrace-dir` or by dotnet-trace, takes the samples
/// of EventPipe's sample profiler (`Microsoft-DotNETCore-SampleProfiler` ThreadSample events:
/// thread, time, stack; one every ~1 ms per thread, each a weight of 1 at 1000 Hz) and names
/// their frames from the file's own method, module and rundown events (the `default` and
/// `dotnet-sampled-thread-time` profiles of `tracer run` ask for them); a frame no method
/// names stays `[unknown]+0x<address>`. The sample profiler samples every managed thread,
/// running or waiting in native code, so the weights are thread time rather than CPU time.
/// Needs no privileges; writes nothing but the files, created mode 0600, never through a
/// symlink. A file that ends early (a session that ended abnormally) is converted up to where
/// it ends, with a warning.
///
/// Example: tracer convert /var/tmp/traces/4242_app_20260101_120000_1a.nettrace --format svg
#[derive(clap::Args, Debug, Clone)]
pub struct ConvertArgs {
    /// The .nettrace file.
    pub input: PathBuf,
    /// File formats, comma-separated or repeated: pprof (gzip'd profile.proto, `.pb.gz`),
    /// speedscope (`.speedscope.json`), folded (`.folded`), svg (a flame graph, `.svg`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "pprof")]
    pub format: Vec<FormatArg>,
    /// Where to write: with one format, this file; with several, this path with each format's
    /// suffix appended. Default: the input's path without `.nettrace`, with each format's
    /// suffix. Created mode 0600, never through a symlink.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

impl ConvertArgs {
    pub fn config(&self) -> convert::ConvertConfig {
        let base = match self.input.extension() {
            Some(ext) if ext == "nettrace" => self.input.with_extension(""),
            _ => self.input.clone(),
        };
        convert::ConvertConfig {
            input: self.input.clone(),
            outputs: output_files(&self.format, self.output.as_deref(), &base),
        }
    }
}

/// `tracer convert`: no runtime, no signals; the summary on stderr.
fn convert_main(args: &ConvertArgs) -> ExitCode {
    match convert::run(&args.config()) {
        Ok(summary) => {
            eprint!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tracer convert: error: {}", escape_control(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Stream kernel tracepoints (ftrace events) as JSON lines.
///
/// Events are recorded in a private ftrace instance (`instances/tracer-<pid>`, removed on exit)
/// with the `mono` clock, read from the per-CPU ring buffers (whole sub-buffers with read(), or
/// memory-mapped with --read-mode mmap), checked for integrity, and merged across CPUs in time
/// order.
/// A summary (per-CPU records, overrun, lost events, corrupt pages, read mode) goes to stderr.
///
/// Example: tracer ftrace --event sched:sched_process_exec --event 'syscalls:sys_enter_openat:dfd
/// == -100' --duration 10s
#[derive(Debug, clap::Args)]
pub struct FtraceArgs {
    /// Tracepoint to record: SYSTEM:NAME, SYSTEM:* (every event of the system), optionally
    /// followed by :FILTER (a kernel filter expression, e.g. `sched:sched_switch:prev_pid != 0`).
    /// Repeatable.
    #[arg(long = "event", required = true, value_name = "SYSTEM:NAME[:FILTER]")]
    pub events: Vec<EventSpec>,
    /// Ring-buffer size per CPU, in KiB.
    #[arg(long, default_value_t = 4096)]
    pub buffer_size_kb: u64,
    /// Sub-buffer size in KiB (Linux ≥ 6.8; the kernel rounds up to a power of two of pages):
    /// each read() or mmap reader swap then hands over that much. Default: one page. Some
    /// kernels forbid the change even to root (EPERM): tracer then stops with an error.
    #[arg(long, value_name = "KIB")]
    pub subbuf_size_kb: Option<u64>,
    /// Wake the reader when a CPU buffer is this full (0–100; 0 = on every event). A 100 ms poll
    /// timer drains quieter CPUs anyway.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub buffer_percent: u32,
    /// How to read the ring buffer: read() of whole sub-buffers (the default: cheaper per record
    /// than the mapping for records under a few hundred bytes), mmap (Linux ≥ 6.10; cheaper for
    /// ~1 KiB records), or auto (mmap, falling back to read()). docs/protocol/ftrace.md §6.7.
    #[arg(long, value_enum, default_value = "read")]
    pub read_mode: ReadModeArg,
    /// What a corrupt ring-buffer page does: lenient = report, count and skip; strict = exit 1.
    #[arg(long, value_enum, default_value = "lenient")]
    pub integrity: IntegrityArg,
    /// Stop after this long (e.g. 30s, 5m); default: until SIGINT/SIGTERM.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Write JSON lines to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// `--read-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadModeArg {
    /// Memory-map the ring buffer (Linux ≥ 6.10).
    Mmap,
    /// Copy whole sub-buffers with read().
    Read,
    /// mmap, falling back to read() when the kernel refuses the mapping.
    Auto,
}

impl From<ReadModeArg> for ReadMode {
    fn from(arg: ReadModeArg) -> ReadMode {
        match arg {
            ReadModeArg::Mmap => ReadMode::Mmap,
            ReadModeArg::Read => ReadMode::Read,
            ReadModeArg::Auto => ReadMode::Auto,
        }
    }
}

/// `--integrity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IntegrityArg {
    /// Report, count and skip corrupt pages.
    Lenient,
    /// A corrupt page or record is a fatal error.
    Strict,
}

impl From<IntegrityArg> for Integrity {
    fn from(arg: IntegrityArg) -> Integrity {
        match arg {
            IntegrityArg::Lenient => Integrity::Lenient,
            IntegrityArg::Strict => Integrity::Strict,
        }
    }
}

/// Check privileges and kernel features tracer needs, and say what to do about missing ones.
///
/// Checks: privileges (root or CAP_BPF + CAP_PERFMON), the bpf() syscall, every tracepoint the
/// detection programs attach to, the tracefs mount, user_events (optional), memory-mapped
/// trace_pipe_raw (tried on a scratch instance; read() is the default transport either way), and
/// the kernel version. Exit status 1 when a required feature is missing, 0 otherwise.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {}

/// List the .NET processes on this host (dotnet-trace's `ps`).
///
/// For each: pid, container, runtime version, the session kinds tracer can start with it
/// (`streaming`, `user_events`, `buffering`), how it was found (its `dotnet_ipc_created` or
/// `doublemapper` mapping, its listening diagnostic `socket`), the socket and the command line.
/// Each runtime is only asked for ProcessInfo over its checked socket (the same checks as a
/// session's); no session is started. Runtimes before .NET 5 answer no ProcessInfo: their
/// version is the directory of the libcoreclr.so they mapped. A table on a terminal; JSON lines
/// (`dotnet_process`, then `summary`) with --json, --output, or when stdout is not a terminal.
#[derive(Debug, clap::Args)]
pub struct PsArgs {
    /// JSON lines even on a terminal.
    #[arg(long)]
    pub json: bool,
    /// Write JSON lines to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Time limit for each step of the ProcessInfo exchange (connect, write, read reply).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub ipc_timeout: Duration,
    /// How long the whole listing may take: a runtime that has not answered by then (a silent
    /// peer, or one waiting behind 16 others) is listed with that reason.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `tracer ps`: a table on a terminal, JSON lines otherwise.
fn ps_main(args: PsArgs) -> ExitCode {
    let config = crate::pipeline::ps::PsConfig {
        timeouts: Timeouts {
            connect: args.ipc_timeout,
            write: args.ipc_timeout,
            read: args.ipc_timeout,
        },
        deadline: args.timeout,
    };
    let table = !args.json && args.output.is_none() && std::io::stdout().is_terminal();
    if table {
        let listed = async_runtime()
            .and_then(|runtime| runtime.block_on(crate::pipeline::ps::list(&config)));
        return match listed.and_then(|l| {
            crate::pipeline::ps::write_table(&l, std::io::stdout().lock())
                .context("writing the table")
        }) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tracer ps: error: {}", escape_control(&format!("{e:#}")));
                ExitCode::FAILURE
            }
        };
    }
    run_pipeline("ps", None, args.output, |mut sink, _stop| async move {
        let listed = crate::pipeline::ps::list(&config).await?;
        crate::pipeline::ps::write_lines(&listed, &mut sink);
        let output_failed = sink.failure().is_some();
        Ok(Ended { output_failed })
    })
}

/// Every .NET process on the host in one live screen, refreshed every second.
///
/// One row per .NET process (those running and those that start; selected as `run` selects
/// them): pid, name, container or pod, runtime version, CPU % (the kernel's, all threads),
/// working set, GC heap, GCs per second by generation, % of time paused in GC, allocations,
/// exceptions and lock contentions per second, thread-pool threads and queue, and the managed
/// method most of its CPU samples are in (sampled in the kernel at 49 Hz, named as `tracer
/// profile` names frames). `n/a`: the runtime does not report it. Each runtime gets the session
/// `run --profile counters` starts (its System.Runtime counters every second), and a runtime
/// busy in code tracer cannot name yet is asked for a rundown of its methods (at most every
/// 30 s). Keys: c/m/g/a/e sort by CPU, memory, GC, allocations, exceptions; / filters by name,
/// command line, container or pod; arrows select; Enter shows a process's counters with their
/// last minute, its top methods and its threads; Esc goes back; q quits. Not on a terminal (or
/// with --once): one snapshot, a `top_process` JSON line per process.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Print one snapshot as JSON lines (`top_process`, one per process: the fields the screen
    /// shows, `null` where nothing is reported, rates over every counter interval seen) once
    /// every process has sent two whole rounds of counters, and exit. The default when stdout
    /// is not a terminal.
    #[arg(long)]
    pub once: bool,
    /// Only these processes (repeatable) and their children, as `run`; default: every .NET
    /// process.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Time limit for each step of a diagnostic IPC command (and a session's drain at the end).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub ipc_timeout: Duration,
    #[command(flatten)]
    pub hooks: HookArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
}

impl TopArgs {
    pub fn config(&self) -> anyhow::Result<top::TopConfig> {
        Ok(top::TopConfig {
            target_pids: self.pids.clone(),
            filter: self.filter.filter()?,
            hooks: self.hooks.hooks,
            admission: AdmissionLimits::default(),
            timeouts: Timeouts {
                connect: self.ipc_timeout,
                write: self.ipc_timeout,
                read: self.ipc_timeout,
            },
        })
    }
}

/// `tracer top`: the screen on a terminal, one snapshot of JSON lines otherwise.
fn top_main(args: TopArgs) -> ExitCode {
    let once = args.once || !std::io::stdout().is_terminal();
    if once {
        return run_pipeline("top", None, None, |sink, stop| async move {
            let output_failed = top::run(args.config()?, top::Display::Once(sink), stop).await?;
            Ok(Ended { output_failed })
        });
    }
    let result = async_runtime().and_then(|runtime| {
        runtime.block_on(async {
            let stop = handle_signals(None, None)?;
            top::run(args.config()?, top::Display::Screen, stop).await
        })
    });
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tracer top: error: {}", escape_control(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// A directory that exists (`--nettrace-dir`).
fn existing_dir(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => Ok(path),
        Ok(_) => Err(format!("{value} is not a directory")),
        Err(e) => Err(format!("{value}: {e} (create the directory first)")),
    }
}

/// The longest duration any option accepts: longer ones are almost certainly a typo, and deadlines
/// computed from them must not overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Parses `10`, `10s`, `250ms`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 =
        num.parse().map_err(|_| format!("invalid duration {s:?}: expected e.g. 30s, 500ms, 2m"))?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("invalid duration unit {unit:?} in {s:?}: use ms, s, m or h")),
    };
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        _ => Err(format!(
            "invalid duration {s:?}: must be between 0 and {} s (10 years)",
            MAX_DURATION.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rundown_keyword(args: &[&str]) -> u64 {
        let cli = Cli::try_parse_from(["tracer", "run"].iter().chain(args)).unwrap();
        let Command::Run(run) = cli.command else { unreachable!("a run command") };
        run_config(&run).unwrap().session.request.rundown_keyword
    }

    #[test]
    fn gc_collect_asks_for_the_gc_rundown_and_rundown_for_the_full_one() {
        // The default profile samples no stacks: no rundown; the one that does, the full one.
        assert_eq!(rundown_keyword(&[]), 0);
        let sampled = ["--profile", "dotnet-sampled-thread-time"];
        assert_eq!(rundown_keyword(&sampled), DEFAULT_RUNDOWN_KEYWORD);
        assert_eq!(rundown_keyword(&["--profile", "gc"]), 0);
        assert_eq!(rundown_keyword(&["--profile", "gc-collect"]), 0x1);
        assert_eq!(rundown_keyword(&["--profile", "counters,gc-collect"]), 0x1);
        assert_eq!(rundown_keyword(&["--profile", "gc-collect", "--rundown"]), 0x8002_0139);
        assert_eq!(rundown_keyword(&["--rundown"]), DEFAULT_RUNDOWN_KEYWORD);
        // Explicit providers replace the profiles, rundown included.
        let providers =
            ["--providers", "Microsoft-Windows-DotNETRuntime:0x1:4", "--profile", "gc-collect"];
        assert_eq!(rundown_keyword(&providers), 0);
    }

    #[test]
    fn meters_are_asked_for_when_metrics_are_exported() {
        let meters = |args: &[&str]| {
            let cli = Cli::try_parse_from(["tracer", "run"].iter().chain(args)).unwrap();
            let Command::Run(run) = cli.command else { unreachable!("a run command") };
            run_config(&run).unwrap().session.meters
        };
        assert_eq!(meters(&[]), None);
        let default =
            MeterRequest { meters: DEFAULT_METERS.map(str::to_owned).to_vec(), refresh_secs: 5 };
        assert_eq!(meters(&["--metrics-addr", "127.0.0.1:0"]), Some(default.clone()));
        assert_eq!(meters(&["--otlp-endpoint", "http://127.0.0.1:4318"]), Some(default));
        let shop = MeterRequest { meters: vec!["Shop".into(), "System.*".into()], refresh_secs: 1 };
        let asked = ["--meters", "Shop, System.*", "--meter-interval", "1"];
        assert_eq!(meters(&asked), Some(shop));
        assert_eq!(meters(&["--metrics-addr", "127.0.0.1:0", "--meters", "none"]), None);
        assert!(Cli::try_parse_from(["tracer", "run", "--meter-interval", "0"]).is_err());
    }

    #[test]
    fn logs_ask_for_the_logging_providers_json_messages_with_the_filters() {
        let providers = |args: &[&str]| -> Vec<ProviderConfig> {
            let cli = Cli::try_parse_from(["tracer", "run"].iter().chain(args)).unwrap();
            let Command::Run(run) = cli.command else { unreachable!("a run command") };
            run_config(&run)
                .unwrap()
                .session
                .request
                .providers
                .into_iter()
                .map(|p| p.provider)
                .collect()
        };
        let logging = |filters: &str| ProviderConfig {
            name: LOGGING_PROVIDER.into(),
            keywords: 0x8,
            level: EventLevel::Verbose,
            arguments: Some(format!("FilterSpecs=\"{filters}\"")),
        };
        let asked = providers(&["--profile", "gc", "--logs", "Shop.*:Debug;Microsoft.*:Warning"]);
        assert_eq!(asked.last(), Some(&logging("Shop.*:Debug;Microsoft.*:Warning")));
        assert_eq!(providers(&["--logs"]).last(), Some(&logging("*:Information")));
        assert!(!providers(&[]).iter().any(|p| p.name == LOGGING_PROVIDER));
        // The user's own entry for the provider is kept as it is.
        let own = ["--providers", "Microsoft-Extensions-Logging:0x4:4", "--logs"];
        assert_eq!(providers(&own).iter().filter(|p| p.name == LOGGING_PROVIDER).count(), 1);
        assert_eq!(providers(&own)[0].keywords, 0x4);
        let cli = Cli::try_parse_from(["tracer", "run", "--logs", "a\"b"]).unwrap();
        let Command::Run(run) = cli.command else { unreachable!("a run command") };
        assert!(format!("{:#}", run_config(&run).unwrap_err()).contains("cannot hold"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("5x").unwrap_err().contains("unit"));
        assert!(parse_duration("").is_err());
        assert_eq!(
            parse_duration("99999999999999999999").unwrap_err(),
            "invalid duration \"99999999999999999999\": must be between 0 and 315360000 s (10 \
             years)"
        );
        assert_eq!(parse_duration("315360000").unwrap(), MAX_DURATION);
        assert!(parse_duration("315360001").is_err());
        assert!(parse_duration("-1").is_err());
    }
}
