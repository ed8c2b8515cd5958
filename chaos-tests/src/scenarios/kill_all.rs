//! `kill-all`: kill -9 all three nodes at once and restart them 3 s later
//! (process-crash consistency: nothing acknowledged may be lost).

use std::time::Duration;

use futures::future::BoxFuture;

use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;

pub struct KillAll;

impl Scenario for KillAll {
    fn name(&self) -> &'static str {
        "kill-all"
    }
    fn about(&self) -> &'static str {
        "kill -9 all three nodes at once; restart them 3 s later"
    }
    fn bounds(&self) -> Bounds {
        NO_BOUNDS
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            run.fault_start_ms = Some(now_ms());
            println!("    kill -9 every node");
            for node in &mut run.cluster.nodes {
                node.kill9();
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            println!("    restart every node");
            for id in 1..=3 {
                run.cluster.restart(id)?;
            }
            Ok(())
        })
    }
}
