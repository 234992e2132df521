//! Text that other processes or the kernel hand tracer: `/proc/<pid>/{maps,status,stat,environ,
//! cgroup,timens_offsets,net/unix}` and `/proc/<pid>/task/<tid>/stat` (any process names its
//! sockets), `/proc/<pid>/fd` link targets, and a pidfd's fdinfo (a process controls its memfd
//! names, comm, environment and time namespace offsets) and tracefs files (`format`,
//! `header_page`, `header_event`, per-CPU `stats`; a user_events tracepoint's format follows the
//! fields its registering process chose), any of that text as a cell of `tracer top`'s
//! screen, and a process's OpenTelemetry resource from its environment. Never a panic; a
//! parsed event format or page layout then decodes the rest of the input as a record or page.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::container::environ_value;
use tracer_decode::ftrace::format::EventFormat;
use tracer_decode::ftrace::page::{PageLayout, decode_page};
use tracer_decode::ftrace::record::decode_fields;
use tracer_decode::ftrace::stats::CpuBufferStats;
use tracer_decode::otel_resource::{
    MAX_ATTRIBUTE_BYTES, MAX_ATTRIBUTES, resource_attributes, service_name,
};
use tracer_decode::procfs::{
    cgroup_v2_path, coreclr_version, memfd_mappings, parse_ns_pid, parse_ns_pid_depth,
    parse_pidfd_fdinfo_pid, parse_start_time, parse_stat_ppid, parse_status_cap_bnd,
    parse_status_cap_eff, parse_status_seccomp, parse_status_tgid, parse_status_uid,
    parse_status_uids, parse_task_stat, parse_timens_offsets, parse_tmpdir,
    start_time_in_namespace,
};
use tracer_decode::text::{escape_control, screen_cell, screen_width};
use tracer_decode::unix_socket::{
    diagnostic_socket_name, listening_diagnostic_sockets, parse_net_unix_line, parse_socket_link,
};

fuzz_target!(|input: &[u8]| {
    // The first byte says where the text ends and the record bytes begin.
    let Some((&cut, rest)) = input.split_first() else { return };
    let (text, record) = rest.split_at(usize::from(cut) * rest.len() / 256);
    let text = String::from_utf8_lossy(text);

    if let Ok(format) = EventFormat::parse(&text) {
        for field in format.fields() {
            assert!(field.offset.checked_add(field.size).is_some());
            assert!(format.fixed_size() >= field.end());
        }
        let _ = decode_fields(&format, record);
    }
    // A header_page layout, however odd, must be safe to decode pages with.
    if let Ok(layout) = PageLayout::parse_header_page(&text) {
        let _ = decode_page(record, &layout);
    }
    let _ = PageLayout::check_header_event(&text);
    let _ = CpuBufferStats::parse(&text);

    // Each value found, formatted back the way procfs prints it, parses to itself.
    for mapping in memfd_mappings(1, &text) {
        assert!(mapping.path.starts_with("/memfd:"), "{mapping:?}");
        assert!(mapping.prot() <= 7, "{mapping:?}");
        let line = format!(
            "{:x}-{:x} {} {:08x} 00:01 1 {}",
            mapping.start, mapping.end, mapping.perms, mapping.offset, mapping.path
        );
        assert_eq!(memfd_mappings(1, &line), [mapping]);
    }
    if let Some(version) = coreclr_version(&text) {
        // A version is plain text (it reaches a terminal table) and reads back from its line.
        assert!(version.bytes().all(|b| b.is_ascii_alphanumeric() || b"-+.".contains(&b)));
        let line = format!("7f00-7f10 r-xp 00000000 00:01 1 /d/{version}/libcoreclr.so");
        assert_eq!(coreclr_version(&line), Some(version));
    }
    if let Some(uid) = parse_status_uid(&text) {
        assert_eq!(parse_status_uid(&format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}")), Some(uid));
    }
    let _ = parse_status_cap_eff(&text);
    let _ = parse_status_cap_bnd(&text);
    let _ = parse_status_seccomp(&text);
    let _ = parse_status_tgid(&text);
    let _ = parse_stat_ppid(&text);
    if let Some(path) = cgroup_v2_path(&text) {
        assert_eq!(cgroup_v2_path(&format!("0::{path}")), Some(path));
    }
    if let Some(pid) = parse_ns_pid(&text) {
        assert_eq!(parse_ns_pid(&format!("NSpid:\t{pid}")), Some(pid));
    }
    // A line whose every pid parses has an innermost one.
    if parse_ns_pid_depth(&text).is_some() {
        assert!(parse_ns_pid(&text).is_some());
    }
    assert!(!escape_control(&text).chars().any(char::is_control));
    // A name on `tracer top`'s screen stays in its column and moves no cursor.
    let columns = usize::from(cut) % 64;
    let cell = screen_cell(&text, columns);
    assert!(screen_width(&cell) <= columns, "{cell:?} in {columns}");
    assert!(!cell.chars().any(char::is_control), "{cell:?}");
    let _ = parse_status_uids(&text);
    let _ = parse_pidfd_fdinfo_pid(&text);
    if let Some(offsets) = parse_timens_offsets(&text) {
        // Offsets come from another process's namespace; any pair must be safe to apply.
        let reader = parse_start_time(&text).unwrap_or(u64::MAX);
        let delta = offsets.boottime_ns - offsets.monotonic_ns;
        let keys = start_time_in_namespace(reader, delta, 10_000_000);
        assert!(keys.len() <= 2 && keys.windows(2).all(|w| w[1] == w[0] + 1), "{keys:?}");
    }
    if let Some(start) = parse_start_time(&text) {
        // Field 22 of a stat line: state, 18 more fields, then the start time.
        let stat = format!("1 (comm) S{} {start} 0", " 0".repeat(18));
        assert_eq!(parse_start_time(&stat), Some(start));
    }
    if let Some(stat) = parse_task_stat(&text) {
        // Printed back as procfs prints the line (a name, whatever it holds, in parentheses),
        // the fields read parse to themselves.
        let line = format!(
            "1 ({}) {} 0 0 0 0 -1 0 0 0 0 0 {} {} 0 0 20 0 {} 0 {} 0 {} 0 0\n",
            stat.comm,
            stat.state,
            stat.utime_ticks,
            stat.stime_ticks,
            stat.num_threads,
            stat.start_ticks,
            stat.rss_pages
        );
        assert_eq!(parse_task_stat(&line), Some(stat));
    }
    // Each listening diagnostic socket found, printed back as procfs prints it, parses to itself.
    for socket in listening_diagnostic_sockets(rest) {
        let name = socket.path.strip_prefix(b"@").unwrap_or(&socket.path);
        assert_eq!(diagnostic_socket_name(name), Some(socket.name));
        let line = [
            format!("0000000000000000: 00000002 00000000 00010000 0001 01 {:5} ", socket.inode)
                .as_bytes(),
            &socket.path,
        ]
        .concat();
        let entry = parse_net_unix_line(&line).expect("a printed line parses");
        assert!(entry.is_listening_stream());
        assert_eq!((entry.inode, &entry.path), (socket.inode, &socket.path));
    }
    if let Some(name) = diagnostic_socket_name(rest) {
        let printed = format!("/t/dotnet-diagnostic-{}-{}-socket", name.pid, name.key);
        assert_eq!(diagnostic_socket_name(printed.as_bytes()), Some(name));
    }
    if let Some(inode) = parse_socket_link(rest) {
        assert_eq!(parse_socket_link(format!("socket:[{inode}]").as_bytes()), Some(inode));
    }
    let tmpdir = parse_tmpdir(rest);
    assert!(!tmpdir.as_os_str().is_empty());
    let environ = [&b"TMPDIR="[..], tmpdir.as_os_str().as_encoded_bytes()].concat();
    assert_eq!(parse_tmpdir(&environ), tmpdir);

    // A process's own OpenTelemetry resource: bounded, printable attributes and service name.
    let (attributes, _) =
        resource_attributes(environ_value(rest, b"OTEL_RESOURCE_ATTRIBUTES").unwrap_or(rest));
    assert!(attributes.len() <= MAX_ATTRIBUTES);
    for (key, value) in &attributes {
        assert!(
            !key.is_empty()
                && key.len() <= MAX_ATTRIBUTE_BYTES
                && value.len() <= MAX_ATTRIBUTE_BYTES
        );
        assert!(!key.chars().chain(value.chars()).any(char::is_control), "{key:?}={value:?}");
    }
    let service = service_name(
        environ_value(rest, b"OTEL_SERVICE_NAME"),
        &attributes,
        Some(&text),
        Some(&text),
    );
    if let Some(name) = service {
        assert!(!name.is_empty() && name.len() <= MAX_ATTRIBUTE_BYTES, "{name:?}");
        assert!(!name.chars().any(char::is_control), "{name:?}");
    }
});
