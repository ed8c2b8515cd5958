//! Namespace quotas, set through the CLI into the cluster map: a namespace
//! at its pending limit has creates refused with RESOURCE_EXHAUSTED and a
//! retry hint, single and batched, and nothing is created; a retry of a
//! timer that exists is still answered; other namespaces are untouched; a
//! cancel makes room; a create-rate quota refuses a burst and admits again
//! after a second; clearing the quota lifts it.

use std::process::Command;
use std::time::Duration;

use tocsin_client::v1 as pb;

use crate::support::NodeProcess;
use crate::support::now_ms;

/// `tocsin admin --addr <addr> namespace <args…>`: (success, stdout, stderr).
fn namespace_cli(addr: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["admin", "--addr", addr, "namespace"])
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn pull(ns: &str, id: &str) -> pb::CreateTimerRequest {
    tocsin_client::pull_timer(ns, id, now_ms() + 3_600_000, "quota")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_over_its_quota_is_refused_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    // One shard: the namespace's whole limit is that shard's share.
    let node = NodeProcess::start(dir.path(), &[("TOCSIN_NUM_SHARDS", "1")]);
    // One attempt per call: the library retries RESOURCE_EXHAUSTED after
    // its hint, and this test looks at the refusal itself.
    let options = tocsin_client::ClientOptions { max_attempts: 1, ..Default::default() };
    let client = tocsin_client::Client::with_options([node.grpc.clone()], options).await.unwrap();

    // Phase: a pending quota of 5.
    let (ok, out, err) = namespace_cli(&node.grpc, &["set-quota", "capped", "--max-pending", "5"]);
    assert!(ok && out.contains("max pending 5"), "{out}{err}");
    let (ok, out, err) = namespace_cli(&node.grpc, &["quotas", "--json"]);
    assert!(ok, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed[0]["namespace"], "capped");
    assert_eq!(listed[0]["max_pending"], 5);
    let first = pull("capped", "t-0");
    for i in 0..5 {
        let req = if i == 0 { first.clone() } else { pull("capped", &format!("t-{i}")) };
        client.create_timer(req).await.unwrap_or_else(|e| panic!("create {i}: {e}"));
    }

    // Phase: the sixth is refused, with a retry hint, and not created.
    let refused = client.create_timer(pull("capped", "t-5")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    assert!(refused.to_string().contains("quota"), "{refused}");
    let missing = client.get_timer("capped", "t-5").await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing}");
    // A batch in the namespace: each item refused, none created.
    let batch: Vec<_> = (6..9).map(|i| pull("capped", &format!("t-{i}"))).collect();
    let results = client.create_timers(batch).await;
    assert!(results.iter().all(|r| r.as_ref().is_err_and(|e| e.code() == tonic::Code::ResourceExhausted)));
    for i in 6..9 {
        assert_eq!(client.get_timer("capped", &format!("t-{i}")).await.unwrap_err().code(), tonic::Code::NotFound);
    }
    // A retry of a timer that exists is still answered: created: false.
    let again = client.create_timer(first.clone()).await.unwrap();
    assert!(!again.created, "{again:?}");
    // Another namespace is untouched.
    client.create_timer(pull("free", "t-5")).await.unwrap();

    // Phase: a cancel makes room for one more.
    client.cancel_timer("capped", "t-1").await.unwrap();
    client.create_timer(pull("capped", "t-5")).await.unwrap();
    assert_eq!(client.create_timer(pull("capped", "t-6")).await.unwrap_err().code(), tonic::Code::ResourceExhausted);

    // Phase: a create rate of 5/s refuses a burst of 20, then admits again.
    let (ok, out, err) = namespace_cli(&node.grpc, &["set-quota", "rated", "--creates-per-sec", "5"]);
    assert!(ok, "{out}{err}");
    // Sent at once, so the bucket refills little meanwhile; the bound
    // allows for what it did refill.
    let started = std::time::Instant::now();
    let burst = (0..20).map(|i| client.create_timer(pull("rated", &format!("r-{i}"))));
    let results = futures::future::join_all(burst).await;
    let elapsed_s = started.elapsed().as_secs_f64();
    let mut admitted = 0;
    for r in &results {
        match r {
            Ok(_) => admitted += 1,
            Err(e) => assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}"),
        }
    }
    let bound = 5 + (elapsed_s * 5.0).ceil() as usize;
    assert!((5..=bound).contains(&admitted) && admitted < 20, "admitted {admitted} of 20 in {elapsed_s:.2} s");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    client.create_timer(pull("rated", "r-after")).await.unwrap();

    // Phase: the quota cleared, creates pass again.
    let (ok, out, err) = namespace_cli(&node.grpc, &["clear-quota", "capped"]);
    assert!(ok && out.contains("cleared"), "{out}{err}");
    client.create_timer(pull("capped", "t-6")).await.unwrap();
    let (ok, out, _) = namespace_cli(&node.grpc, &["clear-quota", "capped"]);
    assert!(ok && out.contains("nothing to clear"), "{out}");

    // Bad input: no limit given, a malformed namespace.
    let (ok, _, err) = namespace_cli(&node.grpc, &["set-quota", "capped"]);
    assert!(!ok && err.contains("--max-pending"), "{err}");
    let (ok, _, err) = namespace_cli(&node.grpc, &["set-quota", "no spaces", "--max-pending", "1"]);
    assert!(!ok && err.contains("namespace"), "{err}");

    let http = tocsin_contract::tls::http_client_builder().build().unwrap();
    let metrics = http.get(format!("http://{}/metrics", node.http)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("tocsin_creates_over_quota_total"), "no quota metric");
}
