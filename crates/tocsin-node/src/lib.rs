//! The Tocsin server.
//!
//! A node hosts one Raft group per shard it replicates, all in one RocksDB
//! (`tocsin-store`). For each shard it leads, a fire loop (`shard::leader`) keeps
//! the timers due within the hot window in a timing wheel (`tocsin-wheel`),
//! records each fire through Raft, and hands it to delivery (`shard::delivery`):
//! webhooks or pull topics. Clients use gRPC or the HTTP/JSON mirror
//! ([`api`]).
//!
//! Three layers, arrows pointing down only (a tidy test checks every
//! `crate::` path): [`api`] → [`control`] → [`shard`], over base modules
//! that import none of them. [`node`] is the composition root that builds
//! and starts everything; nothing imports it.
//!
//! Code map:
//! - [`node`]: start-up and shutdown (the composition root);
//! - [`api`]: gRPC services and the HTTP mirror;
//! - [`control`]: the shared [`NodeState`], the metadata group and the
//!   cluster map, replica moves, operations, the cluster view, the leader
//!   balancer;
//! - [`shard`]: Raft groups and transport, the proposer, the fire loop,
//!   delivery;
//! - base: [`config`] (the TOML config and its environment overrides),
//!   [`error`] (what requests and start-up fail with), [`admission`] (rate
//!   and disk limits), [`labels`] (metric labels from client input,
//!   capped), [`egress`] (the SSRF guard on webhook targets),
//!   [`forward`] (channels to other nodes), [`peer_tls`] (mTLS between
//!   nodes), [`client_tls`] (TLS on the client ports), [`runtime`] (the Raft
//!   and fire runtimes apart from the work runtime), [`clock`] (the only
//!   wall-clock reads, and the guard against a clock that jumps or drifts
//!   from the peers'), [`fault`] (fault points for tests, compiled out of
//!   release builds).
//!
//! The wire contract (error code names, headers, JSON forms, signing) is
//! `tocsin-contract`'s.

pub mod admission;
pub mod api;
pub mod auth;
pub mod client_tls;
pub mod clock;
pub mod config;
pub mod control;
pub mod egress;
pub mod error;
pub mod fault;
pub mod forward;
pub mod grid;
pub mod labels;
pub mod node;
pub mod peer_tls;
pub mod runtime;
pub mod shard;
pub mod telemetry;
pub mod testing;

pub use config::NodeConfig;
pub use control::state::NodeState;
pub use node::Node;
