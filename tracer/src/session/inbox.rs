//! The channel from the session tasks to the pipeline, looked at in rounds.
//!
//! Every look at the channel wakes the pipeline's thread, and a node agent's sessions each send
//! a message or two a second (50 runtimes' counters: ~60 wake-ups a second, each costing more
//! than the lines it writes). So once a look finds the channel empty, the next one comes
//! [`LOOK_INTERVAL`] later, unless a session rings the [`Bell`] first: it handed on a full batch
//! of lines or found the channel full, a burst the pipeline takes at once. A message is handled
//! at most [`LOOK_INTERVAL`] after it was sent; one sent while the pipeline waits for messages
//! is handled at once.
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::SessionMessage;

/// After a look that emptied the channel, the next is this much later (unless the bell rang).
pub const LOOK_INTERVAL: Duration = Duration::from_millis(100);
/// Messages the channel holds; a session finding it full holds its lines (within its budget)
/// and waits.
pub const CAPACITY: usize = 1024;

/// What a session rings when the pipeline should look now rather than at its next round.
#[derive(Clone, Debug, Default)]
pub struct Bell(Arc<Notify>);

impl Bell {
    pub fn ring(&self) {
        self.0.notify_one();
    }
}

/// The pipeline's end of the channel.
pub struct Inbox {
    rx: mpsc::Receiver<SessionMessage>,
    bell: Bell,
    /// No look before then (`None`: the next message is taken as it comes).
    closed_until: Option<Instant>,
}

impl Inbox {
    /// The inbox, and the sender and bell every session gets.
    pub fn new() -> (Inbox, mpsc::Sender<SessionMessage>, Bell) {
        let (tx, rx) = mpsc::channel(CAPACITY);
        let bell = Bell::default();
        (Inbox { rx, bell: bell.clone(), closed_until: None }, tx, bell)
    }

    /// The next message, once this round's wait is over; `None` once every sender is gone.
    /// Cancel-safe (a `select!` arm): a wait cut short goes on at the next call.
    pub async fn recv(&mut self) -> Option<SessionMessage> {
        if let Some(until) = self.closed_until {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = self.bell.0.notified() => {}
            }
            self.closed_until = None;
        }
        self.rx.recv().await
    }

    /// A message already sent, if any; finding none closes the inbox for [`LOOK_INTERVAL`].
    pub fn try_recv(&mut self) -> Option<SessionMessage> {
        let msg = self.rx.try_recv().ok();
        if msg.is_none() {
            self.closed_until = Some(Instant::now() + LOOK_INTERVAL);
        }
        msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Incarnation;

    fn message(pid: u32) -> SessionMessage {
        SessionMessage::Failed {
            process: Incarnation::new(pid, None),
            error: String::new(),
            refused: false,
        }
    }

    fn pid(msg: Option<SessionMessage>) -> Option<u32> {
        match msg {
            Some(SessionMessage::Failed { process, .. }) => Some(process.pid),
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn after_an_emptying_look_the_next_waits_for_the_interval_or_the_bell() {
        let (mut inbox, tx, bell) = Inbox::new();
        // Waiting for messages: the first is taken at once.
        tx.send(message(1)).await.unwrap();
        let start = Instant::now();
        assert_eq!(pid(inbox.recv().await), Some(1));
        assert_eq!(start.elapsed(), Duration::ZERO);
        // The round's look finds the channel empty: the next waits a whole interval.
        assert_eq!(pid(inbox.try_recv()), None);
        tx.send(message(2)).await.unwrap();
        tx.send(message(3)).await.unwrap();
        assert_eq!(pid(inbox.recv().await), Some(2));
        assert_eq!(start.elapsed(), LOOK_INTERVAL);
        // Messages already there are taken in the same round, then the inbox closes again.
        assert_eq!(pid(inbox.try_recv()), Some(3));
        assert_eq!(pid(inbox.try_recv()), None);
        // The bell ends the wait.
        let rung = Instant::now();
        tx.send(message(4)).await.unwrap();
        bell.ring();
        assert_eq!(pid(inbox.recv().await), Some(4));
        assert_eq!(rung.elapsed(), Duration::ZERO);
        // Every sender gone: the inbox says so.
        drop(tx);
        assert_eq!(pid(inbox.recv().await), None);
    }
}
