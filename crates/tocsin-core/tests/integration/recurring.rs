//! Recurring timers under the apply rules: each occurrence a firing of its
//! own, the next one fixed in the entry that fires the current one.

use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::TimerSpec;
use tocsin_core::TimerState;
use tocsin_core::command::AttemptOutcome;
use tocsin_core::recurrence::Recurrence;
use tocsin_core::recurrence::Rule;

use crate::apply_rules::Shard;
use crate::apply_rules::T0;
use crate::apply_rules::create;
use crate::apply_rules::spec;
use crate::apply_rules::webhook;

fn every(interval_ms: u64, count: u64) -> Recurrence {
    Recurrence { rule: Rule::Every { interval_ms }, until_ms: 0, count, catch_up_all: false }
}

fn series_spec(first_at_ms: u64, recurrence: Recurrence) -> TimerSpec {
    TimerSpec { recurrence: Some(recurrence), ..spec(first_at_ms, webhook()) }
}

fn fire(key: &TimerKey, due_ms: u64, epoch: u64) -> Command {
    Command::Fire { key: key.clone(), due_ms, epoch, timeout_ms: 30_000 }
}

fn outcome(key: &TimerKey, record: &TimerRecord, outcome: AttemptOutcome) -> Command {
    let fire = record.fire.as_ref().expect("fired");
    Command::AttemptResult {
        key: key.clone(),
        fire_index: fire.fire_index,
        attempt: fire.attempt,
        outcome,
        report: Default::default(),
    }
}

fn dispatched(result: CommandResult) -> TimerRecord {
    match result {
        CommandResult::Dispatch { record } => record,
        other => panic!("expected a dispatch, got {other:?}"),
    }
}

#[test]
fn each_occurrence_fires_once_with_its_own_fire_id_and_a_failover_neither_skips_nor_doubles_one() {
    let mut shard = Shard::new();
    let epoch = shard.elect(T0, 1);
    let key = TimerKey::new("reports", "daily");
    shard.apply(T0, create(&key, &series_spec(T0 + 1_000, every(1_000, 3)), 3));

    // Phase: the first occurrence fires; the same entry fixes the next.
    let first = dispatched(shard.apply(T0 + 1_000, fire(&key, T0 + 1_000, epoch)));
    let series = first.series.clone().unwrap();
    assert_eq!((series.occurrence, series.next_at_ms), (1, Some(T0 + 2_000)));
    assert_eq!(first.state, TimerState::Firing);

    // Phase: the leader dies with the attempt in flight. The new leader
    // redelivers that attempt (the same firing, the same fire id): the
    // series does not move on, so nothing is doubled, and the next
    // occurrence is still the one fixed before.
    let epoch2 = shard.elect(T0 + 1_200, 2);
    let redelivered = dispatched(shard.apply(T0 + 1_300, fire(&key, T0 + 31_000, epoch2)));
    let (a, b) = (first.fire.as_ref().unwrap(), redelivered.fire.as_ref().unwrap());
    assert_eq!(a.fire_index, b.fire_index, "one occurrence, one fire id");
    assert_eq!(b.attempt, 2);
    assert_eq!(redelivered.series.as_ref().unwrap().occurrence, 1);
    assert_eq!(redelivered.series.as_ref().unwrap().next_at_ms, Some(T0 + 2_000));

    // Phase: delivered: scheduled at the next occurrence, a new generation.
    let CommandResult::Recorded { record } =
        shard.apply(T0 + 1_400, outcome(&key, &redelivered, AttemptOutcome::Delivered))
    else {
        panic!()
    };
    assert_eq!((record.state, record.fire_at_ms, record.generation), (TimerState::Scheduled, T0 + 2_000, 2));
    assert!(record.fire.is_none());
    assert_eq!(record.due_ms(), Some(T0 + 2_000), "in the fire-time index at the next occurrence");
    assert_eq!((shard.meta.scheduled, shard.meta.firing, shard.meta.finished), (1, 0, 0));

    // Phase: occurrences 2 and 3 fire with fire ids of their own; the third
    // is the last (count 3) and the series ends DELIVERED.
    let mut fire_indexes = vec![a.fire_index];
    for (n, at) in [(2u64, T0 + 2_000), (3, T0 + 3_000)] {
        let record = dispatched(shard.apply(at, fire(&key, at, epoch2)));
        let series = record.series.clone().unwrap();
        assert_eq!(series.occurrence, n);
        assert_eq!(series.next_at_ms, (n < 3).then_some(at + 1_000));
        fire_indexes.push(record.fire.as_ref().unwrap().fire_index);
        shard.apply(at + 5, outcome(&key, &record, AttemptOutcome::Delivered));
    }
    fire_indexes.dedup();
    assert_eq!(fire_indexes.len(), 3, "three occurrences, three fire ids");
    let done = shard.table.timers.get(&key).unwrap().clone();
    assert_eq!(done.state, TimerState::Delivered);
    assert_eq!(done.series.as_ref().unwrap().delivered, 3);
    assert!(shard.table.due.is_empty());
    assert_eq!((shard.meta.scheduled, shard.meta.finished), (0, 1));
}

#[test]
fn a_series_late_by_many_slots_fires_once_unless_asked_for_every_slot() {
    let mut shard = Shard::new();
    let epoch = shard.elect(T0, 1);
    let (once, all) = (TimerKey::new("ns", "once"), TimerKey::new("ns", "all"));
    shard.apply(T0, create(&once, &series_spec(T0 + 60_000, every(60_000, 0)), 3));
    let catch_up = Recurrence { catch_up_all: true, ..every(60_000, 0) };
    shard.apply(T0, create(&all, &series_spec(T0 + 60_000, catch_up), 3));

    // Phase: three hours of outage; the first occurrence fires at last.
    let late = T0 + 3 * 3_600_000 + 30_000;
    let record = dispatched(shard.apply(late, fire(&once, T0 + 60_000, epoch)));
    // Once: the next is the first slot after now, not the 179 missed ones.
    assert_eq!(record.series.unwrap().next_at_ms, Some(T0 + 3 * 3_600_000 + 60_000));
    let record = dispatched(shard.apply(late, fire(&all, T0 + 60_000, epoch)));
    // Every slot: the one after the late occurrence's own time.
    assert_eq!(record.series.unwrap().next_at_ms, Some(T0 + 120_000));
}

#[test]
fn a_late_occurrence_is_skipped_and_a_dead_one_does_not_end_the_series() {
    let mut shard = Shard::new();
    let epoch = shard.elect(T0, 1);
    let key = TimerKey::new("ns", "strict");
    let strict = TimerSpec { skip_if_late_ms: 5_000, ..series_spec(T0 + 1_000, every(60_000, 0)) };
    shard.apply(T0, create(&key, &strict, 1));

    // Phase: 10 s late, beyond the policy: skipped, and the series goes on.
    let CommandResult::LateSkipped { record } = shard.apply(T0 + 11_000, fire(&key, T0 + 1_000, epoch)) else {
        panic!()
    };
    assert_eq!((record.state, record.fire_at_ms), (TimerState::Scheduled, T0 + 61_000));
    assert_eq!(record.series.as_ref().unwrap().skipped, 1);

    // Phase: the next occurrence fails its only attempt: DEAD for that
    // occurrence (the history says so), the series scheduled at the next.
    let record = dispatched(shard.apply(T0 + 61_000, fire(&key, T0 + 61_000, epoch)));
    let failed = AttemptOutcome::Failed { error: "503".into(), retry_at_ms: T0 + 62_000 };
    let CommandResult::Dead { record } = shard.apply(T0 + 61_010, outcome(&key, &record, failed)) else { panic!() };
    assert_eq!((record.state, record.fire_at_ms), (TimerState::Scheduled, T0 + 121_000));
    let series = record.series.as_ref().unwrap();
    assert_eq!((series.occurrence, series.dead, series.skipped), (2, 1, 1));
    assert_eq!(record.attempts.len(), 1);
}

#[test]
fn cancel_ends_the_series_and_reschedule_moves_its_next_occurrence() {
    let mut shard = Shard::new();
    let epoch = shard.elect(T0, 1);
    let (a, b) = (TimerKey::new("ns", "a"), TimerKey::new("ns", "b"));
    shard.apply(T0, create(&a, &series_spec(T0 + 1_000, every(1_000, 0)), 3));
    shard.apply(T0, create(&b, &series_spec(T0 + 1_000, every(1_000, 0)), 3));

    // Phase: cancelled while an occurrence is being delivered: no further
    // attempt, no further occurrence.
    let record = dispatched(shard.apply(T0 + 1_000, fire(&a, T0 + 1_000, epoch)));
    assert!(matches!(
        shard.apply(T0 + 1_001, Command::Cancel { key: a.clone() }),
        CommandResult::CancelledWhileFiring { attempt_in_flight: true, .. }
    ));
    assert_eq!(
        shard.apply(T0 + 1_002, outcome(&a, &record, AttemptOutcome::Delivered)),
        CommandResult::Skipped { reason: tocsin_core::command::SkipReason::WrongState }
    );
    assert_eq!(shard.state(&a), Some(TimerState::Cancelled));

    // Phase: a reschedule moves b's next occurrence; the interval goes on
    // from there.
    let CommandResult::Rescheduled { record } =
        shard.apply(T0 + 500, Command::Reschedule { key: b.clone(), expected_generation: 1, fire_at_ms: T0 + 5_500 })
    else {
        panic!()
    };
    assert_eq!(record.fire_at_ms, T0 + 5_500);
    let record = dispatched(shard.apply(T0 + 5_500, fire(&b, T0 + 5_500, epoch)));
    assert_eq!(record.series.unwrap().next_at_ms, Some(T0 + 6_500));

    // Phase: cancelled while scheduled: ends, out of the index.
    shard.apply(T0 + 5_600, Command::Cancel { key: b.clone() });
    assert!(shard.table.due.is_empty());
    assert_eq!(shard.meta.scheduled + shard.meta.firing, 0);
}

#[test]
fn the_spec_digest_tells_series_apart() {
    let base = spec(T0 + 1_000, webhook());
    let a = series_spec(T0 + 1_000, every(1_000, 0));
    let b = series_spec(T0 + 1_000, every(2_000, 0));
    let c = series_spec(
        T0 + 1_000,
        Recurrence {
            rule: Rule::Cron { expr: "0 9 * * MON".into(), tz: "Europe/Berlin".into() },
            until_ms: 0,
            count: 0,
            catch_up_all: false,
        },
    );
    let digests = [base.digest(), a.digest(), b.digest(), c.digest()];
    for i in 0..digests.len() {
        for j in i + 1..digests.len() {
            assert_ne!(digests[i], digests[j], "{i} vs {j}");
        }
    }
}
