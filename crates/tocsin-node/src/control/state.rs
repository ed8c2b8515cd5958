//! What every API handler and background task of a node shares
//! ([`NodeState`]): the store, the hosted shards and the metadata replica,
//! the Raft router, the cluster map cache; and hosting or releasing a
//! replica at run time. The composition root (`node.rs`) builds it.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeMap;
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

use crate::admission::Admission;
use crate::clock::Clock;
use crate::config::NodeConfig;
use crate::control::map::MapCache;
use crate::control::map::MetaCtx;
use crate::error::NodeError;
use crate::error::StartError;
use crate::forward::Forwarder;
use crate::shard::ShardCtx;
use crate::shard::delivery::Dispatcher;
use crate::shard::events::EventSink;
use crate::shard::leader;
use crate::shard::proposer::Proposer;
use crate::shard::raft::Groups;
use crate::shard::raft::NetworkFactory;
use crate::shard::raft::Router;

/// What every API handler and background task shares.
pub struct NodeState {
    pub config: Arc<NodeConfig>,
    pub node_id: u64,
    pub self_addr: NodeAddr,
    /// Who may call the client ports (`auth.rs`).
    pub authority: crate::auth::Authority,
    /// The node's guarded wall clock (`clock.rs`): every time a timer sees.
    pub clock: Arc<Clock>,
    pub store: Arc<Store>,
    /// Hosted shards; replicas come and go as memberships change.
    pub shards: ShardTable,
    pub groups: Groups,
    pub router: Router,
    pub(crate) raft_config: Arc<openraft::Config>,
    /// Where Raft's tasks run (`runtime.rs`); the runtime itself is the
    /// [`Node`]'s.
    pub(crate) raft_runtime: tokio::runtime::Handle,
    /// Where each shard's proposer, leader supervisor, fire loop and
    /// deliveries run (`runtime.rs`).
    pub(crate) fire_runtime: tokio::runtime::Handle,
    /// Serializes hosting and releasing shards, and so the hosted-set
    /// writes.
    pub(crate) hosting: tokio::sync::Mutex<()>,
    pub dispatcher: Arc<Dispatcher>,
    pub admission: Arc<Admission>,
    pub metrics: Option<PrometheusHandle>,
    pub forwarder: Arc<Forwarder>,
    /// mTLS on the peer port (`peer_tls.rs`); None: plaintext.
    pub peer_tls: Option<Arc<crate::peer_tls::PeerTls>>,
    /// The cluster as the other nodes report it, refreshed by the
    /// reconcile loop: where requests for the shards this node does not
    /// host go.
    pub remote_view: std::sync::RwLock<Option<crate::control::view::ClusterView>>,
    /// This node's replica of the metadata group, if it hosts one.
    pub(crate) meta: std::sync::RwLock<Option<Arc<MetaCtx>>>,
    /// The newest cluster map this node knows.
    pub map: MapCache,
    /// Replica moves this node runs at once as a shard leader (see
    /// `reconcile.rs`).
    pub moves: Arc<tokio::sync::Semaphore>,
    pub(crate) shutting_down: AtomicBool,
    /// Whether this node's groups may campaign (`shard::raft_timer`): not
    /// while its clock is off from its peers (`balance::watch_health`).
    pub(crate) campaigning: crate::shard::raft_timer::Campaigning,
    /// The quiet groups this node leads and what its peers say of theirs
    /// (`shard::quiet`).
    pub quiet: crate::shard::quiet::Quiet,
}

impl NodeState {
    /// Why this node should not be sent requests, or `None` when it is
    /// ready: the store accepts writes, every shard it hosts has a leader
    /// somewhere, the metadata group has one and the cluster map is
    /// bootstrapped, and it is not shutting down. `GET /readyz` and the gRPC
    /// health service (`grpc.health.v1`) both answer from this.
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.store.has_failed() {
            return Some("store failed".into());
        }
        if self.shutting_down() {
            return Some("shutting down".into());
        }
        let leaderless: Vec<u32> = self
            .shards
            .all()
            .into_iter()
            .filter(|ctx| ctx.raft.metrics().borrow_watched().current_leader.is_none())
            .map(|ctx| ctx.shard)
            .collect();
        if !leaderless.is_empty() {
            return Some(format!("shards without a leader: {leaderless:?}"));
        }
        if self.meta().is_some_and(|m| m.raft.metrics().borrow_watched().current_leader.is_none()) {
            return Some("the metadata group has no leader".into());
        }
        if self.meta().is_some() && !self.map.get().is_bootstrapped() {
            return Some("the cluster map is not bootstrapped yet".into());
        }
        None
    }

    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// The metadata group's status as this node knows it: from its own
    /// replica, or as last learned.
    pub fn meta_status(&self) -> pb::MetadataStatus {
        match self.meta() {
            Some(ctx) => ctx.status(),
            None => pb::MetadataStatus { hosted: false, ..self.map.route() },
        }
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
    pub fn check_route(&self, shard: ShardId, map_epoch: u64) -> Result<(), NodeError> {
        if map_epoch == 0 {
            return Ok(());
        }
        self.map.saw_epoch(map_epoch);
        let map = self.map.get();
        let shard_epoch = map.shard_epoch(shard);
        if shard_epoch > map_epoch {
            metrics::counter!("tocsin_stale_map_refusals_total").increment(1);
            return Err(NodeError::StaleMap {
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

    /// The peer addresses of every other node.
    pub fn peer_addrs(&self) -> Vec<String> {
        self.peers().into_values().map(|a| a.peer_addr).filter(|a| !a.is_empty()).collect()
    }

    /// Where node `id`'s peer API listens: from the Raft router (every
    /// node this one shares a group with, and the initial members), else
    /// from the cluster view the other nodes report.
    pub fn peer_addr_of(&self, id: u64) -> Option<String> {
        self.router.addr(id).or_else(|| {
            let view = self.remote_view.read().expect("view lock");
            view.as_ref()?.nodes.get(&id).map(|a| a.peer_addr.clone()).filter(|a| !a.is_empty())
        })
    }

    /// The hosted shard `shard`, or UNAVAILABLE.
    pub fn shard(&self, shard: ShardId) -> Result<Arc<ShardCtx>, NodeError> {
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
            NodeError::Unavailable {
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
        // Unfinished timers per namespace, from the shards this node leads
        // (each shard counted once cluster-wide); a namespace that had some
        // and now has none reads 0, not its last value.
        let mut pending: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
        for ctx in self.shards.all().into_iter().filter(|c| c.epoch().is_some()) {
            if let Ok(counts) = ctx.store.pending_by_namespace(ctx.group, crate::labels::MAX_VALUES * 10) {
                for (ns, n) in counts {
                    *pending.entry(crate::labels::namespace(&ns)).or_default() += n;
                }
            }
        }
        {
            static REPORTED: std::sync::Mutex<std::collections::BTreeSet<String>> =
                std::sync::Mutex::new(std::collections::BTreeSet::new());
            let mut reported = REPORTED.lock().expect("reported namespaces lock");
            for ns in reported.iter().filter(|ns| !pending.contains_key(*ns)) {
                metrics::gauge!("tocsin_namespace_pending_timers", "namespace" => ns.clone()).set(0.0);
            }
            for (ns, n) in &pending {
                metrics::gauge!("tocsin_namespace_pending_timers", "namespace" => ns.clone()).set(*n as f64);
                reported.insert(ns.clone());
            }
        }
        for (name, value) in self.store.memory_usage() {
            metrics::gauge!(name).set(value as f64);
        }
        // Summed per capped label pair: every topic past the cap adds to `other`.
        let mut ready: std::collections::BTreeMap<(String, String), usize> = std::collections::BTreeMap::new();
        for (ns, topic, n) in self.dispatcher.pull.ready_counts() {
            *ready.entry((crate::labels::namespace(&ns), crate::labels::topic(&topic))).or_default() += n;
        }
        for ((ns, topic), n) in ready {
            metrics::gauge!("tocsin_pull_ready", "namespace" => ns, "topic" => topic).set(n as f64);
        }
    }
}

impl NodeState {
    /// Opens `shard`'s group from the store and starts its proposer and
    /// fire-loop supervisor. Does not touch the hosted set.
    pub(crate) async fn open_shard(self: &Arc<Self>, shard: ShardId) -> Result<Arc<ShardCtx>, StartError> {
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
            crate::shard::proposer::ProposerLimits {
                queue: self.config.admission.proposal_queue,
                timeout: Duration::from_millis(self.config.admission.request_timeout_ms),
                shed_creates_after: Duration::from_millis(self.config.admission.shed_creates_after_ms),
                shed_creates_fire_behind: Duration::from_millis(self.config.admission.shed_creates_fire_behind_ms),
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
                cluster_id: self.map.cluster_id_cell(),
                delivery_lag: self.admission.delivery_lag(),
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
        let raft = self
            .raft_runtime
            .spawn(async move { Raft::new(node_id, config, network, log, sm).await })
            .await
            .map_err(|e| raft_error(e.to_string()))?
            .map_err(|e| raft_error(e.to_string()))?;
        // openraft's tick is off: this times the group's heartbeats and
        // elections, at the Raft threads' priority.
        let quieting = crate::shard::raft_timer::Quieting {
            quiet: self.quiet.clone(),
            heartbeat: match self.config.raft.quiet_heartbeat_ms {
                0 => None,
                ms => Some(std::time::Duration::from_millis(ms)),
            },
        };
        self.raft_runtime.spawn(crate::shard::raft_timer::drive(
            raft.clone(),
            node_id,
            group,
            self.campaigning.clone(),
            quieting,
        ));
        Ok(raft)
    }

    /// Opens the metadata group's replica from the store.
    pub(crate) async fn open_meta(&self) -> Result<Arc<MetaCtx>, StartError> {
        let group = tocsin_store::keys::META_GROUP;
        let log = LogStore::new(self.store.clone(), group);
        let sm = StateMachine::open(self.store.clone(), group)
            .await
            .map_err(|e| StartError::Raft { group, message: e.to_string() })?;
        let network = NetworkFactory::new(self.router.clone(), group);
        let raft =
            self.new_raft(group, crate::shard::raft::metadata_config(&self.config.raft), network, log, sm).await?;
        let ctx = Arc::new(MetaCtx::new(self.node_id, raft.clone()));
        self.groups.insert(group, raft);
        *self.meta.write().expect("meta lock") = Some(ctx.clone());
        Ok(ctx)
    }

    pub(crate) async fn persist_hosted(&self, bootstrapped: bool) -> Result<(), StartError> {
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
