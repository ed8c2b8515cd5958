//! `kill-leader`: kill -9 the leader of shard 0 while a burst of extra
//! timers is due in the next ten seconds; restart it 10 s later.

use std::time::Duration;
use std::time::Instant;

use futures::future::BoxFuture;

use crate::driver;
use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::FAILOVER_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::leader;
use crate::scenario::new_leader_after;
use crate::scenario::sleep_rest;

pub struct KillLeader;

impl Scenario for KillLeader {
    fn name(&self) -> &'static str {
        "kill-leader"
    }
    fn about(&self) -> &'static str {
        "kill -9 the leader of shard 0 while a burst of timers (--burst, 20,000 unless told) is due in the next 10 s; restart it 10 s later"
    }
    fn bounds(&self) -> Bounds {
        FAILOVER_BOUNDS
    }
    fn quick(&self) -> bool {
        true
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            // The burst is due in the ten seconds after the kill.
            let lead_ms = 4_000;
            let made = Instant::now();
            let url = run.cluster.sink_url.clone();
            driver::burst(run.client(), &run.rec, &url, run.args.burst, lead_ms, 10_000, "b").await;
            let elapsed = made.elapsed();
            println!("    created the {} burst timers in {:.1} s", run.args.burst, elapsed.as_secs_f64());
            if let Some(left) = Duration::from_millis(lead_ms).checked_sub(elapsed) {
                tokio::time::sleep(left).await;
            }
            let victim = leader(&run.seeds, 0).await?;
            let fault_start_ms = now_ms();
            run.fault_start_ms = Some(fault_start_ms);
            println!("    kill -9 node {victim}");
            run.cluster.node(victim).kill9();
            run.live.failover_ms = new_leader_after(&run.cluster, 0, victim).await;
            sleep_rest(fault_start_ms, Duration::from_secs(10)).await;
            println!("    restart node {victim}");
            run.cluster.restart(victim)?;
            Ok(())
        })
    }
}
