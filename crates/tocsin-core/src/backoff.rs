//! The retry schedule: exponential backoff with "equal jitter".
//!
//! The leader draws the jitter and stamps the resulting retry time into the
//! log, so apply stays deterministic; this function is pure.

use crate::timer::RetryPolicy;

/// The delay before the attempt after `failed_attempt` (1-based):
/// `d = min(max, initial × 2^(failed_attempt − 1))`, then a uniformly random
/// point of `[d/2, d]` chosen by `jitter` in `[0, 1)`. Half the delay is
/// guaranteed (no retry storm right after a failure) and the other half
/// spreads retries of a burst of timers that failed together.
pub fn backoff_ms(policy: &RetryPolicy, failed_attempt: u32, jitter: f64) -> u64 {
    equal_jitter_ms(policy.initial_backoff_ms, policy.max_backoff_ms, failed_attempt.saturating_sub(1), jitter)
}

/// `d = min(max_ms, initial_ms × 2^exponent)`, then the point of `[d/2, d]`
/// that `jitter` in `[0, 1)` picks: the one backoff rule of the project
/// (the leader's retry schedule above, and the client's retries).
pub fn equal_jitter_ms(initial_ms: u64, max_ms: u64, exponent: u32, jitter: f64) -> u64 {
    let base = initial_ms.max(1).saturating_mul(1u64 << exponent.min(62)).min(max_ms.max(1));
    let jitter = jitter.clamp(0.0, 1.0);
    let half = base / 2;
    half + ((base - half) as f64 * jitter) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps() {
        let p = RetryPolicy { max_attempts: 10, initial_backoff_ms: 1000, max_backoff_ms: 10_000, give_up_after_ms: 0 };
        assert_eq!(backoff_ms(&p, 1, 1.0), 1000);
        assert_eq!(backoff_ms(&p, 1, 0.0), 500);
        assert_eq!(backoff_ms(&p, 2, 1.0), 2000);
        assert_eq!(backoff_ms(&p, 4, 1.0), 8000);
        assert_eq!(backoff_ms(&p, 5, 1.0), 10_000);
        assert_eq!(backoff_ms(&p, 500, 0.5), 7500);
        for a in 1..30 {
            let d = backoff_ms(&p, a, 0.3);
            assert!((500..=10_000).contains(&d));
        }
    }
}
