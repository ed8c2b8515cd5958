//! Recurring timers against a real node: created from the CLI and over
//! HTTP, each occurrence a delivery with its own fire id, never early; a
//! kill -9 in the middle of a series neither skips nor doubles an
//! occurrence; a series held up by a failing receiver fires once on
//! recovery, not once per missed slot; cancel ends it; bad rules are
//! refused with the field named.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use tocsin_client::Client;

use crate::support::NodeProcess;
use crate::support::Receiver;
use crate::support::Seen;
use crate::support::now_ms;
use crate::support::wait_for;

/// `tocsin timer <args…>`: (success, stdout, stderr).
fn timer_cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin")).arg("timer").args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Deliveries grouped by occurrence number.
fn by_occurrence(seen: &[Seen]) -> BTreeMap<u64, Vec<Seen>> {
    let mut out: BTreeMap<u64, Vec<Seen>> = BTreeMap::new();
    for s in seen {
        out.entry(s.occurrence).or_default().push(s.clone());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recurring_timers_fire_each_occurrence_once_through_a_crash_a_receiver_outage_and_a_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let mut node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    let http = tocsin_contract::tls::http_client_builder().build().unwrap();

    // Phase: from the CLI, every second, three times.
    let (ok, out, err) = timer_cli(&[
        "create",
        "--addr",
        &node.grpc,
        "--json",
        "reports",
        "tick",
        "--every-ms",
        "1000",
        "--count",
        "3",
        "--webhook",
        &receiver.url,
    ]);
    assert!(ok, "create failed: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["recurrence"]["every_ms"], 1000);
    assert_eq!(v["recurrence"]["count"], 3);
    let first_at = v["fire_at_ms"].as_u64().unwrap();
    wait_for("three occurrences", Duration::from_secs(15), async || receiver.of("tick").len() >= 3).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seen = receiver.of("tick");
    assert_eq!(seen.len(), 3, "{seen:?}");
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.occurrence, i as u64 + 1);
        assert_eq!(s.fire_at_ms, first_at + 1000 * i as u64, "an interval counts from the first occurrence");
        assert!(s.recv_ms >= s.fire_at_ms, "occurrence {} early by {} ms", s.occurrence, s.fire_at_ms - s.recv_ms);
    }
    let mut ids: Vec<&str> = seen.iter().map(|s| s.fire_id.as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 3, "each occurrence has its own fire id");
    let timer = client.get_timer("reports", "tick").await.unwrap();
    assert_eq!(timer.state, tocsin_client::v1::timer::State::Delivered as i32, "the last occurrence ends it");
    let series = timer.series.unwrap();
    assert_eq!((series.occurrence, series.delivered, series.next_fire_at_ms), (3, 3, 0));
    let (ok, out, _) = timer_cli(&["get", "--addr", &node.grpc, "reports", "tick"]);
    assert!(ok && out.contains("every_ms=1000 occurrence=3 delivered=3"), "{out}");

    // Phase: over HTTP, a cron rule with seconds, read in Berlin time.
    let body = serde_json::json!({
        "namespace": "reports", "id": "cron",
        "callback": { "webhook": { "url": receiver.url } },
        "recurrence": { "cron": "*/2 * * * * *", "time_zone": "Europe/Berlin", "count": 2 },
    });
    let resp = http.post(format!("http://{}/v1/timers", node.http)).json(&body).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 201, "{}", resp.text().await.unwrap());
    wait_for("two cron occurrences", Duration::from_secs(10), async || receiver.of("cron").len() >= 2).await;
    for s in receiver.of("cron") {
        assert_eq!(s.fire_at_ms % 2000, 0, "on even seconds: {s:?}");
        assert!(s.recv_ms >= s.fire_at_ms);
    }

    // Phase: kill -9 in the middle of a five-occurrence series; after the
    // restart every occurrence arrives, each under one fire id (a repeat
    // is a redelivery of the same firing, never a second firing).
    let (ok, out, err) = timer_cli(&[
        "create",
        "--addr",
        &node.grpc,
        "reports",
        "crash",
        "--every-ms",
        "1000",
        "--count",
        "5",
        "--webhook",
        &receiver.url,
    ]);
    assert!(ok, "{out}{err}");
    wait_for("two occurrences before the crash", Duration::from_secs(10), async || receiver.of("crash").len() >= 2)
        .await;
    node.kill9();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    node.restart();
    wait_for("five occurrences after the crash", Duration::from_secs(20), async || {
        by_occurrence(&receiver.of("crash")).len() >= 5
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let occurrences = by_occurrence(&receiver.of("crash"));
    assert_eq!(occurrences.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4, 5], "none skipped, none extra");
    for (n, deliveries) in &occurrences {
        let mut ids: Vec<&str> = deliveries.iter().map(|s| s.fire_id.as_str()).collect();
        ids.dedup();
        assert_eq!(ids.len(), 1, "occurrence {n} fired twice: {deliveries:?}");
        assert!(deliveries.iter().all(|s| s.recv_ms >= s.fire_at_ms), "occurrence {n} early");
    }
    let client = Client::connect([node.grpc.clone()]).await.unwrap();

    // Phase: the receiver fails for 4 s while a per-second series runs. The
    // first occurrence retries; the next waits for it and, once it is
    // delivered, fires once (late), not once per missed slot.
    receiver.answer(500);
    let mut req = tocsin_client::webhook_timer("reports", "outage", 0, &receiver.url);
    req.fire_time = None;
    req.recurrence = Some(tocsin_client::v1::Recurrence {
        rule: Some(tocsin_client::v1::recurrence::Rule::EveryMs(1000)),
        ..Default::default()
    });
    req.retry =
        Some(tocsin_client::v1::RetryPolicy { initial_backoff_ms: 1000, max_backoff_ms: 1000, ..Default::default() });
    client.create_timer(req).await.unwrap();
    wait_for("a failed first occurrence", Duration::from_secs(10), async || !receiver.of("outage").is_empty()).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    receiver.answer(200);
    let recovered_ms = now_ms();
    wait_for("three occurrences after recovery", Duration::from_secs(15), async || {
        by_occurrence(&receiver.of("outage")).len() >= 3
    })
    .await;
    let occurrences = by_occurrence(&receiver.of("outage"));
    assert!(occurrences[&1].len() >= 3, "the first occurrence retried through the outage");
    let second = &occurrences[&2][0];
    assert!(second.late_by_ms >= 2_500, "the second waited for the first: {second:?}");
    let third = &occurrences[&3][0];
    assert!(
        third.fire_at_ms + 1_000 >= recovered_ms,
        "the missed slots were not fired one by one: the third is at {} ms, recovery at {recovered_ms}",
        third.fire_at_ms
    );

    // Phase: cancel ends the series.
    let cancel = client.cancel_timer("reports", "outage").await.unwrap();
    assert_eq!(cancel.timer.unwrap().state, tocsin_client::v1::timer::State::Cancelled as i32);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_cancel = receiver.of("outage").len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(receiver.of("outage").len(), at_cancel, "nothing after the cancel");

    // Phase: bad rules are refused, naming the field.
    for (flags, field) in [
        (vec!["--cron", "61 * * * *"], "recurrence.cron"),
        (vec!["--cron", "0 9 * * MON", "--tz", "Mars/Olympus"], "recurrence.time_zone"),
        (vec!["--every-ms", "10"], "recurrence.every_ms"),
        (vec!["--cron", "0 0 30 2 *"], "recurrence"),
    ] {
        let mut args = vec!["create", "--addr", node.grpc.as_str(), "reports", "bad", "--webhook", &receiver.url];
        args.extend(flags.iter().copied());
        let (ok, out, err) = timer_cli(&args);
        assert!(!ok, "{flags:?} was accepted: {out}");
        assert!(err.contains(field), "{flags:?}: {err}");
    }
    let both = serde_json::json!({
        "namespace": "reports", "id": "bad",
        "callback": { "webhook": { "url": receiver.url } },
        "recurrence": { "cron": "* * * * *", "every_ms": 1000 },
    });
    let resp = http.post(format!("http://{}/v1/timers", node.http)).json(&both).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert!(resp.text().await.unwrap().contains("not both"));
}
