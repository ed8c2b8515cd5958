//! `disk-full-follower` (matrix row 10): as `disk-full-leader`, on a node
//! that follows shard 0. Every node leads some shards, so those fail over
//! when its store fails; the rest keep committing with the other two.
//!
//! Bounds: I1 (nothing acknowledged lost), fault-window lateness p99 < 1 s,
//! digests equal after the restart (I7).

use futures::future::BoxFuture;

use crate::check::Report;
use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::Setup;
use crate::scenario::leader;
use crate::scenario::led_by;
use crate::scenarios::disk_fill;

pub struct DiskFullFollower;

impl Scenario for DiskFullFollower {
    fn name(&self) -> &'static str {
        "disk-full-follower"
    }
    fn about(&self) -> &'static str {
        "fill the data directory (tmpfs) of a follower of shard 0 under load (below the watermark 8 s, then full until the store fails or 30 s); free it, restart it if it stopped"
    }
    fn bounds(&self) -> Bounds {
        Bounds { window_p99_ms: Some(1_000), ..NO_BOUNDS }
    }
    fn setup_options(&self, _args: &crate::Args) -> Setup {
        disk_fill::setup()
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let l0 = leader(&run.seeds, 0).await?;
            let victim = run.cluster.nodes.iter().map(|n| n.id).find(|id| *id != l0).expect("three nodes");
            println!("    node {victim} follows shard 0 and leads shards {:?}", led_by(run, victim).await);
            disk_fill::fill_and_free(run, victim, false).await
        })
    }
    fn judge<'a>(&'a self, run: &'a mut Run, _report: &'a Report) -> BoxFuture<'a, anyhow::Result<Vec<String>>> {
        Box::pin(async move {
            if let Some(victim) = run.notes.get("victim").copied() {
                disk_fill::report_creates(run, victim)?;
            }
            Ok(Vec::new())
        })
    }
}
