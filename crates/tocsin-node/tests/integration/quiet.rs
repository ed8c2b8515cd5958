//! Quiet groups (`shard/quiet.rs`) on three nodes in one process, in
//! linear phases: idle groups go quiet and heartbeat rarely without any
//! follower campaigning, a write to a quiet group is answered at once, a
//! quiet group's timers fire on time, and a quiet group whose leader node
//! falls silent gets a new leader.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use tocsin_proto::v1 as pb;

use crate::cluster::Cluster;
use crate::cluster::id_on_shard;
use crate::cluster::now_ms;
use crate::cluster::pull_create;

const SHARDS: u32 = 4;
/// Node ids 11-13: the fault point this test arms names a node id, and the
/// other tests of this binary use 1-3.
const FIRST_ID: u64 = 11;

/// Each node's (shard, current term) for every shard it hosts.
fn terms(cluster: &Cluster) -> Vec<Vec<(u32, u64)>> {
    cluster
        .nodes
        .iter()
        .map(|node| {
            (0..SHARDS)
                .filter_map(|s| {
                    node.state.shards.get(s).map(|ctx| (s, ctx.raft.metrics().borrow_watched().current_term))
                })
                .collect()
        })
        .collect()
}

/// Whether every shard's leader lists it as quiet.
async fn all_quiet(cluster: &Cluster) -> bool {
    let now = tokio::time::Instant::now();
    for shard in 0..SHARDS {
        let leader = cluster.leader_of(shard).await;
        if !cluster.nodes[leader]
            .state
            .quiet
            .listed(now, Duration::from_millis(120))
            .iter()
            .any(|(g, _)| *g == u64::from(shard))
        {
            return false;
        }
    }
    true
}

async fn wait_all_quiet(cluster: &Cluster, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while !all_quiet(cluster).await {
        assert!(tokio::time::Instant::now() < deadline, "every shard quiet within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates a timer, retrying while the answer is UNAVAILABLE (a leadership
/// that just moved), as the client library does; returns whether it was
/// created.
async fn create(
    client: &mut pb::timer_service_client::TimerServiceClient<tonic::transport::Channel>,
    request: pb::CreateTimerRequest,
) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match client.create_timer(request.clone()).await {
            Ok(resp) => return resp.into_inner().created,
            Err(s) if s.code() == tonic::Code::Unavailable && tokio::time::Instant::now() < deadline => {
                eprintln!("create {}: {} (retrying) at {}", request.id, s.message(), now_ms());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => panic!("create {}: {s:?}", request.id),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_groups_go_quiet_keep_their_leaders_fire_on_time_and_fail_over() {
    let cluster = Cluster::start_from(FIRST_ID, 3, SHARDS, |_, _| {}).await;

    // Phase: the balancer moves each leadership to its preferred node
    // (a handover is a new term, which the quiet phase below must not see).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cluster.nodes[0].state.map.get().is_bootstrapped() {
        assert!(tokio::time::Instant::now() < deadline, "the cluster map is bootstrapped within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let map = cluster.nodes[0].state.map.get();
    let placements: Vec<Vec<u64>> = (0..SHARDS).map(|s| map.replicas(s).to_vec()).collect();
    let preferred = tocsin_core::routing::spread_leaders(&placements);
    for shard in 0..SHARDS {
        let want = preferred[shard as usize].expect("a preferred leader");
        while cluster.nodes[cluster.leader_of(shard).await].state.node_id != want {
            assert!(tokio::time::Instant::now() < deadline, "shard {shard} led by node {want} within 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Phase: one pull timer per shard, due in 5 s.
    let mut client = cluster.timers(0).await;
    let due_ms = now_ms() + 5_000;
    let mut created = BTreeSet::new();
    for shard in 0..SHARDS {
        let id = id_on_shard("quiet", shard, SHARDS, 0);
        assert!(create(&mut client, pull_create("quiet", &id, due_ms)).await);
        created.insert(id);
    }

    // Phase: a second after the last write every shard is quiet, and stays
    // led: over 1.5 s no group changes its term on any node, and the
    // leaders send a few openraft heartbeats instead of one per 40 ms per
    // group (4 groups and the metadata group: 185 in 1.5 s).
    wait_all_quiet(&cluster, Duration::from_secs(3)).await;
    let terms_before = terms(&cluster);
    let heartbeats = |c: &Cluster| c.nodes.iter().map(|n| n.state.quiet.heartbeats()).sum::<u64>();
    let liveness = |c: &Cluster| c.nodes.iter().map(|n| n.state.quiet.liveness_sent()).sum::<u64>();
    let (hb_before, live_before) = (heartbeats(&cluster), liveness(&cluster));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(terms(&cluster), terms_before, "no follower campaigned while its group was quiet");
    let sent = heartbeats(&cluster) - hb_before;
    assert!(sent <= 40, "quiet groups sent {sent} openraft heartbeats in 1.5 s");
    assert!(liveness(&cluster) > live_before, "the quiet groups' leaders sent LIVENESS messages");
    assert!(all_quiet(&cluster).await);

    // Phase: a write to a quiet group is answered at once (its leader has
    // a quorum's recent answer, from the quiet heartbeats).
    let id = id_on_shard("quiet", 0, SHARDS, 1);
    let started = std::time::Instant::now();
    assert!(create(&mut client, pull_create("quiet", &id, due_ms)).await);
    assert!(started.elapsed() < Duration::from_millis(500), "create on a quiet group took {:?}", started.elapsed());
    created.insert(id);

    // Phase: the timers of the groups that stayed quiet fire on time: none
    // early, none more than a second late.
    let latest_ms = crate::cluster::drain_reserve(&mut client, "quiet", &created, Duration::from_secs(15)).await;
    assert!(latest_ms < 1_000, "a quiet group's timer was delivered {latest_ms} ms late");
    eprintln!("quiet groups' timers delivered at most {latest_ms} ms late");

    // Phase: quiet again, shard 1's leader node falls silent (every Raft
    // message it sends, LIVENESS included, is dropped). Its followers stop
    // hearing from it and elect another leader.
    wait_all_quiet(&cluster, Duration::from_secs(5)).await;
    let silent = cluster.leader_of(1).await;
    let silent_id = cluster.nodes[silent].state.node_id;
    fail::cfg(format!("raft::from::{silent_id}"), "return(drop)").unwrap();
    let started = std::time::Instant::now();
    let moved = loop {
        let led_elsewhere = cluster
            .nodes
            .iter()
            .enumerate()
            .any(|(i, node)| i != silent && node.state.shards.get(1).is_some_and(|ctx| ctx.check_leader().is_ok()));
        if led_elsewhere || started.elapsed() > Duration::from_secs(5) {
            break led_elsewhere;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    fail::remove(format!("raft::from::{silent_id}"));
    eprintln!("shard 1 led elsewhere {:?} after its quiet leader's node fell silent", started.elapsed());
    assert!(moved, "shard 1 got a new leader within 5 s of its quiet leader's node falling silent");
    cluster.shutdown().await;
}
