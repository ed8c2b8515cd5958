//! The node's wake-up grid: periodic work whose exact instant does not
//! matter sleeps to the next line of one node-wide grid, not for a period
//! from its own last turn, so the tasks of a runtime that share a period
//! (or periods that are multiples of each other) wake together.
//!
//! Why: an idle node is made of wake-ups. Each one that a thread sleeps
//! and is woken for costs a context switch, an `epoll_wait` and, on this
//! machine (a VM), a timer exit; measured at 30-100 µs of a core apiece
//! depending on the hour (`deploy/idle.sh` prints them per thread). Sixteen
//! fire loops ticking every 500 ms from their own start were 32 separate
//! wake-ups a second; on the grid they are two, and the control loops'
//! one-second rounds fall on lines the health watch wakes on anyway.
//!
//! What is on it: every group's heartbeats and the node's `LIVENESS`
//! messages (`shard::raft_timer`), a fire loop's look when nothing is due
//! sooner (`shard::leader`), the runtimes' lag probes (`runtime`), the
//! health watch, the balancer, the disk check, the reconcile round and the
//! gRPC health report (`control`, `admission`, `node`). What is not:
//! anything timed to an instant of its own (a timer's fire time, a
//! follower's election deadline, a retry's backoff).

use std::sync::LazyLock;
use std::time::Duration;

use tokio::time::Instant;

/// The grid's origin: the last whole minute of the wall clock before the
/// first time any of the node asks for it. Nodes whose clocks agree (NTP
/// keeps them within milliseconds) then draw the same lines: a peer's
/// heartbeats and `LIVENESS` messages, sent on its lines, reach a node while
/// its own line's wake-up runs, instead of waking it at a phase of their
/// own (measured: a fifth fewer Raft-runtime wake-ups on three idle nodes).
/// Clocks that disagree cost only those wake-ups: the grid says when
/// periodic work runs, and nothing's correctness depends on two nodes'
/// lines agreeing.
static BASE: LazyLock<Instant> = LazyLock::new(|| {
    let since_epoch = Duration::from_millis(crate::clock::system_now_ms());
    anchored(Instant::now(), since_epoch, ANCHOR_EVERY)
});

/// The wall-clock period the grid's origin is a whole multiple of: one that
/// every spacing on the grid divides (40 and 80 ms heartbeat and LIVENESS
/// lines at the defaults, 250, 400, 500 ms and 1 s).
const ANCHOR_EVERY: Duration = Duration::from_secs(60);

/// The instant, at or before `now`, at which the wall clock (reading
/// `since_epoch` at `now`) last passed a whole multiple of `every`; `now`
/// itself if the monotonic clock does not reach back that far. Pure.
pub fn anchored(now: Instant, since_epoch: Duration, every: Duration) -> Instant {
    let every_us = every.as_micros().max(1);
    let into_us = (since_epoch.as_micros() % every_us) as u64;
    now.checked_sub(Duration::from_micros(into_us)).unwrap_or(now)
}

/// The grid's origin for this process.
pub fn base() -> Instant {
    *BASE
}

/// The first line strictly after `now` of the grid with origin `base` and
/// spacing `every`. Pure.
pub fn line_after(now: Instant, base: Instant, every: Duration) -> Instant {
    line_at_or_before(now, base, every) + Duration::from_micros(every.as_micros().max(1) as u64)
}

/// The last line at or before `at` of the grid with origin `base` and
/// spacing `every` (`base` itself when `at` is before it). Pure.
pub fn line_at_or_before(at: Instant, base: Instant, every: Duration) -> Instant {
    let every_us = every.as_micros().max(1);
    let lines = at.saturating_duration_since(base).as_micros() / every_us;
    base + Duration::from_micros((lines * every_us) as u64)
}

/// The next line of the node's grid of spacing `every`: never more than
/// `every` away.
pub fn next_line(every: Duration) -> Instant {
    line_after(Instant::now(), base(), every)
}

/// Sleeps to the next line of the node's grid of spacing `every`.
pub async fn sleep_to_next_line(every: Duration) {
    tokio::time::sleep_until(next_line(every)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn tasks_that_ask_at_different_moments_wake_on_one_line() {
        let base = Instant::now();
        assert_eq!(line_after(base + ms(1), base, ms(40)), base + ms(40));
        assert_eq!(line_after(base + ms(39), base, ms(40)), base + ms(40));
        // On a line, the next one: work just done is not done again.
        assert_eq!(line_after(base + ms(40), base, ms(40)), base + ms(80));
        assert_eq!(line_after(base, base, ms(40)), base + ms(40));
        // A period that is a multiple of another lands on its lines.
        assert_eq!(line_after(base + ms(730), base, ms(1_000)), base + ms(1_000));
        assert_eq!(line_after(base + ms(990), base, ms(50)), base + ms(1_000));
        // Two nodes started apart, their clocks agreeing, share an origin.
        let epoch = Duration::from_secs(1_800_000_000);
        let a = anchored(base + ms(70_000), epoch + ms(12_345), ms(60_000));
        let b = anchored(base + ms(95_000), epoch + ms(37_345), ms(60_000));
        assert_eq!(a, base + ms(70_000 - 12_345));
        assert_eq!(a, b);
        // A wall clock on a whole minute is its own origin.
        assert_eq!(anchored(base + ms(70_000), epoch + ms(60_000), ms(60_000)), base + ms(70_000));
        // The line a moment belongs to: itself when on one.
        assert_eq!(line_at_or_before(base + ms(79), base, ms(40)), base + ms(40));
        assert_eq!(line_at_or_before(base + ms(80), base, ms(40)), base + ms(80));
        assert_eq!(line_at_or_before(base, base, ms(40)), base);
        for at in 0..200 {
            let line = line_at_or_before(base + ms(at), base, ms(40));
            assert!(line <= base + ms(at) && line_after(line, base, ms(40)) > base + ms(at), "{at}");
        }
    }
}
