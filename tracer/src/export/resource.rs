//! One OpenTelemetry resource per traced process (docs/otlp.md "One resource per process"):
//! what an SDK inside the process would say of itself — `service.name` from its own
//! `OTEL_SERVICE_NAME`, its `OTEL_RESOURCE_ATTRIBUTES`, else its entry assembly or executable —
//! and what tracer knows of it, which the process cannot override: `process.pid`,
//! `process.creation.time`, `container.id`, `k8s.pod.uid`, the runtime's version. (`host.name`
//! and `k8s.node.name` are the node's, added by the exporter.)
use tracer_decode::container::environ_value;
use tracer_decode::diagnostic_ipc::ProcessInfo;
use tracer_decode::otel_resource::{resource_attributes, service_name};

use crate::metrics::runtime::ResourceAttributes;
use crate::output::{Incarnation, ProcessLabels};
use crate::time::{Clock, format_iso8601};

/// `service.name` when nothing names the service (OpenTelemetry's default, without the
/// executable an SDK appends: it is not known for every process).
pub const UNKNOWN_SERVICE: &str = "unknown_service";

/// The resource of `process`, from its environment (`environ`, when it could be read), what its
/// runtime reported and where it runs; and how many `OTEL_RESOURCE_ATTRIBUTES` entries were
/// dropped (malformed or past the bounds).
pub fn process_resource(
    process: Incarnation,
    labels: Option<&ProcessLabels>,
    runtime: Option<&ProcessInfo>,
    environ: Option<&[u8]>,
    clock: &Clock,
) -> (ResourceAttributes, usize) {
    let env = |name: &[u8]| environ.and_then(|e| environ_value(e, name));
    let (from_env, dropped) =
        env(b"OTEL_RESOURCE_ATTRIBUTES").map(resource_attributes).unwrap_or_default();
    let command_line = runtime.map(|r| r.command_line.as_str());
    let entry_assembly = runtime.and_then(|r| r.managed_entrypoint_assembly.as_deref());
    let service = service_name(env(b"OTEL_SERVICE_NAME"), &from_env, entry_assembly, command_line)
        .unwrap_or_else(|| UNKNOWN_SERVICE.to_owned());
    let mut own = vec![
        ("service.name".to_owned(), service),
        ("process.pid".to_owned(), process.pid.to_string()),
    ];
    if let Some(start) = process.start_ns {
        let created = format_iso8601(clock.wall_of_boottime_ns(start));
        own.push(("process.creation.time".to_owned(), created));
    }
    if let Some(labels) = labels {
        own.extend(labels.container_id.clone().map(|id| ("container.id".to_owned(), id)));
        own.extend(labels.pod_uid.clone().map(|uid| ("k8s.pod.uid".to_owned(), uid)));
    }
    if let Some(version) = runtime.and_then(|r| r.clr_product_version.clone()) {
        own.push(("process.runtime.name".to_owned(), ".NET".to_owned()));
        own.push(("process.runtime.version".to_owned(), version));
    }
    // The process's own attributes first, without those tracer sets.
    let mut all: Vec<(String, String)> =
        from_env.into_iter().filter(|(k, _)| !own.iter().any(|(o, _)| o == k)).collect();
    all.extend(own);
    (all.into(), dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(resource: &'a ResourceAttributes, key: &str) -> Option<&'a str> {
        resource.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn what_the_process_says_and_what_tracer_knows() {
        let labels = ProcessLabels {
            container_id: Some("c0ffee".into()),
            pod_uid: Some("0c8f".into()),
            ..ProcessLabels::default()
        };
        let runtime = ProcessInfo {
            info_version: None,
            process_id: 42,
            runtime_cookie: tracer_decode::diagnostic_ipc::Guid([0; 16]),
            command_line: "dotnet /app/Shop.Api.dll".into(),
            os: "Linux".into(),
            arch: "x64".into(),
            managed_entrypoint_assembly: Some(String::new()),
            clr_product_version: Some("8.0.4".into()),
            portable_rid: None,
        };
        let environ = b"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod,process.pid=1,container.id=forged\0PATH=/bin";
        let process = Incarnation::new(42, Some(5_000_000_000));
        let clock = Clock::with_offset(1_000_000_000_000_000_000);
        let (resource, dropped) =
            process_resource(process, Some(&labels), Some(&runtime), Some(environ), &clock);
        assert_eq!(dropped, 0);
        let keys: Vec<&str> = resource.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "deployment.environment",
                "service.name",
                "process.pid",
                "process.creation.time",
                "container.id",
                "k8s.pod.uid",
                "process.runtime.name",
                "process.runtime.version"
            ]
        );
        assert_eq!(get(&resource, "service.name"), Some("Shop.Api"));
        assert_eq!(get(&resource, "process.pid"), Some("42"), "tracer's, not the process's");
        assert_eq!(get(&resource, "container.id"), Some("c0ffee"));
        assert_eq!(get(&resource, "process.creation.time"), Some("2001-09-09T01:46:45.000000000Z"));
        assert_eq!(get(&resource, "process.runtime.version"), Some("8.0.4"));
        // Its own name wins; nothing known: unknown_service.
        let named = b"OTEL_SERVICE_NAME=checkout";
        let (resource, _) = process_resource(process, None, Some(&runtime), Some(named), &clock);
        assert_eq!(get(&resource, "service.name"), Some("checkout"));
        let (resource, _) = process_resource(Incarnation::new(7, None), None, None, None, &clock);
        assert_eq!(get(&resource, "service.name"), Some(UNKNOWN_SERVICE));
        assert_eq!(get(&resource, "process.creation.time"), None);
    }
}
