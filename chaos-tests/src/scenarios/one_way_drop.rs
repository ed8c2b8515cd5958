//! `one-way-drop` (matrix row 5): inside the namespace of the leader of
//! shard 0, iptables drops everything it sends to the two followers (OUTPUT
//! only) for 20 s; what they send it still arrives. TCP makes this a
//! two-way failure for Raft, so the bounds are partition-leader's.

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

pub struct OneWayDrop;

impl Scenario for OneWayDrop {
    fn name(&self) -> &'static str {
        "one-way-drop"
    }
    fn about(&self) -> &'static str {
        "drop what the leader of shard 0 sends to the two followers (iptables OUTPUT in its namespace) for 20 s"
    }
    fn bounds(&self) -> Bounds {
        FAILOVER_BOUNDS
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let victim = leader(&run.seeds, 0).await?;
            let host = run.cluster.node(victim).host.clone();
            let peers: Vec<_> = run.cluster.nodes.iter().filter(|n| n.id != victim).map(|n| n.host.clone()).collect();
            let fault_start_ms = now_ms();
            run.fault_start_ms = Some(fault_start_ms);
            println!("    drop what node {victim} sends to its peers");
            run.net.drop_outgoing(&host, &peers.iter().collect::<Vec<_>>())?;
            run.live.failover_ms = new_leader_after(&run.cluster, 0, victim).await;
            sleep_rest(fault_start_ms, Duration::from_secs(20)).await;
            println!("    heal");
            run.net.heal(&host)?;
            Ok(())
        })
    }
}
