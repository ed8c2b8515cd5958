//! The metadata Raft group on this node, and the cluster map it
//! replicates (`tocsin_core::cluster`).
//!
//! - Every node caches the newest map it knows ([`MapCache`]). Each
//!   reconcile round refreshes it: from this node's own metadata replica if
//!   it hosts one, else from the metadata voters; a request carrying a newer
//!   epoch than the cache triggers a refresh at once.
//! - [`propose`] sends a cluster command to the metadata leader: applied
//!   here if this node leads the group, forwarded over
//!   `ReplicaControl.ProposeCluster` otherwise.
//! - [`read_latest`] reads the map linearizably at the metadata leader:
//!   what cluster operations plan from, and what a shard leader acts on
//!   before it moves replicas, so no node ever moves a shard by a stale map.
//! - [`drive`] is the metadata leader's part of every reconcile round:
//!   bootstrap the map of a new cluster, keep the group's own voters as
//!   `tocsin_core::cluster::metadata_voters` says, and finish node
//!   transitions (joining → active once every replica the map gives the
//!   node is in place; draining → removed once it holds nothing), so an
//!   operation interrupted half-way is completed without its operator.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::Proposal;
use tocsin_core::cluster::ClusterCommand;
use tocsin_core::cluster::ClusterMap;
use tocsin_core::cluster::ClusterOutcome;
use tocsin_core::cluster::MapChange;
use tocsin_core::cluster::NewNode;
use tocsin_core::cluster::NodeStatus;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::replica_control_client::ReplicaControlClient;
use tocsin_store::NodeAddr;

use crate::control::state::NodeState;
use crate::control::view::ClusterView;
use crate::error::NodeError;

/// How long a cluster command or a linearizable map read keeps trying to
/// reach the metadata leader (an election takes well under this).
const META_DEADLINE: Duration = Duration::from_secs(10);
/// Deadline of one metadata RPC.
const META_RPC_TIMEOUT: Duration = Duration::from_secs(3);

/// Where to send metadata calls: the known leader first, then every voter.
fn candidates(node: &NodeState) -> Vec<(u64, String)> {
    let status = node.meta_status();
    let addr_of = |id: u64| {
        status
            .nodes
            .iter()
            .find(|n| n.node_id == id)
            .map(|n| n.peer_addr.clone())
            .filter(|a| !a.is_empty())
            .or_else(|| node.map.get().nodes.get(&id).map(|n| n.peer_addr.clone()))
    };
    let mut out: Vec<(u64, String)> = Vec::new();
    if status.leader != 0
        && let Some(addr) = addr_of(status.leader)
    {
        out.push((status.leader, addr));
    }
    for id in &status.voters {
        if let Some(addr) = addr_of(*id)
            && !out.iter().any(|(i, _)| i == id)
        {
            out.push((*id, addr));
        }
    }
    if out.is_empty() {
        // Nothing learned yet (a node that just joined): any node will do,
        // for a non-linearizable read at least.
        let map = node.map.get();
        out.extend(
            map.nodes
                .iter()
                .filter(|(id, n)| **id != node.node_id && n.status != NodeStatus::Removed)
                .map(|(id, n)| (*id, n.peer_addr.clone())),
        );
        out.extend(node.router.known());
        out.extend(node.peers().into_iter().map(|(id, a)| (id, a.peer_addr)));
        out.sort();
        out.dedup();
    }
    out.retain(|(id, a)| *id != node.node_id && !a.is_empty());
    out
}

async fn client(node: &NodeState, addr: &str) -> Option<ReplicaControlClient<tonic::transport::Channel>> {
    Some(ReplicaControlClient::new(node.forwarder.channel(addr)?))
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, NodeError> {
    postcard::from_bytes(bytes).map_err(|e| NodeError::Internal(format!("decoding a metadata answer: {e}")))
}

pub fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("cluster types serialize")
}

/// Applies `cmd` at this node, which must lead the metadata group.
async fn propose_here(node: &NodeState, cmd: ClusterCommand) -> Result<(ClusterOutcome, u64), NodeError> {
    let Some(ctx) = node.meta().filter(|c| c.is_leader()) else {
        return Err(NodeError::unavailable("this node does not lead the metadata group", 100));
    };
    let proposal = Proposal { now_ms: node.clock.now_ms(), commands: vec![Command::Cluster(cmd)].into() };
    crate::shard::quiet::renew_lease(&ctx.raft).await;
    let resp = tokio::time::timeout(META_RPC_TIMEOUT, ctx.raft.client_write(proposal))
        .await
        .map_err(|_| NodeError::unavailable("the metadata group did not commit in time; the outcome is unknown", 500))?
        .map_err(|e| NodeError::unavailable(format!("the metadata group refused the write: {e}"), 200))?;
    let index = resp.log_id.index;
    match resp.data.results.into_iter().next() {
        Some(CommandResult::Cluster(outcome)) => {
            // Applied and durable before client_write returned.
            node.local_map().await;
            Ok((outcome, index))
        }
        other => Err(NodeError::Internal(format!("unexpected metadata result {other:?}"))),
    }
}

/// The server side of `ProposeCluster`.
pub async fn serve_propose(node: &NodeState, command: &[u8]) -> Result<pb::ProposeClusterResponse, NodeError> {
    let cmd: ClusterCommand = decode(command)?;
    let (outcome, applied_index) = propose_here(node, cmd).await.map_err(|e| with_leader_hint(node, e))?;
    Ok(pb::ProposeClusterResponse { outcome: encode(&outcome).into(), applied_index })
}

/// Points an UNAVAILABLE answer at the metadata leader, if known.
fn with_leader_hint(node: &NodeState, e: NodeError) -> NodeError {
    match e {
        NodeError::Unavailable { message, leader: None, retry_after_ms } => {
            let s = node.meta_status();
            let leader =
                s.nodes.iter().find(|n| n.node_id == s.leader && s.leader != node.node_id).map(|n| pb::LeaderHint {
                    shard: 0,
                    node_id: n.node_id,
                    grpc_addr: n.grpc_addr.clone(),
                    http_addr: n.http_addr.clone(),
                });
            NodeError::Unavailable { message, leader, retry_after_ms }
        }
        other => other,
    }
}

/// Runs `call` against the metadata leader (here, or the candidates in
/// turn, following leader hints) until it answers or [`META_DEADLINE`].
async fn at_leader<T, L, LF, R, RF>(node: &NodeState, local: L, remote: R) -> Result<T, NodeError>
where
    L: Fn() -> LF,
    LF: std::future::Future<Output = Result<T, NodeError>>,
    R: Fn(ReplicaControlClient<tonic::transport::Channel>) -> RF,
    RF: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = tokio::time::Instant::now() + META_DEADLINE;
    let mut last = String::from("no metadata voter is known");
    loop {
        if node.meta().is_some_and(|c| c.is_leader()) {
            match local().await {
                Ok(v) => return Ok(v),
                Err(e @ NodeError::Unavailable { .. }) => last = e.to_string(),
                Err(e) => return Err(e),
            }
        } else {
            let mut hint: Option<String> = None;
            for (id, addr) in candidates(node) {
                let Some(c) = client(node, &addr).await else { continue };
                match tokio::time::timeout(META_RPC_TIMEOUT, remote(c)).await {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(status)) if status.code() == tonic::Code::Unavailable => {
                        let info = tocsin_contract::codes::info_of(&status);
                        // The hint names the leader's client address; nodes
                        // talk to each other on the peer port.
                        hint = info.leader.and_then(|l| {
                            node.peer_addr_of(l.node_id)
                                .or_else(|| node.map.get().nodes.get(&l.node_id).map(|n| n.peer_addr.clone()))
                        });
                        last = format!("node {id}: {}", status.message());
                        if hint.is_some() {
                            break;
                        }
                    }
                    Ok(Err(status)) => return Err(NodeError::from_status(&status)),
                    Err(_) => last = format!("node {id} did not answer within {META_RPC_TIMEOUT:?}"),
                }
            }
            if let Some(addr) = hint
                && let Some(c) = client(node, &addr).await
                && let Ok(Ok(v)) = tokio::time::timeout(META_RPC_TIMEOUT, remote(c)).await
            {
                return Ok(v);
            }
        }
        if tokio::time::Instant::now() > deadline {
            return Err(NodeError::unavailable(format!("the metadata group has no reachable leader: {last}"), 1000));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        refresh(node).await;
    }
}

/// Proposes `cmd` to the metadata group and returns what it did. The map
/// it produced is in this node's cache when this returns.
pub async fn propose(node: &NodeState, cmd: ClusterCommand) -> Result<ClusterOutcome, NodeError> {
    let bytes = encode(&cmd);
    let (outcome, _) = at_leader(
        node,
        || propose_here(node, cmd.clone()),
        |mut c| {
            let bytes = bytes.clone();
            async move {
                let resp = c.propose_cluster(pb::ProposeClusterRequest { command: bytes.into() }).await?.into_inner();
                let outcome: ClusterOutcome = postcard::from_bytes(&resp.outcome)
                    .map_err(|e| tonic::Status::internal(format!("decoding the outcome: {e}")))?;
                Ok((outcome, resp.applied_index))
            }
        },
    )
    .await?;
    if !matches!(outcome, ClusterOutcome::Unchanged { .. }) {
        let _ = read_latest(node).await;
    }
    Ok(outcome)
}

/// The map as of a linearizable read at this node, which must lead.
async fn read_here(node: &NodeState) -> Result<(ClusterMap, pb::MetadataStatus), NodeError> {
    let Some(ctx) = node.meta().filter(|c| c.is_leader()) else {
        return Err(NodeError::unavailable("this node does not lead the metadata group", 100));
    };
    tokio::time::timeout(META_RPC_TIMEOUT, ctx.raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex))
        .await
        .map_err(|_| NodeError::unavailable("the metadata leader could not confirm its leadership in time", 300))?
        .map_err(|e| {
            NodeError::unavailable(format!("the metadata leader could not confirm its leadership: {e}"), 300)
        })?;
    let map = node.local_map().await.ok_or_else(|| NodeError::Internal("reading the cluster map failed".into()))?;
    Ok((map, ctx.status()))
}

/// The server side of `ReadClusterMap`.
pub async fn serve_read(node: &NodeState, linearizable: bool) -> Result<pb::ReadClusterMapResponse, NodeError> {
    let (map, metadata) = if linearizable {
        read_here(node).await.map_err(|e| with_leader_hint(node, e))?
    } else {
        ((*node.fresh_map().await).clone(), node.meta_status())
    };
    Ok(pb::ReadClusterMapResponse { map: encode(&map).into(), metadata: Some(metadata) })
}

/// The cluster map as it is now: every change committed before this call
/// is in it. Learned into the cache as well.
pub async fn read_latest(node: &NodeState) -> Result<ClusterMap, NodeError> {
    let (map, metadata) = at_leader(
        node,
        || read_here(node),
        |mut c| async move {
            let resp = c.read_cluster_map(pb::ReadClusterMapRequest { linearizable: true }).await?.into_inner();
            let map: ClusterMap = postcard::from_bytes(&resp.map)
                .map_err(|e| tonic::Status::internal(format!("decoding the map: {e}")))?;
            Ok((map, resp.metadata.unwrap_or_default()))
        },
    )
    .await?;
    node.map.learn_route(&metadata);
    node.map.learn(map.clone());
    Ok(map)
}

/// Refreshes the cache: from this node's metadata replica if it hosts one
/// (which also tells where the leader is), and from the metadata voters
/// (non-linearizable: whatever they have applied) when it does not, or
/// when asked for a newer epoch than the local replica has.
pub async fn refresh(node: &NodeState) {
    if let Some(ctx) = node.meta() {
        node.map.learn_route(&ctx.status());
        node.local_map().await;
        let wanted = node.map.wanted.load(Ordering::SeqCst);
        if ctx.raft.metrics().borrow_watched().current_leader.is_some() && node.map.get().epoch >= wanted {
            return;
        }
    }
    let asks = candidates(node).into_iter().map(|(_, addr)| async move {
        let mut c = client(node, &addr).await?;
        let call = c.read_cluster_map(pb::ReadClusterMapRequest { linearizable: false });
        let resp = tokio::time::timeout(META_RPC_TIMEOUT, call).await.ok()?.ok()?.into_inner();
        let map: ClusterMap = postcard::from_bytes(&resp.map).ok()?;
        Some((map, resp.metadata.unwrap_or_default()))
    });
    for (map, metadata) in futures::future::join_all(asks).await.into_iter().flatten() {
        if metadata.hosted {
            node.map.learn_route(&metadata);
        }
        node.map.learn(map);
    }
}

/// The metadata voters the first start of a new cluster gives the group:
/// the lowest ids among the initial members.
pub fn initial_voters(members: &[crate::config::Member]) -> Vec<u64> {
    let mut ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    ids.sort_unstable();
    ids.truncate(tocsin_core::cluster::metadata_voter_count(ids.len()));
    ids
}

/// The metadata leader's round (see the module doc). `view` is the
/// cluster as the reachable nodes report it.
pub async fn drive(node: &Arc<NodeState>, view: &ClusterView) {
    let Some(ctx) = node.meta().filter(|c| c.is_leader()) else { return };
    let Some(map) = node.local_map().await else { return };
    if !map.is_bootstrapped() {
        bootstrap(node).await;
        return;
    }

    // The group's own voters.
    let m = ctx.raft.metrics().borrow_watched().clone();
    let current: Vec<u64> = m.membership_config.membership().voter_ids().collect();
    let joint = m.membership_config.membership().get_joint_config().len() > 1;
    let want = tocsin_core::cluster::metadata_voters(&map, &current);
    // Learners left over from a change a leader change cut short (voters left
    // out stay learners until they are released).
    let strays = m.membership_config.membership().learner_ids().any(|id| !want.contains(&id));
    if (want != current || joint || strays) && !ctx.changing.swap(true, Ordering::SeqCst) {
        let target: BTreeMap<u64, NodeAddr> = want
            .iter()
            .filter_map(|id| {
                let n = map.nodes.get(id)?;
                Some((*id, crate::control::map::node_addr(n)))
            })
            .collect();
        let (node, ctx, from) = (node.clone(), ctx.clone(), current.clone());
        tokio::spawn(async move {
            tracing::info!(?from, to = ?want, "changing the metadata group's voters");
            let group = crate::control::replicas::Group::Meta(ctx.clone());
            match crate::control::replicas::set_voters(&node, &group, target).await {
                Ok(_) => {}
                // Left out, this leader handed the group to a new voter.
                Err(e @ NodeError::Unavailable { .. }) => tracing::info!(error = %e, "metadata voters: not the leader"),
                Err(e) => tracing::warn!(error = %e, "changing the metadata group's voters"),
            }
            ctx.changing.store(false, Ordering::SeqCst);
        });
    }

    // Node transitions an interrupted operation left behind.
    let meta_voters: Vec<u64> = current;
    let mut status = Vec::new();
    for id in map.with_status(NodeStatus::Joining) {
        let placed = map.shards_on(id).iter().all(|s| view.in_place(*s, map.replicas(*s)));
        if placed {
            status.push((id, NodeStatus::Active));
        }
    }
    for id in map.with_status(NodeStatus::Draining) {
        let covered = view.shards.iter().all(|s| !s.voters.is_empty());
        let holds = view.shards.iter().any(|s| s.voters.contains(&id) || s.learners.contains(&id));
        if covered && !holds && !meta_voters.contains(&id) {
            status.push((id, NodeStatus::Removed));
        }
    }
    if !status.is_empty() {
        tracing::info!(?status, "finishing node transitions");
        let change = MapChange { expected_epoch: map.epoch, status, ..Default::default() };
        match propose_here(node, ClusterCommand::Change(change)).await {
            Ok((ClusterOutcome::Refused { error, .. }, _)) => tracing::info!(%error, "node transition not applied"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "finishing node transitions"),
        }
    }
}

/// Proposes the first map of a new cluster, from this node's config.
async fn bootstrap(node: &NodeState) {
    let members = match node.config.initial_members() {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "cannot bootstrap the cluster map");
            return;
        }
    };
    let nodes = members
        .into_iter()
        .map(|m| {
            if m.id == node.node_id {
                let me = &node.self_addr;
                NewNode {
                    id: m.id,
                    grpc_addr: me.grpc_addr.clone(),
                    http_addr: me.http_addr.clone(),
                    peer_addr: me.peer_addr.clone(),
                }
            } else {
                NewNode { id: m.id, grpc_addr: m.grpc, http_addr: m.http, peer_addr: m.peer }
            }
        })
        .collect();
    let cmd = ClusterCommand::Bootstrap {
        num_shards: node.config.num_shards,
        replication_factor: node.config.replication_factor as u32,
        nodes,
        cluster_id: new_cluster_id(),
    };
    match propose_here(node, cmd).await {
        Ok((outcome, index)) => tracing::info!(?outcome, index, "bootstrapped the cluster map"),
        Err(e) => tracing::warn!(error = %e, "bootstrapping the cluster map"),
    }
}

/// A random cluster id (16 hex digits): if two nodes race to bootstrap,
/// the first entry applied wins and the other is a no-op, so every node
/// learns the same id.
fn new_cluster_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Tells every other node that map `epoch` exists, so each refreshes its
/// cache now instead of at its next round (a revoked token is refused
/// everywhere within about a second). Best effort: a node that does not
/// answer refreshes on its own round.
pub async fn announce(node: &NodeState, epoch: u64) {
    let map = node.map.get();
    let mut addrs: BTreeMap<u64, String> = node.router.known().into_iter().collect();
    for (id, n) in &map.nodes {
        if n.status != NodeStatus::Removed && !n.peer_addr.is_empty() {
            addrs.insert(*id, n.peer_addr.clone());
        }
    }
    addrs.remove(&node.node_id);
    let tells = addrs.into_values().map(|addr| async move {
        let channel = node.forwarder.channel(&addr)?;
        let mut admin = tocsin_proto::v1::admin_service_client::AdminServiceClient::new(channel);
        let mut request = tonic::Request::new(pb::GetShardMapRequest {});
        request.metadata_mut().insert(tocsin_contract::headers::MAP_EPOCH, epoch.into());
        tokio::time::timeout(META_RPC_TIMEOUT, admin.get_shard_map(request)).await.ok()?.ok()
    });
    futures::future::join_all(tells).await;
}
