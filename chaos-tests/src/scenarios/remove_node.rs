//! `remove-node`: with a fourth node added before the load, drain and
//! remove the leader of shard 0 (`tocsin admin node remove`) under load;
//! every shard must end on three nodes without it.

use std::time::Instant;

use anyhow::bail;
use futures::future::BoxFuture;

use crate::driver;
use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::FAILOVER_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::add_fourth;
use crate::scenario::last_line;
use crate::scenario::leader;

pub struct RemoveNode;

impl Scenario for RemoveNode {
    fn name(&self) -> &'static str {
        "remove-node"
    }
    fn about(&self) -> &'static str {
        "with four nodes, drain and remove the leader of shard 0 (`tocsin admin node remove`) under load"
    }
    fn bounds(&self) -> Bounds {
        FAILOVER_BOUNDS
    }
    fn setup<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        // A fourth node, so that removing one leaves every shard its three
        // replicas.
        Box::pin(add_fourth(run))
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let victim = leader(&run.seeds, 0).await?;
            run.fault_start_ms = Some(now_ms());
            let others: Vec<String> = run.cluster.nodes.iter().filter(|n| n.id != victim).map(|n| n.grpc()).collect();
            let removing = Instant::now();
            let (ok, out) = run.cluster.admin(&others, &["node", "remove", &victim.to_string()])?;
            if !ok {
                bail!("node remove {victim} failed:\n{out}");
            }
            println!(
                "    node {victim} drained and removed in {} ms: {}",
                removing.elapsed().as_millis(),
                last_line(&out)
            );
            let map = driver::client(others.clone()).await?.shard_map().await?;
            if let Some(s) = map.shards.iter().find(|s| s.replicas.contains(&victim) || s.replicas.len() != 3) {
                bail!("after removing node {victim}, shard {} is on {:?}", s.shard, s.replicas);
            }
            // The removed node holds nothing; keep only the others as seeds.
            run.seeds = others;
            Ok(())
        })
    }
}
