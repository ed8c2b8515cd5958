//! `rolling-restart`: SIGTERM each node in turn (it hands its leaderships
//! over first), restart it, wait for leaders, next.

use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use futures::future::BoxFuture;

use crate::cluster;
use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::FAILOVER_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;

pub struct RollingRestart;

impl Scenario for RollingRestart {
    fn name(&self) -> &'static str {
        "rolling-restart"
    }
    fn about(&self) -> &'static str {
        "SIGTERM each node in turn (it hands its leaderships over first), restart it, wait for leaders"
    }
    fn bounds(&self) -> Bounds {
        FAILOVER_BOUNDS
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            run.fault_start_ms = Some(now_ms());
            for id in 1..=3 {
                let stopping = Instant::now();
                run.cluster.node(id).terminate(Duration::from_secs(30));
                println!("    node {id} stopped gracefully in {} ms; restarting", stopping.elapsed().as_millis());
                run.cluster.restart(id)?;
                cluster::wait_all_led(&run.seeds, run.shards(), Duration::from_secs(30))
                    .await
                    .with_context(|| format!("shards without a leader after restarting node {id}"))?;
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            Ok(())
        })
    }
}
