//! Delivery of fired timers: webhooks ([`webhook`]), AMQP publishes
//! ([`amqp`]) and pull topics ([`pull`]), with Standard Webhooks signing
//! (`tocsin_contract::signing`). A push attempt's lease gate and outcome
//! recording are shared ([`attempt`]).

pub mod amqp;
pub mod attempt;
pub mod paused;
pub mod pull;
pub mod webhook;

use std::sync::Arc;

use tocsin_core::Callback;
use tocsin_core::FirePhase;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;

use crate::shard::ShardCtx;

/// Routes each dispatched timer to its delivery mechanism.
pub struct Dispatcher {
    pub webhook: Arc<webhook::WebhookSender>,
    pub amqp: Arc<amqp::AmqpSender>,
    pub pull: Arc<pull::PullHub>,
}

impl Dispatcher {
    /// Hands a timer whose `Fire` was just applied (under this node's
    /// `epoch`) to delivery: a webhook attempt is sent, a ready pull timer
    /// is offered to the topic's consumers.
    pub fn dispatch(&self, ctx: &Arc<ShardCtx>, epoch: u64, key: TimerKey, record: TimerRecord) {
        let Some(fire) = &record.fire else { return };
        if fire.attempt <= 1 && fire.fired_at_ms == fire.attempt_started_at_ms {
            ctx.record_fire_lateness(&key.namespace, record.fire_at_ms);
        }
        match (&record.callback, fire.phase) {
            (Callback::Webhook { .. }, FirePhase::InFlight { .. }) => {
                self.webhook.spawn(ctx.clone(), epoch, key, record)
            }
            (Callback::Amqp { .. }, FirePhase::InFlight { .. }) => self.amqp.spawn(ctx.clone(), epoch, key, record),
            (Callback::Pull { .. }, FirePhase::Ready { .. }) => self.pull.offer(ctx, key, &record),
            _ => {
                tracing::warn!(shard = ctx.shard, %key, phase = ?fire.phase, "dispatch of a timer in an unexpected phase")
            }
        }
    }
}
