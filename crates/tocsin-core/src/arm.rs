//! Armed fires: a push timer's first `Fire` committed ahead of its time,
//! so that sending it at its time waits for no commit.
//!
//! The apply rules let a leader's `Fire` for a scheduled webhook or AMQP
//! timer land up to [`MAX_ARM_AHEAD_MS`](crate::limits::MAX_ARM_AHEAD_MS)
//! before the timer's fire time: its first attempt then *starts at the
//! fire time* (`FireRecord::attempt_started_at_ms`), and its deadline in
//! the fire-time index is that time plus the attempt's timeout, as for any
//! attempt. Until the fire time, a cancel or reschedule applied under the
//! same leader undoes it as if it had never been applied. So the leader
//! commits the `Fire`s of the next stretch of time together, a little
//! ahead, and at each timer's time only sends.
//!
//! That is safe only if the leader never sends an armed attempt that a
//! cancel applied later could still undo. A cancel undoes an armed attempt
//! only while the entry carrying it is stamped before the attempt's start
//! (apply's clock is the entry's stamp; `apply.rs`). The leader is the only
//! proposer of its shard, so before sending an attempt starting at `t` it
//! makes sure of two things, both kept by [`StampFence`]:
//! - no entry it stamps from then on is stamped before `t` (the fence's
//!   floor, whatever the wall clock does meanwhile);
//! - no entry already stamped before `t` that carries a cancel or
//!   reschedule of the timer is still on its way; if one is, the attempt
//!   waits until it is applied, and the applied log then says whether the
//!   attempt still stands.
//!
//! An entry openraft answers with an error (the node lost its leadership
//! on the way) has an unknown fate: the next leader may still commit it,
//! and apply it before that leader's epoch entry, under this leader's
//! epoch. So once one entry of a leadership is lost that way
//! ([`StampFence::lost`]), the fence lets no armed attempt go until an
//! entry stamped after it is applied (everything before that entry in the
//! log is applied too, or was never there) or the next leadership starts
//! ([`StampFence::new_leadership`]). An attempt held meanwhile comes due at
//! its deadline, whose `Fire` is such an entry: nothing waits for ever.
//!
//! [`Armed`] is what the leader holds meanwhile: each armed attempt until
//! its start, dropped as soon as the applied log moves the timer again.
//! [`arm_at`] is when the fire loop hands a timer over to be armed.
//!
//! A leader that takes over an earlier leader's armed attempt cannot know
//! whether that leader sent it: the attempt stays armed at its own time,
//! under the new epoch, and a cancel of it answers "cancelled while
//! firing" (`apply.rs`).
//!
//! Pure: no clock and no I/O; time comes in as `now_ms`.

use std::collections::BTreeSet;
use std::collections::HashMap;

use crate::command::Command;
use crate::timer::TimerKey;

/// When the fire loop hands over a timer due at `due_ms` to be armed: the
/// first line of the `step_ms` grid at or after `due_ms - ahead_ms`, so a
/// timer is armed between `ahead_ms - step_ms` and `ahead_ms` before its
/// time and all timers due within one step are armed together (one batch
/// of `Fire`s, not one per millisecond). `ahead_ms` 0 arms nothing: the
/// timer is handed over at its time.
pub fn arm_at(due_ms: u64, ahead_ms: u64, step_ms: u64) -> u64 {
    if ahead_ms == 0 {
        return due_ms;
    }
    let step = step_ms.clamp(1, ahead_ms);
    let earliest = due_ms.saturating_sub(ahead_ms);
    earliest.div_ceil(step).saturating_mul(step).min(due_ms)
}

/// The timer a command can undo an armed fire of: a cancel or a
/// reschedule.
pub fn undoes_arm(command: &Command) -> Option<&TimerKey> {
    match command {
        Command::Cancel { key } | Command::Reschedule { key, .. } => Some(key),
        _ => None,
    }
}

/// The proposer's stamps, as the sending of armed attempts needs them (see
/// the module doc). One per shard leader; the node keeps it under a lock
/// that both the proposer and the fire loop take.
#[derive(Debug, Default)]
pub struct StampFence {
    /// No entry is stamped before this.
    floor_ms: u64,
    /// The latest stamp handed out: stamps never go backwards.
    last_ms: u64,
    /// For each timer, the stamps of the entries on their way that carry a
    /// command that can undo its armed fire.
    in_flight: HashMap<TimerKey, Vec<u64>>,
    /// Counts the leaderships of this shard on this node.
    leadership: u64,
    /// Counts the stamps handed out.
    seq: u64,
    /// An entry of the current leadership carrying a cancel or reschedule,
    /// stamped as number `n`, had an unknown fate: nothing armed may be
    /// sent until an entry stamped after it is applied.
    blind_after: Option<u64>,
}

/// What [`StampFence::stamp`] registered, to hand back to
/// [`StampFence::done`] once the entry is applied or failed for good.
#[derive(Debug, Default)]
#[must_use = "hand it back to StampFence::done once the entry's fate is known"]
pub struct Stamped {
    pub stamp_ms: u64,
    keys: Vec<TimerKey>,
    leadership: u64,
    seq: u64,
}

impl StampFence {
    /// The stamp of an entry carrying `commands`, proposed at `now_ms`: at
    /// least the previous stamp and the floor. Registers the entry's
    /// cancels and reschedules until [`done`](Self::done).
    pub fn stamp<'a>(&mut self, now_ms: u64, commands: impl IntoIterator<Item = &'a Command>) -> Stamped {
        let stamp_ms = now_ms.max(self.last_ms).max(self.floor_ms);
        self.last_ms = stamp_ms;
        let keys: Vec<TimerKey> = commands.into_iter().filter_map(undoes_arm).cloned().collect();
        for key in &keys {
            self.in_flight.entry(key.clone()).or_default().push(stamp_ms);
        }
        self.seq += 1;
        Stamped { stamp_ms, keys, leadership: self.leadership, seq: self.seq }
    }

    /// The entry `stamped` was for failed with its fate unknown (openraft
    /// answered with an error: the leadership was lost on the way, and the
    /// next leader may commit it). If it could undo an armed attempt and
    /// belongs to the current leadership, no armed attempt is sent until
    /// an entry stamped after it is applied, or
    /// [`new_leadership`](Self::new_leadership).
    pub fn lost(&mut self, stamped: Stamped) {
        if !stamped.keys.is_empty() && stamped.leadership == self.leadership {
            self.blind_after = Some(self.blind_after.unwrap_or(0).max(stamped.seq));
        }
        self.release(stamped);
    }

    /// This node leads the shard again (a new leader task, whose own epoch
    /// entry follows every entry stamped before it in the log): what was
    /// lost before no longer matters, since it is applied, or truncated,
    /// before anything the new leadership arms.
    pub fn new_leadership(&mut self) {
        self.leadership += 1;
        self.blind_after = None;
    }

    /// The entry `stamped` was for is applied, or will never be.
    pub fn done(&mut self, stamped: Stamped) {
        if self.blind_after.is_some_and(|lost| stamped.seq > lost) {
            self.blind_after = None;
        }
        self.release(stamped);
    }

    fn release(&mut self, stamped: Stamped) {
        for key in stamped.keys {
            if let Some(stamps) = self.in_flight.get_mut(&key) {
                if let Some(at) = stamps.iter().position(|&s| s == stamped.stamp_ms) {
                    stamps.swap_remove(at);
                }
                if stamps.is_empty() {
                    self.in_flight.remove(&key);
                }
            }
        }
    }

    /// Whether the armed attempt of `key` that starts at `start_ms` may be
    /// sent as far as stamps go: from now on nothing is stamped before
    /// `start_ms`, and no entry stamped before it that could undo the
    /// attempt is on its way. The caller then reads the applied log up to
    /// now before it sends (an entry that was on its way has been applied by
    /// then, and says whether the attempt still stands).
    pub fn may_send(&mut self, key: &TimerKey, start_ms: u64) -> bool {
        self.floor_ms = self.floor_ms.max(start_ms);
        self.blind_after.is_none()
            && !self.in_flight.get(key).is_some_and(|stamps| stamps.iter().any(|&s| s < start_ms))
    }

    /// Entries on their way that carry a cancel or reschedule.
    pub fn undoing_in_flight(&self) -> usize {
        self.in_flight.values().map(Vec::len).sum()
    }
}

/// Armed attempts a leader holds until their start (see the module doc),
/// each with what it sends then (`V`: the record the `Fire` left).
#[derive(Debug)]
pub struct Armed<V> {
    by_key: HashMap<TimerKey, Held<V>>,
    by_start: BTreeSet<(u64, TimerKey)>,
}

#[derive(Debug)]
struct Held<V> {
    start_ms: u64,
    /// The log index of the entry that armed it.
    index: u64,
    value: V,
}

impl<V> Default for Armed<V> {
    fn default() -> Self {
        Armed { by_key: HashMap::new(), by_start: BTreeSet::new() }
    }
}

impl<V> Armed<V> {
    /// Holds `key`'s attempt starting at `start_ms`, armed by the entry at
    /// `index`, in place of any it held for it before.
    pub fn hold(&mut self, key: TimerKey, index: u64, start_ms: u64, value: V) {
        if let Some(old) = self.by_key.get(&key) {
            if old.index > index {
                return;
            }
            self.by_start.remove(&(old.start_ms, key.clone()));
        }
        self.by_start.insert((start_ms, key.clone()));
        self.by_key.insert(key, Held { start_ms, index, value });
    }

    /// The applied log moved `key`'s fire-time index entry at `index`: an
    /// attempt armed by an earlier entry no longer stands (cancelled,
    /// rescheduled, or taken over by a later `Fire`).
    pub fn on_change(&mut self, key: &TimerKey, index: u64) {
        if self.by_key.get(key).is_some_and(|held| held.index < index) {
            let held = self.by_key.remove(key).expect("present");
            self.by_start.remove(&(held.start_ms, key.clone()));
        }
    }

    /// The held attempts whose start has come by `now_ms`, earliest first,
    /// with their starts; they stay held until [`take`](Self::take).
    pub fn due(&self, now_ms: u64) -> Vec<(TimerKey, u64)> {
        self.by_start
            .iter()
            .take_while(|(start, _)| *start <= now_ms)
            .map(|(start, key)| (key.clone(), *start))
            .collect()
    }

    /// Stops holding `key`'s attempt and returns it.
    pub fn take(&mut self, key: &TimerKey) -> Option<V> {
        let held = self.by_key.remove(key)?;
        self.by_start.remove(&(held.start_ms, key.clone()));
        Some(held.value)
    }

    /// The earliest start held.
    pub fn next_ms(&self) -> Option<u64> {
        self.by_start.first().map(|(start, _)| *start)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Forgets everything held (changes were lost: what was held may have
    /// been undone; each attempt is sent again at its deadline instead).
    pub fn clear(&mut self) {
        self.by_key.clear();
        self.by_start.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> TimerKey {
        TimerKey::new("ns", id)
    }

    #[test]
    fn timers_are_handed_over_on_a_grid_between_ahead_less_a_step_and_ahead_before_their_time() {
        assert_eq!(arm_at(10_000, 0, 50), 10_000, "0 arms nothing");
        for due in [10_000u64, 10_001, 10_049, 10_050, 10_199, 123_457] {
            let at = arm_at(due, 250, 50);
            assert_eq!(at % 50, 0, "{due}: on the grid");
            assert!(due - at <= 250 && due - at > 200, "{due}: handed over {} ahead", due - at);
        }
        // Timers due within one step share their hand-over.
        assert_eq!(arm_at(10_251, 250, 50), arm_at(10_300, 250, 50));
        // Near the clock's start nothing underflows, and a step above the
        // lead is the lead.
        assert_eq!(arm_at(100, 250, 50), 0);
        assert_eq!(arm_at(10_000, 100, 1_000), 9_900);
    }

    #[test]
    fn stamps_never_go_below_the_previous_stamp_or_the_floor() {
        let mut fence = StampFence::default();
        let a = fence.stamp(1_000, []);
        assert_eq!(a.stamp_ms, 1_000);
        let b = fence.stamp(900, []);
        assert_eq!(b.stamp_ms, 1_000, "a clock that stepped back");
        assert!(fence.may_send(&key("x"), 1_500));
        assert_eq!(fence.stamp(1_200, []).stamp_ms, 1_500, "nothing is stamped before a start that was sent");
        fence.done(a);
        fence.done(b);
    }

    #[test]
    fn an_attempt_waits_for_a_cancel_stamped_before_its_start_and_only_for_one_of_its_own_timer() {
        let mut fence = StampFence::default();
        let cancel = Command::Cancel { key: key("x") };
        let other = Command::Cancel { key: key("y") };
        let create_like = Command::LeaderEpoch { leader: 1 };
        let stamped = fence.stamp(1_000, [&cancel, &other, &create_like]);
        assert_eq!(fence.undoing_in_flight(), 2);
        assert!(!fence.may_send(&key("x"), 1_001), "its cancel is on its way");
        assert!(fence.may_send(&key("z"), 1_001), "another timer's cancel holds nothing up");
        assert!(fence.may_send(&key("x"), 1_000), "stamped at its start: the cancel comes after it");
        fence.done(stamped);
        assert_eq!(fence.undoing_in_flight(), 0);
        assert!(fence.may_send(&key("x"), 1_001));
        // A reschedule counts like a cancel; two entries for one timer are
        // each waited for.
        let resched = Command::Reschedule { key: key("x"), expected_generation: 1, fire_at_ms: 5 };
        let first = fence.stamp(2_000, [&resched]);
        let second = fence.stamp(2_000, [&cancel]);
        fence.done(first);
        assert!(!fence.may_send(&key("x"), 2_001));
        fence.done(second);
        assert!(fence.may_send(&key("x"), 2_001));
    }

    #[test]
    fn a_lost_cancel_holds_every_attempt_until_a_later_entry_is_applied_or_a_new_leadership() {
        let mut fence = StampFence::default();
        let cancel = Command::Cancel { key: key("x") };
        let epoch = Command::LeaderEpoch { leader: 1 };
        // Lost with nothing in it that undoes an arm: nothing changes.
        let plain = fence.stamp(1_000, [&epoch]);
        fence.lost(plain);
        assert!(fence.may_send(&key("y"), 1_001));
        // A lost cancel: the next leader may commit it under this epoch, so
        // no armed attempt of this leadership goes, whatever its timer.
        let stamped = fence.stamp(1_000, [&cancel]);
        fence.lost(stamped);
        assert_eq!(fence.undoing_in_flight(), 0);
        assert!(!fence.may_send(&key("x"), 1_001));
        assert!(!fence.may_send(&key("y"), 5_000), "another timer's too");
        // Until an entry stamped after it is applied.
        let later = fence.stamp(1_000, [&epoch]);
        fence.done(later);
        assert!(fence.may_send(&key("y"), 5_000), "an entry after the lost one was applied");
        let earlier = fence.stamp(5_000, [&epoch]);
        let stamped = fence.stamp(5_000, [&cancel]);
        fence.lost(stamped);
        fence.done(earlier);
        assert!(!fence.may_send(&key("y"), 5_000), "an entry stamped before the lost one says nothing");
        fence.new_leadership();
        assert!(fence.may_send(&key("y"), 5_000));
        // An entry of the leadership before, lost after the next began, is
        // applied or truncated before anything the new one arms.
        let old = fence.stamp(6_000, [&cancel]);
        fence.new_leadership();
        fence.lost(old);
        assert!(fence.may_send(&key("x"), 7_000));
    }

    #[test]
    fn a_held_attempt_is_dropped_by_a_later_change_and_comes_due_at_its_start() {
        let mut armed: Armed<&str> = Armed::default();
        armed.hold(key("a"), 10, 1_000, "a");
        armed.hold(key("b"), 11, 900, "b");
        armed.hold(key("c"), 12, 1_000, "c");
        assert_eq!(armed.next_ms(), Some(900));
        // The arming entry's own change is not newer than it.
        armed.on_change(&key("a"), 10);
        armed.on_change(&key("c"), 13);
        assert_eq!(armed.len(), 2);
        assert_eq!(armed.due(899), vec![]);
        assert_eq!(armed.due(1_000), vec![(key("b"), 900), (key("a"), 1_000)]);
        assert_eq!(armed.take(&key("b")), Some("b"));
        assert_eq!(armed.take(&key("b")), None);
        // An older arming never replaces a newer one; a newer one replaces.
        armed.hold(key("a"), 9, 500, "old");
        assert_eq!(armed.due(600), vec![]);
        armed.hold(key("a"), 14, 2_000, "new");
        assert_eq!(armed.due(1_999), vec![]);
        assert_eq!(armed.take(&key("a")), Some("new"));
        assert!(armed.is_empty());
        armed.hold(key("d"), 15, 1, "d");
        armed.clear();
        assert_eq!((armed.len(), armed.next_ms()), (0, None));
    }
}
