//! One simulated node: openraft over the simulated wire, the client API,
//! and a compact equivalent of `tocsin-node`'s shard leader shell: the
//! epoch entry, [`FireCore`] driven by pages of the due index and the
//! applied log, `Fire` proposals, webhook dispatch behind a lease gate,
//! and a pull queue whose reservations are recorded through Raft.
//!
//! What it leaves out of the real node: the clock guard (`clock.rs`, which
//! stops a node whose clock is far off its peers' from firing), batching of
//! many callers' commands into one entry, retry budgets, purging. Large
//! clock offsets are therefore only ever negative in the fault plan (see
//! `plan.rs`).

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use openraft::Instant as _;
use openraft::async_runtime::WatchReceiver as _;
use openraft::error::ClientWriteError;
use openraft::error::RaftError;
use tocsin_core::Callback;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::DueKind;
use tocsin_core::DuePos;
use tocsin_core::FirePhase;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::arm::Armed;
use tocsin_core::arm::StampFence;
use tocsin_core::command::AttemptOutcome;
use tocsin_core::command::SkipReason;
use tocsin_core::fire::Action;
use tocsin_core::fire::FireConfig;
use tocsin_core::fire::FireCore;
use tocsin_core::fire::FireOutcome;
use tocsin_core::fire::LoadFrom;

use crate::net;
use crate::net::ClientReply;
use crate::net::Delivery;
use crate::net::Request;
use crate::net::Response;
use crate::store::Applied;
use crate::store::Durable;
use crate::store::EventSink;
use crate::store::LogStore;
use crate::store::StateMachine;
use crate::types::Raft;
use crate::world::Shared;

/// A webhook attempt's time, stamped into each `Fire`.
pub const WEBHOOK_TIMEOUT_MS: u64 = 2_000;
const HEARTBEAT_MS: u64 = 50;
const ELECTION_MIN_MS: u64 = 150;
const ELECTION_MAX_MS: u64 = 300;
/// openraft's leader lease, as the node's (`ShardCtx::lease_valid`): the
/// maximum election timeout from an acknowledged heartbeat's send.
pub const LEASE_MS: u64 = ELECTION_MAX_MS;
/// As `proposer.rs`: a leader without a quorum for this long refuses work.
const QUORUM_LOST_MS: u64 = 1_000;
/// As `webhook.rs`.
const RECORD_MARGIN_MS: u64 = 200;
const MIN_REQUEST_MS: u64 = 50;
const FIRE_BATCH: usize = 64;
/// Push timers' first fires are armed this far ahead, in steps of
/// `ARM_STEP_MS` (the node's defaults).
const ARM_AHEAD_MS: u64 = 300;
const ARM_STEP_MS: u64 = 50;
const MAX_FIRE_BATCHES_IN_FLIGHT: usize = 4;
/// How long a proposal may take before its outcome counts as unknown.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a proposal did not give a result.
#[derive(Debug)]
enum ProposeError {
    /// Refused before it entered the log.
    NotLeader(Option<u64>),
    /// Refused before it entered the log by a node that still leads, until
    /// a quorum confirms its lease (`ForwardReason::LeaseExpired`), as the
    /// node's proposer tells it apart (`ProposeError::LeaseLapsed`).
    LeaseLapsed,
    /// It may or may not apply.
    Unknown,
}

/// One incarnation of a node (a restart builds a new one over the same
/// [`Durable`]).
pub struct Node {
    pub id: u64,
    shared: Arc<Shared>,
    raft: Raft,
    durable: Arc<Mutex<Durable>>,
    events: EventSink,
    /// The epoch this node fires under, while its leader loop runs.
    leading: Mutex<Option<u64>>,
    /// The stamps, as `proposer.rs` hands them out: never backwards, and
    /// fenced for armed attempts (`tocsin_core::arm`).
    fence: Arc<Mutex<StampFence>>,
    pull: Mutex<PullQueue>,
    /// splitmix64 state for backoff jitter.
    rng: Mutex<u64>,
    /// Counts leader loops: a loop's guard undoes only its own attachment.
    generation: Mutex<u64>,
}

#[derive(Default)]
struct PullQueue {
    /// `(key, fire_index, attempt, due_ms)`: a ready timer's firing and
    /// attempt (due 0), or a scheduled one's due time (firing and attempt 0),
    /// as in `pull.rs`.
    ready: VecDeque<(TimerKey, u64, u32, u64)>,
    queued: BTreeSet<TimerKey>,
}

pub fn raft_config() -> Arc<openraft::Config> {
    let config = openraft::Config {
        cluster_name: "tocsin-sim".into(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_MIN_MS,
        election_timeout_max: ELECTION_MAX_MS,
        install_snapshot_timeout: 5_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(300),
        max_in_snapshot_log_to_keep: 50,
        enable_pre_vote: Some(true),
        ..Default::default()
    };
    Arc::new(config.validate().expect("valid raft config"))
}

/// The node host's software: opens the durable state, starts Raft, serves
/// the wire and supervises the leader loop. `incarnation` counts restarts.
pub async fn run(shared: Arc<Shared>, id: u64, incarnation: u64) -> turmoil::Result {
    let durable = shared.durable[(id - 1) as usize].clone();
    let events: EventSink = Arc::default();
    let fresh = {
        let d = durable.lock().unwrap();
        d.vote.is_none() && d.log.is_empty() && d.snapshot.is_none()
    };
    let raft = Raft::new(
        id,
        raft_config(),
        net::Network,
        LogStore { durable: durable.clone() },
        StateMachine { durable: durable.clone(), events: events.clone() },
    )
    .await
    .map_err(|e| e.to_string())?;
    if fresh && id == 1 {
        let members: BTreeMap<u64, openraft::BasicNode> =
            (1..=3).map(|n| (n, openraft::BasicNode::new(net::node_host(n)))).collect();
        raft.initialize(members).await.map_err(|e| e.to_string())?;
    }
    let node = Arc::new(Node {
        id,
        shared: shared.clone(),
        raft,
        durable,
        events,
        leading: Mutex::new(None),
        fence: Arc::default(),
        pull: Mutex::default(),
        rng: Mutex::new(shared.seed ^ (id << 32) ^ incarnation.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        generation: Mutex::new(0),
    });
    crate::types::spawn(supervise(node.clone()));
    let handler = {
        let node = node.clone();
        move |request: Request| {
            let node = node.clone();
            async move { node.handle(request).await }
        }
    };
    net::serve(net::NODE_PORT, handler).await?;
    Ok(())
}

impl Node {
    /// This node's wall clock: true time plus its offset (a fault).
    pub fn now_ms(&self) -> u64 {
        let offset = self.shared.clock_offset_ms(self.id);
        crate::world::true_now_ms().saturating_add_signed(offset)
    }

    /// The clock the fire loop and the stamps use (the `early_ms` mutation
    /// moves it forward, as a broken clock guard would let a fast clock).
    fn fire_clock_ms(&self) -> u64 {
        // Clock faults step this both ways; `FireCore` keeps to the largest
        // time it was polled with (the simulation found it asserting on a
        // backward step before it did).
        self.now_ms() + self.shared.knobs.early_ms
    }

    fn jitter(&self) -> f64 {
        let mut s = self.rng.lock().unwrap();
        *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn leader_now(&self) -> (bool, Option<u64>, u64) {
        let m = self.raft.metrics().borrow_watched().clone();
        (
            m.state == openraft::ServerState::Leader && m.current_leader == Some(self.id),
            m.current_leader,
            m.current_term,
        )
    }

    fn quorum_acked_within(&self, ms: u64) -> bool {
        let m = self.raft.metrics().borrow_watched().clone();
        m.last_quorum_acked.as_ref().is_some_and(|t| t.elapsed() < Duration::from_millis(ms))
    }

    /// As `ShardCtx::may_dispatch`: leading under `epoch` with a live lease.
    fn may_dispatch(&self, epoch: u64) -> bool {
        *self.leading.lock().unwrap() == Some(epoch) && self.leader_now().0 && self.quorum_acked_within(LEASE_MS)
    }

    fn epoch(&self) -> Option<u64> {
        *self.leading.lock().unwrap()
    }

    async fn propose(&self, commands: Vec<Command>) -> Result<(u64, Vec<CommandResult>), ProposeError> {
        // Stamped never behind the last entry nor the fence's floor; the
        // entry's cancels stay fenced until openraft answers, past the
        // caller's timeout if need be (as `proposer.rs`).
        let stamped = self.fence.lock().unwrap().stamp(self.fire_clock_ms(), commands.iter());
        let proposal = tocsin_core::Proposal { now_ms: stamped.stamp_ms, commands: commands.into() };
        let raft = self.raft.clone();
        let mut write = Box::pin(async move { raft.client_write(proposal).await });
        let result = tokio::time::timeout(PROPOSE_TIMEOUT, &mut write).await;
        // An error from openraft leaves the entry's fate unknown (the next
        // leader may commit it): `StampFence::lost`, as `proposer.rs`.
        match &result {
            Ok(Ok(_)) => self.fence.lock().unwrap().done(stamped),
            Ok(Err(_)) => self.fence.lock().unwrap().lost(stamped),
            Err(_) => {
                let fence = self.fence.clone();
                crate::types::spawn(async move {
                    let applied = write.await.is_ok();
                    let mut fence = fence.lock().unwrap();
                    if applied { fence.done(stamped) } else { fence.lost(stamped) }
                });
            }
        }
        match result {
            Ok(Ok(resp)) => Ok((resp.log_id.index(), resp.data.results)),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))))
                if f.reason == openraft::error::ForwardReason::LeaseExpired =>
            {
                Err(ProposeError::LeaseLapsed)
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader(f.leader_id))
            }
            Ok(Err(_)) | Err(_) => Err(ProposeError::Unknown),
        }
    }

    async fn handle(self: &Arc<Self>, request: Request) -> Option<Response> {
        Some(match request {
            Request::Append(r) => Response::Append(self.raft.append_entries(r).await.map_err(|e| e.to_string())),
            Request::Vote(r) => Response::Vote(self.raft.vote(r).await.map_err(|e| e.to_string())),
            Request::PreVote(r) => Response::Vote(self.raft.pre_vote(r).await.map_err(|e| e.to_string())),
            Request::Snapshot { vote, meta, data } => {
                let snapshot =
                    openraft::alias::SnapshotOf::<crate::types::TypeConfig, Vec<u8>> { meta, snapshot: data };
                Response::Snapshot(self.raft.install_full_snapshot(vote, snapshot).await.map_err(|e| e.to_string()))
            }
            Request::Client { command, drop_reply } => {
                let reply = self.client(command).await;
                if drop_reply {
                    return None;
                }
                Response::Client(reply)
            }
            Request::Reserve { max, ttr_ms } => Response::Reserved(self.reserve(max, ttr_ms).await),
            Request::Ack { key, fire_index, attempt } => {
                let command = Command::AttemptResult {
                    key,
                    fire_index,
                    attempt,
                    outcome: AttemptOutcome::Delivered,
                    report: tocsin_core::command::AttemptReport::new(0, "ack", 0),
                };
                Response::Acked(matches!(
                    self.propose(vec![command]).await,
                    Ok((_, r)) if matches!(r.first(), Some(CommandResult::Recorded { .. }))
                ))
            }
            Request::Deliver(_) => return None,
        })
    }

    async fn client(&self, command: Command) -> ClientReply {
        let (leading, leader, _) = self.leader_now();
        if !leading {
            return ClientReply::NotLeader { leader };
        }
        if !self.quorum_acked_within(QUORUM_LOST_MS) {
            return ClientReply::NoQuorum;
        }
        match self.propose(vec![command]).await {
            Ok((index, mut results)) => ClientReply::Applied { index, result: Box::new(results.remove(0)) },
            Err(ProposeError::NotLeader(leader)) => ClientReply::NotLeader { leader },
            // Nothing was written; the node names no other leader.
            Err(ProposeError::LeaseLapsed) => ClientReply::NotLeader { leader: None },
            Err(ProposeError::Unknown) => ClientReply::Unknown,
        }
    }

    /// A pull consumer's reservation: ready timers are recorded as reserved
    /// through Raft before they are handed out (`pull.rs`).
    async fn reserve(&self, max: usize, ttr_ms: u64) -> Vec<Delivery> {
        let Some(epoch) = self.epoch() else { return Vec::new() };
        let items: Vec<(TimerKey, u64, u32, u64)> = {
            let mut q = self.pull.lock().unwrap();
            let n = q.ready.len().min(max);
            let items: Vec<_> = q.ready.drain(..n).collect();
            for (key, _, _, _) in &items {
                q.queued.remove(key);
            }
            items
        };
        if items.is_empty() {
            return Vec::new();
        }
        let until_ms = self.now_ms().saturating_add(ttr_ms);
        let commands = items
            .iter()
            .map(|(key, fire_index, attempt, due_ms)| match fire_index {
                0 => Command::FireReserve { key: key.clone(), due_ms: *due_ms, epoch, until_ms },
                _ => Command::Reserve {
                    key: key.clone(),
                    fire_index: *fire_index,
                    expected_attempt: *attempt,
                    epoch,
                    until_ms,
                },
            })
            .collect();
        let results = match self.propose(commands).await {
            Ok((_, results)) => results,
            Err(_) => {
                // Not recorded (or unknown): back to the front of the queue; a
                // reservation that did apply makes the next one skip as stale.
                let mut q = self.pull.lock().unwrap();
                for item in items.into_iter().rev() {
                    if q.queued.insert(item.0.clone()) {
                        q.ready.push_front(item);
                    }
                }
                return Vec::new();
            }
        };
        if !self.may_dispatch(epoch) {
            // Deposed or lease lost meanwhile: what was reserved comes due again
            // when its reservation runs out.
            return Vec::new();
        }
        let mut out = Vec::new();
        for (item, result) in items.into_iter().zip(results) {
            trace(&item.0, || format!("n{} reserve: {result:?}", self.id));
            match result {
                CommandResult::Dispatch { record } => out.extend(delivery(self.id, &item.0, &record)),
                // A scheduled timer's reservation stamped before its time (a
                // clock that stepped back): back to the queue, as `pull.rs` does.
                CommandResult::Skipped { reason: SkipReason::NotDue } if item.1 == 0 => {
                    let mut q = self.pull.lock().unwrap();
                    if q.queued.insert(item.0.clone()) {
                        q.ready.push_back(item);
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// A ready pull timer from this node's own `Fire`.
    fn offer(&self, key: TimerKey, record: &TimerRecord) {
        let Some(fire) = &record.fire else { return };
        trace(&key, || format!("n{} offers attempt {}", self.id, fire.attempt));
        let mut q = self.pull.lock().unwrap();
        if q.queued.insert(key.clone()) {
            q.ready.push_back((key, fire.fire_index, fire.attempt, 0));
        } else if let Some(item) = q.ready.iter_mut().find(|(k, _, _, _)| *k == key) {
            // Already queued, perhaps for an older attempt (a reservation whose
            // outcome was unknown went back to the queue, then applied and ran
            // out): the newer attempt replaces it. `tocsin-node`'s `PullHub::offer`
            // ignores the offer instead; the simulation found that this strands
            // the timer (the stale item's reservation is skipped as stale, and a
            // ready timer is tracked by nobody else).
            // A firing is newer than the scheduled offer it came from.
            item.2 = if item.1 == 0 { fire.attempt } else { item.2.max(fire.attempt) };
            item.1 = fire.fire_index;
            item.3 = 0;
        }
    }

    /// A scheduled pull timer whose time came (`FireCore`'s `Offer`): the
    /// reservation fires it. False if a firing of it is queued already (a
    /// scheduled offer never replaces one).
    fn offer_due(&self, key: TimerKey, due_ms: u64) -> bool {
        trace(&key, || format!("n{} offers it scheduled at {due_ms}", self.id));
        let mut q = self.pull.lock().unwrap();
        if q.queued.insert(key.clone()) {
            q.ready.push_back((key, 0, 0, due_ms));
            return true;
        }
        match q.ready.iter_mut().find(|(k, _, _, _)| *k == key) {
            Some(item) if item.1 == 0 => {
                item.3 = due_ms;
                true
            }
            _ => false,
        }
    }

    /// Sends one webhook attempt and records its outcome (`webhook.rs`).
    async fn deliver_webhook(self: Arc<Self>, epoch: u64, key: TimerKey, record: TimerRecord) {
        let Some(fire) = record.fire.clone() else { return };
        let FirePhase::InFlight { until_ms, .. } = fire.phase else { return };
        // As `attempt::gate`: hold back while the lease is out, as long as
        // the attempt has time left to send and record.
        while !self.may_dispatch(epoch) {
            if self.epoch() != Some(epoch) || self.now_ms() + RECORD_MARGIN_MS + MIN_REQUEST_MS > until_ms {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left_ms = until_ms.saturating_sub(self.now_ms()).saturating_sub(RECORD_MARGIN_MS);
        if left_ms < MIN_REQUEST_MS {
            return;
        }
        let Some(d) = delivery(self.id, &key, &record) else { return };
        let status =
            match net::call("recv", net::RECEIVER_PORT, &Request::Deliver(d), Duration::from_millis(left_ms)).await {
                Ok(Response::Delivered(s)) => Some(s),
                _ => None,
            };
        let now = self.now_ms();
        let outcome = match status {
            Some(200..=299) => AttemptOutcome::Delivered,
            Some(409) if !self.may_dispatch(epoch) => return,
            other => {
                let backoff = tocsin_core::backoff::backoff_ms(&record.retry, fire.attempt, self.jitter());
                AttemptOutcome::Failed { error: format!("status {other:?}"), retry_at_ms: now.saturating_add(backoff) }
            }
        };
        let report = tocsin_core::command::AttemptReport::new(status.unwrap_or(0), "sim", 0);
        let command =
            Command::AttemptResult { key, fire_index: fire.fire_index, attempt: fire.attempt, outcome, report };
        for _ in 0..5 {
            if self.epoch() != Some(epoch) {
                return;
            }
            match self.propose(vec![command.clone()]).await {
                Ok(_) | Err(ProposeError::NotLeader(_)) => return,
                Err(ProposeError::LeaseLapsed | ProposeError::Unknown) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
            }
        }
    }

    /// The fire-time index page `from`..`before_ms`, at the applied index.
    fn page(&self, from: &LoadFrom, before_ms: u64, limit: usize) -> (u64, Vec<(DuePos, DueKind)>) {
        let d = self.durable.lock().unwrap();
        let start = match from {
            LoadFrom::Time(t) => Bound::Included((*t, TimerKey::new("", ""))),
            LoadFrom::After(p) => Bound::Excluded((p.due_ms, p.key.clone())),
        };
        let entries =
            d.sm.table
                .due
                .range((start, Bound::Unbounded))
                .take_while(|(due_ms, _)| *due_ms < before_ms)
                .take(limit)
                .map(|(due_ms, key)| {
                    let kind = d.sm.table.timers[key].due().expect("indexed timers have a due entry").kind;
                    (DuePos { due_ms: *due_ms, key: key.clone() }, kind)
                })
                .collect();
        (d.sm.applied_index(), entries)
    }

    fn read_due(&self, key: &TimerKey) -> (u64, Option<tocsin_core::Due>) {
        let d = self.durable.lock().unwrap();
        (d.sm.applied_index(), d.sm.table.timers.get(key).and_then(TimerRecord::due))
    }

    fn due_kind(&self, key: &TimerKey) -> Option<DueKind> {
        self.read_due(key).1.map(|d| d.kind)
    }
}

/// Debugging aid: `TOCSIN_DST_TRACE=<id>` prints what the nodes do with
/// that timer.
fn trace(key: &TimerKey, what: impl FnOnce() -> String) {
    if std::env::var("TOCSIN_DST_TRACE").is_ok_and(|id| id == key.id) {
        eprintln!("[+{} ms] {key}: {}", crate::world::true_now_ms() - crate::world::BASE_MS, what());
    }
}

/// What a receiver is sent for a dispatched record.
fn delivery(from: u64, key: &TimerKey, record: &TimerRecord) -> Option<Delivery> {
    let fire = record.fire.as_ref()?;
    Some(Delivery {
        key: key.clone(),
        fire_index: fire.fire_index,
        attempt: fire.attempt,
        epoch: fire.epoch,
        attempt_index: fire.attempt_index,
        fire_at_ms: record.fire_at_ms,
        from,
    })
}

/// Keeps a leader loop running exactly while this node leads (`leader.rs`'s
/// `supervise`).
async fn supervise(node: Arc<Node>) {
    let mut task: Option<(tokio::task::JoinHandle<()>, u64)> = None;
    loop {
        let (leading, _, term) = node.leader_now();
        task = match (leading, task.take()) {
            (false, Some((t, _))) => {
                t.abort();
                None
            }
            (true, Some((t, t_term))) if t_term != term || t.is_finished() => {
                t.abort();
                Some((crate::types::spawn(lead(node.clone())), term))
            }
            (true, None) => Some((crate::types::spawn(lead(node.clone())), term)),
            (_, other) => other,
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Detaches the leader loop when it ends or is aborted. An abort takes
/// effect when the task is next polled, possibly after the next loop
/// attached: the guard then leaves that loop's attachment alone (the
/// simulation found this: a late guard cleared the new leader's pull queue
/// and event sink, and a ready pull timer was never offered again).
struct Guard(Arc<Node>, u64);

impl Drop for Guard {
    fn drop(&mut self) {
        if *self.0.generation.lock().unwrap() != self.1 {
            return;
        }
        *self.0.leading.lock().unwrap() = None;
        *self.0.events.lock().unwrap() = None;
        let mut q = self.0.pull.lock().unwrap();
        q.ready.clear();
        q.queued.clear();
    }
}

/// The leader loop: establish the epoch, then run [`FireCore`].
async fn lead(node: Arc<Node>) {
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<Applied>();
    let generation = {
        let mut g = node.generation.lock().unwrap();
        *g += 1;
        *g
    };
    *node.events.lock().unwrap() = Some(tx);
    *node.leading.lock().unwrap() = None;
    let _guard = Guard(node.clone(), generation);
    node.fence.lock().unwrap().new_leadership();
    let mut epoch = None;
    for _ in 0..20 {
        match node.propose(vec![Command::LeaderEpoch { leader: node.id }]).await {
            Ok((_, r)) => match r.first() {
                Some(CommandResult::Epoch { epoch: e, leader }) if *leader == node.id => {
                    epoch = Some(*e);
                    break;
                }
                _ => return,
            },
            Err(ProposeError::NotLeader(_)) => return,
            Err(ProposeError::LeaseLapsed | ProposeError::Unknown) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
        }
    }
    let Some(epoch) = epoch else { return };
    *node.leading.lock().unwrap() = Some(epoch);
    node.shared.note_epoch(node.id, epoch);
    let config = FireConfig {
        hot_window_ms: 60_000,
        load_page: 256,
        max_tracked: 100_000,
        retry_delay_ms: 50,
        retries_per_namespace_per_sec: 0,
        catch_up_after_ms: 0,
        catch_up_per_namespace_per_sec: 0,
        arm_ahead_ms: ARM_AHEAD_MS,
        arm_step_ms: ARM_STEP_MS,
    };
    let mut core = FireCore::new(config, epoch, node.fire_clock_ms());
    let mut armed: Armed<TimerRecord> = Armed::default();
    let (io_tx, mut io_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<(TimerKey, u64, FireOutcome)>>();
    let mut in_flight = 0usize;
    loop {
        while let Ok(applied) = events.try_recv() {
            on_applied(&node, &mut core, &mut armed, epoch, applied);
        }
        while let Ok(outcomes) = io_rx.try_recv() {
            in_flight -= 1;
            if !on_outcomes(&node, &mut core, outcomes) {
                return;
            }
        }
        send_armed(&node, &mut core, &mut armed, epoch, &mut events);
        let now = node.fire_clock_ms();
        let budget = MAX_FIRE_BATCHES_IN_FLIGHT.saturating_sub(in_flight) * FIRE_BATCH;
        for action in core.poll(now, budget, FIRE_BATCH) {
            match action {
                Action::Load { from, before_ms, limit } => {
                    let (applied_index, entries) = node.page(&from, before_ms, limit);
                    core.on_page(applied_index, entries, before_ms);
                }
                Action::Fire(mut fires) => {
                    if node.shared.knobs.no_redelivery {
                        // Mutation: only first fires; a deadline or backoff that
                        // comes due is dropped on the floor.
                        fires.retain(|(key, _)| node.due_kind(key) == Some(DueKind::Fire));
                        if fires.is_empty() {
                            continue;
                        }
                    }
                    in_flight += 1;
                    let (node, io_tx) = (node.clone(), io_tx.clone());
                    crate::types::spawn(async move {
                        let commands = fires
                            .iter()
                            .map(|(key, due_ms)| Command::Fire {
                                key: key.clone(),
                                due_ms: *due_ms,
                                epoch,
                                timeout_ms: WEBHOOK_TIMEOUT_MS,
                            })
                            .collect();
                        let result = node.propose(commands).await;
                        let outcomes = fires
                            .into_iter()
                            .enumerate()
                            .map(|(i, (key, due_ms))| {
                                let outcome = match &result {
                                    Ok((index, results)) => FireOutcome::applied(*index, &results[i]),
                                    Err(ProposeError::NotLeader(_)) => FireOutcome::NotLeader,
                                    Err(ProposeError::LeaseLapsed | ProposeError::Unknown) => FireOutcome::Unknown,
                                };
                                (key, due_ms, outcome)
                            })
                            .collect();
                        let _ = io_tx.send(outcomes);
                    });
                }
                Action::Offer(offers) => {
                    // Handed over at once (the node reads the records for their
                    // topics first; the simulation has one queue).
                    let now = node.fire_clock_ms();
                    for (key, due_ms) in offers {
                        let scheduled =
                            node.read_due(&key).1 == Some(tocsin_core::Due { at_ms: due_ms, kind: DueKind::PullFire });
                        let outcome = if scheduled && node.offer_due(key.clone(), due_ms) {
                            FireOutcome::Offered
                        } else {
                            FireOutcome::Unknown
                        };
                        if let Some(Action::Reread(key)) = core.on_fire_outcome(key, due_ms, outcome, now) {
                            reread(&node, &mut core, key);
                        }
                    }
                }
                Action::Reread(key) => reread(&node, &mut core, key),
                Action::Stop => return,
            }
        }
        let now = node.fire_clock_ms();
        let core_wake = core.next_wake_ms().filter(|_| in_flight < MAX_FIRE_BATCHES_IN_FLIGHT);
        let wake_ms = match [core_wake, armed.next_ms()].into_iter().flatten().min() {
            Some(at) => at.saturating_sub(now).clamp(1, 100),
            _ => 100,
        };
        tokio::select! {
            biased;
            applied = events.recv() => match applied {
                Some(applied) => on_applied(&node, &mut core, &mut armed, epoch, applied),
                None => return,
            },
            outcomes = io_rx.recv() => {
                in_flight -= 1;
                if !on_outcomes(&node, &mut core, outcomes.expect("the loop holds a sender")) {
                    return;
                }
            },
            _ = tokio::time::sleep(Duration::from_millis(wake_ms)) => {}
        }
    }
}

fn reread(node: &Node, core: &mut FireCore, key: TimerKey) {
    let (applied_index, due) = node.read_due(&key);
    core.on_reread(key, due, applied_index, node.fire_clock_ms());
}

fn on_outcomes(node: &Arc<Node>, core: &mut FireCore, outcomes: Vec<(TimerKey, u64, FireOutcome)>) -> bool {
    let now = node.fire_clock_ms();
    for (key, due_ms, outcome) in outcomes {
        match core.on_fire_outcome(key, due_ms, outcome, now) {
            Some(Action::Stop) => return false,
            Some(Action::Reread(key)) => reread(node, core, key),
            Some(other) => unreachable!("a fire outcome asks only to stop or re-read, not {other:?}"),
            None => {}
        }
    }
    true
}

/// As the node's `leader.rs`: the held armed attempts whose start has come
/// are sent once the stamp fence allows and the applied log up to now has
/// been read (the `arm_unfenced` mutation sends them at their start, blind).
fn send_armed(
    node: &Arc<Node>,
    core: &mut FireCore,
    armed: &mut Armed<TimerRecord>,
    epoch: u64,
    events: &mut tokio::sync::mpsc::UnboundedReceiver<Applied>,
) {
    let now = node.fire_clock_ms();
    let blind = node.shared.knobs.arm_unfenced;
    let ready: Vec<TimerKey> = armed
        .due(now)
        .into_iter()
        .filter(|(key, start)| blind || node.fence.lock().unwrap().may_send(key, *start))
        .map(|(key, _)| key)
        .collect();
    if !blind {
        while let Ok(applied) = events.try_recv() {
            on_applied(node, core, armed, epoch, applied);
        }
    }
    for key in ready {
        if let Some(record) = armed.take(&key) {
            trace(&key, || format!("n{} epoch {epoch} sends its armed attempt at {now}", node.id));
            crate::types::spawn(node.clone().deliver_webhook(epoch, key, record));
        }
    }
}

fn on_applied(node: &Arc<Node>, core: &mut FireCore, armed: &mut Armed<TimerRecord>, epoch: u64, applied: Applied) {
    if applied.index <= epoch {
        return;
    }
    for change in applied.changes {
        trace(&change.key, || format!("n{} epoch {epoch} change at {}: {:?}", node.id, applied.index, change.due));
        if !node.shared.knobs.arm_unfenced {
            armed.on_change(&change.key, applied.index);
        }
        core.on_change(applied.index, change);
    }
    for d in applied.dispatches {
        trace(&d.key, || format!("n{} epoch {epoch} dispatch at {} under {}", node.id, applied.index, d.epoch));
        if d.epoch != epoch {
            continue;
        }
        match (&d.record.callback, d.record.fire.as_ref().map(|f| (f.phase, f.attempt_started_at_ms))) {
            // Every webhook attempt goes past the stamp fence, a due one too
            // (an armed `Fire` applied after its start, a cancel stamped before
            // it still on its way), as the node's `leader.rs` does.
            (Callback::Webhook { .. }, Some((FirePhase::InFlight { .. }, start))) => {
                armed.hold(d.key, applied.index, start, d.record);
            }
            (Callback::Pull { .. }, Some((FirePhase::Ready { .. }, _))) => node.offer(d.key, &d.record),
            _ => {}
        }
    }
}
