//! The apply rules: how each [`Command`] changes a shard's timers.
//!
//! Pure and deterministic: the rules see the stored timers through
//! [`TimerTable`], the shard's counters and epoch through [`ShardMeta`], and
//! time only as [`ApplyCtx::now_ms`], stamped by the leader into the entry.
//! Every replica applying the same entry to the same state reaches the same
//! state and returns the same [`CommandResult`]s.
//!
//! Two kinds of trouble are told apart:
//! - a command that does not fit the current state (a `Fire` after a cancel, a
//!   stale epoch, a late ack) is an expected race: it changes nothing and
//!   returns [`CommandResult::Skipped`];
//! - state that breaks an invariant (a firing timer without fire facts, a
//!   counter going negative) is corruption: [`ApplyError::Invariant`], on
//!   which the store stops the group rather than limp on.

use serde::Deserialize;
use serde::Serialize;

use crate::NodeId;
use crate::command::AttemptOutcome;
use crate::command::AttemptReport;
use crate::command::Command;
use crate::command::CommandResult;
use crate::command::Proposal;
use crate::command::SkipReason;
use crate::limits;
use crate::recurrence::Series;
use crate::timer::AttemptEnd;
use crate::timer::AttemptEntry;
use crate::timer::DeadReason;
use crate::timer::FirePhase;
use crate::timer::FireRecord;
use crate::timer::TimerKey;
use crate::timer::TimerRecord;
use crate::timer::TimerState;

/// Where a command sits in the log, and the leader's stamped time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApplyCtx {
    /// Log index of the entry.
    pub index: u64,
    /// The command's position within the entry's proposal.
    pub position: u32,
    pub now_ms: u64,
}

impl ApplyCtx {
    /// A number unique to this command in the shard's history: the log
    /// index and the position in the entry, `index × 4096 + position`.
    pub fn sequence(&self) -> u64 {
        debug_assert!((self.position as usize) < crate::command::MAX_COMMANDS_PER_PROPOSAL);
        self.index * crate::command::MAX_COMMANDS_PER_PROPOSAL as u64 + u64::from(self.position)
    }
}

/// Per-shard state beside the timers: the fencing epoch and live counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMeta {
    /// Log index of the latest applied `LeaderEpoch` entry; 0 before any.
    pub epoch: u64,
    /// The node that proposed it.
    pub epoch_leader: NodeId,
    /// Timers in `SCHEDULED`.
    pub scheduled: u64,
    /// Timers in `FIRING`.
    pub firing: u64,
    /// Finished timers still retained.
    pub finished: u64,
    /// The largest time any applied entry was stamped with: apply's clock
    /// never goes backwards, whatever a new leader's wall clock says (see
    /// [`apply_proposal`]).
    pub clock_ms: u64,
}

/// The stored timers of one shard, as the rules see them.
pub trait TimerTable {
    type Error;

    fn get(&mut self, key: &TimerKey) -> std::result::Result<Option<TimerRecord>, Self::Error>;

    /// Replaces `old` (what [`get`](Self::get) returned) by `new`. The
    /// store derives its index changes from the two.
    fn write(
        &mut self,
        key: &TimerKey,
        old: Option<&TimerRecord>,
        new: Option<&TimerRecord>,
    ) -> std::result::Result<(), Self::Error>;
}

/// Why apply could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError<E> {
    #[error("storage error: {0}")]
    Storage(E),
    #[error("broken invariant at log index {index}: {message}")]
    Invariant { index: u64, message: String },
}

type Result<T, E> = std::result::Result<T, ApplyError<E>>;

/// Applies every command of one entry, in order.
pub fn apply_proposal<T: TimerTable>(
    table: &mut T,
    meta: &mut ShardMeta,
    index: u64,
    proposal: &Proposal,
) -> Result<Vec<CommandResult>, T::Error> {
    if proposal.commands.len() > crate::command::MAX_COMMANDS_PER_PROPOSAL {
        return Err(ApplyError::Invariant {
            index,
            message: format!(
                "entry carries {} commands, more than {}",
                proposal.commands.len(),
                crate::command::MAX_COMMANDS_PER_PROPOSAL
            ),
        });
    }
    // A shard's time never goes backwards: a leader whose clock is behind the
    // previous one's (or stepped back) cannot move created, fired or
    // finished times into the past, nor make a fire look early or late.
    let now_ms = proposal.now_ms.max(meta.clock_ms);
    meta.clock_ms = now_ms;
    proposal
        .commands
        .iter()
        .enumerate()
        .map(|(position, cmd)| {
            let ctx = ApplyCtx { index, position: position as u32, now_ms };
            apply_command(table, meta, ctx, cmd)
        })
        .collect()
}

/// Applies one command.
pub fn apply_command<T: TimerTable>(
    table: &mut T,
    meta: &mut ShardMeta,
    ctx: ApplyCtx,
    cmd: &Command,
) -> Result<CommandResult, T::Error> {
    let mut rules = Rules { table, meta, ctx };
    match cmd {
        Command::Create { key, spec, fire_at_ms, retry, retention_ms, replace_finished } => {
            if spec.payload.len() > limits::HARD_MAX_PAYLOAD_BYTES || spec.labels.len() > limits::MAX_LABELS {
                return Ok(CommandResult::Skipped { reason: SkipReason::OverLimit });
            }
            let digest = spec.digest();
            let existing = rules.get(key)?;
            // A finished timer under the id is replaced only when asked: a
            // create that merely finds it answers so, and a client that
            // cancelled and subscribes again learns it must ask.
            let (previous, generation) = match existing {
                Some(old) if old.state.is_terminal() && *replace_finished => {
                    let generation = old.generation + 1;
                    (Some(old), generation)
                }
                Some(old) if old.spec_digest != digest => return Ok(CommandResult::AlreadyExists { record: old }),
                Some(old) if old.state.is_terminal() => return Ok(CommandResult::Finished { record: old }),
                Some(old) => return Ok(CommandResult::Created { record: old, created: false }),
                None => (None, 1),
            };
            let record = TimerRecord {
                state: TimerState::Scheduled,
                fire_at_ms: *fire_at_ms,
                payload: spec.payload.clone(),
                labels: spec.labels.clone(),
                callback: spec.callback.clone(),
                retry: *retry,
                skip_if_late_ms: spec.skip_if_late_ms,
                spec_digest: digest,
                generation,
                created_at_ms: ctx.now_ms,
                created_index: ctx.index,
                fire: None,
                finished_at_ms: 0,
                retention_ms: *retention_ms,
                attempts: Vec::new(),
                series: spec.recurrence.clone().map(|r| Series::new(r, *fire_at_ms)),
            };
            rules.put(key, previous.as_ref(), record.clone())?;
            Ok(CommandResult::Created { record, created: true })
        }
        Command::Cancel { key } => rules.cancel(key),
        Command::Reschedule { key, expected_generation, fire_at_ms } => {
            rules.reschedule(key, *expected_generation, *fire_at_ms)
        }
        Command::Fire { key, due_ms, epoch, timeout_ms } => rules.fire(key, *due_ms, *epoch, *timeout_ms),
        Command::Reserve { key, fire_index, expected_attempt, epoch, until_ms } => {
            rules.reserve(key, *fire_index, *expected_attempt, *epoch, *until_ms)
        }
        Command::FireReserve { key, due_ms, epoch, until_ms } => rules.fire_reserve(key, *due_ms, *epoch, *until_ms),
        Command::AttemptResult { key, fire_index, attempt, outcome, report } => {
            rules.attempt_result(key, *fire_index, *attempt, outcome, report)
        }
        Command::Redrive { key } => rules.redrive(key),
        Command::LeaderEpoch { leader } => {
            // A second epoch command in the same entry changes nothing; an
            // older index than the current epoch means the log went backwards.
            if ctx.index == rules.meta.epoch {
                return Ok(CommandResult::Epoch { epoch: rules.meta.epoch, leader: rules.meta.epoch_leader });
            }
            if ctx.index < rules.meta.epoch {
                return Err(rules.broken(format!("epoch would go from {} to {}", rules.meta.epoch, ctx.index)));
            }
            rules.meta.epoch = ctx.index;
            rules.meta.epoch_leader = *leader;
            Ok(CommandResult::Epoch { epoch: ctx.index, leader: *leader })
        }
        Command::Purge { keys } => {
            let mut count = 0;
            for key in keys {
                let Some(record) = rules.get(key)? else { continue };
                match record.purge_after_ms() {
                    Some(after) if after <= ctx.now_ms => {
                        rules.put_none(key, record)?;
                        count += 1;
                    }
                    _ => {}
                }
            }
            Ok(CommandResult::Purged { count })
        }
        Command::Cluster(_) => Err(rules.broken("a cluster-map command in a shard's log".into())),
    }
}

/// Applies one entry of the metadata group's log to the cluster map. Any
/// command but [`Command::Cluster`], or a stored map that breaks the map's
/// rules, is a broken invariant: the group stops.
pub fn apply_cluster_proposal<E>(
    map: &mut crate::cluster::ClusterMap,
    index: u64,
    proposal: &Proposal,
) -> Result<Vec<CommandResult>, E> {
    if proposal.commands.len() > crate::command::MAX_COMMANDS_PER_PROPOSAL {
        return Err(ApplyError::Invariant {
            index,
            message: format!("metadata entry carries {} commands", proposal.commands.len()),
        });
    }
    proposal
        .commands
        .iter()
        .map(|cmd| match cmd {
            Command::Cluster(c) => crate::cluster::apply_cluster(map, c, proposal.now_ms)
                .map(CommandResult::Cluster)
                .map_err(|message| ApplyError::Invariant { index, message }),
            other => Err(ApplyError::Invariant {
                index,
                message: format!("a shard command in the metadata log: {:?}", other.key()),
            }),
        })
        .collect()
}

struct Rules<'a, T> {
    table: &'a mut T,
    meta: &'a mut ShardMeta,
    ctx: ApplyCtx,
}

impl<T: TimerTable> Rules<'_, T> {
    fn broken(&self, message: String) -> ApplyError<T::Error> {
        ApplyError::Invariant { index: self.ctx.index, message }
    }

    fn get(&mut self, key: &TimerKey) -> Result<Option<TimerRecord>, T::Error> {
        let record = self.table.get(key).map_err(ApplyError::Storage)?;
        if let Some(record) = &record {
            self.check(key, record)?;
        }
        Ok(record)
    }

    /// Invariants every stored record satisfies, checked when read and
    /// before written (TigerBeetle's paired assertions).
    fn check(&self, key: &TimerKey, record: &TimerRecord) -> Result<(), T::Error> {
        let fire_ok = match record.state {
            TimerState::Scheduled | TimerState::Skipped => record.fire.is_none(),
            TimerState::Firing => record.fire.is_some(),
            TimerState::Delivered | TimerState::Dead => record.fire.is_some(),
            // Cancelled before it fired, or while its delivery went on.
            TimerState::Cancelled => true,
        };
        if !fire_ok {
            return Err(self.broken(format!("{key}: state {:?} with fire facts {:?}", record.state, record.fire)));
        }
        if record.generation == 0 {
            return Err(self.broken(format!("{key}: generation 0")));
        }
        if record.state.is_terminal() != (record.finished_at_ms != 0) {
            return Err(self.broken(format!("{key}: state {:?} finished_at {}", record.state, record.finished_at_ms)));
        }
        if record.attempts.len() > limits::MAX_ATTEMPT_HISTORY {
            return Err(self.broken(format!("{key}: {} attempts in its history", record.attempts.len())));
        }
        if (record.state == TimerState::Dead) != record.fire.as_ref().is_some_and(|f| f.dead_reason.is_some()) {
            return Err(self.broken(format!("{key}: state {:?} with dead reason {:?}", record.state, record.fire)));
        }
        Ok(())
    }

    /// Writes `new` over `old`, keeping the shard's counters in step.
    fn put(&mut self, key: &TimerKey, old: Option<&TimerRecord>, new: TimerRecord) -> Result<(), T::Error> {
        self.check(key, &new)?;
        self.count(old.map(|r| r.state), Some(new.state))?;
        self.table.write(key, old, Some(&new)).map_err(ApplyError::Storage)
    }

    fn put_none(&mut self, key: &TimerKey, old: TimerRecord) -> Result<(), T::Error> {
        self.count(Some(old.state), None)?;
        self.table.write(key, Some(&old), None).map_err(ApplyError::Storage)
    }

    fn count(&mut self, old: Option<TimerState>, new: Option<TimerState>) -> Result<(), T::Error> {
        if old == new {
            return Ok(());
        }
        if let Some(old) = old {
            let counter = counter_for(self.meta, old);
            *counter = counter.checked_sub(1).ok_or_else(|| ApplyError::Invariant {
                index: self.ctx.index,
                message: format!("counter for {old:?} would go below zero"),
            })?;
        }
        if let Some(new) = new {
            *counter_for(self.meta, new) += 1;
        }
        Ok(())
    }

    fn cancel(&mut self, key: &TimerKey) -> Result<CommandResult, T::Error> {
        let Some(record) = self.get(key)? else {
            return Ok(CommandResult::NotFound);
        };
        match record.state {
            TimerState::Scheduled => {
                let mut new = record.clone();
                new.state = TimerState::Cancelled;
                new.finished_at_ms = self.ctx.now_ms.max(1);
                self.put(key, Some(&record), new.clone())?;
                Ok(CommandResult::Cancelled { record: new })
            }
            // Armed by this leader and not yet due: nothing was sent, and
            // nothing will be (the leader sends an armed attempt only once
            // every entry stamped before its time is applied, this one
            // included): cancelled as if the fire had not been applied.
            TimerState::Firing if self.sendable_only_by_current_leader(&record) => {
                let mut new = record.unarmed();
                new.state = TimerState::Cancelled;
                new.finished_at_ms = self.ctx.now_ms.max(1);
                self.put(key, Some(&record), new.clone())?;
                Ok(CommandResult::Cancelled { record: new })
            }
            // Fired, and still being delivered: no further attempt starts
            // (the record leaves the fire-time index). An attempt already
            // under way may still arrive; the answer says so.
            TimerState::Firing => {
                let fire = record.fire.as_ref().expect("checked: firing timers have fire facts");
                let attempt_in_flight = matches!(fire.phase, FirePhase::InFlight { .. });
                let mut new = record.clone();
                if attempt_in_flight {
                    let entry = ended(fire, self.ctx.now_ms, AttemptEnd::Cancelled, &AttemptReport::default(), "");
                    push_attempt(&mut new, entry);
                }
                new.state = TimerState::Cancelled;
                new.finished_at_ms = self.ctx.now_ms.max(1);
                self.put(key, Some(&record), new.clone())?;
                Ok(CommandResult::CancelledWhileFiring { record: new, attempt_in_flight })
            }
            TimerState::Cancelled => Ok(CommandResult::AlreadyCancelled { record }),
            // Its fire came (a skipped one too): the record says how it ended.
            TimerState::Delivered | TimerState::Dead | TimerState::Skipped => {
                Ok(CommandResult::AlreadyFired { record })
            }
        }
    }

    fn reschedule(&mut self, key: &TimerKey, expected: u64, fire_at_ms: u64) -> Result<CommandResult, T::Error> {
        let Some(record) = self.get(key)? else {
            return Ok(CommandResult::NotFound);
        };
        // An armed fire not yet due is undone first, as a cancel undoes it.
        let armed = record.state == TimerState::Firing && self.sendable_only_by_current_leader(&record);
        if record.state != TimerState::Scheduled && !armed {
            return Ok(CommandResult::NotScheduled { state: record.state });
        }
        if record.generation != expected {
            return Ok(CommandResult::GenerationMismatch { current: record.generation });
        }
        let mut new = if armed { record.unarmed() } else { record.clone() };
        new.fire_at_ms = fire_at_ms;
        new.generation += 1;
        if let Some(series) = &mut new.series {
            // The next occurrence moves; an interval series goes on from it.
            series.anchor_ms = fire_at_ms;
        }
        self.put(key, Some(&record), new.clone())?;
        Ok(CommandResult::Rescheduled { record: new })
    }

    /// Whether `record` is a push timer's first attempt that this shard's
    /// current leader armed and whose time has not come: no attempt of it
    /// can have been sent, since only the leader that armed it sends it,
    /// and only once every entry stamped before its time has been applied.
    /// An attempt taken over from an earlier leader (its firing started in
    /// an earlier epoch) never is: that leader may have sent it.
    fn sendable_only_by_current_leader(&self, record: &TimerRecord) -> bool {
        record.armed_not_started(self.ctx.now_ms)
            && record.fire.as_ref().is_some_and(|fire| {
                fire.epoch == self.meta.epoch
                    && fire.fire_index / crate::command::MAX_COMMANDS_PER_PROPOSAL as u64 > self.meta.epoch
            })
    }

    fn fire(&mut self, key: &TimerKey, due_ms: u64, epoch: u64, timeout_ms: u64) -> Result<CommandResult, T::Error> {
        let Some(record) = self.get(key)? else {
            return Ok(skip(SkipReason::NotFound));
        };
        // Epoch 0 means no leader has established itself yet: nobody fires.
        if epoch != self.meta.epoch || epoch == 0 {
            return Ok(skip(SkipReason::StaleEpoch));
        }
        let Some(due) = record.due() else {
            return Ok(skip(SkipReason::Stale));
        };
        if due.at_ms != due_ms {
            // Cancelled, rescheduled or moved on since the leader loaded it.
            return Ok(skip(SkipReason::Stale));
        }
        let now = self.ctx.now_ms;
        // Never early: the entry's time must have come, except for a webhook
        // attempt an earlier leader started, which is redelivered at once,
        // and a push timer's first fire, which may be armed ahead of its
        // time (see `armable`): its attempt starts at the fire time, not now.
        if due_ms > now && !due.adopt_now(epoch) && !armable(&record, due, now) {
            return Ok(skip(SkipReason::NotDue));
        }
        // When the attempt this fire starts begins: now, or an armed fire's
        // own time.
        let start = if record.fire.is_none() { now.max(due_ms) } else { now };
        let pull = record.callback.is_pull();
        let mut new = record.clone();
        if new.fire.is_none()
            && record.skip_if_late_ms != 0
            && now > record.fire_at_ms.saturating_add(record.skip_if_late_ms)
        {
            // The late-fire policy: too late to be worth delivering. A
            // series skips this occurrence and goes on.
            if let Some(series) = &mut new.series {
                crate::recurrence::advance(series, record.fire_at_ms, now);
                series.skipped += 1;
            }
            if !next_occurrence(&mut new) {
                new.state = TimerState::Skipped;
                new.finished_at_ms = now.max(1);
            }
            self.put(key, Some(&record), new.clone())?;
            return Ok(CommandResult::LateSkipped { record: new });
        }
        match &mut new.fire {
            None => {
                // A series works out its next occurrence in the entry that
                // fires this one: a failover can neither skip nor double it.
                // An armed fire works it out as a fire at its own time would.
                if let Some(series) = &mut new.series {
                    crate::recurrence::advance(series, record.fire_at_ms, start);
                }
                // SCHEDULED -> FIRING: the fire itself.
                new.state = TimerState::Firing;
                new.fire = Some(FireRecord {
                    fire_index: self.ctx.sequence(),
                    epoch,
                    attempt: if pull { 0 } else { 1 },
                    attempt_index: self.ctx.index,
                    fired_at_ms: start,
                    attempt_started_at_ms: start,
                    phase: if pull {
                        FirePhase::Ready { since_ms: now }
                    } else {
                        FirePhase::InFlight { since_ms: start, until_ms: start.saturating_add(timeout_ms.max(1)) }
                    },
                    last_error: String::new(),
                    dead_reason: None,
                });
                if past_give_up(&new, start) {
                    return self.die(
                        key,
                        record,
                        new,
                        DeadReason::GiveUpAfter,
                        "gave up: fired after retry.give_up_after_ms",
                    );
                }
            }
            Some(fire) if pull => {
                // Ready already (a new leader re-offers it): nothing changes. A
                // reservation that ran out, or a nack's backoff that ended: ready
                // for the next consumer.
                if matches!(fire.phase, FirePhase::Ready { .. }) {
                    return Ok(CommandResult::Dispatch { record });
                }
                if matches!(fire.phase, FirePhase::InFlight { .. }) {
                    fire.last_error = "the reservation ran out without an ack".into();
                    let entry = ended(fire, now, AttemptEnd::NoOutcome, &AttemptReport::default(), &fire.last_error);
                    push_attempt_to(&mut new.attempts, entry);
                }
                fire.phase = FirePhase::Ready { since_ms: now };
            }
            Some(fire) if fire.epoch < epoch && not_started(fire, now) => {
                // An armed attempt an earlier leader left: its time has not
                // come, so nobody can have sent it unless that leader did.
                // This leader takes it over as it stands, under its own epoch,
                // still starting at its own time (never early) and counting
                // as the same attempt (an attempt that was never made must
                // not use up the timer's attempts). Since the earlier leader
                // may have sent it after all, a cancel now answers "while
                // firing" (`sendable_only_by_current_leader`).
                fire.epoch = epoch;
                fire.attempt_index = self.ctx.index;
                let start = fire.attempt_started_at_ms;
                fire.phase = FirePhase::InFlight { since_ms: start, until_ms: start.saturating_add(timeout_ms.max(1)) };
            }
            Some(fire) => {
                // A webhook retry after a backoff, an attempt whose deadline passed
                // with no outcome recorded (lost reply, dropped task), or an attempt
                // an earlier leader left in flight.
                if matches!(fire.phase, FirePhase::InFlight { .. }) {
                    let end = if fire.epoch < epoch {
                        fire.last_error = "the leader that started the attempt lost its leadership".into();
                        AttemptEnd::LeaderChanged
                    } else {
                        fire.last_error = "no outcome recorded before the attempt's deadline".into();
                        AttemptEnd::NoOutcome
                    };
                    let entry = ended(fire, now, end, &AttemptReport::default(), &fire.last_error);
                    push_attempt_to(&mut new.attempts, entry);
                }
                if fire.attempt >= record.retry.max_attempts.max(1) {
                    let error = format!("gave up after {} attempts: {}", fire.attempt, fire.last_error);
                    return self.die(key, record, new, DeadReason::MaxAttempts, &error);
                }
                if past_give_up(&record, now) {
                    return self.die(
                        key,
                        record,
                        new,
                        DeadReason::GiveUpAfter,
                        "gave up: retry.give_up_after_ms passed",
                    );
                }
                fire.attempt += 1;
                fire.epoch = epoch;
                fire.attempt_index = self.ctx.index;
                fire.attempt_started_at_ms = now;
                fire.phase = FirePhase::InFlight { since_ms: now, until_ms: now.saturating_add(timeout_ms.max(1)) };
            }
        }
        self.put(key, Some(&record), new.clone())?;
        Ok(CommandResult::Dispatch { record: new })
    }

    /// [`Command::FireReserve`]: `fire`, then, if that made a pull timer
    /// ready, `reserve` of the firing it started. Each step reads what the
    /// one before wrote (the table is the entry's overlay), so the result
    /// is exactly that of the two commands one after the other at this log
    /// position: the same fire id, attempt, history and index entries.
    /// Only a pull timer is reserved; any other is refused before its fire
    /// (a consumer never names one).
    fn fire_reserve(
        &mut self,
        key: &TimerKey,
        due_ms: u64,
        epoch: u64,
        until_ms: u64,
    ) -> Result<CommandResult, T::Error> {
        match self.get(key)? {
            None => return Ok(skip(SkipReason::NotFound)),
            Some(record) if !record.callback.is_pull() => return Ok(skip(SkipReason::WrongState)),
            Some(_) => {}
        }
        let fired = self.fire(key, due_ms, epoch, 0)?;
        let CommandResult::Dispatch { record } = &fired else { return Ok(fired) };
        match &record.fire {
            Some(fire) if matches!(fire.phase, FirePhase::Ready { .. }) => {
                let (fire_index, attempt) = (fire.fire_index, fire.attempt);
                self.reserve(key, fire_index, attempt, epoch, until_ms)
            }
            // A pull timer's fire makes it ready or kills it; anything else
            // is the fire's own answer.
            _ => Ok(fired),
        }
    }

    fn reserve(
        &mut self,
        key: &TimerKey,
        fire_index: u64,
        expected_attempt: u32,
        epoch: u64,
        until_ms: u64,
    ) -> Result<CommandResult, T::Error> {
        let Some(record) = self.get(key)? else {
            return Ok(skip(SkipReason::NotFound));
        };
        // Epoch 0 means no leader has established itself yet: nobody fires.
        if epoch != self.meta.epoch || epoch == 0 {
            return Ok(skip(SkipReason::StaleEpoch));
        }
        if record.state != TimerState::Firing || !record.callback.is_pull() {
            return Ok(skip(SkipReason::WrongState));
        }
        let fire = record.fire.as_ref().expect("checked: firing timers have fire facts");
        if fire.fire_index != fire_index || fire.attempt != expected_attempt {
            return Ok(skip(SkipReason::Stale));
        }
        let now = self.ctx.now_ms;
        // Reservable: ready, or a reservation or backoff that has run out. A
        // reservation still running belongs to its consumer until `until_ms`.
        let reservable = match fire.phase {
            FirePhase::Ready { .. } => true,
            FirePhase::InFlight { until_ms, .. } => until_ms <= now,
            FirePhase::Backoff { at_ms } => at_ms <= now,
        };
        if !reservable {
            return Ok(skip(SkipReason::NotDue));
        }
        let mut new = record.clone();
        if matches!(fire.phase, FirePhase::InFlight { .. }) {
            // The previous reservation ran out unacked.
            let error = "the reservation ran out without an ack";
            push_attempt(&mut new, ended(fire, now, AttemptEnd::NoOutcome, &AttemptReport::default(), error));
        }
        if fire.attempt >= record.retry.max_attempts.max(1) {
            let error = format!("gave up after {} deliveries: {}", fire.attempt, fire.last_error);
            return self.die(key, record, new, DeadReason::MaxAttempts, &error);
        }
        if past_give_up(&new, now) {
            return self.die(key, record, new, DeadReason::GiveUpAfter, "gave up: retry.give_up_after_ms passed");
        }
        let fire = new.fire.as_mut().expect("copied from a firing record");
        fire.attempt += 1;
        fire.epoch = epoch;
        fire.attempt_index = self.ctx.index;
        fire.attempt_started_at_ms = now;
        fire.phase = FirePhase::InFlight { since_ms: now, until_ms: until_ms.max(now.saturating_add(1)) };
        self.put(key, Some(&record), new.clone())?;
        Ok(CommandResult::Dispatch { record: new })
    }

    fn attempt_result(
        &mut self,
        key: &TimerKey,
        fire_index: u64,
        attempt: u32,
        outcome: &AttemptOutcome,
        report: &AttemptReport,
    ) -> Result<CommandResult, T::Error> {
        let Some(record) = self.get(key)? else {
            return Ok(skip(SkipReason::NotFound));
        };
        if record.state != TimerState::Firing {
            return Ok(skip(SkipReason::WrongState));
        }
        let fire = record.fire.as_ref().expect("checked: firing timers have fire facts");
        if fire.fire_index != fire_index || fire.attempt != attempt || attempt == 0 {
            return Ok(skip(SkipReason::Stale));
        }
        if !matches!(fire.phase, FirePhase::InFlight { .. }) {
            // The attempt already has a result (or the timer went back to ready).
            return Ok(skip(SkipReason::Stale));
        }
        let now = self.ctx.now_ms;
        if not_started(fire, now) {
            // An armed attempt is sent at its start, and every entry after
            // that is stamped at or after it: an outcome stamped before it
            // cannot be of a real send.
            return Ok(skip(SkipReason::NotDue));
        }
        let mut new = record.clone();
        let (end, error) = match outcome {
            AttemptOutcome::Delivered => (AttemptEnd::Delivered, ""),
            AttemptOutcome::Failed { error, .. } => (AttemptEnd::Failed, error.as_str()),
            AttemptOutcome::GiveUp { error } => (AttemptEnd::GaveUp, error.as_str()),
        };
        push_attempt(&mut new, ended(fire, now, end, report, error));
        match outcome {
            AttemptOutcome::Delivered => {
                if let Some(series) = &mut new.series {
                    series.delivered += 1;
                }
                if !next_occurrence(&mut new) {
                    new.state = TimerState::Delivered;
                    new.finished_at_ms = now.max(1);
                }
            }
            AttemptOutcome::GiveUp { error } => {
                return self.die(key, record, new, DeadReason::Gone, error);
            }
            AttemptOutcome::Failed { error, retry_at_ms } => {
                let out_of_attempts = attempt >= record.retry.max_attempts.max(1);
                let out_of_time = record.retry.give_up_after_ms != 0 && *retry_at_ms > record.retry.give_up_after_ms;
                if out_of_attempts || out_of_time {
                    let reason = if out_of_attempts { DeadReason::MaxAttempts } else { DeadReason::GiveUpAfter };
                    return self.die(key, record, new, reason, error);
                }
                let fire = new.fire.as_mut().expect("copied from a firing record");
                fire.phase = FirePhase::Backoff { at_ms: *retry_at_ms };
                fire.last_error = truncate(error);
            }
        }
        self.put(key, Some(&record), new.clone())?;
        Ok(CommandResult::Recorded { record: new })
    }

    fn die(
        &mut self,
        key: &TimerKey,
        old: TimerRecord,
        mut new: TimerRecord,
        reason: DeadReason,
        error: &str,
    ) -> Result<CommandResult, T::Error> {
        new.state = TimerState::Dead;
        new.finished_at_ms = self.ctx.now_ms.max(1);
        let fire = new.fire.as_mut().ok_or_else(|| self.broken(format!("{key}: dying without fire facts")))?;
        fire.last_error = truncate(error);
        fire.dead_reason = Some(reason);
        // One dead occurrence does not end a series: its history and
        // counters say so, and the next occurrence is scheduled.
        if let Some(series) = &mut new.series {
            series.dead += 1;
        }
        next_occurrence(&mut new);
        self.put(key, Some(&old), new.clone())?;
        Ok(CommandResult::Dead { record: new })
    }

    /// A `DEAD` timer scheduled again at once: a new firing (new fire id,
    /// attempts from 1), its generation raised; its history stays.
    fn redrive(&mut self, key: &TimerKey) -> Result<CommandResult, T::Error> {
        let Some(record) = self.get(key)? else {
            return Ok(CommandResult::NotFound);
        };
        if record.state != TimerState::Dead {
            return Ok(CommandResult::NotDead { record });
        }
        let mut new = record.clone();
        new.state = TimerState::Scheduled;
        new.fire_at_ms = self.ctx.now_ms;
        new.generation += 1;
        new.fire = None;
        new.finished_at_ms = 0;
        self.put(key, Some(&record), new.clone())?;
        Ok(CommandResult::Redriven { record: new })
    }
}

/// When an occurrence of a series ends (delivered, dead or skipped) and
/// another follows: the record is scheduled at it, a new generation (a
/// reschedule aimed at the occurrence that ended no longer applies), with
/// the occurrence's fire facts dropped (its attempts stay in the history).
/// False for a one-shot timer or a series' last occurrence.
fn next_occurrence(record: &mut TimerRecord) -> bool {
    let Some(next_at_ms) = record.series.as_mut().and_then(|s| s.next_at_ms.take()) else {
        return false;
    };
    record.state = TimerState::Scheduled;
    record.fire_at_ms = next_at_ms;
    record.fire = None;
    record.finished_at_ms = 0;
    record.generation += 1;
    true
}

fn counter_for(meta: &mut ShardMeta, state: TimerState) -> &mut u64 {
    match state {
        TimerState::Scheduled => &mut meta.scheduled,
        TimerState::Firing => &mut meta.firing,
        TimerState::Delivered | TimerState::Dead | TimerState::Cancelled | TimerState::Skipped => &mut meta.finished,
    }
}

/// Whether a `Fire` for `due` at `now_ms`, ahead of the entry's time, arms
/// the timer: a push timer's first fire (webhook or AMQP; a pull timer is
/// offered unfired instead) at most [`limits::MAX_ARM_AHEAD_MS`] ahead, which
/// its retry window lets start at its time. Its attempt then starts at the
/// fire time, so the leader can send it then without a commit in between;
/// until then a cancel or a reschedule applied in this leader's epoch
/// undoes it (`Rules::sendable_only_by_current_leader`).
fn armable(record: &TimerRecord, due: crate::timer::Due, now_ms: u64) -> bool {
    due.kind == crate::timer::DueKind::Fire
        && record.state == TimerState::Scheduled
        && record.fire.is_none()
        && !record.callback.is_pull()
        && due.at_ms.saturating_sub(now_ms) <= limits::MAX_ARM_AHEAD_MS
        && !past_give_up(record, due.at_ms)
}

/// Whether `fire`'s current attempt is an armed one whose time has not come
/// at `now_ms`.
fn not_started(fire: &FireRecord, now_ms: u64) -> bool {
    matches!(fire.phase, FirePhase::InFlight { .. }) && fire.attempt_started_at_ms > now_ms
}

fn past_give_up(record: &TimerRecord, now_ms: u64) -> bool {
    record.retry.give_up_after_ms != 0 && now_ms > record.retry.give_up_after_ms
}

fn skip(reason: SkipReason) -> CommandResult {
    CommandResult::Skipped { reason }
}

/// The history entry of the attempt `fire` has under way, ended `end` at
/// `now_ms`.
fn ended(fire: &FireRecord, now_ms: u64, end: AttemptEnd, report: &AttemptReport, error: &str) -> AttemptEntry {
    let mut class = report.class.clone();
    if class.len() > limits::MAX_ATTEMPT_CLASS_BYTES {
        class = truncate_to(&class, limits::MAX_ATTEMPT_CLASS_BYTES);
    }
    AttemptEntry {
        fire_index: fire.fire_index,
        attempt: fire.attempt,
        epoch: fire.epoch,
        attempt_index: fire.attempt_index,
        started_at_ms: fire.attempt_started_at_ms,
        finished_at_ms: now_ms,
        end,
        status: report.status,
        class,
        latency_ms: report.latency_ms,
        error: truncate(error),
    }
}

/// Appends to a timer's history, dropping the oldest beyond the bound.
fn push_attempt(record: &mut TimerRecord, entry: AttemptEntry) {
    push_attempt_to(&mut record.attempts, entry);
}

fn push_attempt_to(attempts: &mut Vec<AttemptEntry>, entry: AttemptEntry) {
    attempts.push(entry);
    if attempts.len() > limits::MAX_ATTEMPT_HISTORY {
        let extra = attempts.len() - limits::MAX_ATTEMPT_HISTORY;
        attempts.drain(..extra);
    }
}

fn truncate(error: &str) -> String {
    truncate_to(error, limits::MAX_ERROR_BYTES)
}

fn truncate_to(error: &str, max: usize) -> String {
    if error.len() <= max {
        return error.to_string();
    }
    let mut end = max;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    error[..end].to_string()
}
