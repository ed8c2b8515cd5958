//! Cluster operations end to end, under a steady stream of webhook timers:
//! three nodes form a cluster whose metadata group bootstraps the cluster
//! map; `tocsin admin node add` brings in a fourth (started with `--join`)
//! while the metadata leader is killed, and a second run completes it; a
//! request routed by a stale map is refused; `shard move` puts a replica on
//! a node that held none of it; `node remove` drains node 1 and is
//! idempotent, and its id cannot come back; a removal that would cost a
//! shard its quorum is refused; `node decommission` replaces a dead node's
//! replicas. Every map change raises the epoch. Every timer whose create
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
    let (ok, text) = admin_quiet(addr, args);
    println!("$ tocsin admin {}\n{text}", args.join(" "));
    (ok, text)
}

/// [`admin`] without echoing the output (a failing test prints what it
/// printed, and a status listing is hundreds of lines).
fn admin_quiet(addr: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["admin", "--addr", addr])
        .args(args)
        .output()
        .expect("run tocsin admin");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Every shard's voters, from the merged shard map, once every shard has a
/// leader and its voters are the map's target (waits up to 30 s for that).
async fn placements(client: &Client) -> Vec<BTreeSet<u64>> {
    let deadline = now_ms() + 30_000;
    loop {
        if let Ok(map) = client.shard_map().await {
            let settled = map.shards.iter().all(|s| {
                let mut voters = s.replicas.clone();
                voters.sort_unstable();
                s.leader != 0 && voters == s.target
            });
            if settled || now_ms() > deadline {
                let mut out = vec![BTreeSet::new(); map.num_shards as usize];
                for s in map.shards {
                    out[s.shard as usize] = s.replicas.into_iter().collect();
                }
                return out;
            }
        }
        assert!(now_ms() < deadline, "no shard map with a leader for every shard");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `tocsin admin status --json` from `addr`.
fn status(addr: &str) -> serde_json::Value {
    let (ok, out) = admin_quiet(addr, &["status", "--json"]);
    println!("$ tocsin admin status --json: {} bytes", out.len());
    assert!(ok || out.contains("\"shards\""), "status failed:\n{out}");
    serde_json::from_str(&out[out.find('{').expect("json")..]).expect("status json")
}

/// The cluster map as the shard-aware client loads it.
async fn map_of(client: &Client) -> pb::ShardMap {
    client.shard_map().await.expect("shard map")
}

/// Node `id`'s state in `map`.
fn state_of(map: &pb::ShardMap, id: u64) -> Option<pb::node_info::State> {
    map.nodes.iter().find(|n| n.node_id == id).and_then(|n| pb::node_info::State::try_from(n.state).ok())
}

/// The metadata group's leader, as any node that answers says.
async fn metadata_leader(seeds: &[String]) -> u64 {
    let deadline = now_ms() + 20_000;
    loop {
        for seed in seeds {
            if let Ok(mut c) = pb::admin_service_client::AdminServiceClient::connect(format!("http://{seed}")).await
                && let Ok(info) = c.get_cluster(pb::GetClusterRequest { digests: false }).await
                && let Some(m) = info.into_inner().metadata
                && m.hosted
                && m.leader != 0
            {
                return m.leader;
            }
        }
        assert!(now_ms() < deadline, "the metadata group has no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The snapshot bytes a finished `node add` reports.
fn bytes_streamed(out: &str) -> u64 {
    let at = out.rfind(" snapshot bytes streamed").expect("a byte count");
    out[..at].rsplit(' ').next().unwrap().parse().expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn add_drain_remove_and_decommission_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let ports = free_ports(12);
    let addrs: Vec<[String; 3]> = ports.chunks(3).map(|p| [0, 1, 2].map(|k| format!("127.0.0.1:{}", p[k]))).collect();
    let initial = (0..3).map(|i| format!("{}={}", i + 1, addrs[i].join("/"))).collect::<Vec<_>>().join(",");

    // Phase: three nodes, eight shards, three replicas each. Snapshots every
    // 20 entries, keeping 5: a replica added later catches up by snapshot.
    let mut nodes: HashMap<u64, NodeProcess> = HashMap::new();
    for id in 1..=3u64 {
        let [grpc, http, peer] = &addrs[id as usize - 1];
        let node = NodeProcess::start_member(
            dir.path(),
            id,
            [grpc, http, peer],
            &["--initial-cluster", &initial],
            SMALL_SNAPSHOTS,
        );
        nodes.insert(id, node);
    }
    for node in nodes.values_mut() {
        node.wait_ready();
    }
    let options = ClientOptions { request_timeout: Duration::from_secs(3), max_attempts: 30, ..Default::default() };
    let seeds: Vec<String> = addrs.iter().map(|a| a[0].clone()).collect();
    let client = Client::with_options(seeds.clone(), options).await.unwrap();
    let before = placements(&client).await;
    assert!(before.iter().all(|v| *v == BTreeSet::from([1, 2, 3])), "{before:?}");
    // The metadata group bootstrapped the map: three active nodes, every
    // shard placed at epoch 1.
    let map = map_of(&client).await;
    assert_eq!(map.epoch, 1, "{map:?}");
    assert!((1..=3).all(|id| state_of(&map, id) == Some(pb::node_info::State::Active)));
    assert!(map.shards.iter().all(|s| s.shard_epoch == 1 && s.target == vec![1, 2, 3]));
    let st = status(&seeds[0]);
    assert_eq!(st["metadata"]["voters"], serde_json::json!([1, 2, 3]), "{st}");

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
    let [grpc4, http4, peer4] = &addrs[3];
    let mut n4 = NodeProcess::start_member(
        dir.path(),
        4,
        [grpc4, http4, peer4],
        &["--join", "--initial-cluster", &initial],
        SMALL_SNAPSHOTS,
    );
    n4.wait_ready();
    nodes.insert(4, n4);

    // Phase: `node add 4` runs while the metadata leader is killed as soon
    // as the map names node 4; the first run may fail with it, the second
    // completes the add. The logs were purged behind snapshots, so node 4
    // catches up by snapshot.
    let first_add = {
        let (seed, grpc4) = (seeds[0].clone(), grpc4.clone());
        std::thread::spawn(move || admin(&seed, &["node", "add", &grpc4]))
    };
    let deadline = now_ms() + 30_000;
    while state_of(&map_of(&client).await, 4) != Some(pb::node_info::State::Joining) {
        assert!(now_ms() < deadline, "the map never had node 4 joining");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let meta_leader = metadata_leader(&seeds).await;
    println!("killing the metadata leader, node {meta_leader}, mid-add");
    nodes.get_mut(&meta_leader).unwrap().kill9();
    let (first_ok, first_out) = first_add.join().unwrap();
    println!("first node add: ok={first_ok}");
    nodes.get_mut(&meta_leader).unwrap().restart();
    let (ok, out) = admin(&seeds[1], &["node", "add", grpc4]);
    assert!(ok && out.contains("node 4 added"), "node add failed:\n{out}");
    let streamed = bytes_streamed(&out) + if first_ok { bytes_streamed(&first_out) } else { 0 };
    println!("snapshot bytes streamed to node 4: {streamed}");
    let after_add = placements(&client).await;
    let on4 = after_add.iter().filter(|v| v.contains(&4)).count();
    assert!(on4 > 0, "node 4 holds no replica: {after_add:?}");
    assert!(after_add.iter().all(|v| v.len() == 3), "{after_add:?}");
    let map = map_of(&client).await;
    assert_eq!(state_of(&map, 4), Some(pb::node_info::State::Active), "{map:?}");
    // Adding (joining) and activating node 4 are two changes.
    assert_eq!(map.epoch, 3, "{map:?}");
    let epoch_after_add = map.epoch;
    // Re-running the add changes nothing and still succeeds.
    let (ok, out) = admin(&seeds[1], &["node", "add", grpc4]);
    assert!(ok, "re-running node add failed:\n{out}");
    assert_eq!(placements(&client).await, after_add);
    assert_eq!(map_of(&client).await.epoch, epoch_after_add);

    // Phase: a request routed by the epoch-1 map, for a shard that moved
    // since, is refused with ABORTED and the current epoch; routed by the
    // current map it is served. The shard-aware client refreshes by itself.
    let moved = map.shards.iter().find(|s| s.shard_epoch > 1).expect("some shard moved to node 4");
    let id = (0..).map(|i| format!("stale-{i}")).find(|id| client.shard_of("ops", id) == moved.shard).unwrap();
    let mut raw = pb::timer_service_client::TimerServiceClient::connect(format!("http://{}", seeds[1])).await.unwrap();
    let create = |epoch: u64| {
        let mut req = tonic::Request::new(tocsin_client::webhook_timer("ops", &id, 600_000, &receiver.url));
        req.metadata_mut().insert(tocsin_client::MAP_EPOCH_HEADER, epoch.into());
        req
    };
    let refused = raw.create_timer(create(1)).await.expect_err("a stale route must be refused");
    assert_eq!(refused.code(), tonic::Code::Aborted, "{refused:?}");
    let info = tocsin_contract::codes::info_of(&refused);
    assert_eq!(info.map_epoch, epoch_after_add);
    assert!(info.message.contains("stale shard map"), "{}", info.message);
    // Routed by the current map it is served. The balancer may be moving
    // the shard's leadership at this moment (node 4 just joined): a new
    // leader answers UNAVAILABLE with a retry hint until its epoch entry
    // commits, and a client retries that, as this one does.
    let mut attempts = 0;
    loop {
        match raw.create_timer(create(epoch_after_add)).await {
            Ok(_) => break,
            Err(e) if e.code() == tonic::Code::Unavailable && attempts < 50 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("routed by the current map: {e:?}"),
        }
    }
    client.cancel_timer("ops", &id).await.unwrap();

    // Phase: move one replica of a shard onto node 4, which holds none of
    // it (the map knows node 4, so it need not hold any replica already).
    let (shard, from) = after_add
        .iter()
        .enumerate()
        .find_map(|(s, v)| (!v.contains(&4)).then(|| (s, *v.iter().next().unwrap())))
        .expect("a shard without node 4");
    let (ok, out) =
        admin(&seeds[1], &["shard", "move", "--shard", &shard.to_string(), "--from", &from.to_string(), "--to", "4"]);
    assert!(ok, "shard move failed:\n{out}");
    let after_move = placements(&client).await;
    assert!(after_move[shard].contains(&4) && !after_move[shard].contains(&from), "{after_move:?}");
    assert_eq!(map_of(&client).await.epoch, epoch_after_add + 1);

    // Phase: drain and remove node 1, which leads some shards and is a
    // metadata voter.
    let (ok, out) = admin(&seeds[1], &["node", "remove", "1"]);
    assert!(ok && out.contains("drained and removed"), "node remove failed:\n{out}");
    let after_remove = placements(&client).await;
    assert!(after_remove.iter().all(|v| !v.contains(&1) && v.len() == 3), "{after_remove:?}");
    let (ok, out) = admin(&seeds[1], &["node", "remove", "1"]);
    assert!(ok && out.contains("was removed at map epoch"), "re-running node remove:\n{out}");
    let map = map_of(&client).await;
    assert_eq!(state_of(&map, 1), Some(pb::node_info::State::Removed), "{map:?}");
    let st = status(&seeds[1]);
    assert_eq!(st["metadata"]["voters"], serde_json::json!([2, 3, 4]), "{st}");
    // Node 1 dropped its replicas, the metadata one included, and their data.
    let mut n1 = pb::admin_service_client::AdminServiceClient::connect(format!("http://{}", seeds[0])).await.unwrap();
    let info = n1.get_cluster(pb::GetClusterRequest { digests: false }).await.unwrap().into_inner();
    assert_eq!(info.node_id, 1);
    assert!(
        info.shards.is_empty() && !info.metadata.as_ref().unwrap().hosted,
        "node 1 still hosts {:?} (metadata: {:?}); its log:\n{}",
        info.shards.iter().map(|s| s.shard).collect::<Vec<_>>(),
        info.metadata,
        nodes[&1].log()
    );
    // Its id is never reused, whatever the address.
    let (ok, out) = admin(&seeds[1], &["node", "add", &seeds[0]]);
    assert!(!ok && out.contains("never reused"), "re-adding a removed id was not refused:\n{out}");

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
    let map = map_of(&client).await;
    assert_eq!(state_of(&map, 4), Some(pb::node_info::State::Removed), "{map:?}");

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
