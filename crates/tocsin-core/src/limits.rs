//! Every bound a request, a batch or a record must respect, in one place.
//!
//! [`Limits`] holds the configurable ones (a node reads them from its
//! config); the `HARD_*` constants are compiled in and also checked while
//! applying the log, so a misconfigured leader cannot bloat the log.

use serde::Deserialize;
use serde::Serialize;

/// Largest payload any configuration may allow.
pub const HARD_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// Largest batch of creates in one call.
pub const HARD_MAX_BATCH: usize = 1000;
/// Most labels on a timer.
pub const MAX_LABELS: usize = 16;
pub const MAX_LABEL_KEY_BYTES: usize = 64;
pub const MAX_LABEL_VALUE_BYTES: usize = 256;
pub const MAX_NAMESPACE_BYTES: usize = 64;
pub const MAX_ID_BYTES: usize = 256;
pub const MAX_TOPIC_BYTES: usize = 64;
pub const MAX_URL_BYTES: usize = 2048;
/// Most delivery attempts a policy may ask for.
pub const MAX_ATTEMPTS_CAP: u32 = 1000;
/// Longest retry backoff a policy may ask for: a day.
pub const MAX_BACKOFF_CAP_MS: u64 = 24 * 3600 * 1000;
/// Longest a timer may keep retrying (`give_up_after_ms`), and longest a
/// consumer may push a delivery back with a `Nack`: 30 days.
pub const MAX_RETRY_WINDOW_MS: u64 = 30 * 24 * 3600 * 1000;
/// Longest stored delivery error message.
pub const MAX_ERROR_BYTES: usize = 256;
/// The smallest late-fire bound a timer may set (`skip_if_late_ms`).
pub const MIN_SKIP_IF_LATE_MS: u64 = 1_000;
/// Shortest and longest time-to-run of a pull reservation.
pub const MIN_TTR_MS: u64 = 100;
pub const MAX_TTR_MS: u64 = 24 * 3600 * 1000;
/// Finished attempts a timer's history keeps (the latest ones).
pub const MAX_ATTEMPT_HISTORY: usize = 32;
/// Longest outcome class kept in an attempt's history entry.
pub const MAX_ATTEMPT_CLASS_BYTES: usize = 32;
/// Longest AMQP exchange name and routing key (an AMQP short string).
pub const MAX_AMQP_NAME_BYTES: usize = 255;
/// Longest cron expression and time-zone name of a recurring timer.
pub const MAX_CRON_BYTES: usize = 256;
pub const MAX_TIME_ZONE_BYTES: usize = 64;
/// Shortest and longest interval of a recurring timer (`every_ms`).
pub const MIN_INTERVAL_MS: u64 = 1_000;
pub const MAX_INTERVAL_MS: u64 = 366 * 24 * 3600 * 1000;
/// Width of a horizon bucket: counts of upcoming fires are kept per minute.
pub const HORIZON_BUCKET_MS: u64 = 60_000;
/// Longest a push timer's first `Fire` may be applied ahead of its fire
/// time (an *armed* fire, see `apply.rs`): the apply rules refuse an
/// earlier one (`NotDue`), whatever a leader's `firing.arm_ahead_ms` says.
/// A part of the apply rules: every replica must agree on it.
pub const MAX_ARM_AHEAD_MS: u64 = 2_000;

/// Configurable limits and defaults. Every field is documented in
/// `deploy/tocsin.example.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_payload_bytes: usize,
    pub max_batch: usize,
    /// How far in the past an absolute fire time may be (client clock skew,
    /// retried requests); such a timer fires at once.
    pub max_past_skew_ms: u64,
    /// How far ahead a fire time may be.
    pub max_horizon_ms: u64,
    /// How long a finished timer stays queryable, and its id taken.
    pub retention_ms: u64,
    pub default_max_attempts: u32,
    pub default_initial_backoff_ms: u64,
    pub default_max_backoff_ms: u64,
    /// Shortest retry backoff a policy may ask for (0 asks for the
    /// default): one create cannot become a stream of requests to its
    /// target. Each wait is a random point of `[d/2, d]` of its backoff `d`.
    pub min_backoff_ms: u64,
    /// Most timers one `ListTimers` page returns.
    pub max_page_size: usize,
    /// Most deliveries one `Ack` or `Nack` call settles.
    pub max_settle_batch: usize,
    /// A `Nack`'s reason is cut to this many characters.
    pub max_reason_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload_bytes: 64 * 1024,
            max_batch: HARD_MAX_BATCH,
            max_past_skew_ms: 60_000,
            max_horizon_ms: 2 * 365 * 24 * 3600 * 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            // With no policy given, a timer keeps trying for at least a day: the
            // backoff doubles from 1 s to 10 min (each wait is a random point of
            // [d/2, d]), so 300 attempts take at least ~25 h. A receiver outage
            // of hours costs retries, not timers.
            default_max_attempts: 300,
            default_initial_backoff_ms: 1_000,
            default_max_backoff_ms: 600_000,
            min_backoff_ms: 1_000,
            max_page_size: 1000,
            max_settle_batch: 10_000,
            max_reason_chars: 200,
        }
    }
}
