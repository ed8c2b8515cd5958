//! The node's only reads of the wall clock, and the guard that keeps a wall
//! clock that jumps from firing timers early or holding them back.
//!
//! Leaders stamp time from here into every log entry (apply never reads a
//! clock), resolve `delay_ms` with it and poll the wheel with it. Three
//! defences stand between a bad wall clock and a timer:
//!
//! 1. **Jumps are not followed blindly.** The [`Guard`] anchors the wall
//!    clock to the monotonic clock. While the wall clock keeps pace with the
//!    monotonic one (within half of `max_clock_offset_ms` per reading) it is
//!    trusted and re-anchored; when it jumps, the node keeps the old
//!    timeline (anchor plus monotonic time elapsed) until the jump is
//!    confirmed: by the peers (the node's wall clock agrees with theirs
//!    again, so the jump was a correction), or, on a node with no peers,
//!    by the jump lasting [`ALONE_ACCEPT_MS`].
//! 2. **Peers measure each other.** Every Raft request and reply carries
//!    its sender's wall clock: a leader measures its offset to each peer from
//!    the round trip ([`Clock::record_peer`]), a follower from the requests
//!    it receives ([`Clock::record_incoming`]), so every node always has
//!    fresh measurements. Exported as `tocsin_clock_offset_seconds`.
//! 3. **A node that is off stops.** When a majority of the peers with a
//!    fresh measurement see this node's wall clock more than
//!    `max_clock_offset_ms` away from theirs, the node is *unsafe*: it fires
//!    nothing, hands over every leadership and stops campaigning (see
//!    [`watch`]) until its clock agrees again. With a single peer it cannot
//!    tell which of the two is wrong, so it also needs a jump of its own.
//!
//! Stamps never go backwards either way: the proposer and apply both keep
//! the largest time stamped so far.
//!
//! In test builds (debug assertions on) `TOCSIN_TEST_CLOCK_OFFSET_FILE`
//! names a file holding a signed number of milliseconds added to the wall
//! clock, re-read at most every 100 ms: how the chaos tests step a node's
//! clock (the binary is static, so libfaketime cannot).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;

/// How long a jump on a node without peers must last before the node
/// follows it.
pub const ALONE_ACCEPT_MS: u64 = 5_000;
/// A peer measurement older than this does not count.
const PEER_FRESH_MS: u64 = 3_000;
/// The min-filter bucket of one-way samples: the estimate is the smallest
/// sample of the current and the previous bucket.
const ONE_WAY_BUCKET_MS: u64 = 1_500;

/// A peer's one-way samples, reduced to two buckets' minimums.
#[derive(Clone, Copy, Debug)]
struct OneWay {
    cur_min: i64,
    cur_start: u64,
    prev_min: Option<i64>,
    prev_start: u64,
}

/// Unix milliseconds now, from the system clock alone (no guard, no test
/// offset): for file names, logs and the wake-up grid's origin
/// (`crate::grid`), never for timers.
pub fn system_now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// [`system_now_ms`] in microseconds.
fn system_now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// What the guard thinks of this node's wall clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockStatus {
    /// Keeps pace with the monotonic clock and agrees with the peers.
    Trusted,
    /// Jumped by `jump_ms` (positive: forward) and not yet confirmed; the
    /// node keeps its old timeline meanwhile.
    Jumped { jump_ms: i64 },
    /// A majority of the peers see it off by more than the allowed offset:
    /// the node must not fire or lead.
    Unsafe { offset_ms: i64 },
}

/// The pure part of the clock guard: readings in, trusted time out. No
/// clock is read in here.
#[derive(Clone, Debug)]
pub struct Guard {
    max_offset_ms: u64,
    /// `(wall, mono)` when the wall clock was last trusted.
    anchor: Option<(u64, u64)>,
    /// Since when (monotonic ms) the wall clock has been away from the
    /// anchored timeline, if it is.
    jumped_since_mono_ms: Option<u64>,
    /// `peer → (offset of this node's wall clock to the peer's, ms; when the
    /// measuring request was sent, monotonic ms)`.
    peers: HashMap<u64, (i64, u64)>,
    /// One-way samples per peer, min-filtered (see [`Guard::record_one_way`]).
    one_way: HashMap<u64, OneWay>,
    /// The largest time handed out: trusted time never goes backwards, except
    /// to follow a step the peers confirmed.
    last_ms: u64,
}

impl Guard {
    pub fn new(max_offset_ms: u64) -> Guard {
        Guard {
            max_offset_ms,
            anchor: None,
            jumped_since_mono_ms: None,
            peers: HashMap::new(),
            one_way: HashMap::new(),
            last_ms: 0,
        }
    }

    /// Records a one-way sample: a request from `peer` stamped with its wall
    /// clock, received at `mono_ms`. The sample is this node's offset plus
    /// the request's delay, which is never negative and on a loaded node
    /// reaches seconds (measured: 0.7–2 s under the chaos load, which made
    /// healthy nodes hand their leaderships over and leave shards without a
    /// leader). So, as NTP does, the peer's offset is the smallest sample of
    /// the last [`ONE_WAY_BUCKET_MS`] to two buckets: one request that got
    /// through quickly is enough to bound the offset.
    pub fn record_one_way(&mut self, peer: u64, offset_ms: i64, mono_ms: u64) {
        let w = self.one_way.entry(peer).or_insert(OneWay {
            cur_min: offset_ms,
            cur_start: mono_ms,
            prev_min: None,
            prev_start: mono_ms,
        });
        let age = mono_ms.saturating_sub(w.cur_start);
        if age >= ONE_WAY_BUCKET_MS {
            w.prev_min = (age < 2 * ONE_WAY_BUCKET_MS).then_some(w.cur_min);
            w.prev_start = w.cur_start;
            w.cur_min = offset_ms;
            w.cur_start = mono_ms;
        } else {
            w.cur_min = w.cur_min.min(offset_ms);
        }
        // The estimate is dated by the start of the bucket it comes from, the
        // earliest its sample can be: a minimum taken over samples from
        // before a wall-clock jump must not count as a measurement after it,
        // or it would confirm the jump as a correction (seen in the chaos
        // `clock-forward` row: a +30 s step followed, timers fired early).
        let (estimate, dated) = match w.prev_min {
            Some(p) if p <= w.cur_min => (p, w.prev_start),
            _ => (w.cur_min, w.cur_start),
        };
        self.peers.insert(peer, (estimate, dated));
    }

    /// Records one measurement of this node's offset to `peer`, by a request
    /// sent at `sent_mono_ms`.
    pub fn record_peer(&mut self, peer: u64, offset_ms: i64, sent_mono_ms: u64) {
        self.peers.insert(peer, (offset_ms, sent_mono_ms));
    }

    /// Forgets a peer (it left the cluster).
    pub fn forget_peer(&mut self, peer: u64) {
        self.peers.remove(&peer);
        self.one_way.remove(&peer);
    }

    /// Offsets of the peers measured by requests sent in the last
    /// [`PEER_FRESH_MS`], and at or after `since_mono_ms`.
    fn fresh_offsets(&self, mono_ms: u64, since_mono_ms: u64) -> Vec<i64> {
        let mut v: Vec<i64> = self
            .peers
            .values()
            .filter(|(_, sent)| *sent >= since_mono_ms && mono_ms.saturating_sub(*sent) <= PEER_FRESH_MS)
            .map(|(o, _)| *o)
            .collect();
        v.sort_unstable();
        v
    }

    /// The median offset of this node's wall clock to its fresh peers.
    pub fn median_offset_ms(&self, mono_ms: u64) -> Option<i64> {
        let v = self.fresh_offsets(mono_ms, 0);
        (!v.is_empty()).then(|| v[v.len() / 2])
    }

    /// Whether the peers say this node's wall clock is off: a strict
    /// majority of the fresh ones see it more than the allowed offset away.
    /// A lone peer's word counts only against a node that saw itself jump.
    fn peers_disagree(&self, mono_ms: u64, jumped: bool) -> Option<i64> {
        let v = self.fresh_offsets(mono_ms, 0);
        let off: Vec<i64> = v.iter().copied().filter(|o| o.unsigned_abs() > self.max_offset_ms).collect();
        let majority = off.len() * 2 > v.len() && (v.len() >= 2 || jumped);
        majority.then(|| off[off.len() / 2])
    }

    /// Whether the peers vouch for this node's wall clock as it is since
    /// `since_mono_ms`: a majority of those measured by requests sent since
    /// agree with it within the allowed offset. (A request sent before a
    /// jump measured the old wall clock.)
    fn peers_agree(&self, mono_ms: u64, since_mono_ms: u64) -> bool {
        let v = self.fresh_offsets(mono_ms, since_mono_ms);
        let ok = v.iter().filter(|o| o.unsigned_abs() <= self.max_offset_ms).count();
        !v.is_empty() && ok * 2 > v.len()
    }

    /// Takes a reading of both clocks and returns the time the node goes by,
    /// and what the guard thinks of the wall clock.
    pub fn observe(&mut self, wall_ms: u64, mono_ms: u64) -> (u64, ClockStatus) {
        let Some((anchor_wall, anchor_mono)) = self.anchor else {
            self.anchor = Some((wall_ms, mono_ms));
            self.last_ms = self.last_ms.max(wall_ms);
            return (self.last_ms, self.status_after(0, mono_ms));
        };
        let timeline_ms = anchor_wall.saturating_add(mono_ms.saturating_sub(anchor_mono));
        let jump_ms = wall_ms as i64 - timeline_ms as i64;
        let follows = jump_ms.unsigned_abs() <= self.max_offset_ms / 2;
        let since = self.jumped_since_mono_ms.unwrap_or(mono_ms);
        let confirmed = follows
            // The peers agree with the new wall clock: the jump was a correction.
            || self.peers_agree(mono_ms, since)
            // Nobody to ask: follow a jump that lasts.
            || (self.fresh_offsets(mono_ms, 0).is_empty() && mono_ms.saturating_sub(since) >= ALONE_ACCEPT_MS);
        let now_ms = if confirmed {
            if !follows {
                // A confirmed step is followed, backwards too: the time before it
                // was the wrong one (stamps stay monotonic per shard regardless:
                // the proposer and apply keep the largest stamp).
                tracing::warn!(jump_ms, "following a wall-clock jump the peers (or time) confirmed");
                self.last_ms = wall_ms;
            }
            self.anchor = Some((wall_ms, mono_ms));
            self.jumped_since_mono_ms = None;
            wall_ms
        } else {
            if self.jumped_since_mono_ms.is_none() {
                tracing::warn!(jump_ms, "the wall clock jumped; keeping the previous timeline until it is confirmed");
                self.jumped_since_mono_ms = Some(mono_ms);
            }
            timeline_ms
        };
        self.last_ms = self.last_ms.max(now_ms);
        let jump = if self.jumped_since_mono_ms.is_some() { jump_ms } else { 0 };
        (self.last_ms, self.status_after(jump, mono_ms))
    }

    fn status_after(&self, jump_ms: i64, mono_ms: u64) -> ClockStatus {
        if let Some(offset_ms) = self.peers_disagree(mono_ms, jump_ms != 0) {
            return ClockStatus::Unsafe { offset_ms };
        }
        if jump_ms != 0 { ClockStatus::Jumped { jump_ms } } else { ClockStatus::Trusted }
    }
}

/// A node's clock: the system clock (plus, in test builds, an offset from a
/// file) behind a [`Guard`].
pub struct Clock {
    max_offset_ms: u64,
    mono_base: Instant,
    guard: Mutex<(Guard, ClockStatus)>,
    test_offset: Option<TestOffset>,
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clock").field("max_offset_ms", &self.max_offset_ms).finish_non_exhaustive()
    }
}

impl Clock {
    /// The system clock, guarded with `max_offset_ms`.
    pub fn system(max_offset_ms: u64) -> Arc<Clock> {
        Arc::new(Clock {
            max_offset_ms,
            mono_base: Instant::now(),
            guard: Mutex::new((Guard::new(max_offset_ms), ClockStatus::Trusted)),
            test_offset: TestOffset::from_env(),
        })
    }

    pub fn max_offset_ms(&self) -> u64 {
        self.max_offset_ms
    }

    fn mono_ms(&self) -> u64 {
        self.mono_base.elapsed().as_millis() as u64
    }

    /// The raw wall clock in unix ms (with the test offset, if any): what
    /// this node reports to its peers.
    pub fn wall_ms(&self) -> u64 {
        self.wall_us() / 1000
    }

    /// [`wall_ms`](Self::wall_ms) in microseconds.
    fn wall_us(&self) -> u64 {
        let offset_ms = self.test_offset.as_ref().map_or(0, TestOffset::offset_ms);
        system_now_us().saturating_add_signed(offset_ms.saturating_mul(1000))
    }

    /// Unix milliseconds the node goes by: the guarded wall clock, never
    /// going backwards.
    pub fn now_ms(&self) -> u64 {
        self.now_ms_and_into().0
    }

    /// [`now_ms`](Self::now_ms), and how far into that millisecond the wall
    /// clock is (zero when the guard goes by another timeline than the
    /// wall clock's). A wake-up for `at_ms` is then `at_ms - now` whole
    /// milliseconds less that part: without it a fire loop woke up to a
    /// millisecond after the timer's millisecond began, on top of the
    /// runtime's own rounding up to its next millisecond.
    pub fn now_ms_and_into(&self) -> (u64, Duration) {
        let wall_us = self.wall_us();
        let (wall, mono) = (wall_us / 1000, self.mono_ms());
        let mut guard = self.guard.lock().expect("clock lock");
        let (now, status) = guard.0.observe(wall, mono);
        guard.1 = status;
        let into = if now == wall { Duration::from_micros(wall_us % 1000) } else { Duration::ZERO };
        (now, into)
    }

    /// What the guard thinks of the wall clock (as of a fresh reading).
    pub fn status(&self) -> ClockStatus {
        self.now_ms();
        self.guard.lock().expect("clock lock").1
    }

    /// Whether this node may fire timers and lead shards.
    pub fn is_safe(&self) -> bool {
        !matches!(self.status(), ClockStatus::Unsafe { .. })
    }

    /// Records a round trip to `peer`: sent at `sent` (when this node's wall
    /// clock said `sent_wall_ms`), answered now with the peer's wall clock at
    /// `peer_wall_ms`.
    pub fn record_peer(&self, peer: u64, sent_wall_ms: u64, sent: Instant, peer_wall_ms: u64) {
        if peer_wall_ms == 0 {
            return; // a peer that does not report its clock
        }
        let rtt = sent.elapsed();
        let midpoint_ms = sent_wall_ms as i64 + (rtt.as_millis() as i64) / 2;
        let offset_ms = midpoint_ms - peer_wall_ms as i64;
        let sent_mono = sent.saturating_duration_since(self.mono_base).as_millis() as u64;
        self.guard.lock().expect("clock lock").0.record_peer(peer, offset_ms, sent_mono);
    }

    /// Records a request from `peer` that left it when its wall clock said
    /// `peer_sent_wall_ms`: a one-way measurement (it counts the network
    /// delay as offset, milliseconds on a LAN), which is what a follower
    /// hears, since only leaders send requests to it.
    pub fn record_incoming(&self, peer: u64, peer_sent_wall_ms: u64) {
        if peer_sent_wall_ms == 0 {
            return;
        }
        let offset_ms = self.wall_ms() as i64 - peer_sent_wall_ms as i64;
        let mono = self.mono_ms();
        self.guard.lock().expect("clock lock").0.record_one_way(peer, offset_ms, mono);
    }

    pub fn forget_peer(&self, peer: u64) {
        self.guard.lock().expect("clock lock").0.forget_peer(peer);
    }

    /// This node's median offset to its peers, for the metric.
    pub fn median_offset_ms(&self) -> Option<i64> {
        let mono = self.mono_ms();
        self.guard.lock().expect("clock lock").0.median_offset_ms(mono)
    }

    /// Whether this node measures `peer`'s wall clock more than the allowed
    /// offset away from its own (a fresh measurement says so).
    pub fn peer_is_off(&self, peer: u64) -> bool {
        self.peer_offsets_ms().iter().any(|(p, o)| *p == peer && o.unsigned_abs() > self.max_offset_ms)
    }

    /// Every fresh peer offset, for the metric.
    pub fn peer_offsets_ms(&self) -> Vec<(u64, i64)> {
        let mono = self.mono_ms();
        let guard = self.guard.lock().expect("clock lock");
        let mut v: Vec<(u64, i64)> = guard
            .0
            .peers
            .iter()
            .filter(|(_, (_, at))| mono.saturating_sub(*at) <= PEER_FRESH_MS)
            .map(|(p, (o, _))| (*p, *o))
            .collect();
        v.sort_unstable();
        v
    }
}

/// The test-only wall-clock offset file (see the module doc).
struct TestOffset {
    path: std::path::PathBuf,
    cached: Mutex<(Instant, i64)>,
}

impl TestOffset {
    fn from_env() -> Option<TestOffset> {
        if !cfg!(debug_assertions) {
            return None;
        }
        let path = std::env::var_os("TOCSIN_TEST_CLOCK_OFFSET_FILE")?;
        tracing::warn!(path = ?path, "test build: the wall clock is offset by the contents of this file");
        let offset = TestOffset { path: path.into(), cached: Mutex::new((Instant::now(), 0)) };
        offset.reload();
        Some(offset)
    }

    fn reload(&self) -> i64 {
        let value = std::fs::read_to_string(&self.path).ok().and_then(|s| s.trim().parse::<i64>().ok()).unwrap_or(0);
        *self.cached.lock().expect("offset lock") = (Instant::now(), value);
        value
    }

    fn offset_ms(&self) -> i64 {
        let (read_at, value) = *self.cached.lock().expect("offset lock");
        if read_at.elapsed() < Duration::from_millis(100) { value } else { self.reload() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_800_000_000_000;

    /// The part of the millisecond comes from the same wall-clock reading
    /// as the millisecond: together they never lie ahead of a reading taken
    /// after them, so a fire loop that sleeps `at - now` milliseconds less
    /// that part wakes at the start of millisecond `at`, not before it.
    #[test]
    fn the_part_of_the_millisecond_goes_with_the_millisecond() {
        let clock = Clock::system(500);
        for _ in 0..1_000 {
            let (now_ms, into) = clock.now_ms_and_into();
            let after_us = system_now_us();
            assert!(into < Duration::from_millis(1));
            let read_us = now_ms * 1000 + into.as_micros() as u64;
            assert!(read_us <= after_us, "read {read_us} µs, wall clock after it {after_us} µs");
            assert!(after_us - read_us < 1_000_000, "the reading is a second behind the wall clock");
            assert!(clock.now_ms() >= now_ms, "the node's clock went backwards");
        }
    }

    /// Seen in the disk-full chaos row: under load, requests queued for
    /// 0.7–2 s made followers' one-way samples say their clocks were off;
    /// they handed their leaderships over and shards went without a leader.
    /// One quick request in the window must be enough to bound the offset,
    /// and a real offset must still show.
    #[test]
    fn delayed_requests_do_not_make_a_clock_look_off() {
        let mut g = Guard::new(500);
        g.observe(T, 0);
        for (i, delay_ms) in [5, 2_000, 1_800, 900, 2_100, 700, 1_500].into_iter().enumerate() {
            let at = 100 + i as u64 * 200;
            g.record_one_way(2, delay_ms, at);
            g.record_one_way(3, delay_ms, at);
            let (_, status) = g.observe(T + at, at);
            assert_eq!(status, ClockStatus::Trusted, "after a {delay_ms} ms delay");
        }
        // A clock that really is 30 s ahead shows through every sample.
        let mut g = Guard::new(500);
        g.observe(T, 0);
        for i in 0..5u64 {
            g.record_one_way(2, 30_000 + 5, 100 + i * 200);
            g.record_one_way(3, 30_000 + 5, 100 + i * 200);
        }
        let (_, status) = g.observe(T + 1_000, 1_000);
        assert!(matches!(status, ClockStatus::Unsafe { .. }), "{status:?}");
    }

    #[test]
    fn follows_a_steady_clock() {
        let mut g = Guard::new(500);
        for i in 0..100 {
            let (now, status) = g.observe(T + i * 10, i * 10);
            assert_eq!((now, status), (T + i * 10, ClockStatus::Trusted));
        }
    }

    #[test]
    fn a_forward_jump_keeps_the_old_timeline_until_peers_confirm() {
        let mut g = Guard::new(500);
        g.observe(T, 0);
        g.record_peer(2, 0, 0);
        g.record_peer(3, 0, 0);
        // The wall clock jumps 30 s ahead: nothing due in those 30 s comes early.
        let (now, status) = g.observe(T + 100 + 30_000, 100);
        assert_eq!(now, T + 100);
        assert_eq!(status, ClockStatus::Jumped { jump_ms: 30_000 });
        // The peers measure the node 30 s ahead: unsafe.
        g.record_peer(2, 30_000, 150);
        g.record_peer(3, 30_000, 150);
        let (now, status) = g.observe(T + 200 + 30_000, 200);
        assert_eq!(now, T + 200);
        assert_eq!(status, ClockStatus::Unsafe { offset_ms: 30_000 });
        // Stepped back: trusted again, once the peers measure it so.
        g.record_peer(2, 0, 300);
        g.record_peer(3, 0, 300);
        let (now, status) = g.observe(T + 300, 300);
        assert_eq!((now, status), (T + 300, ClockStatus::Trusted));
    }

    #[test]
    fn one_way_samples_from_before_a_jump_do_not_confirm_it() {
        let mut g = Guard::new(500);
        g.observe(T, 0);
        // Followers hear requests from peers 2 and 3: offsets of a few ms.
        for t in (0..1_400).step_by(100) {
            g.record_one_way(2, 5, t);
            g.record_one_way(3, 5, t);
        }
        // The wall clock jumps 30 s ahead; the next requests measure it so.
        let (now, status) = g.observe(T + 1_600 + 30_000, 1_600);
        assert_eq!((now, status), (T + 1_600, ClockStatus::Jumped { jump_ms: 30_000 }));
        g.record_one_way(2, 30_005, 1_650);
        g.record_one_way(3, 30_005, 1_650);
        // The minimum over both buckets still says 5 ms, but it was measured
        // before the jump: the jump stays unconfirmed, nothing comes early.
        let (now, status) = g.observe(T + 1_700 + 30_000, 1_700);
        assert_eq!(now, T + 1_700);
        assert_eq!(status, ClockStatus::Jumped { jump_ms: 30_000 });
        // Once only samples from after the jump remain, the peers call the
        // node off: unsafe.
        for t in (1_700..4_800).step_by(100) {
            g.record_one_way(2, 30_005, t);
            g.record_one_way(3, 30_005, t);
        }
        let (now, status) = g.observe(T + 4_800 + 30_000, 4_800);
        assert_eq!(now, T + 4_800);
        assert_eq!(status, ClockStatus::Unsafe { offset_ms: 30_005 });
    }

    #[test]
    fn a_node_that_started_ahead_follows_the_correction_back() {
        let mut g = Guard::new(500);
        // Started 30 s ahead: nothing to compare with yet, so its wall clock is
        // taken; the peers then see it off.
        g.observe(T + 30_000, 0);
        g.record_peer(2, 30_000, 10);
        g.record_peer(3, 30_000, 10);
        assert!(matches!(g.observe(T + 30_020, 20).1, ClockStatus::Unsafe { .. }));
        // Corrected: it must go back to the right time at once, not stay 30 s
        // ahead until real time catches up (it would fire early).
        g.record_peer(2, 0, 30);
        g.record_peer(3, 0, 30);
        assert_eq!(g.observe(T + 30, 30), (T + 30, ClockStatus::Trusted));
    }

    #[test]
    fn a_backward_jump_never_stalls_time() {
        let mut g = Guard::new(500);
        g.observe(T, 0);
        let (now, status) = g.observe(T + 100 - 600_000, 100);
        assert_eq!(now, T + 100, "the old timeline goes on: due timers are not held back");
        assert_eq!(status, ClockStatus::Jumped { jump_ms: -600_000 });
    }

    #[test]
    fn a_correction_the_peers_confirm_is_followed() {
        let mut g = Guard::new(500);
        g.observe(T, 0);
        // The peers say this node is 20 s behind...
        g.record_peer(2, -20_000, 0);
        g.record_peer(3, -20_000, 0);
        let (_, status) = g.observe(T + 50, 50);
        assert_eq!(status, ClockStatus::Unsafe { offset_ms: -20_000 });
        // ...then NTP steps it right: the peers agree with the new wall clock.
        g.record_peer(2, 0, 100);
        g.record_peer(3, 0, 100);
        let (now, status) = g.observe(T + 100 + 20_000, 100);
        assert_eq!((now, status), (T + 100 + 20_000, ClockStatus::Trusted));
    }

    #[test]
    fn measurements_sent_before_a_jump_do_not_confirm_it() {
        let mut g = Guard::new(500);
        g.observe(T, 0);
        // Sent before the jump: they measured the old wall clock, which agreed.
        g.record_peer(2, 0, 90);
        g.record_peer(3, 0, 90);
        let (now, status) = g.observe(T + 100 + 30_000, 100);
        assert_eq!((now, status), (T + 100, ClockStatus::Jumped { jump_ms: 30_000 }));
    }

    #[test]
    fn a_lone_node_follows_a_lasting_jump() {
        let mut g = Guard::new(500);
        g.observe(T, 0);
        let (now, _) = g.observe(T + 10_000, 1_000);
        assert_eq!(now, T + 1_000);
        let (now, _) = g.observe(T + 9_000 + ALONE_ACCEPT_MS, 1_000 + ALONE_ACCEPT_MS);
        assert_eq!(now, T + 9_000 + ALONE_ACCEPT_MS);
    }

    #[test]
    fn one_peer_alone_cannot_make_a_steady_node_unsafe() {
        let mut g = Guard::new(500);
        g.observe(T, 0);
        g.record_peer(2, 30_000, 0);
        let (_, status) = g.observe(T + 10, 10);
        assert_eq!(status, ClockStatus::Trusted);
    }

    #[test]
    fn time_never_goes_backwards() {
        let mut g = Guard::new(500);
        g.observe(T, 0);
        // A small step back within the tolerance is followed, but not below
        // what was already handed out.
        let (now, _) = g.observe(T + 10 - 200, 10);
        assert_eq!(now, T);
    }
}
