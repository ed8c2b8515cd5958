//! Every group's Raft timer, in place of openraft's tick.
//!
//! openraft ticks each group every `heartbeat_ms * 13 / 64` (8 ms at the
//! default 40 ms) to see whether a heartbeat or an election is due. With
//! 16 groups per node that is 2,000 wake-ups a second of a tick task and a
//! core each, whatever the groups do, and the groups' heartbeats leave at
//! different phases, so they rarely share a link frame: an idle node of a
//! three-node cluster spent 5-6% of a core on it (docs/perf-history.md,
//! "Every group's Raft timer instead of openraft's tick").
//!
//! Here openraft's tick is off for good and one task per group wakes only
//! when something is due ([`next_step`], pure: the group's role and vote
//! clock in, what to do and when out):
//!
//! - **A leader with a peer** (voter or learner) sends a heartbeat every
//!   `heartbeat_ms`, on a grid every group of the node shares
//!   (the node's wake-up grid, `crate::grid`): the node's heartbeats to a peer leave
//!   together and share one link frame. A leader alone needs none.
//! - **A voter that does not lead** campaigns at openraft's own deadline
//!   (`handle_tick_election`): the vote's last update, plus its lease (the
//!   election timeout max while the vote is an established leader's), plus
//!   an election timeout ([`election_deadline`]; how long, next). The vote
//!   clock is openraft's, read from its core at the deadline, so everything
//!   that defers an election there (appends, heartbeats, snapshots from the
//!   leader, a granted vote) defers it here, and the deadline is met to the
//!   millisecond instead of the next tick. A campaign starts with a pre-vote
//!   (a lone voter's need not), as with openraft's `enable_pre_vote`:
//!   openraft's tick also holds back a voter that has seen a longer log than
//!   its own (for twice the max), which this cannot see; such a voter's
//!   pre-vote is refused without a new term, and the voter with the longest
//!   log still wins at its own deadline.
//! - **The election timeouts** are not drawn at random over one range for
//!   every voter: two survivors of a dead leader could then campaign within
//!   a message's flight of each other, both pass their pre-votes, split the
//!   vote and wait a whole timeout more. Each voter of a group has its own
//!   place in the group's campaign order ([`campaign_rank`], by a hash of
//!   group and node: the same on every node, and a different order per
//!   group, so a dead node's groups go to the survivors about evenly). The
//!   node the voter's vote names (the leader gone silent) has no place, so
//!   the first survivor is always first in line. The voter at place `r`
//!   waits `min + r × (max − min) / 2` plus a jitter under a third of that
//!   step ([`Timings::campaign_timeout`]): at the default timings any two
//!   voters' campaigns are 10 ms or more apart, where a pre-vote's round
//!   trip takes a millisecond or two, so the first survivor has won before
//!   the next one starts. A first in line that cannot win (its log is
//!   behind, or it cannot reach a quorum) costs the next in line one step.
//! - **A learner** waits for a membership change.
//! - **A quiet group** (`quiet.rs`): a leader whose group has been idle
//!   and caught up for a second wakes only every other grid line, heartbeats
//!   only every `raft.quiet_heartbeat_ms` (on lines all the node's quiet
//!   groups share), and lists the group for the node's `LIVENESS` messages
//!   ([`run_liveness`]: one per peer every other line, no reply); a
//!   follower counts such a message as hearing from its leader when it
//!   names the vote it holds.
//!
//! A node whose clock is off from its peers does not campaign
//! ([`Campaigning`], set by `control::balance`): openraft's `elect(false)`
//! only stops its tick, and a triggered election ignores it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::ServerState;
use rand::Rng as _;
use tocsin_store::Raft;
use tokio::time::Instant;

/// Whether this node may campaign: false while its clock is off from its
/// peers (`control::balance::watch_health`). Shared by all its groups.
#[derive(Clone, Debug)]
pub struct Campaigning(Arc<AtomicBool>);

impl Default for Campaigning {
    fn default() -> Self {
        Campaigning(Arc::new(AtomicBool::new(true)))
    }
}

impl Campaigning {
    pub fn set(&self, allowed: bool) {
        self.0.store(allowed, Ordering::Relaxed);
    }

    pub fn allowed(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A group's role, as far as its timer is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Leads, with at least one other member (voter or learner).
    Leader,
    /// Leads, and is the group's only member: nothing to time.
    LoneLeader,
    /// A voter that does not lead; `lone` when it is the only voter.
    Voter { lone: bool },
    /// Not a voter (a learner, or removed): never campaigns.
    NotVoter,
}

/// The group's role from openraft's server metrics.
pub fn role_of(m: &openraft::metrics::RaftServerMetrics<tocsin_store::TypeConfig>, node_id: u64) -> Role {
    let membership = m.membership_config.membership();
    let voter = membership.voter_ids().any(|v| v == node_id);
    let lone_voter = voter && membership.voter_ids().count() == 1;
    if m.state == ServerState::Leader && m.current_leader == Some(node_id) {
        if lone_voter && membership.learner_ids().next().is_none() { Role::LoneLeader } else { Role::Leader }
    } else if voter {
        Role::Voter { lone: lone_voter }
    } else {
        Role::NotVoter
    }
}

/// The group's timings, from its openraft config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    pub heartbeat: Duration,
    pub election_min: Duration,
    pub election_max: Duration,
}

impl Timings {
    pub fn of(config: &openraft::Config) -> Timings {
        Timings {
            heartbeat: Duration::from_millis(config.heartbeat_interval),
            election_min: Duration::from_millis(config.election_timeout_min),
            election_max: Duration::from_millis(config.election_timeout_max),
        }
    }

    /// What separates two neighbours in a group's campaign order: half the
    /// range between the timeouts' min and max (15 ms at the defaults).
    fn campaign_step(&self) -> Duration {
        self.election_max.saturating_sub(self.election_min) / 2
    }

    /// The jitter on top of a place's timeout stays under a third of a step,
    /// so neighbours' campaigns are at least two thirds of a step apart.
    fn jitter_span_ms(&self) -> u64 {
        (self.campaign_step().as_millis() as u64 / 3).max(1)
    }

    /// A fresh jitter for the next campaign, from [0, a third of a step).
    fn draw_jitter(&self) -> Duration {
        Duration::from_millis(rand::rng().random_range(0..self.jitter_span_ms()))
    }

    /// The election timeout of the voter at place `rank` of its group's
    /// campaign order ([`campaign_rank`]), with `jitter` from
    /// [`Self::draw_jitter`]: `min + rank × step + jitter`. Pure.
    pub fn campaign_timeout(&self, rank: usize, jitter: Duration) -> Duration {
        self.election_min + self.campaign_step() * rank as u32 + jitter
    }
}

/// This node's place in its group's campaign order: how many of the
/// group's `voters`, other than `silent` (the node its vote names: the
/// leader it would replace), come before it. The order is by a hash of the
/// group and each voter's id (ties by id), so every node computes the same
/// order from the same membership and vote, and each group has its own:
/// over many groups, each of two voters comes first in about half. Pure.
pub fn campaign_rank(group: u64, node_id: u64, voters: impl Iterator<Item = u64>, silent: Option<u64>) -> usize {
    let key = |node: u64| (campaign_hash(group, node), node);
    let mine = key(node_id);
    voters.filter(|&v| v != node_id && Some(v) != silent && key(v) < mine).count()
}

/// splitmix64's finaliser over the group and node: fixed, unlike the
/// standard library's hasher, because every node must compute the same
/// order.
fn campaign_hash(group: u64, node: u64) -> u64 {
    let mut z = group.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ node.wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// When a voter campaigns, by openraft's rule: the vote's last update, plus
/// the lease of an established leader's vote (a candidate's vote has none),
/// plus the drawn election timeout. A vote never updated since the group
/// started counts from `started`.
pub fn election_deadline(
    vote_updated: Option<Instant>,
    leader_vote: bool,
    lease: Duration,
    drawn: Duration,
    started: Instant,
) -> Instant {
    match vote_updated {
        Some(at) => at + if leader_vote { lease } else { Duration::ZERO } + drawn,
        None => started + drawn,
    }
}

/// What a group's timer does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing is due until the role changes.
    Idle,
    /// Send a heartbeat at this instant.
    HeartbeatAt(Instant),
    /// Read the vote clock again at this instant.
    CheckAt(Instant),
    /// Campaign now, with a pre-vote round first or not.
    Elect { pre_vote: bool },
}

/// The vote clock as openraft's core reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VoteClock {
    pub updated: Option<Instant>,
    /// The vote is an established leader's (committed), so it holds a lease.
    pub leader_vote: bool,
    /// `updated` is a LIVENESS message's arrival (`quiet.rs`), later than
    /// anything the core saw: the group's leader is quiet.
    pub by_liveness: bool,
}

impl VoteClock {
    /// This clock with a LIVENESS message heard at `heard` (one that names
    /// this vote, `quiet::heard_counts`) counted as word from the leader.
    pub fn with_liveness(self, heard: Option<Instant>) -> VoteClock {
        let by_liveness = heard.is_some_and(|h| self.updated.is_none_or(|u| h > u));
        VoteClock { updated: self.updated.max(heard), by_liveness, ..self }
    }
}

/// openraft's view of a group this node leads, for `quiet::is_quiet`.
fn leader_view(raft: &Raft) -> (crate::shard::quiet::LeaderView, u64) {
    use openraft::Instant as _;
    use openraft::async_runtime::WatchReceiver as _;
    let rx = raft.metrics();
    let m = rx.borrow_watched();
    let last_log_index = m.last_log_index.unwrap_or(0);
    let all_matched = m.replication.as_ref().is_some_and(|targets| {
        targets.values().all(|matched| matched.as_ref().is_some_and(|l| l.index == last_log_index))
    });
    let view = crate::shard::quiet::LeaderView {
        last_log_index,
        committed_index: m.local_committed.as_ref().map_or(0, |l| l.index),
        all_matched,
        quorum_acked_age: m.last_quorum_acked.as_ref().map(|t| t.elapsed()),
    };
    (view, m.current_term)
}

/// A leader timer's memory of its group's log, for the quiet rule.
struct LeaderMemory {
    last_log_index: u64,
    grew_at: Instant,
    /// The group was quiet at the last grid line.
    quiet: bool,
}

/// Takes the group out of the node's quiet lists when its timer ends (the
/// core stopped: the group is gone from here).
struct Unlist {
    quiet: crate::shard::quiet::Quiet,
    group: u64,
}

impl Drop for Unlist {
    fn drop(&mut self) {
        self.quiet.forget(self.group);
    }
}

/// What to do next, at `now`, for a group in `role` whose vote clock reads
/// `vote` (only a voter's is read), with `drawn` as the current election
/// timeout. Pure: no clock, no I/O.
pub fn next_step(
    role: Role,
    now: Instant,
    vote: Option<VoteClock>,
    timings: Timings,
    drawn: Duration,
    started: Instant,
    grid_base: Instant,
) -> Step {
    match role {
        Role::LoneLeader | Role::NotVoter => Step::Idle,
        Role::Leader => Step::HeartbeatAt(crate::grid::line_after(now, grid_base, timings.heartbeat)),
        // openraft's tick elects a lone voter at once, lease or not.
        Role::Voter { lone: true } => Step::Elect { pre_vote: false },
        Role::Voter { lone: false } => {
            let Some(vote) = vote else { return Step::CheckAt(now) };
            let deadline = election_deadline(vote.updated, vote.leader_vote, timings.election_max, drawn, started);
            if now >= deadline { Step::Elect { pre_vote: true } } else { Step::CheckAt(deadline) }
        }
    }
}

/// How the node's timers quiet idle groups (`quiet.rs`).
#[derive(Clone)]
pub struct Quieting {
    pub quiet: crate::shard::quiet::Quiet,
    /// A quiet group's heartbeat interval; `None`: groups never go quiet.
    pub heartbeat: Option<Duration>,
}

/// A voter's last read of its vote from the core: the clock, and the
/// leader (term, node) it names.
#[derive(Clone, Copy)]
struct VoteRead {
    clock: VoteClock,
    leader: (u64, u64),
}

impl VoteRead {
    /// The node the vote names: while this voter waits, the leader gone
    /// silent, which the campaign order leaves out.
    fn silent(self) -> u64 {
        self.leader.1
    }
}

/// Drives `raft`'s heartbeats and elections for the group's life (see the
/// module doc). Spawned on the Raft runtime with every group.
pub async fn drive(raft: Raft, node_id: u64, group: u64, campaigning: Campaigning, quieting: Quieting) {
    use openraft::async_runtime::WatchReceiver as _;
    raft.runtime_config().tick(false);
    let timings = Timings::of(raft.config());
    let grid_base = crate::grid::base();
    let started = Instant::now();
    // The jitter is drawn per campaign; the place in the campaign order is
    // read from the membership on every turn (it changes with the voters).
    let mut jitter = timings.draw_jitter();
    let mut metrics = raft.server_metrics();
    let quiet = quieting.quiet.clone();
    let _unlist = Unlist { quiet: quiet.clone(), group };
    let mut memory: Option<LeaderMemory> = None;
    // Valid until the server metrics change (a new vote changes them).
    let mut vote_read: Option<VoteRead> = None;
    loop {
        // Only a voter among others campaigns in an order, so only it
        // reads the voters (a leader's heartbeat turns allocate nothing).
        let (role, voters) = {
            let m = metrics.borrow_and_update();
            let role = role_of(&m, node_id);
            let voters = match role {
                Role::Voter { lone: false } => m.membership_config.membership().voter_ids().collect::<Vec<u64>>(),
                _ => Vec::new(),
            };
            (role, voters)
        };
        // The election timeout, for a vote that names `silent` (the
        // campaign order leaves that node out).
        let drawn_for = |silent: Option<u64>, jitter: Duration| {
            timings.campaign_timeout(campaign_rank(group, node_id, voters.iter().copied(), silent), jitter)
        };
        if role != Role::Leader {
            quiet.unlist(group);
            memory = None;
        }
        let now = Instant::now();
        let vote = match role {
            Role::Voter { lone: false } => {
                // While a quiet leader's LIVENESS messages keep the deadline
                // ahead, the core need not be asked (`quiet.rs`).
                let heard_ahead = vote_read.and_then(|read| {
                    let heard = crate::shard::quiet::heard_counts(
                        quiet.heard(group),
                        Some(read.leader),
                        read.clock.leader_vote,
                    )?;
                    let drawn = drawn_for(Some(read.silent()), jitter);
                    let deadline = election_deadline(Some(heard), true, timings.election_max, drawn, started);
                    (deadline > now).then_some(heard)
                });
                match heard_ahead {
                    // Only a committed vote's heard time counts.
                    Some(heard) => Some(VoteClock { updated: Some(heard), leader_vote: true, by_liveness: true }),
                    None => match read_vote(&raft).await {
                        Some(read) => {
                            vote_read = Some(read);
                            // A LIVENESS message naming this vote counts as
                            // hearing from the leader.
                            let heard = crate::shard::quiet::heard_counts(
                                quiet.heard(group),
                                Some(read.leader),
                                read.clock.leader_vote,
                            );
                            Some(read.clock.with_liveness(heard))
                        }
                        // The core stopped: nothing left to time.
                        None => return,
                    },
                }
            }
            _ => None,
        };
        let now = Instant::now();
        let drawn = drawn_for(vote_read.map(VoteRead::silent), jitter);
        let wake_at = match next_step(role, now, vote, timings, drawn, started, grid_base) {
            Step::Idle => None,
            // A quiet leader wakes on the LIVENESS grid only (`quiet.rs`).
            Step::HeartbeatAt(_) if memory.as_ref().is_some_and(|m| m.quiet) => {
                Some(crate::grid::line_after(now, grid_base, crate::shard::quiet::liveness_every(timings.heartbeat)))
            }
            // A follower of a quiet group looks again on the last LIVENESS
            // line before its deadline, when the node's own line wake-ups
            // run anyway; silence since then moves the look to the
            // deadline itself, so a campaign is not a moment later.
            Step::CheckAt(at) if vote.is_some_and(|v| v.by_liveness) => Some(crate::shard::quiet::recheck_at(
                now,
                at,
                grid_base,
                crate::shard::quiet::liveness_every(timings.heartbeat),
            )),
            Step::HeartbeatAt(at) | Step::CheckAt(at) => Some(at),
            Step::Elect { pre_vote } => {
                if campaigning.allowed() && raft.trigger().elect(pre_vote).await.is_err() {
                    return;
                }
                // A campaign draws a new jitter, and the next one waits a
                // whole timeout: a pre-vote does not move the vote clock, and
                // a lone voter's election is decided by the next metrics.
                jitter = timings.draw_jitter();
                Some(now + drawn_for(vote_read.map(VoteRead::silent), jitter))
            }
        };
        let changed = match wake_at {
            None => metrics.changed().await.is_ok(),
            Some(at) => tokio::select! {
                changed = metrics.changed() => {
                    vote_read = None;
                    changed.is_ok()
                }
                () = tokio::time::sleep_until(at) => {
                    if role == Role::Leader && heartbeat_due(&raft, group, &quieting, &mut memory, timings.heartbeat, at, grid_base) {
                        quiet.count_heartbeat();
                        if raft.trigger().heartbeat().await.is_err() {
                            return;
                        }
                    }
                    true
                }
            },
        };
        if !changed {
            return;
        }
    }
}

/// The vote as the core holds it; `None` when the core has stopped.
async fn read_vote(raft: &Raft) -> Option<VoteRead> {
    raft.with_raft_state(|st| {
        use openraft::Instant as _;
        // openraft's instant wraps tokio's, privately: the same moment, as
        // an age.
        let now = Instant::now();
        let leader = st.vote_ref().leader_id();
        VoteRead {
            clock: VoteClock {
                updated: st.vote_last_modified().map(|at| now - at.elapsed()),
                leader_vote: st.vote_ref().is_committed(),
                by_liveness: false,
            },
            leader: (leader.term, leader.node_id),
        }
    })
    .await
    .ok()
}

/// On a leader's grid line `at`: whether to send openraft's heartbeat now.
/// A quiet group (`quiet::is_quiet`) is listed for the node's `LIVENESS`
/// messages and heartbeats only on the lines of the quiet grid
/// (`quiet::quiet_line`), which every quiet group of the node shares, so
/// their heartbeats to a peer leave together, beside a LIVENESS message;
/// any other group is unlisted and heartbeats on every line.
fn heartbeat_due(
    raft: &Raft,
    group: u64,
    quieting: &Quieting,
    memory: &mut Option<LeaderMemory>,
    every: Duration,
    at: Instant,
    grid_base: Instant,
) -> bool {
    let Some(quiet_every) = quieting.heartbeat else { return true };
    let now = Instant::now();
    let (view, term) = leader_view(raft);
    let memory = memory.get_or_insert(LeaderMemory { last_log_index: view.last_log_index, grew_at: now, quiet: false });
    if view.last_log_index != memory.last_log_index {
        memory.last_log_index = view.last_log_index;
        memory.grew_at = now;
    }
    memory.quiet = crate::shard::quiet::is_quiet(view, now.saturating_duration_since(memory.grew_at), quiet_every);
    if memory.quiet {
        quieting.quiet.list(group, term, now);
        crate::shard::quiet::quiet_line(at, grid_base, every, quiet_every)
    } else {
        quieting.quiet.unlist(group);
        true
    }
}

/// Sends every peer the quiet groups this node leads, on every LIVENESS
/// line (`quiet::liveness_every`) of the timers' grid, while there are any. One
/// way: a lost message only lets the follower's deadline come closer. Runs
/// for the node's life, on the Raft runtime.
pub async fn run_liveness(quiet: crate::shard::quiet::Quiet, router: crate::shard::raft::Router, heartbeat: Duration) {
    let grid_base = crate::grid::base();
    let every = crate::shard::quiet::liveness_every(heartbeat);
    let fresh = heartbeat * crate::shard::quiet::LISTING_FRESH_HEARTBEATS;
    loop {
        let now = Instant::now();
        tokio::time::sleep_until(crate::grid::line_after(now, grid_base, every)).await;
        // Let the quiet leaders' timers, woken on the same line, renew
        // their listings (and queue their heartbeats) first.
        tokio::task::yield_now().await;
        let groups = quiet.listed(Instant::now(), fresh);
        metrics::gauge!("tocsin_raft_quiet_groups").set(groups.len() as f64);
        if groups.is_empty() {
            // Nothing quiet to tell (a lone node's groups never are): sleep
            // until a group is listed, not to every line.
            quiet.wait_listed().await;
            continue;
        }
        for (peer, _) in router.known() {
            quiet.count_sent();
            // Refused (no connection yet, a full queue): the peer's
            // deadline comes closer, nothing else.
            let _ = router.liveness(peer, &groups);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timings = Timings {
        heartbeat: Duration::from_millis(40),
        election_min: Duration::from_millis(100),
        election_max: Duration::from_millis(130),
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_follower_campaigns_at_openrafts_deadline_lease_plus_draw() {
        let start = Instant::now();
        let heard = start + ms(1_000);
        let vote = Some(VoteClock { updated: Some(heard), leader_vote: true, by_liveness: false });
        let step = |now| next_step(Role::Voter { lone: false }, now, vote, T, ms(110), start, start);
        // Heard from the leader at 1,000: lease 130 + drawn 110.
        assert_eq!(step(heard + ms(10)), Step::CheckAt(heard + ms(240)));
        assert_eq!(step(heard + ms(239)), Step::CheckAt(heard + ms(240)));
        assert_eq!(step(heard + ms(240)), Step::Elect { pre_vote: true });
        // A candidate's vote holds no lease: only the draw.
        let candidate = Some(VoteClock { updated: Some(heard), leader_vote: false, by_liveness: false });
        assert_eq!(
            next_step(Role::Voter { lone: false }, heard + ms(50), candidate, T, ms(110), start, start),
            Step::CheckAt(heard + ms(110))
        );
        // A vote never updated counts from the group's start.
        let fresh = Some(VoteClock { updated: None, leader_vote: false, by_liveness: false });
        assert_eq!(
            next_step(Role::Voter { lone: false }, start + ms(5), fresh, T, ms(120), start, start),
            Step::CheckAt(start + ms(120))
        );
    }

    #[test]
    fn a_liveness_message_counts_only_when_later_than_the_cores_word() {
        let start = Instant::now();
        let core = VoteClock { updated: Some(start + ms(100)), leader_vote: true, by_liveness: false };
        assert_eq!(core.with_liveness(None), core);
        assert_eq!(core.with_liveness(Some(start + ms(100))), core);
        assert_eq!(core.with_liveness(Some(start + ms(50))), core);
        let later = core.with_liveness(Some(start + ms(180)));
        assert_eq!(later, VoteClock { updated: Some(start + ms(180)), by_liveness: true, ..core });
        let never = VoteClock { updated: None, ..core };
        assert_eq!(never.with_liveness(Some(start)), VoteClock { updated: Some(start), by_liveness: true, ..core });
    }

    #[test]
    fn leaders_heartbeat_lone_voters_elect_at_once_and_others_wait() {
        let start = Instant::now();
        let now = start + ms(95);
        assert_eq!(next_step(Role::Leader, now, None, T, ms(100), start, start), Step::HeartbeatAt(start + ms(120)));
        assert_eq!(next_step(Role::LoneLeader, now, None, T, ms(100), start, start), Step::Idle);
        assert_eq!(next_step(Role::NotVoter, now, None, T, ms(100), start, start), Step::Idle);
        let vote = Some(VoteClock { updated: Some(now), leader_vote: true, by_liveness: false });
        assert_eq!(
            next_step(Role::Voter { lone: true }, now, vote, T, ms(100), start, start),
            Step::Elect { pre_vote: false }
        );
    }

    #[test]
    fn neighbours_in_the_campaign_order_campaign_two_thirds_of_a_step_apart() {
        // Step 15 ms at the defaults, jitter under 5 ms.
        assert_eq!(T.campaign_step(), ms(15));
        for _ in 0..1_000 {
            let jitter = T.draw_jitter();
            assert!(jitter < ms(5), "{jitter:?}");
            assert_eq!(T.campaign_timeout(0, jitter), ms(100) + jitter);
            assert_eq!(T.campaign_timeout(2, jitter), ms(130) + jitter);
        }
        // The latest first in line against the earliest second: 11 ms.
        assert_eq!(T.campaign_timeout(1, Duration::ZERO) - T.campaign_timeout(0, ms(4)), ms(11));
    }

    #[test]
    fn a_groups_campaign_order_is_one_order_and_fair_over_groups() {
        let voters = [1_u64, 2, 3];
        let mut first = [0_usize; 4];
        let mut two_before_three = 0;
        for group in 0..3_000_u64 {
            let places: Vec<usize> =
                voters.iter().map(|&n| campaign_rank(group, n, voters.into_iter(), None)).collect();
            // Every node computes the same order: places 0, 1, 2, once each.
            let mut sorted = places.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2], "group {group}: {places:?}");
            first[voters[places.iter().position(|&r| r == 0).unwrap()] as usize] += 1;
            // With node 1 silent, which survivor campaigns first: always
            // at place 0, the other at place 1, in the same order as before.
            let silent = |n: u64| campaign_rank(group, n, voters.into_iter(), Some(1));
            assert_eq!([silent(2), silent(3)].iter().min(), Some(&0), "group {group}");
            assert_eq!(silent(2) < silent(3), places[1] < places[2], "group {group}");
            two_before_three += usize::from(places[1] < places[2]);
        }
        for (node, firsts) in first.iter().enumerate().skip(1) {
            assert!((850..=1_150).contains(firsts), "node {node} first in {firsts} of 3,000");
        }
        assert!((1_350..=1_650).contains(&two_before_three), "node 2 before node 3 in {two_before_three} of 3,000");
        // Whether the node itself is in the list does not change its place.
        assert_eq!(campaign_rank(7, 2, [1, 3].into_iter(), None), campaign_rank(7, 2, voters.into_iter(), None));
        // A vote naming the node itself (it campaigned) takes no one out.
        assert_eq!(campaign_rank(7, 2, voters.into_iter(), Some(2)), campaign_rank(7, 2, voters.into_iter(), None));
    }
}
