//! Cluster operations end to end, under a steady stream of webhook timers:
//! three nodes form a cluster; `tocsin admin node add` brings in a fourth
//! (started with `--join`); `node remove` drains node 1 and is idempotent;
//! a removal that would cost a shard its quorum is refused; `node
//! decommission` replaces a dead node's replicas. Every timer whose create
//! was acknowledged and that was not cancelled is delivered, none early.

use std::collections::BTreeSet;
use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tocsin_client::Client;
use tocsin_client::ClientOptions;
use tocsin_client::v1 as pb;

use crate::support::Fate;
use crate::support::NodeProcess;
use crate::support::Receiver;
use crate::support::create_and_cancel_fifth;
use crate::support::free_ports;
use crate::support::now_ms;
use crate::support::percentiles;

const SMALL_SNAPSHOTS: &[(&str, &str)] =
    &[("TOCSIN_RAFT__SNAPSHOT_EVERY_ENTRIES", "20"), ("TOCSIN_RAFT__KEEP_ENTRIES_AFTER_SNAPSHOT", "5")];

/// Runs `tocsin admin …` against `addr`; returns (success, stdout + stderr).
fn admin(addr: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["admin", "--addr", addr])
        .args(args)
        .output()
        .expect("run tocsin admin");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("$ tocsin admin {}\n{text}", args.join(" "));
    (out.status.success(), text)
}

/// Every shard's voters, from the merged shard map, once every shard has a
/// leader (waits up to 20 s for that).
async fn placements(client: &Client) -> Vec<BTreeSet<u64>> {
    let deadline = now_ms() + 20_000;
    loop {
        if let Ok(map) = client.shard_map().await
            && (map.shards.iter().all(|s| s.leader != 0) || now_ms() > deadline)
        {
            let mut out = vec![BTreeSet::new(); map.num_shards as usize];
            for s in map.shards {
                out[s.shard as usize] = s.replicas.into_iter().collect();
            }
            return out;
        }
        assert!(now_ms() < deadline, "no shard map with a leader for every shard");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn add_drain_remove_and_decommission_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let ports = free_ports(8);
    let addrs: Vec<(String, String)> =
        ports.chunks(2).map(|p| (format!("127.0.0.1:{}", p[0]), format!("127.0.0.1:{}", p[1]))).collect();
    let initial = (0..3).map(|i| format!("{}={}/{}", i + 1, addrs[i].0, addrs[i].1)).collect::<Vec<_>>().join(",");

    // Phase: three nodes, eight shards, three replicas each. Snapshots every
    // 20 entries, keeping 5: a replica added later catches up by snapshot.
    let mut nodes: HashMap<u64, NodeProcess> = HashMap::new();
    for id in 1..=3u64 {
        let (grpc, http) = &addrs[id as usize - 1];
        let node =
            NodeProcess::start_member(dir.path(), id, grpc, http, &["--initial-cluster", &initial], SMALL_SNAPSHOTS);
        nodes.insert(id, node);
    }
    for node in nodes.values_mut() {
        node.wait_ready();
    }
    let options = ClientOptions { request_timeout: Duration::from_secs(3), max_attempts: 30, ..Default::default() };
    let seeds: Vec<String> = addrs.iter().map(|a| a.0.clone()).collect();
    let client = Client::with_options(seeds.clone(), options).await.unwrap();
    let before = placements(&client).await;
    assert!(before.iter().all(|v| *v == BTreeSet::from([1, 2, 3])), "{before:?}");

    // Phase: steady load in the background — 40 timers every 100 ms, due
    // 2–6 s ahead, every fifth cancelled — for as long as the operations run.
    let fates: Arc<Mutex<Vec<(String, Fate, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (client, fates, stop, url) = (client.clone(), fates.clone(), stop.clone(), receiver.url.clone());
        tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let base = now_ms();
                let reqs: Vec<pb::CreateTimerRequest> = (0..40u64)
                    .map(|i| {
                        let mut r = tocsin_client::webhook_timer("ops", &format!("t-{round}-{i}"), 0, &url);
                        r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(base + 2_000 + i * 100));
                        r
                    })
                    .collect();
                let got = create_and_cancel_fifth(&client, reqs).await;
                fates.lock().unwrap().extend(got);
                round += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Phase: node 4 starts empty and is added. Like a StatefulSet pod, it is
    // given the same --initial-cluster as the others, which does not list it.
    let (grpc4, http4) = &addrs[3];
    let mut n4 = NodeProcess::start_member(
        dir.path(),
        4,
        grpc4,
        http4,
        &["--join", "--initial-cluster", &initial],
        SMALL_SNAPSHOTS,
    );
    n4.wait_ready();
    nodes.insert(4, n4);
    let (ok, out) = admin(&seeds[0], &["node", "add", grpc4]);
    assert!(ok && out.contains("node 4 added"), "node add failed:\n{out}");
    // The logs were purged behind snapshots, so node 4 caught up by snapshot;
    // the leader waits for that before promoting it, and reports the bytes.
    assert!(out.contains(" snapshot bytes streamed)"), "no move streamed a snapshot:\n{out}");
    let after_add = placements(&client).await;
    let on4 = after_add.iter().filter(|v| v.contains(&4)).count();
    assert!(on4 > 0, "node 4 holds no replica: {after_add:?}");
    assert!(after_add.iter().all(|v| v.len() == 3), "{after_add:?}");
    // Re-running the add changes nothing and still succeeds.
    let (ok, out) = admin(&seeds[1], &["node", "add", grpc4]);
    assert!(ok, "re-running node add failed:\n{out}");
    assert_eq!(placements(&client).await, after_add);

    // Phase: drain and remove node 1, which leads some shards.
    let (ok, out) = admin(&seeds[1], &["node", "remove", "1"]);
    assert!(ok && out.contains("drained and removed"), "node remove failed:\n{out}");
    let after_remove = placements(&client).await;
    assert!(after_remove.iter().all(|v| !v.contains(&1) && v.len() == 3), "{after_remove:?}");
    let (ok, out) = admin(&seeds[1], &["node", "remove", "1"]);
    assert!(ok && out.contains("holds no replica"), "re-running node remove:\n{out}");
    // Node 1 dropped its replicas and their data.
    let mut n1 = pb::admin_service_client::AdminServiceClient::connect(format!("http://{}", seeds[0])).await.unwrap();
    let info = n1.get_cluster(pb::GetClusterRequest { digests: false }).await.unwrap().into_inner();
    assert_eq!(info.node_id, 1);
    assert!(
        info.shards.is_empty(),
        "node 1 still hosts {:?}; its log:\n{}",
        info.shards.iter().map(|s| s.shard).collect::<Vec<_>>(),
        nodes[&1].log()
    );

    // Phase: with node 4 dead, removing node 2 would leave shards on {3, 4}
    // with only node 3 answering: refused before anything moves.
    nodes.get_mut(&4).unwrap().kill9();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (ok, out) = admin(&seeds[1], &["node", "remove", "2"]);
    assert!(!ok && out.contains("no quorum"), "a quorum-losing removal was not refused:\n{out}");
    let (ok, out) = admin(&seeds[1], &["node", "remove", "4"]);
    assert!(!ok && out.contains("decommission"), "removing a dead node should point at decommission:\n{out}");

    // Phase: decommission the dead node 4: its replicas come from 2 and 3.
    let (ok, out) = admin(&seeds[1], &["node", "decommission", "4"]);
    assert!(ok && out.contains("decommissioned"), "node decommission failed:\n{out}");
    let after_decommission = placements(&client).await;
    assert!(after_decommission.iter().all(|v| *v == BTreeSet::from([2, 3])), "{after_decommission:?}");

    // Phase: stop the load, then every timer that must fire has fired.
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();
    let fates = fates.lock().unwrap().clone();
    let last_due = fates.iter().map(|f| f.2).max().unwrap_or(0);
    let must: Vec<&(String, Fate, u64)> = fates.iter().filter(|f| f.1 == Fate::MustFire).collect();
    let deadline = last_due + 20_000;
    loop {
        let delivered = receiver.delivered();
        let missing = must.iter().filter(|f| !delivered.contains_key(&f.0)).count();
        if missing == 0 {
            break;
        }
        assert!(now_ms() < deadline, "{missing} of {} timers were never delivered", must.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let delivered = receiver.delivered();
    let mut lateness = Vec::new();
    for (id, fate, fire_at) in &fates {
        let Some(seen) = delivered.get(id) else { continue };
        assert_ne!(*fate, Fate::Cancelled, "timer {id} was cancelled but delivered");
        for s in seen {
            assert!(s.recv_ms >= *fire_at, "timer {id} arrived {} ms early", fire_at - s.recv_ms);
        }
        lateness.push(seen.iter().map(|s| s.recv_ms).min().unwrap() - fire_at);
    }
    println!(
        "{} timers created, {} must fire, all delivered; lateness {}",
        fates.len(),
        must.len(),
        percentiles(lateness)
    );
    assert!(must.len() > 500, "too little load to mean anything: {}", must.len());
}
