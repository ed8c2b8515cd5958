//! The simulation's openraft types: entries carry tocsin-core's
//! [`Proposal`], and the runtime is tokio with openraft's deterministic RNG
//! (election timeouts drawn from a seed, not from the OS).

use tocsin_core::Proposal;
use tocsin_core::command::ApplyResponse;

/// tokio, with openraft's `thread_rng()` replaced by a seeded generator.
pub type Runtime = openraft::rt::deterministic_rng::DeterministicRng<openraft::TokioRuntime>;

openraft::declare_raft_types!(
    /// The simulated shard's types: as `tocsin-store`'s, with a seeded RNG.
    pub TypeConfig:
        D = Proposal,
        R = ApplyResponse,
        NodeId = u64,
        Node = openraft::BasicNode,
        AsyncRuntime = Runtime,
);

pub type Raft = openraft::Raft<TypeConfig, crate::store::StateMachine>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;

/// Spawns a task that inherits the caller's deterministic RNG seed (openraft
/// reads it in every task it reaches).
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    <Runtime as openraft::AsyncRuntime>::spawn(future)
}
