//! The cluster map: which nodes make up the cluster and where each shard's
//! replicas belong. The metadata Raft group replicates it; every node
//! caches it, and each shard's leader moves its replicas to where the map
//! says they belong.
//!
//! - [`ClusterMap`]: the node list (addresses and [`NodeStatus`]), the
//!   placement ring's tokens, and each shard's target replica set with the
//!   map epoch at which it last changed;
//! - [`ClusterCommand`] and [`apply_cluster`]: the only ways the map
//!   changes. Every change raises the map epoch by one, and a
//!   [`MapChange`] applies only to the epoch it was planned against
//!   (compare-and-set), so two operators cannot interleave half-plans;
//! - the planners ([`plan_add`], [`plan_remove`], [`plan_rebalance`],
//!   [`plan_move`]) and [`metadata_voters`]: what an operation proposes.
//!
//! Pure, like the shard rules: time arrives as `now_ms`, stamped by the
//! metadata leader into the entry.
//!
//! Rules the map keeps at every epoch (checked by [`ClusterMap::check`]):
//! every shard has a target of at least one replica, and every target names
//! only nodes that may hold replicas (`Joining` or `Active`); so a node is
//! drained by the same change that marks it `Draining`, and a `Removed`
//! node holds nothing. Removed node ids stay in the map for ever: an id is
//! never reused.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use serde::Deserialize;
use serde::Serialize;

use crate::NodeId;
use crate::ShardId;
use crate::routing::Ring;

mod apply;
mod plan;

pub use apply::apply_cluster;
pub use plan::Plan;
pub use plan::metadata_voter_count;
pub use plan::metadata_voters;
pub use plan::plan_add;
pub use plan::plan_move;
pub use plan::plan_rebalance;
pub use plan::plan_remove;

/// Most voters the metadata group has.
pub const MAX_METADATA_VOTERS: usize = 5;
/// Most nodes a map records, removed ones included.
pub const MAX_NODES: usize = 1024;
/// Most replicas one shard may have.
pub const MAX_REPLICAS: usize = 7;
/// Longest node address accepted, in bytes.
pub const MAX_ADDR_BYTES: usize = 256;

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NodeStatus {
    /// Added; its replicas are being created and caught up.
    Joining,
    /// Holds replicas and may lead.
    Active,
    /// Its replicas are moving away; it gets no new ones.
    Draining,
    /// Holds nothing, and its id is never used again.
    Removed,
}

impl NodeStatus {
    /// Whether a shard's target may name a node in this state.
    pub fn may_hold_replicas(self) -> bool {
        matches!(self, NodeStatus::Joining | NodeStatus::Active)
    }

    /// Lowercase name, as the CLI prints it.
    pub fn name(self) -> &'static str {
        match self {
            NodeStatus::Joining => "joining",
            NodeStatus::Active => "active",
            NodeStatus::Draining => "draining",
            NodeStatus::Removed => "removed",
        }
    }
}

/// One node as the map records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapNode {
    /// The client gRPC API.
    pub grpc_addr: String,
    pub http_addr: String,
    /// The peer API other nodes dial (Raft, replica control, forwarding).
    pub peer_addr: String,
    pub status: NodeStatus,
    /// The map epoch at which `status` was set.
    pub since_epoch: u64,
}

/// Where one shard's replicas belong.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The target voters, sorted.
    pub replicas: Vec<NodeId>,
    /// The map epoch at which `replicas` last changed: a request routed by
    /// a map older than this is routed by a stale map.
    pub epoch: u64,
}

/// The replicated cluster map.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Raised by every change; 0 until the cluster is bootstrapped.
    pub epoch: u64,
    pub num_shards: u32,
    pub replication_factor: u32,
    /// Every node ever added, by id (removed ones included).
    pub nodes: BTreeMap<NodeId, MapNode>,
    /// The placement ring's tokens over the nodes that may hold replicas,
    /// sorted by token.
    pub ring: Vec<(u64, NodeId)>,
    /// One placement per shard, by shard id.
    pub shards: Vec<Placement>,
    /// The metadata leader's clock when the last change was applied.
    pub changed_at_ms: u64,
    /// Bearer tokens by id (see `crate::auth`): stored hashed, so every
    /// node checks a call against the same grants.
    pub tokens: BTreeMap<String, crate::auth::TokenRecord>,
    /// Drawn at bootstrap, never changed: it names this cluster in every
    /// fire id and delivery, so a receiver tells a rebuilt cluster's
    /// deliveries (whose epochs start again) from the old one's.
    pub cluster_id: String,
    /// Per-namespace quotas (see [`NamespaceQuota`]).
    pub quotas: BTreeMap<String, NamespaceQuota>,
    /// Per-namespace webhook signing secrets; they take precedence over a
    /// node's configuration file, so a rotation reaches every node at once
    /// without a restart.
    pub secrets: BTreeMap<String, NamespaceSecrets>,
    /// Namespaces whose firing is paused, with when: their due timers
    /// wait in the fire-time index until resumed.
    pub paused_namespaces: BTreeMap<String, u64>,
    /// Webhook endpoints (`scheme://host:port`) whose deliveries are
    /// paused, with when: attempts to them are held, not sent.
    pub paused_endpoints: BTreeMap<String, u64>,
}

/// Most namespaces with a quota, and with a secret.
pub const MAX_NAMESPACE_SETTINGS: usize = 10_000;
/// Most secrets being rotated out per namespace: deliveries carry one
/// signature per secret.
pub const MAX_PREVIOUS_SECRETS: usize = 2;
/// Shortest and longest signing secret, in bytes.
pub const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// Whether `id` has the shape of a cluster id: 16 lowercase hex digits.
pub fn is_cluster_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A namespace's limits; 0 means no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceQuota {
    /// Most unfinished timers (scheduled, firing or retrying) at once.
    pub max_pending: u64,
    /// Most creates per second, cluster-wide.
    pub creates_per_sec: u64,
}

impl NamespaceQuota {
    /// One shard's share of `limit` (timers spread over the shards by id
    /// hash), rounded up so a small limit still admits something; 0 stays
    /// "no limit".
    pub fn share(limit: u64, num_shards: u32) -> u64 {
        if limit == 0 { 0 } else { limit.div_ceil(u64::from(num_shards.max(1))) }
    }
}

/// A webhook signing secret: its bytes never appear in `Debug` output.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret(pub Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<{} bytes redacted>)", self.0.len())
    }
}

/// A namespace's signing secrets: every delivery is signed with the
/// current one and each previous one (Standard Webhooks allows several
/// signatures), so receivers move to the new secret at their own pace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceSecrets {
    pub current: Secret,
    /// Newest first, at most [`MAX_PREVIOUS_SECRETS`].
    pub previous: Vec<Secret>,
    pub rotated_at_ms: u64,
}

impl NamespaceSecrets {
    /// The keys to sign with, the current one first.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.current.0.as_slice()).chain(self.previous.iter().map(|s| s.0.as_slice()))
    }
}

/// A node to add, as the operator names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewNode {
    pub id: NodeId,
    pub grpc_addr: String,
    pub http_addr: String,
    pub peer_addr: String,
}

/// One atomic change to the map.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapChange {
    /// The epoch this change was planned against; any other refuses it.
    pub expected_epoch: u64,
    /// Nodes to add, as `Joining` (an identical existing entry is left as
    /// it is).
    pub add: Vec<NewNode>,
    /// Status changes.
    pub status: Vec<(NodeId, NodeStatus)>,
    /// New targets, sorted or not.
    pub placements: Vec<(ShardId, Vec<NodeId>)>,
}

/// The commands the metadata group's log carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterCommand {
    /// The first map of a new cluster: every node `Active`, each shard
    /// placed by the ring over them. A no-op once bootstrapped.
    Bootstrap {
        num_shards: u32,
        replication_factor: u32,
        nodes: Vec<NewNode>,
        /// See [`ClusterMap::cluster_id`]; drawn by the node that
        /// bootstraps.
        cluster_id: String,
    },
    Change(MapChange),
    /// Creates or revokes a bearer token.
    Token(TokenChange),
    /// Sets (`Some`) or clears (`None`) a namespace's quota.
    Quota {
        namespace: String,
        quota: Option<NamespaceQuota>,
    },
    /// Changes a namespace's signing secrets.
    Secret {
        namespace: String,
        change: SecretChange,
    },
    /// Pauses (`paused: true`) or resumes a namespace's firing or a webhook
    /// endpoint's deliveries.
    Pause {
        target: PauseTarget,
        paused: bool,
    },
}

/// What a [`ClusterCommand::Pause`] pauses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PauseTarget {
    /// Every fire and retry of the namespace's timers.
    Namespace(String),
    /// Every webhook request to this endpoint, `scheme://host:port` (or
    /// `scheme://host`).
    Endpoint(String),
}

/// Longest endpoint name a pause may hold.
pub const MAX_ENDPOINT_BYTES: usize = 300;

/// Whether `endpoint` is an origin: `http://` or `https://`, a host, an
/// optional port, nothing after.
pub fn is_origin(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("https://")) else {
        return false;
    };
    endpoint.len() <= MAX_ENDPOINT_BYTES
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', '@', ' '])
        && rest.chars().all(|c| c.is_ascii_graphic())
}

/// A change to a namespace's signing secrets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SecretChange {
    /// `secret` becomes current; the current one moves to the front of the
    /// previous ones (the oldest beyond [`MAX_PREVIOUS_SECRETS`] is dropped).
    Rotate { secret: Secret },
    /// Stops signing with the previous secrets (the rotation is over).
    DropPrevious,
    /// Removes the namespace's secrets (the node's file applies again).
    Clear,
}

/// A change to the map's tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenChange {
    /// Adds a token under a new id (an id in use is refused).
    Create { id: String, record: crate::auth::TokenRecord },
    /// Removes a token; an unknown id changes nothing.
    Revoke { id: String },
}

/// What a cluster command did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterOutcome {
    /// Applied; the map is now at `epoch`.
    Changed { epoch: u64 },
    /// Nothing to change; the map stays at `epoch`.
    Unchanged { epoch: u64 },
    /// Refused; the map stays at `epoch`.
    Refused { epoch: u64, error: MapError },
}

/// Why a cluster command was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MapError {
    #[error("the cluster map is not bootstrapped yet")]
    NotBootstrapped,
    #[error("the map changed meanwhile: planned against epoch {expected}, now at {current}")]
    StaleEpoch { expected: u64, current: u64 },
    #[error("node {0} is not in the cluster map")]
    UnknownNode(NodeId),
    #[error("node id {id} was removed at epoch {epoch}; node ids are never reused")]
    IdRetired { id: NodeId, epoch: u64 },
    #[error("node id {id} already belongs to the node at {grpc_addr}")]
    IdTaken { id: NodeId, grpc_addr: String },
    #[error("address {addr} already belongs to node {id}")]
    AddressTaken { addr: String, id: NodeId },
    #[error("node {id} cannot go from {from:?} to {to:?}")]
    BadTransition { id: NodeId, from: NodeStatus, to: NodeStatus },
    #[error("shard {shard}: {message}")]
    BadPlacement { shard: ShardId, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl ClusterMap {
    /// Whether the cluster has been bootstrapped.
    pub fn is_bootstrapped(&self) -> bool {
        self.epoch > 0
    }

    pub fn status(&self, node: NodeId) -> Option<NodeStatus> {
        self.nodes.get(&node).map(|n| n.status)
    }

    /// Nodes that may hold replicas (`Joining` or `Active`).
    pub fn eligible(&self) -> BTreeSet<NodeId> {
        self.nodes.iter().filter(|(_, n)| n.status.may_hold_replicas()).map(|(id, _)| *id).collect()
    }

    /// Nodes in `status`.
    pub fn with_status(&self, status: NodeStatus) -> BTreeSet<NodeId> {
        self.nodes.iter().filter(|(_, n)| n.status == status).map(|(id, _)| *id).collect()
    }

    /// The target replicas of `shard` (empty if there is no such shard).
    pub fn replicas(&self, shard: ShardId) -> &[NodeId] {
        self.shards.get(shard as usize).map_or(&[], |p| p.replicas.as_slice())
    }

    /// The epoch at which `shard`'s target last changed (0 if unknown).
    pub fn shard_epoch(&self, shard: ShardId) -> u64 {
        self.shards.get(shard as usize).map_or(0, |p| p.epoch)
    }

    /// Shards whose target names `node`.
    pub fn shards_on(&self, node: NodeId) -> Vec<ShardId> {
        (0..self.shards.len() as ShardId).filter(|s| self.replicas(*s).contains(&node)).collect()
    }

    /// The rules every map keeps (see the module doc), as a description of
    /// the first one broken.
    pub fn check(&self) -> Result<(), String> {
        if !self.is_bootstrapped() {
            return Ok(());
        }
        if self.num_shards == 0 || self.shards.len() != self.num_shards as usize {
            return Err(format!("{} placements for {} shards", self.shards.len(), self.num_shards));
        }
        if self.nodes.len() > MAX_NODES {
            return Err(format!("{} nodes, more than {MAX_NODES}", self.nodes.len()));
        }
        if self.tokens.len() > crate::auth::MAX_TOKENS {
            return Err(format!("{} tokens, more than {}", self.tokens.len(), crate::auth::MAX_TOKENS));
        }
        for (id, t) in &self.tokens {
            t.check().map_err(|e| format!("token {id}: {e}"))?;
        }
        if !is_cluster_id(&self.cluster_id) {
            return Err(format!("cluster id {:?} is not 16 hex digits", self.cluster_id));
        }
        if self.quotas.len() > MAX_NAMESPACE_SETTINGS || self.secrets.len() > MAX_NAMESPACE_SETTINGS {
            return Err(format!(
                "{} quotas and {} secrets, more than {MAX_NAMESPACE_SETTINGS}",
                self.quotas.len(),
                self.secrets.len()
            ));
        }
        for (ns, s) in &self.secrets {
            if s.previous.len() > MAX_PREVIOUS_SECRETS || s.keys().any(|k| !SECRET_BYTES.contains(&k.len())) {
                return Err(format!("namespace {ns}'s secrets break the size rules"));
            }
        }
        for (shard, p) in self.shards.iter().enumerate() {
            if p.replicas.is_empty() {
                return Err(format!("shard {shard} has no target replica"));
            }
            if p.replicas.len() > MAX_REPLICAS {
                return Err(format!("shard {shard} has {} replicas, more than {MAX_REPLICAS}", p.replicas.len()));
            }
            if p.replicas.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("shard {shard}'s replicas {:?} are not sorted and distinct", p.replicas));
            }
            if p.epoch > self.epoch {
                return Err(format!("shard {shard} changed at epoch {}, after the map's {}", p.epoch, self.epoch));
            }
            for id in &p.replicas {
                match self.status(*id) {
                    Some(s) if s.may_hold_replicas() => {}
                    Some(s) => return Err(format!("shard {shard} is placed on node {id}, which is {}", s.name())),
                    None => return Err(format!("shard {shard} is placed on unknown node {id}")),
                }
            }
        }
        Ok(())
    }

    fn ring_over_eligible(&self) -> Vec<(u64, NodeId)> {
        Ring::new(self.eligible()).tokens().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: NodeId) -> NewNode {
        NewNode {
            id,
            grpc_addr: format!("n{id}:7070"),
            http_addr: format!("n{id}:7071"),
            peer_addr: format!("n{id}:7072"),
        }
    }

    fn booted(nodes: &[NodeId], shards: u32) -> ClusterMap {
        let mut map = ClusterMap::default();
        let cmd = ClusterCommand::Bootstrap {
            num_shards: shards,
            replication_factor: 3,
            nodes: nodes.iter().map(|n| node(*n)).collect(),
            cluster_id: "0123456789abcdef".into(),
        };
        assert_eq!(apply_cluster(&mut map, &cmd, 5).unwrap(), ClusterOutcome::Changed { epoch: 1 });
        map
    }

    fn change(map: &mut ClusterMap, change: MapChange) -> ClusterOutcome {
        apply_cluster(map, &ClusterCommand::Change(change), 10).unwrap()
    }

    #[test]
    fn tokens_are_created_once_and_revoked_with_the_epoch_raised() {
        use crate::auth::Scope;
        use crate::auth::TokenRecord;
        let mut map = booted(&[1, 2, 3], 4);
        let record = TokenRecord {
            secret_sha256: [7; 32],
            scopes: vec![Scope::TimersWrite],
            namespaces: vec!["orders".into()],
            label: "svc".into(),
            created_at_ms: 3,
        };
        let token =
            |map: &ClusterMap, change| apply_cluster(&mut map.clone(), &ClusterCommand::Token(change), 20).unwrap();
        let create = TokenChange::Create { id: "t1".into(), record: record.clone() };
        assert_eq!(
            apply_cluster(&mut map, &ClusterCommand::Token(create.clone()), 20).unwrap(),
            ClusterOutcome::Changed { epoch: 2 }
        );
        assert_eq!(map.tokens["t1"], record);
        assert!(matches!(token(&map, create), ClusterOutcome::Refused { epoch: 2, .. }), "an id is never given twice");
        let bad = TokenRecord { scopes: vec![], ..record.clone() };
        assert!(matches!(
            token(&map, TokenChange::Create { id: "t2".into(), record: bad }),
            ClusterOutcome::Refused { .. }
        ));
        assert!(matches!(
            token(&map, TokenChange::Create { id: "t_2".into(), record }),
            ClusterOutcome::Refused { .. }
        ));
        let revoke = ClusterCommand::Token(TokenChange::Revoke { id: "t1".into() });
        assert_eq!(apply_cluster(&mut map, &revoke, 30).unwrap(), ClusterOutcome::Changed { epoch: 3 });
        assert!(map.tokens.is_empty());
        assert_eq!(apply_cluster(&mut map, &revoke, 40).unwrap(), ClusterOutcome::Unchanged { epoch: 3 });
    }

    #[test]
    fn namespaces_and_endpoints_are_paused_and_resumed() {
        let mut map = booted(&[1, 2, 3], 4);
        let ns = |paused| ClusterCommand::Pause { target: PauseTarget::Namespace("billing".into()), paused };
        let ep = |origin: &str, paused| ClusterCommand::Pause { target: PauseTarget::Endpoint(origin.into()), paused };
        assert_eq!(apply_cluster(&mut map, &ns(true), 6).unwrap(), ClusterOutcome::Changed { epoch: 2 });
        assert_eq!(map.paused_namespaces["billing"], 6);
        assert_eq!(apply_cluster(&mut map, &ns(true), 7).unwrap(), ClusterOutcome::Unchanged { epoch: 2 });
        assert_eq!(map.paused_namespaces["billing"], 6, "a second pause keeps the first time");
        let origin = "https://hooks.example.com:8443";
        assert_eq!(apply_cluster(&mut map, &ep(origin, true), 8).unwrap(), ClusterOutcome::Changed { epoch: 3 });
        for bad in ["https://hooks.example.com/path", "ftp://x", "https://", "https://a b"] {
            let refused = apply_cluster(&mut map, &ep(bad, true), 9).unwrap();
            assert!(matches!(refused, ClusterOutcome::Refused { epoch: 3, .. }), "{bad}: {refused:?}");
        }
        assert_eq!(apply_cluster(&mut map, &ns(false), 10).unwrap(), ClusterOutcome::Changed { epoch: 4 });
        assert_eq!(apply_cluster(&mut map, &ns(false), 11).unwrap(), ClusterOutcome::Unchanged { epoch: 4 });
        assert!(map.paused_namespaces.is_empty());
        assert_eq!(map.paused_endpoints.keys().collect::<Vec<_>>(), [origin]);
    }

    #[test]
    fn quotas_are_set_replaced_and_cleared_with_the_epoch_raised() {
        let mut map = booted(&[1, 2, 3], 4);
        let set = |q: Option<NamespaceQuota>| ClusterCommand::Quota { namespace: "orders".into(), quota: q };
        let q = NamespaceQuota { max_pending: 10, creates_per_sec: 0 };
        assert_eq!(apply_cluster(&mut map, &set(Some(q)), 6).unwrap(), ClusterOutcome::Changed { epoch: 2 });
        assert_eq!(map.quotas["orders"], q);
        assert_eq!(apply_cluster(&mut map, &set(Some(q)), 7).unwrap(), ClusterOutcome::Unchanged { epoch: 2 });
        let empty = apply_cluster(&mut map, &set(Some(NamespaceQuota::default())), 7).unwrap();
        assert!(matches!(empty, ClusterOutcome::Refused { epoch: 2, .. }), "{empty:?}");
        let bad = ClusterCommand::Quota { namespace: "no spaces".into(), quota: Some(q) };
        assert!(matches!(apply_cluster(&mut map, &bad, 7).unwrap(), ClusterOutcome::Refused { .. }));
        assert_eq!(apply_cluster(&mut map, &set(None), 8).unwrap(), ClusterOutcome::Changed { epoch: 3 });
        assert!(map.quotas.is_empty());
        assert_eq!(apply_cluster(&mut map, &set(None), 9).unwrap(), ClusterOutcome::Unchanged { epoch: 3 });
        assert_eq!(NamespaceQuota::share(10, 4), 3);
        assert_eq!(NamespaceQuota::share(0, 4), 0);
        assert_eq!(NamespaceQuota::share(1, 12), 1);
    }

    #[test]
    fn secrets_rotate_keeping_two_previous_and_never_print() {
        let mut map = booted(&[1, 2, 3], 4);
        let rotate = |b: u8| ClusterCommand::Secret {
            namespace: "orders".into(),
            change: SecretChange::Rotate { secret: Secret(vec![b; 32]) },
        };
        for (i, b) in [1u8, 2, 3, 4].into_iter().enumerate() {
            let epoch = 2 + i as u64;
            assert_eq!(apply_cluster(&mut map, &rotate(b), 10).unwrap(), ClusterOutcome::Changed { epoch });
        }
        let s = &map.secrets["orders"];
        let keys: Vec<u8> = s.keys().map(|k| k[0]).collect();
        assert_eq!(keys, vec![4, 3, 2], "current first, then at most two previous, newest first");
        // A secret used before is refused; a short one too.
        assert!(matches!(apply_cluster(&mut map, &rotate(3), 11).unwrap(), ClusterOutcome::Refused { .. }));
        let short = ClusterCommand::Secret {
            namespace: "orders".into(),
            change: SecretChange::Rotate { secret: Secret(vec![9; 8]) },
        };
        assert!(matches!(apply_cluster(&mut map, &short, 11).unwrap(), ClusterOutcome::Refused { .. }));
        let drop = ClusterCommand::Secret { namespace: "orders".into(), change: SecretChange::DropPrevious };
        assert_eq!(apply_cluster(&mut map, &drop, 12).unwrap(), ClusterOutcome::Changed { epoch: 6 });
        assert_eq!(map.secrets["orders"].keys().count(), 1);
        assert_eq!(apply_cluster(&mut map, &drop, 12).unwrap(), ClusterOutcome::Unchanged { epoch: 6 });
        let printed = format!("{map:?}");
        assert!(!printed.contains("4, 4, 4"), "a secret's bytes in Debug output: {printed}");
        assert!(printed.contains("redacted"));
        let clear = ClusterCommand::Secret { namespace: "orders".into(), change: SecretChange::Clear };
        assert_eq!(apply_cluster(&mut map, &clear, 13).unwrap(), ClusterOutcome::Changed { epoch: 7 });
        assert!(map.secrets.is_empty());
    }

    #[test]
    fn bootstrap_draws_on_a_well_formed_cluster_id() {
        let mut map = ClusterMap::default();
        let bad = ClusterCommand::Bootstrap {
            num_shards: 1,
            replication_factor: 1,
            nodes: vec![node(1)],
            cluster_id: "not-hex".into(),
        };
        assert!(matches!(apply_cluster(&mut map, &bad, 1).unwrap(), ClusterOutcome::Refused { epoch: 0, .. }));
        assert_eq!(booted(&[1], 1).cluster_id, "0123456789abcdef");
        assert!(is_cluster_id("0123456789abcdef") && !is_cluster_id("0123456789ABCDEF"));
    }

    #[test]
    fn bootstrap_places_every_shard_once() {
        let mut map = booted(&[1, 2, 3], 8);
        assert!(map.shards.iter().all(|p| p.replicas == vec![1, 2, 3] && p.epoch == 1));
        assert_eq!(map.ring.len(), 3 * crate::routing::TOKENS_PER_NODE as usize);
        // A second bootstrap (another metadata leader's) changes nothing.
        let again = ClusterCommand::Bootstrap {
            num_shards: 4,
            replication_factor: 1,
            nodes: vec![node(9)],
            cluster_id: "fedcba9876543210".into(),
        };
        assert_eq!(apply_cluster(&mut map, &again, 9).unwrap(), ClusterOutcome::Unchanged { epoch: 1 });
        assert_eq!(map.num_shards, 8);
        // One node: every shard on it.
        let one = booted(&[7], 4);
        assert!(one.shards.iter().all(|p| p.replicas == vec![7]));
    }

    #[test]
    fn a_change_applies_only_to_the_epoch_it_was_planned_against() {
        let mut map = booted(&[1, 2, 3], 4);
        let add = MapChange { expected_epoch: 1, add: vec![node(4)], ..Default::default() };
        assert_eq!(change(&mut map, add.clone()), ClusterOutcome::Changed { epoch: 2 });
        assert_eq!(map.status(4), Some(NodeStatus::Joining));
        let before = map.clone();
        let out = change(&mut map, add);
        assert_eq!(out, ClusterOutcome::Refused { epoch: 2, error: MapError::StaleEpoch { expected: 1, current: 2 } });
        assert_eq!(map, before);
        // The same add at the current epoch changes nothing.
        let same = MapChange { expected_epoch: 2, add: vec![node(4)], ..Default::default() };
        assert_eq!(change(&mut map, same), ClusterOutcome::Unchanged { epoch: 2 });
    }

    #[test]
    fn ids_are_never_reused_and_addresses_never_shared() {
        let mut map = booted(&[1, 2, 3], 4);
        let other_addr = NewNode { grpc_addr: "elsewhere:1".into(), ..node(3) };
        let out = change(&mut map, MapChange { expected_epoch: 1, add: vec![other_addr], ..Default::default() });
        assert!(matches!(out, ClusterOutcome::Refused { error: MapError::IdTaken { id: 3, .. }, .. }), "{out:?}");
        let same_addr = NewNode { id: 9, ..node(3) };
        let out = change(&mut map, MapChange { expected_epoch: 1, add: vec![same_addr], ..Default::default() });
        assert!(matches!(out, ClusterOutcome::Refused { error: MapError::AddressTaken { id: 3, .. }, .. }), "{out:?}");
        // Drain node 3 (its shards go to {1, 2}), then remove it.
        let plan = plan_remove(&map, 3);
        assert_eq!(plan.len(), 4);
        let drain = MapChange {
            expected_epoch: 1,
            status: vec![(3, NodeStatus::Draining)],
            placements: plan,
            ..Default::default()
        };
        assert_eq!(change(&mut map, drain), ClusterOutcome::Changed { epoch: 2 });
        assert!(map.shards.iter().all(|p| p.replicas == vec![1, 2] && p.epoch == 2));
        let remove = MapChange { expected_epoch: 2, status: vec![(3, NodeStatus::Removed)], ..Default::default() };
        assert_eq!(change(&mut map, remove), ClusterOutcome::Changed { epoch: 3 });
        let out = change(&mut map, MapChange { expected_epoch: 3, add: vec![node(3)], ..Default::default() });
        assert_eq!(out, ClusterOutcome::Refused { epoch: 3, error: MapError::IdRetired { id: 3, epoch: 3 } });
        let back = MapChange { expected_epoch: 3, status: vec![(3, NodeStatus::Active)], ..Default::default() };
        assert!(matches!(
            change(&mut map, back),
            ClusterOutcome::Refused { error: MapError::BadTransition { .. }, .. }
        ));
        // Its address is free again for a new id.
        let fresh = NewNode { id: 4, ..node(3) };
        assert_eq!(
            change(&mut map, MapChange { expected_epoch: 3, add: vec![fresh], ..Default::default() }),
            ClusterOutcome::Changed { epoch: 4 }
        );
    }

    #[test]
    fn a_node_is_drained_by_the_change_that_marks_it_draining() {
        let mut map = booted(&[1, 2, 3], 4);
        // Marking it draining without moving its shards is refused.
        let out = change(
            &mut map,
            MapChange { expected_epoch: 1, status: vec![(2, NodeStatus::Draining)], ..Default::default() },
        );
        assert!(matches!(out, ClusterOutcome::Refused { error: MapError::BadPlacement { .. }, .. }), "{out:?}");
        // So is removing a node that still holds replicas.
        let out = change(
            &mut map,
            MapChange { expected_epoch: 1, status: vec![(2, NodeStatus::Removed)], ..Default::default() },
        );
        assert!(matches!(out, ClusterOutcome::Refused { error: MapError::BadPlacement { .. }, .. }), "{out:?}");
        // And placing a shard on an unknown node, or on nothing.
        let out =
            change(&mut map, MapChange { expected_epoch: 1, placements: vec![(0, vec![1, 9])], ..Default::default() });
        assert_eq!(out, ClusterOutcome::Refused { epoch: 1, error: MapError::UnknownNode(9) });
        let out =
            change(&mut map, MapChange { expected_epoch: 1, placements: vec![(0, vec![])], ..Default::default() });
        assert!(matches!(out, ClusterOutcome::Refused { error: MapError::BadPlacement { shard: 0, .. }, .. }));
        let out =
            change(&mut map, MapChange { expected_epoch: 1, placements: vec![(9, vec![1])], ..Default::default() });
        assert!(matches!(out, ClusterOutcome::Refused { error: MapError::BadPlacement { shard: 9, .. }, .. }));
        // Or on more nodes than the replication factor (found by the cluster
        // model: a drain planned for the factor left the extra copy).
        let too_many: Vec<NodeId> = (1..=map.replication_factor as u64 + 1).collect();
        let out =
            change(&mut map, MapChange { expected_epoch: 1, placements: vec![(0, too_many)], ..Default::default() });
        assert!(
            matches!(out, ClusterOutcome::Refused { error: MapError::BadPlacement { shard: 0, .. }, .. }),
            "{out:?}"
        );
        assert_eq!(map.epoch, 1);
    }

    #[test]
    fn only_changed_shards_get_the_new_epoch() {
        let mut map = booted(&[1, 2, 3, 4, 5], 32);
        let (shard, target) = (0..32)
            .find_map(|s| {
                plan_move(
                    &map,
                    s,
                    map.replicas(s)[0],
                    *map.eligible().iter().find(|n| !map.replicas(s).contains(n)).unwrap(),
                )
                .unwrap()
            })
            .unwrap();
        assert_eq!(
            change(
                &mut map,
                MapChange { expected_epoch: 1, placements: vec![(shard, target.clone())], ..Default::default() }
            ),
            ClusterOutcome::Changed { epoch: 2 }
        );
        assert_eq!(map.shard_epoch(shard), 2);
        assert_eq!(map.replicas(shard), target.as_slice());
        assert!((0..32).filter(|s| *s != shard).all(|s| map.shard_epoch(s) == 1));
        // Moving it back to where it is now is a no-op plan.
        let from = target[0];
        assert!(plan_move(&map, shard, 99, from).unwrap().is_none());
    }

    #[test]
    fn adding_a_fourth_node_moves_about_a_quarter_of_the_replicas_to_it() {
        let mut map = booted(&[1, 2, 3], 64);
        let add =
            MapChange { expected_epoch: 1, add: vec![node(4)], placements: plan_add(&map, 4), ..Default::default() };
        let moves = add.placements.clone();
        assert!((32..=64).contains(&moves.len()), "{} shards change", moves.len());
        for (shard, to) in &moves {
            assert!(to.contains(&4) && to.len() == 3, "{to:?}");
            // Exactly one old voter leaves each changed shard.
            assert_eq!(map.replicas(*shard).iter().filter(|n| !to.contains(n)).count(), 1);
        }
        assert_eq!(change(&mut map, add), ClusterOutcome::Changed { epoch: 2 });
        // The plan is done: planning again proposes nothing.
        assert!(plan_add(&map, 4).is_empty());
        assert!(plan_rebalance(&map).is_empty());
        // A single-node cluster grows: every shard gets the second replica.
        let one = booted(&[1], 8);
        let moves = plan_add(&one, 2);
        assert_eq!(moves.len(), 8);
        assert!(moves.iter().all(|(_, to)| *to == vec![1, 2]));
    }

    #[test]
    fn removing_a_node_replaces_only_its_replicas() {
        let map = booted(&[1, 2, 3, 4, 5], 32);
        let plan = plan_remove(&map, 1);
        assert_eq!(plan.len(), map.shards_on(1).len());
        for (shard, to) in &plan {
            assert!(!to.contains(&1) && to.len() == 3);
            let kept: Vec<_> = map.replicas(*shard).iter().filter(|n| **n != 1).collect();
            assert!(kept.iter().all(|n| to.contains(n)));
        }
        // Three nodes, replication factor 3: shards shrink to two voters.
        let three = booted(&[1, 2, 3], 4);
        assert!(plan_remove(&three, 3).iter().all(|(_, to)| *to == vec![1, 2]));
        assert!(plan_remove(&three, 9).is_empty());
    }

    #[test]
    fn metadata_voters_stay_odd_and_prefer_the_current_ones() {
        let map = booted(&[1, 2, 3, 4, 5, 6, 7], 4);
        assert_eq!(metadata_voters(&map, &[1, 2, 3]), vec![1, 2, 3, 4, 5]);
        assert_eq!(metadata_voters(&map, &[7, 6, 5, 4, 3]), vec![3, 4, 5, 6, 7]);
        let four = booted(&[1, 2, 3, 4], 4);
        assert_eq!(metadata_voters(&four, &[1, 2, 3]), vec![1, 2, 3]);
        assert_eq!(metadata_voters(&four, &[2, 3, 4, 1]), vec![1, 2, 3]);
        let two = booted(&[1, 2], 4);
        assert_eq!(metadata_voters(&two, &[1]), vec![1, 2]);
        let one = booted(&[5], 4);
        assert_eq!(metadata_voters(&one, &[5]), vec![5]);
        // A draining voter is replaced by an active node.
        let mut map = booted(&[1, 2, 3, 4], 4);
        let drain = MapChange {
            expected_epoch: 1,
            status: vec![(2, NodeStatus::Draining)],
            placements: plan_remove(&map, 2),
            ..Default::default()
        };
        assert_eq!(change(&mut map, drain), ClusterOutcome::Changed { epoch: 2 });
        assert_eq!(metadata_voters(&map, &[1, 2, 3]), vec![1, 3, 4]);
    }
}
