//! Rebuilding a wheel from a list of pending entries gives the same future
//! fire schedule: the property a new shard leader relies on.

use proptest::prelude::*;
use tocsin_wheel::Wheel;

fn drain(wheel: &mut Wheel<u32>, now: u64) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    while let Some(item) = wheel.poll(now) {
        out.push(item);
    }
    out.sort_unstable();
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]
    #[test]
    fn rebuilt_wheel_fires_the_same_schedule(
        start in 0u64..1_000_000,
        offsets in proptest::collection::vec(0u64..20_000_000, 1..400),
        warmup in proptest::collection::vec(0u64..2_000_000, 0..6),
        steps in proptest::collection::vec(0u64..3_000_000, 1..20),
        cancel_every in 2usize..7,
    ) {
        let mut original = Wheel::new(start);
        let mut handles = Vec::new();
        for (i, offset) in offsets.iter().enumerate() {
            handles.push(original.insert(start + offset, i as u32).unwrap());
        }
        for (i, handle) in handles.iter().enumerate() {
            if i % cancel_every == 0 {
                original.cancel(*handle);
            }
        }
        let mut now = start;
        for step in warmup {
            now += step;
            drain(&mut original, now);
        }

        // The rebuild happens at some later wall-clock time than the last poll, the
        // way a new leader starts after an election.
        let mut rebuilt = Wheel::new(now);
        for (due, &id) in original.pending() {
            rebuilt.insert(due, id).unwrap();
        }
        prop_assert_eq!(rebuilt.len(), original.len());
        for step in steps {
            now += step;
            prop_assert_eq!(drain(&mut original, now), drain(&mut rebuilt, now));
        }
        prop_assert_eq!(drain(&mut original, u64::MAX >> 23), drain(&mut rebuilt, u64::MAX >> 23));
    }
}
