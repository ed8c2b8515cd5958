//! Test harness: a `tocsin serve` child process on free ports and a
//! temporary data directory, and an in-test webhook receiver.

use axum::serve::ListenerExt as _;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

pub use tocsin_node::testing::free_ports;

/// One `tocsin serve` process.
pub struct NodeProcess {
    pub node_id: u64,
    pub data: PathBuf,
    pub grpc: String,
    pub http: String,
    /// The peer port (Raft, replica control, forwarding).
    pub peer: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    log: PathBuf,
    /// How the readiness probe reaches a node with client TLS, which
    /// answers https only.
    probe_tls: Option<ProbeTls>,
    /// Set: the node's stderr is a pipe this holds and never reads, so
    /// once the pipe is full every write to it would wait.
    stuck_stderr: Option<Option<std::io::PipeReader>>,
}

/// The files a probe of a node with client TLS presents: the CA that
/// signed the node's certificate, and a client certificate and key when
/// the node requires one.
#[derive(Clone, Debug)]
pub struct ProbeTls {
    pub ca: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl NodeProcess {
    /// Starts a single-node cluster with `env` as extra `TOCSIN_*` settings.
    pub fn start(dir: &std::path::Path, env: &[(&str, &str)]) -> NodeProcess {
        NodeProcess::start_with_args(dir, &[], env)
    }

    /// [`start`](Self::start) with extra `tocsin serve` arguments.
    pub fn start_with_args(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> NodeProcess {
        NodeProcess::start_single(dir, args, env, None)
    }

    /// [`start`](Self::start) for a node whose client ports speak TLS:
    /// its readiness is probed over https with `tls`.
    pub fn start_with_tls(dir: &std::path::Path, env: &[(&str, &str)], tls: ProbeTls) -> NodeProcess {
        NodeProcess::start_single(dir, &[], env, Some(tls))
    }

    /// [`start`](Self::start) with its stderr a pipe nobody reads: a log
    /// shipper that stopped, a stalled disk. Its log is not kept.
    pub fn start_with_stuck_stderr(dir: &std::path::Path, env: &[(&str, &str)]) -> NodeProcess {
        NodeProcess::start_single_with(dir, &[], env, None, true)
    }

    fn start_single(
        dir: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
        probe_tls: Option<ProbeTls>,
    ) -> NodeProcess {
        NodeProcess::start_single_with(dir, args, env, probe_tls, false)
    }

    fn start_single_with(
        dir: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
        probe_tls: Option<ProbeTls>,
        stuck_stderr: bool,
    ) -> NodeProcess {
        let ports = free_ports(3);
        let mut node = NodeProcess {
            node_id: 1,
            data: dir.join("data"),
            grpc: format!("127.0.0.1:{}", ports[0]),
            http: format!("127.0.0.1:{}", ports[1]),
            peer: format!("127.0.0.1:{}", ports[2]),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            child: None,
            log: dir.join("node.log"),
            probe_tls,
            stuck_stderr: stuck_stderr.then_some(None),
        };
        node.spawn();
        node.wait_ready();
        node
    }

    /// Starts a three-node cluster on free loopback ports, node `i + 1`
    /// with `env(i)` as extra settings, and waits until every node is ready.
    pub fn start_three(dir: &std::path::Path, env: impl Fn(usize) -> Vec<(String, String)>) -> Vec<NodeProcess> {
        let ports = free_ports(9);
        let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
        let cluster: Vec<String> =
            (0..3).map(|i| format!("{}={}/{}/{}", i + 1, addr(3 * i), addr(3 * i + 1), addr(3 * i + 2))).collect();
        let cluster = cluster.join(",");
        let mut nodes: Vec<NodeProcess> = (0..3)
            .map(|i| {
                let env = env(i);
                let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                NodeProcess::start_member(
                    dir,
                    i as u64 + 1,
                    [&addr(3 * i), &addr(3 * i + 1), &addr(3 * i + 2)],
                    &["--initial-cluster", &cluster],
                    &env,
                )
            })
            .collect();
        for n in &mut nodes {
            n.wait_ready();
        }
        nodes
    }

    /// Starts node `node_id` of a cluster on `[grpc, http, peer]` with
    /// extra `serve` arguments, without waiting for it to be ready (its
    /// peers may not be up yet).
    pub fn start_member(
        dir: &std::path::Path,
        node_id: u64,
        [grpc, http, peer]: [&str; 3],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> NodeProcess {
        let mut node = NodeProcess {
            node_id,
            data: dir.join(format!("data-{node_id}")),
            grpc: grpc.to_string(),
            http: http.to_string(),
            peer: peer.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: [("TOCSIN_REPLICATION_FACTOR", "3")]
                .iter()
                .chain(env)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            log: dir.join(format!("node-{node_id}.log")),
            probe_tls: None,
            stuck_stderr: None,
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let log: Stdio = match &mut self.stuck_stderr {
            Some(reader) => {
                let (r, w) = std::io::pipe().unwrap();
                *reader = Some(r);
                w.into()
            }
            None => std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap().into(),
        };
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tocsin"));
        let id = self.node_id.to_string();
        cmd.args(["serve", "--node-id", &id, "--grpc", &self.grpc, "--http", &self.http, "--peer", &self.peer])
            .args(&self.args)
            .arg("--data")
            .arg(&self.data)
            .env("TOCSIN_NUM_SHARDS", "8")
            .env("TOCSIN_REPLICATION_FACTOR", "1")
            // The tests' receivers listen on loopback, which the SSRF guard
            // refuses unless allowed; a test's own env may override this.
            .env("TOCSIN_DELIVERY__WEBHOOK_ALLOW", "127.0.0.0/8")
            // Most tests are not about tokens: the node runs open unless a
            // test's own env says `tokens` (the `auth` tests).
            .env("TOCSIN_AUTH__MODE", "open")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn tocsin"));
    }

    /// Probes this node's readiness over TLS with `tls` from now on (a
    /// member started with client TLS).
    pub fn set_probe_tls(&mut self, tls: ProbeTls) {
        self.probe_tls = Some(tls);
    }

    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut curl: Vec<String> = vec!["-sf".into(), "-m".into(), "1".into()];
        let url = match &self.probe_tls {
            Some(tls) => {
                curl.extend(["--cacert".into(), tls.ca.display().to_string()]);
                if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                    curl.extend(["--cert".into(), cert.display().to_string()]);
                    curl.extend(["--key".into(), key.display().to_string()]);
                }
                format!("https://{}/readyz", self.http)
            }
            None => format!("http://{}/readyz", self.http),
        };
        curl.push(url);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("node exited with {status}; log:\n{}", self.log());
            }
            if let Ok(out) = Command::new("curl").args(&curl).output()
                && out.status.success()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("node {} not ready; log:\n{}", self.node_id, std::fs::read_to_string(&self.log).unwrap_or_default());
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "kill it first");
        self.spawn();
        self.wait_ready();
    }

    /// Sends `signal` (as `kill -s` names it) to the running node.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        assert!(Command::new("kill").args(["-s", signal, &pid.to_string()]).status().unwrap().success());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A delivery as the receiver saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub recv_ms: u64,
    pub fire_at_ms: u64,
    pub fire_id: String,
    pub epoch: u64,
    pub attempt: u64,
    pub late_by_ms: u64,
    /// A recurring timer's occurrence number; 0 for a one-shot timer.
    pub occurrence: u64,
}

/// An HTTP receiver that records every delivery by timer id, and answers
/// each with the status it is set to (200 unless [`Receiver::answer`]).
pub struct Receiver {
    pub url: String,
    pub seen: Arc<Mutex<HashMap<String, Vec<Seen>>>>,
    status: Arc<std::sync::atomic::AtomicU16>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let seen: Arc<Mutex<HashMap<String, Vec<Seen>>>> = Arc::default();
        let status = Arc::new(std::sync::atomic::AtomicU16::new(200));
        let state = seen.clone();
        let answer = status.clone();
        let app = axum::Router::new().fallback(axum::routing::post(move |body: axum::body::Bytes| {
            let state = state.clone();
            let answer = answer.clone();
            async move {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let s = Seen {
                    recv_ms: now_ms(),
                    fire_at_ms: v["fire_at_ms"].as_u64().unwrap(),
                    fire_id: v["fire_id"].as_str().unwrap().to_string(),
                    epoch: v["epoch"].as_u64().unwrap(),
                    attempt: v["attempt"].as_u64().unwrap(),
                    late_by_ms: v["late_by_ms"].as_u64().unwrap(),
                    occurrence: v["occurrence"].as_u64().unwrap_or(0),
                };
                state.lock().unwrap().entry(v["id"].as_str().unwrap().to_string()).or_default().push(s);
                let code = answer.load(std::sync::atomic::Ordering::Relaxed);
                (axum::http::StatusCode::from_u16(code).unwrap(), "ok")
            }
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move {
            axum::serve(
                listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                }),
                app,
            )
            .await
        });
        Receiver { url, seen, status }
    }

    /// Answers every delivery from now on with `status`.
    pub fn answer(&self, status: u16) {
        self.status.store(status, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn delivered(&self) -> HashMap<String, Vec<Seen>> {
        self.seen.lock().unwrap().clone()
    }

    /// The deliveries of timer `id` so far.
    pub fn of(&self, id: &str) -> Vec<Seen> {
        self.seen.lock().unwrap().get(id).cloned().unwrap_or_default()
    }
}

/// p50/p99/max of a list, for the test's printout.
/// The Prometheus text a node serves on `http` (its HTTP API address).
pub async fn metrics_text(http: &str) -> String {
    let client = tocsin_contract::tls::http_client_builder().build().unwrap();
    client.get(format!("http://{http}/metrics")).send().await.unwrap().text().await.unwrap()
}

/// The value of the unlabelled metric `name` a node serves on `http`; 0
/// while it has none (a counter not yet counted is not shown).
pub async fn metric_value(http: &str, name: &str) -> u64 {
    let prefix = format!("{name} ");
    metrics_text(http)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str())?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Polls `done` every 50 ms until it holds; fails the test, naming `what`,
/// if it does not within `limit`.
pub async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates through a plain (not shard-aware) gRPC client, retrying an
/// UNAVAILABLE for up to 4 s as a client must: a shard's leadership can
/// move while a test runs (the start-up balancing hands leaders from node 1
/// to nodes 2 and 3), and a create that reaches a node just as it stops
/// leading is refused with a retry hint, which this waits out (10 ms at
/// least, for an answer without one). The timer's id makes a retry safe.
/// Not the shard-aware client, which retries by itself: these tests send
/// through a chosen node to see it forward.
pub async fn create_retrying_unavailable(
    client: &mut tocsin_client::v1::timer_service_client::TimerServiceClient<tonic::transport::Channel>,
    req: tocsin_client::v1::CreateTimerRequest,
) -> Result<tonic::Response<tocsin_client::v1::CreateTimerResponse>, tonic::Status> {
    let until = Instant::now() + Duration::from_secs(4);
    loop {
        match client.create_timer(req.clone()).await {
            Err(status) if status.code() == tonic::Code::Unavailable && Instant::now() < until => {
                let hint_ms = tocsin_contract::codes::info_of(&status).retry_after_ms;
                tokio::time::sleep(Duration::from_millis(hint_ms.max(10))).await;
            }
            other => return other,
        }
    }
}

pub fn percentiles(mut v: Vec<u64>) -> String {
    if v.is_empty() {
        return "no samples".into();
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!("p50 {} ms, p99 {} ms, max {} ms (n={})", at(0.5), at(0.99), v[v.len() - 1], v.len())
}

/// What a test may expect of a timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Create acknowledged; not cancelled (or the cancel said it fired).
    MustFire,
    /// A cancel answered CANCELLED (or ALREADY_CANCELLED).
    Cancelled,
    /// The create or the cancel has an unknown outcome.
    Unknown,
}

/// Creates `reqs` in chunks of 250, eight chunks at a time, and cancels every
/// fifth acknowledged timer right after its chunk is created. Returns each
/// timer's id, fate and fire time.
pub async fn create_and_cancel_fifth(
    client: &tocsin_client::Client,
    reqs: Vec<tocsin_client::v1::CreateTimerRequest>,
) -> Vec<(String, Fate, u64)> {
    use futures::StreamExt;
    use tocsin_client::v1 as pb;
    let chunks: Vec<Vec<pb::CreateTimerRequest>> = reqs.chunks(250).map(<[_]>::to_vec).collect();
    futures::stream::iter(chunks)
        .map(|chunk| async move {
            let results = client.create_timers(chunk.clone()).await;
            let mut fates: Vec<(String, Fate, u64)> = chunk
                .iter()
                .zip(results)
                .map(|(req, res)| {
                    let fire_at = match req.fire_time {
                        Some(pb::create_timer_request::FireTime::FireAtMs(at)) => at,
                        _ => panic!("tests give absolute fire times"),
                    };
                    (req.id.clone(), if res.is_ok() { Fate::MustFire } else { Fate::Unknown }, fire_at)
                })
                .collect();
            let cancels: Vec<usize> =
                (0..fates.len()).filter(|i| fates[*i].1 == Fate::MustFire && i % 5 == 0).collect();
            let namespace = chunk[0].namespace.clone();
            let outcomes =
                futures::future::join_all(cancels.iter().map(|i| client.cancel_timer(&namespace, &fates[*i].0))).await;
            for (i, outcome) in cancels.into_iter().zip(outcomes) {
                use pb::cancel_timer_response::Outcome;
                fates[i].1 = match outcome.map(|r| r.outcome) {
                    Ok(o) if o == Outcome::Cancelled as i32 || o == Outcome::AlreadyCancelled as i32 => Fate::Cancelled,
                    Ok(o) if o == Outcome::AlreadyFired as i32 => Fate::MustFire,
                    _ => Fate::Unknown,
                };
            }
            fates
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Timers `0..total` due evenly over `span_ms`, from `from_ms` after
/// `base_ms`: the kill -9 tests' load.
pub struct DueWindow {
    pub base_ms: u64,
    pub from_ms: u64,
    pub span_ms: u64,
    pub total: usize,
}

impl DueWindow {
    pub fn fire_at(&self, i: usize) -> u64 {
        self.base_ms + self.from_ms + i as u64 * self.span_ms / self.total as u64
    }

    /// Waits for the middle of the window, or not at all when the creates
    /// ran past it on a loaded machine (CI runs these beside a 4-node test),
    /// and checks that at least a quarter of the timers are still pending
    /// then, so that a kill there lands mid-way. Returns that moment.
    pub async fn kill_point(&self) -> u64 {
        let kill_at = (self.base_ms + self.from_ms + self.span_ms / 2).max(now_ms());
        tokio::time::sleep(std::time::Duration::from_millis(kill_at.saturating_sub(now_ms()))).await;
        let pending = (0..self.total).filter(|i| self.fire_at(*i) > kill_at).count();
        assert!(
            pending >= self.total / 4,
            "creating took {} ms: only {pending} timers pending at the kill",
            kill_at - self.base_ms
        );
        kill_at
    }
}
