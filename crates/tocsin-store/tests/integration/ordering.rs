//! One ordering for fire-time index positions: the byte order of the store's
//! `due` keys is exactly `DuePos`'s (and `TimerKey`'s) `Ord`, which the
//! leader's loader cursor uses to decide what a page covered. If the two
//! disagreed, a page boundary inside one millisecond could skip a timer.

use proptest::prelude::*;
use tocsin_core::DuePos;
use tocsin_core::TimerKey;
use tocsin_store::keys;

fn key() -> impl Strategy<Value = TimerKey> {
    // Short alphabets so equal prefixes, equal lengths and prefix-of cases
    // come up often; multi-byte characters so byte and char order can differ.
    let part = |max| prop::collection::vec(prop::sample::select(vec!['a', 'b', 'z', 'é', '✓', '0']), 0..max);
    (part(4), part(5))
        .prop_map(|(ns, id)| TimerKey::new(ns.into_iter().collect::<String>(), id.into_iter().collect::<String>()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5_000, ..ProptestConfig::default() })]

    #[test]
    fn index_byte_order_is_due_pos_order(a in key(), b in key(), da in 0u64..4, db in 0u64..4) {
        let (pa, pb) = (DuePos { due_ms: da, key: a }, DuePos { due_ms: db, key: b });
        let (ka, kb) = (keys::time_index_key(7, pa.due_ms, &pa.key), keys::time_index_key(7, pb.due_ms, &pb.key));
        prop_assert_eq!(ka.cmp(&kb), pa.cmp(&pb), "{:?} vs {:?}", pa, pb);
        let (ta, tb) = (keys::timer_key(7, &pa.key), keys::timer_key(7, &pb.key));
        prop_assert_eq!(ta.cmp(&tb), pa.key.cmp(&pb.key));
    }
}

/// The case that string order gets wrong: a shorter namespace sorts first in
/// the index even when it is greater as a string.
#[test]
fn shorter_namespaces_sort_first() {
    let (b, aa) = (TimerKey::new("b", "x"), TimerKey::new("aa", "x"));
    assert!(b < aa);
    assert!(keys::time_index_key(1, 5, &b) < keys::time_index_key(1, 5, &aa));
}
