//! `add-node`: start a fourth node with `--join` and `tocsin admin node add`
//! it under load; each shard's leader moves its replicas to the new map.

use std::time::Instant;

use anyhow::bail;
use futures::future::BoxFuture;

use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::FAILOVER_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::last_line;

pub struct AddNode;

impl Scenario for AddNode {
    fn name(&self) -> &'static str {
        "add-node"
    }
    fn about(&self) -> &'static str {
        "start a fourth node with --join and `tocsin admin node add` it under load"
    }
    fn bounds(&self) -> Bounds {
        FAILOVER_BOUNDS
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            run.fault_start_ms = Some(now_ms());
            run.cluster.start_joiner(run.net.host("n4"), 4).await?;
            let n4 = run.cluster.node(4).grpc();
            let added = Instant::now();
            let (ok, out) = run.cluster.admin(&run.seeds, &["node", "add", &n4])?;
            if !ok {
                bail!("node add failed:\n{out}");
            }
            println!("    node 4 added in {} ms: {}", added.elapsed().as_millis(), last_line(&out));
            run.seeds = run.cluster.seeds();
            Ok(())
        })
    }
}
