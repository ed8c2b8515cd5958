//! Every RocksDB key Tocsin writes, in one module (TiKV's `keys`).
//!
//! One RocksDB per node holds every Raft group on it. Every key in every
//! column family starts with the group id, 8 bytes big-endian, so a group's
//! data is one contiguous range per column family: range scans, range
//! deletes and snapshots of one group never touch another. Numbers inside
//! keys are big-endian so byte order is numeric order.
//!
//! | CF | key | value |
//! |----|-----|-------|
//! | `raft_log` | group · index | `Entry` |
//! | `raft_meta` | group · tag (vote, committed, last purged); node group · hosted, format | `Vote` / `LogId` / group ids / format version |
//! | `timers` | group · timer key | `TimerRecord` |
//! | `due` | group · due_ms · timer key | what is due ([`due_value`]) |
//! | `retention` | group · purge_after_ms · timer key | empty |
//! | `horizon` | group · ns length · namespace · minute | count, u64 BE (at minute [`PENDING_MINUTE`]: the namespace's unfinished timers) |
//! | `sm_meta` | group · tag (applied, membership, shard meta, installing; cluster map under the metadata group) | … |
//!
//! A timer key is `ns length (1 byte) · namespace · id`: the length prefix
//! makes every namespace's timers one contiguous range, and the encoding
//! unambiguous even though ids are arbitrary UTF-8. Byte order of these
//! keys is exactly `TimerKey`'s `Ord` (and of a `due` key, `DuePos`'s): the
//! fire loop's cursor compares positions with that `Ord`, and a property
//! test checks that the two agree.

use tocsin_core::DueKind;
use tocsin_core::TimerKey;

pub const CF_RAFT_LOG: &str = "raft_log";
pub const CF_RAFT_META: &str = "raft_meta";
pub const CF_TIMERS: &str = "timers";
pub const CF_DUE: &str = "due";
pub const CF_RETENTION: &str = "retention";
pub const CF_HORIZON: &str = "horizon";
pub const CF_SM_META: &str = "sm_meta";

/// Every column family, in a fixed order.
pub const ALL_CFS: [&str; 7] = [CF_RAFT_LOG, CF_RAFT_META, CF_TIMERS, CF_DUE, CF_RETENTION, CF_HORIZON, CF_SM_META];

/// The column families that make up a group's state machine: what a
/// snapshot carries and what installing one replaces.
pub const STATE_MACHINE_CFS: [&str; 5] = [CF_TIMERS, CF_DUE, CF_RETENTION, CF_HORIZON, CF_SM_META];

/// A Raft group id: a shard number, or [`META_GROUP`].
pub type GroupId = u64;

/// The cluster metadata group's id, above every shard's.
pub const META_GROUP: GroupId = 1 << 32;

/// Not a Raft group: the key space of node-level facts (the hosted set).
pub const NODE_GROUP: GroupId = META_GROUP + 1;

/// Tags under `raft_meta`.
pub mod raft_meta {
    pub const VOTE: u8 = 1;
    pub const COMMITTED: u8 = 2;
    pub const LAST_PURGED: u8 = 3;
    /// Under [`super::NODE_GROUP`]: the groups this node hosts.
    pub const HOSTED: u8 = 4;
    /// Under [`super::NODE_GROUP`]: the store's format version.
    pub const FORMAT: u8 = 5;
}

/// Tags under `sm_meta`.
pub mod sm_meta {
    pub const APPLIED: u8 = 1;
    pub const MEMBERSHIP: u8 = 2;
    pub const SHARD: u8 = 3;
    /// Present while a snapshot install is incomplete (see `snapshot.rs`).
    pub const INSTALLING: u8 = 4;
    /// Under [`super::META_GROUP`]: the cluster map.
    pub const CLUSTER_MAP: u8 = 5;
}

/// The first key of `group` in any column family.
pub fn group_start(group: GroupId) -> [u8; 8] {
    group.to_be_bytes()
}

/// The first key past `group` in any column family. Group ids stay far
/// below `u64::MAX`, so this never wraps.
pub fn group_end(group: GroupId) -> [u8; 8] {
    (group + 1).to_be_bytes()
}

pub fn log_key(group: GroupId, index: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&group.to_be_bytes());
    k[8..].copy_from_slice(&index.to_be_bytes());
    k
}

/// The log index of a `raft_log` key.
pub fn log_index(key: &[u8]) -> u64 {
    assert_eq!(key.len(), 16, "raft_log key of {} bytes", key.len());
    u64::from_be_bytes(key[8..16].try_into().expect("8 bytes"))
}

pub fn tag_key(group: GroupId, tag: u8) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[..8].copy_from_slice(&group.to_be_bytes());
    k[8] = tag;
    k
}

fn push_timer_key(out: &mut Vec<u8>, key: &TimerKey) {
    let ns = key.namespace.as_bytes();
    assert!(ns.len() <= u8::MAX as usize, "namespace of {} bytes", ns.len());
    out.push(ns.len() as u8);
    out.extend_from_slice(ns);
    out.extend_from_slice(key.id.as_bytes());
}

/// Decodes the timer-key part of a key, after the group and any time prefix.
pub fn decode_timer_key(bytes: &[u8]) -> Option<TimerKey> {
    let (&ns_len, rest) = bytes.split_first()?;
    let ns_len = ns_len as usize;
    if rest.len() < ns_len {
        return None;
    }
    let namespace = std::str::from_utf8(&rest[..ns_len]).ok()?.to_string();
    let id = std::str::from_utf8(&rest[ns_len..]).ok()?.to_string();
    Some(TimerKey { namespace, id })
}

pub fn timer_key(group: GroupId, key: &TimerKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.namespace.len() + key.id.len());
    k.extend_from_slice(&group.to_be_bytes());
    push_timer_key(&mut k, key);
    k
}

/// The range of one namespace's timers in `timers`: `[start, end)`.
pub fn namespace_range(group: GroupId, namespace: &str) -> (Vec<u8>, Vec<u8>) {
    let mut start = Vec::with_capacity(9 + namespace.len());
    start.extend_from_slice(&group.to_be_bytes());
    start.push(namespace.len() as u8);
    start.extend_from_slice(namespace.as_bytes());
    let end = prefix_end(&start);
    (start, end)
}

/// The smallest key greater than every key with this prefix.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    // An all-0xff prefix has no successor of the same length; nothing of ours
    // looks like that because group ids are small.
    vec![u8::MAX; prefix.len() + 1]
}

/// A key in a time-ordered index (`due` or `retention`).
pub fn time_index_key(group: GroupId, at_ms: u64, key: &TimerKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(17 + key.namespace.len() + key.id.len());
    k.extend_from_slice(&group.to_be_bytes());
    k.extend_from_slice(&at_ms.to_be_bytes());
    push_timer_key(&mut k, key);
    k
}

/// The start of `group`'s time index at `at_ms`.
pub fn time_index_from(group: GroupId, at_ms: u64) -> [u8; 16] {
    log_key(group, at_ms)
}

/// Decodes a `due` or `retention` key into its time and timer key.
pub fn decode_time_index_key(key: &[u8]) -> Option<(u64, TimerKey)> {
    if key.len() < 17 {
        return None;
    }
    let at_ms = u64::from_be_bytes(key[8..16].try_into().ok()?);
    Some((at_ms, decode_timer_key(&key[16..])?))
}

/// The value of a `due` entry: what the leader does when it comes due.
/// One tag byte; an attempt adds its epoch (8 bytes big-endian) and whether
/// it is a webhook's (1 byte).
pub fn due_value(kind: DueKind) -> Vec<u8> {
    match kind {
        DueKind::Fire => vec![1],
        DueKind::Attempt { epoch, webhook } => {
            let mut v = Vec::with_capacity(10);
            v.push(2);
            v.extend_from_slice(&epoch.to_be_bytes());
            v.push(u8::from(webhook));
            v
        }
        DueKind::Retry => vec![3],
        DueKind::Ready => vec![4],
        DueKind::PullFire => vec![5],
    }
}

/// Decodes a `due` entry's value; `None` if it is not one.
pub fn decode_due_value(value: &[u8]) -> Option<DueKind> {
    match value {
        [1] => Some(DueKind::Fire),
        [2, rest @ ..] if rest.len() == 9 => Some(DueKind::Attempt {
            epoch: u64::from_be_bytes(rest[..8].try_into().ok()?),
            webhook: match rest[8] {
                0 => false,
                1 => true,
                _ => return None,
            },
        }),
        [3] => Some(DueKind::Retry),
        [4] => Some(DueKind::Ready),
        [5] => Some(DueKind::PullFire),
        _ => None,
    }
}

/// The `horizon` minute under which a namespace's count of unfinished
/// timers (scheduled, firing or retrying: every timer with a due time) is
/// kept, for its quota. No fire time reaches it (`u64::MAX` ms is minute
/// `u64::MAX / 60_000`), and horizon scans end before it.
pub const PENDING_MINUTE: u64 = u64::MAX;

pub fn horizon_key(group: GroupId, namespace: &str, minute: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17 + namespace.len());
    k.extend_from_slice(&group.to_be_bytes());
    k.push(namespace.len() as u8);
    k.extend_from_slice(namespace.as_bytes());
    k.extend_from_slice(&minute.to_be_bytes());
    k
}

/// The namespace of a `horizon` key (`group · ns length · namespace ·
/// minute`), if the key is well formed.
pub fn horizon_namespace(key: &[u8]) -> Option<String> {
    let (&ns_len, rest) = key.get(8..)?.split_first()?;
    let ns = rest.get(..ns_len as usize)?;
    (rest.len() == ns_len as usize + 8).then(|| String::from_utf8(ns.to_vec()).ok()).flatten()
}

/// Replaces the group prefix of a key: snapshots store keys without it.
pub fn strip_group(key: &[u8]) -> &[u8] {
    &key[8..]
}

pub fn with_group(group: GroupId, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + rest.len());
    k.extend_from_slice(&group.to_be_bytes());
    k.extend_from_slice(rest);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_keys_round_trip_and_sort_by_namespace() {
        let k = TimerKey::new("orders", "a/b ✓");
        let enc = timer_key(3, &k);
        assert_eq!(decode_timer_key(&enc[8..]), Some(k.clone()));
        let (start, end) = namespace_range(3, "orders");
        assert!(enc.as_slice() >= start.as_slice() && enc.as_slice() < end.as_slice());
        // "orders2" must not fall into "orders"'s range.
        let other = timer_key(3, &TimerKey::new("orders2", "a"));
        assert!(!(other.as_slice() >= start.as_slice() && other.as_slice() < end.as_slice()));
    }

    #[test]
    fn time_index_orders_by_time_then_key() {
        let a = time_index_key(1, 5, &TimerKey::new("z", "z"));
        let b = time_index_key(1, 6, &TimerKey::new("a", "a"));
        assert!(a < b);
        assert_eq!(decode_time_index_key(&b), Some((6, TimerKey::new("a", "a"))));
        assert!(time_index_key(1, u64::MAX, &TimerKey::new("a", "a")).as_slice() < group_end(1).as_slice());
        assert!(log_key(1, u64::MAX).as_slice() < group_end(1).as_slice());
    }

    #[test]
    fn due_values_round_trip() {
        for kind in [
            DueKind::Fire,
            DueKind::Attempt { epoch: 0x0102_0304_0506_0708, webhook: true },
            DueKind::Attempt { epoch: 7, webhook: false },
            DueKind::Retry,
            DueKind::Ready,
            DueKind::PullFire,
        ] {
            assert_eq!(decode_due_value(&due_value(kind)), Some(kind));
        }
        assert_eq!(decode_due_value(&[]), None);
        assert_eq!(decode_due_value(&[2, 0, 0, 0, 0, 0, 0, 0, 1, 9]), None);
    }

    #[test]
    fn prefix_end_is_the_successor() {
        assert_eq!(prefix_end(&[1, 2]), vec![1, 3]);
        assert_eq!(prefix_end(&[1, 255]), vec![2]);
    }
}
