//! JSON forms of the API messages (proto3 JSON mapping with the proto's own
//! snake_case field names: bytes as base64, enums as their names, 64-bit
//! integers written as numbers and read from numbers or strings), plus the
//! conversions from stored records to API messages.
//!
//! The HTTP API parses these into the generated proto types and calls the
//! same service as gRPC, so both share one validation path and one set of
//! error codes.

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
use tocsin_proto::v1 as pb;

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

/// The body of a webhook delivery and of a pull delivery's JSON form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryJson {
    pub namespace: String,
    pub id: String,
    #[serde(with = "b64")]
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
    }
}

pub fn state_proto(state: TimerState) -> pb::timer::State {
    match state {
        TimerState::Scheduled => pb::timer::State::Scheduled,
        TimerState::Firing => pb::timer::State::Firing,
        TimerState::Delivered => pb::timer::State::Delivered,
        TimerState::Dead => pb::timer::State::Dead,
        TimerState::Cancelled => pb::timer::State::Cancelled,
    }
}

pub fn callback_proto(callback: &Callback) -> pb::Callback {
    pb::Callback {
        target: Some(match callback {
            Callback::Webhook { url } => pb::callback::Target::Webhook(pb::Webhook { url: url.clone() }),
            Callback::Pull { topic } => pb::callback::Target::Pull(pb::Pull { topic: topic.clone() }),
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
    })
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
    }
}

// ---- HTTP request and response bodies ------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTimerJson {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub id: String,
    #[serde(default, deserialize_with = "de_opt_u64")]
    pub fire_at_ms: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_u64")]
    pub delay_ms: Option<u64>,
    #[serde(default, with = "b64")]
    pub payload: bytes::Bytes,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub callback: Option<CallbackJson>,
    pub retry: Option<RetryJson>,
    /// Replace a finished timer under the id (see the proto).
    #[serde(default)]
    pub replace_finished: bool,
}

impl CreateTimerJson {
    pub fn into_proto(self) -> pb::CreateTimerRequest {
        pb::CreateTimerRequest {
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
        }
    }
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CallbackJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull: Option<PullJson>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookJson {
    #[serde(default)]
    pub url: String,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PullJson {
    #[serde(default)]
    pub topic: String,
}

impl CallbackJson {
    fn into_proto(self) -> pb::Callback {
        pb::Callback {
            target: match (self.webhook, self.pull) {
                (Some(w), _) => Some(pb::callback::Target::Webhook(pb::Webhook { url: w.url })),
                (None, Some(p)) => Some(pb::callback::Target::Pull(pb::Pull { topic: p.topic })),
                (None, None) => None,
            },
        }
    }

    fn from_proto(cb: &pb::Callback) -> CallbackJson {
        match &cb.target {
            Some(pb::callback::Target::Webhook(w)) => {
                CallbackJson { webhook: Some(WebhookJson { url: w.url.clone() }), pull: None }
            }
            Some(pb::callback::Target::Pull(p)) => {
                CallbackJson { webhook: None, pull: Some(PullJson { topic: p.topic.clone() }) }
            }
            None => CallbackJson::default(),
        }
    }
}

#[derive(Debug, Default, Deserialize, Serialize)]
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

#[derive(Debug, Serialize)]
pub struct FireJson {
    pub fire_id: String,
    pub epoch: u64,
    pub attempt: u32,
    pub fired_at_ms: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub next_attempt_at_ms: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_error: String,
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
        }
    }
}

#[derive(Debug, Serialize)]
pub struct TimerJson {
    pub namespace: String,
    pub id: String,
    pub state: &'static str,
    pub fire_at_ms: u64,
    #[serde(with = "b64")]
    pub payload: bytes::Bytes,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub callback: CallbackJson,
    pub retry: RetryJson,
    pub generation: u64,
    pub created_at_ms: u64,
    pub shard: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fire: Option<FireJson>,
    #[serde(skip_serializing_if = "is_zero")]
    pub finished_at_ms: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub retained_until_ms: u64,
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
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RescheduleJson {
    #[serde(default, deserialize_with = "de_u64")]
    pub expected_generation: u64,
    #[serde(default, deserialize_with = "de_opt_u64")]
    pub fire_at_ms: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_u64")]
    pub delay_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTimersJson {
    #[serde(default)]
    pub timers: Vec<CreateTimerJson>,
}

/// An error as the HTTP API reports it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ErrorJson {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderJson>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub map_epoch: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_after_ms: u64,
    /// A finer reason within the code (`TIMER_FINISHED`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

#[derive(Debug, Serialize, Deserialize)]
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
