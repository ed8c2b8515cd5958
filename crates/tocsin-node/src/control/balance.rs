//! Keeps shard leaderships spread evenly over the nodes.
//!
//! Every node computes the same preferred leader per shard
//! (`tocsin_core::routing::spread_leaders` over the cluster map's targets,
//! leaving out nodes the map has as joining or draining, so a draining
//! node sheds its leaderships first): the same on every node that has the
//! same map. A shard whose replicas are moving is left alone until they
//! are in place, and a node keeps a leadership it just took for
//! [`SETTLE`]: when nodes briefly disagree (one has a newer map than
//! another), a shard moves once, not back and forth.
//! A node leading a shard whose preferred leader is another healthy, caught
//! up voter hands the leadership over, a few shards per round and each not
//! more often than the cooldown allows, so a node that restarts gets its
//! share back once it has caught up, and nothing flaps.
//!
//! Handing over is also how a node shuts down gracefully:
//! [`hand_over_all`] moves every leadership it holds to the best other
//! voter before the process exits, so a rolling restart costs no election
//! timeout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use openraft::async_runtime::WatchReceiver as _;
use tocsin_core::ShardId;
use tocsin_core::cluster::NodeStatus;
use tocsin_store::Raft;

use crate::control::state::NodeState;

/// How long after a leadership change a shard is left alone.
const COOLDOWN: Duration = Duration::from_secs(10);
/// How long a node keeps a leadership it took before handing it to the
/// preferred node.
const SETTLE: Duration = Duration::from_secs(3);
/// How far behind (in entries) a voter may be and still take leadership.
const MAX_LAG: u64 = 64;
/// How often the balancer looks, and how many leaderships it moves per
/// look. A handover costs the shard one epoch entry and a wheel rebuild on
/// the new leader (milliseconds), so a fresh cluster, where the first node
/// up wins most elections, is spread within a few seconds; a small batch
/// keeps the rebuilds from landing on the nodes all at once.
const ROUND: Duration = Duration::from_secs(1);
const MOVES_PER_ROUND: usize = 3;
/// How often the health watch looks at the clock and the disk: a clock
/// found off hands leaderships over within this. A quarter second, on the
/// lines the gRPC health report and the quiet lag probes wake on: at 50 ms
/// it was 20 wake-ups a second of an idle node's work runtime, and nothing
/// waits on it to stay safe (the fire loops and delivery ask the clock
/// themselves before every fire; the disk check runs once a second).
const HEALTH_EVERY: Duration = Duration::from_millis(250);

/// Voters of a group this node leads (other than itself) that
/// acknowledged a heartbeat recently and whose log matches this leader's to
/// within [`MAX_LAG`] entries.
pub fn healthy_voters(raft: &Raft, node_id: u64) -> Vec<u64> {
    let m = raft.metrics().borrow_watched().clone();
    let last = m.last_log_index.unwrap_or(0);
    let Some(replication) = m.replication.as_ref() else { return Vec::new() };
    let heartbeats = m.heartbeat.clone().unwrap_or_default();
    m.membership_config
        .membership()
        .voter_ids()
        .filter(|id| *id != node_id)
        .filter(|id| {
            let matched = replication.get(id).cloned().flatten().map_or(0, |l| l.index);
            let fresh = heartbeats
                .get(id)
                .cloned()
                .flatten()
                .is_some_and(|t| openraft::Instant::elapsed(&t.into_inner()) < Duration::from_secs(1));
            fresh && matched + MAX_LAG >= last
        })
        .collect()
}

/// Nodes (voters or learners) of a group this node leads that acknowledged
/// a heartbeat in the last second.
pub fn answering_nodes(raft: &Raft) -> std::collections::BTreeSet<u64> {
    let m = raft.metrics().borrow_watched().clone();
    let heartbeats = m.heartbeat.clone().unwrap_or_default();
    heartbeats
        .iter()
        .filter(|(_, t)| {
            t.as_ref().is_some_and(|t| openraft::Instant::elapsed(&(*t).into_inner()) < Duration::from_secs(1))
        })
        .map(|(id, _)| *id)
        .collect()
}

/// Runs the balancer until the node stops.
pub async fn run(node: Arc<NodeState>) {
    let mut last_move: BTreeMap<ShardId, Instant> = BTreeMap::new();
    let mut leading_since: BTreeMap<ShardId, Instant> = BTreeMap::new();
    loop {
        crate::grid::sleep_to_next_line(ROUND).await;
        if node.shutting_down() {
            return;
        }
        // Voter sets of the shards this node does not host come from the
        // other nodes (the view `reconcile.rs` refreshes); only needed once
        // the cluster has more nodes than replicas.
        let remote: Option<Vec<Vec<u64>>> = node
            .remote_view
            .read()
            .expect("view lock")
            .as_ref()
            .map(|view| view.shards.iter().map(|s| s.voters.clone()).collect());
        let preferred = preferred_leaders(&node, remote.as_deref());
        let map = node.map.get();
        let mut moves = 0;
        let shards = node.shards.all();
        leading_since.retain(|shard, _| shards.iter().any(|c| c.shard == *shard && c.epoch().is_some()));
        for ctx in shards {
            if ctx.epoch().is_none() {
                continue;
            }
            let since = *leading_since.entry(ctx.shard).or_insert_with(Instant::now);
            let Some(&Some(want)) = preferred.get(ctx.shard as usize) else { continue };
            if want == node.node_id
                || since.elapsed() < SETTLE
                || last_move.get(&ctx.shard).is_some_and(|t| t.elapsed() < COOLDOWN)
            {
                continue;
            }
            let moving = map.is_bootstrapped() && {
                let mut voters: Vec<u64> =
                    ctx.raft.metrics().borrow_watched().membership_config.membership().voter_ids().collect();
                voters.sort_unstable();
                voters != map.replicas(ctx.shard)
            };
            if moving {
                continue;
            }
            if !healthy_voters(&ctx.raft, ctx.node_id).contains(&want) {
                continue;
            }
            if let Some(why) = unfit_to_lead(&node, want) {
                // It would hand the leadership straight back (seen in the chaos
                // `disk-full-leader` row: the same shards went to a full node
                // and back every 5-10 s).
                tracing::debug!(shard = ctx.shard, to = want, why, "not handing leadership to the preferred node");
                continue;
            }
            tracing::info!(shard = ctx.shard, to = want, "handing leadership to the preferred node");
            last_move.insert(ctx.shard, Instant::now());
            let _ = ctx.raft.trigger().transfer_leader(want).await;
            moves += 1;
            if moves == MOVES_PER_ROUND {
                break;
            }
        }
    }
}

/// Why `peer` should not be handed a leadership, if it should not: it would
/// hand it straight back. Both signals come from the peer's Raft replies:
/// its clock offset (`clock.rs`: it would not fire) and its free disk
/// (`RaftReply.low_disk`: it refuses creates).
pub fn unfit_to_lead(node: &NodeState, peer: u64) -> Option<&'static str> {
    if node.clock.peer_is_off(peer) {
        Some("its clock is off from this node's")
    } else if node.router.peer_low_disk(peer) {
        Some("its free disk is low")
    } else {
        None
    }
}

/// Where a node that must give up a leadership hands it: the first voter
/// `fit` to lead, else the first voter (if every node is unfit, someone must
/// still lead).
pub fn handover_target(voters: &[u64], fit: impl Fn(u64) -> bool) -> Option<u64> {
    voters.iter().copied().find(|v| fit(*v)).or(voters.first().copied())
}

/// The preferred leader of each shard, spread over the map's targets (the
/// voter sets before the map is bootstrapped): the same on every node that
/// has the same map.
fn preferred_leaders(node: &NodeState, remote: Option<&[Vec<u64>]>) -> Vec<Option<u64>> {
    let map = node.map.get();
    let active = |id: &u64| !map.is_bootstrapped() || map.status(*id) == Some(NodeStatus::Active);
    let placements: Vec<Vec<u64>> = (0..node.config.num_shards)
        .map(|shard| {
            let voters: Vec<u64> = match node.shards.get(shard) {
                _ if map.is_bootstrapped() => map.replicas(shard).to_vec(),
                Some(ctx) => {
                    let m = ctx.raft.metrics().borrow_watched().clone();
                    m.membership_config.membership().voter_ids().collect()
                }
                None => remote.and_then(|r| r.get(shard as usize).cloned()).unwrap_or_default(),
            };
            // Leaders go to active nodes; a shard all of whose voters are
            // joining or draining keeps them all as candidates.
            let preferred: Vec<u64> = voters.iter().copied().filter(active).collect();
            if preferred.is_empty() { voters } else { preferred }
        })
        .collect();
    tocsin_core::routing::spread_leaders(&placements)
}

/// Moves every leadership this node holds to a healthy voter, waiting up to
/// `timeout` in all; used before a graceful shutdown.
pub async fn hand_over_all(node: &NodeState, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut leading: Vec<Raft> =
        node.shards.all().into_iter().filter(|c| c.epoch().is_some()).map(|c| c.raft.clone()).collect();
    // The metadata group too: cluster operations need not wait out an
    // election either.
    leading.extend(node.meta().filter(|m| m.is_leader()).map(|m| m.raft.clone()));
    for raft in &leading {
        if let Some(to) = healthy_voters(raft, node.node_id).first() {
            let _ = raft.trigger().transfer_leader(*to).await;
        }
    }
    for raft in leading {
        while raft.metrics().borrow_watched().current_leader == Some(node.node_id)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Keeps a node that should not lead out of leadership:
/// - one whose clock is off (see `clock.rs`): while its peers see its wall
///   clock off by more than `max_clock_offset_ms`, it fires nothing (the fire
///   loops and delivery ask the clock themselves), hands over every
///   leadership it holds, and does not campaign;
/// - one whose free disk is below the watermark: it refuses creates, so it
///   hands its leaderships to replicas that can take them (it still
///   campaigns: if every node is short of disk, someone must lead).
///
/// Also exports the clock's metrics.
pub async fn watch_health(node: Arc<NodeState>) {
    let mut was_unsafe = false;
    let mut last_handover: BTreeMap<u64, Instant> = BTreeMap::new();
    loop {
        // On the node's grid: the one-second control rounds fall on these
        // lines too (`crate::grid`).
        crate::grid::sleep_to_next_line(HEALTH_EVERY).await;
        if node.shutting_down() {
            return;
        }
        let status = node.clock.status();
        if let Some(offset_ms) = node.clock.median_offset_ms() {
            metrics::gauge!("tocsin_clock_offset_seconds").set(offset_ms as f64 / 1000.0);
        }
        for (peer, offset_ms) in node.clock.peer_offsets_ms() {
            metrics::gauge!("tocsin_clock_peer_offset_seconds", "peer" => peer.to_string())
                .set(offset_ms as f64 / 1000.0);
        }
        let jumped = matches!(status, crate::clock::ClockStatus::Jumped { .. });
        metrics::gauge!("tocsin_clock_jumped").set(if jumped { 1.0 } else { 0.0 });
        let is_unsafe = matches!(status, crate::clock::ClockStatus::Unsafe { .. });
        metrics::gauge!("tocsin_clock_unsafe").set(if is_unsafe { 1.0 } else { 0.0 });
        if is_unsafe != was_unsafe {
            if is_unsafe {
                tracing::error!(
                    ?status,
                    "this node's clock is off from its peers: no firing, handing leaderships over"
                );
            } else {
                tracing::warn!("this node's clock agrees with its peers again: firing and campaigning resume");
            }
            was_unsafe = is_unsafe;
        }
        let disk_low = node.admission.disk_low();
        // Not campaigning while off: every group's timer asks
        // (`shard::raft_timer`).
        node.campaigning.set(!is_unsafe);
        let groups = node.groups.all();
        for (group, raft) in &groups {
            if !(is_unsafe || disk_low) || raft.metrics().borrow_watched().current_leader != Some(node.node_id) {
                continue;
            }
            // A disk-low node whose peers are short of disk too would get the
            // leadership back: not more often than this.
            let cooldown = if is_unsafe { Duration::from_millis(500) } else { Duration::from_secs(5) };
            if last_handover.get(group).is_some_and(|t| t.elapsed() < cooldown) {
                continue;
            }
            // A voter that is unfit itself would only hand it back.
            let voters = healthy_voters(raft, node.node_id);
            if let Some(to) = handover_target(&voters, |v| unfit_to_lead(&node, v).is_none()) {
                let why = if is_unsafe { "this node's clock is off" } else { "this node's free disk is low" };
                tracing::warn!(group, to, why, "handing leadership over");
                last_handover.insert(*group, Instant::now());
                let _ = raft.trigger().transfer_leader(to).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::raft::LowDiskPeers;

    #[test]
    fn a_handover_skips_a_peer_short_of_disk_unless_all_are() {
        let low = LowDiskPeers::default();
        let now = Instant::now();
        low.note(2, true, now);
        low.note(3, false, now);
        let fit = |v: u64| !low.is_low(v, now);
        assert_eq!(handover_target(&[2, 3], fit), Some(3));
        low.note(3, true, now);
        let fit = |v: u64| !low.is_low(v, now);
        assert_eq!(handover_target(&[2, 3], fit), Some(2), "someone must still lead");
        assert_eq!(handover_target(&[], fit), None);
    }

    #[test]
    fn a_low_disk_reply_counts_for_three_seconds_and_a_later_reply_clears_it() {
        let low = LowDiskPeers::default();
        let at = Instant::now();
        low.note(2, true, at);
        assert!(low.is_low(2, at + Duration::from_millis(2_900)));
        assert!(!low.is_low(2, at + Duration::from_millis(3_100)), "stale");
        assert!(!low.is_low(3, at), "never heard of");
        low.note(2, false, at + Duration::from_millis(100));
        assert!(!low.is_low(2, at + Duration::from_millis(200)));
    }
}
