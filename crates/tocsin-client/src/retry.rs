//! Retrying: run a call against the right node, follow leader hints,
//! refresh a stale map, back off (`tocsin_core::backoff::equal_jitter_ms`)
//! and retry what may be retried.

use std::time::Duration;

use tocsin_proto::v1 as pb;
use tocsin_proto::v1::timer_service_client::TimerServiceClient;

use crate::Client;
use crate::ClientError;
use crate::LEADER_HEADER;
use crate::conn::Conn;

impl Client {
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let o = &self.inner.options;
        Duration::from_millis(tocsin_core::backoff::equal_jitter_ms(
            o.initial_backoff.as_millis() as u64,
            o.max_backoff.as_millis() as u64,
            attempt.min(16),
            rand::random::<f64>(),
        ))
    }

    /// The error of a call `addr` did not answer within the request timeout.
    pub(crate) fn no_answer(&self, addr: &str) -> ClientError {
        ClientError::Status {
            code: tonic::Code::DeadlineExceeded,
            message: format!("no answer from {addr} within {:?}", self.inner.options.request_timeout),
            info: pb::ErrorInfo::default(),
        }
    }

    /// Runs `call` against the right node, following hints and retrying
    /// retryable failures.
    pub(crate) async fn call<T, F, Fut>(&self, shard: Option<u32>, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(TimerServiceClient<Conn>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_channel(shard, |channel| call(TimerServiceClient::new(channel).max_decoding_message_size(64 << 20)))
            .await
    }

    /// [`Client::call`], and whether it sent the call more than once: a
    /// create sent again may find the timer its unanswered first send
    /// created (`Client::finished_on_retry`).
    pub(crate) async fn call_counting_sends<T, F, Fut>(
        &self,
        shard: Option<u32>,
        mut call: F,
    ) -> (Result<T, ClientError>, bool)
    where
        F: FnMut(TimerServiceClient<Conn>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut sends = 0u32;
        let result = self
            .call(shard, |c| {
                sends += 1;
                call(c)
            })
            .await;
        (result, sends > 1)
    }

    /// [`Client::call`] for any service on the node's channel.
    pub(crate) async fn call_channel<T, F, Fut>(&self, shard: Option<u32>, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut last = ClientError::Unreachable("no attempt made".into());
        for attempt in 0..self.inner.options.max_attempts {
            let addr = self.addr_for(shard, attempt)?;
            let channel = self.channel(&addr)?;
            match tokio::time::timeout(self.inner.options.request_timeout, call(channel)).await {
                Ok(Ok(resp)) => {
                    // Forwarded to the shard's leader: route there next time.
                    if let Some(leader) = forwarded_to(resp.metadata()) {
                        self.learned_leader(shard, leader);
                    }
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) => {
                    let err = ClientError::from_status(status);
                    if !err.retryable() {
                        return Err(err);
                    }
                    // Routed by a stale map: refresh it and retry at once.
                    if let ClientError::Status { code: tonic::Code::Aborted, info, .. } = &err
                        && info.map_epoch > 0
                    {
                        self.refresh_to(info.map_epoch).await;
                        // The nodes asked may not have the new map yet
                        // either: give them a moment.
                        if self.map_epoch() < info.map_epoch {
                            tokio::time::sleep(self.backoff(attempt)).await;
                        }
                        last = err;
                        continue;
                    }
                    if err.code() == tonic::Code::DeadlineExceeded
                        || (err.code() == tonic::Code::Unavailable
                            && matches!(&err, ClientError::Status { info, .. } if info.leader.is_none()))
                    {
                        self.suspect(&addr);
                    }
                    // A fresh hint means retry now; otherwise try elsewhere,
                    // refresh and back off.
                    if !self.learn(shard, &err) {
                        // Overloaded is not misrouted: a node sheds creates
                        // only for shards it leads, so the route is right and
                        // only the wait it asks for is needed. Forgetting the
                        // leader sent every retry of a shed create through
                        // another node's forwarding, on a cluster short of CPU.
                        let overloaded = err.code() == tonic::Code::ResourceExhausted;
                        if !overloaded {
                            self.forget_leader(shard);
                        }
                        let wait = match &err {
                            ClientError::Status { info, .. } if info.retry_after_ms > 0 => {
                                Duration::from_millis(info.retry_after_ms).max(self.backoff(attempt))
                            }
                            _ => self.backoff(attempt),
                        };
                        tokio::time::sleep(wait).await;
                        if !overloaded {
                            self.refresh_after_failure().await;
                        }
                    }
                    last = err;
                }
                Err(_) => {
                    last = self.no_answer(&addr);
                    self.suspect(&addr);
                    self.forget_leader(shard);
                    tokio::time::sleep(self.backoff(attempt)).await;
                    self.refresh_after_failure().await;
                }
            }
        }
        Err(last)
    }
}

/// The leader a node forwarded the call to, from its answer's metadata.
pub(crate) fn forwarded_to(metadata: &tonic::metadata::MetadataMap) -> Option<u64> {
    metadata.get(LEADER_HEADER).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}
