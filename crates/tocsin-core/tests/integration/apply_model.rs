//! Model-based property test of the apply rules: random command sequences
//! over a few keys, checked after every step against the invariants a client
//! relies on, and replayed to check determinism.

use proptest::prelude::*;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::TimerKey;
use tocsin_core::TimerState;
use tocsin_core::apply::ApplyCtx;
use tocsin_core::apply::apply_command;
use tocsin_core::command::AttemptOutcome;
use tocsin_core::command::AttemptReport;
use tocsin_core::timer::Callback;

use crate::apply_rules::Shard;
use crate::apply_rules::T0;
use crate::apply_rules::create;
use crate::apply_rules::spec;
use crate::apply_rules::webhook;

#[derive(Clone, Debug)]
enum Step {
    Create { k: usize, offset_ms: u64, variant: u8, pull: bool, replace: bool },
    Cancel { k: usize },
    Reschedule { k: usize, stale: bool, offset_ms: u64 },
    Fire { k: usize, stale_due: bool, stale_epoch: bool },
    Reserve { k: usize, stale: bool },
    FireReserve { k: usize, stale_due: bool, stale_epoch: bool },
    Result { k: usize, stale: bool, outcome: u8 },
    Elect,
    Redrive { k: usize },
    Purge { k: usize },
    Advance { ms: u64 },
}

const KEYS: usize = 4;

fn step() -> impl Strategy<Value = Step> {
    let k = 0..KEYS;
    prop_oneof![
        3 => (k.clone(), prop_oneof![0u64..8, 0u64..5_000], 0u8..2, any::<bool>(), prop::bool::weighted(0.3)).prop_map(|(k, offset_ms, variant, pull, replace)| Step::Create { k, offset_ms, variant, pull, replace }),
        2 => k.clone().prop_map(|k| Step::Cancel { k }),
        1 => (k.clone(), any::<bool>(), 0u64..5_000).prop_map(|(k, stale, offset_ms)| Step::Reschedule { k, stale, offset_ms }),
        3 => (k.clone(), prop::bool::weighted(0.2), prop::bool::weighted(0.2)).prop_map(|(k, stale_due, stale_epoch)| Step::Fire { k, stale_due, stale_epoch }),
        2 => (k.clone(), prop::bool::weighted(0.2)).prop_map(|(k, stale)| Step::Reserve { k, stale }),
        2 => (k.clone(), prop::bool::weighted(0.2), prop::bool::weighted(0.2)).prop_map(|(k, stale_due, stale_epoch)| Step::FireReserve { k, stale_due, stale_epoch }),
        2 => (k.clone(), prop::bool::weighted(0.2), 0u8..3).prop_map(|(k, stale, outcome)| Step::Result { k, stale, outcome }),
        1 => Just(Step::Elect),
        1 => k.clone().prop_map(|k| Step::Redrive { k }),
        1 => k.clone().prop_map(|k| Step::Purge { k }),
        3 => prop_oneof![0u64..4, 0u64..4_000].prop_map(|ms| Step::Advance { ms }),
    ]
}

fn key(k: usize) -> TimerKey {
    TimerKey::new("ns", format!("timer-{k}"))
}

/// The due time and epoch a fire of timer `k` names: the record's current
/// due time and the shard's epoch, or one less where the step asks for a
/// stale one. `None` if there is no such timer.
fn fire_target(shard: &Shard, k: usize, stale_due: bool, stale_epoch: bool) -> Option<(u64, u64)> {
    let r = shard.table.timers.get(&key(k))?;
    Some((
        r.due_ms().unwrap_or(r.fire_at_ms) - u64::from(stale_due),
        shard.meta.epoch.saturating_sub(u64::from(stale_epoch)),
    ))
}

/// Turns a step into a concrete command, reading the current record so that
/// most commands are plausible (right generation, attempt, epoch) and some
/// are deliberately stale.
fn command(shard: &Shard, now: u64, step: &Step) -> Option<Command> {
    let rec = |k| shard.table.timers.get(&key(k));
    Some(match *step {
        Step::Create { k, offset_ms, variant, pull, replace } => {
            let cb = if pull { Callback::Pull { topic: "t".into(), ttr_ms: 0 } } else { webhook() };
            let mut s = spec(now + offset_ms, cb);
            let mut p = s.payload.to_vec();
            p.push(variant);
            s.payload = p.into();
            let mut cmd = create(&key(k), &s, 3);
            if let Command::Create { replace_finished, .. } = &mut cmd {
                *replace_finished = replace;
            }
            cmd
        }
        Step::Cancel { k } => Command::Cancel { key: key(k) },
        Step::Reschedule { k, stale, offset_ms } => Command::Reschedule {
            key: key(k),
            expected_generation: rec(k).map_or(1, |r| r.generation - u64::from(stale)),
            fire_at_ms: now + offset_ms,
        },
        Step::Fire { k, stale_due, stale_epoch } => {
            let (due_ms, epoch) = fire_target(shard, k, stale_due, stale_epoch)?;
            Command::Fire { key: key(k), due_ms, epoch, timeout_ms: 30_000 }
        }
        Step::Reserve { k, stale } => {
            let fire = rec(k)?.fire.clone()?;
            Command::Reserve {
                key: key(k),
                fire_index: fire.fire_index,
                expected_attempt: fire.attempt.wrapping_sub(u32::from(stale)),
                epoch: shard.meta.epoch,
                until_ms: now + 30_000,
            }
        }
        Step::FireReserve { k, stale_due, stale_epoch } => {
            let (due_ms, epoch) = fire_target(shard, k, stale_due, stale_epoch)?;
            Command::FireReserve { key: key(k), due_ms, epoch, until_ms: now + 30_000 }
        }
        Step::Result { k, stale, outcome } => {
            let fire = rec(k)?.fire.clone()?;
            Command::AttemptResult {
                key: key(k),
                fire_index: fire.fire_index,
                attempt: fire.attempt.wrapping_sub(u32::from(stale)),
                outcome: match outcome {
                    0 => AttemptOutcome::Delivered,
                    1 => AttemptOutcome::Failed { error: "503".into(), retry_at_ms: now + 1000 },
                    _ => AttemptOutcome::GiveUp { error: "410".into() },
                },
                report: AttemptReport::new(500, "5xx", 12),
            }
        }
        Step::Elect => Command::LeaderEpoch { leader: 1 },
        Step::Redrive { k } => Command::Redrive { key: key(k) },
        Step::Purge { k } => Command::Purge { keys: vec![key(k)] },
        Step::Advance { .. } => return None,
    })
}

/// What `cmd` (a `FireReserve`) should do to `shard` at `now`: its `Fire`
/// applied, then, if that made a pull timer ready, the `Reserve` of that
/// firing, both at the log position the `FireReserve` will take. Returns the
/// shard after both and the answer expected.
fn fire_then_reserve(shard: &Shard, now: u64, cmd: &Command) -> (Shard, CommandResult) {
    let Command::FireReserve { key, due_ms, epoch, until_ms } = cmd.clone() else { unreachable!() };
    let mut twin = Shard { table: shard.table.clone(), meta: shard.meta.clone(), index: shard.index + 1 };
    // As `apply_proposal` stamps an entry: the shard's time never goes back.
    let now_ms = now.max(twin.meta.clock_ms);
    twin.meta.clock_ms = now_ms;
    if shard.table.timers.get(&key).is_some_and(|r| !r.callback.is_pull()) {
        // Only a pull timer is reserved: any other is refused, untouched.
        return (twin, CommandResult::Skipped { reason: tocsin_core::command::SkipReason::WrongState });
    }
    let ctx = ApplyCtx { index: twin.index, position: 0, now_ms };
    let mut step = |cmd| apply_command(&mut twin.table, &mut twin.meta, ctx, &cmd).expect("no broken invariant");
    let fired = step(Command::Fire { key: key.clone(), due_ms, epoch, timeout_ms: 0 });
    let expected = match &fired {
        CommandResult::Dispatch { record }
            if matches!(record.fire.as_ref().map(|f| f.phase), Some(tocsin_core::FirePhase::Ready { .. })) =>
        {
            let fire = record.fire.as_ref().unwrap();
            step(Command::Reserve { key, fire_index: fire.fire_index, expected_attempt: fire.attempt, epoch, until_ms })
        }
        _ => fired,
    };
    (twin, expected)
}

fn run(steps: &[Step]) -> (Vec<CommandResult>, Shard) {
    let mut shard = Shard::new();
    let mut now = T0;
    let mut results = Vec::new();
    // Incarnations (key, created_index) whose cancel was acknowledged.
    let mut cancelled = std::collections::BTreeSet::new();
    for step in steps {
        if let Step::Advance { ms } = step {
            now += ms;
            continue;
        }
        let Some(cmd) = command(&shard, now, step) else { continue };
        let before = cmd.key().and_then(|k| shard.table.timers.get(k).cloned());
        let shard_before = Shard { table: Default::default(), meta: shard.meta.clone(), index: shard.index };
        let twin = matches!(cmd, Command::FireReserve { .. }).then(|| fire_then_reserve(&shard, now, &cmd));
        let result = shard.apply(now, cmd.clone());
        // A `FireReserve` is exactly a `Fire`, then a `Reserve` of the firing
        // it started, at the same log position: the same answer, the same
        // records, indexes and counters.
        if let Some((twin, expected)) = twin {
            assert_eq!(result, expected, "FireReserve answered unlike Fire then Reserve");
            assert_eq!(shard.table, twin.table, "FireReserve left other state than Fire then Reserve");
            assert_eq!(shard.meta, twin.meta);
        }

        // A cancel's answer is decided by the state it found. An armed fire
        // whose time has not come is undone as if never applied, when this
        // leader armed it (an earlier leader may have sent it).
        if let Command::Cancel { .. } = cmd {
            let expected = match before.as_ref().map(|r| r.state) {
                None => "not_found",
                Some(TimerState::Scheduled) => "cancelled",
                Some(TimerState::Firing) if armed_by_this_leader(&shard_before, before.as_ref().unwrap(), now) => {
                    "cancelled"
                }
                Some(TimerState::Firing) => "cancelled_while_firing",
                Some(TimerState::Cancelled) => "already_cancelled",
                Some(_) => "already_fired",
            };
            let got = match &result {
                CommandResult::NotFound => "not_found",
                CommandResult::Cancelled { .. } => "cancelled",
                CommandResult::CancelledWhileFiring { record, attempt_in_flight } => {
                    let phase = before.as_ref().and_then(|r| r.fire.as_ref()).map(|f| f.phase);
                    assert_eq!(
                        *attempt_in_flight,
                        matches!(phase, Some(tocsin_core::FirePhase::InFlight { .. })),
                        "attempt_in_flight says whether an attempt had started without an outcome"
                    );
                    assert_eq!(record.due(), None, "a cancelled timer leaves the fire-time index");
                    "cancelled_while_firing"
                }
                CommandResult::AlreadyCancelled { .. } => "already_cancelled",
                CommandResult::AlreadyFired { .. } => "already_fired",
                other => panic!("cancel answered {other:?}"),
            };
            assert_eq!(got, expected);
            if let CommandResult::Cancelled { record } | CommandResult::CancelledWhileFiring { record, .. } = &result {
                cancelled.insert((cmd.key().unwrap().clone(), record.created_index));
            }
        }
        // A create's answer is decided by what the id held: nothing or a
        // finished timer it may replace (a new timer, generation raised),
        // a live identical timer (found), or anything else (refused).
        if let Command::Create { spec, replace_finished, .. } = &cmd {
            match (&before, &result) {
                (None, CommandResult::Created { record, created: true }) => assert_eq!(record.generation, 1),
                (Some(b), CommandResult::Created { record, created: true }) => {
                    assert!(b.state.is_terminal() && *replace_finished, "replaced a live timer or unasked");
                    assert_eq!(record.generation, b.generation + 1);
                    assert!(record.created_index > b.created_index);
                }
                (Some(b), CommandResult::Created { record, created: false }) => {
                    assert!(!b.state.is_terminal(), "a finished timer was answered as found");
                    assert_eq!((record, spec.digest()), (b, b.spec_digest));
                }
                (Some(b), CommandResult::Finished { record }) => {
                    assert!(b.state.is_terminal() && !*replace_finished && b.spec_digest == spec.digest());
                    assert_eq!(record, b);
                }
                (Some(b), CommandResult::AlreadyExists { .. }) => {
                    assert_ne!(b.spec_digest, spec.digest());
                    assert!(!(b.state.is_terminal() && *replace_finished));
                }
                (_, CommandResult::Skipped { .. }) => {}
                (b, other) => panic!("create over {b:?} answered {other:?}"),
            }
        }
        if let CommandResult::Dispatch { record } = &result {
            let k = cmd.key().unwrap().clone();
            assert!(
                !cancelled.contains(&(k, record.created_index)),
                "dispatched a timer whose cancel was acknowledged"
            );
            let fire = record.fire.as_ref().unwrap();
            // Never early: a pull timer is made ready once its time has come;
            // a push timer's attempt starts at its fire time at the earliest
            // (an armed fire is applied ahead, its attempt starting then).
            if record.callback.is_pull() {
                assert!(record.fire_at_ms <= now, "dispatched before its fire time");
            } else {
                assert!(fire.attempt_started_at_ms >= record.fire_at_ms, "an attempt starts before its fire time");
                assert!(
                    fire.attempt_started_at_ms <= now.max(shard.meta.clock_ms) + tocsin_core::limits::MAX_ARM_AHEAD_MS,
                    "armed further ahead than the rules allow"
                );
            }
            if matches!(fire.phase, tocsin_core::FirePhase::InFlight { .. }) {
                assert_eq!(fire.epoch, shard.meta.epoch, "an attempt started under a stale epoch");
                assert_ne!(fire.epoch, 0);
            }
        }
        // A redrive restarts exactly the DEAD timers: scheduled at once, the
        // generation raised, the history kept.
        if let Command::Redrive { .. } = &cmd {
            match (&before, &result) {
                (None, CommandResult::NotFound) => {}
                (Some(b), CommandResult::NotDead { record }) => assert!(b.state != TimerState::Dead && record == b),
                (Some(b), CommandResult::Redriven { record }) => {
                    assert_eq!(b.state, TimerState::Dead);
                    assert_eq!(
                        (record.state, record.generation, record.fire_at_ms),
                        (TimerState::Scheduled, b.generation + 1, now)
                    );
                    assert_eq!(record.attempts, b.attempts);
                }
                (b, other) => panic!("redrive of {b:?} answered {other:?}"),
            }
        }
        // Every attempt that ended is in the history, within its bound.
        if let Some(a) = cmd.key().and_then(|k| shard.table.timers.get(k)) {
            assert!(a.attempts.len() <= tocsin_core::limits::MAX_ATTEMPT_HISTORY);
            assert!(a.attempts.windows(2).all(|w| w[0].finished_at_ms <= w[1].finished_at_ms));
        }
        // State only moves forward along SCHEDULED -> FIRING -> DELIVERED | DEAD and
        // SCHEDULED | FIRING -> CANCELLED (a purge removes, a create may start a new
        // incarnation, a redrive takes DEAD back to SCHEDULED).
        if let (Some(b), Some(a)) = (&before, shard.table.timers.get(cmd.key().unwrap_or(&key(0))))
            && cmd.key().is_some()
            && a.created_index == b.created_index
            && !matches!(cmd, Command::Redrive { .. })
        {
            let rank = |s| match s {
                TimerState::Scheduled => 0,
                TimerState::Firing => 1,
                _ => 2,
            };
            // The one way back: a reschedule undoes an armed fire whose time
            // has not come.
            let unarmed = matches!(cmd, Command::Reschedule { .. })
                && matches!(result, CommandResult::Rescheduled { .. })
                && armed_by_this_leader(&shard_before, b, now);
            assert!(rank(a.state) >= rank(b.state) || unarmed, "{:?} -> {:?}", b.state, a.state);
            if b.state.is_terminal() {
                assert_eq!(a, b, "a finished timer never changes");
            }
        }
        results.push(result);

        // Counters agree with a recount.
        let count = |f: fn(TimerState) -> bool| shard.table.timers.values().filter(|r| f(r.state)).count() as u64;
        assert_eq!(shard.meta.scheduled, count(|s| s == TimerState::Scheduled));
        assert_eq!(shard.meta.firing, count(|s| s == TimerState::Firing));
        assert_eq!(shard.meta.finished, count(TimerState::is_terminal));
    }
    (results, shard)
}

/// Whether `record` (in `shard` as it was before a command applied at
/// `now`) is an armed first attempt this shard's current leader armed and
/// whose time has not come: nothing of it can have been sent.
fn armed_by_this_leader(shard: &Shard, record: &tocsin_core::TimerRecord, now: u64) -> bool {
    let now = now.max(shard.meta.clock_ms);
    record.state == TimerState::Firing
        && record.attempts.is_empty()
        && record.fire.as_ref().is_some_and(|f| {
            matches!(f.phase, tocsin_core::FirePhase::InFlight { .. })
                && f.attempt == 1
                && f.attempt_started_at_ms > now
                && f.epoch == shard.meta.epoch
                && f.fire_index / tocsin_core::command::MAX_COMMANDS_PER_PROPOSAL as u64 > shard.meta.epoch
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]
    #[test]
    fn apply_rules_keep_their_promises(steps in proptest::collection::vec(step(), 1..120)) {
        let (results, shard) = run(&steps);
        // Determinism: a second replica applying the same log agrees exactly.
        let (results_again, replica) = run(&steps);
        prop_assert_eq!(results, results_again);
        prop_assert_eq!(shard.table, replica.table);
        prop_assert_eq!(shard.meta, replica.meta);
    }
}
