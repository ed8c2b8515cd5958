//! What a timer is: the client's request ([`TimerSpec`]) and the replicated
//! row ([`TimerRecord`]) with its state machine
//! `SCHEDULED → FIRING → DELIVERED | DEAD` and `SCHEDULED → CANCELLED`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::Serialize;
use xxhash_rust::xxh3::Xxh3;

/// A timer's name: unique within its namespace, chosen by the client.
///
/// Keys are ordered exactly as the store encodes them (`ns length · namespace
/// · id`, see `tocsin-store`'s `keys.rs`): by namespace length, then
/// namespace bytes, then id bytes. Every ordered structure over keys (the
/// fire-time index, the fire loop's cursor into it, the in-memory reference
/// table) therefore agrees with the index on disk; a property test in the
/// store checks the encoding against this `Ord`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TimerKey {
    pub namespace: String,
    pub id: String,
}

impl Ord for TimerKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.namespace.len(), self.namespace.as_bytes(), self.id.as_bytes()).cmp(&(
            other.namespace.len(),
            other.namespace.as_bytes(),
            other.id.as_bytes(),
        ))
    }
}

impl PartialOrd for TimerKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A position in a shard's fire-time index: the due time, then the key.
/// Ordered as the index is (see [`TimerKey`]'s `Ord`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DuePos {
    pub due_ms: u64,
    pub key: TimerKey,
}

impl TimerKey {
    pub fn new(namespace: impl Into<String>, id: impl Into<String>) -> Self {
        TimerKey { namespace: namespace.into(), id: id.into() }
    }
}

impl std::fmt::Display for TimerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id)
    }
}

/// Where a fired timer goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Callback {
    /// An HTTP POST to this URL.
    Webhook { url: String },
    /// Held on a topic until a consumer reserves it. `ttr_ms`, when not 0,
    /// is how long a consumer's reservation of this timer lasts, whatever
    /// the consumer asked for.
    Pull { topic: String, ttr_ms: u64 },
    /// A publish to `exchange` with `routing_key` on the AMQP broker the
    /// node's configuration names `broker`, confirmed by the broker.
    Amqp { broker: String, exchange: String, routing_key: String },
}

impl Callback {
    pub fn is_pull(&self) -> bool {
        matches!(self, Callback::Pull { .. })
    }
}

/// Delivery retries. In a request, zero fields mean "the default"; in a
/// record, every field holds the effective value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// Absolute unix ms after which no attempt starts; 0 means no deadline.
    pub give_up_after_ms: u64,
}

/// The fire time as the client gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FireTime {
    /// Absolute unix milliseconds.
    At(u64),
    /// Milliseconds after the shard leader receives the request.
    Delay(u64),
}

/// A create request's content, as the client sent it (before the leader
/// resolved the fire time and filled in defaults). Two creates of the same
/// id are "the same" when their specs are equal, compared by
/// [`TimerSpec::digest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerSpec {
    pub fire_time: FireTime,
    /// Shared, reference-counted bytes: cloning a spec or record does not copy
    /// the payload.
    pub payload: bytes::Bytes,
    pub labels: BTreeMap<String, String>,
    pub callback: Callback,
    pub retry: RetryPolicy,
    /// The late-fire policy: 0 fires however late (the delivery says by
    /// how much, `late_by_ms`); N > 0 skips a fire that comes more than N
    /// ms after its fire time (the timer ends `SKIPPED`).
    pub skip_if_late_ms: u64,
    /// A recurring timer's rule and end; `None` for a one-shot timer.
    pub recurrence: Option<crate::recurrence::Recurrence>,
}

impl TimerSpec {
    /// A stable 128-bit digest of the spec, for idempotency checks. Each
    /// field is length-prefixed, so distinct specs cannot collide by
    /// concatenation.
    pub fn digest(&self) -> u128 {
        let mut h = Xxh3::new();
        match self.fire_time {
            FireTime::At(ms) => {
                h.update(&[1]);
                h.update(&ms.to_be_bytes());
            }
            FireTime::Delay(ms) => {
                h.update(&[2]);
                h.update(&ms.to_be_bytes());
            }
        }
        hash_bytes(&mut h, &self.payload);
        h.update(&(self.labels.len() as u64).to_be_bytes());
        for (k, v) in &self.labels {
            hash_bytes(&mut h, k.as_bytes());
            hash_bytes(&mut h, v.as_bytes());
        }
        match &self.callback {
            Callback::Webhook { url } => {
                h.update(&[1]);
                hash_bytes(&mut h, url.as_bytes());
            }
            Callback::Pull { topic, ttr_ms } => {
                h.update(&[2]);
                hash_bytes(&mut h, topic.as_bytes());
                h.update(&ttr_ms.to_be_bytes());
            }
            Callback::Amqp { broker, exchange, routing_key } => {
                h.update(&[3]);
                hash_bytes(&mut h, broker.as_bytes());
                hash_bytes(&mut h, exchange.as_bytes());
                hash_bytes(&mut h, routing_key.as_bytes());
            }
        }
        h.update(&self.retry.max_attempts.to_be_bytes());
        h.update(&self.retry.initial_backoff_ms.to_be_bytes());
        h.update(&self.retry.max_backoff_ms.to_be_bytes());
        h.update(&self.retry.give_up_after_ms.to_be_bytes());
        if self.skip_if_late_ms != 0 {
            // Only when set, so a spec without it keeps the digest it had.
            h.update(&[3]);
            h.update(&self.skip_if_late_ms.to_be_bytes());
        }
        if let Some(r) = &self.recurrence {
            // Only when set, as above.
            h.update(&[4]);
            match &r.rule {
                crate::recurrence::Rule::Cron { expr, tz } => {
                    h.update(&[1]);
                    hash_bytes(&mut h, expr.as_bytes());
                    hash_bytes(&mut h, tz.as_bytes());
                }
                crate::recurrence::Rule::Every { interval_ms } => {
                    h.update(&[2]);
                    h.update(&interval_ms.to_be_bytes());
                }
            }
            h.update(&r.until_ms.to_be_bytes());
            h.update(&r.count.to_be_bytes());
            h.update(&[u8::from(r.catch_up_all)]);
        }
        h.digest128()
    }
}

fn hash_bytes(h: &mut Xxh3, bytes: &[u8]) {
    h.update(&(bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// A timer's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TimerState {
    Scheduled,
    Firing,
    Delivered,
    Dead,
    Cancelled,
    /// Its fire came later than its late-fire policy allows
    /// (`skip_if_late_ms`): nothing was delivered.
    Skipped,
}

impl TimerState {
    /// Delivered, dead, cancelled or skipped: nothing more will happen to it.
    pub fn is_terminal(self) -> bool {
        matches!(self, TimerState::Delivered | TimerState::Dead | TimerState::Cancelled | TimerState::Skipped)
    }

    pub fn name(self) -> &'static str {
        match self {
            TimerState::Scheduled => "SCHEDULED",
            TimerState::Firing => "FIRING",
            TimerState::Delivered => "DELIVERED",
            TimerState::Dead => "DEAD",
            TimerState::Cancelled => "CANCELLED",
            TimerState::Skipped => "SKIPPED",
        }
    }
}

/// Where a firing timer's delivery stands. Each phase says when the shard
/// leader must look at the timer next: its key in the fire-time index (see
/// [`TimerRecord::due`]). Nothing about an unfinished timer lives only in a
/// leader's memory: if an attempt's outcome is never recorded (a lost
/// reply, a dropped task, a consumer that vanished), its deadline comes and
/// the leader starts the next attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FirePhase {
    /// An attempt started at `since_ms` and has no recorded result.
    /// `until_ms` is its deadline: the webhook's timeout, or the pull
    /// reservation's end. The timer is indexed at `until_ms`. A new leader
    /// redelivers an earlier leader's webhook attempt at once
    /// (at-least-once), but honours a pull reservation until it runs out.
    InFlight { since_ms: u64, until_ms: u64 },
    /// The last attempt failed; the next one is due at `at_ms`.
    Backoff { at_ms: u64 },
    /// A pull timer waiting for a consumer since `since_ms`: indexed then,
    /// so a new leader offers it at once.
    Ready { since_ms: u64 },
}

/// What the shard leader must do when a timer's index entry comes due: the
/// value stored with its fire-time index entry, so the leader can tell
/// without reading the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DueKind {
    /// A scheduled timer: fire it.
    Fire,
    /// An attempt's deadline: a webhook attempt (`webhook`) or a pull
    /// reservation started under `epoch`. Without a recorded outcome by
    /// then, the leader starts the next attempt.
    Attempt { epoch: u64, webhook: bool },
    /// The end of a backoff: the next attempt.
    Retry,
    /// A pull timer waiting for a consumer: offer it.
    Ready,
    /// A scheduled pull timer: offer it to its topic's consumers when its
    /// time comes, unfired; the consumer's reservation fires it
    /// ([`crate::Command::FireReserve`]). An entry written before this kind
    /// existed says [`DueKind::Fire`] for a pull timer: that `Fire` makes it
    /// ready, which is as correct, one command dearer.
    PullFire,
}

/// A timer's entry in the fire-time index: when, and what for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Due {
    pub at_ms: u64,
    pub kind: DueKind,
}

impl Due {
    /// Whether a leader under `epoch` acts on this entry at once rather than
    /// at `at_ms`: a webhook attempt an earlier leader started and may never
    /// have sent is redelivered now (at-least-once) instead of waiting for
    /// its deadline.
    pub fn adopt_now(&self, epoch: u64) -> bool {
        matches!(self.kind, DueKind::Attempt { epoch: started, webhook: true } if started < epoch)
    }
}

/// The facts about a fired timer's delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FireRecord {
    /// The fire command's sequence number (log index × 4096 + position in
    /// the entry, see `ApplyCtx::sequence`): with the shard, the receiver's
    /// deduplication key (see [`fire_id`]).
    pub fire_index: u64,
    /// The fencing epoch of the leader that started the latest attempt.
    pub epoch: u64,
    /// Attempts started so far.
    pub attempt: u32,
    /// Log index of the entry that started the latest attempt: a receiver
    /// or checker can order it against a cancel's index.
    pub attempt_index: u64,
    pub fired_at_ms: u64,
    pub attempt_started_at_ms: u64,
    pub phase: FirePhase,
    pub last_error: String,
    /// Why the timer is `DEAD`; `None` before.
    pub dead_reason: Option<DeadReason>,
}

/// Why a timer gave up (`DEAD`): what `tocsin timer list --state dead
/// --reason` and a redrive filter on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeadReason {
    /// `retry.max_attempts` attempts were made.
    MaxAttempts,
    /// `retry.give_up_after_ms` passed.
    GiveUpAfter,
    /// The receiver said not to try again (a webhook's `410 Gone`).
    Gone,
}

impl DeadReason {
    pub const ALL: [DeadReason; 3] = [DeadReason::MaxAttempts, DeadReason::GiveUpAfter, DeadReason::Gone];

    pub fn name(self) -> &'static str {
        match self {
            DeadReason::MaxAttempts => "MAX_ATTEMPTS",
            DeadReason::GiveUpAfter => "GIVE_UP_AFTER",
            DeadReason::Gone => "GONE",
        }
    }

    /// The reason a name names, case-insensitively.
    pub fn from_name(name: &str) -> Option<DeadReason> {
        DeadReason::ALL.into_iter().find(|r| r.name().eq_ignore_ascii_case(name))
    }
}

/// How one delivery attempt ended, as its history keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptEnd {
    /// The receiver acknowledged it (webhook 2xx, pull `Ack`).
    Delivered,
    /// It failed and a retry was scheduled, or the retries ran out.
    Failed,
    /// The receiver said not to try again.
    GaveUp,
    /// Its deadline passed with no outcome recorded (a lost reply, a
    /// dropped task, a pull reservation that ran out unacked).
    NoOutcome,
    /// The leader that started it lost its leadership before an outcome was
    /// recorded; the next leader started another.
    LeaderChanged,
    /// The timer was cancelled while it was under way.
    Cancelled,
}

impl AttemptEnd {
    pub fn name(self) -> &'static str {
        match self {
            AttemptEnd::Delivered => "DELIVERED",
            AttemptEnd::Failed => "FAILED",
            AttemptEnd::GaveUp => "GAVE_UP",
            AttemptEnd::NoOutcome => "NO_OUTCOME",
            AttemptEnd::LeaderChanged => "LEADER_CHANGED",
            AttemptEnd::Cancelled => "CANCELLED",
        }
    }
}

/// One finished delivery attempt, in the timer's history (the latest
/// [`crate::limits::MAX_ATTEMPT_HISTORY`] are kept).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptEntry {
    /// The firing it belongs to (with the shard and cluster, its fire id).
    pub fire_index: u64,
    pub attempt: u32,
    /// The fencing epoch it was started under.
    pub epoch: u64,
    /// Log index of the entry that started it.
    pub attempt_index: u64,
    pub started_at_ms: u64,
    /// When its end was recorded (the stamp of that entry).
    pub finished_at_ms: u64,
    pub end: AttemptEnd,
    /// The HTTP status the receiver answered; 0 for none (no answer, pull).
    pub status: u16,
    /// The class of the outcome: `2xx`, `5xx`, `timeout`, `connection
    /// refused`, `ack`, `nack`, … (never the receiver's own words).
    pub class: String,
    /// How long the request took, as the node measured it; 0 where unknown.
    pub latency_ms: u32,
    pub error: String,
}

/// The receiver-facing id of one firing of a timer: stable across delivery
/// attempts, unique across shards, id reuse and clusters (a rebuilt
/// cluster draws a new cluster id, so its fire ids never repeat the old
/// one's although its log indexes start again).
pub fn fire_id(cluster_id: &str, shard: u32, fire_index: u64) -> String {
    format!("f-{cluster_id}-{shard}-{fire_index}")
}

/// The parts of a [`fire_id`]: `(cluster id, shard, fire index)`.
pub fn parse_fire_id(fire_id: &str) -> Option<(&str, u32, u64)> {
    let mut parts = fire_id.strip_prefix("f-")?.splitn(3, '-');
    let (cluster, shard, index) = (parts.next()?, parts.next()?, parts.next()?);
    if cluster.is_empty() || cluster.contains('-') {
        return None;
    }
    Some((cluster, shard.parse().ok()?, index.parse().ok()?))
}

/// The replicated row of one timer: the value under its key in a shard's
/// state machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerRecord {
    pub state: TimerState,
    /// Absolute fire time, stamped by the leader.
    pub fire_at_ms: u64,
    pub payload: bytes::Bytes,
    pub labels: BTreeMap<String, String>,
    pub callback: Callback,
    /// Effective retry policy.
    pub retry: RetryPolicy,
    /// The late-fire policy ([`TimerSpec::skip_if_late_ms`]).
    pub skip_if_late_ms: u64,
    /// Digest of the create request's spec, for idempotent creates.
    pub spec_digest: u128,
    /// 1 at creation, raised by each reschedule.
    pub generation: u64,
    pub created_at_ms: u64,
    /// Log index of the create: tells apart two timers that reused an id
    /// after retention.
    pub created_index: u64,
    pub fire: Option<FireRecord>,
    /// When it reached a terminal state; 0 before.
    pub finished_at_ms: u64,
    /// How long it stays queryable once terminal.
    pub retention_ms: u64,
    /// Its finished delivery attempts, oldest first, the latest
    /// [`crate::limits::MAX_ATTEMPT_HISTORY`] of them (across redrives).
    pub attempts: Vec<AttemptEntry>,
    /// A recurring timer's rule and progress; `None` for a one-shot timer.
    /// `fire_at_ms` is then the current occurrence's time.
    pub series: Option<crate::recurrence::Series>,
}

impl TimerRecord {
    /// When the shard leader must next look at this timer, and why: its
    /// entry in the fire-time index. `None` for terminal timers; every
    /// unfinished timer has one (**the** invariant of the firing path).
    pub fn due(&self) -> Option<Due> {
        match self.state {
            TimerState::Scheduled => Some(Due {
                at_ms: self.fire_at_ms,
                kind: if self.callback.is_pull() { DueKind::PullFire } else { DueKind::Fire },
            }),
            TimerState::Firing => self.fire.as_ref().map(|f| match f.phase {
                FirePhase::InFlight { until_ms, .. } => Due {
                    at_ms: until_ms,
                    kind: DueKind::Attempt { epoch: f.epoch, webhook: !self.callback.is_pull() },
                },
                FirePhase::Backoff { at_ms } => Due { at_ms, kind: DueKind::Retry },
                FirePhase::Ready { since_ms } => Due { at_ms: since_ms, kind: DueKind::Ready },
            }),
            TimerState::Delivered | TimerState::Dead | TimerState::Cancelled | TimerState::Skipped => None,
        }
    }

    /// Whether this is a push timer whose first fire is armed
    /// (`crate::arm`) and whose attempt has not started by `now_ms`: it has
    /// not fired yet, whatever its stored state says.
    pub fn armed_not_started(&self, now_ms: u64) -> bool {
        self.state == TimerState::Firing
            && self.attempts.is_empty()
            && self.fire.as_ref().is_some_and(|f| {
                f.attempt == 1 && matches!(f.phase, FirePhase::InFlight { .. }) && f.attempt_started_at_ms > now_ms
            })
    }

    /// The record as it was before its armed `Fire`: scheduled, without fire
    /// facts, its series (if any) back where it stood (the fire counted the
    /// occurrence and worked out the next one; a scheduled occurrence has
    /// none worked out yet, `next_occurrence` in `apply.rs` took it).
    pub fn unarmed(&self) -> TimerRecord {
        let mut new = self.clone();
        new.state = TimerState::Scheduled;
        new.fire = None;
        if let Some(series) = &mut new.series {
            series.occurrence = series.occurrence.saturating_sub(1);
            series.next_at_ms = None;
        }
        new
    }

    /// The record as a client sees it at `now_ms`: an armed fire whose time
    /// has not come reads as the scheduled timer it still is.
    pub fn as_of(&self, now_ms: u64) -> std::borrow::Cow<'_, TimerRecord> {
        if self.armed_not_started(now_ms) {
            std::borrow::Cow::Owned(self.unarmed())
        } else {
            std::borrow::Cow::Borrowed(self)
        }
    }

    /// The time of [`due`](Self::due): the key of the timer's entry in the
    /// fire-time index.
    pub fn due_ms(&self) -> Option<u64> {
        self.due().map(|d| d.at_ms)
    }

    /// When a terminal timer may be purged: the key of its entry in the
    /// retention index. `None` while it is live.
    pub fn purge_after_ms(&self) -> Option<u64> {
        self.state.is_terminal().then(|| self.finished_at_ms.saturating_add(self.retention_ms))
    }

    /// The horizon bucket a scheduled timer counts in (its fire minute).
    pub fn horizon_minute(&self) -> Option<u64> {
        (self.state == TimerState::Scheduled).then_some(self.fire_at_ms / crate::limits::HORIZON_BUCKET_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fire_id_names_its_cluster_shard_and_index_and_parses_back() {
        let id = fire_id("0123456789abcdef", 7, 42 * 4096 + 3);
        assert_eq!(id, "f-0123456789abcdef-7-172035");
        assert_eq!(parse_fire_id(&id), Some(("0123456789abcdef", 7, 172_035)));
        for bad in ["f-7-172035", "x-0123456789abcdef-7-1", "f-0123456789abcdef-x-1", "f--7-1", "f-a-7-1-2"] {
            assert_eq!(parse_fire_id(bad), None, "{bad}");
        }
    }
}
