//! How a shard leader's fire loop hears about the applied log.
//!
//! The shard's state machine calls [`EventSink::applied`] (it is the
//! group's `ApplyObserver`) once a batch of entries is written, in log
//! order, whoever proposed them and whether or not anyone still waits for
//! them. The sink hands each entry's fire-time index changes, and the
//! timers its `Fire` commands dispatched, to the leader task attached to
//! it. With no task attached (a follower) nothing is kept: a leader that
//! starts later reads the index anyway.
//!
//! The queue is bounded by the number of changes it holds. When an entry
//! does not fit, it is dropped and the sink remembers that it overflowed:
//! the leader then reads the index again from the start, and a dispatch
//! that was lost that way is redelivered at its attempt's deadline. Nothing
//! depends on an event arriving, only on how soon.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;

use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::fire::IndexChange;
use tocsin_store::AppliedEntry;
use tocsin_store::ApplyObserver;
use tokio::sync::mpsc;

/// Most changes and dispatches queued for a leader task.
pub const EVENT_QUEUE: usize = 65_536;

/// A timer a `Fire` dispatched.
#[derive(Debug)]
pub struct Dispatched {
    pub key: TimerKey,
    pub record: TimerRecord,
    /// The epoch of the `Fire` command.
    pub epoch: u64,
}

/// What one applied entry means to the shard's leader.
#[derive(Debug)]
pub struct Applied {
    /// The entry's log index.
    pub index: u64,
    /// Timers whose fire-time index entry moved.
    pub changes: Vec<IndexChange>,
    /// Timers whose `Fire` started an attempt or made them ready, as the
    /// entry left them, with the epoch the `Fire` was proposed under (a pull
    /// timer made ready again keeps the epoch of its last reservation).
    pub dispatches: Vec<Dispatched>,
}

impl Applied {
    fn weight(&self) -> usize {
        (self.changes.len() + self.dispatches.len()).max(1)
    }
}

struct Attached {
    generation: u64,
    tx: mpsc::UnboundedSender<Applied>,
    /// Changes and dispatches queued for this task and not yet taken.
    queued: Arc<AtomicUsize>,
}

/// The per-shard mailbox the leader task attaches to.
#[derive(Default)]
pub struct EventSink {
    attached: Mutex<Option<Attached>>,
    generations: AtomicU64,
    /// Set when something could not be queued: the leader must rescan.
    overflowed: AtomicBool,
}

/// A leader task's end of the mailbox.
pub struct Events {
    pub generation: u64,
    rx: mpsc::UnboundedReceiver<Applied>,
    queued: Arc<AtomicUsize>,
}

impl Events {
    pub async fn recv(&mut self) -> Option<Applied> {
        let applied = self.rx.recv().await?;
        self.queued.fetch_sub(applied.weight(), Ordering::SeqCst);
        Some(applied)
    }

    pub fn try_recv(&mut self) -> Option<Applied> {
        let applied = self.rx.try_recv().ok()?;
        self.queued.fetch_sub(applied.weight(), Ordering::SeqCst);
        Some(applied)
    }
}

impl EventSink {
    /// Attaches a new leader task (replacing any earlier one) and returns its
    /// end of the mailbox.
    pub fn attach(&self) -> Events {
        let (tx, rx) = mpsc::unbounded_channel();
        let generation = self.generations.fetch_add(1, Ordering::SeqCst) + 1;
        let queued = Arc::new(AtomicUsize::new(0));
        *self.attached.lock().expect("sink lock") = Some(Attached { generation, tx, queued: queued.clone() });
        self.overflowed.store(false, Ordering::SeqCst);
        Events { generation, rx, queued }
    }

    /// Detaches the task that attached as `generation`, and only that one: a
    /// task that ends after its successor attached must not leave the
    /// successor deaf.
    pub fn detach(&self, generation: u64) {
        let mut attached = self.attached.lock().expect("sink lock");
        if attached.as_ref().is_some_and(|a| a.generation == generation) {
            *attached = None;
        }
    }

    /// Asks the leader to rescan the fire-time index (something it handed
    /// on could not be kept).
    pub fn mark_overflow(&self) {
        self.overflowed.store(true, Ordering::SeqCst);
    }

    /// Whether anything was lost since the last [`take_overflow`](Self::take_overflow),
    /// leaving the flag as it is.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::SeqCst)
    }

    /// Whether anything was lost since the last call (and clears the flag).
    pub fn take_overflow(&self) -> bool {
        self.overflowed.swap(false, Ordering::SeqCst)
    }
}

impl ApplyObserver for EventSink {
    fn applied(&self, entries: &[AppliedEntry<'_>]) {
        let attached = self.attached.lock().expect("sink lock");
        let Some(attached) = attached.as_ref() else { return };
        // Counted here, by the leader only: once per entry cluster-wide.
        let mut counts = crate::telemetry::LifecycleCounts::default();
        for entry in entries {
            for (command, result) in entry.commands.iter().zip(entry.results) {
                counts.add(command, result);
            }
            // A cancel or reschedule after a `Fire` in the same entry undid the
            // attempt that `Fire` dispatched (an armed one, answered CANCELLED
            // or RESCHEDULED): its dispatch no longer stands, and the entry's
            // index changes, one set for the whole entry, cannot say so.
            let undone = last_undo(entry.commands.iter().zip(entry.results).map(|(command, result)| {
                (command, matches!(result, CommandResult::Cancelled { .. } | CommandResult::Rescheduled { .. }))
            }));
            let dispatches: Vec<Dispatched> = entry
                .commands
                .iter()
                .zip(entry.results)
                .enumerate()
                .filter_map(|(at, (command, result))| match (command, result) {
                    (Command::Fire { key, epoch, .. }, CommandResult::Dispatch { record })
                        if undone.get(key).is_none_or(|&undo| undo < at) =>
                    {
                        Some(Dispatched { key: key.clone(), record: record.clone(), epoch: *epoch })
                    }
                    _ => None,
                })
                .collect();
            if entry.changes.is_empty() && dispatches.is_empty() {
                continue;
            }
            // A test can lose an entry that dispatched nothing (a cancel's, say)
            // as a full queue would: the `events::lose` fault point.
            let lose = dispatches.is_empty() && crate::fault::check_now("events::lose").is_err();
            let applied = Applied { index: entry.index, changes: entry.changes.to_vec(), dispatches };
            let weight = applied.weight();
            let full = !lose && attached.queued.fetch_add(weight, Ordering::SeqCst) + weight > EVENT_QUEUE;
            if full {
                attached.queued.fetch_sub(weight, Ordering::SeqCst);
            }
            if lose || full {
                self.overflowed.store(true, Ordering::SeqCst);
                metrics::counter!("tocsin_wheel_event_overflows_total").increment(1);
                continue;
            }
            if attached.tx.send(applied).is_err() {
                attached.queued.fetch_sub(weight, Ordering::SeqCst);
            }
        }
        counts.flush();
    }
}

/// For each timer whose armed attempt a command of one entry undid (a
/// cancel or reschedule, `true` beside it when it answered `Cancelled` or
/// `Rescheduled`), the position of the last such command.
fn last_undo<'a>(steps: impl Iterator<Item = (&'a Command, bool)>) -> HashMap<&'a TimerKey, usize> {
    let mut undone = HashMap::new();
    for (at, (command, undid)) in steps.enumerate() {
        if let (Some(key), true) = (tocsin_core::arm::undoes_arm(command), undid) {
            undone.insert(key, at);
        }
    }
    undone
}

#[cfg(test)]
mod tests {
    use super::*;
    use tocsin_core::Due;
    use tocsin_core::DueKind;

    fn entry_changes(key: &TimerKey) -> Vec<IndexChange> {
        vec![IndexChange { key: key.clone(), due: Some(Due { at_ms: 5, kind: DueKind::Fire }) }]
    }

    /// Finding 7: a leader task restarted on a new term attaches before the
    /// old one's guard detaches; the late detach must not leave the new task
    /// deaf.
    #[tokio::test]
    async fn a_late_detach_of_an_old_task_leaves_the_new_one_attached() {
        let sink = EventSink::default();
        let old = sink.attach();
        let mut new = sink.attach();
        sink.detach(old.generation);
        let key = TimerKey::new("ns", "a");
        let changes = entry_changes(&key);
        sink.applied(&[AppliedEntry { index: 7, commands: &[], results: &[], changes: &changes }]);
        let got = new.try_recv().expect("the new task still hears the applied log");
        assert_eq!((got.index, got.changes.len()), (7, 1));
        // Its own detach does detach it.
        sink.detach(new.generation);
        sink.applied(&[AppliedEntry { index: 8, commands: &[], results: &[], changes: &changes }]);
        assert!(new.try_recv().is_none());
    }

    /// A `Fire` and, after it in the same entry, a cancel that undid its
    /// armed attempt: the dispatch must not stand. One before it, or one
    /// that undid nothing, leaves it.
    #[test]
    fn an_undo_later_in_the_entry_is_found_and_one_earlier_is_not_later() {
        let a = TimerKey::new("ns", "a");
        let b = TimerKey::new("ns", "b");
        let fire = |key: &TimerKey| Command::Fire { key: key.clone(), due_ms: 5, epoch: 1, timeout_ms: 10 };
        let cancel = |key: &TimerKey| Command::Cancel { key: key.clone() };
        let steps = [(fire(&a), false), (cancel(&b), true), (cancel(&a), true), (fire(&b), false)];
        let undone = last_undo(steps.iter().map(|(c, u)| (c, *u)));
        assert_eq!(undone.get(&a), Some(&2), "a's cancel comes after its Fire (at 0)");
        assert_eq!(undone.get(&b), Some(&1), "b's cancel comes before its Fire (at 3)");
        let steps = [(fire(&a), false), (cancel(&a), false)];
        assert!(last_undo(steps.iter().map(|(c, u)| (c, *u))).is_empty(), "a cancel that undid nothing");
    }

    #[tokio::test]
    async fn entries_arrive_in_log_order_and_overflow_is_flagged() {
        let sink = EventSink::default();
        let mut events = sink.attach();
        let key = TimerKey::new("ns", "a");
        let changes = entry_changes(&key);
        let entries: Vec<AppliedEntry<'_>> =
            (1..=3).map(|index| AppliedEntry { index, commands: &[], results: &[], changes: &changes }).collect();
        sink.applied(&entries);
        let order: Vec<u64> = std::iter::from_fn(|| events.try_recv()).map(|a| a.index).collect();
        assert_eq!(order, vec![1, 2, 3]);
        assert!(!sink.take_overflow());
        // More than the queue holds: dropped, and the leader is told to rescan.
        let many: Vec<IndexChange> =
            (0..EVENT_QUEUE + 1).map(|i| IndexChange { key: TimerKey::new("ns", i.to_string()), due: None }).collect();
        sink.applied(&[AppliedEntry { index: 4, commands: &[], results: &[], changes: &many }]);
        assert!(events.try_recv().is_none());
        assert!(sink.take_overflow());
    }
}
