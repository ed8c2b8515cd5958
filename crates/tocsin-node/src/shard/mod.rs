//! The shard layer (the data plane): Raft groups and their transport
//! ([`raft`], [`link`]), batching commands into entries ([`proposer`]),
//! following the applied log ([`events`]), the leader's fire loop
//! ([`leader`]) and delivery ([`delivery`]). It knows nothing of the
//! control plane or the API above it.
//!
//! This file is one shard as this node hosts it ([`ShardCtx`]): its Raft
//! group, its proposer, and whether (and under which epoch) this node leads
//! it.
//!
//! Leadership here is stricter than openraft's: a node *leads* a shard for
//! firing purposes only after its own `LeaderEpoch` entry is applied, and
//! may *dispatch* only while that is still true and its leader lease holds
//! ([`ShardCtx::may_dispatch`]). openraft does not step a leader down when it
//! loses its quorum, so the lease check guards every delivery batch; and a
//! node whose clock its peers see off by more than the allowed offset
//! dispatches nothing (see `clock.rs`).

pub mod delivery;
pub mod events;
pub mod leader;
pub mod link;
pub mod proposer;
pub mod quiet;
pub mod raft;
pub mod raft_timer;

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;
use std::time::Duration;

use openraft::Instant as _;
use openraft::ServerState;
use tocsin_core::ShardId;
use tocsin_store::GroupId;
use tocsin_store::NodeAddr;
use tocsin_store::Raft;
use tocsin_store::Store;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::config::NodeConfig;
use crate::shard::events::EventSink;
use crate::shard::proposer::Proposer;

/// How many recent fire lateness samples a shard keeps for its status.
pub const LATENESS_SAMPLES: usize = 2048;

/// Whether this node fires for a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// Not leading (or not yet: the epoch entry is not applied).
    Follower,
    /// Leading under this fencing epoch.
    Leading { epoch: u64 },
}

/// What every shard of a node shares.
#[derive(Clone)]
pub struct ShardEnv {
    pub store: Arc<Store>,
    pub config: Arc<NodeConfig>,
    pub clock: Arc<Clock>,
    /// The cluster's id, set once this node learns a bootstrapped map
    /// (`MapCache::cluster_id_cell`).
    pub cluster_id: Arc<std::sync::OnceLock<String>>,
    /// The node's per-namespace delivery waits, which creates are shed on.
    pub delivery_lag: Arc<crate::admission::DeliveryLag>,
}

/// Everything about one hosted shard.
pub struct ShardCtx {
    pub shard: ShardId,
    pub group: GroupId,
    pub node_id: u64,
    pub raft: Raft,
    pub proposer: Proposer,
    pub events: Arc<EventSink>,
    pub store: Arc<Store>,
    pub config: Arc<NodeConfig>,
    pub clock: Arc<Clock>,
    /// Where push attempts report how long they waited to be sent
    /// (`admission::DeliveryLag`).
    pub delivery_lag: Arc<crate::admission::DeliveryLag>,
    leadership: watch::Sender<Leadership>,
    /// Held while this node changes the shard's voter set, so changes to one
    /// shard's membership never overlap.
    pub membership_change: tokio::sync::Mutex<()>,
    /// Whether a move of this shard's replicas to the cluster map's target
    /// is running here (see `reconcile.rs`).
    pub moving: std::sync::atomic::AtomicBool,
    /// Why the last move failed ("" if it did not), and when to try again.
    pub move_error: std::sync::Mutex<(String, Option<std::time::Instant>)>,
    /// The latest fire lateness samples (at most [`LATENESS_SAMPLES`]), for
    /// `tocsin admin status`.
    lateness_ms: std::sync::Mutex<std::collections::VecDeque<u64>>,
    /// How long a quorum acknowledgement keeps the lease: openraft's own
    /// leader lease, the *maximum* election timeout, counted from when the
    /// acknowledged heartbeat was sent. A follower that took that heartbeat
    /// grants no vote for that long after it arrived (openraft's
    /// `Engine::timer_config.leader_lease`, the rule its `ensure_linearizable`
    /// reads by), and every quorum that could elect a successor holds such a
    /// follower, so no other leader exists before it runs out.
    lease: Duration,
    cluster_id: Arc<std::sync::OnceLock<String>>,
}

impl ShardCtx {
    pub fn new(
        shard: ShardId,
        node_id: u64,
        raft: Raft,
        proposer: Proposer,
        events: Arc<EventSink>,
        env: ShardEnv,
    ) -> ShardCtx {
        let ShardEnv { store, config, clock, cluster_id, delivery_lag } = env;
        let lease = Duration::from_millis(config.raft.election_timeout_max_ms);
        ShardCtx {
            shard,
            group: u64::from(shard),
            node_id,
            raft,
            proposer,
            events,
            store,
            config,
            clock,
            delivery_lag,
            leadership: watch::channel(Leadership::Follower).0,
            membership_change: tokio::sync::Mutex::new(()),
            moving: std::sync::atomic::AtomicBool::new(false),
            move_error: std::sync::Mutex::new((String::new(), None)),
            lateness_ms: std::sync::Mutex::new(std::collections::VecDeque::with_capacity(LATENESS_SAMPLES)),
            lease,
            cluster_id,
        }
    }

    /// The cluster's id, once this node has learned the map: every fire id
    /// and delivery carries it. `None` only on a node that has not seen a
    /// bootstrapped map yet.
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.get().map(String::as_str)
    }

    /// Records how late a fire of this shard was: how long after its fire
    /// time (`fire_at_ms`) a timer of `namespace` was fired, in the
    /// `tocsin_fire_lateness_seconds` histogram and the shard's samples.
    /// A webhook or AMQP timer is fired when its `Fire` is applied; a pull
    /// timer when it is offered to its topic's consumers.
    pub fn record_fire_lateness(&self, namespace: &str, fire_at_ms: u64) {
        let lateness_ms = self.clock.now_ms().saturating_sub(fire_at_ms);
        metrics::histogram!("tocsin_fire_lateness_seconds", "namespace" => crate::labels::namespace(namespace))
            .record(lateness_ms as f64 / 1000.0);
        let mut samples = self.lateness_ms.lock().expect("lateness lock");
        if samples.len() == LATENESS_SAMPLES {
            samples.pop_front();
        }
        samples.push_back(lateness_ms);
    }

    /// p99 of the latest fire lateness samples; 0 before any fire.
    pub fn lateness_ms_p99(&self) -> u64 {
        let mut v: Vec<u64> = self.lateness_ms.lock().expect("lateness lock").iter().copied().collect();
        if v.is_empty() {
            return 0;
        }
        v.sort_unstable();
        v[(v.len() - 1) * 99 / 100]
    }

    /// Why the last move of this shard's replicas failed, if it did.
    pub fn move_error(&self) -> String {
        self.move_error.lock().expect("move error lock").0.clone()
    }

    pub fn leadership(&self) -> Leadership {
        *self.leadership.borrow()
    }

    pub fn watch_leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.subscribe()
    }

    pub(crate) fn set_leadership(&self, value: Leadership) {
        self.leadership.send_replace(value);
    }

    /// The epoch this node fires under, if it leads the shard.
    pub fn epoch(&self) -> Option<u64> {
        match self.leadership() {
            Leadership::Leading { epoch } => Some(epoch),
            Leadership::Follower => None,
        }
    }

    /// Whether a delivery started under `epoch` may be sent now: this node
    /// still leads with that epoch, holds a valid lease, and its clock is
    /// not off.
    pub fn may_dispatch(&self, epoch: u64) -> bool {
        self.epoch() == Some(epoch) && self.lease_valid() && self.clock.is_safe()
    }

    /// openraft's view: leader, and a quorum acknowledged it within the
    /// lease (always true for a one-voter group).
    pub fn lease_valid(&self) -> bool {
        // Read in place: this runs before every send, and a clone copies
        // the whole membership.
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        if metrics.state != ServerState::Leader || metrics.current_leader != Some(self.node_id) {
            return false;
        }
        if metrics.membership_config.membership().voter_ids().nth(1).is_none() {
            return true;
        }
        metrics.last_quorum_acked.as_ref().is_some_and(|acked| acked.elapsed() < self.lease)
    }

    /// The current leader, as this node knows it.
    pub fn leader_hint(&self) -> Option<(u64, NodeAddr)> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let leader = metrics.current_leader?;
        let node = metrics.membership_config.membership().get_node(&leader).cloned()?;
        Some((leader, node))
    }

    /// Refuses, pointing at the leader, unless this node leads the shard by
    /// openraft's account. A write checks this before it is charged
    /// admission, so a request that ends up forwarded is charged only on
    /// the node that proposes it.
    pub fn check_leader(&self) -> Result<(), crate::shard::proposer::ProposeError> {
        let leads = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            m.state == ServerState::Leader && m.current_leader == Some(self.node_id)
        };
        if leads {
            return Ok(());
        }
        Err(crate::shard::proposer::ProposeError::NotLeader { leader: self.leader_hint() })
    }

    /// Asks a quorum whether this node still leads (a ReadIndex round).
    pub async fn confirm_leadership(&self) -> bool {
        self.raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex).await.is_ok()
    }
}
