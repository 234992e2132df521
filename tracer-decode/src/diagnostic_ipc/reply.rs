//! Replies from a runtime: header validation and payload decoding, bounded by the expected
//! reply shape.
use std::fmt;

use thiserror::Error;

use super::*;

/// 16 GUID bytes in Windows memory layout (u32, u16, u16 little-endian, then 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guid(pub [u8; 16]);

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        let d1 = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let d2 = u16::from_le_bytes([b[4], b[5]]);
        let d3 = u16::from_le_bytes([b[6], b[7]]);
        write!(f, "{d1:08x}-{d2:04x}-{d3:04x}-{:02x}{:02x}-", b[8], b[9])?;
        b[10..].iter().try_for_each(|x| write!(f, "{x:02x}"))
    }
}

/// What the OK reply of a command carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyShape {
    /// `i32` status (always 0 from the runtime).
    Status,
    /// `u64` session id (CollectTracing*, StopTracing).
    SessionId,
    ProcessInfo,
    ProcessInfo2,
    ProcessInfo3,
}

impl ReplyShape {
    /// Largest OK payload a well-behaved runtime sends for this shape: a reply announcing more
    /// is refused before its payload is read.
    fn max_ok_payload(self) -> usize {
        match self {
            ReplyShape::Status => 4,
            ReplyShape::SessionId => 8,
            ReplyShape::ProcessInfo | ReplyShape::ProcessInfo2 | ReplyShape::ProcessInfo3 => {
                MAX_MESSAGE_LEN - HEADER_LEN
            }
        }
    }
}

/// Decoded fields of a ProcessInfo, ProcessInfo2 or ProcessInfo3 reply
/// (docs/protocol/diagnostic-ipc.md §3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// ProcessInfo3's leading version field; `None` for ProcessInfo/ProcessInfo2.
    pub info_version: Option<u32>,
    /// The pid as the runtime sees it (inside its pid namespace).
    pub process_id: u64,
    pub runtime_cookie: Guid,
    pub command_line: String,
    pub os: String,
    pub arch: String,
    /// ProcessInfo2 and later.
    pub managed_entrypoint_assembly: Option<String>,
    /// ProcessInfo2 and later, e.g. `8.0.4+<commit>`.
    pub clr_product_version: Option<String>,
    /// ProcessInfo3 with version ≥ 1, e.g. `linux-x64`.
    pub portable_rid: Option<String>,
}

impl ProcessInfo {
    /// Major runtime version from `clrProductVersion` (`"10.0.0+abc"` → 10); `None` before
    /// ProcessInfo2 (.NET 5) or when the string does not start with a number.
    pub fn major_version(&self) -> Option<u32> {
        major_version(self.clr_product_version.as_deref()?)
    }
}

/// The leading number of a runtime version (`8.0.4+abc` → 8).
pub fn major_version(version: &str) -> Option<u32> {
    let digits = version.find(|c: char| !c.is_ascii_digit()).unwrap_or(version.len());
    version[..digits].parse().ok()
}

/// A decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(i32),
    SessionId(u64),
    ProcessInfo(ProcessInfo),
    /// The runtime refused the command.
    Error {
        error: ServerError,
        message: Option<String>,
    },
}

/// HRESULTs of Error replies (docs/protocol/diagnostic-ipc.md §2.4), each explaining what it means
/// for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum ServerError {
    #[error(
        "BAD_ENCODING (0x80131384): the runtime could not parse the request, does not support one \
         of its options, or did not receive a valid file descriptor"
    )]
    BadEncoding,
    #[error(
        "UNKNOWN_COMMAND (0x80131385): the runtime does not know this command (it is older than \
         the command)"
    )]
    UnknownCommand,
    #[error("UNKNOWN_MAGIC (0x80131386): the runtime did not recognise the message header")]
    UnknownMagic,
    #[error("UnknownError (0x80131387): the runtime reported an unspecified error")]
    UnknownError,
    #[error("NOTSUPPORTED (0x80131515): the command is not supported on this platform or runtime")]
    NotSupported,
    #[error(
        "FAIL (0x80004005): the runtime failed to carry out the command (e.g. the session could \
         not be enabled, or user_events registration was refused)"
    )]
    Fail,
    #[error("NOT_YET_AVAILABLE (0x8013135B): the runtime has not started far enough; retry later")]
    NotYetAvailable,
    #[error("RUNTIME_UNINITIALIZED (0x80131371): the runtime is not initialised")]
    RuntimeUninitialized,
    #[error("INVALIDARG (0x80070057): the runtime rejected an argument of the command")]
    InvalidArg,
    #[error("INSUFFICIENT_BUFFER (0x8007007A): a buffer in the runtime was too small")]
    InsufficientBuffer,
    #[error("ENVVAR_NOT_FOUND (0x800000CB): the environment variable does not exist")]
    EnvVarNotFound,
    #[error("ProfilerAlreadyActive (0x8013136A): a profiler is already loaded")]
    ProfilerAlreadyActive,
    #[error("unrecognised HRESULT {0:#010x}")]
    Other(u32),
}

impl ServerError {
    pub fn from_hresult(hresult: u32) -> ServerError {
        match hresult {
            0x8013_1384 => ServerError::BadEncoding,
            0x8013_1385 => ServerError::UnknownCommand,
            0x8013_1386 => ServerError::UnknownMagic,
            0x8013_1387 => ServerError::UnknownError,
            0x8013_1515 => ServerError::NotSupported,
            0x8000_4005 => ServerError::Fail,
            0x8013_135B => ServerError::NotYetAvailable,
            0x8013_1371 => ServerError::RuntimeUninitialized,
            0x8007_0057 => ServerError::InvalidArg,
            0x8007_007A => ServerError::InsufficientBuffer,
            0x8000_00CB => ServerError::EnvVarNotFound,
            0x8013_136A => ServerError::ProfilerAlreadyActive,
            other => ServerError::Other(other),
        }
    }

    pub fn hresult(self) -> u32 {
        match self {
            ServerError::BadEncoding => 0x8013_1384,
            ServerError::UnknownCommand => 0x8013_1385,
            ServerError::UnknownMagic => 0x8013_1386,
            ServerError::UnknownError => 0x8013_1387,
            ServerError::NotSupported => 0x8013_1515,
            ServerError::Fail => 0x8000_4005,
            ServerError::NotYetAvailable => 0x8013_135B,
            ServerError::RuntimeUninitialized => 0x8013_1371,
            ServerError::InvalidArg => 0x8007_0057,
            ServerError::InsufficientBuffer => 0x8007_007A,
            ServerError::EnvVarNotFound => 0x8000_00CB,
            ServerError::ProfilerAlreadyActive => 0x8013_136A,
            ServerError::Other(hresult) => hresult,
        }
    }
}

/// Why reply bytes were refused. `offset` is counted from the first byte of the reply header.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("reply truncated at offset {offset}: {what} needs {needed} bytes, {available} left")]
    Truncated { offset: usize, what: &'static str, needed: usize, available: usize },
    #[error(
        "bad magic at offset 0: {found:02x?} is not \"DOTNET_IPC_V1\\0\" (not a .NET runtime?)"
    )]
    BadMagic { found: [u8; 14] },
    #[error("command set {found:#04x} at offset 16 is not 0xff (Server): not a reply")]
    NotAReply { found: u8 },
    #[error("reply command id {found:#04x} at offset 17 is neither 0x00 (OK) nor 0xff (Error)")]
    UnknownReplyId { found: u8 },
    #[error("declared size {size} at offset 14 is smaller than the 20-byte header")]
    SizeTooSmall { size: u16 },
    #[error(
        "declared size {size} at offset 14 exceeds the {max} bytes a {shape:?} {kind} reply can \
         have"
    )]
    Oversize { size: u16, max: usize, shape: ReplyShape, kind: &'static str },
    #[error("reply is {actual} bytes but its header at offset 14 declares {declared}")]
    LengthMismatch { declared: u16, actual: usize },
    #[error("{extra} unexpected bytes after the {shape:?} reply at offset {offset}")]
    TrailingBytes { offset: usize, extra: usize, shape: ReplyShape },
    #[error("{what} string at offset {offset} lacks its NUL terminator")]
    StringNotTerminated { offset: usize, what: &'static str },
    #[error(
        "{what} string at offset {offset} claims {units} UTF-16 code units but only {available} \
         bytes remain"
    )]
    StringTooLong { offset: usize, what: &'static str, units: u32, available: usize },
    #[error("{what} string at offset {offset} is not valid UTF-16")]
    InvalidUtf16 { offset: usize, what: &'static str },
}

/// The validated 20-byte header of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHeader {
    /// Total message size, header included (≥ 20).
    pub size: u16,
    pub is_error: bool,
}

/// Validates a reply header (magic, command set 0xFF, id OK/Error, size ≥ 20) and refuses a size
/// that the expected reply `shape` cannot have, so that a hostile peer cannot make the caller
/// wait for bytes it will never need.
pub fn decode_reply_header(shape: ReplyShape, bytes: &[u8]) -> Result<ReplyHeader, DecodeError> {
    let header = bytes.get(..HEADER_LEN).ok_or(DecodeError::Truncated {
        offset: 0,
        what: "reply header",
        needed: HEADER_LEN,
        available: bytes.len(),
    })?;
    if header[..14] != MAGIC {
        let mut found = [0; 14];
        found.copy_from_slice(&header[..14]);
        return Err(DecodeError::BadMagic { found });
    }
    let size = u16::from_le_bytes([header[14], header[15]]);
    if header[16] != SET_SERVER {
        return Err(DecodeError::NotAReply { found: header[16] });
    }
    let is_error = match header[17] {
        REPLY_OK => false,
        REPLY_ERROR => true,
        found => return Err(DecodeError::UnknownReplyId { found }),
    };
    if usize::from(size) < HEADER_LEN {
        return Err(DecodeError::SizeTooSmall { size });
    }
    let (max, kind) = if is_error {
        // An HRESULT, optionally followed by a message string: any size is possible.
        (MAX_MESSAGE_LEN, "Error")
    } else {
        (HEADER_LEN + shape.max_ok_payload(), "OK")
    };
    if usize::from(size) > max {
        return Err(DecodeError::Oversize { size, max, shape, kind });
    }
    Ok(ReplyHeader { size, is_error })
}

/// Decodes one complete reply message (header + exactly `size - 20` payload bytes) to a command
/// whose OK reply has `shape`.
pub fn decode_reply(shape: ReplyShape, message: &[u8]) -> Result<Reply, DecodeError> {
    let header = decode_reply_header(shape, message)?;
    if message.len() != usize::from(header.size) {
        if message.len() < usize::from(header.size) {
            return Err(DecodeError::Truncated {
                offset: message.len(),
                what: "reply payload",
                needed: usize::from(header.size) - message.len(),
                available: 0,
            });
        }
        return Err(DecodeError::LengthMismatch { declared: header.size, actual: message.len() });
    }
    let mut r = Reader { bytes: message, pos: HEADER_LEN };
    let reply = if header.is_error {
        let error = ServerError::from_hresult(r.u32("HRESULT")?);
        // GenerateCoreDump3 may append a message; accept it from any command.
        let message = if r.remaining() > 0 { Some(r.string("error message")?) } else { None };
        Reply::Error { error, message }
    } else {
        match shape {
            ReplyShape::Status => Reply::Status(r.u32("status")? as i32),
            ReplyShape::SessionId => Reply::SessionId(r.u64("session id")?),
            ReplyShape::ProcessInfo | ReplyShape::ProcessInfo2 | ReplyShape::ProcessInfo3 => {
                Reply::ProcessInfo(decode_process_info(shape, &mut r)?)
            }
        }
    };
    if r.remaining() > 0 && !r.may_have_appended_fields(&reply) {
        return Err(DecodeError::TrailingBytes { offset: r.pos, extra: r.remaining(), shape });
    }
    Ok(reply)
}

fn decode_process_info(shape: ReplyShape, r: &mut Reader<'_>) -> Result<ProcessInfo, DecodeError> {
    let info_version =
        if shape == ReplyShape::ProcessInfo3 { Some(r.u32("ProcessInfo3 version")?) } else { None };
    let process_id = r.u64("process id")?;
    let runtime_cookie = r.guid("runtime cookie")?;
    let command_line = r.string("command line")?;
    let os = r.string("OS")?;
    let arch = r.string("arch")?;
    let (managed_entrypoint_assembly, clr_product_version) = if shape == ReplyShape::ProcessInfo {
        (None, None)
    } else {
        (Some(r.string("managed entrypoint assembly")?), Some(r.string("clr product version")?))
    };
    let portable_rid = match info_version {
        Some(v) if v >= 1 => Some(r.string("portable RID")?),
        _ => None,
    };
    Ok(ProcessInfo {
        info_version,
        process_id,
        runtime_cookie,
        command_line,
        os,
        arch,
        managed_entrypoint_assembly,
        clr_product_version,
        portable_rid,
    })
}

/// Bounds-checked little-endian reader over one reply message.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let available = self.remaining();
        if n > available {
            return Err(DecodeError::Truncated { offset: self.pos, what, needed: n, available });
        }
        let slice = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn guid(&mut self, what: &'static str) -> Result<Guid, DecodeError> {
        self.array(what).map(Guid)
    }

    /// u32 count of UTF-16 units including the NUL, then the units. Count 0 is an empty string.
    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let offset = self.pos;
        let units = self.u32(what)?;
        let byte_len = u64::from(units) * 2;
        let available = self.remaining();
        if byte_len > available as u64 {
            return Err(DecodeError::StringTooLong { offset, what, units, available });
        }
        let bytes = self.take(byte_len as usize, what)?;
        let Some((text, terminator)) = bytes.split_last_chunk::<2>() else {
            return Ok(String::new()); // count 0: absent string
        };
        if *terminator != [0, 0] {
            return Err(DecodeError::StringNotTerminated { offset, what });
        }
        let code_units = text.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
        char::decode_utf16(code_units)
            .collect::<Result<String, _>>()
            .map_err(|_| DecodeError::InvalidUtf16 { offset, what })
    }

    /// ProcessInfo3 promises that later versions only append fields; everything else is exact.
    fn may_have_appended_fields(&self, reply: &Reply) -> bool {
        matches!(reply, Reply::ProcessInfo(ProcessInfo { info_version: Some(v), .. }) if *v > 1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn major_version_from_clr_product_version() {
        let mut info = ProcessInfo {
            info_version: None,
            process_id: 1,
            runtime_cookie: Guid([0; 16]),
            command_line: String::new(),
            os: "Linux".into(),
            arch: "x64".into(),
            managed_entrypoint_assembly: None,
            clr_product_version: Some("10.0.0+test-double".into()),
            portable_rid: None,
        };
        assert_eq!(info.major_version(), Some(10));
        info.clr_product_version = Some("8.0.4".into());
        assert_eq!(info.major_version(), Some(8));
        info.clr_product_version = Some("v8".into());
        assert_eq!(info.major_version(), None);
        info.clr_product_version = None;
        assert_eq!(info.major_version(), None);
    }

    #[test]
    fn ok_replies() {
        let session = reply(0, &0xdead_beef_u64.to_le_bytes());
        assert_eq!(session.len(), 28);
        assert_eq!(
            decode_reply(ReplyShape::SessionId, &session),
            Ok(Reply::SessionId(0xdead_beef))
        );
        assert_eq!(decode_reply(ReplyShape::Status, &reply(0, &[0; 4])), Ok(Reply::Status(0)));
    }

    #[test]
    fn error_replies_name_the_hresult() {
        let r = decode_reply(ReplyShape::ProcessInfo3, &reply(0xFF, &0x8013_1385u32.to_le_bytes()));
        assert_eq!(r, Ok(Reply::Error { error: ServerError::UnknownCommand, message: None }));
        let with_message = [0x8000_4005u32.to_le_bytes().as_slice(), &utf16z("boom")].concat();
        assert_eq!(
            decode_reply(ReplyShape::SessionId, &reply(0xFF, &with_message)),
            Ok(Reply::Error { error: ServerError::Fail, message: Some("boom".into()) })
        );
        for hresult in [0x8013_1384, 0x8013_1386, 0x8013_1515, 0x8013_135B, 0x1234_5678] {
            assert_eq!(ServerError::from_hresult(hresult).hresult(), hresult);
        }
        assert!(ServerError::UnknownCommand.to_string().contains("older"));
        assert_eq!(ServerError::Other(0x1234_5678).to_string(), "unrecognised HRESULT 0x12345678");
    }

    fn process_info_payload(version: Option<u32>) -> Vec<u8> {
        let mut p = Vec::new();
        if let Some(v) = version {
            p.extend_from_slice(&v.to_le_bytes());
        }
        p.extend_from_slice(&42u64.to_le_bytes());
        p.extend_from_slice(&[
            0x78, 0x56, 0x34, 0x12, 0x34, 0x12, 0x78, 0x56, 1, 2, 3, 4, 5, 6, 7, 8,
        ]);
        p.extend_from_slice(&utf16z("/usr/bin/python3 host.py"));
        p.extend_from_slice(&utf16z("Linux"));
        p.extend_from_slice(&utf16z("x64"));
        p
    }

    #[test]
    fn process_info_versions() {
        let v1 = decode_reply(ReplyShape::ProcessInfo, &reply(0, &process_info_payload(None)));
        let Ok(Reply::ProcessInfo(info)) = v1 else { panic!("{v1:?}") };
        assert_eq!(info.process_id, 42);
        assert_eq!(info.runtime_cookie.to_string(), "12345678-1234-5678-0102-030405060708");
        assert_eq!(info.command_line, "/usr/bin/python3 host.py");
        assert_eq!((info.os.as_str(), info.arch.as_str()), ("Linux", "x64"));
        assert_eq!(info.clr_product_version, None);

        let mut p3 = process_info_payload(Some(1));
        p3.extend_from_slice(&utf16z("python3"));
        p3.extend_from_slice(&utf16z("8.0.4+2d7eea252964e69be94cb9c847b371b23e4dd470"));
        p3.extend_from_slice(&utf16z("linux-x64"));
        let Ok(Reply::ProcessInfo(info)) = decode_reply(ReplyShape::ProcessInfo3, &reply(0, &p3))
        else {
            panic!()
        };
        assert_eq!(info.info_version, Some(1));
        assert_eq!(info.managed_entrypoint_assembly.as_deref(), Some("python3"));
        assert!(info.clr_product_version.as_deref().unwrap().starts_with("8.0.4+"));
        assert_eq!(info.portable_rid.as_deref(), Some("linux-x64"));

        // A later ProcessInfo3 version may append fields; version 1 may not.
        let mut p3_future = p3.clone();
        p3_future[..4].copy_from_slice(&2u32.to_le_bytes());
        p3_future.extend_from_slice(&[9, 9, 9]);
        let Ok(Reply::ProcessInfo(future)) =
            decode_reply(ReplyShape::ProcessInfo3, &reply(0, &p3_future))
        else {
            panic!("a later version decodes")
        };
        assert_eq!(future, ProcessInfo { info_version: Some(2), ..info.clone() });
        let mut p3_trailing = p3;
        p3_trailing.push(9);
        let len = 20 + p3_trailing.len();
        assert_eq!(
            decode_reply(ReplyShape::ProcessInfo3, &reply(0, &p3_trailing)),
            Err(DecodeError::TrailingBytes {
                offset: len - 1,
                extra: 1,
                shape: ReplyShape::ProcessInfo3
            })
        );
    }

    /// Replies captured from the real CoreCLR 8.0.4 host by `tests/dotnet/capture_ipc_replies.py`.
    mod captured {
        pub const PROCESS_INFO: &[u8] = include_bytes!("fixtures/ipc/processinfo_8.0.4.bin");
        pub const PROCESS_INFO2: &[u8] = include_bytes!("fixtures/ipc/processinfo2_8.0.4.bin");
        pub const PROCESS_INFO3: &[u8] = include_bytes!("fixtures/ipc/processinfo3_8.0.4.bin");
        pub const SESSION: &[u8] = include_bytes!("fixtures/ipc/collecttracing2_session_8.0.4.bin");
        pub const STOP: &[u8] = include_bytes!("fixtures/ipc/stoptracing_8.0.4.bin");
        pub const UNKNOWN_COMMAND: &[u8] =
            include_bytes!("fixtures/ipc/collecttracing3_unknown_command_8.0.4.bin");
        pub const DISABLE_PERF_MAP: &[u8] = include_bytes!("fixtures/ipc/disableperfmap_8.0.4.bin");
    }

    #[test]
    fn real_8_0_4_process_info_replies() {
        let decode = |shape, bytes| match decode_reply(shape, bytes) {
            Ok(Reply::ProcessInfo(info)) => info,
            other => panic!("{shape:?}: {other:?}"),
        };
        let v3 = decode(ReplyShape::ProcessInfo3, captured::PROCESS_INFO3);
        assert_eq!(v3.info_version, Some(1));
        assert_eq!(v3.process_id, 4280);
        assert_eq!(v3.runtime_cookie.to_string(), "d5ec28c1-c576-4f39-81a8-49f6f6035822");
        assert_eq!(v3.command_line, "/root/.pyenv/versions/3.11.7/bin/python3.11");
        assert_eq!((v3.os.as_str(), v3.arch.as_str()), ("Linux", "x64"));
        // Hosted from Python: there is no managed entry point assembly.
        assert_eq!(v3.managed_entrypoint_assembly.as_deref(), Some(""));
        assert_eq!(v3.clr_product_version.as_deref(), Some("8.0.4"));
        assert_eq!(v3.portable_rid.as_deref(), Some("linux-x64"));

        let v2 = decode(ReplyShape::ProcessInfo2, captured::PROCESS_INFO2);
        let v1 = decode(ReplyShape::ProcessInfo, captured::PROCESS_INFO);
        assert_eq!(v2, ProcessInfo { info_version: None, portable_rid: None, ..v3.clone() });
        assert_eq!(
            v1,
            ProcessInfo { managed_entrypoint_assembly: None, clr_product_version: None, ..v2 }
        );
    }

    #[test]
    fn real_8_0_4_session_status_and_error_replies() {
        let session = decode_reply(ReplyShape::SessionId, captured::SESSION);
        assert_eq!(session, Ok(Reply::SessionId(0x7fe5_e000_16f0)));
        assert_eq!(decode_reply(ReplyShape::SessionId, captured::STOP), session);
        assert_eq!(
            decode_reply(ReplyShape::SessionId, captured::UNKNOWN_COMMAND),
            Ok(Reply::Error { error: ServerError::UnknownCommand, message: None })
        );
        assert_eq!(
            decode_reply(ReplyShape::Status, captured::DISABLE_PERF_MAP),
            Ok(Reply::Status(0))
        );
    }

    /// Every cut of a real reply, with the header's size patched to match, is refused.
    #[test]
    fn every_truncation_of_a_real_reply_is_refused() {
        let full = captured::PROCESS_INFO3;
        for len in 0..full.len() {
            let mut cut = full[..len].to_vec();
            if len >= HEADER_LEN {
                cut[14..16].copy_from_slice(&(len as u16).to_le_bytes());
            }
            let result = decode_reply(ReplyShape::ProcessInfo3, &cut);
            assert!(
                matches!(
                    result,
                    Err(DecodeError::Truncated { .. } | DecodeError::StringTooLong { .. })
                ),
                "cut at {len}: {result:?}"
            );
        }
    }

    #[test]
    fn hostile_replies_are_refused_with_offsets() {
        let shape = ReplyShape::SessionId;
        let mut bad_magic = reply(0, &[0; 8]);
        bad_magic[3] = b'X';
        assert!(matches!(decode_reply(shape, &bad_magic), Err(DecodeError::BadMagic { .. })));
        assert_eq!(
            decode_reply(shape, &header(28, 0x02, 0)),
            Err(DecodeError::NotAReply { found: 0x02 })
        );
        assert_eq!(
            decode_reply(shape, &header(28, 0xFF, 0x01)),
            Err(DecodeError::UnknownReplyId { found: 0x01 })
        );
        assert_eq!(
            decode_reply(shape, &header(19, 0xFF, 0)),
            Err(DecodeError::SizeTooSmall { size: 19 })
        );
        assert_eq!(
            decode_reply(shape, &b"DOTNET"[..]),
            Err(DecodeError::Truncated {
                offset: 0,
                what: "reply header",
                needed: 20,
                available: 6
            })
        );
        // A session reply announcing 60 KB is refused from its header alone.
        assert_eq!(
            decode_reply_header(shape, &header(60_000, 0xFF, 0)),
            Err(DecodeError::Oversize { size: 60_000, max: 28, shape, kind: "OK" })
        );
        let mut short = reply(0, &[0; 8]);
        short.truncate(24);
        assert_eq!(
            decode_reply(shape, &short),
            Err(DecodeError::Truncated {
                offset: 24,
                what: "reply payload",
                needed: 4,
                available: 0
            })
        );
        let mut long = reply(0, &[0; 8]);
        long.push(0);
        assert_eq!(
            decode_reply(shape, &long),
            Err(DecodeError::LengthMismatch { declared: 28, actual: 29 })
        );
        // A 4-byte payload where a session id (8 bytes) is due.
        assert_eq!(
            decode_reply(shape, &reply(0, &[0; 4])),
            Err(DecodeError::Truncated { offset: 20, what: "session id", needed: 8, available: 4 })
        );
    }

    #[test]
    fn hostile_strings_are_refused_with_offsets() {
        let shape = ReplyShape::ProcessInfo;
        let strings_at = 20 + 8 + 16;
        let with_command_line = |s: &[u8]| {
            let mut p = process_info_payload(None)[..24].to_vec();
            p.extend_from_slice(s);
            reply(0, &p)
        };
        // Count says 3 units but the last one is not NUL.
        let unterminated = [3u32.to_le_bytes().as_slice(), &[b'a', 0, b'b', 0, b'c', 0]].concat();
        assert_eq!(
            decode_reply(shape, &with_command_line(&unterminated)),
            Err(DecodeError::StringNotTerminated { offset: strings_at, what: "command line" })
        );
        let too_long = [1000u32.to_le_bytes().as_slice(), &[b'a', 0, 0, 0]].concat();
        assert_eq!(
            decode_reply(shape, &with_command_line(&too_long)),
            Err(DecodeError::StringTooLong {
                offset: strings_at,
                what: "command line",
                units: 1000,
                available: 4
            })
        );
        let huge = u32::MAX.to_le_bytes();
        assert!(matches!(
            decode_reply(shape, &with_command_line(&huge)),
            Err(DecodeError::StringTooLong { units: u32::MAX, available: 0, .. })
        ));
        // A lone high surrogate (0xD800) followed by the terminator.
        let lone_surrogate = [2u32.to_le_bytes().as_slice(), &[0x00, 0xD8, 0, 0]].concat();
        assert_eq!(
            decode_reply(shape, &with_command_line(&lone_surrogate)),
            Err(DecodeError::InvalidUtf16 { offset: strings_at, what: "command line" })
        );
        // Valid command line, then the OS string is cut off.
        let cut = [utf16z("x"), 2u32.to_le_bytes().to_vec()].concat();
        assert_eq!(
            decode_reply(shape, &with_command_line(&cut)),
            Err(DecodeError::StringTooLong {
                offset: strings_at + 8,
                what: "OS",
                units: 2,
                available: 0
            })
        );
    }
}
