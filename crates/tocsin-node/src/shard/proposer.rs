//! Batches a shard's commands into Raft entries.
//!
//! Every writer of a shard (API requests, the leader's fire loop, delivery
//! results) hands its commands to the shard's proposer. The proposer takes
//! whatever is queued — up to [`MAX_COMMANDS_PER_ENTRY`] commands or
//! [`MAX_ENTRY_BYTES`] — stamps the leader's wall clock on it, and proposes it
//! as one entry; while that entry commits, the next batch gathers. A few
//! entries are kept in flight so the log's group commit stays busy.
//!
//! When the entry is applied each caller gets its own command's result. The
//! leader's wheel does not depend on these replies: it follows the applied
//! log itself (the state machine tells the shard's `EventSink`), so a reply
//! that times out or is dropped loses no timer.
//!
//! **Commands that can wait.** An attempt's outcome has until its
//! attempt's deadline (seconds) to be recorded, and nobody waits for it
//! before answering a client. Proposed at once, each outcome was an entry
//! of its own: at a few thousand webhook timers a second a shard fires
//! one timer every few milliseconds, so a timer cost two entries (its
//! `Fire`, its outcome), and on one node an entry costs about 200 µs of
//! CPU (openraft's steps, the log write, the sync, apply and the thread
//! hand-offs between them) against about 70 µs for everything else a
//! timer needs. So a command proposed with [`Proposer::propose_deferred`]
//! waits up to [`DEFERRED_LINGER`] for company: the first command that
//! cannot wait takes it along in its entry, or the linger ends and it goes
//! alone.
//!
//! Stamps never go backwards: each entry carries at least the time of the
//! one before it (apply enforces the same over leader changes). They are
//! handed out by the shard's [`StampFence`], which the fire loop asks
//! before it sends an armed attempt (`tocsin_core::arm`): from then on no
//! entry is stamped before the attempt's start, and one already stamped
//! before it that carries a cancel or reschedule of the timer holds the
//! attempt back until it is applied. So the fence keeps an entry's cancels
//! and reschedules until `client_write` itself returns, past the callers'
//! timeout if need be: an entry whose callers gave up may still be applied.
//!
//! **Shedding.** Offered more creates than the shard can commit, a queue
//! only grows: every command in it, the leader's own fires and attempt
//! outcomes included, waits longer, requests time out and are retried, and
//! attempts pass their deadlines and are repeated. So the proposer keeps one
//! number, how long the command at the head of its queue has been waiting
//! ([`Proposer::backlog_wait`]); while it is past the shard's
//! `shed_creates_after`, new client creates are refused at once with
//! `Overloaded` and that wait as the retry hint, and the commands already
//! queued (and the leader's own) go through at the rate the shard commits.
//!
//! The queue is not the only place an overloaded shard falls behind: each
//! accepted timer costs its leader a `Fire` and an outcome later, and those
//! go through this same queue only as fast as the fire loop's bounded
//! batches let them. So the fire loop also reports since when it has been
//! leaving due timers in its wheel for want of batches
//! (`FireCore::behind_ms`, [`Proposer::set_fire_behind`]); while that is
//! past `shed_creates_fire_behind`, client creates are refused the same
//! way. Creates taken faster than the shard can fire them would all fire
//! late, however short the queue is.

use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::Proposal;
use tocsin_core::TimerKey;
use tocsin_core::arm::StampFence;
use tocsin_proto::v1 as pb;
use tocsin_store::NodeAddr;
use tocsin_store::Raft;
use tokio::sync::Semaphore;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::clock::Clock;
use crate::error::NodeError;

/// Most commands in one entry.
pub const MAX_COMMANDS_PER_ENTRY: usize = 2_048;
/// Approximate largest entry, counting payloads.
pub const MAX_ENTRY_BYTES: usize = 4 << 20;
/// Entries in flight per shard.
const MAX_IN_FLIGHT: usize = 2;
/// Longest a command proposed with [`Proposer::propose_deferred`] waits for
/// a command that cannot wait to share its entry (module doc). Far inside
/// the time an attempt keeps for recording its outcome
/// (`delivery::attempt::RECORD_MARGIN_MS`, 200 ms).
pub const DEFERRED_LINGER: Duration = Duration::from_millis(10);
/// A leader that has heard from no quorum for this long refuses new
/// commands at once instead of queueing them behind a commit that may never
/// come (openraft keeps a partitioned leader leading): the client moves on
/// to a node that can reach the real leader.
pub const QUORUM_LOST_AFTER: Duration = Duration::from_secs(1);
/// How often an entry waiting to commit longer than [`QUORUM_LOST_AFTER`]
/// looks whether its leader has been cut off.
const QUORUM_CHECK_EVERY: Duration = Duration::from_millis(100);

/// Why a command was not applied (or might not have been).
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProposeError {
    /// This node does not lead the shard; `leader` is the current one if known.
    #[error("not the shard leader")]
    NotLeader { leader: Option<(u64, NodeAddr)> },
    /// This node leads the shard, but openraft refused the write until a
    /// quorum confirms its lease (`ForwardReason::LeaseExpired`: right after
    /// an election, on a busy leader, or on one briefly cut off). Nothing was
    /// proposed; the same node may take it a moment later.
    #[error("the shard leader's lease is not confirmed by a quorum")]
    LeaseLapsed,
    /// Leadership changed while the command was in the log: it may or may
    /// not be applied. Creates and cancels are idempotent, so retrying with
    /// the same id is safe.
    #[error("leadership changed; the outcome is unknown")]
    Discarded { leader: Option<(u64, NodeAddr)> },
    /// The shard's queue is full, or its head has waited past the shedding
    /// bound; nothing was proposed. Retry after `retry_after`.
    #[error("the shard's proposal queue is full")]
    Overloaded { retry_after: Duration },
    /// This node leads the shard by its own account but has not heard from a
    /// quorum for [`QUORUM_LOST_AFTER`]: it is probably cut off.
    #[error("this leader cannot reach a quorum")]
    NoQuorum,
    /// The outcome is unknown: the command may still be applied.
    #[error("raft did not answer in time")]
    Timeout,
    /// The command's entry was waiting to commit when this leader lost its
    /// quorum (see [`QUORUM_LOST_AFTER`]): the outcome is unknown, and
    /// another node may already lead.
    #[error("this leader lost its quorum while the command waited to commit")]
    QuorumLost,
    #[error("raft failed: {0}")]
    Fatal(String),
}

/// The result of one command, with the index of the entry that applied it.
pub type Applied = Result<(u64, CommandResult), ProposeError>;

struct Pending {
    command: Command,
    size: usize,
    done: oneshot::Sender<Applied>,
    submitted: Instant,
    /// Proposed with [`Proposer::propose_deferred`].
    can_wait: bool,
}

/// The process's time base for [`Backlog`]'s atomics.
static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Microseconds since [`BASE`], never 0 (0 means "nothing waiting").
fn micros_since_base(at: Instant) -> u64 {
    at.saturating_duration_since(*BASE).as_micros() as u64 + 1
}

/// How long the oldest queued command has been waiting, written by the
/// proposer task and read by request handlers without a lock.
#[derive(Debug, Default)]
struct Backlog {
    /// When the command at the head of the queue was submitted
    /// ([`micros_since_base`]), or 0 while the task waits for commands.
    head_submitted_us: AtomicU64,
    /// Since when this node's fire loop for the shard has been behind
    /// ([`micros_since_base`]), or 0: written by the fire loop.
    fire_behind_since_us: AtomicU64,
}

impl Backlog {
    fn wait_at(&self, now: Instant) -> Duration {
        match self.head_submitted_us.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            since => Duration::from_micros(micros_since_base(now).saturating_sub(since)),
        }
    }

    fn fire_behind_at(&self, now: Instant) -> Duration {
        match self.fire_behind_since_us.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            since => Duration::from_micros(micros_since_base(now).saturating_sub(since)),
        }
    }
}

/// Whether a client create is refused while the queue head has waited
/// `backlog_wait` against the bound `shed_after` (0: never); the retry hint
/// is the wait, within 50 ms and 2 s.
pub fn shed_create(backlog_wait: Duration, shed_after: Duration) -> Result<(), ProposeError> {
    match crate::admission::shed(crate::admission::ShedReason::QueueDelay, backlog_wait, shed_after) {
        None => Ok(()),
        Some(retry_after) => Err(ProposeError::Overloaded { retry_after }),
    }
}

/// Whether a client create is refused while the shard's fire loop has been
/// behind for `fire_behind` against the bound `shed_after` (0: never).
pub fn shed_create_for_fire_behind(fire_behind: Duration, shed_after: Duration) -> Result<(), ProposeError> {
    match crate::admission::shed(crate::admission::ShedReason::FireBehind, fire_behind, shed_after) {
        None => Ok(()),
        Some(retry_after) => Err(ProposeError::Overloaded { retry_after }),
    }
}

/// A handle for submitting a shard's commands.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
    timeout: Duration,
    shed_after: Duration,
    shed_fire_behind: Duration,
    backlog: Arc<Backlog>,
    fence: Arc<std::sync::Mutex<StampFence>>,
    raft: Raft,
    node_id: u64,
}

/// How a shard's proposer queues and sheds.
#[derive(Clone, Copy, Debug)]
pub struct ProposerLimits {
    /// Most commands waiting for an entry.
    pub queue: usize,
    /// How long a caller waits for its command to apply.
    pub timeout: Duration,
    /// Client creates are refused while the queue's head has waited longer
    /// than this (zero: never).
    pub shed_creates_after: Duration,
    /// Client creates are refused while the shard's fire loop has been
    /// behind for longer than this (zero: never).
    pub shed_creates_fire_behind: Duration,
}

impl Proposer {
    /// Starts the proposer task for `raft` on `runtime` (the fire runtime:
    /// `runtime.rs`).
    pub fn start(
        raft: Raft,
        node_id: u64,
        clock: Arc<Clock>,
        limits: ProposerLimits,
        runtime: &tokio::runtime::Handle,
    ) -> Proposer {
        LazyLock::force(&BASE);
        let (tx, rx) = mpsc::channel(limits.queue.max(1));
        let backlog = Arc::new(Backlog::default());
        let fence = Arc::new(std::sync::Mutex::new(StampFence::default()));
        runtime.spawn(run(raft.clone(), node_id, clock, rx, limits.timeout, backlog.clone(), fence.clone()));
        Proposer {
            tx,
            timeout: limits.timeout,
            shed_after: limits.shed_creates_after,
            shed_fire_behind: limits.shed_creates_fire_behind,
            backlog,
            fence,
            raft,
            node_id,
        }
    }

    /// A new leader task of this shard starts on this node
    /// ([`StampFence::new_leadership`]).
    pub fn new_leadership(&self) {
        self.fence.lock().expect("stamp fence").new_leadership();
    }

    /// Whether the fire loop may send `key`'s armed attempt starting at
    /// `start_ms`, as far as this shard's stamps go
    /// ([`StampFence::may_send`]): afterwards nothing is stamped before
    /// `start_ms`. The loop then reads the applied log before it sends.
    pub fn may_send_armed(&self, key: &TimerKey, start_ms: u64) -> bool {
        self.fence.lock().expect("stamp fence").may_send(key, start_ms)
    }

    /// How long the command at the head of the queue has been waiting for an
    /// entry (zero when the queue is empty).
    pub fn backlog_wait(&self) -> Duration {
        self.backlog.wait_at(Instant::now())
    }

    /// Refuses a client create while the queue, or the fire loop, is past
    /// its shedding bound (see the module doc). The leader's own commands
    /// never ask.
    pub fn admit_create(&self) -> Result<(), ProposeError> {
        let now = Instant::now();
        shed_create(self.backlog.wait_at(now), self.shed_after)?;
        shed_create_for_fire_behind(self.backlog.fire_behind_at(now), self.shed_fire_behind)
    }

    /// The fire loop's report: it has been behind for `behind` (zero: it is
    /// not). The loop reports on every turn and zero when it stops.
    pub fn set_fire_behind(&self, behind: Duration) {
        let since =
            if behind.is_zero() { 0 } else { micros_since_base(Instant::now().checked_sub(behind).unwrap_or(*BASE)) };
        self.backlog.fire_behind_since_us.store(since, Ordering::Relaxed);
    }

    /// Whether this node leads the shard by its own account but has heard
    /// from no quorum for [`QUORUM_LOST_AFTER`].
    pub fn quorum_lost(&self) -> bool {
        self.check_quorum().is_err()
    }

    /// Refuses work when this node leads without a quorum (see
    /// [`QUORUM_LOST_AFTER`]).
    fn check_quorum(&self) -> Result<(), ProposeError> {
        if cut_off(&self.raft, self.node_id) { Err(ProposeError::NoQuorum) } else { Ok(()) }
    }

    /// Proposes one command and waits until it is applied.
    pub async fn propose(&self, command: Command) -> Applied {
        self.check_quorum()?;
        let rx = self.submit(command, false)?;
        self.wait(rx).await
    }

    /// Like [`propose`](Self::propose), for a command that can wait up to
    /// [`DEFERRED_LINGER`] before it is proposed, so that it shares an
    /// entry with the next command that cannot (module doc).
    pub async fn propose_deferred(&self, command: Command) -> Applied {
        self.check_quorum()?;
        let rx = self.submit(command, true)?;
        self.wait(rx).await
    }

    /// Proposes several commands (they may land in different entries) and
    /// waits for all of them.
    pub async fn propose_all(&self, commands: Vec<Command>) -> Vec<Applied> {
        if let Err(e) = self.check_quorum() {
            return commands.iter().map(|_| Err(e.clone())).collect();
        }
        let mut receivers = Vec::with_capacity(commands.len());
        for command in commands {
            receivers.push(self.submit(command, false));
        }
        let mut out = Vec::with_capacity(receivers.len());
        for rx in receivers {
            out.push(match rx {
                Ok(rx) => self.wait(rx).await,
                Err(e) => Err(e),
            });
        }
        out
    }

    fn submit(&self, command: Command, can_wait: bool) -> Result<oneshot::Receiver<Applied>, ProposeError> {
        let (done, rx) = oneshot::channel();
        let size = command_size(&command);
        self.tx.try_send(Pending { command, size, done, submitted: Instant::now(), can_wait }).map_err(
            |e| match e {
                mpsc::error::TrySendError::Full(_) => {
                    ProposeError::Overloaded { retry_after: self.backlog_wait().max(Duration::from_millis(100)) }
                }
                mpsc::error::TrySendError::Closed(_) => ProposeError::Fatal("proposer stopped".into()),
            },
        )?;
        Ok(rx)
    }

    async fn wait(&self, rx: oneshot::Receiver<Applied>) -> Applied {
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(result)) => result,
            // The reply was lost (the entry's task ended without answering):
            // like a timeout, the command may or may not be applied.
            Ok(Err(_)) => Err(ProposeError::Timeout),
            Err(_) => Err(ProposeError::Timeout),
        }
    }
}

/// A rough size of a command in an entry: payloads dominate.
fn command_size(command: &Command) -> usize {
    match command {
        Command::Create { spec, .. } => {
            256 + spec.payload.len() + spec.labels.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
        }
        Command::Purge { keys } => 64 * keys.len(),
        _ => 160,
    }
}

/// The start of an entry's batch: `first`, and, if `first` can wait, what
/// arrives until a command that cannot wait arrives, the batch is full, or
/// `linger` has passed since `first` was submitted (module doc). Returns
/// the batch and its size.
async fn linger(first: Pending, rx: &mut mpsc::Receiver<Pending>, linger: Duration) -> (Vec<Pending>, usize) {
    let mut bytes = first.size;
    let until = tokio::time::Instant::now() + linger.saturating_sub(first.submitted.elapsed());
    let can_wait = first.can_wait;
    let mut batch = vec![first];
    if !can_wait {
        return (batch, bytes);
    }
    while batch.len() < MAX_COMMANDS_PER_ENTRY && bytes < MAX_ENTRY_BYTES {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(p)) => {
                let urgent = !p.can_wait;
                bytes += p.size;
                batch.push(p);
                if urgent {
                    break;
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    (batch, bytes)
}

async fn run(
    raft: Raft,
    node_id: u64,
    clock: Arc<Clock>,
    mut rx: mpsc::Receiver<Pending>,
    timeout: Duration,
    backlog: Arc<Backlog>,
    fence: Arc<std::sync::Mutex<StampFence>>,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // The head waits here for an entry slot: while it does, its age is
        // the queue's delay (see `Backlog`).
        backlog.head_submitted_us.store(micros_since_base(first.submitted), Ordering::Relaxed);
        let (mut batch, mut bytes) = linger(first, &mut rx, DEFERRED_LINGER).await;
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        while batch.len() < MAX_COMMANDS_PER_ENTRY && bytes < MAX_ENTRY_BYTES {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.size;
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        // The next head is the next command received; until then nothing waits.
        backlog.head_submitted_us.store(0, Ordering::Relaxed);
        if cut_off(&raft, node_id) {
            // Commands queued before this leader was cut off (behind the
            // entries that then gave up, `QuorumLost`) are refused as new
            // ones are (`Proposer::check_quorum`), not written: openraft
            // refuses a write from a leader whose lease ran out naming no
            // leader, which the fire loop takes for a deposition (seen in a
            // chaos partition-leader run: the cut-off leader's loop stopped
            // 1.35 s into the cut and was started again 250 ms later).
            drop(permit);
            for p in batch {
                let _ = p.done.send(Err(ProposeError::NoQuorum));
            }
            continue;
        }
        let raft = raft.clone();
        let stamped = fence.lock().expect("stamp fence").stamp(clock.now_ms(), batch.iter().map(|p| &p.command));
        let now_ms = stamped.stamp_ms;
        let fence = fence.clone();
        // How long the oldest command waited for an entry to carry it.
        let queued = batch[0].submitted.elapsed();
        metrics::histogram!("tocsin_propose_queue_seconds").record(queued.as_secs_f64());
        metrics::histogram!("tocsin_propose_batch_commands").record(batch.len() as f64);
        tokio::spawn(async move {
            let (commands, waiters): (Vec<Command>, Vec<oneshot::Sender<Applied>>) =
                batch.into_iter().map(|p| (p.command, p.done)).unzip();
            let proposal = Proposal { now_ms, commands: commands.into() };
            let writing = std::time::Instant::now();
            // A quiet group's leader lease has usually run out (`quiet.rs`).
            crate::shard::quiet::renew_lease(&raft).await;
            let write = raft.client_write(proposal);
            tokio::pin!(write);
            // Append, replicate to a quorum, commit and apply; or give up
            // at the timeout, or as soon as this leader is cut off from its
            // quorum: openraft keeps a partitioned leader leading and the
            // entry waiting, and its callers then waited out their own
            // deadlines (chaos partition-leader: every create call sent to
            // the cut-off leader in the cut's first second took the
            // driver's 2 s deadline; with the client's default, 10 s).
            let waited = tokio::select! {
                result = &mut write => Ok(result),
                gave_up = give_up(&raft, node_id, timeout) => Err(gave_up),
            };
            metrics::histogram!("tocsin_raft_write_seconds").record(writing.elapsed().as_secs_f64());
            drop(permit);
            let result = match waited {
                Ok(result) => result,
                Err(gave_up) => {
                    // The callers hear now; the entry may still be applied,
                    // so its cancels stay fenced until openraft answers.
                    for waiter in waiters {
                        let _ = waiter.send(Err(gave_up.clone()));
                    }
                    let result = write.await;
                    settle(&fence, stamped, result.is_ok());
                    return;
                }
            };
            // An error means the leadership was lost on the way: the entry may
            // still be committed by the next leader (`StampFence::lost`).
            settle(&fence, stamped, result.is_ok());
            // A test can delay the replies, or lose them: the entry is applied
            // either way, and the waiters see a timeout.
            if crate::fault::hit("proposer::reply").await.is_some() {
                return;
            }
            match result {
                Ok(resp) => {
                    let index = resp.log_id.index;
                    let results = resp.data.results;
                    if results.len() != waiters.len() {
                        // Apply broke its one-result-per-command rule: the
                        // group's state cannot be trusted. Stop the group
                        // rather than limp on (another replica takes over),
                        // and tell every waiter so.
                        let message = format!(
                            "apply of entry {index} returned {} results for {} commands; stopping the group",
                            results.len(),
                            waiters.len()
                        );
                        tracing::error!(index, "{message}");
                        for waiter in waiters {
                            let _ = waiter.send(Err(ProposeError::Fatal(message.clone())));
                        }
                        if let Err(e) = raft.shutdown().await {
                            tracing::error!(error = %e, "stopping the group after a wrong result count");
                        }
                        return;
                    }
                    for (waiter, result) in waiters.into_iter().zip(results) {
                        let _ = waiter.send(Ok((index, result)));
                    }
                }
                Err(e) => {
                    let err = to_propose_error(e);
                    for waiter in waiters {
                        let _ = waiter.send(Err(err.clone()));
                    }
                }
            }
        });
    }
}

/// Whether `node_id` leads the group by its own account but has heard from
/// no quorum for [`QUORUM_LOST_AFTER`].
fn cut_off(raft: &Raft, node_id: u64) -> bool {
    use openraft::Instant as _;
    use openraft::async_runtime::WatchReceiver as _;
    let rx = raft.metrics();
    let m = rx.borrow_watched();
    m.current_leader == Some(node_id)
        && m.membership_config.membership().voter_ids().nth(1).is_some()
        && m.last_quorum_acked.as_ref().is_some_and(|t| t.elapsed() > QUORUM_LOST_AFTER)
}

/// Why the callers of an entry still waiting to commit stop waiting: the
/// `timeout` passed, or this node, leading, was cut off from its quorum
/// ([`cut_off`]) first. Looks first after [`QUORUM_LOST_AFTER`], then
/// every [`QUORUM_CHECK_EVERY`]; one timer at a time, so an entry that
/// commits in milliseconds costs what the bare timeout did.
async fn give_up(raft: &Raft, node_id: u64, timeout: Duration) -> ProposeError {
    let until = tokio::time::Instant::now() + timeout;
    tokio::time::sleep_until(until.min(tokio::time::Instant::now() + QUORUM_LOST_AFTER)).await;
    loop {
        if cut_off(raft, node_id) {
            return ProposeError::QuorumLost;
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            return ProposeError::Timeout;
        }
        tokio::time::sleep_until(until.min(now + QUORUM_CHECK_EVERY)).await;
    }
}

/// Hands an entry's stamp back to the fence once openraft has answered:
/// applied, or (an error) of unknown fate.
fn settle(fence: &std::sync::Mutex<StampFence>, stamped: tocsin_core::arm::Stamped, applied: bool) {
    let mut fence = fence.lock().expect("stamp fence");
    if applied { fence.done(stamped) } else { fence.lost(stamped) }
}

pub(crate) fn to_propose_error(
    e: openraft::error::RaftError<
        tocsin_store::TypeConfig,
        openraft::error::ClientWriteError<tocsin_store::TypeConfig>,
    >,
) -> ProposeError {
    use openraft::error::ClientWriteError;
    use openraft::error::ForwardReason;
    use openraft::error::RaftError;
    match e {
        // Told apart from "not leader": both name no leader, but this node
        // still leads and a deposition would stop its fire loop for nothing.
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) if f.reason == ForwardReason::LeaseExpired => {
            ProposeError::LeaseLapsed
        }
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            ProposeError::NotLeader { leader: f.leader_id.zip(f.leader_node) }
        }
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => {
            ProposeError::Discarded { leader: f.leader_id.zip(f.leader_node) }
        }
        RaftError::APIError(other) => ProposeError::Fatal(other.to_string()),
        RaftError::Fatal(f) => ProposeError::Fatal(f.to_string()),
    }
}

impl NodeError {
    /// Maps a failed proposal on `shard`.
    pub fn from_propose(shard: u32, e: ProposeError) -> NodeError {
        let hint = |leader: Option<(u64, tocsin_store::NodeAddr)>| {
            leader.map(|(id, addr)| pb::LeaderHint {
                shard,
                node_id: id,
                grpc_addr: addr.grpc_addr,
                http_addr: addr.http_addr,
            })
        };
        match e {
            ProposeError::NotLeader { leader } => NodeError::Unavailable {
                message: format!("this node does not lead shard {shard}"),
                leader: hint(leader),
                retry_after_ms: 50,
            },
            ProposeError::LeaseLapsed => NodeError::Unavailable {
                message: format!(
                    "this node leads shard {shard} but waits for a quorum to confirm its lease; nothing was written, retry"
                ),
                leader: None,
                retry_after_ms: 50,
            },
            ProposeError::Discarded { leader } => NodeError::Unavailable {
                message: format!("leadership of shard {shard} changed; the outcome is unknown, retry with the same id"),
                leader: hint(leader),
                retry_after_ms: 50,
            },
            ProposeError::NoQuorum => NodeError::Unavailable {
                message: format!("this node's leadership of shard {shard} lost its quorum; try another node"),
                leader: None,
                retry_after_ms: 100,
            },
            ProposeError::Overloaded { retry_after } => NodeError::ResourceExhausted {
                message: format!(
                    "shard {shard} is overloaded: its queue's oldest command has waited {} ms",
                    retry_after.as_millis()
                ),
                retry_after_ms: retry_after.as_millis() as u64,
            },
            ProposeError::QuorumLost => NodeError::Unavailable {
                message: format!(
                    "this node's leadership of shard {shard} lost its quorum while the command waited to commit; \
                     the outcome is unknown, retry with the same id on another node"
                ),
                leader: None,
                retry_after_ms: 100,
            },
            ProposeError::Timeout => NodeError::Unavailable {
                message: format!(
                    "shard {shard} did not answer in time; the outcome is unknown, retry with the same id"
                ),
                leader: None,
                retry_after_ms: 200,
            },
            ProposeError::Fatal(m) => NodeError::Unavailable {
                message: format!("shard {shard} is not serving: {m}"),
                leader: None,
                retry_after_ms: 1000,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_lapsed_lease_is_told_apart_from_not_leading() {
        use openraft::error::ClientWriteError;
        use openraft::error::ForwardReason;
        use openraft::error::ForwardToLeader;
        use openraft::error::RaftError;
        let refused = |f: ForwardToLeader<tocsin_store::TypeConfig>| {
            to_propose_error(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
        };
        // What `ensure_writable_leader_handler` answers a leader whose lease lapsed.
        let lapsed = ForwardToLeader::empty().with_reason(ForwardReason::LeaseExpired);
        assert!(matches!(refused(lapsed), ProposeError::LeaseLapsed));
        // Not leading, no leader known (a candidate, a deposed leader).
        assert!(matches!(refused(ForwardToLeader::empty()), ProposeError::NotLeader { leader: None }));
        // Handing leadership over: the target is named.
        let transfer = ForwardToLeader::new(2, NodeAddr::default()).with_reason(ForwardReason::LeadershipTransfer);
        assert!(matches!(refused(transfer), ProposeError::NotLeader { leader: Some((2, _)) }));
        // The client is told to retry, with no other node named.
        match NodeError::from_propose(3, ProposeError::LeaseLapsed) {
            NodeError::Unavailable { leader: None, retry_after_ms: 50, message } => {
                assert!(message.contains("lease"), "{message}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn creates_pass_until_the_queue_head_has_waited_past_the_bound() {
        assert!(shed_create(Duration::ZERO, MS(250)).is_ok());
        assert!(shed_create(MS(250), MS(250)).is_ok());
        match shed_create(MS(251), MS(250)) {
            Err(ProposeError::Overloaded { retry_after }) => assert_eq!(retry_after, MS(251)),
            other => panic!("expected Overloaded, got {other:?}"),
        }
    }

    #[test]
    fn the_retry_hint_is_the_wait_within_50_ms_and_2_s() {
        let hint = |wait| match shed_create(wait, MS(10)) {
            Err(ProposeError::Overloaded { retry_after }) => retry_after,
            other => panic!("expected Overloaded, got {other:?}"),
        };
        assert_eq!(hint(MS(11)), MS(50));
        assert_eq!(hint(MS(700)), MS(700));
        assert_eq!(hint(Duration::from_secs(30)), Duration::from_secs(2));
    }

    fn pending(can_wait: bool) -> (Pending, oneshot::Receiver<Applied>) {
        let (done, rx) = oneshot::channel();
        let command = Command::Cancel { key: tocsin_core::TimerKey::new("ns", "id") };
        (Pending { size: command_size(&command), command, done, submitted: Instant::now(), can_wait }, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_that_can_wait_waits_for_one_that_cannot_or_for_the_linger() {
        let (tx, mut rx) = mpsc::channel(16);
        // A command that cannot wait goes at once, alone, whatever follows.
        let (urgent, _r1) = pending(false);
        let (later, _r2) = pending(true);
        tx.try_send(later).unwrap();
        let (batch, _) = linger(urgent, &mut rx, MS(10)).await;
        assert_eq!(batch.len(), 1);
        assert!(!batch[0].can_wait);
        // The queued command that can wait now heads a batch: it takes the
        // next one that can wait along, and goes with the first that cannot,
        // 3 ms in, not at the linger's end.
        let first = rx.try_recv().unwrap();
        let (also, _r3) = pending(true);
        tx.try_send(also).unwrap();
        let sender = tx.clone();
        let (urgent, _r4) = pending(false);
        tokio::spawn(async move {
            tokio::time::sleep(MS(3)).await;
            sender.try_send(urgent).unwrap();
        });
        let started = tokio::time::Instant::now();
        let (batch, bytes) = linger(first, &mut rx, MS(10)).await;
        assert_eq!(batch.iter().map(|p| p.can_wait).collect::<Vec<_>>(), vec![true, true, false]);
        assert_eq!(bytes, batch.iter().map(|p| p.size).sum::<usize>());
        assert_eq!(started.elapsed(), MS(3));
        // Nothing that cannot wait comes: it goes when the linger ends,
        // counted from its submission, with what came meanwhile.
        let (alone, _r5) = pending(true);
        let sender = tx.clone();
        let (also, _r6) = pending(true);
        tokio::spawn(async move {
            tokio::time::sleep(MS(4)).await;
            sender.try_send(also).unwrap();
        });
        let started = tokio::time::Instant::now();
        let (batch, _) = linger(alone, &mut rx, MS(10)).await;
        assert_eq!(batch.len(), 2);
        assert_eq!(started.elapsed(), MS(10));
        // The queue closing ends the wait too.
        let (last, _r7) = pending(true);
        drop(tx);
        let (batch, _) = linger(last, &mut rx, MS(10)).await;
        assert_eq!(batch.len(), 1);
    }

    #[test]
    fn a_zero_bound_never_sheds() {
        assert!(shed_create(Duration::from_secs(3600), Duration::ZERO).is_ok());
    }

    #[test]
    fn the_backlog_is_the_head_commands_age_and_empty_when_nothing_waits() {
        LazyLock::force(&BASE);
        let backlog = Backlog::default();
        let t0 = Instant::now();
        assert_eq!(backlog.wait_at(t0 + MS(500)), Duration::ZERO);
        backlog.head_submitted_us.store(micros_since_base(t0), Ordering::Relaxed);
        assert_eq!(backlog.wait_at(t0 + MS(300)), MS(300));
        // A clock read from before the head was submitted is no wait at all.
        assert_eq!(backlog.wait_at(t0.checked_sub(MS(5)).unwrap_or(t0)), Duration::ZERO);
        backlog.head_submitted_us.store(0, Ordering::Relaxed);
        assert_eq!(backlog.wait_at(t0 + MS(300)), Duration::ZERO);
    }
}
