//! How a shard leader's wheel hears about timers that moved.
//!
//! After an entry is applied, the proposer turns each result that changed a
//! timer's place in the fire-time index into a [`WheelEvent`] and offers it
//! to the shard's [`EventSink`]. The leader task, while it runs, drains the
//! sink in order with its own index scans, which is what makes "loaded or
//! announced" exhaustive (see `leader.rs`). With no leader task attached,
//! events are dropped: a leader that starts later scans the index anyway.

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;

use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::TimerKey;
use tokio::sync::mpsc;

/// A timer's new place in the fire-time index, as far as the wheel cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WheelEvent {
    /// The leader must look at `key` at `due_ms`.
    Due { key: TimerKey, due_ms: u64 },
    /// `key` needs no wheel entry (finished, or an attempt is in flight).
    Gone { key: TimerKey },
}

/// Capacity of the channel from the proposer to the leader task.
pub const EVENT_QUEUE: usize = 65_536;

/// The per-shard mailbox the leader task attaches to.
#[derive(Default)]
pub struct EventSink {
    tx: Mutex<Option<mpsc::Sender<WheelEvent>>>,
    /// Set when an event could not be queued: the leader must rescan.
    overflowed: AtomicBool,
}

impl EventSink {
    /// Attaches a new leader task and returns its receiving end.
    pub fn attach(&self) -> mpsc::Receiver<WheelEvent> {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        *self.tx.lock().expect("sink lock") = Some(tx);
        self.overflowed.store(false, Ordering::SeqCst);
        rx
    }

    pub fn detach(&self) {
        *self.tx.lock().expect("sink lock") = None;
    }

    /// Asks the leader to rescan the fire-time index (something it offered
    /// could not be kept).
    pub fn mark_overflow(&self) {
        self.overflowed.store(true, Ordering::SeqCst);
    }

    /// Whether events were lost since the last call (and clears the flag).
    pub fn take_overflow(&self) -> bool {
        self.overflowed.swap(false, Ordering::SeqCst)
    }

    /// Derives events from one applied entry's commands and results.
    pub fn observe(&self, commands: &[Command], results: &[CommandResult]) {
        let guard = self.tx.lock().expect("sink lock");
        let Some(tx) = guard.as_ref() else { return };
        for (command, result) in commands.iter().zip(results) {
            let Some(event) = event_for(command, result) else { continue };
            if tx.try_send(event).is_err() {
                self.overflowed.store(true, Ordering::SeqCst);
            }
        }
    }
}

/// The wheel event an applied command implies, if any. A `Fire` or
/// `Reserve` result goes straight to whoever proposed it, not here.
pub fn event_for(command: &Command, result: &CommandResult) -> Option<WheelEvent> {
    let key = command.key()?.clone();
    match result {
        CommandResult::Created { record, created: true } | CommandResult::Rescheduled { record } => {
            Some(WheelEvent::Due { key, due_ms: record.fire_at_ms })
        }
        CommandResult::Recorded { record } => Some(match record.due_ms() {
            Some(due_ms) => WheelEvent::Due { key, due_ms },
            None => WheelEvent::Gone { key },
        }),
        CommandResult::Cancelled { .. } | CommandResult::Dead { .. } => Some(WheelEvent::Gone { key }),
        _ => None,
    }
}
