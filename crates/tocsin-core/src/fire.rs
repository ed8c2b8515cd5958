//! The shard leader's fire-loop decisions, as a pure state machine.
//!
//! The leader keeps the part of the fire-time index due within its hot
//! window in a timing wheel, and proposes a `Fire` for every entry whose time
//! has come. [`FireCore`] makes every decision of that loop; the node's
//! `leader.rs` only carries out its [`Action`]s (scan a page of the index,
//! propose `Fire`s, re-read one timer) and feeds back what happened. There
//! is no clock and no I/O in here: time arrives as `now_ms`.
//!
//! **What it knows.** Every timer the core tracks is in exactly one of two
//! states: waiting in the wheel for its time, or proposed (a `Fire` is on
//! its way through Raft). Three sources tell it where timers are:
//! - pages of the fire-time index, read in index order behind a cursor
//!   ([`FireCore::on_page`]);
//! - the applied log, in log order, one [`IndexChange`] per timer whose
//!   index entry moved ([`FireCore::on_change`]), whether or not anyone
//!   waits for the command that moved it;
//! - a re-read of one timer ([`FireCore::on_reread`]), which the core asks
//!   for whenever an outcome is unknown, instead of guessing.
//!
//! Every piece of information carries the log index it reflects, and older
//! information never overwrites newer: a page read before a reschedule was
//! applied cannot move the timer back to its old time, and a `Fire` that
//! comes back after the timer moved cannot put the old time back.
//!
//! **Why nothing is stranded.** Everything in the index up to the cursor is
//! either tracked or gone, because a page covers everything before the
//! cursor and every later change arrives as an [`IndexChange`] (or, if
//! changes were lost, [`FireCore::on_overflow`] makes the loader start
//! again). A tracked timer leaves the core only when the applied log says
//! its entry moved or went, or when a `Fire`'s applied result says a pull
//! timer is now offered to consumers, or when a scheduled pull timer whose
//! time came was handed to its topic's consumers ([`Action::Offer`]): the
//! consumer's reservation fires it, and until then it is still in the
//! index, where a new leader or a rescan finds it. Every other outcome (not applied,
//! unknown, skipped) puts it back in the wheel or re-reads it.

use std::collections::HashMap;
use std::collections::VecDeque;

use tocsin_wheel::Handle;
use tocsin_wheel::Wheel;

use crate::command::CommandResult;
use crate::command::SkipReason;

impl FireOutcome {
    /// The outcome of a `Fire` that was applied with `result`.
    pub fn applied(index: u64, result: &CommandResult) -> FireOutcome {
        let skipped = match result {
            CommandResult::Skipped { reason } => Some(*reason),
            _ => None,
        };
        FireOutcome::Applied { index, skipped }
    }
}
use crate::timer::Due;
use crate::timer::DueKind;
use crate::timer::DuePos;
use crate::timer::TimerKey;

/// How the core is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FireConfig {
    /// Only entries due before `now + hot_window_ms` are loaded.
    pub hot_window_ms: u64,
    /// Entries per page of the index.
    pub load_page: usize,
    /// Past this many tracked timers the loader waits.
    pub max_tracked: usize,
    /// After an unknown outcome or a `NotDue`, the next `Fire` of the timer
    /// waits at least this long (so a full proposal queue is not hammered).
    pub retry_delay_ms: u64,
    /// Retries (a backoff's end, an attempt's deadline) started per second per
    /// namespace by this shard's leader; 0: unlimited. First fires are not held by
    /// it (only catch-up pacing holds them, below); a backlog of retries after a
    /// receiver outage drains at this pace instead of starving every other
    /// namespace.
    pub retries_per_namespace_per_sec: u32,
    /// A first fire later than this is catch-up (after an outage, a
    /// backlog), paced per namespace at `catch_up_per_namespace_per_sec`
    /// so a backlog does not stampede its receivers; 0: never.
    pub catch_up_after_ms: u64,
    /// Catch-up fires started per second per namespace by this shard's
    /// leader; 0: unlimited.
    pub catch_up_per_namespace_per_sec: u32,
    /// A push timer's first `Fire` is proposed up to this long before its
    /// time, to be armed (`crate::arm`); 0: at its time. At most
    /// [`crate::limits::MAX_ARM_AHEAD_MS`].
    pub arm_ahead_ms: u64,
    /// Timers due within this much of each other are armed together, in
    /// one batch ([`crate::arm::arm_at`]).
    pub arm_step_ms: u64,
}

/// What a paced `Fire` is: each namespace has a budget for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Pace {
    /// A retry (a backoff's end, this leader's own attempt deadline).
    Retry,
    /// A first fire later than `catch_up_after_ms`.
    CatchUp,
}

/// Namespaces with a retry budget, at most; past it the idle ones go.
const MAX_BUDGETS: usize = 10_000;

/// A token bucket: `rate` per second, holding at most a second's worth.
#[derive(Clone, Copy, Debug)]
struct Budget {
    tokens: f64,
    at_ms: u64,
}

impl Budget {
    fn refill(&mut self, rate: f64, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.at_ms) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * rate).min(rate.max(1.0));
        self.at_ms = self.at_ms.max(now_ms);
    }
}

/// One timer's new place in the fire-time index, as an applied entry left
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexChange {
    pub key: TimerKey,
    /// `None`: the timer left the index (finished, cancelled, purged).
    pub due: Option<Due>,
}

/// What became of a proposed `Fire`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FireOutcome {
    /// Applied at this log index: it took effect (`skipped: None`: an attempt
    /// started, the timer became ready or died), or was skipped for this
    /// reason.
    Applied { index: u64, skipped: Option<SkipReason> },
    /// Not applied, or unknown whether it was (timeout, full queue, quorum
    /// lost, entry discarded).
    Unknown,
    /// This node no longer leads the shard.
    NotLeader,
    /// A scheduled pull timer of an [`Action::Offer`] was handed to its
    /// topic's consumers.
    Offered,
}

/// Where a page of the index starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadFrom {
    /// The first entry due at or after this time.
    Time(u64),
    /// The first entry after this position.
    After(DuePos),
}

/// What the shell must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Read index entries from `from` and due before `before_ms`, at most
    /// `limit`, in index order, and call [`FireCore::on_page`].
    Load { from: LoadFrom, before_ms: u64, limit: usize },
    /// Propose these `Fire`s (`(key, due_ms)`) and report each outcome with
    /// [`FireCore::on_fire_outcome`].
    Fire(Vec<(TimerKey, u64)>),
    /// Offer these scheduled pull timers (`(key, due_ms)`, index entries of
    /// kind [`DueKind::PullFire`]) to their topics' consumers, whose
    /// reservations fire them, and report each with
    /// [`FireCore::on_fire_outcome`]: `Offered` once offered (the consumers
    /// own it then, as they own a ready timer), `Unknown` if it could not
    /// be.
    Offer(Vec<(TimerKey, u64)>),
    /// Read this timer's record and call [`FireCore::on_reread`].
    Reread(TimerKey),
    /// A `Fire` met a newer epoch: this leader is deposed and must stop.
    Stop,
}

/// Where the loader stands in the index.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cursor {
    /// Every entry due before this time is covered.
    Before(u64),
    /// Every entry at or before this position is covered.
    After(DuePos),
}

impl Cursor {
    fn covers(&self, pos: &DuePos) -> bool {
        match self {
            Cursor::Before(t) => pos.due_ms < *t,
            Cursor::After(p) => pos <= p,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// In the wheel; its index entry is `due`.
    Waiting { handle: Handle, due: Due },
    /// A `Fire` for `due` is proposed.
    Proposed { due: Due },
    /// A re-read is outstanding; until it answers, nothing is proposed.
    Rereading,
    /// A retry whose time came, waiting in its namespace's queue for the
    /// retry budget.
    Deferred { due: Due },
}

#[derive(Clone, Copy, Debug)]
struct Tracked {
    state: State,
    /// The log index the latest information about this timer reflects.
    seen_index: u64,
    /// The apply rules refused to arm its fire ahead of time (`NotDue`):
    /// it waits for its time instead.
    unarmable: bool,
}

/// Counters for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FireStats {
    pub proposed: u64,
    pub rereads: u64,
    pub stale_info_ignored: u64,
    pub rescans: u64,
    /// Retries that waited for their namespace's retry budget.
    pub retries_deferred: u64,
    /// Late first fires that waited for their namespace's catch-up budget.
    pub catch_up_deferred: u64,
    /// Due timers of paused namespaces let go (read again on resume).
    pub paused_let_go: u64,
}

/// The fire loop's state: see the module documentation.
pub struct FireCore {
    config: FireConfig,
    epoch: u64,
    wheel: Wheel<TimerKey>,
    tracked: HashMap<TimerKey, Tracked>,
    cursor: Cursor,
    /// Retry and catch-up budgets and the fires waiting for them, per
    /// namespace.
    budgets: HashMap<(Pace, String), Budget>,
    deferred: HashMap<(Pace, String), VecDeque<TimerKey>>,
    /// The bound of the outstanding `Load`, if one is outstanding.
    loading: Option<u64>,
    /// Start the loader again from the beginning once the outstanding page
    /// is in (changes were lost).
    rescan: bool,
    /// Namespaces whose firing is paused (the cluster map's).
    paused: std::collections::HashSet<String>,
    stats: FireStats,
    /// The largest `now_ms` polled with. The node follows a confirmed
    /// backward step of its wall clock, but the wheel has already passed the
    /// old time: the core keeps to the shard's time, which never goes
    /// backwards (the stamps apply checks "never early" against do not either).
    clock_ms: u64,
    /// Since when every poll has left due timers in the wheel for want of
    /// fire budget (the `Fire` batches in flight are at their bound): the
    /// fire path is behind, and the node sheds creates to the shard once
    /// this has lasted (see [`FireCore::behind_ms`]).
    behind_since_ms: Option<u64>,
}

impl FireCore {
    /// A core for a leader firing under `epoch`, starting at `now_ms` with
    /// nothing loaded.
    pub fn new(config: FireConfig, epoch: u64, now_ms: u64) -> FireCore {
        FireCore {
            config,
            epoch,
            wheel: Wheel::new(now_ms),
            tracked: HashMap::new(),
            cursor: Cursor::Before(0),
            budgets: HashMap::new(),
            deferred: HashMap::new(),
            loading: None,
            rescan: false,
            paused: std::collections::HashSet::new(),
            stats: FireStats::default(),
            clock_ms: now_ms,
            behind_since_ms: None,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Timers tracked (in the wheel, proposed or being re-read).
    pub fn tracked(&self) -> usize {
        self.tracked.len()
    }

    /// Timers waiting in the wheel.
    pub fn in_wheel(&self) -> usize {
        self.wheel.len()
    }

    pub fn stats(&self) -> FireStats {
        self.stats
    }

    /// How far ahead of `now_ms` the loader has covered the index (0 while
    /// it is still paging through the past).
    pub fn loaded_until_ms(&self) -> u64 {
        match &self.cursor {
            Cursor::Before(t) => *t,
            Cursor::After(p) => p.due_ms,
        }
    }

    /// How long the fire path has been behind, as of the last
    /// [`poll`](Self::poll): every poll for that long left timers that were
    /// due in the wheel because the fire budget ran out. 0 when the last poll
    /// handed over everything due. Lateness itself would be the wrong
    /// measure: a timer created with a past fire time, or one of a resumed
    /// namespace, is late without the fire path being short of anything;
    /// paced retries and catch-up fires wait for their namespace's budget,
    /// not the fire budget, and do not count either.
    pub fn behind_ms(&self) -> u64 {
        self.behind_since_ms.map_or(0, |since| self.clock_ms.saturating_sub(since))
    }

    /// Retries waiting for their namespace's budget.
    pub fn deferred(&self) -> usize {
        self.deferred.values().map(VecDeque::len).sum()
    }

    /// When [`poll`](Self::poll) may next have something to do, if anything
    /// is waiting.
    pub fn next_wake_ms(&self) -> Option<u64> {
        let budget_ms = self
            .deferred
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(pace_ns, _)| {
                let rate = self.rate(pace_ns.0);
                let b = self.budgets.get(pace_ns).copied().unwrap_or(Budget { tokens: 0.0, at_ms: 0 });
                // When the next whole token is in.
                b.at_ms + ((1.0 - b.tokens).max(0.0) * 1000.0 / rate.max(1.0)).ceil() as u64
            })
            .min();
        match (self.wheel.next_poll_ms(), budget_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The applied log moved `change.key`'s index entry; `index` is the log
    /// index of the entry that did.
    pub fn on_change(&mut self, index: u64, change: IndexChange) {
        let IndexChange { key, due } = change;
        if !self.newer(&key, index) {
            return;
        }
        match due {
            // A pull timer became ready in this entry: the same entry's dispatch
            // offered it to the topic's consumers, which own it from now on.
            Some(Due { kind: DueKind::Ready, .. }) => self.forget(&key),
            Some(due) if self.in_range(&DuePos { due_ms: due.at_ms, key: key.clone() }) => {
                self.wait(key, due, index, 0)
            }
            // Beyond the cursor: the loader will find it where it is now.
            Some(_) => self.forget(&key),
            None => self.forget(&key),
        }
    }

    /// A page of the index, read at `applied_index`, in index order, for the
    /// last [`Action::Load`]. `before_ms` is that action's bound.
    pub fn on_page(&mut self, applied_index: u64, entries: Vec<(DuePos, DueKind)>, before_ms: u64) {
        self.loading = None;
        let full = entries.len() >= self.config.load_page;
        let last = entries.last().map(|(pos, _)| pos.clone());
        for (pos, kind) in entries {
            let key = pos.key;
            if !self.newer(&key, applied_index) {
                continue;
            }
            if let Some(t) = self.tracked.get(&key)
                && matches!(t.state, State::Proposed { due } | State::Deferred { due } if due.at_ms == pos.due_ms)
            {
                // Already on its way (its outcome decides), or waiting for its
                // retry budget.
                continue;
            }
            self.wait(key, Due { at_ms: pos.due_ms, kind }, applied_index, 0);
        }
        if self.rescan {
            self.rescan = false;
            self.cursor = Cursor::Before(0);
            return;
        }
        self.cursor = match (full, last) {
            (true, Some(pos)) => Cursor::After(pos),
            _ => Cursor::Before(before_ms),
        };
    }

    /// The answer to an [`Action::Reread`]: the timer's index entry as of
    /// `applied_index`.
    pub fn on_reread(&mut self, key: TimerKey, due: Option<Due>, applied_index: u64, now_ms: u64) {
        let rereading = self.tracked.get(&key).is_some_and(|t| t.state == State::Rereading);
        let floor = if rereading {
            // The re-read answers the question it was asked for, however old the
            // entry it saw: nothing newer arrived meanwhile, or the state would
            // have moved on from `Rereading`.
            self.tracked.remove(&key);
            now_ms.saturating_add(self.config.retry_delay_ms)
        } else if self.newer(&key, applied_index) {
            0
        } else {
            return;
        };
        match due {
            Some(due) if self.in_range(&DuePos { due_ms: due.at_ms, key: key.clone() }) => {
                self.wait(key, due, applied_index, floor)
            }
            _ => self.forget(&key),
        }
    }

    /// What became of the `Fire` proposed for `(key, due_ms)`.
    pub fn on_fire_outcome(&mut self, key: TimerKey, due_ms: u64, outcome: FireOutcome, now_ms: u64) -> Option<Action> {
        let t = self.tracked.get(&key)?;
        let State::Proposed { due } = t.state else { return None };
        if due.at_ms != due_ms {
            // Newer information arrived while the fire was on its way.
            return None;
        }
        let seen_index = t.seen_index;
        match outcome {
            FireOutcome::NotLeader => Some(Action::Stop),
            FireOutcome::Applied { skipped: Some(SkipReason::StaleEpoch), .. } => Some(Action::Stop),
            FireOutcome::Applied { index, skipped: Some(SkipReason::NotDue) } if due.at_ms > now_ms => {
                // Proposed ahead of its time to be armed, and not armable (a pull
                // timer's entry of an older format, a retry window that ends
                // before its time): it waits for its time.
                self.tracked.remove(&key);
                self.wait_unarmed(key, due, index.max(seen_index), 0);
                None
            }
            FireOutcome::Applied { index, skipped: Some(SkipReason::NotDue) } => {
                // The entry is where it was (the leader's stamp was behind): try
                // again a little later.
                self.tracked.remove(&key);
                self.wait(key, due, index.max(seen_index), now_ms.saturating_add(self.config.retry_delay_ms));
                None
            }
            FireOutcome::Offered => {
                // The consumers own it now, as they own a ready timer: the
                // reservation that fires it moves its index entry, and the
                // applied log says so.
                self.forget(&key);
                None
            }
            FireOutcome::Applied { skipped: None, .. } => {
                // Applied: the same entry's index change (or, for a ready pull
                // timer, its dispatch) says what comes next. If that change was
                // lost, the rescan that follows every loss finds it.
                self.forget(&key);
                None
            }
            FireOutcome::Applied { .. } | FireOutcome::Unknown => {
                // Moved on (stale, not found), or no idea whether it applied:
                // look rather than guess.
                self.stats.rereads += 1;
                self.tracked.get_mut(&key).expect("checked").state = State::Rereading;
                Some(Action::Reread(key))
            }
        }
    }

    /// Changes from the applied log were lost: load the index again from the
    /// start (what is tracked stays; pages refresh it).
    /// The namespaces whose firing is paused now. A paused namespace's
    /// timers are let go when their time comes (they stay in the index, so
    /// nothing of them lives only here); when one is resumed, the loader
    /// reads the index again from the start and finds them, late, paced
    /// as catch-up.
    pub fn set_paused(&mut self, paused: std::collections::HashSet<String>) {
        let resumed = self.paused.iter().any(|ns| !paused.contains(ns));
        self.paused = paused;
        if resumed {
            self.on_overflow();
        }
    }

    pub fn on_overflow(&mut self) {
        self.stats.rescans += 1;
        if self.loading.is_some() {
            self.rescan = true;
        } else {
            self.cursor = Cursor::Before(0);
        }
    }

    /// Everything to do at `now_ms`: a page to load, and up to
    /// `fire_budget` `Fire`s (in batches of at most `batch`).
    pub fn poll(&mut self, now_ms: u64, fire_budget: usize, batch: usize) -> Vec<Action> {
        let now_ms = now_ms.max(self.clock_ms);
        self.clock_ms = now_ms;
        let mut actions = Vec::new();
        let bound = now_ms.saturating_add(self.config.hot_window_ms);
        // The loader moves the window forward in steps of an eighth of it,
        // not on every poll: on an idle shard each load is an empty index
        // scan, and one per tick per shard was most of an idle node's work.
        // What lies between the cursor and the bound is still at least 7/8 of
        // the window away, and the next load finds whatever lands there.
        let step = self.config.hot_window_ms / 8;
        let caught_up = matches!(self.cursor, Cursor::Before(t) if t.saturating_add(step) >= bound);
        if self.loading.is_none() && !caught_up && self.tracked.len() < self.config.max_tracked {
            self.loading = Some(bound);
            let from = match &self.cursor {
                Cursor::Before(t) => LoadFrom::Time(*t),
                Cursor::After(p) => LoadFrom::After(p.clone()),
            };
            actions.push(Action::Load { from, before_ms: bound, limit: self.config.load_page });
        }
        let mut budget = fire_budget;
        let mut fires: Vec<(TimerKey, Due)> = Vec::new();
        // Retries whose budget came back first: they have waited longest.
        self.release_deferred(now_ms, &mut budget, &mut fires);
        while budget > 0 {
            let Some((_, key)) = self.wheel.poll(now_ms) else { break };
            let Some(State::Waiting { due, .. }) = self.tracked.get(&key).map(|t| t.state) else {
                unreachable!("every wheel entry is tracked as waiting")
            };
            // Never early: the wheel yields nothing before its time, and an
            // entry is in the wheel before its time only when adopted from
            // an earlier leader, or to be armed (its attempt starts at its
            // time whenever the `Fire` is applied).
            debug_assert!(due.at_ms <= now_ms || due.adopt_now(self.epoch) || self.arms(&due));
            // Checked per fire: skip the hash when nothing is paused.
            if !self.paused.is_empty() && self.paused.contains(&key.namespace) {
                self.tracked.remove(&key);
                self.stats.paused_let_go += 1;
                continue;
            }
            let deferred = self.pace_of(&due, now_ms).filter(|&pace| !self.take_token(pace, &key.namespace, now_ms));
            let t = self.tracked.get_mut(&key).expect("tracked");
            if let Some(pace) = deferred {
                t.state = State::Deferred { due };
                match pace {
                    Pace::Retry => self.stats.retries_deferred += 1,
                    Pace::CatchUp => self.stats.catch_up_deferred += 1,
                }
                self.deferred.entry((pace, key.namespace.clone())).or_default().push_back(key);
                continue;
            }
            t.state = State::Proposed { due };
            fires.push((key, due));
            budget -= 1;
        }
        let behind = budget == 0 && self.wheel.next_poll_ms().is_some_and(|at| at <= now_ms);
        self.behind_since_ms = if behind { Some(self.behind_since_ms.unwrap_or(now_ms)) } else { None };
        self.stats.proposed += fires.len() as u64;
        // A scheduled pull timer is offered, not fired: the consumer's
        // reservation fires it. Everything else is a `Fire`.
        let (offers, fires): (Vec<_>, Vec<_>) = fires.into_iter().partition(|(_, due)| due.kind == DueKind::PullFire);
        let batches: [(Vec<(TimerKey, Due)>, fn(Vec<(TimerKey, u64)>) -> Action); 2] =
            [(fires, Action::Fire), (offers, Action::Offer)];
        for (group, action) in batches {
            let mut group: Vec<(TimerKey, u64)> = group.into_iter().map(|(key, due)| (key, due.at_ms)).collect();
            while !group.is_empty() {
                let rest = group.split_off(group.len().min(batch.max(1)));
                actions.push(action(std::mem::replace(&mut group, rest)));
            }
        }
        actions
    }

    /// Whether `due` starts a retry: the end of a backoff, or the deadline
    /// of this leader's own webhook attempt (an adopted attempt of an earlier
    /// leader is failover, not a retry). A pull reservation that runs out is
    /// not paced: it only makes the timer offerable again, consumers pull at
    /// their own rate, and the time-to-run is a promise to them.
    fn is_retry(&self, due: &Due) -> bool {
        self.config.retries_per_namespace_per_sec > 0
            && match due.kind {
                DueKind::Retry => true,
                DueKind::Attempt { epoch, webhook } => webhook && epoch >= self.epoch,
                DueKind::Fire | DueKind::PullFire | DueKind::Ready => false,
            }
    }

    /// Whether a `Fire` for `due` at `now_ms` is paced, and by which budget.
    fn pace_of(&self, due: &Due, now_ms: u64) -> Option<Pace> {
        if self.is_retry(due) {
            return Some(Pace::Retry);
        }
        let late = matches!(due.kind, DueKind::Fire | DueKind::PullFire)
            && self.config.catch_up_after_ms > 0
            && self.config.catch_up_per_namespace_per_sec > 0
            && now_ms.saturating_sub(due.at_ms) > self.config.catch_up_after_ms;
        late.then_some(Pace::CatchUp)
    }

    fn rate(&self, pace: Pace) -> f64 {
        f64::from(match pace {
            Pace::Retry => self.config.retries_per_namespace_per_sec,
            Pace::CatchUp => self.config.catch_up_per_namespace_per_sec,
        })
    }

    fn take_token(&mut self, pace: Pace, namespace: &str, now_ms: u64) -> bool {
        let rate = self.rate(pace);
        let key = (pace, namespace.to_string());
        if !self.budgets.contains_key(&key) && self.budgets.len() >= MAX_BUDGETS {
            // Bounded: forget the namespaces with a full bucket and no queue.
            let (deferred, retry_rate, catch_up_rate) =
                (&self.deferred, self.rate(Pace::Retry), self.rate(Pace::CatchUp));
            self.budgets.retain(|k, b| {
                let rate = if k.0 == Pace::Retry { retry_rate } else { catch_up_rate };
                b.refill(rate, now_ms);
                b.tokens < rate.max(1.0) || deferred.get(k).is_some_and(|q| !q.is_empty())
            });
        }
        let b = self.budgets.entry(key).or_insert(Budget { tokens: rate.max(1.0), at_ms: now_ms });
        b.refill(rate, now_ms);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Moves deferred fires whose namespace has budget again to `fires`.
    fn release_deferred(&mut self, now_ms: u64, budget: &mut usize, fires: &mut Vec<(TimerKey, Due)>) {
        let namespaces: Vec<(Pace, String)> = self.deferred.keys().cloned().collect();
        for ns in namespaces {
            if !self.paused.is_empty() && self.paused.contains(&ns.1) {
                for key in self.deferred.remove(&ns).unwrap_or_default() {
                    if matches!(self.tracked.get(&key).map(|t| t.state), Some(State::Deferred { .. })) {
                        self.tracked.remove(&key);
                        self.stats.paused_let_go += 1;
                    }
                }
                continue;
            }
            while *budget > 0 {
                let Some(key) = self.deferred.get(&ns).and_then(|q| q.front().cloned()) else { break };
                // Skip what moved on while it waited.
                let due = match self.tracked.get(&key).map(|t| t.state) {
                    Some(State::Deferred { due }) => due,
                    _ => {
                        self.deferred.get_mut(&ns).expect("present").pop_front();
                        continue;
                    }
                };
                if !self.take_token(ns.0, &ns.1, now_ms) {
                    break;
                }
                self.deferred.get_mut(&ns).expect("present").pop_front();
                self.tracked.get_mut(&key).expect("tracked").state = State::Proposed { due };
                fires.push((key, due));
                *budget -= 1;
            }
            if self.deferred.get(&ns).is_some_and(VecDeque::is_empty) {
                self.deferred.remove(&ns);
            }
        }
    }

    /// Whether the core tracks a timer at `pos`: the cursor covers it, or the
    /// outstanding page does. The second matters because that page may have
    /// been read before the change that put the timer there was applied: a
    /// change is never dropped in favour of a page that might not show it.
    fn in_range(&self, pos: &DuePos) -> bool {
        self.cursor.covers(pos) || self.loading.is_some_and(|before_ms| pos.due_ms < before_ms)
    }

    /// Whether information from `index` is at least as new as what the core
    /// knows about `key`.
    fn newer(&mut self, key: &TimerKey, index: u64) -> bool {
        match self.tracked.get(key) {
            Some(t) if t.seen_index > index => {
                self.stats.stale_info_ignored += 1;
                false
            }
            _ => true,
        }
    }

    /// Whether the core hands `due` over ahead of its time, to be armed: the
    /// first fire of a scheduled timer, while arming is on. A scheduled pull
    /// timer is offered at its time instead ([`DueKind::PullFire`]).
    fn arms(&self, due: &Due) -> bool {
        due.kind == DueKind::Fire && self.config.arm_ahead_ms > 0
    }

    /// Tracks `key` as waiting for `due`, in the wheel at the time the leader
    /// acts on it (never before `not_before_ms`).
    fn wait(&mut self, key: TimerKey, due: Due, seen_index: u64, not_before_ms: u64) {
        let unarmable = self.tracked.get(&key).is_some_and(|t| t.unarmable && Self::waiting_for(t) == Some(due));
        self.wait_as(key, due, seen_index, not_before_ms, unarmable);
    }

    /// Like [`wait`](Self::wait), at `due`'s own time even if it could be
    /// armed.
    fn wait_unarmed(&mut self, key: TimerKey, due: Due, seen_index: u64, not_before_ms: u64) {
        self.wait_as(key, due, seen_index, not_before_ms, true);
    }

    fn waiting_for(t: &Tracked) -> Option<Due> {
        match t.state {
            State::Waiting { due, .. } | State::Proposed { due } | State::Deferred { due } => Some(due),
            State::Rereading => None,
        }
    }

    fn wait_as(&mut self, key: TimerKey, due: Due, seen_index: u64, not_before_ms: u64, unarmable: bool) {
        if let Some(t) = self.tracked.get(&key)
            && let State::Waiting { handle, due: old } = t.state
        {
            if old == due && t.unarmable == unarmable {
                // Already waiting for exactly this (perhaps later, after a retry
                // delay): keep its place.
                self.tracked.get_mut(&key).expect("present").seen_index = seen_index.max(t.seen_index);
                return;
            }
            self.wheel.cancel(handle);
        }
        let at_ms = if due.adopt_now(self.epoch) {
            0
        } else if !unarmable && self.arms(&due) {
            crate::arm::arm_at(due.at_ms, self.config.arm_ahead_ms, self.config.arm_step_ms)
        } else {
            due.at_ms
        }
        .max(not_before_ms);
        let handle = self.insert_wheel(&key, at_ms);
        self.tracked.insert(key, Tracked { state: State::Waiting { handle, due }, seen_index, unarmable });
    }

    fn insert_wheel(&mut self, key: &TimerKey, at_ms: u64) -> Handle {
        // The wheel's horizon is thousands of years; index times come from
        // validated fire times, so a refusal is a broken invariant.
        self.wheel.insert(at_ms.min(tocsin_wheel::MAX_DUE_MS), key.clone()).expect("within the wheel's horizon")
    }

    fn forget(&mut self, key: &TimerKey) {
        if let Some(t) = self.tracked.remove(key)
            && let State::Waiting { handle, .. } = t.state
        {
            self.wheel.cancel(handle);
        }
    }
}
