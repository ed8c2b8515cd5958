//! `clock-skewed-leader` (matrix row 14): node 3's wall clock runs 30 s
//! ahead from its start (test clock offset file `30000`); under load,
//! `tocsin admin leader transfer` moves shard 0's leadership to it (if it
//! led shard 0 at the start, shard 0 is first moved to node 1).
//!
//! It must not fire early (no delivery more than 500 ms before its fire
//! time, by the receiver's host clock) and should refuse the leadership or
//! give it up: node 3 must not lead shard 0 20 s after the transfer.
//! Reported: whether it took shard 0, for how long, and the time until
//! another node led shard 0. Its clock goes back to the host's at the end.

use std::time::Duration;
use std::time::Instant;

use anyhow::bail;
use futures::future::BoxFuture;

use crate::cluster;
use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::Setup;
use crate::scenario::last_line;
use crate::scenario::leader;
use crate::scenario::led_by;
use crate::scenarios::clock;

pub struct ClockSkewedLeader;

/// The node whose clock runs ahead.
const SKEWED: u64 = 3;
const SKEW_MS: i64 = 30_000;

impl Scenario for ClockSkewedLeader {
    fn name(&self) -> &'static str {
        "clock-skewed-leader"
    }
    fn about(&self) -> &'static str {
        "node 3's clock runs +30 s from its start; `admin leader transfer` moves shard 0 to it"
    }
    fn bounds(&self) -> Bounds {
        Bounds { early_tolerance_ms: clock::EARLY_TOLERANCE_MS, ..NO_BOUNDS }
    }
    fn setup_options(&self, _args: &crate::Args) -> Setup {
        let mut setup = Setup::default();
        setup.nodes.clock_files = true;
        setup.nodes.initial_clock_offsets_ms = vec![(SKEWED, SKEW_MS)];
        setup
    }
    fn setup<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let led = led_by(run, SKEWED).await;
            println!("    setup: node {SKEWED} (clock {SKEW_MS:+} ms since its start) leads shards {led:?}");
            if leader(&run.seeds, 0).await? == SKEWED {
                let (ok, out) = run.cluster.admin(&run.seeds, &["leader", "transfer", "--shard", "0", "--to", "1"])?;
                println!("    setup: shard 0 to node 1 first: {}", last_line(&out));
                if !ok || leader(&run.seeds, 0).await? == SKEWED {
                    bail!("setup: could not move shard 0 off node {SKEWED}:\n{out}");
                }
            }
            Ok(())
        })
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let fault_start_ms = now_ms();
            run.fault_start_ms = Some(fault_start_ms);
            let (ok, out) = run.cluster.admin(&run.seeds, &["leader", "transfer", "--shard", "0", "--to", "3"])?;
            println!(
                "    leader transfer of shard 0 to node {SKEWED} {}: {}",
                if ok { "returned" } else { "failed" },
                last_line(&out)
            );
            clock::report_probe(run, SKEWED, SKEW_MS).await;
            // Who leads shard 0, every 100 ms.
            let started = Instant::now();
            let (mut took_ms, mut left_ms) = (None, None);
            while started.elapsed() < clock::HOLD {
                let now = cluster::leader_of(&run.seeds, 0).await;
                let at = (now_ms() - fault_start_ms) as i64;
                match now {
                    Some(SKEWED) if took_ms.is_none() => took_ms = Some(at),
                    Some(other) if other != SKEWED && took_ms.is_some() && left_ms.is_none() => left_ms = Some(at),
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let leads = leader(&run.seeds, 0).await.ok() == Some(SKEWED);
            match (took_ms, left_ms) {
                (None, _) => println!(
                    "    node {SKEWED} never led shard 0: it refused the leadership (or the transfer did not happen)"
                ),
                (Some(t), Some(l)) => println!(
                    "    node {SKEWED} led shard 0 from +{t} ms to +{l} ms; another node led it {l} ms after the transfer began"
                ),
                (Some(t), None) => println!("    node {SKEWED} took shard 0 at +{t} ms and still led it at the end"),
            }
            if leads {
                run.failures.push(format!(
                    "clock-skewed-leader: node {SKEWED}, its clock {SKEW_MS:+} ms off, still led shard 0 {} s after the transfer",
                    clock::HOLD.as_secs()
                ));
            }
            println!("    node {SKEWED}: wall clock back to the host's");
            run.cluster.set_clock_offset(SKEWED, 0)?;
            Ok(())
        })
    }
}
