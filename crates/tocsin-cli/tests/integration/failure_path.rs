//! The webhook failure path against a real node and receivers that fail on
//! cue: a `429` with `Retry-After` is honoured and holds the whole endpoint
//! until then; a receiver that hangs costs its own timers a timeout and then
//! opens its endpoint's circuit breaker, while another endpoint's timers
//! fire on time; a `410 Gone` kills its timer (DEAD, reason GONE) and
//! disables the URL until `tocsin admin endpoint enable`. Pausing a
//! namespace stops its fires until resumed; pausing an endpoint holds its
//! deliveries. A namespace whose deliveries wait for a slow receiver has
//! its creates refused (RESOURCE_EXHAUSTED) while another's are taken.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tocsin_client::Client;
use tocsin_client::v1 as pb;

use crate::support::NodeProcess;
use crate::support::Receiver;
use crate::support::now_ms;
use crate::support::percentiles;
use crate::support::wait_for;

/// What the scripted receiver answers, and how late.
#[derive(Clone, Copy)]
struct Script {
    status: u16,
    retry_after_s: Option<u64>,
    delay_ms: u64,
}

/// A receiver that answers as its script says and records when each
/// timer's requests arrived.
struct Scripted {
    url: String,
    script: Arc<Mutex<Script>>,
    seen: Arc<Mutex<HashMap<String, Vec<u64>>>>,
}

impl Scripted {
    async fn start(script: Script) -> Scripted {
        let script = Arc::new(Mutex::new(script));
        let seen: Arc<Mutex<HashMap<String, Vec<u64>>>> = Arc::default();
        let (s, r) = (script.clone(), seen.clone());
        let app = axum::Router::new().fallback(axum::routing::post(move |body: axum::body::Bytes| {
            let (script, seen) = (s.clone(), r.clone());
            async move {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let id = v["id"].as_str().unwrap().to_string();
                seen.lock().unwrap().entry(id).or_default().push(now_ms());
                let now = *script.lock().unwrap();
                tokio::time::sleep(Duration::from_millis(now.delay_ms)).await;
                let mut headers = axum::http::HeaderMap::new();
                if let Some(s) = now.retry_after_s {
                    headers.insert("retry-after", s.to_string().parse().unwrap());
                }
                (axum::http::StatusCode::from_u16(now.status).unwrap(), headers, "answer")
            }
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Scripted { url, script, seen }
    }

    fn set(&self, script: Script) {
        *self.script.lock().unwrap() = script;
    }

    fn of(&self, id: &str) -> Vec<u64> {
        self.seen.lock().unwrap().get(id).cloned().unwrap_or_default()
    }

    fn requests(&self) -> usize {
        self.seen.lock().unwrap().values().map(Vec::len).sum()
    }
}

const OK: Script = Script { status: 200, retry_after_s: None, delay_ms: 0 };

fn timer(ns: &str, id: &str, delay_ms: u64, url: &str) -> pb::CreateTimerRequest {
    let mut r = tocsin_client::webhook_timer(ns, id, delay_ms, url);
    r.retry = Some(pb::RetryPolicy {
        max_attempts: 200,
        initial_backoff_ms: 1000,
        max_backoff_ms: 2000,
        ..Default::default()
    });
    r
}

/// Whether every one of `ids` in `ns` is DELIVERED.
async fn all_delivered(client: &Client, ns: &str, ids: &[String]) -> bool {
    for id in ids {
        if state_of(client, ns, id).await != pb::timer::State::Delivered as i32 {
            return false;
        }
    }
    true
}

async fn state_of(client: &Client, ns: &str, id: &str) -> i32 {
    client.get_timer(ns, id).await.unwrap().state
}

/// `tocsin admin …` against `node`: its exit status and stdout.
fn admin(node: &NodeProcess, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .arg("admin")
        .args(args)
        .args(["--addr", &node.grpc])
        .output()
        .expect("run tocsin");
    (out.status.success(), String::from_utf8(out.stdout).unwrap() + &String::from_utf8_lossy(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn receivers_that_fail_throttle_hang_and_go_away() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[("TOCSIN_DELIVERY__WEBHOOK_TIMEOUT_MS", "3000")]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    let delivered = pb::timer::State::Delivered as i32;

    // Phase: 429 with Retry-After: 3 on the first requests. No request
    // reaches the endpoint until the 3 s have passed, for the timers that
    // got the 429 and for one created during the pause; then all deliver.
    let throttling = Scripted::start(Script { status: 429, retry_after_s: Some(3), delay_ms: 0 }).await;
    for i in 0..5 {
        client.create_timer(timer("slow", &format!("t-{i}"), 100, &throttling.url)).await.unwrap();
    }
    wait_for("the first 429s", Duration::from_secs(10), async || throttling.requests() >= 5).await;
    // The first 429 already slows the whole endpoint down, so the five
    // requests may come from fewer than five timers: take the latest first
    // request among those that got one.
    let first_429_ms = (0..5).filter_map(|i| throttling.of(&format!("t-{i}")).first().copied()).max().unwrap();
    throttling.set(OK);
    client.create_timer(timer("slow", "during-pause", 0, &throttling.url)).await.unwrap();
    let ids: Vec<String> = (0..5).map(|i| format!("t-{i}")).chain(["during-pause".to_string()]).collect();
    wait_for("every throttled timer delivered", Duration::from_secs(20), async || {
        all_delivered(&client, "slow", &ids).await
    })
    .await;
    for id in &ids {
        let seen = throttling.of(id);
        let after_pause: Vec<u64> = seen.iter().filter(|&&t| t > first_429_ms + 50).copied().collect();
        assert!(
            after_pause.iter().all(|&t| t + 100 >= first_429_ms + 3_000),
            "{id}: a request {:?} ms after the 429 asked for 3 s",
            after_pause.iter().map(|t| t - first_429_ms).collect::<Vec<_>>()
        );
    }
    let t = client.get_timer_with("slow", "during-pause", true).await.unwrap();
    let classes: Vec<&str> = t.attempts.iter().map(|a| a.class.as_str()).collect();
    assert_eq!(classes.last(), Some(&"2xx"), "{classes:?}");
    assert!(classes[..classes.len() - 1].iter().all(|c| *c == "throttled"), "{classes:?}");
    // The timers that reached the endpoint before it slowed down recorded
    // the 429 as their first attempt.
    let mut got_429 = 0;
    for i in 0..5 {
        let t = client.get_timer_with("slow", &format!("t-{i}"), true).await.unwrap();
        if !throttling.of(&format!("t-{i}")).is_empty() && t.attempts[0].http_status == 429 {
            assert_eq!(t.attempts[0].class, "4xx");
            got_429 += 1;
        }
    }
    assert!(got_429 >= 1, "no timer recorded the 429");

    // Phase: a receiver that hangs (20 s, past the node's 3 s timeout)
    // beside a healthy one. The hanging endpoint's first attempts time out,
    // then its breaker opens and the rest are held without a request; the
    // healthy endpoint's timers, due over the same seconds, fire on time.
    let hanging = Scripted::start(Script { status: 200, retry_after_s: None, delay_ms: 20_000 }).await;
    let healthy = Receiver::start().await;
    let base = now_ms();
    for i in 0..40 {
        client.create_timer(timer("hang", &format!("h-{i}"), 200 + i * 50, &hanging.url)).await.unwrap();
        client.create_timer(timer("fine", &format!("f-{i}"), 200 + i * 50, &healthy.url)).await.unwrap();
    }
    wait_for("the healthy endpoint's 40 deliveries", Duration::from_secs(15), async || healthy.delivered().len() >= 40)
        .await;
    let lateness: Vec<u64> =
        healthy.delivered().values().map(|seen| seen[0].recv_ms.saturating_sub(seen[0].fire_at_ms)).collect();
    println!("healthy endpoint beside a hanging one: lateness ms {}", percentiles(lateness.clone()));
    assert!(lateness.iter().all(|&l| l < 1_000), "lateness beside a hanging endpoint: {lateness:?}");
    wait_for("the hanging endpoint's breaker to hold attempts", Duration::from_secs(20), async || {
        let mut held = 0;
        for i in 0..40 {
            let t = client.get_timer_with("hang", &format!("h-{i}"), true).await.unwrap();
            held += t.attempts.iter().filter(|a| a.class == "circuit_open").count();
        }
        held >= 10
    })
    .await;
    let (mut timeouts, mut held, mut attempts) = (0, 0, 0);
    for i in 0..40 {
        let t = client.get_timer_with("hang", &format!("h-{i}"), true).await.unwrap();
        timeouts += t.attempts.iter().filter(|a| a.class == "timeout").count();
        held += t.attempts.iter().filter(|a| a.class == "circuit_open").count();
        attempts += t.attempts.len();
    }
    // Every first attempt was sent (all 40 were under way before the first
    // timed out); after that, only the breaker's probes.
    let retries_sent = hanging.requests().saturating_sub(40);
    println!(
        "hanging endpoint: {attempts} attempts recorded, {timeouts} timed out, {held} held by the open breaker; \
         {} requests sent, {retries_sent} of them retries (probes)",
        hanging.requests()
    );
    assert!(timeouts >= 5, "{timeouts} timeouts");
    assert!(retries_sent < held, "held attempts send no request: {retries_sent} retries sent, {held} held");
    let (ok, out) = admin(&node, &["endpoint", "list"]);
    assert!(ok && out.contains(hanging.url.trim_end_matches("/hook")), "{out}");

    // Phase: the hanging receiver recovers: a probe closes the breaker and
    // every timer is delivered, none DEAD.
    hanging.set(OK);
    wait_for("every hanging-endpoint timer delivered", Duration::from_secs(60), async || {
        for i in 0..40 {
            if state_of(&client, "hang", &format!("h-{i}")).await != delivered {
                return false;
            }
        }
        true
    })
    .await;
    println!("hanging endpoint recovered: drained {} ms after the first timer's fire", now_ms() - base - 200);

    // Phase: 410 Gone kills its timer (DEAD, GONE) and disables the URL;
    // another timer to it is held without a request; enabling the URL
    // again delivers it.
    let gone = Scripted::start(Script { status: 410, retry_after_s: None, delay_ms: 0 }).await;
    client.create_timer(timer("gone", "g-1", 0, &gone.url)).await.unwrap();
    let dead = pb::timer::State::Dead as i32;
    wait_for("g-1 DEAD", Duration::from_secs(10), async || state_of(&client, "gone", "g-1").await == dead).await;
    assert_eq!(client.get_timer("gone", "g-1").await.unwrap().fire.unwrap().dead_reason, "GONE");
    gone.set(OK);
    client.create_timer(timer("gone", "g-2", 0, &gone.url)).await.unwrap();
    wait_for("g-2 held", Duration::from_secs(10), async || {
        let t = client.get_timer_with("gone", "g-2", true).await.unwrap();
        t.attempts.iter().any(|a| a.class == "url_disabled")
    })
    .await;
    assert!(gone.of("g-2").is_empty(), "a disabled URL gets no request");
    let (ok, out) = admin(&node, &["endpoint", "list", "--json"]);
    assert!(ok, "{out}");
    let json_start = out.find('[').unwrap();
    let listed: serde_json::Value = serde_json::from_str(out[json_start..].trim()).unwrap();
    assert_eq!(listed[0]["disabled"][0]["url"], gone.url.as_str(), "{listed}");
    assert_eq!(listed[0]["disabled"][0]["by_timer"], "gone/g-1", "{listed}");
    let (ok, out) = admin(&node, &["endpoint", "enable", &gone.url]);
    assert!(ok && out.contains("enabled again on node(s)"), "{out}");
    wait_for("g-2 delivered once enabled", Duration::from_secs(10), async || {
        state_of(&client, "gone", "g-2").await == delivered
    })
    .await;
    let (_, out) = admin(&node, &["endpoint", "enable", &gone.url]);
    assert!(out.contains("was not disabled"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pausing_a_namespace_and_an_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    let receiver = Receiver::start().await;
    let other = Receiver::start().await;
    let delivered = pb::timer::State::Delivered as i32;

    // Phase: a paused namespace fires nothing; another fires as usual.
    let (ok, out) = admin(&node, &["namespace", "pause", "billing"]);
    assert!(ok && out.contains("namespace billing paused"), "{out}");
    let (_, out) = admin(&node, &["namespace", "pause", "billing"]);
    assert!(out.contains("already paused"), "{out}");
    for i in 0..5 {
        client.create_timer(timer("billing", &format!("b-{i}"), 200, &receiver.url)).await.unwrap();
        client.create_timer(timer("orders", &format!("o-{i}"), 200, &receiver.url)).await.unwrap();
    }
    let mut strict = timer("billing", "b-strict", 200, &receiver.url);
    strict.skip_if_late_ms = 1_000;
    client.create_timer(strict).await.unwrap();
    wait_for("the other namespace's timers", Duration::from_secs(10), async || {
        (0..5).all(|i| !receiver.of(&format!("o-{i}")).is_empty())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!((0..5).all(|i| receiver.of(&format!("b-{i}")).is_empty()), "a paused namespace fired");
    assert_eq!(state_of(&client, "billing", "b-0").await, pb::timer::State::Scheduled as i32);
    let (ok, out) = admin(&node, &["namespace", "paused"]);
    assert!(ok && out.contains("namespace billing"), "{out}");

    // Phase: resumed: every timer fires, late (late_by_ms says by how
    // much), and the one whose policy skips fires over a second late is
    // SKIPPED.
    let (ok, out) = admin(&node, &["namespace", "resume", "billing"]);
    assert!(ok && out.contains("resumed"), "{out}");
    wait_for("the paused namespace's timers after resume", Duration::from_secs(10), async || {
        (0..5).all(|i| !receiver.of(&format!("b-{i}")).is_empty())
    })
    .await;
    for i in 0..5 {
        let seen = &receiver.of(&format!("b-{i}"))[0];
        assert!(seen.late_by_ms >= 1_500, "b-{i} late by {} ms only", seen.late_by_ms);
    }
    wait_for("b-strict SKIPPED", Duration::from_secs(10), async || {
        state_of(&client, "billing", "b-strict").await == pb::timer::State::Skipped as i32
    })
    .await;
    assert!(receiver.of("b-strict").is_empty());

    // Phase: a paused endpoint gets no request (its attempts are held,
    // class endpoint_paused); another endpoint is unaffected; on resume
    // the held timer is delivered.
    let (ok, out) = admin(&node, &["endpoint", "pause", &other.url]);
    assert!(ok && out.contains("paused"), "{out}");
    client.create_timer(timer("orders", "to-paused", 0, &other.url)).await.unwrap();
    client.create_timer(timer("orders", "to-live", 0, &receiver.url)).await.unwrap();
    wait_for("to-paused held", Duration::from_secs(10), async || {
        let t = client.get_timer_with("orders", "to-paused", true).await.unwrap();
        t.attempts.iter().any(|a| a.class == "endpoint_paused")
    })
    .await;
    assert!(other.of("to-paused").is_empty());
    wait_for("to-live delivered", Duration::from_secs(10), async || !receiver.of("to-live").is_empty()).await;
    let (ok, out) = admin(&node, &["endpoint", "resume", &other.url]);
    assert!(ok && out.contains("resumed"), "{out}");
    wait_for("to-paused delivered after resume", Duration::from_secs(10), async || {
        state_of(&client, "orders", "to-paused").await == delivered
    })
    .await;
    let (_, out) = admin(&node, &["namespace", "paused"]);
    assert!(out.contains("nothing is paused"), "{out}");
}

/// The deliveries waiting for a connection slot are bounded in bytes on the
/// node (`delivery.max_queued_bytes`): past it an attempt fails at once as
/// `queue_full` and is retried after its backoff, sending nothing, and once
/// the endpoint keeps up again every timer is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_deliveries_are_bounded_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // One request at a time to the endpoint, and room for one waiting
    // delivery (each counts its payload and 2 KiB).
    let node = NodeProcess::start(
        dir.path(),
        &[("TOCSIN_DELIVERY__PER_ENDPOINT_CONCURRENCY", "1"), ("TOCSIN_DELIVERY__MAX_QUEUED_BYTES", "3000")],
    );
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    let slow = Scripted::start(Script { status: 200, retry_after_s: None, delay_ms: 1_500 }).await;
    let ids = create_due_together(&client, "bounded", "q", 5, 500, &slow.url).await;
    // Phase: one is sent, one waits, the other three find the queue full.
    wait_for("three queue_full attempts", Duration::from_secs(10), async || {
        let mut full = 0;
        for id in &ids {
            let t = client.get_timer_with("bounded", id, true).await.unwrap();
            full += t.attempts.iter().filter(|a| a.class == "queue_full").count();
        }
        full >= 3
    })
    .await;
    assert!(slow.requests() <= 2, "{} requests while one at a time takes 1.5 s", slow.requests());
    // Phase: the endpoint keeps up again and every timer is delivered.
    slow.set(OK);
    wait_for("every timer delivered", Duration::from_secs(30), async || all_delivered(&client, "bounded", &ids).await)
        .await;
    for id in &ids {
        assert!(!slow.of(id).is_empty(), "{id} never reached the endpoint");
    }
}

/// Creates `count` timers `{prefix}-{i}` in `ns`, all due `in_ms` from now
/// at `url`; returns their ids.
async fn create_due_together(
    client: &Client,
    ns: &str,
    prefix: &str,
    count: usize,
    in_ms: u64,
    url: &str,
) -> Vec<String> {
    let ids: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    let fire_at_ms = now_ms() + in_ms;
    for id in &ids {
        let mut t = timer(ns, id, 0, url);
        t.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(fire_at_ms));
        client.create_timer(t).await.unwrap();
    }
    ids
}

/// One create in `ns` with a single attempt: its error code, if refused, and
/// the message.
async fn create_once(client: &Client, ns: &str, id: &str, url: &str) -> Result<(), (tonic::Code, String)> {
    client.create_timer(timer(ns, id, 60_000, url)).await.map(|_| ()).map_err(|e| (e.code(), e.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_whose_deliveries_wait_has_its_creates_shed_alone() {
    let dir = tempfile::tempdir().unwrap();
    // One request at a time to an endpoint, so that a slow receiver's
    // deliveries wait for the slot.
    let node = NodeProcess::start(dir.path(), &[("TOCSIN_DELIVERY__PER_ENDPOINT_CONCURRENCY", "1")]);
    let once = tocsin_client::ClientOptions { max_attempts: 1, ..Default::default() };
    let client = Client::with_options([node.grpc.clone()], once).await.unwrap();
    let slow = Scripted::start(Script { status: 200, retry_after_s: None, delay_ms: 800 }).await;
    let healthy = Receiver::start().await;

    // Phase: five timers of one namespace due together at the slow
    // receiver: each waits up to 3.2 s for the slot, past the 300 ms bound.
    let ids = create_due_together(&client, "backlogged", "b", 5, 300, &slow.url).await;
    // Phase: while they wait, that namespace's creates are refused with
    // RESOURCE_EXHAUSTED and a message that says why; another namespace's
    // are taken.
    let mut n = 0;
    let mut refused = None;
    wait_for("a create in the backlogged namespace refused", Duration::from_secs(10), async || {
        n += 1;
        match create_once(&client, "backlogged", &format!("more-{n}"), &healthy.url).await {
            Ok(()) => false,
            Err(e) => {
                refused = Some(e);
                true
            }
        }
    })
    .await;
    let (code, message) = refused.unwrap();
    assert_eq!(code, tonic::Code::ResourceExhausted, "{message}");
    assert!(message.contains("backlogged") && message.contains("deliveries"), "{message}");
    create_once(&client, "unrelated", "u-1", &healthy.url).await.expect("another namespace is not shed");
    let metrics = crate::support::metrics_text(&node.http).await;
    assert!(metrics.contains("tocsin_creates_shed_total{reason=\"delivery_behind\"}"), "no shed counted");

    // Phase: the receiver keeps up again; once the waits are over (a
    // report counts for one to two seconds) the namespace's creates are
    // taken again, and every timer was delivered.
    slow.set(OK);
    wait_for("every backlogged timer delivered", Duration::from_secs(30), async || {
        all_delivered(&client, "backlogged", &ids).await
    })
    .await;
    wait_for("the backlogged namespace's creates taken again", Duration::from_secs(5), async || {
        n += 1;
        create_once(&client, "backlogged", &format!("more-{n}"), &healthy.url).await.is_ok()
    })
    .await;
}
