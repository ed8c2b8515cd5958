//! A node whose stderr nobody reads (a log shipper that stopped, a disk
//! whose journal stalls): once the pipe is full, a node that wrote its log
//! on its own threads would wait in every log call, its fire loop and its
//! request handlers with it. Tocsin's log goes through a bounded queue to
//! one writer thread (`tocsin-cli`'s `logpipe`): the lines that do not fit
//! are dropped and counted, and the timers fire on time.

use std::time::Duration;

use futures::StreamExt;
use tocsin_client::Client;
use tocsin_client::ClientOptions;
use tocsin_client::v1 as pb;

use crate::support::NodeProcess;
use crate::support::Receiver;
use crate::support::now_ms;
use crate::support::percentiles;

const TIMERS: usize = 300;

async fn dropped_lines(http: &str) -> u64 {
    crate::support::metric_value(http, "tocsin_log_lines_dropped_total").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_stderr_is_stuck_drops_log_lines_and_fires_on_time() {
    let dir = tempfile::tempdir().unwrap();
    // Debug lines and an access line per request: far more than the 64 KiB
    // pipe and the writer's queue hold.
    let node =
        NodeProcess::start_with_stuck_stderr(dir.path(), &[("RUST_LOG", "debug"), ("TOCSIN_ACCESS_LOG", "true")]);
    let receiver = Receiver::start().await;
    let options = ClientOptions { request_timeout: Duration::from_secs(3), max_attempts: 20, ..Default::default() };
    let client = Client::with_options([node.grpc.clone()], options).await.unwrap();

    // Phase: creates of far-future timers until the node says it dropped
    // log lines: its stderr is full and its writer's queue too.
    let mut flooded = 0usize;
    while dropped_lines(&node.http).await == 0 {
        assert!(flooded < 100_000, "{flooded} creates and not one log line dropped: is the node's stderr stuck?");
        let creates = futures::stream::iter(flooded..flooded + 500)
            .map(|i| {
                let client = client.clone();
                let url = receiver.url.clone();
                async move {
                    let mut r = tocsin_client::webhook_timer("flood", &format!("f-{i}"), 0, &url);
                    r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(now_ms() + 3_600_000));
                    client.create_timer(r).await.expect("a create while the log is stuck");
                }
            })
            .buffer_unordered(16);
        creates.collect::<Vec<()>>().await;
        flooded += 500;
    }
    let dropped_before = dropped_lines(&node.http).await;
    println!("{flooded} creates filled the log; {dropped_before} lines dropped so far");

    // Phase: timers due 1.5-3 s ahead, with the log still stuck.
    let base = now_ms() + 1_500;
    let reqs: Vec<pb::CreateTimerRequest> = (0..TIMERS)
        .map(|i| {
            let mut r = tocsin_client::webhook_timer("stuck-log", &format!("t-{i}"), 0, &receiver.url);
            r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(base + i as u64 * 5));
            r
        })
        .collect();
    for result in client.create_timers(reqs).await {
        result.expect("a create while the log is stuck");
    }
    let deadline = now_ms() + 20_000;
    while receiver.delivered().len() < TIMERS && now_ms() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Phase: check. Every timer once at least, none early, none a second
    // late; and lines were still being dropped, so the log stayed stuck
    // the whole time.
    let delivered = receiver.delivered();
    let lost: Vec<usize> = (0..TIMERS).filter(|i| !delivered.contains_key(&format!("t-{i}"))).collect();
    assert!(lost.is_empty(), "{} timers never delivered: {lost:?}", lost.len());
    let lateness: Vec<u64> = delivered
        .iter()
        .filter(|(id, _)| id.starts_with("t-"))
        .map(|(_, seen)| {
            let first = &seen[0];
            assert!(first.recv_ms >= first.fire_at_ms, "delivered {} ms early", first.fire_at_ms - first.recv_ms);
            first.recv_ms - first.fire_at_ms
        })
        .collect();
    let max_ms = lateness.iter().copied().max().unwrap_or(0);
    println!("lateness with the log stuck: {}", percentiles(lateness));
    assert!(max_ms < 1_000, "a timer fired {max_ms} ms late with the node's log stuck");
    let dropped_after = dropped_lines(&node.http).await;
    assert!(dropped_after > dropped_before, "no line dropped while the timers fired ({dropped_after}): the log moved");
}
