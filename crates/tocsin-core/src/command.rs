//! The commands a shard's Raft log carries, and what applying each returns.
//!
//! One log entry carries a [`Proposal`]: a batch of commands plus the time
//! the leader stamped on it. The metadata group's entries use the same
//! shape, with [`Command::Cluster`] commands only. Everything apply needs is in the entry, so every
//! replica reaches the same state (time is data).

use serde::Deserialize;
use serde::Serialize;

use crate::timer::RetryPolicy;
use crate::timer::TimerKey;
use crate::timer::TimerRecord;
use crate::timer::TimerSpec;
use crate::timer::TimerState;

/// Most commands in one log entry.
pub const MAX_COMMANDS_PER_PROPOSAL: usize = 4096;

/// The application payload of one Raft log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// The leader's wall clock when it built the entry, unix ms.
    pub now_ms: u64,
    /// Shared, not owned: openraft clones an entry each time it reads one
    /// from the log cache (for apply, and for each follower's replication),
    /// and a deep clone of a batch of creates was most of the copying and
    /// allocation on the Raft threads. Serialized as a sequence, the same
    /// bytes as a `Vec`.
    pub commands: std::sync::Arc<[Command]>,
}

impl std::fmt::Display for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "proposal(now_ms={}, commands={})", self.now_ms, self.commands.len())
    }
}

/// One change to a shard's timers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create a timer, or find an identical one. A finished timer
    /// (delivered, dead or cancelled) under the id is not "found": the
    /// answer is [`CommandResult::Finished`], unless `replace_finished`.
    Create {
        key: TimerKey,
        /// Boxed: a spec is most of a create's size, and every other command
        /// is small (serialized the same as unboxed).
        spec: Box<TimerSpec>,
        /// The resolved absolute fire time.
        fire_at_ms: u64,
        /// The effective policy (defaults filled in by the leader).
        retry: RetryPolicy,
        retention_ms: u64,
        /// If the id holds a finished timer, replace it: a new timer under
        /// the same id, its generation the old one's plus one.
        replace_finished: bool,
    },
    Cancel {
        key: TimerKey,
    },
    /// Compare-and-set of the fire time on `generation`.
    Reschedule {
        key: TimerKey,
        expected_generation: u64,
        fire_at_ms: u64,
    },
    /// The leader's wheel says `key` is due at `due_ms` (its key in the
    /// fire-time index). If that still holds, apply takes the next step: a
    /// scheduled timer fires (a webhook's first attempt starts, a pull timer
    /// becomes ready); a webhook in backoff, or in flight under an earlier
    /// leader, starts its next attempt; a pull timer becomes ready again. If
    /// the timer moved on meanwhile (cancelled, rescheduled, delivered) this
    /// is a no-op. `timeout_ms` bounds a webhook attempt started here.
    Fire {
        key: TimerKey,
        due_ms: u64,
        epoch: u64,
        timeout_ms: u64,
    },
    /// A pull consumer reserved a ready timer until `until_ms`: the next
    /// attempt starts.
    Reserve {
        key: TimerKey,
        fire_index: u64,
        expected_attempt: u32,
        epoch: u64,
        until_ms: u64,
    },
    /// How an attempt ended.
    AttemptResult {
        key: TimerKey,
        fire_index: u64,
        attempt: u32,
        outcome: AttemptOutcome,
        /// What the node saw of it, for the attempt history.
        report: AttemptReport,
    },
    /// Start a `DEAD` timer over: it is scheduled again at once, its
    /// generation raised, and fires with a new fire id and a new attempt
    /// series (its history keeps the old one's attempts).
    Redrive {
        key: TimerKey,
    },
    /// A new leader's first entry. Its log index becomes the shard's fencing
    /// epoch.
    LeaderEpoch {
        leader: crate::NodeId,
    },
    /// Delete these finished timers, if their retention has run out.
    Purge {
        keys: Vec<TimerKey>,
    },
    /// A change to the cluster map. Only the metadata group's log carries
    /// these, and it carries nothing else.
    Cluster(crate::cluster::ClusterCommand),
    /// A pull consumer takes a due pull timer straight from the fire-time
    /// index: its `Fire` (as [`Command::Fire`] with `due_ms`) and the
    /// reservation of its first attempt until `until_ms` (as
    /// [`Command::Reserve`] of the firing that `Fire` starts), in one
    /// command. Applying it is applying those two in turn at the same log
    /// position, so it has every effect and check of each (a timer that is
    /// not a pull timer is refused, `WrongState`, untouched); a pull timer
    /// thus costs one command less between its due time and a consumer's
    /// hands. Last among the variants: postcard numbers them by position,
    /// and the logs written before it still decode.
    FireReserve {
        key: TimerKey,
        due_ms: u64,
        epoch: u64,
        until_ms: u64,
    },
}

impl Command {
    /// The timer this command is about, if any.
    pub fn key(&self) -> Option<&TimerKey> {
        match self {
            Command::Create { key, .. }
            | Command::Cancel { key }
            | Command::Reschedule { key, .. }
            | Command::Fire { key, .. }
            | Command::Reserve { key, .. }
            | Command::FireReserve { key, .. }
            | Command::AttemptResult { key, .. }
            | Command::Redrive { key } => Some(key),
            Command::LeaderEpoch { .. } | Command::Purge { .. } | Command::Cluster(_) => None,
        }
    }
}

/// What the node saw of one attempt, kept in the timer's history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptReport {
    /// The HTTP status the receiver answered; 0 for none.
    pub status: u16,
    /// The outcome's class: `2xx`, `5xx`, `timeout`, `ack`, `nack`, …
    pub class: String,
    /// How long the request took; 0 where there was none.
    pub latency_ms: u32,
}

/// How a delivery attempt ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptOutcome {
    /// Acknowledged: webhook 2xx, or pull `Ack`.
    Delivered,
    /// Failed; retry at `retry_at_ms` (the leader drew the backoff and
    /// jitter), unless attempts or time run out.
    Failed { error: String, retry_at_ms: u64 },
    /// Failed for good (for example a webhook answered 410 Gone).
    GiveUp { error: String },
}

impl AttemptReport {
    pub fn new(status: u16, class: impl Into<String>, latency_ms: u32) -> AttemptReport {
        AttemptReport { status, class: class.into(), latency_ms }
    }
}

/// Why a command changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SkipReason {
    NotFound,
    /// Proposed under an epoch that is no longer the shard's.
    StaleEpoch,
    /// The timer is not in the state the command expects (for example a
    /// `Fire` after a cancel).
    WrongState,
    /// Refers to an older firing or attempt, or to a due time the timer no
    /// longer has.
    Stale,
    /// A `Fire` stamped before the timer's fire time: never fire early.
    NotDue,
    /// Exceeds a compiled-in hard limit.
    OverLimit,
}

/// What applying one command did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// `created` is false when an identical timer already existed.
    Created {
        record: TimerRecord,
        created: bool,
    },
    /// The id is taken by a timer with a different spec.
    AlreadyExists {
        record: TimerRecord,
    },
    /// The id holds a finished timer (delivered, dead or cancelled) with
    /// the same spec: nothing was created, and nothing will fire. A create
    /// with `replace_finished` starts a new timer under the id.
    Finished {
        record: TimerRecord,
    },
    Cancelled {
        record: TimerRecord,
    },
    /// The timer had fired and was still being delivered (retrying, or
    /// held by a pull consumer): it is now cancelled and no further
    /// attempt starts. `attempt_in_flight`: an attempt had started and
    /// has no recorded outcome, so it may still reach the receiver.
    CancelledWhileFiring {
        record: TimerRecord,
        attempt_in_flight: bool,
    },
    AlreadyCancelled {
        record: TimerRecord,
    },
    AlreadyFired {
        record: TimerRecord,
    },
    NotFound,
    Rescheduled {
        record: TimerRecord,
    },
    GenerationMismatch {
        current: u64,
    },
    NotScheduled {
        state: TimerState,
    },
    /// A delivery attempt was recorded: the leader dispatches it now.
    Dispatch {
        record: TimerRecord,
    },
    /// No attempt is left: the timer is now `DEAD`.
    Dead {
        record: TimerRecord,
    },
    /// A `Fire` came later than the timer's late-fire policy allows: it
    /// is `SKIPPED`, nothing delivered.
    LateSkipped {
        record: TimerRecord,
    },
    /// A `DEAD` timer was scheduled again (`Redrive`).
    Redriven {
        record: TimerRecord,
    },
    /// `Redrive` of a timer that is not `DEAD`.
    NotDead {
        record: TimerRecord,
    },
    /// An attempt result was recorded; `record` is the timer now.
    Recorded {
        record: TimerRecord,
    },
    Skipped {
        reason: SkipReason,
    },
    /// The entry's index became the fencing epoch.
    Epoch {
        epoch: u64,
        leader: crate::NodeId,
    },
    Purged {
        count: u32,
    },
    /// What a cluster-map command did (metadata group only).
    Cluster(crate::cluster::ClusterOutcome),
}

/// What applying one log entry returned: one result per command.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResponse {
    pub results: Vec<CommandResult>,
}
