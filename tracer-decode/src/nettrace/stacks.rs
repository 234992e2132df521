//! StackBlocks (docs/protocol/nettrace.md §4.6): the stacks a stream's events refer to by id,
//! each a list of instruction pointers, leaf first. A stream defines a stack once and its events
//! name it by id until the next sequence point, where ids start over; the table is emptied there.
//!
//! Bounded by [`MAX_STACK_FRAMES`] per stack, and [`MAX_STACKS`] stacks and
//! [`MAX_STACK_TABLE_FRAMES`] frames between two sequence points: a stack past any of them is
//! not kept and counted ([`super::NettraceStats::stacks_refused`]); its events carry no stack.
use std::collections::HashMap;

use super::NettraceError;
use super::cursor::Cursor;
use super::methods::{MAX_LOOKUP_CANDIDATES, MethodTable};
use crate::budget::OutputBudget;

/// Frames one stack may have to be kept (the runtime walks at most 100, `EP_MAX_STACK_DEPTH`;
/// a profile keeps 512 frames of a stack, `tracer::profile::model::MAX_STACK_DEPTH`).
pub const MAX_STACK_FRAMES: usize = 512;
/// Stacks kept between two sequence points.
pub const MAX_STACKS: usize = 1 << 18;
/// Frames kept between two sequence points, all stacks together (8 bytes each: 16 MiB).
pub const MAX_STACK_TABLE_FRAMES: usize = 1 << 21;

/// What is wrong with a StackBlock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StackBlockError {
    #[error("{len} bytes, too short for its first id and count")]
    TruncatedHeader { len: usize },
    #[error("stack {index} of {count}: its size is cut by the end of the block")]
    TruncatedSize { index: u32, count: u32 },
    #[error("stack {index} of {count}: {size} bytes, more than the {left} left in the block")]
    Overrun { index: u32, count: u32, size: u32, left: usize },
    #[error(
        "stack {index} of {count}: {size} bytes is not a whole number of {pointer_size}-byte addresses"
    )]
    Ragged { index: u32, count: u32, size: u32, pointer_size: u32 },
    #[error("{left} bytes after its last stack")]
    TrailingBytes { left: usize },
}

/// Where a kept stack's frames are in [`StackTable::frames`].
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    len: u32,
}

/// The stacks defined since the last sequence point.
#[derive(Debug, Default)]
pub(super) struct StackTable {
    /// Every kept stack's frames, back to back.
    frames: Vec<u64>,
    by_id: HashMap<u32, Span>,
}

impl StackTable {
    /// Takes a StackBlock's `content` (at stream offset `base`); returns (stacks defined,
    /// stacks refused). A stack redefined replaces the earlier one (an event refers to the
    /// latest definition).
    pub(super) fn block(
        &mut self,
        content: &[u8],
        base: u64,
        pointer_size: u32,
    ) -> Result<(u64, u64), NettraceError> {
        let mut cur = Cursor::new(content);
        let bad =
            |at: usize, problem| NettraceError::BadStackBlock { offset: base + at as u64, problem };
        let (Some(first_id), Some(count)) = (cur.u32(), cur.u32()) else {
            return Err(bad(0, StackBlockError::TruncatedHeader { len: content.len() }));
        };
        let mut refused = 0;
        for index in 0..count {
            let at = cur.pos();
            let size = cur
                .u32()
                .ok_or_else(|| bad(at, StackBlockError::TruncatedSize { index, count }))?;
            let left = cur.remaining();
            let bytes = cur
                .take(size as usize)
                .ok_or_else(|| bad(at, StackBlockError::Overrun { index, count, size, left }))?;
            if size % pointer_size != 0 {
                return Err(bad(at, StackBlockError::Ragged { index, count, size, pointer_size }));
            }
            let (id, depth) = (first_id.wrapping_add(index), (size / pointer_size) as usize);
            let kept = self.frames.len() + depth <= MAX_STACK_TABLE_FRAMES
                && depth <= MAX_STACK_FRAMES
                && (self.by_id.len() < MAX_STACKS || self.by_id.contains_key(&id));
            if !kept {
                // An earlier definition of the id is not the latest any more.
                self.by_id.remove(&id);
                refused += 1;
                continue;
            }
            let start = self.frames.len() as u32;
            match pointer_size {
                8 => self.frames.extend(
                    bytes
                        .chunks_exact(8)
                        .map(|ip| u64::from_le_bytes(ip.try_into().expect("8 bytes"))),
                ),
                _ => self.frames.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|ip| u64::from(u32::from_le_bytes(ip.try_into().expect("4 bytes")))),
                ),
            }
            self.by_id.insert(id, Span { start, len: depth as u32 });
        }
        if cur.remaining() > 0 {
            let at = cur.pos();
            return Err(bad(at, StackBlockError::TrailingBytes { left: cur.remaining() }));
        }
        Ok((u64::from(count), refused))
    }

    /// The frames of stack `id`, leaf first; `None` when no kept stack has that id.
    pub(super) fn get(&self, id: u32) -> Option<&[u64]> {
        let span = self.by_id.get(&id)?;
        Some(&self.frames[span.start as usize..][..span.len as usize])
    }

    /// Forgets every stack: ids start over after a sequence point.
    pub(super) fn clear(&mut self) {
        self.frames.clear();
        self.by_id.clear();
    }

    /// Bytes the table holds (frames and ids), for a session's memory accounting.
    pub(super) fn heap_bytes(&self) -> usize {
        self.frames.capacity() * size_of::<u64>()
            + self.by_id.capacity() * (size_of::<u32>() + size_of::<Span>())
    }
}

/// Most bytes of the `stack` member of a line (the JSON array): the frames past it are left out
/// and the array ends with [`STACK_CUT_MARKER`]. 100 frames (the runtime's deepest walk) of
/// 160-character names fit.
pub const MAX_STACK_JSON_BYTES: usize = 16 << 10;
/// The last element of a `stack` cut at [`MAX_STACK_JSON_BYTES`].
pub const STACK_CUT_MARKER: &str = "…";
/// How a line's `stack` member starts (after the members before it).
const STACK_KEY: &[u8] = br#","stack":"#;
/// `,"…"`: the room the marker takes.
const CUT_MARKER_JSON_BYTES: usize = 1 + 2 + STACK_CUT_MARKER.len();

/// One frame of a stack as a line shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackFrame {
    /// The method whose code covered the address (`Namespace.Name`).
    Method(std::sync::Arc<str>),
    /// An address no method covered, shown as `"0x7f…"`.
    Address(u64),
    /// Frames left out past [`MAX_STACK_JSON_BYTES`].
    Cut,
}

/// A stack's frames, leaf first, with their JSON array rendered as they are added: what a line's
/// `stack` member takes is known before the line is written (a session spends a budget on it).
#[derive(Debug, Clone)]
pub struct NamedStack {
    frames: Vec<StackFrame>,
    /// `[` and the frames, without the closing `]`.
    json: Vec<u8>,
    /// The frames are `ips` as [`NamedStack::name`] named them from an empty method table: their
    /// addresses, whatever the time, so the same stack again needs no naming.
    addresses_only: bool,
    ips: Vec<u64>,
}

impl Default for NamedStack {
    fn default() -> Self {
        NamedStack { frames: Vec::new(), json: vec![b'['], addresses_only: false, ips: Vec::new() }
    }
}

impl NamedStack {
    /// Empties it for the next stack (its buffers kept).
    pub fn clear(&mut self) {
        self.frames.clear();
        self.json.truncate(1);
        self.addresses_only = false;
    }

    /// Appends the next frame, root-ward; false once the stack is full (it then ends with
    /// [`StackFrame::Cut`], and further frames are left out).
    pub fn push(&mut self, frame: StackFrame) -> bool {
        self.addresses_only = false;
        if self.frames.last() == Some(&StackFrame::Cut) {
            return false;
        }
        let before = self.json.len();
        self.render(&frame);
        if self.json.len() + CUT_MARKER_JSON_BYTES + 1 > MAX_STACK_JSON_BYTES {
            self.json.truncate(before);
            self.render(&StackFrame::Cut);
            self.frames.push(StackFrame::Cut);
            return false;
        }
        self.frames.push(frame);
        true
    }

    fn render(&mut self, frame: &StackFrame) {
        if self.json.len() > 1 {
            self.json.push(b',');
        }
        match frame {
            StackFrame::Method(name) => crate::json::push_str(&mut self.json, name),
            StackFrame::Address(address) => {
                self.json.push(b'"');
                crate::json::push_hex_digits(&mut self.json, *address);
                self.json.push(b'"');
            }
            StackFrame::Cut => crate::json::push_str(&mut self.json, STACK_CUT_MARKER),
        }
    }

    pub fn frames(&self) -> &[StackFrame] {
        &self.frames
    }

    /// Bytes [`NamedStack::write_member`] appends: what the stack adds to a line.
    pub fn member_len(&self) -> usize {
        STACK_KEY.len() + self.json.len() + 1
    }

    /// Appends the line's `stack` member: `,"stack":` and the frames as a JSON array of
    /// strings.
    pub fn write_member(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(STACK_KEY);
        out.extend_from_slice(&self.json);
        out.push(b']');
    }
}

/// The serde reference's form of a frame: the string a line shows.
#[cfg(any(test, feature = "serde-reference"))]
impl serde::Serialize for StackFrame {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            StackFrame::Method(name) => s.serialize_str(name),
            StackFrame::Address(address) => s.collect_str(&format_args!("{address:#x}")),
            StackFrame::Cut => s.serialize_str(STACK_CUT_MARKER),
        }
    }
}

/// The most naming a stack of `depth` frames may cost a stack budget: every method-table entry
/// its lookups may examine, and the longest `stack` member.
pub fn naming_cost_bound(depth: usize) -> u64 {
    (depth * MAX_LOOKUP_CANDIDATES + STACK_KEY.len() + MAX_STACK_JSON_BYTES) as u64
}

impl NamedStack {
    /// Names `ips` as [`NamedStack::name`] does when `budget` can pay for the most it may cost
    /// ([`naming_cost_bound`]), and spends what it cost: the `stack` member's bytes and a byte
    /// for each method-table entry examined. Returns whether it named them (else the stack is
    /// left as it was).
    pub fn name_within(
        &mut self,
        budget: &mut OutputBudget,
        ips: &[u64],
        time_ns: u64,
        methods: &mut MethodTable,
    ) -> bool {
        if budget.remaining() < naming_cost_bound(ips.len()) {
            return false;
        }
        let examined = methods.entries_examined;
        self.name(ips, time_ns, methods);
        let cost = (methods.entries_examined - examined) + self.member_len() as u64;
        crate::work::count(cost as usize);
        budget.spend(cost).expect("within the bound checked");
        true
    }

    /// Names `ips` (a stack, leaf first) at `time_ns` from `methods`: each frame by the method
    /// whose code covered it then, else by its address.
    pub fn name(&mut self, ips: &[u64], time_ns: u64, methods: &mut MethodTable) {
        // Without method events (`--profile counters` asks for none) every frame is its
        // address, and a runtime's counter events all carry the same stack: named once.
        if methods.is_empty() && self.addresses_only && self.ips == ips {
            return;
        }
        self.clear();
        for (ip, method) in methods.name_stack(ips, time_ns) {
            let frame = match method {
                Some(method) => StackFrame::Method(method.name),
                None => StackFrame::Address(ip),
            };
            if !self.push(frame) {
                break;
            }
        }
        if methods.is_empty() {
            self.ips.clear();
            self.ips.extend_from_slice(ips);
            self.addresses_only = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nettrace::methods::{CodeEvent, MethodCode};

    /// The stack's JSON array.
    fn json(stack: &NamedStack) -> String {
        let mut out = Vec::new();
        stack.write_member(&mut out);
        assert_eq!(out.len(), stack.member_len());
        String::from_utf8(out).unwrap().strip_prefix(r#","stack":"#).unwrap().to_owned()
    }

    #[test]
    fn frames_are_names_or_addresses_and_render_as_serde_json_does() {
        let mut stack = NamedStack::default();
        assert_eq!(json(&stack), "[]");
        stack.push(StackFrame::Method("Ns.T`1[System.Int32].M".into()));
        stack.push(StackFrame::Address(0x7f00_0000_1234));
        stack.push(StackFrame::Method("quote\" back\\ \u{1}".into()));
        let expected = r#"["Ns.T`1[System.Int32].M","0x7f0000001234","quote\" back\\ \u0001"]"#;
        assert_eq!(json(&stack), expected);
        assert_eq!(serde_json::to_string(stack.frames()).unwrap(), expected);
        stack.clear();
        assert_eq!((json(&stack), stack.frames().len()), ("[]".to_owned(), 0));
    }

    #[test]
    fn a_stack_past_its_byte_bound_ends_with_the_cut_marker() {
        let name: std::sync::Arc<str> = "N".repeat(1000).into();
        let mut stack = NamedStack::default();
        let mut pushed = 0;
        while stack.push(StackFrame::Method(name.clone())) {
            pushed += 1;
        }
        // 1 003 bytes a frame (quotes, comma): 16 frames and the marker fit in 16 KiB.
        assert_eq!(pushed, 16);
        assert_eq!(stack.frames().len(), 17);
        assert_eq!(stack.frames().last(), Some(&StackFrame::Cut));
        assert!(!stack.push(StackFrame::Address(1)), "nothing after the marker");
        let text = json(&stack);
        assert!(text.ends_with(r#"NNN","…"]"#), "{}", &text[text.len() - 20..]);
        assert_eq!(text.len(), 1 + 16 * 1002 + 15 + CUT_MARKER_JSON_BYTES + 1);
        assert!(text.len() <= MAX_STACK_JSON_BYTES);
        assert_eq!(serde_json::to_string(stack.frames()).unwrap(), text);
    }

    fn code(id: u64, start: u64, name: &str) -> MethodCode {
        MethodCode {
            method_id: id,
            module_id: 1,
            start,
            size: 0x100,
            flags: 0,
            namespace: "W".into(),
            name: name.into(),
            signature: String::new(),
        }
    }

    #[test]
    fn a_stack_named_without_methods_is_named_again_only_once_it_may_differ() {
        let (mut methods, mut stack) = (MethodTable::default(), NamedStack::default());
        stack.name(&[0x1000, 0x2010], 1, &mut methods);
        assert_eq!(json(&stack), r#"["0x1000","0x2010"]"#);
        stack.name(&[0x1000, 0x2010], 2, &mut methods);
        assert_eq!(json(&stack), r#"["0x1000","0x2010"]"#);
        stack.name(&[0x1000], 3, &mut methods);
        assert_eq!(json(&stack), r#"["0x1000"]"#);
        // Frames pushed by hand are not the addresses named before.
        stack.push(StackFrame::Address(0x3000));
        stack.name(&[0x1000], 4, &mut methods);
        assert_eq!(json(&stack), r#"["0x1000"]"#);
        // Once the table knows a method, the same addresses are looked up again.
        methods.method(CodeEvent::Loaded, &code(1, 0x1000, "Leaf"), 0);
        stack.name(&[0x1000], 5, &mut methods);
        assert_eq!(stack.frames(), [StackFrame::Method("W.Leaf".into())]);
    }

    #[test]
    fn a_stack_is_named_by_the_methods_that_covered_its_addresses_then() {
        let mut methods = MethodTable::default();
        methods.method(CodeEvent::Loaded, &code(1, 0x1000, "Leaf"), 10);
        methods.method(CodeEvent::Loaded, &code(2, 0x2000, "Caller"), 10);
        let mut stack = NamedStack::default();
        // A caller's frame is a return address: 0x1000 names the code before it, none here.
        stack.name(&[0x1000, 0x2010, 0x1000, 0x9000], 20, &mut methods);
        assert_eq!(
            stack.frames(),
            [
                StackFrame::Method("W.Leaf".into()),
                StackFrame::Method("W.Caller".into()),
                StackFrame::Address(0x1000),
                StackFrame::Address(0x9000),
            ]
        );
        stack.name(&[0x1000], 5, &mut methods);
        assert_eq!(stack.frames(), [StackFrame::Address(0x1000)], "before it was compiled");
    }
}
