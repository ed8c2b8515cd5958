//! `freeze-leader`: SIGSTOP the leader of shard 0 for 5 s, then SIGCONT: the
//! zombie leader must re-check its lease before sending anything.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::FAILOVER_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::leader;
use crate::scenario::new_leader_after;
use crate::scenario::sleep_rest;

pub struct FreezeLeader;

impl Scenario for FreezeLeader {
    fn name(&self) -> &'static str {
        "freeze-leader"
    }
    fn about(&self) -> &'static str {
        "SIGSTOP the leader of shard 0 for 5 s, then SIGCONT"
    }
    fn bounds(&self) -> Bounds {
        FAILOVER_BOUNDS
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let victim = leader(&run.seeds, 0).await?;
            let fault_start_ms = now_ms();
            run.fault_start_ms = Some(fault_start_ms);
            println!("    SIGSTOP node {victim}");
            run.cluster.node(victim).freeze();
            run.live.failover_ms = new_leader_after(&run.cluster, 0, victim).await;
            sleep_rest(fault_start_ms, Duration::from_secs(5)).await;
            println!("    SIGCONT node {victim}");
            run.cluster.node(victim).thaw();
            Ok(())
        })
    }
}
