//! Runtime counters in decoded events, named as Prometheus metrics (docs/protocol/counters.md).
//!
//! Two sources:
//! * EventCounters: an EventSource with counters, enabled with the argument
//!   `EventCounterIntervalSec=N`, writes one `EventCounters` event per counter every N seconds.
//!   Its payload is an object, `Payload` (CoreCLR 8 wraps it in one unnamed object field), whose
//!   fields say which counter it is (`Name`, `DisplayName`, `DisplayUnits`), how it aggregates
//!   (`CounterType`: `Mean` for gauges, `Sum` for rates) and its value (`Mean`, or `Increment`
//!   over the interval).
//! * `System.Diagnostics.Metrics` (the `Meter` API): per instrument and tag set,
//!   `GaugeValuePublished` (`lastValue`), `CounterRateValuePublished` (`rate`, and from .NET 8
//!   the running total `value`), `UpDownCounterRateValuePublished` (`value`) and
//!   `HistogramValuePublished` (`quantiles`, and from .NET 8 the interval's `count` and `sum`),
//!   each with `meterName`, `instrumentName`, `unit` and `tags` (`k=v,k2=v2`), numbers as text.
//!
//! Each sample says what kind of value it is ([`Reading`]): a level (gauges), what a monotonic
//! counter added (EventCounters `Sum` counters, Meter counters), or a histogram's interval.
//!
//! Every string in them comes from the traced process: the names built here contain only
//! `[A-Za-z0-9_]`, are bounded in length and never take the `tracer_` prefix of tracer's own
//! families; tags become at most [`MAX_TAGS`] labels with bounded, printable values.
use std::sync::Arc;

use thiserror::Error;

use crate::nettrace::payload::write_json_and;
use crate::nettrace::{DecodedEvent, OutputEvent};

mod members;
mod meter_session;
use members::{Found, Member, MemberSink, Members, Seen};
pub use meter_session::{MeterLoss, MeterSession};

/// The event every EventCounters sample is.
pub const EVENT_COUNTERS: &str = "EventCounters";
/// Longest metric name built from a counter (bytes); longer ones are refused.
pub const MAX_METRIC_NAME: usize = 200;
/// Longest HELP text kept from a counter's display name and units (bytes); longer is cut.
pub const MAX_HELP: usize = 200;
/// The prefix of tracer's own metric families; a counter cannot take it.
pub const RESERVED_PREFIX: &str = "tracer_";
/// The EventSource of the `System.Diagnostics.Metrics` API.
pub const METRICS_PROVIDER: &str = "System.Diagnostics.Metrics";
/// Tags of one `System.Diagnostics.Metrics` value kept as labels; more: the sample is refused.
pub const MAX_TAGS: usize = 8;
/// Longest label value kept from a tag (bytes); longer is cut.
pub const MAX_LABEL_VALUE: usize = 128;
/// Quantiles one histogram value may carry (the runtime sends 3); more: the sample is refused.
pub const MAX_QUANTILES: usize = 16;
/// Labels tracer puts on every series itself: a tag of one of these names is `tag_<name>`.
pub const PROCESS_LABELS: [&str; 3] = ["pid", "container_id", "pod_uid"];

/// Metric names (with their HELP) one [`CounterReader`] keeps, each built once for the strings
/// it is made of; names past it are built for every event that has them.
pub const MAX_CACHED_NAMES: usize = 64;
/// Longest strings (bytes, together) a kept name is made of; longer: built for every event.
pub const MAX_CACHED_NAME_KEY: usize = 256;

/// One counter value, ready to be a series.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterSample {
    /// The Prometheus metric name (dotnet-monitor's naming: `systemruntime_gc_heap_size_bytes`),
    /// without the `_total` a counter's series takes.
    pub metric: Arc<str>,
    /// The display name and units: printable ASCII, no `\` or `"`, at most [`MAX_HELP`] bytes.
    pub help: Arc<str>,
    /// The instrument as OpenTelemetry names it (OTLP).
    pub instrument: Arc<Instrument>,
    /// In the metric's base unit (`MB` counters in bytes).
    pub reading: Reading,
    /// Labels from the instrument's tags (`System.Diagnostics.Metrics`), in the order sent.
    pub labels: Vec<(String, String)>,
    /// The tags' own keys (printable, at most [`MAX_LABEL_VALUE`] bytes), in the labels' order:
    /// OTLP attributes keep them (`http.request.method`, where the label is
    /// `http_request_method`).
    pub tag_keys: Vec<String>,
    /// The seconds an EventCounters value covers (`IntervalSec`, positive and finite): a `Sum`
    /// counter's value is what was added in them. `None` for `System.Diagnostics.Metrics`
    /// values and counters that do not say.
    pub interval_secs: Option<f64>,
}

/// An instrument as OpenTelemetry names it: its meter (an EventCounters counter's EventSource)
/// as the instrumentation scope, its own name and its unit (UCUM; EventCounters' `MB` and `B`
/// as `By`, the unit their values are scaled to). Printable, bounded like the metric name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instrument {
    pub scope: String,
    pub name: String,
    pub unit: String,
}

impl Instrument {
    fn new(scope: &str, name: &str, unit: &str) -> Instrument {
        let clean = |s: &str| printable(s.chars()).collect::<String>();
        Instrument { scope: clean(scope), name: clean(name), unit: clean(unit) }
    }
}

/// What one counter event says of its series, in the metric's base unit.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// The value now: a gauge, an up-down counter's sum, an EventCounters `Mean`.
    Level(f64),
    /// What a monotonic counter added over the interval, and the running total the runtime
    /// keeps where it sends one (a Meter counter's `value`, .NET 8+).
    Added { amount: f64, total: Option<f64> },
    /// A histogram's interval.
    Distribution(Distribution),
}

/// A histogram instrument's values of one interval, as the runtime aggregates them.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    /// (quantile in 0..=1, value), in the order sent (0.5, 0.95, 0.99 by default).
    pub quantiles: Vec<(f64, f64)>,
    /// How many values were recorded in the interval and their sum (.NET 8+).
    pub count_and_sum: Option<(u64, f64)>,
}

impl CounterSample {
    /// A level's value, or what a counter added in the interval; `None` for a histogram.
    pub fn value(&self) -> Option<f64> {
        match self.reading {
            Reading::Level(value) | Reading::Added { amount: value, .. } => Some(value),
            Reading::Distribution(_) => None,
        }
    }
}

/// Why an `EventCounters` event gives no sample.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CounterError {
    #[error("EventCounters event without a `Payload` object")]
    NoPayload,
    #[error("EventCounters payload without a string `{0}` field")]
    MissingName(&'static str),
    #[error("EventCounters payload of counter {counter:?} without a numeric `{field}` field")]
    MissingValue { counter: String, field: &'static str },
    #[error("counter {counter:?} has a value that is not a finite number")]
    NotFinite { counter: String },
    #[error("metric name of counter {counter:?} is {len} bytes (at most {MAX_METRIC_NAME})")]
    NameTooLong { counter: String, len: usize },
    #[error("metric name {metric:?} takes the {RESERVED_PREFIX:?} prefix of tracer's own metrics")]
    Reserved { metric: String },
    #[error("{event} without a string `{field}` field")]
    MissingField { event: &'static str, field: &'static str },
    #[error("instrument {instrument:?} has the value {value:?}, not a finite number")]
    BadValue { instrument: String, value: String },
    #[error("instrument {instrument:?} has {tags} tags (at most {MAX_TAGS})")]
    TooManyTags { instrument: String, tags: usize },
    #[error("instrument {instrument:?} has two tags named {label:?} as labels")]
    DuplicateTag { instrument: String, label: String },
    #[error(
        "instrument {instrument:?} has the quantiles {quantiles:?}, not at most \
         {MAX_QUANTILES} `q=value` pairs with q in 0..=1 and finite values"
    )]
    BadQuantiles { instrument: String, quantiles: String },
    /// The runtime said it did not publish some values (not a sample: a loss to count).
    #[error("{loss}: {message}")]
    Runtime { loss: MeterLoss, message: String },
}

/// The `System.Diagnostics.Metrics` events that carry a value, with the member holding it.
const METER_VALUES: [(&str, Member); 4] = [
    ("GaugeValuePublished", Member::LastValue),
    ("CounterRateValuePublished", Member::Rate),
    ("UpDownCounterRateValuePublished", Member::Value),
    ("HistogramValuePublished", Member::Quantiles),
];

/// Whether events of `provider` named `event` may carry a counter sample, or a notice of values
/// the runtime did not publish.
fn may_carry_sample(provider: &str, event: &str) -> bool {
    event == EVENT_COUNTERS
        || provider.eq_ignore_ascii_case(METRICS_PROVIDER)
            && (METER_VALUES.iter().any(|&(name, _)| name == event)
                || meter_session::NOTICES.iter().any(|&(name, ..)| name == event))
}

/// Reads the counter samples of a session's events on their way to output: from the decode that
/// renders each event's `fields` (no tree of the payload), with the metric names it built
/// before. Counters come every second from every traced process.
#[derive(Debug, Default)]
pub struct CounterReader {
    /// The strings of the members read (of one event at a time).
    text: String,
    names: NameCache,
    /// The Meter session whose values and notices are taken; without one, every one is.
    session: Option<MeterSession>,
}

impl CounterReader {
    /// A reader of the values and notices of `session` only ([`MeterSession`]).
    pub fn for_session(session: MeterSession) -> CounterReader {
        CounterReader { session: Some(session), ..CounterReader::default() }
    }

    /// The counter sample `event` carries, as [`counter_sample`] reads it from the decoded event.
    /// Only events whose names say they may carry one are decoded, once: into `fields_json`, the
    /// `fields` object of the event's line (for [`OutputEvent::rendered_fields`]), and into the
    /// members a sample is read from. `fields_json` is left as it was for other events, and for
    /// a payload that does not decode (its line shows why).
    pub fn read(
        &mut self,
        event: &OutputEvent,
        fields_json: &mut Vec<u8>,
    ) -> Option<Result<CounterSample, CounterError>> {
        let meta = event.metadata;
        // An unnamed event (empty name) carries none.
        if !may_carry_sample(&meta.provider, &meta.event_name) {
            return None;
        }
        let mut sink = MemberSink::new(&mut self.text);
        let decoded =
            write_json_and(meta, event.payload, event.pointer_size, fields_json, &mut sink);
        // A payload that does not decode has none of the members (as `decode` keeps it as hex).
        let found = if decoded.is_ok() { sink.found } else { Found::default() };
        let event = (meta.provider.as_str(), meta.event_name.as_str());
        sample_of(event, &found, &self.text, &mut self.names, self.session.as_ref())
    }
}

/// The counter sample `event` carries: `None` when it carries none (another event, or an
/// instrument that has no value yet).
pub fn counter_sample(event: &DecodedEvent) -> Option<Result<CounterSample, CounterError>> {
    session_sample(event, None)
}

/// [`counter_sample`] as a reader of `session` reads it.
fn session_sample(
    event: &DecodedEvent,
    session: Option<&MeterSession>,
) -> Option<Result<CounterSample, CounterError>> {
    if !may_carry_sample(event.provider, &event.event) {
        return None;
    }
    let mut text = String::new();
    let mut sink = MemberSink::new(&mut text);
    sink.walk(&event.fields);
    let found = sink.found;
    let names = &mut NameCache::default();
    sample_of((event.provider, &event.event), &found, &text, names, session)
}

/// A metric name and its HELP text.
#[derive(Debug, Clone)]
struct SeriesName {
    metric: Arc<str>,
    help: Arc<str>,
    instrument: Arc<Instrument>,
}

/// Series names by the strings they are made of (at most [`MAX_CACHED_NAMES`]).
#[derive(Debug, Default)]
struct NameCache {
    /// The strings of the name being looked up, joined.
    key: String,
    /// Looked up for every counter event: a fast hasher, seeded per process.
    names: foldhash::HashMap<Box<str>, Result<SeriesName, CounterError>>,
}

impl NameCache {
    /// The name made of `parts`, built by `build` unless it was before.
    fn get_or_build(
        &mut self,
        parts: &[&str],
        build: impl FnOnce() -> Result<SeriesName, CounterError>,
    ) -> Result<SeriesName, CounterError> {
        self.key.clear();
        for part in parts {
            // No decoded string holds a NUL (each ended at one).
            self.key.push_str(part);
            self.key.push('\0');
        }
        if let Some(known) = self.names.get(self.key.as_str()) {
            return known.clone();
        }
        let name = build();
        if self.key.len() <= MAX_CACHED_NAME_KEY && self.names.len() < MAX_CACHED_NAMES {
            self.names.insert(self.key.as_str().into(), name.clone());
        }
        name
    }
}

/// The sample (or notice) of `event` (its provider and name), from the members found in it.
fn sample_of(
    (provider, event): (&str, &str),
    found: &Found,
    text: &str,
    names: &mut NameCache,
    session: Option<&MeterSession>,
) -> Option<Result<CounterSample, CounterError>> {
    if !may_carry_sample(provider, event) {
        return None;
    }
    if event == EVENT_COUNTERS {
        return Some(event_counter(provider, found, text, names));
    }
    let top = &found.top;
    if let Some(loss) = meter_session::notice_for(event, top, text, session) {
        let message = str_of(top, Member::ErrorMessage, text).unwrap_or_default();
        let message = printable(message.chars()).take(MAX_HELP).collect();
        return Some(Err(CounterError::Runtime { loss, message }));
    }
    let &(name, member) = METER_VALUES.iter().find(|(name, _)| event == *name)?;
    if let Some(session) = session {
        // Another session's values (a shared session carries every client's meters).
        let ours = str_of(top, Member::SessionId, text) == Some(session.session_id.as_str())
            && str_of(top, Member::MeterName, text)
                .zip(str_of(top, Member::InstrumentName, text))
                .is_some_and(|(meter, instrument)| session.wants(meter, instrument));
        if !ours {
            return None;
        }
    }
    meter_value(name, member, top, text, names)
}

/// The number a member holds, times `scale`: a number, or a number written as text (the Meter
/// events write theirs as text). `Ok(None)`: absent, or empty text (no value this interval).
fn number_of(
    members: &Members,
    member: Member,
    text: &str,
    instrument: &str,
    scale: f64,
) -> Result<Option<f64>, CounterError> {
    let bad = |value: String| CounterError::BadValue { instrument: instrument.into(), value };
    let raw = match members.get(member) {
        Seen::Absent => return Ok(None),
        Seen::Number(n) => Ok(n),
        Seen::Str { start, end } => {
            let raw = &text[start as usize..end as usize];
            if raw.is_empty() {
                return Ok(None);
            }
            raw.parse::<f64>().map_err(|_| raw.to_owned())
        }
        Seen::Object | Seen::Other => Err("(not a number)".to_owned()),
    };
    let raw = raw.map_err(bad)?;
    let scaled = raw * scale;
    if scaled.is_finite() { Ok(Some(scaled)) } else { Err(bad(raw.to_string())) }
}

/// `0.5=1;0.95=2;0.99=3` as (quantile, value) pairs scaled by `scale`.
fn quantiles(instrument: &str, raw: &str, scale: f64) -> Result<Vec<(f64, f64)>, CounterError> {
    let bad =
        || CounterError::BadQuantiles { instrument: instrument.into(), quantiles: raw.into() };
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    if raw.split(';').count() > MAX_QUANTILES {
        return Err(bad());
    }
    raw.split(';')
        .map(|pair| {
            let (q, v) = pair.split_once('=').ok_or_else(bad)?;
            let (q, v) =
                (q.parse::<f64>().map_err(|_| bad())?, v.parse::<f64>().map_err(|_| bad())?);
            let v = v * scale;
            if (0.0..=1.0).contains(&q) && v.is_finite() { Ok((q, v)) } else { Err(bad()) }
        })
        .collect()
}

/// The string `member` of `members` is, if it is one.
fn str_of<'t>(members: &Members, member: Member, text: &'t str) -> Option<&'t str> {
    match members.get(member) {
        Seen::Str { start, end } => Some(&text[start as usize..end as usize]),
        _ => None,
    }
}

/// A `System.Diagnostics.Metrics` value event: named `<meter>_<instrument>[_<unit>]`, the unit
/// as OpenTelemetry names it in Prometheus ([`meter_unit_suffix`]).
fn meter_value(
    event: &'static str,
    field: Member,
    top: &Members,
    text: &str,
    names: &mut NameCache,
) -> Option<Result<CounterSample, CounterError>> {
    let string = |member: Member| {
        str_of(top, member, text).ok_or(CounterError::MissingField { event, field: member.name() })
    };
    let mut sample = || -> Result<Option<CounterSample>, CounterError> {
        let (meter, instrument, unit) =
            (string(Member::MeterName)?, string(Member::InstrumentName)?, string(Member::Unit)?);
        let scale = unit_scale(unit);
        let number = |member: Member| number_of(top, member, text, instrument, scale);
        if top.get(field) == Seen::Absent {
            return Err(CounterError::MissingField { event, field: field.name() });
        }
        // A gauge not observed yet, or a rate without a previous value, has an empty value.
        let reading = match field {
            Member::Quantiles => {
                let quantiles = quantiles(instrument, string(field)?, scale)?;
                let count = number_of(top, Member::Count, text, instrument, 1.0)?;
                let count_and_sum =
                    count.zip(number(Member::Sum)?).map(|(c, s)| (c.max(0.0) as u64, s));
                Reading::Distribution(Distribution { quantiles, count_and_sum })
            }
            Member::Rate => match (number(Member::Rate)?, number(Member::Value)?) {
                (None, None) => return Ok(None),
                (amount, total) => Reading::Added { amount: amount.unwrap_or(0.0), total },
            },
            _ => match number(field)? {
                Some(level) => Reading::Level(level),
                None => return Ok(None),
            },
        };
        let (labels, tag_keys) = tag_labels(instrument, string(Member::Tags).unwrap_or(""))?;
        let gauge = matches!(reading, Reading::Level(_));
        let SeriesName { metric, help, instrument: otel } =
            names.get_or_build(&["M", event, meter, instrument, unit], || {
                let suffix = meter_unit_suffix(unit, gauge);
                let metric = metric_name(meter, instrument, suffix.as_deref());
                Ok(SeriesName {
                    metric: checked_metric(metric, instrument)?.into(),
                    help: help_text(&format!("{instrument} of meter {meter}"), unit).into(),
                    instrument: Instrument::new(meter, instrument, unit).into(),
                })
            })?;
        let instrument = otel;
        let interval_secs = None;
        Ok(Some(CounterSample {
            metric,
            help,
            instrument,
            reading,
            labels,
            tag_keys,
            interval_secs,
        }))
    };
    sample().transpose()
}

/// `k=v,k2=v2` as labels: names normalized like counter names (`tag_` before one of
/// [`PROCESS_LABELS`] or a name starting with `__`, which Prometheus reserves), values printable.
/// The labels, and the tags' own keys ([`CounterSample::tag_keys`]).
type Tags = (Vec<(String, String)>, Vec<String>);

fn tag_labels(instrument: &str, tags: &str) -> Result<Tags, CounterError> {
    if tags.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let count = tags.split(',').count();
    if count > MAX_TAGS {
        return Err(CounterError::TooManyTags { instrument: instrument.into(), tags: count });
    }
    let labels = tags.split(',').map(|tag| {
        let (key, value) = tag.split_once('=').unwrap_or((tag, ""));
        let mut name = String::with_capacity(key.len() + 4);
        push_normalized(&mut name, if key.is_empty() { "_" } else { key });
        if PROCESS_LABELS.contains(&name.as_str()) || name.starts_with("__") {
            name.insert_str(0, "tag_");
        }
        name.truncate(MAX_LABEL_VALUE);
        let value: String = printable(value.chars()).take(MAX_LABEL_VALUE).collect();
        (name, value)
    });
    let labels: Vec<(String, String)> = labels.collect();
    // Two tags may normalize to one name (`a-b`, `a_b`): a series with a label twice would make
    // Prometheus refuse the whole scrape, every process's series with it.
    for (i, (name, _)) in labels.iter().enumerate() {
        if labels[..i].iter().any(|(seen, _)| seen == name) {
            let (instrument, label) = (instrument.into(), name.clone());
            return Err(CounterError::DuplicateTag { instrument, label });
        }
    }
    let keys = tags.split(',').map(|tag| {
        let key = tag.split_once('=').map_or(tag, |(key, _)| key);
        // ASCII: one byte a character.
        printable(key.chars()).take(MAX_LABEL_VALUE).collect::<String>()
    });
    Ok((labels, keys.collect()))
}

fn event_counter(
    provider: &str,
    found: &Found,
    text: &str,
    names: &mut NameCache,
) -> Result<CounterSample, CounterError> {
    // CoreCLR writes the payload object inside one unnamed object field; accept it bare too.
    let payload = match (found.top.get(Member::Payload), found.top.get(Member::Wrapper)) {
        (Seen::Object, _) => &found.payload,
        (Seen::Absent, Seen::Object) => match found.wrapper.get(Member::Payload) {
            Seen::Object => &found.wrapped,
            _ => return Err(CounterError::NoPayload),
        },
        _ => return Err(CounterError::NoPayload),
    };
    let text = |member: Member| {
        str_of(payload, member, text).ok_or(CounterError::MissingName(member.name()))
    };
    let name = text(Member::Name)?;
    let units = text(Member::DisplayUnits).unwrap_or("");
    let display = text(Member::DisplayName).unwrap_or(name);
    // `Sum` counters report what was added during the interval; the others are gauges.
    let sum = text(Member::CounterType) == Ok("Sum") || payload.get(Member::Mean) == Seen::Absent;
    let field = if sum { Member::Increment } else { Member::Mean };
    let Seen::Number(raw) = payload.get(field) else {
        return Err(CounterError::MissingValue { counter: name.to_owned(), field: field.name() });
    };
    let value = raw * unit_scale(units);
    if !value.is_finite() {
        return Err(CounterError::NotFinite { counter: name.to_owned() });
    }
    let reading =
        if sum { Reading::Added { amount: value, total: None } } else { Reading::Level(value) };
    let SeriesName { metric, help, instrument } =
        names.get_or_build(&["E", provider, name, display, units], || {
            let metric = metric_name(provider, name, event_counter_unit_suffix(units));
            let unit = if ["B", "MB"].iter().any(|u| u.eq_ignore_ascii_case(units)) {
                "By"
            } else {
                units
            };
            Ok(SeriesName {
                metric: checked_metric(metric, name)?.into(),
                help: help_text(display, units).into(),
                instrument: Instrument::new(provider, name, unit).into(),
            })
        })?;
    let interval_secs = match payload.get(Member::IntervalSec) {
        Seen::Number(secs) if secs.is_finite() && secs > 0.0 => Some(secs),
        _ => None,
    };
    let (labels, tag_keys) = (Vec::new(), Vec::new());
    Ok(CounterSample { metric, help, instrument, reading, labels, tag_keys, interval_secs })
}

/// `metric` unless it is too long or takes tracer's own prefix.
fn checked_metric(metric: String, counter: &str) -> Result<String, CounterError> {
    if metric.len() > MAX_METRIC_NAME {
        return Err(CounterError::NameTooLong { counter: counter.to_owned(), len: metric.len() });
    }
    if metric.starts_with(RESERVED_PREFIX) {
        return Err(CounterError::Reserved { metric });
    }
    Ok(metric)
}

/// EventCounters' `MB` is 10^6 bytes; the metric is in bytes.
fn unit_scale(units: &str) -> f64 {
    if units.eq_ignore_ascii_case("MB") { 1e6 } else { 1.0 }
}

/// The suffix an EventCounters counter's display units give its metric name, as dotnet-monitor
/// names them (`None`: no suffix).
pub fn event_counter_unit_suffix(units: &str) -> Option<&str> {
    let known = [("", None), ("count", None), ("B", Some("bytes")), ("MB", Some("bytes"))];
    match known.iter().find(|(u, _)| u.eq_ignore_ascii_case(units)) {
        Some((_, suffix)) => *suffix,
        None if units == "%" => Some("ratio"),
        None => Some(units),
    }
}

/// The suffix OpenTelemetry's Prometheus naming gives a Meter instrument's unit (UCUM):
/// annotations in braces say what is counted and are dropped (`{request}`: no suffix), known
/// units are spelled out (`s` → `seconds`, `By` → `bytes`), `a/b` is `a_per_b` with `b` singular
/// (`By/s` → `bytes_per_second`), and `1` is `ratio` for a gauge; other units stay as written
/// (docs/protocol/counters.md §4).
fn meter_unit_suffix(unit: &str, gauge: bool) -> Option<String> {
    let mut plain = String::with_capacity(unit.len());
    let mut depth = 0usize;
    for c in unit.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            c if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let plain = plain.trim();
    let spelled = |unit: &str| -> String {
        const UNITS: [(&str, &str); 25] = [
            ("d", "days"),
            ("h", "hours"),
            ("min", "minutes"),
            ("s", "seconds"),
            ("ms", "milliseconds"),
            ("us", "microseconds"),
            ("ns", "nanoseconds"),
            ("By", "bytes"),
            ("KiBy", "kibibytes"),
            ("MiBy", "mebibytes"),
            ("GiBy", "gibibytes"),
            ("TiBy", "tebibytes"),
            ("KBy", "kilobytes"),
            ("MBy", "megabytes"),
            ("GBy", "gigabytes"),
            ("TBy", "terabytes"),
            ("m", "meters"),
            ("V", "volts"),
            ("A", "amperes"),
            ("J", "joules"),
            ("W", "watts"),
            ("g", "grams"),
            ("Cel", "celsius"),
            ("Hz", "hertz"),
            ("%", "percent"),
        ];
        UNITS.iter().find(|(u, _)| *u == unit).map_or(unit, |(_, name)| name).to_owned()
    };
    let per = |unit: &str| -> String {
        const PER: [(&str, &str); 7] = [
            ("s", "second"),
            ("m", "minute"),
            ("h", "hour"),
            ("d", "day"),
            ("w", "week"),
            ("mo", "month"),
            ("y", "year"),
        ];
        PER.iter().find(|(u, _)| *u == unit).map_or(unit, |(_, name)| name).to_owned()
    };
    match plain.split_once('/') {
        _ if plain.is_empty() => None,
        Some((a, b)) => {
            let (a, b) = (a.trim(), b.trim());
            match (a.is_empty(), b.is_empty()) {
                (true, true) => None,
                (true, false) => Some(format!("per_{}", per(b))),
                (false, true) => Some(spelled(a)),
                (false, false) => Some(format!("{}_per_{}", spelled(a), per(b))),
            }
        }
        None if plain == "1" => gauge.then(|| "ratio".to_owned()),
        None => Some(spelled(plain)),
    }
}

/// dotnet-monitor's metric name for a counter: `<provider>_<counter>[_<unit suffix>]`. The provider
/// keeps only its valid characters, lowercased (`System.Runtime` → `systemruntime`; none valid →
/// `_`); the counter and unit keep their case and turn every invalid character into `_`. Valid
/// is an ASCII letter or `_`, and after the first character also a digit. (dotnet-monitor judges
/// the provider's first character by its position, so `1.2` would start the name with a digit,
/// which Prometheus refuses; here it is the first character kept.)
pub fn metric_name(provider: &str, counter: &str, unit_suffix: Option<&str>) -> String {
    let units = unit_suffix.unwrap_or_default();
    let mut out = String::with_capacity(provider.len() + counter.len() + units.len() + 2);
    let before = out.len();
    for c in provider.chars() {
        if valid(c, out.len() == before) {
            out.push(c.to_ascii_lowercase());
        }
    }
    if out.len() == before {
        out.push('_');
    }
    out.push('_');
    push_normalized(&mut out, counter);
    if let Some(suffix) = unit_suffix.filter(|s| !s.is_empty()) {
        out.push('_');
        push_normalized(&mut out, suffix);
    }
    out
}

fn push_normalized(out: &mut String, part: &str) {
    for (i, c) in part.chars().enumerate() {
        out.push(if valid(c, i == 0) { c } else { '_' });
    }
}

fn valid(c: char, first: bool) -> bool {
    c == '_' || if first { c.is_ascii_alphabetic() } else { c.is_ascii_alphanumeric() }
}

/// `text (units)` (or `text` without units) in printable ASCII without `\` and `"` (which the
/// exposition would have to escape), cut to [`MAX_HELP`] bytes.
fn help_text(text: &str, units: &str) -> String {
    let (open, close) = if units.is_empty() { ("", "") } else { (" (", ")") };
    // One allocation: counters come every second from every traced process.
    let mut help = String::with_capacity(MAX_HELP.min(text.len() + units.len() + 3));
    help.extend(
        printable([text, open, units, close].into_iter().flat_map(str::chars)).take(MAX_HELP),
    );
    help
}

fn printable(text: impl Iterator<Item = char>) -> impl Iterator<Item = char> {
    text.map(|c| if c.is_ascii_graphic() && c != '\\' && c != '"' || c == ' ' { c } else { '_' })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nettrace::payload::{Fields, Value};
    use crate::ordered::OrderedMap;

    fn event<'a>(provider: &'a str, name: &'a str, fields: Fields<'a>) -> DecodedEvent<'a> {
        DecodedEvent::with_fields(provider, name, fields)
    }

    /// As CoreCLR 8.0.4 writes it: `{"": {"Payload": {...}}}`.
    fn payload(fields: Vec<(&'static str, Value<'static>)>) -> Fields<'static> {
        let wrapped = OrderedMap(vec![("Payload", Value::Object(OrderedMap(fields)))]);
        OrderedMap(vec![("", Value::Object(wrapped))])
    }

    fn s(v: &str) -> Value<'static> {
        Value::Str(v.into())
    }

    /// The fields of a `Mean` counter as CoreCLR 8 writes them.
    fn mean(name: &str, display: &str, units: &str, mean: f64) -> Fields<'static> {
        payload(vec![
            ("Name", s(name)),
            ("DisplayName", s(display)),
            ("Mean", Value::F64(mean)),
            ("StandardDeviation", Value::F64(0.0)),
            ("Count", Value::I64(1)),
            ("Min", Value::F64(mean)),
            ("Max", Value::F64(mean)),
            ("IntervalSec", Value::F64(1.0)),
            ("Series", s("Interval=1000")),
            ("CounterType", s("Mean")),
            ("Metadata", s("")),
            ("DisplayUnits", s(units)),
        ])
    }

    fn sum(name: &str, display: &str, units: &str, increment: f64) -> Fields<'static> {
        payload(vec![
            ("Name", s(name)),
            ("DisplayName", s(display)),
            ("DisplayRateTimeScale", s("00:01:00")),
            ("Increment", Value::F64(increment)),
            ("IntervalSec", Value::F64(1.0)),
            ("Metadata", s("")),
            ("Series", s("Interval=1000")),
            ("CounterType", s("Sum")),
            ("DisplayUnits", s(units)),
        ])
    }

    fn sample_of(provider: &str, fields: Fields) -> Result<CounterSample, CounterError> {
        counter_sample(&event(provider, EVENT_COUNTERS, fields)).expect("an EventCounters event")
    }

    #[test]
    fn names_follow_dotnet_monitor() {
        let cases = [
            ("System.Runtime", "cpu-usage", "%", "systemruntime_cpu_usage_ratio"),
            ("System.Runtime", "working-set", "MB", "systemruntime_working_set_bytes"),
            ("System.Runtime", "gc-heap-size", "MB", "systemruntime_gc_heap_size_bytes"),
            ("System.Runtime", "gen-0-gc-count", "count", "systemruntime_gen_0_gc_count"),
            ("System.Runtime", "alloc-rate", "B", "systemruntime_alloc_rate_bytes"),
            (
                "System.Runtime",
                "threadpool-thread-count",
                "",
                "systemruntime_threadpool_thread_count",
            ),
            (
                "Microsoft.AspNetCore.Hosting",
                "requests-per-second",
                "",
                "microsoftaspnetcorehosting_requests_per_second",
            ),
            ("My-App", "Queue Length", "items", "myapp_Queue_Length_items"),
            ("1.2", "9lives", "ms/op", "___lives_ms_op"),
            ("Ünï", "é", "", "n__"),
        ];
        for (provider, counter, units, expected) in cases {
            let suffix = event_counter_unit_suffix(units);
            assert_eq!(metric_name(provider, counter, suffix), expected, "{provider} {counter}");
        }
    }

    #[test]
    fn mean_counters_are_their_mean_and_mb_is_bytes() {
        let heap = sample_of("System.Runtime", mean("gc-heap-size", "GC Heap Size", "MB", 7.5));
        assert_eq!(
            heap,
            Ok(CounterSample {
                metric: "systemruntime_gc_heap_size_bytes".into(),
                help: "GC Heap Size (MB)".into(),
                instrument: Instrument::new("System.Runtime", "gc-heap-size", "By").into(),
                reading: Reading::Level(7_500_000.0),
                labels: Vec::new(),
                tag_keys: Vec::new(),
                interval_secs: Some(1.0),
            })
        );
        let cpu = sample_of("System.Runtime", mean("cpu-usage", "CPU Usage", "%", 12.5)).unwrap();
        assert_eq!((&*cpu.metric, cpu.value()), ("systemruntime_cpu_usage_ratio", Some(12.5)));
    }

    #[test]
    fn sum_counters_are_their_increment() {
        let gcs = sample_of("System.Runtime", sum("gen-0-gc-count", "Gen 0 GC Count", "", 3.0));
        assert_eq!(
            gcs,
            Ok(CounterSample {
                metric: "systemruntime_gen_0_gc_count".into(),
                help: "Gen 0 GC Count".into(),
                instrument: Instrument::new("System.Runtime", "gen-0-gc-count", "").into(),
                reading: Reading::Added { amount: 3.0, total: None },
                labels: Vec::new(),
                tag_keys: Vec::new(),
                interval_secs: Some(1.0),
            })
        );
    }

    #[test]
    fn a_bare_payload_object_is_read_too() {
        let Value::Object(wrapped) = &mean("c", "C", "", 2.0).0[0].1 else { unreachable!() };
        let bare = sample_of("P", wrapped.clone()).unwrap();
        assert_eq!((&*bare.metric, bare.value()), ("p_c", Some(2.0)));
    }

    fn meter_event<'a>(name: &'a str, fields: Vec<(&'a str, &'a str)>) -> DecodedEvent<'a> {
        let fields = fields.into_iter().map(|(k, v)| (k, s(v))).collect();
        event("System.Diagnostics.Metrics", name, OrderedMap(fields))
    }

    /// As .NET 8 writes them (sessionId first, then the instrument, tags, value).
    fn published<'a>(
        name: &'a str,
        unit: &'a str,
        tags: &'a str,
        value: (&'a str, &'a str),
    ) -> DecodedEvent<'a> {
        meter_event(
            name,
            vec![
                ("sessionId", "t1"),
                ("meterName", "TracerTest.App"),
                ("meterVersion", "1.0"),
                ("instrumentName", "queue-length"),
                ("unit", unit),
                ("tags", tags),
                value,
            ],
        )
    }

    #[test]
    fn meter_values_are_samples_with_their_tags_as_labels() {
        let gauge = published("GaugeValuePublished", "items", "", ("lastValue", "42.5"));
        assert_eq!(
            counter_sample(&gauge),
            Some(Ok(CounterSample {
                metric: "tracertestapp_queue_length_items".into(),
                help: "queue-length of meter TracerTest.App (items)".into(),
                instrument: Instrument::new("TracerTest.App", "queue-length", "items").into(),
                reading: Reading::Level(42.5),
                labels: Vec::new(),
                tag_keys: Vec::new(),
                interval_secs: None,
            }))
        );
        let rate = published("CounterRateValuePublished", "", "route=/a,pid=7", ("rate", "5"));
        let sample = counter_sample(&rate).unwrap().unwrap();
        assert_eq!(
            (&*sample.metric, sample.reading),
            ("tracertestapp_queue_length", Reading::Added { amount: 5.0, total: None })
        );
        let labels = vec![("route".into(), "/a".into()), ("tag_pid".into(), "7".into())];
        assert_eq!(sample.labels, labels);
        let level = published("UpDownCounterRateValuePublished", "MB", "", ("value", "2"));
        assert_eq!(counter_sample(&level).unwrap().unwrap().reading, Reading::Level(2e6));
        // No value yet: no sample, and nothing wrong.
        let unobserved = published("GaugeValuePublished", "", "", ("lastValue", ""));
        assert_eq!(counter_sample(&unobserved), None);
        // Other events of the provider carry none.
        assert_eq!(counter_sample(&meter_event("CollectionStart", vec![])), None);
    }

    /// A Meter event as .NET 8 writes it, for instrument `i` of meter `Shop` with `unit`.
    fn instrument_event<'a>(
        name: &'a str,
        unit: &'a str,
        values: Vec<(&'a str, Value<'a>)>,
    ) -> DecodedEvent<'a> {
        let mut fields = vec![
            ("sessionId", s("t1")),
            ("meterName", s("Shop")),
            ("meterVersion", s("")),
            ("instrumentName", s("orders.placed")),
            ("unit", Value::Str(unit.into())),
            ("tags", s("")),
        ];
        fields.extend(values);
        event("System.Diagnostics.Metrics", name, OrderedMap(fields))
    }

    #[test]
    fn counters_carry_the_runtimes_running_total_and_histograms_their_quantiles() {
        let counter = instrument_event(
            "CounterRateValuePublished",
            "{order}",
            vec![("rate", s("5")), ("value", s("12"))],
        );
        let sample = counter_sample(&counter).unwrap().unwrap();
        assert_eq!(&*sample.metric, "shop_orders_placed");
        assert_eq!(sample.reading, Reading::Added { amount: 5.0, total: Some(12.0) });
        // An observable counter's first interval has no rate, but its total.
        let first = instrument_event(
            "CounterRateValuePublished",
            "",
            vec![("rate", s("")), ("value", s("7"))],
        );
        let reading = counter_sample(&first).unwrap().unwrap().reading;
        assert_eq!(reading, Reading::Added { amount: 0.0, total: Some(7.0) });
        let histogram = instrument_event(
            "HistogramValuePublished",
            "s",
            vec![
                ("quantiles", s("0.5=0.25;0.95=1.5;0.99=2")),
                ("count", Value::I64(40)),
                ("sum", Value::F64(18.5)),
            ],
        );
        let sample = counter_sample(&histogram).unwrap().unwrap();
        assert_eq!(&*sample.metric, "shop_orders_placed_seconds");
        assert_eq!(
            sample.reading,
            Reading::Distribution(Distribution {
                quantiles: vec![(0.5, 0.25), (0.95, 1.5), (0.99, 2.0)],
                count_and_sum: Some((40, 18.5)),
            })
        );
        assert_eq!(sample.value(), None);
        // .NET 6 and 7: quantiles only; an interval without values: none.
        let net6 = instrument_event("HistogramValuePublished", "ms", vec![("quantiles", s(""))]);
        assert_eq!(
            counter_sample(&net6).unwrap().unwrap().reading,
            Reading::Distribution(Distribution { quantiles: vec![], count_and_sum: None })
        );
        let bad = |quantiles: &str| {
            let event = instrument_event(
                "HistogramValuePublished",
                "s",
                vec![("quantiles", Value::Str(quantiles.into()))],
            );
            counter_sample(&event)
        };
        for quantiles in ["0.5", "2=1", "0.5=x", "0.5=inf", &"0.5=1;".repeat(MAX_QUANTILES + 1)] {
            assert_eq!(
                bad(quantiles),
                Some(Err(CounterError::BadQuantiles {
                    instrument: "orders.placed".into(),
                    quantiles: quantiles.into()
                })),
                "{quantiles}"
            );
        }
    }

    #[test]
    fn a_session_takes_its_own_values_and_the_notices_that_name_it() {
        let session = MeterSession {
            session_id: "SHARED".into(),
            client_id: "tracer-1".into(),
            meters: vec!["Shop".into()],
        };
        let value = |session_id: &'static str, meter: &'static str| {
            meter_event(
                "GaugeValuePublished",
                vec![
                    ("sessionId", session_id),
                    ("meterName", meter),
                    ("meterVersion", ""),
                    ("instrumentName", "queue"),
                    ("unit", ""),
                    ("tags", ""),
                    ("lastValue", "1"),
                ],
            )
        };
        let read = |event: &DecodedEvent| session_sample(event, Some(&session));
        assert_eq!(read(&value("SHARED", "Shop")).unwrap().unwrap().value(), Some(1.0));
        // Another tool's meter in the shared session, another session's id: not ours.
        assert_eq!(read(&value("SHARED", "Other")), None);
        assert_eq!(read(&value("dotnet-monitor", "Shop")), None);
        // Without a session, every value is taken.
        assert!(counter_sample(&value("x", "Other")).is_some());

        let runtime = |loss, message: &str| {
            Some(Err(CounterError::Runtime { loss, message: message.into() }))
        };
        let limit = meter_event("TimeSeriesLimitReached", vec![("sessionId", "SHARED")]);
        assert_eq!(read(&limit), runtime(MeterLoss::TimeSeriesLimit, ""));
        let not_ours = meter_event("HistogramLimitReached", vec![("sessionId", "other")]);
        assert_eq!(read(&not_ours), None);
        let failed = meter_event(
            "ObservableInstrumentCallbackError",
            vec![("sessionId", "SHARED"), ("errorMessage", "boom\n")],
        );
        assert_eq!(read(&failed), runtime(MeterLoss::CallbackError, "boom_"));
        // Event 17 names the client whose settings were refused; event 15 the session that runs.
        let refused = |client: &'static str| {
            meter_event("MultipleSessionsConfiguredIncorrectlyError", vec![("clientId", client)])
        };
        assert_eq!(read(&refused("tracer-1")), runtime(MeterLoss::SessionRefused, ""));
        assert_eq!(read(&refused("dotnet-counters")), None);
        let running = |id: &'static str| {
            meter_event("MultipleSessionsNotSupportedError", vec![("runningSessionId", id)])
        };
        assert_eq!(read(&running("dotnet-monitor")), runtime(MeterLoss::SessionRefused, ""));
        assert_eq!(read(&running("SHARED")), None);
        // Without a session, every notice counts.
        assert!(counter_sample(&refused("dotnet-counters")).is_some());
    }

    #[test]
    fn meter_units_are_named_as_opentelemetry_names_them_in_prometheus() {
        let cases = [
            ("{order}", false, None),
            ("", false, None),
            ("s", false, Some("seconds")),
            ("ms", false, Some("milliseconds")),
            ("By", false, Some("bytes")),
            ("By/s", false, Some("bytes_per_second")),
            ("{request}/s", false, Some("per_second")),
            ("{packet}/min", false, Some("per_min")),
            ("1", true, Some("ratio")),
            ("1", false, None),
            ("%", false, Some("percent")),
            ("items", false, Some("items")),
            ("{a}{b}", false, None),
        ];
        for (unit, gauge, expected) in cases {
            assert_eq!(meter_unit_suffix(unit, gauge).as_deref(), expected, "{unit:?}");
        }
        let gauge = instrument_event("GaugeValuePublished", "1", vec![("lastValue", s("0.5"))]);
        assert_eq!(&*counter_sample(&gauge).unwrap().unwrap().metric, "shop_orders_placed_ratio");
    }

    #[test]
    fn malformed_meter_values_say_why() {
        let nan = published("GaugeValuePublished", "", "", ("lastValue", "NaN"));
        let bad = |value: &str| CounterError::BadValue {
            instrument: "queue-length".into(),
            value: value.into(),
        };
        assert_eq!(counter_sample(&nan), Some(Err(bad("NaN"))));
        let text = published("GaugeValuePublished", "", "", ("lastValue", "lots"));
        assert_eq!(counter_sample(&text), Some(Err(bad("lots"))));
        let no_value = meter_event(
            "GaugeValuePublished",
            vec![("meterName", "m"), ("instrumentName", "i"), ("unit", "")],
        );
        assert_eq!(
            counter_sample(&no_value),
            Some(Err(CounterError::MissingField {
                event: "GaugeValuePublished",
                field: "lastValue"
            }))
        );
        let tags = (0..=MAX_TAGS).map(|i| format!("k{i}=v")).collect::<Vec<_>>().join(",");
        let many = published("GaugeValuePublished", "", &tags, ("lastValue", "1"));
        assert_eq!(
            counter_sample(&many),
            Some(Err(CounterError::TooManyTags {
                instrument: "queue-length".into(),
                tags: MAX_TAGS + 1
            }))
        );
        let twice = published("GaugeValuePublished", "", "a-b=1,a_b=2", ("lastValue", "1"));
        let duplicate = |label: &str| CounterError::DuplicateTag {
            instrument: "queue-length".into(),
            label: label.into(),
        };
        assert_eq!(counter_sample(&twice), Some(Err(duplicate("a_b"))));
        let renamed = published("GaugeValuePublished", "", "pid=1,tag_pid=2", ("lastValue", "1"));
        assert_eq!(counter_sample(&renamed), Some(Err(duplicate("tag_pid"))));
        let hostile =
            published("GaugeValuePublished", "", "__name__=x\n\"y\",=", ("lastValue", "1"));
        let labels = counter_sample(&hostile).unwrap().unwrap().labels;
        assert_eq!(labels, [("tag___name__".into(), "x__y_".into()), ("_".into(), String::new())]);
    }

    #[test]
    fn other_events_carry_no_sample() {
        let gc = event("System.Runtime", "GCStart", mean("x", "x", "", 1.0));
        assert_eq!(counter_sample(&gc), None);
    }

    #[test]
    fn the_first_member_of_a_name_counts_and_deeper_ones_do_not() {
        let object =
            |members: Vec<(&'static str, Value<'static>)>| Value::Object(OrderedMap(members));
        let counter = |name: &str| vec![("Name", s(name)), ("Mean", Value::F64(1.0))];
        // A later name in the payload object, and the same name deeper down, are not read.
        let deep = object(vec![("Name", s("deep"))]);
        let mut members = vec![("inner", deep.clone()), ("list", Value::Array(vec![deep]))];
        members.extend(counter("first"));
        members.push(("Name", s("second")));
        let bare = OrderedMap(vec![("Payload", object(members))]);
        assert_eq!(&*sample_of("P", bare).unwrap().metric, "p_first");
        // The first top-level `Payload` decides, also when it is not an object.
        let shadowed = OrderedMap(vec![("Payload", s("x")), ("Payload", object(counter("a")))]);
        assert_eq!(sample_of("P", shadowed), Err(CounterError::NoPayload));
        // The wrapper is read only without a top-level `Payload`, and only its first `Payload`.
        let wrapped_twice = OrderedMap(vec![(
            "",
            object(vec![("Payload", Value::Array(vec![])), ("Payload", object(counter("b")))]),
        )]);
        assert_eq!(sample_of("P", wrapped_twice), Err(CounterError::NoPayload));
        let both = OrderedMap(vec![
            ("", object(vec![("Payload", object(counter("wrapped")))])),
            ("Payload", object(counter("top"))),
        ]);
        assert_eq!(&*sample_of("P", both).unwrap().metric, "p_top");
        let second_wrapper = OrderedMap(vec![
            ("", s("not an object")),
            ("", object(vec![("Payload", object(counter("c")))])),
        ]);
        assert_eq!(sample_of("P", second_wrapper), Err(CounterError::NoPayload));
    }

    #[test]
    fn a_reader_builds_each_name_once_and_keeps_a_bounded_number() {
        let mut names = NameCache::default();
        let built = std::cell::Cell::new(0);
        let get = |names: &mut NameCache, parts: &[&str]| {
            names.get_or_build(parts, || {
                built.set(built.get() + 1);
                let instrument = Arc::default();
                Ok(SeriesName { metric: parts.concat().into(), help: "h".into(), instrument })
            })
        };
        let first = get(&mut names, &["E", "P", "c"]).unwrap();
        let again = get(&mut names, &["E", "P", "c"]).unwrap();
        assert!(Arc::ptr_eq(&first.metric, &again.metric));
        // The parts are kept apart: the same letters split otherwise are another name.
        let split = get(&mut names, &["E", "Pc", ""]).unwrap();
        assert_eq!((&*split.metric, built.get()), ("EPc", 2));
        for i in 0..MAX_CACHED_NAMES + 5 {
            get(&mut names, &["E", "P", &i.to_string()]).unwrap();
        }
        assert_eq!(names.names.len(), MAX_CACHED_NAMES);
        // Past the bound (or too long a key), names are built each time, and the same.
        let (late, long) = ((MAX_CACHED_NAMES + 1).to_string(), "x".repeat(MAX_CACHED_NAME_KEY));
        let before = built.get();
        for parts in [["E", "P", late.as_str()], ["E", "P", long.as_str()]] {
            assert_eq!(
                get(&mut names, &parts).unwrap().metric,
                get(&mut names, &parts).unwrap().metric
            );
        }
        assert_eq!(built.get() - before, 4);
    }

    #[test]
    fn malformed_payloads_say_what_is_missing() {
        assert_eq!(sample_of("P", Fields::default()), Err(CounterError::NoPayload));
        let empty_wrapper = OrderedMap(vec![("", Value::Object(Fields::default()))]);
        assert_eq!(sample_of("P", empty_wrapper), Err(CounterError::NoPayload));
        let no_name = payload(vec![("Mean", Value::F64(1.0))]);
        assert_eq!(sample_of("P", no_name), Err(CounterError::MissingName("Name")));
        let no_value = payload(vec![("Name", s("c")), ("CounterType", s("Sum"))]);
        assert_eq!(
            sample_of("P", no_value),
            Err(CounterError::MissingValue { counter: "c".into(), field: "Increment" })
        );
        let text_value = payload(vec![("Name", s("c")), ("Mean", s("1"))]);
        assert_eq!(
            sample_of("P", text_value),
            Err(CounterError::MissingValue { counter: "c".into(), field: "Mean" })
        );
        assert_eq!(
            sample_of("P", mean("c", "c", "", f64::NAN)),
            Err(CounterError::NotFinite { counter: "c".into() })
        );
        // Finite, but not once scaled to bytes.
        assert_eq!(
            sample_of("P", mean("c", "c", "MB", f64::MAX)),
            Err(CounterError::NotFinite { counter: "c".into() })
        );
    }

    /// Every `EventCounters` event of the captured stream (System.Runtime of CoreCLR 8.0.4 at 1 s,
    /// `gc 3` induced during the capture) with its sample (each the same from the output path).
    fn captured_samples() -> Vec<(String, CounterSample)> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/nettrace/coreclr8_counters.nettrace"
        );
        let data = std::fs::read(path).unwrap();
        let mut parser = crate::nettrace::NettraceParser::default();
        // One reader for the stream, as a session has: its kept names give the same samples.
        let mut reader = CounterReader::default();
        let mut samples = Vec::new();
        parser
            .feed(&data, |e| {
                let decoded = e.decode();
                // The output path decodes once, for the line's fields and the sample's members.
                let (event, mut fields) = (e.output(), Vec::new());
                assert_eq!(reader.read(&event, &mut fields), counter_sample(&decoded));
                if !fields.is_empty() {
                    let rendered = OutputEvent { rendered_fields: Some(&fields), ..event };
                    let (mut line, mut expected) = (Vec::new(), Vec::new());
                    rendered.write_json(&mut line);
                    event.write_json(&mut expected);
                    assert_eq!(String::from_utf8(line), String::from_utf8(expected));
                }
                if let Some(sample) = counter_sample(&decoded) {
                    let Value::Object(wrapper) = &decoded.fields.0[0].1 else { panic!() };
                    let Some(Value::Object(payload)) = wrapper.get("Payload") else { panic!() };
                    let Some(Value::Str(name)) = payload.get("Name") else { panic!() };
                    samples.push((name.clone(), sample.unwrap()));
                }
            })
            .unwrap();
        parser.finish().unwrap();
        samples
    }

    #[test]
    fn a_real_runtimes_counters_all_give_samples() {
        let samples = captured_samples();
        let per_interval: std::collections::BTreeSet<&str> =
            samples.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(per_interval.len(), 27, "{per_interval:?}");
        assert_eq!(samples.len() % per_interval.len(), 0, "whole intervals: {}", samples.len());
        let by_name = |name: &str| -> Vec<&CounterSample> {
            samples.iter().filter(|(n, _)| n == name).map(|(_, s)| s).collect()
        };
        let heap = by_name("gc-heap-size");
        assert!(heap.iter().all(|s| &*s.metric == "systemruntime_gc_heap_size_bytes"));
        assert!(heap.iter().all(|s| s.value() > Some(1e6) && &*s.help == "GC Heap Size (MB)"));
        // `gc 3` during the capture: three gen-2 collections, counted once each over the intervals.
        let gen2: f64 = by_name("gen-2-gc-count").iter().filter_map(|s| s.value()).sum();
        assert_eq!(gen2, 3.0);
    }

    #[test]
    fn peer_strings_cannot_break_the_exposition() {
        let long = "x".repeat(MAX_METRIC_NAME);
        assert_eq!(
            sample_of("P", mean(&long, "d", "", 1.0)),
            Err(CounterError::NameTooLong { counter: long.clone(), len: MAX_METRIC_NAME + 2 })
        );
        assert_eq!(
            sample_of("tracer", mean("events", "d", "", 1.0)),
            Err(CounterError::Reserved { metric: "tracer_events".into() })
        );
        let display = format!("a\"b\\c\nd\u{1b}[2J{}", "y".repeat(300));
        let sample = sample_of("P", mean("c", &display, "", 1.0)).unwrap();
        assert!(sample.help.starts_with("a_b_c_d_[2Jyyy"), "{}", sample.help);
        assert_eq!(sample.help.len(), MAX_HELP);
        let metric = sample_of("P", mean("a{b=\"c\"} 1\n#", "d", "", 1.0)).unwrap().metric;
        assert_eq!(&*metric, "p_a_b__c___1__");
    }
}
