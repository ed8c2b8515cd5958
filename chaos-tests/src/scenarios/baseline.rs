//! `baseline`: no fault, the steady load for 20 s; the capacity check every
//! other scenario's lateness is read against.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;

pub struct Baseline;

impl Scenario for Baseline {
    fn name(&self) -> &'static str {
        "baseline"
    }
    fn about(&self) -> &'static str {
        "no fault: the steady load for 20 s"
    }
    fn bounds(&self) -> Bounds {
        Bounds { run_p99_ms: Some(200), ..NO_BOUNDS }
    }
    fn quick(&self) -> bool {
        true
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            run.fault_start_ms = Some(now_ms());
            tokio::time::sleep(Duration::from_secs(15)).await;
            Ok(())
        })
    }
}
