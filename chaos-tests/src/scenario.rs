//! What a scenario is, and the run every scenario shares.
//!
//! A scenario ([`Scenario`]) names itself, states its bounds, may ask for
//! particular nodes (config overrides, clock offset files, data directories
//! on tmpfs or a loop device, more receivers), and supplies its steps:
//! `setup` before the load, `fault` (inject and heal) while the steady
//! load runs, and `judge` for its own checks after the common ones. The
//! shared run ([`execute`]) does the rest the same way for every scenario:
//! a fresh network and cluster, leaders for every shard, the load, five
//! seconds, the fault, leaders after healing (I8), five more seconds of
//! load, the drain, the checker (I1, I2, I4, I5, I6) and the replica
//! digests (I7).

use std::collections::BTreeMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::bail;
use futures::future::BoxFuture;
use tocsin_client::Client;

use crate::Args;
use crate::check;
use crate::check::Report;
use crate::cluster;
use crate::cluster::Cluster;
use crate::cluster::NodeOptions;
use crate::disk::Disks;
use crate::driver;
use crate::driver::Load;
use crate::driver::Recorder;
use crate::driver::now_ms;
use crate::leaders::LeaderWatch;
use crate::net::Net;

/// Lateness and timing bounds a scenario must meet (I1, I2, I4, I6, I7 and
/// I8 always apply).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// p99 and max over timers due in the fault window.
    pub window_p99_ms: Option<u64>,
    pub window_max_ms: Option<u64>,
    /// p99 over the whole run.
    pub run_p99_ms: Option<u64>,
    /// A delivery is early only if it arrives more than this before its
    /// fire time (0: any earlier arrival is).
    pub early_tolerance_ms: u64,
    /// p99 of how long the create calls sent just after healing took
    /// (`Report::create_calls_after_heal`).
    pub after_heal_create_p99_ms: Option<u64>,
}

pub const NO_BOUNDS: Bounds = Bounds {
    window_p99_ms: None,
    window_max_ms: None,
    run_p99_ms: None,
    early_tolerance_ms: 0,
    after_heal_create_p99_ms: None,
};

pub const FAILOVER_BOUNDS: Bounds = Bounds { window_p99_ms: Some(1_000), window_max_ms: Some(2_000), ..NO_BOUNDS };

/// Where the nodes keep their data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataDirs {
    /// Plain directories under the run directory.
    #[default]
    Plain,
    /// Each on its own tmpfs of this many MiB.
    Tmpfs { size_mib: u64 },
    /// Each on its own ext4 image of this many MiB, loop-mounted.
    Loop { size_mib: u64 },
}

/// How a scenario's cluster is started.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    pub nodes: NodeOptions,
    pub data_dirs: DataDirs,
}

/// Live measurements the runner adds to the checker's report.
#[derive(Default)]
pub struct Live {
    /// Milliseconds from the fault until shard 0 had another leader.
    pub failover_ms: Option<u64>,
    /// Milliseconds from healing until nothing that must fire was missing.
    pub drained_after_heal_ms: Option<u64>,
    /// After a failover: shard 0's leadership lines from the nodes' logs in
    /// the 10 s from the fault, as "+ms nN: line".
    pub leadership: Vec<String>,
}

/// One fault scenario.
pub trait Scenario: Sync {
    fn name(&self) -> &'static str;
    fn about(&self) -> &'static str;
    fn bounds(&self) -> Bounds;
    /// In the CI subset (`--quick`).
    fn quick(&self) -> bool {
        false
    }
    /// How its cluster is started.
    fn setup_options(&self, _args: &Args) -> Setup {
        Setup::default()
    }
    /// Before the load starts (the cluster is up and every shard led).
    fn setup<'a>(&'a self, _run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
    /// Injects the fault and heals it, with the load running. Sets
    /// `run.fault_start_ms` where the fault began (default: when this was
    /// called); the fault ends when this returns.
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>>;
    /// Its own checks, after the common ones: prints its figures, returns
    /// its failures.
    fn judge<'a>(&'a self, _run: &'a mut Run, _report: &'a Report) -> BoxFuture<'a, anyhow::Result<Vec<String>>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// One scenario's run: its processes, network, records and settings.
///
/// Fields drop in order: the load first, then the processes, then the
/// mounts under them, then the network.
pub struct Run {
    stop_load: StopOnDrop,
    pub cluster: Cluster,
    pub disks: Disks,
    pub net: Net,
    pub args: Args,
    pub dir: PathBuf,
    /// The nodes the runner asks for leaders and digests.
    pub seeds: Vec<String>,
    pub live: Live,
    pub fault_start_ms: Option<u64>,
    /// The steady loads; `setup` may change them.
    pub loads: Vec<Load>,
    client: Option<Client>,
    pub rec: Recorder,
    pub ops: PathBuf,
    /// Every receiver's records.
    pub deliveries: Vec<PathBuf>,
    /// Timers counted in the lateness figures (id prefixes; empty: all).
    pub lateness_prefixes: Vec<String>,
    /// Longest drain after the load stops.
    pub drain_limit: Duration,
    /// When the fault ended (set by the runner once `fault` returns).
    pub fault_end_ms: Option<u64>,
    /// The scenario's own failures, found while it ran (`judge` may add more).
    pub failures: Vec<String>,
    /// A leader sampler a scenario started, for `judge` to read.
    pub watch: Option<LeaderWatch>,
    /// Figures a scenario's `fault` keeps for its `judge`.
    pub notes: BTreeMap<&'static str, u64>,
    /// The fault's phases as (start ms, label), in time order: the runner
    /// prints the fault window's lateness per label (timers by due time).
    pub phases: Vec<(u64, String)>,
    /// Whether the load waits for the balancer to spread leaderships
    /// first: not when a node starts unfit to lead (a skewed clock), which
    /// keeps the balancer from ever reaching its preferred spread.
    pub wait_balanced: bool,
}

impl Run {
    /// The load's client (there once `setup` has run).
    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("the client exists once setup ran")
    }

    pub fn shards(&self) -> u32 {
        self.args.shards
    }
}

/// Sets its flag when dropped.
pub struct StopOnDrop(pub Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `scenario` from nothing; returns the checker's report, the live
/// figures and the scenario's own failures.
pub async fn execute(
    scenario: &dyn Scenario,
    args: &Args,
    tocsin: &Path,
) -> anyhow::Result<(Report, Live, Vec<String>)> {
    crate::disk::cleanup(&args.dir);
    let dir = args.dir.join(scenario.name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let dir = dir.canonicalize()?;
    let setup = scenario.setup_options(args);
    let mut hosts = vec![("n1", 1), ("n2", 2), ("n3", 3), ("n4", 4), ("sink", 10)];
    if setup.nodes.second_sink {
        hosts.push(("sink2", 11));
    }
    let net = Net::create(&hosts)?;
    let mut disks = Disks::default();
    let data_dirs = match (setup.data_dirs, args.data_tmpfs_mib) {
        (DataDirs::Plain, Some(size_mib)) => DataDirs::Tmpfs { size_mib },
        (chosen, _) => chosen,
    };
    for name in ["n1", "n2", "n3", "n4"] {
        let data = dir.join(format!("{name}-data"));
        match data_dirs {
            DataDirs::Plain => {}
            DataDirs::Tmpfs { size_mib } => disks.tmpfs(&data, size_mib)?,
            DataDirs::Loop { size_mib } => disks.loop_ext4(&data, &dir.join(format!("{name}.img")), size_mib)?,
        }
    }
    let cluster = Cluster::start(&net, tocsin, &dir, args.shards, &setup.nodes)?;
    let ops = dir.join("ops.ndjson");
    let mut run = Run {
        stop_load: StopOnDrop(Arc::new(AtomicBool::new(false))),
        seeds: cluster.seeds(),
        loads: vec![Load::steady(&cluster.sink_url, args.rate, args.cancel_fraction)],
        deliveries: vec![cluster.deliveries.clone()],
        cluster,
        disks,
        net,
        args: args.clone(),
        dir,
        live: Live::default(),
        fault_start_ms: None,
        client: None,
        rec: Recorder::new(&ops)?,
        ops,
        lateness_prefixes: Vec::new(),
        drain_limit: Duration::from_secs(40),
        fault_end_ms: None,
        failures: Vec::new(),
        watch: None,
        notes: BTreeMap::new(),
        phases: Vec::new(),
        wait_balanced: setup.nodes.initial_clock_offsets_ms.is_empty(),
    };
    let result = drive(scenario, &mut run).await;
    if result.is_err() {
        eprintln!("{}", run.cluster.logs());
    }
    drop(run);
    result
}

async fn drive(scenario: &dyn Scenario, run: &mut Run) -> anyhow::Result<(Report, Live, Vec<String>)> {
    let shards = run.shards();
    wait_started(run).await?;
    crate::cluster::make_load_token(&run.cluster.tocsin, &run.dir, &run.seeds)?;
    scenario.setup(run).await?;
    run.client = Some(driver::client(run.seeds.clone()).await?);
    // However this scenario ends (an error included), its load stops: it
    // must never spill into the next scenario's cluster.
    let stop = run.stop_load.0.clone();
    let counters = crate::observe::CounterTimeline::start(
        run.cluster.nodes.iter().map(|n| (format!("n{}", n.id), n.http())).collect(),
        run.dir.join("counters.ndjson"),
    );
    let mut loads = tokio::task::JoinSet::new();
    for load in run.loads.clone() {
        loads.spawn(driver::steady(run.client().clone(), run.rec.clone(), load, stop.clone()));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;

    let called_ms = now_ms();
    scenario.fault(run).await?;
    let fault_start_ms = run.fault_start_ms.unwrap_or(called_ms);
    let healed = Instant::now();
    let fault_end_ms = now_ms();
    run.fault_start_ms = Some(fault_start_ms);
    run.fault_end_ms = Some(fault_end_ms);
    let leaders_ms = cluster::wait_all_led(&run.seeds, shards, Duration::from_secs(30))
        .await
        .map(|_| healed.elapsed().as_millis() as u64);

    // Keep the load on a little past the fault, then stop it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = loads.join_next().await {
        done.context("the load driver panicked")?;
    }
    let rec = &run.rec;
    rec.flush();
    println!(
        "    load stopped after {} creates ({} unknown)",
        rec.creates.load(Ordering::Relaxed),
        rec.failures.load(Ordering::Relaxed)
    );
    println!("    creates shed by the nodes: {}", counters.finish().await);

    // Drain: every timer is due within 10 s of its create; give retries
    // the rest of the drain limit, and stop as soon as nothing is missing.
    let bounds = scenario.bounds();
    let fault = Some((fault_start_ms, fault_end_ms));
    let drain_until = Instant::now() + run.drain_limit;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let inputs = check::Inputs {
        ops: &run.ops,
        deliveries: &run.deliveries,
        fault,
        lateness_prefixes: &run.lateness_prefixes,
        early_tolerance_ms: bounds.early_tolerance_ms,
    };
    let mut report = check::check(&inputs)?;
    // Long drains re-read big files; poll them less often.
    let poll = if run.drain_limit > Duration::from_secs(60) { 5 } else { 2 };
    while report.lost > 0 && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_secs(poll)).await;
        report = check::check(&inputs)?;
    }
    if report.lost == 0 {
        run.live.drained_after_heal_ms = Some(now_ms().saturating_sub(fault_end_ms));
    } else {
        show_lost(run, &report.lost_examples).await;
    }
    report.leaders_after_heal_ms = leaders_ms;
    if run.live.failover_ms.is_some() {
        run.live.leadership = run
            .cluster
            .leadership_lines(0, fault_start_ms, fault_start_ms + 10_000)
            .into_iter()
            .map(|(at, node, line)| format!("+{} ms n{node}: {line}", at - fault_start_ms))
            .collect();
    }
    report.digests_equal = Some(digests_agree(&run.seeds, shards).await?);
    if let Some(first) = run.phases.first() {
        let timeline: Vec<String> =
            run.phases.iter().map(|(at, label)| format!("+{:.1} s {label}", (at - first.0) as f64 / 1000.0)).collect();
        std::fs::write(run.dir.join("phases.txt"), timeline.join("\n") + "\n")?;
    }
    for (label, late) in check::lateness_by_phase(&report.fault_window_samples, &run.phases) {
        println!("    fault-window lateness, due while {label}: {late}");
    }
    let mut own = std::mem::take(&mut run.failures);
    own.extend(scenario.judge(run, &report).await?);
    Ok((report, std::mem::take(&mut run.live), own))
}

/// Waits (up to 60 s) until every shard has a leader; fails at once,
/// saying why, if a node process ended meanwhile (a node that refuses its
/// configuration exits at start).
async fn wait_started(run: &mut Run) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        for node in &mut run.cluster.nodes {
            if node.has_exited() {
                bail!("node {} exited at start: {}", node.id, last_line(&node.log_tail(5)));
            }
        }
        if cluster::wait_all_led(&run.seeds, run.args.shards, Duration::from_secs(1)).await.is_some() {
            if !run.wait_balanced {
                return Ok(());
            }
            // A fresh cluster's first node up wins most elections, and the
            // balancer then hands leaderships over a few per second (a
            // handover delays the moving shard's fires by the new leader's
            // election and wheel rebuild). The load starts once that is
            // done: the baseline measures a settled cluster, and a
            // scenario's fault is the only thing moving its shards.
            match cluster::wait_balanced(&run.seeds, run.args.shards, Duration::from_secs(30)).await {
                Some(took) => println!("    leaderships spread {} ms after every shard was led", took.as_millis()),
                None => println!("    starting the load with leaderships not yet spread"),
            }
            return Ok(());
        }
    }
    bail!("the cluster never had a leader for every shard")
}

/// Starts watching the CPU use of the nodes and of this harness (the load
/// driver), which share the machine's cores.
pub fn cpu_watch(run: &Run) -> crate::observe::CpuWatch {
    let mut processes: Vec<(String, u32)> =
        run.cluster.nodes.iter().filter_map(|n| Some((format!("n{}", n.id), n.pid()?))).collect();
    processes.push(("driver".into(), std::process::id()));
    crate::observe::CpuWatch::start(processes)
}

/// Prints what the cluster holds for some timers the checker found lost.
async fn show_lost(run: &Run, ids: &[String]) {
    let ops = check::read_ops(&run.ops).unwrap_or_default();
    for id in ids {
        let Some(op) = ops.iter().find(|o| o.op == "create" && &o.id == id) else { continue };
        match run.client().get_timer(&op.namespace, id).await {
            Ok(t) => {
                let state = tocsin_client::v1::timer::State::try_from(t.state).map_or("?".into(), |s| format!("{s:?}"));
                let f = t.fire.unwrap_or_default();
                println!(
                    "    lost {id} (shard {}): {state}, fire_at {} ({:+} ms from created_at), attempt {}, next attempt {}, last error {:?}",
                    t.shard,
                    t.fire_at_ms,
                    t.fire_at_ms as i64 - t.created_at_ms as i64,
                    f.attempt,
                    f.next_attempt_at_ms,
                    f.last_error
                );
            }
            Err(e) => println!("    lost {id}: get failed: {e}"),
        }
    }
}

pub fn last_line(text: &str) -> &str {
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// Sleeps until `total` has passed since `since_ms` (unix ms).
pub async fn sleep_rest(since_ms: u64, total: Duration) {
    tokio::time::sleep(total.saturating_sub(Duration::from_millis(now_ms().saturating_sub(since_ms)))).await;
}

/// Setup for the scenarios that need four nodes: starts node 4 and adds it.
pub async fn add_fourth(run: &mut Run) -> anyhow::Result<()> {
    let seeds = run.seeds.clone();
    run.cluster.start_joiner(run.net.host("n4"), 4).await?;
    let n4 = run.cluster.node(4).grpc();
    let (ok, out) = run.cluster.admin(&seeds, &["node", "add", &n4])?;
    if !ok {
        bail!("setup: node add failed:\n{out}");
    }
    println!("    setup: {}", last_line(&out));
    cluster::wait_all_led(&run.cluster.seeds(), run.cluster.num_shards(), Duration::from_secs(30))
        .await
        .context("setup: shards without a leader after adding node 4")?;
    run.seeds = run.cluster.seeds();
    Ok(())
}

/// Shards `node` leads, as it reports them itself.
pub async fn led_by(run: &Run, node: u64) -> Vec<u32> {
    let addr = run.cluster.nodes.iter().find(|n| n.id == node).map(|n| n.grpc()).unwrap_or_default();
    match cluster::node_info(&addr, false).await {
        Some(info) => info.shards.iter().filter(|s| s.leader == node).map(|s| s.shard).collect(),
        None => Vec::new(),
    }
}

pub async fn leader(seeds: &[String], shard: u32) -> anyhow::Result<u64> {
    cluster::leader_of(seeds, shard).await.with_context(|| format!("shard {shard} has no leader"))
}

/// Polls the other nodes until one of them names a leader for `shard`
/// other than `old`; returns how long that took.
pub async fn new_leader_after(cluster: &Cluster, shard: u32, old: u64) -> Option<u64> {
    new_leader_within(cluster, shard, old, Duration::from_secs(10)).await
}

/// [`new_leader_after`] with its own time limit. Every survivor is asked
/// at once, every 10 ms, each over a connection made once: a new connection
/// per question (up to a second to connect) made the figure as much about
/// the asking as about the election.
pub async fn new_leader_within(cluster: &Cluster, shard: u32, old: u64, limit: Duration) -> Option<u64> {
    let started = Instant::now();
    let others: Vec<String> = cluster.nodes.iter().filter(|n| n.id != old).map(|n| n.grpc()).collect();
    let mut clients = vec![None; others.len()];
    // The term the survivors held when first asked (the old leader's, as
    // an election takes a few hundred milliseconds): a new leader more than
    // one term later means a campaign failed on the way (a split vote).
    let mut term_before: Option<u64> = None;
    while started.elapsed() < limit {
        let asked = Instant::now();
        let answers =
            futures::future::join_all(others.iter().zip(clients.iter_mut()).map(|(addr, client)| async move {
                if client.is_none() {
                    *client = cluster::admin_client(addr).await;
                }
                let info = cluster::node_info_on(client.as_mut()?, false).await;
                if info.is_none() {
                    // Connect again next time: the node may have restarted.
                    *client = None;
                }
                info
            }))
            .await;
        let mut terms = Vec::new();
        for info in answers.into_iter().flatten() {
            let Some(s) = info.shards.into_iter().find(|s| s.shard == shard) else { continue };
            if s.leader != 0 && s.leader != old {
                let ms = started.elapsed().as_millis() as u64;
                match term_before {
                    Some(before) => println!(
                        "    shard {shard}: node {} leads in term {} ({} term(s) after {before})",
                        s.leader,
                        s.term,
                        s.term.saturating_sub(before)
                    ),
                    None => println!("    shard {shard}: node {} leads in term {}", s.leader, s.term),
                }
                return Some(ms);
            }
            terms.push(s.term);
        }
        if term_before.is_none() {
            term_before = terms.into_iter().min();
        }
        tokio::time::sleep_until((asked + Duration::from_millis(10)).into()).await;
    }
    None
}

/// I7: for every shard, every replica that has applied the same index has
/// the same digest. Waits (up to 30 s) for the replicas to catch up to one
/// another; replicas that never do count as a failure.
pub async fn digests_agree(seeds: &[String], shards: u32) -> anyhow::Result<bool> {
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
