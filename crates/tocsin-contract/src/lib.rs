//! The wire contract: everything the node, the client, the CLI and the
//! chaos tests must agree on, defined once. It links neither RocksDB nor
//! openraft, so a webhook receiver (`tocsin sink`) or a client builds
//! without them.
//!
//! - [`codes`]: error code names, their HTTP statuses, `ErrorInfo` in a
//!   gRPC status;
//! - [`headers`]: the metadata and HTTP header names;
//! - [`json`]: JSON forms of the API messages and of a webhook delivery;
//! - [`signing`]: Standard Webhooks signatures;
//! - [`verdict`]: what a receiver decided about a delivery;
//! - [`link_frame`]: the Raft link's preface and frames;
//! - [`map`]: folding the nodes' shard maps into one view;
//! - [`query`]: the HTTP API's query strings as gRPC requests;
//! - [`relay`]: copying a node's `Reserve` stream to a consumer;
//! - [`tls`]: the HTTP client builder with the process's crypto provider.

pub mod codes;
pub mod headers;
pub mod json;
pub mod link_frame;
pub mod map;
pub mod query;
pub mod relay;
pub mod signing;
pub mod tls;
pub mod verdict;

pub use verdict::Verdict;
