//! tracer's `user_events_data` fds: registering tracepoints with the exact field list the
//! .NET runtime uses, so they exist in tracefs (and can be enabled) before a runtime is asked to
//! write to them, and passing the fd to runtimes (CollectTracing5 user_events sessions).
//!
//! The fd is a privilege (docs/security.md, "user_events grant"): every session gets its own
//! `open()` (its write indices are private to that open file), and the file is closed when the
//! session ends, so the kernel can delete the session's events.
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd as _, BorrowedFd};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use anyhow::Context as _;
use tracer_common::{DIAG_IOCSREG, DIAG_IOCSUNREG, UserReg, UserUnreg};

use crate::kernel::tracefs::Tracefs;

/// Field list of the runtime's "Tracepoint Format Version 1" (docs/protocol/user_events.md §7.1).
/// It must match the runtime's byte for byte: a different list under the same name is refused with
/// EADDRINUSE.
pub const DOTNET_TRACEPOINT_FIELDS: &str =
    "u8 version; u16 event_id; __rel_loc u8[] extension; __rel_loc u8[] payload";

/// The bit the kernel sets in our enable word while any consumer enables the event.
const ENABLE_BIT: u8 = 31;

/// Enable words deliberately leaked (process-wide): `DIAG_IOCSUNREG` failed, so the kernel may
/// still set bits in them, and freeing them would let it write into reused heap.
static LEAKED_ENABLE_WORDS: AtomicU64 = AtomicU64::new(0);

/// Enable words leaked so far because unregistering them failed (see [`LEAKED_ENABLE_WORDS`]).
pub fn leaked_enable_words() -> u64 {
    LEAKED_ENABLE_WORDS.load(Ordering::Relaxed)
}

/// An open `user_events_data` and the events registered through it.
pub struct UserEventsData {
    file: File,
    /// Event name → the enable word the kernel writes. Boxed so its address is stable; it must
    /// outlive the registration, hence unregistration before it is freed (also on drop).
    registered: Mutex<HashMap<String, Box<AtomicU32>>>,
}

impl UserEventsData {
    pub fn path(tracefs: &Tracefs) -> PathBuf {
        tracefs.path("user_events_data")
    }

    /// Whether this kernel has user_events (`CONFIG_USER_EVENTS`).
    pub fn available(tracefs: &Tracefs) -> bool {
        Self::path(tracefs).exists()
    }

    pub fn open(tracefs: &Tracefs) -> anyhow::Result<UserEventsData> {
        let path = Self::path(tracefs);
        let file = OpenOptions::new().read(true).write(true).open(&path).with_context(|| {
            format!("opening {} (kernel built with CONFIG_USER_EVENTS? root?)", path.display())
        })?;
        Ok(UserEventsData { file, registered: Mutex::default() })
    }

    /// Registers `<name> <fields>` (DIAG_IOCSREG, enable bit 31 of a 4-byte word); returns the
    /// write index. The event then exists under `events/user_events/<name>/`.
    ///
    /// A name already registered through this file is refused (`AlreadyExists`): replacing its
    /// enable word would free a word the kernel still writes.
    pub fn register(&self, name: &str, fields: &str) -> io::Result<u32> {
        // Held across the ioctl so a concurrent registration of the same name cannot race.
        let mut registered = self.registered.lock().expect("not poisoned");
        if registered.contains_key(name) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("user_events tracepoint {name} is already registered through this fd"),
            ));
        }
        let name_args = std::ffi::CString::new(format!("{name} {fields}"))
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let word = Box::new(AtomicU32::new(0));
        let mut reg = UserReg {
            size: size_of::<UserReg>() as u32,
            enable_bit: ENABLE_BIT,
            enable_size: 4,
            flags: 0,
            enable_addr: word.as_ptr() as u64,
            name_args: name_args.as_ptr() as u64,
            write_index: 0,
        };
        // SAFETY: `reg` points at a valid user_reg; name_args and the enable word outlive the
        // call, and the word is kept (in `registered`) until it is unregistered.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), DIAG_IOCSREG as _, &mut reg) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        registered.insert(name.to_string(), word);
        Ok(reg.write_index)
    }

    /// Removes our registration of `name` (DIAG_IOCSUNREG). The event itself is deleted by the
    /// kernel once no process references it. If the kernel refuses, the enable word is leaked
    /// (and counted): it may still be written.
    pub fn unregister(&self, name: &str) -> io::Result<()> {
        let Some(word) = self.registered.lock().expect("not poisoned").remove(name) else {
            return Ok(());
        };
        let result = self.unregister_word(&word);
        if result.is_err() {
            leak(word);
        }
        result
    }

    fn unregister_word(&self, word: &AtomicU32) -> io::Result<()> {
        let unreg = UserUnreg {
            size: size_of::<UserUnreg>() as u32,
            disable_bit: ENABLE_BIT,
            reserved: 0,
            reserved2: 0,
            disable_addr: word.as_ptr() as u64,
        };
        // SAFETY: valid user_unreg for a word this process registered.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), DIAG_IOCSUNREG as _, &unreg) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsFd for UserEventsData {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl Drop for UserEventsData {
    fn drop(&mut self) {
        // The kernel would keep writing into freed words otherwise.
        let registered = std::mem::take(&mut *self.registered.lock().expect("not poisoned"));
        for (name, word) in registered {
            if let Err(e) = self.unregister_word(&word) {
                log::warn!("unregistering user_events tracepoint {name}: {e}");
                leak(word);
            }
        }
    }
}

/// Leaks an enable word the kernel may still write, rather than let it write into freed memory.
fn leak(word: Box<AtomicU32>) {
    LEAKED_ENABLE_WORDS.fetch_add(1, Ordering::Relaxed);
    log::warn!("leaking a user_events enable word (4 bytes) the kernel may still write");
    Box::leak(word);
}
