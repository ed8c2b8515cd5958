//! One webhook endpoint's health, as the node that sends to it sees it: a
//! circuit breaker, the slow-down a `429`/`503` asks for, and the switch a
//! `410 Gone` throws. Pure: time arrives as `now_ms`, answers are returned.
//!
//! - **Closed** (healthy): every attempt is sent.
//! - **Open**: after [`BreakerConfig::failures_to_open`] failures in a row
//!   (connection refused, timeouts, 5xx other than 503), attempts are not
//!   sent until the open period ends; they count as failed attempts whose
//!   retry is no sooner than then. The period doubles with each opening
//!   (from `open_min_ms` to `open_max_ms`), and resets on a success.
//! - **Half-open**: when the period ends, one attempt (the probe) is sent;
//!   the others wait for it. Its success closes the breaker, its failure
//!   opens it again for longer. A probe with no answer within
//!   `probe_timeout_ms` is taken as lost.
//! - **Throttled**: a `429` or `503` holds every attempt to the endpoint
//!   until its `Retry-After` (or, without one, a pause that doubles from
//!   `throttle_min_ms` with each throttle in a row, to `throttle_max_ms`).
//!
//! Why: a dead or overloaded receiver should cost one request per period,
//! not one per timer, and its timers' attempts must not hold connection
//! slots that other endpoints' deliveries need. A held attempt is a failed
//! attempt (the timer's own backoff, and its retry policy, still apply):
//! nothing is lost, and nothing waits in this node's memory.
//!
//! A `410 Gone` disables one callback URL ([`Disabled`]): further attempts
//! to it are held, never sent, until an operator enables it again. That is
//! kept apart from the breaker, per URL rather than per endpoint, since a
//! receiver says "gone" of one resource.

use serde::Serialize;

/// The breaker's thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Failures in a row that open the breaker.
    pub failures_to_open: u32,
    /// The first open period; it doubles with each opening in a row.
    pub open_min_ms: u64,
    pub open_max_ms: u64,
    /// How long a probe may go unanswered before another is sent.
    pub probe_timeout_ms: u64,
    /// The pause after a `429`/`503` without `Retry-After`; it doubles with
    /// each throttle in a row.
    pub throttle_min_ms: u64,
    /// The longest pause a `Retry-After` may ask for.
    pub throttle_max_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures_to_open: 5,
            open_min_ms: 1_000,
            open_max_ms: 60_000,
            probe_timeout_ms: 15_000,
            throttle_min_ms: 1_000,
            throttle_max_ms: 600_000,
        }
    }
}

/// What to do with an attempt to the endpoint now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send it. A probe's answer decides whether the breaker closes.
    Send { probe: bool },
    /// Do not send it; its retry is due no sooner than `until_ms`.
    Hold { until_ms: u64, why: HoldReason },
}

/// Why an attempt was held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum HoldReason {
    /// The breaker is open, or half-open with its probe out.
    CircuitOpen,
    /// The endpoint asked to slow down (`429`, `503`).
    Throttled,
}

impl HoldReason {
    /// The attempt history's class, and a metric label.
    pub fn class(self) -> &'static str {
        match self {
            HoldReason::CircuitOpen => "circuit_open",
            HoldReason::Throttled => "throttled",
        }
    }
}

/// What an attempt found, as far as the endpoint's health goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// A 2xx.
    Success,
    /// Any other answer: the receiver is up (a 4xx says "not this one").
    Answered,
    /// No answer (refused, reset, timeout) or a 5xx other than 503.
    Failure,
    /// `429` or `503`, with the `Retry-After` it carried.
    Throttled { retry_after_ms: Option<u64> },
}

/// The state names `GET /v1/admin/endpoints` and the metrics use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
    Throttled,
}

impl BreakerState {
    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Throttled => "throttled",
        }
    }
}

/// One endpoint's breaker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Breaker {
    failures_in_a_row: u32,
    /// Openings since the last success: the open period's exponent.
    opens_in_a_row: u32,
    /// 0 when closed.
    open_until_ms: u64,
    /// When the probe out now was sent; 0 for none.
    probe_sent_ms: u64,
    throttles_in_a_row: u32,
    throttled_until_ms: u64,
}

impl Breaker {
    /// Whether to send an attempt at `now_ms`. A `Send { probe: true }`
    /// must be followed by [`Breaker::observe`] with `probe: true`, or by
    /// [`Breaker::probe_dropped`].
    pub fn check(&mut self, cfg: &BreakerConfig, now_ms: u64) -> Verdict {
        if now_ms < self.throttled_until_ms {
            return Verdict::Hold { until_ms: self.throttled_until_ms, why: HoldReason::Throttled };
        }
        if self.open_until_ms == 0 {
            return Verdict::Send { probe: false };
        }
        if now_ms < self.open_until_ms {
            return Verdict::Hold { until_ms: self.open_until_ms, why: HoldReason::CircuitOpen };
        }
        // Half-open: one probe at a time.
        if self.probe_sent_ms != 0 && now_ms < self.probe_sent_ms.saturating_add(cfg.probe_timeout_ms) {
            let until_ms = self.probe_sent_ms.saturating_add(cfg.probe_timeout_ms).min(now_ms + cfg.open_min_ms);
            return Verdict::Hold { until_ms, why: HoldReason::CircuitOpen };
        }
        self.probe_sent_ms = now_ms.max(1);
        Verdict::Send { probe: true }
    }

    /// A probe that was not sent after all (the attempt was abandoned).
    pub fn probe_dropped(&mut self) {
        self.probe_sent_ms = 0;
    }

    /// Takes what an attempt sent at `check`'s word found.
    pub fn observe(&mut self, cfg: &BreakerConfig, now_ms: u64, probe: bool, observed: Observed) {
        if probe {
            self.probe_sent_ms = 0;
        }
        match observed {
            Observed::Success | Observed::Answered => {
                self.failures_in_a_row = 0;
                self.opens_in_a_row = 0;
                self.open_until_ms = 0;
                self.throttles_in_a_row = 0;
            }
            Observed::Failure => {
                self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
                // A failed probe opens it again at once; otherwise, a
                // closed breaker opens at the threshold (an open one's
                // period is not stretched by answers to attempts sent
                // before it opened).
                let opening = probe || (self.open_until_ms == 0 && self.failures_in_a_row >= cfg.failures_to_open);
                if opening {
                    let exponent = self.opens_in_a_row.min(20);
                    let period = cfg.open_min_ms.saturating_mul(1 << exponent).min(cfg.open_max_ms);
                    self.opens_in_a_row = self.opens_in_a_row.saturating_add(1);
                    self.open_until_ms = now_ms.saturating_add(period).max(1);
                }
            }
            Observed::Throttled { retry_after_ms } => {
                let exponent = self.throttles_in_a_row.min(20);
                let pause = retry_after_ms
                    .unwrap_or_else(|| cfg.throttle_min_ms.saturating_mul(1 << exponent))
                    .min(cfg.throttle_max_ms);
                self.throttles_in_a_row = self.throttles_in_a_row.saturating_add(1);
                self.throttled_until_ms = self.throttled_until_ms.max(now_ms.saturating_add(pause));
                // The receiver answered: it is up.
                self.failures_in_a_row = 0;
            }
        }
    }

    pub fn state(&self, now_ms: u64) -> BreakerState {
        if now_ms < self.throttled_until_ms {
            BreakerState::Throttled
        } else if self.open_until_ms == 0 {
            BreakerState::Closed
        } else if now_ms < self.open_until_ms {
            BreakerState::Open
        } else {
            BreakerState::HalfOpen
        }
    }

    /// Failures in a row so far.
    pub fn failures_in_a_row(&self) -> u32 {
        self.failures_in_a_row
    }

    /// Until when attempts are held (open or throttled); 0 for none.
    pub fn held_until_ms(&self) -> u64 {
        self.open_until_ms.max(self.throttled_until_ms)
    }

    /// Whether it holds nothing worth remembering (a fresh one is the same).
    pub fn is_fresh(&self) -> bool {
        *self == Breaker::default()
    }
}

/// A callback URL a `410 Gone` disabled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Disabled {
    pub url: String,
    pub disabled_at_ms: u64,
    /// The timer whose attempt got the `410`.
    pub by_timer: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: BreakerConfig = BreakerConfig {
        failures_to_open: 3,
        open_min_ms: 1_000,
        open_max_ms: 8_000,
        probe_timeout_ms: 5_000,
        throttle_min_ms: 500,
        throttle_max_ms: 60_000,
    };

    fn send(b: &mut Breaker, now: u64) -> bool {
        match b.check(&CFG, now) {
            Verdict::Send { probe } => probe,
            v => panic!("held at {now}: {v:?}"),
        }
    }

    #[test]
    fn opens_after_failures_in_a_row_and_a_probe_closes_it() {
        let mut b = Breaker::default();
        for now in [0, 10, 20] {
            assert!(!send(&mut b, now));
            b.observe(&CFG, now, false, Observed::Failure);
        }
        assert_eq!(b.state(20), BreakerState::Open);
        assert_eq!(b.check(&CFG, 500), Verdict::Hold { until_ms: 1_020, why: HoldReason::CircuitOpen });
        // Half-open: one probe, the rest wait for it.
        assert!(send(&mut b, 1_020));
        assert!(matches!(b.check(&CFG, 1_030), Verdict::Hold { why: HoldReason::CircuitOpen, .. }));
        b.observe(&CFG, 1_100, true, Observed::Success);
        assert_eq!(b.state(1_100), BreakerState::Closed);
        assert!(!send(&mut b, 1_101));
    }

    #[test]
    fn a_failed_probe_opens_it_for_longer_up_to_the_cap() {
        let mut b = Breaker::default();
        for now in 0..3 {
            b.observe(&CFG, now, false, Observed::Failure);
        }
        let mut now = 2;
        let mut periods = Vec::new();
        for _ in 0..6 {
            let Verdict::Hold { until_ms, .. } = b.check(&CFG, now) else { panic!("not open") };
            periods.push(until_ms - now);
            now = until_ms;
            assert!(send(&mut b, now));
            b.observe(&CFG, now, true, Observed::Failure);
        }
        assert_eq!(periods, [1_000, 2_000, 4_000, 8_000, 8_000, 8_000]);
    }

    #[test]
    fn a_lost_probe_is_replaced_after_its_timeout() {
        let mut b = Breaker::default();
        for now in 0..3 {
            b.observe(&CFG, now, false, Observed::Failure);
        }
        assert!(send(&mut b, 1_002));
        assert!(matches!(b.check(&CFG, 3_000), Verdict::Hold { .. }));
        assert!(send(&mut b, 6_002), "the probe's timeout passed");
        b.probe_dropped();
        assert!(send(&mut b, 6_003), "a dropped probe frees the slot");
    }

    #[test]
    fn answers_that_are_not_failures_reset_the_count() {
        let mut b = Breaker::default();
        for i in 0..10 {
            b.observe(&CFG, i, false, Observed::Failure);
            b.observe(&CFG, i, false, Observed::Failure);
            b.observe(&CFG, i, false, Observed::Answered);
        }
        assert_eq!(b.state(10), BreakerState::Closed);
    }

    #[test]
    fn throttles_honour_retry_after_and_double_without_it() {
        let mut b = Breaker::default();
        b.observe(&CFG, 0, false, Observed::Throttled { retry_after_ms: Some(3_000) });
        assert_eq!(b.check(&CFG, 1), Verdict::Hold { until_ms: 3_000, why: HoldReason::Throttled });
        assert!(!send(&mut b, 3_000));
        b.observe(&CFG, 3_000, false, Observed::Throttled { retry_after_ms: None });
        assert_eq!(b.held_until_ms(), 3_000 + 1_000, "second in a row: twice the minimum");
        b.observe(&CFG, 4_000, false, Observed::Throttled { retry_after_ms: Some(10_000_000) });
        assert_eq!(b.held_until_ms(), 4_000 + 60_000, "capped");
        b.observe(&CFG, 64_000, false, Observed::Success);
        b.observe(&CFG, 64_001, false, Observed::Throttled { retry_after_ms: None });
        assert_eq!(b.held_until_ms(), 64_001 + 500, "a success resets the doubling");
    }

    #[test]
    fn late_failures_do_not_stretch_an_open_period() {
        let mut b = Breaker::default();
        for now in 0..3 {
            b.observe(&CFG, now, false, Observed::Failure);
        }
        let until = b.held_until_ms();
        for now in 3..20 {
            b.observe(&CFG, now, false, Observed::Failure);
        }
        assert_eq!(b.held_until_ms(), until);
    }
}
