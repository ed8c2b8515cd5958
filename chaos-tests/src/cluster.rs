//! The processes under test: three `tocsin serve` nodes (and, for the
//! membership scenarios, a fourth that joins later) and `tocsin sink`
//! receivers, each in its own namespace, with the controls faults need
//! (SIGKILL, SIGTERM, SIGSTOP/SIGCONT, restart with the same data, the test
//! clock offset), and `tocsin admin` to change the membership.

use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::bail;
use tocsin_client::v1 as pb;

use crate::net::Host;
use crate::net::Net;

pub const GRPC_PORT: u16 = 7070;
pub const HTTP_PORT: u16 = 7071;
/// The peer port: Raft, replica control and forwarding between nodes.
pub const PEER_PORT: u16 = 7072;

/// The nodes' bootstrap token (`auth.bootstrap_token_file`): the harness's
/// admin commands and observers use it; the load uses a scoped token made
/// with it (`LOAD_TOKEN`). The cluster checks tokens like a production one.
pub const BOOTSTRAP_TOKEN: &str = "chaos-harness-bootstrap-token-0123456789abcdef";

/// The load's token: `timers:write,timers:read,pull` on every namespace,
/// created with `tocsin admin token create` once each cluster is up.
static LOAD_TOKEN: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

pub fn load_token() -> Option<String> {
    LOAD_TOKEN.lock().expect("token lock").clone()
}

/// Creates the load's scoped token on the cluster at `addrs`.
pub fn make_load_token(tocsin: &Path, dir: &Path, addrs: &[String]) -> anyhow::Result<()> {
    let args = [
        "token",
        "create",
        "--scope",
        "timers:write,timers:read,pull",
        "--namespace",
        "*",
        "--label",
        "chaos-load",
        "--json",
    ];
    // A new cluster's shards may have leaders before its metadata group
    // has written the first map: try for a while.
    let started = Instant::now();
    let out = loop {
        let (ok, out) = run_admin(tocsin, dir, addrs, &args)?;
        if ok {
            break out;
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(20), "creating the load's token failed: {out}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let line = out.lines().find(|l| l.starts_with('{')).context("no JSON from token create")?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let token = v["token"].as_str().context("no token in the answer")?.to_string();
    *LOAD_TOKEN.lock().expect("token lock") = Some(token);
    Ok(())
}

pub const SINK_PORT: u16 = 9000;

/// How a scenario wants its nodes and receivers started.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// Extra environment for every node (`TOCSIN_*` config overrides).
    pub env: Vec<(String, String)>,
    /// Give every node its own test clock offset file (see
    /// [`Cluster::set_clock_offset`]), holding `0` unless listed here.
    pub clock_files: bool,
    pub initial_clock_offsets_ms: Vec<(u64, i64)>,
    /// Further ports the main sink listens on (each is its own webhook
    /// endpoint for the nodes).
    pub sink_extra_ports: Vec<u16>,
    /// A second receiver, in its own namespace (`tc-sink2`), never faulted.
    pub second_sink: bool,
}

/// The environment variable a debug-build node reads its test clock offset
/// file from: one signed integer, milliseconds added to its wall clock,
/// re-read at most every 100 ms.
pub const CLOCK_OFFSET_ENV: &str = "TOCSIN_TEST_CLOCK_OFFSET_FILE";

/// One node process.
pub struct NodeProc {
    pub id: u64,
    pub host: Host,
    /// Its data directory.
    pub data: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl NodeProc {
    pub fn grpc(&self) -> String {
        format!("{}:{GRPC_PORT}", self.host.ip)
    }

    fn spawn(&mut self, tocsin: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host.ns()]).arg(tocsin).args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.stdout(Stdio::null()).stderr(log).spawn().context("starting a node")?;
        self.child = Some(child);
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits (the node hands its leaderships over first).
    pub fn terminate(&mut self, timeout: Duration) {
        self.signal("-TERM");
        let deadline = Instant::now() + timeout;
        if let Some(child) = self.child.as_mut() {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill9();
    }

    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process ended by itself (then it counts as not running).
    pub fn has_exited(&mut self) -> bool {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(_)) = child.try_wait()
        {
            self.child = None;
            return true;
        }
        false
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Its HTTP address.
    pub fn http(&self) -> String {
        format!("{}:{HTTP_PORT}", self.host.ip)
    }
}

/// One receiver process.
struct SinkProc {
    child: Option<Child>,
}

/// The nodes and the receivers.
pub struct Cluster {
    pub nodes: Vec<NodeProc>,
    sinks: Vec<SinkProc>,
    /// The main receiver's endpoint, and where it records.
    pub sink_url: String,
    pub deliveries: PathBuf,
    /// The second receiver's endpoint and records, when started.
    pub sink2: Option<(String, PathBuf)>,
    pub tocsin: PathBuf,
    dir: PathBuf,
    shards: u32,
    options: NodeOptions,
}

impl Cluster {
    /// Starts the receivers and three nodes (hosts named n1..n3 in `net`).
    pub fn start(net: &Net, tocsin: &Path, dir: &Path, shards: u32, options: &NodeOptions) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("bootstrap-token"), format!("{BOOTSTRAP_TOKEN}\n"))?;
        make_certs(tocsin, &dir.join("certs"))?;
        let deliveries = dir.join("deliveries.ndjson");
        let sink_host = net.host("sink");
        let mut cluster = Cluster {
            nodes: Vec::new(),
            sinks: Vec::new(),
            sink_url: format!("http://{}:{SINK_PORT}/hook", sink_host.ip),
            deliveries: deliveries.clone(),
            sink2: None,
            tocsin: tocsin.to_path_buf(),
            dir: dir.to_path_buf(),
            shards,
            options: options.clone(),
        };
        let mut ports = vec![SINK_PORT];
        ports.extend(&options.sink_extra_ports);
        cluster.start_sink(sink_host, &ports, &deliveries, "sink.log")?;
        if options.second_sink {
            let host = net.host("sink2");
            let out = dir.join("deliveries-2.ndjson");
            cluster.start_sink(host, &[SINK_PORT], &out, "sink2.log")?;
            cluster.sink2 = Some((format!("http://{}:{SINK_PORT}/hook", host.ip), out));
        }
        if options.clock_files {
            for id in 1..=4u64 {
                let offset = options.initial_clock_offsets_ms.iter().find(|(n, _)| *n == id).map_or(0, |(_, ms)| *ms);
                cluster.set_clock_offset(id, offset)?;
            }
        }
        let names = ["n1", "n2", "n3"];
        let initial: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let ip = &net.host(n).ip;
                format!("{}={ip}:{GRPC_PORT}/{ip}:{HTTP_PORT}/{ip}:{PEER_PORT}", i + 1)
            })
            .collect();
        for (i, name) in names.iter().enumerate() {
            cluster.spawn_node(net.host(name), i as u64 + 1, &["--initial-cluster".into(), initial.join(",")])?;
        }
        Ok(cluster)
    }

    fn start_sink(&mut self, host: &Host, ports: &[u16], out: &Path, log: &str) -> anyhow::Result<()> {
        let sink_log = std::fs::File::create(self.dir.join(log))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &host.ns()]).arg(&self.tocsin).args(["sink", "--quiet"]);
        for port in ports {
            cmd.args(["--listen", &format!("{}:{port}", host.ip)]);
        }
        let child =
            cmd.arg("--out").arg(out).stdout(Stdio::null()).stderr(sink_log).spawn().context("starting a sink")?;
        self.sinks.push(SinkProc { child: Some(child) });
        Ok(())
    }

    /// The test clock offset file of node `id`.
    pub fn clock_file(&self, id: u64) -> PathBuf {
        self.dir.join(format!("n{id}.clock-offset-ms"))
    }

    /// Sets node `id`'s wall clock `offset_ms` away from the host's (through
    /// its offset file; written whole, then renamed, so the node never reads
    /// half a number).
    pub fn set_clock_offset(&self, id: u64, offset_ms: i64) -> anyhow::Result<()> {
        let path = self.clock_file(id);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset_ms}\n"))?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    fn spawn_node(&mut self, host: &Host, id: u64, extra: &[String]) -> anyhow::Result<()> {
        let data = self.dir.join(format!("{}-data", host.name));
        let mut args = vec![
            "serve".into(),
            "--node-id".into(),
            id.to_string(),
            "--data".into(),
            data.display().to_string(),
            "--grpc".into(),
            format!("0.0.0.0:{GRPC_PORT}"),
            "--http".into(),
            format!("0.0.0.0:{HTTP_PORT}"),
            "--advertise-grpc".into(),
            format!("{}:{GRPC_PORT}", host.ip),
            "--advertise-http".into(),
            format!("{}:{HTTP_PORT}", host.ip),
            "--peer".into(),
            format!("0.0.0.0:{PEER_PORT}"),
            "--advertise-peer".into(),
            format!("{}:{PEER_PORT}", host.ip),
            "--shards".into(),
            self.shards.to_string(),
        ];
        args.extend(extra.iter().cloned());
        let mut env = vec![
            ("TOCSIN_REPLICATION_FACTOR".to_string(), "3".to_string()),
            ("RUST_LOG".to_string(), "info,openraft=error".to_string()),
            // The sinks live on the harness's private bridge: the SSRF guard
            // refuses private addresses unless the operator allows them.
            ("TOCSIN_DELIVERY__WEBHOOK_ALLOW".to_string(), format!("{}.0/24", crate::net::SUBNET)),
            // The load's retry policy (`driver::chaos_retry`) retries after
            // 200 ms, below the 1 s floor a production node keeps: the
            // lateness bounds measure failover, not the backoff floor.
            ("TOCSIN_LIMITS__MIN_BACKOFF_MS".to_string(), "200".to_string()),
            // Tokens on, as in production (see `BOOTSTRAP_TOKEN`).
            ("TOCSIN_AUTH__MODE".to_string(), "tokens".to_string()),
            ("TOCSIN_AUTH__BOOTSTRAP_TOKEN_FILE".to_string(), self.dir.join("bootstrap-token").display().to_string()),
            // mTLS between nodes, as in production (see `make_certs`).
            ("TOCSIN_PEER_TLS__DIR".to_string(), self.dir.join("certs").display().to_string()),
        ];
        env.extend(self.options.env.iter().cloned());
        if self.options.clock_files {
            env.push((CLOCK_OFFSET_ENV.to_string(), self.clock_file(id).display().to_string()));
        }
        let log = self.dir.join(format!("{}.log", host.name));
        let mut node = NodeProc { id, host: host.clone(), data, log, args, env, child: None };
        node.spawn(&self.tocsin)?;
        self.nodes.push(node);
        Ok(())
    }

    /// Starts node `id` on `host` empty, waiting to be added (`--join`),
    /// and waits until it answers.
    pub async fn start_joiner(&mut self, host: &Host, id: u64) -> anyhow::Result<()> {
        self.spawn_node(host, id, &["--join".into()])?;
        let addr = self.node(id).grpc();
        let started = Instant::now();
        while node_info(&addr, false).await.is_none() {
            if started.elapsed() > Duration::from_secs(30) {
                bail!("node {id} did not answer at {addr} within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Runs `tocsin admin` (see [`run_admin`]) against `addrs`.
    pub fn admin(&self, addrs: &[String], args: &[&str]) -> anyhow::Result<(bool, String)> {
        run_admin(&self.tocsin, &self.dir, addrs, args)
    }

    /// The binary and the run directory, for running `tocsin admin` from
    /// another thread.
    pub fn admin_paths(&self) -> (PathBuf, PathBuf) {
        (self.tocsin.clone(), self.dir.clone())
    }

    pub fn num_shards(&self) -> u32 {
        self.shards
    }

    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(NodeProc::grpc).collect()
    }

    pub fn node(&mut self, id: u64) -> &mut NodeProc {
        self.nodes.iter_mut().find(|n| n.id == id).expect("node id")
    }

    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        let tocsin = self.tocsin.clone();
        let node = self.node(id);
        if node.running() {
            bail!("node {id} is still running");
        }
        node.spawn(&tocsin)
    }

    /// Every node's log lines about `shard`'s leadership from `since_ms`
    /// to `until_ms`, in time order, each as (Unix ms, node id, line).
    pub fn leadership_lines(&self, shard: u32, since_ms: u64, until_ms: u64) -> Vec<(u64, u64, String)> {
        let mut lines: Vec<(u64, u64, String)> = self
            .nodes
            .iter()
            .flat_map(|n| {
                let log = std::fs::read_to_string(&n.log).unwrap_or_default();
                crate::check::leadership_lines(&log, shard, since_ms)
                    .into_iter()
                    .filter(|(at, _)| *at <= until_ms)
                    .map(|(at, line)| (at, n.id, line))
                    .collect::<Vec<_>>()
            })
            .collect();
        // By time only: a node's lines of one millisecond keep its log's order.
        lines.sort_by_key(|(at, _, _)| *at);
        lines
    }

    pub fn logs(&self) -> String {
        self.nodes.iter().map(|n| format!("--- node {} ---\n{}", n.id, tail(&n.log, 40))).collect::<Vec<_>>().join("\n")
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.thaw();
            node.kill9();
        }
        for sink in &mut self.sinks {
            if let Some(mut child) = sink.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Makes the cluster's CA and certificates for every node a scenario may
/// start (1 to 4, joiners included) with `tocsin certs`, as an operator
/// would.
fn make_certs(tocsin: &Path, dir: &Path) -> anyhow::Result<()> {
    let dir_s = dir.display().to_string();
    for args in [
        vec!["certs", "init", "--force", "--dir", &dir_s],
        vec!["certs", "issue", "--force", "--dir", &dir_s, "--node", "1,2,3,4"],
    ] {
        let out = Command::new(tocsin).args(&args).output().context("running tocsin certs")?;
        anyhow::ensure!(out.status.success(), "tocsin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Runs `tocsin admin --addr <addrs> <args>` from the root namespace
/// (which reaches every node over the bridge), appending its output to
/// `admin.log` in `dir`; returns whether it succeeded, and its output.
pub fn run_admin(tocsin: &Path, dir: &Path, addrs: &[String], args: &[&str]) -> anyhow::Result<(bool, String)> {
    let mut cmd = Command::new(tocsin);
    cmd.env("TOCSIN_TOKEN", BOOTSTRAP_TOKEN).arg("admin");
    for a in addrs {
        cmd.args(["--addr", a]);
    }
    let out = cmd.args(args).output().context("running tocsin admin")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    use std::io::Write as _;
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("admin.log"))?;
    writeln!(log, "$ tocsin admin {}\n{text}", args.join(" "))?;
    Ok((out.status.success(), text))
}

/// Cluster info as one particular node sees it.
pub async fn node_info(addr: &str, digests: bool) -> Option<pb::ClusterInfo> {
    let mut admin = admin_client(addr).await?;
    node_info_on(&mut admin, digests).await
}

/// A connection to `addr`'s admin service, for asking it again and again
/// without a new connection each time ([`node_info_on`]).
pub async fn admin_client(
    addr: &str,
) -> Option<pb::admin_service_client::AdminServiceClient<tonic::transport::Channel>> {
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).ok()?.connect_timeout(Duration::from_secs(1));
    let channel = tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await.ok()?.ok()?;
    Some(pb::admin_service_client::AdminServiceClient::new(channel))
}

/// [`node_info`] over a connection already made.
pub async fn node_info_on(
    admin: &mut pb::admin_service_client::AdminServiceClient<tonic::transport::Channel>,
    digests: bool,
) -> Option<pb::ClusterInfo> {
    let mut request = tonic::Request::new(pb::GetClusterRequest { digests });
    request.metadata_mut().insert("authorization", format!("Bearer {BOOTSTRAP_TOKEN}").parse().ok()?);
    let info = tokio::time::timeout(Duration::from_secs(20), admin.get_cluster(request)).await.ok()?.ok()?;
    Some(info.into_inner())
}

/// Waits until every node answers, every replica it hosts knows a leader,
/// and every shard is hosted somewhere; returns how long that took.
pub async fn wait_all_led(seeds: &[String], shards: u32, timeout: Duration) -> Option<Duration> {
    let started = Instant::now();
    // What held the wait up, printed when it was slow: an I8 figure alone
    // says neither which node or shard it waited for nor whether a node was
    // merely slow to answer (a round that finds everything led can itself
    // take seconds).
    let mut lacking: Vec<String> = Vec::new();
    let mut slow: Vec<String> = Vec::new();
    while started.elapsed() < timeout {
        let mut why: Vec<String> = Vec::new();
        let mut led = vec![false; shards as usize];
        for seed in seeds {
            let asked = Instant::now();
            let info = node_info(seed, false).await;
            if asked.elapsed() > Duration::from_secs(1) {
                slow.push(format!("{seed} took {} ms to answer", asked.elapsed().as_millis()));
            }
            match info {
                Some(info) => {
                    for s in &info.shards {
                        if s.leader == 0 {
                            why.push(format!("{seed} knows no leader of shard {}", s.shard));
                        } else if let Some(l) = led.get_mut(s.shard as usize) {
                            *l = true;
                        }
                    }
                }
                None => why.push(format!("{seed} did not answer")),
            }
        }
        for (shard, l) in led.iter().enumerate() {
            if !l {
                why.push(format!("nobody knows a leader of shard {shard}"));
            }
        }
        if why != lacking && !why.is_empty() && started.elapsed() > Duration::from_secs(2) {
            println!("    (waiting for leaders, at {} ms: {})", started.elapsed().as_millis(), why.join("; "));
        }
        if why.is_empty() {
            if started.elapsed() > Duration::from_secs(2) {
                println!(
                    "    (every shard led after {} ms; lacking before: [{}]; slow answers: [{}])",
                    started.elapsed().as_millis(),
                    lacking.join("; "),
                    slow.join("; ")
                );
            }
            return Some(started.elapsed());
        }
        lacking = why;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "    (no leader everywhere after {} ms; lacking: [{}]; slow answers: [{}])",
        timeout.as_millis(),
        lacking.join("; "),
        slow.join("; ")
    );
    None
}

/// Waits until every shard is led by the node the balancer prefers for it
/// (`control/balance.rs`: `spread_leaders` over the map's targets, every
/// node active), so that a scenario's load starts on a settled cluster
/// rather than one still moving leaderships; returns how long that took,
/// or `None` (and says which shards were off) after `timeout`.
pub async fn wait_balanced(seeds: &[String], shards: u32, timeout: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut off: Vec<String> = Vec::new();
    while started.elapsed() < timeout {
        // shard -> (leader, target) as the nodes hosting it report them.
        let mut seen: Vec<Option<(u64, Vec<u64>)>> = vec![None; shards as usize];
        let mut answered = true;
        for seed in seeds {
            let Some(info) = node_info(seed, false).await else {
                answered = false;
                continue;
            };
            for s in info.shards {
                if let Some(slot) = seen.get_mut(s.shard as usize)
                    && s.leader != 0
                {
                    let target = if s.target.is_empty() { s.replicas.clone() } else { s.target.clone() };
                    *slot = Some((s.leader, target));
                }
            }
        }
        if answered && seen.iter().all(Option::is_some) {
            let placements: Vec<Vec<u64>> = seen.iter().flatten().map(|(_, t)| t.clone()).collect();
            let preferred = tocsin_core::routing::spread_leaders(&placements);
            off = seen
                .iter()
                .flatten()
                .zip(&preferred)
                .enumerate()
                .filter(|(_, ((leader, _), want))| Some(*leader) != **want)
                .map(|(shard, ((leader, _), want))| format!("shard {shard} led by {leader}, not {want:?}"))
                .collect();
            if off.is_empty() {
                return Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("    (leaderships not spread after {} ms: [{}])", timeout.as_millis(), off.join("; "));
    None
}

/// The node that leads `shard` now, as a node hosting it reports.
pub async fn leader_of(seeds: &[String], shard: u32) -> Option<u64> {
    for seed in seeds {
        if let Some(info) = node_info(seed, false).await
            && let Some(s) = info.shards.iter().find(|s| s.shard == shard && s.leader != 0)
        {
            return Some(s.leader);
        }
    }
    None
}
