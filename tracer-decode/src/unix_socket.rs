//! Names of .NET diagnostic server sockets and the listening sockets of `/proc/<pid>/net/unix`.
//!
//! Every runtime since .NET Core 3.0 binds `$TMPDIR/dotnet-diagnostic-<pid>-<key>-socket` (pid as
//! the runtime sees it, key = its start time in clock ticks) and listens on it. Socket names are
//! chosen by whoever binds them, so a match says "looks like a runtime"; the session's checks
//! (socket owner, listener identity) decide whether tracer talks to it.
use tracer_common::{
    DIAGNOSTIC_SOCKET_MAX_DIGITS, DIAGNOSTIC_SOCKET_PREFIX, DIAGNOSTIC_SOCKET_SUFFIX,
};

/// The numbers of a `dotnet-diagnostic-<pid>-<key>-socket` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiagnosticSocketName {
    /// The pid the runtime saw (its innermost pid namespace).
    pub pid: u64,
    pub key: u64,
}

/// `Some` when the basename of `path` (after its last `/`) is exactly
/// `dotnet-diagnostic-<digits>-<digits>-socket`, each run of 1 to
/// [`DIAGNOSTIC_SOCKET_MAX_DIGITS`] digits — the pattern the eBPF program matches at `bind()`.
pub fn diagnostic_socket_name(path: &[u8]) -> Option<DiagnosticSocketName> {
    let base = match path.iter().rposition(|&b| b == b'/') {
        Some(slash) => &path[slash + 1..],
        None => path,
    };
    let numbers =
        base.strip_prefix(DIAGNOSTIC_SOCKET_PREFIX)?.strip_suffix(DIAGNOSTIC_SOCKET_SUFFIX)?;
    let dash = numbers.iter().position(|&b| b == b'-')?;
    let (pid, key) = (&numbers[..dash], &numbers[dash + 1..]);
    Some(DiagnosticSocketName { pid: decimal(pid)?, key: decimal(key)? })
}

/// 1 to [`DIAGNOSTIC_SOCKET_MAX_DIGITS`] ASCII digits (which always fit a u64).
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > DIAGNOSTIC_SOCKET_MAX_DIGITS {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0')))
}

/// `__SO_ACCEPTCON` in the `Flags` column: the socket is listening.
const SO_ACCEPTCON: u32 = 1 << 16;
/// `SOCK_STREAM` in the `Type` column.
const SOCK_STREAM: u32 = 1;

/// One line of `/proc/net/unix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnixSocketEntry {
    pub flags: u32,
    pub socket_type: u32,
    pub state: u32,
    pub inode: u64,
    /// The name as procfs prints it (abstract names start with `@`); empty when unbound.
    pub path: Vec<u8>,
}

impl UnixSocketEntry {
    pub fn is_listening_stream(&self) -> bool {
        self.flags & SO_ACCEPTCON != 0 && self.socket_type == SOCK_STREAM
    }
}

/// Parses one line: `Num: RefCount Protocol Flags Type St Inode [Path]` (hex but the inode).
/// The path is the rest of the line after one space (names may hold spaces; a name holding a
/// newline splits its line, and the pieces fail to parse or carry someone's chosen numbers —
/// which is why a match is only a candidate).
pub fn parse_net_unix_line(line: &[u8]) -> Option<UnixSocketEntry> {
    let mut rest = line;
    let mut cols = [&b""[..]; 7];
    for col in &mut cols {
        let start = rest.iter().position(|&b| b != b' ')?;
        rest = &rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        *col = &rest[..end];
        rest = &rest[end..];
    }
    let [num, _refcount, _protocol, flags, socket_type, state, inode] = cols;
    num.strip_suffix(b":")?;
    let hex = |c: &[u8]| u32::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok();
    let path = match rest.split_first() {
        None => Vec::new(),
        Some((b' ', path)) => path.to_vec(),
        Some(_) => return None,
    };
    Some(UnixSocketEntry {
        flags: hex(flags)?,
        socket_type: hex(socket_type)?,
        state: hex(state)?,
        inode: std::str::from_utf8(inode).ok()?.parse().ok()?,
        path,
    })
}

/// A listening stream socket with a diagnostic socket's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListeningDiagnosticSocket {
    pub inode: u64,
    pub path: Vec<u8>,
    pub name: DiagnosticSocketName,
}

/// The listening diagnostic sockets of a `/proc/<pid>/net/unix` text (the header line and
/// anything unparsable are skipped).
pub fn listening_diagnostic_sockets(text: &[u8]) -> Vec<ListeningDiagnosticSocket> {
    text.split(|&b| b == b'\n')
        .filter_map(parse_net_unix_line)
        .filter(UnixSocketEntry::is_listening_stream)
        .filter_map(|e| {
            // procfs prints an abstract name's leading NUL as `@`.
            let name = diagnostic_socket_name(e.path.strip_prefix(b"@").unwrap_or(&e.path))?;
            Some(ListeningDiagnosticSocket { inode: e.inode, path: e.path, name })
        })
        .collect()
}

/// The inode of a `/proc/<pid>/fd/<n>` link target `socket:[<inode>]`.
pub fn parse_socket_link(target: &[u8]) -> Option<u64> {
    let digits = target.strip_prefix(b"socket:[")?.strip_suffix(b"]")?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(pid: u64, key: u64) -> Option<DiagnosticSocketName> {
        Some(DiagnosticSocketName { pid, key })
    }

    #[test]
    fn diagnostic_names() {
        assert_eq!(
            diagnostic_socket_name(b"/tmp/dotnet-diagnostic-123-4567-socket"),
            name(123, 4567)
        );
        assert_eq!(diagnostic_socket_name(b"dotnet-diagnostic-1-2-socket"), name(1, 2));
        assert_eq!(diagnostic_socket_name(b"@/x/dotnet-diagnostic-1-2-socket"), name(1, 2));
        let max = b"/t/dotnet-diagnostic-9999999999999999999-9999999999999999999-socket";
        assert_eq!(
            diagnostic_socket_name(max),
            name(9_999_999_999_999_999_999, 9_999_999_999_999_999_999)
        );
        for bad in [
            &b"/tmp/dotnet-diagnostic-123-4567-socket.x"[..],
            b"/tmp/xdotnet-diagnostic-1-2-socket",
            b"/tmp/dotnet-diagnostic--2-socket",
            b"/tmp/dotnet-diagnostic-1--socket",
            b"/tmp/dotnet-diagnostic-1-2-3-socket",
            b"/tmp/dotnet-diagnostic-1a-2-socket",
            b"/tmp/dotnet-diagnostic-12345678901234567890-2-socket",
            b"/tmp/dotnet-diagnostic-1-2-socket/",
            b"/tmp/dotnet-diagnostic-1-2-Socket",
            b"",
        ] {
            assert_eq!(diagnostic_socket_name(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn net_unix_lines() {
        let text = b"Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 51234 /tmp/dotnet-diagnostic-77-880-socket\n\
            0000000000000000: 00000002 00000000 00000000 0001 01 51235 /tmp/dotnet-diagnostic-78-880-socket\n\
            0000000000000000: 00000002 00000000 00010000 0002 01 51236 /tmp/dotnet-diagnostic-79-880-socket\n\
            0000000000000000: 00000002 00000000 00010000 0001 01  7001 @dotnet-diagnostic-80-1-socket\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 51237 /tmp/a b/dotnet-diagnostic-81-2-socket\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 51238\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 51239 /run/other.sock\n";
        let found = listening_diagnostic_sockets(text);
        let got: Vec<(u64, &[u8], DiagnosticSocketName)> =
            found.iter().map(|s| (s.inode, &s.path[..], s.name)).collect();
        assert_eq!(
            got,
            vec![
                (51234, &b"/tmp/dotnet-diagnostic-77-880-socket"[..], name(77, 880).unwrap()),
                (7001, &b"@dotnet-diagnostic-80-1-socket"[..], name(80, 1).unwrap()),
                (51237, &b"/tmp/a b/dotnet-diagnostic-81-2-socket"[..], name(81, 2).unwrap()),
            ]
        );
        let unbound =
            parse_net_unix_line(b"0000000000000000: 00000003 00000000 00000000 0001 03 51238")
                .unwrap();
        assert_eq!(
            unbound,
            UnixSocketEntry { flags: 0, socket_type: 1, state: 3, inode: 51238, path: vec![] }
        );
        assert_eq!(
            parse_net_unix_line(b"Num       RefCount Protocol Flags    Type St Inode Path"),
            None
        );
        assert_eq!(parse_net_unix_line(b"0: 1 0 10000 1 1"), None);
    }

    #[test]
    fn socket_links() {
        assert_eq!(parse_socket_link(b"socket:[51234]"), Some(51234));
        assert_eq!(parse_socket_link(b"socket:[]"), None);
        assert_eq!(parse_socket_link(b"socket:[+1]"), None);
        assert_eq!(parse_socket_link(b"pipe:[51234]"), None);
        assert_eq!(parse_socket_link(b"socket:[99999999999999999999999]"), None);
    }
}
