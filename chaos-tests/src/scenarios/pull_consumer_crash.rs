//! `pull-consumer-crash`: pull consumers that die mid-batch.
//!
//! `--pull-timers` (3,000) pull timers (topic `crash`) fall due in the same
//! second. Twenty consumers in a row open a `Reserve` stream (time-to-run
//! 2 s, batches of 10, at most 1,000 in flight), take one message and drop
//! the stream without acking; then a well-behaved consumer reserves with
//! the same options and acks everything, fencing by epoch like a webhook
//! receiver, for up to 30 s. The webhook load runs throughout.
//!
//! Every pull timer must be acked at least once (I1, over the consumer's
//! records as well as the sink's), and each must reach the good consumer
//! within its time-to-run plus 1 s after its due time or the good
//! consumer's start, whichever is later. Timers the good consumer never
//! got are reported as stranded (never offered again).

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;
use std::time::Instant;

use futures::future::BoxFuture;
use tocsin_client::Client;
use tocsin_client::v1 as pb;
use tocsin_contract::Verdict;

use crate::check;
use crate::check::Delivery;
use crate::check::Report;
use crate::driver;
use crate::driver::NAMESPACE;
use crate::driver::chaos_retry;
use crate::driver::now_ms;
use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;

pub struct PullConsumerCrash;

const TOPIC: &str = "crash";
const TTR_MS: u64 = 2_000;
const CRASHES: usize = 20;
/// How long the good consumer runs at most.
const GOOD_FOR: Duration = Duration::from_secs(30);

fn reserve_request() -> pb::ReserveRequest {
    pb::ReserveRequest {
        namespace: NAMESPACE.into(),
        topic: TOPIC.into(),
        ttr_ms: TTR_MS,
        max_batch: 10,
        max_in_flight: 1_000,
    }
}

impl Scenario for PullConsumerCrash {
    fn name(&self) -> &'static str {
        "pull-consumer-crash"
    }
    fn about(&self) -> &'static str {
        "3,000 pull timers due in one second; 20 consumers take one batch each and die unacked, then one acks all"
    }
    fn bounds(&self) -> Bounds {
        NO_BOUNDS
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let out_path = run.dir.join("pull-deliveries.ndjson");
            run.deliveries.push(out_path.clone());
            let mut out = std::io::BufWriter::new(std::fs::File::create(&out_path)?);
            let n = run.args.pull_timers.max(1);
            let due_ms = now_ms() + 5_000;
            let reqs: Vec<pb::CreateTimerRequest> = (0..n)
                .map(|i| {
                    let mut r = tocsin_client::pull_timer(NAMESPACE, &format!("p-{i}"), due_ms + i * 1_000 / n, TOPIC);
                    r.retry = Some(chaos_retry());
                    r
                })
                .collect();
            let ok = driver::create_all(run.client(), &run.rec, reqs).await;
            println!("    {} pull timers due at +5 s ({} acknowledged)", n, ok.len());
            run.fault_start_ms = Some(due_ms);
            // All due and offered.
            tokio::time::sleep(Duration::from_millis((due_ms + 1_500).saturating_sub(now_ms()))).await;
            let client = run.client().clone();
            let mut abandoned = 0;
            for _ in 0..CRASHES {
                let mut rx = client.reserve(reserve_request()).await?;
                let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
                // The consumer dies: the stream goes away, nothing is acked.
                drop(rx);
                if let Ok(Some(batch)) = got {
                    let recv_ms = now_ms();
                    for d in &batch.deliveries {
                        abandoned += 1;
                        write_line(&mut out, recv_ms, Verdict::Abandoned, d)?;
                    }
                }
            }
            println!("    {CRASHES} consumers died holding {abandoned} deliveries between them");
            let good_start_ms = now_ms();
            run.notes.insert("good_start_ms", good_start_ms);
            let acked = good_consumer(&client, &mut out, ok.len()).await?;
            out.flush()?;
            println!(
                "    the good consumer acked {acked} of {} in {:.1} s",
                ok.len(),
                (now_ms() - good_start_ms) as f64 / 1000.0
            );
            Ok(())
        })
    }
    fn judge<'a>(&'a self, run: &'a mut Run, _report: &'a Report) -> BoxFuture<'a, anyhow::Result<Vec<String>>> {
        Box::pin(async move {
            let mut failures = Vec::new();
            let good_start_ms = run.notes.get("good_start_ms").copied().unwrap_or(0);
            let ops = check::read_ops(&run.ops)?;
            let due: HashMap<&str, u64> = ops
                .iter()
                .filter(|o| o.op == "create" && o.outcome == "ok" && o.id.starts_with("p-"))
                .map(|o| (o.id.as_str(), o.fire_at_ms))
                .collect();
            let got = check::read_deliveries(&run.dir.join("pull-deliveries.ndjson"))?;
            let mut first: HashMap<&str, u64> = HashMap::new();
            for d in got.iter().filter(|d| d.verdict == Verdict::Accepted) {
                first.entry(d.id.as_str()).or_insert(d.recv_ms);
            }
            let stranded = due.keys().filter(|id| !first.contains_key(*id)).count();
            let mut waits = Vec::new();
            let mut late = 0;
            for (id, due_ms) in &due {
                if let Some(recv_ms) = first.get(id) {
                    let wait = recv_ms.saturating_sub((*due_ms).max(good_start_ms));
                    if wait > TTR_MS + 1_000 {
                        late += 1;
                    }
                    waits.push(wait);
                }
            }
            let w = check::Percentiles::of(waits);
            println!(
                "    pull: {} acknowledged creates; {} acked by the good consumer, {stranded} stranded (never offered again)",
                due.len(),
                first.len()
            );
            println!(
                "    pull: wait after max(due, good consumer start): p50 {} ms, p99 {} ms, max {} ms; {late} over TTR + 1 s",
                w.p50_ms, w.p99_ms, w.max_ms
            );
            if stranded > 0 {
                // Where the stranded ones are: did a dying consumer ever see
                // them, and what state does the cluster hold for them?
                let abandoned: std::collections::HashSet<&str> =
                    got.iter().filter(|d| d.verdict == Verdict::Abandoned).map(|d| d.id.as_str()).collect();
                let lost: Vec<&str> = due.keys().filter(|id| !first.contains_key(*id)).copied().collect();
                let seen = lost.iter().filter(|id| abandoned.contains(*id)).count();
                println!(
                    "    pull: {seen} of the stranded were in a batch a dying consumer read; the rest never reached one"
                );
                for id in lost.iter().take(3) {
                    if let Ok(t) = run.client().get_timer(NAMESPACE, id).await {
                        let state = pb::timer::State::try_from(t.state).map_or("?".to_string(), |s| format!("{s:?}"));
                        let f = t.fire.unwrap_or_default();
                        println!(
                            "    pull: {id}: {state}, attempt {}, next attempt at {} ({} ms from now)",
                            f.attempt,
                            f.next_attempt_at_ms,
                            f.next_attempt_at_ms as i64 - now_ms() as i64
                        );
                    }
                }
                failures.push(format!("pull-consumer-crash: {stranded} pull timers stranded (never offered again)"));
            }
            if late > 0 {
                failures.push(format!(
                    "pull-consumer-crash: {late} pull timers reached the good consumer more than TTR + 1 s after it started"
                ));
            }
            Ok(failures)
        })
    }
}

fn write_line(out: &mut impl Write, recv_ms: u64, verdict: Verdict, d: &pb::Delivery) -> anyhow::Result<()> {
    let line = Delivery {
        recv_ms,
        verdict,
        id: d.id.clone(),
        shard: d.shard,
        epoch: d.epoch,
        fire_id: d.fire_id.clone(),
        attempt: d.attempt,
        attempt_index: 0,
        fire_at_ms: d.fire_at_ms,
        path: String::new(),
        status: 0,
    };
    writeln!(out, "{}", serde_json::to_string(&line)?)?;
    Ok(())
}

/// Records a settled batch; counts what was acked.
fn settle(
    (recv_ms, batch, verdicts): (u64, Vec<pb::Delivery>, Vec<Verdict>),
    out: &mut impl Write,
    acked: &mut std::collections::HashSet<String>,
) -> anyhow::Result<()> {
    for (d, verdict) in batch.iter().zip(verdicts) {
        if verdict == Verdict::Accepted {
            acked.insert(d.id.clone());
        }
        write_line(out, recv_ms, verdict, d)?;
    }
    Ok(())
}

/// Reserves and acks until `expected` timers are acked or [`GOOD_FOR`]
/// passes; fences by epoch per shard (a stale delivery is not acked).
/// Returns how many it acked.
async fn good_consumer(client: &Client, out: &mut impl Write, expected: usize) -> anyhow::Result<usize> {
    let until = Instant::now() + GOOD_FOR;
    let mut rx = client.reserve(reserve_request()).await?;
    let mut max_epoch: HashMap<u32, u64> = HashMap::new();
    let mut acks = tokio::task::JoinSet::new();
    let mut acked = std::collections::HashSet::new();
    while acked.len() < expected && Instant::now() < until {
        while let Some(done) = acks.try_join_next() {
            settle(done?, &mut *out, &mut acked)?;
        }
        let left = until.saturating_duration_since(Instant::now()).min(Duration::from_millis(200));
        let Ok(msg) = tokio::time::timeout(left, rx.recv()).await else { continue };
        let Some(batch) = msg else { break };
        let recv_ms = now_ms();
        let mut to_ack = Vec::new();
        let mut stale = Vec::new();
        for d in batch.deliveries {
            let max = max_epoch.entry(d.shard).or_insert(0);
            if d.epoch < *max {
                stale.push(d);
            } else {
                *max = d.epoch;
                to_ack.push(d);
            }
        }
        let verdicts = vec![Verdict::RejectedStale; stale.len()];
        settle((recv_ms, stale, verdicts), &mut *out, &mut acked)?;
        let client = client.clone();
        acks.spawn(async move {
            let refs: Vec<pb::DeliveryRef> = to_ack
                .iter()
                .map(|d| pb::DeliveryRef {
                    namespace: d.namespace.clone(),
                    id: d.id.clone(),
                    fire_id: d.fire_id.clone(),
                    attempt: d.attempt,
                })
                .collect();
            let verdicts: Vec<Verdict> = match client.ack(refs).await {
                Ok(results) => results
                    .iter()
                    .map(|r| match pb::ack_result::Status::try_from(r.status) {
                        Ok(pb::ack_result::Status::Ok) => Verdict::Accepted,
                        Ok(pb::ack_result::Status::Stale) => Verdict::AckStale,
                        _ => Verdict::AckNotFound,
                    })
                    .collect(),
                Err(_) => vec![Verdict::AckFailed; to_ack.len()],
            };
            (recv_ms, to_ack, verdicts)
        });
    }
    drop(rx);
    while let Some(done) = acks.join_next().await {
        settle(done?, &mut *out, &mut acked)?;
    }
    Ok(acked.len())
}
