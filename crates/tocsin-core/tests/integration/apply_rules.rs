//! The apply rules, one scenario per test, each in linear phases.

use std::collections::BTreeMap;

use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::FirePhase;
use tocsin_core::Proposal;
use tocsin_core::ShardMeta;
use tocsin_core::TimerKey;
use tocsin_core::TimerSpec;
use tocsin_core::TimerState;
use tocsin_core::apply::apply_proposal;
use tocsin_core::command::AttemptOutcome;
use tocsin_core::command::AttemptReport;
use tocsin_core::command::SkipReason;
use tocsin_core::limits::MAX_ATTEMPT_HISTORY;
use tocsin_core::timer::AttemptEnd;
use tocsin_core::timer::Callback;
use tocsin_core::timer::DeadReason;
use tocsin_core::timer::FireTime;
use tocsin_core::timer::RetryPolicy;

use tocsin_core::mem_table::MemTable;

pub const T0: u64 = 1_800_000_000_000;

pub fn spec(fire_at_ms: u64, callback: Callback) -> TimerSpec {
    TimerSpec {
        fire_time: FireTime::At(fire_at_ms),
        payload: bytes::Bytes::from_static(b"{\"order\":42}"),
        labels: BTreeMap::from([("team".to_string(), "payments".to_string())]),
        callback,
        retry: RetryPolicy::default(),
        skip_if_late_ms: 0,
        recurrence: None,
    }
}

pub fn webhook() -> Callback {
    Callback::Webhook { url: "http://127.0.0.1:9000/hook".to_string() }
}

pub fn create(key: &TimerKey, spec: &TimerSpec, max_attempts: u32) -> Command {
    let FireTime::At(fire_at_ms) = spec.fire_time else { unreachable!() };
    Command::Create {
        key: key.clone(),
        spec: Box::new(spec.clone()),
        fire_at_ms,
        retry: RetryPolicy { max_attempts, initial_backoff_ms: 1000, max_backoff_ms: 60_000, give_up_after_ms: 0 },
        retention_ms: 3_600_000,
        replace_finished: false,
    }
}

/// A shard state plus a log index counter, applying one command per entry.
pub struct Shard {
    pub table: MemTable,
    pub meta: ShardMeta,
    pub index: u64,
}

impl Shard {
    pub fn new() -> Shard {
        Shard { table: MemTable::default(), meta: ShardMeta::default(), index: 0 }
    }

    pub fn apply(&mut self, now_ms: u64, cmd: Command) -> CommandResult {
        self.index += 1;
        let proposal = Proposal { now_ms, commands: vec![cmd].into() };
        let mut results =
            apply_proposal(&mut self.table, &mut self.meta, self.index, &proposal).expect("no broken invariant");
        assert_eq!(results.len(), 1);
        results.pop().unwrap()
    }

    /// Elects a leader: returns the new fencing epoch.
    pub fn elect(&mut self, now_ms: u64, leader: u64) -> u64 {
        match self.apply(now_ms, Command::LeaderEpoch { leader }) {
            CommandResult::Epoch { epoch, .. } => epoch,
            other => panic!("{other:?}"),
        }
    }

    pub fn state(&self, key: &TimerKey) -> Option<TimerState> {
        self.table.timers.get(key).map(|r| r.state)
    }
}

fn fire(key: &TimerKey, due_ms: u64, epoch: u64) -> Command {
    Command::Fire { key: key.clone(), due_ms, epoch, timeout_ms: 30_000 }
}

#[test]
fn create_is_idempotent_and_detects_conflicts() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "order-42");
    let s = spec(T0 + 1000, webhook());

    // Phase: the first create makes the timer.
    let CommandResult::Created { record, created } = shard.apply(T0, create(&key, &s, 3)) else { panic!() };
    assert!(created);
    assert_eq!(record.generation, 1);
    assert_eq!(record.state, TimerState::Scheduled);

    // Phase: a retry with the same spec finds it, even later.
    let CommandResult::Created { record: again, created } = shard.apply(T0 + 500, create(&key, &s, 3)) else {
        panic!()
    };
    assert!(!created);
    assert_eq!(again, record);

    // Phase: a different spec under the same id is refused.
    let other = spec(T0 + 2000, webhook());
    assert!(matches!(shard.apply(T0, create(&key, &other, 3)), CommandResult::AlreadyExists { .. }));
    assert_eq!(shard.meta.scheduled, 1);
}

#[test]
fn a_fire_later_than_the_late_fire_policy_allows_is_skipped() {
    let mut shard = Shard::new();
    let epoch = shard.elect(T0, 1);
    let (late, lax, on_time) =
        (TimerKey::new("ns", "late"), TimerKey::new("ns", "lax"), TimerKey::new("ns", "on-time"));
    let strict = TimerSpec { skip_if_late_ms: 5_000, ..spec(T0 + 1000, webhook()) };
    shard.apply(T0, create(&late, &strict, 3));
    shard.apply(T0, create(&on_time, &strict, 3));
    shard.apply(T0, create(&lax, &spec(T0 + 1000, webhook()), 3));
    assert_ne!(strict.digest(), spec(T0 + 1000, webhook()).digest(), "the policy is part of the spec");

    // Phase: 5 s late is within the bound: it fires, and the delivery can
    // say how late (fired_at - fire_at).
    let CommandResult::Dispatch { record } = shard.apply(T0 + 6_000, fire(&on_time, T0 + 1000, epoch)) else {
        panic!()
    };
    assert_eq!(record.fire.unwrap().fired_at_ms - record.fire_at_ms, 5_000);

    // Phase: a millisecond more and it is skipped: terminal, out of the
    // index, nothing dispatched; counted as finished.
    let CommandResult::LateSkipped { record } = shard.apply(T0 + 6_001, fire(&late, T0 + 1000, epoch)) else {
        panic!()
    };
    assert_eq!((record.state, record.due(), record.fire.is_none()), (TimerState::Skipped, None, true));
    assert_eq!(record.finished_at_ms, T0 + 6_001);
    assert!(matches!(shard.apply(T0 + 7_000, fire(&late, T0 + 1000, epoch)), CommandResult::Skipped { .. }));
    assert!(matches!(
        shard.apply(T0 + 7_000, Command::Cancel { key: late.clone() }),
        CommandResult::AlreadyFired { .. }
    ));

    // Phase: without a policy, an hour late still fires.
    assert!(matches!(shard.apply(T0 + 3_600_000, fire(&lax, T0 + 1000, epoch)), CommandResult::Dispatch { .. }));
    assert_eq!((shard.meta.scheduled, shard.meta.firing, shard.meta.finished), (0, 2, 1));
}

#[test]
fn cancel_while_firing_stops_the_retries_and_says_whether_an_attempt_is_under_way() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "a");
    shard.apply(T0, create(&key, &spec(T0 + 1000, webhook()), 3));
    let epoch = shard.elect(T0, 1);

    // Phase: the fire is recorded and dispatched.
    let CommandResult::Dispatch { record } = shard.apply(T0 + 1000, fire(&key, T0 + 1000, epoch)) else { panic!() };
    let fire_facts = record.fire.clone().unwrap();
    assert_eq!(fire_facts.epoch, epoch);
    assert_eq!(fire_facts.attempt, 1);

    // Phase: a cancel while the first attempt is under way cancels, and says
    // the attempt may still arrive.
    let CommandResult::CancelledWhileFiring { record, attempt_in_flight } =
        shard.apply(T0 + 1001, Command::Cancel { key: key.clone() })
    else {
        panic!()
    };
    assert!(attempt_in_flight);
    assert_eq!(record.fire.unwrap().fire_index, fire_facts.fire_index);
    assert_eq!(shard.state(&key), Some(TimerState::Cancelled));
    assert!(shard.table.due.is_empty(), "no deadline left: no further attempt");
    assert_eq!((shard.meta.firing, shard.meta.finished), (0, 1));

    // Phase: the attempt's late outcome and the wheel's look at the old
    // deadline change nothing.
    let result = Command::AttemptResult {
        key: key.clone(),
        fire_index: fire_facts.fire_index,
        attempt: 1,
        outcome: AttemptOutcome::Failed { error: "503".into(), retry_at_ms: T0 + 2000 },
        report: Default::default(),
    };
    assert_eq!(shard.apply(T0 + 1002, result), CommandResult::Skipped { reason: SkipReason::WrongState });
    assert_eq!(
        shard.apply(T0 + 31_000, fire(&key, T0 + 31_000, epoch)),
        CommandResult::Skipped { reason: SkipReason::Stale }
    );
    assert!(matches!(
        shard.apply(T0 + 31_001, Command::Cancel { key: key.clone() }),
        CommandResult::AlreadyCancelled { .. }
    ));

    // Phase: a timer in backoff (no attempt under way) cancels with
    // attempt_in_flight false; a delivered one is already fired.
    let b = TimerKey::new("orders", "b");
    shard.apply(T0 + 40_000, create(&b, &spec(T0 + 41_000, webhook()), 3));
    let CommandResult::Dispatch { record } = shard.apply(T0 + 41_000, fire(&b, T0 + 41_000, epoch)) else { panic!() };
    let fire_index = record.fire.unwrap().fire_index;
    let failed = Command::AttemptResult {
        key: b.clone(),
        fire_index,
        attempt: 1,
        outcome: AttemptOutcome::Failed { error: "503".into(), retry_at_ms: T0 + 42_000 },
        report: Default::default(),
    };
    assert!(matches!(shard.apply(T0 + 41_001, failed), CommandResult::Recorded { .. }));
    assert!(matches!(
        shard.apply(T0 + 41_002, Command::Cancel { key: b.clone() }),
        CommandResult::CancelledWhileFiring { attempt_in_flight: false, .. }
    ));
    let c = TimerKey::new("orders", "c");
    shard.apply(T0 + 50_000, create(&c, &spec(T0 + 51_000, webhook()), 3));
    let CommandResult::Dispatch { record } = shard.apply(T0 + 51_000, fire(&c, T0 + 51_000, epoch)) else { panic!() };
    let delivered = Command::AttemptResult {
        key: c.clone(),
        fire_index: record.fire.unwrap().fire_index,
        attempt: 1,
        outcome: AttemptOutcome::Delivered,
        report: Default::default(),
    };
    shard.apply(T0 + 51_001, delivered);
    assert!(matches!(shard.apply(T0 + 51_002, Command::Cancel { key: c.clone() }), CommandResult::AlreadyFired { .. }));
}

#[test]
fn a_finished_id_is_refused_unless_replaced_and_a_replacement_is_a_new_generation() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "sub");
    let s = spec(T0 + 1000, webhook());
    let CommandResult::Created { record: first, created: true } = shard.apply(T0, create(&key, &s, 3)) else {
        panic!()
    };
    assert!(matches!(shard.apply(T0 + 10, Command::Cancel { key: key.clone() }), CommandResult::Cancelled { .. }));

    // Phase: the same spec again finds the cancelled timer and says so;
    // nothing is scheduled.
    let CommandResult::Finished { record } = shard.apply(T0 + 20, create(&key, &s, 3)) else { panic!() };
    assert_eq!(record.state, TimerState::Cancelled);
    assert!(shard.table.due.is_empty());
    // Another spec is refused too.
    assert!(matches!(
        shard.apply(T0 + 20, create(&key, &spec(T0 + 5000, webhook()), 3)),
        CommandResult::AlreadyExists { .. }
    ));

    // Phase: asked to, a create replaces it: a new timer, generation 2, a
    // new incarnation, in the fire-time index.
    let mut replace = create(&key, &s, 3);
    if let Command::Create { replace_finished, .. } = &mut replace {
        *replace_finished = true;
    }
    let CommandResult::Created { record: second, created: true } = shard.apply(T0 + 30, replace.clone()) else {
        panic!()
    };
    assert_eq!((second.state, second.generation), (TimerState::Scheduled, 2));
    assert!(second.created_index > first.created_index);
    assert_eq!(second.fire, None);
    assert_eq!(shard.table.due.len(), 1);
    assert_eq!((shard.meta.scheduled, shard.meta.finished), (1, 0));

    // Phase: replace never touches a live timer: the same spec is found,
    // another is refused.
    assert!(matches!(shard.apply(T0 + 40, replace), CommandResult::Created { created: false, .. }));
    let mut other = create(&key, &spec(T0 + 9000, webhook()), 3);
    if let Command::Create { replace_finished, .. } = &mut other {
        *replace_finished = true;
    }
    assert!(matches!(shard.apply(T0 + 40, other), CommandResult::AlreadyExists { .. }));

    // Phase: it fires with a fire id of its own.
    let epoch = shard.elect(T0 + 50, 1);
    let CommandResult::Dispatch { record } = shard.apply(T0 + 1000, fire(&key, T0 + 1000, epoch)) else { panic!() };
    assert_eq!(record.generation, 2);
    assert!(record.fire.unwrap().fire_index > first.created_index * 4096);
}

#[test]
fn attempts_are_kept_in_the_history_and_a_dead_timer_can_be_redriven() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "dead");
    shard.apply(T0, create(&key, &spec(T0 + 1000, webhook()), 2));
    let epoch = shard.elect(T0, 1);

    // Phase: attempt 1 fails (503), attempt 2 gets no outcome before its
    // deadline: with max_attempts 2 the timer dies, MAX_ATTEMPTS.
    let CommandResult::Dispatch { record } = shard.apply(T0 + 1000, fire(&key, T0 + 1000, epoch)) else { panic!() };
    let first_fire = record.fire.unwrap().fire_index;
    let failed = Command::AttemptResult {
        key: key.clone(),
        fire_index: first_fire,
        attempt: 1,
        outcome: AttemptOutcome::Failed { error: "http 503".into(), retry_at_ms: T0 + 3000 },
        report: AttemptReport::new(503, "5xx", 42),
    };
    assert!(matches!(shard.apply(T0 + 1050, failed), CommandResult::Recorded { .. }));
    let CommandResult::Dispatch { record } = shard.apply(T0 + 3000, fire(&key, T0 + 3000, epoch)) else { panic!() };
    let until = record.due_ms().unwrap();
    let CommandResult::Dead { record } = shard.apply(until, fire(&key, until, epoch)) else { panic!() };
    let fire_facts = record.fire.clone().unwrap();
    assert_eq!(fire_facts.dead_reason, Some(DeadReason::MaxAttempts));
    let ends: Vec<_> = record.attempts.iter().map(|a| (a.attempt, a.end, a.status, a.latency_ms)).collect();
    assert_eq!(ends, vec![(1, AttemptEnd::Failed, 503, 42), (2, AttemptEnd::NoOutcome, 0, 0)]);
    assert_eq!(record.attempts[0].class, "5xx");
    assert_eq!(
        (record.attempts[0].started_at_ms, record.attempts[0].finished_at_ms, record.attempts[1].started_at_ms),
        (T0 + 1000, T0 + 1050, T0 + 3000)
    );

    // Phase: only a DEAD timer is redriven; it is scheduled again at once,
    // generation 2, and its history stays.
    let live = TimerKey::new("orders", "live");
    shard.apply(T0 + 10, create(&live, &spec(T0 + 60_000, webhook()), 2));
    assert!(matches!(
        shard.apply(until + 1, Command::Redrive { key: live.clone() }),
        CommandResult::NotDead { record } if record.state == TimerState::Scheduled
    ));
    assert_eq!(shard.apply(until + 1, Command::Redrive { key: TimerKey::new("orders", "x") }), CommandResult::NotFound);
    let CommandResult::Redriven { record } = shard.apply(until + 10, Command::Redrive { key: key.clone() }) else {
        panic!()
    };
    assert_eq!((record.state, record.generation, record.fire_at_ms), (TimerState::Scheduled, 2, until + 10));
    assert_eq!(record.fire, None);
    assert_eq!(record.attempts.len(), 2);
    assert_eq!((shard.meta.scheduled, shard.meta.finished), (2, 0));

    // Phase: it fires again as a new firing (new fire index, attempt 1) and
    // is delivered; a 410 on another timer is GONE.
    let CommandResult::Dispatch { record } = shard.apply(until + 10, fire(&key, until + 10, epoch)) else { panic!() };
    let second = record.fire.unwrap();
    assert!(second.fire_index > first_fire);
    assert_eq!(second.attempt, 1);
    let ok = Command::AttemptResult {
        key: key.clone(),
        fire_index: second.fire_index,
        attempt: 1,
        outcome: AttemptOutcome::Delivered,
        report: AttemptReport::new(200, "2xx", 7),
    };
    let CommandResult::Recorded { record } = shard.apply(until + 20, ok) else { panic!() };
    assert_eq!(record.state, TimerState::Delivered);
    assert_eq!(record.attempts.last().map(|a| (a.fire_index, a.end)), Some((second.fire_index, AttemptEnd::Delivered)));
    let CommandResult::Dispatch { record } = shard.apply(T0 + 60_000, fire(&live, T0 + 60_000, epoch)) else {
        panic!()
    };
    let gone = Command::AttemptResult {
        key: live.clone(),
        fire_index: record.fire.unwrap().fire_index,
        attempt: 1,
        outcome: AttemptOutcome::GiveUp { error: "http 410 gone".into() },
        report: AttemptReport::new(410, "4xx", 3),
    };
    let CommandResult::Dead { record } = shard.apply(T0 + 60_010, gone) else { panic!() };
    assert_eq!(record.fire.unwrap().dead_reason, Some(DeadReason::Gone));
}

#[test]
fn the_history_keeps_the_latest_attempts_only() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "flaky");
    shard.apply(T0, create(&key, &spec(T0 + 1000, webhook()), 1000));
    let epoch = shard.elect(T0, 1);
    let mut now = T0 + 1000;
    let CommandResult::Dispatch { mut record } = shard.apply(now, fire(&key, now, epoch)) else { panic!() };
    for _ in 0..(MAX_ATTEMPT_HISTORY + 8) {
        let facts = record.fire.clone().unwrap();
        let failed = Command::AttemptResult {
            key: key.clone(),
            fire_index: facts.fire_index,
            attempt: facts.attempt,
            outcome: AttemptOutcome::Failed { error: "http 500".into(), retry_at_ms: now + 1000 },
            report: AttemptReport::new(500, "5xx", 1),
        };
        shard.apply(now + 1, failed);
        now += 1000;
        let CommandResult::Dispatch { record: next } = shard.apply(now, fire(&key, now, epoch)) else { panic!() };
        record = next;
    }
    assert_eq!(record.attempts.len(), MAX_ATTEMPT_HISTORY);
    assert_eq!(record.attempts[0].attempt, 9, "the oldest are dropped");
    assert_eq!(record.attempts.last().unwrap().attempt as usize, MAX_ATTEMPT_HISTORY + 8);
}

#[test]
fn fire_after_cancel_is_a_no_op() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "b");
    shard.apply(T0, create(&key, &spec(T0 + 1000, webhook()), 3));
    let epoch = shard.elect(T0, 1);

    assert!(matches!(shard.apply(T0 + 10, Command::Cancel { key: key.clone() }), CommandResult::Cancelled { .. }));
    assert_eq!(
        shard.apply(T0 + 1000, fire(&key, T0 + 1000, epoch)),
        CommandResult::Skipped { reason: SkipReason::Stale }
    );
    assert!(matches!(
        shard.apply(T0 + 1001, Command::Cancel { key: key.clone() }),
        CommandResult::AlreadyCancelled { .. }
    ));
    assert_eq!(shard.state(&key), Some(TimerState::Cancelled));
    assert!(shard.table.due.is_empty(), "a cancelled timer leaves the fire-time index");
    assert_eq!((shard.meta.scheduled, shard.meta.finished), (0, 1));
}

#[test]
fn never_fires_early_nor_under_a_stale_epoch() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "c");
    shard.apply(T0, create(&key, &spec(T0 + 10_000, webhook()), 3));
    let old_epoch = shard.elect(T0, 1);
    let new_epoch = shard.elect(T0 + 1, 2);
    assert!(new_epoch > old_epoch);

    // Further ahead than a fire may be armed: not yet.
    let too_early = T0 + 9_999 - tocsin_core::limits::MAX_ARM_AHEAD_MS;
    assert_eq!(
        shard.apply(too_early, fire(&key, T0 + 10_000, new_epoch)),
        CommandResult::Skipped { reason: SkipReason::NotDue }
    );
    assert_eq!(
        shard.apply(T0 + 10_000, fire(&key, T0 + 10_000, old_epoch)),
        CommandResult::Skipped { reason: SkipReason::StaleEpoch }
    );
    // Closer than that it is armed: the attempt starts at the fire time,
    // not when the fire is applied.
    let CommandResult::Dispatch { record } = shard.apply(T0 + 9_999, fire(&key, T0 + 10_000, new_epoch)) else {
        panic!()
    };
    let facts = record.fire.unwrap();
    assert_eq!((facts.attempt, facts.fired_at_ms, facts.attempt_started_at_ms), (1, T0 + 10_000, T0 + 10_000));
    assert_eq!(facts.phase, FirePhase::InFlight { since_ms: T0 + 10_000, until_ms: T0 + 40_000 });
}

#[test]
fn an_armed_fire_is_undone_by_a_cancel_or_reschedule_before_its_time_under_its_leader() {
    let mut shard = Shard::new();
    let (a, b, c) =
        (TimerKey::new("orders", "arm-a"), TimerKey::new("orders", "arm-b"), TimerKey::new("orders", "arm-c"));
    for key in [&a, &b, &c] {
        shard.apply(T0, create(key, &spec(T0 + 1000, webhook()), 3));
    }
    let epoch = shard.elect(T0, 1);
    for key in [&a, &b, &c] {
        assert!(matches!(shard.apply(T0 + 800, fire(key, T0 + 1000, epoch)), CommandResult::Dispatch { .. }));
    }
    assert_eq!(shard.table.due.len(), 3, "armed attempts are indexed at their deadline");
    assert_eq!((shard.meta.scheduled, shard.meta.firing), (0, 3));

    // Phase: a cancel before the fire time undoes the fire: cancelled, never
    // fired, out of the index.
    let CommandResult::Cancelled { record } = shard.apply(T0 + 999, Command::Cancel { key: a.clone() }) else {
        panic!()
    };
    assert_eq!((record.state, record.fire.is_none(), record.due()), (TimerState::Cancelled, true, None));

    // Phase: a reschedule before the fire time puts it back, scheduled at the
    // new time, the generation raised.
    let resched = Command::Reschedule { key: b.clone(), expected_generation: 1, fire_at_ms: T0 + 5000 };
    let CommandResult::Rescheduled { record } = shard.apply(T0 + 999, resched) else { panic!() };
    assert_eq!((record.state, record.fire_at_ms, record.generation), (TimerState::Scheduled, T0 + 5000, 2));
    assert!(record.fire.is_none());
    assert_eq!((shard.meta.scheduled, shard.meta.firing, shard.meta.finished), (1, 1, 1));

    // Phase: at its time the attempt has started: a cancel no longer undoes
    // it, and a reschedule no longer applies.
    let resched = Command::Reschedule { key: c.clone(), expected_generation: 1, fire_at_ms: T0 + 5000 };
    assert_eq!(shard.apply(T0 + 1000, resched), CommandResult::NotScheduled { state: TimerState::Firing });
    assert!(matches!(
        shard.apply(T0 + 1000, Command::Cancel { key: c.clone() }),
        CommandResult::CancelledWhileFiring { attempt_in_flight: true, .. }
    ));
}

#[test]
fn a_new_leader_takes_over_an_armed_attempt_at_its_time_without_using_up_an_attempt() {
    let mut shard = Shard::new();
    let (a, b) = (TimerKey::new("orders", "taken-a"), TimerKey::new("orders", "taken-b"));
    for key in [&a, &b] {
        shard.apply(T0, create(key, &spec(T0 + 1000, webhook()), 1));
    }
    let first = shard.elect(T0, 1);
    for key in [&a, &b] {
        assert!(matches!(shard.apply(T0 + 800, fire(key, T0 + 1000, first)), CommandResult::Dispatch { .. }));
    }
    let deadline = T0 + 31_000;

    // Phase: the leader changes before the fire time. The first leader may
    // have sent nothing, or (its clock ahead) the attempt: a cancel under
    // the new leader answers "while firing".
    let second = shard.elect(T0 + 900, 2);
    assert!(matches!(
        shard.apply(T0 + 901, Command::Cancel { key: a.clone() }),
        CommandResult::CancelledWhileFiring { attempt_in_flight: true, .. }
    ));

    // Phase: the new leader takes the other over at once (an attempt of an
    // earlier leader is adopted now), still starting at the fire time, the
    // same attempt (one allowed: it is not used up, nor the timer dead).
    let CommandResult::Dispatch { record } = shard.apply(T0 + 902, fire(&b, deadline, second)) else { panic!() };
    let facts = record.fire.clone().unwrap();
    assert_eq!((facts.attempt, facts.epoch, facts.attempt_started_at_ms), (1, second, T0 + 1000));
    assert!(record.attempts.is_empty(), "no attempt ended: none was made");
    // Taken over, it may have been sent by the first leader: a cancel before
    // its time answers "while firing" under this leader too.
    let CommandResult::CancelledWhileFiring { record, .. } = shard.apply(T0 + 950, Command::Cancel { key: b.clone() })
    else {
        panic!()
    };
    assert_eq!(record.state, TimerState::Cancelled);
}

#[test]
fn only_a_push_timers_first_fire_is_armed_and_no_outcome_precedes_its_attempt() {
    let mut shard = Shard::new();
    let push = TimerKey::new("orders", "push");
    let pull = TimerKey::new("orders", "pull");
    let late_give_up = TimerKey::new("orders", "give-up");
    shard.apply(T0, create(&push, &spec(T0 + 1000, webhook()), 3));
    shard.apply(T0, create(&pull, &spec(T0 + 1000, Callback::Pull { topic: "t".into(), ttr_ms: 0 }), 3));
    let mut gives_up = create(&late_give_up, &spec(T0 + 1000, webhook()), 3);
    if let Command::Create { retry, .. } = &mut gives_up {
        retry.give_up_after_ms = T0 + 500;
    }
    shard.apply(T0, gives_up);
    let epoch = shard.elect(T0, 1);

    // Phase: a pull timer is offered at its time, not armed; nor is a timer
    // whose retry window ends before its time (it dies at its time).
    assert_eq!(
        shard.apply(T0 + 900, fire(&pull, T0 + 1000, epoch)),
        CommandResult::Skipped { reason: SkipReason::NotDue }
    );
    assert_eq!(
        shard.apply(T0 + 900, fire(&late_give_up, T0 + 1000, epoch)),
        CommandResult::Skipped { reason: SkipReason::NotDue }
    );

    // Phase: an outcome stamped before an armed attempt's start is refused:
    // nothing can have been sent yet.
    let CommandResult::Dispatch { record } = shard.apply(T0 + 900, fire(&push, T0 + 1000, epoch)) else { panic!() };
    let facts = record.fire.unwrap();
    let outcome = |at| Command::AttemptResult {
        key: push.clone(),
        fire_index: facts.fire_index,
        attempt: 1,
        outcome: AttemptOutcome::Failed { error: "503".into(), retry_at_ms: at + 1000 },
        report: AttemptReport::new(503, "5xx", 3),
    };
    assert_eq!(shard.apply(T0 + 950, outcome(T0 + 950)), CommandResult::Skipped { reason: SkipReason::NotDue });
    assert!(matches!(shard.apply(T0 + 1010, outcome(T0 + 1010)), CommandResult::Recorded { .. }));

    // Phase: its retry, after the backoff, is fired at its time, not armed.
    let retry_at = T0 + 2010;
    assert_eq!(
        shard.apply(retry_at - 100, fire(&push, retry_at, epoch)),
        CommandResult::Skipped { reason: SkipReason::NotDue }
    );
    let CommandResult::Dispatch { record } = shard.apply(retry_at, fire(&push, retry_at, epoch)) else { panic!() };
    assert_eq!(record.fire.unwrap().attempt, 2);
}

#[test]
fn reschedule_is_a_compare_and_set_on_generation() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "d");
    shard.apply(T0, create(&key, &spec(T0 + 1000, webhook()), 3));
    let epoch = shard.elect(T0, 1);
    let resched =
        |generation, at| Command::Reschedule { key: key.clone(), expected_generation: generation, fire_at_ms: at };

    let CommandResult::Rescheduled { record } = shard.apply(T0 + 1, resched(1, T0 + 5000)) else { panic!() };
    assert_eq!((record.generation, record.fire_at_ms), (2, T0 + 5000));
    assert_eq!(shard.apply(T0 + 2, resched(1, T0 + 9000)), CommandResult::GenerationMismatch { current: 2 });
    assert_eq!(shard.table.due.iter().next().unwrap().0, T0 + 5000);

    // Phase: a fire for the old fire time is stale; the new one fires.
    assert_eq!(
        shard.apply(T0 + 5000, fire(&key, T0 + 1000, epoch)),
        CommandResult::Skipped { reason: SkipReason::Stale }
    );
    assert!(matches!(shard.apply(T0 + 5000, fire(&key, T0 + 5000, epoch)), CommandResult::Dispatch { .. }));
    assert_eq!(
        shard.apply(T0 + 5001, resched(2, T0 + 9000)),
        CommandResult::NotScheduled { state: TimerState::Firing }
    );
}

#[test]
fn retries_back_off_then_die() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "e");
    shard.apply(T0, create(&key, &spec(T0, webhook()), 2));
    let epoch = shard.elect(T0, 1);
    let CommandResult::Dispatch { record } = shard.apply(T0, fire(&key, T0, epoch)) else { panic!() };
    let fire_index = record.fire.unwrap().fire_index;
    let failed = |attempt| Command::AttemptResult {
        key: key.clone(),
        fire_index,
        attempt,
        outcome: AttemptOutcome::Failed { error: "http 503".into(), retry_at_ms: T0 + 2000 },
        report: Default::default(),
    };

    // Phase: attempt 1 fails; the timer waits in backoff, indexed at the retry time.
    assert!(
        matches!(shard.apply(T0 + 10, failed(1)), CommandResult::Recorded { record } if record.state == TimerState::Firing)
    );
    assert_eq!(shard.table.due.iter().next().unwrap().0, T0 + 2000);
    assert_eq!(shard.apply(T0 + 11, failed(1)), CommandResult::Skipped { reason: SkipReason::Stale });

    // Phase: attempt 2 starts at the retry time and fails: out of attempts, so dead.
    let CommandResult::Dispatch { record } = shard.apply(T0 + 2000, fire(&key, T0 + 2000, epoch)) else { panic!() };
    assert_eq!(record.fire.as_ref().unwrap().attempt, 2);
    assert_eq!(
        shard.apply(T0 + 2000, fire(&key, T0 + 2000, epoch)),
        CommandResult::Skipped { reason: SkipReason::Stale }
    );
    assert!(matches!(shard.apply(T0 + 2010, failed(2)), CommandResult::Dead { .. }));
    assert_eq!(shard.state(&key), Some(TimerState::Dead));
    assert!(shard.table.due.is_empty());
    assert_eq!(shard.table.retention.len(), 1);
}

#[test]
fn a_new_leader_redelivers_what_the_old_one_left_in_flight() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "g");
    shard.apply(T0, create(&key, &spec(T0, webhook()), 5));
    let old = shard.elect(T0, 1);
    let CommandResult::Dispatch { record } = shard.apply(T0 + 1, fire(&key, T0, old)) else { panic!() };
    let first = record.fire.unwrap();

    // Phase: the old leader dies mid-delivery. The in-flight attempt is in the
    // fire-time index at its deadline, marked as an attempt of the old epoch,
    // so the new leader redelivers it at once instead of waiting for it.
    let new = shard.elect(T0 + 300, 2);
    let (due, due_key) = shard.table.due.iter().next().unwrap().clone();
    assert_eq!((due, &due_key), (T0 + 1 + 30_000, &key));
    let CommandResult::Dispatch { record } = shard.apply(T0 + 400, fire(&key, due, new)) else { panic!() };
    let second = record.fire.unwrap();
    assert_eq!(second.attempt, 2);
    assert_eq!(second.epoch, new);
    assert_eq!(second.fire_index, first.fire_index, "the same firing, so the same fire_id");

    // Phase: the old leader's late result is stale.
    let late = Command::AttemptResult {
        key: key.clone(),
        fire_index: first.fire_index,
        attempt: 1,
        outcome: AttemptOutcome::Delivered,
        report: Default::default(),
    };
    assert_eq!(shard.apply(T0 + 500, late), CommandResult::Skipped { reason: SkipReason::Stale });
}

#[test]
fn an_attempt_without_an_outcome_is_retried_at_its_deadline() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "deadline");
    shard.apply(T0, create(&key, &spec(T0, webhook()), 3));
    let epoch = shard.elect(T0, 1);
    let CommandResult::Dispatch { record } = shard.apply(T0, fire(&key, T0, epoch)) else { panic!() };
    let until = T0 + 30_000;
    assert_eq!(record.due_ms(), Some(until), "an attempt is indexed at its deadline");

    // Phase: the leader lost the attempt's outcome (a dropped reply, a lost task).
    // Its own wheel looking before the deadline starts nothing...
    assert_eq!(
        shard.apply(T0 + 29_999, fire(&key, until, epoch)),
        CommandResult::Skipped { reason: SkipReason::NotDue }
    );
    // ...and at the deadline it starts the next attempt, in the same epoch.
    let CommandResult::Dispatch { record } = shard.apply(until, fire(&key, until, epoch)) else { panic!() };
    let facts = record.fire.unwrap();
    assert_eq!((facts.attempt, facts.epoch), (2, epoch));
    assert_eq!(facts.last_error, "no outcome recorded before the attempt's deadline");

    // Phase: the last attempt's deadline passes too: out of attempts, dead.
    let CommandResult::Dispatch { .. } = shard.apply(until + 30_000, fire(&key, until + 30_000, epoch)) else {
        panic!()
    };
    let CommandResult::Dead { record } = shard.apply(until + 60_000, fire(&key, until + 60_000, epoch)) else {
        panic!()
    };
    assert!(record.fire.unwrap().last_error.starts_with("gave up after 3 attempts"));
    assert!(shard.table.due.is_empty());
}

#[test]
fn a_shards_clock_never_goes_backwards() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "clock");
    shard.apply(T0 + 5_000, create(&key, &spec(T0 + 6_000, webhook()), 3));
    let epoch = shard.elect(T0 + 5_000, 1);

    // Phase: a leader whose clock is behind stamps an earlier time: apply uses the
    // shard's latest time, so the timer is neither early nor fired in the past.
    assert_eq!(shard.apply(T0, Command::Cancel { key: TimerKey::new("orders", "none") }), CommandResult::NotFound);
    assert_eq!(shard.meta.clock_ms, T0 + 5_000);
    // A fire armed at that time starts its attempt at the fire time, never
    // earlier; a cancel stamped behind still undoes it, at the shard's time.
    let CommandResult::Dispatch { record } = shard.apply(T0, fire(&key, T0 + 6_000, epoch)) else { panic!() };
    assert_eq!(record.fire.unwrap().attempt_started_at_ms, T0 + 6_000);
    let CommandResult::Cancelled { record } = shard.apply(T0 + 10, Command::Cancel { key: key.clone() }) else {
        panic!()
    };
    assert_eq!(record.finished_at_ms, T0 + 5_000);
}

#[test]
fn pull_timers_wait_ready_then_reserve_and_ack() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "p");
    let pull = Callback::Pull { topic: "close-order".into(), ttr_ms: 0 };
    shard.apply(T0, create(&key, &spec(T0, pull), 5));
    let epoch = shard.elect(T0, 1);

    // Phase: the fire makes it ready, with no attempt yet.
    let CommandResult::Dispatch { record } = shard.apply(T0, fire(&key, T0, epoch)) else { panic!() };
    let facts = record.fire.unwrap();
    assert_eq!(facts.attempt, 0);

    // Phase: a consumer reserves it (attempt 1); a late ack for attempt 0 is stale.
    let reserve = |expected_attempt| Command::Reserve {
        key: key.clone(),
        fire_index: facts.fire_index,
        expected_attempt,
        epoch,
        until_ms: T0 + 30_000,
    };
    assert!(matches!(shard.apply(T0 + 5, reserve(0)), CommandResult::Dispatch { .. }));
    let ack = |attempt| Command::AttemptResult {
        key: key.clone(),
        fire_index: facts.fire_index,
        attempt,
        outcome: AttemptOutcome::Delivered,
        report: Default::default(),
    };
    assert_eq!(shard.apply(T0 + 6, ack(0)), CommandResult::Skipped { reason: SkipReason::Stale });

    // Phase: while the reservation runs, nobody else may take it, not even a new
    // leader: the consumer may still ack.
    let newer = shard.elect(T0 + 10, 2);
    let reserve_under = |epoch, expected_attempt| Command::Reserve {
        key: key.clone(),
        fire_index: facts.fire_index,
        expected_attempt,
        epoch,
        until_ms: T0 + 70_000,
    };
    assert_eq!(shard.apply(T0 + 20, reserve_under(newer, 1)), CommandResult::Skipped { reason: SkipReason::NotDue });
    assert_eq!(
        shard.apply(T0 + 20, fire(&key, T0 + 30_000, newer)),
        CommandResult::Skipped { reason: SkipReason::NotDue }
    );

    // Phase: the reservation runs out; another consumer reserves it (attempt 2), so
    // the first consumer's ack is stale and the second one's counts.
    let reserve = |expected_attempt| reserve_under(newer, expected_attempt);
    assert!(matches!(shard.apply(T0 + 40_000, reserve(1)), CommandResult::Dispatch { .. }));
    assert_eq!(shard.apply(T0 + 40_001, ack(1)), CommandResult::Skipped { reason: SkipReason::Stale });
    assert!(
        matches!(shard.apply(T0 + 40_002, ack(2)), CommandResult::Recorded { record } if record.state == TimerState::Delivered)
    );
}

#[test]
fn a_scheduled_pull_timer_is_fired_and_reserved_in_one_command() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "q");
    let pull = Callback::Pull { topic: "close-order".into(), ttr_ms: 0 };
    shard.apply(T0, create(&key, &spec(T0 + 1_000, pull.clone()), 5));
    let epoch = shard.elect(T0, 1);
    let record = &shard.table.timers[&key];
    assert_eq!(record.due().map(|d| d.kind), Some(tocsin_core::DueKind::PullFire), "indexed to be offered unfired");
    let fire_reserve = |due_ms, epoch| Command::FireReserve { key: key.clone(), due_ms, epoch, until_ms: T0 + 31_000 };

    // Phase: never early, never under a stale epoch, never for a due time it
    // no longer has.
    assert_eq!(
        shard.apply(T0 + 999, fire_reserve(T0 + 1_000, epoch)),
        CommandResult::Skipped { reason: SkipReason::NotDue }
    );
    assert_eq!(
        shard.apply(T0 + 1_000, fire_reserve(T0 + 1_000, epoch - 1)),
        CommandResult::Skipped { reason: SkipReason::StaleEpoch }
    );
    assert_eq!(
        shard.apply(T0 + 1_000, fire_reserve(T0 + 999, epoch)),
        CommandResult::Skipped { reason: SkipReason::Stale }
    );
    assert_eq!(shard.state(&key), Some(TimerState::Scheduled));

    // Phase: at its time it fires and its first attempt starts, reserved until
    // `until_ms`; the index waits for the reservation's end.
    let CommandResult::Dispatch { record } = shard.apply(T0 + 1_005, fire_reserve(T0 + 1_000, epoch)) else { panic!() };
    let fire = record.fire.clone().unwrap();
    assert_eq!((record.state, fire.attempt, fire.fired_at_ms, fire.epoch), (TimerState::Firing, 1, T0 + 1_005, epoch));
    assert_eq!(fire.phase, FirePhase::InFlight { since_ms: T0 + 1_005, until_ms: T0 + 31_000 });
    assert_eq!(
        record.due(),
        Some(tocsin_core::Due { at_ms: T0 + 31_000, kind: tocsin_core::DueKind::Attempt { epoch, webhook: false } })
    );
    assert_eq!((shard.meta.scheduled, shard.meta.firing), (0, 1));
    // A second consumer's copy of the same offer finds it fired.
    assert_eq!(
        shard.apply(T0 + 1_006, fire_reserve(T0 + 1_000, epoch)),
        CommandResult::Skipped { reason: SkipReason::Stale }
    );
    let ack = Command::AttemptResult {
        key: key.clone(),
        fire_index: fire.fire_index,
        attempt: 1,
        outcome: AttemptOutcome::Delivered,
        report: Default::default(),
    };
    assert!(
        matches!(shard.apply(T0 + 1_010, ack), CommandResult::Recorded { record } if record.state == TimerState::Delivered)
    );

    // Phase: a cancel applied while the offer waits for a consumer wins: the
    // reservation finds nothing to fire.
    let other = TimerKey::new("orders", "r");
    shard.apply(T0 + 2_000, create(&other, &spec(T0 + 2_000, pull.clone()), 5));
    assert!(matches!(shard.apply(T0 + 2_001, Command::Cancel { key: other.clone() }), CommandResult::Cancelled { .. }));
    let late = Command::FireReserve { key: other.clone(), due_ms: T0 + 2_000, epoch, until_ms: T0 + 32_000 };
    assert_eq!(shard.apply(T0 + 2_002, late), CommandResult::Skipped { reason: SkipReason::Stale });

    // Phase: only a pull timer is reserved; a webhook timer is refused, unfired
    // (a consumer never names one; this is the rule if one did).
    let hook = TimerKey::new("orders", "w");
    shard.apply(T0 + 3_000, create(&hook, &spec(T0 + 3_000, webhook()), 5));
    let reserve_hook = Command::FireReserve { key: hook.clone(), due_ms: T0 + 3_000, epoch, until_ms: T0 + 4_000 };
    assert_eq!(shard.apply(T0 + 3_000, reserve_hook), CommandResult::Skipped { reason: SkipReason::WrongState });
    assert_eq!(shard.state(&hook), Some(TimerState::Scheduled));
}

#[test]
fn purge_waits_for_retention() {
    let mut shard = Shard::new();
    let key = TimerKey::new("orders", "f");
    shard.apply(T0, create(&key, &spec(T0 + 1000, webhook()), 3));
    shard.apply(T0 + 10, Command::Cancel { key: key.clone() });
    let purge = || Command::Purge { keys: vec![key.clone()] };

    assert_eq!(shard.apply(T0 + 3_600_000, purge()), CommandResult::Purged { count: 0 });
    assert_eq!(shard.apply(T0 + 3_600_010, purge()), CommandResult::Purged { count: 1 });
    assert_eq!(shard.state(&key), None);
    assert_eq!(shard.meta.finished, 0);

    // Phase: the id is free again.
    assert!(matches!(
        shard.apply(T0 + 3_600_020, create(&key, &spec(T0 + 4_000_000, webhook()), 3)),
        CommandResult::Created { created: true, .. }
    ));
}

#[test]
fn timers_fired_in_one_entry_get_distinct_fire_ids() {
    let mut shard = Shard::new();
    let (a, b) = (TimerKey::new("orders", "x"), TimerKey::new("orders", "y"));
    shard.apply(T0, create(&a, &spec(T0, webhook()), 3));
    shard.apply(T0, create(&b, &spec(T0, webhook()), 3));
    let epoch = shard.elect(T0, 1);
    shard.index += 1;
    let proposal = Proposal { now_ms: T0 + 1, commands: vec![fire(&a, T0, epoch), fire(&b, T0, epoch)].into() };
    let results =
        tocsin_core::apply::apply_proposal(&mut shard.table, &mut shard.meta, shard.index, &proposal).unwrap();
    let ids: Vec<u64> = results
        .iter()
        .map(|r| match r {
            CommandResult::Dispatch { record } => record.fire.as_ref().unwrap().fire_index,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_ne!(ids[0], ids[1]);
    assert_eq!(shard.table.timers[&a].fire.as_ref().unwrap().attempt_index, shard.index);
}
