//! A running node: the store, one Raft group per hosted shard, the fire
//! loops, delivery, and the gRPC and HTTP servers.
//!
//! Start-up order matters: listeners are bound first (so an `:0` port is
//! known before it is written into Raft membership), then every hosted
//! group (shards and, where hosted, the metadata group) is opened from the
//! store (restart recovery: openraft replays nothing already applied, the
//! state machine is durable), then the initial memberships are written if
//! the cluster is new, and finally the servers start.

use axum::serve::ListenerExt as _;
use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tocsin_core::ShardId;
use tocsin_proto::v1 as pb;
use tocsin_store::LogStore;
use tocsin_store::NodeAddr;
use tocsin_store::Raft;
use tocsin_store::StateMachine;
use tocsin_store::Store;
use tocsin_store::StoreConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admission::Admission;
use crate::api::admin::AdminApi;
use crate::api::error::ApiError;
use crate::api::timers::TimerApi;
use crate::clock::Clock;
use crate::config::NodeConfig;
use crate::delivery::Dispatcher;
use crate::delivery::pull::PullHub;
use crate::delivery::signing;
use crate::delivery::webhook::WebhookSender;
use crate::events::EventSink;
use crate::forward::Forwarder;
use crate::leader;
use crate::meta::MapCache;
use crate::meta::MetaCtx;
use crate::proposer::Proposer;
use crate::raft::Groups;
use crate::raft::NetworkFactory;
use crate::raft::Router;
use crate::raft::TransportService;
use crate::raft::openraft_config;
use crate::runtime::SideRuntime;
use crate::shard::ShardCtx;

/// Replica moves a node runs at once as a shard leader: each streams a
/// snapshot and catches a learner up, and the fire loops share the cores.
const MOVES_AT_ONCE: usize = 1;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("binding {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("opening the store at {path}: {source}")]
    Store { path: String, source: std::io::Error },
    #[error("starting raft group {group}: {message}")]
    Raft { group: u64, message: String },
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("building the webhook client: {0}")]
    Webhook(String),
    #[error("starting a runtime (Raft or fire): {0}")]
    Runtime(std::io::Error),
}

/// What every API handler and background task shares.
pub struct NodeState {
    pub config: Arc<NodeConfig>,
    pub node_id: u64,
    pub self_addr: NodeAddr,
    /// The node's guarded wall clock (`clock.rs`): every time a timer sees.
    pub clock: Arc<Clock>,
    pub store: Arc<Store>,
    /// Hosted shards; replicas come and go as memberships change.
    pub shards: ShardTable,
    pub groups: Groups,
    pub router: Router,
    raft_config: Arc<openraft::Config>,
    /// Where Raft's tasks run (`runtime.rs`); the runtime itself is the
    /// [`Node`]'s.
    raft_runtime: tokio::runtime::Handle,
    /// Where each shard's proposer, leader supervisor, fire loop and
    /// deliveries run (`runtime.rs`).
    fire_runtime: tokio::runtime::Handle,
    /// Serializes hosting and releasing shards, and so the hosted-set
    /// writes.
    hosting: tokio::sync::Mutex<()>,
    pub dispatcher: Arc<Dispatcher>,
    pub admission: Arc<Admission>,
    pub metrics: Option<PrometheusHandle>,
    pub forwarder: Arc<Forwarder>,
    /// The cluster as the other nodes report it, refreshed by the
    /// reconcile loop: where requests for the shards this node does not
    /// host go.
    pub remote_view: std::sync::RwLock<Option<crate::view::ClusterView>>,
    /// This node's replica of the metadata group, if it hosts one.
    meta: std::sync::RwLock<Option<Arc<MetaCtx>>>,
    /// The newest cluster map this node knows.
    pub map: MapCache,
    /// Replica moves this node runs at once as a shard leader (see
    /// `reconcile.rs`).
    pub moves: Arc<tokio::sync::Semaphore>,
    shutting_down: AtomicBool,
}

impl NodeState {
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// This node's metadata replica, if it hosts one.
    pub fn meta(&self) -> Option<Arc<MetaCtx>> {
        self.meta.read().expect("meta lock").clone()
    }

    /// The map this node's metadata replica has applied, if it hosts one;
    /// read on the blocking pool, and learned into the cache.
    pub async fn local_map(&self) -> Option<tocsin_core::cluster::ClusterMap> {
        self.meta()?;
        let store = self.store.clone();
        let read = tokio::task::spawn_blocking(move || store.cluster_map()).await;
        match read.map_err(std::io::Error::other).and_then(|r| r) {
            Ok(map) => {
                self.map.learn(map.clone());
                Some(map)
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the cluster map");
                None
            }
        }
    }

    /// The cached cluster map, first updated from this node's metadata
    /// replica if it hosts one (a point read; not for every request).
    pub async fn fresh_map(&self) -> Arc<tocsin_core::cluster::ClusterMap> {
        self.local_map().await;
        self.map.get()
    }

    /// Refuses a request for `shard` routed by a map older than the
    /// shard's last placement change (`map_epoch` 0: the client carries no
    /// map, nothing to check). A newer epoch than this node's makes it
    /// refresh its own map.
    pub fn check_route(&self, shard: ShardId, map_epoch: u64) -> Result<(), ApiError> {
        if map_epoch == 0 {
            return Ok(());
        }
        self.map.saw_epoch(map_epoch);
        let map = self.map.get();
        let shard_epoch = map.shard_epoch(shard);
        if shard_epoch > map_epoch {
            metrics::counter!("tocsin_stale_map_refusals_total").increment(1);
            return Err(ApiError::StaleMap {
                message: format!(
                    "stale shard map: shard {shard}'s replicas changed at map epoch {shard_epoch}, after the epoch {map_epoch} this request was routed by; refresh the map"
                ),
                map_epoch: map.epoch,
            });
        }
        Ok(())
    }

    /// Every other node named in a hosted group's membership, by id.
    pub fn peers(&self) -> BTreeMap<u64, NodeAddr> {
        let mut peers = BTreeMap::new();
        let rafts = self.shards.all().into_iter().map(|c| c.raft.clone()).chain(self.meta().map(|m| m.raft.clone()));
        for raft in rafts {
            let m = raft.metrics().borrow_watched().clone();
            for (id, addr) in m.membership_config.membership().nodes() {
                if *id != self.node_id {
                    peers.insert(*id, addr.clone());
                }
            }
        }
        peers
    }

    /// The gRPC addresses of every other node.
    pub fn peer_grpc_addrs(&self) -> Vec<String> {
        self.peers().into_values().map(|a| a.grpc_addr).filter(|a| !a.is_empty()).collect()
    }

    /// The hosted shard `shard`, or UNAVAILABLE.
    pub fn shard(&self, shard: ShardId) -> Result<Arc<ShardCtx>, ApiError> {
        self.shards.get(shard).ok_or_else(|| {
            // Point at the leader the other nodes report, so the request is
            // forwarded there.
            let leader = self.remote_view.read().expect("view lock").as_ref().and_then(|view| {
                let s = view.shards.get(shard as usize)?;
                let addr = view.nodes.get(&s.leader)?;
                (s.leader != 0).then(|| pb::LeaderHint {
                    shard,
                    node_id: s.leader,
                    grpc_addr: addr.grpc_addr.clone(),
                    http_addr: addr.http_addr.clone(),
                })
            });
            ApiError::Unavailable {
                message: format!("shard {shard} is not hosted on node {}", self.node_id),
                leader,
                retry_after_ms: 100,
            }
        })
    }

    /// Updates the per-shard gauges from Raft metrics and the shard meta.
    pub fn refresh_gauges(&self) {
        for ctx in self.shards.all() {
            let shard = ctx.shard.to_string();
            let m = ctx.raft.metrics().borrow_watched().clone();
            metrics::gauge!("tocsin_raft_applied_index", "shard" => shard.clone())
                .set(m.last_applied.map_or(0, |l| l.index) as f64);
            metrics::gauge!("tocsin_raft_committed_index", "shard" => shard.clone())
                .set(m.local_committed.map_or(0, |l| l.index) as f64);
            metrics::gauge!("tocsin_raft_term", "shard" => shard.clone()).set(m.current_term as f64);
            metrics::gauge!("tocsin_raft_is_leader", "shard" => shard.clone()).set(if ctx.epoch().is_some() {
                1.0
            } else {
                0.0
            });
            if let Ok(meta) = ctx.store.shard_meta(ctx.group) {
                metrics::gauge!("tocsin_pending_timers", "shard" => shard.clone()).set(meta.scheduled as f64);
                metrics::gauge!("tocsin_firing_timers", "shard" => shard.clone()).set(meta.firing as f64);
                metrics::gauge!("tocsin_epoch", "shard" => shard).set(meta.epoch as f64);
            }
        }
        for (name, value) in self.store.memory_usage() {
            metrics::gauge!(name).set(value as f64);
        }
        for (ns, topic, n) in self.dispatcher.pull.ready_counts() {
            metrics::gauge!("tocsin_pull_ready", "namespace" => ns, "topic" => topic).set(n as f64);
        }
    }
}

impl NodeState {
    /// Opens `shard`'s group from the store and starts its proposer and
    /// fire-loop supervisor. Does not touch the hosted set.
    async fn open_shard(self: &Arc<Self>, shard: ShardId) -> Result<Arc<ShardCtx>, StartError> {
        let group = u64::from(shard);
        let log = LogStore::new(self.store.clone(), group);
        // The fire loop follows the applied log through this sink.
        let events = Arc::new(EventSink::default());
        let sm = StateMachine::open_observed(self.store.clone(), group, Some(events.clone()))
            .await
            .map_err(|e| StartError::Raft { group, message: e.to_string() })?;
        let network = NetworkFactory::new(self.router.clone(), group);
        let raft = self.new_raft(group, self.raft_config.clone(), network, log, sm).await?;
        let proposer = Proposer::start(
            raft.clone(),
            self.node_id,
            self.clock.clone(),
            crate::proposer::ProposerLimits {
                queue: self.config.admission.proposal_queue,
                timeout: Duration::from_millis(self.config.admission.request_timeout_ms),
                shed_creates_after: Duration::from_millis(self.config.admission.shed_creates_after_ms),
            },
            &self.fire_runtime,
        );
        let ctx = Arc::new(ShardCtx::new(
            shard,
            self.node_id,
            raft.clone(),
            proposer,
            events,
            crate::shard::ShardEnv {
                store: self.store.clone(),
                config: self.config.clone(),
                clock: self.clock.clone(),
            },
        ));
        self.groups.insert(group, raft);
        self.shards.insert(ctx.clone());
        let dispatcher = self.dispatcher.clone();
        let pull = dispatcher.pull.clone();
        let mut leadership = ctx.watch_leadership();
        let supervised = ctx.clone();
        // On the fire runtime: the supervisor spawns the fire loop, which
        // spawns the deliveries, each on the runtime it runs on.
        self.fire_runtime.spawn(async move {
            // Forget pull state of shards we stop leading.
            tokio::spawn(async move {
                while leadership.changed().await.is_ok() {
                    if *leadership.borrow() == crate::shard::Leadership::Follower {
                        pull.forget_shard(shard);
                    }
                }
            });
            // Returns when the group shuts down (its metrics close).
            leader::supervise(supervised, dispatcher).await;
        });
        Ok(ctx)
    }

    /// Starts a group's openraft core on the Raft runtime (`runtime.rs`):
    /// openraft spawns its tasks on the runtime it is started from.
    async fn new_raft(
        &self,
        group: u64,
        config: Arc<openraft::Config>,
        network: NetworkFactory,
        log: LogStore,
        sm: StateMachine,
    ) -> Result<Raft, StartError> {
        let raft_error = |message: String| StartError::Raft { group, message };
        let node_id = self.node_id;
        self.raft_runtime
            .spawn(async move { Raft::new(node_id, config, network, log, sm).await })
            .await
            .map_err(|e| raft_error(e.to_string()))?
            .map_err(|e| raft_error(e.to_string()))
    }

    /// Opens the metadata group's replica from the store.
    async fn open_meta(&self) -> Result<Arc<MetaCtx>, StartError> {
        let group = tocsin_store::keys::META_GROUP;
        let log = LogStore::new(self.store.clone(), group);
        let sm = StateMachine::open(self.store.clone(), group)
            .await
            .map_err(|e| StartError::Raft { group, message: e.to_string() })?;
        let network = NetworkFactory::new(self.router.clone(), group);
        let raft = self.new_raft(group, crate::raft::metadata_config(&self.config.raft), network, log, sm).await?;
        let ctx = Arc::new(MetaCtx::new(self.node_id, raft.clone()));
        self.groups.insert(group, raft);
        *self.meta.write().expect("meta lock") = Some(ctx.clone());
        Ok(ctx)
    }

    async fn persist_hosted(&self, bootstrapped: bool) -> Result<(), StartError> {
        let mut groups: Vec<u64> = self.shards.ids().into_iter().map(u64::from).collect();
        if self.meta().is_some() {
            groups.push(tocsin_store::keys::META_GROUP);
        }
        self.store
            .set_hosted_groups(&tocsin_store::hosting::Hosted { groups, bootstrapped })
            .await
            .map_err(|source| StartError::Store { path: self.store.path().display().to_string(), source })
    }

    /// Starts hosting `shard` as an empty replica a leader can add as a
    /// learner; `false` if it was hosted already.
    pub async fn host_shard(self: &Arc<Self>, shard: ShardId) -> Result<bool, StartError> {
        let _guard = self.hosting.lock().await;
        if self.shards.get(shard).is_some() {
            return Ok(false);
        }
        self.open_shard(shard).await?;
        self.persist_hosted(true).await?;
        tracing::info!(shard, "hosting a new replica");
        Ok(true)
    }

    /// Starts hosting an empty replica of the metadata group; `false` if it
    /// was hosted already.
    pub async fn host_meta(self: &Arc<Self>) -> Result<bool, StartError> {
        let _guard = self.hosting.lock().await;
        if self.meta().is_some() {
            return Ok(false);
        }
        self.open_meta().await?;
        self.persist_hosted(true).await?;
        tracing::info!("hosting a new replica of the metadata group");
        Ok(true)
    }

    /// Stops hosting the metadata group and deletes its data; `false` if it
    /// was not hosted.
    pub async fn release_meta(self: &Arc<Self>) -> Result<bool, StartError> {
        let _guard = self.hosting.lock().await;
        let Some(ctx) = self.meta.write().expect("meta lock").take() else { return Ok(false) };
        self.persist_hosted(true).await?;
        let group = tocsin_store::keys::META_GROUP;
        self.groups.remove(group);
        if let Err(e) = ctx.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown while releasing the metadata replica");
        }
        self.store
            .drop_group(group)
            .await
            .map_err(|source| StartError::Store { path: self.store.path().display().to_string(), source })?;
        tracing::info!("released the metadata replica and deleted its data");
        Ok(true)
    }

    /// Stops hosting `shard`: shuts its group down, forgets its pull state
    /// and deletes its data. `false` if it was not hosted.
    pub async fn release_shard(self: &Arc<Self>, shard: ShardId) -> Result<bool, StartError> {
        let _guard = self.hosting.lock().await;
        let Some(ctx) = self.shards.remove(shard) else { return Ok(false) };
        self.persist_hosted(true).await?;
        self.groups.remove(ctx.group);
        if let Err(e) = ctx.raft.shutdown().await {
            tracing::warn!(shard, error = %e, "raft shutdown while releasing");
        }
        self.dispatcher.pull.forget_shard(shard);
        self.store
            .drop_group(ctx.group)
            .await
            .map_err(|source| StartError::Store { path: self.store.path().display().to_string(), source })?;
        tracing::info!(shard, "released the replica and deleted its data");
        Ok(true)
    }
}

/// The shards a node hosts, by shard id.
#[derive(Default)]
pub struct ShardTable {
    inner: std::sync::RwLock<BTreeMap<ShardId, Arc<ShardCtx>>>,
}

impl ShardTable {
    pub fn get(&self, shard: ShardId) -> Option<Arc<ShardCtx>> {
        self.inner.read().expect("shard table lock").get(&shard).cloned()
    }

    /// Every hosted shard, in shard order.
    pub fn all(&self) -> Vec<Arc<ShardCtx>> {
        self.inner.read().expect("shard table lock").values().cloned().collect()
    }

    pub fn ids(&self) -> Vec<ShardId> {
        self.inner.read().expect("shard table lock").keys().copied().collect()
    }

    fn insert(&self, ctx: Arc<ShardCtx>) {
        self.inner.write().expect("shard table lock").insert(ctx.shard, ctx);
    }

    fn remove(&self, shard: ShardId) -> Option<Arc<ShardCtx>> {
        self.inner.write().expect("shard table lock").remove(&shard)
    }
}

/// A running node.
pub struct Node {
    pub state: Arc<NodeState>,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    supervisors: Vec<JoinHandle<()>>,
    /// Dropped last: every group's core runs on it.
    raft_runtime: SideRuntime,
    /// Dropped before the Raft runtime: proposers, fire loops, deliveries.
    fire_runtime: SideRuntime,
}

impl Node {
    /// Opens the store, starts every hosted shard's group and serves.
    pub async fn start(config: NodeConfig, metrics: Option<PrometheusHandle>) -> Result<Node, StartError> {
        config.validate()?;
        let grpc_listener = TcpListener::bind(&config.grpc_listen)
            .await
            .map_err(|source| StartError::Bind { addr: config.grpc_listen.clone(), source })?;
        let http_listener = TcpListener::bind(&config.http_listen)
            .await
            .map_err(|source| StartError::Bind { addr: config.http_listen.clone(), source })?;
        let grpc_addr = grpc_listener
            .local_addr()
            .map_err(|source| StartError::Bind { addr: config.grpc_listen.clone(), source })?;
        let http_addr = http_listener
            .local_addr()
            .map_err(|source| StartError::Bind { addr: config.http_listen.clone(), source })?;
        // Without an explicit advertise address a node advertises its own
        // `initial_cluster` entry, or else the address it actually bound
        // (which resolves a `:0` listen port).
        let mut config = config;
        if config.grpc_advertise.is_none() {
            let own = config.grpc_advertise();
            config.grpc_advertise = Some(if own == config.grpc_listen { grpc_addr.to_string() } else { own });
        }
        if config.http_advertise.is_none() {
            let own = config.http_advertise();
            config.http_advertise = Some(if own == config.http_listen { http_addr.to_string() } else { own });
        }
        let config = Arc::new(config);
        let node_id = config.node_id;
        let self_addr = NodeAddr { grpc_addr: config.grpc_advertise(), http_addr: config.http_advertise() };

        let store = Store::open(&StoreConfig::new(&config.data_dir))
            .map_err(|source| StartError::Store { path: config.data_dir.display().to_string(), source })?;

        let secrets = config
            .namespaces
            .iter()
            .filter_map(|(ns, c)| c.webhook_secret.as_ref().map(|s| (ns.clone(), signing::secret_bytes(s))))
            .collect();
        let webhook =
            WebhookSender::new(config.delivery.clone(), secrets).map_err(|e| StartError::Webhook(e.to_string()))?;
        let dispatcher =
            Arc::new(Dispatcher { webhook: Arc::new(webhook), pull: PullHub::new(config.delivery.clone()) });
        let admission = Admission::start(config.admission.clone(), config.data_dir.clone());

        // Placement on the first start: each shard's replicas by the token
        // ring over the initial members (all of them when there are no more
        // members than replicas); a joining node starts with none. Later
        // starts reopen exactly the replicas recorded in the store, however
        // membership changed since.
        let members = config.initial_members()?;
        let ring = tocsin_core::routing::Ring::new(members.iter().map(|m| m.0));
        let rf = config.replication_factor.min(members.len());
        let store_err = |source| StartError::Store { path: config.data_dir.display().to_string(), source };
        let recorded = store.hosted_groups().map_err(store_err)?;
        // The metadata group starts on the lowest-id initial members.
        let meta_voters = crate::meta::initial_voters(&members);
        let (hosted, host_meta, bootstrapped): (Vec<ShardId>, bool, bool) = match &recorded {
            Some(h) => (
                h.groups.iter().filter(|g| **g < u64::from(config.num_shards)).map(|g| *g as ShardId).collect(),
                h.groups.contains(&tocsin_store::keys::META_GROUP),
                h.bootstrapped,
            ),
            None if config.join => (Vec::new(), false, true),
            None => (
                (0..config.num_shards).filter(|s| ring.replicas(*s, rf).contains(&node_id)).collect(),
                meta_voters.contains(&node_id),
                false,
            ),
        };
        let clock = Clock::system(config.max_clock_offset_ms);
        let raft_runtime = SideRuntime::start_raft().map_err(StartError::Runtime)?;
        let fire_runtime = SideRuntime::start_fire().map_err(StartError::Runtime)?;
        admission.watch_fire_lag(fire_runtime.lag_us());
        let router = Router::new(
            node_id,
            Duration::from_millis(config.raft.rpc_timeout_ms),
            clock.clone(),
            raft_runtime.handle().clone(),
        );
        for (id, grpc, _) in &members {
            if *id != node_id {
                router.set_addr(*id, grpc);
            }
        }

        let state = Arc::new(NodeState {
            config: config.clone(),
            node_id,
            self_addr: self_addr.clone(),
            clock: clock.clone(),
            store: store.clone(),
            shards: ShardTable::default(),
            groups: Groups::default(),
            router,
            raft_config: openraft_config(&config.raft),
            raft_runtime: raft_runtime.handle().clone(),
            fire_runtime: fire_runtime.handle().clone(),
            hosting: tokio::sync::Mutex::new(()),
            dispatcher: dispatcher.clone(),
            admission,
            metrics,
            forwarder: Arc::new(Forwarder::new(Duration::from_millis(config.admission.request_timeout_ms))),
            remote_view: std::sync::RwLock::new(None),
            meta: std::sync::RwLock::new(None),
            map: MapCache::default(),
            moves: Arc::new(tokio::sync::Semaphore::new(MOVES_AT_ONCE)),
            shutting_down: AtomicBool::new(false),
        });
        if host_meta {
            state.open_meta().await?;
            state.local_map().await;
        }
        for shard in &hosted {
            state.open_shard(*shard).await?;
        }
        state.persist_hosted(bootstrapped).await?;

        let (shutdown, shutdown_rx) = watch::channel(false);
        let servers = vec![
            // Raft's links are accepted and served on the Raft runtime; every
            // other connection (gRPC) is served here, on the work runtime.
            tokio::spawn(serve_grpc(
                state.clone(),
                grpc_listener,
                store.path().join("spool"),
                shutdown_rx.clone(),
                raft_runtime.handle().clone(),
            )),
            tokio::spawn(serve_http(state.clone(), http_listener, shutdown_rx)),
        ];

        // Until the first start has bootstrapped, the lowest-id replica of
        // each shard writes its first membership. Never afterwards: a replica
        // hosted later waits, uninitialized, to be added by its leader.
        if !bootstrapped {
            let voters_of = |ids: &[u64]| -> BTreeMap<u64, NodeAddr> {
                members
                    .iter()
                    .filter(|m| ids.contains(&m.0))
                    .map(|(id, grpc, http)| {
                        let addr = if *id == node_id {
                            self_addr.clone()
                        } else {
                            NodeAddr { grpc_addr: grpc.clone(), http_addr: http.clone() }
                        };
                        (*id, addr)
                    })
                    .collect()
            };
            if let Some(meta) = state.meta()
                && meta_voters.first() == Some(&node_id)
                && !meta.raft.is_initialized().await.unwrap_or(true)
            {
                let voters = voters_of(meta_voters.as_slice());
                if let Err(e) = meta.raft.initialize(voters).await {
                    tracing::warn!(error = %e, "initializing the metadata group failed (already initialized?)");
                }
            }
            for shard in &hosted {
                let replicas = ring.replicas(*shard, rf);
                if replicas.iter().min() != Some(&node_id) {
                    continue;
                }
                let voters = voters_of(replicas.as_slice());
                let Some(ctx) = state.shards.get(*shard) else { continue };
                if !ctx.raft.is_initialized().await.unwrap_or(true)
                    && let Err(e) = ctx.raft.initialize(voters).await
                {
                    tracing::warn!(shard, error = %e, "initializing a group failed (already initialized elsewhere?)");
                }
            }
            state.persist_hosted(true).await?;
        }

        let supervisors = vec![
            tokio::spawn(crate::balance::run(state.clone())),
            tokio::spawn(crate::reconcile::run(state.clone())),
            tokio::spawn(crate::balance::watch_health(state.clone())),
        ];
        tracing::info!(node_id, %grpc_addr, %http_addr, shards = config.num_shards, hosted = hosted.len(), metadata = host_meta, data = %config.data_dir.display(), "node started");
        Ok(Node { state, grpc_addr, http_addr, shutdown, servers, supervisors, raft_runtime, fire_runtime })
    }

    /// Waits until every hosted shard has a leader, or the timeout passes.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let meta_led = self.state.meta().is_none_or(|m| m.raft.metrics().borrow_watched().current_leader.is_some());
            if meta_led
                && self.state.shards.all().iter().all(|c| c.raft.metrics().borrow_watched().current_leader.is_some())
            {
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Hands over its leaderships, stops serving, stops every group, and
    /// closes the store.
    pub async fn shutdown(self) {
        self.state.shutting_down.store(true, Ordering::SeqCst);
        crate::balance::hand_over_all(&self.state, Duration::from_secs(3)).await;
        let _ = self.shutdown.send(true);
        for s in self.supervisors {
            s.abort();
        }
        for (group, raft) in self.state.groups.all() {
            if let Err(e) = raft.shutdown().await {
                tracing::warn!(group, error = %e, "raft shutdown");
            }
        }
        for s in self.servers {
            let _ = tokio::time::timeout(Duration::from_secs(5), s).await;
        }
        // Stop compactions and flushes before the process exits: RocksDB's
        // background threads must not outlive its static state. Everything
        // acknowledged is already in the synced WAL.
        let store = self.state.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.db().cancel_all_background_work(true)).await;
        // Last: every group's core ran on it, and all are shut down now.
        drop(self.fire_runtime);
        drop(self.raft_runtime);
    }
}

/// See `serve_grpc`.
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 1_000;

async fn serve_grpc(
    state: Arc<NodeState>,
    listener: TcpListener,
    spool: std::path::PathBuf,
    mut shutdown: watch::Receiver<bool>,
    raft: tokio::runtime::Handle,
) {
    let max = state.config.admission.max_request_bytes;
    let timers = pb::timer_service_server::TimerServiceServer::new(TimerApi::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(64 << 20);
    let admin = pb::admin_service_server::AdminServiceServer::new(AdminApi::new(state.clone()));
    let replicas =
        pb::replica_control_server::ReplicaControlServer::new(crate::replicas::ReplicaService::new(state.clone()));
    let transport = Arc::new(TransportService::new(
        state.groups.clone(),
        spool,
        state.clock.clone(),
        state.admission.disk_low_flag(),
    ));
    // Raft messages come on their own links (`link.rs`), told apart from
    // HTTP/2 by their first byte; everything else is gRPC.
    let incoming = crate::link::split_incoming(listener, transport.clone(), raft);
    let transport = pb::raft_transport_server::RaftTransportServer::from_arc(transport)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let result = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        // h2's rapid-reset guard closes a whole connection once 20 streams
        // are reset before the server accepted them. After a partition
        // heals (or through a slow link), a peer's timed-out Raft RPCs and
        // forwarded requests arrive as HEADERS and RST_STREAM together, so
        // the guard tripped 61-76 times per node in one chaos
        // `flapping-partitions` run, and every group's RPCs on the peer
        // connection failed with it. Still bounded, so a client cannot make
        // the server track resets without end.
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .add_service(timers)
        .add_service(admin)
        .add_service(replicas)
        .add_service(transport)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "grpc server stopped");
    }
}

async fn serve_http(state: Arc<NodeState>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let app = crate::api::http::router(state);
    let result = axum::serve(
        listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        }),
        app,
    )
    .with_graceful_shutdown(async move {
        let _ = shutdown.wait_for(|s| *s).await;
    })
    .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "http server stopped");
    }
}
