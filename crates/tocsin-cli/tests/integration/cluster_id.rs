//! The cluster id in every delivery: a cluster rebuilt from scratch (its
//! data gone, its log indexes and epochs starting again) fires timers whose
//! fire ids and fencing tokens a receiver that saw the old cluster takes as
//! new: the reference receiver (`tocsin sink`, fencing per cluster and
//! shard, deduplicating by fire id) accepts every one, none stale or a
//! duplicate. `tocsin cluster status` names the same id.

use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;

use crate::support::NodeProcess;
use crate::support::now_ms;

struct Sink(Child);

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn records(out: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

async fn wait_records(out: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = now_ms() + 20_000;
    loop {
        let r = records(out);
        if r.len() >= n {
            return r;
        }
        assert!(now_ms() < deadline, "{} of {n} deliveries reached the sink", r.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn cluster_id(grpc: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["cluster", "status", "--addr", grpc, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["cluster_id"].as_str().unwrap().to_string()
}

/// Creates timers `t-0..n` (due at once) and waits for the sink to hold
/// `total` records.
async fn fire(node: &NodeProcess, url: &str, n: usize, out: &std::path::Path, total: usize) -> Vec<serde_json::Value> {
    let client = tocsin_client::Client::connect([node.grpc.clone()]).await.unwrap();
    for i in 0..n {
        client.create_timer(tocsin_client::webhook_timer("rebuilt", &format!("t-{i}"), 100, url)).await.unwrap();
    }
    wait_records(out, total).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_cluster_is_neither_stale_nor_a_duplicate_to_the_receiver() {
    let dir = tempfile::tempdir().unwrap();
    let sink_addr = format!("127.0.0.1:{}", tocsin_node::testing::free_ports(1)[0]);
    let out = dir.path().join("sink.ndjson");
    let _sink = Sink(
        Command::new(env!("CARGO_BIN_EXE_tocsin"))
            .args(["sink", "--listen", &sink_addr, "--quiet", "--out"])
            .arg(&out)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://{sink_addr}/hook");
    // One shard: both clusters' firings land on the same shard at the same
    // log indexes, which is what made their fire ids collide.
    let env = [("TOCSIN_NUM_SHARDS", "1")];

    // Phase: the first cluster fires five timers.
    let first_dir = dir.path().join("first");
    std::fs::create_dir_all(&first_dir).unwrap();
    let mut node = NodeProcess::start(&first_dir, &env);
    let first_id = cluster_id(&node.grpc);
    assert!(tocsin_core::cluster::is_cluster_id(&first_id), "{first_id:?}");
    let first = fire(&node, &url, 5, &out, 5).await;
    assert!(first.iter().all(|r| r["verdict"] == "accepted" && r["cluster_id"] == first_id.as_str()), "{first:?}");
    node.kill9();

    // Phase: rebuilt from nothing (a new data directory), the same timer
    // ids fire again; the receiver keeps its state.
    let second_dir = dir.path().join("second");
    std::fs::create_dir_all(&second_dir).unwrap();
    let node = NodeProcess::start(&second_dir, &env);
    let second_id = cluster_id(&node.grpc);
    assert_ne!(first_id, second_id, "a new cluster draws a new id");
    let all = fire(&node, &url, 5, &out, 10).await;
    let second: Vec<_> = all.iter().filter(|r| r["cluster_id"] == second_id.as_str()).collect();
    assert_eq!(second.len(), 5, "{all:?}");
    for r in &second {
        assert_eq!(r["verdict"], "accepted", "the rebuilt cluster's delivery was refused: {r}");
        let fire_id = r["fire_id"].as_str().unwrap();
        let (cluster, shard, _) = tocsin_core::timer::parse_fire_id(fire_id).expect("a fire id");
        assert_eq!((cluster, shard), (second_id.as_str(), 0));
        assert!(first.iter().all(|f| f["fire_id"] != fire_id), "fire id {fire_id} repeats the old cluster's");
    }
    // The epochs started again: without the cluster id they were stale.
    let old_max = first.iter().map(|r| r["epoch"].as_u64().unwrap()).max().unwrap();
    assert!(second.iter().any(|r| r["epoch"].as_u64().unwrap() <= old_max), "epochs did not start again");
}
