//! `disk-full-leader` (matrix row 9): the data directory of the leader of
//! shard 0 (each node's on its own 512 MiB tmpfs) fills up under load, in
//! two steps: 8 s below the free-disk watermark, then completely full
//! until its store fails stop (and 5 s more) or for 30 s; then it is freed
//! and the node restarted if it stopped.
//!
//! Nothing acknowledged may be lost (I1): creates are refused
//! (RESOURCE_EXHAUSTED, or they fail) rather than acknowledged and lost,
//! and the replicas' digests agree after the restart (I7). Reported: how
//! the creates fared, when the store failed, the failover of shard 0.

use futures::future::BoxFuture;

use crate::check::Report;
use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::Setup;
use crate::scenario::leader;
use crate::scenarios::disk_fill;

pub struct DiskFullLeader;

impl Scenario for DiskFullLeader {
    fn name(&self) -> &'static str {
        "disk-full-leader"
    }
    fn about(&self) -> &'static str {
        "fill the data directory (tmpfs) of the leader of shard 0 under load (below the watermark 8 s, then full until the store fails or 30 s); free it, restart it if it stopped"
    }
    fn bounds(&self) -> Bounds {
        NO_BOUNDS
    }
    fn setup_options(&self, _args: &crate::Args) -> Setup {
        disk_fill::setup()
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let victim = leader(&run.seeds, 0).await?;
            disk_fill::fill_and_free(run, victim, true).await
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
