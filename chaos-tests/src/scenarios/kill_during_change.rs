//! `kill-during-change`: `node add` a fourth node under load, kill -9 the
//! leader of a shard while node 4 is its learner (mid-change), restart it
//! 3 s later and re-run `node add`, which finds the plan in the map and
//! only waits for what is left.

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
use crate::scenario::last_line;

pub struct KillDuringChange;

impl Scenario for KillDuringChange {
    fn name(&self) -> &'static str {
        "kill-during-change"
    }
    fn about(&self) -> &'static str {
        "kill -9 a shard's leader while `node add` is changing its membership; restart it, re-run the add"
    }
    fn bounds(&self) -> Bounds {
        FAILOVER_BOUNDS
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            run.cluster.start_joiner(run.net.host("n4"), 4).await?;
            let n4 = run.cluster.node(4).grpc();
            let (tocsin, run_dir) = run.cluster.admin_paths();
            let admin_seeds = run.seeds.clone();
            let target = n4.clone();
            run.fault_start_ms = Some(now_ms());
            let first = tokio::task::spawn_blocking(move || {
                cluster::run_admin(&tocsin, &run_dir, &admin_seeds, &["node", "add", &target])
            });
            // Wait for a shard with node 4 as a learner: its change is under way.
            let (shard, victim) = mid_change(&run.seeds, 4).await.context("node add never started a change")?;
            println!("    kill -9 node {victim}, the leader of shard {shard}, while it adds node 4");
            run.cluster.node(victim).kill9();
            let (ok, out) = first.await.context("the admin thread panicked")??;
            println!(
                "    the interrupted node add {}: {}",
                if ok { "still finished" } else { "failed" },
                last_line(&out)
            );
            tokio::time::sleep(Duration::from_secs(3)).await;
            println!("    restart node {victim}, run node add again");
            run.cluster.restart(victim)?;
            run.seeds = run.cluster.seeds();
            cluster::wait_all_led(&run.seeds, run.shards(), Duration::from_secs(30))
                .await
                .context("shards without a leader after the restart")?;
            let (ok, out) = run.cluster.admin(&run.seeds, &["node", "add", &n4])?;
            if !ok {
                bail!("re-running node add failed:\n{out}");
            }
            println!("    node add re-run: {}", last_line(&out));
            let map = driver::client(run.seeds.clone()).await?.shard_map().await?;
            if let Some(s) = map.shards.iter().find(|s| s.replicas.len() != 3) {
                bail!("after the add, shard {} is on {:?}", s.shard, s.replicas);
            }
            Ok(())
        })
    }
}

/// Polls until some shard has `learner` as a learner (a membership change
/// adding it is under way); returns the shard and its leader.
async fn mid_change(seeds: &[String], learner: u64) -> Option<(u32, u64)> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        for seed in seeds {
            if let Some(info) = cluster::node_info(seed, false).await
                && let Some(s) = info.shards.iter().find(|s| s.learners.contains(&learner) && s.leader != 0)
            {
                return Some((s.shard, s.leader));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
