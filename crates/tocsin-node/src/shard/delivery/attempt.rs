//! What every push attempt (a webhook request, an AMQP publish) does
//! around its send: the lease gate right before it, and recording its
//! outcome after.
//!
//! An attempt has a deadline in replicated state (its `InFlight` phase's
//! `until_ms`); one that cannot be sent in time, or whose outcome cannot be
//! recorded, is simply left, and the deadline starts the next attempt.

use std::time::Duration;

use tocsin_core::Command;
use tocsin_core::FireRecord;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::command::AttemptOutcome;
use tocsin_core::command::AttemptReport;

use crate::shard::ShardCtx;
use crate::shard::proposer::ProposeError;

/// Time kept free before an attempt's deadline to record its outcome.
pub const RECORD_MARGIN_MS: u64 = 200;
/// Shortest send worth starting.
const MIN_SEND_MS: u64 = 50;

/// The lease gate, right before a send: a leader that lost its quorum holds
/// back until the lease returns or someone else leads. A node that has not
/// learned the cluster map has no cluster id to put in the delivery: it
/// holds back likewise (on a new cluster, for the moment between a shard's
/// first leader and the first map). Returns the time the send may take
/// (what is left of the attempt, less the time to record it), or `None`
/// when the attempt is to be left to its deadline. `sink` labels the
/// abandoned-attempt counter: `leadership` (another epoch leads now),
/// `lease` (the lease did not come back in time), `deadline` (too little
/// of the attempt was left to send it).
///
/// The gate waits as long as the attempt has: giving up sooner gains
/// nothing, since the next attempt starts only at the attempt's deadline in
/// replicated state either way. A fixed wait of four election timeouts
/// (520 ms with 40 / 100–130 ms timings) gave up on 535–1,016 attempts per
/// run on the node taking the load in the three-node overload runs, each
/// then 10 s late, while the lease lapsed for moments under saturation
/// (docs/perf-history.md, "Raft threads first").
pub async fn gate(ctx: &ShardCtx, epoch: u64, until_ms: u64, sink: &'static str) -> Option<u64> {
    let abandon = |reason: &'static str| {
        metrics::counter!("tocsin_attempts_abandoned_total", "sink" => sink, "reason" => reason).increment(1);
        None
    };
    loop {
        if ctx.epoch() != Some(epoch) {
            return abandon("leadership");
        }
        let ready = ctx.may_dispatch(epoch) && ctx.cluster_id().is_some();
        let left_ms = until_ms.saturating_sub(ctx.clock.now_ms()).saturating_sub(RECORD_MARGIN_MS);
        if left_ms < MIN_SEND_MS {
            return abandon(if ready { "deadline" } else { "lease" });
        }
        if ready {
            return Some(left_ms);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reports how long the attempt waited since it started in replicated
/// state (for a first attempt, its `Fire`), for a connection slot and for
/// the lease: right before its send, or when it gave up waiting for a slot.
/// Creates of a namespace whose attempts wait too long are shed
/// (`admission::DeliveryLag`).
pub fn note_wait(ctx: &ShardCtx, key: &TimerKey, record: &TimerRecord) {
    if let Some(fire) = &record.fire {
        let wait_ms = ctx.clock.now_ms().saturating_sub(fire.attempt_started_at_ms);
        ctx.delivery_lag.note(&key.namespace, wait_ms, std::time::Instant::now());
    }
}

/// Counts a delivery's latency (fire time to acknowledgement) in its
/// namespace's histogram.
pub fn observe_delivered(key: &TimerKey, fire_at_ms: u64, now_ms: u64) {
    metrics::histogram!("tocsin_delivery_latency_seconds", "namespace" => crate::labels::namespace(&key.namespace))
        .record(now_ms.saturating_sub(fire_at_ms) as f64 / 1000.0);
}

/// Records how the attempt `fire` has under way ended (see
/// [`record_outcome`]).
pub async fn record(
    ctx: &ShardCtx,
    epoch: u64,
    key: TimerKey,
    fire: &FireRecord,
    outcome: AttemptOutcome,
    report: AttemptReport,
) {
    let command = Command::AttemptResult { key, fire_index: fire.fire_index, attempt: fire.attempt, outcome, report };
    record_outcome(ctx, epoch, command).await;
}

/// Records an attempt's outcome, retrying while this node still leads under
/// `epoch`: a proposal that fails (queue full, quorum briefly lost, timeout)
/// is tried again rather than left to the attempt's deadline.
async fn record_outcome(ctx: &ShardCtx, epoch: u64, command: Command) {
    let mut delay = Duration::from_millis(20);
    for attempt in 0..8 {
        let proposed = match crate::fault::hit("webhook::record_outcome").await {
            Some(_) => Err(ProposeError::Overloaded { retry_after: Duration::from_millis(100) }),
            // Nobody waits on the outcome but the timer's next step, which
            // has until the attempt's deadline: it rides with the shard's
            // next entry (`proposer`'s "commands that can wait").
            None => ctx.proposer.propose_deferred(command.clone()).await,
        };
        match proposed {
            Ok(_) => return,
            Err(ProposeError::NotLeader { .. } | ProposeError::Discarded { .. }) => return,
            Err(e) if ctx.epoch() != Some(epoch) => {
                tracing::debug!(shard = ctx.shard, error = %e, "could not record an attempt outcome; no longer leading");
                return;
            }
            Err(e) => {
                tracing::debug!(shard = ctx.shard, attempt, error = %e, "recording an attempt outcome failed; retrying");
                metrics::counter!("tocsin_attempt_outcome_retries_total").increment(1);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
    // The attempt's deadline starts the next attempt.
}
