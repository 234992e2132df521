//! Where a .NET runtime put the native code of its methods, from its own events
//! (docs/protocol/profiling.md, "Naming managed frames"): `MethodLoadVerbose` /
//! `MethodUnloadVerbose` of `Microsoft-Windows-DotNETRuntime` (keyword JIT, level verbose) while a
//! session runs, and the rundown's `MethodDCStartVerbose` / `MethodDCEndVerbose` of
//! `Microsoft-Windows-DotNETRuntimeRundown` for every method with code (JIT'd and ReadyToRun)
//! when a session stops; `ModuleLoad` / `ModuleDCEnd` name the module a method belongs to.
//!
//! The payloads come from the traced process: every read is bounds-checked, strings are cut at
//! [`MAX_NAME_UNITS`], and a short or malformed payload is a typed error with its offset.
use thiserror::Error;

use super::cursor::{Cursor, Utf16Problem};
use super::runtime_events::{RUNDOWN_PROVIDER, RUNTIME_PROVIDER};

/// Characters kept of a namespace, method name, signature or module path; a longer one is cut
/// (ending in `…`).
pub const MAX_NAME_UNITS: usize = 1024;

/// What a method or module event says happened to the code it describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeEvent {
    /// Code was compiled (or a module loaded) at the event's time: it owns its addresses from
    /// then on.
    Loaded,
    /// The code (or module) went away at the event's time.
    Unloaded,
    /// The rundown listed it: it existed when the rundown ran (its start is not known).
    Listed,
}

/// What kind of record a method event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodEvent {
    Method(CodeEvent),
    Module(CodeEvent),
}

/// The method or module event `event_id` of `provider` is, if it is one of those this module
/// decodes (the verbose method events, which name the method, and the module events).
pub fn method_event(provider: &str, event_id: u32) -> Option<MethodEvent> {
    use CodeEvent::*;
    // EventPipe matches provider names without regard to case.
    let runtime = provider.eq_ignore_ascii_case(RUNTIME_PROVIDER);
    let rundown = provider.eq_ignore_ascii_case(RUNDOWN_PROVIDER);
    match (runtime, rundown, event_id) {
        (true, _, 143) => Some(MethodEvent::Method(Loaded)),
        (true, _, 144) => Some(MethodEvent::Method(Unloaded)),
        (true, _, 152) => Some(MethodEvent::Module(Loaded)),
        (true, _, 153) => Some(MethodEvent::Module(Unloaded)),
        // DCStart and DCEnd: a rundown at the start or at the end of a session.
        (_, true, 143 | 144) => Some(MethodEvent::Method(Listed)),
        (_, true, 153 | 154) => Some(MethodEvent::Module(Listed)),
        _ => None,
    }
}

/// A method's native code, as a verbose method event describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodCode {
    pub method_id: u64,
    pub module_id: u64,
    pub start: u64,
    pub size: u32,
    /// `MethodFlags`: dynamic, generic, shared generic, jitted, and the optimization tier.
    pub flags: u32,
    /// The type's full name, e.g. `System.Collections.Generic.List`1[System.Int32]`.
    pub namespace: String,
    pub name: String,
    pub signature: String,
}

/// Where `MethodFlags` keeps the code's optimization tier (3 bits), and the tier of
/// on-stack-replacement code (`OptimizedTier1OSR`).
const TIER_SHIFT: u32 = 7;
const TIER_MASK: u32 = 0x7;
const TIER_OSR: u32 = 5;

impl MethodCode {
    /// Whether this is on-stack-replacement code (a hot loop's tier-1 code entered from the
    /// running tier-0 frame).
    pub fn is_osr(&self) -> bool {
        (self.flags >> TIER_SHIFT) & TIER_MASK == TIER_OSR
    }

    /// `Namespace.Name`, as profilers show a managed frame (the namespace alone is the type).
    pub fn display_name(&self) -> String {
        match self.namespace.is_empty() {
            true => self.name.clone(),
            false => format!("{}.{}", self.namespace, self.name),
        }
    }
}

/// A module, as a module event describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    pub module_id: u64,
    /// The IL image's path (a dynamic module's name), as the runtime reports it.
    pub il_path: String,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum MethodEventError {
    #[error("{what} event: payload of {len} bytes ends at offset {offset}, inside {field}")]
    Short { what: &'static str, field: &'static str, offset: usize, len: usize },
    #[error("{what} event: {field} at offset {offset} has no terminating NUL")]
    Unterminated { what: &'static str, field: &'static str, offset: usize },
}

/// Decodes the payload of a verbose method event (every version: later ones only append
/// fields).
pub fn decode_method_code(payload: &[u8]) -> Result<MethodCode, MethodEventError> {
    let mut r = Reader { cur: Cursor::new(payload), what: "method", len: payload.len() };
    Ok(MethodCode {
        method_id: r.u64("MethodID")?,
        module_id: r.u64("ModuleID")?,
        start: r.u64("MethodStartAddress")?,
        size: r.u32("MethodSize")?,
        flags: {
            r.u32("MethodToken")?;
            r.u32("MethodFlags")?
        },
        namespace: r.text("MethodNamespace")?,
        name: r.text("MethodName")?,
        signature: r.text("MethodSignature")?,
    })
}

/// Decodes the payload of a module event (every version).
pub fn decode_module(payload: &[u8]) -> Result<ModuleInfo, MethodEventError> {
    let mut r = Reader { cur: Cursor::new(payload), what: "module", len: payload.len() };
    let module_id = r.u64("ModuleID")?;
    r.u64("AssemblyID")?;
    r.u32("ModuleFlags")?;
    r.u32("Reserved1")?;
    Ok(ModuleInfo { module_id, il_path: r.text("ModuleILPath")? })
}

/// Method code entries one process's table keeps; beyond, new entries are refused (counted).
pub const MAX_METHOD_CODE: usize = 1 << 20;
/// Modules one process's table keeps; beyond, their methods' frames name no module.
pub const MAX_MODULES: usize = 1 << 16;
/// Bytes one table may hold ([`MethodTable::heap_bytes`]): names are up to [`MAX_NAME_UNITS`]
/// characters, so [`MAX_METHOD_CODE`] entries alone could take gigabytes. Beyond, new entries
/// are refused (counted). An application's 200 000 methods take about 40 MiB.
pub const MAX_METHOD_TABLE_BYTES: usize = 64 << 20;
/// Code entries a lookup examines, highest start first: live code does not overlap, so the
/// entry that covers an address is the first whose range holds it (older code at the same
/// addresses, freed and reused, comes next), but a peer can send any number of entries at one
/// address. Past it the lookup answers with the best entry seen (counted).
pub const MAX_LOOKUP_CANDIDATES: usize = 64;
/// What an entry costs besides its name: the entry, its place in the start index and the
/// (method, start) map, rounded up.
const CODE_ENTRY_BYTES: usize = 128;

/// Which method owned a code address at a given time, from a process's method and module
/// events: code addresses are reused (tiered compilation moves a method to new code, freed code
/// may be given to another method), so a sample is named by the code that covered its address
/// at its time.
#[derive(Debug, Default)]
pub struct MethodTable {
    code: Vec<Code>,
    /// (start, index into `code`), in order: an entry goes in at its place, so events that
    /// add code and lookups can alternate (a session names stacks as its events arrive).
    by_start: std::collections::BTreeSet<(u64, u32)>,
    /// The longest code seen: how far back from an address a lookup searches.
    longest: u64,
    modules: std::collections::HashMap<u64, std::sync::Arc<str>>,
    /// (method id, start) → its latest entry: unloads and rundown listings find it in O(1),
    /// whatever a peer sends.
    latest: std::collections::HashMap<(u64, u64), u32>,
    /// [`MethodTable::heap_bytes`].
    bytes: usize,
    /// Entries refused past [`MAX_METHOD_CODE`], [`MAX_MODULES`] or
    /// [`MAX_METHOD_TABLE_BYTES`].
    pub refused: u64,
    /// Lookups that stopped at [`MAX_LOOKUP_CANDIDATES`] (their answer is the best of those).
    pub lookups_cut: u64,
    /// Entries all lookups examined: what naming cost.
    pub entries_examined: u64,
}

#[derive(Debug)]
struct Code {
    method_id: u64,
    osr: bool,
    end: u64,
    name: std::sync::Arc<str>,
    module_id: u64,
    /// When the code was compiled (`None`: listed by a rundown, so from before).
    from_ns: Option<u64>,
    /// When it was unloaded, if it was.
    until_ns: Option<u64>,
}

/// A managed frame's name and module (the module's file name; `None` when its module event
/// did not come).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagedFrame {
    pub name: std::sync::Arc<str>,
    pub module: Option<std::sync::Arc<str>>,
    pub method_id: u64,
    /// On-stack-replacement code: it runs on the frame of the method's tier-0 code, which the
    /// stack shows as its caller.
    pub osr: bool,
}

impl MethodTable {
    /// Takes the event if it is a method or module event ([`method_event`]): `None` for other
    /// events, else whether its payload decoded.
    pub fn take_event(
        &mut self,
        provider: &str,
        event_id: u32,
        payload: &[u8],
        time_ns: u64,
    ) -> Option<Result<(), MethodEventError>> {
        Some(match method_event(provider, event_id)? {
            MethodEvent::Method(event) => {
                decode_method_code(payload).map(|code| self.method(event, &code, time_ns))
            }
            MethodEvent::Module(_) => decode_module(payload).map(|module| self.module(&module)),
        })
    }

    /// Takes what a method event at `time_ns` says about `code`.
    pub fn method(&mut self, event: CodeEvent, code: &MethodCode, time_ns: u64) {
        let key = (code.method_id, code.start);
        match (event, self.latest.get(&key)) {
            (CodeEvent::Unloaded, Some(&i)) => {
                self.code[i as usize].until_ns.get_or_insert(time_ns);
                return;
            }
            (CodeEvent::Unloaded, None) => return,
            // A rundown lists code the live events may have shown already.
            (CodeEvent::Listed, Some(_)) => return,
            _ => {}
        }
        let name = code.display_name();
        let bytes = self.bytes + CODE_ENTRY_BYTES + name.len();
        if self.code.len() >= MAX_METHOD_CODE || bytes > MAX_METHOD_TABLE_BYTES || code.size == 0 {
            self.refused += u64::from(code.size != 0);
            return;
        }
        self.bytes = bytes;
        let from_ns = (event == CodeEvent::Loaded).then_some(time_ns);
        let end = code.start.saturating_add(code.size.into());
        let index = self.code.len() as u32;
        self.by_start.insert((code.start, index));
        self.latest.insert(key, index);
        self.longest = self.longest.max(end - code.start);
        self.code.push(Code {
            method_id: code.method_id,
            osr: code.is_osr(),
            end,
            name: name.into(),
            module_id: code.module_id,
            from_ns,
            until_ns: None,
        });
    }

    /// Takes a module event (its file name names the module of its methods' frames).
    pub fn module(&mut self, module: &ModuleInfo) {
        let file = module.il_path.rsplit(['/', '\\']).next().unwrap_or_default();
        let known = self.modules.contains_key(&module.module_id);
        let bytes = self.bytes + CODE_ENTRY_BYTES + file.len();
        if !known && (self.modules.len() >= MAX_MODULES || bytes > MAX_METHOD_TABLE_BYTES) {
            self.refused += 1;
            return;
        }
        if let Some(old) = self.modules.insert(module.module_id, file.into()) {
            self.bytes -= CODE_ENTRY_BYTES + old.len();
        }
        self.bytes += CODE_ENTRY_BYTES + file.len();
    }

    /// Method code entries kept.
    pub fn len(&self) -> usize {
        self.code.len()
    }

    pub fn is_empty(&self) -> bool {
        self.code.is_empty()
    }

    /// Bytes the entries and their names hold, as counted against [`MAX_METHOD_TABLE_BYTES`].
    pub fn heap_bytes(&self) -> usize {
        self.bytes
    }

    /// The method whose code covered `address` at `time_ns`: of the code containing it, the
    /// latest compiled at or before that time and not unloaded by then (code a rundown listed
    /// counts as compiled before any time).
    pub fn lookup(&mut self, address: u64, time_ns: u64) -> Option<ManagedFrame> {
        let lowest = address.saturating_sub(self.longest);
        let mut best: Option<&Code> = None;
        let candidates = self.by_start.range(..=(address, u32::MAX)).rev();
        for (examined, &(start, i)) in candidates.enumerate() {
            if start < lowest {
                break;
            }
            if examined == MAX_LOOKUP_CANDIDATES {
                self.lookups_cut += 1;
                break;
            }
            self.entries_examined += 1;
            let code = &self.code[i as usize];
            let covers = address < code.end
                && code.from_ns.is_none_or(|from| from <= time_ns)
                && code.until_ns.is_none_or(|until| time_ns < until);
            if covers && best.is_none_or(|b| code.from_ns > b.from_ns) {
                best = Some(code);
            }
        }
        let best = best?;
        Some(ManagedFrame {
            name: best.name.clone(),
            module: self.modules.get(&best.module_id).cloned(),
            method_id: best.method_id,
            osr: best.osr,
        })
    }

    /// The frames of an EventPipe stack (`ips`, leaf first) at `time_ns`, each with the method
    /// whose code covered it then (`None`: no method did), as [`OsrFrames`] shows them.
    pub fn name_stack<'t>(
        &'t mut self,
        ips: &'t [u64],
        time_ns: u64,
    ) -> impl Iterator<Item = (u64, Option<ManagedFrame>)> + 't {
        let mut osr = OsrFrames::default();
        ips.iter().enumerate().filter_map(move |(depth, &ip)| {
            let method = self.lookup(code_address(depth, ip), time_ns);
            osr.shows(method.as_ref()).then_some((ip, method))
        })
    }
}

/// The address to name a stack's frame at `depth` (0: the leaf) by: below the leaf a frame's
/// address is a return address, so the call is the byte before it (a call at the very end of a
/// method is not given to the next one).
pub fn code_address(depth: usize, address: u64) -> u64 {
    if depth == 0 { address } else { address.saturating_sub(1) }
}

/// Which frames of a stack to show, leaf first: code of a method running on-stack-replacement
/// code runs on the frame of its tier-0 code, which the stack shows next, as its caller; that
/// frame is the same call and is left out.
#[derive(Debug, Default)]
pub struct OsrFrames {
    /// The method of the OSR frame just shown.
    osr_method: Option<u64>,
}

impl OsrFrames {
    /// Whether the next frame is shown; `method` is the method that names it (`None`: a frame
    /// no method names).
    pub fn shows(&mut self, method: Option<&ManagedFrame>) -> bool {
        let osr_below = self.osr_method.take();
        match method {
            Some(m) if osr_below == Some(m.method_id) => false,
            Some(m) => {
                self.osr_method = m.osr.then_some(m.method_id);
                true
            }
            None => true,
        }
    }
}

struct Reader<'a> {
    cur: Cursor<'a>,
    what: &'static str,
    len: usize,
}

impl Reader<'_> {
    fn short(&self, field: &'static str) -> MethodEventError {
        MethodEventError::Short { what: self.what, field, offset: self.cur.pos(), len: self.len }
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, MethodEventError> {
        self.cur.u64().ok_or_else(|| self.short(field))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, MethodEventError> {
        self.cur.u32().ok_or_else(|| self.short(field))
    }

    /// A UTF-16Z string, cut after [`MAX_NAME_UNITS`] characters (read whole first: the work
    /// is bounded by the payload, which the caller bounds).
    fn text(&mut self, field: &'static str) -> Result<String, MethodEventError> {
        let offset = self.cur.pos();
        let mut text = self.cur.utf16z(self.cur.remaining() / 2).map_err(|_: Utf16Problem| {
            MethodEventError::Unterminated { what: self.what, field, offset }
        })?;
        if let Some((cut, _)) = text.char_indices().nth(MAX_NAME_UNITS) {
            text.truncate(cut);
            text.push('…');
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utf16z(s: &str) -> Vec<u8> {
        s.encode_utf16().chain([0]).flat_map(u16::to_le_bytes).collect()
    }

    /// A `MethodLoadVerbose` payload of version 2 (ClrInstanceID and ReJITID appended).
    fn method_payload(namespace: &str, name: &str) -> Vec<u8> {
        let mut p = Vec::new();
        for v in [7u64, 8, 0x7f00_1000] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        for v in [0x40u32, 0x0600_0001, 0x0000_0109] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        for s in [namespace, name, "int32  (int32)"] {
            p.extend_from_slice(&utf16z(s));
        }
        p.extend_from_slice(&9u16.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        p
    }

    #[test]
    fn a_verbose_method_event_names_its_code() {
        let code = decode_method_code(&method_payload("Workload", "Inner")).unwrap();
        assert_eq!(
            code,
            MethodCode {
                method_id: 7,
                module_id: 8,
                start: 0x7f00_1000,
                size: 0x40,
                flags: 0x109,
                namespace: "Workload".into(),
                name: "Inner".into(),
                signature: "int32  (int32)".into(),
            }
        );
        assert_eq!(code.display_name(), "Workload.Inner");
    }

    #[test]
    fn short_unterminated_and_long_names_are_handled() {
        let full = method_payload("Workload", "Inner");
        assert_eq!(
            decode_method_code(&full[..30]),
            Err(MethodEventError::Short {
                what: "method",
                field: "MethodToken",
                offset: 28,
                len: 30
            })
        );
        let name_at = 36 + utf16z("Workload").len();
        assert_eq!(
            decode_method_code(&full[..name_at + 4]),
            Err(MethodEventError::Unterminated {
                what: "method",
                field: "MethodName",
                offset: name_at
            })
        );
        let long = "N".repeat(MAX_NAME_UNITS + 10);
        let code = decode_method_code(&method_payload("Workload", &long)).unwrap();
        assert_eq!(code.name.chars().count(), MAX_NAME_UNITS + 1);
        assert!(code.name.ends_with('…'));
        assert_eq!(code.signature, "int32  (int32)", "the rest after a cut name is read");
    }

    #[test]
    fn module_events_name_the_module() {
        let mut p = Vec::new();
        for v in [3u64, 4] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        p.extend_from_slice(&[0; 8]);
        p.extend_from_slice(&utf16z("/usr/share/dotnet/System.Private.CoreLib.dll"));
        p.extend_from_slice(&utf16z(""));
        assert_eq!(
            decode_module(&p).unwrap(),
            ModuleInfo {
                module_id: 3,
                il_path: "/usr/share/dotnet/System.Private.CoreLib.dll".into()
            }
        );
    }

    #[test]
    fn which_events_are_method_events() {
        use CodeEvent::*;
        assert_eq!(method_event(RUNTIME_PROVIDER, 143), Some(MethodEvent::Method(Loaded)));
        assert_eq!(method_event(RUNTIME_PROVIDER, 144), Some(MethodEvent::Method(Unloaded)));
        assert_eq!(method_event(RUNDOWN_PROVIDER, 144), Some(MethodEvent::Method(Listed)));
        assert_eq!(method_event(RUNDOWN_PROVIDER, 154), Some(MethodEvent::Module(Listed)));
        assert_eq!(
            method_event("microsoft-windows-dotnetruntime", 152),
            Some(MethodEvent::Module(Loaded))
        );
        assert_eq!(method_event(RUNTIME_PROVIDER, 141), None, "not verbose: no names");
        assert_eq!(method_event("Other", 143), None);
    }

    fn code(id: u64, start: u64, size: u32, name: &str) -> MethodCode {
        MethodCode {
            method_id: id,
            module_id: 1,
            start,
            size,
            flags: 0,
            namespace: "W".into(),
            name: name.into(),
            signature: String::new(),
        }
    }

    fn named(table: &mut MethodTable, address: u64, time: u64) -> Option<String> {
        table.lookup(address, time).map(|f| f.name.to_string())
    }

    /// Tiering moves a method to new code; freed code is reused by another method; a rundown
    /// names code compiled before the events began; nothing is named outside code or before
    /// its compilation.
    #[test]
    fn a_sample_is_named_by_the_code_that_covered_its_address_then() {
        use CodeEvent::*;
        let mut t = MethodTable::default();
        t.module(&ModuleInfo { module_id: 1, il_path: "/app/Workload.dll".into() });
        t.method(Loaded, &code(1, 0x1000, 0x100, "Inner"), 100);
        // Tier 1: new code; the old stays valid for frames still in it.
        t.method(Loaded, &code(1, 0x5000, 0x80, "Inner"), 200);
        assert_eq!(named(&mut t, 0x1080, 150).as_deref(), Some("W.Inner"));
        assert_eq!(named(&mut t, 0x5010, 250).as_deref(), Some("W.Inner"));
        assert_eq!(named(&mut t, 0x5010, 150), None, "before it was compiled");
        assert_eq!(named(&mut t, 0x1100, 150), None, "past the end");
        // The old code is freed and another method compiled into it.
        t.method(Unloaded, &code(1, 0x1000, 0x100, "Inner"), 300);
        t.method(Loaded, &code(2, 0x1040, 0x20, "Other"), 310);
        assert_eq!(named(&mut t, 0x1050, 305), None, "freed, not yet reused");
        assert_eq!(named(&mut t, 0x1050, 320).as_deref(), Some("W.Other"));
        assert_eq!(named(&mut t, 0x1050, 150).as_deref(), Some("W.Inner"));
        // Listed by the rundown: compiled before the events began; listed again: once.
        t.method(Listed, &code(3, 0x9000, 0x10, "Old"), 400);
        t.method(Listed, &code(1, 0x5000, 0x80, "Inner"), 400);
        assert_eq!(t.len(), 4);
        assert_eq!(named(&mut t, 0x9008, 0).as_deref(), Some("W.Old"));
        let frame = t.lookup(0x9008, 0).unwrap();
        assert_eq!(frame.module.as_deref(), Some("Workload.dll"));
        // A module whose event did not come: the frame is named, without module.
        let mut unknown_module = code(4, 0xa000, 0x10, "NoModule");
        unknown_module.module_id = 99;
        t.method(Loaded, &unknown_module, 1);
        let frame = t.lookup(0xa000, 5).unwrap();
        assert_eq!((&*frame.name, frame.module, frame.method_id), ("W.NoModule", None, 4));
        // On-stack-replacement code says so (tier 5 in bits 7..10 of the flags).
        let mut osr = code(5, 0xb000, 0x10, "Loop");
        osr.flags = 5 << 7 | 0x8;
        t.method(Loaded, &osr, 1);
        assert!(t.lookup(0xb000, 2).unwrap().osr && !t.lookup(0xa000, 2).unwrap().osr);
    }

    /// A session names stacks while its method events arrive: code added after a lookup is
    /// found by the next one.
    #[test]
    fn code_added_between_lookups_is_found() {
        let mut t = MethodTable::default();
        t.method(CodeEvent::Loaded, &code(1, 0x5000, 0x10, "High"), 1);
        assert_eq!(named(&mut t, 0x1008, 2), None);
        t.method(CodeEvent::Loaded, &code(2, 0x1000, 0x10, "Low"), 1);
        assert_eq!(named(&mut t, 0x1008, 2).as_deref(), Some("W.Low"));
        assert_eq!(named(&mut t, 0x5008, 2).as_deref(), Some("W.High"));
        assert_eq!(
            t.take_event(RUNTIME_PROVIDER, 143, &method_payload("Live", "Event"), 3),
            Some(Ok(()))
        );
        assert_eq!(named(&mut t, 0x7f00_1000, 4).as_deref(), Some("Live.Event"));
        assert!(t.take_event(RUNTIME_PROVIDER, 143, &[0; 10], 3).unwrap().is_err());
        assert_eq!(t.take_event(RUNTIME_PROVIDER, 1, &[], 3), None, "not a method event");
    }

    /// The frames of a method running OSR code: the OSR frame, then the tier-0 frame it runs
    /// on (the same call, left out), then its caller.
    #[test]
    fn a_stack_shows_a_method_in_osr_code_once() {
        let mut t = MethodTable::default();
        let mut osr = code(1, 0x1000, 0x100, "Loop");
        osr.flags = TIER_OSR << TIER_SHIFT;
        t.method(CodeEvent::Loaded, &osr, 1);
        t.method(CodeEvent::Loaded, &code(1, 0x2000, 0x100, "Loop"), 1);
        t.method(CodeEvent::Loaded, &code(2, 0x3000, 0x100, "Caller"), 1);
        let names = |t: &mut MethodTable, ips: &[u64]| -> Vec<String> {
            let frames = t.name_stack(ips, 5);
            frames.map(|(ip, m)| m.map_or(format!("{ip:#x}"), |m| m.name.to_string())).collect()
        };
        assert_eq!(names(&mut t, &[0x1010, 0x2010, 0x3010]), ["W.Loop", "W.Caller"]);
        // Not below OSR code: tier-0 code of a method calling itself shows twice.
        assert_eq!(names(&mut t, &[0x2010, 0x2020, 0x9000]), ["W.Loop", "W.Loop", "0x9000"]);
        // An unnamed frame between them: both shown.
        assert_eq!(names(&mut t, &[0x1010, 0x9000, 0x2010]), ["W.Loop", "0x9000", "W.Loop"]);
    }

    /// Entries a peer stacks at one address make a lookup stop after MAX_LOOKUP_CANDIDATES,
    /// with the best entry it saw (counted).
    #[test]
    fn a_lookup_examines_a_bounded_number_of_entries() {
        let mut t = MethodTable::default();
        t.method(CodeEvent::Loaded, &code(0, 0x1000, 0x1000, "Outer"), 1);
        for id in 1..=MAX_LOOKUP_CANDIDATES as u64 {
            t.method(CodeEvent::Loaded, &code(id, 0x1800, 0x10, "Stacked"), 1);
        }
        // Below the stacked entries: Outer is the first examined.
        assert_eq!(named(&mut t, 0x1100, 2).as_deref(), Some("W.Outer"));
        assert_eq!((t.lookups_cut, t.entries_examined), (0, 1));
        // Past them, Outer is not reached: the best of those examined names the address.
        assert_eq!(named(&mut t, 0x1900, 2).as_deref(), None);
        assert_eq!(named(&mut t, 0x1808, 2).as_deref(), Some("W.Stacked"));
        let examined = 1 + 2 * MAX_LOOKUP_CANDIDATES as u64;
        assert_eq!((t.lookups_cut, t.entries_examined), (2, examined));
    }

    #[test]
    fn a_table_holds_a_bounded_number_of_bytes() {
        let mut t = MethodTable::default();
        let long = "N".repeat(MAX_NAME_UNITS);
        let entry = CODE_ENTRY_BYTES + 2 * MAX_NAME_UNITS + 1;
        let fit = (MAX_METHOD_TABLE_BYTES / entry) as u64;
        for id in 0..fit + 3 {
            let mut c = code(id, 0x1000 + id * 0x10, 0x10, &long);
            c.namespace = long.clone();
            t.method(CodeEvent::Loaded, &c, 1);
        }
        assert_eq!((t.len() as u64, t.refused), (fit, 3));
        assert!(t.heap_bytes() <= MAX_METHOD_TABLE_BYTES);
        // Less than an entry is left: a module with a name as long does not fit either.
        t.module(&ModuleInfo { module_id: 1, il_path: "x".repeat(entry) });
        assert_eq!(t.refused, 4);
    }
}
