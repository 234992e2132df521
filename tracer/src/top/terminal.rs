//! The terminal while `tracer top` owns it: raw mode, the alternate screen, the cursor hidden —
//! and put back as it was however top ends: quitting, a signal, an error, a panic (the panic
//! hook restores it before the message is printed), or a terminal that went away (restoring
//! then fails quietly).
use std::io::{Stdout, stdout};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::cursor::{Hide, Show};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

/// Whether the terminal is in top's state (restored once, by whoever comes first).
static TAKEN: AtomicBool = AtomicBool::new(false);
/// The log level before the screen muted the log (stderr is the same terminal).
static MUTED_LOG: std::sync::Mutex<Option<log::LevelFilter>> = std::sync::Mutex::new(None);

/// The terminal, taken; dropped, it is given back.
pub struct Screen {
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Screen {
    /// Takes the terminal. Log lines would write over the screen: while it is up they are not
    /// written when stderr is this terminal too (redirect stderr to keep them).
    pub fn take() -> anyhow::Result<Screen> {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                give_back();
                previous(info);
            }));
        });
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            *MUTED_LOG.lock().unwrap_or_else(|e| e.into_inner()) = Some(log::max_level());
            log::set_max_level(log::LevelFilter::Off);
        }
        TAKEN.store(true, Ordering::SeqCst);
        enable_raw_mode().context("switching the terminal to raw mode")?;
        execute!(stdout(), EnterAlternateScreen, Hide).context("entering the alternate screen")?;
        let terminal =
            Terminal::new(CrosstermBackend::new(stdout())).context("setting up the screen")?;
        Ok(Screen { terminal })
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        give_back();
    }
}

/// Whether the terminal is still top's: a panic anywhere (a task's too, which the runtime
/// survives) gives it back, and top then ends.
pub fn is_taken() -> bool {
    TAKEN.load(Ordering::SeqCst)
}

/// Puts the terminal back as it was (once; later calls do nothing).
pub fn give_back() {
    if !TAKEN.swap(false, Ordering::SeqCst) {
        return;
    }
    // A terminal that went away (SIGHUP) cannot be restored: nothing to do then.
    let _ = execute!(stdout(), LeaveAlternateScreen, Show);
    let _ = disable_raw_mode();
    if let Some(level) = MUTED_LOG.lock().unwrap_or_else(|e| e.into_inner()).take() {
        log::set_max_level(level);
    }
}
