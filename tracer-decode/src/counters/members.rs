//! The members a counter sample is read from, kept as the decode of an event's payload passes
//! them ([`Sink`]), or as a decoded tree is walked: the first member of each name a sample may
//! read, in the three objects it may read them from. No tree is built, and once the reader's
//! text buffer has grown, nothing is allocated.
use crate::nettrace::payload::{Fields, Nest, Scalar, Sink, Value};

/// The member names a sample is read by: of an `EventCounters` payload (its wrapper and
/// `Payload` object included), then of a `System.Diagnostics.Metrics` value event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Member {
    Payload,
    /// The unnamed object CoreCLR wraps `Payload` in.
    Wrapper,
    Name,
    DisplayName,
    DisplayUnits,
    CounterType,
    Mean,
    Increment,
    IntervalSec,
    MeterName,
    InstrumentName,
    Unit,
    Tags,
    LastValue,
    Rate,
    Value,
    Quantiles,
    Count,
    Sum,
    SessionId,
    ClientId,
    RunningSessionId,
    ErrorMessage,
}

const MEMBERS: usize = Member::ErrorMessage as usize + 1;

/// Each member's name, in the order of [`Member`].
const NAMES: [&str; MEMBERS] = [
    "Payload",
    "",
    "Name",
    "DisplayName",
    "DisplayUnits",
    "CounterType",
    "Mean",
    "Increment",
    "IntervalSec",
    "meterName",
    "instrumentName",
    "unit",
    "tags",
    "lastValue",
    "rate",
    "value",
    "quantiles",
    "count",
    "sum",
    "sessionId",
    "clientId",
    "runningSessionId",
    "errorMessage",
];

impl Member {
    pub(super) fn name(self) -> &'static str {
        NAMES[self as usize]
    }

    pub(super) fn of(name: &str) -> Option<Member> {
        Some(match name {
            "Payload" => Member::Payload,
            "" => Member::Wrapper,
            "Name" => Member::Name,
            "DisplayName" => Member::DisplayName,
            "DisplayUnits" => Member::DisplayUnits,
            "CounterType" => Member::CounterType,
            "Mean" => Member::Mean,
            "Increment" => Member::Increment,
            "IntervalSec" => Member::IntervalSec,
            "meterName" => Member::MeterName,
            "instrumentName" => Member::InstrumentName,
            "unit" => Member::Unit,
            "tags" => Member::Tags,
            "lastValue" => Member::LastValue,
            "rate" => Member::Rate,
            "value" => Member::Value,
            "quantiles" => Member::Quantiles,
            "count" => Member::Count,
            "sum" => Member::Sum,
            "sessionId" => Member::SessionId,
            "clientId" => Member::ClientId,
            "runningSessionId" => Member::RunningSessionId,
            "errorMessage" => Member::ErrorMessage,
            _ => return None,
        })
    }
}

/// What the first member of a name in an object was.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) enum Seen {
    #[default]
    Absent,
    /// A string: where it is in the reader's text.
    Str {
        start: u32,
        end: u32,
    },
    /// An integer or floating-point number.
    Number(f64),
    Object,
    /// Anything else (an array, a GUID, bytes, a boolean, a mapped value).
    Other,
}

/// The first member of each name in one object.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Members([Seen; MEMBERS]);

impl Members {
    pub(super) fn get(&self, member: Member) -> Seen {
        self.0[member as usize]
    }

    fn first(&mut self, member: Member) -> Option<&mut Seen> {
        let slot = &mut self.0[member as usize];
        (*slot == Seen::Absent).then_some(slot)
    }
}

/// The objects a sample reads members from, as the decode enters them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Within {
    /// The first top-level `Payload`, an object.
    Payload,
    /// The first top-level unnamed member, an object.
    Wrapper,
    /// The first `Payload` of that wrapper, an object.
    WrappedPayload,
    /// Any other array or object.
    Elsewhere,
}

/// Where the objects a sample reads were found, and their members.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Found {
    /// The payload's own (top-level) members.
    pub(super) top: Members,
    /// The first top-level `Payload` object's.
    pub(super) payload: Members,
    /// The first top-level unnamed object's.
    pub(super) wrapper: Members,
    /// The first `Payload` object's in that wrapper.
    pub(super) wrapped: Members,
}

/// Keeps the members of one payload: a [`Sink`] beside the line's JSON.
pub(super) struct MemberSink<'t> {
    pub(super) found: Found,
    /// The strings of the members kept (`Seen::Str` ranges).
    pub(super) text: &'t mut String,
    /// The member the next value is, when it is one a sample reads.
    key: Option<Member>,
    /// Arrays and objects open: how many, and what the first two levels are.
    depth: usize,
    within: [Within; 2],
}

impl<'t> MemberSink<'t> {
    pub(super) fn new(text: &'t mut String) -> MemberSink<'t> {
        text.clear();
        MemberSink {
            found: Found::default(),
            text,
            key: None,
            depth: 0,
            within: [Within::Elsewhere; 2],
        }
    }

    /// Notes a value that is not an array or object.
    fn value(&mut self, seen: impl FnOnce(&mut String) -> Seen) {
        let Some(member) = self.key.take() else { return };
        if let Some(slot) =
            reading(&mut self.found, self.depth, self.within).and_then(|m| m.first(member))
        {
            *slot = seen(self.text);
        }
    }

    fn enter(&mut self, nest: Nest) {
        let member = self.key.take();
        let (depth, within) = (self.depth, self.within);
        let entered = match (nest, reading(&mut self.found, depth, within), member) {
            (Nest::Object, Some(members), Some(member)) => {
                let first = members.first(member).map(|slot| *slot = Seen::Object).is_some();
                match (depth, member, first) {
                    (0, Member::Payload, true) => Within::Payload,
                    (0, Member::Wrapper, true) => Within::Wrapper,
                    (1, Member::Payload, true) if within[0] == Within::Wrapper => {
                        Within::WrappedPayload
                    }
                    _ => Within::Elsewhere,
                }
            }
            (Nest::Array, Some(members), Some(member)) => {
                if let Some(slot) = members.first(member) {
                    *slot = Seen::Other;
                }
                Within::Elsewhere
            }
            _ => Within::Elsewhere,
        };
        if let Some(level) = self.within.get_mut(depth) {
            *level = entered;
        }
        self.depth += 1;
    }

    fn leave(&mut self) {
        self.depth -= 1;
        self.key = None;
    }

    /// Feeds the sink a decoded tree, as the decode that built it would have.
    pub(super) fn walk(&mut self, fields: &Fields) {
        for (name, value) in &fields.0 {
            self.key = Member::of(name);
            self.walk_value(value);
        }
    }

    fn walk_value(&mut self, value: &Value) {
        match value {
            Value::Object(fields) => {
                self.enter(Nest::Object);
                self.walk(fields);
                self.leave();
            }
            Value::Array(items) => {
                self.enter(Nest::Array);
                for item in items {
                    self.key = None;
                    self.walk_value(item);
                }
                self.leave();
            }
            Value::Str(s) => self.value(|text| push_str(text, s)),
            Value::I64(v) => self.value(|_| Seen::Number(*v as f64)),
            Value::U64(v) => self.value(|_| Seen::Number(*v as f64)),
            Value::F64(v) => self.value(|_| Seen::Number(*v)),
            Value::Bool(_)
            | Value::Guid(_)
            | Value::Enum { .. }
            | Value::Flags { .. }
            | Value::Bytes(_) => self.value(|_| Seen::Other),
        }
    }
}

/// The members of the object the decode is in, `depth` arrays and objects down, when a sample
/// reads them.
fn reading(found: &mut Found, depth: usize, within: [Within; 2]) -> Option<&mut Members> {
    match depth {
        0 => Some(&mut found.top),
        1 | 2 => match within[depth - 1] {
            Within::Payload => Some(&mut found.payload),
            Within::Wrapper => Some(&mut found.wrapper),
            Within::WrappedPayload => Some(&mut found.wrapped),
            Within::Elsewhere => None,
        },
        _ => None,
    }
}

fn push_str(text: &mut String, s: &str) -> Seen {
    let start = text.len() as u32;
    text.push_str(s);
    Seen::Str { start, end: text.len() as u32 }
}

impl<'m> Sink<'m> for MemberSink<'_> {
    /// What was found, and the text's length: marks fall between top-level members.
    type Mark = (Found, usize);

    fn key(&mut self, name: &'m str) {
        self.key = Member::of(name);
    }

    fn scalar(&mut self, value: Scalar<'_>) {
        match value {
            Scalar::Str(s) => self.value(|text| push_str(text, s)),
            Scalar::I64(v) => self.value(|_| Seen::Number(v as f64)),
            Scalar::U64(v) => self.value(|_| Seen::Number(v as f64)),
            Scalar::F64(v) => self.value(|_| Seen::Number(v)),
            Scalar::Bool(_)
            | Scalar::Guid(_)
            | Scalar::Enum { .. }
            | Scalar::Flags { .. }
            | Scalar::Bytes(_) => self.value(|_| Seen::Other),
        }
    }

    fn open(&mut self, nest: Nest) {
        self.enter(nest);
    }

    fn close(&mut self, _: Nest) {
        self.leave();
    }

    fn mark(&self) -> (Found, usize) {
        (self.found, self.text.len())
    }

    fn rewind(&mut self, (found, text_len): (Found, usize)) {
        self.found = found;
        self.text.truncate(text_len);
        (self.key, self.depth) = (None, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_member_is_found_by_its_name() {
        for name in NAMES {
            assert_eq!(Member::of(name).map(Member::name), Some(name));
        }
        assert_eq!(Member::of("name"), None);
    }
}
