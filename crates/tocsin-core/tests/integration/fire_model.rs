//! The fire loop's decisions ([`FireCore`]) against a model of the world
//! they live in: a fire-time index changed by creates, reschedules, cancels
//! and the core's own fires; applied changes that arrive late, out of step
//! with `Fire` outcomes, or not at all (overflow); pages read before changes
//! they do not show; outcomes that are unknown whether or not they applied.
//!
//! Two properties, for every generated history:
//! - **never early**: the core proposes `(key, due)` only when `due` has come,
//!   when the entry is a webhook attempt an earlier leader started, or at
//!   most `ARM_AHEAD_MS` ahead to be armed (the model's apply then starts
//!   the attempt at `due`, and nothing answers an attempt before it starts);
//! - **nothing stranded, nothing late**: once the faults stop and the world
//!   settles (changes delivered, outcomes answered), no timer is more than a
//!   second late, and once time has passed every due time the index is
//!   empty: every timer was fired and finished.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::collections::VecDeque;

use proptest::prelude::*;
use tocsin_core::Due;
use tocsin_core::DueKind;
use tocsin_core::DuePos;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::TimerState;
use tocsin_core::command::CommandResult;
use tocsin_core::command::SkipReason;
use tocsin_core::fire::Action;
use tocsin_core::fire::FireConfig;
use tocsin_core::fire::FireCore;
use tocsin_core::fire::FireOutcome;
use tocsin_core::fire::IndexChange;
use tocsin_core::fire::LoadFrom;
use tocsin_core::limits::MAX_ARM_AHEAD_MS;

const EPOCH: u64 = 50;
const ATTEMPT_MS: u64 = 3_000;
const WINDOW_MS: u64 = 5_000;
const ARM_AHEAD_MS: u64 = 250;
const ARM_STEP_MS: u64 = 50;

#[derive(Clone, Debug)]
enum Step {
    Create {
        k: usize,
        delay_ms: u64,
        pull: bool,
    },
    /// A webhook attempt an earlier leader left in flight, due `delay_ms` on.
    Orphan {
        k: usize,
        delay_ms: u64,
    },
    Reschedule {
        k: usize,
        delay_ms: u64,
    },
    Cancel {
        k: usize,
    },
    Advance {
        ms: u64,
    },
    DeliverChanges {
        n: usize,
    },
    LoseChanges,
    ReadPage,
    AnswerPage,
    /// Resolve the i-th outstanding fire: 0 applied and reported, 1 applied but
    /// unknown, 2 not applied and unknown.
    ResolveFire {
        i: usize,
        how: u8,
    },
    AnswerReread {
        i: usize,
    },
    /// A webhook attempt in flight gets its outcome (delivered).
    Deliver {
        k: usize,
    },
    /// A consumer takes a ready pull timer and acks it (or leaves it reserved).
    Consume {
        k: usize,
        ack: bool,
    },
    Poll,
}

fn step() -> impl Strategy<Value = Step> {
    let k = 0usize..12;
    prop_oneof![
        3 => (k.clone(), 0u64..8_000, prop::bool::weighted(0.3)).prop_map(|(k, delay_ms, pull)| Step::Create { k, delay_ms, pull }),
        1 => (k.clone(), 0u64..4_000).prop_map(|(k, delay_ms)| Step::Orphan { k, delay_ms }),
        1 => (k.clone(), 0u64..8_000).prop_map(|(k, delay_ms)| Step::Reschedule { k, delay_ms }),
        1 => k.clone().prop_map(|k| Step::Cancel { k }),
        3 => (1u64..1_500).prop_map(|ms| Step::Advance { ms }),
        3 => (1usize..6).prop_map(|n| Step::DeliverChanges { n }),
        1 => Just(Step::LoseChanges),
        2 => Just(Step::ReadPage),
        2 => Just(Step::AnswerPage),
        3 => (0usize..8, 0u8..3).prop_map(|(i, how)| Step::ResolveFire { i, how }),
        2 => (0usize..8).prop_map(|i| Step::AnswerReread { i }),
        1 => k.clone().prop_map(|k| Step::Deliver { k }),
        1 => (k, prop::bool::ANY).prop_map(|(k, ack)| Step::Consume { k, ack }),
        4 => Just(Step::Poll),
    ]
}

fn key(k: usize) -> TimerKey {
    // Namespaces of different lengths, so index order and string order differ.
    let ns = ["b", "aa", "c"][k % 3];
    TimerKey::new(ns, format!("t{k}"))
}

/// The world: the index as the state machine holds it, and everything in
/// transit between it and the core.
struct World {
    now: u64,
    log_index: u64,
    index: BTreeMap<TimerKey, Due>,
    /// Pull timers offered to consumers (ready, owned by the topic queue).
    offered: BTreeSet<TimerKey>,
    /// Scheduled pull timers offered unfired ([`Action::Offer`]), with the
    /// due time offered: the consumer's reservation fires them.
    queued_due: BTreeMap<TimerKey, u64>,
    changes: VecDeque<(u64, IndexChange)>,
    overflowed: bool,
    load: Option<(LoadFrom, u64, usize)>,
    page: Option<(u64, Vec<(DuePos, DueKind)>, u64)>,
    /// Outstanding fires and offers (`true`).
    fires: Vec<(TimerKey, u64, bool)>,
    rereads: Vec<TimerKey>,
    pull: BTreeSet<TimerKey>,
    /// `(key, due)` pairs that were ever an earlier leader's webhook attempt.
    adoptable: BTreeSet<(TimerKey, u64)>,
    /// When each webhook attempt in the index starts: an armed one at its
    /// timer's fire time, which may be ahead.
    starts: BTreeMap<TimerKey, u64>,
    core: FireCore,
}

impl World {
    fn new() -> World {
        let config = FireConfig {
            hot_window_ms: WINDOW_MS,
            load_page: 3,
            max_tracked: 1_000,
            retry_delay_ms: 20,
            retries_per_namespace_per_sec: 20,
            catch_up_after_ms: 0,
            catch_up_per_namespace_per_sec: 0,
            arm_ahead_ms: ARM_AHEAD_MS,
            arm_step_ms: ARM_STEP_MS,
        };
        World {
            now: 1_000_000,
            log_index: 100,
            index: BTreeMap::new(),
            offered: BTreeSet::new(),
            queued_due: BTreeMap::new(),
            changes: VecDeque::new(),
            overflowed: false,
            load: None,
            page: None,
            fires: Vec::new(),
            rereads: Vec::new(),
            pull: BTreeSet::new(),
            adoptable: BTreeSet::new(),
            starts: BTreeMap::new(),
            core: FireCore::new(config, EPOCH, 1_000_000),
        }
    }

    /// One applied entry changing `key`'s index entry.
    fn set(&mut self, key: TimerKey, due: Option<Due>) {
        self.log_index += 1;
        match due {
            Some(d) => {
                if d.adopt_now(EPOCH) {
                    self.adoptable.insert((key.clone(), d.at_ms));
                }
                self.index.insert(key.clone(), d)
            }
            None => self.index.remove(&key),
        };
        self.changes.push_back((self.log_index, IndexChange { key, due }));
    }

    /// The state machine's `Fire` rule, reduced to the index.
    fn apply_fire(&mut self, key: &TimerKey, due_ms: u64) -> CommandResult {
        let Some(due) = self.index.get(key).copied() else {
            return CommandResult::Skipped { reason: SkipReason::NotFound };
        };
        if due.at_ms != due_ms {
            return CommandResult::Skipped { reason: SkipReason::Stale };
        }
        let pull = self.pull.contains(key);
        // A webhook timer's first fire may be armed ahead of its time: its
        // attempt starts at its time.
        let armed = due.kind == DueKind::Fire && !pull && due_ms > self.now;
        if due_ms > self.now && !due.adopt_now(EPOCH) && !(armed && due_ms - self.now <= MAX_ARM_AHEAD_MS) {
            return CommandResult::Skipped { reason: SkipReason::NotDue };
        }
        let start = if due.kind == DueKind::Fire { due_ms.max(self.now) } else { self.now };
        let next = match due.kind {
            DueKind::Ready => {
                // Re-offered; nothing changes.
                self.log_index += 1;
                self.offered.insert(key.clone());
                return dispatch();
            }
            _ if pull => Due { at_ms: self.now, kind: DueKind::Ready },
            _ => Due { at_ms: start + ATTEMPT_MS, kind: DueKind::Attempt { epoch: EPOCH, webhook: true } },
        };
        if !pull {
            self.starts.insert(key.clone(), start);
        }
        self.set(key.clone(), Some(next));
        if pull {
            // The same entry's dispatch offers it.
            self.offered.insert(key.clone());
        }
        dispatch()
    }

    fn step(&mut self, s: Step) {
        match s {
            Step::Create { k, delay_ms, pull } => {
                let key = key(k);
                if !self.index.contains_key(&key) && !self.offered.contains(&key) {
                    if pull {
                        self.pull.insert(key.clone());
                    } else {
                        self.pull.remove(&key);
                    }
                    // Half the pull timers have the index entry a store writes now,
                    // half the one written before scheduled pull timers were offered.
                    let kind = if pull && k % 2 == 0 { DueKind::PullFire } else { DueKind::Fire };
                    self.set(key, Some(Due { at_ms: self.now + delay_ms, kind }));
                }
            }
            Step::Orphan { k, delay_ms } => {
                let key = key(k);
                if !self.index.contains_key(&key) && !self.offered.contains(&key) {
                    self.pull.remove(&key);
                    let kind = DueKind::Attempt { epoch: EPOCH - 1, webhook: true };
                    self.set(key, Some(Due { at_ms: self.now + delay_ms, kind }));
                }
            }
            Step::Reschedule { k, delay_ms } => {
                let key = key(k);
                if let Some(kind) = self.index.get(&key).map(|d| d.kind).filter(|k| scheduled(*k)) {
                    self.set(key, Some(Due { at_ms: self.now + delay_ms, kind }));
                }
            }
            Step::Cancel { k } => {
                let key = key(k);
                if self.index.get(&key).is_some_and(|d| scheduled(d.kind)) {
                    self.set(key, None);
                }
            }
            Step::Advance { ms } => self.now += ms,
            Step::DeliverChanges { n } => {
                for _ in 0..n {
                    let Some((index, change)) = self.changes.pop_front() else { break };
                    self.core.on_change(index, change);
                }
            }
            Step::LoseChanges => {
                if !self.changes.is_empty() {
                    self.changes.clear();
                    self.overflowed = true;
                }
            }
            Step::ReadPage => {
                if let Some((from, before_ms, limit)) = self.load.take() {
                    self.page = Some((self.log_index, self.read_page(&from, before_ms, limit), before_ms));
                }
            }
            Step::AnswerPage => {
                if let Some((applied, entries, before_ms)) = self.page.take() {
                    self.core.on_page(applied, entries, before_ms);
                }
            }
            Step::ResolveFire { i, how } => {
                if self.fires.is_empty() {
                    return;
                }
                let (key, due_ms, offer) = self.fires.remove(i % self.fires.len());
                let outcome = if offer {
                    // The shell reads the record: still scheduled at that time, it
                    // is queued (a queued copy takes the newer due time).
                    let due = Due { at_ms: due_ms, kind: DueKind::PullFire };
                    if how < 2 && self.index.get(&key) == Some(&due) {
                        self.queued_due.insert(key.clone(), due_ms);
                        FireOutcome::Offered
                    } else {
                        FireOutcome::Unknown
                    }
                } else {
                    match how {
                        0 => {
                            let result = self.apply_fire(&key, due_ms);
                            FireOutcome::applied(self.log_index, &result)
                        }
                        1 => {
                            self.apply_fire(&key, due_ms);
                            FireOutcome::Unknown
                        }
                        _ => FireOutcome::Unknown,
                    }
                };
                let action = self.core.on_fire_outcome(key, due_ms, outcome, self.now);
                self.take(action.into_iter().collect());
            }
            Step::AnswerReread { i } => {
                if self.rereads.is_empty() {
                    return;
                }
                let key = self.rereads.remove(i % self.rereads.len());
                let due = self.index.get(&key).copied();
                self.core.on_reread(key, due, self.log_index, self.now);
            }
            Step::Deliver { k } => {
                let key = key(k);
                if self.index.get(&key).is_some_and(|d| matches!(d.kind, DueKind::Attempt { webhook: true, .. }))
                    && self.started(&key)
                {
                    self.set(key, None);
                }
            }
            Step::Consume { k, ack } => {
                let key = key(k);
                let reserved =
                    Due { at_ms: self.now + ATTEMPT_MS, kind: DueKind::Attempt { epoch: EPOCH, webhook: false } };
                if let Some(&due_ms) = self.queued_due.get(&key) {
                    // `FireReserve`: it fires and is reserved at once, if it is
                    // still scheduled at the time offered and that time has
                    // come; a stale copy is dropped, one not due yet waits.
                    match self.index.get(&key) {
                        Some(d) if *d == Due { at_ms: due_ms, kind: DueKind::PullFire } => {
                            if due_ms <= self.now {
                                self.queued_due.remove(&key);
                                self.set(key, (!ack).then_some(reserved));
                            }
                        }
                        _ => {
                            self.queued_due.remove(&key);
                        }
                    }
                } else if self.offered.contains(&key) && self.index.get(&key).is_some_and(|d| d.kind == DueKind::Ready)
                {
                    self.offered.remove(&key);
                    // An acked reservation finishes the timer; one left reserved
                    // comes due again when the reservation runs out.
                    self.set(key, (!ack).then_some(reserved));
                }
            }
            Step::Poll => {
                if std::mem::take(&mut self.overflowed) {
                    self.core.on_overflow();
                }
                let actions = self.core.poll(self.now, 16, 4);
                self.take(actions);
            }
        }
    }

    fn take(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Load { from, before_ms, limit } => {
                    assert!(self.load.is_none() && self.page.is_none(), "one load at a time");
                    self.load = Some((from, before_ms, limit));
                }
                Action::Fire(batch) => {
                    for (key, due_ms) in batch {
                        assert!(
                            due_ms <= self.now + ARM_AHEAD_MS || self.adoptable.contains(&(key.clone(), due_ms)),
                            "{key} proposed at {} for {due_ms}: early",
                            self.now
                        );
                        self.fires.push((key, due_ms, false));
                    }
                }
                Action::Offer(batch) => {
                    for (key, due_ms) in batch {
                        assert!(due_ms <= self.now, "{key} offered at {} for {due_ms}: early", self.now);
                        self.fires.push((key, due_ms, true));
                    }
                }
                Action::Reread(key) => self.rereads.push(key),
                Action::Stop => panic!("nothing in this model deposes the leader"),
            }
        }
    }

    /// Whether `key`'s webhook attempt has started: a receiver can answer
    /// only an attempt that was sent, and an armed one is sent at its start.
    fn started(&self, key: &TimerKey) -> bool {
        self.starts.get(key).is_none_or(|&start| start <= self.now)
    }

    fn read_page(&self, from: &LoadFrom, before_ms: u64, limit: usize) -> Vec<(DuePos, DueKind)> {
        let mut all: Vec<(DuePos, DueKind)> = self
            .index
            .iter()
            .map(|(k, d)| (DuePos { due_ms: d.at_ms, key: k.clone() }, d.kind))
            .filter(|(p, _)| p.due_ms < before_ms)
            .filter(|(p, _)| match from {
                LoadFrom::Time(t) => p.due_ms >= *t,
                LoadFrom::After(after) => p > after,
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.truncate(limit);
        all
    }

    /// No more faults: deliver everything, answer everything, consume and
    /// deliver everything, and let time run until the index must be empty.
    fn settle(&mut self) {
        let start = self.now;
        let end = self.now + 40_000;
        while self.now < end {
            // A second after the faults stop, nothing is more than a second
            // late: stale information left over from the faults may cost a
            // wasted `Fire`, never a delay.
            if self.now > start + 1_000 {
                let late: Vec<_> = self.index.iter().filter(|(_, d)| d.at_ms + 1_000 < self.now).collect();
                assert!(late.is_empty(), "late at {}: {late:?}", self.now);
            }
            self.step(Step::DeliverChanges { n: usize::MAX });
            self.step(Step::Poll);
            self.step(Step::ReadPage);
            self.step(Step::AnswerPage);
            while !self.fires.is_empty() {
                self.step(Step::ResolveFire { i: 0, how: 0 });
                self.step(Step::DeliverChanges { n: usize::MAX });
            }
            while !self.rereads.is_empty() {
                self.step(Step::AnswerReread { i: 0 });
            }
            // Receivers answer and consumers ack whatever reached them.
            let done: Vec<TimerKey> = self
                .index
                .iter()
                .filter(|(k, d)| {
                    (matches!(d.kind, DueKind::Attempt { webhook: true, .. }) && self.started(k))
                        || (d.kind == DueKind::Ready && self.offered.contains(*k))
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in done {
                self.offered.remove(&k);
                self.set(k, None);
            }
            // Consumers take and ack every scheduled offer that came due.
            let queued: Vec<usize> = (0..12).filter(|k| self.queued_due.contains_key(&key(*k))).collect();
            for k in queued {
                self.step(Step::Consume { k, ack: true });
            }
            self.step(Step::Advance { ms: 50 });
        }
    }
}

/// A scheduled timer's index entry: a webhook's, or a pull timer's (either
/// kind).
fn scheduled(kind: DueKind) -> bool {
    matches!(kind, DueKind::Fire | DueKind::PullFire)
}

fn dispatch() -> CommandResult {
    CommandResult::Dispatch { record: dummy_record() }
}

fn dummy_record() -> TimerRecord {
    TimerRecord {
        state: TimerState::Firing,
        fire_at_ms: 0,
        payload: bytes::Bytes::new(),
        labels: BTreeMap::new(),
        callback: tocsin_core::Callback::Pull { topic: "t".into(), ttr_ms: 0 },
        retry: Default::default(),
        skip_if_late_ms: 0,
        spec_digest: 0,
        generation: 1,
        created_at_ms: 0,
        created_index: 0,
        fire: None,
        finished_at_ms: 0,
        retention_ms: 0,
        attempts: Vec::new(),
        series: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn never_early_and_nothing_stranded(steps in prop::collection::vec(step(), 1..300)) {
        let mut world = World::new();
        for s in steps {
            world.step(s);
        }
        world.settle();
        prop_assert!(
            world.index.is_empty(),
            "stranded at {}: {:?} (core tracks {}, offered {:?})",
            world.now,
            world.index,
            world.core.tracked(),
            world.offered
        );
    }
}

/// Finding 6: a page boundary inside one millisecond, between keys whose
/// index order differs from their string order, must not skip a timer.
/// The paced tests' config: a 5 s hot window and `load_page` entries a
/// page, with the given retry and catch-up budgets.
fn paced_config(load_page: usize, retries_per_sec: u32, catch_up_after_ms: u64, catch_up_per_sec: u32) -> FireConfig {
    FireConfig {
        hot_window_ms: WINDOW_MS,
        load_page,
        max_tracked: 10_000,
        retry_delay_ms: 20,
        retries_per_namespace_per_sec: retries_per_sec,
        catch_up_after_ms,
        catch_up_per_namespace_per_sec: catch_up_per_sec,
        arm_ahead_ms: 0,
        arm_step_ms: 0,
    }
}

/// The keys a poll's actions fire, and the actions that are not fires.
fn split_fires(actions: Vec<Action>) -> (Vec<TimerKey>, Vec<Action>) {
    let mut keys = Vec::new();
    let mut rest = Vec::new();
    for a in actions {
        match a {
            Action::Fire(f) => keys.extend(f.into_iter().map(|(k, _)| k)),
            other => rest.push(other),
        }
    }
    (keys, rest)
}

/// The keys a poll's actions fire.
fn fired(actions: Vec<Action>) -> Vec<TimerKey> {
    split_fires(actions).0
}

#[test]
fn a_page_boundary_inside_one_millisecond_skips_nothing() {
    let mut world = World::new();
    let t = world.now + 100;
    // "b" sorts before "aa" in the index (shorter namespace first).
    for (ns, id) in [("b", "1"), ("aa", "0"), ("aa", "2"), ("b", "3"), ("cc", "4")] {
        world.set(TimerKey::new(ns, id), Some(Due { at_ms: t, kind: DueKind::Fire }));
    }
    world.changes.clear();
    world.settle();
    assert!(world.index.is_empty(), "stranded: {:?}", world.index);
}

/// Finding 5: a `Fire` that comes back `NotDue` after a reschedule moved
/// the timer must not put the old time back.
#[test]
fn a_late_fire_outcome_never_overwrites_a_newer_due_time() {
    let mut world = World::new();
    let key = key(0);
    world.set(key.clone(), Some(Due { at_ms: world.now, kind: DueKind::Fire }));
    world.changes.clear();
    world.step(Step::Poll);
    world.step(Step::ReadPage);
    world.step(Step::AnswerPage);
    world.step(Step::Poll);
    assert_eq!(world.fires.len(), 1);
    // The reschedule lands first, and its change reaches the core.
    let later = world.now + 2_000;
    world.set(key.clone(), Some(Due { at_ms: later, kind: DueKind::Fire }));
    world.step(Step::DeliverChanges { n: 10 });
    // Then the stale fire's outcome arrives: it must change nothing.
    let (k, due, _) = world.fires.pop().unwrap();
    let action = world.core.on_fire_outcome(
        k,
        due,
        FireOutcome::Applied { index: world.log_index, skipped: Some(SkipReason::NotDue) },
        world.now,
    );
    assert_eq!(action, None);
    world.step(Step::Advance { ms: 1_000 });
    world.step(Step::Poll);
    assert!(world.fires.is_empty(), "fired at the old time: {:?}", world.fires);
    world.step(Step::Advance { ms: 1_000 });
    world.step(Step::Poll);
    assert_eq!(world.fires, vec![(key, later, false)]);
}

/// A backlog of retries (a receiver came back) drains at the namespace's
/// retry budget; first fires, of this namespace or any other, and pull
/// reservations that ran out (consumers that left) are never held behind it.
#[test]
fn retries_are_paced_and_first_fires_are_not() {
    let config = paced_config(1_000, 10, 0, 0);
    let now = 1_000_000;
    let mut core = FireCore::new(config, EPOCH, now);
    let mut entries = Vec::new();
    for i in 0..100 {
        let key = TimerKey::new("down", format!("r-{i}"));
        entries.push((DuePos { due_ms: now - 5_000, key }, DueKind::Retry));
    }
    for i in 0..20 {
        let key = TimerKey::new("other", format!("f-{i}"));
        entries.push((DuePos { due_ms: now, key }, DueKind::Fire));
    }
    for i in 0..50 {
        let key = TimerKey::new("down", format!("reserved-{i}"));
        entries.push((DuePos { due_ms: now - 1, key }, DueKind::Attempt { epoch: EPOCH, webhook: false }));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let _ = core.poll(now, 0, 100);
    core.on_page(1, entries, now + WINDOW_MS);
    // Phase: at once, every first fire and one second's worth of retries.
    let first = fired(core.poll(now, 10_000, 100));
    assert_eq!(first.iter().filter(|k| k.namespace == "other").count(), 20);
    assert_eq!(first.iter().filter(|k| k.id.starts_with("reserved-")).count(), 50);
    assert_eq!(first.iter().filter(|k| k.id.starts_with("r-")).count(), 10);
    assert_eq!(core.deferred(), 90);
    // Phase: then ten a second, oldest first, until the backlog is gone.
    let mut t = now;
    let mut drained = 10;
    while core.deferred() > 0 {
        let wake = core.next_wake_ms().expect("deferred retries wake the loop");
        assert!(wake > t && wake <= t + 100, "wake {} after {t}", wake - t);
        t = wake;
        drained += fired(core.poll(t, 10_000, 100)).len();
    }
    assert_eq!(drained, 100);
    let took_ms = t - now;
    assert!((8_900..=9_100).contains(&took_ms), "90 deferred retries at 10/s took {took_ms} ms");
}

/// After an outage, first fires later than `catch_up_after_ms` drain at
/// the namespace's catch-up rate, oldest first; fires on time, of this
/// namespace or another, are not held behind them.
#[test]
fn a_late_backlog_catches_up_at_its_namespace_rate() {
    let config = paced_config(1_000, 10, 60_000, 20);
    let now = 10_000_000;
    let mut core = FireCore::new(config, EPOCH, now);
    let mut entries = Vec::new();
    for i in 0..100 {
        // Due 2 to 3 minutes ago: the node was down.
        let key = TimerKey::new("backlog", format!("late-{i:03}"));
        entries.push((DuePos { due_ms: now - 180_000 + i * 600, key }, DueKind::Fire));
    }
    for i in 0..10 {
        // Late, but within the bound: not catch-up.
        let key = TimerKey::new("backlog", format!("recent-{i}"));
        entries.push((DuePos { due_ms: now - 30_000, key }, DueKind::Fire));
    }
    for i in 0..10 {
        let key = TimerKey::new("other", format!("late-{i}"));
        entries.push((DuePos { due_ms: now - 120_000, key }, DueKind::Fire));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let _ = core.poll(now, 0, 100);
    core.on_page(1, entries, now + WINDOW_MS);
    // Phase: at once, the recent ones and a second's worth per namespace.
    let first = fired(core.poll(now, 10_000, 100));
    assert_eq!(first.iter().filter(|k| k.id.starts_with("recent-")).count(), 10);
    assert_eq!(first.iter().filter(|k| k.namespace == "other").count(), 10, "its own budget");
    let late: Vec<&TimerKey> = first.iter().filter(|k| k.namespace == "backlog" && k.id.starts_with("late-")).collect();
    assert_eq!(late.len(), 20);
    assert_eq!(core.stats().catch_up_deferred, 80);
    // Phase: then twenty a second, in due order.
    let mut order: Vec<String> = late.iter().map(|k| k.id.clone()).collect();
    let mut t = now;
    while core.deferred() > 0 {
        t = core.next_wake_ms().expect("deferred fires wake the loop");
        order.extend(fired(core.poll(t, 10_000, 100)).into_iter().map(|k| k.id));
    }
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "oldest first");
    assert_eq!(order.len(), 100);
    let took_ms = t - now;
    assert!((3_900..=4_100).contains(&took_ms), "80 deferred fires at 20/s took {took_ms} ms");
}

/// The fire path is behind while due timers stay in the wheel for want of
/// fire budget, and only then: not for late timers it hands over at once
/// (created with a past fire time), nor for retries waiting for their
/// namespace's retry budget. `behind_ms` is how long it has been so.
#[test]
fn the_fire_path_is_behind_only_while_the_fire_budget_leaves_due_timers() {
    let config = paced_config(10_000, 10, 0, 0);
    let now = 10_000_000;
    let mut core = FireCore::new(config, EPOCH, now);
    let mut entries = Vec::new();
    // Created an hour late: due long ago, yet nothing is short.
    for i in 0..50 {
        entries
            .push((DuePos { due_ms: now - 3_600_000, key: TimerKey::new("late", format!("l-{i:02}")) }, DueKind::Fire));
    }
    // A receiver outage's retries: paced, not the fire path's backlog.
    for i in 0..200 {
        entries.push((DuePos { due_ms: now - 1_000, key: TimerKey::new("down", format!("r-{i:03}")) }, DueKind::Retry));
    }
    // A burst due in one millisecond, a second from now.
    for i in 0..1_000 {
        entries.push((DuePos { due_ms: now + 1_000, key: TimerKey::new("burst", format!("b-{i:04}")) }, DueKind::Fire));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let fired_count = |actions: Vec<Action>| fired(actions).len();
    let _ = core.poll(now, 0, 100);
    core.on_page(1, entries, now + WINDOW_MS);
    // Phase: the late ones and a second of retries go at once; the rest of
    // the retries wait for their budget, and that is not being behind.
    assert_eq!(fired_count(core.poll(now, 400, 100)), 60);
    assert_eq!(core.behind_ms(), 0);
    assert_eq!(core.deferred(), 190);
    assert_eq!(fired_count(core.poll(now + 500, 400, 100)), 5);
    assert_eq!(core.behind_ms(), 0, "paced retries are not the fire path's backlog");
    // Phase: the burst comes due with a budget of 300 per poll.
    let t = now + 1_000;
    assert!(fired_count(core.poll(t, 300, 100)) <= 300);
    assert_eq!(core.behind_ms(), 0, "behind since this poll");
    assert_eq!(fired_count(core.poll(t + 40, 0, 100)), 0, "batches in flight: no budget");
    assert_eq!(core.behind_ms(), 40);
    assert_eq!(fired_count(core.poll(t + 90, 300, 100)), 300);
    assert_eq!(core.behind_ms(), 90);
    // Phase: the budget catches up with the burst, and the fire path is
    // not behind any more.
    let mut at = t + 90;
    while core.in_wheel() > 0 {
        at += 10;
        let _ = core.poll(at, 300, 100);
    }
    assert_eq!(core.behind_ms(), 0, "everything due was handed over at {}", at - t);
    // An empty budget with nothing due is not behind either.
    let _ = core.poll(at + 10, 0, 100);
    assert_eq!(core.behind_ms(), 0);
}

/// A paused namespace fires nothing: its due timers are let go (they stay
/// in the index); the others fire as usual. On resume the loader reads the
/// index from the start again and they fire, late.
#[test]
fn a_paused_namespace_fires_nothing_until_resumed() {
    let config = paced_config(1_000, 0, 0, 0);
    let now = 5_000_000;
    let mut core = FireCore::new(config, EPOCH, now);
    core.set_paused(["paused".to_string()].into());
    let entries: Vec<(DuePos, DueKind)> = (0..10)
        .map(|i| {
            let ns = if i % 2 == 0 { "paused" } else { "live" };
            (DuePos { due_ms: now + i * 10, key: TimerKey::new(ns, format!("t-{i}")) }, DueKind::Fire)
        })
        .collect();
    let _ = core.poll(now, 0, 100);
    core.on_page(1, entries.clone(), now + WINDOW_MS);
    // Phase: paused for a minute: only the live namespace fires.
    let (keys, rest) = split_fires(core.poll(now + 60_000, 10_000, 100));
    assert_eq!(keys.len(), 5);
    assert!(keys.iter().all(|k| k.namespace == "live"));
    // The window moved on: answer its page (nothing new in it).
    for action in rest {
        if let Action::Load { before_ms, .. } = action {
            core.on_page(2, Vec::new(), before_ms);
        }
    }
    assert_eq!(core.stats().paused_let_go, 5);
    assert_eq!(core.tracked(), 5, "only the live ones are proposed and tracked");
    // Phase: resumed: the next poll loads the index from the start, and the
    // page (the paused timers are still in it) fires them.
    core.set_paused(Default::default());
    let (keys, rest) = split_fires(core.poll(now + 60_001, 10_000, 100));
    assert!(keys.is_empty());
    assert!(matches!(rest.as_slice(), [Action::Load { from: tocsin_core::fire::LoadFrom::Time(0), .. }]), "{rest:?}");
    let paused_entries: Vec<_> = entries.into_iter().filter(|(p, _)| p.key.namespace == "paused").collect();
    core.on_page(3, paused_entries, now + 60_001 + WINDOW_MS);
    let (keys, _) = split_fires(core.poll(now + 60_002, 10_000, 100));
    assert_eq!(keys.len(), 5);
    assert!(keys.iter().all(|k| k.namespace == "paused"));
}
