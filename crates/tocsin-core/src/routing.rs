//! Routing: which shard owns a timer, and which nodes host a shard.
//!
//! **Key → shard: jump consistent hash over xxh3.** A cluster has a fixed
//! number of virtual shards, chosen at creation (16 by default). A timer's
//! shard is `jump(xxh3_64(namespace, id), num_shards)`. Jump hash needs no
//! table, is perfectly balanced, and if the shard count ever grows from n to
//! n + 1 it moves only 1/(n + 1) of the keys. xxh3 is stable across Rust
//! releases and platforms, unlike the standard library's default hasher, which is why every
//! client computes the same shard as every server.
//!
//! **Shard → nodes: a token ring.** Each node owns [`TOKENS_PER_NODE`]
//! pseudo-random tokens on a 64-bit ring. A shard's replicas are the first
//! `replication_factor` distinct nodes met walking clockwise from the shard's
//! own ring position. Adding or removing a node moves only the shards whose
//! walk meets that node's tokens. The ring only *proposes* placement; the
//! replicated shard map records what was decided.

use xxhash_rust::xxh3::Xxh3;
use xxhash_rust::xxh3::xxh3_64;

use crate::NodeId;
use crate::ShardId;

/// Tokens each node owns on the placement ring: enough that three to ten
/// nodes get roughly even shares.
pub const TOKENS_PER_NODE: u32 = 64;

/// The stable 64-bit hash of a timer key.
pub fn key_hash(namespace: &str, id: &str) -> u64 {
    let mut h = Xxh3::new();
    // Length-prefix the namespace so ("ab", "c") and ("a", "bc") differ.
    h.update(&(namespace.len() as u32).to_be_bytes());
    h.update(namespace.as_bytes());
    h.update(id.as_bytes());
    h.digest()
}

/// Lamping and Veach's jump consistent hash: a bucket in `[0, buckets)`.
pub fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    assert!(buckets > 0, "jump_hash needs at least one bucket");
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// The shard that owns `(namespace, id)`.
pub fn shard_for(namespace: &str, id: &str, num_shards: u32) -> ShardId {
    jump_hash(key_hash(namespace, id), num_shards)
}

/// The placement ring: sorted `(token, node)` pairs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    tokens: Vec<(u64, NodeId)>,
}

impl Ring {
    /// A ring with [`TOKENS_PER_NODE`] tokens for each node.
    pub fn new(nodes: impl IntoIterator<Item = NodeId>) -> Ring {
        let mut tokens: Vec<(u64, NodeId)> =
            nodes.into_iter().flat_map(|node| (0..TOKENS_PER_NODE).map(move |i| (node_token(node, i), node))).collect();
        tokens.sort_unstable();
        tokens.dedup_by_key(|(t, _)| *t);
        Ring { tokens }
    }

    /// A ring from explicit tokens, as stored in a shard map.
    pub fn from_tokens(mut tokens: Vec<(u64, NodeId)>) -> Ring {
        tokens.sort_unstable();
        tokens.dedup_by_key(|(t, _)| *t);
        Ring { tokens }
    }

    pub fn tokens(&self) -> &[(u64, NodeId)] {
        &self.tokens
    }

    /// The first `replication_factor` distinct nodes clockwise from the
    /// shard's ring position (fewer if the ring has fewer nodes).
    pub fn replicas(&self, shard: ShardId, replication_factor: usize) -> Vec<NodeId> {
        let mut out = Vec::with_capacity(replication_factor);
        if self.tokens.is_empty() {
            return out;
        }
        let position = xxh3_64(&[b"shard".as_slice(), &shard.to_be_bytes()].concat());
        let start = self.tokens.partition_point(|(t, _)| *t < position);
        for i in 0..self.tokens.len() {
            let (_, node) = self.tokens[(start + i) % self.tokens.len()];
            if !out.contains(&node) {
                out.push(node);
                if out.len() == replication_factor {
                    break;
                }
            }
        }
        out
    }
}

fn node_token(node: NodeId, i: u32) -> u64 {
    xxh3_64(&[node.to_be_bytes().as_slice(), &i.to_be_bytes()].concat())
}

/// Picks a preferred leader for each shard so that leaderships spread evenly:
/// shards in order, each to the replica leading the fewest shards so far
/// (ties to the earlier replica in the list).
pub fn spread_leaders(placements: &[Vec<NodeId>]) -> Vec<Option<NodeId>> {
    let mut load: std::collections::BTreeMap<NodeId, usize> = std::collections::BTreeMap::new();
    placements
        .iter()
        .map(|replicas| {
            let leader = replicas.iter().copied().min_by_key(|n| load.get(n).copied().unwrap_or(0))?;
            *load.entry(leader).or_default() += 1;
            Some(leader)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_hash_is_stable_and_in_range() {
        // Pinned values: a change here would re-route every existing timer.
        assert_eq!(key_hash("orders", "order-42"), 12_628_540_823_850_880_818);
        assert_eq!(shard_for("orders", "order-42", 16), 14);
        assert_eq!(shard_for("a", "b", 256), 137);
        assert_eq!(jump_hash(42, 1000), 571);
        for n in 1..40 {
            assert!(shard_for("ns", &format!("id-{n}"), n) < n);
        }
        assert_eq!(jump_hash(0, 1), 0);
    }

    #[test]
    fn jump_hash_is_balanced_and_moves_little() {
        let keys: Vec<u64> = (0..100_000).map(|i| key_hash("ns", &format!("timer-{i}"))).collect();
        let mut counts = [0u32; 16];
        for k in &keys {
            counts[jump_hash(*k, 16) as usize] += 1;
        }
        for c in counts {
            assert!((5_500..7_000).contains(&c), "{counts:?}");
        }
        let moved = keys.iter().filter(|k| jump_hash(**k, 16) != jump_hash(**k, 17)).count();
        assert!((4_800..7_000).contains(&moved), "moved {moved} of 100000 going 16 -> 17");
    }

    #[test]
    fn ring_places_distinct_replicas_and_moves_little() {
        let ring = Ring::new([1, 2, 3]);
        for shard in 0..64 {
            let mut r = ring.replicas(shard, 3);
            r.sort_unstable();
            assert_eq!(r, vec![1, 2, 3]);
        }
        let five = Ring::new([1, 2, 3, 4, 5]);
        let six = Ring::new([1, 2, 3, 4, 5, 6]);
        let mut per_node = std::collections::BTreeMap::new();
        let mut changed = 0;
        for shard in 0..256 {
            let before = five.replicas(shard, 3);
            let after = six.replicas(shard, 3);
            for n in &after {
                *per_node.entry(*n).or_insert(0) += 1;
            }
            // Only shards that gained node 6 change, and each loses one replica.
            if before != after {
                changed += 1;
                assert!(after.contains(&6), "{before:?} -> {after:?}");
            }
        }
        assert!(changed < 256 / 2 + 40, "{changed} of 256 shards changed");
        for (node, count) in per_node {
            assert!((60..=200).contains(&count), "node {node} holds {count} of 768 replicas");
        }
    }

    #[test]
    fn leaders_spread_evenly() {
        let ring = Ring::new([1, 2, 3]);
        let placements: Vec<_> = (0..12).map(|s| ring.replicas(s, 3)).collect();
        let leaders = spread_leaders(&placements);
        for node in 1..=3 {
            assert_eq!(leaders.iter().filter(|l| **l == Some(node)).count(), 4);
        }
    }
}
