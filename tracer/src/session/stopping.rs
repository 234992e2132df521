//! `--stopping-event PROVIDER[/EVENT][:FIELD=VALUE[,FIELD=VALUE…]]`: a session stops after the
//! first event that matches (dotnet-trace's `--stopping-event-*` options). The provider compares
//! ignoring case, as EventPipe does; the event name and field values compare exactly, a value
//! as its JSON output shows it (a string's text, a number's digits, an enum's name).
use tracer_decode::nettrace::OutputEvent;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoppingEvent {
    pub provider: String,
    pub event: Option<String>,
    pub fields: Vec<(String, String)>,
}

impl std::str::FromStr for StoppingEvent {
    type Err = String;

    fn from_str(spec: &str) -> Result<StoppingEvent, String> {
        let (name, fields) = match spec.split_once(':') {
            Some((name, fields)) => (name, Some(fields)),
            None => (spec, None),
        };
        let (provider, event) = match name.split_once('/') {
            Some((provider, event)) => (provider.trim(), Some(event.trim())),
            None => (name.trim(), None),
        };
        if provider.is_empty() {
            return Err(format!("{spec:?}: no provider name (PROVIDER[/EVENT][:FIELD=VALUE])"));
        }
        if event.is_some_and(str::is_empty) {
            return Err(format!("{spec:?}: an empty event name after '/'"));
        }
        let fields = match fields {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|pair| match pair.split_once('=') {
                    Some((field, value)) if !field.trim().is_empty() => {
                        Ok((field.trim().to_owned(), value.to_owned()))
                    }
                    _ => Err(format!("{spec:?}: {pair:?} is not FIELD=VALUE")),
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(StoppingEvent { provider: provider.to_owned(), event: event.map(str::to_owned), fields })
    }
}

impl StoppingEvent {
    /// Whether `event` is the stopping event; its payload is decoded into fields only when the
    /// names match and the spec names fields.
    pub fn matches(&self, event: &OutputEvent<'_>) -> bool {
        let meta = event.metadata;
        if !super::is_provider(&self.provider, &meta.provider)
            || self.event.as_deref().is_some_and(|name| name != meta.display_name())
        {
            return false;
        }
        if self.fields.is_empty() {
            return true;
        }
        let decoded = event.decode();
        self.fields.iter().all(|(field, wanted)| {
            decoded.fields.get(field.as_str()).is_some_and(|value| {
                let mut json = Vec::new();
                tracer_decode::json::WriteJson::write_json(value, &mut json);
                // A string matches by its text, any other value by its JSON.
                match serde_json::from_slice::<String>(&json) {
                    Ok(text) => text == *wanted,
                    Err(_) => json == wanted.as_bytes(),
                }
            })
        })
    }

    /// `PROVIDER/EVENT:FIELD=VALUE` as given, for messages.
    pub fn describe(&self) -> String {
        let mut s = self.provider.clone();
        if let Some(event) = &self.event {
            s = format!("{s}/{event}");
        }
        if !self.fields.is_empty() {
            let pairs: Vec<String> = self.fields.iter().map(|(f, v)| format!("{f}={v}")).collect();
            s = format!("{s}:{}", pairs.join(","));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_into_provider_event_and_fields() {
        let spec: StoppingEvent =
            "Microsoft-Windows-DotNETRuntime/GCStart:Reason=Induced,Depth=2".parse().unwrap();
        assert_eq!(spec.provider, "Microsoft-Windows-DotNETRuntime");
        assert_eq!(spec.event.as_deref(), Some("GCStart"));
        assert_eq!(
            spec.fields,
            vec![("Reason".to_owned(), "Induced".to_owned()), ("Depth".into(), "2".into())]
        );
        assert_eq!(
            spec.describe(),
            "Microsoft-Windows-DotNETRuntime/GCStart:Reason=Induced,Depth=2"
        );
        let only: StoppingEvent = "TestDouble".parse().unwrap();
        assert_eq!((only.event, only.fields), (None, vec![]));
        assert!("".parse::<StoppingEvent>().unwrap_err().contains("no provider name"));
        assert!("P/".parse::<StoppingEvent>().unwrap_err().contains("empty event name"));
        assert!("P/E:Reason".parse::<StoppingEvent>().unwrap_err().contains("not FIELD=VALUE"));
    }
}
