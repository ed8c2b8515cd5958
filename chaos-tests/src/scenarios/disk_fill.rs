//! What the disk-full scenarios share: fill a node's data directory (on its
//! own tmpfs) in two steps, watch what the node does, free it and restart
//! the node if it stopped.
//!
//! Step one leaves 128 MiB free, below the node's free-disk watermark
//! (`admission.min_free_disk_bytes`, 256 MiB by default): creates it leads
//! must be refused with RESOURCE_EXHAUSTED. Step two fills the rest, so
//! RocksDB's next allocation fails with ENOSPC and the store should fail
//! stop; step two lasts until it does (and 5 s more) or 30 s. Then the files
//! go; a node whose store failed (`/readyz` says so) or whose process ended
//! is restarted with the same data.

use std::time::Duration;
use std::time::Instant;

use crate::check;
use crate::disk;
use crate::driver::now_ms;
use crate::observe;
use crate::scenario::DataDirs;
use crate::scenario::Run;
use crate::scenario::Setup;
use crate::scenario::cpu_watch;
use crate::scenario::new_leader_within;

/// Each node's data directory gets its own tmpfs of this size.
const TMPFS_MIB: u64 = 512;
/// Step one leaves this much free: under the default watermark.
const GUARD_LEFT_BYTES: u64 = 128 << 20;
/// How long step one lasts.
const GUARD_FOR: Duration = Duration::from_secs(8);
/// Step two lasts until the store fails stop (and 5 s more), or this long.
const FULL_FOR: Duration = Duration::from_secs(30);

pub fn setup() -> Setup {
    Setup { data_dirs: DataDirs::Tmpfs { size_mib: TMPFS_MIB }, ..Setup::default() }
}

/// Fills `victim`'s data directory, holds, frees it, restarts the node if
/// it stopped. Sets the fault start and the failover of shard 0 (when the
/// victim led it).
pub async fn fill_and_free(run: &mut Run, victim: u64, leads_shard0: bool) -> anyhow::Result<()> {
    let node = run.cluster.node(victim);
    let data = node.data.clone();
    let http = node.http();
    let free_mib = disk::free_bytes(&data)? >> 20;
    let fault_start_ms = now_ms();
    run.fault_start_ms = Some(fault_start_ms);
    let cpu = cpu_watch(run);
    let forwarded_before = forwarded(run).await;
    println!(
        "    node {victim}: {free_mib} MiB free; fill it to {} MiB free (under the watermark)",
        GUARD_LEFT_BYTES >> 20
    );
    let guard = disk::fill(&data, GUARD_LEFT_BYTES, "chaos-fill-1")?;
    tokio::time::sleep(GUARD_FOR).await;
    println!("    node {victim}: fill the rest ({} MiB free before)", disk::free_bytes(&data)? >> 20);
    let full = disk::fill(&data, 0, "chaos-fill-2")?;
    let full_at = Instant::now();
    let mut failed_after_ms = None;
    let mut exited = false;
    let mut failover = None;
    // Until the store fails stop (and 5 s more, to see the failover), or
    // FULL_FOR: RocksDB may write into WAL space it preallocated for a while.
    while full_at.elapsed() < FULL_FOR
        && failed_after_ms.is_none_or(|ms| full_at.elapsed() < Duration::from_millis(ms + 5_000))
    {
        if failed_after_ms.is_none() {
            if run.cluster.node(victim).has_exited() {
                exited = true;
                failed_after_ms = Some(full_at.elapsed().as_millis() as u64);
            } else if let Ok((503, body)) = observe::get_status(&format!("http://{http}/readyz")).await
                && body.contains("store failed")
            {
                failed_after_ms = Some(full_at.elapsed().as_millis() as u64);
            }
        }
        if leads_shard0
            && failover.is_none()
            && new_leader_within(&run.cluster, 0, victim, Duration::from_millis(200)).await.is_some()
        {
            failover = Some(full_at.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("    CPU while the disk was filled (share of one core): {}", cpu.report());
    let forwarded_during: Vec<String> = forwarded(run)
        .await
        .iter()
        .zip(&forwarded_before)
        .map(|((id, after), (_, before))| format!("n{id} {:.0}", after - before))
        .collect();
    println!("    requests forwarded to a leader by each node meanwhile: {}", forwarded_during.join(", "));
    match failed_after_ms {
        Some(ms) if exited => println!("    node {victim} exited {ms} ms after its disk filled"),
        Some(ms) => println!("    node {victim}'s store failed (fail-stop) {ms} ms after its disk filled"),
        None => println!(
            "    node {victim} neither exited nor reported a failed store within {} s of a full disk",
            FULL_FOR.as_secs()
        ),
    }
    if leads_shard0 {
        match failover {
            Some(ms) => println!("    shard 0 had a new leader {ms} ms after the disk filled"),
            None => println!("    shard 0 kept node {victim} as its leader"),
        }
        run.live.failover_ms = failover;
    }
    // RocksDB's own log says what it did with the full disk (write stalls,
    // background errors); keep a copy, the tmpfs goes at the end of the run.
    let kept = run.dir.join(format!("n{victim}-rocksdb-LOG"));
    if std::fs::copy(data.join("LOG"), &kept).is_ok() {
        let text = std::fs::read_to_string(&kept).unwrap_or_default();
        let notable: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Stopping writes") || l.contains("No space") || l.contains("Background IO error"))
            .collect();
        println!(
            "    node {victim}'s RocksDB log ({}): {} lines about stopped writes or no space{}",
            kept.display(),
            notable.len(),
            notable.first().map_or(String::new(), |l| format!(", first: {}", l.chars().take(160).collect::<String>()))
        );
    }
    for file in [full, guard].into_iter().flatten() {
        std::fs::remove_file(file)?;
    }
    println!("    freed node {victim}'s disk ({} MiB free)", disk::free_bytes(&data)? >> 20);
    let node = run.cluster.node(victim);
    let store_failed = matches!(
        observe::get_status(&format!("http://{http}/readyz")).await,
        Ok((503, body)) if body.contains("store failed")
    );
    if node.has_exited() || !node.running() {
        println!("    restart node {victim} (it had exited)");
        run.cluster.restart(victim)?;
    } else if store_failed {
        println!("    restart node {victim} (its store had failed)");
        run.cluster.node(victim).kill9();
        run.cluster.restart(victim)?;
    } else {
        println!("    node {victim} kept running with a working store; not restarted");
    }
    run.notes.insert("victim", victim);
    Ok(())
}

/// Each node's count of requests it forwarded to a shard's leader (0 for a
/// node that does not answer).
async fn forwarded(run: &Run) -> Vec<(u64, f64)> {
    let mut out = Vec::new();
    for node in &run.cluster.nodes {
        let text = observe::metrics(&node.http()).await.unwrap_or_default();
        out.push((node.id, observe::counter_sum(&text, "tocsin_forwarded_requests_total")));
    }
    out
}

/// Prints whether the victim's admission guard engaged and how the creates
/// fared (by the client's last error for those whose outcome is unknown).
pub fn report_creates(run: &Run, victim: u64) -> anyhow::Result<()> {
    let log = run.cluster.nodes.iter().find(|n| n.id == victim).map(|n| n.log_tail(100_000)).unwrap_or_default();
    let guard = log.lines().any(|l| l.contains("refusing creates"));
    println!(
        "    node {victim}'s free-disk guard {}",
        if guard { "engaged (its log: refusing creates)" } else { "never engaged" }
    );
    let ops = check::read_ops(&run.ops)?;
    let mut unknown: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut ok = 0;
    for o in ops.iter().filter(|o| o.op == "create") {
        if o.outcome == "ok" {
            ok += 1;
        } else {
            *unknown.entry(o.code.as_str()).or_default() += 1;
        }
    }
    println!("    creates: {ok} acknowledged; unknown, by the client's last error: {unknown:?}");
    Ok(())
}
