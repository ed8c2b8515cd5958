//! Node configuration: a TOML file (every setting is documented in
//! `deploy/tocsin.example.toml`) with environment overrides.
//!
//! Any setting can be overridden by an environment variable named
//! `TOCSIN_` + its path in upper case, with `__` between table and key:
//! `TOCSIN_NODE_ID=2`, `TOCSIN_LIMITS__MAX_PAYLOAD_BYTES=131072`. Values are
//! parsed as TOML (numbers, booleans, arrays) and fall back to strings.
//!
//! Only variables that name a setting are read. Any other `TOCSIN_*`
//! variable is ignored and reported ([`NodeConfig::load_reporting`]), never
//! fatal: the CLI reads `TOCSIN_ADDR` itself, and Kubernetes injects
//! `TOCSIN_SERVICE_HOST`, `TOCSIN_PORT` and the like into every pod of a
//! namespace with a Service named `tocsin`. A typo in the TOML file is
//! still an error.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use serde::Serialize;
use tocsin_core::Limits;

/// Everything a node needs to start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's id: unique in the cluster, never reused for another node.
    pub node_id: u64,
    /// Where RocksDB and snapshots live.
    pub data_dir: PathBuf,
    /// The client gRPC listen address: TimerService and AdminService.
    pub grpc_listen: String,
    /// HTTP/JSON listen address.
    pub http_listen: String,
    /// The peer listen address: Raft links and transport, replica control
    /// and requests forwarded between nodes. Only other nodes belong here:
    /// bind it to the cluster's network. Default: `grpc_listen`'s host with
    /// its port + 2 (`7072` next to `7070`; `:0` stays `:0`).
    pub peer_listen: Option<String>,
    /// Addresses clients (and, for `peer_advertise`, other nodes) use to
    /// reach this node; default to the node's `initial_cluster` entry, else
    /// the listen addresses.
    pub grpc_advertise: Option<String>,
    pub http_advertise: Option<String>,
    pub peer_advertise: Option<String>,
    /// Number of shards, fixed when the cluster is created.
    pub num_shards: u32,
    /// Initial voters, `id=grpc_addr`, `id=grpc_addr/http_addr` or
    /// `id=grpc_addr/http_addr/peer_addr` (a missing peer address is the
    /// gRPC address's port + 2); empty means a single-node cluster of this
    /// node. Only the node with the lowest id
    /// initializes the groups; the others wait to be contacted.
    pub initial_cluster: Vec<String>,
    /// Start empty and wait to be added to a running cluster (`tocsin admin
    /// node add`): the node hosts no shard and forms no cluster of its own.
    /// Only read on the first start; afterwards the node reopens the
    /// replicas it hosted.
    pub join: bool,
    /// Replicas per shard (at most the number of initial voters).
    pub replication_factor: usize,
    pub limits: Limits,
    pub raft: RaftTuning,
    pub firing: FiringConfig,
    pub delivery: DeliveryConfig,
    pub admission: AdmissionConfig,
    pub auth: AuthConfig,
    pub peer_tls: PeerTlsConfig,
    pub client_tls: ClientTlsConfig,
    /// Per-namespace settings, such as the webhook signing secret.
    pub namespaces: BTreeMap<String, NamespaceConfig>,
    /// Log filter, as `RUST_LOG` (which takes precedence). The default
    /// keeps openraft's own lines to warnings: at `info` it writes one per
    /// heartbeat its core is asked for (about 100 a second on an idle node
    /// of three, measured 2026-11-27), and the node logs leadership changes
    /// itself.
    pub log: String,
    /// `text` (the default, for a terminal) or `json` (one object per line,
    /// for a log pipeline).
    pub log_format: LogFormat,
    /// One log line per client request (gRPC and HTTP: method or route,
    /// status, duration, peer), at INFO under the target `access`.
    pub access_log: bool,
    /// How far this node's wall clock may be from its peers' (measured over
    /// Raft round trips) before it stops firing and hands its leaderships
    /// over; also the largest wall-clock step it follows without asking
    /// its peers (see `clock.rs`).
    pub max_clock_offset_ms: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: 1,
            data_dir: PathBuf::from("./tocsin-data"),
            grpc_listen: "127.0.0.1:7070".into(),
            http_listen: "127.0.0.1:7071".into(),
            peer_listen: None,
            grpc_advertise: None,
            http_advertise: None,
            peer_advertise: None,
            num_shards: 16,
            initial_cluster: Vec::new(),
            join: false,
            replication_factor: 3,
            limits: Limits::default(),
            raft: RaftTuning::default(),
            firing: FiringConfig::default(),
            delivery: DeliveryConfig::default(),
            admission: AdmissionConfig::default(),
            auth: AuthConfig::default(),
            peer_tls: PeerTlsConfig::default(),
            client_tls: ClientTlsConfig::default(),
            namespaces: BTreeMap::new(),
            log: "info,openraft=warn".into(),
            log_format: LogFormat::Text,
            access_log: false,
            max_clock_offset_ms: 500,
        }
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Raft timings. A follower campaigns after `election_timeout_max_ms`
/// (openraft's leader lease, during which it grants no vote) plus its
/// election timeout of silence: `min + r × (max − min) / 2` and a jitter
/// under a third of that step, where `r` is its place in the group's
/// campaign order with the silent leader left out (`shard::raft_timer`),
/// so a killed leader is replaced about max + min after its last
/// heartbeat, and two survivors never campaign together. The max is also
/// the leader's dispatch lease (`ShardCtx::may_dispatch`): openraft's own
/// lease rule.
///
/// The defaults (40 / 100–130 ms) replace a killed leader in 210–260 ms
/// (the chaos `kill-leader` row). They hold on a CPU-saturated host because
/// the Raft threads run at a raised priority (`thread_nice`): offered
/// 10,000 timers/s, three nodes on two cores then held no election and
/// delivered 47–67 duplicates; with the Raft threads at the process's
/// priority the same timings gave 200–500 elections per node and 18,248
/// duplicates (docs/perf-history.md, "Raft threads first"). A node that cannot
/// raise the priority (no `CAP_SYS_NICE`) on a host that runs out of CPU
/// is safer with 50 / 150–300 ms, at 450–600 ms per failover.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftTuning {
    /// Leader heartbeat: well under half the election timeout, so one lost
    /// heartbeat does not start an election.
    pub heartbeat_ms: u64,
    /// Election timeouts: the first voter in a group's campaign order waits
    /// min, each next one (max − min) / 2 more, plus a jitter drawn per
    /// campaign (see above). The max also bounds each peer's Raft link: one
    /// to connect, two of silence before the connection is replaced
    /// (`shard::raft`).
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Take a snapshot after this many log entries since the last.
    pub snapshot_every_entries: u64,
    /// Keep this many entries behind a snapshot, so a briefly lagging
    /// follower catches up from the log rather than a snapshot.
    pub keep_entries_after_snapshot: u64,
    /// Deadline of every Raft RPC except snapshot transfer.
    pub rpc_timeout_ms: u64,
    /// The nice value of the Raft runtime's threads (openraft's cores,
    /// heartbeats, appends, votes): −20 to 0, 0 leaves them at the
    /// process's. Below 0 they run ahead of request and delivery work when
    /// the CPU is saturated, so heartbeats stay on time and leaders stay
    /// put (`runtime::raise_priority`). Needs `CAP_SYS_NICE` (the compose
    /// file and the Kubernetes manifests add it) or `LimitNICE=` under
    /// systemd; without either the node logs a warning at start and runs
    /// them at the process's priority. `tocsin_raft_thread_nice` shows
    /// which.
    pub thread_nice: i32,
    /// A quiet group's heartbeat (`shard::quiet`): a group whose log has
    /// not grown for a second, held by every member, is heartbeated this
    /// often instead of every `heartbeat_ms`, and the node's one `LIVENESS`
    /// message per peer per `heartbeat_ms` keeps its followers from
    /// campaigning. 0: groups never go quiet. Otherwise between
    /// `heartbeat_ms` and 450, so a quorum's answer stays under a second old
    /// (a leader refuses writes after a second without one).
    pub quiet_heartbeat_ms: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        RaftTuning {
            heartbeat_ms: 40,
            election_timeout_min_ms: 100,
            election_timeout_max_ms: 130,
            snapshot_every_entries: 20_000,
            keep_entries_after_snapshot: 5_000,
            rpc_timeout_ms: 1_000,
            thread_nice: -10,
            quiet_heartbeat_ms: 400,
        }
    }
}

/// The leader's wheel and the loader that feeds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FiringConfig {
    /// Only timers due within this window are held in memory.
    pub hot_window_ms: u64,
    /// Timers loaded per scan of the fire-time index.
    pub load_page: usize,
    /// Most timers held in one shard's wheel; past it the loader waits.
    pub max_wheel_entries: usize,
    /// Most `Fire` commands in one proposal.
    pub fire_batch: usize,
    /// Purge finished timers past retention this often.
    pub purge_interval_ms: u64,
    /// Retries (after a backoff, or an attempt's deadline) a shard's leader starts
    /// per second per namespace; 0: unlimited. First fires are not held by it (only
    /// catch-up pacing, below, holds them). Cluster-wide a namespace retries at
    /// most about this times the number of shards per second, so the backlog a
    /// receiver outage leaves drains without starving other namespaces.
    pub retries_per_namespace_per_sec: u32,
    /// A first fire later than this is catch-up (the backlog an outage
    /// leaves): paced per namespace at `catch_up_per_namespace_per_sec` so
    /// it does not stampede the receivers. 0: no pacing.
    pub catch_up_after_ms: u64,
    /// Catch-up fires a shard's leader starts per second per namespace
    /// (cluster-wide about this times the number of shards); 0: unlimited.
    pub catch_up_per_namespace_per_sec: u32,
    /// A webhook or AMQP timer's first `Fire` is committed up to this long
    /// before its fire time and sent at its time with no commit in between
    /// (an armed fire, `tocsin_core::arm`); 0: committed at its time. At
    /// most `tocsin_core::limits::MAX_ARM_AHEAD_MS` (2000).
    pub arm_ahead_ms: u64,
    /// Timers due within this much of each other are armed in one batch of
    /// `Fire`s: each is armed between `arm_ahead_ms - arm_step_ms` and
    /// `arm_ahead_ms` before its time.
    pub arm_step_ms: u64,
}

impl Default for FiringConfig {
    fn default() -> Self {
        FiringConfig {
            hot_window_ms: 60_000,
            load_page: 10_000,
            max_wheel_entries: 1_000_000,
            fire_batch: 1_000,
            purge_interval_ms: 10_000,
            retries_per_namespace_per_sec: 50,
            catch_up_after_ms: 60_000,
            catch_up_per_namespace_per_sec: 1_000,
            arm_ahead_ms: 300,
            arm_step_ms: 50,
        }
    }
}

/// Webhook and pull delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// Webhook request timeout; a timeout is a failed attempt.
    pub webhook_timeout_ms: u64,
    /// Most concurrent requests to one endpoint (scheme, host and port).
    pub per_endpoint_concurrency: usize,
    /// Most deliveries waiting for one endpoint; past it attempts fail fast
    /// and back off, so one slow endpoint cannot hold unbounded memory.
    pub per_endpoint_queue: usize,
    /// Most bytes the deliveries waiting for a connection slot hold on the
    /// node, all endpoints together (a waiting delivery counts its payload
    /// and about 2 KiB); past it attempts fail fast and back off like
    /// `per_endpoint_queue`. A full queue makes each attempt that finds it
    /// so a failed one, retried after a backoff and paced with the
    /// namespace's retries (measured under overload: 15,000–30,000 such
    /// retries per node, and a p99 lateness of 35–45 s), so the count bound
    /// is high and memory is bounded here.
    pub max_queued_bytes: usize,
    /// Most webhook requests in flight on the node.
    pub max_in_flight: usize,
    /// Deliveries waiting for a pull consumer, per topic.
    pub max_ready_per_topic: usize,
    /// Webhook targets the SSRF guard lets through although they are not
    /// public (`egress.rs`): CIDRs (`10.0.0.0/8`, `fd00::/8`), addresses,
    /// host names (`receiver.internal`) and `*.suffix` names. Empty (the
    /// default for `tocsin serve`): only public addresses. In the
    /// environment, a comma-separated list:
    /// `TOCSIN_DELIVERY__WEBHOOK_ALLOW=10.0.0.0/8,receiver.internal`.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub webhook_allow: Vec<String>,
    /// AMQP 0-9-1 brokers (RabbitMQ) timers may publish to, by name:
    /// `amqp_brokers.main = "amqp://user:password@rabbit:5672/%2f"`. A
    /// timer's `callback.amqp.broker` names one; clients never give an
    /// address. Every node of a cluster needs the same names (any node may
    /// lead a timer's shard). In the environment:
    /// `TOCSIN_DELIVERY__AMQP_BROKERS__MAIN=amqp://…`.
    pub amqp_brokers: std::collections::BTreeMap<String, BrokerUrl>,
}

/// An AMQP broker's URL, which may carry a password: shown without it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BrokerUrl(pub String);

impl std::fmt::Debug for BrokerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (scheme, rest) = self.0.split_once("://").unwrap_or(("", self.0.as_str()));
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        write!(f, "{scheme}://<redacted>@{host}")
    }
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            webhook_timeout_ms: 10_000,
            per_endpoint_concurrency: 64,
            per_endpoint_queue: 100_000,
            max_queued_bytes: 256 << 20,
            max_in_flight: 2_048,
            max_ready_per_topic: 1_000_000,
            webhook_allow: Vec::new(),
            amqp_brokers: std::collections::BTreeMap::new(),
        }
    }
}

impl NodeConfig {
    /// Every namespace's signing keys, the current one first, decoded and
    /// checked once: `validate` and the node (at start and on SIGHUP) both
    /// take them from here.
    /// The bootstrap token from `auth.bootstrap_token_file`, if set: the
    /// file's content, trimmed, at least 32 characters.
    pub fn bootstrap_token(&self) -> Result<Option<String>, ConfigError> {
        let Some(path) = &self.auth.bootstrap_token_file else { return Ok(None) };
        let invalid = |message: String| ConfigError::Invalid { field: "auth.bootstrap_token_file".into(), message };
        let token = std::fs::read_to_string(path).map_err(|e| invalid(format!("reading {}: {e}", path.display())))?;
        let token = token.trim().to_string();
        if token.chars().count() < 32 || token.chars().any(char::is_whitespace) {
            return Err(invalid(format!("{} must hold one token of at least 32 characters", path.display())));
        }
        Ok(Some(token))
    }

    pub fn signing_keys(&self) -> Result<std::collections::HashMap<String, Vec<Vec<u8>>>, ConfigError> {
        let invalid = |field: String, message: &str| ConfigError::Invalid { field, message: message.into() };
        let mut keys = std::collections::HashMap::new();
        for (ns, cfg) in &self.namespaces {
            let Some(current) = &cfg.webhook_secret else {
                if !cfg.webhook_previous_secrets.is_empty() {
                    let field = format!("namespaces.{ns}.webhook_previous_secrets");
                    return Err(invalid(field, "needs a webhook_secret to rotate to"));
                }
                continue;
            };
            if cfg.webhook_previous_secrets.len() > 8 {
                return Err(invalid(format!("namespaces.{ns}.webhook_previous_secrets"), "at most 8"));
            }
            let named = std::iter::once(("webhook_secret", current))
                .chain(cfg.webhook_previous_secrets.iter().map(|s| ("webhook_previous_secrets", s)));
            let mut decoded = Vec::with_capacity(1 + cfg.webhook_previous_secrets.len());
            for (name, secret) in named {
                let field = format!("namespaces.{ns}.{name}");
                match tocsin_contract::signing::secret_bytes(secret) {
                    Err(e) => return Err(invalid(field, &e.to_string())),
                    Ok(key) if key.len() < 24 => return Err(invalid(field, "must be at least 24 bytes")),
                    Ok(key) => decoded.push(key),
                }
            }
            keys.insert(ns.clone(), decoded);
        }
        Ok(keys)
    }
}

impl DeliveryConfig {
    /// The SSRF guard's allowlist, parsed.
    pub fn egress_policy(&self) -> Result<crate::egress::EgressPolicy, ConfigError> {
        crate::egress::EgressPolicy::parse(&self.webhook_allow)
            .map_err(|message| ConfigError::Invalid { field: "delivery.webhook_allow".into(), message })
    }
}

/// A list setting that an environment variable may also give as one
/// comma-separated string.
fn list_or_comma_separated<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        List(Vec<String>),
        Text(String),
    }
    Ok(match Form::deserialize(d)? {
        Form::List(v) => v,
        Form::Text(s) => s.split(',').map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect(),
    })
}

/// Who may call the client API (see docs/security.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `tokens`: every call on the client ports needs a bearer token whose
    /// scopes cover it. `open`: no token is asked for (a trusted network
    /// only; `tocsin dev` runs so, `tocsin serve` only when told with
    /// `--insecure-no-auth` or this setting).
    pub mode: AuthMode,
    /// A file holding the bootstrap token: a secret of at least 32
    /// characters that grants every scope on every namespace, for creating
    /// the first tokens (`tocsin admin token create`). Read at start; keep
    /// it as secret as a root password, and drop it once tokens exist.
    pub bootstrap_token_file: Option<PathBuf>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig { mode: AuthMode::Tokens, bootstrap_token_file: None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    Tokens,
    Open,
}

/// Mutual TLS on the peer port (see docs/security.md and `peer_tls.rs`):
/// every node presents a certificate from the cluster's CA naming it
/// (`node-<id>.peer.tocsin`) and checks its peer's. Off when nothing is
/// set; `tocsin certs init|issue` makes the files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeerTlsConfig {
    /// A directory as `tocsin certs` writes it: `ca.pem`, and
    /// `node-<id>.pem` and `node-<id>.key` for this node's id. The three
    /// settings below override a file each.
    pub dir: Option<PathBuf>,
    /// The cluster CA's certificate (PEM): peers must present a
    /// certificate it signed.
    pub ca_file: Option<PathBuf>,
    /// This node's certificate chain (PEM), naming `node-<id>.peer.tocsin`.
    pub cert_file: Option<PathBuf>,
    /// This node's private key (PEM).
    pub key_file: Option<PathBuf>,
}

/// The three files of [`PeerTlsConfig`], when peer TLS is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// TLS on the client ports, gRPC and HTTP alike (see docs/security.md and
/// `client_tls.rs`): off when nothing is set. With `client_ca_file`, every
/// client must also present a certificate that CA signed (tokens still
/// apply on top when `auth.mode` is `tokens`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientTlsConfig {
    /// The certificate chain the node presents to clients (PEM); it must
    /// name the address clients dial (`tocsin certs issue --host`).
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    pub key_file: Option<PathBuf>,
    /// The CA whose certificates clients must present (PEM; `tocsin certs
    /// client` issues them). Unset: any client may connect, as over
    /// plaintext, only encrypted and with the node authenticated.
    pub client_ca_file: Option<PathBuf>,
}

/// The files of [`ClientTlsConfig`], when client TLS is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// What the node accepts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Creates per second per namespace (token bucket, burst = 1 s); 0 means
    /// unlimited.
    pub create_rate_per_namespace: u64,
    /// Creates are refused with RESOURCE_EXHAUSTED while the data
    /// directory's filesystem has less free space than this.
    pub min_free_disk_bytes: u64,
    /// Largest gRPC message and HTTP body accepted, checked before reading
    /// the whole body.
    pub max_request_bytes: usize,
    /// Commands waiting for a proposal, per shard.
    pub proposal_queue: usize,
    /// Creates are refused with RESOURCE_EXHAUSTED while the oldest command
    /// in a shard's queue has waited longer than this (0: never), so that an
    /// overloaded shard keeps the timers it accepted on time instead of
    /// queueing everything late. Fires and cancels are never shed.
    pub shed_creates_after_ms: u64,
    /// Creates are refused with RESOURCE_EXHAUSTED while the node's
    /// scheduling lag (a moving average, `tocsin_scheduling_lag_seconds`)
    /// is over this (0: never): a node that cannot keep its own timers and
    /// heartbeats on time takes no more work.
    pub shed_creates_lag_ms: u64,
    /// Creates are refused with RESOURCE_EXHAUSTED while a shard's fire loop
    /// has been leaving due timers unfired for longer than this (0: never)
    /// because its `Fire` batches in flight are at their bound: a shard that
    /// takes creates faster than it can fire them fires all of them late.
    pub shed_creates_fire_behind_ms: u64,
    /// Creates of a namespace are refused with RESOURCE_EXHAUSTED in a
    /// second in which 1% of its push deliveries from this node waited
    /// longer than this to be sent after their attempt started, and let in
    /// at a limit below what its deliveries made lately for a few seconds
    /// after
    /// (0: never; `admission::DeliveryLag`): the node fires on time but
    /// cannot deliver as fast, or the namespace's receiver is slow and its
    /// endpoint's connection slots are full. Other namespaces' creates are
    /// not refused for it.
    pub shed_creates_delivery_behind_ms: u64,
    /// Deadline for a request waiting on Raft.
    pub request_timeout_ms: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            create_rate_per_namespace: 0,
            min_free_disk_bytes: 256 << 20,
            max_request_bytes: 8 << 20,
            proposal_queue: 20_000,
            shed_creates_after_ms: 250,
            shed_creates_lag_ms: 30,
            shed_creates_fire_behind_ms: 200,
            shed_creates_delivery_behind_ms: 300,
            request_timeout_ms: 10_000,
        }
    }
}

/// Settings of one namespace.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Standard Webhooks signing secret (`whsec_` + base64, or raw text of at
    /// least 24 bytes). Deliveries are signed when set.
    pub webhook_secret: Option<String>,
    /// Secrets being rotated out: deliveries carry a signature with each of
    /// them too (Standard Webhooks lists several), so receivers that still
    /// hold an old secret keep verifying while they move to the new one.
    /// `tocsin serve` re-reads secrets on SIGHUP, without a restart.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub webhook_previous_secrets: Vec<String>,
}

/// Written by hand so a logged or printed config never shows a secret.
impl std::fmt::Debug for NamespaceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceConfig")
            .field("webhook_secret", &self.webhook_secret.as_ref().map(|_| "<redacted>"))
            .field("webhook_previous_secrets", &format!("<{} redacted>", self.webhook_previous_secrets.len()))
            .finish()
    }
}

/// `TOCSIN_*` variables the CLI reads itself (after the prefix).
const NOT_SETTINGS: [&str; 7] = ["ADDR", "TOKEN", "NEW_SECRET", "TLS_CA", "TLS_CERT", "TLS_KEY", "TLS_DOMAIN"];

/// Whether `path` (lower case, from `TOCSIN_A__B`) names a setting: a leaf
/// of the config's schema, or a field of one namespace's settings
/// (`namespaces.<name>.<field>`).
fn is_setting(path: &[String]) -> bool {
    static LEAVES: std::sync::LazyLock<std::collections::BTreeSet<Vec<String>>> = std::sync::LazyLock::new(|| {
        // The schema's leaves, from the defaults with every optional setting
        // filled in (an absent `Option` serializes to nothing).
        let config = NodeConfig {
            peer_listen: Some(String::new()),
            auth: AuthConfig { bootstrap_token_file: Some(PathBuf::new()), ..AuthConfig::default() },
            peer_tls: PeerTlsConfig {
                dir: Some(PathBuf::new()),
                ca_file: Some(PathBuf::new()),
                cert_file: Some(PathBuf::new()),
                key_file: Some(PathBuf::new()),
            },
            client_tls: ClientTlsConfig {
                cert_file: Some(PathBuf::new()),
                key_file: Some(PathBuf::new()),
                client_ca_file: Some(PathBuf::new()),
            },
            grpc_advertise: Some(String::new()),
            http_advertise: Some(String::new()),
            peer_advertise: Some(String::new()),
            ..NodeConfig::default()
        };
        let mut leaves = std::collections::BTreeSet::new();
        collect_leaves(&toml::Table::try_from(&config).expect("the config serializes"), &mut Vec::new(), &mut leaves);
        leaves
    });
    static NAMESPACE_FIELDS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        let ns = NamespaceConfig { webhook_secret: Some(String::new()), webhook_previous_secrets: Vec::new() };
        toml::Table::try_from(&ns).expect("namespace settings serialize").keys().cloned().collect()
    });
    match path {
        [first, _name, field] if first == "namespaces" => NAMESPACE_FIELDS.contains(field),
        [first, second, _name] if first == "delivery" && second == "amqp_brokers" => true,
        _ => LEAVES.contains(path),
    }
}

fn collect_leaves(table: &toml::Table, prefix: &mut Vec<String>, out: &mut std::collections::BTreeSet<Vec<String>>) {
    for (key, value) in table {
        prefix.push(key.clone());
        match value {
            toml::Value::Table(t) if !t.is_empty() => collect_leaves(t, prefix, out),
            _ => {
                out.insert(prefix.clone());
            }
        }
        prefix.pop();
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("parsing config: {0}")]
    Parse(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

impl NodeConfig {
    /// Reads `path` (if given), applies `TOCSIN_*` environment overrides from
    /// `env`, and validates the result.
    pub fn load(
        path: Option<&std::path::Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<NodeConfig, ConfigError> {
        let config = NodeConfig::load_reporting(path, env)?.0;
        config.validate()?;
        Ok(config)
    }

    /// [`NodeConfig::load`] without the validation, also returning the
    /// names of the `TOCSIN_*` variables it ignored because they name no
    /// setting, for the caller to warn about once logging is up. The caller
    /// applies its own overrides (the command line's flags) and then calls
    /// [`NodeConfig::validate`]: a setting completed by a flag (a file from
    /// the environment, its directory from `--peer-tls-dir`) is judged whole.
    pub fn load_reporting(
        path: Option<&std::path::Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(NodeConfig, Vec<String>), ConfigError> {
        let mut ignored = Vec::new();
        let mut doc: toml::Table = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
                text.parse().map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?
            }
            None => toml::Table::new(),
        };
        for (name, value) in env {
            let Some(rest) = name.strip_prefix("TOCSIN_") else { continue };
            // Test hooks (`TOCSIN_TEST_CLOCK_OFFSET_FILE`) and the CLI's own
            // variables: not settings, and expected.
            if rest.starts_with("TEST_") || NOT_SETTINGS.contains(&rest) {
                continue;
            }
            let path: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
            if !is_setting(&path) {
                ignored.push(name);
                continue;
            }
            set_path(&mut doc, &path, parse_scalar(&value));
        }
        let config: NodeConfig =
            toml::Value::Table(doc).try_into().map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        ignored.sort();
        Ok((config, ignored))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid =
            |field: &str, message: &str| Err(ConfigError::Invalid { field: field.into(), message: message.into() });
        if self.node_id == 0 {
            return invalid("node_id", "must be at least 1");
        }
        if self.num_shards == 0 || self.num_shards > 4096 {
            return invalid("num_shards", "must be between 1 and 4096");
        }
        let peer = self.peer_listen();
        if peer.is_empty() {
            return invalid("peer_listen", "give host:port (it defaults to grpc_listen's port + 2, and that has none)");
        }
        if !peer.ends_with(":0") && (peer == self.grpc_listen || peer == self.http_listen) {
            return invalid(
                "peer_listen",
                "must differ from grpc_listen and http_listen: peers and clients get a port each",
            );
        }
        if self.raft.heartbeat_ms * 2 >= self.raft.election_timeout_min_ms {
            return invalid("raft.heartbeat_ms", "must be under half of raft.election_timeout_min_ms");
        }
        let quiet = self.raft.quiet_heartbeat_ms;
        if quiet != 0 && !(self.raft.heartbeat_ms..=450).contains(&quiet) {
            return invalid("raft.quiet_heartbeat_ms", "must be 0 (off) or between raft.heartbeat_ms and 450");
        }
        if !(-20..=0).contains(&self.raft.thread_nice) {
            return invalid("raft.thread_nice", "must be between -20 and 0");
        }
        if self.raft.election_timeout_min_ms >= self.raft.election_timeout_max_ms {
            return invalid("raft.election_timeout_min_ms", "must be below raft.election_timeout_max_ms");
        }
        if self.limits.max_payload_bytes > tocsin_core::limits::HARD_MAX_PAYLOAD_BYTES {
            return invalid("limits.max_payload_bytes", "must be at most 1 MiB");
        }
        if self.limits.max_batch == 0 || self.limits.max_batch > tocsin_core::limits::HARD_MAX_BATCH {
            return invalid("limits.max_batch", "must be between 1 and 1000");
        }
        if self.limits.max_page_size == 0 || self.limits.max_page_size > 10_000 {
            return invalid("limits.max_page_size", "must be between 1 and 10000");
        }
        if self.limits.max_settle_batch == 0 || self.limits.max_settle_batch > 100_000 {
            return invalid("limits.max_settle_batch", "must be between 1 and 100000");
        }
        if self.limits.min_backoff_ms == 0 || self.limits.min_backoff_ms > self.limits.default_initial_backoff_ms {
            return invalid("limits.min_backoff_ms", "must be between 1 and limits.default_initial_backoff_ms");
        }
        if self.limits.max_reason_chars > tocsin_core::limits::MAX_ERROR_BYTES {
            return invalid("limits.max_reason_chars", "must be at most 256");
        }
        if self.admission.max_request_bytes < self.limits.max_payload_bytes + 4096 {
            return invalid("admission.max_request_bytes", "must exceed limits.max_payload_bytes");
        }
        if self.firing.fire_batch == 0 || self.firing.load_page == 0 {
            return invalid("firing.fire_batch", "batches must not be empty");
        }
        if self.firing.arm_ahead_ms > tocsin_core::limits::MAX_ARM_AHEAD_MS {
            return invalid("firing.arm_ahead_ms", "must be at most 2000 (the apply rules arm no further ahead)");
        }
        if self.firing.arm_ahead_ms > 0 && !(1..=self.firing.arm_ahead_ms).contains(&self.firing.arm_step_ms) {
            return invalid("firing.arm_step_ms", "must be between 1 and firing.arm_ahead_ms");
        }
        if !(20..=60_000).contains(&self.max_clock_offset_ms) {
            return invalid("max_clock_offset_ms", "must be between 20 and 60000");
        }
        if self.replication_factor == 0 {
            return invalid("replication_factor", "must be at least 1");
        }
        if self.delivery.webhook_allow.len() > 1_000 {
            return invalid("delivery.webhook_allow", "at most 1000 entries");
        }
        self.delivery.egress_policy()?;
        if self.delivery.amqp_brokers.len() > 64 {
            return invalid("delivery.amqp_brokers", "at most 64 brokers");
        }
        for (name, url) in &self.delivery.amqp_brokers {
            let field = format!("delivery.amqp_brokers.{name}");
            let bad = |message: &str| Err(ConfigError::Invalid { field: field.clone(), message: message.into() });
            if tocsin_core::validate::check_callback(&tocsin_core::Callback::Amqp {
                broker: name.clone(),
                exchange: String::new(),
                routing_key: String::new(),
            })
            .is_err()
            {
                return bad("a broker's name must match [a-z0-9._-], 1 to 64 bytes");
            }
            if !url.0.starts_with("amqp://") {
                return bad("must be an amqp:// URL (amqp://user:password@host:5672/vhost)");
            }
        }
        for ns in self.namespaces.keys() {
            tocsin_core::validate::check_namespace(ns)
                .map_err(|e| ConfigError::Invalid { field: format!("namespaces.{ns}"), message: e.message })?;
        }
        self.signing_keys()?;
        self.bootstrap_token()?;
        self.peer_tls_files()?;
        self.client_tls_files()?;
        self.initial_members().map(|_| ())
    }

    /// Where this node's peer TLS files are, or None when peer TLS is off.
    /// All three must be known (from `peer_tls.dir` or each setting), or
    /// none: a half-configured TLS is an error, never plaintext.
    pub fn peer_tls_files(&self) -> Result<Option<PeerTlsFiles>, ConfigError> {
        let t = &self.peer_tls;
        let id = self.node_id;
        let from_dir = |name: String| t.dir.as_ref().map(|d| d.join(name));
        let ca = t.ca_file.clone().or_else(|| from_dir("ca.pem".into()));
        let cert = t.cert_file.clone().or_else(|| from_dir(format!("node-{id}.pem")));
        let key = t.key_file.clone().or_else(|| from_dir(format!("node-{id}.key")));
        match (ca, cert, key) {
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(PeerTlsFiles { ca, cert, key })),
            _ => Err(ConfigError::Invalid {
                field: "peer_tls".into(),
                message: "set peer_tls.dir, or all of ca_file, cert_file and key_file".into(),
            }),
        }
    }

    /// The files of client TLS, or None when it is off. The certificate and
    /// key come together or not at all, and a client CA needs both: a
    /// half-configured TLS is an error, never plaintext.
    pub fn client_tls_files(&self) -> Result<Option<ClientTlsFiles>, ConfigError> {
        let t = &self.client_tls;
        let invalid = |message: &str| ConfigError::Invalid { field: "client_tls".into(), message: message.into() };
        match (&t.cert_file, &t.key_file, &t.client_ca_file) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), client_ca) => {
                Ok(Some(ClientTlsFiles { cert: cert.clone(), key: key.clone(), client_ca: client_ca.clone() }))
            }
            (None, None, Some(_)) => Err(invalid("client_ca_file needs cert_file and key_file")),
            _ => Err(invalid("set both cert_file and key_file, or neither")),
        }
    }

    /// The client gRPC address: `grpc_advertise`, else this node's own
    /// entry in `initial_cluster`, else the listen address.
    pub fn grpc_advertise(&self) -> String {
        self.grpc_advertise
            .clone()
            .or_else(|| self.own_initial_entry().map(|m| m.grpc))
            .unwrap_or_else(|| self.grpc_listen.clone())
    }

    /// The HTTP address, found like [`Self::grpc_advertise`].
    pub fn http_advertise(&self) -> String {
        self.http_advertise
            .clone()
            .or_else(|| self.own_initial_entry().map(|m| m.http).filter(|h| !h.is_empty()))
            .unwrap_or_else(|| self.http_listen.clone())
    }

    /// The peer listen address (see `peer_listen`).
    pub fn peer_listen(&self) -> String {
        self.peer_listen.clone().unwrap_or_else(|| peer_next_to(&self.grpc_listen))
    }

    /// The peer address other nodes dial, found like [`Self::grpc_advertise`].
    pub fn peer_advertise(&self) -> String {
        self.peer_advertise
            .clone()
            .or_else(|| self.own_initial_entry().map(|m| m.peer))
            .unwrap_or_else(|| self.peer_listen())
    }

    /// This node's entry in `initial_cluster`, if it is listed.
    fn own_initial_entry(&self) -> Option<Member> {
        if self.initial_cluster.is_empty() {
            return None;
        }
        let members = self.initial_members().ok()?;
        members.into_iter().find(|m| m.id == self.node_id)
    }

    /// The initial voters.
    pub fn initial_members(&self) -> Result<Vec<Member>, ConfigError> {
        if self.initial_cluster.is_empty() {
            return Ok(vec![Member {
                id: self.node_id,
                grpc: self.grpc_advertise(),
                http: self.http_advertise(),
                peer: self.peer_advertise(),
            }]);
        }
        let mut out: Vec<Member> = Vec::new();
        for item in &self.initial_cluster {
            let bad = || ConfigError::Invalid {
                field: "initial_cluster".into(),
                message: format!(
                    "{item:?} is not id=grpc_addr, id=grpc_addr/http_addr or id=grpc_addr/http_addr/peer_addr"
                ),
            };
            let (id, addrs) = item.split_once('=').ok_or_else(bad)?;
            let id: u64 = id.trim().parse().map_err(|_| bad())?;
            let mut parts = addrs.split('/').map(|a| a.trim().to_string());
            let grpc = parts.next().unwrap_or_default();
            let http = parts.next().unwrap_or_default();
            let peer = parts.next().unwrap_or_else(|| peer_next_to(&grpc));
            if grpc.is_empty() || peer.is_empty() || id == 0 || parts.next().is_some() {
                return Err(bad());
            }
            out.push(Member { id, grpc, http, peer });
        }
        out.sort_by_key(|m| m.id);
        out.dedup_by_key(|m| m.id);
        // A joining node may name the cluster it will join without being in
        // it (a StatefulSet gives every pod the same flags).
        if !self.join && !out.iter().any(|m| m.id == self.node_id) {
            return Err(ConfigError::Invalid {
                field: "initial_cluster".into(),
                message: format!("does not list this node's id {}", self.node_id),
            });
        }
        Ok(out)
    }
}

/// One initial voter's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub grpc: String,
    pub http: String,
    pub peer: String,
}

/// The default peer address next to a gRPC address: the same host, port +
/// 2 (`:0`, an ephemeral port, stays `:0`). Empty if `grpc` has no port.
pub fn peer_next_to(grpc: &str) -> String {
    let Some((host, port)) = grpc.rsplit_once(':') else { return String::new() };
    match port.parse::<u16>() {
        Ok(0) => format!("{host}:0"),
        Ok(p) => p.checked_add(2).map(|p| format!("{host}:{p}")).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

fn parse_scalar(value: &str) -> toml::Value {
    // `x = <value>` parses numbers, booleans, arrays and quoted strings; anything
    // else is taken as a bare string.
    match format!("x = {value}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("x").unwrap_or_else(|| toml::Value::String(value.to_string())),
        Err(_) => toml::Value::String(value.to_string()),
    }
}

fn set_path(doc: &mut toml::Table, path: &[String], value: toml::Value) {
    match path {
        [] => {}
        [last] => {
            doc.insert(last.clone(), value);
        }
        [head, rest @ ..] => {
            let entry = doc.entry(head.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(t) = entry {
                set_path(t, rest, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_nested_settings() {
        let env = [
            ("TOCSIN_NODE_ID".to_string(), "3".to_string()),
            ("TOCSIN_LIMITS__MAX_PAYLOAD_BYTES".to_string(), "1000".to_string()),
            ("TOCSIN_GRPC_LISTEN".to_string(), "0.0.0.0:9000".to_string()),
            ("TOCSIN_INITIAL_CLUSTER".to_string(), "[\"1=a:1\", \"3=c:3/c:4\"]".to_string()),
            ("PATH".to_string(), "/bin".to_string()),
        ];
        let c = NodeConfig::load(None, env).unwrap();
        assert_eq!(c.node_id, 3);
        assert_eq!(c.limits.max_payload_bytes, 1000);
        assert_eq!(c.grpc_listen, "0.0.0.0:9000");
        let members = c.initial_members().unwrap();
        assert_eq!((members[1].id, members[1].grpc.as_str(), members[1].http.as_str()), (3, "c:3", "c:4"));
        // With no advertise address, the node's own entry is what it advertises.
        assert_eq!((c.grpc_advertise(), c.http_advertise()), ("c:3".to_string(), "c:4".to_string()));
        // No peer address given: the gRPC port + 2.
        assert_eq!((members[0].peer.as_str(), c.peer_advertise()), ("a:3", "c:5".to_string()));
    }

    #[test]
    fn peer_addresses_are_given_or_next_to_the_grpc_port() {
        assert_eq!(peer_next_to("10.0.0.1:7070"), "10.0.0.1:7072");
        assert_eq!(peer_next_to("[::1]:9000"), "[::1]:9002");
        assert_eq!(peer_next_to("127.0.0.1:0"), "127.0.0.1:0");
        assert_eq!(peer_next_to("65535"), "");
        assert_eq!(peer_next_to("h:65535"), "");
        let config = |cluster: &[&str]| NodeConfig {
            node_id: 2,
            initial_cluster: cluster.iter().map(|s| s.to_string()).collect(),
            ..NodeConfig::default()
        };
        let c = config(&["1=a:1/a:2/a:9", "2=b:1/b:2/b:9"]);
        let members = c.initial_members().unwrap();
        assert_eq!(members[0], Member { id: 1, grpc: "a:1".into(), http: "a:2".into(), peer: "a:9".into() });
        assert_eq!(c.peer_advertise(), "b:9");
        assert!(config(&["1=a:1/a:2/a:9/x:1", "2=b:1"]).initial_members().is_err());
        assert!(config(&["1=a/a:2", "2=b:1"]).initial_members().is_err(), "no port, no peer default");
        let same = NodeConfig { peer_listen: Some("127.0.0.1:7070".into()), ..NodeConfig::default() };
        assert!(same.validate().is_err());
        assert!(NodeConfig::default().validate().is_ok());
        assert_eq!(NodeConfig::default().peer_listen(), "127.0.0.1:7072");
    }

    #[test]
    fn a_joining_node_need_not_be_in_the_initial_cluster() {
        let env = |join: &str| {
            [
                ("TOCSIN_NODE_ID".to_string(), "4".to_string()),
                ("TOCSIN_INITIAL_CLUSTER".to_string(), "[\"1=a:1\", \"2=b:1\", \"3=c:1\"]".to_string()),
                ("TOCSIN_JOIN".to_string(), join.to_string()),
            ]
        };
        let err = NodeConfig::load(None, env("false")).unwrap_err();
        assert!(err.to_string().contains("does not list this node's id 4"), "{err}");
        let c = NodeConfig::load(None, env("true")).unwrap();
        assert!(c.join);
        assert_eq!(c.initial_members().unwrap().len(), 3);
    }

    #[test]
    fn bad_settings_name_the_field() {
        let err = NodeConfig::load(None, [("TOCSIN_NUM_SHARDS".to_string(), "0".to_string())]).unwrap_err();
        assert!(err.to_string().starts_with("num_shards:"), "{err}");
        // A nice value that would lower the Raft threads below the rest.
        let err = NodeConfig::load(None, [("TOCSIN_RAFT__THREAD_NICE".to_string(), "5".to_string())]).unwrap_err();
        assert!(err.to_string().starts_with("raft.thread_nice:"), "{err}");
        let c = NodeConfig::load(None, [("TOCSIN_RAFT__THREAD_NICE".to_string(), "0".to_string())]).unwrap();
        assert_eq!(c.raft.thread_nice, 0);
    }

    #[test]
    fn variables_that_name_no_setting_are_reported_not_fatal() {
        let var = |k: &str, v: &str| (k.to_string(), v.to_string());
        // What Kubernetes injects for a Service named `tocsin`, the CLI's own
        // variable, a typo, and two real settings.
        let env = [
            var("TOCSIN_SERVICE_HOST", "10.96.0.10"),
            var("TOCSIN_SERVICE_PORT", "7070"),
            var("TOCSIN_SERVICE_PORT_GRPC", "7070"),
            var("TOCSIN_PORT", "tcp://10.96.0.10:7070"),
            var("TOCSIN_PORT_7070_TCP", "tcp://10.96.0.10:7070"),
            var("TOCSIN_PORT_7070_TCP_ADDR", "10.96.0.10"),
            var("TOCSIN_ADDR", "127.0.0.1:7070"),
            var("TOCSIN_TLS_CA", "/etc/tocsin/ca.pem"),
            var("TOCSIN_TLS_DOMAIN", "tocsin.example"),
            var("TOCSIN_BOGUS", "1"),
            var("TOCSIN_NODE_ID", "2"),
            var("TOCSIN_NAMESPACES__ORDERS__WEBHOOK_SECRET", "a-secret-of-at-least-24-bytes"),
        ];
        let (c, ignored) = NodeConfig::load_reporting(None, env).unwrap();
        assert_eq!(c.node_id, 2);
        assert_eq!(c.namespaces["orders"].webhook_secret.as_deref(), Some("a-secret-of-at-least-24-bytes"));
        assert_eq!(
            ignored,
            [
                "TOCSIN_BOGUS",
                "TOCSIN_PORT",
                "TOCSIN_PORT_7070_TCP",
                "TOCSIN_PORT_7070_TCP_ADDR",
                "TOCSIN_SERVICE_HOST",
                "TOCSIN_SERVICE_PORT",
                "TOCSIN_SERVICE_PORT_GRPC",
            ]
        );
        // A bad value of a real setting is still an error.
        let err = NodeConfig::load(None, [var("TOCSIN_NUM_SHARDS", "many")]).unwrap_err();
        assert!(err.to_string().contains("num_shards"), "{err}");
    }

    #[test]
    fn client_tls_is_all_or_none_and_read_from_the_environment() {
        let var = |k: &str, v: &str| (k.to_string(), v.to_string());
        let c = NodeConfig::load(
            None,
            [
                var("TOCSIN_CLIENT_TLS__CERT_FILE", "/tls/node.pem"),
                var("TOCSIN_CLIENT_TLS__KEY_FILE", "/tls/node.key"),
                var("TOCSIN_CLIENT_TLS__CLIENT_CA_FILE", "/tls/clients.pem"),
            ],
        )
        .unwrap();
        let files = c.client_tls_files().unwrap().expect("client TLS on");
        assert_eq!(
            files,
            ClientTlsFiles {
                cert: "/tls/node.pem".into(),
                key: "/tls/node.key".into(),
                client_ca: Some("/tls/clients.pem".into())
            }
        );
        assert_eq!(NodeConfig::default().client_tls_files().unwrap(), None);
        for half in [
            vec![var("TOCSIN_CLIENT_TLS__CERT_FILE", "/tls/node.pem")],
            vec![var("TOCSIN_CLIENT_TLS__KEY_FILE", "/tls/node.key")],
            vec![var("TOCSIN_CLIENT_TLS__CLIENT_CA_FILE", "/tls/clients.pem")],
            vec![
                var("TOCSIN_CLIENT_TLS__KEY_FILE", "/tls/node.key"),
                var("TOCSIN_CLIENT_TLS__CLIENT_CA_FILE", "/tls/clients.pem"),
            ],
        ] {
            let err = NodeConfig::load(None, half.clone()).unwrap_err().to_string();
            assert!(err.starts_with("client_tls:"), "{half:?}: {err}");
        }
    }

    #[test]
    fn secrets_are_checked_and_never_printed() {
        let var = |k: &str, v: &str| (k.to_string(), v.to_string());
        let err = NodeConfig::load(None, [var("TOCSIN_NAMESPACES__ORDERS__WEBHOOK_SECRET", "whsec_%%%not-base64%%%")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("namespaces.orders.webhook_secret") && err.contains("base64"), "{err}");
        assert!(!err.contains("not-base64"), "the error repeats the secret: {err}");
        let c =
            NodeConfig::load(None, [var("TOCSIN_NAMESPACES__ORDERS__WEBHOOK_SECRET", "a-secret-of-at-least-24-bytes")])
                .unwrap();
        let printed = format!("{c:?}");
        assert!(!printed.contains("a-secret-of-at-least-24-bytes") && printed.contains("<redacted>"), "{printed}");
    }

    #[test]
    fn the_webhook_allowlist_comes_as_a_list_or_comma_separated() {
        let var = |k: &str, v: &str| (k.to_string(), v.to_string());
        let c =
            NodeConfig::load(None, [var("TOCSIN_DELIVERY__WEBHOOK_ALLOW", "10.0.0.0/8, receiver.internal")]).unwrap();
        assert_eq!(c.delivery.webhook_allow, ["10.0.0.0/8", "receiver.internal"]);
        let c = NodeConfig::load(None, [var("TOCSIN_DELIVERY__WEBHOOK_ALLOW", r#"["::1/128"]"#)]).unwrap();
        assert_eq!(c.delivery.webhook_allow, ["::1/128"]);
        let c = NodeConfig::load(None, [var("TOCSIN_DELIVERY__WEBHOOK_ALLOW", "")]).unwrap();
        assert!(c.delivery.webhook_allow.is_empty());
        let err = NodeConfig::load(None, [var("TOCSIN_DELIVERY__WEBHOOK_ALLOW", "10.0.0.0/40")]).unwrap_err();
        assert!(err.to_string().contains("delivery.webhook_allow"), "{err}");
    }

    #[test]
    fn every_setting_of_the_example_file_is_a_setting() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/tocsin.example.toml");
        let doc: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
        let mut leaves = std::collections::BTreeSet::new();
        collect_leaves(&doc, &mut Vec::new(), &mut leaves);
        for leaf in leaves {
            assert!(is_setting(&leaf), "{leaf:?} cannot be set from the environment");
        }
    }

    #[test]
    fn the_example_file_parses() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/tocsin.example.toml");
        let c = NodeConfig::load(Some(&path), []).unwrap();
        assert_eq!(
            c,
            NodeConfig { namespaces: c.namespaces.clone(), ..NodeConfig::default() },
            "the example documents the defaults"
        );
    }
}
