//! `rebalance`: with a fourth node and three shards moved off the ring's
//! placement before the load, `tocsin admin rebalance` under load; a dry
//! run afterwards must plan no moves.

use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::bail;
use futures::future::BoxFuture;

use crate::cluster;
use crate::driver;
use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::FAILOVER_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::add_fourth;
use crate::scenario::last_line;

pub struct Rebalance;

impl Scenario for Rebalance {
    fn name(&self) -> &'static str {
        "rebalance"
    }
    fn about(&self) -> &'static str {
        "with four nodes and three shards moved off the ring's placement, `tocsin admin rebalance` under load"
    }
    fn bounds(&self) -> Bounds {
        FAILOVER_BOUNDS
    }
    fn setup<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            // Somewhere to move a replica to, then three replicas moved there.
            add_fourth(run).await?;
            unbalance(run, 3).await
        })
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            run.fault_start_ms = Some(now_ms());
            let started = Instant::now();
            let (ok, out) = run.cluster.admin(&run.seeds, &["rebalance"])?;
            if !ok {
                bail!("rebalance failed:\n{out}");
            }
            println!("    rebalanced in {} ms: {}", started.elapsed().as_millis(), last_line(&out));
            let (ok, out) = run.cluster.admin(&run.seeds, &["rebalance", "--dry-run"])?;
            if !ok || !last_line(&out).contains("would move 0 shards") {
                bail!("after the rebalance, a dry run still plans moves:\n{out}");
            }
            let map = driver::client(run.seeds.clone()).await?.shard_map().await?;
            if let Some(s) = map.shards.iter().find(|s| s.replicas.len() != 3) {
                bail!("after the rebalance, shard {} is on {:?}", s.shard, s.replicas);
            }
            Ok(())
        })
    }
}

/// Moves one replica of each of the first `count` shards to the node the
/// ring did not place it on, so that a rebalance has that many shards to
/// put back.
async fn unbalance(run: &Run, count: usize) -> anyhow::Result<()> {
    let seeds = &run.seeds;
    let map = driver::client(seeds.to_vec()).await?.shard_map().await?;
    let nodes: Vec<u64> = run.cluster.nodes.iter().map(|n| n.id).collect();
    for s in map.shards.iter().take(count) {
        let from = *s.replicas.first().context("a shard with no replicas")?;
        let to = *nodes.iter().find(|n| !s.replicas.contains(n)).context("every node already holds the shard")?;
        let args =
            ["shard", "move", "--shard", &s.shard.to_string(), "--from", &from.to_string(), "--to", &to.to_string()];
        let (ok, out) = run.cluster.admin(seeds, &args)?;
        if !ok {
            bail!("setup: moving shard {} from {from} to {to} failed:\n{out}", s.shard);
        }
        println!("    setup: {}", last_line(&out));
    }
    cluster::wait_all_led(seeds, run.cluster.num_shards(), Duration::from_secs(30))
        .await
        .context("setup: shards without a leader after the moves")?;
    Ok(())
}
