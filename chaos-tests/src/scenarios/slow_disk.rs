//! `slow-disk` (matrix row 11): the leader of shard 0 gets a slow disk.
//!
//! Every node's data directory is its own loop-mounted ext4 image; at the
//! fault the leader's process is moved into a cgroup-v1 blkio group that
//! throttles writes to its loop device (`--slow-disk-write-bps`, 1 MiB/s,
//! and `--slow-disk-write-iops`, 20, by default) for 20 s. cgroup v1 does
//! not throttle buffered writeback, but RocksDB's WAL syncs are issued by
//! the node's own threads, so its fsync latency (`tocsin_store_fsync_seconds`
//! on `/metrics`) must rise visibly; if it does not, the fault was not
//! injected and the scenario fails saying so.
//!
//! Bounds: at most one leader change per shard (no flapping), fault-window
//! lateness p99 < 1 s, nothing lost. Reported: fsync p99 before and
//! during, create acknowledgement p99 during the fault.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::check;
use crate::check::Report;
use crate::driver::now_ms;
use crate::leaders::LeaderWatch;
use crate::observe;
use crate::observe::Histogram;
use crate::scenario::Bounds;
use crate::scenario::DataDirs;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::Setup;
use crate::scenario::leader;
use crate::scenario::sleep_rest;

pub struct SlowDisk;

const FSYNC: &str = "tocsin_store_fsync_seconds";
const HOLD: Duration = Duration::from_secs(20);

async fn fsyncs(http: &str) -> anyhow::Result<Histogram> {
    Ok(Histogram::parse(&observe::metrics(http).await?, FSYNC))
}

fn ms(seconds: Option<f64>) -> String {
    match seconds {
        Some(s) if s.is_finite() => format!("≤ {:.0} ms", s * 1000.0),
        Some(_) => "over the largest bucket".into(),
        None => "none completed".into(),
    }
}

impl Scenario for SlowDisk {
    fn name(&self) -> &'static str {
        "slow-disk"
    }
    fn about(&self) -> &'static str {
        "throttle writes to the data device (loop-mounted ext4, cgroup-v1 blkio) of the leader of shard 0 for 20 s"
    }
    fn bounds(&self) -> Bounds {
        Bounds { window_p99_ms: Some(1_000), ..NO_BOUNDS }
    }
    fn setup_options(&self, _args: &crate::Args) -> Setup {
        Setup { data_dirs: DataDirs::Loop { size_mib: 2_048 }, ..Setup::default() }
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let victim = leader(&run.seeds, 0).await?;
            run.watch = Some(LeaderWatch::start(run.seeds.clone(), Duration::from_millis(200)));
            let node = run.cluster.node(victim);
            let (http, data) = (node.http(), node.data.clone());
            let pid = node.pid().ok_or_else(|| anyhow::anyhow!("node {victim} is not running"))?;
            let device = run.disks.loop_device_of(&data)?;
            let m0 = fsyncs(&http).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let m1 = fsyncs(&http).await?;
            let before = m1.quantile_since(&m0, 0.99);
            let fault_start_ms = now_ms();
            run.fault_start_ms = Some(fault_start_ms);
            let (bps, iops) = (run.args.slow_disk_write_bps, run.args.slow_disk_write_iops);
            run.disks.throttle(pid, &device, bps, iops)?;
            println!(
                "    node {victim}: writes to its data device {device} throttled to {} KiB/s and {iops} IOPS (fsync p99 before: {}, {} fsyncs in 5 s)",
                bps >> 10,
                ms(before),
                m1.count_since(&m0)
            );
            tokio::time::sleep(Duration::from_secs(5)).await;
            let m2 = fsyncs(&http).await?;
            let early = m2.quantile_since(&m1, 0.99);
            let rose = match (before, early) {
                (_, None) => true,
                (Some(b), Some(d)) => d >= (b * 4.0).max(b + 0.020),
                (None, Some(_)) => true,
            };
            println!(
                "    calibration: fsync p99 in the first 5 s {} ({} fsyncs){}",
                ms(early),
                m2.count_since(&m1),
                if rose { "" } else { ": NOT visibly higher" }
            );
            if !rose {
                run.failures.push(format!(
                    "slow-disk: the throttle did not visibly raise fsync latency (p99 {} → {}): the fault was not injected; \
                     lower --slow-disk-write-bps / --slow-disk-write-iops",
                    ms(before),
                    ms(early)
                ));
            }
            sleep_rest(fault_start_ms, HOLD).await;
            let m3 = fsyncs(&http).await?;
            println!(
                "    fsync p99 over the fault {} ({} fsyncs in 20 s)",
                ms(m3.quantile_since(&m1, 0.99)),
                m3.count_since(&m1)
            );
            run.disks.unthrottle();
            println!("    throttle lifted");
            Ok(())
        })
    }
    fn judge<'a>(&'a self, run: &'a mut Run, _report: &'a Report) -> BoxFuture<'a, anyhow::Result<Vec<String>>> {
        Box::pin(async move {
            let mut failures = Vec::new();
            let (start, end) = (run.fault_start_ms.unwrap_or(0), run.fault_end_ms.unwrap_or(0));
            if let Some(watch) = &run.watch {
                let changes = watch.changes(start, end + 5_000);
                let total: usize = changes.values().sum();
                let flapping: Vec<(u32, usize)> =
                    changes.iter().filter(|(_, c)| **c > 1).map(|(s, c)| (*s, *c)).collect();
                println!(
                    "    leader changes during the fault and 5 s after: {total} ({flapping:?} with more than one)"
                );
                if !flapping.is_empty() {
                    failures.push(format!("slow-disk: shards changed leader more than once: {flapping:?}"));
                }
            }
            let ops = check::read_ops(&run.ops)?;
            let acks: Vec<u64> = ops
                .iter()
                .filter(|o| o.op == "create" && o.outcome == "ok" && o.invoke_ms >= start && o.invoke_ms <= end)
                .map(|o| o.complete_ms - o.invoke_ms)
                .collect();
            let a = check::Percentiles::of(acks);
            println!(
                "    create acknowledgement during the fault: p50 {} ms, p99 {} ms, max {} ms",
                a.p50_ms, a.p99_ms, a.max_ms
            );
            Ok(failures)
        })
    }
}
