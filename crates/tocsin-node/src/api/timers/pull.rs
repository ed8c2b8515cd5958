//! Pull delivery over the API: `Reserve` streams (this node's shards, and
//! every peer's relayed) and settling deliveries with `Ack` and `Nack`.

use std::collections::BTreeMap;

use tocsin_core::Callback;
use tocsin_core::TimerKey;
use tocsin_core::validate;
use tocsin_proto::v1 as pb;
use tonic::Request;
use tonic::Status;

use crate::api::timers::ReserveStream;
use crate::api::timers::TimerApi;
use crate::error::NodeError;
use crate::shard::delivery::pull::AckStatus;
use crate::shard::delivery::pull::ReserveOptions;
use tocsin_contract::relay::RelayEnd;
use tocsin_contract::relay::relay;

impl TimerApi {
    /// `Reserve`: this node's own shards, and, unless the request is
    /// local-only, every peer's relayed into the same stream.
    pub(super) fn reserve_stream(&self, req: pb::ReserveRequest, local_only: bool) -> Result<ReserveStream, NodeError> {
        validate::check_namespace(&req.namespace)?;
        validate::check_callback(&Callback::Pull { topic: req.topic.clone(), ttr_ms: 0 })?;
        let options = ReserveOptions::new(req.ttr_ms, req.max_batch, req.max_in_flight);
        let mut local = self.node.dispatcher.pull.reserve(req.namespace.clone(), req.topic.clone(), options);
        if local_only {
            let stream = tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(local), Ok);
            return Ok(Box::pin(stream));
        }
        // A plain client gets every node's ready timers through this one stream:
        // this node reserves from its own shards and relays streams opened on
        // the others (each marked local-only).
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        {
            let tx = tx.clone();
            // Watch the consumer too, not only the batches: dropping `local`
            // as soon as the consumer leaves is what stops this node from
            // reserving more timers for a consumer that is gone.
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        batch = local.recv() => match batch {
                            Some(batch) => if tx.send(batch).await.is_err() { return },
                            None => return,
                        },
                        _ = tx.closed() => return,
                    }
                }
            });
        }
        for addr in self.node.peer_addrs() {
            let tx = tx.clone();
            let req = req.clone();
            let forwarder = self.node.forwarder.clone();
            tokio::spawn(async move {
                while !tx.is_closed() {
                    if let Some(mut client) = forwarder.client(&addr) {
                        let mut request = Request::new(req.clone());
                        request
                            .metadata_mut()
                            .insert(tocsin_contract::headers::LOCAL_ONLY, "1".parse().expect("ascii"));
                        if let Ok(resp) = client.reserve(request).await
                            && relay(&mut resp.into_inner(), &tx).await == RelayEnd::ConsumerGone
                        {
                            return;
                        }
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            });
        }
        drop(tx);
        let stream = tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok);
        Ok(Box::pin(stream))
    }

    pub(super) async fn settle(
        &self,
        refs: Vec<pb::DeliveryRef>,
        nack: Option<(u64, String)>,
        forwarded: bool,
        map_epoch: u64,
    ) -> Result<Vec<pb::AckResult>, Status> {
        if refs.len() > self.limits().max_settle_batch {
            let message = format!("at most {} per call", self.limits().max_settle_batch);
            return Err(NodeError::invalid("deliveries", message).into());
        }
        let mut statuses = vec![AckStatus::NotFound; refs.len()];
        let cluster_id = self.node.map.cluster_id_cell();
        let mut by_shard: BTreeMap<u32, Vec<(usize, pb::DeliveryRef, TimerKey, u64)>> = BTreeMap::new();
        for (i, r) in refs.into_iter().enumerate() {
            // One bad reference refuses the whole call before anything is
            // settled, and says which one: the consumer fixes or drops it and
            // sends the rest again, knowing none of them took effect.
            let refused = |field: &str, message: &str| {
                let message = format!("deliveries[{i}]: {message}; nothing in this call was settled");
                NodeError::invalid(&format!("deliveries.{field}"), message)
            };
            let key = TimerKey::new(r.namespace.clone(), r.id.clone());
            validate::check_key(&key).map_err(|e| match NodeError::from(e) {
                NodeError::InvalidArgument { field, message } => refused(&field, &message),
                other => other,
            })?;
            let Some((cluster, shard, index)) = tocsin_core::timer::parse_fire_id(&r.fire_id) else {
                return Err(refused("fire_id", &format!("{:?} is not a fire id", r.fire_id)).into());
            };
            if cluster_id.get().map(String::as_str) != Some(cluster) {
                continue; // NOT_FOUND: another cluster's (an old one's) firing
            }
            let owner = tocsin_core::routing::shard_for(&key.namespace, &key.id, self.node.config.num_shards);
            if owner != shard {
                continue; // NOT_FOUND: that firing cannot belong to this key
            }
            by_shard.entry(shard).or_default().push((i, r, key, index));
        }
        let per_shard = by_shard.into_iter().map(|(shard, items)| {
            let nack = nack.clone();
            async move {
                self.node.check_route(shard, map_epoch)?;
                let ctx = self.node.shard(shard)?;
                if ctx.epoch().is_none() {
                    // Another node leads the shard: its hub holds the reservations.
                    let hint = ctx.leader_hint().map(|(_, addr)| addr.peer_addr).filter(|_| !forwarded);
                    let Some(addr) = hint else {
                        return Err(NodeError::Unavailable {
                            message: format!("shard {shard} has no leader here; retry"),
                            leader: None,
                            retry_after_ms: 100,
                        });
                    };
                    let (positions, deliveries): (Vec<usize>, Vec<pb::DeliveryRef>) =
                        items.into_iter().map(|(i, r, _, _)| (i, r)).unzip();
                    let results = match &nack {
                        None => {
                            self.forward(&addr, pb::AckRequest { deliveries }, None, |mut c, r| async move {
                                c.ack(r).await
                            })
                            .await
                            .map(|r| r.results)
                        }
                        Some((delay_ms, reason)) => self
                            .forward(
                                &addr,
                                pb::NackRequest { deliveries, delay_ms: *delay_ms, reason: reason.clone() },
                                None,
                                |mut c, r| async move { c.nack(r).await },
                            )
                            .await
                            .map(|r| r.results),
                    }
                    .map_err(crate::api::timers::forward_failed)?;
                    use pb::ack_result::Status as S;
                    let statuses = results.into_iter().map(|r| match S::try_from(r.status) {
                        Ok(S::Ok) => AckStatus::Ok,
                        Ok(S::NotFound) => AckStatus::NotFound,
                        _ => AckStatus::Stale,
                    });
                    return Ok(positions.into_iter().zip(statuses).collect::<Vec<_>>());
                }
                let (positions, refs): (Vec<usize>, Vec<(TimerKey, u64, u32)>) =
                    items.into_iter().map(|(i, r, k, f)| (i, (k, f, r.attempt))).unzip();
                let results = self.node.dispatcher.pull.settle(&ctx, refs, nack).await;
                Ok::<_, NodeError>(positions.into_iter().zip(results).collect::<Vec<_>>())
            }
        });
        for shard_results in futures::future::join_all(per_shard).await {
            for (i, status) in shard_results.map_err(Status::from)? {
                statuses[i] = status;
            }
        }
        use pb::ack_result::Status as S;
        Ok(statuses
            .into_iter()
            .map(|s| pb::AckResult {
                status: match s {
                    AckStatus::Ok => S::Ok,
                    AckStatus::Stale => S::Stale,
                    AckStatus::NotFound => S::NotFound,
                } as i32,
            })
            .collect())
    }
}
