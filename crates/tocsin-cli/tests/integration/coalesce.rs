//! Concurrent single creates through the shard-aware client share
//! `CreateTimers` calls (the client's coalescing, `tocsin-client`'s
//! `coalesce.rs`), and each caller still gets the answer `CreateTimer`
//! gives on its own: a new timer, an identical retry, a conflicting spec,
//! an invalid field. A `CreateTimers` batch goes one call per leader node.

use std::time::Duration;

use tocsin_client::Client;
use tocsin_client::ClientError;
use tocsin_client::ClientOptions;
use tocsin_proto::v1 as pb;

use crate::support::NodeProcess;
use crate::support::now_ms;

/// A create's answer, as much of it as two ways of asking must agree on.
fn answer(got: &Result<pb::CreateTimerResponse, ClientError>) -> String {
    match got {
        Ok(resp) => {
            let t = resp.timer.as_ref().expect("a created timer is answered with it");
            format!("ok created={} id={} payload={:?} fire_at_ms={}", resp.created, t.id, t.payload, t.fire_at_ms)
        }
        Err(ClientError::Status { code, info, .. }) => {
            format!("{code:?} field={} reason={}", info.field, info.reason)
        }
        Err(e) => format!("{e}"),
    }
}

/// Client gRPC calls of `method` the node at `http` answered, by any code.
async fn calls(http: &str, method: &str) -> u64 {
    let prefix = format!("tocsin_grpc_requests_total{{method=\"tocsin.v1.TimerService/{method}\",");
    crate::support::metrics_text(http)
        .await
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_single_creates_share_calls_and_keep_their_own_answers() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let fire_at_ms = now_ms() + 3_600_000;
    let req = |id: &str, payload: &'static [u8]| {
        let mut r = tocsin_client::pull_timer("co", id, fire_at_ms, "jobs");
        r.payload = bytes::Bytes::from_static(payload);
        r
    };
    // An identical retry, another spec under a live id, an id that is not
    // valid, and a fire time past the horizon.
    let specials = [req("dup", b"a"), req("conflict", b"b"), req(&"x".repeat(10_000), b"a"), {
        let mut r = req("far", b"a");
        r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(fire_at_ms + 100 * 365 * 86_400_000));
        r
    }];

    // Phase: what each special create gets on its own, one call each.
    let alone = ClientOptions { coalesce_in_flight: 0, ..Default::default() };
    let alone = Client::with_options([node.grpc.clone()], alone).await.unwrap();
    alone.create_timer(req("dup", b"a")).await.unwrap();
    alone.create_timer(req("conflict", b"a")).await.unwrap();
    let mut expected = Vec::new();
    for r in &specials {
        expected.push(answer(&alone.create_timer(r.clone()).await));
    }
    assert!(expected[0].starts_with("ok created=false"), "{}", expected[0]);
    assert!(expected[1].starts_with("AlreadyExists"), "{}", expected[1]);
    assert!(expected[2].starts_with("InvalidArgument field=id"), "{}", expected[2]);
    assert!(expected[3].starts_with("InvalidArgument"), "{}", expected[3]);

    // Phase: 300 creates at once through a coalescing client (the default),
    // the specials among them, once every shard's leader is known.
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    crate::support::wait_for("every shard's leader in the map", Duration::from_secs(10), async || {
        client.refresh().await.is_ok_and(|m| m.shards.iter().all(|s| s.leader != 0))
    })
    .await;
    let (singles, batches) = (calls(&node.http, "CreateTimer").await, calls(&node.http, "CreateTimers").await);
    let mut reqs: Vec<pb::CreateTimerRequest> = (0..296).map(|i| req(&format!("n-{i}"), b"x")).collect();
    for (k, special) in specials.iter().enumerate() {
        reqs.insert(70 * k + 3, special.clone());
    }
    let got = futures::future::join_all(reqs.iter().cloned().map(|r| {
        let client = client.clone();
        async move { client.create_timer(r).await }
    }))
    .await;
    assert_answers("create", &reqs, &got, &specials, &expected, fire_at_ms);

    // Phase: they shared calls. Every answer above came from `CreateTimers`
    // items (none fell back to a call of its own), and fewer calls than
    // creates carried them.
    let (singles, batches) =
        (calls(&node.http, "CreateTimer").await - singles, calls(&node.http, "CreateTimers").await - batches);
    assert_eq!(singles, 0, "every create went through a shared call");
    assert!((1..reqs.len() as u64 / 4).contains(&batches), "{batches} calls for {} creates", reqs.len());

    // Phase: a `CreateTimers` batch over every shard goes to the node in one
    // call (the node splits it per shard), not one call per shard, and each
    // item is answered in its place, the specials' refusals included.
    let before = calls(&node.http, "CreateTimers").await;
    let mut batch: Vec<pb::CreateTimerRequest> = (0..296).map(|i| req(&format!("b-{i}"), b"x")).collect();
    for (k, special) in specials.iter().enumerate() {
        batch.insert(70 * k + 5, special.clone());
    }
    let shards: std::collections::BTreeSet<u32> = batch.iter().map(|r| client.shard_of(&r.namespace, &r.id)).collect();
    assert!(shards.len() > 1, "the batch spans {} shards", shards.len());
    let got = client.create_timers(batch.clone()).await;
    assert_eq!(got.len(), batch.len());
    assert_answers("batch item", &batch, &got, &specials, &expected, fire_at_ms);
    let batch_calls = calls(&node.http, "CreateTimers").await - before;
    assert_eq!(batch_calls, 1, "a batch over {} shards of one node took {batch_calls} calls", shards.len());
}

/// Each request's answer in its own place: a special gets what it got on
/// its own (`expected`, by its index in `specials`), every other request a
/// new timer with its own id, payload and fire time.
fn assert_answers(
    what: &str,
    reqs: &[pb::CreateTimerRequest],
    got: &[Result<pb::CreateTimerResponse, ClientError>],
    specials: &[pb::CreateTimerRequest],
    expected: &[String],
    fire_at_ms: u64,
) {
    assert_eq!(reqs.len(), got.len(), "{what}: one answer per request");
    for (i, (r, got)) in reqs.iter().zip(got).enumerate() {
        match specials.iter().position(|s| s.id == r.id && s.payload == r.payload) {
            Some(k) => assert_eq!(answer(got), expected[k], "{what} {i}: special {k}"),
            None => assert_eq!(
                answer(got),
                format!("ok created=true id={} payload={:?} fire_at_ms={fire_at_ms}", r.id, r.payload),
                "{what} {i}"
            ),
        }
    }
}
