//! `clock-forward` (matrix row 12): the wall clock of the leader of shard 0
//! steps 30 s forward (its test clock offset file goes from `0` to
//! `30000`) for 20 s, then back.
//!
//! It must never fire early (a delivery more than 500 ms before its fire
//! time, by the receiver's host clock, is early) and must hand its
//! leaderships over: shard 0 must get another leader, and the node must
//! lead nothing by the end of the 20 s. Reported: how long until shard 0
//! had a new leader.

use futures::future::BoxFuture;

use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::Setup;
use crate::scenarios::clock;

pub struct ClockForward;

impl Scenario for ClockForward {
    fn name(&self) -> &'static str {
        "clock-forward"
    }
    fn about(&self) -> &'static str {
        "the leader of shard 0 has its wall clock stepped +30 s for 20 s (test clock offset file)"
    }
    fn bounds(&self) -> Bounds {
        Bounds { early_tolerance_ms: clock::EARLY_TOLERANCE_MS, ..NO_BOUNDS }
    }
    fn setup_options(&self, _args: &crate::Args) -> Setup {
        let mut setup = Setup::default();
        setup.nodes.clock_files = true;
        setup
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(clock::jump_leader(run, 30_000))
    }
}
