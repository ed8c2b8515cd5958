//! `tocsin-chaos`: runs the fault scenarios against a real three-node
//! cluster (four for the membership scenarios) and judges each with the
//! invariant checker.
//!
//! Each scenario starts from nothing: a fresh network (bridge, one namespace
//! per node and one for the receiver), fresh data directories, the steady
//! load (creates at a fixed rate, some cancelled), then its fault, then a
//! drain until every timer that must fire has fired or the drain gives up.
//! The runner checks I7 (replica digests) and I8 (leaders after healing)
//! live; the rest come from the recorded files.
//!
//! It needs root (network namespaces, iptables). Without it the run prints
//! SKIPPED and exits with status 77; it never reports a pass it did not see.

mod check;
mod cluster;
mod driver;
mod net;

use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::bail;
use clap::Parser;

use crate::check::Report;
use crate::cluster::Cluster;
use crate::driver::Recorder;
use crate::driver::now_ms;
use crate::net::Net;

/// Exit status for "could not run" (the automake convention for skipped).
const EXIT_SKIPPED: u8 = 77;

#[derive(Parser)]
#[command(about = "Fault scenarios against a real three-node Tocsin cluster")]
struct Args {
    /// Scenarios to run, comma separated (default: all). `--list` names them.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The CI subset: baseline, kill-leader, partition-leader.
    #[arg(long)]
    quick: bool,
    /// Print the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// The `tocsin` binary (default: next to this one).
    #[arg(long)]
    tocsin: Option<PathBuf>,
    /// Where each scenario keeps its data, logs and NDJSON records.
    #[arg(long, default_value = "chaos-tests/run")]
    dir: PathBuf,
    #[arg(long, default_value_t = 12)]
    shards: u32,
    /// Steady creates per second.
    #[arg(long, default_value_t = 1_000)]
    rate: u64,
    /// Fraction of the steady creates cancelled before they are due.
    #[arg(long, default_value_t = 0.1)]
    cancel_fraction: f64,
    /// Timers due in the ten seconds after the leader kill.
    #[arg(long, default_value_t = 20_000)]
    burst: u64,
}

/// Lateness bounds a scenario must meet.
#[derive(Clone, Copy)]
struct Bounds {
    /// p99 and max over timers due in the fault window.
    window_p99_ms: Option<u64>,
    window_max_ms: Option<u64>,
    /// p99 over the whole run.
    run_p99_ms: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    None,
    KillLeader,
    PartitionLeader,
    FreezeLeader,
    KillAll,
    RollingRestart,
    AddNode,
    RemoveNode,
    KillDuringChange,
    Rebalance,
}

struct Scenario {
    name: &'static str,
    about: &'static str,
    fault: Fault,
    bounds: Bounds,
    quick: bool,
}

const FAILOVER_BOUNDS: Bounds = Bounds { window_p99_ms: Some(1_000), window_max_ms: Some(2_000), run_p99_ms: None };

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "baseline",
        about: "no fault: the steady load for 20 s",
        fault: Fault::None,
        bounds: Bounds { window_p99_ms: None, window_max_ms: None, run_p99_ms: Some(200) },
        quick: true,
    },
    Scenario {
        name: "kill-leader",
        about: "kill -9 the leader of shard 0 while 20,000 timers are due in the next 10 s; restart it 10 s later",
        fault: Fault::KillLeader,
        bounds: FAILOVER_BOUNDS,
        quick: true,
    },
    Scenario {
        name: "partition-leader",
        about: "cut the leader of shard 0 off from the other nodes for 20 s (it still reaches clients and the receiver)",
        fault: Fault::PartitionLeader,
        bounds: FAILOVER_BOUNDS,
        quick: true,
    },
    Scenario {
        name: "freeze-leader",
        about: "SIGSTOP the leader of shard 0 for 5 s, then SIGCONT",
        fault: Fault::FreezeLeader,
        bounds: FAILOVER_BOUNDS,
        quick: false,
    },
    Scenario {
        name: "kill-all",
        about: "kill -9 all three nodes at once; restart them 3 s later",
        fault: Fault::KillAll,
        bounds: Bounds { window_p99_ms: None, window_max_ms: None, run_p99_ms: None },
        quick: false,
    },
    Scenario {
        name: "rolling-restart",
        about: "SIGTERM each node in turn (it hands its leaderships over first), restart it, wait for leaders",
        fault: Fault::RollingRestart,
        bounds: FAILOVER_BOUNDS,
        quick: false,
    },
    Scenario {
        name: "add-node",
        about: "start a fourth node with --join and `tocsin admin node add` it under load",
        fault: Fault::AddNode,
        bounds: FAILOVER_BOUNDS,
        quick: false,
    },
    Scenario {
        name: "remove-node",
        about: "with four nodes, drain and remove the leader of shard 0 (`tocsin admin node remove`) under load",
        fault: Fault::RemoveNode,
        bounds: FAILOVER_BOUNDS,
        quick: false,
    },
    Scenario {
        name: "kill-during-change",
        about: "kill -9 a shard's leader while `node add` is changing its membership; restart it, re-run the add",
        fault: Fault::KillDuringChange,
        bounds: FAILOVER_BOUNDS,
        quick: false,
    },
    Scenario {
        name: "rebalance",
        about: "with four nodes and three shards moved off the ring's placement, `tocsin admin rebalance` under load",
        fault: Fault::Rebalance,
        bounds: FAILOVER_BOUNDS,
        quick: false,
    },
];

/// Live measurements the runner adds to the checker's report.
#[derive(Default)]
struct Live {
    /// Milliseconds from the fault until shard 0 had another leader.
    failover_ms: Option<u64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.list {
        for s in SCENARIOS {
            println!("{:<18} {}{}", s.name, s.about, if s.quick { " (quick)" } else { "" });
        }
        return ExitCode::SUCCESS;
    }
    let selected: Vec<&Scenario> = SCENARIOS
        .iter()
        .filter(|s| if args.only.is_empty() { !args.quick || s.quick } else { args.only.iter().any(|o| o == s.name) })
        .collect();
    if let Some(unknown) = args.only.iter().find(|o| !SCENARIOS.iter().any(|s| s.name == o.as_str())) {
        eprintln!("error: no scenario named {unknown:?} (see --list)");
        return ExitCode::from(2);
    }
    if let Err(why) = can_run() {
        eprintln!();
        eprintln!("************************************************************");
        eprintln!("  CHAOS TESTS SKIPPED: {why}");
        eprintln!("  nothing was checked; run as root to check the invariants");
        eprintln!("************************************************************");
        return ExitCode::from(EXIT_SKIPPED);
    }
    let tocsin = match args.tocsin.clone().map_or_else(default_tocsin, Ok) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let (mut passed, mut failed) = (0, 0);
    for scenario in selected {
        println!("=== {}: {}", scenario.name, scenario.about);
        let started = Instant::now();
        let result = runtime.block_on(run(scenario, &args, &tocsin));
        match result {
            Ok((report, live)) => {
                print_figures(&report, &live);
                let failures = failures(&report, scenario.bounds);
                if failures.is_empty() {
                    println!("--- {}: PASS ({:.0} s)", scenario.name, started.elapsed().as_secs_f64());
                    passed += 1;
                } else {
                    for f in &failures {
                        println!("    FAIL {f}");
                    }
                    println!("--- {}: FAIL (records in {})", scenario.name, args.dir.join(scenario.name).display());
                    failed += 1;
                }
            }
            Err(e) => {
                println!("    ERROR {e:#}");
                println!(
                    "--- {}: FAIL (could not complete; records in {})",
                    scenario.name,
                    args.dir.join(scenario.name).display()
                );
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn can_run() -> anyhow::Result<()> {
    let uid = net::sh(&["id", "-u"]).context("running id")?;
    if uid.trim() != "0" {
        bail!("not root (network namespaces and iptables need it)");
    }
    for tool in ["ip", "iptables"] {
        net::sh(&["sh", "-c", &format!("command -v {tool}")]).with_context(|| format!("{tool} is not installed"))?;
    }
    // The kernel must let us make a namespace at all.
    net::sh(&["ip", "netns", "add", "tc-probe"]).context("cannot create a network namespace")?;
    let _ = net::sh(&["ip", "netns", "del", "tc-probe"]);
    Ok(())
}

fn default_tocsin() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.parent().context("no parent directory")?.join("tocsin");
    if !path.exists() {
        bail!("no tocsin binary at {} (build it, or pass --tocsin)", path.display());
    }
    Ok(path)
}

fn failures(report: &Report, bounds: Bounds) -> Vec<String> {
    let mut out = report.failures(bounds.window_p99_ms.unwrap_or(u64::MAX));
    if let Some(max) = bounds.window_max_ms
        && report.lateness_fault_window.max_ms > max
    {
        out.push(format!("I5: fault-window lateness max {} ms over {max} ms", report.lateness_fault_window.max_ms));
    }
    if let Some(p99) = bounds.run_p99_ms
        && report.lateness.p99_ms > p99
    {
        out.push(format!("I5: whole-run lateness p99 {} ms over {p99} ms", report.lateness.p99_ms));
    }
    out
}

fn print_figures(r: &Report, live: &Live) {
    println!(
        "    creates {} acknowledged, {} unknown; cancels {} acknowledged, {} unknown; {} must fire",
        r.creates_ok, r.creates_unknown, r.cancels_cancelled, r.cancels_unknown, r.must_fire
    );
    println!(
        "    I1 lost {}   I2 cancelled-then-delivered {} ({} in flight, shown by index)",
        r.lost, r.cancelled_then_delivered, r.cancelled_in_flight_excused
    );
    println!(
        "    I4 accepted stale {}, epoch-order violations {} (rejected stale {}, duplicates {})",
        r.accepted_stale, r.epoch_order_violations, r.rejected_stale, r.duplicates
    );
    println!("    I5 lateness, whole run:    {}", r.lateness);
    println!("    I5 lateness, fault window: {}", r.lateness_fault_window);
    println!("    I6 early {}", r.early);
    if r.created_overdue > 0 {
        println!(
            "    {} creates were committed after their fire time; their lateness counts from creation",
            r.created_overdue
        );
    }
    println!(
        "    I7 digests {}   I8 leaders after healing {}",
        match r.digests_equal {
            Some(true) => "equal".to_string(),
            Some(false) => "DIFFER".to_string(),
            None => "not compared".to_string(),
        },
        r.leaders_after_heal_ms.map_or("never".to_string(), |ms| format!("{ms} ms")),
    );
    if let Some(ms) = live.failover_ms {
        println!("    failover: shard 0 had a new leader {ms} ms after the fault");
    }
}

async fn run(scenario: &Scenario, args: &Args, tocsin: &Path) -> anyhow::Result<(Report, Live)> {
    let dir = args.dir.join(scenario.name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let dir = dir.canonicalize()?;
    let net = Net::create(&[("n1", 1), ("n2", 2), ("n3", 3), ("n4", 4), ("sink", 10)])?;
    let mut cluster = Cluster::start(&net, tocsin, &dir, args.shards)?;
    let result = drive(scenario, args, &net, &mut cluster, &dir).await;
    if result.is_err() {
        eprintln!("{}", cluster.logs());
    }
    drop(cluster);
    drop(net);
    result
}

async fn drive(
    scenario: &Scenario,
    args: &Args,
    net: &Net,
    cluster: &mut Cluster,
    dir: &Path,
) -> anyhow::Result<(Report, Live)> {
    let mut seeds = cluster.seeds();
    let shards = args.shards;
    cluster::wait_all_led(&seeds, shards, Duration::from_secs(60))
        .await
        .context("the cluster never had a leader for every shard")?;
    if matches!(scenario.fault, Fault::RemoveNode | Fault::Rebalance) {
        // Setup, before any load: a fourth node, so that removing one leaves
        // every shard its three replicas, or so that there is somewhere to
        // move a replica to.
        add_fourth(net, cluster, &seeds).await?;
        seeds = cluster.seeds();
    }
    if scenario.fault == Fault::Rebalance {
        unbalance(cluster, &seeds, 3).await?;
    }
    let client = driver::client(seeds.clone()).await?;
    let ops = dir.join("ops.ndjson");
    let rec = Recorder::new(&ops)?;
    let stop = Arc::new(AtomicBool::new(false));
    // However this scenario ends (an error included), its load stops: it
    // must never spill into the next scenario's cluster.
    let _stop_on_exit = StopOnDrop(stop.clone());
    let load = tokio::spawn(driver::steady(
        client.clone(),
        rec.clone(),
        cluster.sink_url.clone(),
        args.rate,
        args.cancel_fraction,
        stop.clone(),
        "s",
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;

    let mut live = Live::default();
    let fault_start_ms;
    match scenario.fault {
        Fault::None => {
            fault_start_ms = now_ms();
            tokio::time::sleep(Duration::from_secs(15)).await;
        }
        Fault::KillLeader => {
            // The burst is due in the ten seconds after the kill.
            let lead_ms = 4_000;
            let made = Instant::now();
            driver::burst(&client, &rec, &cluster.sink_url, args.burst, lead_ms, 10_000, "b").await;
            let elapsed = made.elapsed();
            println!("    created the {} burst timers in {:.1} s", args.burst, elapsed.as_secs_f64());
            if let Some(left) = Duration::from_millis(lead_ms).checked_sub(elapsed) {
                tokio::time::sleep(left).await;
            }
            let victim = leader(&seeds, 0).await?;
            fault_start_ms = now_ms();
            println!("    kill -9 node {victim}");
            cluster.node(victim).kill9();
            live.failover_ms = new_leader_after(cluster, 0, victim).await;
            tokio::time::sleep(
                Duration::from_secs(10).saturating_sub(Duration::from_millis(now_ms() - fault_start_ms)),
            )
            .await;
            println!("    restart node {victim}");
            cluster.restart(victim)?;
        }
        Fault::PartitionLeader => {
            let victim = leader(&seeds, 0).await?;
            let host = cluster.node(victim).host.clone();
            let peers: Vec<_> = cluster.nodes.iter().filter(|n| n.id != victim).map(|n| n.host.clone()).collect();
            fault_start_ms = now_ms();
            println!("    partition node {victim} from its peers");
            net.partition(&host, &peers.iter().collect::<Vec<_>>())?;
            live.failover_ms = new_leader_after(cluster, 0, victim).await;
            tokio::time::sleep(
                Duration::from_secs(20).saturating_sub(Duration::from_millis(now_ms() - fault_start_ms)),
            )
            .await;
            println!("    heal");
            net.heal(&host)?;
        }
        Fault::FreezeLeader => {
            let victim = leader(&seeds, 0).await?;
            fault_start_ms = now_ms();
            println!("    SIGSTOP node {victim}");
            cluster.node(victim).freeze();
            live.failover_ms = new_leader_after(cluster, 0, victim).await;
            tokio::time::sleep(Duration::from_secs(5).saturating_sub(Duration::from_millis(now_ms() - fault_start_ms)))
                .await;
            println!("    SIGCONT node {victim}");
            cluster.node(victim).thaw();
        }
        Fault::KillAll => {
            fault_start_ms = now_ms();
            println!("    kill -9 every node");
            for node in &mut cluster.nodes {
                node.kill9();
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            println!("    restart every node");
            for id in 1..=3 {
                cluster.restart(id)?;
            }
        }
        Fault::RollingRestart => {
            fault_start_ms = now_ms();
            for id in 1..=3 {
                let stopping = Instant::now();
                cluster.node(id).terminate(Duration::from_secs(30));
                println!("    node {id} stopped gracefully in {} ms; restarting", stopping.elapsed().as_millis());
                cluster.restart(id)?;
                cluster::wait_all_led(&seeds, shards, Duration::from_secs(30))
                    .await
                    .with_context(|| format!("shards without a leader after restarting node {id}"))?;
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        }
        Fault::AddNode => {
            fault_start_ms = now_ms();
            cluster.start_joiner(net.host("n4"), 4).await?;
            let n4 = cluster.node(4).grpc();
            let added = Instant::now();
            let (ok, out) = cluster.admin(&seeds, &["node", "add", &n4])?;
            if !ok {
                bail!("node add failed:\n{out}");
            }
            println!("    node 4 added in {} ms: {}", added.elapsed().as_millis(), last_line(&out));
            seeds = cluster.seeds();
        }
        Fault::RemoveNode => {
            let victim = leader(&seeds, 0).await?;
            fault_start_ms = now_ms();
            let others: Vec<String> = cluster.nodes.iter().filter(|n| n.id != victim).map(|n| n.grpc()).collect();
            let removing = Instant::now();
            let (ok, out) = cluster.admin(&others, &["node", "remove", &victim.to_string()])?;
            if !ok {
                bail!("node remove {victim} failed:\n{out}");
            }
            println!(
                "    node {victim} drained and removed in {} ms: {}",
                removing.elapsed().as_millis(),
                last_line(&out)
            );
            let map = driver::client(others.clone()).await?.shard_map().await?;
            if let Some(s) = map.shards.iter().find(|s| s.replicas.contains(&victim) || s.replicas.len() != 3) {
                bail!("after removing node {victim}, shard {} is on {:?}", s.shard, s.replicas);
            }
            // The removed node holds nothing; keep only the others as seeds.
            seeds = others;
        }
        Fault::KillDuringChange => {
            cluster.start_joiner(net.host("n4"), 4).await?;
            let n4 = cluster.node(4).grpc();
            let (tocsin, run_dir) = cluster.admin_paths();
            let admin_seeds = seeds.clone();
            let target = n4.clone();
            fault_start_ms = now_ms();
            let first = tokio::task::spawn_blocking(move || {
                cluster::run_admin(&tocsin, &run_dir, &admin_seeds, &["node", "add", &target])
            });
            // Wait for a shard with node 4 as a learner: its change is under way.
            let (shard, victim) = mid_change(&seeds, 4).await.context("node add never started a change")?;
            println!("    kill -9 node {victim}, the leader of shard {shard}, while it adds node 4");
            cluster.node(victim).kill9();
            let (ok, out) = first.await.context("the admin thread panicked")??;
            println!(
                "    the interrupted node add {}: {}",
                if ok { "still finished" } else { "failed" },
                last_line(&out)
            );
            tokio::time::sleep(Duration::from_secs(3)).await;
            println!("    restart node {victim}, run node add again");
            cluster.restart(victim)?;
            seeds = cluster.seeds();
            cluster::wait_all_led(&seeds, shards, Duration::from_secs(30))
                .await
                .context("shards without a leader after the restart")?;
            let (ok, out) = cluster.admin(&seeds, &["node", "add", &n4])?;
            if !ok {
                bail!("re-running node add failed:\n{out}");
            }
            println!("    node add re-run: {}", last_line(&out));
            let map = driver::client(seeds.clone()).await?.shard_map().await?;
            if let Some(s) = map.shards.iter().find(|s| s.replicas.len() != 3) {
                bail!("after the add, shard {} is on {:?}", s.shard, s.replicas);
            }
        }
        Fault::Rebalance => {
            fault_start_ms = now_ms();
            let started = Instant::now();
            let (ok, out) = cluster.admin(&seeds, &["rebalance"])?;
            if !ok {
                bail!("rebalance failed:\n{out}");
            }
            println!("    rebalanced in {} ms: {}", started.elapsed().as_millis(), last_line(&out));
            let (ok, out) = cluster.admin(&seeds, &["rebalance", "--dry-run"])?;
            if !ok || !last_line(&out).contains("would move 0 shards") {
                bail!("after the rebalance, a dry run still plans moves:\n{out}");
            }
            let map = driver::client(seeds.clone()).await?.shard_map().await?;
            if let Some(s) = map.shards.iter().find(|s| s.replicas.len() != 3) {
                bail!("after the rebalance, shard {} is on {:?}", s.shard, s.replicas);
            }
        }
    }
    let healed = Instant::now();
    let fault_end_ms = now_ms();
    let leaders_ms = cluster::wait_all_led(&seeds, shards, Duration::from_secs(30))
        .await
        .map(|_| healed.elapsed().as_millis() as u64);

    // Keep the load on a little past the fault, then stop it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.context("the load driver panicked")?;
    rec.flush();
    println!(
        "    load stopped after {} creates ({} unknown)",
        rec.creates.load(Ordering::Relaxed),
        rec.failures.load(Ordering::Relaxed)
    );

    // Drain: every timer is due within 10 s of its create; give retries a
    // further 30 s, and stop as soon as nothing is missing.
    let fault = Some((fault_start_ms, fault_end_ms));
    let drain_until = Instant::now() + Duration::from_secs(40);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut report = check::check(&ops, &cluster.deliveries, fault)?;
    while report.lost > 0 && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_secs(2)).await;
        report = check::check(&ops, &cluster.deliveries, fault)?;
    }
    report.leaders_after_heal_ms = leaders_ms;
    report.digests_equal = Some(digests_agree(&seeds, shards).await?);
    Ok((report, live))
}

/// Sets its flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn last_line(text: &str) -> &str {
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// Setup for the scenarios that need four nodes: starts node 4 and adds it.
async fn add_fourth(net: &Net, cluster: &mut Cluster, seeds: &[String]) -> anyhow::Result<()> {
    cluster.start_joiner(net.host("n4"), 4).await?;
    let n4 = cluster.node(4).grpc();
    let (ok, out) = cluster.admin(seeds, &["node", "add", &n4])?;
    if !ok {
        bail!("setup: node add failed:\n{out}");
    }
    println!("    setup: {}", last_line(&out));
    cluster::wait_all_led(&cluster.seeds(), cluster.num_shards(), Duration::from_secs(30))
        .await
        .context("setup: shards without a leader after adding node 4")?;
    Ok(())
}

/// Setup for `rebalance`: moves one replica of each of the first `count`
/// shards to the node the ring did not place it on, so that a rebalance has
/// that many shards to put back.
async fn unbalance(cluster: &Cluster, seeds: &[String], count: usize) -> anyhow::Result<()> {
    let map = driver::client(seeds.to_vec()).await?.shard_map().await?;
    let nodes: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
    for s in map.shards.iter().take(count) {
        let from = *s.replicas.first().context("a shard with no replicas")?;
        let to = *nodes.iter().find(|n| !s.replicas.contains(n)).context("every node already holds the shard")?;
        let args =
            ["shard", "move", "--shard", &s.shard.to_string(), "--from", &from.to_string(), "--to", &to.to_string()];
        let (ok, out) = cluster.admin(seeds, &args)?;
        if !ok {
            bail!("setup: moving shard {} from {from} to {to} failed:\n{out}", s.shard);
        }
        println!("    setup: {}", last_line(&out));
    }
    cluster::wait_all_led(seeds, cluster.num_shards(), Duration::from_secs(30))
        .await
        .context("setup: shards without a leader after the moves")?;
    Ok(())
}

/// Polls until some shard has `learner` as a learner (a membership change
/// adding it is under way); returns the shard and its leader.
async fn mid_change(seeds: &[String], learner: u64) -> Option<(u32, u64)> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        for seed in seeds {
            if let Some(info) = cluster::node_info(seed, false).await
                && let Some(s) = info.shards.iter().find(|s| s.learners.contains(&learner) && s.leader != 0)
            {
                return Some((s.shard, s.leader));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

async fn leader(seeds: &[String], shard: u32) -> anyhow::Result<u64> {
    cluster::leader_of(seeds, shard).await.with_context(|| format!("shard {shard} has no leader"))
}

/// Polls the other nodes until one of them names a leader for `shard`
/// other than `old`; returns how long that took.
async fn new_leader_after(cluster: &Cluster, shard: u32, old: u64) -> Option<u64> {
    let started = Instant::now();
    let others: Vec<String> = cluster.nodes.iter().filter(|n| n.id != old).map(|n| n.grpc()).collect();
    while started.elapsed() < Duration::from_secs(10) {
        for addr in &others {
            if let Some(info) = cluster::node_info(addr, false).await
                && let Some(s) = info.shards.iter().find(|s| s.shard == shard)
                && s.leader != 0
                && s.leader != old
            {
                return Some(started.elapsed().as_millis() as u64);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// I7: for every shard, every replica that has applied the same index has
/// the same digest. Waits (up to 30 s) for the replicas to catch up to one
/// another; replicas that never do count as a failure.
async fn digests_agree(seeds: &[String], shards: u32) -> anyhow::Result<bool> {
    let started = Instant::now();
    loop {
        // shard -> [(node, applied, digest, count)], and its voter count
        let mut seen: Vec<Vec<(u64, u64, u64, u64)>> = vec![Vec::new(); shards as usize];
        let mut voters: Vec<usize> = vec![0; shards as usize];
        for seed in seeds {
            let Some(info) = cluster::node_info(seed, true).await else { continue };
            for s in info.shards {
                if let Some(v) = seen.get_mut(s.shard as usize) {
                    v.push((info.node_id, s.digest_applied_index, s.state_digest, s.timer_count));
                    voters[s.shard as usize] = voters[s.shard as usize].max(s.replicas.len());
                }
            }
        }
        let settled = seen.iter().zip(&voters).all(|(v, n)| *n > 0 && v.len() == *n && v.iter().all(|r| r.1 == v[0].1));
        if settled {
            let mut equal = true;
            for (shard, v) in seen.iter().enumerate() {
                if v.iter().any(|r| r.2 != v[0].2) {
                    println!("    shard {shard}: replicas at index {} differ: {v:?}", v[0].1);
                    equal = false;
                }
            }
            return Ok(equal);
        }
        if started.elapsed() > Duration::from_secs(30) {
            println!("    replicas never reached the same applied index: {seen:?}");
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
