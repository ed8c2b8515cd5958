//! The RocksDB state machine against `tocsin-core`'s in-memory reference
//! table: the same log applied to both must give the same timers, the same
//! fire-time and retention indexes, the same horizon counts and the same
//! shard counters, however the entries are batched. And the changes apply
//! reports to its observer, replayed in order, rebuild the fire-time index
//! exactly: the shard leader's wheel can follow the applied log alone.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tocsin_core::Command;
use tocsin_core::Proposal;
use tocsin_core::ShardMeta;
use tocsin_core::TimerKey;
use tocsin_core::TimerSpec;
use tocsin_core::apply::apply_proposal;
use tocsin_core::command::AttemptOutcome;
use tocsin_core::mem_table::MemTable;
use tocsin_core::timer::Callback;
use tocsin_core::timer::FireTime;
use tocsin_core::timer::RetryPolicy;
use tocsin_store::Entry;
use tocsin_store::StateMachine;
use tocsin_store::keys;

use crate::support;

const T0: u64 = 1_800_000_000_000;

fn create(k: u32, at: u64, pull: bool) -> Command {
    Command::Create {
        key: TimerKey::new(if k.is_multiple_of(2) { "orders" } else { "alerts" }, format!("t-{k}")),
        spec: Box::new(TimerSpec {
            fire_time: FireTime::At(at),
            payload: vec![7; 100].into(),
            labels: BTreeMap::new(),
            callback: if pull {
                Callback::Pull { topic: "q".into(), ttr_ms: 0 }
            } else {
                Callback::Webhook { url: "http://127.0.0.1:1/h".into() }
            },
            retry: RetryPolicy::default(),
            skip_if_late_ms: 0,
            recurrence: None,
        }),
        fire_at_ms: at,
        retry: RetryPolicy { max_attempts: 2, initial_backoff_ms: 10, max_backoff_ms: 100, give_up_after_ms: 0 },
        retention_ms: 60_000,
        replace_finished: false,
    }
}

/// A fixed, realistic log: an epoch, creates, some cancels and fires.
pub fn sample_entries(start_index: u64, n: u64) -> Vec<Entry> {
    (0..n)
        .map(|i| {
            let now = T0 + i * 1000;
            let mut commands = vec![create(i as u32, now + 500, i % 3 == 0)];
            if i == 0 {
                commands.insert(0, Command::LeaderEpoch { leader: 1 });
            }
            if i % 4 == 1 {
                commands.push(Command::Cancel { key: TimerKey::new("orders", format!("t-{}", i - 1)) });
            }
            support::entry(1, start_index + i, Proposal { now_ms: now, commands: commands.into() })
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    Create { k: u32, offset: u64, pull: bool },
    Cancel { k: u32 },
    Reschedule { k: u32, offset: u64 },
    Fire { k: u32 },
    Reserve { k: u32 },
    Result { k: u32, outcome: u8 },
    Purge { k: u32 },
    Elect,
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0u32..12;
    prop_oneof![
        4 => (k.clone(), 0u64..3000, any::<bool>()).prop_map(|(k, offset, pull)| Op::Create { k, offset, pull }),
        2 => k.clone().prop_map(|k| Op::Cancel { k }),
        1 => (k.clone(), 0u64..200_000).prop_map(|(k, offset)| Op::Reschedule { k, offset }),
        3 => k.clone().prop_map(|k| Op::Fire { k }),
        2 => k.clone().prop_map(|k| Op::Reserve { k }),
        2 => (k.clone(), 0u8..3).prop_map(|(k, outcome)| Op::Result { k, outcome }),
        1 => k.clone().prop_map(|k| Op::Purge { k }),
        1 => Just(Op::Elect),
        2 => (0u64..90_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// Resolves ops against the reference's current state into commands, one
/// proposal per `Advance` boundary or every `per_entry` commands.
fn build_log(ops: &[Op], per_entry: usize) -> Vec<Proposal> {
    let mut reference = MemTable::default();
    let mut meta = ShardMeta::default();
    let mut now = T0;
    let mut index = 0u64;
    let mut proposals = Vec::new();
    let mut pending: Vec<Command> = Vec::new();
    let key = |k: u32| TimerKey::new(if k.is_multiple_of(2) { "orders" } else { "alerts" }, format!("t-{k}"));
    for op in ops {
        let record = |k: u32, r: &MemTable| r.timers.get(&key(k)).cloned();
        let cmd = match op {
            Op::Advance { ms } => {
                now += ms;
                None
            }
            Op::Create { k, offset, pull } => Some(create(*k, now + offset, *pull)),
            Op::Cancel { k } => Some(Command::Cancel { key: key(*k) }),
            Op::Reschedule { k, offset } => record(*k, &reference).map(|r| Command::Reschedule {
                key: key(*k),
                expected_generation: r.generation,
                fire_at_ms: now + offset,
            }),
            Op::Fire { k } => record(*k, &reference).and_then(|r| r.due_ms()).map(|due_ms| Command::Fire {
                key: key(*k),
                due_ms,
                epoch: meta.epoch,
                timeout_ms: 5000,
            }),
            Op::Reserve { k } => record(*k, &reference).and_then(|r| r.fire).map(|f| Command::Reserve {
                key: key(*k),
                fire_index: f.fire_index,
                expected_attempt: f.attempt,
                epoch: meta.epoch,
                until_ms: now + 5000,
            }),
            Op::Result { k, outcome } => record(*k, &reference).and_then(|r| r.fire).map(|f| Command::AttemptResult {
                key: key(*k),
                fire_index: f.fire_index,
                attempt: f.attempt,
                outcome: match outcome {
                    0 => AttemptOutcome::Delivered,
                    1 => AttemptOutcome::Failed { error: "503".into(), retry_at_ms: now + 50 },
                    _ => AttemptOutcome::GiveUp { error: "410".into() },
                },
                report: Default::default(),
            }),
            Op::Purge { k } => Some(Command::Purge { keys: vec![key(*k)] }),
            Op::Elect => Some(Command::LeaderEpoch { leader: 1 }),
        };
        if let Some(cmd) = cmd {
            pending.push(cmd);
        }
        // Later commands are resolved against the state after earlier ones, so
        // cut an entry when time moves or the entry is full, and apply it to
        // the reference right away.
        if !pending.is_empty() && (matches!(op, Op::Advance { .. }) || pending.len() >= per_entry) {
            index += 1;
            let proposal = Proposal { now_ms: now, commands: std::mem::take(&mut pending).into() };
            apply_proposal(&mut reference, &mut meta, index, &proposal).unwrap();
            proposals.push(proposal);
        }
    }
    if !pending.is_empty() {
        index += 1;
        let proposal = Proposal { now_ms: now, commands: pending.into() };
        apply_proposal(&mut reference, &mut meta, index, &proposal).unwrap();
        proposals.push(proposal);
    }
    proposals
}

/// Records every index change apply reports, in order.
#[derive(Default)]
struct Recorder {
    changes: std::sync::Mutex<Vec<(u64, tocsin_core::fire::IndexChange)>>,
}

impl tocsin_store::ApplyObserver for Recorder {
    fn applied(&self, entries: &[tocsin_store::AppliedEntry<'_>]) {
        let mut changes = self.changes.lock().unwrap();
        for entry in entries {
            assert_eq!(entry.commands.len(), entry.results.len());
            changes.extend(entry.changes.iter().map(|c| (entry.index, c.clone())));
        }
    }
}

async fn check_same(sm: &StateMachine, proposals: &[Proposal], group: u64, recorded: &Recorder) {
    // Reference.
    let mut reference = MemTable::default();
    let mut meta = ShardMeta::default();
    for (i, p) in proposals.iter().enumerate() {
        apply_proposal(&mut reference, &mut meta, i as u64 + 1, p).unwrap();
    }
    let store = sm.store().clone();
    // Timers.
    for (key, record) in &reference.timers {
        assert_eq!(store.get_timer(group, key).unwrap().as_ref(), Some(record), "{key}");
    }
    let count = store.state_digest(group).unwrap().timer_count;
    assert_eq!(count as usize, reference.timers.len());
    // Indexes.
    let due: Vec<_> = store.scan_due(group, 0, u64::MAX, usize::MAX).unwrap();
    assert_eq!(due, reference.due.iter().cloned().collect::<Vec<_>>());
    // The loader's pages: the same entries, in the same order, each with what
    // it is due for, at the applied index.
    let page = store.due_page(group, &tocsin_core::fire::LoadFrom::Time(0), u64::MAX, usize::MAX).unwrap();
    assert_eq!(page.applied_index, proposals.len() as u64);
    let expected: Vec<_> = reference
        .due
        .iter()
        .map(|(at, key)| {
            let due = reference.timers[key].due().unwrap();
            assert_eq!(due.at_ms, *at);
            (tocsin_core::DuePos { due_ms: *at, key: key.clone() }, due.kind)
        })
        .collect();
    assert_eq!(page.entries, expected);
    // Paging in small pages after the last position finds the same entries.
    let mut paged = Vec::new();
    let mut from = tocsin_core::fire::LoadFrom::Time(0);
    loop {
        let page = store.due_page(group, &from, u64::MAX, 3).unwrap();
        let Some((last, _)) = page.entries.last().cloned() else { break };
        paged.extend(page.entries);
        from = tocsin_core::fire::LoadFrom::After(last);
    }
    assert_eq!(paged, expected);
    // The observer's changes, replayed in log order, rebuild the index.
    let mut replayed = BTreeMap::new();
    let changes = recorded.changes.lock().unwrap().clone();
    assert!(changes.windows(2).all(|w| w[0].0 <= w[1].0), "changes arrive in log order");
    for (_, change) in changes {
        match change.due {
            Some(due) => replayed.insert(change.key, due),
            None => replayed.remove(&change.key),
        };
    }
    let index: BTreeMap<_, _> = expected.iter().map(|(pos, kind)| (pos.key.clone(), (pos.due_ms, *kind))).collect();
    let replayed: BTreeMap<_, _> = replayed.into_iter().map(|(k, d)| (k, (d.at_ms, d.kind))).collect();
    assert_eq!(replayed, index);
    let retention = store.scan_time_index(keys::CF_RETENTION, group, 0, u64::MAX, usize::MAX).unwrap();
    assert_eq!(retention, reference.retention.iter().cloned().collect::<Vec<_>>());
    // Horizon counters, per (namespace, minute).
    for ((namespace, minute), count) in &reference.horizon {
        assert_eq!(store.horizon_count(group, namespace, *minute, minute + 1).unwrap(), *count);
    }
    let total: u64 = reference.horizon.iter().filter(|((ns, _), _)| ns == "orders").map(|(_, c)| c).sum();
    assert_eq!(store.horizon_count(group, "orders", 0, u64::MAX / 60_000).unwrap(), total);
    // Each namespace's count of unfinished timers, for its quota.
    let mut unfinished: BTreeMap<String, u64> = BTreeMap::new();
    for (key, record) in &reference.timers {
        *unfinished.entry(key.namespace.clone()).or_default() += u64::from(record.due().is_some());
    }
    for (namespace, count) in &unfinished {
        assert_eq!(store.pending_count(group, namespace).unwrap(), *count, "pending in {namespace}");
    }
    assert_eq!(store.shard_meta(group).unwrap(), meta);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    #[test]
    fn rocksdb_state_machine_matches_reference(ops in proptest::collection::vec(op(), 1..150), per_entry in 1usize..6, apply_batch in 1usize..8) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let (_dir, store) = support::open_store();
            let recorder = std::sync::Arc::new(Recorder::default());
            let sm = StateMachine::open_observed(store, 3, Some(recorder.clone())).await.unwrap();
            let proposals = build_log(&ops, per_entry);
            let entries: Vec<Entry> = proposals.iter().enumerate().map(|(i, p)| support::entry(1, i as u64 + 1, p.clone())).collect();
            // Apply in batches of several entries, as openraft does.
            for chunk in entries.chunks(apply_batch) {
                support::apply(&sm, chunk.to_vec()).await;
            }
            check_same(&sm, &proposals, 3, &recorder).await;
        });
    }
}

/// Pull timers fired in the millisecond they were due: each one's fire-time
/// index entry keeps its key (same instant, same timer) and only changes
/// kind, from scheduled to ready. Apply sorts a batch's index writes by key;
/// a delete of the old entry beside the put of the new one could sort after
/// it (an unstable sort of 64 such pairs reorders several) and leave a ready
/// timer out of the index, where no consumer would ever see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_entries_that_only_change_kind_stay_indexed() {
    const N: u32 = 64;
    let (_dir, store) = support::open_store();
    let recorder = std::sync::Arc::new(Recorder::default());
    let sm = StateMachine::open_observed(store, 3, Some(recorder.clone())).await.unwrap();
    let mut ops = vec![Op::Elect];
    ops.extend((0..N).map(|k| Op::Create { k, offset: 0, pull: true }));
    ops.extend((0..N).map(|k| Op::Fire { k }));
    // The election and the creates in one entry, the fires in the next, all at T0.
    let proposals = build_log(&ops, N as usize + 1);
    assert_eq!(proposals.len(), 2);
    assert_eq!(proposals[1].commands.len(), N as usize);
    for (i, p) in proposals.iter().enumerate() {
        support::apply(&sm, vec![support::entry(1, i as u64 + 1, p.clone())]).await;
    }
    let group = 3;
    let page = sm.store().due_page(group, &tocsin_core::fire::LoadFrom::Time(0), u64::MAX, usize::MAX).unwrap();
    assert_eq!(page.entries.len(), N as usize, "every fired pull timer is indexed once");
    for (pos, kind) in &page.entries {
        assert_eq!((pos.due_ms, *kind), (T0, tocsin_core::timer::DueKind::Ready), "{}", pos.key);
    }
    check_same(&sm, &proposals, group, &recorder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_state_and_responses() {
    let (_dir, store) = support::open_store();
    let mut sm = StateMachine::open(store.clone(), 1).await.unwrap();
    assert_eq!(support::applied(&mut sm).await, None);

    let mut entries = vec![support::membership_entry(1, 1, &[1])];
    entries.extend(sample_entries(2, 8));
    let responses = support::apply(&sm, entries).await;
    assert_eq!(responses.len(), 9);
    assert!(responses[0].results.is_empty(), "a membership entry has no command results");
    assert!(matches!(responses[1].results[0], tocsin_core::CommandResult::Epoch { epoch: 2, .. }));
    assert_eq!(support::applied(&mut sm).await.map(|id| id.index), Some(9));
    assert_eq!(store.shard_meta(1).unwrap().epoch, 2);

    // Phase: the state survives a reopen.
    drop(sm);
    let mut sm = StateMachine::open(store, 1).await.unwrap();
    assert_eq!(support::applied(&mut sm).await.map(|id| id.index), Some(9));
}
