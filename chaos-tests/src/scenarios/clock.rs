//! What the clock scenarios share: the jump itself (write the leader's
//! test clock offset file, watch it hand its leaderships over, put the
//! clock back) and a probe that tells whether a node honours its offset
//! file at all (its measured offset to its peers, from `/metrics`).

use std::time::Duration;

use crate::cluster::CLOCK_OFFSET_ENV;
use crate::driver::now_ms;
use crate::scenario::Run;
use crate::scenario::leader;
use crate::scenario::led_by;
use crate::scenario::new_leader_within;
use crate::scenario::sleep_rest;

/// How long a jumped clock stays jumped.
pub const HOLD: Duration = Duration::from_secs(20);
/// A delivery arriving more than this before its fire time is early (the
/// receiver's clock is the host's).
pub const EARLY_TOLERANCE_MS: u64 = 500;

/// The node's own measurement of its wall clock against its peers
/// (`tocsin_clock_offset_seconds`, the median offset, in ms), scraped from
/// its `/metrics`; `None` if it does not export one (yet). This shows the
/// offset file took effect whether or not the node leads anything (its
/// guard keeps the old timeline for stamps and firing, so a stamp would
/// not show it).
pub async fn probe_skew_ms(run: &Run, node: u64) -> Option<i64> {
    let http = run.cluster.nodes.iter().find(|n| n.id == node)?.http();
    let text = crate::observe::metrics(&http).await.ok()?;
    let line = text.lines().find(|l| l.starts_with("tocsin_clock_offset_seconds "))?;
    let seconds: f64 = line.rsplit(' ').next()?.parse().ok()?;
    Some((seconds * 1000.0).round() as i64)
}

/// Steps the wall clock of the leader of shard 0 by `offset_ms` for
/// [`HOLD`], then back to 0. Records the failover (time until shard 0 had
/// another leader) and fails the run if the node kept shard 0 or any other
/// leadership until the end of the hold.
pub async fn jump_leader(run: &mut Run, offset_ms: i64) -> anyhow::Result<()> {
    let victim = leader(&run.seeds, 0).await?;
    let fault_start_ms = now_ms();
    run.fault_start_ms = Some(fault_start_ms);
    println!("    node {victim} (leader of shard 0): wall clock {offset_ms:+} ms");
    run.cluster.set_clock_offset(victim, offset_ms)?;
    // The node re-reads its offset file at most every 100 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    report_probe(run, victim, offset_ms).await;
    let left = HOLD.saturating_sub(Duration::from_millis(now_ms() - fault_start_ms));
    let found = new_leader_within(&run.cluster, 0, victim, left).await;
    run.live.failover_ms = found.map(|_| now_ms() - fault_start_ms);
    match run.live.failover_ms {
        Some(ms) => println!("    shard 0 had a new leader {ms} ms after the jump"),
        None => {
            println!("    shard 0 still had node {victim} as its leader {} s after the jump", HOLD.as_secs());
            run.failures.push(format!(
                "clock: node {victim} kept shard 0 for {} s with its clock {offset_ms:+} ms off",
                HOLD.as_secs()
            ));
        }
    }
    sleep_rest(fault_start_ms, HOLD).await;
    let still = led_by(run, victim).await;
    println!("    at the end of the jump node {victim} leads shards {still:?}");
    if !still.is_empty() {
        run.failures.push(format!(
            "clock: node {victim} still led {} shards {} s after its clock jumped {offset_ms:+} ms",
            still.len(),
            HOLD.as_secs()
        ));
    }
    println!("    node {victim}: wall clock back to the host's");
    run.cluster.set_clock_offset(victim, 0)?;
    Ok(())
}

/// Prints whether `node` stamps creates with its offset clock; a node that
/// does not fails the run (the fault was not injected).
pub async fn report_probe(run: &mut Run, node: u64, offset_ms: i64) {
    // The node min-filters the one-way samples a follower hears over two
    // 1.5 s buckets (`clock.rs`), so its median may take up to 3 s to show
    // the step: look for up to 4 s.
    let started = std::time::Instant::now();
    let mut skew = probe_skew_ms(run, node).await;
    while started.elapsed() < Duration::from_secs(4)
        && skew.is_none_or(|s| (s - offset_ms).abs() >= offset_ms.abs() / 2)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
        skew = probe_skew_ms(run, node).await;
    }
    match skew {
        Some(skew) if (skew - offset_ms).abs() < offset_ms.abs() / 2 => {
            println!(
                "    probe: node {node} measures its clock {skew:+} ms from its peers': the offset file took effect"
            )
        }
        Some(skew) => {
            println!(
                "    probe: node {node} measures its clock {skew:+} ms from its peers': it does NOT honour its offset \
                 file ({CLOCK_OFFSET_ENV}); this run does not exercise a skewed clock"
            );
            run.failures.push(format!(
                "clock: node {node} does not honour its test clock offset file (it measures {skew:+} ms against its \
                 peers, not about {offset_ms:+} ms): the fault was not injected"
            ));
        }
        None => {
            println!("    probe: node {node} exports no clock offset, so the injection could not be checked");
            run.failures.push(format!("clock: node {node} exports no tocsin_clock_offset_seconds"));
        }
    }
}
