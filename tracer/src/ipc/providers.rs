//! Provider lists in dotnet-trace's `--providers` syntax and named profiles. Pure parsing.
//!
//! Syntax: comma-separated `Name[:Keywords[:Level[:Arguments]]]`
//! * `Keywords`: hexadecimal with or without `0x`; empty or absent = all keywords.
//! * `Level`: `0`–`5` or a level name (`LogAlways`, `Critical`, `Error`, `Warning`,
//!   `Informational`, `Verbose`, any case); empty or absent = Verbose, as dotnet-trace does.
//! * `Arguments`: the rest of the entry, passed unchanged (`key=value;key=value`). A value in
//!   double quotes may hold `,` `;` `=` and `:` (`Metrics="MyApp,System.Net.Http"`): commas
//!   inside quotes do not end the entry, and the runtime takes the quoted value whole
//!   (docs/protocol/diagnostic-ipc.md §3.4, "Arguments").
//!
//! Profiles:
//! * `gc`: `Microsoft-Windows-DotNETRuntime:0x1:4` — GC keyword at Informational (GCStart,
//!   GCEnd, GCHeapStats, …), the cheapest useful session.
//! * `default`: dotnet-trace's default when no profile is given (`cpu-sampling`, as documented
//!   on learn.microsoft.com for dotnet-trace ≤ 9 and printed by the tool itself):
//!   `Microsoft-DotNETCore-SampleProfiler:0xF00000000000:4` and
//!   `Microsoft-Windows-DotNETRuntime:0x14C14FCCBD:4`.
//! * `counters`: the runtime's counters (GC heap size, CPU usage, thread pool, …) every second,
//!   as dotnet-counters asks for them: `System.Runtime:0xFFFFFFFF:5:EventCounterIntervalSec=1`.
//!   With `--metrics-addr` each counter is also a Prometheus series per process.
//!
//! Profiles that sample stacks (`default`, `dotnet-sampled-thread-time`) also ask for the
//! runtime's method events ([`with_method_events`]) and the rundown: they name the frames of
//! the stacks the sample profiler sends (docs/protocol/nettrace.md §4.6).

use thiserror::Error;

use tracer_decode::counters::{METRICS_PROVIDER, MeterSession};
use tracer_decode::diagnostic_ipc::{
    DEFAULT_RUNDOWN_KEYWORD, EventLevel, FilteredProvider, ProviderConfig,
};

pub const RUNTIME_PROVIDER: &str = "Microsoft-Windows-DotNETRuntime";
pub const SAMPLE_PROFILER_PROVIDER: &str = "Microsoft-DotNETCore-SampleProfiler";
/// The runtime's EventSource of counters.
pub const SYSTEM_RUNTIME_PROVIDER: &str = "System.Runtime";
/// How often the `counters` profile asks for every counter's value (seconds).
pub const COUNTER_INTERVAL_SECS: u32 = 1;

/// Names accepted by [`profile`], for `--help` and error messages: tracer's own, then
/// dotnet-trace's (same names, same providers; docs/protocol/diagnostic-ipc.md "Profiles").
pub const PROFILE_NAMES: [&str; 8] = [
    "gc",
    "default",
    "counters",
    "dotnet-common",
    "dotnet-sampled-thread-time",
    "gc-verbose",
    "gc-collect",
    "database",
];
/// The runtime's private provider (some GC events of `gc-collect`).
pub const RUNTIME_PRIVATE_PROVIDER: &str = "Microsoft-Windows-DotNETRuntimePrivate";
/// Runtime keywords of dotnet-trace's `dotnet-common`: GC, AssemblyLoader, Loader, JIT,
/// Exception, Threading, JittedMethodILToNativeMap, Compilation.
const DOTNET_COMMON_KEYWORDS: u64 =
    0x1 | 0x4 | 0x8 | 0x10 | 0x8000 | 0x10000 | 0x20000 | 0x10_0000_0000;
/// Runtime keywords GC, GCHandle, Exception (`gc-verbose`).
const GC_VERBOSE_KEYWORDS: u64 = 0x1 | 0x2 | 0x8000;
/// `System.Threading.Tasks.TplEventSource` keyword TasksFlowActivityIds (`database`).
const TPL_TASKS_FLOW_ACTIVITY_IDS: u64 = 0x80;
/// `Microsoft-Diagnostics-DiagnosticSource` keywords Messages and Events (`database`).
const DIAGNOSTIC_SOURCE_MESSAGES_AND_EVENTS: u64 = 0x1 | 0x2;
/// What `database` asks DiagnosticSource to forward: ADO.NET (SqlClient) and Entity Framework
/// Core command start/stop, with the command's text and connection facts (dotnet-trace's spec,
/// quoted because it contains `;`).
const DATABASE_FILTER_AND_PAYLOAD_SPECS: &str = concat!(
    "FilterAndPayloadSpecs=\"",
    "SqlClientDiagnosticListener/System.Data.SqlClient.WriteCommandBefore@Activity1Start:-Command;",
    "Command.CommandText;ConnectionId;Operation;Command.Connection.ServerVersion;",
    "Command.CommandTimeout;Command.CommandType;Command.Connection.ConnectionString;",
    "Command.Connection.Database;Command.Connection.DataSource;Command.Connection.PacketSize\r\n",
    "SqlClientDiagnosticListener/System.Data.SqlClient.WriteCommandAfter@Activity1Stop:\r\n",
    "Microsoft.EntityFrameworkCore/Microsoft.EntityFrameworkCore.Database.Command.",
    "CommandExecuting@Activity2Start:-Command.CommandText;Command;ConnectionId;IsAsync;",
    "Command.Connection.ClientConnectionId;Command.Connection.ServerVersion;",
    "Command.CommandTimeout;Command.CommandType;Command.Connection.ConnectionString;",
    "Command.Connection.Database;Command.Connection.DataSource;Command.Connection.PacketSize\r\n",
    "Microsoft.EntityFrameworkCore/Microsoft.EntityFrameworkCore.Database.Command.",
    "CommandExecuted@Activity2Stop:\"",
);

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProviderSpecError {
    #[error("empty provider entry #{index} in {spec:?}: remove the extra comma")]
    EmptyEntry { spec: String, index: usize },
    #[error("provider entry {entry:?} has no provider name before ':'")]
    MissingName { entry: String },
    #[error(
        "the quote opened at byte {at} of {spec:?} is not closed: end the quoted argument \
         value with '\"'"
    )]
    UnclosedQuote { spec: String, at: usize },
    #[error(
        "provider name {name:?} holds '=' or ';': it looks like the rest of the previous \
         provider's arguments, cut at a comma. Quote an argument value that holds commas, e.g. \
         'System.Diagnostics.Metrics:0x2:4:Metrics=\"MyApp,System.Net.Http\"'"
    )]
    ArgumentsOutsideQuotes { name: String },
    #[error("keywords {value:?} of provider {provider:?} are not a 64-bit hex number (e.g. 0x1)")]
    BadKeywords { provider: String, value: String },
    #[error(
        "level {value:?} of provider {provider:?} is not 0-5 or one of LogAlways, Critical, \
         Error, Warning, Informational, Verbose"
    )]
    BadLevel { provider: String, value: String },
    #[error(
        "unknown profile {name:?}: known profiles are gc, default, counters, dotnet-common, \
         dotnet-sampled-thread-time, gc-verbose, gc-collect, database"
    )]
    UnknownProfile { name: String },
    #[error(
        "providers {first:?} and {second:?} are the same provider (names compare ignoring case, \
         and user_events tracepoint names map every character but ASCII letters and digits to \
         '_'): list each provider once"
    )]
    Duplicate { first: String, second: String },
}

/// Parses a `--providers` value into providers without event filters. A provider listed twice
/// (also as names that differ only in case or in characters other than ASCII letters and digits,
/// e.g. `A-B` and `A.B`, which would share a user_events tracepoint) is refused.
pub fn parse_providers(spec: &str) -> Result<Vec<FilteredProvider>, ProviderSpecError> {
    let providers = split_entries(spec)?
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(ProviderSpecError::EmptyEntry { spec: spec.to_owned(), index });
            }
            parse_entry(entry).map(|provider| FilteredProvider { provider, filter: None })
        })
        .collect::<Result<Vec<_>, _>>()?;
    refuse_duplicates(&providers)?;
    Ok(providers)
}

/// `spec` cut at each comma outside double quotes, as dotnet-trace reads a quoted argument.
fn split_entries(spec: &str) -> Result<Vec<&str>, ProviderSpecError> {
    let mut entries = Vec::new();
    let (mut start, mut open_quote) = (0, None);
    for (at, c) in spec.char_indices() {
        match (c, open_quote) {
            ('"', None) => open_quote = Some(at),
            ('"', Some(_)) => open_quote = None,
            (',', None) => {
                entries.push(&spec[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    if let Some(at) = open_quote {
        return Err(ProviderSpecError::UnclosedQuote { spec: spec.to_owned(), at });
    }
    entries.push(&spec[start..]);
    Ok(entries)
}

/// The form under which two provider names are the same provider: case folded, and every
/// character but ASCII letters and digits as `_` (as in user_events tracepoint names).
pub fn provider_key(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
        .collect()
}

/// Refuses a list naming one provider twice (see [`provider_key`]), naming both entries.
pub fn refuse_duplicates(providers: &[FilteredProvider]) -> Result<(), ProviderSpecError> {
    let mut seen: std::collections::HashMap<String, &str> = Default::default();
    for p in providers {
        let name = p.provider.name.as_str();
        if let Some(first) = seen.insert(provider_key(name), name) {
            return Err(ProviderSpecError::Duplicate {
                first: first.to_owned(),
                second: name.to_owned(),
            });
        }
    }
    Ok(())
}

fn parse_entry(entry: &str) -> Result<ProviderConfig, ProviderSpecError> {
    let mut parts = entry.splitn(4, ':');
    let name = parts.next().unwrap_or_default().trim();
    if name.is_empty() {
        return Err(ProviderSpecError::MissingName { entry: entry.to_owned() });
    }
    // No EventSource name holds these; an argument list cut at a comma does.
    if name.contains(['=', ';', '"']) {
        return Err(ProviderSpecError::ArgumentsOutsideQuotes { name: name.to_owned() });
    }
    let keywords = match parts.next().map(str::trim).filter(|k| !k.is_empty()) {
        None => u64::MAX,
        Some(k) => {
            let digits = k.strip_prefix("0x").or_else(|| k.strip_prefix("0X")).unwrap_or(k);
            u64::from_str_radix(digits, 16).map_err(|_| ProviderSpecError::BadKeywords {
                provider: name.to_owned(),
                value: k.to_owned(),
            })?
        }
    };
    let level = match parts.next().map(str::trim).filter(|l| !l.is_empty()) {
        None => EventLevel::Verbose,
        Some(l) => parse_level(l).ok_or_else(|| ProviderSpecError::BadLevel {
            provider: name.to_owned(),
            value: l.to_owned(),
        })?,
    };
    let arguments = parts.next().map(str::to_owned);
    Ok(ProviderConfig { name: name.to_owned(), keywords, level, arguments })
}

fn parse_level(value: &str) -> Option<EventLevel> {
    if let Ok(n) = value.parse::<u32>() {
        return EventLevel::from_u32(n);
    }
    let levels = [
        ("logalways", EventLevel::LogAlways),
        ("critical", EventLevel::Critical),
        ("error", EventLevel::Error),
        ("warning", EventLevel::Warning),
        ("informational", EventLevel::Informational),
        ("verbose", EventLevel::Verbose),
    ];
    levels.iter().find(|(name, _)| value.eq_ignore_ascii_case(name)).map(|(_, level)| *level)
}

/// The providers of several profiles together (`--profile a,b`), each provider once; with the
/// method events when one of them samples stacks ([`samples_stacks`]).
pub fn profiles(names: &[String]) -> Result<Vec<FilteredProvider>, ProviderSpecError> {
    let mut providers = Vec::new();
    for name in names {
        providers.extend(profile(name.trim())?);
    }
    refuse_duplicates(&providers)?;
    if names.iter().any(|name| samples_stacks(name)) {
        with_method_events(&mut providers);
    }
    Ok(providers)
}

/// The runtime provider's keywords that name managed code: Loader (0x8: module loads, which
/// name a method's module) and JIT (0x10: method loads and unloads), at verbose level, where
/// the method events carry names.
pub const METHOD_EVENTS_KEYWORDS: u64 = 0x8 | 0x10;
pub const METHOD_EVENTS_LEVEL: EventLevel = EventLevel::Verbose;

/// Whether the profile's sessions sample stacks (the runtime's sample profiler).
pub fn samples_stacks(profile: &str) -> bool {
    profile.trim() == "dotnet-sampled-thread-time"
}

/// Makes `providers` ask for the method events ([`METHOD_EVENTS_KEYWORDS`] at
/// [`METHOD_EVENTS_LEVEL`]): merged into the runtime provider's entry when there is one (a
/// session enables each provider's events from one entry, so its keywords are OR'd and its
/// level raised to verbose for all of them), else as an entry of its own.
pub fn with_method_events(providers: &mut Vec<FilteredProvider>) {
    let runtime = providers
        .iter_mut()
        .find(|p| provider_key(&p.provider.name) == provider_key(RUNTIME_PROVIDER));
    match runtime {
        Some(entry) => {
            entry.provider.keywords |= METHOD_EVENTS_KEYWORDS;
            entry.provider.level = entry.provider.level.max(METHOD_EVENTS_LEVEL);
        }
        None => providers.push(FilteredProvider {
            provider: ProviderConfig {
                name: RUNTIME_PROVIDER.to_owned(),
                keywords: METHOD_EVENTS_KEYWORDS,
                level: METHOD_EVENTS_LEVEL,
                arguments: None,
            },
            filter: None,
        }),
    }
}

/// The runtime's GC keyword: `gc-collect`'s rundown mask (the GC state at the end, nothing
/// about methods or modules).
pub const GC_RUNDOWN_KEYWORD: u64 = 0x1;

/// The rundown keyword mask the profiles ask for, 0 for none: `gc-collect` asks for the GC-only
/// rundown, as dotnet-trace's does (runtimes before .NET 9 cannot be asked for a mask: their
/// sessions run without rundown, docs/protocol/diagnostic-ipc.md §3.3); profiles that sample
/// stacks for the default one, which lists every method with code when the session stops (a
/// saved `.nettrace` then names frames of methods compiled before the session).
pub fn profiles_rundown_keyword(names: &[String]) -> u64 {
    names.iter().fold(0, |mask, name| {
        mask | match name.trim() {
            "gc-collect" => GC_RUNDOWN_KEYWORD,
            name if samples_stacks(name) => DEFAULT_RUNDOWN_KEYWORD,
            _ => 0,
        }
    })
}

/// The providers of a named profile.
pub fn profile(name: &str) -> Result<Vec<FilteredProvider>, ProviderSpecError> {
    let with_arguments =
        |name: &str, keywords, level, arguments: Option<String>| FilteredProvider {
            provider: ProviderConfig { name: name.to_owned(), keywords, level, arguments },
            filter: None,
        };
    let provider = |name: &str, keywords, level| with_arguments(name, keywords, level, None);
    match name {
        "gc" => Ok(vec![provider(RUNTIME_PROVIDER, 0x1, EventLevel::Informational)]),
        // The runtime's events only: EventPipe's sample profiler suspends the runtime about a
        // thousand times a second (6 % of a CPU-bound workload's throughput, and its
        // suspensions are most of the lines, measured: docs/protocol/profiling.md); where CPU
        // goes is `tracer profile`'s question, sampled in the kernel.
        "default" => {
            Ok(vec![provider(RUNTIME_PROVIDER, 0x14_C14F_CCBD, EventLevel::Informational)])
        }
        "counters" => Ok(vec![with_arguments(
            SYSTEM_RUNTIME_PROVIDER,
            0xFFFF_FFFF,
            EventLevel::Verbose,
            Some(format!("EventCounterIntervalSec={COUNTER_INTERVAL_SECS}")),
        )]),
        "dotnet-common" => {
            Ok(vec![provider(RUNTIME_PROVIDER, DOTNET_COMMON_KEYWORDS, EventLevel::Informational)])
        }
        "dotnet-sampled-thread-time" => Ok(vec![provider(
            SAMPLE_PROFILER_PROVIDER,
            0xF000_0000_0000,
            EventLevel::Informational,
        )]),
        "gc-verbose" => {
            Ok(vec![provider(RUNTIME_PROVIDER, GC_VERBOSE_KEYWORDS, EventLevel::Verbose)])
        }
        "gc-collect" => Ok(vec![
            provider(RUNTIME_PROVIDER, 0x1, EventLevel::Informational),
            provider(RUNTIME_PRIVATE_PROVIDER, 0x1, EventLevel::Informational),
        ]),
        "database" => Ok(vec![
            provider(
                "System.Threading.Tasks.TplEventSource",
                TPL_TASKS_FLOW_ACTIVITY_IDS,
                EventLevel::Informational,
            ),
            with_arguments(
                "Microsoft-Diagnostics-DiagnosticSource",
                DIAGNOSTIC_SOURCE_MESSAGES_AND_EVENTS,
                EventLevel::Verbose,
                Some(DATABASE_FILTER_AND_PAYLOAD_SPECS.to_owned()),
            ),
        ]),
        _ => Err(ProviderSpecError::UnknownProfile { name: name.to_owned() }),
    }
}

/// `--meters`: which `System.Diagnostics.Metrics` meters every session asks the runtime for,
/// with the settings every client of a shared Meter session must agree on (docs/protocol/
/// counters.md §4, "Sessions and what the runtime refuses").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeterRequest {
    /// `Meter`, `Meter\instrument`, `*` or `Prefix*` (the last two on .NET 9+).
    pub meters: Vec<String>,
    /// `RefreshInterval`: seconds between two publications of every instrument.
    pub refresh_secs: u32,
}

/// The meters `--meters` asks for by default: the runtime's own (its meter on .NET 9+, its
/// EventCounters before) and the networking and ASP.NET Core meters every service has.
pub const DEFAULT_METERS: [&str; 5] = [
    SYSTEM_RUNTIME_PROVIDER,
    "System.Net.Http",
    "System.Net.NameResolution",
    "Microsoft.AspNetCore.Hosting",
    "Microsoft.AspNetCore.Server.Kestrel",
];
/// `RefreshInterval`, `MaxTimeSeries` and `MaxHistograms` as dotnet-monitor sets them: a shared
/// session keeps the first client's, and refuses another client's that differ.
pub const DEFAULT_METER_REFRESH_SECS: u32 = 5;
pub const METER_MAX_TIME_SERIES: u32 = 1000;
pub const METER_MAX_HISTOGRAMS: u32 = 20;
/// The first runtime with shared Meter sessions (`SessionId=SHARED`, a `ClientId` each).
pub const SHARED_METER_SESSION_MAJOR: u32 = 8;
/// The first runtime with the `System.Runtime` meter; before it, its EventCounters.
pub const RUNTIME_METER_MAJOR: u32 = 9;
/// The `SessionId` of the runtime's shared Meter session.
pub const SHARED_METER_SESSION: &str = "SHARED";

impl MeterRequest {
    /// The providers of a session with a runtime of `major` (`None`: unknown), for the client
    /// `client_id`: `providers`, plus the Meter provider unless they have one (an explicit one
    /// wins), plus the `System.Runtime` EventCounters when the runtime's meter is asked of a
    /// runtime without it (and `providers` do not already ask for them). With the Meter
    /// provider added, the session whose values and notices are this client's.
    pub fn providers_for(
        &self,
        providers: &[FilteredProvider],
        major: Option<u32>,
        client_id: &str,
    ) -> (Vec<FilteredProvider>, Option<MeterSession>) {
        let mut out = providers.to_vec();
        let has = |out: &[FilteredProvider], name: &str| {
            out.iter().any(|p| provider_key(&p.provider.name) == provider_key(name))
        };
        let runtime_meter = MeterSession { meters: self.meters.clone(), ..MeterSession::default() }
            .wants(SYSTEM_RUNTIME_PROVIDER, "");
        if runtime_meter
            && major.is_none_or(|m| m < RUNTIME_METER_MAJOR)
            && !has(&out, SYSTEM_RUNTIME_PROVIDER)
        {
            out.push(FilteredProvider {
                provider: ProviderConfig {
                    name: SYSTEM_RUNTIME_PROVIDER.to_owned(),
                    keywords: 0xFFFF_FFFF,
                    level: EventLevel::Verbose,
                    arguments: Some(format!("EventCounterIntervalSec={}", self.refresh_secs)),
                },
                filter: None,
            });
        }
        if has(&out, METRICS_PROVIDER) {
            return (out, None);
        }
        let shared = major.is_some_and(|m| m >= SHARED_METER_SESSION_MAJOR);
        let session = MeterSession {
            session_id: if shared { SHARED_METER_SESSION.to_owned() } else { client_id.to_owned() },
            client_id: client_id.to_owned(),
            meters: self.meters.clone(),
        };
        let arguments = format!(
            "SessionId={};Metrics={};RefreshInterval={};MaxTimeSeries={METER_MAX_TIME_SERIES};\
             MaxHistograms={METER_MAX_HISTOGRAMS};ClientId={client_id}",
            session.session_id,
            self.meters.join(","),
            self.refresh_secs,
        );
        out.push(FilteredProvider {
            provider: ProviderConfig {
                name: METRICS_PROVIDER.to_owned(),
                // TimeSeriesValues, at Informational: what dotnet-counters and dotnet-monitor ask.
                keywords: 0x2,
                level: EventLevel::Informational,
                arguments: Some(arguments),
            },
            filter: None,
        });
        (out, Some(session))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str, keywords: u64, level: EventLevel, args: Option<&str>) -> ProviderConfig {
        ProviderConfig { name: name.into(), keywords, level, arguments: args.map(str::to_owned) }
    }

    fn parsed(spec: &str) -> Vec<ProviderConfig> {
        parse_providers(spec).unwrap().into_iter().map(|p| p.provider).collect()
    }

    #[test]
    fn dotnet_trace_syntax() {
        assert_eq!(
            parsed("Microsoft-Windows-DotNETRuntime:0x1:4,MyEventSource"),
            vec![
                config(RUNTIME_PROVIDER, 1, EventLevel::Informational, None),
                config("MyEventSource", u64::MAX, EventLevel::Verbose, None),
            ]
        );
        assert_eq!(
            parsed("A:ff:Warning:key=v;k2=a:b"),
            vec![config("A", 0xff, EventLevel::Warning, Some("key=v;k2=a:b"))]
        );
        assert_eq!(
            parsed("A::informational"),
            vec![config("A", u64::MAX, EventLevel::Informational, None)]
        );
        assert_eq!(parsed(" A:0X10 "), vec![config("A", 0x10, EventLevel::Verbose, None)]);
        assert_eq!(parsed("A:1:5:"), vec![config("A", 1, EventLevel::Verbose, Some(""))]);
    }

    #[test]
    fn meters_are_a_shared_session_from_net_8_and_the_runtime_counters_before_net_9() {
        let request =
            MeterRequest { meters: vec!["System.Runtime".into(), "Shop".into()], refresh_secs: 5 };
        let names = |providers: &[FilteredProvider]| -> Vec<String> {
            providers.iter().map(|p| p.provider.name.clone()).collect()
        };
        let gc = profile("gc").unwrap();
        let (net8, session) = request.providers_for(&gc, Some(8), "tracer-1-2-3");
        assert_eq!(names(&net8), [RUNTIME_PROVIDER, SYSTEM_RUNTIME_PROVIDER, METRICS_PROVIDER]);
        assert_eq!(
            net8[1].provider.arguments.as_deref(),
            Some("EventCounterIntervalSec=5"),
            "the System.Runtime counters at the meters' interval"
        );
        assert_eq!(
            net8[2].provider,
            config(
                METRICS_PROVIDER,
                2,
                EventLevel::Informational,
                Some(
                    "SessionId=SHARED;Metrics=System.Runtime,Shop;RefreshInterval=5;\
                     MaxTimeSeries=1000;MaxHistograms=20;ClientId=tracer-1-2-3"
                )
            )
        );
        let session = session.unwrap();
        assert_eq!(
            (session.session_id.as_str(), session.client_id.as_str()),
            ("SHARED", "tracer-1-2-3")
        );
        // .NET 9 has the runtime's meter; .NET 6 and 7 no shared session.
        let (net9, _) = request.providers_for(&gc, Some(9), "c");
        assert_eq!(names(&net9), [RUNTIME_PROVIDER, METRICS_PROVIDER]);
        let (net6, session) = request.providers_for(&[], Some(6), "c");
        assert!(net6[1].provider.arguments.as_deref().unwrap().starts_with("SessionId=c;"));
        assert_eq!(session.unwrap().session_id, "c");
        // Providers of the user's that ask for either are kept as they are.
        let counters = profile("counters").unwrap();
        let explicit =
            parse_providers("System.Diagnostics.Metrics:0x2:5:SessionId=mine;Metrics=Shop")
                .unwrap();
        let both: Vec<FilteredProvider> = counters.iter().chain(&explicit).cloned().collect();
        assert_eq!(request.providers_for(&both, Some(8), "c"), (both, None));
    }

    #[test]
    fn quoted_argument_values_keep_their_commas() {
        let metrics = r#"System.Diagnostics.Metrics:0x2:5:SessionId=t;Metrics="SteerShop,System.Net.Http";RefreshInterval=1"#;
        assert_eq!(
            parsed(&format!("{metrics},B:1")),
            vec![
                config(
                    "System.Diagnostics.Metrics",
                    2,
                    EventLevel::Verbose,
                    Some(r#"SessionId=t;Metrics="SteerShop,System.Net.Http";RefreshInterval=1"#),
                ),
                config("B", 1, EventLevel::Verbose, None),
            ]
        );
        // Quotes anywhere in the arguments, and around a value with ':' and ';'.
        assert_eq!(
            parsed(r#"A:1:4:k="x,y:z;w",C"#),
            vec![
                config("A", 1, EventLevel::Informational, Some(r#"k="x,y:z;w""#)),
                config("C", u64::MAX, EventLevel::Verbose, None),
            ]
        );
    }

    #[test]
    fn an_argument_list_cut_at_a_comma_says_to_quote_it() {
        let unquoted = "System.Diagnostics.Metrics:0x2:5:SessionId=t;Metrics=SteerShop,\
                        System.Net.Http;RefreshInterval=1";
        let error = parse_providers(unquoted).unwrap_err();
        assert_eq!(
            error,
            ProviderSpecError::ArgumentsOutsideQuotes {
                name: "System.Net.Http;RefreshInterval=1".into()
            }
        );
        assert!(error.to_string().contains(r#"Metrics="MyApp,System.Net.Http""#), "{error}");
        assert_eq!(
            parse_providers(r#"A:1:4:k="x,B"#),
            Err(ProviderSpecError::UnclosedQuote { spec: r#"A:1:4:k="x,B"#.into(), at: 8 })
        );
        assert_eq!(
            parse_providers("B=1"),
            Err(ProviderSpecError::ArgumentsOutsideQuotes { name: "B=1".into() })
        );
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        assert_eq!(
            parse_providers("A,,B"),
            Err(ProviderSpecError::EmptyEntry { spec: "A,,B".into(), index: 1 })
        );
        assert_eq!(
            parse_providers(":1"),
            Err(ProviderSpecError::MissingName { entry: ":1".into() })
        );
        assert_eq!(
            parse_providers("A:0xZZ"),
            Err(ProviderSpecError::BadKeywords { provider: "A".into(), value: "0xZZ".into() })
        );
        assert_eq!(
            parse_providers("A:1:6"),
            Err(ProviderSpecError::BadLevel { provider: "A".into(), value: "6".into() })
        );
        assert_eq!(
            parse_providers("A:10000000000000000"),
            Err(ProviderSpecError::BadKeywords {
                provider: "A".into(),
                value: "10000000000000000".into()
            })
        );
    }

    #[test]
    fn duplicate_providers_are_refused_naming_both() {
        let dup = |first: &str, second: &str| {
            Err(ProviderSpecError::Duplicate { first: first.into(), second: second.into() })
        };
        assert_eq!(parse_providers("A,A").map(|_| ()), dup("A", "A"));
        assert_eq!(parse_providers("A-B:1,A.B:2").map(|_| ()), dup("A-B", "A.B"));
        assert_eq!(
            parse_providers("X,my-provider,My_Provider").map(|_| ()),
            dup("my-provider", "My_Provider")
        );
        let message = parse_providers("A-B,A.B").unwrap_err().to_string();
        assert!(message.contains("\"A-B\"") && message.contains("\"A.B\""), "{message}");
        assert!(parse_providers("A-B,A-C,AB").is_ok());
    }

    #[test]
    fn tracer_profiles() {
        let gc: Vec<_> = profile("gc").unwrap().into_iter().map(|p| p.provider).collect();
        assert_eq!(gc, parsed("Microsoft-Windows-DotNETRuntime:0x1:4"));
        let default: Vec<_> = profile("default").unwrap().into_iter().map(|p| p.provider).collect();
        assert_eq!(default, parsed("Microsoft-Windows-DotNETRuntime:0x00000014C14FCCBD:4"));
        let counters: Vec<_> =
            profile("counters").unwrap().into_iter().map(|p| p.provider).collect();
        assert_eq!(counters, parsed("System.Runtime:0xFFFFFFFF:5:EventCounterIntervalSec=1"));
        assert_eq!(profile("cpu"), Err(ProviderSpecError::UnknownProfile { name: "cpu".into() }));
        assert!(PROFILE_NAMES.iter().all(|n| profile(n).is_ok()));
    }

    fn of_profiles(names: &[&str]) -> Vec<ProviderConfig> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        profiles(&names).unwrap().into_iter().map(|p| p.provider).collect()
    }

    /// Sessions of the profiles that sample stacks ask for the JIT and loader events at
    /// verbose too: merged into the runtime provider, or as one of their own.
    #[test]
    fn profiles_that_sample_stacks_ask_for_the_method_events() {
        assert_eq!(
            of_profiles(&["default", "dotnet-sampled-thread-time"]),
            parsed(
                "Microsoft-Windows-DotNETRuntime:0x14C14FCCBD:5,\
                 Microsoft-DotNETCore-SampleProfiler:0xF00000000000:4"
            )
        );
        assert_eq!(
            of_profiles(&["default"]),
            parsed("Microsoft-Windows-DotNETRuntime:0x14C14FCCBD:4")
        );
        assert_eq!(
            of_profiles(&["dotnet-sampled-thread-time"]),
            parsed(
                "Microsoft-DotNETCore-SampleProfiler:0xF00000000000:4,\
                 Microsoft-Windows-DotNETRuntime:0x18:5"
            )
        );
        assert_eq!(
            of_profiles(&["gc-verbose", "dotnet-sampled-thread-time"]),
            parsed(
                "Microsoft-Windows-DotNETRuntime:0x801B:5,\
                 Microsoft-DotNETCore-SampleProfiler:0xF00000000000:4"
            )
        );
        assert_eq!(of_profiles(&["gc"]), parsed("Microsoft-Windows-DotNETRuntime:0x1:4"));
        let rundown = |names: &[&str]| {
            profiles_rundown_keyword(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(rundown(&["gc", "counters"]), 0);
        assert_eq!(rundown(&["gc-collect"]), GC_RUNDOWN_KEYWORD);
        assert_eq!(rundown(&["default"]), 0);
        assert_eq!(rundown(&["gc-collect", "dotnet-sampled-thread-time"]), DEFAULT_RUNDOWN_KEYWORD);
    }

    /// dotnet-trace's profiles, as dotnet-trace's own `--providers` spelling of each.
    #[test]
    fn dotnet_trace_profiles() {
        let of =
            |name| -> Vec<_> { profile(name).unwrap().into_iter().map(|p| p.provider).collect() };
        assert_eq!(of("dotnet-common"), parsed("Microsoft-Windows-DotNETRuntime:0x100003801D:4"));
        assert_eq!(
            of("dotnet-sampled-thread-time"),
            parsed("Microsoft-DotNETCore-SampleProfiler:0xF00000000000:4")
        );
        assert_eq!(of("gc-verbose"), parsed("Microsoft-Windows-DotNETRuntime:0x8003:5"));
        assert_eq!(
            of("gc-collect"),
            parsed(
                "Microsoft-Windows-DotNETRuntime:0x1:4,Microsoft-Windows-DotNETRuntimePrivate:0x1:4"
            )
        );
        let database = of("database");
        assert_eq!(
            database[0],
            config("System.Threading.Tasks.TplEventSource", 0x80, EventLevel::Informational, None)
        );
        assert_eq!(
            (database[1].name.as_str(), database[1].keywords, database[1].level),
            ("Microsoft-Diagnostics-DiagnosticSource", 0x3, EventLevel::Verbose)
        );
        let args = database[1].arguments.as_deref().unwrap();
        assert!(args.starts_with("FilterAndPayloadSpecs=\"SqlClientDiagnosticListener/"), "{args}");
        assert!(args.ends_with("CommandExecuted@Activity2Stop:\""), "{args}");
        assert_eq!(args.matches("\r\n").count(), 3);
        // dotnet-trace's default is these two together.
        let both =
            profiles(&["dotnet-common".into(), "dotnet-sampled-thread-time".into()]).unwrap();
        assert_eq!(both.len(), 2);
        assert_eq!(
            of_profiles(&["dotnet-common", "dotnet-sampled-thread-time"]),
            parsed(
                "Microsoft-Windows-DotNETRuntime:0x100003801D:5,\
                 Microsoft-DotNETCore-SampleProfiler:0xF00000000000:4"
            ),
            "the method events merged into dotnet-common's runtime provider"
        );
        assert_eq!(
            profiles(&["gc".into(), "gc-verbose".into()]),
            Err(ProviderSpecError::Duplicate {
                first: RUNTIME_PROVIDER.into(),
                second: RUNTIME_PROVIDER.into()
            })
        );
    }
}
