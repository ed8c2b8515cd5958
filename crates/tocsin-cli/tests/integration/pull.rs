//! Pull delivery: a consumer that dies without acking has its reservations
//! handed to another after the time-to-run; and, as for webhooks, timers
//! survive a kill -9 of the node mid-way, cancelled ones never arrive, and
//! none arrives early.

use std::collections::HashMap;
use std::collections::HashSet;
use std::time::Duration;

use tocsin_client::Client;
use tocsin_client::ClientOptions;
use tocsin_client::v1 as pb;

use crate::support::DueWindow;
use crate::support::Fate;
use crate::support::NodeProcess;
use crate::support::create_and_cancel_fifth;
use crate::support::now_ms;
use crate::support::percentiles;

fn refs(batch: &pb::ReserveResponse) -> Vec<pb::DeliveryRef> {
    batch
        .deliveries
        .iter()
        .map(|d| pb::DeliveryRef {
            namespace: d.namespace.clone(),
            id: d.id.clone(),
            fire_id: d.fire_id.clone(),
            attempt: d.attempt,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unacked_reservations_are_redelivered_after_ttr() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();

    // Phase: 200 pull timers due in a second.
    let due = now_ms() + 1_000;
    let reqs: Vec<_> = (0..200).map(|i| tocsin_client::pull_timer("ttr", &format!("p-{i}"), due, "jobs")).collect();
    assert!(client.create_timers(reqs).await.iter().all(Result::is_ok));

    // Phase: consumer A reserves with a 1 s time-to-run and dies without acking.
    let reserve = |ttr_ms| pb::ReserveRequest {
        namespace: "ttr".into(),
        topic: "jobs".into(),
        ttr_ms,
        max_batch: 500,
        max_in_flight: 1000,
    };
    let mut a = client.reserve(reserve(1_000)).await.unwrap();
    let mut taken_by_a = HashSet::new();
    let deadline = now_ms() + 10_000;
    while taken_by_a.len() < 200 && now_ms() < deadline {
        if let Ok(Some(batch)) = tokio::time::timeout(Duration::from_secs(2), a.recv()).await {
            for d in &batch.deliveries {
                assert_eq!(d.attempt, 1);
                assert!(d.reserved_until_ms > now_ms());
                taken_by_a.insert(d.id.clone());
            }
        }
    }
    assert_eq!(taken_by_a.len(), 200, "consumer A got everything");
    let reserved_at = now_ms();
    drop(a);

    // Phase: consumer B gets every timer again once A's reservations run out,
    // as attempt 2, and acks them.
    let mut b = client.reserve(reserve(30_000)).await.unwrap();
    let mut got = HashMap::new();
    let deadline = now_ms() + 15_000;
    while got.len() < 200 && now_ms() < deadline {
        if let Ok(Some(batch)) = tokio::time::timeout(Duration::from_secs(2), b.recv()).await {
            for d in &batch.deliveries {
                got.insert(d.id.clone(), (d.attempt, now_ms()));
            }
            let results = client.ack(refs(&batch)).await.unwrap();
            assert!(results.iter().all(|r| r.status == pb::ack_result::Status::Ok as i32), "{results:?}");
        }
    }
    assert_eq!(
        got.len(),
        200,
        "every timer came back to consumer B (waited {} ms after A left)",
        now_ms().saturating_sub(reserved_at)
    );
    assert!(
        got.values().all(|(attempt, _)| *attempt == 2),
        "attempts: {:?}",
        got.values().map(|(a, _)| *a).collect::<std::collections::BTreeSet<_>>()
    );
    let first_redelivery = got.values().map(|(_, t)| *t).min().unwrap();
    assert!(first_redelivery >= reserved_at + 900, "redelivered only after the time-to-run");

    // Phase: an ack for A's expired attempt is stale, and the timers are DELIVERED.
    let stale = client
        .ack(vec![pb::DeliveryRef {
            namespace: "ttr".into(),
            id: "p-0".into(),
            fire_id: client.get_timer("ttr", "p-0").await.unwrap().fire.unwrap().fire_id,
            attempt: 1,
        }])
        .await
        .unwrap();
    assert_eq!(stale[0].status, pb::ack_result::Status::Stale as i32);
    for i in [0, 99, 199] {
        let t = client.get_timer("ttr", &format!("p-{i}")).await.unwrap();
        assert_eq!(t.state, pb::timer::State::Delivered as i32);
        assert_eq!(t.fire.unwrap().attempt, 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pull_timers_survive_kill_9() {
    const TOTAL: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let mut node = NodeProcess::start(dir.path(), &[]);
    let options = ClientOptions { request_timeout: Duration::from_secs(3), max_attempts: 20, ..Default::default() };
    let client = Client::with_options([node.grpc.clone()], options).await.unwrap();

    // Phase: a consumer that acks everything it gets, recording first receipt.
    let received: std::sync::Arc<std::sync::Mutex<HashMap<String, (u64, u64)>>> = Default::default();
    {
        let client = client.clone();
        let received = received.clone();
        tokio::spawn(async move {
            let mut rx = client
                .reserve(pb::ReserveRequest {
                    namespace: "pull".into(),
                    topic: "q".into(),
                    ttr_ms: 5_000,
                    max_batch: 500,
                    max_in_flight: 20_000,
                })
                .await
                .unwrap();
            while let Some(batch) = rx.recv().await {
                let now = now_ms();
                {
                    let mut r = received.lock().unwrap();
                    for d in &batch.deliveries {
                        r.entry(d.id.clone()).or_insert((now, d.fire_at_ms));
                    }
                }
                let client = client.clone();
                tokio::spawn(async move { client.ack(refs(&batch)).await });
            }
        });
    }

    // Phase: create timers due 2-10 s ahead and cancel every fifth, while the
    // node is killed and restarted.
    let base = now_ms();
    let window = DueWindow { base_ms: base, from_ms: 2_000, span_ms: 8_000, total: TOTAL };
    let reqs: Vec<pb::CreateTimerRequest> =
        (0..TOTAL).map(|i| tocsin_client::pull_timer("pull", &format!("t-{i}"), window.fire_at(i), "q")).collect();
    let fates_list: Vec<(String, Option<bool>)> = create_and_cancel_fifth(&client, reqs)
        .await
        .into_iter()
        .map(|(id, fate, _)| {
            (
                id,
                match fate {
                    Fate::MustFire => Some(true),
                    Fate::Cancelled => Some(false),
                    Fate::Unknown => None,
                },
            )
        })
        .collect();
    let created_in_ms = now_ms() - base;
    println!("created and cancelled in {created_in_ms} ms");
    window.kill_point().await;
    node.kill9();
    let killed_at = now_ms();
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.restart();
    let restarted_at = now_ms();
    let fates = fates_list;

    // Phase: wait for every timer that must fire, then check.
    let must: Vec<&String> = fates.iter().filter(|(_, f)| *f == Some(true)).map(|(id, _)| id).collect();
    let deadline = now_ms() + 30_000;
    while now_ms() < deadline {
        if must.iter().all(|id| received.lock().unwrap().contains_key(*id)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let received = received.lock().unwrap().clone();
    let lost: Vec<&&String> = must.iter().filter(|id| !received.contains_key(**id)).collect();
    let cancelled_received: Vec<&String> =
        fates.iter().filter(|(id, f)| *f == Some(false) && received.contains_key(id)).map(|(id, _)| id).collect();
    let early: Vec<&String> = received.iter().filter(|(_, (recv, fire_at))| recv < fire_at).map(|(id, _)| id).collect();
    println!(
        "pull: must fire {}, cancelled {}, unknown {}, received {}",
        must.len(),
        fates.iter().filter(|(_, f)| *f == Some(false)).count(),
        fates.iter().filter(|(_, f)| f.is_none()).count(),
        received.len()
    );
    println!(
        "pull lateness over the run: {}",
        percentiles(received.values().map(|(r, f)| r.saturating_sub(*f)).collect())
    );
    let outage: Vec<u64> = received
        .values()
        .filter(|(_, f)| *f >= killed_at.saturating_sub(500) && *f <= restarted_at)
        .map(|(r, f)| r.saturating_sub((*f).max(restarted_at)))
        .collect();
    println!("pull lateness after restart for timers due during the outage: {}", percentiles(outage));
    assert!(
        lost.is_empty(),
        "{} acknowledged pull timers never delivered, e.g. {:?}\n{}",
        lost.len(),
        &lost[..lost.len().min(5)],
        node.log()
    );
    assert!(cancelled_received.is_empty(), "cancelled yet delivered: {cancelled_received:?}");
    assert!(early.is_empty(), "delivered early: {early:?}");
}

/// Finding 4 of issue 10, measured as a new user did: 5,000 pull timers due
/// in the same second; twenty times a consumer opens `Reserve` (ttr 2 s,
/// max_batch 10, max_in_flight 1000), reads one message and closes the
/// stream; then a consumer acks everything. Reservations the leavers never
/// saw used to stay FIRING for good; every timer must now come back within
/// its time-to-run (plus a second) and be delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_that_leave_mid_batch_strand_nothing() {
    use tocsin_client::v1::timer_service_client::TimerServiceClient;
    const TOTAL: usize = 5_000;
    const TTR_MS: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();

    let due = now_ms() + 1_500;
    for chunk in (0..TOTAL).collect::<Vec<_>>().chunks(1000) {
        let reqs = chunk.iter().map(|i| tocsin_client::pull_timer("leavers", &format!("p-{i}"), due, "jobs")).collect();
        assert!(client.create_timers(reqs).await.iter().all(Result::is_ok));
    }
    tokio::time::sleep(Duration::from_millis((due + 300).saturating_sub(now_ms()))).await;

    // Phase: twenty consumers each read one message and leave.
    let reserve = |ttr_ms, max_batch, max_in_flight| pb::ReserveRequest {
        namespace: "leavers".into(),
        topic: "jobs".into(),
        ttr_ms,
        max_batch,
        max_in_flight,
    };
    let mut left_with = 0;
    for _ in 0..20 {
        let mut raw = TimerServiceClient::connect(format!("http://{}", node.grpc)).await.unwrap();
        let mut stream = raw.reserve(reserve(TTR_MS, 10, 1000)).await.unwrap().into_inner();
        let first = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
        left_with += first.deliveries.len();
        drop(stream);
    }
    let left_at = now_ms();
    println!("twenty consumers left holding {left_with} deliveries they read");

    // Phase: a consumer that acks everything, for at most 20 s.
    let mut good = client.reserve(reserve(30_000, 500, 20_000)).await.unwrap();
    let mut received: HashMap<String, u64> = HashMap::new();
    let deadline = now_ms() + 20_000;
    while received.len() < TOTAL && now_ms() < deadline {
        if let Ok(Some(batch)) = tokio::time::timeout(Duration::from_secs(1), good.recv()).await {
            let now = now_ms();
            for d in &batch.deliveries {
                received.entry(d.id.clone()).or_insert(now);
            }
            let results = client.ack(refs(&batch)).await.unwrap();
            assert!(results.iter().all(|r| r.status == pb::ack_result::Status::Ok as i32), "{results:?}");
        }
    }
    let last = received.values().copied().max().unwrap_or(0);
    println!(
        "delivered {} of {TOTAL}; the last {} ms after the leavers left (ttr {TTR_MS} ms)",
        received.len(),
        last.saturating_sub(left_at)
    );
    assert_eq!(received.len(), TOTAL, "stranded: {} timers never offered again", TOTAL - received.len());
    assert!(last <= left_at + TTR_MS + 1_000, "the last one came {} ms after the leavers left", last - left_at);
    for i in [0, 2_499, 4_999] {
        let t = client.get_timer("leavers", &format!("p-{i}")).await.unwrap();
        assert_eq!(t.state, pb::timer::State::Delivered as i32, "p-{i}");
    }
}

/// A consumer never holds more unacked reservations than its
/// `max_in_flight` (found by the Python reproduction of issue 10: a window
/// of 10 held 40, one batch per slot being recorded), and an ack opens the
/// window again: the next batch follows the ack, the consumer asks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_holds_at_most_its_window_and_an_ack_reopens_it() {
    use tocsin_client::v1::timer_service_client::TimerServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    let due = now_ms() + 500;
    let reqs = (0..200).map(|i| tocsin_client::pull_timer("window", &format!("w-{i}"), due, "jobs")).collect();
    assert!(client.create_timers(reqs).await.iter().all(Result::is_ok));
    tokio::time::sleep(Duration::from_millis((due + 500).saturating_sub(now_ms()))).await;

    let mut raw = TimerServiceClient::connect(format!("http://{}", node.grpc)).await.unwrap();
    let request = pb::ReserveRequest {
        namespace: "window".into(),
        topic: "jobs".into(),
        ttr_ms: 60_000,
        max_batch: 10,
        max_in_flight: 10,
    };
    let mut stream = raw.reserve(request).await.unwrap().into_inner();
    // Phase: read without acking for 1.5 s: never more than the window.
    let mut held = Vec::new();
    while let Ok(Ok(Some(batch))) = tokio::time::timeout(Duration::from_millis(1_500), stream.message()).await {
        held.extend(batch.deliveries);
    }
    assert_eq!(held.len(), 10, "a window of 10 held {} unacked reservations", held.len());

    // Phase: ack them; the next ten follow.
    let results = client.ack(refs(&pb::ReserveResponse { deliveries: held.clone() })).await.unwrap();
    assert!(results.iter().all(|r| r.status == pb::ack_result::Status::Ok as i32), "{results:?}");
    let next = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
    assert!(!next.deliveries.is_empty() && next.deliveries.len() <= 10, "{}", next.deliveries.len());
    assert!(next.deliveries.iter().all(|d| held.iter().all(|h| h.id != d.id)), "an acked timer came again");
}
