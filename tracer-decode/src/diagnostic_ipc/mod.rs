//! The .NET diagnostic IPC protocol, no I/O: request encoders ([`request`], written with
//! [`writer`]) and reply decoders ([`reply`]).
//!
//! Byte layouts: docs/protocol/diagnostic-ipc.md. A 20-byte header (`DOTNET_IPC_V1\0`, u16 total
//! size, command set, command id, u16 reserved), little-endian integers, 1-byte bools, u32-counted
//! arrays and UTF-16LE strings whose u32 count includes the terminating NUL. Every reply byte
//! comes from another process and is treated as hostile: decoding checks every length against
//! what is there and reports the byte offset of the first problem.
mod reply;
mod request;
mod writer;

pub use reply::*;
pub use request::*;

/// `"DOTNET_IPC_V1"` followed by NUL.
pub const MAGIC: [u8; 14] = *b"DOTNET_IPC_V1\0";
/// Every message starts with this many header bytes; `size` counts them.
pub const HEADER_LEN: usize = 20;
/// `size` is a u16, so no message (header included) can be longer.
pub const MAX_MESSAGE_LEN: usize = u16::MAX as usize;
/// Rundown keywords the runtime uses when CollectTracing1–3 ask for a rundown
/// (docs/protocol/diagnostic-ipc.md §3.6).
pub const DEFAULT_RUNDOWN_KEYWORD: u64 = 0x8002_0139;
/// The runtime refuses sessions with more providers than this.
pub const MAX_PROVIDERS: usize = 1000;

const SET_EVENTPIPE: u8 = 0x02;
const SET_PROCESS: u8 = 0x04;
const SET_SERVER: u8 = 0xFF;
const REPLY_OK: u8 = 0x00;
const REPLY_ERROR: u8 = 0xFF;

#[cfg(test)]
mod test_support {
    use super::*;

    pub fn header(size: u16, set: u8, id: u8) -> Vec<u8> {
        let mut m = MAGIC.to_vec();
        m.extend_from_slice(&size.to_le_bytes());
        m.extend_from_slice(&[set, id, 0, 0]);
        m
    }

    pub fn utf16z(s: &str) -> Vec<u8> {
        let mut out = ((s.encode_utf16().count() + 1) as u32).to_le_bytes().to_vec();
        for unit in s.encode_utf16().chain([0]) {
            out.extend_from_slice(&unit.to_le_bytes());
        }
        out
    }

    pub fn reply(id: u8, payload: &[u8]) -> Vec<u8> {
        let mut m = header((HEADER_LEN + payload.len()) as u16, 0xFF, id);
        m.extend_from_slice(payload);
        m
    }
}
