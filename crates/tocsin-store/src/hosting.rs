//! Which Raft groups this node hosts, and removing a group's data when a
//! replica moves away.
//!
//! The hosted set is one durable key (`raft_meta` under
//! [`keys::NODE_GROUP`]), written whenever the node starts or stops hosting
//! a group, so a restarted node reopens exactly the replicas it had, no
//! matter how the cluster's membership changed since it first started.
//! Dropping a group deletes its range in every column family and its
//! snapshot files; the group must be shut down first.

use std::io;

use rocksdb::WriteBatch;
use serde::Deserialize;
use serde::Serialize;

use crate::codec;
use crate::db::Store;
use crate::db::to_io;
use crate::keys;
use crate::keys::GroupId;

/// What a node records about the groups it hosts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hosted {
    /// Hosted group ids, sorted.
    pub groups: Vec<GroupId>,
    /// Whether the first start finished writing the initial memberships;
    /// until then a restart writes them again.
    pub bootstrapped: bool,
}

impl Store {
    /// The persisted hosted set, or `None` before the first
    /// [`Store::set_hosted_groups`] (a node's first start).
    pub fn hosted_groups(&self) -> io::Result<Option<Hosted>> {
        let key = keys::tag_key(keys::NODE_GROUP, keys::raft_meta::HOSTED);
        match self.db().get_cf(self.cf(keys::CF_RAFT_META), key).map_err(to_io)? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// Durably records the hosted set (its groups sorted and deduplicated).
    pub async fn set_hosted_groups(&self, hosted: &Hosted) -> io::Result<()> {
        let mut hosted = hosted.clone();
        hosted.groups.sort_unstable();
        hosted.groups.dedup();
        let mut batch = WriteBatch::default();
        batch.put_cf(
            self.cf(keys::CF_RAFT_META),
            keys::tag_key(keys::NODE_GROUP, keys::raft_meta::HOSTED),
            codec::encode(&hosted)?,
        );
        self.write_durable(batch).await
    }

    /// Deletes everything `group` has in this store (log, vote, state,
    /// indexes, snapshots) in one synced batch. The group's Raft instance
    /// must already be shut down.
    pub async fn drop_group(&self, group: GroupId) -> io::Result<()> {
        assert!(group <= keys::META_GROUP, "drop_group({group}) is for Raft groups only");
        let mut batch = WriteBatch::default();
        for name in keys::ALL_CFS {
            batch.delete_range_cf(self.cf(name), keys::group_start(group), keys::group_end(group));
        }
        self.write_durable(batch).await?;
        match std::fs::remove_dir_all(self.snapshot_dir(group)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}
