//! The Reserve relay: copying one node's `Reserve` stream into a
//! consumer's channel, as the shard-aware client does for every node and a
//! node does for its peers' shards when a plain client reserves through it.

use tocsin_proto::v1 as pb;
use tokio::sync::mpsc;

/// Why [`relay`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayEnd {
    /// The node's stream ended or failed: open another (after a pause).
    StreamEnded,
    /// The consumer is gone: stop, and drop the stream so the node stops
    /// reserving for it.
    ConsumerGone,
}

/// Forwards every batch of `stream` to `tx` until one side ends. Watching
/// `tx` too, not only the stream, is what stops a relay (and so the node's
/// reservations) as soon as the consumer leaves.
pub async fn relay(
    stream: &mut tonic::Streaming<pb::ReserveResponse>,
    tx: &mpsc::Sender<pb::ReserveResponse>,
) -> RelayEnd {
    loop {
        tokio::select! {
            msg = stream.message() => match msg {
                Ok(Some(batch)) => if tx.send(batch).await.is_err() { return RelayEnd::ConsumerGone },
                _ => return RelayEnd::StreamEnded,
            },
            _ = tx.closed() => return RelayEnd::ConsumerGone,
        }
    }
}
