//! Tocsin's domain, free of I/O, clocks and frameworks.
//!
//! - [`timer`]: what a timer is ([`TimerRecord`]) and what a client asks for
//!   ([`TimerSpec`]);
//! - [`limits`] and [`validate`]: input rules, with the offending field named;
//! - [`command`]: the commands a shard's Raft log carries;
//! - [`apply`]: the pure, deterministic rules that apply a command to a
//!   shard's state;
//! - [`fire`]: the shard leader's fire-loop decisions (what to load, what
//!   to fire, what to re-read), as a pure state machine over the wheel;
//! - [`routing`]: key → shard (jump hash over xxh3) and shard → nodes (a
//!   token ring);
//! - [`recurrence`]: recurring timers' rules (cron in a time zone, interval)
//!   and the pure calculation of their occurrences;
//! - [`backoff`]: the retry schedule;
//! - [`breaker`]: a webhook endpoint's health (circuit breaker, slow-down,
//!   disabled URLs);
//! - [`egress`]: the SSRF guard's rules for webhook targets;
//! - [`cluster`]: the replicated cluster map (nodes, their states, each
//!   shard's target replicas, the map epoch), its rules and the planners of
//!   cluster operations.
//!
//! **Architecture Invariant:** nothing here reads a clock, touches a file or a
//! socket, or links RocksDB, tonic or openraft. Time arrives as data
//! (`now_ms` stamped by the shard leader into each log entry).

pub mod apply;
pub mod arm;
pub mod auth;
pub mod backoff;
pub mod breaker;
pub mod cluster;
pub mod command;
pub mod egress;
pub mod fire;
pub mod limits;
pub mod mem_table;
pub mod recurrence;
pub mod routing;
pub mod timer;
pub mod validate;

pub use apply::ApplyCtx;
pub use apply::ApplyError;
pub use apply::ShardMeta;
pub use apply::TimerTable;
pub use command::Command;
pub use command::CommandResult;
pub use command::Proposal;
pub use limits::Limits;
pub use timer::Callback;
pub use timer::Due;
pub use timer::DueKind;
pub use timer::DuePos;
pub use timer::FirePhase;
pub use timer::FireRecord;
pub use timer::FireTime;
pub use timer::RetryPolicy;
pub use timer::TimerKey;
pub use timer::TimerRecord;
pub use timer::TimerSpec;
pub use timer::TimerState;
pub use validate::ValidationError;

/// A Raft node's id. Never reused for a different node.
pub type NodeId = u64;
/// A shard (virtual partition) number in `0..num_shards`.
pub type ShardId = u32;
