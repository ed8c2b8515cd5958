//! `clock-back` (matrix row 13): the wall clock of the leader of shard 0
//! steps 10 min back (its test clock offset file goes from `0` to
//! `-600000`) for 20 s, then forward again.
//!
//! Nothing may be held back ten minutes: fault-window lateness p99 < 1 s,
//! no early delivery (more than 500 ms before its fire time, by the
//! receiver's host clock), and the node must hand its leaderships over
//! (shard 0 gets another leader; the node leads nothing by the end of the
//! 20 s). Reported: how long until shard 0 had a new leader.

use futures::future::BoxFuture;

use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::Setup;
use crate::scenarios::clock;

pub struct ClockBack;

impl Scenario for ClockBack {
    fn name(&self) -> &'static str {
        "clock-back"
    }
    fn about(&self) -> &'static str {
        "the leader of shard 0 has its wall clock stepped -10 min for 20 s (test clock offset file)"
    }
    fn bounds(&self) -> Bounds {
        Bounds { window_p99_ms: Some(1_000), early_tolerance_ms: clock::EARLY_TOLERANCE_MS, ..NO_BOUNDS }
    }
    fn setup_options(&self, _args: &crate::Args) -> Setup {
        let mut setup = Setup::default();
        setup.nodes.clock_files = true;
        setup
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(clock::jump_leader(run, -600_000))
    }
}
