//! The Tocsin server.
//!
//! A node hosts one Raft group per shard it replicates, all in one RocksDB
//! (`tocsin-store`). For each shard it leads, a fire loop ([`leader`]) keeps
//! the timers due within the hot window in a timing wheel (`tocsin-wheel`),
//! records each fire through Raft, and hands it to delivery ([`delivery`]):
//! webhooks or pull topics. Clients use gRPC or the HTTP/JSON mirror
//! ([`api`]).
//!
//! Code map:
//! - [`node`]: start-up, shutdown, what is shared;
//! - [`config`]: the TOML config and its environment overrides;
//! - [`raft`]: openraft config, the shared gRPC transport;
//! - [`runtime`]: the Raft runtime, apart from the work runtime so that a
//!   backlog of requests cannot delay a heartbeat;
//! - [`shard`]: one hosted shard and whether this node may fire for it;
//! - [`proposer`]: batching commands into Raft entries;
//! - [`events`]: how applied changes reach the fire loop;
//! - [`leader`]: epoch, rebuild, loader, wheel, fire batches, purge;
//! - [`delivery`]: webhooks (signing, per-endpoint limits) and pull topics;
//! - [`api`]: gRPC services and the HTTP mirror;
//! - [`forward`]: one-hop forwarding to shard leaders;
//! - [`meta`]: the metadata group and the cluster map it replicates;
//! - [`reconcile`]: moving replicas to where the map says, cleaning up;
//! - [`replicas`]: changing a group's voters; the `ReplicaControl` service;
//! - [`ops`]: the cluster operations behind `tocsin admin`;
//! - [`view`]: where the replicas are, as the nodes report it;
//! - [`balance`]: spreading leaderships, handing them over on shutdown;
//! - [`admission`]: rate and disk limits;
//! - [`json`]: JSON forms of API messages and deliveries;
//! - [`clock`]: the only wall-clock reads, and the guard against a clock
//!   that jumps or drifts from the peers';
//! - [`fault`]: fault points for tests (compiled out of release builds).

pub mod admission;
pub mod api;
pub mod balance;
pub mod clock;
pub mod config;
pub mod delivery;
pub mod events;
pub mod fault;
pub mod forward;
pub mod json;
pub mod leader;
pub mod link;
pub mod meta;
pub mod node;
pub mod ops;
pub mod proposer;
pub mod raft;
pub mod reconcile;
pub mod replicas;
pub mod runtime;
pub mod shard;
pub mod view;

pub use config::NodeConfig;
pub use node::Node;
pub use node::NodeState;
