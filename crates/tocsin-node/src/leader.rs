//! The shard leader's fire loop: only the leader of a shard runs one.
//!
//! On becoming leader (openraft's `on_leader_change`), the task:
//! 1. proposes a `LeaderEpoch` entry and waits until it is applied: its log
//!    index is the fencing epoch, and every cancel committed under earlier
//!    leaders is applied by then;
//! 2. rebuilds the wheel from the fire-time index: overdue timers first
//!    (including attempts an earlier leader left in flight, redelivered at
//!    once), then the hot window;
//! 3. loops: timers leaving the wheel are proposed as batched `Fire`
//!    commands; each applied `Dispatch` goes to delivery, which re-checks the
//!    lease before sending.
//!
//! **The hot window.** Only timers due before `cursor` (about now + 60 s)
//! are in the wheel. The loader pages the index forward in bounded pages;
//! applied changes arrive as [`WheelEvent`]s and are taken only if they fall
//! before the cursor. Events and pages are handled by this one task in
//! order, and an event is produced only after its entry is durably applied,
//! so every timer is either found by a later page or announced by an event:
//! none falls between the two.
//!
//! On step-down the task is aborted at once; deliveries in flight notice
//! through [`ShardCtx::may_dispatch`].

use openraft::async_runtime::WatchReceiver as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::TimerKey;
use tocsin_core::command::SkipReason;
use tocsin_wheel::Handle;
use tocsin_wheel::Wheel;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::clock;
use crate::delivery::Dispatcher;
use crate::events::WheelEvent;
use crate::proposer::ProposeError;
use crate::shard::Leadership;
use crate::shard::ShardCtx;

/// Fire batches proposed and not yet applied, per shard.
const MAX_FIRE_BATCHES_IN_FLIGHT: usize = 4;
/// How often the loader extends the window when nothing else wakes the task.
const LOADER_TICK: Duration = Duration::from_millis(500);

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
    let mut metrics = ctx.raft.metrics();
    let mut task: Option<(LeaderTask, u64)> = None;
    loop {
        let (leading, term) = {
            let m = metrics.borrow_and_update();
            (m.state == openraft::ServerState::Leader && m.current_leader == Some(ctx.node_id), m.current_term)
        };
        task = match (leading, task.take()) {
            (false, Some((t, _))) => {
                t.stop();
                ctx.set_leadership(Leadership::Follower);
                tracing::info!(shard = ctx.shard, "stopped leading shard");
                None
            }
            (true, Some((t, t_term))) if t_term != term || t.is_finished() => {
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
            // A finished task is noticed within this period.
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// Where the loader stands in the fire-time index.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cursor {
    /// Every entry due before this time has been loaded.
    Before(u64),
    /// Every entry up to and including `(due, key)` has been loaded.
    After(u64, TimerKey),
}

impl Cursor {
    fn covers(&self, due_ms: u64, key: &TimerKey) -> bool {
        match self {
            Cursor::Before(t) => due_ms < *t,
            Cursor::After(t, k) => (due_ms, key) <= (*t, k),
        }
    }
}

/// Keys re-entering the wheel after a fire batch (not due yet, or outcome
/// unknown).
struct BatchDone {
    reinsert: Vec<(TimerKey, u64)>,
    deposed: bool,
}

async fn run(ctx: Arc<ShardCtx>, dispatcher: Arc<Dispatcher>) {
    let events = ctx.events.attach();
    let Some(epoch) = establish(&ctx).await else {
        ctx.events.detach();
        return;
    };
    tracing::info!(shard = ctx.shard, epoch, "leading shard");
    metrics::counter!("tocsin_leader_changes_total", "shard" => ctx.shard.to_string()).increment(1);
    ctx.set_leadership(Leadership::Leading { epoch });
    let guard = Guard { ctx: ctx.clone() };
    tokio::spawn(refresh_own_address(ctx.clone()));
    let mut lp = FireLoop {
        ctx: ctx.clone(),
        dispatcher,
        epoch,
        wheel: Wheel::new(clock::now_ms()),
        handles: HashMap::new(),
        cursor: Cursor::Before(0),
        in_flight: 0,
        first_fire_logged: false,
        started_ms: clock::now_ms(),
    };
    lp.run(events).await;
    drop(guard);
}

/// Resets leadership when the task ends or is aborted.
struct Guard {
    ctx: Arc<ShardCtx>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.ctx.set_leadership(Leadership::Follower);
        self.ctx.events.detach();
        metrics::gauge!("tocsin_wheel_entries", "shard" => self.ctx.shard.to_string()).set(0.0);
    }
}

/// If this node's address in the group's membership is not the one it now
/// advertises (it was restarted on another port, say), records the new one,
/// so peers and clients find it.
async fn refresh_own_address(ctx: Arc<ShardCtx>) {
    use openraft::async_runtime::WatchReceiver as _;
    let want =
        tocsin_store::NodeAddr { grpc_addr: ctx.config.grpc_advertise(), http_addr: ctx.config.http_advertise() };
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
async fn establish(ctx: &ShardCtx) -> Option<u64> {
    for attempt in 0..20 {
        match ctx.proposer.propose(Command::LeaderEpoch { leader: ctx.node_id }).await {
            Ok((_, CommandResult::Epoch { epoch, leader })) if leader == ctx.node_id => return Some(epoch),
            Ok((_, other)) => {
                tracing::warn!(shard = ctx.shard, ?other, "unexpected epoch result");
                return None;
            }
            Err(ProposeError::NotLeader { .. }) => return None,
            Err(e) => {
                tracing::warn!(shard = ctx.shard, attempt, error = %e, "proposing the leader epoch failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    None
}

struct FireLoop {
    ctx: Arc<ShardCtx>,
    dispatcher: Arc<Dispatcher>,
    epoch: u64,
    wheel: Wheel<TimerKey>,
    /// Wheel handle and due time of every key in the wheel.
    handles: HashMap<TimerKey, (Handle, u64)>,
    cursor: Cursor,
    in_flight: usize,
    first_fire_logged: bool,
    started_ms: u64,
}

impl FireLoop {
    async fn run(&mut self, mut events: mpsc::Receiver<WheelEvent>) {
        let (done_tx, mut done_rx) = mpsc::channel::<BatchDone>(MAX_FIRE_BATCHES_IN_FLIGHT * 2);
        let purge_every = Duration::from_millis(self.ctx.config.firing.purge_interval_ms);
        let mut next_purge = tokio::time::Instant::now() + purge_every;
        let mut next_rescan = tokio::time::Instant::now();
        loop {
            // Rescans are throttled: a persistently full pull queue must not turn
            // into a loop of full index scans.
            if tokio::time::Instant::now() >= next_rescan && self.ctx.events.take_overflow() {
                next_rescan = tokio::time::Instant::now() + Duration::from_secs(5);
                tracing::warn!(shard = self.ctx.shard, "wheel events overflowed; rescanning the fire-time index");
                self.cursor = Cursor::Before(0);
            }
            while let Ok(event) = events.try_recv() {
                self.on_event(event);
            }
            if !self.load().await {
                return;
            }
            self.fire(&done_tx);
            if tokio::time::Instant::now() >= next_purge {
                self.purge().await;
                next_purge = tokio::time::Instant::now() + purge_every;
            }
            self.publish_gauges();

            let now = clock::now_ms();
            let wake_ms = match self.wheel.next_poll_ms() {
                Some(at) if self.in_flight < MAX_FIRE_BATCHES_IN_FLIGHT => {
                    at.saturating_sub(now).min(LOADER_TICK.as_millis() as u64)
                }
                _ => LOADER_TICK.as_millis() as u64,
            };
            let sleep = tokio::time::sleep(Duration::from_millis(wake_ms));
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => self.on_event(event),
                    None => return,
                },
                done = done_rx.recv() => {
                    if let Some(done) = done {
                        self.in_flight -= 1;
                        if done.deposed {
                            tracing::info!(shard = self.ctx.shard, epoch = self.epoch, "fenced by a newer epoch; stopping");
                            return;
                        }
                        for (key, due) in done.reinsert {
                            self.insert(key, due);
                        }
                    }
                }
                _ = sleep => {}
            }
        }
    }

    fn insert(&mut self, key: TimerKey, due_ms: u64) {
        if let Some((handle, due)) = self.handles.get(&key) {
            if *due == due_ms {
                return;
            }
            self.wheel.cancel(*handle);
        }
        match self.wheel.insert(due_ms, key.clone()) {
            Ok(handle) => {
                self.handles.insert(key, (handle, due_ms));
            }
            Err(e) => tracing::error!(shard = self.ctx.shard, %key, due_ms, error = %e, "timer does not fit the wheel"),
        }
    }

    fn remove(&mut self, key: &TimerKey) {
        if let Some((handle, _)) = self.handles.remove(key) {
            self.wheel.cancel(handle);
        }
    }

    fn on_event(&mut self, event: WheelEvent) {
        match event {
            WheelEvent::Due { key, due_ms } => {
                if self.cursor.covers(due_ms, &key) {
                    self.insert(key, due_ms);
                } else {
                    // The loader will find it; a stale nearer entry must go.
                    self.remove(&key);
                }
            }
            WheelEvent::Gone { key } => self.remove(&key),
        }
    }

    /// Pages the fire-time index into the wheel up to now + the hot window.
    /// Returns false if the store failed (the group is then stopping).
    async fn load(&mut self) -> bool {
        let ctx = self.ctx.clone();
        let firing = &ctx.config.firing;
        loop {
            let bound = clock::now_ms() + firing.hot_window_ms;
            let done = match &self.cursor {
                Cursor::Before(t) => *t >= bound,
                Cursor::After(..) => false,
            };
            if done || self.wheel.len() >= firing.max_wheel_entries {
                return true;
            }
            let store = self.ctx.store.clone();
            let group = self.ctx.group;
            let cursor = self.cursor.clone();
            let limit = firing.load_page;
            let page = tokio::task::spawn_blocking(move || match cursor {
                Cursor::Before(t) => store.scan_due(group, t, bound, limit),
                Cursor::After(t, key) => store.scan_due_after(group, t, &key, bound, limit),
            })
            .await;
            let page = match page {
                Ok(Ok(page)) => page,
                Ok(Err(e)) => {
                    tracing::error!(shard = self.ctx.shard, error = %e, "scanning the fire-time index failed");
                    return false;
                }
                Err(e) => {
                    tracing::error!(shard = self.ctx.shard, error = %e, "loader task failed");
                    return false;
                }
            };
            let full = page.len() >= limit;
            let last = page.last().cloned();
            for (due, key) in page {
                self.insert(key, due);
            }
            self.cursor = match (full, last) {
                (true, Some((due, key))) => Cursor::After(due, key),
                _ => Cursor::Before(bound),
            };
            if !full {
                return true;
            }
        }
    }

    /// Proposes a batch of `Fire`s for the timers now due.
    fn fire(&mut self, done_tx: &mpsc::Sender<BatchDone>) {
        while self.in_flight < MAX_FIRE_BATCHES_IN_FLIGHT {
            let now = clock::now_ms();
            let mut batch = Vec::new();
            while batch.len() < self.ctx.config.firing.fire_batch {
                let Some((due, key)) = self.wheel.poll(now) else { break };
                self.handles.remove(&key);
                // How late the wheel hands a timer over (before any Raft work).
                metrics::histogram!("tocsin_wheel_poll_lag_seconds").record(now.saturating_sub(due) as f64 / 1000.0);
                batch.push((key, due));
            }
            if batch.is_empty() {
                return;
            }
            if !self.first_fire_logged {
                self.first_fire_logged = true;
                tracing::info!(
                    shard = self.ctx.shard,
                    epoch = self.epoch,
                    ms_since_leading = now.saturating_sub(self.started_ms),
                    "first fire batch"
                );
            }
            self.in_flight += 1;
            let ctx = self.ctx.clone();
            let dispatcher = self.dispatcher.clone();
            let epoch = self.epoch;
            let done_tx = done_tx.clone();
            tokio::spawn(async move {
                let done = fire_batch(&ctx, &dispatcher, epoch, batch).await;
                let _ = done_tx.send(done).await;
            });
        }
    }

    async fn purge(&mut self) {
        let store = self.ctx.store.clone();
        let group = self.ctx.group;
        let now = clock::now_ms();
        let expired = tokio::task::spawn_blocking(move || store.scan_expired(group, now, 1000)).await;
        if let Ok(Ok(keys)) = expired
            && !keys.is_empty()
        {
            let n = keys.len();
            if let Ok((_, CommandResult::Purged { count })) = self.ctx.proposer.propose(Command::Purge { keys }).await {
                tracing::debug!(shard = self.ctx.shard, count, of = n, "purged finished timers past retention");
            }
        }
    }

    fn publish_gauges(&self) {
        let shard = self.ctx.shard.to_string();
        metrics::gauge!("tocsin_wheel_entries", "shard" => shard.clone()).set(self.wheel.len() as f64);
        let lag_ms = match &self.cursor {
            Cursor::Before(t) => (clock::now_ms() + self.ctx.config.firing.hot_window_ms).saturating_sub(*t),
            Cursor::After(t, _) => (clock::now_ms() + self.ctx.config.firing.hot_window_ms).saturating_sub(*t),
        };
        metrics::gauge!("tocsin_loader_lag_seconds", "shard" => shard).set(lag_ms as f64 / 1000.0);
    }
}

/// Proposes one batch of `Fire` commands and dispatches what they start.
async fn fire_batch(
    ctx: &Arc<ShardCtx>,
    dispatcher: &Dispatcher,
    epoch: u64,
    batch: Vec<(TimerKey, u64)>,
) -> BatchDone {
    let timeout_ms = ctx.config.delivery.webhook_timeout_ms;
    let commands: Vec<Command> =
        batch.iter().map(|(key, due)| Command::Fire { key: key.clone(), due_ms: *due, epoch, timeout_ms }).collect();
    let results = ctx.proposer.propose_all(commands).await;
    let mut done = BatchDone { reinsert: Vec::new(), deposed: false };
    for ((key, due), result) in batch.into_iter().zip(results) {
        match result {
            Ok((_, CommandResult::Dispatch { record })) => dispatcher.dispatch(ctx, epoch, key, record),
            Ok((_, CommandResult::Skipped { reason: SkipReason::NotDue })) => done.reinsert.push((key, due)),
            Ok((_, CommandResult::Skipped { reason: SkipReason::StaleEpoch })) => done.deposed = true,
            Ok((_, CommandResult::Dead { .. } | CommandResult::Skipped { .. })) => {}
            Ok((_, other)) => tracing::error!(shard = ctx.shard, %key, ?other, "unexpected fire result"),
            Err(ProposeError::NotLeader { .. }) => done.deposed = true,
            // Unknown outcome: look again; apply skips a fire that already happened.
            Err(_) => done.reinsert.push((key, due)),
        }
    }
    if !done.reinsert.is_empty() {
        // Back off before the same timers are proposed again.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done
}
