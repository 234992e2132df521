//! What a traced process says of itself as an OpenTelemetry resource, from its environment and
//! command line (untrusted text, docs/otlp.md "One resource per process"): `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES` (`key=value,…`, values percent-encoded, as OpenTelemetry's SDKs
//! read it), else the entry assembly (`dotnet App.dll`) or the executable's name. Bounded: at
//! most [`MAX_ATTRIBUTES`] attributes of at most [`MAX_ATTRIBUTE_BYTES`] each; what is past a
//! bound or malformed is dropped and counted.

/// Attributes kept from `OTEL_RESOURCE_ATTRIBUTES`.
pub const MAX_ATTRIBUTES: usize = 32;
/// Longest key or value kept (bytes, decoded); longer: the attribute is dropped.
pub const MAX_ATTRIBUTE_BYTES: usize = 255;

/// `OTEL_RESOURCE_ATTRIBUTES` as (key, value) pairs, and how many entries were dropped
/// (malformed: no `=`, an empty key, bad percent-encoding, not UTF-8; too long; past the count).
pub fn resource_attributes(text: &[u8]) -> (Vec<(String, String)>, usize) {
    let (mut kept, mut dropped) = (Vec::new(), 0);
    for entry in text.split(|&b| b == b',') {
        if entry.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let pair = entry.iter().position(|&b| b == b'=').and_then(|eq| {
            let key = percent_decoded(entry[..eq].trim_ascii())?;
            let value = percent_decoded(entry[eq + 1..].trim_ascii())?;
            let fits = !key.is_empty()
                && key.len() <= MAX_ATTRIBUTE_BYTES
                && value.len() <= MAX_ATTRIBUTE_BYTES;
            fits.then_some((key, value))
        });
        match pair {
            Some(pair) if kept.len() < MAX_ATTRIBUTES => kept.push(pair),
            _ => dropped += 1,
        }
    }
    (kept, dropped)
}

fn percent_decoded(text: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.iter();
    while let Some(&b) = bytes.next() {
        if b == b'%' {
            let hex = [*bytes.next()?, *bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    let text = String::from_utf8(out).ok()?;
    // Printable: a value ends up in a collector's UI and its logs.
    text.chars().all(|c| !c.is_control()).then_some(text)
}

/// The service a process is: `OTEL_SERVICE_NAME`, else `service.name` of its resource
/// attributes, else its entry assembly (as the runtime names it, else from its command line:
/// `dotnet [options] App.dll` → `App`), else its executable's file name; the first of them
/// that is printable and at most [`MAX_ATTRIBUTE_BYTES`] bytes.
pub fn service_name(
    otel_service_name: Option<&[u8]>,
    attributes: &[(String, String)],
    entry_assembly: Option<&str>,
    command_line: Option<&str>,
) -> Option<String> {
    let fits = |name: &String| name.len() <= MAX_ATTRIBUTE_BYTES;
    let from_env = otel_service_name.and_then(percent_free).filter(fits);
    let from_attributes =
        attributes.iter().find(|(k, _)| k == "service.name").map(|(_, v)| v.clone());
    from_env
        .or(from_attributes)
        .or_else(|| entry_assembly.and_then(|a| percent_free(a.as_bytes())).filter(fits))
        .or_else(|| command_line.and_then(entry_point).filter(fits))
}

/// A printable UTF-8 value as it is.
fn percent_free(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?.trim();
    (!text.is_empty() && !text.chars().any(char::is_control)).then(|| text.to_owned())
}

/// The entry assembly or executable a command line runs: `dotnet App.dll …` → `App` (the first
/// argument ending in `.dll`), `/app/App …` → `App`.
fn entry_point(command_line: &str) -> Option<String> {
    let mut words = command_line.split_ascii_whitespace();
    let executable = file_name(words.next()?);
    let name = if executable == "dotnet" || executable == "dotnet.exe" {
        let dll = words.find(|w| w.ends_with(".dll"))?;
        file_name(dll).strip_suffix(".dll")?
    } else {
        executable
    };
    percent_free(name.as_bytes())
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn resource_attributes_as_the_sdks_read_them() {
        let (kept, dropped) = resource_attributes(
            b"deployment.environment=prod, team=payments%2Cbilling,service.name=shop,=x,bad,k=%zz,,",
        );
        assert_eq!(
            kept,
            pairs(&[
                ("deployment.environment", "prod"),
                ("team", "payments,billing"),
                ("service.name", "shop")
            ])
        );
        assert_eq!(dropped, 3);
        let long = format!("k={}", "v".repeat(MAX_ATTRIBUTE_BYTES + 1));
        assert_eq!(resource_attributes(long.as_bytes()), (vec![], 1));
        let many: Vec<String> = (0..MAX_ATTRIBUTES + 2).map(|i| format!("k{i}=v")).collect();
        let (kept, dropped) = resource_attributes(many.join(",").as_bytes());
        assert_eq!((kept.len(), dropped), (MAX_ATTRIBUTES, 2));
        assert_eq!(resource_attributes(b"k=a%0Ab"), (vec![], 1), "no control characters");
    }

    #[test]
    fn the_service_is_named_as_an_sdk_inside_would_name_it() {
        let attributes = pairs(&[("service.name", "from-attributes")]);
        let name = |env: Option<&[u8]>, attributes, entry, command_line| {
            service_name(env, attributes, entry, command_line)
        };
        assert_eq!(name(Some(b"checkout"), &attributes, None, None).as_deref(), Some("checkout"));
        assert_eq!(name(None, &attributes, Some("Api"), None).as_deref(), Some("from-attributes"));
        assert_eq!(name(None, &[], Some("Api"), Some("dotnet x.dll")).as_deref(), Some("Api"));
        let dotnet =
            Some("/usr/bin/dotnet exec --depsfile x.json /app/Shop.Api.dll --urls http://*:80");
        assert_eq!(name(None, &[], Some(""), dotnet).as_deref(), Some("Shop.Api"));
        let apphost = Some("/app/Checkout --port 1");
        assert_eq!(name(None, &[], None, apphost).as_deref(), Some("Checkout"));
        let python = Some("python3 host.py");
        assert_eq!(name(Some(b" "), &[], None, python).as_deref(), Some("python3"));
        assert_eq!(name(None, &[], None, Some("dotnet")), None);
        assert_eq!(name(Some(b"a\x1b[2J"), &[], None, None), None);
        let long = "x".repeat(MAX_ATTRIBUTE_BYTES + 1);
        assert_eq!(name(Some(long.as_bytes()), &[], Some("Api"), None).as_deref(), Some("Api"));
    }
}
