//! Parse once: each wire request becomes a validated domain value here,
//! exactly once, on the node that receives it. Everything below the API
//! takes these values, never a proto: the key is checked and its shard
//! hashed once, "`fire_at_ms` or `delay_ms`" is decided in one place
//! ([`fire_time`], which the HTTP mirror calls too), and the create's spec is
//! checked field by field once. The fire time's range depends on the
//! leader's clock, so it is checked where the leader stamps it
//! (`validate::resolve_fire_at`), not here.

use tocsin_core::Callback;
use tocsin_core::Limits;
use tocsin_core::RetryPolicy;
use tocsin_core::ShardId;
use tocsin_core::TimerKey;
use tocsin_core::TimerSpec;
use tocsin_core::recurrence::Recurrence;
use tocsin_core::recurrence::Rule;
use tocsin_core::timer::FireTime;
use tocsin_core::validate;
use tocsin_proto::v1 as pb;

use crate::egress::CheckedUrls;
use crate::error::NodeError;
use crate::shard::delivery::amqp::AmqpSender;

/// A checked key and the shard it hashes to.
#[derive(Clone, Debug)]
pub struct Keyed {
    pub key: TimerKey,
    pub shard: ShardId,
}

/// A checked create: its key (and shard) and its spec.
#[derive(Clone, Debug)]
pub struct ValidCreate {
    pub target: Keyed,
    pub spec: TimerSpec,
    /// Replace a finished timer under the id (`replace_finished`).
    pub replace_finished: bool,
}

/// A checked reschedule.
#[derive(Clone, Debug)]
pub struct ValidReschedule {
    pub target: Keyed,
    pub expected_generation: u64,
    pub fire_time: FireTime,
}

/// Checks a namespace and id and hashes them to their shard.
pub fn key(namespace: &str, id: &str, num_shards: u32) -> Result<Keyed, NodeError> {
    let key = TimerKey::new(namespace.to_string(), id.to_string());
    validate::check_key(&key)?;
    let shard = tocsin_core::routing::shard_for(&key.namespace, &key.id, num_shards);
    Ok(Keyed { key, shard })
}

/// The one rule for a request's fire time: exactly one of `fire_at_ms` and
/// `delay_ms`. (The proto's oneof cannot carry both; JSON can.)
pub fn fire_time(fire_at_ms: Option<u64>, delay_ms: Option<u64>) -> Result<FireTime, NodeError> {
    match (fire_at_ms, delay_ms) {
        (Some(_), Some(_)) => Err(NodeError::invalid("delay_ms", "give fire_at_ms or delay_ms, not both")),
        (Some(at), None) => Ok(FireTime::At(at)),
        (None, Some(d)) => Ok(FireTime::Delay(d)),
        (None, None) => Err(NodeError::invalid("fire_at_ms", "give fire_at_ms or delay_ms")),
    }
}

/// A recurrence as the proto carries it: exactly one rule.
fn recurrence(r: &pb::Recurrence) -> Result<Recurrence, NodeError> {
    let rule = match &r.rule {
        Some(pb::recurrence::Rule::Cron(expr)) => Rule::Cron { expr: expr.clone(), tz: r.time_zone.clone() },
        Some(pb::recurrence::Rule::EveryMs(every)) => {
            if !r.time_zone.is_empty() {
                return Err(NodeError::invalid("recurrence.time_zone", "applies to recurrence.cron only"));
            }
            Rule::Every { interval_ms: *every }
        }
        None => return Err(NodeError::invalid("recurrence", "give recurrence.cron or recurrence.every_ms")),
    };
    Ok(Recurrence { rule, until_ms: r.until_ms, count: r.count, catch_up_all: r.catch_up_all })
}

/// Checks a create request.
pub fn create(
    req: &pb::CreateTimerRequest,
    limits: &Limits,
    num_shards: u32,
    egress: &CheckedUrls,
    amqp: &AmqpSender,
) -> Result<ValidCreate, NodeError> {
    use pb::create_timer_request::FireTime as F;
    let target = key(&req.namespace, &req.id, num_shards)?;
    let recurrence = req.recurrence.as_ref().map(recurrence).transpose()?;
    let fire_time = match (req.fire_time, &recurrence) {
        (Some(F::FireAtMs(at)), _) => fire_time(Some(at), None)?,
        (Some(F::DelayMs(d)), _) => fire_time(None, Some(d))?,
        // A series with no start: now for cron, one interval from now.
        (None, Some(r)) => match r.rule {
            Rule::Every { interval_ms } => FireTime::Delay(interval_ms),
            Rule::Cron { .. } => FireTime::Delay(0),
        },
        (None, None) => fire_time(None, None)?,
    };
    let callback = match req.callback.as_ref().and_then(|c| c.target.as_ref()) {
        Some(pb::callback::Target::Webhook(w)) => Callback::Webhook { url: w.url.clone() },
        Some(pb::callback::Target::Pull(p)) => Callback::Pull { topic: p.topic.clone(), ttr_ms: p.ttr_ms },
        Some(pb::callback::Target::Amqp(a)) => Callback::Amqp {
            broker: a.broker.clone(),
            exchange: a.exchange.clone(),
            routing_key: a.routing_key.clone(),
        },
        None => {
            return Err(NodeError::invalid(
                "callback",
                "give callback.webhook.url, callback.pull.topic or callback.amqp.broker",
            ));
        }
    };
    let retry = req.retry.as_ref().map_or(RetryPolicy::default(), |r| RetryPolicy {
        max_attempts: r.max_attempts,
        initial_backoff_ms: r.initial_backoff_ms,
        max_backoff_ms: r.max_backoff_ms,
        give_up_after_ms: r.give_up_after_ms,
    });
    let spec = TimerSpec {
        fire_time,
        payload: req.payload.clone(),
        labels: req.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        callback,
        retry,
        skip_if_late_ms: req.skip_if_late_ms,
        recurrence,
    };
    validate::check_skip_if_late(spec.skip_if_late_ms)?;
    if let Some(r) = &spec.recurrence {
        validate::check_recurrence(r, &spec.retry)?;
    }
    validate::check_payload(&spec.payload, limits)?;
    validate::check_labels(&spec.labels)?;
    validate::check_callback(&spec.callback)?;
    if let Callback::Webhook { url } = &spec.callback {
        // The SSRF guard's create-time half (the other is at connect).
        egress.check_url(url).map_err(|e| NodeError::invalid("callback.webhook.url", e.to_string()))?;
    }
    if let Callback::Amqp { broker, .. } = &spec.callback
        && !amqp.knows(broker)
    {
        return Err(NodeError::invalid(
            "callback.amqp.broker",
            format!("no AMQP broker named {broker:?} is configured (the node's delivery.amqp_brokers)"),
        ));
    }
    validate::check_retry(&spec.retry, limits)?;
    Ok(ValidCreate { target, spec, replace_finished: req.replace_finished })
}

/// Checks a reschedule request.
pub fn reschedule(req: &pb::RescheduleTimerRequest, num_shards: u32) -> Result<ValidReschedule, NodeError> {
    use pb::reschedule_timer_request::FireTime as F;
    let target = key(&req.namespace, &req.id, num_shards)?;
    if req.expected_generation == 0 {
        return Err(NodeError::invalid("expected_generation", "give the generation you last saw (1 or more)"));
    }
    let fire_time = match req.fire_time {
        Some(F::FireAtMs(at)) => fire_time(Some(at), None)?,
        Some(F::DelayMs(d)) => fire_time(None, Some(d))?,
        None => fire_time(None, None)?,
    };
    Ok(ValidReschedule { target, expected_generation: req.expected_generation, fire_time })
}

/// Checks a nack: its delay is bounded, its reason cut to the limit.
pub fn nack(req: &pb::NackRequest, limits: &Limits) -> Result<(u64, String), NodeError> {
    validate::check_nack_delay(req.delay_ms)?;
    let reason = if req.reason.is_empty() {
        "nacked by consumer".to_string()
    } else {
        req.reason.chars().take(limits.max_reason_chars).collect()
    };
    Ok((req.delay_ms, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(e: NodeError) -> String {
        match e {
            NodeError::InvalidArgument { field, .. } => field,
            other => panic!("not INVALID_ARGUMENT: {other:?}"),
        }
    }

    #[test]
    fn a_nack_delay_is_bounded_and_its_reason_cut() {
        let limits = Limits { max_reason_chars: 3, ..Limits::default() };
        let req = pb::NackRequest { delay_ms: u64::MAX, ..Default::default() };
        assert_eq!(field(nack(&req, &limits).unwrap_err()), "delay_ms");
        let req = pb::NackRequest { delay_ms: 500, reason: "abcdef".into(), ..Default::default() };
        assert_eq!(nack(&req, &limits).unwrap(), (500, "abc".to_string()));
    }

    #[test]
    fn one_fire_time_exactly() {
        assert_eq!(fire_time(Some(5), None).unwrap(), FireTime::At(5));
        assert_eq!(fire_time(None, Some(7)).unwrap(), FireTime::Delay(7));
        assert_eq!(field(fire_time(Some(5), Some(7)).unwrap_err()), "delay_ms");
        assert_eq!(field(fire_time(None, None).unwrap_err()), "fire_at_ms");
    }

    #[test]
    fn a_create_is_checked_field_by_field_and_hashed_once() {
        let limits = Limits::default();
        let open = CheckedUrls::new(std::sync::Arc::new(crate::egress::EgressPolicy::default()));
        let brokers = std::collections::BTreeMap::from([(
            "main".to_string(),
            crate::config::BrokerUrl("amqp://127.0.0.1:5672/%2f".into()),
        )]);
        let amqp = AmqpSender::new(&brokers);
        let mut req = pb::CreateTimerRequest {
            namespace: "orders".into(),
            id: "o-1".into(),
            fire_time: Some(pb::create_timer_request::FireTime::DelayMs(1000)),
            callback: Some(pb::Callback {
                target: Some(pb::callback::Target::Pull(pb::Pull { topic: "t".into(), ttr_ms: 0 })),
            }),
            ..Default::default()
        };
        let valid = create(&req, &limits, 16, &open, &amqp).unwrap();
        assert_eq!(valid.target.shard, tocsin_core::routing::shard_for("orders", "o-1", 16));
        assert_eq!(valid.spec.fire_time, FireTime::Delay(1000));
        req.namespace = String::new();
        assert_eq!(field(create(&req, &limits, 16, &open, &amqp).unwrap_err()), "namespace");
        req.namespace = "orders".into();
        req.callback = None;
        assert_eq!(field(create(&req, &limits, 16, &open, &amqp).unwrap_err()), "callback");
        // The SSRF guard refuses a loopback target unless it is allowed.
        let hook = |url: &str| {
            Some(pb::Callback { target: Some(pb::callback::Target::Webhook(pb::Webhook { url: url.into() })) })
        };
        req.callback = hook("http://0x7f.1:9000/hook");
        let refused = create(&req, &limits, 16, &open, &amqp).unwrap_err();
        assert_eq!(field(refused.clone()), "callback.webhook.url");
        assert!(refused.to_string().contains("loopback"), "{refused}");
        let loopback =
            CheckedUrls::new(std::sync::Arc::new(crate::egress::EgressPolicy::parse(&["127.0.0.0/8".into()]).unwrap()));
        assert!(create(&req, &limits, 16, &loopback, &amqp).is_ok());
        req.callback = hook("https://example.com/hook");
        assert!(create(&req, &limits, 16, &open, &amqp).is_ok());
        // An AMQP callback names a configured broker, never an address.
        let amqp_to = |broker: &str, exchange: &str| {
            Some(pb::Callback {
                target: Some(pb::callback::Target::Amqp(pb::Amqp {
                    broker: broker.into(),
                    exchange: exchange.into(),
                    routing_key: "app-a".into(),
                })),
            })
        };
        req.callback = amqp_to("main", "apps");
        assert!(create(&req, &limits, 16, &open, &amqp).is_ok());
        req.callback = amqp_to("other", "apps");
        assert_eq!(field(create(&req, &limits, 16, &open, &amqp).unwrap_err()), "callback.amqp.broker");
        req.callback = amqp_to("main", "bad exchange");
        assert_eq!(field(create(&req, &limits, 16, &open, &amqp).unwrap_err()), "callback.amqp.exchange");
    }
}
