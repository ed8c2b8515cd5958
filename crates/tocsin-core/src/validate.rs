//! Input rules. Each failure names the offending field and says what is
//! wrong in a lowercase message with no trailing period, so the API layer can
//! answer `INVALID_ARGUMENT` with the field.

use crate::limits;
use crate::limits::Limits;
use crate::timer::Callback;
use crate::timer::FireTime;
use crate::timer::RetryPolicy;
use crate::timer::TimerKey;
use crate::timer::TimerSpec;

/// A request field that breaks a rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// The field's name in the API, such as `namespace` or `callback.webhook.url`.
    pub field: String,
    pub message: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ValidationError { field: field.into(), message: message.into() }
    }
}

type Result<T = ()> = std::result::Result<T, ValidationError>;

/// `[a-z0-9._-]{1,64}`: namespaces and pull topics.
fn check_name(field: &str, value: &str, max: usize) -> Result {
    if value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(ValidationError::new(field, format!("must be at most {max} bytes")));
    }
    if let Some(c) = value.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '.' | '_' | '-')) {
        return Err(ValidationError::new(field, format!("must match [a-z0-9._-], found {c:?}")));
    }
    Ok(())
}

pub fn check_namespace(namespace: &str) -> Result {
    check_name("namespace", namespace, limits::MAX_NAMESPACE_BYTES)
}

/// 1–256 bytes of UTF-8 (a Rust `str` is already valid UTF-8), without
/// control characters, which would make logs and URLs ambiguous.
pub fn check_id(id: &str) -> Result {
    if id.is_empty() {
        return Err(ValidationError::new("id", "must not be empty"));
    }
    if id.len() > limits::MAX_ID_BYTES {
        return Err(ValidationError::new("id", format!("must be at most {} bytes", limits::MAX_ID_BYTES)));
    }
    if id.chars().any(char::is_control) {
        return Err(ValidationError::new("id", "must not contain control characters"));
    }
    Ok(())
}

pub fn check_key(key: &TimerKey) -> Result {
    check_namespace(&key.namespace)?;
    check_id(&key.id)
}

pub fn check_callback(callback: &Callback) -> Result {
    match callback {
        Callback::Webhook { url } => check_webhook_url(url),
        Callback::Pull { topic, ttr_ms } => {
            check_name("callback.pull.topic", topic, limits::MAX_TOPIC_BYTES)?;
            if *ttr_ms != 0 && !(limits::MIN_TTR_MS..=limits::MAX_TTR_MS).contains(ttr_ms) {
                return Err(ValidationError::new(
                    "callback.pull.ttr_ms",
                    format!("must be 0 (the consumer's) or {} to {} ms", limits::MIN_TTR_MS, limits::MAX_TTR_MS),
                ));
            }
            Ok(())
        }
        Callback::Amqp { broker, exchange, routing_key } => {
            check_name("callback.amqp.broker", broker, limits::MAX_NAMESPACE_BYTES)?;
            // AMQP 0-9-1: exchange names are letters, digits, `-_.:`, up to
            // 255 bytes; a routing key is any short string (255 bytes).
            if exchange.len() > limits::MAX_AMQP_NAME_BYTES {
                let max = limits::MAX_AMQP_NAME_BYTES;
                return Err(ValidationError::new("callback.amqp.exchange", format!("must be at most {max} bytes")));
            }
            if let Some(c) =
                exchange.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
            {
                return Err(ValidationError::new(
                    "callback.amqp.exchange",
                    format!("must match [A-Za-z0-9-_.:], found {c:?}"),
                ));
            }
            if routing_key.len() > limits::MAX_AMQP_NAME_BYTES {
                let max = limits::MAX_AMQP_NAME_BYTES;
                return Err(ValidationError::new("callback.amqp.routing_key", format!("must be at most {max} bytes")));
            }
            if routing_key.chars().any(char::is_control) {
                return Err(ValidationError::new("callback.amqp.routing_key", "must not contain control characters"));
            }
            Ok(())
        }
    }
}

/// An absolute `http` or `https` URL with a host. Which addresses a node may
/// call is the node's policy, not a property of the request.
pub fn check_webhook_url(url: &str) -> Result {
    const FIELD: &str = "callback.webhook.url";
    if url.len() > limits::MAX_URL_BYTES {
        return Err(ValidationError::new(FIELD, format!("must be at most {} bytes", limits::MAX_URL_BYTES)));
    }
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| ValidationError::new(FIELD, "must be an http:// or https:// url"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    if host.is_empty() || host.starts_with(':') {
        return Err(ValidationError::new(FIELD, "must name a host"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ValidationError::new(FIELD, "must not contain whitespace or control characters"));
    }
    Ok(())
}

pub fn check_labels(labels: &std::collections::BTreeMap<String, String>) -> Result {
    if labels.len() > limits::MAX_LABELS {
        return Err(ValidationError::new("labels", format!("at most {} labels", limits::MAX_LABELS)));
    }
    for (k, v) in labels {
        if k.is_empty() || k.len() > limits::MAX_LABEL_KEY_BYTES {
            return Err(ValidationError::new(
                "labels",
                format!("label keys must be 1-{} bytes", limits::MAX_LABEL_KEY_BYTES),
            ));
        }
        if v.len() > limits::MAX_LABEL_VALUE_BYTES {
            return Err(ValidationError::new(
                "labels",
                format!("label {k:?}: values must be at most {} bytes", limits::MAX_LABEL_VALUE_BYTES),
            ));
        }
    }
    Ok(())
}

pub fn check_retry(retry: &RetryPolicy, limits: &Limits) -> Result {
    if retry.max_attempts > limits::MAX_ATTEMPTS_CAP {
        return Err(ValidationError::new(
            "retry.max_attempts",
            format!("must be at most {}", limits::MAX_ATTEMPTS_CAP),
        ));
    }
    if retry.max_backoff_ms != 0 && retry.initial_backoff_ms > retry.max_backoff_ms {
        return Err(ValidationError::new("retry.initial_backoff_ms", "must not exceed retry.max_backoff_ms"));
    }
    for (field, value) in
        [("retry.initial_backoff_ms", retry.initial_backoff_ms), ("retry.max_backoff_ms", retry.max_backoff_ms)]
    {
        if value > limits::MAX_BACKOFF_CAP_MS {
            return Err(ValidationError::new(field, format!("must be at most {} ms", limits::MAX_BACKOFF_CAP_MS)));
        }
        if value != 0 && value < limits.min_backoff_ms {
            return Err(ValidationError::new(
                field,
                format!("must be 0 (the default) or at least {} ms", limits.min_backoff_ms),
            ));
        }
    }
    if retry.give_up_after_ms > limits::MAX_RETRY_WINDOW_MS {
        return Err(ValidationError::new(
            "retry.give_up_after_ms",
            format!("must be at most {} ms", limits::MAX_RETRY_WINDOW_MS),
        ));
    }
    Ok(())
}

/// A `Nack`'s delay before the delivery is offered again.
pub fn check_nack_delay(delay_ms: u64) -> Result {
    if delay_ms > limits::MAX_RETRY_WINDOW_MS {
        return Err(ValidationError::new("delay_ms", format!("must be at most {} ms", limits::MAX_RETRY_WINDOW_MS)));
    }
    Ok(())
}

pub fn check_payload(payload: &[u8], limits: &Limits) -> Result {
    if payload.len() > limits.max_payload_bytes.min(limits::HARD_MAX_PAYLOAD_BYTES) {
        return Err(ValidationError::new(
            "payload",
            format!("is {} bytes, the limit is {}", payload.len(), limits.max_payload_bytes),
        ));
    }
    Ok(())
}

/// Every rule a create request must pass before it reaches a leader.
pub fn check_create(key: &TimerKey, spec: &TimerSpec, limits: &Limits) -> Result {
    check_key(key)?;
    check_payload(&spec.payload, limits)?;
    check_labels(&spec.labels)?;
    check_callback(&spec.callback)?;
    check_retry(&spec.retry, limits)?;
    check_skip_if_late(spec.skip_if_late_ms)?;
    if let Some(recurrence) = &spec.recurrence {
        check_recurrence(recurrence, &spec.retry)?;
    }
    check_fire_time_shape("fire_at_ms", spec.fire_time, limits)
}

/// A recurring timer's rule, and what it rules out: `give_up_after_ms` is
/// one absolute time, which every occurrence after it would be past.
pub fn check_recurrence(recurrence: &crate::recurrence::Recurrence, retry: &RetryPolicy) -> Result {
    crate::recurrence::check(recurrence).map_err(|e| ValidationError::new(e.field, e.message))?;
    if retry.give_up_after_ms != 0 {
        return Err(ValidationError::new(
            "retry.give_up_after_ms",
            "is one absolute time and cannot bound a recurring timer's occurrences; bound them with \
             max_attempts and max_backoff_ms",
        ));
    }
    Ok(())
}

/// A series' first occurrence at or after its resolved start, within the
/// horizon.
pub fn first_occurrence(
    recurrence: &crate::recurrence::Recurrence,
    start_ms: u64,
    now_ms: u64,
    limits: &Limits,
) -> Result<u64> {
    let Some(first) = crate::recurrence::first_at(recurrence, start_ms) else {
        let why = if recurrence.until_ms != 0 { "before recurrence.until_ms" } else { "ever" };
        return Err(ValidationError::new("recurrence", format!("has no occurrence {why}")));
    };
    if first > now_ms.saturating_add(limits.max_horizon_ms) {
        return Err(ValidationError::new(
            "recurrence",
            format!("first occurs at {first} ms, more than {} ms ahead", limits.max_horizon_ms),
        ));
    }
    Ok(first)
}

/// The late-fire policy: 0 (fire however late), or a bound a fire can
/// miss by design (at least a second: lateness under that is the service's
/// own) and at most the longest retry window.
pub fn check_skip_if_late(skip_if_late_ms: u64) -> Result {
    if skip_if_late_ms != 0 && !(limits::MIN_SKIP_IF_LATE_MS..=limits::MAX_RETRY_WINDOW_MS).contains(&skip_if_late_ms) {
        return Err(ValidationError::new(
            "skip_if_late_ms",
            format!(
                "must be 0 (fire however late) or {} to {} ms",
                limits::MIN_SKIP_IF_LATE_MS,
                limits::MAX_RETRY_WINDOW_MS
            ),
        ));
    }
    Ok(())
}

/// The checks that need no clock: a delay within the horizon.
pub fn check_fire_time_shape(field: &str, fire_time: FireTime, limits: &Limits) -> Result {
    match fire_time {
        FireTime::Delay(ms) if ms > limits.max_horizon_ms => {
            Err(ValidationError::new("delay_ms", format!("must be at most {} ms", limits.max_horizon_ms)))
        }
        FireTime::At(0) => Err(ValidationError::new(field, "must be set, or give delay_ms")),
        _ => Ok(()),
    }
}

/// Turns the requested fire time into an absolute one at the leader's
/// `now_ms`: an absolute time more than `max_past_skew_ms` in the past, or
/// any time beyond the horizon, is refused.
pub fn resolve_fire_at(fire_time: FireTime, now_ms: u64, limits: &Limits) -> Result<u64> {
    match fire_time {
        FireTime::Delay(ms) => {
            check_fire_time_shape("delay_ms", fire_time, limits)?;
            Ok(now_ms.saturating_add(ms))
        }
        FireTime::At(at) => {
            check_fire_time_shape("fire_at_ms", fire_time, limits)?;
            if at.saturating_add(limits.max_past_skew_ms) < now_ms {
                return Err(ValidationError::new(
                    "fire_at_ms",
                    format!(
                        "is {} ms in the past, more than the accepted skew of {} ms",
                        now_ms - at,
                        limits.max_past_skew_ms
                    ),
                ));
            }
            if at > now_ms.saturating_add(limits.max_horizon_ms) {
                return Err(ValidationError::new(
                    "fire_at_ms",
                    format!("is more than {} ms ahead", limits.max_horizon_ms),
                ));
            }
            Ok(at)
        }
    }
}

/// The retry policy a new record stores: the request's, with defaults
/// filled in.
pub fn effective_retry(requested: &RetryPolicy, limits: &Limits) -> RetryPolicy {
    let max_backoff_ms = if requested.max_backoff_ms == 0 {
        limits.default_max_backoff_ms.max(requested.initial_backoff_ms)
    } else {
        requested.max_backoff_ms
    };
    RetryPolicy {
        max_attempts: if requested.max_attempts == 0 { limits.default_max_attempts } else { requested.max_attempts },
        initial_backoff_ms: if requested.initial_backoff_ms == 0 {
            limits.default_initial_backoff_ms.min(max_backoff_ms)
        } else {
            requested.initial_backoff_ms
        },
        max_backoff_ms,
        give_up_after_ms: requested.give_up_after_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces() {
        assert!(check_namespace("orders").is_ok());
        assert!(check_namespace("a.b_c-9").is_ok());
        assert_eq!(check_namespace("").unwrap_err().field, "namespace");
        assert!(check_namespace("Orders").is_err());
        assert!(check_namespace("a/b").is_err());
        assert!(check_namespace(&"a".repeat(64)).is_ok());
        assert!(check_namespace(&"a".repeat(65)).is_err());
    }

    #[test]
    fn ids() {
        assert!(check_id("order-42").is_ok());
        assert!(check_id("ünïcode ✓").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id(&"x".repeat(256)).is_ok());
        assert!(check_id(&"x".repeat(257)).is_err());
        assert!(check_id("a\nb").is_err());
    }

    #[test]
    fn urls() {
        assert!(check_webhook_url("http://127.0.0.1:9000/hook").is_ok());
        assert!(check_webhook_url("https://example.com").is_ok());
        assert!(check_webhook_url("ftp://example.com").is_err());
        assert!(check_webhook_url("http://").is_err());
        assert!(check_webhook_url("http://:80/x").is_err());
        assert!(check_webhook_url("http://a b").is_err());
    }

    #[test]
    fn fire_times() {
        let limits = Limits::default();
        let now = 1_800_000_000_000;
        assert_eq!(resolve_fire_at(FireTime::Delay(5), now, &limits), Ok(now + 5));
        assert_eq!(resolve_fire_at(FireTime::At(now - 1000), now, &limits), Ok(now - 1000));
        let err = resolve_fire_at(FireTime::At(now - 61_000), now, &limits).unwrap_err();
        assert_eq!(err.field, "fire_at_ms");
        assert!(resolve_fire_at(FireTime::At(now + limits.max_horizon_ms + 1), now, &limits).is_err());
        assert_eq!(
            resolve_fire_at(FireTime::Delay(limits.max_horizon_ms + 1), now, &limits).unwrap_err().field,
            "delay_ms"
        );
        assert!(resolve_fire_at(FireTime::At(0), now, &limits).is_err());
    }

    #[test]
    fn retry_defaults() {
        let limits = Limits::default();
        let eff = effective_retry(&RetryPolicy::default(), &limits);
        assert_eq!(eff.max_attempts, 300);
        assert_eq!(eff.initial_backoff_ms, 1000);
        assert_eq!(eff.max_backoff_ms, 600_000);
        // The defaults keep a timer trying for at least 24 hours: the sum of the
        // shortest waits (half of each backoff) before attempt 300.
        let shortest_ms: u64 = (1..eff.max_attempts).map(|a| crate::backoff::backoff_ms(&eff, a, 0.0)).sum();
        assert!(shortest_ms >= 24 * 3600 * 1000, "{shortest_ms} ms");
        let eff = effective_retry(&RetryPolicy { initial_backoff_ms: 900_000, ..Default::default() }, &limits);
        assert!(eff.max_backoff_ms >= eff.initial_backoff_ms);
        assert!(check_retry(&RetryPolicy { max_attempts: 5000, ..Default::default() }, &limits).is_err());
        let field = |p: RetryPolicy| check_retry(&p, &limits).unwrap_err().field;
        // A floor under the backoff: one create is not a burst of requests.
        assert_eq!(field(RetryPolicy { initial_backoff_ms: 10, ..Default::default() }), "retry.initial_backoff_ms");
        assert_eq!(field(RetryPolicy { max_backoff_ms: 999, ..Default::default() }), "retry.max_backoff_ms");
        assert!(
            check_retry(&RetryPolicy { initial_backoff_ms: 1000, max_backoff_ms: 1000, ..Default::default() }, &limits)
                .is_ok()
        );
        assert_eq!(field(RetryPolicy { max_backoff_ms: u64::MAX, ..Default::default() }), "retry.max_backoff_ms");
        assert_eq!(field(RetryPolicy { give_up_after_ms: u64::MAX, ..Default::default() }), "retry.give_up_after_ms");
        assert!(
            check_retry(&RetryPolicy { give_up_after_ms: limits::MAX_RETRY_WINDOW_MS, ..Default::default() }, &limits)
                .is_ok()
        );
        assert_eq!(check_nack_delay(u64::MAX).unwrap_err().field, "delay_ms");
        assert!(check_nack_delay(60_000).is_ok());
    }
}
