//! A timer's life past its first fire, against a real node and a receiver
//! that fails on cue: a cancel while its delivery retries stops the
//! retries and says whether an attempt is under way; an id that holds a
//! finished timer refuses a create that would silently do nothing, and
//! starts a new timer (a new generation, new fire ids) when asked to.

use std::time::Duration;

use tocsin_client::Client;
use tocsin_client::v1 as pb;

use crate::support::NodeProcess;
use crate::support::Receiver;
use crate::support::now_ms;

async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + limit;
    while !done() {
        assert!(std::time::Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn retrying(id: &str, url: &str) -> pb::CreateTimerRequest {
    let mut r = tocsin_client::webhook_timer("subs", id, 200, url);
    r.retry = Some(pb::RetryPolicy {
        max_attempts: 1000,
        initial_backoff_ms: 1000,
        max_backoff_ms: 1000,
        ..Default::default()
    });
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_while_retrying_and_replacing_a_finished_id() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.answer(500);
    let node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    let http = tocsin_contract::tls::http_client_builder().build().unwrap();

    // Phase: a timer fires into a failing receiver and retries.
    let req = retrying("renewal", &receiver.url);
    let created = client.create_timer(req.clone()).await.unwrap();
    assert!(created.created);
    wait_for("two failed attempts", Duration::from_secs(10), || receiver.of("renewal").len() >= 2).await;

    // Phase: a cancel now stops it, and says whether an attempt was under
    // way. At most that attempt arrives afterwards.
    let cancel = client.cancel_timer("subs", "renewal").await.unwrap();
    let outcome = pb::cancel_timer_response::Outcome::try_from(cancel.outcome).unwrap();
    assert_eq!(outcome, pb::cancel_timer_response::Outcome::CancelledWhileFiring);
    let timer = cancel.timer.clone().unwrap();
    assert_eq!(timer.state, pb::timer::State::Cancelled as i32);
    let fire = cancel.fire.clone().expect("the fire's facts");
    assert!(fire.attempt >= 2);
    let at_cancel = receiver.of("renewal").len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = receiver.of("renewal").len();
    let allowed = at_cancel + usize::from(cancel.attempt_in_flight);
    assert!(
        after <= allowed,
        "{after} attempts after a cancel at {at_cancel} (attempt_in_flight {})",
        cancel.attempt_in_flight
    );
    println!(
        "cancelled at attempt {} (in flight: {}); {at_cancel} attempts at the cancel, {after} three seconds later",
        fire.attempt, cancel.attempt_in_flight
    );
    let again = client.cancel_timer("subs", "renewal").await.unwrap();
    assert_eq!(again.outcome, pb::cancel_timer_response::Outcome::AlreadyCancelled as i32);

    // Phase: the same create again is refused, unmistakably, over gRPC and
    // over HTTP; nothing is scheduled.
    let err = client.create_timer(req.clone()).await.unwrap_err();
    assert!(err.is_timer_finished(), "{err:?}");
    assert!(err.to_string().contains("CANCELLED"), "{err}");
    let body = serde_json::json!({
        "namespace": "subs", "id": "renewal", "delay_ms": 200,
        "callback": {"webhook": {"url": receiver.url}},
        "retry": {"max_attempts": 1000, "initial_backoff_ms": 1000, "max_backoff_ms": 1000}
    });
    let resp = http.post(format!("http://{}/v1/timers", node.http)).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 412);
    let json: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(json["error"]["code"], "FAILED_PRECONDITION");
    assert_eq!(json["error"]["reason"], "TIMER_FINISHED");
    assert_eq!(client.get_timer("subs", "renewal").await.unwrap().state, pb::timer::State::Cancelled as i32);

    // Phase: asked to, a create starts a new timer under the id: generation
    // 2, and it fires with a fire id of its own.
    receiver.answer(200);
    let mut replace = req.clone();
    replace.replace_finished = true;
    let second = client.create_timer(replace.clone()).await.unwrap();
    assert!(second.created);
    let t = second.timer.unwrap();
    assert_eq!((t.state, t.generation), (pb::timer::State::Scheduled as i32, 2));
    wait_for("the new timer's delivery", Duration::from_secs(10), || {
        receiver.of("renewal").iter().any(|s| s.fire_id != fire.fire_id && s.recv_ms + 10_000 > now_ms())
    })
    .await;
    let new_fire = receiver.of("renewal").into_iter().find(|s| s.fire_id != fire.fire_id).unwrap();
    assert_eq!(new_fire.attempt, 1);
    let mut delivered = false;
    for _ in 0..100 {
        if client.get_timer("subs", "renewal").await.unwrap().state == pb::timer::State::Delivered as i32 {
            delivered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(delivered, "the replacement was recorded as delivered");

    // Phase: delivered is finished too: the same create is refused, a
    // cancel is too late, and the HTTP replace starts generation 3.
    assert!(client.create_timer(req.clone()).await.unwrap_err().is_timer_finished());
    let late = client.cancel_timer("subs", "renewal").await.unwrap();
    assert_eq!(late.outcome, pb::cancel_timer_response::Outcome::AlreadyFired as i32);
    let mut body = body;
    body["replace_finished"] = true.into();
    let resp = http.post(format!("http://{}/v1/timers", node.http)).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 201);
    let json: serde_json::Value = resp.json().await.unwrap();
    assert_eq!((json["created"].as_bool(), json["timer"]["generation"].as_u64()), (Some(true), Some(3)));
}
