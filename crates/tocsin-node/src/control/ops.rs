//! Cluster operations behind `tocsin admin`: add, remove and decommission a
//! node, move a shard's replica, rebalance.
//!
//! Each one reads the cluster map at the metadata leader, plans new targets
//! with `tocsin_core::cluster`'s planners, checks that every shard keeps a
//! quorum through its move, and commits the whole plan to the metadata
//! group as one compare-and-set [`MapChange`] (the map epoch rises by one;
//! a plan made against an older epoch is made again). The shards' leaders
//! then move the replicas (`reconcile.rs`); the operation follows them,
//! streaming progress, until the replicas are where the map says, and
//! records the node's new state (joining → active, draining → removed).
//!
//! Nothing depends on the operation's own task finishing: the map already
//! says where everything goes, so the leaders and the metadata leader
//! complete an interrupted operation by themselves, and running it again
//! plans only what is left and waits for the rest.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use tocsin_core::ShardId;
use tocsin_core::cluster::ClusterCommand;
use tocsin_core::cluster::ClusterMap;
use tocsin_core::cluster::ClusterOutcome;
use tocsin_core::cluster::MapChange;
use tocsin_core::cluster::MapError;
use tocsin_core::cluster::NewNode;
use tocsin_core::cluster::NodeStatus;
use tocsin_core::cluster::Plan;
use tocsin_proto::v1 as pb;
use tokio::sync::mpsc;
use tonic::Status;

use crate::control::state::NodeState;
use crate::control::view::ClusterView;
use crate::error::NodeError;

/// How long an operation waits for the replicas while none of them moves
/// into place; past it, it reports what is still moving and stops
/// following (the leaders keep at it).
const STALL_TIMEOUT: Duration = Duration::from_secs(300);
/// How often an operation looks at the cluster while it waits.
const POLL: Duration = Duration::from_millis(300);
/// Deadline of each node's answer when the view is gathered.
const VIEW_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a plan is made again when the map changed under it.
const PLAN_ATTEMPTS: usize = 5;
/// How long an operation on a cluster that just started waits for its
/// first map.
const BOOTSTRAP_WAIT: Duration = Duration::from_secs(20);
/// Progress messages buffered for a slow reader.
pub const PROGRESS_QUEUE: usize = 64;

/// One shard's planned change, from its current voters to its new target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub shard: ShardId,
    pub from: Vec<u64>,
    pub to: Vec<u64>,
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

/// The moves a plan makes, from the voters the view sees now (the map's
/// target where the view knows none).
fn moves(view: &ClusterView, map: &ClusterMap, plan: &Plan) -> Vec<Move> {
    plan.iter()
        .map(|(shard, to)| {
            let seen = view.shards.get(*shard as usize).map(|s| s.voters.clone()).unwrap_or_default();
            let from = if seen.is_empty() { map.replicas(*shard).to_vec() } else { seen };
            Move { shard: *shard, from, to: to.clone() }
        })
        .collect()
}

/// Streams progress to the admin client. A client that goes away does not
/// stop the operation: every step is safe to finish unobserved.
pub struct Reporter {
    tx: mpsc::Sender<Result<pb::Progress, Status>>,
    started: Instant,
    pub total: u32,
    pub done: u32,
    pub bytes: u64,
    pub map_epoch: u64,
}

impl Reporter {
    pub fn new(tx: mpsc::Sender<Result<pb::Progress, Status>>) -> Reporter {
        Reporter { tx, started: Instant::now(), total: 0, done: 0, bytes: 0, map_epoch: 0 }
    }

    fn eta_ms(&self) -> u64 {
        if self.done == 0 || self.done >= self.total {
            return 0;
        }
        let per_shard = self.started.elapsed().as_millis() as u64 / u64::from(self.done);
        per_shard * u64::from(self.total - self.done)
    }

    fn progress(&self, step: &str, message: String, done: bool) -> pb::Progress {
        pb::Progress {
            step: step.into(),
            shards_done: self.done,
            shards_total: self.total,
            bytes_streamed: self.bytes,
            eta_ms: if done { 0 } else { self.eta_ms() },
            message,
            done,
            map_epoch: self.map_epoch,
        }
    }

    pub async fn say(&self, step: &str, message: impl Into<String>) {
        let message = message.into();
        tracing::info!(step, "{message}");
        let _ = self.tx.send(Ok(self.progress(step, message, false))).await;
    }

    pub async fn finish(&self, message: impl Into<String>) {
        let message = message.into();
        tracing::info!("{message}");
        let _ = self.tx.send(Ok(self.progress("done", message, true))).await;
    }

    pub async fn fail(&self, error: NodeError) {
        tracing::warn!(error = %error, "cluster operation failed");
        let _ = self.tx.send(Err(error.into())).await;
    }
}

/// Plans against the latest map and commits the plan, planning again if the
/// map changed meanwhile. `plan` returns `None` when there is nothing to
/// change. Returns the map after the change.
async fn commit<F>(node: &Arc<NodeState>, rep: &mut Reporter, what: &str, plan: F) -> Result<ClusterMap, NodeError>
where
    F: Fn(&ClusterMap, &ClusterView) -> Result<Option<MapChange>, NodeError>,
{
    let mut attempts = 0;
    let bootstrap_deadline = Instant::now() + BOOTSTRAP_WAIT;
    while attempts < PLAN_ATTEMPTS {
        let map = crate::control::meta::read_latest(node).await?;
        rep.map_epoch = map.epoch;
        if !map.is_bootstrapped() {
            // A cluster that just started: its metadata leader writes the
            // first map within a moment.
            if Instant::now() > bootstrap_deadline {
                return Err(NodeError::unavailable(
                    format!("the cluster map is still not bootstrapped after {BOOTSTRAP_WAIT:?}; see the nodes' logs"),
                    1000,
                ));
            }
            tokio::time::sleep(POLL).await;
            continue;
        }
        attempts += 1;
        let view = crate::control::report::gather(node, VIEW_TIMEOUT).await;
        let Some(change) = plan(&map, &view)? else { return Ok(map) };
        match crate::control::meta::propose(node, ClusterCommand::Change(change)).await? {
            ClusterOutcome::Changed { epoch } => {
                rep.map_epoch = epoch;
                rep.say("map", format!("{what}: the cluster map is now at epoch {epoch}")).await;
                return crate::control::meta::read_latest(node).await;
            }
            ClusterOutcome::Unchanged { .. } => return Ok(map),
            ClusterOutcome::Refused { error: MapError::StaleEpoch { .. }, .. } => continue,
            ClusterOutcome::Refused { error, .. } => return Err(refusal(error)),
        }
    }
    Err(NodeError::unavailable(
        format!("the cluster map kept changing while planning ({PLAN_ATTEMPTS} attempts); run the command again"),
        1000,
    ))
}

fn refusal(error: MapError) -> NodeError {
    match error {
        MapError::IdRetired { .. } | MapError::IdTaken { .. } | MapError::AddressTaken { .. } => {
            NodeError::AlreadyExists(error.to_string())
        }
        other => NodeError::FailedPrecondition(other.to_string()),
    }
}

/// Refuses a plan any of whose moves would cost its shard a quorum.
fn check_quorum(view: &ClusterView, map: &ClusterMap, plan: &Plan) -> Result<(), NodeError> {
    for m in moves(view, map, plan) {
        if let Some(problem) = quorum_problem(&m, &view.reachable) {
            return Err(NodeError::FailedPrecondition(format!("refusing to start: {problem}")));
        }
    }
    Ok(())
}

/// Waits until every shard in `shards` has its replicas where the map
/// says (and `also` holds), streaming a line per shard as it lands and the
/// leaders' errors as they change. Gives up when nothing lands for
/// [`STALL_TIMEOUT`].
async fn converge(
    node: &Arc<NodeState>,
    rep: &mut Reporter,
    shards: &BTreeSet<ShardId>,
    also: impl Fn(&ClusterView) -> Option<String>,
) -> Result<(), NodeError> {
    rep.total = shards.len() as u32;
    rep.done = 0;
    let mut landed: BTreeSet<ShardId> = BTreeSet::new();
    let mut errors: BTreeMap<ShardId, String> = BTreeMap::new();
    let mut bytes_before: Option<BTreeMap<ShardId, u64>> = None;
    let mut last_progress = Instant::now();
    let mut waiting_on = String::new();
    loop {
        let map = node.map.get();
        let view = crate::control::report::gather(node, VIEW_TIMEOUT).await;
        let before = bytes_before.get_or_insert_with(|| {
            shards.iter().map(|s| (*s, view.shards.get(*s as usize).map_or(0, |v| v.snapshot_bytes))).collect()
        });
        rep.bytes = shards
            .iter()
            .map(|s| {
                let now = view.shards.get(*s as usize).map_or(0, |v| v.snapshot_bytes);
                now.saturating_sub(before.get(s).copied().unwrap_or(0))
            })
            .sum();
        for shard in shards {
            let target = map.replicas(*shard);
            if !landed.contains(shard) && view.in_place(*shard, target) {
                landed.insert(*shard);
                rep.done = landed.len() as u32;
                last_progress = Instant::now();
                rep.say("moved", format!("shard {shard} is on {target:?}")).await;
            }
            let error = view.shards.get(*shard as usize).map(|s| s.move_error.clone()).unwrap_or_default();
            if !landed.contains(shard) && !error.is_empty() && errors.get(shard) != Some(&error) {
                rep.say("waiting", format!("shard {shard}: the leader's last attempt failed: {error}")).await;
                errors.insert(*shard, error);
            }
        }
        let pending = also(&view);
        if landed.len() == shards.len() {
            match &pending {
                None => return Ok(()),
                Some(what) if *what != waiting_on => {
                    rep.say("waiting", what.clone()).await;
                    waiting_on = what.clone();
                }
                Some(_) => {}
            }
        }
        if last_progress.elapsed() > STALL_TIMEOUT {
            let left: Vec<ShardId> = shards.iter().copied().filter(|s| !landed.contains(s)).collect();
            let mut message = format!(
                "no replica moved into place for {STALL_TIMEOUT:?}; still moving: shards {left:?}. The leaders keep trying; run the command again to follow them, or see `tocsin admin status`"
            );
            if let Some(what) = pending {
                message.push_str(&format!("; also {what}"));
            }
            return Err(NodeError::unavailable(message, 1000));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Records `status` for `id` unless the metadata leader did it already.
async fn set_status(node: &Arc<NodeState>, rep: &mut Reporter, id: u64, status: NodeStatus) -> Result<(), NodeError> {
    commit(node, rep, &format!("node {id} is {}", status.name()), |map, _| {
        Ok((map.status(id) != Some(status)).then(|| MapChange {
            expected_epoch: map.epoch,
            status: vec![(id, status)],
            ..Default::default()
        }))
    })
    .await
    .map(|_| ())
}

/// `node add`: the new node joins the shards the ring gives it, is marked
/// active once they are in place, and the balancer moves some leaderships
/// to it.
pub async fn add_node(node: Arc<NodeState>, addrs: NewAddrs, mut rep: Reporter) {
    if let Err(e) = add_node_steps(&node, addrs, &mut rep).await {
        rep.fail(e).await;
    }
}

/// A node to add, as the operator names it: its client gRPC address, and
/// optionally its HTTP and peer addresses (empty: what the node reports).
pub struct NewAddrs {
    pub grpc_addr: String,
    pub http_addr: String,
    pub peer_addr: String,
}

async fn add_node_steps(node: &Arc<NodeState>, addrs: NewAddrs, rep: &mut Reporter) -> Result<(), NodeError> {
    let NewAddrs { grpc_addr, http_addr, peer_addr: given_peer } = addrs;
    // A node the map already names (a re-run of an interrupted add) holds
    // the map and checks tokens on its client port: ask it on its peer
    // port. A new node knows no cluster yet and answers reads anywhere.
    let known_peer = node
        .map
        .get()
        .nodes
        .values()
        .find(|n| n.grpc_addr == grpc_addr && !n.peer_addr.is_empty())
        .map(|n| n.peer_addr.clone())
        .or_else(|| (!given_peer.is_empty()).then(|| given_peer.clone()));
    let info = match &known_peer {
        Some(peer) => fetch_info(node, peer).await?,
        None => fetch_info_at(node, Port::Client(&grpc_addr), 0).await?,
    };
    let new = info.node_id;
    if info.num_shards != node.config.num_shards {
        return Err(NodeError::FailedPrecondition(format!(
            "node {new} at {grpc_addr} has {} shards, the cluster {}; start it with --shards {}",
            info.num_shards, node.config.num_shards, node.config.num_shards
        )));
    }
    let http_addr = if http_addr.is_empty() {
        info.nodes.iter().find(|n| n.node_id == new).map(|n| n.http_addr.clone()).unwrap_or_default()
    } else {
        http_addr
    };
    // Its peer address is its own word (the operator's, if given, is where
    // it was asked, and must be the same).
    let peer_addr = info.nodes.iter().find(|n| n.node_id == new).map(|n| n.peer_addr.clone()).unwrap_or_default();
    if !given_peer.is_empty() {
        let own_grpc = info.nodes.iter().find(|n| n.node_id == new).map(|n| n.grpc_addr.as_str()).unwrap_or("");
        if (!peer_addr.is_empty() && given_peer != peer_addr) || own_grpc != grpc_addr {
            return Err(NodeError::invalid(
                "peer_addr",
                format!(
                    "the node at peer address {given_peer} is node {new} with client address {own_grpc:?} \
                     and peer address {peer_addr:?}, not the node at {grpc_addr}"
                ),
            ));
        }
    }
    if peer_addr.is_empty() {
        return Err(NodeError::FailedPrecondition(format!(
            "node {new} at {grpc_addr} did not say where its peer port is (a build from before the peer port?)"
        )));
    }
    let hosts: Vec<u32> = info.shards.iter().map(|s| s.shard).collect();
    // The plan's quorum check asks every node it knows on its peer port:
    // the newcomer must be one of them, or a shard moving to it alone (a
    // one-replica cluster growing) is refused as having no quorum.
    node.router.set_addr(new, &peer_addr);
    let newcomer = NewNode { id: new, grpc_addr: grpc_addr.clone(), http_addr, peer_addr };
    let mut planned = 0usize;
    let map = commit(node, rep, &format!("adding node {new}"), |map, view| {
        match map.status(new) {
            None if !hosts.is_empty() => {
                return Err(NodeError::FailedPrecondition(format!(
                    "node {new} at {grpc_addr} already hosts shards {hosts:?} of some cluster; start it with --join on an empty data directory"
                )));
            }
            Some(NodeStatus::Removed) => {
                return Err(refusal(MapError::IdRetired { id: new, epoch: map.nodes[&new].since_epoch }));
            }
            Some(NodeStatus::Draining) => {
                return Err(NodeError::FailedPrecondition(format!(
                    "node {new} is draining; finish its removal with `tocsin admin node remove {new}` first"
                )));
            }
            _ => {}
        }
        let plan = tocsin_core::cluster::plan_add(map, new);
        check_quorum(view, map, &plan)?;
        let known = map
            .nodes
            .get(&new)
            .is_some_and(|n| n.grpc_addr == newcomer.grpc_addr && n.peer_addr == newcomer.peer_addr);
        if known && plan.is_empty() {
            return Ok(None);
        }
        Ok(Some(MapChange {
            expected_epoch: map.epoch,
            add: vec![newcomer.clone()],
            placements: plan,
            ..Default::default()
        }))
    })
    .await?;
    let shards: BTreeSet<ShardId> = map.shards_on(new).into_iter().collect();
    if map.status(new) == Some(NodeStatus::Joining) {
        planned = shards.len();
    }
    rep.say("plan", format!("node {new} at {grpc_addr} holds a replica of {} shards by the map", shards.len())).await;
    converge(node, rep, &shards, |_| None).await?;
    set_status(node, rep, new, NodeStatus::Active).await?;
    rep.say("leaders", "waiting for the balancer to hand leaderships to the new node").await;
    let led = wait_for_leaders(node, new, Duration::from_secs(15)).await;
    rep.finish(format!(
        "node {new} added: it holds a replica of {} shards ({planned} placed by this run, {} snapshot bytes streamed) and leads {led}; map epoch {}",
        shards.len(),
        rep.bytes,
        rep.map_epoch
    ))
    .await;
    Ok(())
}

/// `node remove` (drain a live node) and `node decommission` (replace a dead
/// node's replicas): both leave the node holding nothing, then mark it
/// removed.
pub async fn remove_node(node: Arc<NodeState>, gone: u64, dead: bool, mut rep: Reporter) {
    if let Err(e) = remove_node_steps(&node, gone, dead, &mut rep).await {
        rep.fail(e).await;
    }
}

async fn remove_node_steps(node: &Arc<NodeState>, gone: u64, dead: bool, rep: &mut Reporter) -> Result<(), NodeError> {
    let verb = if dead { "decommission" } else { "remove" };
    let map = commit(node, rep, &format!("draining node {gone}"), |map, view| {
        match map.status(gone) {
            None => return Err(NodeError::NotFound(format!("node {gone} is not in the cluster map"))),
            Some(NodeStatus::Removed) | Some(NodeStatus::Draining) => return Ok(None),
            Some(_) => {}
        }
        if map.eligible().len() == 1 {
            return Err(NodeError::FailedPrecondition(format!(
                "node {gone} is the last node: removing it would lose every shard"
            )));
        }
        if !dead && !view.reachable.contains(&gone) {
            return Err(NodeError::FailedPrecondition(format!(
                "node {gone} does not answer; to replace a dead node's replicas run `tocsin admin node decommission {gone}`"
            )));
        }
        let plan = tocsin_core::cluster::plan_remove(map, gone);
        check_quorum(view, map, &plan)?;
        Ok(Some(MapChange {
            expected_epoch: map.epoch,
            status: vec![(gone, NodeStatus::Draining)],
            placements: plan,
            ..Default::default()
        }))
    })
    .await?;
    if map.status(gone) == Some(NodeStatus::Removed) {
        rep.finish(format!(
            "node {gone} was removed at map epoch {}; it holds no replica: nothing to {verb}",
            map.nodes[&gone].since_epoch
        ))
        .await;
        return Ok(());
    }
    // Every shard the node still holds moves; so does the metadata group.
    let view = crate::control::report::gather(node, VIEW_TIMEOUT).await;
    let shards: BTreeSet<ShardId> = (0..map.num_shards)
        .filter(|s| {
            let v = &view.shards[*s as usize];
            v.voters.contains(&gone) || v.learners.contains(&gone) || !view.in_place(*s, map.replicas(*s))
        })
        .collect();
    rep.say("plan", format!("moving {} shards' replicas off node {gone}", shards.len())).await;
    converge(node, rep, &shards, |view| {
        if view.holds_any(gone) {
            return Some(format!("node {gone} still holds a replica"));
        }
        let meta = node.meta_status();
        meta.voters.contains(&gone).then(|| format!("node {gone} is still a voter of the metadata group"))
    })
    .await?;
    set_status(node, rep, gone, NodeStatus::Removed).await?;
    if !dead {
        sweep(node, gone).await;
    }
    rep.finish(format!(
        "node {gone} {}: it holds no replica and can be stopped; its id is never reused; map epoch {}",
        if dead { "decommissioned" } else { "drained and removed" },
        rep.map_epoch
    ))
    .await;
    Ok(())
}

/// `shard move`: one replica of one shard from one node to another.
pub async fn move_shard(node: Arc<NodeState>, shard: ShardId, from: u64, to: u64, mut rep: Reporter) {
    let steps = async {
        let map = commit(&node, &mut rep, &format!("moving shard {shard}"), |map, view| {
            let Some(planned) = tocsin_core::cluster::plan_move(map, shard, from, to).map_err(|e| match e {
                MapError::UnknownNode(n) => {
                    NodeError::invalid("to_node", format!("node {n} is not known; add it with `tocsin admin node add`"))
                }
                other => NodeError::FailedPrecondition(other.to_string()),
            })?
            else {
                return Ok(None);
            };
            let plan = vec![planned];
            check_quorum(view, map, &plan)?;
            Ok(Some(MapChange { expected_epoch: map.epoch, placements: plan, ..Default::default() }))
        })
        .await?;
        converge(&node, &mut rep, &BTreeSet::from([shard]), |_| None).await?;
        Ok::<_, NodeError>(map)
    };
    match steps.await {
        Ok(map) => rep.finish(format!("shard {shard} is on {:?}; map epoch {}", map.replicas(shard), map.epoch)).await,
        Err(e) => rep.fail(e).await,
    }
}

/// `rebalance`: every shard onto the ring's placement over the nodes; the
/// balancer evens out leaderships afterwards.
pub async fn rebalance(node: Arc<NodeState>, dry_run: bool, mut rep: Reporter) {
    if dry_run {
        let result = crate::control::meta::read_latest(&node).await;
        let map = match result {
            Ok(map) => map,
            Err(e) => return rep.fail(e).await,
        };
        let plan = tocsin_core::cluster::plan_rebalance(&map);
        rep.total = plan.len() as u32;
        rep.map_epoch = map.epoch;
        for (shard, to) in &plan {
            rep.say("plan", format!("shard {shard}: {:?} -> {to:?}", map.replicas(*shard))).await;
        }
        let view = crate::control::report::gather(&node, VIEW_TIMEOUT).await;
        return rep.finish(format!("rebalance would move {} shards; {}", plan.len(), leader_counts(&view))).await;
    }
    let mut planned = 0usize;
    let steps = async {
        let map = commit(&node, &mut rep, "rebalancing", |map, view| {
            let plan = tocsin_core::cluster::plan_rebalance(map);
            if plan.is_empty() {
                return Ok(None);
            }
            check_quorum(view, map, &plan)?;
            Ok(Some(MapChange { expected_epoch: map.epoch, placements: plan, ..Default::default() }))
        })
        .await?;
        // Whatever this or an earlier run changed and is not in place yet.
        let view = crate::control::report::gather(&node, VIEW_TIMEOUT).await;
        let shards: BTreeSet<ShardId> = (0..map.num_shards).filter(|s| !view.in_place(*s, map.replicas(*s))).collect();
        planned = shards.len();
        converge(&node, &mut rep, &shards, |_| None).await?;
        Ok::<_, NodeError>(())
    };
    match steps.await {
        Ok(()) => {
            let view = crate::control::report::gather(&node, VIEW_TIMEOUT).await;
            rep.finish(format!("rebalanced {planned} shards; {}; map epoch {}", leader_counts(&view), rep.map_epoch))
                .await
        }
        Err(e) => rep.fail(e).await,
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
        let view = crate::control::report::gather(node, VIEW_TIMEOUT).await;
        let led = view.shards.iter().filter(|s| s.leader == id).count();
        if led > 0 || tokio::time::Instant::now() > deadline {
            return led;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Releases whatever replicas `gone` still hosts although it is a voter of
/// none (what a removal interrupted between a membership change and the
/// release leaves behind), then makes sure it knows the map removing it.
async fn sweep(node: &Arc<NodeState>, gone: u64) {
    let map = node.map.get();
    let Some(addr) = map.nodes.get(&gone).map(|n| n.peer_addr.clone()) else { return };
    let Ok(info) = fetch_info(node, &addr).await else { return };
    let Ok(mut client) = crate::control::replicas::control_client(node, &addr, Duration::from_secs(10)).await else {
        return;
    };
    for s in info.shards {
        let voters = map.replicas(s.shard).to_vec();
        if voters.is_empty() || voters.contains(&gone) {
            continue;
        }
        // The node releases only what its own committed membership no longer
        // counts it a voter of.
        let req = pb::ReleaseShardRequest { shard: s.shard, metadata: false, membership_index: 0 };
        if let Err(e) = client.release_shard(req).await {
            tracing::warn!(shard = s.shard, node = gone, error = %e.message(), "sweeping a left-over replica");
        }
    }
    if info.metadata.is_some_and(|m| m.hosted && !m.voters.contains(&gone)) {
        let req = pb::ReleaseShardRequest { shard: 0, metadata: true, membership_index: 0 };
        if let Err(e) = client.release_shard(req).await {
            tracing::warn!(node = gone, error = %e.message(), "sweeping a left-over metadata replica");
        }
    }
    // The removed node hosts no metadata replica any more, so it learns of
    // its removal on its next map refresh; until then it would answer
    // clients with the map before it. Tell it the epoch and wait until it
    // has it, so that once `node remove` says done, every node says so.
    let deadline = tokio::time::Instant::now() + TELL_REMOVED_NODE;
    while tokio::time::Instant::now() < deadline {
        match fetch_info_at(node, Port::Peer(&addr), map.epoch).await {
            Ok(info) if info.map_epoch >= map.epoch => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => return, // gone already: nothing serves its stale map
        }
    }
    tracing::warn!(node = gone, epoch = map.epoch, "the removed node did not learn its removal in time");
}

/// How long `node remove` waits for the removed node to learn the map that
/// removed it.
const TELL_REMOVED_NODE: Duration = Duration::from_secs(5);

/// Which of a node's ports a call goes to.
#[derive(Clone, Copy)]
enum Port<'a> {
    /// Its peer port (through mTLS when that is on).
    Peer(&'a str),
    /// Its client port: only a new node's, which knows no cluster yet.
    Client(&'a str),
}

/// A node's view of itself and its cluster, asked on its peer port.
async fn fetch_info(node: &NodeState, peer_addr: &str) -> Result<pb::ClusterInfo, NodeError> {
    fetch_info_at(node, Port::Peer(peer_addr), 0).await
}

/// [`fetch_info`] on `port`, telling the node the map epoch `epoch` exists
/// (0: none).
async fn fetch_info_at(node: &NodeState, port: Port<'_>, epoch: u64) -> Result<pb::ClusterInfo, NodeError> {
    use tocsin_proto::v1::admin_service_client::AdminServiceClient;
    let (Port::Peer(grpc_addr) | Port::Client(grpc_addr)) = port;
    let unreachable = |e: String| NodeError::unavailable(format!("cannot reach the node at {grpc_addr}: {e}"), 1000);
    tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))
        .map_err(|e| NodeError::invalid("grpc_addr", format!("{grpc_addr:?} is not host:port: {e}")))?;
    let channel = match port {
        Port::Peer(addr) => node.forwarder.channel(addr),
        Port::Client(addr) => node.forwarder.client_port_channel(addr),
    }
    .ok_or_else(|| unreachable("bad address".into()))?;
    let mut admin = AdminServiceClient::new(channel);
    let mut request = tonic::Request::new(pb::GetClusterRequest { digests: false });
    if epoch > 0 {
        request.metadata_mut().insert(tocsin_contract::headers::MAP_EPOCH, epoch.into());
    }
    let call = admin.get_cluster(request);
    let info = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .map_err(|_| unreachable("no answer within 5s".into()))?
        .map_err(|s| unreachable(s.message().to_string()))?;
    Ok(info.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_needs_a_majority_of_old_and_new_voters() {
        let m = Move { shard: 0, from: vec![1, 2, 3], to: vec![2, 3, 4] };
        assert_eq!(quorum_problem(&m, &BTreeSet::from([1, 2, 3, 4])), None);
        assert_eq!(quorum_problem(&m, &BTreeSet::from([1, 2, 4])), None);
        assert!(quorum_problem(&m, &BTreeSet::from([1, 4])).unwrap().contains("current voters"));
        assert!(quorum_problem(&m, &BTreeSet::from([1, 2])).unwrap().contains("new voters"));
    }
}
