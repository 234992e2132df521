//! Request messages tracer sends: commands, provider configurations and CollectTracing
//! versions, validated before anything is written.
use std::fmt;

use thiserror::Error;

use super::writer::MessageWriter;
use super::*;

/// Every command tracer can send, by (command set, command id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandCode {
    StopTracing,
    CollectTracing,
    CollectTracing2,
    CollectTracing3,
    CollectTracing4,
    CollectTracing5,
    CollectTracing6,
    ProcessInfo,
    ResumeRuntime,
    ProcessInfo2,
    EnablePerfMap,
    DisablePerfMap,
    ProcessInfo3,
}

impl CommandCode {
    /// The (command_set, command_id) pair on the wire.
    pub fn set_and_id(self) -> (u8, u8) {
        match self {
            CommandCode::StopTracing => (SET_EVENTPIPE, 0x01),
            CommandCode::CollectTracing => (SET_EVENTPIPE, 0x02),
            CommandCode::CollectTracing2 => (SET_EVENTPIPE, 0x03),
            CommandCode::CollectTracing3 => (SET_EVENTPIPE, 0x04),
            CommandCode::CollectTracing4 => (SET_EVENTPIPE, 0x05),
            CommandCode::CollectTracing5 => (SET_EVENTPIPE, 0x06),
            CommandCode::CollectTracing6 => (SET_EVENTPIPE, 0x07),
            CommandCode::ProcessInfo => (SET_PROCESS, 0x00),
            CommandCode::ResumeRuntime => (SET_PROCESS, 0x01),
            CommandCode::ProcessInfo2 => (SET_PROCESS, 0x04),
            CommandCode::EnablePerfMap => (SET_PROCESS, 0x05),
            CommandCode::DisablePerfMap => (SET_PROCESS, 0x06),
            CommandCode::ProcessInfo3 => (SET_PROCESS, 0x08),
        }
    }

    /// What an OK reply to this command carries.
    pub fn reply_shape(self) -> ReplyShape {
        match self {
            CommandCode::StopTracing
            | CommandCode::CollectTracing
            | CommandCode::CollectTracing2
            | CommandCode::CollectTracing3
            | CommandCode::CollectTracing4
            | CommandCode::CollectTracing5
            | CommandCode::CollectTracing6 => ReplyShape::SessionId,
            CommandCode::ResumeRuntime
            | CommandCode::EnablePerfMap
            | CommandCode::DisablePerfMap => ReplyShape::Status,
            CommandCode::ProcessInfo => ReplyShape::ProcessInfo,
            CommandCode::ProcessInfo2 => ReplyShape::ProcessInfo2,
            CommandCode::ProcessInfo3 => ReplyShape::ProcessInfo3,
        }
    }
}

impl fmt::Display for CommandCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (set, id) = self.set_and_id();
        write!(f, "{self:?} (0x{set:02x}{id:02x})")
    }
}

/// EventPipe verbosity levels (docs/protocol/diagnostic-ipc.md §3.4); the runtime rejects anything
/// above Verbose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum EventLevel {
    LogAlways = 0,
    Critical = 1,
    Error = 2,
    Warning = 3,
    Informational = 4,
    Verbose = 5,
}

impl EventLevel {
    pub fn from_u32(level: u32) -> Option<EventLevel> {
        Some(match level {
            0 => EventLevel::LogAlways,
            1 => EventLevel::Critical,
            2 => EventLevel::Error,
            3 => EventLevel::Warning,
            4 => EventLevel::Informational,
            5 => EventLevel::Verbose,
            _ => return None,
        })
    }
}

/// One EventPipe provider as CollectTracing1–4 carry it (`provider_config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    pub name: String,
    pub keywords: u64,
    pub level: EventLevel,
    /// `key=value;key=value` filter data; `None` is sent as count 0, `Some("")` as count 1 + NUL.
    pub arguments: Option<String>,
}

/// Per-provider event-id filter of CollectTracing5 (docs/protocol/diagnostic-ipc.md §3.4, "Event
/// filters").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventFilter {
    /// Only the listed event ids pass.
    Only(Vec<u32>),
    /// Every event except the listed ids passes.
    Except(Vec<u32>),
}

impl EventFilter {
    /// Wire form: (`enable`, ids). "No filter" is `enable = 0` with an empty list.
    pub(super) fn wire(filter: Option<&EventFilter>) -> (bool, &[u32]) {
        match filter {
            None => (false, &[]),
            Some(EventFilter::Only(ids)) => (true, ids),
            Some(EventFilter::Except(ids)) => (false, ids),
        }
    }
}

/// A provider with an optional event filter (`provider_config_v2`, CollectTracing5 streaming).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilteredProvider {
    pub provider: ProviderConfig,
    pub filter: Option<EventFilter>,
}

/// Which tracepoint receives which events of a user_events provider
/// (docs/protocol/diagnostic-ipc.md §4.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracepointConfig {
    /// Tracepoint for events not listed in any set; `None` means such events are not written.
    pub default_name: Option<String>,
    pub sets: Vec<TracepointSet>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracepointSet {
    pub name: String,
    pub event_ids: Vec<u32>,
}

/// One provider of a CollectTracing5 user_events session (`user_events_provider_config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserEventsProvider {
    pub provider: ProviderConfig,
    pub filter: Option<EventFilter>,
    pub tracepoints: TracepointConfig,
}

/// `format` field of the streaming CollectTracing commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum TraceFormat {
    /// Legacy V3 stream; listed for completeness, tracer does not parse it.
    NetPerf = 0,
    NetTrace = 1,
}

/// The CollectTracing family. Field names follow docs/protocol/diagnostic-ipc.md §3.5; semantics of
/// the older commands: CT1 always rundown + stack walk, CT2 rundown switch (always stacks), CT3
/// adds the stack-walk switch, CT4 replaces the rundown switch by a keyword mask, CT5 adds event
/// filters and user_events sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CollectTracing {
    V1 {
        circular_buffer_mb: u32,
        format: TraceFormat,
        providers: Vec<ProviderConfig>,
    },
    V2 {
        circular_buffer_mb: u32,
        format: TraceFormat,
        request_rundown: bool,
        providers: Vec<ProviderConfig>,
    },
    V3 {
        circular_buffer_mb: u32,
        format: TraceFormat,
        request_rundown: bool,
        request_stackwalk: bool,
        providers: Vec<ProviderConfig>,
    },
    V4 {
        circular_buffer_mb: u32,
        format: TraceFormat,
        rundown_keyword: u64,
        request_stackwalk: bool,
        providers: Vec<ProviderConfig>,
    },
    /// CollectTracing5 with `session_type = 0`: nettrace on the socket, like CT1–4.
    V5Streaming {
        circular_buffer_mb: u32,
        format: TraceFormat,
        rundown_keyword: u64,
        request_stackwalk: bool,
        providers: Vec<FilteredProvider>,
    },
    /// CollectTracing6 (.NET 11): the CT5 streaming payload, then how the runtime's session
    /// buffers behave when full (docs/protocol/diagnostic-ipc.md §3.5).
    V6 {
        circular_buffer_mb: u32,
        format: TraceFormat,
        rundown_keyword: u64,
        request_stackwalk: bool,
        providers: Vec<FilteredProvider>,
        buffering_mode: BufferingMode,
    },
    /// CollectTracing5 with `session_type = 1`: the runtime writes to user_events tracepoints
    /// through a `user_events_data` fd that must follow the message as SCM_RIGHTS
    /// (docs/protocol/diagnostic-ipc.md §4.2).
    V5UserEvents {
        rundown_keyword: u64,
        providers: Vec<UserEventsProvider>,
    },
}

impl CollectTracing {
    pub fn code(&self) -> CommandCode {
        match self {
            CollectTracing::V1 { .. } => CommandCode::CollectTracing,
            CollectTracing::V2 { .. } => CommandCode::CollectTracing2,
            CollectTracing::V3 { .. } => CommandCode::CollectTracing3,
            CollectTracing::V4 { .. } => CommandCode::CollectTracing4,
            CollectTracing::V5Streaming { .. } | CollectTracing::V5UserEvents { .. } => {
                CommandCode::CollectTracing5
            }
            CollectTracing::V6 { .. } => CommandCode::CollectTracing6,
        }
    }

    /// Whether the runtime answers with a nettrace stream on the same socket.
    pub fn streams_nettrace(&self) -> bool {
        !matches!(self, CollectTracing::V5UserEvents { .. })
    }
}

/// `sessionBufferMode` of CollectTracing6: what the runtime does when a session's buffers are
/// full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum BufferingMode {
    /// Drop the event (counted in the stream's sequence numbers); what every older command does.
    Drop = 0,
    /// Block the writing thread until the session has room: nothing is lost.
    Block = 1,
}

/// The first runtime version with CollectTracing6.
pub const COLLECT_TRACING6_MAJOR: u32 = 11;
/// The first runtime version with CollectTracing4, whose rundown is a keyword mask.
pub const COLLECT_TRACING4_MAJOR: u32 = 9;

/// Whether `request` asks for a rundown keyword mask (neither none nor the default rundown)
/// that a runtime of `major` cannot be asked for (no CollectTracing4). Such a session runs
/// without rundown: the mask narrows a rundown, so dropping it is the lighter fallback (what
/// dotnet-trace's `gc-collect` retry does too).
pub fn rundown_mask_unsupported(request: &TracingRequest, major: Option<u32>) -> bool {
    !matches!(request.rundown_keyword, 0 | DEFAULT_RUNDOWN_KEYWORD)
        && major.is_none_or(|m| m < COLLECT_TRACING4_MAJOR)
}

/// What a caller wants from a streaming session, independent of the command that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracingRequest {
    pub circular_buffer_mb: u32,
    pub providers: Vec<FilteredProvider>,
    /// 0 = no rundown; [`DEFAULT_RUNDOWN_KEYWORD`] = the rundown CT1–3 request.
    pub rundown_keyword: u64,
    pub request_stackwalk: bool,
    /// CollectTracing6's buffering mode; `None`: the runtime's default (drop).
    pub buffering_mode: Option<BufferingMode>,
}

/// A lossless (`Block`) session was asked of a runtime without CollectTracing6.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "lossless (block) buffering needs CollectTracing6, which runtimes before .NET \
     {COLLECT_TRACING6_MAJOR} lack ({version}): use --buffering-mode drop, or leave it out"
)]
pub struct NoCollectTracing6 {
    pub version: String,
}

/// The command for `request` to a runtime of `major` version (`None`: unknown, e.g. .NET Core
/// 3.x, which answers no ProcessInfo): CollectTracing6 when a buffering mode is asked and the
/// runtime has it; else [`oldest_collect_tracing`] — without the rundown when its keyword mask
/// is beyond the runtime ([`rundown_mask_unsupported`]), and unless `Block` was asked, which
/// only CollectTracing6 can give.
pub fn collect_tracing_for(
    request: &TracingRequest,
    major: Option<u32>,
) -> Result<CollectTracing, NoCollectTracing6> {
    match request.buffering_mode {
        Some(buffering_mode) if major.is_some_and(|m| m >= COLLECT_TRACING6_MAJOR) => {
            Ok(CollectTracing::V6 {
                circular_buffer_mb: request.circular_buffer_mb,
                format: TraceFormat::NetTrace,
                rundown_keyword: request.rundown_keyword,
                request_stackwalk: request.request_stackwalk,
                providers: request.providers.clone(),
                buffering_mode,
            })
        }
        Some(BufferingMode::Block) => Err(NoCollectTracing6 {
            version: major.map_or("version unknown".into(), |m| format!(".NET {m}")),
        }),
        _ if rundown_mask_unsupported(request, major) => {
            Ok(oldest_collect_tracing(&TracingRequest { rundown_keyword: 0, ..request.clone() }))
        }
        _ => Ok(oldest_collect_tracing(request)),
    }
}

/// Picks the oldest CollectTracing command that expresses `request` exactly, so the session works
/// on as many runtime versions as possible (docs/protocol/diagnostic-ipc.md §3.3):
/// event filters need CT5 (10.0+); a rundown mask other than none/default needs CT4 (9.0+);
/// switching stack walking off needs CT3 (9.0+); otherwise CT2 (3.0+) without rundown, or CT1
/// (3.0+, always rundown + stacks) with the default rundown.
pub fn oldest_collect_tracing(request: &TracingRequest) -> CollectTracing {
    let circular_buffer_mb = request.circular_buffer_mb;
    let format = TraceFormat::NetTrace;
    let rundown_keyword = request.rundown_keyword;
    let request_stackwalk = request.request_stackwalk;
    if request.providers.iter().any(|p| p.filter.is_some()) {
        return CollectTracing::V5Streaming {
            circular_buffer_mb,
            format,
            rundown_keyword,
            request_stackwalk,
            providers: request.providers.clone(),
        };
    }
    let providers: Vec<ProviderConfig> =
        request.providers.iter().map(|p| p.provider.clone()).collect();
    let request_rundown = match rundown_keyword {
        0 => false,
        DEFAULT_RUNDOWN_KEYWORD => true,
        _ => {
            return CollectTracing::V4 {
                circular_buffer_mb,
                format,
                rundown_keyword,
                request_stackwalk,
                providers,
            };
        }
    };
    match (request_rundown, request_stackwalk) {
        (_, false) => CollectTracing::V3 {
            circular_buffer_mb,
            format,
            request_rundown,
            request_stackwalk,
            providers,
        },
        (true, true) => CollectTracing::V1 { circular_buffer_mb, format, providers },
        (false, true) => {
            CollectTracing::V2 { circular_buffer_mb, format, request_rundown, providers }
        }
    }
}

/// `perfMapType` of EnablePerfMap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PerfMapType {
    Disabled = 0,
    PerfMapAndJitDump = 1,
    JitDumpOnly = 2,
    PerfMapOnly = 3,
}

/// A request message, ready to encode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    ProcessInfo,
    ProcessInfo2,
    ProcessInfo3,
    ResumeRuntime,
    EnablePerfMap(PerfMapType),
    DisablePerfMap,
    CollectTracing(CollectTracing),
    StopTracing { session_id: u64 },
}

/// Why a request could not be encoded. Nothing is sent in that case.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    #[error(
        "{command} message would be {size} bytes, above the protocol's 65535-byte limit: \
         use fewer providers, shorter arguments or split them across sessions"
    )]
    TooLarge { command: CommandCode, size: usize },
    #[error("a session needs at least one provider")]
    NoProviders,
    #[error("{count} providers given; the runtime accepts at most {MAX_PROVIDERS}")]
    TooManyProviders { count: usize },
    #[error("provider #{index} has an empty name")]
    EmptyProviderName { index: usize },
    #[error(
        "string {value:?} contains a NUL character, which would truncate it on the runtime side"
    )]
    NulInString { value: String },
    #[error("streaming sessions need a circular buffer of at least 1 MB")]
    ZeroBuffer,
    #[error(
        "user_events provider {provider:?} has neither a default tracepoint nor a tracepoint set, \
         so none of its events could be written"
    )]
    NoTracepoint { provider: String },
    #[error("user_events provider {provider:?} has a tracepoint set with an empty name")]
    EmptyTracepointName { provider: String },
    #[error("tracepoint set {tracepoint:?} of provider {provider:?} lists no event ids")]
    EmptyTracepointSet { provider: String, tracepoint: String },
    #[error("event id {event_id} of provider {provider:?} is in more than one tracepoint set")]
    DuplicateTracepointEvent { provider: String, event_id: u32 },
}

impl Request {
    pub fn code(&self) -> CommandCode {
        match self {
            Request::ProcessInfo => CommandCode::ProcessInfo,
            Request::ProcessInfo2 => CommandCode::ProcessInfo2,
            Request::ProcessInfo3 => CommandCode::ProcessInfo3,
            Request::ResumeRuntime => CommandCode::ResumeRuntime,
            Request::EnablePerfMap(_) => CommandCode::EnablePerfMap,
            Request::DisablePerfMap => CommandCode::DisablePerfMap,
            Request::CollectTracing(ct) => ct.code(),
            Request::StopTracing { .. } => CommandCode::StopTracing,
        }
    }

    /// The whole message (header + payload), validated and at most 65535 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let code = self.code();
        let mut w = MessageWriter::new(code);
        match self {
            Request::ProcessInfo
            | Request::ProcessInfo2
            | Request::ProcessInfo3
            | Request::ResumeRuntime
            | Request::DisablePerfMap => {}
            Request::EnablePerfMap(kind) => w.u32(*kind as u32),
            Request::StopTracing { session_id } => w.u64(*session_id),
            Request::CollectTracing(ct) => encode_collect_tracing(&mut w, ct)?,
        }
        w.finish()
    }
}

fn encode_collect_tracing(w: &mut MessageWriter, ct: &CollectTracing) -> Result<(), EncodeError> {
    match ct {
        CollectTracing::V1 { circular_buffer_mb, format, providers } => {
            w.streaming_prefix(*circular_buffer_mb, *format)?;
            w.providers(providers, |w, p| w.provider(p))
        }
        CollectTracing::V2 { circular_buffer_mb, format, request_rundown, providers } => {
            w.streaming_prefix(*circular_buffer_mb, *format)?;
            w.bool(*request_rundown);
            w.providers(providers, |w, p| w.provider(p))
        }
        CollectTracing::V3 {
            circular_buffer_mb,
            format,
            request_rundown,
            request_stackwalk,
            providers,
        } => {
            w.streaming_prefix(*circular_buffer_mb, *format)?;
            w.bool(*request_rundown);
            w.bool(*request_stackwalk);
            w.providers(providers, |w, p| w.provider(p))
        }
        CollectTracing::V4 {
            circular_buffer_mb,
            format,
            rundown_keyword,
            request_stackwalk,
            providers,
        } => {
            w.streaming_prefix(*circular_buffer_mb, *format)?;
            w.u64(*rundown_keyword);
            w.bool(*request_stackwalk);
            w.providers(providers, |w, p| w.provider(p))
        }
        CollectTracing::V5Streaming {
            circular_buffer_mb,
            format,
            rundown_keyword,
            request_stackwalk,
            providers,
        } => encode_v5_streaming(
            w,
            *circular_buffer_mb,
            *format,
            *rundown_keyword,
            *request_stackwalk,
            providers,
        ),
        CollectTracing::V6 {
            circular_buffer_mb,
            format,
            rundown_keyword,
            request_stackwalk,
            providers,
            buffering_mode,
        } => {
            encode_v5_streaming(
                w,
                *circular_buffer_mb,
                *format,
                *rundown_keyword,
                *request_stackwalk,
                providers,
            )?;
            w.u32(*buffering_mode as u32);
            Ok(())
        }
        CollectTracing::V5UserEvents { rundown_keyword, providers } => {
            w.u32(1); // session_type: user_events
            w.u64(*rundown_keyword);
            w.providers(providers, |w, p| {
                w.provider(&p.provider)?;
                w.event_filter(p.filter.as_ref());
                w.tracepoint_config(&p.provider.name, &p.tracepoints)
            })
        }
    }
}

/// The CollectTracing5 streaming payload (also the start of CollectTracing6's).
fn encode_v5_streaming(
    w: &mut MessageWriter,
    circular_buffer_mb: u32,
    format: TraceFormat,
    rundown_keyword: u64,
    request_stackwalk: bool,
    providers: &[FilteredProvider],
) -> Result<(), EncodeError> {
    w.u32(0); // session_type: streaming
    w.streaming_prefix(circular_buffer_mb, format)?;
    w.u64(rundown_keyword);
    w.bool(request_stackwalk);
    w.providers(providers, |w, p| {
        w.provider(&p.provider)?;
        w.event_filter(p.filter.as_ref());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    /// CollectTracing6 is the CT5 streaming message under id 0x07, then `sessionBufferMode`.
    #[test]
    fn collect_tracing6_is_ct5_streaming_then_the_buffering_mode() {
        let providers = vec![FilteredProvider { provider: runtime_provider(), filter: None }];
        let ct5 = CollectTracing::V5Streaming {
            circular_buffer_mb: 64,
            format: TraceFormat::NetTrace,
            rundown_keyword: 0,
            request_stackwalk: true,
            providers: providers.clone(),
        };
        let ct5 = Request::CollectTracing(ct5).encode().unwrap();
        for (mode, value) in [(BufferingMode::Drop, 0u32), (BufferingMode::Block, 1)] {
            let ct6 = CollectTracing::V6 {
                circular_buffer_mb: 64,
                format: TraceFormat::NetTrace,
                rundown_keyword: 0,
                request_stackwalk: true,
                providers: providers.clone(),
                buffering_mode: mode,
            };
            let bytes = Request::CollectTracing(ct6).encode().unwrap();
            let mut expected = ct5.clone();
            expected[14..16].copy_from_slice(&((ct5.len() + 4) as u16).to_le_bytes());
            expected[17] = 0x07;
            expected.extend_from_slice(&value.to_le_bytes());
            assert_eq!(bytes, expected, "{mode:?}");
        }
    }

    #[test]
    fn buffering_modes_need_collect_tracing6_unless_drop() {
        let request = |buffering_mode| TracingRequest {
            circular_buffer_mb: 64,
            providers: vec![FilteredProvider { provider: runtime_provider(), filter: None }],
            rundown_keyword: 0,
            request_stackwalk: true,
            buffering_mode,
        };
        let code = |r: &TracingRequest, major| collect_tracing_for(r, major).map(|c| c.code());
        let block = request(Some(BufferingMode::Block));
        assert_eq!(code(&block, Some(11)), Ok(CommandCode::CollectTracing6));
        let refused = collect_tracing_for(&block, Some(10)).unwrap_err();
        assert_eq!(refused, NoCollectTracing6 { version: ".NET 10".into() });
        assert!(refused.to_string().contains("--buffering-mode drop"), "{refused}");
        assert_eq!(collect_tracing_for(&block, None).unwrap_err().version, "version unknown");
        let drop = request(Some(BufferingMode::Drop));
        assert_eq!(code(&drop, Some(12)), Ok(CommandCode::CollectTracing6));
        assert_eq!(code(&drop, Some(8)), Ok(CommandCode::CollectTracing2), "falls back");
        assert_eq!(code(&request(None), Some(11)), Ok(CommandCode::CollectTracing2));
    }

    /// `gc-collect`'s GC-only rundown: CollectTracing4 where the runtime has it; older (or
    /// unknown) runtimes get the session without rundown, not a refusal.
    #[test]
    fn a_rundown_keyword_mask_needs_collect_tracing4_and_is_dropped_before() {
        let request = |rundown_keyword| TracingRequest {
            circular_buffer_mb: 64,
            providers: vec![FilteredProvider { provider: runtime_provider(), filter: None }],
            rundown_keyword,
            request_stackwalk: true,
            buffering_mode: None,
        };
        let gc_only = request(0x1);
        let v4 = collect_tracing_for(&gc_only, Some(9)).unwrap();
        assert_eq!(v4.code(), CommandCode::CollectTracing4);
        assert!(matches!(v4, CollectTracing::V4 { rundown_keyword: 0x1, .. }), "{v4:?}");
        for older in [Some(8), Some(5), None] {
            let v2 = collect_tracing_for(&gc_only, older).unwrap();
            assert!(matches!(v2, CollectTracing::V2 { request_rundown: false, .. }), "{v2:?}");
        }
        // The default rundown and none are what every runtime takes.
        let default = collect_tracing_for(&request(DEFAULT_RUNDOWN_KEYWORD), Some(8)).unwrap();
        assert_eq!(default.code(), CommandCode::CollectTracing);
        assert!(!rundown_mask_unsupported(&request(0), None));
    }

    fn runtime_provider() -> ProviderConfig {
        ProviderConfig {
            name: "Microsoft-Windows-DotNETRuntime".into(),
            keywords: 0x1,
            level: EventLevel::Informational,
            arguments: None,
        }
    }

    #[test]
    fn ready_made_messages_match_the_reference_byte_for_byte() {
        let magic = b"DOTNET_IPC_V1\0";
        let expect = |tail: &[u8]| [magic.as_slice(), tail].concat();
        assert_eq!(Request::ProcessInfo.encode().unwrap(), expect(&[0x14, 0, 4, 0, 0, 0]));
        assert_eq!(
            Request::EnablePerfMap(PerfMapType::PerfMapOnly).encode().unwrap(),
            expect(&[0x18, 0, 4, 5, 0, 0, 3, 0, 0, 0])
        );
        assert_eq!(Request::DisablePerfMap.encode().unwrap(), expect(&[0x14, 0, 4, 6, 0, 0]));
        assert_eq!(Request::ProcessInfo2.encode().unwrap(), expect(&[0x14, 0, 4, 4, 0, 0]));
        assert_eq!(Request::ProcessInfo3.encode().unwrap(), expect(&[0x14, 0, 4, 8, 0, 0]));
        assert_eq!(Request::ResumeRuntime.encode().unwrap(), expect(&[0x14, 0, 4, 1, 0, 0]));
        assert_eq!(
            Request::StopTracing { session_id: 0x1122_3344_5566_7788 }.encode().unwrap(),
            expect(&[0x1c, 0, 2, 1, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11])
        );
    }

    /// The 119-byte CollectTracing2 of `dotnet/runtime` issue #42382
    /// (docs/protocol/diagnostic-ipc.md §3.8).
    #[test]
    fn collect_tracing2_worked_example() {
        let request = Request::CollectTracing(CollectTracing::V2 {
            circular_buffer_mb: 256,
            format: TraceFormat::NetTrace,
            request_rundown: true,
            providers: vec![ProviderConfig {
                name: "Microsoft-Windows-DotNETRuntime".into(),
                keywords: 0xFFFF_FFFF_FFFF_FFBF,
                level: EventLevel::Verbose,
                arguments: Some(String::new()),
            }],
        });
        let mut expected = b"DOTNET_IPC_V1\0".to_vec();
        expected.extend_from_slice(&[0x77, 0x00, 0x02, 0x03, 0x00, 0x00]);
        expected.extend_from_slice(&[0x00, 0x01, 0x00, 0x00]);
        expected.extend_from_slice(&[0x01, 0x00, 0x00, 0x00]);
        expected.push(0x01);
        expected.extend_from_slice(&[0x01, 0x00, 0x00, 0x00]);
        expected.extend_from_slice(&[0xbf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        expected.extend_from_slice(&[0x05, 0x00, 0x00, 0x00]);
        expected.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
        for c in "Microsoft-Windows-DotNETRuntime\0".bytes() {
            expected.extend_from_slice(&[c, 0]);
        }
        expected.extend_from_slice(&[0x01, 0x00, 0x00, 0x00, 0x00, 0x00]);
        assert_eq!(expected.len(), 119);
        assert_eq!(request.encode().unwrap(), expected);
    }

    #[test]
    fn collect_tracing_1_3_4_field_order() {
        let providers = vec![runtime_provider()];
        let provider_bytes = || {
            let mut p = 1u32.to_le_bytes().to_vec();
            p.extend_from_slice(&1u64.to_le_bytes());
            p.extend_from_slice(&4u32.to_le_bytes());
            p.extend_from_slice(&utf16z("Microsoft-Windows-DotNETRuntime"));
            p.extend_from_slice(&0u32.to_le_bytes());
            p
        };
        let prefix = [64u32.to_le_bytes(), 1u32.to_le_bytes()].concat();
        let cases = [
            (
                CollectTracing::V1 {
                    circular_buffer_mb: 64,
                    format: TraceFormat::NetTrace,
                    providers: providers.clone(),
                },
                0x02,
                vec![],
            ),
            (
                CollectTracing::V3 {
                    circular_buffer_mb: 64,
                    format: TraceFormat::NetTrace,
                    request_rundown: false,
                    request_stackwalk: true,
                    providers: providers.clone(),
                },
                0x04,
                vec![0, 1],
            ),
            (
                CollectTracing::V4 {
                    circular_buffer_mb: 64,
                    format: TraceFormat::NetTrace,
                    rundown_keyword: 0x8,
                    request_stackwalk: false,
                    providers: providers.clone(),
                },
                0x05,
                [8u64.to_le_bytes().as_slice(), &[0]].concat(),
            ),
        ];
        for (ct, id, middle) in cases {
            let payload = [prefix.as_slice(), &middle, &provider_bytes()].concat();
            let mut expected = header((20 + payload.len()) as u16, 2, id);
            expected.extend_from_slice(&payload);
            assert_eq!(Request::CollectTracing(ct).encode().unwrap(), expected, "id {id}");
        }
    }

    #[test]
    fn collect_tracing5_streaming_with_filter() {
        let ct = CollectTracing::V5Streaming {
            circular_buffer_mb: 16,
            format: TraceFormat::NetTrace,
            rundown_keyword: 0,
            request_stackwalk: false,
            providers: vec![
                FilteredProvider {
                    provider: runtime_provider(),
                    filter: Some(EventFilter::Only(vec![1, 2])),
                },
                FilteredProvider {
                    provider: ProviderConfig {
                        name: "My".into(),
                        keywords: u64::MAX,
                        level: EventLevel::Verbose,
                        arguments: Some("a=b".into()),
                    },
                    filter: None,
                },
            ],
        };
        let mut payload = Vec::new();
        payload.extend_from_slice(&0u32.to_le_bytes()); // session_type
        payload.extend_from_slice(&16u32.to_le_bytes());
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes());
        payload.push(0);
        payload.extend_from_slice(&2u32.to_le_bytes());
        payload.extend_from_slice(&1u64.to_le_bytes());
        payload.extend_from_slice(&4u32.to_le_bytes());
        payload.extend_from_slice(&utf16z("Microsoft-Windows-DotNETRuntime"));
        payload.extend_from_slice(&0u32.to_le_bytes());
        payload.push(1);
        payload.extend_from_slice(&[2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
        payload.extend_from_slice(&u64::MAX.to_le_bytes());
        payload.extend_from_slice(&5u32.to_le_bytes());
        payload.extend_from_slice(&utf16z("My"));
        payload.extend_from_slice(&utf16z("a=b"));
        payload.push(0); // no filter: enable 0, empty list
        payload.extend_from_slice(&0u32.to_le_bytes());
        let mut expected = header((20 + payload.len()) as u16, 2, 6);
        expected.extend_from_slice(&payload);
        assert_eq!(Request::CollectTracing(ct).encode().unwrap(), expected);
    }

    #[test]
    fn collect_tracing5_user_events() {
        let ct = CollectTracing::V5UserEvents {
            rundown_keyword: 0,
            providers: vec![UserEventsProvider {
                provider: runtime_provider(),
                filter: Some(EventFilter::Except(vec![7])),
                tracepoints: TracepointConfig {
                    default_name: Some("tp_all".into()),
                    sets: vec![TracepointSet { name: "tp_gc".into(), event_ids: vec![1, 2] }],
                },
            }],
        };
        let mut payload = Vec::new();
        payload.extend_from_slice(&1u32.to_le_bytes()); // session_type user_events
        payload.extend_from_slice(&0u64.to_le_bytes()); // rundownKeyword; no buffer/format
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&1u64.to_le_bytes());
        payload.extend_from_slice(&4u32.to_le_bytes());
        payload.extend_from_slice(&utf16z("Microsoft-Windows-DotNETRuntime"));
        payload.extend_from_slice(&0u32.to_le_bytes());
        payload.push(0);
        payload.extend_from_slice(&[1, 0, 0, 0, 7, 0, 0, 0]);
        payload.extend_from_slice(&utf16z("tp_all"));
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&utf16z("tp_gc"));
        payload.extend_from_slice(&[2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
        let mut expected = header((20 + payload.len()) as u16, 2, 6);
        expected.extend_from_slice(&payload);
        assert_eq!(Request::CollectTracing(ct).encode().unwrap(), expected);
    }

    #[test]
    fn user_events_tracepoint_rules() {
        let with = |tracepoints| {
            Request::CollectTracing(CollectTracing::V5UserEvents {
                rundown_keyword: 0,
                providers: vec![UserEventsProvider {
                    provider: runtime_provider(),
                    filter: None,
                    tracepoints,
                }],
            })
            .encode()
        };
        let name = "Microsoft-Windows-DotNETRuntime".to_string();
        assert_eq!(
            with(TracepointConfig { default_name: None, sets: vec![] }),
            Err(EncodeError::NoTracepoint { provider: name.clone() })
        );
        let set = |n: &str, ids: Vec<u32>| TracepointSet { name: n.into(), event_ids: ids };
        assert_eq!(
            with(TracepointConfig { default_name: None, sets: vec![set("a", vec![])] }),
            Err(EncodeError::EmptyTracepointSet { provider: name.clone(), tracepoint: "a".into() })
        );
        assert_eq!(
            with(TracepointConfig {
                default_name: None,
                sets: vec![set("a", vec![1, 2]), set("b", vec![2])]
            }),
            Err(EncodeError::DuplicateTracepointEvent { provider: name, event_id: 2 })
        );
    }

    #[test]
    fn encode_refusals() {
        let big = ProviderConfig { arguments: Some("x".repeat(40_000)), ..runtime_provider() };
        let err = Request::CollectTracing(CollectTracing::V2 {
            circular_buffer_mb: 1,
            format: TraceFormat::NetTrace,
            request_rundown: false,
            providers: vec![big],
        })
        .encode()
        .unwrap_err();
        assert!(
            matches!(err, EncodeError::TooLarge { command: CommandCode::CollectTracing2, size }
                if size == 20 + 9 + 4 + 12 + 68 + 4 + 80_002),
            "{err:?}"
        );
        let ct2 = |providers, buffer| {
            Request::CollectTracing(CollectTracing::V2 {
                circular_buffer_mb: buffer,
                format: TraceFormat::NetTrace,
                request_rundown: false,
                providers,
            })
            .encode()
        };
        assert_eq!(ct2(vec![], 1), Err(EncodeError::NoProviders));
        assert_eq!(ct2(vec![runtime_provider()], 0), Err(EncodeError::ZeroBuffer));
        let unnamed = ProviderConfig { name: String::new(), ..runtime_provider() };
        assert_eq!(
            ct2(vec![runtime_provider(), unnamed], 1),
            Err(EncodeError::EmptyProviderName { index: 1 })
        );
        let nul = ProviderConfig { name: "a\0b".into(), ..runtime_provider() };
        assert_eq!(ct2(vec![nul], 1), Err(EncodeError::NulInString { value: "a\0b".into() }));
        assert_eq!(
            ct2(vec![runtime_provider(); 1001], 1),
            Err(EncodeError::TooManyProviders { count: 1001 })
        );
    }

    #[test]
    fn oldest_command_for_each_request() {
        let plain = FilteredProvider { provider: runtime_provider(), filter: None };
        let filtered =
            FilteredProvider { filter: Some(EventFilter::Only(vec![1])), ..plain.clone() };
        let request = |providers: Vec<FilteredProvider>, rundown_keyword, request_stackwalk| {
            oldest_collect_tracing(&TracingRequest {
                circular_buffer_mb: 64,
                providers,
                rundown_keyword,
                request_stackwalk,
                buffering_mode: None,
            })
            .code()
        };
        use CommandCode as C;
        assert_eq!(request(vec![plain.clone()], 0, true), C::CollectTracing2);
        assert_eq!(request(vec![plain.clone()], DEFAULT_RUNDOWN_KEYWORD, true), C::CollectTracing);
        assert_eq!(request(vec![plain.clone()], 0, false), C::CollectTracing3);
        assert_eq!(
            request(vec![plain.clone()], DEFAULT_RUNDOWN_KEYWORD, false),
            C::CollectTracing3
        );
        assert_eq!(request(vec![plain.clone()], 0x8, true), C::CollectTracing4);
        assert_eq!(request(vec![plain.clone(), filtered], 0, true), C::CollectTracing5);
        let ct2 = oldest_collect_tracing(&TracingRequest {
            circular_buffer_mb: 64,
            providers: vec![plain],
            rundown_keyword: 0,
            request_stackwalk: true,
            buffering_mode: None,
        });
        assert_eq!(
            ct2,
            CollectTracing::V2 {
                circular_buffer_mb: 64,
                format: TraceFormat::NetTrace,
                request_rundown: false,
                providers: vec![runtime_provider()],
            }
        );
    }
}
