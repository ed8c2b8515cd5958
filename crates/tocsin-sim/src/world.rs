//! One seed's simulated world: three nodes, a webhook receiver, a pull
//! consumer and a client as turmoil hosts; the fault schedule applied
//! between simulation steps; the history the checker judges.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tocsin_core::Callback;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::FireTime;
use tocsin_core::RetryPolicy;
use tocsin_core::TimerKey;
use tocsin_core::TimerSpec;

use crate::net;
use crate::net::ClientReply;
use crate::net::Delivery;
use crate::net::Request;
use crate::net::Response;
use crate::plan;
use crate::plan::Fault;
use crate::plan::Op;
use crate::plan::OpKind;
use crate::plan::Plan;
use crate::plan::Rng;
use crate::store::Durable;

/// Simulated time zero, as a unix time in ms.
pub const BASE_MS: u64 = 1_700_000_000_000;
/// turmoil's tick: the resolution of simulated time.
pub const TICK_MS: u64 = 1;

/// True (simulated) time now, as unix ms: what the checker measures with.
pub fn true_now_ms() -> u64 {
    BASE_MS + turmoil::sim_elapsed().expect("inside the simulation").as_millis() as u64
}

/// Test-only knobs that break the system on purpose, so the tests can show
/// the checker catches it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Knobs {
    /// The leader's fire clock and stamps run this far ahead of its clock.
    pub early_ms: u64,
    /// The leader never starts a second attempt (no re-offer after a
    /// deadline, a backoff or a lapsed reservation).
    pub no_redelivery: bool,
    /// The leader sends an armed attempt at its start without asking the
    /// stamp fence or reading the applied log since it was armed (so a
    /// cancel applied meanwhile does not stop it).
    pub arm_unfenced: bool,
}

#[derive(Clone, Debug)]
pub enum OpOutcome {
    Applied {
        index: u64,
        result: Box<CommandResult>,
    },
    Unknown,
    /// Not attempted (a reschedule without a known generation).
    Skipped,
}

#[derive(Clone, Debug)]
pub struct OpRecord {
    pub op: Op,
    pub outcome: OpOutcome,
    /// Some attempt's outcome was unknown (it may have applied).
    pub any_unknown: bool,
    /// True time of the answer.
    pub ack_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    Webhook,
    Pull,
}

#[derive(Clone, Debug)]
pub struct Received {
    pub delivery: Delivery,
    pub recv_ms: u64,
    pub channel: Channel,
    /// 200 accepted (pull: processed), 409 stale epoch, 503 receiver down.
    pub status: u16,
}

#[derive(Default)]
pub struct History {
    pub ops: Vec<OpRecord>,
    pub received: Vec<Received>,
    /// `(node, epoch, true ms)` of every leader that established itself.
    pub epochs: Vec<(u64, u64, u64)>,
}

struct ReceiverState {
    down: bool,
    max_epoch: u64,
    rng: Rng,
}

/// What the hosts share with the test: durable node state, faults in force,
/// the history.
pub struct Shared {
    pub seed: u64,
    pub knobs: Knobs,
    pub durable: Vec<Arc<Mutex<Durable>>>,
    offsets_ms: Mutex<[i64; 3]>,
    receiver: Mutex<ReceiverState>,
    receiver_drop_permille: u64,
    pub history: Mutex<History>,
}

impl Shared {
    pub fn clock_offset_ms(&self, node: u64) -> i64 {
        self.offsets_ms.lock().unwrap()[(node - 1) as usize]
    }

    pub fn note_epoch(&self, node: u64, epoch: u64) {
        self.history.lock().unwrap().epochs.push((node, epoch, true_now_ms()));
    }

    /// The webhook receiver: fences on the epoch per shard (one shard here),
    /// fails while down, and sometimes drops its reply after accepting.
    fn receive(&self, d: Delivery) -> Option<Response> {
        let recv_ms = true_now_ms();
        let mut r = self.receiver.lock().unwrap();
        let status = if r.down {
            503
        } else if d.epoch < r.max_epoch {
            409
        } else {
            r.max_epoch = d.epoch;
            200
        };
        let drop_reply = status == 200 && r.rng.chance(self.receiver_drop_permille);
        drop(r);
        self.history.lock().unwrap().received.push(Received {
            delivery: d,
            recv_ms,
            channel: Channel::Webhook,
            status,
        });
        if drop_reply { None } else { Some(Response::Delivered(status)) }
    }
}

fn sleep_until_sim_ms(at_ms: u64) -> tokio::time::Sleep {
    let now = turmoil::sim_elapsed().expect("inside the simulation").as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(at_ms.saturating_sub(now)))
}

async fn receiver(shared: Arc<Shared>) -> turmoil::Result {
    let handler = move |request: Request| {
        let shared = shared.clone();
        async move {
            match request {
                Request::Deliver(d) => shared.receive(d),
                _ => None,
            }
        }
    };
    net::serve(net::RECEIVER_PORT, handler).await?;
    Ok(())
}

/// A pull consumer: reserves small batches, processes them one by one, and
/// sometimes crashes part-way (what it had not processed is never acked and
/// must come back once the reservation runs out).
async fn consumer(shared: Arc<Shared>, crash_permille: u64) -> turmoil::Result {
    let mut rng = Rng::new(shared.seed ^ 0xc0ffee);
    let mut node = 1u64;
    loop {
        let now = turmoil::sim_elapsed().unwrap().as_millis() as u64;
        if now >= plan::END_MS {
            return Ok(());
        }
        let reply = net::call(
            &net::node_host(node),
            net::NODE_PORT,
            &Request::Reserve { max: 4, ttr_ms: 3_000 },
            Duration::from_secs(1),
        )
        .await;
        let batch = match reply {
            Ok(Response::Reserved(batch)) => batch,
            _ => Vec::new(),
        };
        if batch.is_empty() {
            node = node % 3 + 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let crash_at = rng.chance(crash_permille).then(|| rng.range(0, batch.len() as u64) as usize);
        for (i, d) in batch.into_iter().enumerate() {
            if crash_at == Some(i) {
                // Crashed: the rest of the batch is never processed nor acked.
                tokio::time::sleep(Duration::from_millis(rng.range(200, 1_500))).await;
                break;
            }
            let ack = Request::Ack { key: d.key.clone(), fire_index: d.fire_index, attempt: d.attempt };
            shared.history.lock().unwrap().received.push(Received {
                delivery: d,
                recv_ms: true_now_ms(),
                channel: Channel::Pull,
                status: 200,
            });
            let _ = net::call(&net::node_host(node), net::NODE_PORT, &ack, Duration::from_secs(1)).await;
        }
    }
}

struct ClientState {
    /// The generation each timer has, as far as the client knows.
    generations: BTreeMap<TimerKey, u64>,
    leader: u64,
}

fn command_for(op: &Op, generations: &BTreeMap<TimerKey, u64>) -> Option<Command> {
    Some(match &op.kind {
        OpKind::Create { fire_at_ms, pull } => {
            let fire_at_ms = BASE_MS + fire_at_ms;
            let callback = if *pull {
                Callback::Pull { topic: "jobs".into(), ttr_ms: 0 }
            } else {
                Callback::Webhook { url: "http://recv/hook".into() }
            };
            // Effectively unlimited attempts: I1 asks for a delivery of every
            // acknowledged timer, however long the receiver is down.
            let retry = RetryPolicy {
                max_attempts: 10_000,
                initial_backoff_ms: 200,
                max_backoff_ms: 2_000,
                give_up_after_ms: 0,
            };
            let spec = TimerSpec {
                fire_time: FireTime::At(fire_at_ms),
                payload: bytes::Bytes::from_static(b"x"),
                labels: BTreeMap::new(),
                callback,
                retry,
                skip_if_late_ms: 0,
                recurrence: None,
            };
            Command::Create {
                key: op.key.clone(),
                spec: Box::new(spec),
                fire_at_ms,
                retry,
                retention_ms: 3_600_000,
                replace_finished: false,
            }
        }
        OpKind::Cancel => Command::Cancel { key: op.key.clone() },
        OpKind::Reschedule { fire_at_ms } => Command::Reschedule {
            key: op.key.clone(),
            expected_generation: *generations.get(&op.key)?,
            fire_at_ms: BASE_MS + fire_at_ms,
        },
    })
}

/// Runs one op: tries nodes until one answers definitively (creates and
/// cancels are idempotent, so an unknown outcome is retried).
async fn run_op(shared: Arc<Shared>, state: Arc<Mutex<ClientState>>, op: Op) {
    sleep_until_sim_ms(op.at_ms).await;
    let Some(command) = command_for(&op, &state.lock().unwrap().generations) else {
        shared.history.lock().unwrap().ops.push(OpRecord {
            op,
            outcome: OpOutcome::Skipped,
            any_unknown: false,
            ack_ms: true_now_ms(),
        });
        return;
    };
    let mut node = state.lock().unwrap().leader;
    let mut any_unknown = false;
    let mut outcome = OpOutcome::Unknown;
    for attempt in 0..12 {
        let request = Request::Client { command: command.clone(), drop_reply: op.drop_reply && attempt == 0 };
        let reply = net::call(&net::node_host(node), net::NODE_PORT, &request, Duration::from_secs(4)).await;
        match reply {
            Ok(Response::Client(ClientReply::Applied { index, result })) => {
                if any_unknown
                    && let (OpKind::Reschedule { .. }, CommandResult::GenerationMismatch { .. }) = (&op.kind, &*result)
                {
                    // Perhaps our own earlier attempt moved the generation on.
                    break;
                }
                let mut s = state.lock().unwrap();
                s.leader = node;
                if let CommandResult::Created { record, .. } | CommandResult::Rescheduled { record } = &*result {
                    s.generations.insert(op.key.clone(), record.generation);
                }
                outcome = OpOutcome::Applied { index, result };
                break;
            }
            Ok(Response::Client(ClientReply::NotLeader { leader })) => {
                node = leader.filter(|l| *l != node).unwrap_or(node % 3 + 1);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(Response::Client(ClientReply::NoQuorum)) => {
                node = node % 3 + 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => {
                any_unknown = true;
                node = node % 3 + 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    shared.history.lock().unwrap().ops.push(OpRecord { op, outcome, any_unknown, ack_ms: true_now_ms() });
}

async fn client(shared: Arc<Shared>, ops: Vec<Op>) -> turmoil::Result {
    let state = Arc::new(Mutex::new(ClientState { generations: BTreeMap::new(), leader: 1 }));
    let tasks: Vec<_> =
        ops.into_iter().map(|op| crate::types::spawn(run_op(shared.clone(), state.clone(), op))).collect();
    for t in tasks {
        t.await?;
    }
    sleep_until_sim_ms(plan::END_MS).await;
    Ok(())
}

/// Every node's `(last_applied index, digest)` at the end.
pub type FinalStates = Vec<(u64, u64)>;

thread_local! {
    /// Panics in this thread's simulation (tokio catches a task's panic; the
    /// hook still sees it).
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.borrow_mut().push(info.to_string()));
            previous(info);
        }));
    });
}

/// What one seed's run left for the checker.
pub struct RunOutput {
    pub plan: Plan,
    pub history: History,
    pub finals: FinalStates,
    pub panics: Vec<String>,
    /// Largest clock offset ahead of true time any node had.
    pub max_ahead_ms: u64,
    /// Each timer's final record on the first node, for the reports.
    pub final_records: BTreeMap<TimerKey, String>,
}

/// Runs one seed's plan to the end.
pub fn run(seed: u64, knobs: Knobs) -> RunOutput {
    install_panic_hook();
    PANICS.with(|p| p.borrow_mut().clear());
    let plan = Plan::generate(seed);
    let shared = Arc::new(Shared {
        seed,
        knobs,
        durable: (0..3).map(|_| Arc::default()).collect(),
        offsets_ms: Mutex::new([0; 3]),
        receiver: Mutex::new(ReceiverState { down: false, max_epoch: 0, rng: Rng::new(seed ^ 0xbeef) }),
        receiver_drop_permille: plan.receiver_drop_permille,
        history: Mutex::default(),
    });
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_millis(plan::END_MS + 30_000))
        .tick_duration(Duration::from_millis(TICK_MS))
        .min_message_latency(Duration::from_millis(0))
        .max_message_latency(Duration::from_millis(2))
        .tcp_capacity(1 << 16)
        .rng_seed(seed)
        .build();
    for id in 1..=3u64 {
        let shared = shared.clone();
        let incarnation = Arc::new(AtomicU64::new(0));
        sim.host(net::node_host(id), move || {
            let n = incarnation.fetch_add(1, Ordering::Relaxed);
            let rng_seed = shared.seed.wrapping_mul(31).wrapping_add(id * 1_000 + n);
            crate::types::Runtime::scope(rng_seed, crate::node::run(shared.clone(), id, n))
        });
    }
    {
        let shared = shared.clone();
        sim.host("recv", move || crate::types::Runtime::scope(seed ^ 7, receiver(shared.clone())));
    }
    sim.client(
        "consumer",
        crate::types::Runtime::scope(seed ^ 11, consumer(shared.clone(), plan.consumer_crash_permille)),
    );
    sim.client("client", crate::types::Runtime::scope(seed ^ 13, client(shared.clone(), plan.ops.clone())));

    let mut faults = plan.faults.iter().peekable();
    let mut crashed = [false; 3];
    let healed = AtomicBool::new(false);
    let mut max_ahead_ms = 0u64;
    let all_hosts = ["n1", "n2", "n3", "recv", "client", "consumer"];
    loop {
        let now = sim.elapsed().as_millis() as u64;
        while let Some((at, fault)) = faults.peek() {
            if *at > now {
                break;
            }
            match fault {
                Fault::Partition { a, b, oneway: true } => sim.partition_oneway(a.as_str(), b.as_str()),
                Fault::Partition { a, b, oneway: false } => sim.partition(a.as_str(), b.as_str()),
                Fault::Repair { a, b } => sim.repair(a.as_str(), b.as_str()),
                Fault::Crash(n) => {
                    if !crashed[(*n - 1) as usize] {
                        crashed[(*n - 1) as usize] = true;
                        sim.crash(net::node_host(*n));
                    }
                }
                Fault::Restart(n) => {
                    if crashed[(*n - 1) as usize] {
                        crashed[(*n - 1) as usize] = false;
                        sim.bounce(net::node_host(*n));
                    }
                }
                Fault::Latency { a, b, ms } => {
                    sim.set_link_max_message_latency(a.as_str(), b.as_str(), Duration::from_millis(*ms))
                }
                Fault::Clock { node, offset_ms } => {
                    shared.offsets_ms.lock().unwrap()[(*node - 1) as usize] = *offset_ms;
                    max_ahead_ms = max_ahead_ms.max((*offset_ms).max(0) as u64);
                }
                Fault::ReceiverDown(down) => shared.receiver.lock().unwrap().down = *down,
            }
            faults.next();
        }
        if now >= plan::HEAL_AT_MS && !healed.swap(true, Ordering::Relaxed) {
            for (i, a) in all_hosts.iter().enumerate() {
                for b in &all_hosts[i + 1..] {
                    sim.repair(*a, *b);
                    sim.set_link_max_message_latency(*a, *b, Duration::from_millis(2));
                }
            }
            for (i, c) in crashed.iter_mut().enumerate() {
                if *c {
                    *c = false;
                    sim.bounce(net::node_host(i as u64 + 1));
                }
            }
            *shared.offsets_ms.lock().unwrap() = [0; 3];
            shared.receiver.lock().unwrap().down = false;
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                PANICS.with(|p| p.borrow_mut().push(format!("simulation error: {e}")));
                break;
            }
        }
    }
    // I7 is judged once the replicas had a moment to agree after the run.
    let finals = |shared: &Shared| -> FinalStates {
        shared
            .durable
            .iter()
            .map(|d| {
                let d = d.lock().unwrap();
                (d.sm.applied_index(), d.sm.digest())
            })
            .collect()
    };
    for _ in 0..3_000 {
        let f = finals(&shared);
        if f.iter().all(|x| *x == f[0]) {
            break;
        }
        if sim.step().is_err() {
            break;
        }
    }
    let finals = finals(&shared);
    let panics = PANICS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let final_records = shared.durable[0]
        .lock()
        .unwrap()
        .sm
        .table
        .timers
        .iter()
        .map(|(k, r)| (k.clone(), format!("{:?} fire_at +{} ms {:?}", r.state, r.fire_at_ms - BASE_MS, r.fire)))
        .collect();
    drop(sim);
    let history = std::mem::take(&mut *shared.history.lock().unwrap());
    RunOutput { plan, history, finals, panics, max_ahead_ms, final_records }
}
