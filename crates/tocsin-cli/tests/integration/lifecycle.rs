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
use crate::support::wait_for;

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
    wait_for("two failed attempts", Duration::from_secs(10), async || receiver.of("renewal").len() >= 2).await;

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
    wait_for("the new timer's delivery", Duration::from_secs(10), async || {
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

/// `tocsin timer …` against `node`, its stdout.
fn cli(node: &NodeProcess, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["timer"])
        .args(args)
        .args(["--addr", &node.grpc])
        .output()
        .expect("run tocsin");
    assert!(out.status.success() || out.status.code() == Some(4), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_timers_keep_their_attempts_and_are_redriven() {
    let dir = tempfile::tempdir().unwrap();
    // One receiver (one endpoint) per timer: two failures each stay below
    // the endpoint's circuit breaker threshold, so every attempt is sent.
    let failing = [Receiver::start().await, Receiver::start().await, Receiver::start().await];
    for f in &failing {
        f.answer(500);
    }
    let gone = Receiver::start().await;
    gone.answer(410);
    let node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    let http = tocsin_contract::tls::http_client_builder().build().unwrap();

    // Phase: three timers give up against a 500 after two attempts, one
    // against a 410 after one.
    for (i, receiver) in failing.iter().enumerate() {
        let mut r = tocsin_client::webhook_timer("ops", &format!("retry-{i}"), 100, &receiver.url);
        r.retry = Some(pb::RetryPolicy { max_attempts: 2, initial_backoff_ms: 1000, ..Default::default() });
        client.create_timer(r).await.unwrap();
    }
    client.create_timer(tocsin_client::webhook_timer("ops", "gone-0", 100, &gone.url)).await.unwrap();
    let dead = |reason: &'static str| {
        let client = client.clone();
        async move {
            let req = pb::ListTimersRequest {
                namespace: "ops".into(),
                state: pb::timer::State::Dead as i32,
                dead_reason: reason.into(),
                ..Default::default()
            };
            client.list_timers(req).await.unwrap().timers
        }
    };
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while dead("").await.len() < 4 {
        assert!(std::time::Instant::now() < until, "four timers DEAD");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead("MAX_ATTEMPTS").await.len(), 3);
    let gone_dead = dead("GONE").await;
    assert_eq!(gone_dead.len(), 1);
    assert_eq!(gone_dead[0].fire.as_ref().unwrap().dead_reason, "GONE");

    // Phase: each attempt is in the history: outcome, status, class, a
    // latency, its fire id; over gRPC, HTTP and the CLI.
    let t = client.get_timer_with("ops", "retry-0", true).await.unwrap();
    let seen: Vec<_> =
        t.attempts.iter().map(|a| (a.attempt, a.outcome.as_str(), a.http_status, a.class.as_str())).collect();
    assert_eq!(seen, vec![(1, "FAILED", 500, "5xx"), (2, "FAILED", 500, "5xx")]);
    let first_fire_id = t.attempts[0].fire_id.clone();
    assert_eq!(first_fire_id, t.fire.as_ref().unwrap().fire_id);
    assert!(t.attempts.iter().all(|a| a.finished_at_ms >= a.started_at_ms && a.started_at_ms > 0));
    assert!(client.get_timer("ops", "retry-0").await.unwrap().attempts.is_empty(), "only when asked");
    let body: serde_json::Value = http
        .get(format!("http://{}/v1/timers/ops/gone-0/attempts", node.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["state"], "DEAD");
    assert_eq!(body["attempts"][0]["outcome"], "GAVE_UP");
    assert_eq!(body["attempts"][0]["http_status"], 410);
    let shown = cli(&node, &["get", "ops", "retry-1", "--attempts"]);
    assert!(
        shown.contains("dead_reason=MAX_ATTEMPTS") && shown.contains("#2") && shown.contains("status=500"),
        "{shown}"
    );

    // Phase: one redriven by id (the receiver recovered): generation 2, a
    // new fire id, delivered; its history keeps the old attempts.
    for f in &failing {
        f.answer(200);
    }
    let resp = client.redrive_timers("ops", vec!["retry-0".into(), "nope".into()]).await.unwrap();
    let outcomes: Vec<i32> = resp.results.iter().map(|r| r.outcome).collect();
    use pb::redrive_result::Outcome;
    assert_eq!(outcomes, vec![Outcome::Redriven as i32, Outcome::NotFound as i32]);
    assert_eq!(resp.results[0].timer.as_ref().unwrap().generation, 2);
    wait_for("the redriven delivery", Duration::from_secs(10), async || {
        failing[0].of("retry-0").iter().any(|s| s.fire_id != first_fire_id)
    })
    .await;
    let mut t = client.get_timer_with("ops", "retry-0", true).await.unwrap();
    for _ in 0..100 {
        if t.state == pb::timer::State::Delivered as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        t = client.get_timer_with("ops", "retry-0", true).await.unwrap();
    }
    assert_eq!(t.state, pb::timer::State::Delivered as i32);
    let last = t.attempts.last().unwrap();
    assert_eq!(last.outcome, "DELIVERED");
    assert_ne!(last.fire_id, first_fire_id);
    // The six 500s in a row opened the endpoint's breaker: the new series
    // may have begun with attempts it held, but holds nothing else.
    assert_eq!(t.attempts.iter().filter(|a| a.fire_id == first_fire_id).count(), 2);
    let new_series: Vec<_> = t.attempts.iter().filter(|a| a.fire_id != first_fire_id).collect();
    assert!(new_series[..new_series.len() - 1].iter().all(|a| a.class == "circuit_open"), "{new_series:?}");
    assert_eq!(last.attempt as usize, new_series.len());
    let again = client.redrive_timers("ops", vec!["retry-0".into()]).await.unwrap();
    assert_eq!(again.results[0].outcome, Outcome::NotDead as i32);

    // Phase: the rest in bulk: over HTTP those of one reason, then the CLI
    // for everything left.
    let body: serde_json::Value = http
        .post(format!("http://{}/v1/namespaces/ops:redrive", node.http))
        .json(&serde_json::json!({ "all_dead": true, "dead_reason": "GONE" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((body["redriven"].as_u64(), body["more"].as_bool()), (Some(1), Some(false)), "{body}");
    let out = cli(&node, &["redrive", "ops", "--all-dead"]);
    assert!(out.contains("redriven 2 DEAD timers"), "{out}");
    assert!(dead("").await.len() <= 1, "only gone-0, which the 410 receiver kills again, may be DEAD");
    wait_for("retry-1 and retry-2 delivered", Duration::from_secs(10), async || {
        (1..3).all(|i| failing[i].of(&format!("retry-{i}")).len() >= 3)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_pull_long_polls_acks_nacks_and_honours_a_timers_own_ttr() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    let http = tocsin_contract::tls::http_client_builder().build().unwrap();
    let base = format!("http://{}/v1/namespaces/jobs/topics/close-order", node.http);
    let post = |suffix: &str, body: serde_json::Value| {
        let request = http.post(format!("{base}{suffix}")).json(&body);
        async move {
            let resp = request.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let pull = |id: &str, ttr_ms: u64| {
        let mut r = tocsin_client::pull_timer("jobs", id, now_ms() + 50, "close-order");
        if let Some(pb::callback::Target::Pull(p)) = r.callback.as_mut().and_then(|c| c.target.as_mut()) {
            p.ttr_ms = ttr_ms;
        }
        r
    };

    // Phase: a long poll on an empty topic answers when a timer comes due.
    let started = std::time::Instant::now();
    let due_in = {
        let client = client.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            client.create_timer(pull("a", 800)).await.unwrap();
        })
    };
    let (status, body) = post(":reserve", serde_json::json!({ "max": 5, "wait_ms": 10_000, "ttr_ms": 60_000 })).await;
    due_in.await.unwrap();
    let waited = started.elapsed();
    assert_eq!(status, 200, "{body}");
    let got = body["deliveries"].as_array().unwrap();
    assert_eq!(got.len(), 1, "{body}");
    assert!(waited >= Duration::from_millis(400) && waited < Duration::from_secs(5), "{waited:?}");
    let a = &got[0];
    assert_eq!(
        (a["id"].as_str(), a["attempt"].as_u64(), a["topic"].as_str()),
        (Some("a"), Some(1), Some("close-order"))
    );
    // The timer's own time-to-run (800 ms) wins over the consumer's 60 s.
    let left = a["reserved_until_ms"].as_u64().unwrap().saturating_sub(now_ms());
    assert!(left <= 800, "reserved for {left} ms more");

    // Phase: unacked, it comes back after its time-to-run as attempt 2; an
    // ack of attempt 1 is then stale, of attempt 2 is OK.
    let (_, body) = post(":reserve", serde_json::json!({ "wait_ms": 5_000 })).await;
    let again = &body["deliveries"][0];
    assert_eq!((again["id"].as_str(), again["attempt"].as_u64()), (Some("a"), Some(2)), "{body}");
    let fire_id = again["fire_id"].as_str().unwrap().to_string();
    let acks = serde_json::json!({ "deliveries": [
        { "id": "a", "fire_id": fire_id, "attempt": 1 },
        { "id": "a", "fire_id": fire_id, "attempt": 2 },
    ]});
    let (status, body) = post(":ack", acks).await;
    assert_eq!(status, 200, "{body}");
    let statuses: Vec<&str> =
        body["results"].as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, vec!["STALE", "OK"]);
    assert_eq!(client.get_timer("jobs", "a").await.unwrap().state, pb::timer::State::Delivered as i32);

    // Phase: a nack puts it back after its delay; several come back in one call.
    for id in ["b", "c", "d"] {
        client.create_timer(pull(id, 0)).await.unwrap();
    }
    // All three on the topic before the call, so one reservation batch takes
    // them: a call answers with what arrives within a few ms of its first
    // delivery, and timers coming due one commit apart would be split across
    // calls (CI, two tests on two cores: 1 in ~10 runs). A due pull timer is
    // offered unfired (it stays SCHEDULED until a reservation fires it), so
    // the topic's ready gauge says when all three wait.
    let ready = "tocsin_pull_ready{namespace=\"jobs\",topic=\"close-order\"} 3";
    crate::support::wait_for("b, c and d offered", Duration::from_secs(10), async || {
        crate::support::metrics_text(&node.http).await.lines().any(|l| l == ready)
    })
    .await;
    for id in ["b", "c", "d"] {
        let state = client.get_timer("jobs", id).await.unwrap().state;
        assert_eq!(state, pb::timer::State::Scheduled as i32, "{id}: offered, not fired before a consumer takes it");
    }
    let (_, body) = post(":reserve", serde_json::json!({ "max": 3, "wait_ms": 5_000 })).await;
    let mut ids: Vec<&str> = body["deliveries"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec!["b", "c", "d"], "{body}");
    let b = body["deliveries"].as_array().unwrap().iter().find(|d| d["id"] == "b").unwrap().clone();
    let nack = serde_json::json!({
        "deliveries": [{ "id": "b", "fire_id": b["fire_id"], "attempt": b["attempt"] }],
        "delay_ms": 300, "reason": "not yet"
    });
    let (status, body) = post(":nack", nack).await;
    assert_eq!((status, body["results"][0]["status"].as_str()), (200, Some("OK")), "{body}");
    let (_, body) = post(":reserve", serde_json::json!({ "max": 1, "wait_ms": 5_000 })).await;
    assert_eq!(
        (body["deliveries"][0]["id"].as_str(), body["deliveries"][0]["attempt"].as_u64()),
        (Some("b"), Some(2)),
        "{body}"
    );

    // Phase: bad input gets the JSON error shape.
    let (status, body) = post(":reserve", serde_json::json!({ "max": 0 })).await;
    assert_eq!((status, body["error"]["field"].as_str()), (400, Some("max")));
    let (status, body) = post(":reserve", serde_json::json!({ "maxx": 1 })).await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = post(":pop", serde_json::json!({})).await;
    assert_eq!(status, 404);
    let (status, body) = post(":ack", serde_json::json!({ "deliveries": [], "delay_ms": 5 })).await;
    assert_eq!((status, body["error"]["field"].as_str()), (400, Some("delay_ms")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_fire_says_how_late_or_is_skipped_by_its_policy() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    // Due 5 s ago (a client's clock behind, a retried request): the fire is
    // 5 s late at once, as after an outage.
    let past = |id: &str, skip_if_late_ms: u64| {
        let mut r = tocsin_client::webhook_timer("late", id, 0, &receiver.url);
        r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(now_ms() - 5_000));
        r.skip_if_late_ms = skip_if_late_ms;
        r
    };
    client.create_timer(past("lenient", 0)).await.unwrap();
    client.create_timer(past("bounded", 60_000)).await.unwrap();
    client.create_timer(past("strict", 2_000)).await.unwrap();
    let skipped = pb::timer::State::Skipped as i32;
    wait_for("the strict timer SKIPPED", Duration::from_secs(10), async || {
        receiver.of("lenient").len() == 1 && receiver.of("bounded").len() == 1
    })
    .await;
    let mut strict = client.get_timer("late", "strict").await.unwrap();
    for _ in 0..100 {
        if strict.state == skipped {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        strict = client.get_timer("late", "strict").await.unwrap();
    }
    assert_eq!(strict.state, skipped);
    assert!(strict.fire.is_none() && strict.finished_at_ms > 0 && strict.skip_if_late_ms == 2_000);
    assert!(receiver.of("strict").is_empty(), "a skipped fire delivers nothing");
    // The deliveries carry late_by_ms (the receiver's record keeps the body's
    // fire and fired times; late_by_ms is their difference).
    for id in ["lenient", "bounded"] {
        let seen = &receiver.of(id)[0];
        let t = client.get_timer("late", id).await.unwrap();
        let late_by = t.fire.unwrap().fired_at_ms - seen.fire_at_ms;
        assert!((5_000..10_000).contains(&late_by), "{id}: {late_by} ms late");
        assert_eq!(seen.late_by_ms, late_by, "{id}");
    }
    // A cancel of a skipped timer says it is over; a bad policy is refused.
    let resp = client.cancel_timer("late", "strict").await.unwrap();
    assert_eq!(resp.timer.unwrap().state, skipped);
    let err = client.create_timer(past("bad", 10)).await.unwrap_err();
    assert!(err.to_string().contains("skip_if_late_ms"), "{err}");
}
