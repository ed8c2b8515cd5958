//! `receiver-down` (matrix row 17): the webhook receiver is unreachable for
//! `--receiver-outage-secs` (default 300) while the load goes on, then comes
//! back.
//!
//! Two tenants share the cluster, each at half the steady rate: `chaos`
//! (ids `s-…`, the server's default retry policy) posts to the main sink,
//! whose bridge port is taken down for the outage; `tenant-b` (ids `o-…`)
//! posts to a second sink in its own namespace that is never down. Every
//! timer of the first tenant due in the outage must be delivered after it
//! (the drain waits out the retry backoff), none may end DEAD, and the
//! second tenant's lateness must not notice (fault-window p99 < 1 s; the
//! lateness figures cover `o-…` only). Reported: the drain time after the
//! receiver returns, attempts per delivered timer (the sink records the
//! attempt number), and the nodes' peak RSS.

use std::time::Duration;

use futures::future::BoxFuture;
use tocsin_client::v1 as pb;

use crate::check;
use crate::check::Percentiles;
use crate::check::Report;
use crate::driver::Load;
use crate::driver::NAMESPACE;
use crate::driver::chaos_retry;
use crate::driver::now_ms;
use crate::observe;
use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::Setup;
use crate::scenario::cpu_watch;

pub struct ReceiverDown;

/// The second tenant.
const OTHER_NAMESPACE: &str = "tenant-b";

impl Scenario for ReceiverDown {
    fn name(&self) -> &'static str {
        "receiver-down"
    }
    fn about(&self) -> &'static str {
        "the webhook receiver is unreachable for 5 min (--receiver-outage-secs) under load; a second tenant's receiver stays up"
    }
    fn bounds(&self) -> Bounds {
        Bounds { window_p99_ms: Some(1_000), ..NO_BOUNDS }
    }
    fn setup_options(&self, _args: &crate::Args) -> Setup {
        let mut setup = Setup::default();
        setup.nodes.second_sink = true;
        setup
    }
    fn setup<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let half = (run.args.rate / 2).max(1);
            let (url2, deliveries2) = run.cluster.sink2.clone().expect("the second sink was asked for");
            let first = &mut run.loads[0];
            first.rate = half;
            // The server's default policy: the one a receiver outage must not
            // exhaust.
            first.retry = None;
            run.loads.push(Load {
                namespace: OTHER_NAMESPACE.into(),
                url: url2,
                tag: "o".into(),
                rate: half,
                cancel_fraction: run.args.cancel_fraction,
                retry: Some(chaos_retry()),
            });
            run.deliveries.push(deliveries2);
            run.lateness_prefixes = vec!["o-".into()];
            // A timer in backoff waits at most its current gap (the default
            // policy caps it at 300 s) after the receiver returns.
            let longest_gap_s = (run.args.receiver_outage_secs + 5).min(300);
            run.drain_limit = Duration::from_secs(longest_gap_s + 40);
            Ok(())
        })
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let outage = Duration::from_secs(run.args.receiver_outage_secs);
            let sink = run.net.host("sink").clone();
            run.fault_start_ms = Some(now_ms());
            println!("    take the receiver's port down for {} s", outage.as_secs());
            run.net.set_link(&sink, false)?;
            let cpu = cpu_watch(run);
            let started = std::time::Instant::now();
            while started.elapsed() < outage {
                let step = (outage - started.elapsed()).min(Duration::from_secs(60));
                tokio::time::sleep(step).await;
                if started.elapsed() < outage {
                    let rss: Vec<String> =
                        peak_rss(run).iter().map(|(id, kib)| format!("n{id} {} MiB", kib >> 10)).collect();
                    println!(
                        "    {} s into the outage; peak RSS so far {}",
                        started.elapsed().as_secs(),
                        rss.join(", ")
                    );
                }
            }
            println!("    CPU during the outage (share of one core): {}", cpu.report());
            println!("    bring the receiver's port back");
            run.net.set_link(&sink, true)?;
            Ok(())
        })
    }
    fn judge<'a>(&'a self, run: &'a mut Run, report: &'a Report) -> BoxFuture<'a, anyhow::Result<Vec<String>>> {
        Box::pin(async move {
            let mut failures = Vec::new();
            let restored_ms = run.fault_end_ms.unwrap_or(0);
            let outage_start_ms = run.fault_start_ms.unwrap_or(0);
            println!("    tenant-b (receiver never down): fault-window lateness {}", report.lateness_fault_window);
            // The first tenant, judged alone: lateness of its timers, how long
            // after the receiver returned the last one arrived, and attempts.
            let first = check::check(&check::Inputs {
                ops: &run.ops,
                deliveries: &run.deliveries,
                fault: Some((outage_start_ms, restored_ms)),
                lateness_prefixes: &["s-".to_string()],
                early_tolerance_ms: 0,
            })?;
            println!("    chaos tenant (receiver down): lateness {}", first.lateness);
            let deliveries = check::read_deliveries(&run.deliveries[0])?;
            let mut first_arrival: std::collections::HashMap<&str, (u64, u32)> = Default::default();
            for d in
                deliveries.iter().filter(|d| d.verdict == tocsin_contract::Verdict::Accepted && d.id.starts_with("s-"))
            {
                first_arrival.entry(d.id.as_str()).or_insert((d.recv_ms, d.attempt));
            }
            let ops = check::read_ops(&run.ops)?;
            let cancelled: std::collections::HashSet<&str> = ops
                .iter()
                .filter(|o| o.op == "cancel" && (o.outcome == "cancelled" || o.outcome == "already_cancelled"))
                .map(|o| o.id.as_str())
                .collect();
            // Timers of the first tenant due while the receiver was down, and
            // not cancelled.
            let due_in_outage: Vec<&str> = ops
                .iter()
                .filter(|o| o.op == "create" && o.outcome == "ok" && o.id.starts_with("s-"))
                .filter(|o| !cancelled.contains(o.id.as_str()))
                .filter(|o| o.fire_at_ms >= outage_start_ms && o.fire_at_ms < restored_ms)
                .map(|o| o.id.as_str())
                .collect();
            let after: Vec<u64> =
                due_in_outage.iter().filter_map(|id| first_arrival.get(id)).map(|(t, _)| *t).collect();
            if let Some(last) = after.iter().max() {
                let drain_ms = last.saturating_sub(restored_ms);
                let delivered_after = after.iter().filter(|t| **t >= restored_ms).count();
                println!(
                    "    drain: {} of {} timers due in the outage delivered; the last {:.1} s after the receiver returned ({:.0}/s)",
                    after.len(),
                    due_in_outage.len(),
                    drain_ms as f64 / 1000.0,
                    delivered_after as f64 / (drain_ms.max(1) as f64 / 1000.0)
                );
            }
            let attempts = Percentiles::of(
                due_in_outage.iter().filter_map(|id| first_arrival.get(id)).map(|(_, a)| *a as u64).collect(),
            );
            println!(
                "    attempts per delivered timer due in the outage: p50 {}, p99 {}, max {} (n={})",
                attempts.p50_ms, attempts.p99_ms, attempts.max_ms, attempts.n
            );
            let rss: Vec<String> = peak_rss(run).iter().map(|(id, kib)| format!("n{id} {} MiB", kib >> 10)).collect();
            println!("    peak RSS (VmHWM): {}", rss.join(", "));
            let dead = count_dead(run).await?;
            println!("    DEAD timers in namespace {NAMESPACE}: {dead}");
            if dead > 0 {
                failures.push(format!(
                    "receiver-down: {dead} timers ended DEAD under the default retry policy during a {} s outage",
                    run.args.receiver_outage_secs
                ));
            }
            Ok(failures)
        })
    }
}

fn peak_rss(run: &Run) -> Vec<(u64, u64)> {
    run.cluster.nodes.iter().filter_map(|n| Some((n.id, observe::peak_rss_kib(n.pid()?)?))).collect()
}

/// How many timers of the main namespace ended DEAD.
async fn count_dead(run: &Run) -> anyhow::Result<usize> {
    let mut dead = 0;
    let mut token = String::new();
    loop {
        let page = run
            .client()
            .list_timers(pb::ListTimersRequest {
                namespace: NAMESPACE.into(),
                state: pb::timer::State::Dead as i32,
                page_size: 1_000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await?;
        dead += page.timers.len();
        if page.next_page_token.is_empty() {
            return Ok(dead);
        }
        token = page.next_page_token;
    }
}
