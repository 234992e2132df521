//! Per-process table of user_events registrations, mirroring what the kernel keeps per mm
//! (docs/protocol/user_events.md §5): a successful `DIAG_IOCSREG` adds an enabler, `DIAG_IOCSUNREG`
//! removes the ones matching (address, bit), fork copies them to the child, exec and exit drop
//! them.
//! A pure state machine: it is fed decoded events and does no I/O.
use std::collections::BTreeMap;

use serde::Serialize;
use tracer_decode::text::escape_control;

use tracer_decode::bpf_event::{DetectionEvent, EventBody, ExistingEnablers, UserEventsOp};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Registration {
    /// As registered; for one found at start, the event's name alone (the kernel keeps no
    /// per-registration copy of the rest).
    pub name_args: String,
    /// `"0x…"` in JSON, like every address tracer prints.
    #[serde(serialize_with = "hex")]
    pub enable_addr: u64,
    pub enable_bit: u8,
    pub enable_size: u8,
    /// The `user_reg` flags; `null` for one found at start.
    pub flags: Option<u16>,
    /// `null` for one found at start.
    pub write_index: Option<u32>,
    /// The `user_events_data` fd it was registered on (in the registering process); `null`
    /// for one found at start.
    pub fd: Option<i32>,
    /// Made before tracer started, found by the task iterator (docs/protocol/bpf-detection.md
    /// §9).
    pub at_start: bool,
}

impl Registration {
    /// Whether it is the enabler at (`addr`, `bit`): the kernel keeps one per place in an mm.
    fn is_at(&self, addr: u64, bit: u8) -> bool {
        self.enable_addr == addr && self.enable_bit == bit
    }
}

fn hex<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:#x}"))
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistrationTable {
    by_pid: BTreeMap<u32, Vec<Registration>>,
}

impl RegistrationTable {
    pub fn new() -> RegistrationTable {
        RegistrationTable::default()
    }

    /// Adds a registration. The kernel keeps one enabler per (address, bit) in an mm, so an
    /// entry already there at that place goes (one found at start that a live report repeats).
    pub fn register(&mut self, pid: u32, reg: Registration) {
        let regs = self.by_pid.entry(pid).or_default();
        regs.retain(|r| !r.is_at(reg.enable_addr, reg.enable_bit));
        regs.push(reg);
    }

    /// Adds the registrations processes held when tracer started (the task iterator's); a
    /// live report of the same place already tabled is kept: it knows more.
    pub fn seed(&mut self, found: &ExistingEnablers) {
        for e in &found.enablers {
            let regs = self.by_pid.entry(e.pid).or_default();
            if regs.iter().any(|r| r.is_at(e.enable_addr, e.enable_bit)) {
                continue;
            }
            regs.push(Registration {
                name_args: match &e.name {
                    Ok(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                    Err(_) => String::new(),
                },
                enable_addr: e.enable_addr,
                enable_bit: e.enable_bit,
                enable_size: e.enable_size,
                flags: None,
                write_index: None,
                fd: None,
                at_start: true,
            });
        }
    }

    /// Removes every registration of `pid` at (`addr`, `bit`); returns how many went.
    pub fn unregister(&mut self, pid: u32, addr: u64, bit: u8) -> usize {
        let Some(regs) = self.by_pid.get_mut(&pid) else { return 0 };
        let before = regs.len();
        regs.retain(|r| !r.is_at(addr, bit));
        let removed = before - regs.len();
        if regs.is_empty() {
            self.by_pid.remove(&pid);
        }
        removed
    }

    /// The child of a fork inherits a copy of every registration (its own enablers).
    pub fn fork(&mut self, parent: u32, child: u32) {
        if let Some(regs) = self.by_pid.get(&parent).cloned() {
            self.by_pid.insert(child, regs);
        }
    }

    /// exec and exit both drop every registration of the process.
    pub fn drop_process(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }

    pub fn get(&self, pid: u32) -> &[Registration] {
        self.by_pid.get(&pid).map_or(&[], Vec::as_slice)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &[Registration])> {
        self.by_pid.iter().map(|(pid, regs)| (*pid, regs.as_slice()))
    }

    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }

    /// Applies one detection event. Failed ioctls change nothing (the kernel refused them).
    pub fn apply(&mut self, event: &DetectionEvent) {
        let pid = event.meta.pid;
        match &event.body {
            EventBody::UserEvents(ioctl) if ioctl.ret == 0 => match &ioctl.op {
                UserEventsOp::Register { reg: Ok(reg), name_args } => {
                    let name_args = match name_args {
                        Some(Ok(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                        _ => String::new(),
                    };
                    self.register(
                        pid,
                        Registration {
                            name_args,
                            enable_addr: reg.enable_addr,
                            enable_bit: reg.enable_bit,
                            enable_size: reg.enable_size,
                            flags: Some(reg.flags),
                            write_index: Some(reg.write_index),
                            fd: Some(ioctl.fd),
                            at_start: false,
                        },
                    );
                }
                UserEventsOp::Unregister { unreg: Ok(unreg) } => {
                    self.unregister(pid, unreg.disable_addr, unreg.disable_bit);
                }
                _ => {}
            },
            EventBody::ProcessFork { child_pid, .. } => self.fork(pid, *child_pid),
            EventBody::ProcessExec { .. } | EventBody::ProcessExit => self.drop_process(pid),
            _ => {}
        }
    }

    /// Human-readable table (one row per registration) for stderr.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{:>8} {:>4} {:>18} {:>3} {:>4} {:>5}  {}\n",
            "PID", "FD", "ENABLE_ADDR", "BIT", "SIZE", "INDEX", "NAME_ARGS"
        );
        for (pid, regs) in self.iter() {
            for r in regs {
                out.push_str(&format!(
                    "{pid:>8} {:>4} {:>18} {:>3} {:>4} {:>5}  {}\n",
                    r.fd.map_or("-".to_string(), |fd| fd.to_string()),
                    format!("{:#x}", r.enable_addr),
                    r.enable_bit,
                    r.enable_size,
                    r.write_index.map_or("-".to_string(), |i| i.to_string()),
                    escape_control(&r.name_args)
                ));
            }
        }
        if self.is_empty() {
            out.push_str("(no registrations)\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{DIAG_IOCSREG, DIAG_IOCSUNREG, EventKind};

    use super::*;
    use tracer_decode::bpf_event::{EventMeta, UserEventsIoctl, UserReg, UserUnreg};

    fn meta(kind: EventKind, pid: u32) -> EventMeta {
        EventMeta {
            kind,
            cpu: 0,
            seq: 0,
            ktime_ns: 0,
            pid,
            tid: pid,
            uid: 0,
            gid: 0,
            cgroup_id: 0,
            comm: "p".into(),
            process_start_ns: None,
        }
    }

    fn reg_event(pid: u32, ret: i64, addr: u64, bit: u8, name: &str) -> DetectionEvent {
        DetectionEvent {
            meta: meta(EventKind::UserEventsRegister, pid),
            body: EventBody::UserEvents(UserEventsIoctl {
                fd: 3,
                ret,
                cmd: DIAG_IOCSREG as u64,
                arg: 0x1000,
                op: UserEventsOp::Register {
                    reg: Ok(UserReg {
                        size: 28,
                        enable_bit: bit,
                        enable_size: 4,
                        flags: 0,
                        enable_addr: addr,
                        name_args_ptr: 0x2000,
                        write_index: 1,
                    }),
                    name_args: Some(Ok(name.as_bytes().to_vec())),
                },
            }),
        }
    }

    fn unreg_event(pid: u32, ret: i64, addr: u64, bit: u8) -> DetectionEvent {
        DetectionEvent {
            meta: meta(EventKind::UserEventsUnregister, pid),
            body: EventBody::UserEvents(UserEventsIoctl {
                fd: 3,
                ret,
                cmd: DIAG_IOCSUNREG as u64,
                arg: 0x1000,
                op: UserEventsOp::Unregister {
                    unreg: Ok(UserUnreg {
                        size: 16,
                        disable_bit: bit,
                        reserved: 0,
                        reserved2: 0,
                        disable_addr: addr,
                    }),
                },
            }),
        }
    }

    fn lifecycle(pid: u32, body: EventBody) -> DetectionEvent {
        let kind = match body {
            EventBody::ProcessFork { .. } => EventKind::ProcessFork,
            EventBody::ProcessExec { .. } => EventKind::ProcessExec,
            _ => EventKind::ProcessExit,
        };
        DetectionEvent { meta: meta(kind, pid), body }
    }

    fn names(t: &RegistrationTable, pid: u32) -> Vec<&str> {
        t.get(pid).iter().map(|r| r.name_args.as_str()).collect()
    }

    #[test]
    fn successful_register_adds_failed_does_not() {
        let mut t = RegistrationTable::new();
        t.apply(&reg_event(10, -25, 0x40, 0, "refused u32 a"));
        assert!(t.is_empty());
        t.apply(&reg_event(10, 0, 0x40, 0, "a u32 x"));
        t.apply(&reg_event(10, 0, 0x40, 1, "b u32 x"));
        assert_eq!(names(&t, 10), ["a u32 x", "b u32 x"]);
        assert_eq!(t.get(10)[0].write_index, Some(1));
        assert_eq!(t.get(10)[0].fd, Some(3));
    }

    #[test]
    fn unregister_matches_address_and_bit() {
        let mut t = RegistrationTable::new();
        t.apply(&reg_event(10, 0, 0x40, 0, "a"));
        t.apply(&reg_event(10, 0, 0x40, 1, "b"));
        t.apply(&unreg_event(10, -22, 0x40, 0));
        assert_eq!(names(&t, 10), ["a", "b"], "a failed UNREG changes nothing");
        t.apply(&unreg_event(10, 0, 0x48, 0));
        assert_eq!(names(&t, 10), ["a", "b"], "other address");
        t.apply(&unreg_event(11, 0, 0x40, 0));
        assert_eq!(names(&t, 10), ["a", "b"], "other process");
        t.apply(&unreg_event(10, 0, 0x40, 0));
        assert_eq!(names(&t, 10), ["b"]);
        assert_eq!(t.unregister(10, 0x40, 1), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn fork_copies_exec_and_exit_drop() {
        let mut t = RegistrationTable::new();
        t.apply(&reg_event(10, 0, 0x40, 0, "a"));
        t.apply(&lifecycle(10, EventBody::ProcessFork { child_pid: 20, clone_flags: 17 }));
        assert_eq!(names(&t, 20), ["a"]);
        // The copies are independent, as the kernel's per-mm enablers are.
        t.apply(&unreg_event(20, 0, 0x40, 0));
        assert_eq!(names(&t, 10), ["a"]);
        assert!(t.get(20).is_empty());
        t.apply(&lifecycle(10, EventBody::ProcessFork { child_pid: 21, clone_flags: 17 }));
        t.apply(&lifecycle(21, EventBody::ProcessExec { old_tid: 21, filename: Ok(vec![]) }));
        assert!(t.get(21).is_empty());
        t.apply(&lifecycle(10, EventBody::ProcessExit));
        assert!(t.is_empty());
        // Fork of a process without registrations creates nothing.
        t.apply(&lifecycle(30, EventBody::ProcessFork { child_pid: 31, clone_flags: 17 }));
        assert!(t.is_empty());
    }

    #[test]
    fn render_lists_rows() {
        let mut t = RegistrationTable::new();
        assert!(t.render().contains("(no registrations)"));
        t.apply(&reg_event(10, 0, 0x40, 3, "a u32 x"));
        let text = t.render();
        assert!(text.lines().nth(1).unwrap().contains("0x40"), "{text}");
        assert!(text.contains("a u32 x"));
        let json = serde_json::to_value(&t.get(10)[0]).unwrap();
        assert_eq!(json["enable_addr"], "0x40");
        assert_eq!(json["enable_bit"], 3);
    }

    fn found_at_start(pid: u32, addr: u64, bit: u8, name: &str) -> ExistingEnablers {
        ExistingEnablers {
            enablers: vec![tracer_decode::bpf_event::ExistingEnabler {
                pid,
                enable_addr: addr,
                enable_bit: bit,
                enable_size: 4,
                name: Ok(name.as_bytes().to_vec()),
            }],
            ..ExistingEnablers::default()
        }
    }

    #[test]
    fn registrations_found_at_start_are_seeded_once_per_place() {
        let mut t = RegistrationTable::new();
        // Reported live while the iterator ran: the live row, which knows more, stays.
        t.apply(&reg_event(10, 0, 0x40, 0, "a u32 x"));
        t.seed(&found_at_start(10, 0x40, 0, "a"));
        t.seed(&found_at_start(10, 0x48, 2, "b"));
        assert_eq!(names(&t, 10), ["a u32 x", "b"]);
        let b = &t.get(10)[1];
        assert_eq!((b.fd, b.write_index, b.flags, b.at_start), (None, None, None, true));
        let json = serde_json::to_value(b).unwrap();
        assert_eq!((&json["fd"], &json["at_start"]), (&serde_json::Value::Null, &true.into()));
        assert!(t.render().contains("      10    -"), "no fd: {}", t.render());
        // A live registration at a place tabled at start replaces it (one enabler per place).
        t.apply(&reg_event(10, 0, 0x48, 2, "b u64 y"));
        assert_eq!(names(&t, 10), ["a u32 x", "b u64 y"]);
        assert!(!t.get(10)[1].at_start);
        // Unregistering works on rows found at start too.
        t.seed(&found_at_start(11, 0x50, 1, "c"));
        t.apply(&unreg_event(11, 0, 0x50, 1));
        assert!(t.get(11).is_empty());
    }
}
