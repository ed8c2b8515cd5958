//! Three nodes in one process, in linear phases: forwarding and where
//! admission is charged, the proposer's batching, then the fire loop
//! delivering what was created, through the Reserve relay.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::cluster::id_on_shard;
use crate::cluster::now_ms;
use crate::cluster::pull_create;

const SHARDS: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forwarding_batching_and_firing_in_one_process() {
    // Every node but the first admits at most one create per second per
    // namespace: a create it forwards must not be charged there.
    let cluster = Cluster::start(3, SHARDS, |i, config| {
        if i > 0 {
            config.admission.create_rate_per_namespace = 1;
        }
    })
    .await;
    // Leadership of shard 0 on node 1 (index 0), the unlimited one.
    let mut leader = cluster.leader_of(0).await;
    if leader != 0 {
        let ctx = cluster.nodes[leader].state.shards.get(0).unwrap();
        ctx.raft.trigger().transfer_leader(1).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while cluster.leader_of(0).await != 0 {
            assert!(tokio::time::Instant::now() < deadline, "leadership moved to node 1");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        leader = 0;
    }
    let follower = 1;
    let due_ms = now_ms() + 3_000;

    // Phase: 20 creates for shard 0 sent to a follower whose own admission
    // allows one a second. Each is forwarded to the leader in one hop, the
    // answer names the leader, and none is refused by the follower's limit.
    let mut client = cluster.timers(follower).await;
    let mut created = BTreeSet::new();
    for n in 0..20 {
        let id = id_on_shard("fwd", 0, SHARDS, n);
        let resp = client.create_timer(pull_create("fwd", &id, due_ms)).await.expect("forwarded create succeeds");
        let answered_by = resp.metadata().get(tocsin_contract::headers::LEADER).expect("the leader is named");
        assert_eq!(answered_by.to_str().unwrap(), (leader + 1).to_string());
        assert!(resp.into_inner().created);
        created.insert(id);
    }
    // The follower still charges what it proposes itself: its limit holds
    // for a shard it leads.
    let own = (0..SHARDS)
        .find(|s| cluster.nodes[follower].state.shards.get(*s).is_some_and(|ctx| ctx.check_leader().is_ok()));
    if let Some(shard) = own {
        let mut refused = 0;
        for n in 0..5 {
            let id = id_on_shard("fwd", shard, SHARDS, n);
            match client.create_timer(pull_create("fwd", &id, due_ms)).await {
                Ok(_) => {
                    created.insert(id);
                }
                Err(s) => {
                    assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
                    refused += 1;
                }
            }
        }
        assert!(refused >= 3, "the follower's own limit applies to what it proposes: {refused} of 5 refused");
    }

    // Phase: 400 concurrent creates on shard 0 at its leader are carried by
    // far fewer Raft entries than commands (the proposer batches).
    let before = cluster.applied(leader, 0);
    let leader_client = cluster.timers(leader).await;
    let ids: Vec<String> = (100..500).map(|n| id_on_shard("fwd", 0, SHARDS, n)).collect();
    let calls = ids.iter().map(|id| {
        let mut c = leader_client.clone();
        let req = pull_create("fwd", id, due_ms);
        async move { c.create_timer(req).await }
    });
    for r in futures::future::join_all(calls).await {
        assert!(r.expect("create succeeds").into_inner().created);
    }
    created.extend(ids);
    let entries = cluster.applied(leader, 0) - before;
    assert!(entries > 0 && entries < 200, "400 creates took {entries} entries");

    // Phase: everything fires (never early) and is delivered once through
    // one Reserve stream opened on a follower, which relays every node's
    // shards; acked deliveries finish their timers.
    crate::cluster::drain_reserve(&mut client, "fwd", &created, Duration::from_secs(30)).await;
    cluster.shutdown().await;
}
