//! Client and peer traffic on separate ports: every peer RPC is refused on
//! the client port, cluster operations are refused on the peer port, and a
//! three-node cluster forms, replicates and forwards over its peer ports.

use std::collections::BTreeMap;
use std::time::Duration;

use tocsin_client::v1 as pb;
use tocsin_client::v1::admin_service_client::AdminServiceClient;
use tocsin_client::v1::raft_transport_client::RaftTransportClient;
use tocsin_client::v1::replica_control_client::ReplicaControlClient;
use tocsin_client::v1::timer_service_client::TimerServiceClient;

use crate::support::NodeProcess;
use crate::support::Receiver;

fn denied<T: std::fmt::Debug>(what: &str, result: Result<T, tonic::Status>) {
    let err = result.expect_err(what);
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{what}: {err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_port_refuses_peer_rpcs_and_the_peer_port_refuses_operations() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let client_port = format!("http://{}", node.grpc);
    let peer_port = format!("http://{}", node.peer);

    // Phase: every ReplicaControl RPC on the client port.
    let mut control = ReplicaControlClient::connect(client_port.clone()).await.unwrap();
    denied("host_shard", control.host_shard(pb::HostShardRequest { shard: 0, metadata: false }).await);
    denied(
        "release_shard",
        control.release_shard(pb::ReleaseShardRequest { shard: 0, metadata: true, membership_index: 0 }).await,
    );
    denied(
        "propose_cluster",
        control.propose_cluster(pb::ProposeClusterRequest { command: vec![1, 2, 3].into() }).await,
    );
    denied("read_cluster_map", control.read_cluster_map(pb::ReadClusterMapRequest { linearizable: false }).await);

    // Phase: a snapshot pushed at the client port.
    let mut transport = RaftTransportClient::connect(client_port.clone()).await.unwrap();
    let chunk = pb::SnapshotChunk {
        group_id: 0,
        from_node: 2,
        header: vec![0; 16].into(),
        offset: 0,
        data: vec![0; 1024].into(),
        done: true,
    };
    denied("install_snapshot", transport.install_snapshot(futures::stream::iter([chunk])).await);

    // Phase: the same reads answer on the peer port, where they belong.
    let mut control = ReplicaControlClient::connect(peer_port.clone()).await.unwrap();
    let map = control.read_cluster_map(pb::ReadClusterMapRequest { linearizable: false }).await;
    assert!(map.is_ok(), "the peer port serves ReplicaControl: {map:?}");

    // Phase: cluster operations on the peer port; reads answer there.
    let mut admin = AdminServiceClient::connect(peer_port.clone()).await.unwrap();
    denied(
        "transfer_leader on the peer port",
        admin.transfer_leader(pb::TransferLeaderRequest { shard: 0, to_node: 1 }).await,
    );
    denied("rebalance on the peer port", admin.rebalance(pb::RebalanceRequest { dry_run: true }).await);
    denied("remove_node on the peer port", admin.remove_node(pb::RemoveNodeRequest { node_id: 1 }).await);
    let info = admin.get_cluster(pb::GetClusterRequest { digests: false }).await.unwrap().into_inner();
    let me = info.nodes.iter().find(|n| n.node_id == 1).expect("the node lists itself");
    assert_eq!((me.grpc_addr.as_str(), me.peer_addr.as_str()), (node.grpc.as_str(), node.peer.as_str()));

    // Phase: the client port still serves clients and operators.
    let mut admin = AdminServiceClient::connect(client_port.clone()).await.unwrap();
    let dry = admin.rebalance(pb::RebalanceRequest { dry_run: true }).await;
    assert!(dry.is_ok(), "operations answer on the client port: {dry:?}");
    let mut timers = TimerServiceClient::connect(client_port).await.unwrap();
    let got = timers
        .get_timer(pb::GetTimerRequest { namespace: "ns".into(), id: "none".into(), include_attempts: false })
        .await
        .expect_err("no such timer");
    assert_eq!(got.code(), tonic::Code::NotFound, "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_replicate_and_forward_over_their_peer_ports() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let nodes = NodeProcess::start_three(dir.path(), |_| Vec::new());

    // Every node knows every other's client and peer address, as given.
    let mut admin = AdminServiceClient::connect(format!("http://{}", nodes[0].grpc)).await.unwrap();
    let info = admin.get_cluster(pb::GetClusterRequest { digests: false }).await.unwrap().into_inner();
    let seen: BTreeMap<u64, (String, String)> =
        info.nodes.iter().map(|n| (n.node_id, (n.grpc_addr.clone(), n.peer_addr.clone()))).collect();
    for n in &nodes {
        assert_eq!(seen.get(&n.node_id), Some(&(n.grpc.clone(), n.peer.clone())), "{seen:?}");
    }

    // Plain (not shard-aware) gRPC clients, one per node, in turn: a
    // create for a shard another node leads is forwarded over the peer
    // ports (right after bootstrap node 1 leads most shards, so creates
    // sent to nodes 2 and 3 are).
    let mut clients = Vec::new();
    for n in &nodes {
        clients.push(TimerServiceClient::connect(format!("http://{}", n.grpc)).await.unwrap());
    }
    let now = crate::support::now_ms();
    let mut forwarded = 0;
    for i in 0..40 {
        let mut req = tocsin_client::webhook_timer("peers", &format!("t-{i}"), 0, &receiver.url);
        req.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(now + 1_500));
        let resp = crate::support::create_retrying_unavailable(&mut clients[i % 3], req)
            .await
            .expect("created, here or at the leader");
        if resp.metadata().get("x-tocsin-leader").is_some() {
            forwarded += 1;
        }
    }
    assert!(forwarded > 0, "some of 40 creates were answered by another node");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while receiver.delivered().len() < 40 {
        assert!(tokio::time::Instant::now() < deadline, "delivered {} of 40", receiver.delivered().len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
