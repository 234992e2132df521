//! Whose `System.Diagnostics.Metrics` events a session takes, and what the runtime says it did
//! not publish (docs/protocol/counters.md §4, "Sessions and what the runtime refuses").
//!
//! The runtime aggregates every Meter session of a process in one place (.NET 8+: a session
//! with `SessionId=SHARED`; each client adds its `Metrics` list and names itself by `ClientId`)
//! and EventPipe hands every session all of the provider's events: a session sees the values of
//! the meters other tools asked for, and the notices meant for them. A reader with a
//! [`MeterSession`] keeps the values of its own session id and meters, and the notices that
//! name it.
use thiserror::Error;

use super::members::{Member, Members, Seen};

/// What a session asked the runtime for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeterSession {
    /// The `SessionId` argument (`SHARED` for a shared session).
    pub session_id: String,
    /// The `ClientId` argument: this session's own name in a shared session.
    pub client_id: String,
    /// The `Metrics` items: `Meter`, `Meter\instrument`, `*` (every meter) or `Prefix*`.
    pub meters: Vec<String>,
}

impl MeterSession {
    /// Whether the session asked for `instrument` of `meter` (names compare as the runtime
    /// compares them: meters ignoring case, a `Prefix*` by its prefix).
    pub fn wants(&self, meter: &str, instrument: &str) -> bool {
        self.meters.iter().any(|item| {
            let (meter_spec, instrument_spec) = match item.split_once('\\') {
                Some((m, i)) => (m, Some(i)),
                None => (item.as_str(), None),
            };
            let meter_matches = match meter_spec.strip_suffix('*') {
                Some(prefix) => {
                    meter.len() >= prefix.len()
                        && meter[..prefix.len()].eq_ignore_ascii_case(prefix)
                }
                None => meter.eq_ignore_ascii_case(meter_spec),
            };
            meter_matches && instrument_spec.is_none_or(|i| i.eq_ignore_ascii_case(instrument))
        })
    }
}

/// Why the runtime did not publish some values (the provider's notice events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MeterLoss {
    /// `TimeSeriesLimitReached`: tag sets beyond `MaxTimeSeries` are not published.
    #[error("time series past MaxTimeSeries are not published")]
    TimeSeriesLimit,
    /// `HistogramLimitReached`: histograms beyond `MaxHistograms` are not published.
    #[error("histograms past MaxHistograms are not published")]
    HistogramLimit,
    /// `ObservableInstrumentCallbackError`: an observable instrument's callback threw.
    #[error("an observable instrument's callback failed")]
    CallbackError,
    /// `MultipleSessionsNotSupportedError`, `MultipleSessionsConfiguredIncorrectlyError`: the
    /// runtime kept another session's settings, not this one's.
    #[error("the runtime refused this session's settings")]
    SessionRefused,
    /// `Error`: the runtime's aggregation failed.
    #[error("the runtime's metrics aggregation failed")]
    Error,
}

impl MeterLoss {
    /// The loss's reason in the summary and `tracer_lost_events_total{source="metrics"}`.
    pub fn reason(self) -> &'static str {
        match self {
            MeterLoss::TimeSeriesLimit => "time_series_limit",
            MeterLoss::HistogramLimit => "histogram_limit",
            MeterLoss::CallbackError => "callback_error",
            MeterLoss::SessionRefused => "session_refused",
            MeterLoss::Error => "runtime_error",
        }
    }

    pub const ALL: [MeterLoss; 5] = [
        MeterLoss::TimeSeriesLimit,
        MeterLoss::HistogramLimit,
        MeterLoss::CallbackError,
        MeterLoss::SessionRefused,
        MeterLoss::Error,
    ];
}

/// The notice events, with the loss each says and the member that says whom it is for.
pub(super) const NOTICES: [(&str, MeterLoss, Member); 6] = [
    ("TimeSeriesLimitReached", MeterLoss::TimeSeriesLimit, Member::SessionId),
    ("HistogramLimitReached", MeterLoss::HistogramLimit, Member::SessionId),
    ("ObservableInstrumentCallbackError", MeterLoss::CallbackError, Member::SessionId),
    // Names the session that runs: a notice to every other one.
    ("MultipleSessionsNotSupportedError", MeterLoss::SessionRefused, Member::RunningSessionId),
    ("MultipleSessionsConfiguredIncorrectlyError", MeterLoss::SessionRefused, Member::ClientId),
    ("Error", MeterLoss::Error, Member::SessionId),
];

/// The loss a notice event says, when it is for `session` (every notice is, without one).
pub(super) fn notice_for(
    event: &str,
    top: &Members,
    text: &str,
    session: Option<&MeterSession>,
) -> Option<MeterLoss> {
    let &(_, loss, whom) = NOTICES.iter().find(|(name, ..)| *name == event)?;
    let Some(session) = session else { return Some(loss) };
    let named = match top.get(whom) {
        Seen::Str { start, end } => &text[start as usize..end as usize],
        _ => "",
    };
    let ours = match whom {
        Member::RunningSessionId => named != session.session_id,
        Member::ClientId => named == session.client_id,
        _ => named == session.session_id,
    };
    ours.then_some(loss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meters_match_as_the_runtime_matches_them() {
        let session = MeterSession {
            meters: vec![
                "System.Net.Http".into(),
                "Shop\\orders".into(),
                "Microsoft.AspNetCore.*".into(),
            ],
            ..MeterSession::default()
        };
        assert!(session.wants("System.Net.Http", "http.client.request.duration"));
        assert!(session.wants("system.net.http", "x"));
        assert!(session.wants("Shop", "orders"));
        assert!(!session.wants("Shop", "wait"));
        assert!(session.wants("Microsoft.AspNetCore.Hosting", "x"));
        assert!(!session.wants("Microsoft.AspNet", "x"));
        assert!(!session.wants("System.Runtime", "x"));
        let every = MeterSession { meters: vec!["*".into()], ..MeterSession::default() };
        assert!(every.wants("Anything", "x"));
    }
}
