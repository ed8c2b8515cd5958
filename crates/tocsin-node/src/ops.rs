//! Cluster operations behind `tocsin admin`: add, remove and decommission a
//! node, move a shard's replica, rebalance. Each one plans replica moves
//! from the merged [`ClusterView`], checks that every shard keeps a quorum
//! through its move, then sends each shard's target voter set to that
//! shard's leader ([`crate::replicas`]), streaming progress as it goes.
//!
//! Plans are pure functions of the view ([`plan_add`], [`plan_remove`],
//! [`plan_rebalance`]); a re-run after an interruption plans only what is
//! left, and the leader completes a half-done change when it is sent the
//! same target again.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use tocsin_core::ShardId;
use tocsin_core::routing::Ring;
use tocsin_proto::v1 as pb;
use tocsin_store::NodeAddr;
use tokio::sync::mpsc;
use tonic::Status;

use crate::api::error::ApiError;
use crate::node::NodeState;
use crate::view::ClusterView;

/// How long one shard's move may take, retries included.
const MOVE_DEADLINE: Duration = Duration::from_secs(400);
/// Deadline of the SetReplicas call (the leader waits for catch-up).
const SET_REPLICAS_TIMEOUT: Duration = Duration::from_secs(330);
/// Deadline of each node's answer when the view is gathered.
const VIEW_TIMEOUT: Duration = Duration::from_secs(2);
/// Progress messages buffered for a slow reader.
pub const PROGRESS_QUEUE: usize = 64;

/// One shard's planned change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub shard: ShardId,
    pub from: Vec<u64>,
    pub to: Vec<u64>,
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v.dedup();
    v
}

/// Adding `new`: every shard the ring over `nodes ∪ {new}` places on `new`
/// moves to the ring's replica set.
pub fn plan_add(view: &ClusterView, new: u64, rf: usize) -> Vec<Move> {
    let mut nodes = view.voter_nodes();
    nodes.insert(new);
    // `to.contains(&new)` also catches a change to this placement that was
    // left in joint consensus (its voters are the union, never equal).
    ring_moves(view, &nodes, rf, |to| to.contains(&new))
}

/// Removing `gone`: every shard with a replica on it gets, in its place,
/// the next node in ring order over the remaining nodes that it lacks (none
/// if fewer nodes remain than replicas).
pub fn plan_remove(view: &ClusterView, gone: u64, rf: usize) -> Vec<Move> {
    let remaining: BTreeSet<u64> = view.voter_nodes().into_iter().filter(|n| *n != gone).collect();
    let ring = Ring::new(remaining.iter().copied());
    let rf = rf.min(remaining.len());
    (0..view.num_shards)
        .filter_map(|shard| {
            let from = view.shards[shard as usize].voters.clone();
            if !from.contains(&gone) {
                return None;
            }
            let mut to: Vec<u64> = from.iter().copied().filter(|n| *n != gone).collect();
            for n in ring.replicas(shard, remaining.len()) {
                if to.len() >= rf {
                    break;
                }
                if !to.contains(&n) {
                    to.push(n);
                }
            }
            Some(Move { shard, from, to: sorted(to) })
        })
        .collect()
}

/// Rebalancing: every shard moves to the ring's replica set over the nodes
/// that hold replicas now.
pub fn plan_rebalance(view: &ClusterView, rf: usize) -> Vec<Move> {
    ring_moves(view, &view.voter_nodes(), rf, |_| true)
}

/// The moves that put each hosted shard whose ring placement over `nodes`
/// passes `wanted` and differs from its voters onto that placement.
fn ring_moves(view: &ClusterView, nodes: &BTreeSet<u64>, rf: usize, wanted: impl Fn(&[u64]) -> bool) -> Vec<Move> {
    let ring = Ring::new(nodes.iter().copied());
    let rf = rf.min(nodes.len());
    (0..view.num_shards)
        .filter_map(|shard| {
            let from = view.shards[shard as usize].voters.clone();
            let to = sorted(ring.replicas(shard, rf));
            (wanted(&to) && from != to && !from.is_empty()).then_some(Move { shard, from, to })
        })
        .collect()
}

/// Why a move would leave its shard without a quorum, if it would: joint
/// consensus needs a majority of both the old and the new voters to answer.
pub fn quorum_problem(m: &Move, reachable: &BTreeSet<u64>) -> Option<String> {
    for (which, set) in [("current", &m.from), ("new", &m.to)] {
        let up: Vec<u64> = set.iter().copied().filter(|n| reachable.contains(n)).collect();
        if up.len() * 2 <= set.len() {
            return Some(format!(
                "shard {} would have no quorum: its {which} voters are {set:?} and only {up:?} answer",
                m.shard
            ));
        }
    }
    None
}

/// Streams progress to the admin client. A client that goes away does not
/// stop the operation: every step is safe to finish unobserved.
pub struct Reporter {
    tx: mpsc::Sender<Result<pb::Progress, Status>>,
    started: Instant,
    pub total: u32,
    pub done: u32,
    pub bytes: u64,
}

impl Reporter {
    pub fn new(tx: mpsc::Sender<Result<pb::Progress, Status>>) -> Reporter {
        Reporter { tx, started: Instant::now(), total: 0, done: 0, bytes: 0 }
    }

    fn eta_ms(&self) -> u64 {
        if self.done == 0 || self.done >= self.total {
            return 0;
        }
        let per_shard = self.started.elapsed().as_millis() as u64 / u64::from(self.done);
        per_shard * u64::from(self.total - self.done)
    }

    pub async fn say(&self, step: &str, message: impl Into<String>) {
        let message = message.into();
        tracing::info!(step, "{message}");
        let _ = self
            .tx
            .send(Ok(pb::Progress {
                step: step.into(),
                shards_done: self.done,
                shards_total: self.total,
                bytes_streamed: self.bytes,
                eta_ms: self.eta_ms(),
                message,
                done: false,
            }))
            .await;
    }

    pub async fn finish(&self, message: impl Into<String>) {
        let message = message.into();
        tracing::info!("{message}");
        let _ = self
            .tx
            .send(Ok(pb::Progress {
                step: "done".into(),
                shards_done: self.done,
                shards_total: self.total,
                bytes_streamed: self.bytes,
                eta_ms: 0,
                message,
                done: true,
            }))
            .await;
    }

    pub async fn fail(&self, error: ApiError) {
        tracing::warn!(error = %error, "cluster operation failed");
        let _ = self.tx.send(Err(error.into())).await;
    }
}

/// Sends `m.to` to the shard's leader until it is the committed voter set,
/// following leadership as it moves. Returns the snapshot bytes streamed.
async fn execute(node: &Arc<NodeState>, view: &mut ClusterView, m: &Move) -> Result<u64, ApiError> {
    let deadline = tokio::time::Instant::now() + MOVE_DEADLINE;
    loop {
        let target: Vec<pb::ReplicaNode> =
            m.to.iter()
                .map(|id| {
                    let addr = view.nodes.get(id).cloned().unwrap_or_default();
                    pb::ReplicaNode { node_id: *id, grpc_addr: addr.grpc_addr, http_addr: addr.http_addr }
                })
                .collect();
        if let Some(missing) = target.iter().find(|t| t.grpc_addr.is_empty()) {
            return Err(ApiError::FailedPrecondition(format!("no address is known for node {}", missing.node_id)));
        }
        let leader = view.shards[m.shard as usize].leader;
        let result = if leader == 0 {
            Err(ApiError::unavailable(format!("shard {} has no known leader", m.shard), 300))
        } else if leader == node.node_id {
            let target = target
                .iter()
                .map(|t| (t.node_id, NodeAddr { grpc_addr: t.grpc_addr.clone(), http_addr: t.http_addr.clone() }))
                .collect();
            crate::replicas::set_replicas(node, m.shard, target).await
        } else {
            let addr = view.nodes.get(&leader).map(|a| a.grpc_addr.clone()).unwrap_or_default();
            match crate::replicas::control_client(&addr, SET_REPLICAS_TIMEOUT).await {
                Ok(mut client) => client
                    .set_replicas(pb::SetReplicasRequest { shard: m.shard, voters: target })
                    .await
                    .map(|r| r.into_inner())
                    .map_err(|s| match s.code() {
                        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
                            ApiError::FailedPrecondition(s.message().to_string())
                        }
                        _ => ApiError::unavailable(s.message(), 300),
                    }),
                Err(e) => Err(e),
            }
        };
        let last = match result {
            Ok(resp) => return Ok(resp.bytes_streamed),
            Err(e @ (ApiError::InvalidArgument { .. } | ApiError::FailedPrecondition(_))) => return Err(e),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() > deadline {
            return Err(ApiError::unavailable(
                format!("shard {}: gave up after {MOVE_DEADLINE:?}: {last}", m.shard),
                1000,
            ));
        }
        tracing::info!(shard = m.shard, error = %last, "retrying the move");
        tokio::time::sleep(Duration::from_millis(300)).await;
        *view = crate::view::gather(node, VIEW_TIMEOUT).await;
    }
}

/// Checks every move's quorum, then carries them out one shard at a time.
async fn run_moves(node: &Arc<NodeState>, view: &mut ClusterView, moves: &[Move], rep: &mut Reporter) -> bool {
    for m in moves {
        if let Some(problem) = quorum_problem(m, &view.reachable) {
            rep.fail(ApiError::FailedPrecondition(format!("refusing to start: {problem}"))).await;
            return false;
        }
    }
    rep.total = moves.len() as u32;
    for m in moves {
        rep.say("move", format!("shard {}: voters {:?} -> {:?}", m.shard, m.from, m.to)).await;
        match execute(node, view, m).await {
            Ok(bytes) => {
                rep.done += 1;
                rep.bytes += bytes;
                let streamed = if bytes > 0 { format!(" ({bytes} snapshot bytes streamed)") } else { String::new() };
                rep.say("moved", format!("shard {} is on {:?}{streamed}", m.shard, m.to)).await;
            }
            Err(e) => {
                rep.fail(e).await;
                return false;
            }
        }
    }
    true
}

fn rf(node: &NodeState) -> usize {
    node.config.replication_factor
}

/// `node add`: the new node joins the shards the ring gives it; the
/// balancer then moves some leaderships to it.
pub async fn add_node(node: Arc<NodeState>, grpc_addr: String, http_addr: String, mut rep: Reporter) {
    let info = match fetch_info(&grpc_addr).await {
        Ok(info) => info,
        Err(e) => return rep.fail(e).await,
    };
    let new = info.node_id;
    if info.num_shards != node.config.num_shards {
        return rep
            .fail(ApiError::FailedPrecondition(format!(
                "node {new} at {grpc_addr} has {} shards, the cluster {}; start it with --shards {}",
                info.num_shards, node.config.num_shards, node.config.num_shards
            )))
            .await;
    }
    let http_addr = if http_addr.is_empty() {
        info.nodes.iter().find(|n| n.node_id == new).map(|n| n.http_addr.clone()).unwrap_or_default()
    } else {
        http_addr
    };
    let mut view = crate::view::gather(&node, VIEW_TIMEOUT).await;
    if let Some(known) = view.nodes.get(&new)
        && known.grpc_addr != grpc_addr
        && view.voter_nodes().contains(&new)
    {
        return rep
            .fail(ApiError::AlreadyExists(format!(
                "node id {new} already belongs to the node at {}; node ids are never reused",
                known.grpc_addr
            )))
            .await;
    }
    view.nodes.insert(new, NodeAddr { grpc_addr: grpc_addr.clone(), http_addr });
    view.reachable.insert(new);
    let moves = plan_add(&view, new, rf(&node));
    rep.say("plan", format!("node {new} at {grpc_addr} takes a replica of {} shards", moves.len())).await;
    if !run_moves(&node, &mut view, &moves, &mut rep).await {
        return;
    }
    rep.say("leaders", "waiting for the balancer to hand leaderships to the new node").await;
    let led = wait_for_leaders(&node, new, Duration::from_secs(15)).await;
    rep.finish(format!(
        "node {new} added: it holds a replica of {} shards ({} moved now, {} snapshot bytes streamed) and leads {led}",
        crate::view::gather(&node, VIEW_TIMEOUT).await.shards.iter().filter(|s| s.voters.contains(&new)).count(),
        moves.len(),
        rep.bytes
    ))
    .await;
}

/// `node remove` (drain a live node) and `node decommission` (replace a dead
/// node's replicas): both leave the node holding nothing.
pub async fn remove_node(node: Arc<NodeState>, gone: u64, dead: bool, mut rep: Reporter) {
    let mut view = crate::view::gather(&node, VIEW_TIMEOUT).await;
    let verb = if dead { "decommission" } else { "remove" };
    if !view.voter_nodes().contains(&gone) {
        return rep.finish(format!("node {gone} holds no replica: nothing to {verb}")).await;
    }
    if view.voter_nodes().len() == 1 {
        return rep
            .fail(ApiError::FailedPrecondition(format!(
                "node {gone} is the last node: removing it would lose every shard"
            )))
            .await;
    }
    if !dead && !view.reachable.contains(&gone) {
        return rep
            .fail(ApiError::FailedPrecondition(format!(
                "node {gone} does not answer; to replace a dead node's replicas run `tocsin admin node decommission {gone}`"
            )))
            .await;
    }
    let moves = plan_remove(&view, gone, rf(&node));
    rep.say("plan", format!("moving {} replicas off node {gone}", moves.len())).await;
    if !run_moves(&node, &mut view, &moves, &mut rep).await {
        return;
    }
    let view = crate::view::gather(&node, VIEW_TIMEOUT).await;
    let still = view.voter_nodes().contains(&gone);
    if !dead && !still {
        sweep(&view, gone).await;
    }
    if still {
        return rep
            .fail(ApiError::Internal(format!(
                "node {gone} still holds replicas after the moves; run the command again"
            )))
            .await;
    }
    rep.finish(format!(
        "node {gone} {}: it holds no replica and can be stopped; its id is not to be reused",
        if dead { "decommissioned" } else { "drained and removed" }
    ))
    .await;
}

/// `shard move`: one replica of one shard from one node to another.
pub async fn move_shard(node: Arc<NodeState>, shard: ShardId, from: u64, to: u64, mut rep: Reporter) {
    if shard >= node.config.num_shards {
        return rep.fail(ApiError::invalid("shard", format!("must be below {}", node.config.num_shards))).await;
    }
    let mut view = crate::view::gather(&node, VIEW_TIMEOUT).await;
    let current = view.shards[shard as usize].voters.clone();
    if current.contains(&to) && !current.contains(&from) {
        rep.total = 1;
        rep.done = 1;
        return rep.finish(format!("shard {shard} is already on {current:?}")).await;
    }
    if !current.contains(&from) {
        return rep.fail(ApiError::invalid("from_node", format!("shard {shard} has no replica on node {from}"))).await;
    }
    if current.contains(&to) {
        return rep
            .fail(ApiError::invalid("to_node", format!("shard {shard} already has a replica on node {to}")))
            .await;
    }
    if !view.nodes.contains_key(&to) {
        return rep
            .fail(ApiError::invalid("to_node", format!("node {to} is not known; add it with `tocsin admin node add`")))
            .await;
    }
    let to_set = sorted(current.iter().copied().filter(|n| *n != from).chain([to]).collect());
    let moves = vec![Move { shard, from: current, to: to_set }];
    if run_moves(&node, &mut view, &moves, &mut rep).await {
        rep.finish(format!("shard {shard} moved from node {from} to node {to}")).await;
    }
}

/// `rebalance`: every shard onto the ring's placement over the current
/// nodes; the balancer evens out leaderships afterwards.
pub async fn rebalance(node: Arc<NodeState>, dry_run: bool, mut rep: Reporter) {
    let mut view = crate::view::gather(&node, VIEW_TIMEOUT).await;
    let moves = plan_rebalance(&view, rf(&node));
    if dry_run || moves.is_empty() {
        rep.total = moves.len() as u32;
        for m in &moves {
            rep.say("plan", format!("shard {}: voters {:?} -> {:?}", m.shard, m.from, m.to)).await;
        }
        let verb = if dry_run { "would move" } else { "moved" };
        return rep.finish(format!("rebalance {verb} {} shards; {}", moves.len(), leader_counts(&view))).await;
    }
    if run_moves(&node, &mut view, &moves, &mut rep).await {
        let view = crate::view::gather(&node, VIEW_TIMEOUT).await;
        rep.finish(format!("rebalanced {} shards; {}", moves.len(), leader_counts(&view))).await;
    }
}

fn leader_counts(view: &ClusterView) -> String {
    let mut counts: BTreeMap<u64, usize> = view.voter_nodes().into_iter().map(|n| (n, 0)).collect();
    for s in &view.shards {
        if s.leader != 0 {
            *counts.entry(s.leader).or_default() += 1;
        }
    }
    let parts: Vec<String> = counts.iter().map(|(n, c)| format!("node {n} leads {c}")).collect();
    parts.join(", ")
}

async fn wait_for_leaders(node: &Arc<NodeState>, id: u64, timeout: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let view = crate::view::gather(node, VIEW_TIMEOUT).await;
        let led = view.shards.iter().filter(|s| s.leader == id).count();
        if led > 0 || tokio::time::Instant::now() > deadline {
            return led;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Releases whatever replicas `gone` still hosts although it is a voter of
/// none: what a removal interrupted between its membership change and the
/// release leaves behind.
async fn sweep(view: &ClusterView, gone: u64) {
    let Some(addr) = view.nodes.get(&gone).map(|a| a.grpc_addr.clone()) else { return };
    let Ok(info) = fetch_info(&addr).await else { return };
    for s in info.shards {
        let voters = view.shards.get(s.shard as usize).map(|v| v.voters.clone()).unwrap_or_default();
        if voters.is_empty() || voters.contains(&gone) {
            continue;
        }
        let Ok(mut client) = crate::replicas::control_client(&addr, Duration::from_secs(10)).await else { return };
        if let Err(e) = client.release_shard(pb::ReleaseShardRequest { shard: s.shard, voters }).await {
            tracing::warn!(shard = s.shard, node = gone, error = %e.message(), "sweeping a left-over replica");
        }
    }
}

async fn fetch_info(grpc_addr: &str) -> Result<pb::ClusterInfo, ApiError> {
    use tocsin_proto::v1::admin_service_client::AdminServiceClient;
    let unreachable = |e: String| ApiError::unavailable(format!("cannot reach the node at {grpc_addr}: {e}"), 1000);
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))
        .map_err(|e| ApiError::invalid("grpc_addr", format!("{grpc_addr:?} is not host:port: {e}")))?
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(5));
    let channel = endpoint.connect().await.map_err(|e| unreachable(e.to_string()))?;
    let info = AdminServiceClient::new(channel)
        .get_cluster(pb::GetClusterRequest { digests: false })
        .await
        .map_err(|s| unreachable(s.message().to_string()))?;
    Ok(info.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::ShardView;

    fn view(placements: &[&[u64]]) -> ClusterView {
        let shards: Vec<ShardView> =
            placements.iter().map(|p| ShardView { voters: sorted(p.to_vec()), ..Default::default() }).collect();
        let nodes: BTreeSet<u64> = placements.iter().flat_map(|p| p.iter().copied()).collect();
        ClusterView {
            num_shards: shards.len() as u32,
            nodes: nodes.iter().map(|n| (*n, NodeAddr::default())).collect(),
            reachable: nodes,
            shards,
        }
    }

    #[test]
    fn adding_a_fourth_node_moves_about_a_quarter_of_the_replicas_to_it() {
        let v = view(&vec![&[1u64, 2, 3][..]; 64]);
        let moves = plan_add(&v, 4, 3);
        assert!((32..=64).contains(&moves.len()), "{} shards change", moves.len());
        for m in &moves {
            assert!(m.to.contains(&4) && m.to.len() == 3, "{m:?}");
            // Exactly one old voter leaves each changed shard.
            assert_eq!(m.from.iter().filter(|n| !m.to.contains(n)).count(), 1, "{m:?}");
        }
        // A single-node cluster grows: every shard gets the second replica.
        let one = view(&[&[1u64][..]; 8]);
        let moves = plan_add(&one, 2, 3);
        assert_eq!(moves.len(), 8);
        assert!(moves.iter().all(|m| m.to == vec![1, 2]));
    }

    #[test]
    fn removing_a_node_replaces_only_its_replicas() {
        let mut placements: Vec<&[u64]> = vec![&[1, 2, 3]; 10];
        placements.extend(vec![&[2u64, 3, 4][..]; 6]);
        let v = view(&placements);
        let moves = plan_remove(&v, 1, 3);
        assert_eq!(moves.len(), 10);
        for m in &moves {
            assert_eq!(m.to, vec![2, 3, 4]);
        }
        // Three nodes, replication factor 3: shards shrink to two voters.
        let three = view(&[&[1u64, 2, 3][..]; 4]);
        assert!(plan_remove(&three, 3, 3).iter().all(|m| m.to == vec![1, 2]));
        // A node that holds nothing: no moves.
        assert!(plan_remove(&three, 9, 3).is_empty());
    }

    #[test]
    fn rebalance_is_a_no_op_on_the_rings_own_placement() {
        let ring = Ring::new([1, 2, 3, 4, 5]);
        let placements: Vec<Vec<u64>> = (0..32).map(|s| ring.replicas(s, 3)).collect();
        let refs: Vec<&[u64]> = placements.iter().map(|p| p.as_slice()).collect();
        assert!(plan_rebalance(&view(&refs), 3).is_empty());
        // Skewed: everything on 1, 2, 3 while 4 and 5 hold a replica each.
        let mut skewed: Vec<&[u64]> = vec![&[1, 2, 3]; 31];
        skewed.push(&[3, 4, 5]);
        let moves = plan_rebalance(&view(&skewed), 3);
        assert!(moves.len() > 10, "{}", moves.len());
    }

    #[test]
    fn a_move_needs_a_majority_of_old_and_new_voters() {
        let m = Move { shard: 0, from: vec![1, 2, 3], to: vec![2, 3, 4] };
        assert_eq!(quorum_problem(&m, &BTreeSet::from([1, 2, 3, 4])), None);
        assert_eq!(quorum_problem(&m, &BTreeSet::from([1, 2, 4])), None);
        assert!(quorum_problem(&m, &BTreeSet::from([1, 4])).unwrap().contains("current voters"));
        assert!(quorum_problem(&m, &BTreeSet::from([1, 2])).unwrap().contains("new voters"));
    }
}
