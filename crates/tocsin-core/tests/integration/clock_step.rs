//! The fire loop under a wall clock that steps backwards: the node follows
//! a confirmed backward jump (`tocsin-node`'s `clock.rs`), so `FireCore`
//! may be polled with an earlier `now_ms` than before. Found by the
//! deterministic simulation (tocsin-sim, seed 54 before the fix): the
//! wheel had already passed the old time, yielded an entry due between the
//! two, and the never-early assertion in `poll` panicked.

use tocsin_core::Due;
use tocsin_core::DueKind;
use tocsin_core::TimerKey;
use tocsin_core::fire::Action;
use tocsin_core::fire::FireConfig;
use tocsin_core::fire::FireCore;
use tocsin_core::fire::IndexChange;

#[test]
fn a_backward_clock_step_neither_panics_nor_fires_behind_the_shards_time() {
    let config = FireConfig {
        hot_window_ms: 60_000,
        load_page: 16,
        max_tracked: 100,
        retry_delay_ms: 50,
        retries_per_namespace_per_sec: 0,
        catch_up_after_ms: 0,
        catch_up_per_namespace_per_sec: 0,
        arm_ahead_ms: 0,
        arm_step_ms: 0,
    };
    let mut core = FireCore::new(config, 5, 10_000);
    // Polls, answering every load with an empty page; returns the fires.
    let poll = |core: &mut FireCore, now_ms: u64| -> Vec<Action> {
        let mut fires = Vec::new();
        for action in core.poll(now_ms, 16, 16) {
            match action {
                Action::Load { before_ms, .. } => core.on_page(5, Vec::new(), before_ms),
                other => fires.push(other),
            }
        }
        fires
    };
    assert!(poll(&mut core, 10_000).is_empty());
    // Time runs to 12 s, then the clock steps back to 11 s.
    assert!(poll(&mut core, 12_000).is_empty());
    let key = TimerKey::new("ns", "a");
    core.on_change(6, IndexChange { key: key.clone(), due: Some(Due { at_ms: 11_500, kind: DueKind::Fire }) });
    // The core keeps the shard's time (stamps never go backwards either): the
    // timer, due before the largest time seen, is fired, not asserted on.
    let actions = poll(&mut core, 11_000);
    assert_eq!(actions, vec![Action::Fire(vec![(key, 11_500)])]);
}
