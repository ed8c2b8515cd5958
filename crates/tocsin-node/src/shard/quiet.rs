//! Quiet groups: an idle group's leader heartbeats it rarely, and one
//! message per peer every other heartbeat interval, for all of a node's
//! quiet groups at once, keeps their followers from campaigning.
//!
//! Why: Raft per group heartbeats every group every `heartbeat_ms`, and each
//! heartbeat wakes the group's core on both ends. On an idle three-node
//! cluster of 16 shards a node sent and answered about 600 heartbeat
//! messages a second, 2.9-3.1% of a core, against 0.6% for one node with no
//! peers (docs/perf-history.md, "Quiet groups"). The interval itself cannot grow:
//! a follower's election timeout must be a few intervals long, and a dead
//! leader must be replaced within 300 ms. So, as CockroachDB quiesces idle
//! ranges under its node liveness, a node tells each peer which idle groups
//! it still leads, in one message, and those groups' own heartbeats slow
//! down.
//!
//! How:
//! - **Leader.** A group is quiet ([`is_quiet`], pure) when its log has not
//!   grown for [`QUIET_AFTER`], every member (voter or learner) holds its
//!   last entry, that entry is committed, and a quorum answered the leader
//!   within two quiet heartbeats (so its core is alive and reached). Its
//!   Raft timer (`raft_timer.rs`) then wakes only on LIVENESS lines
//!   ([`liveness_every`], every other heartbeat line), lists the group here
//!   with its term each time, and triggers openraft's heartbeat only on the
//!   lines of the quiet grid ([`quiet_line`], every
//!   `raft.quiet_heartbeat_ms`, 400 ms), which all the node's quiet groups
//!   share. Those heartbeats keep `last_quorum_acked` under the proposer's
//!   one-second `QUORUM_LOST_AFTER` and the balancer's one-second
//!   freshness. A write ends it: its append reaches the followers at once,
//!   and the timer's next line sees the log grow.
//! - **Writes.** openraft 0.10 refuses a write from a leader whose lease (a
//!   quorum's answer within the election timeout max) has run out, which a
//!   quiet group's has between its heartbeats. Every write path first calls
//!   [`renew_lease`]: a heartbeat and one round trip, on the first write
//!   after a quiet spell only. openraft counts an append's answer as a
//!   heartbeat's, so the writes that follow keep the lease, and a `Fire` or
//!   `Reserve` entry renews the dispatch lease before its delivery is sent.
//! - **Node.** On every LIVENESS line, `raft_timer::run_liveness` sends each peer one
//!   `LIVENESS` message (one way: no reply) with the groups listed within
//!   [`LISTING_FRESH_HEARTBEATS`] heartbeat intervals. A listing that is not
//!   renewed lapses: a group whose timer is stuck behind a hung core drops
//!   out of the message on its own.
//! - **Follower.** The receiver notes, per group it hosts, when it heard
//!   that (node, term) lead it ([`Quiet::heard_from`]). A voter's timer
//!   counts that as hearing from its leader, but only for the vote it holds:
//!   a committed vote for that node in that term ([`heard_counts`]); while
//!   that keeps its deadline ahead, it does not ask the core. A dead or
//!   cut-off leader node sends nothing, and its followers campaign at the
//!   same deadline as before: the last word from it, plus the lease, plus
//!   the drawn timeout (the in-process test measures 232-245 ms).
//!
//! What it leaves alone: openraft's voting and commit, and the dispatch
//! lease (`ShardCtx::lease_valid`), which still needs a quorum's answer
//! within the election timeout. One thing differs while a group is quiet:
//! between its rare heartbeats a follower's openraft lease has run out, so
//! a node that cannot hear the leader (an asymmetric partition) and
//! campaigns gets the other followers' votes where they would have refused
//! it. The new leader is an ordinary one, and the old one learns of it at
//! its next heartbeat. A node of an older version answers `LIVENESS` with
//! an error and its groups never go quiet; during a rolling upgrade its
//! followers of a newer node's quiet groups may campaign, once, and win.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

/// How long a leader's log must not grow before its group is quiet.
pub const QUIET_AFTER: Duration = Duration::from_secs(1);
/// How many heartbeat intervals a listing counts without being renewed
/// ([`Quiet::listed`]); a quiet group's timer renews it on every LIVENESS
/// line, two intervals apart.
pub const LISTING_FRESH_HEARTBEATS: u32 = 3;
/// Most groups one `LIVENESS` message names (a node hosts a few dozen; a
/// message naming more is cut to this, the rest heartbeat as before).
pub const MAX_GROUPS_PER_MESSAGE: usize = 4_096;

/// What the leader's timer sees of its group, from openraft's metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderView {
    pub last_log_index: u64,
    pub committed_index: u64,
    /// Every other member's matched index is `last_log_index`.
    pub all_matched: bool,
    /// How long ago a quorum last acknowledged this leader.
    pub quorum_acked_age: Option<Duration>,
}

/// Whether a leader's group is quiet (see the module doc): nothing new in
/// its log for [`QUIET_AFTER`] (`unchanged_for`), all of it held by every
/// member and committed, and a quorum's acknowledgement younger than two
/// quiet heartbeats. Pure.
pub fn is_quiet(view: LeaderView, unchanged_for: Duration, quiet_heartbeat: Duration) -> bool {
    view.all_matched
        && view.committed_index == view.last_log_index
        && unchanged_for >= QUIET_AFTER
        && view.quorum_acked_age.is_some_and(|age| age < quiet_heartbeat * 2)
}

/// What a follower heard about one group: node `from` leads it in `term`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heard {
    pub from: u64,
    pub term: u64,
    pub at: Instant,
}

/// When a follower last heard from its leader through `LIVENESS`, if that
/// counts for the vote it holds: committed, and for the node and term the
/// message named. A message for another term or node (an older leader, a
/// node that lost the group) counts for nothing. Pure.
pub fn heard_counts(heard: Option<Heard>, vote_leader: Option<(u64, u64)>, vote_committed: bool) -> Option<Instant> {
    let heard = heard?;
    let (term, node) = vote_leader?;
    (vote_committed && heard.term == term && heard.from == node).then_some(heard.at)
}

/// The node's quiet groups, both ways: the ones it leads (listed by their
/// timers) and what its peers said of the ones it follows. Shared by every
/// group's timer, the liveness sender and the link's server.
#[derive(Clone, Default)]
pub struct Quiet {
    inner: Arc<QuietInner>,
}

#[derive(Default)]
struct QuietInner {
    /// Group → (term, when its timer last listed it).
    leading: Mutex<HashMap<u64, (u64, Instant)>>,
    /// Group → the last `LIVENESS` that named it.
    heard: Mutex<HashMap<u64, Heard>>,
    /// openraft heartbeats this node's timers triggered.
    heartbeats: AtomicU64,
    /// `LIVENESS` messages this node sent.
    sent: AtomicU64,
    /// Told when a group is listed while none was: the sender waits on it
    /// instead of waking on every line for nothing.
    first_listed: tokio::sync::Notify,
}

impl Quiet {
    /// Lists `group`, led in `term`, as quiet as of `now`.
    pub fn list(&self, group: u64, term: u64, now: Instant) {
        let mut leading = self.inner.leading.lock().expect("quiet lock");
        if leading.is_empty() {
            self.inner.first_listed.notify_one();
        }
        leading.insert(group, (term, now));
    }

    /// Returns once a group is listed, if none is now; or at once, if one
    /// was listed since the last call. (A permit, not a broadcast: a
    /// listing between a sender's look and its wait is not missed.)
    pub async fn wait_listed(&self) {
        self.inner.first_listed.notified().await;
    }

    /// `group` is not quiet (or not led here) any more.
    pub fn unlist(&self, group: u64) {
        self.inner.leading.lock().expect("quiet lock").remove(&group);
    }

    /// The groups listed within `fresh` of `now` (see
    /// [`LISTING_FRESH_HEARTBEATS`]), with their terms, at most
    /// [`MAX_GROUPS_PER_MESSAGE`]; older listings are dropped.
    pub fn listed(&self, now: Instant, fresh: Duration) -> Vec<(u64, u64)> {
        let mut leading = self.inner.leading.lock().expect("quiet lock");
        leading.retain(|_, (_, at)| now.saturating_duration_since(*at) < fresh);
        let mut groups: Vec<(u64, u64)> = leading.iter().map(|(group, (term, _))| (*group, *term)).collect();
        groups.sort_unstable();
        groups.truncate(MAX_GROUPS_PER_MESSAGE);
        groups
    }

    /// Node `from` says it leads `groups` (group, term), as of `now`; only
    /// groups for which `hosted` holds are noted, so the map stays as small
    /// as what this node hosts.
    pub fn heard_from(&self, from: u64, groups: &[(u64, u64)], now: Instant, hosted: impl Fn(u64) -> bool) {
        let mut heard = self.inner.heard.lock().expect("quiet lock");
        for &(group, term) in groups.iter().take(MAX_GROUPS_PER_MESSAGE) {
            if hosted(group) {
                heard.insert(group, Heard { from, term, at: now });
            }
        }
    }

    /// What this node last heard about `group`.
    pub fn heard(&self, group: u64) -> Option<Heard> {
        self.inner.heard.lock().expect("quiet lock").get(&group).copied()
    }

    /// Forgets what was heard about `group` (it is no longer hosted here).
    pub fn forget(&self, group: u64) {
        self.inner.heard.lock().expect("quiet lock").remove(&group);
        self.unlist(group);
    }

    pub(crate) fn count_heartbeat(&self) {
        self.inner.heartbeats.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("tocsin_raft_heartbeats_total").increment(1);
    }

    pub(crate) fn count_sent(&self) {
        self.inner.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// openraft heartbeats this node's group timers triggered since start.
    pub fn heartbeats(&self) -> u64 {
        self.inner.heartbeats.load(Ordering::Relaxed)
    }

    /// `LIVENESS` messages this node sent since start.
    pub fn liveness_sent(&self) -> u64 {
        self.inner.sent.load(Ordering::Relaxed)
    }
}

/// Renews the leader's lease before a write, if it has run out: openraft
/// 0.10 refuses a write (`ForwardToLeader`, reason `LeaseExpired`) from a
/// leader that no quorum answered within its lease (the election timeout
/// max), and between a quiet group's rare heartbeats that is most of the
/// time. So a write to a quiet group first sends a heartbeat and waits (up
/// to twice the lease) for a quorum's answer: one round trip, on the first
/// write only, since the writes that follow keep the lease fresh. A node
/// that does not lead, a lone voter, or a lease still good: returns at once.
pub async fn renew_lease(raft: &tocsin_store::Raft) {
    use openraft::Instant as _;
    use openraft::async_runtime::WatchReceiver as _;
    let lease = Duration::from_millis(raft.config().election_timeout_max);
    // A write reaches the core within microseconds; the margin covers a
    // busy runtime between this check and the core's.
    let margin = lease / 8;
    let needs_renewal = |m: &openraft::RaftMetrics<tocsin_store::TypeConfig>| {
        m.state == openraft::ServerState::Leader
            && m.current_leader == Some(m.id)
            && m.membership_config.membership().voter_ids().nth(1).is_some()
            && m.last_quorum_acked.as_ref().is_none_or(|acked| acked.elapsed() + margin >= lease)
    };
    let mut metrics = raft.metrics();
    if !needs_renewal(&metrics.borrow_watched()) {
        return;
    }
    metrics::counter!("tocsin_raft_lease_renewals_total").increment(1);
    if raft.trigger().heartbeat().await.is_err() {
        return;
    }
    let renewed = async {
        while needs_renewal(&metrics.borrow_watched()) {
            if metrics.changed().await.is_err() {
                return;
            }
        }
    };
    // No quorum answers: the write goes ahead and is refused, as before.
    let _ = tokio::time::timeout(lease * 2, renewed).await;
}

/// How often a node sends its LIVENESS messages: every other heartbeat
/// line. A follower campaigns only after the lease plus a drawn timeout
/// (230-260 ms at the defaults) without word from its leader, so two of
/// these may be lost in a row before it does; and a longer interval does
/// not delay failover, since the deadline counts from the last word.
pub fn liveness_every(heartbeat: Duration) -> Duration {
    heartbeat * 2
}

/// When a follower whose deadline counts from a LIVENESS message looks
/// again, at `now`, ahead of its election `deadline`: on the last line of
/// the node's grid of spacing `every` (the LIVENESS lines) at or before the
/// deadline, when the node's quiet leaders' timers and its LIVENESS sender
/// wake anyway, and all its followers with them; at the deadline itself
/// when no line falls after `now` and before it. A look that finds no new
/// word moves to the deadline, so the campaign is never later. Pure.
pub fn recheck_at(now: Instant, deadline: Instant, grid_base: Instant, every: Duration) -> Instant {
    let last = crate::grid::line_at_or_before(deadline, grid_base, every);
    if last > now { last } else { deadline }
}

/// Whether the grid line `at` is one of the quiet grid's, on which every
/// quiet group of the node heartbeats: every `quiet_every` (rounded down
/// to whole LIVENESS intervals), on lines that also carry a LIVENESS
/// message, so a peer gets one frame for them all. Pure.
pub fn quiet_line(at: Instant, grid_base: Instant, heartbeat: Duration, quiet_every: Duration) -> bool {
    let step = liveness_every(heartbeat).as_millis().max(1);
    let lines_per_heartbeat = (quiet_every.as_millis() / step).max(1);
    // Round to the nearest line: a timer may wake a little after its line.
    let line = (at.saturating_duration_since(grid_base).as_millis() + step / 2) / step;
    line.is_multiple_of(lines_per_heartbeat)
}

#[cfg(test)]
mod tests {
    use super::*;

    const QH: Duration = Duration::from_millis(400);

    fn view() -> LeaderView {
        LeaderView {
            last_log_index: 10,
            committed_index: 10,
            all_matched: true,
            quorum_acked_age: Some(Duration::from_millis(30)),
        }
    }

    #[test]
    fn a_group_is_quiet_only_when_idle_caught_up_committed_and_acknowledged() {
        assert!(is_quiet(view(), QUIET_AFTER, QH));
        // Its log grew less than QUIET_AFTER ago.
        assert!(!is_quiet(view(), QUIET_AFTER - Duration::from_millis(1), QH));
        // A member lags.
        assert!(!is_quiet(LeaderView { all_matched: false, ..view() }, QUIET_AFTER, QH));
        // Its last entry is not committed.
        assert!(!is_quiet(LeaderView { committed_index: 9, ..view() }, QUIET_AFTER, QH));
        // No quorum answered for two quiet heartbeats, or ever.
        assert!(!is_quiet(LeaderView { quorum_acked_age: Some(QH * 2), ..view() }, QUIET_AFTER, QH));
        assert!(is_quiet(
            LeaderView { quorum_acked_age: Some(QH * 2 - Duration::from_millis(1)), ..view() },
            QUIET_AFTER,
            QH
        ));
        assert!(!is_quiet(LeaderView { quorum_acked_age: None, ..view() }, QUIET_AFTER, QH));
    }

    #[test]
    fn quiet_heartbeats_fall_on_shared_liveness_lines() {
        let base = Instant::now();
        let hb = Duration::from_millis(40);
        let ms = |n| base + Duration::from_millis(n);
        // LIVENESS every 80 ms; quiet heartbeats every 400 ms: lines 0, 5, 10.
        assert!(quiet_line(ms(0), base, hb, QH));
        assert!(!quiet_line(ms(80), base, hb, QH));
        assert!(!quiet_line(ms(320), base, hb, QH));
        assert!(quiet_line(ms(400), base, hb, QH));
        // A timer that wakes a few milliseconds late is still on its line.
        assert!(quiet_line(ms(403), base, hb, QH));
        assert!(!quiet_line(ms(483), base, hb, QH));
        // A quiet interval shorter than two heartbeats: every LIVENESS line.
        assert!(quiet_line(ms(80), base, hb, Duration::from_millis(40)));
        assert_eq!(liveness_every(hb), Duration::from_millis(80));
    }

    #[test]
    fn a_quiet_follower_looks_on_the_last_line_before_its_deadline_or_at_it() {
        let base = Instant::now();
        let ms = |n| base + Duration::from_millis(n);
        let every = Duration::from_millis(80);
        // Lines at 80, 160, 240: the last one at or before 250 is 240.
        assert_eq!(recheck_at(ms(10), ms(250), base, every), ms(240));
        assert_eq!(recheck_at(ms(10), ms(240), base, every), ms(240));
        // No line after now and before the deadline: the deadline.
        assert_eq!(recheck_at(ms(241), ms(300), base, every), ms(300));
        assert_eq!(recheck_at(ms(240), ms(250), base, every), ms(250));
        // Never after the deadline, never before the next line.
        for now in 0..400 {
            for deadline in now + 1..now + 300 {
                let at = recheck_at(ms(now), ms(deadline), base, every);
                assert!(at <= ms(deadline) && at > ms(now), "now {now} deadline {deadline}");
            }
        }
    }

    #[test]
    fn liveness_counts_only_for_the_vote_held() {
        let at = Instant::now();
        let heard = Some(Heard { from: 2, term: 7, at });
        assert_eq!(heard_counts(heard, Some((7, 2)), true), Some(at));
        // Another term, another node, a vote not committed, no vote, nothing heard.
        assert_eq!(heard_counts(heard, Some((8, 2)), true), None);
        assert_eq!(heard_counts(heard, Some((7, 3)), true), None);
        assert_eq!(heard_counts(heard, Some((7, 2)), false), None);
        assert_eq!(heard_counts(heard, None, true), None);
        assert_eq!(heard_counts(None, Some((7, 2)), true), None);
    }

    #[test]
    fn listings_lapse_unless_renewed_and_only_hosted_groups_are_heard() {
        let quiet = Quiet::default();
        let fresh = Duration::from_millis(120);
        let t0 = Instant::now();
        quiet.list(3, 5, t0);
        quiet.list(1, 4, t0 + Duration::from_millis(100));
        assert_eq!(quiet.listed(t0 + Duration::from_millis(110), fresh), vec![(1, 4), (3, 5)]);
        // Group 3 was not renewed within `fresh`.
        assert_eq!(quiet.listed(t0 + fresh, fresh), vec![(1, 4)]);
        quiet.unlist(1);
        assert!(quiet.listed(t0 + fresh, fresh).is_empty());

        quiet.heard_from(2, &[(1, 9), (40, 9)], t0, |g| g < 16);
        assert_eq!(quiet.heard(1), Some(Heard { from: 2, term: 9, at: t0 }));
        assert_eq!(quiet.heard(40), None);
        quiet.forget(1);
        assert_eq!(quiet.heard(1), None);
    }
}
