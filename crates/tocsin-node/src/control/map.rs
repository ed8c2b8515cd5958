//! The cluster map as this node holds it: the cached newest map
//! ([`MapCache`]) and this node's replica of the metadata group
//! ([`MetaCtx`]). Plain state, shared through `NodeState`; what is done
//! with it (proposing changes, reading at the leader, the leader's round) is
//! `meta.rs`.

use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;

use openraft::async_runtime::WatchReceiver as _;
use tocsin_core::cluster::ClusterMap;
use tocsin_proto::v1 as pb;
use tocsin_store::Raft;

/// The metadata group as hosted on this node.
pub struct MetaCtx {
    pub node_id: u64,
    pub raft: Raft,
    /// Held while this node changes the group's voters.
    pub membership_change: tokio::sync::Mutex<()>,
    /// Whether a voter change started by the metadata leader's round
    /// (`meta::drive`) is still running.
    pub(crate) changing: AtomicBool,
}

impl MetaCtx {
    pub fn new(node_id: u64, raft: Raft) -> MetaCtx {
        MetaCtx { node_id, raft, membership_change: tokio::sync::Mutex::new(()), changing: AtomicBool::new(false) }
    }

    /// Whether this node leads the metadata group by openraft's account.
    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics().borrow_watched().clone();
        m.state == openraft::ServerState::Leader && m.current_leader == Some(self.node_id)
    }

    /// The group's voters, leader and addresses, from this replica.
    pub fn status(&self) -> pb::MetadataStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        pb::MetadataStatus {
            voters: membership.voter_ids().collect(),
            leader: m.current_leader.unwrap_or(0),
            term: m.current_term,
            hosted: true,
            committed_index: m.local_committed.map_or(0, |l| l.index),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            nodes: membership
                .nodes()
                .map(|(id, a)| pb::NodeInfo {
                    node_id: *id,
                    grpc_addr: a.grpc_addr.clone(),
                    http_addr: a.http_addr.clone(),
                    peer_addr: a.peer_addr.clone(),
                    ..Default::default()
                })
                .collect(),
        }
    }
}

/// The newest cluster map this node knows, and where the metadata group is.
#[derive(Default)]
pub struct MapCache {
    map: RwLock<Arc<ClusterMap>>,
    /// The metadata group as last learned: for nodes that host no replica.
    route: RwLock<pb::MetadataStatus>,
    /// The highest epoch a request or peer has shown this node; above the
    /// cached one, the next refresh asks the metadata voters.
    pub(crate) wanted: std::sync::atomic::AtomicU64,
    /// Wakes the reconcile loop for an early refresh.
    pub stale: tokio::sync::Notify,
    /// The cluster id of the first bootstrapped map taken (it never
    /// changes), shared with every shard (`ShardCtx::cluster_id`).
    cluster_id: Arc<std::sync::OnceLock<String>>,
    /// Called with each newer map this node takes (set once at start).
    on_learn: std::sync::OnceLock<Box<dyn Fn(&ClusterMap) + Send + Sync>>,
}

impl MapCache {
    pub fn get(&self) -> Arc<ClusterMap> {
        self.map.read().expect("map lock").clone()
    }

    /// Takes `map` if it is newer than the cached one; epochs never go back.
    pub fn learn(&self, map: ClusterMap) -> bool {
        let mut cached = self.map.write().expect("map lock");
        if map.epoch > cached.epoch {
            tracing::info!(from = cached.epoch, to = map.epoch, "learned a newer cluster map");
            metrics::gauge!("tocsin_map_epoch").set(map.epoch as f64);
            if map.is_bootstrapped() {
                let id = self.cluster_id.get_or_init(|| map.cluster_id.clone());
                if *id != map.cluster_id {
                    // Nodes of two clusters mixed up: never sign one's
                    // deliveries with the other's id.
                    tracing::error!(known = %id, learned = %map.cluster_id, "a cluster map of another cluster; ignored");
                    return false;
                }
            }
            *cached = Arc::new(map);
            if let Some(hook) = self.on_learn.get() {
                hook(&cached);
            }
            return true;
        }
        false
    }

    /// The cell holding the cluster id once known.
    pub fn cluster_id_cell(&self) -> Arc<std::sync::OnceLock<String>> {
        self.cluster_id.clone()
    }

    /// Calls `hook` with the cached map now and with every newer one this
    /// node takes from now on (the webhook sender's signing secrets).
    pub fn on_learn(&self, hook: impl Fn(&ClusterMap) + Send + Sync + 'static) {
        let cached = self.map.read().expect("map lock");
        hook(&cached);
        if self.on_learn.set(Box::new(hook)).is_err() {
            tracing::error!("the cluster map's learn hook was set twice; the second is ignored");
        }
    }

    /// Someone routed by `epoch`: if that is newer than the cache, refresh
    /// soon.
    pub fn saw_epoch(&self, epoch: u64) {
        if epoch > self.get().epoch && epoch > self.wanted.fetch_max(epoch, Ordering::SeqCst) {
            self.stale.notify_one();
        }
    }

    pub fn route(&self) -> pb::MetadataStatus {
        self.route.read().expect("route lock").clone()
    }

    pub(crate) fn learn_route(&self, status: &pb::MetadataStatus) {
        let mut route = self.route.write().expect("route lock");
        if status.term >= route.term && !status.voters.is_empty() {
            *route = status.clone();
        }
    }
}

/// A map node's addresses as Raft memberships record them.
pub fn node_addr(n: &tocsin_core::cluster::MapNode) -> tocsin_store::NodeAddr {
    tocsin_store::NodeAddr {
        grpc_addr: n.grpc_addr.clone(),
        http_addr: n.http_addr.clone(),
        peer_addr: n.peer_addr.clone(),
    }
}
