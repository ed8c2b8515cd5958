//! Moving a Raft group's replicas (a shard's, or the metadata group's), and
//! the `ReplicaControl` service nodes use to ask one another for it.
//!
//! A change to group G's voters, as its leader carries it out
//! ([`set_voters`]), is:
//!
//! 1. each new node hosts an empty replica of G (`HostShard`);
//! 2. the leader adds it as a learner and waits until it has caught up,
//!    by snapshot where the log was purged (`add_learner`, blocking);
//! 3. one joint-consensus change makes the target set the voters
//!    (`change_membership`), keeping the voters left out as learners, and
//!    the committed result is checked;
//! 4. each node left out, once its own replica has learned that committed
//!    membership, drops its replica and data (`ReleaseShard`): it decides
//!    from its own committed membership, never from the caller's word, so
//!    a release that arrives late, after the node was added back, deletes
//!    nothing; then the leader removes those learners.
//!
//! Every step is idempotent, so an interrupted change (a leader killed
//! between the joint and the uniform entry) is completed by carrying out
//! the same target again. Changes to one group are serialized by its
//! `membership_change` lock. A leader that is itself left out hands its
//! leadership to a new voter first and answers with that leader as the
//! hint. Which target a shard gets is the cluster map's call
//! (`reconcile.rs` reads it at the metadata leader before every change).

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use openraft::ChangeMembers;
use openraft::async_runtime::WatchReceiver as _;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::replica_control_client::ReplicaControlClient;
use tocsin_store::GroupId;
use tocsin_store::NodeAddr;
use tocsin_store::Raft;
use tonic::transport::Channel;
use tonic::transport::Endpoint;

use crate::control::map::MetaCtx;
use crate::control::state::NodeState;
use crate::error::NodeError;
use crate::shard::ShardCtx;
use crate::shard::proposer::ProposeError;
use crate::shard::proposer::to_propose_error;

/// How long a new replica may take to catch up before the change gives up
/// (it is tried again; the learner keeps what it received).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(300);
/// Deadline of the small node-to-node calls (host, release).
const CONTROL_RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a leader that is left out waits for its handover.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a replica left out may take to learn the committed change (the
/// leader's wait for it to hold the entry, and its own wait for the commit).
const LEARN_TIMEOUT: Duration = Duration::from_secs(3);

/// A group whose voters change.
#[derive(Clone)]
pub enum Group {
    Shard(Arc<ShardCtx>),
    Meta(Arc<MetaCtx>),
}

impl Group {
    fn raft(&self) -> &Raft {
        match self {
            Group::Shard(ctx) => &ctx.raft,
            Group::Meta(ctx) => &ctx.raft,
        }
    }

    fn id(&self) -> GroupId {
        match self {
            Group::Shard(ctx) => ctx.group,
            Group::Meta(_) => tocsin_store::keys::META_GROUP,
        }
    }

    fn lock(&self) -> &tokio::sync::Mutex<()> {
        match self {
            Group::Shard(ctx) => &ctx.membership_change,
            Group::Meta(ctx) => &ctx.membership_change,
        }
    }

    fn name(&self) -> String {
        match self {
            Group::Shard(ctx) => format!("shard {}", ctx.shard),
            Group::Meta(_) => "the metadata group".into(),
        }
    }

    fn not_leader(&self) -> NodeError {
        match self {
            Group::Shard(ctx) => {
                NodeError::from_propose(ctx.shard, ProposeError::NotLeader { leader: ctx.leader_hint() })
            }
            Group::Meta(_) => NodeError::unavailable("this node does not lead the metadata group", 100),
        }
    }

    fn host_request(&self) -> pb::HostShardRequest {
        match self {
            Group::Shard(ctx) => pb::HostShardRequest { shard: ctx.shard, metadata: false },
            Group::Meta(_) => pb::HostShardRequest { shard: 0, metadata: true },
        }
    }

    fn release_request(&self, membership_index: u64) -> pb::ReleaseShardRequest {
        match self {
            Group::Shard(ctx) => pb::ReleaseShardRequest { shard: ctx.shard, metadata: false, membership_index },
            Group::Meta(_) => pb::ReleaseShardRequest { shard: 0, metadata: true, membership_index },
        }
    }

    fn raft_error(
        &self,
        what: &str,
        e: openraft::error::RaftError<
            tocsin_store::TypeConfig,
            openraft::error::ClientWriteError<tocsin_store::TypeConfig>,
        >,
    ) -> NodeError {
        match (self, to_propose_error(e)) {
            (
                Group::Shard(ctx),
                e @ (ProposeError::NotLeader { .. } | ProposeError::LeaseLapsed | ProposeError::Discarded { .. }),
            ) => NodeError::from_propose(ctx.shard, e),
            (_, other) => NodeError::unavailable(format!("{what} of {} failed: {other}", self.name()), 500),
        }
    }
}

/// What a finished change did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// False when the voters already were the target.
    pub changed: bool,
    /// Snapshot bytes sent to catch up the new replicas.
    pub bytes_streamed: u64,
}

/// A `ReplicaControl` client for `addr`, with `timeout` on every call.
pub async fn control_client(
    node: &NodeState,
    addr: &str,
    timeout: Duration,
) -> Result<ReplicaControlClient<Channel>, NodeError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| NodeError::invalid("grpc_addr", format!("{addr:?} is not an address: {e}")))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(timeout)
        .tcp_nodelay(true);
    let channel = match &node.peer_tls {
        // Connects on the first call, which fails as `unavailable` when
        // the peer cannot be reached or its certificate does not verify.
        Some(tls) => tls.channel(endpoint),
        None => {
            endpoint.connect().await.map_err(|e| NodeError::unavailable(format!("cannot reach {addr}: {e}"), 500))?
        }
    };
    Ok(ReplicaControlClient::new(channel))
}

fn is_leader(node: &NodeState, raft: &Raft) -> bool {
    let m = raft.metrics().borrow_watched().clone();
    m.state == openraft::ServerState::Leader && m.current_leader == Some(node.node_id)
}

/// The leader's side: makes `target` the voters of `group` (see the module
/// doc).
pub async fn set_voters(
    node: &Arc<NodeState>,
    group: &Group,
    target: BTreeMap<u64, NodeAddr>,
) -> Result<Changed, NodeError> {
    if target.is_empty() {
        return Err(NodeError::invalid("voters", "must name at least one node"));
    }
    if let Some((id, _)) = target.iter().find(|(id, a)| **id == 0 || a.grpc_addr.is_empty() || a.peer_addr.is_empty()) {
        return Err(NodeError::invalid("voters", format!("node {id} needs an id above 0, a grpc and a peer address")));
    }
    let raft = group.raft();
    let name = group.name();
    let _serial = group.lock().lock().await;
    if !is_leader(node, raft) {
        return Err(group.not_leader());
    }
    let want: BTreeSet<u64> = target.keys().copied().collect();
    let (current, joint, mut left_out) = {
        let m = raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let current = membership.voter_ids().collect::<BTreeSet<u64>>();
        // Where the replicas left out live: voters the change drops, and
        // learners an interrupted earlier change left behind.
        let left_out: BTreeMap<u64, NodeAddr> = membership
            .nodes()
            .map(|(id, _)| *id)
            .filter(|id| !want.contains(id))
            .map(|id| (id, membership.get_node(&id).cloned().unwrap_or_default()))
            .collect();
        (current, membership.get_joint_config().len() > 1, left_out)
    };
    if current == want && !joint && left_out.is_empty() {
        return Ok(Changed::default());
    }

    if !want.contains(&node.node_id)
        && let Some(to) =
            crate::control::balance::healthy_voters(raft, node.node_id).into_iter().find(|id| want.contains(id))
    {
        tracing::info!(group = %name, to, "left out of the new voter set: handing the leadership over first");
        let _ = raft.trigger().transfer_leader(to).await;
        let deadline = tokio::time::Instant::now() + HANDOVER_TIMEOUT;
        while is_leader(node, raft) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        return Err(group.not_leader());
    }

    let bytes_before = node.router.snapshot_bytes(group.id());
    for (id, addr) in target.iter().filter(|(id, _)| !current.contains(id)) {
        if *id != node.node_id {
            let mut client = control_client(node, &addr.peer_addr, CONTROL_RPC_TIMEOUT).await?;
            client.host_shard(group.host_request()).await.map_err(|s| {
                NodeError::unavailable(format!("node {id} could not host a replica of {name}: {}", s.message()), 500)
            })?;
            node.router.set_addr(*id, &addr.peer_addr);
        }
        tracing::info!(group = %name, node = id, "adding a learner and waiting for it to catch up");
        let deadline = tokio::time::Instant::now() + CATCH_UP_TIMEOUT;
        let too_slow = || {
            NodeError::unavailable(format!("node {id} did not catch up on {name} within {CATCH_UP_TIMEOUT:?}"), 1000)
        };
        // openraft's blocking add_learner counts a learner within
        // `replication_lag_threshold` entries (thousands) as caught up, so
        // it can return while a snapshot is still streaming: wait for the
        // learner to hold everything the log had once it was added.
        crate::shard::quiet::renew_lease(raft).await;
        match tokio::time::timeout_at(deadline, raft.add_learner(*id, addr.clone(), false)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(group.raft_error("adding a learner", e)),
            Err(_) => return Err(too_slow()),
        }
        let target = raft.metrics().borrow_watched().last_log_index.unwrap_or(0);
        let mut metrics = raft.metrics();
        loop {
            let (matched, leading) = {
                let m = metrics.borrow_watched();
                let matched = m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map_or(0, |l| l.index);
                (matched, m.state == openraft::ServerState::Leader)
            };
            if !leading {
                return Err(group.not_leader());
            }
            if matched >= target {
                break;
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(group.not_leader()),
                Err(_) => return Err(too_slow()),
            }
        }
    }

    if current != want || joint {
        tracing::info!(group = %name, from = ?current, to = ?want, "changing the voter set");
        // The voters left out stay on as learners, so that they learn the
        // committed change themselves before they are asked to drop their data.
        crate::shard::quiet::renew_lease(raft).await;
        raft.change_membership(ChangeMembers::ReplaceAllVoters(want.clone()), true)
            .await
            .map_err(|e| group.raft_error("the membership change", e))?;
    }
    let (after, committed, membership_index) = {
        let m = raft.metrics().borrow_watched().clone();
        let after: BTreeSet<u64> = m.membership_config.membership().voter_ids().collect();
        let uniform = m.membership_config.membership().get_joint_config().len() == 1;
        let index = m.membership_config.log_id().as_ref().map_or(0, |l| l.index);
        (after, uniform && m.committed_membership_config.log_id() == m.membership_config.log_id(), index)
    };
    if after != want || !committed {
        return Err(NodeError::Internal(format!(
            "{name}: the membership is {after:?} (committed: {committed}), not {want:?}; it will be tried again"
        )));
    }

    // The replicas left out drop their data once they hold the committed
    // change, then leave the membership. A node that is down keeps its copy
    // until it is decommissioned or wiped (its own reconcile loop releases it
    // when it sees the newer membership); it can no longer vote in this group.
    let self_left_out = left_out.remove(&node.node_id).is_some();
    let answering = crate::control::balance::answering_nodes(raft);
    for (id, addr) in &left_out {
        if !answering.contains(id) {
            tracing::info!(group = %name, node = id, "not releasing the left-out replica: its node does not answer");
            continue;
        }
        wait_matched(raft, *id, membership_index, LEARN_TIMEOUT).await;
        if let Err(e) = release_on(node, &addr.peer_addr, group.release_request(membership_index)).await {
            tracing::warn!(group = %name, node = id, error = %e, "could not release the left-out replica (node down?)");
        }
    }
    if !left_out.is_empty() {
        let gone: BTreeSet<u64> = left_out.keys().copied().collect();
        crate::shard::quiet::renew_lease(raft).await;
        raft.change_membership(ChangeMembers::RemoveNodes(gone), false)
            .await
            .map_err(|e| group.raft_error("removing the left-out learners", e))?;
    }
    let bytes_streamed = node.router.snapshot_bytes(group.id()).saturating_sub(bytes_before);
    if self_left_out {
        // This leader removed itself (no new voter could take over first).
        // Give the new voters a few heartbeats to learn that the change
        // committed, then drop the replica before answering.
        tokio::time::sleep(Duration::from_millis(4 * node.config.raft.heartbeat_ms)).await;
        drop(_serial);
        let released = match group {
            Group::Shard(ctx) => node.release_shard(ctx.shard).await,
            Group::Meta(_) => node.release_meta().await,
        };
        if let Err(e) = released {
            tracing::warn!(group = %name, error = %e, "releasing this node's own replica");
        }
    }
    Ok(Changed { changed: true, bytes_streamed })
}

/// Waits until `id`'s replica holds the log up to `index` (or `timeout`).
async fn wait_matched(raft: &Raft, id: u64, index: u64, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut metrics = raft.metrics();
    loop {
        let matched = {
            let m = metrics.borrow_watched();
            m.replication.as_ref().and_then(|r| r.get(&id).cloned().flatten()).map_or(0, |l| l.index)
        };
        if matched >= index {
            return;
        }
        if tokio::time::timeout_at(deadline, metrics.changed()).await.is_err() {
            return;
        }
    }
}

async fn release_on(node: &NodeState, addr: &str, request: pb::ReleaseShardRequest) -> Result<bool, NodeError> {
    if addr.is_empty() {
        return Err(NodeError::unavailable("no address known", 0));
    }
    let mut client = control_client(node, addr, CONTROL_RPC_TIMEOUT).await?;
    let resp = client.release_shard(request).await.map_err(|s| NodeError::unavailable(s.message(), 0))?;
    Ok(resp.into_inner().released)
}

/// Whether this node's replica of a group may be dropped: its own committed
/// membership, at least as new as `membership_index` (waited for up to
/// [`LEARN_TIMEOUT`]), does not count `node_id` as a voter.
pub(crate) async fn check_released(
    raft: &Raft,
    node_id: u64,
    membership_index: u64,
    what: &str,
) -> Result<(), tonic::Status> {
    let deadline = tokio::time::Instant::now() + LEARN_TIMEOUT;
    let mut metrics = raft.metrics();
    loop {
        let (index, voter) = {
            let m = metrics.borrow_watched();
            let committed = &m.committed_membership_config;
            let index = committed.log_id().as_ref().map_or(0, |l| l.index);
            (index, committed.membership().voter_ids().any(|id| id == node_id))
        };
        if index >= membership_index {
            if voter {
                return Err(tonic::Status::failed_precondition(format!(
                    "node {node_id} is a voter of {what} in its committed membership (log index {index})"
                )));
            }
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, metrics.changed()).await.is_err() {
            return Err(tonic::Status::unavailable(format!(
                "node {node_id} has not learned the membership of {what} at log index {membership_index} yet \
                 (it holds {index}); try again"
            )));
        }
    }
}
