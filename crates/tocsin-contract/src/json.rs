//! JSON forms of the API messages (proto3 JSON mapping with the proto's own
//! snake_case field names: bytes as base64, enums as their names, 64-bit
//! integers written as numbers and read from numbers or strings), plus the
//! conversions from stored records to API messages.
//!
//! The HTTP API parses these into the generated proto types and calls the
//! same service as gRPC, so both share one validation path and one set of
//! error codes. Every HTTP request and response body is a type here, and
//! the node's OpenAPI document (`/openapi.json`) is generated from them
//! (`utoipa::ToSchema`), so the description cannot drift from what is sent.
//! Fields that hold a proto enum's name keep it as a string and name their
//! schema with `value_type` (the `*Name` enums at the end of this file).

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde::Deserializer;
use serde::Serialize;
use tocsin_core::Callback;
use tocsin_core::FirePhase;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::TimerState;
use tocsin_core::recurrence::Recurrence;
use tocsin_core::recurrence::Rule;
use tocsin_proto::v1 as pb;
use utoipa::ToSchema;

pub mod b64 {
    //! Base64 (standard alphabet, padded) for `bytes` fields.
    use super::*;

    pub fn serialize<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<bytes::Bytes, D::Error> {
        let s = String::deserialize(d)?;
        STANDARD
            .decode(s.as_bytes())
            .map(bytes::Bytes::from)
            .map_err(|e| serde::de::Error::custom(format!("payload is not base64: {e}")))
    }
}

/// A u64 given as a JSON number or a decimal string (proto3 JSON allows
/// both).
pub fn de_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        Num(u64),
        Str(String),
    }
    match N::deserialize(d)? {
        N::Num(n) => Ok(n),
        N::Str(s) => s.parse().map_err(|_| serde::de::Error::custom(format!("{s:?} is not an unsigned integer"))),
    }
}

fn de_opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    de_u64(d).map(Some)
}

/// The body of a webhook delivery and of a pull delivery's JSON form (in
/// the OpenAPI document's components, for a receiver's code generator).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryJson {
    pub namespace: String,
    pub id: String,
    /// Base64 (standard alphabet, padded).
    #[serde(with = "b64")]
    #[schema(value_type = String, format = Byte)]
    pub payload: bytes::Bytes,
    pub fire_at_ms: u64,
    pub fired_at_ms: u64,
    pub attempt: u32,
    pub shard: u32,
    /// The fencing token: the shard leader's epoch, compared per
    /// `(cluster_id, shard)`.
    pub epoch: u64,
    pub fire_id: String,
    /// The cluster that fired it (drawn when the cluster was created): a
    /// rebuilt cluster's epochs and log indexes start again, under a new id.
    #[serde(default)]
    pub cluster_id: String,
    /// Log index of the entry that started this attempt.
    #[serde(default)]
    pub attempt_index: u64,
    /// How late the fire was: `fired_at_ms - fire_at_ms`.
    #[serde(default)]
    pub late_by_ms: u64,
    /// A recurring timer's occurrence number (1, 2, …); absent (0) for a
    /// one-shot timer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub occurrence: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl DeliveryJson {
    pub fn from_record(cluster_id: &str, shard: u32, key: &TimerKey, record: &TimerRecord) -> DeliveryJson {
        let fire = record.fire.clone().unwrap_or_else(|| panic!("delivering {key} without fire facts"));
        DeliveryJson {
            namespace: key.namespace.clone(),
            id: key.id.clone(),
            payload: record.payload.clone(),
            fire_at_ms: record.fire_at_ms,
            fired_at_ms: fire.fired_at_ms,
            attempt: fire.attempt,
            shard,
            epoch: fire.epoch,
            fire_id: tocsin_core::timer::fire_id(cluster_id, shard, fire.fire_index),
            cluster_id: cluster_id.to_string(),
            attempt_index: fire.attempt_index,
            late_by_ms: fire.fired_at_ms.saturating_sub(record.fire_at_ms),
            occurrence: record.series.as_ref().map_or(0, |s| s.occurrence),
            labels: record.labels.clone(),
        }
    }
}

pub fn delivery_proto(cluster_id: &str, shard: u32, key: &TimerKey, record: &TimerRecord) -> pb::Delivery {
    let d = DeliveryJson::from_record(cluster_id, shard, key, record);
    pb::Delivery {
        namespace: d.namespace,
        id: d.id,
        payload: d.payload,
        fire_at_ms: d.fire_at_ms,
        fired_at_ms: d.fired_at_ms,
        attempt: d.attempt,
        shard,
        epoch: d.epoch,
        fire_id: d.fire_id,
        labels: d.labels.into_iter().collect(),
        reserved_until_ms: 0,
        topic: String::new(),
        cluster_id: d.cluster_id,
        late_by_ms: d.late_by_ms,
        occurrence: d.occurrence,
    }
}

pub fn state_proto(state: TimerState) -> pb::timer::State {
    match state {
        TimerState::Scheduled => pb::timer::State::Scheduled,
        TimerState::Firing => pb::timer::State::Firing,
        TimerState::Delivered => pb::timer::State::Delivered,
        TimerState::Dead => pb::timer::State::Dead,
        TimerState::Cancelled => pb::timer::State::Cancelled,
        TimerState::Skipped => pb::timer::State::Skipped,
    }
}

pub fn callback_proto(callback: &Callback) -> pb::Callback {
    pb::Callback {
        target: Some(match callback {
            Callback::Webhook { url } => pb::callback::Target::Webhook(pb::Webhook { url: url.clone() }),
            Callback::Pull { topic, ttr_ms } => {
                pb::callback::Target::Pull(pb::Pull { topic: topic.clone(), ttr_ms: *ttr_ms })
            }
            Callback::Amqp { broker, exchange, routing_key } => pb::callback::Target::Amqp(pb::Amqp {
                broker: broker.clone(),
                exchange: exchange.clone(),
                routing_key: routing_key.clone(),
            }),
        }),
    }
}

pub fn fire_proto(cluster_id: &str, shard: u32, record: &TimerRecord) -> Option<pb::FireInfo> {
    let fire = record.fire.as_ref()?;
    Some(pb::FireInfo {
        fire_id: tocsin_core::timer::fire_id(cluster_id, shard, fire.fire_index),
        epoch: fire.epoch,
        attempt: fire.attempt,
        fired_at_ms: fire.fired_at_ms,
        next_attempt_at_ms: match fire.phase {
            FirePhase::Backoff { at_ms } => at_ms,
            FirePhase::InFlight { .. } | FirePhase::Ready { .. } => 0,
        },
        last_error: fire.last_error.clone(),
        dead_reason: fire.dead_reason.map(|r| r.name().to_string()).unwrap_or_default(),
    })
}

/// A timer's attempt history in its wire form.
pub fn attempts_proto(cluster_id: &str, shard: u32, record: &TimerRecord) -> Vec<pb::AttemptInfo> {
    record
        .attempts
        .iter()
        .map(|a| pb::AttemptInfo {
            attempt: a.attempt,
            fire_id: tocsin_core::timer::fire_id(cluster_id, shard, a.fire_index),
            epoch: a.epoch,
            attempt_index: a.attempt_index,
            started_at_ms: a.started_at_ms,
            finished_at_ms: a.finished_at_ms,
            outcome: a.end.name().to_string(),
            http_status: u32::from(a.status),
            class: a.class.clone(),
            latency_ms: a.latency_ms,
            error: a.error.clone(),
        })
        .collect()
}

pub fn timer_proto(cluster_id: &str, shard: u32, key: &TimerKey, record: &TimerRecord) -> pb::Timer {
    pb::Timer {
        namespace: key.namespace.clone(),
        id: key.id.clone(),
        state: state_proto(record.state) as i32,
        fire_at_ms: record.fire_at_ms,
        payload: record.payload.clone(),
        labels: record.labels.clone().into_iter().collect(),
        callback: Some(callback_proto(&record.callback)),
        retry: Some(pb::RetryPolicy {
            max_attempts: record.retry.max_attempts,
            initial_backoff_ms: record.retry.initial_backoff_ms,
            max_backoff_ms: record.retry.max_backoff_ms,
            give_up_after_ms: record.retry.give_up_after_ms,
        }),
        generation: record.generation,
        created_at_ms: record.created_at_ms,
        shard,
        fire: fire_proto(cluster_id, shard, record),
        finished_at_ms: record.finished_at_ms,
        retained_until_ms: record.purge_after_ms().unwrap_or(0),
        attempts: Vec::new(),
        skip_if_late_ms: record.skip_if_late_ms,
        recurrence: record.series.as_ref().map(|s| recurrence_proto(&s.recurrence)),
        series: record.series.as_ref().map(|s| pb::SeriesInfo {
            occurrence: s.occurrence,
            next_fire_at_ms: s.next_at_ms.unwrap_or(0),
            delivered: s.delivered,
            dead: s.dead,
            skipped: s.skipped,
        }),
    }
}

pub fn recurrence_proto(r: &Recurrence) -> pb::Recurrence {
    let (rule, time_zone) = match &r.rule {
        Rule::Cron { expr, tz } => (pb::recurrence::Rule::Cron(expr.clone()), tz.clone()),
        Rule::Every { interval_ms } => (pb::recurrence::Rule::EveryMs(*interval_ms), String::new()),
    };
    pb::Recurrence { rule: Some(rule), time_zone, until_ms: r.until_ms, count: r.count, catch_up_all: r.catch_up_all }
}

/// A recurring timer's rule, in JSON: exactly one of `cron` (with an
/// optional `time_zone`) or `every_ms`.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecurrenceJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cron: Option<String>,
    #[serde(default, deserialize_with = "de_opt_u64", skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub every_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub time_zone: String,
    #[serde(default, deserialize_with = "de_u64", skip_serializing_if = "is_zero")]
    pub until_ms: u64,
    #[serde(default, deserialize_with = "de_u64", skip_serializing_if = "is_zero")]
    pub count: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub catch_up_all: bool,
}

impl RecurrenceJson {
    /// Both `cron` and `every_ms` given: `cron` is kept and the node refuses
    /// nothing it cannot see, so the JSON layer refuses it first.
    pub fn into_proto(self) -> Result<pb::Recurrence, String> {
        let rule = match (self.cron, self.every_ms) {
            (Some(_), Some(_)) => return Err("give recurrence.cron or recurrence.every_ms, not both".into()),
            (Some(expr), None) => Some(pb::recurrence::Rule::Cron(expr)),
            (None, Some(every)) => Some(pb::recurrence::Rule::EveryMs(every)),
            (None, None) => None,
        };
        Ok(pb::Recurrence {
            rule,
            time_zone: self.time_zone,
            until_ms: self.until_ms,
            count: self.count,
            catch_up_all: self.catch_up_all,
        })
    }

    pub fn from_proto(r: &pb::Recurrence) -> RecurrenceJson {
        RecurrenceJson {
            cron: match &r.rule {
                Some(pb::recurrence::Rule::Cron(c)) => Some(c.clone()),
                _ => None,
            },
            every_ms: match r.rule {
                Some(pb::recurrence::Rule::EveryMs(e)) => Some(e),
                _ => None,
            },
            time_zone: r.time_zone.clone(),
            until_ms: r.until_ms,
            count: r.count,
            catch_up_all: r.catch_up_all,
        }
    }
}

/// Where a recurring timer's series stands (see the proto's `SeriesInfo`).
#[derive(Debug, Serialize, ToSchema)]
pub struct SeriesJson {
    pub occurrence: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub next_fire_at_ms: u64,
    pub delivered: u64,
    pub dead: u64,
    pub skipped: u64,
}

// ---- HTTP request and response bodies ------------------------------------

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTimerJson {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub id: String,
    /// The fire time, in Unix milliseconds; give it or `delay_ms`.
    #[serde(default, deserialize_with = "de_opt_u64")]
    #[schema(nullable = false)]
    pub fire_at_ms: Option<u64>,
    /// The fire time as a delay from now; give it or `fire_at_ms`.
    #[serde(default, deserialize_with = "de_opt_u64")]
    #[schema(nullable = false)]
    pub delay_ms: Option<u64>,
    /// Base64 (standard alphabet, padded).
    #[serde(default, with = "b64")]
    #[schema(value_type = String, format = Byte)]
    pub payload: bytes::Bytes,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub callback: Option<CallbackJson>,
    pub retry: Option<RetryJson>,
    /// Replace a finished timer under the id (see the proto).
    #[serde(default)]
    pub replace_finished: bool,
    /// The late-fire policy (see the proto): 0 fires however late.
    #[serde(default, deserialize_with = "de_u64")]
    pub skip_if_late_ms: u64,
    /// Makes the timer recurring (see the proto's `Recurrence`).
    pub recurrence: Option<RecurrenceJson>,
}

impl CreateTimerJson {
    /// Refuses only what the proto cannot express (a recurrence with both
    /// rules); everything else is the node's to check.
    pub fn into_proto(self) -> Result<pb::CreateTimerRequest, String> {
        let recurrence = self.recurrence.map(RecurrenceJson::into_proto).transpose()?;
        Ok(pb::CreateTimerRequest {
            namespace: self.namespace,
            id: self.id,
            fire_time: match (self.fire_at_ms, self.delay_ms) {
                (Some(at), _) => Some(pb::create_timer_request::FireTime::FireAtMs(at)),
                (None, Some(d)) => Some(pb::create_timer_request::FireTime::DelayMs(d)),
                (None, None) => None,
            },
            payload: self.payload,
            labels: self.labels.into_iter().collect(),
            callback: self.callback.map(CallbackJson::into_proto),
            retry: self.retry.map(RetryJson::into_proto),
            replace_finished: self.replace_finished,
            skip_if_late_ms: self.skip_if_late_ms,
            recurrence,
        })
    }
}

#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallbackJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub webhook: Option<WebhookJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pull: Option<PullJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub amqp: Option<AmqpJson>,
}

/// A publish to an AMQP exchange on a broker the node's configuration names.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpJson {
    #[serde(default)]
    pub broker: String,
    #[serde(default)]
    pub exchange: String,
    #[serde(default)]
    pub routing_key: String,
}

#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookJson {
    #[serde(default)]
    pub url: String,
}

#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullJson {
    #[serde(default)]
    pub topic: String,
    /// This timer's own time-to-run; 0 (or absent): the consumer's.
    #[serde(default, deserialize_with = "de_u64", skip_serializing_if = "is_zero")]
    pub ttr_ms: u64,
}

impl CallbackJson {
    fn into_proto(self) -> pb::Callback {
        pb::Callback {
            target: match (self.webhook, self.pull, self.amqp) {
                (Some(w), _, _) => Some(pb::callback::Target::Webhook(pb::Webhook { url: w.url })),
                (None, Some(p), _) => Some(pb::callback::Target::Pull(pb::Pull { topic: p.topic, ttr_ms: p.ttr_ms })),
                (None, None, Some(a)) => Some(pb::callback::Target::Amqp(pb::Amqp {
                    broker: a.broker,
                    exchange: a.exchange,
                    routing_key: a.routing_key,
                })),
                (None, None, None) => None,
            },
        }
    }

    fn from_proto(cb: &pb::Callback) -> CallbackJson {
        match &cb.target {
            Some(pb::callback::Target::Webhook(w)) => {
                CallbackJson { webhook: Some(WebhookJson { url: w.url.clone() }), ..CallbackJson::default() }
            }
            Some(pb::callback::Target::Pull(p)) => CallbackJson {
                pull: Some(PullJson { topic: p.topic.clone(), ttr_ms: p.ttr_ms }),
                ..CallbackJson::default()
            },
            Some(pb::callback::Target::Amqp(a)) => CallbackJson {
                amqp: Some(AmqpJson {
                    broker: a.broker.clone(),
                    exchange: a.exchange.clone(),
                    routing_key: a.routing_key.clone(),
                }),
                ..CallbackJson::default()
            },
            None => CallbackJson::default(),
        }
    }
}

#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryJson {
    #[serde(default)]
    pub max_attempts: u32,
    #[serde(default, deserialize_with = "de_u64")]
    pub initial_backoff_ms: u64,
    #[serde(default, deserialize_with = "de_u64")]
    pub max_backoff_ms: u64,
    #[serde(default, deserialize_with = "de_u64")]
    pub give_up_after_ms: u64,
}

impl RetryJson {
    fn into_proto(self) -> pb::RetryPolicy {
        pb::RetryPolicy {
            max_attempts: self.max_attempts,
            initial_backoff_ms: self.initial_backoff_ms,
            max_backoff_ms: self.max_backoff_ms,
            give_up_after_ms: self.give_up_after_ms,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FireJson {
    pub fire_id: String,
    pub epoch: u64,
    pub attempt: u32,
    pub fired_at_ms: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub next_attempt_at_ms: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_error: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub dead_reason: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl FireJson {
    pub fn from_proto(f: &pb::FireInfo) -> FireJson {
        FireJson {
            fire_id: f.fire_id.clone(),
            epoch: f.epoch,
            attempt: f.attempt,
            fired_at_ms: f.fired_at_ms,
            next_attempt_at_ms: f.next_attempt_at_ms,
            last_error: f.last_error.clone(),
            dead_reason: f.dead_reason.clone(),
        }
    }
}

/// One attempt of a timer's history, as the HTTP API reports it.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptJson {
    pub attempt: u32,
    pub fire_id: String,
    pub epoch: u64,
    pub attempt_index: u64,
    pub started_at_ms: u64,
    pub finished_at_ms: u64,
    pub outcome: String,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub http_status: u32,
    pub class: String,
    pub latency_ms: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl AttemptJson {
    pub fn from_proto(a: &pb::AttemptInfo) -> AttemptJson {
        AttemptJson {
            attempt: a.attempt,
            fire_id: a.fire_id.clone(),
            epoch: a.epoch,
            attempt_index: a.attempt_index,
            started_at_ms: a.started_at_ms,
            finished_at_ms: a.finished_at_ms,
            outcome: a.outcome.clone(),
            http_status: a.http_status,
            class: a.class.clone(),
            latency_ms: a.latency_ms,
            error: a.error.clone(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TimerJson {
    pub namespace: String,
    pub id: String,
    #[schema(value_type = TimerStateName)]
    pub state: &'static str,
    pub fire_at_ms: u64,
    /// Base64 (standard alphabet, padded).
    #[serde(with = "b64")]
    #[schema(value_type = String, format = Byte)]
    pub payload: bytes::Bytes,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub callback: CallbackJson,
    pub retry: RetryJson,
    pub generation: u64,
    pub created_at_ms: u64,
    pub shard: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub fire: Option<FireJson>,
    #[serde(skip_serializing_if = "is_zero")]
    pub finished_at_ms: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub retained_until_ms: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub skip_if_late_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub recurrence: Option<RecurrenceJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub series: Option<SeriesJson>,
}

pub fn state_name(state: i32) -> &'static str {
    pb::timer::State::try_from(state).map(|s| s.as_str_name()).unwrap_or("STATE_UNSPECIFIED")
}

impl TimerJson {
    pub fn from_proto(t: &pb::Timer) -> TimerJson {
        let retry = t.retry.unwrap_or_default();
        TimerJson {
            namespace: t.namespace.clone(),
            id: t.id.clone(),
            state: state_name(t.state),
            fire_at_ms: t.fire_at_ms,
            payload: t.payload.clone(),
            labels: t.labels.clone().into_iter().collect(),
            callback: t.callback.as_ref().map(CallbackJson::from_proto).unwrap_or_default(),
            retry: RetryJson {
                max_attempts: retry.max_attempts,
                initial_backoff_ms: retry.initial_backoff_ms,
                max_backoff_ms: retry.max_backoff_ms,
                give_up_after_ms: retry.give_up_after_ms,
            },
            generation: t.generation,
            created_at_ms: t.created_at_ms,
            shard: t.shard,
            fire: t.fire.as_ref().map(FireJson::from_proto),
            finished_at_ms: t.finished_at_ms,
            retained_until_ms: t.retained_until_ms,
            skip_if_late_ms: t.skip_if_late_ms,
            recurrence: t.recurrence.as_ref().map(RecurrenceJson::from_proto),
            series: t.series.as_ref().map(|s| SeriesJson {
                occurrence: s.occurrence,
                next_fire_at_ms: s.next_fire_at_ms,
                delivered: s.delivered,
                dead: s.dead,
                skipped: s.skipped,
            }),
        }
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RescheduleJson {
    #[serde(default, deserialize_with = "de_u64")]
    pub expected_generation: u64,
    /// The fire time, in Unix milliseconds; give it or `delay_ms`.
    #[serde(default, deserialize_with = "de_opt_u64")]
    #[schema(nullable = false)]
    pub fire_at_ms: Option<u64>,
    /// The fire time as a delay from now; give it or `fire_at_ms`.
    #[serde(default, deserialize_with = "de_opt_u64")]
    #[schema(nullable = false)]
    pub delay_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTimersJson {
    #[serde(default)]
    pub timers: Vec<CreateTimerJson>,
}

/// `POST /v1/namespaces/{namespace}/topics/{topic}:reserve`: up to `max`
/// deliveries (default 10, at most 1,000), waiting up to `wait_ms` (default
/// 1 s, at most 30 s; at least the 200 ms a reservation takes to record)
/// for the first, each reserved for `ttr_ms` (default 30 s) unless the
/// timer has its own.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReserveJson {
    #[serde(default)]
    pub max: Option<u32>,
    #[serde(default)]
    pub wait_ms: Option<u64>,
    #[serde(default)]
    pub ttr_ms: Option<u64>,
}

/// One delivery named for `:ack` and `:nack` (the namespace is the path's).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveryRefJson {
    pub id: String,
    pub fire_id: String,
    #[serde(deserialize_with = "de_u64")]
    pub attempt: u64,
}

/// `POST …/topics/{topic}:ack` and `:nack` (`delay_ms` and `reason` are
/// for nack only).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettleJson {
    pub deliveries: Vec<DeliveryRefJson>,
    #[serde(default, deserialize_with = "de_u64")]
    pub delay_ms: u64,
    #[serde(default)]
    pub reason: String,
}

/// A reserved pull delivery as the HTTP API returns it.
#[derive(Debug, Serialize, ToSchema)]
pub struct PulledJson {
    pub namespace: String,
    pub id: String,
    pub topic: String,
    /// Base64 (standard alphabet, padded).
    #[serde(with = "b64")]
    #[schema(value_type = String, format = Byte)]
    pub payload: bytes::Bytes,
    pub fire_at_ms: u64,
    pub fired_at_ms: u64,
    pub attempt: u32,
    pub shard: u32,
    pub epoch: u64,
    pub fire_id: String,
    pub cluster_id: String,
    pub reserved_until_ms: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl PulledJson {
    pub fn from_proto(d: &pb::Delivery) -> PulledJson {
        PulledJson {
            namespace: d.namespace.clone(),
            id: d.id.clone(),
            topic: d.topic.clone(),
            payload: d.payload.clone(),
            fire_at_ms: d.fire_at_ms,
            fired_at_ms: d.fired_at_ms,
            attempt: d.attempt,
            shard: d.shard,
            epoch: d.epoch,
            fire_id: d.fire_id.clone(),
            cluster_id: d.cluster_id.clone(),
            reserved_until_ms: d.reserved_until_ms,
            labels: d.labels.clone().into_iter().collect(),
        }
    }
}

/// `POST /v1/namespaces/{namespace}:redrive`: these ids, or (with
/// `all_dead`) up to `limit` DEAD timers of the namespace, of one
/// `dead_reason` if given.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedriveJson {
    #[serde(default)]
    pub ids: Vec<String>,
    #[serde(default)]
    pub all_dead: bool,
    #[serde(default)]
    pub dead_reason: String,
    #[serde(default)]
    pub limit: Option<u32>,
}

/// An error as the HTTP API reports it.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct ErrorJson {
    /// The gRPC code's name; the HTTP status follows from it.
    #[schema(value_type = ErrorCode)]
    pub code: String,
    pub message: String,
    /// The request field (or query parameter, or `body`) at fault.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub leader: Option<LeaderJson>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub map_epoch: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_after_ms: u64,
    /// A finer reason within the code (`TIMER_FINISHED`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Where the shard's leader is, when a node that is not it answered.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaderJson {
    pub shard: u32,
    pub node_id: u64,
    pub grpc_addr: String,
    pub http_addr: String,
}

impl ErrorJson {
    pub fn from_info(info: &pb::ErrorInfo) -> ErrorJson {
        ErrorJson {
            code: info.code.clone(),
            message: info.message.clone(),
            field: info.field.clone(),
            leader: info.leader.as_ref().map(|l| LeaderJson {
                shard: l.shard,
                node_id: l.node_id,
                grpc_addr: l.grpc_addr.clone(),
                http_addr: l.http_addr.clone(),
            }),
            map_epoch: info.map_epoch,
            retry_after_ms: info.retry_after_ms,
            reason: info.reason.clone(),
        }
    }
}

// ---- HTTP response envelopes ---------------------------------------------

/// Every HTTP error: the one shape, whatever refused the request (the API,
/// the JSON parser, the router, the body limit).
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct ErrorBodyJson {
    pub error: ErrorJson,
}

/// `POST /v1/timers`: the timer, and whether this call created it (201)
/// or found an identical one (200).
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedJson {
    pub timer: Option<TimerJson>,
    pub created: bool,
}

/// One timer of a batch create: `ok` or `error` (neither only if the node
/// answered nothing for it).
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResultJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub ok: Option<CreatedJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<ErrorJson>,
}

/// `POST /v1/timers:batch`: one result per timer, in the request's order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchCreatedJson {
    pub results: Vec<BatchResultJson>,
}

/// `GET /v1/timers/{namespace}/{id}` and `:reschedule`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TimerBodyJson {
    pub timer: Option<TimerJson>,
}

/// `GET /v1/timers/{namespace}/{id}/attempts`: the latest attempts, oldest
/// first.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptsJson {
    pub namespace: String,
    pub id: String,
    #[schema(value_type = TimerStateName)]
    pub state: &'static str,
    pub generation: u64,
    pub attempts: Vec<AttemptJson>,
}

/// `GET /v1/timers/{namespace}`: a page of timers; pass `next_page_token`
/// back as `page_token` for the next (empty: no more).
#[derive(Debug, Serialize, ToSchema)]
pub struct TimerPageJson {
    pub timers: Vec<TimerJson>,
    pub next_page_token: String,
}

/// `DELETE /v1/timers/{namespace}/{id}`. `fire` facts (`epoch`, `fire_id`,
/// `attempt`) when the timer had fired; `attempt_in_flight` with
/// CANCELLED_WHILE_FIRING; `error` with NOT_FOUND (a 404).
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelledJson {
    #[schema(value_type = CancelOutcomeName)]
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub timer: Option<TimerJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub epoch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub fire_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub attempt_in_flight: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<ErrorJson>,
}

/// `…/topics/{topic}:reserve`: the deliveries reserved for this call (none
/// when nothing was ready within `wait_ms`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ReservedJson {
    pub deliveries: Vec<PulledJson>,
}

/// One delivery's fate in an `:ack` or `:nack`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SettleResultJson {
    pub id: String,
    #[schema(value_type = AckStatusName)]
    pub status: &'static str,
}

/// `…/topics/{topic}:ack` and `:nack`: one result per delivery, in the
/// request's order.
#[derive(Debug, Serialize, ToSchema)]
pub struct SettledJson {
    pub results: Vec<SettleResultJson>,
}

/// One timer of a redrive: its outcome, and where it stands now (`state`
/// and `generation`) or why it failed (`error`).
#[derive(Debug, Serialize, ToSchema)]
pub struct RedriveResultJson {
    pub id: String,
    #[schema(value_type = RedriveOutcomeName)]
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub generation: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, value_type = Option<TimerStateName>)]
    pub state: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<ErrorJson>,
}

/// `POST /v1/namespaces/{namespace}:redrive`: counts per outcome, whether
/// `all_dead` stopped at `limit` with more left (`more`), and each timer's
/// result.
#[derive(Debug, Serialize, ToSchema)]
pub struct RedrivenJson {
    pub redriven: u64,
    pub not_dead: u64,
    pub not_found: u64,
    pub failed: u64,
    pub more: bool,
    pub results: Vec<RedriveResultJson>,
}

/// `GET /v1/namespaces/{namespace}/horizon`: how many of the namespace's
/// timers fire in the next minute, hour and day (and are overdue), and the
/// next hour per `bucket_ms` bucket.
#[derive(Debug, Serialize, ToSchema)]
pub struct HorizonJson {
    pub as_of_ms: u64,
    pub overdue: u64,
    pub next_minute: u64,
    pub next_hour: u64,
    pub next_day: u64,
    pub bucket_ms: u64,
    pub next_hour_by_minute: Vec<u64>,
}

/// A node of the cluster, as `GET /v1/cluster` lists it.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeJson {
    pub node_id: u64,
    pub grpc_addr: String,
    pub http_addr: String,
    pub peer_addr: String,
    #[schema(value_type = NodeStateName)]
    pub state: &'static str,
}

/// A shard as this node sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShardJson {
    pub shard: u32,
    pub replicas: Vec<u64>,
    pub learners: Vec<u64>,
    /// The leader's node id (0: none known).
    pub leader: u64,
    pub term: u64,
    pub epoch: u64,
    pub committed_index: u64,
    pub applied_index: u64,
    pub pending_timers: u64,
    pub firing_timers: u64,
}

/// `GET /v1/cluster`: the nodes of the cluster map and the shards.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterJson {
    /// The node that answered.
    pub node_id: u64,
    pub map_epoch: u64,
    pub num_shards: u32,
    pub nodes: Vec<NodeJson>,
    pub shards: Vec<ShardJson>,
}

// ---- Enum names, for the schema --------------------------------------------
//
// The JSON carries these as the proto enum's names (`as_str_name`); these
// types only name the values in the OpenAPI document. The tests below check
// they list every value the proto has.

/// A timer's state.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TimerStateName {
    Scheduled,
    Firing,
    Delivered,
    Dead,
    Cancelled,
    Skipped,
}

/// What a cancel did.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CancelOutcomeName {
    Cancelled,
    AlreadyCancelled,
    AlreadyFired,
    NotFound,
    CancelledWhileFiring,
}

/// What a redrive did to one timer.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RedriveOutcomeName {
    Redriven,
    NotDead,
    NotFound,
    Failed,
}

/// What an ack or nack did to one delivery.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AckStatusName {
    Ok,
    Stale,
    NotFound,
}

/// A node's state in the cluster map.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NodeStateName {
    Joining,
    Active,
    Draining,
    Removed,
}

/// An error's code: a gRPC code's name (`codes::code_name`).
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values the schema lists for `T`: its variants as serde writes them.
    fn listed<T: ToSchema>() -> Vec<String> {
        let schema = serde_json::to_value(T::schema()).unwrap();
        let values = schema["enum"].as_array().unwrap_or_else(|| panic!("{schema}"));
        values.iter().map(|v| v.as_str().unwrap().to_string()).collect()
    }

    /// Every value of a proto enum but `*_UNSPECIFIED`, by its name.
    fn proto_names(name_of: impl Fn(i32) -> Option<&'static str>) -> Vec<String> {
        (1..64).map_while(&name_of).map(str::to_string).collect()
    }

    #[test]
    fn enum_names_list_every_proto_value() {
        let state = |n| pb::timer::State::try_from(n).ok().map(|s| s.as_str_name());
        assert_eq!(listed::<TimerStateName>(), proto_names(state));
        let cancel = |n| pb::cancel_timer_response::Outcome::try_from(n).ok().map(|s| s.as_str_name());
        assert_eq!(listed::<CancelOutcomeName>(), proto_names(cancel));
        let redrive = |n| pb::redrive_result::Outcome::try_from(n).ok().map(|s| s.as_str_name());
        assert_eq!(listed::<RedriveOutcomeName>(), proto_names(redrive));
        let ack = |n| pb::ack_result::Status::try_from(n).ok().map(|s| s.as_str_name());
        assert_eq!(listed::<AckStatusName>(), proto_names(ack));
        let node = |n| pb::node_info::State::try_from(n).ok().map(|s| s.as_str_name());
        assert_eq!(listed::<NodeStateName>(), proto_names(node));
        let codes: Vec<String> = (1..17).map(|n| crate::codes::code_name(tonic::Code::from(n)).to_string()).collect();
        assert_eq!(listed::<ErrorCode>(), codes);
    }
}
