//! Folding the shard maps several nodes report into one view of the
//! cluster, by one rule that the client's routing table and the node's own
//! cluster view (operations, forwarding, the balancer) share.
//!
//! A node knows the committed membership and the leader only of the shards
//! it hosts, so those are merged per shard: the voters of the newest
//! committed membership (`membership_index` is its log index), and the
//! leader named in the highest term, a leader's report about itself winning
//! a tie. What the cluster map says (node states, ring, targets, shard
//! epochs, the metadata group) comes from the report with the highest map
//! epoch. A node's report of its own address wins over others'.

use tocsin_proto::v1 as pb;

/// The merge of the reports added so far.
#[derive(Clone, Debug, Default)]
pub struct MapMerge {
    merged: Option<pb::ShardMap>,
    /// Per entry of `merged.shards`: whether its leader named itself.
    self_reported: Vec<bool>,
}

impl MapMerge {
    /// Adds the map node `from` answered with (`None` when the caller does
    /// not know which node that was).
    pub fn add(&mut self, from: Option<u64>, mut map: pb::ShardMap) {
        for p in &mut map.shards {
            p.replicas.sort_unstable();
            p.learners.sort_unstable();
        }
        let Some(m) = self.merged.as_mut() else {
            self.self_reported = map.shards.iter().map(|p| p.leader != 0 && Some(p.leader) == from).collect();
            for (p, own) in map.shards.iter_mut().zip(&self.self_reported) {
                if !own {
                    p.move_error.clear();
                }
            }
            self.merged = Some(map);
            return;
        };
        let newer = map.epoch > m.epoch;
        if newer {
            m.epoch = map.epoch;
            m.num_shards = map.num_shards;
            m.ring = map.ring.clone();
            m.metadata = map.metadata.clone();
        }
        for n in map.nodes {
            match m.nodes.iter_mut().find(|x| x.node_id == n.node_id) {
                Some(x) if newer => *x = n,
                Some(x) if Some(n.node_id) == from => {
                    x.grpc_addr = n.grpc_addr;
                    x.http_addr = n.http_addr;
                    x.peer_addr = n.peer_addr;
                }
                Some(_) => {}
                None => m.nodes.push(n),
            }
        }
        m.nodes.sort_by_key(|n| n.node_id);
        for p in map.shards {
            let own = p.leader != 0 && Some(p.leader) == from;
            let Some(i) = m.shards.iter().position(|x| x.shard == p.shard) else {
                let mut p = p;
                if !own {
                    p.move_error.clear();
                }
                m.shards.push(p);
                self.self_reported.push(own);
                continue;
            };
            let x = &mut m.shards[i];
            if !p.replicas.is_empty() && (p.membership_index > x.membership_index || x.replicas.is_empty()) {
                x.replicas = p.replicas.clone();
                x.learners = p.learners.clone();
                x.membership_index = p.membership_index;
            }
            if newer {
                x.target = p.target.clone();
                x.shard_epoch = p.shard_epoch;
            }
            if own {
                x.move_error = p.move_error.clone();
            }
            let better = p.leader != 0
                && (p.term > x.term || (p.term == x.term && (x.leader == 0 || (own && !self.self_reported[i]))));
            if better {
                x.leader = p.leader;
                x.term = p.term;
                self.self_reported[i] = own;
            }
            x.snapshot_bytes_sent += p.snapshot_bytes_sent;
        }
        // Shard order, and the flags with their shards.
        let mut order: Vec<usize> = (0..m.shards.len()).collect();
        order.sort_by_key(|&i| m.shards[i].shard);
        if order.windows(2).any(|w| w[0] > w[1]) {
            let shards = std::mem::take(&mut m.shards);
            let flags = std::mem::take(&mut self.self_reported);
            let mut pairs: Vec<(pb::ShardPlacement, bool)> = shards.into_iter().zip(flags).collect();
            pairs.sort_by_key(|(p, _)| p.shard);
            (m.shards, self.self_reported) = pairs.into_iter().unzip();
        }
    }

    /// The merged map, if any report was added.
    pub fn map(&self) -> Option<&pb::ShardMap> {
        self.merged.as_ref()
    }

    /// Whether the leader the merged map names for the shard at `index` of
    /// its `shards` reported itself.
    pub fn leader_self_reported(&self, index: usize) -> bool {
        self.self_reported.get(index).copied().unwrap_or(false)
    }

    pub fn into_map(self) -> Option<pb::ShardMap> {
        self.merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(shard: u32, replicas: &[u64], leader: u64, membership_index: u64, term: u64) -> pb::ShardPlacement {
        pb::ShardPlacement { shard, replicas: replicas.to_vec(), leader, membership_index, term, ..Default::default() }
    }

    fn node(id: u64) -> pb::NodeInfo {
        pb::NodeInfo { node_id: id, ..Default::default() }
    }

    #[test]
    fn merged_maps_take_the_newest_voters_and_the_highest_term_leader() {
        let mut merge = MapMerge::default();
        merge.add(
            None,
            pb::ShardMap {
                num_shards: 3,
                nodes: vec![node(1), node(2)],
                shards: vec![placement(0, &[1, 2, 3], 1, 5, 2), placement(1, &[1, 2, 3], 2, 5, 2)],
                ..Default::default()
            },
        );
        merge.add(
            None,
            pb::ShardMap {
                num_shards: 3,
                nodes: vec![node(4)],
                shards: vec![placement(0, &[1, 2, 4], 0, 9, 2), placement(2, &[2, 3, 4], 4, 3, 1)],
                ..Default::default()
            },
        );
        let m = merge.into_map().unwrap();
        assert_eq!(m.nodes.iter().map(|n| n.node_id).collect::<Vec<_>>(), vec![1, 2, 4]);
        assert_eq!(m.shards.iter().map(|s| s.shard).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!((m.shards[0].replicas.clone(), m.shards[0].leader), (vec![1, 2, 4], 1));
        assert_eq!(m.shards[2].leader, 4);
    }

    #[test]
    fn a_leader_naming_itself_wins_a_tie_and_an_older_term_never_wins() {
        let mut merge = MapMerge::default();
        // Node 2 believes 3 leads shard 0 in term 7.
        merge.add(Some(2), pb::ShardMap { shards: vec![placement(0, &[1, 2, 3], 3, 4, 7)], ..Default::default() });
        assert!(!merge.leader_self_reported(0));
        // Node 1 says it leads, in the same term: its own word wins.
        let mut own = placement(0, &[1, 2, 3], 1, 4, 7);
        own.move_error = "no quorum".into();
        merge.add(Some(1), pb::ShardMap { shards: vec![own], ..Default::default() });
        let m = merge.map().unwrap();
        assert_eq!((m.shards[0].leader, m.shards[0].move_error.as_str()), (1, "no quorum"));
        assert!(merge.leader_self_reported(0));
        // A stale report of an older term does not replace it.
        merge.add(Some(3), pb::ShardMap { shards: vec![placement(0, &[1, 2, 3], 3, 4, 6)], ..Default::default() });
        assert_eq!(merge.map().unwrap().shards[0].leader, 1);
    }
}
