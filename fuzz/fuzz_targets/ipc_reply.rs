//! The IPC reply decoder on arbitrary bytes: it must never panic, and whatever it accepts must be
//! exactly one message whose header it also accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_decode::diagnostic_ipc::{ReplyShape, decode_reply, decode_reply_header};

const SHAPES: [ReplyShape; 5] = [
    ReplyShape::Status,
    ReplyShape::SessionId,
    ReplyShape::ProcessInfo,
    ReplyShape::ProcessInfo2,
    ReplyShape::ProcessInfo3,
];

fuzz_target!(|data: &[u8]| {
    for shape in SHAPES {
        let header = decode_reply_header(shape, data);
        if let Ok(header) = &header {
            // An accepted header announces at least itself (callers subtract it: no underflow).
            assert!(usize::from(header.size) >= 20);
        }
        if decode_reply(shape, data).is_ok() {
            let header = header.expect("an accepted reply has an accepted header");
            assert_eq!(usize::from(header.size), data.len());
            // One more byte is no longer exactly one message.
            assert!(decode_reply(shape, &[data, &[0]].concat()).is_err());
        }
    }
});
