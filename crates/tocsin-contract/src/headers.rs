//! Header names: gRPC metadata between clients and nodes, and the HTTP
//! headers of a webhook delivery.

/// Set on a request one node forwards to another; never forwarded again.
pub const FORWARDED: &str = "x-tocsin-forwarded";
/// Set on a `Reserve` stream that should serve only this node's shards (the
/// shard-aware client opens one per node itself).
pub const LOCAL_ONLY: &str = "x-tocsin-local";
/// Set on `ListTimers` / `GetHorizon` to ask about one shard only.
pub const SHARD: &str = "x-tocsin-shard";
/// Set by the shard-aware client: the cluster map epoch it routed the
/// request by. A node whose shard placement is newer answers ABORTED.
pub const MAP_EPOCH: &str = "x-tocsin-map-epoch";
/// Set on the response to a request a node forwarded: the id of the node
/// that answered it, the shard's leader, so the client routes there next.
pub const LEADER: &str = "x-tocsin-leader";

/// Standard Webhooks: the delivery's id (the fire id).
pub const WEBHOOK_ID: &str = "webhook-id";
/// Standard Webhooks: Unix seconds when the delivery was signed.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// Standard Webhooks: `v1,<base64 HMAC-SHA256>`, space-separated if several.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
