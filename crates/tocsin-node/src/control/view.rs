//! The cluster as the reachable nodes report it: every shard's actual
//! voters and leader, and every node's addresses, merged from each node's
//! shard map. The cluster map says where replicas *belong*; this view says
//! where they *are*, which is what operations wait on and what requests are
//! forwarded by.
//!
//! No node hosts every shard once a cluster has more nodes than the
//! replication factor, so operations, the metadata leader and the leader
//! balancer ask the others. A shard's voter set is taken from the report
//! with the newest committed membership (`membership_index` is the log
//! index of its entry), and its leader from the report with the highest
//! term that names one, a leader's report about itself winning ties.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use tocsin_proto::v1 as pb;
use tocsin_store::NodeAddr;

/// One shard as the view has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardView {
    /// Voters, sorted; empty when no reachable node hosts the shard.
    pub voters: Vec<u64>,
    /// Learners of that membership.
    pub learners: Vec<u64>,
    /// Log index of the (committed) membership `voters` came from.
    pub membership_index: u64,
    /// The leader, or 0 if none is known.
    pub leader: u64,
    pub term: u64,
    /// Whether `leader` reported itself.
    pub leader_self_reported: bool,
    /// Why the leader's last move of the replicas failed ("" if it did not).
    pub move_error: String,
    /// Snapshot bytes sent for this shard, summed over the nodes.
    pub snapshot_bytes: u64,
}

/// The merged view.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    pub num_shards: u32,
    /// Every node named by a reachable node, with its addresses.
    pub nodes: BTreeMap<u64, NodeAddr>,
    /// The nodes that answered.
    pub reachable: BTreeSet<u64>,
    pub shards: Vec<ShardView>,
    /// The reports merged so far.
    merged: tocsin_contract::map::MapMerge,
}

impl ClusterView {
    /// A view of `num_shards` shards that no report has reached yet.
    pub fn empty(num_shards: u32) -> ClusterView {
        ClusterView { num_shards, shards: vec![ShardView::default(); num_shards as usize], ..Default::default() }
    }

    /// Nodes that hold at least one voter replica.
    pub fn voter_nodes(&self) -> BTreeSet<u64> {
        self.shards.iter().flat_map(|s| s.voters.iter().copied()).collect()
    }

    /// Whether `shard`'s committed voters are exactly `target` (sorted),
    /// with no learner still catching up.
    pub fn in_place(&self, shard: u32, target: &[u64]) -> bool {
        self.shards
            .get(shard as usize)
            .is_some_and(|s| !s.voters.is_empty() && s.voters == target && s.learners.is_empty())
    }

    /// Whether `node` holds a replica (voter or learner) of any shard.
    pub fn holds_any(&self, node: u64) -> bool {
        self.shards.iter().any(|s| s.voters.contains(&node) || s.learners.contains(&node))
    }

    /// Merges one node's shard map into the view, by the contract's rule
    /// (`tocsin_contract::map`).
    pub(crate) fn merge(&mut self, from: u64, map: &pb::ShardMap) {
        self.reachable.insert(from);
        self.merged.add(Some(from), map.clone());
        let Some(merged) = self.merged.map() else { return };
        for n in &merged.nodes {
            let addr = NodeAddr {
                grpc_addr: n.grpc_addr.clone(),
                http_addr: n.http_addr.clone(),
                peer_addr: n.peer_addr.clone(),
            };
            self.nodes.insert(n.node_id, addr);
        }
        for (i, p) in merged.shards.iter().enumerate() {
            let Some(s) = self.shards.get_mut(p.shard as usize) else { continue };
            s.voters = p.replicas.clone();
            s.learners = p.learners.clone();
            s.membership_index = p.membership_index;
            s.leader = p.leader;
            s.term = p.term;
            s.leader_self_reported = self.merged.leader_self_reported(i);
            s.move_error = p.move_error.clone();
            s.snapshot_bytes = p.snapshot_bytes_sent;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(nodes: &[u64], shards: &[(u32, &[u64], u64, u64, u64)]) -> pb::ShardMap {
        pb::ShardMap {
            epoch: 1,
            num_shards: 2,
            nodes: nodes
                .iter()
                .map(|id| pb::NodeInfo { node_id: *id, grpc_addr: format!("n{id}:1"), ..Default::default() })
                .collect(),
            ring: Vec::new(),
            shards: shards
                .iter()
                .map(|(shard, replicas, leader, index, term)| pb::ShardPlacement {
                    shard: *shard,
                    replicas: replicas.to_vec(),
                    leader: *leader,
                    membership_index: *index,
                    term: *term,
                    snapshot_bytes_sent: 10,
                    ..Default::default()
                })
                .collect(),
            metadata: None,
        }
    }

    #[test]
    fn newest_membership_and_highest_term_win() {
        let mut view = ClusterView { num_shards: 2, shards: vec![ShardView::default(); 2], ..Default::default() };
        // Node 1 lags: it still has shard 0 on {1,2,3} led by 3 in term 4.
        view.merge(1, &map(&[1, 2, 3], &[(0, &[3, 2, 1], 3, 10, 4)]));
        // Node 4 has the newer membership {1,2,4} and a leader in term 5.
        view.merge(4, &map(&[1, 2, 4], &[(0, &[4, 2, 1], 4, 20, 5), (1, &[1, 2, 4], 0, 7, 5)]));
        assert_eq!(view.shards[0].voters, vec![1, 2, 4]);
        assert_eq!((view.shards[0].leader, view.shards[0].term), (4, 5));
        assert_eq!(view.shards[1].voters, vec![1, 2, 4]);
        assert_eq!(view.shards[1].leader, 0, "no report names a leader");
        // An older membership does not replace a newer one.
        view.merge(2, &map(&[2], &[(0, &[1, 2, 3], 0, 10, 5)]));
        assert_eq!(view.shards[0].voters, vec![1, 2, 4]);
        assert_eq!(view.voter_nodes(), BTreeSet::from([1, 2, 4]));
        assert_eq!(view.reachable, BTreeSet::from([1, 2, 4]));
        assert_eq!(view.nodes.len(), 4);
        // Snapshot bytes add up over the reports; placement is checked
        // against a target.
        assert_eq!(view.shards[0].snapshot_bytes, 30);
        assert!(view.in_place(0, &[1, 2, 4]));
        assert!(!view.in_place(0, &[1, 2, 3]));
        assert!(view.holds_any(4) && !view.holds_any(3));
    }
}
