//! `partition-leader`: iptables cuts the leader of shard 0 off from the
//! other two nodes for 20 s; it still reaches clients and the receiver, so
//! a deposed leader's stray deliveries would show.

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

pub struct PartitionLeader;

impl Scenario for PartitionLeader {
    fn name(&self) -> &'static str {
        "partition-leader"
    }
    fn about(&self) -> &'static str {
        "cut the leader of shard 0 off from the other nodes for 20 s (it still reaches clients and the receiver)"
    }
    fn bounds(&self) -> Bounds {
        // A call sent after the heal waits on nothing the partition left
        // behind: a node forwarding to the healed one over a connection
        // that carried a request during the cut held every call for 2-4 s,
        // the driver's deadline, until the kernel's backed-off resend got
        // through (the 2 s after the heal, every run; `forward.rs`).
        Bounds { after_heal_create_p99_ms: Some(1_000), ..FAILOVER_BOUNDS }
    }
    fn quick(&self) -> bool {
        true
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let victim = leader(&run.seeds, 0).await?;
            let host = run.cluster.node(victim).host.clone();
            let peers: Vec<_> = run.cluster.nodes.iter().filter(|n| n.id != victim).map(|n| n.host.clone()).collect();
            let fault_start_ms = now_ms();
            run.fault_start_ms = Some(fault_start_ms);
            println!("    partition node {victim} from its peers");
            run.net.partition(&host, &peers.iter().collect::<Vec<_>>())?;
            run.live.failover_ms = new_leader_after(&run.cluster, 0, victim).await;
            sleep_rest(fault_start_ms, Duration::from_secs(20)).await;
            println!("    heal");
            run.net.heal(&host)?;
            Ok(())
        })
    }
}
