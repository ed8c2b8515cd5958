//! The postcard-encoded openraft messages a node decodes from a peer: the
//! payload of a Raft link frame (append entries, vote, pre-vote, transfer
//! leader, and their responses) and a snapshot stream's header (vote and
//! snapshot meta), decoded from arbitrary bytes as `shard/raft.rs` decodes
//! them. Whatever decodes re-encodes to bytes that decode and re-encode to
//! the same bytes: postcard never panics, loops or allocates unboundedly on
//! input.
//!
//! The type config mirrors `tocsin_store::TypeConfig` (the same entry
//! payload and apply response from tocsin-core) except the node address,
//! which is declared here with `tocsin_store::NodeAddr`'s wire form (three
//! strings, in that order): the fuzz build links neither RocksDB nor
//! tocsin-store. `tocsin-store`'s unit test
//! `node_addr_is_three_strings_on_the_wire` keeps the two in step.
#![no_main]

use libfuzzer_sys::fuzz_target;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
use openraft::raft::TransferLeaderRequest;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tocsin_core::Proposal;
use tocsin_core::command::ApplyResponse;

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct NodeAddr {
    pub grpc_addr: String,
    pub http_addr: String,
    pub peer_addr: String,
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.grpc_addr)
    }
}

openraft::declare_raft_types!(
    pub Config:
        D = Proposal,
        R = ApplyResponse,
        NodeId = u64,
        Node = NodeAddr,
);

fn round_trip<T: Serialize + DeserializeOwned>(data: &[u8]) {
    if let Ok(message) = postcard::from_bytes::<T>(data) {
        let once = postcard::to_allocvec(&message).expect("a decoded message encodes");
        let again: T = postcard::from_bytes(&once).expect("a re-encoded message decodes");
        assert_eq!(once, postcard::to_allocvec(&again).expect("encodes"), "re-encoding is not stable");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, data)) = data.split_first() else { return };
    match which % 8 {
        0 => round_trip::<AppendEntriesRequest<Config>>(data),
        1 => round_trip::<VoteRequest<Config>>(data),
        2 => round_trip::<TransferLeaderRequest<Config>>(data),
        3 => round_trip::<AppendEntriesResponse<Config>>(data),
        4 => round_trip::<VoteResponse<Config>>(data),
        5 => round_trip::<SnapshotResponse<Config>>(data),
        6 => round_trip::<(openraft::alias::VoteOf<Config>, openraft::alias::SnapshotMetaOf<Config>)>(data),
        _ => round_trip::<openraft::alias::EntryOf<Config>>(data),
    }
});
