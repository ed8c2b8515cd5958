//! The wheel against a `BTreeMap<(due, seq), id>` model, driven by
//! `proptest-state-machine`: insert, cancel, advance and rebuild.

use std::collections::BTreeMap;
use std::collections::HashMap;

use proptest::prelude::*;
use proptest_state_machine::ReferenceStateMachine;
use proptest_state_machine::StateMachineTest;
use proptest_state_machine::prop_state_machine;
use tocsin_wheel::Handle;
use tocsin_wheel::Wheel;

const START_MS: u64 = 1_800_000_000_000;

#[derive(Clone, Debug)]
pub struct Model {
    now_ms: u64,
    next_id: u64,
    pending: BTreeMap<(u64, u64), u64>,
    due_by_id: HashMap<u64, u64>,
}

#[derive(Clone, Debug)]
pub enum Transition {
    /// Insert a timer due at `now + offset` (negative offsets are overdue).
    Insert { offset_ms: i64 },
    /// Cancel the `pick`-th pending timer (modulo the count), or a stale id.
    Cancel { pick: usize },
    /// Advance the clock and drain everything due.
    Advance { by_ms: u64 },
    /// Replace the wheel with one rebuilt from its pending entries, as a new
    /// shard leader does after a failover.
    Rebuild,
}

pub struct ModelMachine;

fn offset_strategy() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 0i64..64,
        4 => 0i64..5_000,
        3 => 0i64..400_000,
        1 => 0i64..100_000_000,
        1 => 0i64..(3 * 365 * 24 * 3600 * 1000),
        1 => -5_000i64..0,
    ]
}

fn advance_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0u64..70, 3 => 0u64..5_000, 2 => 0u64..500_000, 1 => 0u64..200_000_000,]
}

impl ReferenceStateMachine for ModelMachine {
    type State = Model;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<Model> {
        (0u64..100_000)
            .prop_map(|jitter| Model {
                now_ms: START_MS + jitter,
                next_id: 0,
                pending: BTreeMap::new(),
                due_by_id: HashMap::new(),
            })
            .boxed()
    }

    fn transitions(_state: &Model) -> BoxedStrategy<Transition> {
        prop_oneof![
            6 => offset_strategy().prop_map(|offset_ms| Transition::Insert { offset_ms }),
            3 => any::<usize>().prop_map(|pick| Transition::Cancel { pick }),
            3 => advance_strategy().prop_map(|by_ms| Transition::Advance { by_ms }),
            1 => Just(Transition::Rebuild),
        ]
        .boxed()
    }

    fn apply(mut state: Model, transition: &Transition) -> Model {
        match *transition {
            Transition::Insert { offset_ms } => {
                let due = state.now_ms.saturating_add_signed(offset_ms);
                let id = state.next_id;
                state.next_id += 1;
                state.pending.insert((due, id), id);
                state.due_by_id.insert(id, due);
            }
            Transition::Cancel { pick } => {
                if let Some(id) = cancel_target(&state, pick)
                    && let Some(due) = state.due_by_id.remove(&id)
                {
                    state.pending.remove(&(due, id));
                }
            }
            Transition::Advance { by_ms } => {
                state.now_ms += by_ms;
                let later = state.pending.split_off(&(state.now_ms + 1, 0));
                for id in state.pending.values() {
                    state.due_by_id.remove(id);
                }
                state.pending = later;
            }
            Transition::Rebuild => {}
        }
        state
    }
}

/// Picks a pending id, or (one time in eight) an id that already left, to
/// check that stale cancels are harmless.
fn cancel_target(state: &Model, pick: usize) -> Option<u64> {
    if state.next_id == 0 {
        return None;
    }
    if pick.is_multiple_of(8) || state.pending.is_empty() {
        return Some(pick as u64 % state.next_id);
    }
    state.pending.values().nth(pick % state.pending.len()).copied()
}

pub struct Sut {
    wheel: Wheel<u64>,
    handles: HashMap<u64, Handle>,
}

impl StateMachineTest for ModelMachine {
    type SystemUnderTest = Sut;
    type Reference = ModelMachine;

    fn init_test(model: &Model) -> Sut {
        Sut { wheel: Wheel::new(model.now_ms), handles: HashMap::new() }
    }

    fn apply(mut sut: Sut, model: &Model, transition: Transition) -> Sut {
        match transition {
            Transition::Insert { .. } => {
                let id = model.next_id - 1;
                let due = model.due_by_id[&id];
                let handle = sut.wheel.insert(due, id).expect("every due time in the strategy fits");
                sut.handles.insert(id, handle);
            }
            Transition::Cancel { .. } => {
                // The model already removed the target; the SUT must agree on whether it
                // was still pending.
                for (id, handle) in sut.handles.clone() {
                    let pending_in_model = model.due_by_id.contains_key(&id);
                    let pending_in_wheel = sut.wheel.due_ms(handle).is_some();
                    if pending_in_wheel && !pending_in_model {
                        let (due, got) = sut.wheel.cancel(handle).expect("pending entry cancels");
                        assert_eq!(got, id);
                        let _ = due;
                        assert!(sut.wheel.cancel(handle).is_none(), "a second cancel is a no-op");
                        sut.handles.remove(&id);
                    }
                }
            }
            Transition::Advance { .. } => {
                let now = model.now_ms;
                let mut fired = Vec::new();
                while let Some((due, id)) = sut.wheel.poll(now) {
                    assert!(due <= now, "early fire: due={due} now={now}");
                    if let Some(&(last_due, _)) = fired.last() {
                        assert!(due >= last_due, "out of order: {last_due} then {due}");
                    }
                    fired.push((due, id));
                    sut.handles.remove(&id);
                }
                for (_, id) in &fired {
                    assert!(!model.due_by_id.contains_key(id), "fired {id} which the model still holds");
                }
            }
            Transition::Rebuild => {
                let mut rebuilt = Wheel::new(sut.wheel.elapsed_ms());
                let mut handles = HashMap::new();
                for (due, &id) in sut.wheel.pending() {
                    handles.insert(id, rebuilt.insert(due, id).expect("fits"));
                }
                sut = Sut { wheel: rebuilt, handles };
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        assert_eq!(sut.wheel.len(), model.pending.len());
        let mut pending: Vec<(u64, u64)> = sut.wheel.pending().map(|(due, &id)| (due, id)).collect();
        pending.sort_unstable();
        let expected: Vec<(u64, u64)> = model.pending.keys().copied().collect();
        assert_eq!(pending, expected);
        if let Some(&(earliest, _)) = model.pending.keys().next() {
            let next = sut.wheel.next_poll_ms().expect("non-empty wheel has a next poll time");
            assert!(next <= earliest.max(sut.wheel.elapsed_ms()), "next_poll_ms {next} after earliest due {earliest}");
        }
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]
    #[test]
    fn wheel_matches_btreemap_model(sequential 1..200 => ModelMachine);
}

/// A thundering millisecond: many entries due at the same instant, inserted
/// at different elapsed times so they sit in different levels, all come out
/// at that instant and not before.
#[test]
fn same_due_time_from_different_levels() {
    let due = START_MS + 10_000;
    let mut wheel = Wheel::new(START_MS);
    for i in 0..1000u64 {
        wheel.insert(due, i).unwrap();
    }
    assert!(wheel.poll(START_MS + 9_000).is_none());
    for i in 1000..2000u64 {
        wheel.insert(due, i).unwrap();
    }
    assert!(wheel.poll(due - 1).is_none());
    let mut fired = Vec::new();
    while let Some((d, id)) = wheel.poll(due) {
        assert_eq!(d, due);
        fired.push(id);
    }
    fired.sort_unstable();
    assert_eq!(fired, (0..2000).collect::<Vec<_>>());
    assert!(wheel.is_empty());
}
