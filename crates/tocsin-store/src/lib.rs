//! openraft storage for Tocsin: the Raft log and the timer state machine of
//! every Raft group on a node, in one shared RocksDB.
//!
//! - [`db`]: opening the database and the group-commit writer (one WAL
//!   fsync covers every group's pending writes);
//! - [`keys`]: every key encoding (group id first, big-endian);
//! - [`codec`]: value encoding;
//! - [`log_store`]: [`LogStore`], openraft's `RaftLogStorage` for one group;
//! - [`state_machine`]: [`StateMachine`], openraft's `RaftStateMachine`
//!   for one group, applying `tocsin-core`'s rules;
//! - [`snapshot`]: streamed snapshot files and their atomic install;
//! - [`read`]: the queries a node runs (get, list, fire-time scans, horizon);
//! - [`hosting`]: the persisted set of hosted groups, and dropping a group.
//!
//! The durability contract (see `docs/storage.md`): a vote is synced before
//! `save_vote` returns; the append callback runs only after the WAL sync
//! that covers the entries; apply writes timers, indexes and `last_applied`
//! in one batch before answering (unsynced: the log is the durable record).
//! RocksDB work that can wait on the disk (syncs, scans, large apply
//! batches) runs on the writer thread or in `spawn_blocking`; an apply
//! batch of at most 32 commands runs on the state machine's task.

pub mod codec;
pub mod db;
pub mod hosting;
pub mod keys;
pub mod log_store;
pub mod read;
pub mod snapshot;
pub mod state_machine;

pub use db::Store;
pub use db::StoreConfig;
pub use keys::GroupId;
pub use log_store::LogStore;
pub use read::DuePage;
pub use read::StateDigest;
use serde::Deserialize;
use serde::Serialize;
pub use snapshot::SnapshotFile;
pub use state_machine::AppliedEntry;
pub use state_machine::ApplyObserver;
pub use state_machine::StateMachine;
use tocsin_core::Proposal;
use tocsin_core::command::ApplyResponse;

/// How a node is reached: stored in Raft membership configs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeAddr {
    /// The client gRPC API (TimerService, AdminService), `host:port`: what
    /// leader hints give clients.
    pub grpc_addr: String,
    /// HTTP/JSON API, `host:port`.
    pub http_addr: String,
    /// The peer API (Raft links and transport, replica control, forwarded
    /// requests), `host:port`: what other nodes dial, never clients.
    pub peer_addr: String,
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "grpc={} http={} peer={}", self.grpc_addr, self.http_addr, self.peer_addr)
    }
}

openraft::declare_raft_types!(
    /// Tocsin's openraft types: log entries carry a [`Proposal`] (a batch of
    /// timer commands with the leader's stamped time) and applying one
    /// returns an [`ApplyResponse`].
    pub TypeConfig:
        D = Proposal,
        R = ApplyResponse,
        NodeId = u64,
        Node = NodeAddr,
);

/// openraft's Raft handle for one of our groups.
pub type Raft = openraft::Raft<TypeConfig, StateMachine>;
/// A log id in our type config.
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
/// A vote in our type config.
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// A log entry in our type config.
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
/// A membership config with the log id it was applied at.
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
/// A snapshot's metadata.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz target `raft_messages` (crates/tocsin-fuzz) declares this
    /// type's wire form itself, as three strings in this order: a change
    /// here must change it there too.
    #[test]
    fn node_addr_is_three_strings_on_the_wire() {
        let addr = NodeAddr { grpc_addr: "g:1".into(), http_addr: "h:2".into(), peer_addr: "p:3".into() };
        let as_tuple = ("g:1".to_string(), "h:2".to_string(), "p:3".to_string());
        assert_eq!(postcard::to_allocvec(&addr).unwrap(), postcard::to_allocvec(&as_tuple).unwrap());
    }
}
