//! The shard leader's fire loop: only the leader of a shard runs one.
//!
//! On becoming leader (openraft's metrics say so), the task:
//! 1. attaches to the shard's [`EventSink`](crate::shard::events::EventSink), so it
//!    hears about every entry applied from then on;
//! 2. proposes a `LeaderEpoch` entry and waits until it is applied: its log
//!    index is the fencing epoch, and every cancel committed under earlier
//!    leaders is applied by then;
//! 3. runs [`FireCore`], the pure state machine that decides what to load,
//!    what to fire and what to re-read, and carries out its actions: pages
//!    of the fire-time index (on the blocking pool), batches of `Fire`
//!    proposals, re-reads of single timers.
//!
//! Everything the loop needs is in replicated state. Every unfinished timer
//! sits in the fire-time index under the time this leader must act on it
//! next (its fire time, an attempt's deadline, a backoff's end), and the
//! loop follows the applied log in log order whether or not any caller
//! still waits. A `Fire` whose reply is lost is found again in the log or
//! re-read; an attempt whose outcome is lost comes due at its deadline. So
//! a lost reply, task or stream costs bounded lateness, never a timer.
//!
//! Dispatching follows the applied log too: when an entry's `Fire` starts a
//! webhook attempt or makes a pull timer ready, delivery gets it from the
//! applied entry, not from the proposer's reply.
//!
//! **Armed fires** (`tocsin_core::arm`). The core hands a push timer's
//! first fire over up to `firing.arm_ahead_ms` before its time, a step of
//! fire times at once, and the `Fire` is applied ahead: its attempt starts
//! at the fire time. The loop holds such an attempt ([`Armed`]) until its
//! start, drops it if the applied log moves the timer again (a cancel, a
//! reschedule), and at its start sends it once the proposer's
//! [`StampFence`](tocsin_core::arm::StampFence) says no cancel stamped
//! before it is still on its way and the applied log up to then is read.
//! So the commit is off the path from fire time to delivery.
//!
//! On step-down the task is aborted at once; deliveries in flight notice
//! through [`ShardCtx::may_dispatch`]. A node whose clock is off fires
//! nothing (`clock.rs`).

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;
use std::time::Duration;

use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::Due;
use tocsin_core::DueKind;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::arm::Armed;
use tocsin_core::fire::Action;
use tocsin_core::fire::FireConfig;
use tocsin_core::fire::FireCore;
use tocsin_core::fire::FireOutcome;
use tocsin_core::fire::LoadFrom;
use tocsin_store::DuePage;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::shard::Leadership;
use crate::shard::ShardCtx;
use crate::shard::delivery::Dispatcher;
use crate::shard::events::Applied;
use crate::shard::events::Events;
use crate::shard::proposer::ProposeError;

/// Fire batches proposed and not yet answered, per shard.
const MAX_FIRE_BATCHES_IN_FLIGHT: usize = 4;
/// Tries of a leader epoch that failed other than by the two refusals
/// [`establish`] waits out.
const EPOCH_TRIES: u32 = 20;
/// How long a new leader keeps proposing its epoch while openraft refuses
/// it without naming a leader (the lease not yet confirmed): far past the
/// lease's first heartbeat round; bounded so that a refusal that never
/// ends still starts the task afresh.
const EPOCH_REFUSED_PATIENCE: Duration = Duration::from_secs(2);
/// How often the loop looks when nothing wakes it (loads the window
/// forward, purges, publishes gauges).
const TICK: Duration = Duration::from_millis(500);
/// How often the loop's gauges are published.
const GAUGES_EVERY: Duration = Duration::from_millis(500);
/// After an unknown outcome or a `NotDue`, a timer's next `Fire` waits this
/// long.
const RETRY_DELAY_MS: u64 = 50;
/// Least time between two rescans of the whole index after lost events: a
/// persistently full pull queue must not become a loop of full scans.
const RESCAN_EVERY: Duration = Duration::from_secs(5);

/// A running leader task.
pub struct LeaderTask {
    join: JoinHandle<()>,
}

impl LeaderTask {
    pub fn spawn(ctx: Arc<ShardCtx>, dispatcher: Arc<Dispatcher>) -> LeaderTask {
        LeaderTask { join: tokio::spawn(run(ctx, dispatcher)) }
    }

    /// Stops firing at once: the task is aborted wherever it is.
    pub fn stop(self) {
        self.join.abort();
    }

    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }
}

/// Watches openraft's metrics for the shard and keeps a leader task running
/// exactly while this node is the shard's leader: started when it becomes
/// leader, aborted the moment it is not, restarted if it ended on its own
/// (for example after being fenced) while openraft still calls it leader.
pub async fn supervise(ctx: Arc<ShardCtx>, dispatcher: Arc<Dispatcher>) {
    // The server metrics change only with the vote, state, leader or
    // membership. openraft publishes its full metrics after every step of
    // its core (every heartbeat, 25 times a second per group, and every
    // write): watching those would wake this task, across runtimes, that
    // often for every shard.
    let mut metrics = ctx.raft.server_metrics();
    let mut task: Option<(LeaderTask, u64)> = None;
    loop {
        let (leading, term) = {
            let m = metrics.borrow_and_update();
            (m.state == openraft::ServerState::Leader && m.current_leader == Some(ctx.node_id), m.vote.leader_id().term)
        };
        task = match (leading, task.take()) {
            (false, Some((t, _))) => {
                t.stop();
                ctx.set_leadership(Leadership::Follower);
                tracing::info!(shard = ctx.shard, "stopped leading shard");
                None
            }
            (true, Some((t, t_term))) if t_term != term || t.is_finished() => {
                // The old task's guard detaches only its own attachment (by
                // generation), however late the abort takes effect.
                t.stop();
                ctx.set_leadership(Leadership::Follower);
                Some((LeaderTask::spawn(ctx.clone(), dispatcher.clone()), term))
            }
            (true, None) => Some((LeaderTask::spawn(ctx.clone(), dispatcher.clone()), term)),
            (_, other) => other,
        };
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() {
                if let Some((t, _)) = task.take() {
                    t.stop();
                }
                ctx.set_leadership(Leadership::Follower);
                return;
            },
            // A task that ended on its own is restarted a moment later (the
            // loop's head sees it finished; the pause keeps a task that keeps
            // ending from spinning). Waiting on it, rather than polling,
            // keeps an idle shard's supervisor asleep.
            _ = async {
                match task.as_mut() {
                    Some((t, _)) => {
                        let _ = (&mut t.join).await;
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    }
}

async fn run(ctx: Arc<ShardCtx>, dispatcher: Arc<Dispatcher>) {
    let events = ctx.events.attach();
    let _guard = Guard { ctx: ctx.clone(), generation: events.generation };
    tracing::info!(shard = ctx.shard, "elected; committing a leader epoch");
    let elected_ms = ctx.clock.now_ms();
    // Before the epoch entry is proposed: what this node stamped before is
    // applied (or truncated) ahead of that entry (`StampFence`).
    ctx.proposer.new_leadership();
    let Some(epoch) = establish(&ctx).await else { return };
    // How long the epoch took is logged because a failover's first fire
    // waits for it (the chaos suite prints these lines of the new leader).
    tracing::info!(shard = ctx.shard, epoch, epoch_ms = ctx.clock.now_ms().saturating_sub(elected_ms), "leading shard");
    metrics::counter!("tocsin_leader_changes_total", "shard" => ctx.shard.to_string()).increment(1);
    ctx.set_leadership(Leadership::Leading { epoch });
    tokio::spawn(refresh_own_address(ctx.clone()));
    let firing = &ctx.config.firing;
    let config = FireConfig {
        hot_window_ms: firing.hot_window_ms,
        load_page: firing.load_page,
        max_tracked: firing.max_wheel_entries,
        retry_delay_ms: RETRY_DELAY_MS,
        retries_per_namespace_per_sec: firing.retries_per_namespace_per_sec,
        catch_up_after_ms: firing.catch_up_after_ms,
        catch_up_per_namespace_per_sec: firing.catch_up_per_namespace_per_sec,
        arm_ahead_ms: firing.arm_ahead_ms,
        arm_step_ms: firing.arm_step_ms,
    };
    let now = ctx.clock.now_ms();
    let (io_tx, io_rx) = mpsc::unbounded_channel();
    let mut lp = FireLoop {
        core: FireCore::new(config, epoch, now),
        ctx: ctx.clone(),
        dispatcher,
        epoch,
        io_tx,
        batches_in_flight: 0,
        rereads: Vec::new(),
        first_fire_logged: false,
        started_ms: now,
        paused_version: u64::MAX,
        armed: Armed::default(),
    };
    lp.run(events, io_rx).await;
}

/// Resets leadership and detaches from the events when the task ends or is
/// aborted.
struct Guard {
    ctx: Arc<ShardCtx>,
    generation: u64,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.ctx.set_leadership(Leadership::Follower);
        self.ctx.events.detach(self.generation);
        metrics::gauge!("tocsin_wheel_entries", "shard" => self.ctx.shard.to_string()).set(0.0);
        metrics::gauge!("tocsin_fire_behind_seconds", "shard" => self.ctx.shard.to_string()).set(0.0);
        self.ctx.proposer.set_fire_behind(Duration::ZERO);
    }
}

/// If this node's address in the group's membership is not the one it now
/// advertises (it was restarted on another port, say), records the new one,
/// so peers and clients find it.
async fn refresh_own_address(ctx: Arc<ShardCtx>) {
    let want = tocsin_store::NodeAddr {
        grpc_addr: ctx.config.grpc_advertise(),
        http_addr: ctx.config.http_advertise(),
        peer_addr: ctx.config.peer_advertise(),
    };
    let current = ctx.raft.metrics().borrow_watched().membership_config.membership().get_node(&ctx.node_id).cloned();
    if current.as_ref() == Some(&want) {
        return;
    }
    let change = openraft::ChangeMembers::SetNodes(std::collections::BTreeMap::from([(ctx.node_id, want.clone())]));
    match ctx.raft.change_membership(change, true).await {
        Ok(_) => tracing::info!(shard = ctx.shard, grpc = %want.grpc_addr, "recorded this node's new address"),
        Err(e) => tracing::warn!(shard = ctx.shard, error = %e, "could not record this node's new address"),
    }
}

/// Commits this leader's `LeaderEpoch` entry; its index is the epoch.
///
/// Two refusals are waited out for as long as openraft's metrics say this
/// node leads (the supervisor aborts the task the moment they do not):
/// a write refused without a leader named right after the election, for
/// up to [`EPOCH_REFUSED_PATIENCE`], and a leader cut off from its peers,
/// quietly, until a quorum answers. Any other failure is tried
/// [`EPOCH_TRIES`] times.
async fn establish(ctx: &ShardCtx) -> Option<u64> {
    let mut failures = 0;
    let mut refused_since: Option<std::time::Instant> = None;
    let mut cut_off_logged = false;
    loop {
        if !ctx.clock.is_safe() {
            // A node whose clock is off does not take up firing (it is handing
            // its leaderships over).
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        match ctx.proposer.propose(Command::LeaderEpoch { leader: ctx.node_id }).await {
            Ok((_, CommandResult::Epoch { epoch, leader })) if leader == ctx.node_id => return Some(epoch),
            Ok((_, other)) => {
                tracing::warn!(shard = ctx.shard, ?other, "unexpected epoch result");
                return None;
            }
            // Right after an election openraft refuses writes until a
            // quorum has confirmed the new leader's lease (seen in every
            // chaos kill-leader run, within 1 ms of the election, and later
            // on a busy node). Giving up there costs the supervisor's 250 ms
            // restart pause; so did a cap of 20 tries 5 ms apart, whenever
            // the lease took over 100 ms. A lease still unconfirmed after
            // the patience, or a refusal as not leader, ends the task as
            // before.
            Err(ProposeError::LeaseLapsed)
                if refused_since.get_or_insert_with(std::time::Instant::now).elapsed() < EPOCH_REFUSED_PATIENCE =>
            {
                tracing::debug!(shard = ctx.shard, "leader epoch refused until a quorum confirms the lease; retrying");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(ProposeError::LeaseLapsed) => {
                tracing::info!(shard = ctx.shard, "leader epoch refused: no quorum confirmed the lease in time");
                return None;
            }
            Err(ProposeError::NotLeader { leader }) => {
                // The supervisor restarts the task (after its pause) if
                // openraft still calls this node leader.
                tracing::info!(shard = ctx.shard, ?leader, "leader epoch refused; not leading");
                return None;
            }
            // openraft keeps a leader cut off from its peers leading. Such a
            // leader fires nothing anyway; it waits here, logging once, until
            // a quorum answers or it is deposed (before, it logged each of 20
            // tries, gave up, and started over 250 ms later, for as long as
            // the partition lasted).
            Err(ProposeError::NoQuorum | ProposeError::QuorumLost) if still_leading(ctx) => {
                if !cut_off_logged {
                    cut_off_logged = true;
                    tracing::warn!(
                        shard = ctx.shard,
                        "this leader cannot reach a quorum; its leader epoch waits for one"
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(shard = ctx.shard, failures, error = %e, "proposing the leader epoch failed; retrying");
                if failures >= EPOCH_TRIES {
                    tracing::warn!(shard = ctx.shard, "gave up committing a leader epoch");
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Whether openraft's metrics say this node leads the shard under a
/// committed vote.
fn still_leading(ctx: &ShardCtx) -> bool {
    let metrics = ctx.raft.server_metrics();
    let m = metrics.borrow_watched();
    m.state == openraft::ServerState::Leader && m.current_leader == Some(ctx.node_id) && m.vote.is_committed()
}

/// What a proposed `Fire`'s result tells the fire loop. openraft refuses a
/// write from a leader whose lease has lapsed (a busy leader, or one briefly
/// cut off) and that still leads: the timer is re-read after the retry
/// delay, as for any unknown outcome, instead of the loop stopping as if
/// deposed and its timers waiting out the supervisor's restart pause. A
/// refusal as not leader (naming a leader or not) is a deposition.
fn fire_outcome(result: Result<(u64, CommandResult), ProposeError>) -> FireOutcome {
    match result {
        Ok((index, result)) => FireOutcome::applied(index, &result),
        Err(ProposeError::NotLeader { .. }) => FireOutcome::NotLeader,
        Err(_) => FireOutcome::Unknown,
    }
}

/// The error openraft's refusal of a leader whose lease lapsed maps to
/// (`ensure_writable_leader_handler`), for the fault point
/// `leader::fire_refused` and the tests.
fn lapsed_lease_refusal() -> ProposeError {
    use openraft::error::ClientWriteError;
    use openraft::error::ForwardReason;
    use openraft::error::ForwardToLeader;
    use openraft::error::RaftError;
    let refusal = ForwardToLeader::empty().with_reason(ForwardReason::LeaseExpired);
    crate::shard::proposer::to_propose_error(RaftError::APIError(ClientWriteError::ForwardToLeader(refusal)))
}

/// What the loop's I/O tasks report back.
enum Io {
    Page {
        page: DuePage,
        before_ms: u64,
    },
    Reread {
        applied_index: u64,
        dues: Vec<(TimerKey, Option<Due>)>,
    },
    Fired {
        outcomes: Vec<(TimerKey, u64, FireOutcome)>,
    },
    /// The store failed: the group is stopping.
    Failed(String),
}

struct FireLoop {
    core: FireCore,
    ctx: Arc<ShardCtx>,
    dispatcher: Arc<Dispatcher>,
    epoch: u64,
    io_tx: mpsc::UnboundedSender<Io>,
    batches_in_flight: usize,
    /// Re-reads asked for since the last flush: read together on the
    /// blocking pool.
    rereads: Vec<TimerKey>,
    first_fire_logged: bool,
    started_ms: u64,
    /// The version of the paused set the core has (`Paused::version`).
    paused_version: u64,
    /// Armed attempts applied ahead of their start, held until then.
    armed: Armed<TimerRecord>,
}

impl FireLoop {
    async fn run(&mut self, mut events: Events, mut io: mpsc::UnboundedReceiver<Io>) {
        let purge_every = Duration::from_millis(self.ctx.config.firing.purge_interval_ms);
        let mut next_purge = tokio::time::Instant::now() + purge_every;
        let mut next_rescan = tokio::time::Instant::now();
        let mut next_gauges = tokio::time::Instant::now();
        // One timer for the loop's whole life, moved rather than re-created:
        // the loop turns once per applied entry, and a fresh `Sleep` (and
        // gauge update) each turn was measurable CPU on a busy node.
        let wake = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(wake);
        loop {
            if tokio::time::Instant::now() >= next_rescan && self.ctx.events.take_overflow() {
                next_rescan = tokio::time::Instant::now() + RESCAN_EVERY;
                tracing::warn!(shard = self.ctx.shard, "wheel events were lost; reading the fire-time index again");
                self.core.on_overflow();
                // A lost change may have been a cancel of a held attempt: none
                // is sent unseen; each comes due again at its deadline.
                self.armed.clear();
            }
            while let Some(applied) = events.try_recv() {
                self.on_applied(applied);
            }
            while let Ok(done) = io.try_recv() {
                if !self.on_io(done) {
                    return;
                }
            }
            self.send_armed(&mut events);
            if !self.act() {
                return;
            }
            if tokio::time::Instant::now() >= next_purge {
                self.purge().await;
                next_purge = tokio::time::Instant::now() + purge_every;
            }
            if tokio::time::Instant::now() >= next_gauges {
                self.publish_gauges();
                next_gauges = tokio::time::Instant::now() + GAUGES_EVERY;
            }

            let (now, into_ms) = self.ctx.clock.now_ms_and_into();
            let now_instant = tokio::time::Instant::now();
            // With nothing due sooner, the next look is on the node's grid
            // (`crate::grid`), where every shard's loop looks together: one
            // wake-up of the runtime for all of them, and never later than
            // a TICK from now.
            let tick_at = crate::grid::next_line(TICK);
            let core_wake = self.core.next_wake_ms().filter(|_| self.batches_in_flight < MAX_FIRE_BATCHES_IN_FLIGHT);
            // A held attempt still here at its start waits for a cancel on its
            // way: its applied entry wakes the loop; look again a ms on anyway.
            let armed_wake = self.armed.next_ms().map(|at| at.max(now + 1));
            let wake_at = match [core_wake, armed_wake].into_iter().flatten().min() {
                Some(at) => {
                    // At the start of millisecond `at` on the node's clock, not
                    // up to one later (`Clock::now_ms_and_into`). A wake-up a
                    // hair early finds nothing due and sleeps again: the core
                    // never fires before its time, whenever it is asked.
                    let until = Duration::from_millis(at.saturating_sub(now)).saturating_sub(into_ms);
                    tick_at.min(now_instant + until)
                }
                _ => tick_at,
            };
            // Keep a pending wake-up that comes no later than needed (an early
            // turn is harmless); move one that has passed or comes too late.
            if wake.deadline() <= now_instant || wake.deadline() > wake_at {
                wake.as_mut().reset(wake_at);
            }
            tokio::select! {
                applied = events.recv() => match applied {
                    Some(applied) => self.on_applied(applied),
                    None => return,
                },
                done = io.recv() => match done {
                    Some(done) => if !self.on_io(done) { return },
                    None => return,
                },
                _ = &mut wake => {}
            }
        }
    }

    /// One applied entry: its index changes go to the core, its dispatches
    /// to delivery.
    fn on_applied(&mut self, applied: Applied) {
        // Entries up to this leader's epoch entry are reflected in every page
        // it reads (the first page is read after the epoch is applied).
        if applied.index <= self.epoch {
            return;
        }
        for change in applied.changes {
            self.armed.on_change(&change.key, applied.index);
            self.core.on_change(applied.index, change);
        }
        for d in applied.dispatches {
            // Only this leader's own fires (apply accepts a `Fire` only under the
            // shard's current epoch, so after this leader's epoch entry every one
            // is; the check keeps it so).
            if d.epoch != self.epoch {
                continue;
            }
            match d.record.fire.as_ref().map(|f| (f.phase, f.attempt_started_at_ms)) {
                // A push attempt: held until its start, and sent past the stamp
                // fence. That holds for one whose start has passed already: a
                // `Fire` that armed it may have been applied after its start (a
                // slow commit), while a cancel stamped before the start is still
                // on its way and will undo it.
                Some((tocsin_core::FirePhase::InFlight { .. }, start)) => {
                    self.armed.hold(d.key, applied.index, start, d.record);
                }
                _ => self.dispatcher.dispatch(&self.ctx, self.epoch, d.key, d.record),
            }
        }
    }

    /// Sends the held attempts whose start has come, once the proposer's
    /// stamps allow (no cancel or reschedule of the timer stamped before the
    /// start still on its way) and the applied log up to now has been read
    /// (a cancel that was on its way and is now applied drops the attempt).
    fn send_armed(&mut self, events: &mut Events) {
        let now = self.ctx.clock.now_ms();
        if self.armed.next_ms().is_none_or(|at| at > now) {
            return;
        }
        let ready: Vec<TimerKey> = self
            .armed
            .due(now)
            .into_iter()
            .filter(|(key, start)| self.ctx.proposer.may_send_armed(key, *start))
            .map(|(key, _)| key)
            .collect();
        while let Some(applied) = events.try_recv() {
            self.on_applied(applied);
        }
        // An entry whose event was dropped may have been the cancel that
        // undoes a held attempt, and the rescan that follows a loss comes at
        // most every RESCAN_EVERY: until it does, nothing held is sent (each
        // comes due again at its attempt's deadline). The flag is read after
        // the fence: an entry the fence waited for has been applied, and its
        // event queued or the flag set, before the fence let go of it.
        if self.ctx.events.overflowed() {
            self.armed.clear();
            return;
        }
        for key in ready {
            if let Some(record) = self.armed.take(&key) {
                self.dispatcher.dispatch(&self.ctx, self.epoch, key, record);
            }
        }
    }

    /// Feeds one I/O result to the core. Returns false if the loop must stop.
    fn on_io(&mut self, done: Io) -> bool {
        let now = self.ctx.clock.now_ms();
        match done {
            Io::Page { page, before_ms } => self.core.on_page(page.applied_index, page.entries, before_ms),
            Io::Reread { applied_index, dues } => {
                for (key, due) in dues {
                    self.core.on_reread(key, due, applied_index, now);
                }
            }
            Io::Fired { outcomes } => {
                self.batches_in_flight -= 1;
                for (key, due_ms, outcome) in outcomes {
                    // Which of the two depositions it was, for the log: a
                    // refusal from openraft, or a `Fire` applied under a newer
                    // epoch.
                    let refused = outcome == FireOutcome::NotLeader;
                    match self.core.on_fire_outcome(key, due_ms, outcome, now) {
                        Some(Action::Stop) if refused => {
                            tracing::info!(
                                shard = self.ctx.shard,
                                epoch = self.epoch,
                                "deposed: openraft refused a fire, this node no longer leads; stopping"
                            );
                            return false;
                        }
                        Some(Action::Stop) => {
                            tracing::info!(
                                shard = self.ctx.shard,
                                epoch = self.epoch,
                                "deposed by a newer epoch; stopping"
                            );
                            return false;
                        }
                        Some(Action::Reread(key)) => self.rereads.push(key),
                        Some(other) => unreachable!("a fire outcome asks only to stop or re-read, not {other:?}"),
                        None => {}
                    }
                }
            }
            Io::Failed(error) => {
                tracing::error!(shard = self.ctx.shard, error, "reading the fire-time index failed; stopping");
                return false;
            }
        }
        true
    }

    /// Asks the core what to do now and starts it. Returns false if the loop
    /// must stop.
    fn act(&mut self) -> bool {
        let paused = self.dispatcher.webhook.paused();
        let version = paused.version();
        if version != self.paused_version {
            self.paused_version = version;
            self.core.set_paused(paused.namespaces());
        }
        let now = self.ctx.clock.now_ms();
        let batch = self.ctx.config.firing.fire_batch;
        // A node whose clock is off loads but fires nothing.
        let budget = if self.ctx.clock.is_safe() {
            MAX_FIRE_BATCHES_IN_FLIGHT.saturating_sub(self.batches_in_flight) * batch
        } else {
            0
        };
        for action in self.core.poll(now, budget, batch) {
            match action {
                Action::Load { from, before_ms, limit } => self.load(from, before_ms, limit),
                Action::Fire(fires) => self.fire(fires, now),
                Action::Offer(offers) => self.offer(offers, now),
                Action::Reread(key) => self.rereads.push(key),
                Action::Stop => return false,
            }
        }
        self.flush_rereads();
        self.ctx.proposer.set_fire_behind(Duration::from_millis(self.core.behind_ms()));
        true
    }

    fn load(&self, from: LoadFrom, before_ms: u64, limit: usize) {
        let store = self.ctx.store.clone();
        let group = self.ctx.group;
        let tx = self.io_tx.clone();
        tokio::task::spawn_blocking(move || {
            let done = match store.due_page(group, &from, before_ms, limit) {
                Ok(page) => Io::Page { page, before_ms },
                Err(e) => Io::Failed(e.to_string()),
            };
            let _ = tx.send(done);
        });
    }

    fn flush_rereads(&mut self) {
        if self.rereads.is_empty() {
            return;
        }
        let keys = std::mem::take(&mut self.rereads);
        metrics::counter!("tocsin_fire_rereads_total").increment(keys.len() as u64);
        let store = self.ctx.store.clone();
        let group = self.ctx.group;
        let tx = self.io_tx.clone();
        tokio::task::spawn_blocking(move || {
            // One applied index for all: the lowest any read saw, so none of
            // them claims to be newer than it is.
            let mut applied_index = u64::MAX;
            let mut dues = Vec::with_capacity(keys.len());
            for key in keys {
                match store.read_due(group, &key) {
                    Ok((applied, due)) => {
                        applied_index = applied_index.min(applied);
                        dues.push((key, due));
                    }
                    Err(e) => {
                        let _ = tx.send(Io::Failed(e.to_string()));
                        return;
                    }
                }
            }
            let _ = tx.send(Io::Reread { applied_index, dues });
        });
    }

    /// What every batch the wheel hands over shares: the log line of the
    /// first one, and how late the wheel hands each timer over (before any
    /// Raft work).
    fn handing_over(&mut self, batch: &[(TimerKey, u64)], now: u64) {
        if !self.first_fire_logged {
            self.first_fire_logged = true;
            tracing::info!(
                shard = self.ctx.shard,
                epoch = self.epoch,
                ms_since_leading = now.saturating_sub(self.started_ms),
                "first fire batch"
            );
        }
        for (_, due) in batch {
            metrics::histogram!("tocsin_wheel_poll_lag_seconds").record(now.saturating_sub(*due) as f64 / 1000.0);
        }
        self.batches_in_flight += 1;
    }

    /// Proposes one batch of `Fire` commands; the outcomes come back as
    /// [`Io::Fired`]. What they start is dispatched from the applied log.
    fn fire(&mut self, fires: Vec<(TimerKey, u64)>, now: u64) {
        self.handing_over(&fires, now);
        let ctx = self.ctx.clone();
        let epoch = self.epoch;
        let tx = self.io_tx.clone();
        let timeout_ms = ctx.config.delivery.webhook_timeout_ms;
        tokio::spawn(async move {
            let commands: Vec<Command> = fires
                .iter()
                .map(|(key, due)| Command::Fire { key: key.clone(), due_ms: *due, epoch, timeout_ms })
                .collect();
            let mut results = if crate::fault::hit("leader::fire_refused").await.is_some() {
                // A test has openraft's lapsed-lease refusal answer this
                // batch (nothing is proposed), mapped as openraft's own is.
                commands.iter().map(|_| Err(lapsed_lease_refusal())).collect()
            } else {
                ctx.proposer.propose_all(commands).await
            };
            if crate::fault::hit("leader::fire_reply").await.is_some() {
                // A test loses this batch's outcomes (the entries apply anyway).
                results.iter_mut().for_each(|r| *r = Err(ProposeError::Timeout));
            }
            let refused = results.iter().filter(|r| matches!(r, Err(ProposeError::LeaseLapsed))).count();
            if refused > 0 {
                metrics::counter!("tocsin_fire_lease_refusals_total").increment(refused as u64);
            }
            let outcomes =
                fires.into_iter().zip(results).map(|((key, due), result)| (key, due, fire_outcome(result))).collect();
            let _ = tx.send(Io::Fired { outcomes });
        });
    }

    /// Offers one batch of scheduled pull timers whose time came to their
    /// topics' consumers, whose reservations fire them
    /// ([`PullHub::offer_due`](crate::shard::delivery::pull::PullHub::offer_due)).
    /// The topic is in the record, not the index, so the records are read
    /// first (one batched lookup, no Raft entry). A timer whose record is no
    /// longer scheduled at that time, or that could not be queued, is
    /// reported unknown and the core re-reads it. The outcomes come back as
    /// [`Io::Fired`].
    fn offer(&mut self, offers: Vec<(TimerKey, u64)>, now: u64) {
        self.handing_over(&offers, now);
        let ctx = self.ctx.clone();
        let hub = self.dispatcher.pull.clone();
        let tx = self.io_tx.clone();
        tokio::task::spawn_blocking(move || {
            let keys: Vec<TimerKey> = offers.iter().map(|(key, _)| key.clone()).collect();
            let records = match ctx.store.get_timers(ctx.group, &keys) {
                Ok(records) => records,
                Err(e) => {
                    let _ = tx.send(Io::Failed(e.to_string()));
                    return;
                }
            };
            let outcomes = offers
                .into_iter()
                .zip(records)
                .map(|((key, due_ms), record)| {
                    let due = Due { at_ms: due_ms, kind: DueKind::PullFire };
                    let offered = record.filter(|r| r.due() == Some(due)).is_some_and(|record| {
                        ctx.record_fire_lateness(&key.namespace, record.fire_at_ms);
                        hub.offer_due(&ctx, key.clone(), &record, due_ms)
                    });
                    (key, due_ms, if offered { FireOutcome::Offered } else { FireOutcome::Unknown })
                })
                .collect();
            let _ = tx.send(Io::Fired { outcomes });
        });
    }

    async fn purge(&mut self) {
        let store = self.ctx.store.clone();
        let group = self.ctx.group;
        let now = self.ctx.clock.now_ms();
        let expired = tokio::task::spawn_blocking(move || store.scan_expired(group, now, 1000)).await;
        if let Ok(Ok(keys)) = expired
            && !keys.is_empty()
        {
            let n = keys.len();
            let ctx = self.ctx.clone();
            // In its own task: a slow commit must not hold up firing.
            tokio::spawn(async move {
                if let Ok((_, CommandResult::Purged { count })) = ctx.proposer.propose(Command::Purge { keys }).await {
                    tracing::debug!(shard = ctx.shard, count, of = n, "purged finished timers past retention");
                }
            });
        }
    }

    fn publish_gauges(&self) {
        let shard = self.ctx.shard.to_string();
        metrics::gauge!("tocsin_wheel_entries", "shard" => shard.clone()).set(self.core.in_wheel() as f64);
        let lag_ms = (self.ctx.clock.now_ms() + self.ctx.config.firing.hot_window_ms)
            .saturating_sub(self.core.loaded_until_ms());
        metrics::gauge!("tocsin_loader_lag_seconds", "shard" => shard.clone()).set(lag_ms as f64 / 1000.0);
        metrics::gauge!("tocsin_fire_behind_seconds", "shard" => shard).set(self.core.behind_ms() as f64 / 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tocsin_core::command::SkipReason;
    use tocsin_store::NodeAddr;

    #[test]
    fn a_lapsed_lease_re_reads_and_a_refusal_as_not_leader_stops_the_loop() {
        // The lease lapsed on a node that still leads: look again later.
        assert_eq!(fire_outcome(Err(lapsed_lease_refusal())), FireOutcome::Unknown);
        // Not leading any more, whether or not the new leader is known: deposed.
        assert_eq!(fire_outcome(Err(ProposeError::NotLeader { leader: None })), FireOutcome::NotLeader);
        let named = Err(ProposeError::NotLeader { leader: Some((2, NodeAddr::default())) });
        assert_eq!(fire_outcome(named), FireOutcome::NotLeader);
        assert_eq!(fire_outcome(Err(ProposeError::NoQuorum)), FireOutcome::Unknown);
        assert_eq!(fire_outcome(Err(ProposeError::Timeout)), FireOutcome::Unknown);
        let stale = Ok((7, CommandResult::Skipped { reason: SkipReason::StaleEpoch }));
        assert_eq!(fire_outcome(stale), FireOutcome::Applied { index: 7, skipped: Some(SkipReason::StaleEpoch) });
    }
}
