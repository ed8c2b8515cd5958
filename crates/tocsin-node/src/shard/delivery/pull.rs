//! Pull delivery: fired timers wait on a namespace/topic queue until a
//! consumer reserves them (the beanstalkd / lmstfy model).
//!
//! - When a scheduled pull timer's time comes, the shard leader offers it
//!   here unfired (`FireCore`'s `Offer`). A timer that is *ready* (a
//!   reservation that ran out, a nack's backoff that ended, or a `Fire` of
//!   an index entry written before scheduled pull timers were offered) is
//!   offered the same way.
//! - A consumer's `Reserve` stream takes offered timers in batches; each
//!   batch is recorded through Raft before it is sent, up to hundreds per
//!   stream message: a `FireReserve` for a scheduled timer (it fires and
//!   starts the first attempt in one command), a `Reserve` for a ready one
//!   (the next attempt). Both stamp the epoch. So a pull timer costs two
//!   commands from its due time to its ack, not three, and only one of them
//!   stands between its due time and the consumer.
//! - A reservation not acked within its time-to-run goes back to ready, for
//!   this or another consumer: the reserved timer is indexed at the
//!   reservation's end, so the leader's fire loop makes it ready again then
//!   (there is no in-memory expiry to lose). `Ack` records the delivery;
//!   `Nack` schedules a retry after a delay.
//! - Recording a reservation runs in its own task: a consumer that goes
//!   away mid-batch cancels nothing. What it reserved stays reserved until
//!   its time-to-run runs out; what could not be reserved goes back to the
//!   queue.
//!
//! Queues are per node and hold only shards this node leads; a leader change
//! makes the new leader re-offer what was ready (at once) or reserved (when
//! the reservation runs out): at-least-once.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tocsin_contract::json;
use tocsin_core::Callback;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::command::AttemptOutcome;
use tocsin_core::command::AttemptReport;
use tocsin_core::command::SkipReason;
use tocsin_proto::v1 as pb;
use tokio::sync::Notify;
use tokio::sync::mpsc;

use crate::config::DeliveryConfig;
use crate::shard::ShardCtx;

/// A ready timer, or a scheduled one whose time came, as the queue holds
/// it.
#[derive(Clone)]
struct Item {
    shard: Arc<ShardCtx>,
    key: TimerKey,
    /// The firing and attempt a ready timer is offered at; 0 and 0 for a
    /// scheduled one, which its reservation fires (`Command::FireReserve`).
    fire_index: u64,
    attempt: u32,
    /// A scheduled timer's due time (its fire-time index entry); 0 for a
    /// ready one.
    due_ms: u64,
    /// The timer's own time-to-run (`Pull.ttr_ms`); 0: the consumer's.
    ttr_ms: u64,
}

/// How long `item`'s reservation lasts: its own time-to-run, or the
/// consumer's `consumer_ttr_ms`.
fn item_ttr_ms(item: &Item, consumer_ttr_ms: u64) -> u64 {
    if item.ttr_ms == 0 { consumer_ttr_ms } else { item.ttr_ms }
}

/// A reservation this node handed to a consumer: how many a consumer holds
/// bounds what it is sent next.
struct Reservation {
    shard: u32,
    attempt: u32,
    /// When it runs out, on the monotonic clock.
    expires: std::time::Instant,
    consumer: u64,
}

/// The most encoded deliveries one `Reserve` stream message holds. gRPC
/// libraries refuse messages over 4 MiB by default (grpc-go, grpcio, grpc-java),
/// and 256 deliveries of 64 KiB payloads are 16 MiB: a batch bigger than
/// this goes out as several messages. One delivery alone (its payload at
/// most 1 MiB, `HARD_MAX_PAYLOAD_BYTES`) always fits.
pub const RESERVE_MESSAGE_MAX_BYTES: usize = 3 << 20;

/// `deliveries` cut, in order, into messages of at most `max_bytes` encoded
/// (a delivery bigger than that alone in its own).
pub fn split_by_encoded_size(deliveries: Vec<pb::Delivery>, max_bytes: usize) -> Vec<Vec<pb::Delivery>> {
    use prost::Message;
    let mut out = Vec::new();
    let mut current = Vec::new();
    let mut current_bytes = 0usize;
    for d in deliveries {
        // A repeated field's element: tag, length, body.
        let len = d.encoded_len();
        let bytes = 1 + prost::encoding::encoded_len_varint(len as u64) + len;
        if !current.is_empty() && current_bytes + bytes > max_bytes {
            out.push(std::mem::take(&mut current));
            current_bytes = 0;
        }
        current_bytes += bytes;
        current.push(d);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// How long a scheduled timer whose reservation came before its time (a
/// leader clock that stepped back) waits before it is offered again.
const NOT_DUE_RETRY: Duration = Duration::from_millis(50);

/// Topics (namespace and name, from client input) kept at once; past it,
/// topics with nothing ready and no consumer are forgotten.
const MAX_TOPICS: usize = 10_000;

#[derive(Default)]
struct Topic {
    state: Mutex<TopicState>,
    notify: Notify,
}

#[derive(Default)]
struct TopicState {
    ready: VecDeque<Item>,
    /// The queued timers, each with the newest offer for it (`fire_index`,
    /// `attempt`, `due_ms`, as in [`Item`]): an offer for a timer already
    /// queued (its reservation ran out while a stale copy waited) updates
    /// what the queued item reserves, rather than being dropped, or the
    /// stale copy's reservation would be refused and nothing would offer the
    /// timer again. A firing is newer than the scheduled offer it came from
    /// (fire index 0).
    queued: HashMap<TimerKey, (u64, u32, u64)>,
}

impl TopicState {
    /// Remembers `offer` for `key` if it is the newest seen; true if `key`
    /// was not queued.
    fn note(&mut self, key: &TimerKey, offer: (u64, u32, u64)) -> bool {
        match self.queued.get_mut(key) {
            Some(latest) => {
                if offer.0 >= latest.0 {
                    *latest = offer;
                }
                false
            }
            None => {
                self.queued.insert(key.clone(), offer);
                true
            }
        }
    }
}

/// What happened to one ack or nack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckStatus {
    Ok,
    /// The reservation had expired and the timer was (or will be)
    /// delivered again.
    Stale,
    NotFound,
}

/// Consumer options, with defaults and bounds applied.
#[derive(Clone, Copy, Debug)]
pub struct ReserveOptions {
    pub ttr_ms: u64,
    pub max_batch: usize,
    pub max_in_flight: usize,
}

impl ReserveOptions {
    pub fn new(ttr_ms: u64, max_batch: u32, max_in_flight: u32) -> ReserveOptions {
        ReserveOptions {
            ttr_ms: if ttr_ms == 0 { 30_000 } else { ttr_ms.clamp(100, 24 * 3600 * 1000) },
            max_batch: if max_batch == 0 { 256 } else { (max_batch as usize).min(1000) },
            max_in_flight: if max_in_flight == 0 { 10_000 } else { (max_in_flight as usize).min(100_000) },
        }
    }
}

/// Every pull topic's queue on this node.
pub struct PullHub {
    config: DeliveryConfig,
    topics: Mutex<HashMap<(String, String), Arc<Topic>>>,
    reservations: Mutex<HashMap<TimerKey, Reservation>>,
    next_consumer: AtomicU64,
    /// Woken when an ack or nack releases reservations: a consumer whose
    /// window was full may take more at once, not at its next 100 ms poll
    /// (measured: a window of 10 delivered about 380 timers/s, idle 100 ms
    /// after every 40).
    released: Notify,
}

impl PullHub {
    pub fn new(config: DeliveryConfig) -> Arc<PullHub> {
        Arc::new(PullHub {
            config,
            topics: Mutex::new(HashMap::new()),
            reservations: Mutex::new(HashMap::new()),
            next_consumer: AtomicU64::new(1),
            released: Notify::new(),
        })
    }

    fn topic(&self, namespace: &str, topic: &str) -> Arc<Topic> {
        let mut topics = self.topics.lock().expect("topics lock");
        let key = (namespace.to_string(), topic.to_string());
        if topics.len() >= MAX_TOPICS && !topics.contains_key(&key) {
            // Only this map holds such a topic, and it holds nothing.
            topics.retain(|_, t| {
                Arc::strong_count(t) > 1 || {
                    let state = t.state.lock().expect("topic lock");
                    !state.ready.is_empty() || !state.queued.is_empty()
                }
            });
        }
        topics.entry(key).or_default().clone()
    }

    /// A ready pull timer from a shard this node leads.
    pub fn offer(&self, ctx: &Arc<ShardCtx>, key: TimerKey, record: &TimerRecord) {
        let Some(fire) = &record.fire else { return };
        self.enqueue(ctx, key, record, (fire.fire_index, fire.attempt, 0));
    }

    /// A scheduled pull timer whose time (`due_ms`, its index entry) came,
    /// from a shard this node leads: the consumer's reservation fires it.
    /// False if it was not queued because a firing of it is (which a
    /// scheduled offer never replaces): the caller looks at it again.
    pub fn offer_due(&self, ctx: &Arc<ShardCtx>, key: TimerKey, record: &TimerRecord, due_ms: u64) -> bool {
        self.enqueue(ctx, key, record, (0, 0, due_ms))
    }

    /// Queues `offer` of `key`, or updates the queued copy. False only if a
    /// newer offer of it is queued.
    fn enqueue(&self, ctx: &Arc<ShardCtx>, key: TimerKey, record: &TimerRecord, offer: (u64, u32, u64)) -> bool {
        let Callback::Pull { topic, ttr_ms } = &record.callback else { return true };
        // Ready again: any reservation this node remembers for it has ended.
        self.reservations.lock().expect("reservations lock").remove(&key);
        let topic = self.topic(&key.namespace, topic);
        {
            let mut state = topic.state.lock().expect("topic lock");
            if state.queued.contains_key(&key) {
                state.note(&key, offer);
                return state.queued[&key] == offer;
            }
            if state.ready.len() >= self.config.max_ready_per_topic {
                metrics::counter!("tocsin_pull_overflow_total").increment(1);
                // It stays in the shard's index; the leader offers it again
                // after its next rescan.
                ctx.events.mark_overflow();
                return true;
            }
            state.note(&key, offer);
            let (fire_index, attempt, due_ms) = offer;
            state.ready.push_back(Item { shard: ctx.clone(), key, fire_index, attempt, due_ms, ttr_ms: *ttr_ms });
        }
        topic.notify.notify_one();
        true
    }

    /// Starts a consumer: a stream of reserved batches.
    pub fn reserve(
        self: &Arc<Self>,
        namespace: String,
        topic: String,
        options: ReserveOptions,
    ) -> mpsc::Receiver<pb::ReserveResponse> {
        let (tx, rx) = mpsc::channel(2);
        let consumer = self.next_consumer.fetch_add(1, Ordering::Relaxed);
        let hub = self.clone();
        let topic = self.topic(&namespace, &topic);
        tokio::spawn(async move {
            hub.consume(topic, consumer, options, tx).await;
        });
        rx
    }

    async fn consume(
        self: Arc<Self>,
        topic: Arc<Topic>,
        consumer: u64,
        options: ReserveOptions,
        tx: mpsc::Sender<pb::ReserveResponse>,
    ) {
        // Several batches are recorded through Raft at once, so one consumer is
        // not limited to one batch per commit round trip. Each is its own task
        // and reports back here: leaving early drops no reservation half done.
        const BATCHES_IN_FLIGHT: usize = 4;
        let (done_tx, mut done_rx) = mpsc::channel::<(usize, Vec<pb::Delivery>)>(BATCHES_IN_FLIGHT);
        let mut in_flight = 0usize;
        // Timers taken into batches still being recorded: they count
        // against `max_in_flight` too (measured: without them a window of 10
        // held 40 reservations, one batch per slot).
        let mut taken = 0usize;
        loop {
            if tx.is_closed() {
                return;
            }
            let mut took = false;
            // Registered before looking, so a release between the look and
            // the wait below is not missed.
            let released = self.released.notified();
            if in_flight < BATCHES_IN_FLIGHT {
                let room = options
                    .max_in_flight
                    .saturating_sub(self.outstanding(consumer, options.max_in_flight) + taken)
                    .min(options.max_batch);
                let items = if room == 0 { Vec::new() } else { take(&topic, room) };
                if !items.is_empty() {
                    took = true;
                    in_flight += 1;
                    taken += items.len();
                    let (hub, topic, done_tx) = (self.clone(), topic.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        let count = items.len();
                        let deliveries = hub.reserve_items(&topic, consumer, items, options.ttr_ms).await;
                        let _ = done_tx.send((count, deliveries)).await;
                    });
                }
            }
            if took {
                continue;
            }
            tokio::select! {
                _ = released => {}
                Some((count, deliveries)) = done_rx.recv(), if in_flight > 0 => {
                    in_flight -= 1;
                    taken -= count;
                    if !deliveries.is_empty() {
                        for deliveries in split_by_encoded_size(deliveries, RESERVE_MESSAGE_MAX_BYTES) {
                            if tx.send(pb::ReserveResponse { deliveries }).await.is_err() {
                                // The consumer went away; its reservations run out on their own.
                                return;
                            }
                        }
                        if crate::fault::hit("pull::reserve_stream").await.is_some() {
                            // A test closes the stream mid-batch.
                            return;
                        }
                    }
                }
                _ = topic.notify.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = tx.closed() => return,
            }
        }
    }

    /// Reservations `consumer` holds, counting the ones that ran out only
    /// until it reaches `max` (then they are forgotten: the fire loop makes
    /// them ready again).
    fn outstanding(&self, consumer: u64, max: usize) -> usize {
        let mut reservations = self.reservations.lock().expect("reservations lock");
        let held = reservations.values().filter(|r| r.consumer == consumer).count();
        if held < max {
            return held;
        }
        let now = std::time::Instant::now();
        reservations.retain(|_, r| r.expires > now);
        reservations.values().filter(|r| r.consumer == consumer).count()
    }

    /// Records reservations through Raft — one proposal batch per shard, the
    /// shards concurrently — and returns what was reserved. Items whose
    /// reservation could not be recorded (overload, timeout) go back to the
    /// front of the queue.
    async fn reserve_items(
        &self,
        topic: &Arc<Topic>,
        consumer: u64,
        items: Vec<Item>,
        ttr_ms: u64,
    ) -> Vec<pb::Delivery> {
        let mut by_shard: HashMap<u32, Vec<Item>> = HashMap::new();
        for item in items {
            by_shard.entry(item.shard.shard).or_default().push(item);
        }
        let per_shard = by_shard.into_values().map(|items| async move {
            let ctx = items[0].shard.clone();
            let Some(epoch) = ctx.epoch() else { return (items, Vec::new(), None) };
            let now_ms = ctx.clock.now_ms();
            let commands = items
                .iter()
                .map(|i| {
                    let until_ms = now_ms.saturating_add(item_ttr_ms(i, ttr_ms));
                    if i.fire_index == 0 {
                        Command::FireReserve { key: i.key.clone(), due_ms: i.due_ms, epoch, until_ms }
                    } else {
                        Command::Reserve {
                            key: i.key.clone(),
                            fire_index: i.fire_index,
                            expected_attempt: i.attempt,
                            epoch,
                            until_ms,
                        }
                    }
                })
                .collect();
            let results = ctx.proposer.propose_all(commands).await;
            (items, results, Some((epoch, now_ms)))
        });
        let mut out = Vec::new();
        let mut retry = Vec::new();
        let mut not_due = Vec::new();
        for (items, results, stamp) in futures::future::join_all(per_shard).await {
            let Some((epoch, now_ms)) = stamp else { continue };
            let ctx = items[0].shard.clone();
            // Deposed (or lease lost) meanwhile, or the cluster map (and so the
            // cluster id every delivery carries) not learned yet: what was
            // reserved comes due again when its reservation runs out, here or
            // at the next leader.
            let Some(cluster_id) = ctx.cluster_id().filter(|_| ctx.may_dispatch(epoch)) else { continue };
            let mut reservations = self.reservations.lock().expect("reservations lock");
            for (item, result) in items.into_iter().zip(results) {
                match result {
                    Ok((_, CommandResult::Dispatch { record })) => {
                        let Some(fire) = record.fire.as_ref().filter(|f| f.attempt > 0) else { continue };
                        let mut delivery = json::delivery_proto(cluster_id, ctx.shard, &item.key, &record);
                        let item_ttr_ms = item_ttr_ms(&item, ttr_ms);
                        delivery.reserved_until_ms = now_ms.saturating_add(item_ttr_ms);
                        if let Callback::Pull { topic, .. } = &record.callback {
                            delivery.topic = topic.clone();
                        }
                        reservations.insert(
                            item.key.clone(),
                            Reservation {
                                shard: ctx.shard,
                                attempt: fire.attempt,
                                expires: std::time::Instant::now() + Duration::from_millis(item_ttr_ms),
                                consumer,
                            },
                        );
                        out.push(delivery);
                    }
                    // A scheduled timer's reservation stamped before its time
                    // (never early; the clock stepped back): again, a moment later.
                    Ok((_, CommandResult::Skipped { reason: SkipReason::NotDue })) if item.fire_index == 0 => {
                        not_due.push(item)
                    }
                    // Not ready (backing off, reserved), or moved on (acked, dead,
                    // purged, fired by another reservation): the applied log told
                    // the fire loop, which brings it back when it is due again.
                    Ok(_) => {}
                    Err(crate::shard::proposer::ProposeError::NotLeader { .. }) => {}
                    // Not recorded, or unknown: back to the queue. If it was
                    // recorded after all, the next reservation of this item is
                    // stale and the recorded one comes due when it runs out.
                    Err(_) => retry.push(item),
                }
            }
        }
        requeue(topic, retry);
        if !not_due.is_empty() {
            let topic = topic.clone();
            tokio::spawn(async move {
                tokio::time::sleep(NOT_DUE_RETRY).await;
                requeue(&topic, not_due);
                topic.notify.notify_one();
            });
        }
        out
    }

    /// Records acks (`nack_delay_ms` = `None`) or nacks for deliveries of
    /// shards this node leads.
    pub async fn settle(
        &self,
        ctx: &Arc<ShardCtx>,
        refs: Vec<(TimerKey, u64, u32)>,
        nack: Option<(u64, String)>,
    ) -> Vec<AckStatus> {
        let now = ctx.clock.now_ms();
        let commands: Vec<Command> = refs
            .iter()
            .map(|(key, fire_index, attempt)| Command::AttemptResult {
                key: key.clone(),
                fire_index: *fire_index,
                attempt: *attempt,
                outcome: match &nack {
                    None => AttemptOutcome::Delivered,
                    Some((delay_ms, reason)) => {
                        AttemptOutcome::Failed { error: reason.clone(), retry_at_ms: now.saturating_add(*delay_ms) }
                    }
                },
                // How long the consumer held it is the entry's finish minus
                // its start.
                report: AttemptReport::new(0, if nack.is_some() { "nack" } else { "ack" }, 0),
            })
            .collect();
        let results = ctx.proposer.propose_all(commands).await;
        let mut reservations = self.reservations.lock().expect("reservations lock");
        let statuses = refs
            .into_iter()
            .zip(results)
            .map(|((key, _, attempt), result)| {
                let status = match result {
                    Ok((_, CommandResult::Recorded { .. } | CommandResult::Dead { .. })) => AckStatus::Ok,
                    Ok((_, CommandResult::Skipped { reason: SkipReason::NotFound })) => AckStatus::NotFound,
                    Ok(_) => AckStatus::Stale,
                    Err(_) => AckStatus::Stale,
                };
                if status == AckStatus::Ok && reservations.get(&key).is_some_and(|r| r.attempt == attempt) {
                    reservations.remove(&key);
                }
                status
            })
            .collect::<Vec<_>>();
        drop(reservations);
        self.released.notify_waiters();
        statuses
    }

    /// Drops whatever this node queued or reserved for `shard`, after it
    /// stopped leading it.
    pub fn forget_shard(&self, shard: u32) {
        for topic in self.topics.lock().expect("topics lock").values() {
            let mut state = topic.state.lock().expect("topic lock");
            let TopicState { ready, queued } = &mut *state;
            ready.retain(|i| {
                let keep = i.shard.shard != shard;
                if !keep {
                    queued.remove(&i.key);
                }
                keep
            });
        }
        self.reservations.lock().expect("reservations lock").retain(|_, r| r.shard != shard);
    }

    /// Ready (not reserved) timers per topic, for metrics and status.
    pub fn ready_counts(&self) -> Vec<(String, String, usize)> {
        self.topics
            .lock()
            .expect("topics lock")
            .iter()
            .map(|((ns, t), topic)| (ns.clone(), t.clone(), topic.state.lock().expect("topic lock").ready.len()))
            .collect()
    }
}

/// Puts `items` back at the front of `topic`'s queue, in order.
fn requeue(topic: &Topic, items: Vec<Item>) {
    if items.is_empty() {
        return;
    }
    let mut state = topic.state.lock().expect("topic lock");
    for item in items.into_iter().rev() {
        // Already queued again: a newer offer came meanwhile, and the
        // queued item reserves the newest attempt.
        if state.note(&item.key, (item.fire_index, item.attempt, item.due_ms)) {
            state.ready.push_front(item);
        }
    }
}

fn take(topic: &Topic, n: usize) -> Vec<Item> {
    let mut state = topic.state.lock().expect("topic lock");
    let mut out = Vec::with_capacity(n.min(state.ready.len()));
    while out.len() < n {
        let Some(mut item) = state.ready.pop_front() else { break };
        if let Some((fire_index, attempt, due_ms)) = state.queued.remove(&item.key) {
            (item.fire_index, item.attempt, item.due_ms) = (fire_index, attempt, due_ms);
        }
        out.push(item);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_cut_into_messages_under_the_byte_bound_in_order() {
        use prost::Message;
        let delivery = |i: usize, payload: usize| pb::Delivery {
            id: format!("t{i}"),
            payload: vec![7u8; payload].into(),
            ..Default::default()
        };
        // 256 deliveries of 64 KiB, the default batch at the default payload
        // limit: 16 MiB in one message before.
        let batch: Vec<_> = (0..256).map(|i| delivery(i, 64 * 1024)).collect();
        let messages = split_by_encoded_size(batch, RESERVE_MESSAGE_MAX_BYTES);
        assert!(messages.len() >= 6, "{} messages", messages.len());
        let mut ids = Vec::new();
        for m in &messages {
            let encoded = pb::ReserveResponse { deliveries: m.clone() }.encoded_len();
            assert!(encoded <= RESERVE_MESSAGE_MAX_BYTES, "{encoded} bytes");
            ids.extend(m.iter().map(|d| d.id.clone()));
        }
        assert_eq!(ids, (0..256).map(|i| format!("t{i}")).collect::<Vec<_>>(), "all of them, in order");
        // A delivery over the bound travels alone; small ones share one message.
        let messages = split_by_encoded_size(vec![delivery(0, 10), delivery(1, 2_000), delivery(2, 10)], 1_000);
        assert_eq!(messages.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1]);
        let messages = split_by_encoded_size((0..10).map(|i| delivery(i, 10)).collect(), 1_000);
        assert_eq!(messages.len(), 1);
        assert!(split_by_encoded_size(Vec::new(), 1_000).is_empty());
    }

    #[test]
    fn empty_unwatched_topics_are_forgotten_past_the_bound() {
        let hub = PullHub::new(DeliveryConfig::default());
        let watched = hub.topic("ns", "watched");
        for i in 0..MAX_TOPICS + 50 {
            drop(hub.topic("ns", &format!("t{i}")));
        }
        let topics = hub.topics.lock().unwrap();
        assert!(topics.len() <= MAX_TOPICS, "{} topics kept", topics.len());
        // A topic a consumer holds is never forgotten.
        assert!(Arc::ptr_eq(&topics[&("ns".to_string(), "watched".to_string())], &watched));
    }

    /// Found by the simulation (seed 23): a reservation whose reply was lost
    /// goes back to the queue, but it did apply; when it runs out, the offer
    /// of the next attempt found the stale copy queued and was dropped, the
    /// stale copy's reservation was then refused, and nothing offered the
    /// timer again. The queue must reserve the newest attempt offered.
    #[test]
    fn an_offer_for_a_queued_timer_updates_the_attempt_it_reserves() {
        let mut state = TopicState::default();
        let key = TimerKey::new("ns", "t");
        assert!(state.note(&key, (0, 0, 7)), "the scheduled offer queues it");
        assert!(!state.note(&key, (10, 1, 0)), "a second offer does not queue it twice");
        assert_eq!(state.queued[&key], (10, 1, 0), "its firing is newer than the scheduled offer");
        assert!(!state.note(&key, (25, 2, 0)), "the next attempt");
        assert_eq!(state.queued[&key], (25, 2, 0), "the newer attempt is what gets reserved");
        assert!(!state.note(&key, (10, 1, 0)), "a late retry of the older attempt");
        assert_eq!(state.queued[&key], (25, 2, 0), "an older attempt never replaces a newer one");
        assert!(!state.note(&key, (0, 0, 7)), "a late retry of the scheduled offer");
        assert_eq!(state.queued[&key], (25, 2, 0), "nor does the scheduled offer it came from");
    }
}
