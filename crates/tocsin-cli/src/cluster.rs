//! `tocsin cluster …`: look at a running cluster (nodes, shards, leaders,
//! replication lag) and move a shard's leadership by hand.

use std::process::ExitCode;

use anyhow::Context;
use tocsin_client::Client;
use tocsin_client::v1 as pb;

#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// Nodes and shards as one node sees them.
    Status {
        /// gRPC address of any node (repeat for several).
        #[arg(long = "addr", default_value = "127.0.0.1:7070", env = "TOCSIN_ADDR")]
        addrs: Vec<String>,
        /// Also compute each replica's state digest on the answering node.
        #[arg(long)]
        digests: bool,
        /// Print the raw answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move a shard's leadership to another of its voters.
    TransferLeader {
        #[arg(long = "addr", default_value = "127.0.0.1:7070", env = "TOCSIN_ADDR")]
        addrs: Vec<String>,
        #[arg(long)]
        shard: u32,
        /// The node that should lead it.
        #[arg(long)]
        to: u64,
    },
}

pub async fn run(cmd: ClusterCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ClusterCommand::Status { addrs, digests, json } => {
            let client = Client::connect(addrs).await.context("connecting to the cluster")?;
            let info = whole_cluster(&client, digests).await.context("asking for the cluster's state")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status_json(&info))?);
            } else {
                print_status(&info, digests);
            }
            let leaderless = info.shards.iter().filter(|s| s.leader == 0).count();
            Ok(if leaderless == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        ClusterCommand::TransferLeader { addrs, shard, to } => {
            let client = Client::connect(addrs).await.context("connecting to the cluster")?;
            let leader = client.transfer_leader(shard, to).await.context("transferring the leadership")?;
            if leader == to {
                println!("shard {shard} is led by node {to}");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("shard {shard} is led by node {leader}, not {to}, after the transfer's deadline");
                Ok(ExitCode::FAILURE)
            }
        }
    }
}

/// Every node's view, merged: each shard as its leader reports it (with
/// replication lag), else as any replica does; each node marked by whether
/// it answered.
async fn whole_cluster(client: &Client, digests: bool) -> anyhow::Result<pb::ClusterInfo> {
    let mut merged = client.cluster_with(digests).await?;
    let map = client.shard_map().await?;
    for n in map.nodes {
        if !merged.nodes.iter().any(|m| m.node_id == n.node_id) {
            merged.nodes.push(n);
        }
    }
    merged.nodes.sort_by_key(|n| n.node_id);
    // shard -> (status, reported by its leader)
    let mut shards: std::collections::BTreeMap<u32, (pb::ShardStatus, bool)> = std::collections::BTreeMap::new();
    let answers = futures::future::join_all(merged.nodes.iter().map(|n| node_info(n.grpc_addr.clone(), digests))).await;
    for (node, answer) in merged.nodes.iter_mut().zip(answers) {
        node.reachable = answer.is_some();
        for s in answer.map(|a| a.shards).unwrap_or_default() {
            let by_leader = s.leader == node.node_id;
            let better = match shards.get(&s.shard) {
                None => true,
                Some((have, have_by_leader)) => !have_by_leader && (by_leader || s.term > have.term),
            };
            if better {
                shards.insert(s.shard, (s, by_leader));
            }
        }
    }
    merged.shards = shards.into_values().map(|(s, _)| s).collect();
    Ok(merged)
}

async fn node_info(grpc_addr: String, digests: bool) -> Option<pb::ClusterInfo> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))
        .ok()?
        .connect_timeout(std::time::Duration::from_secs(2))
        .timeout(std::time::Duration::from_secs(20));
    let channel = endpoint.connect().await.ok()?;
    let mut admin = pb::admin_service_client::AdminServiceClient::new(channel);
    admin.get_cluster(pb::GetClusterRequest { digests }).await.ok().map(|r| r.into_inner())
}

fn print_status(info: &pb::ClusterInfo, digests: bool) {
    println!("{} shards; map epoch {}; each shard as its leader reports it", info.num_shards, info.map_epoch);
    println!("{:>6}  {:<5} {:<28} http", "node", "up", "grpc");
    for n in &info.nodes {
        println!("{:>6}  {:<5} {:<28} {}", n.node_id, if n.reachable { "yes" } else { "NO" }, n.grpc_addr, n.http_addr);
    }
    println!();
    print!(
        "{:>5} {:>6} {:>6} {:>6} {:<10} {:>10} {:>10} {:>9} {:>9} {:>8}  lag",
        "shard", "leader", "term", "epoch", "voters", "committed", "applied", "pending", "firing", "late99ms"
    );
    println!("{}", if digests { "  digest@index (timers)" } else { "" });
    for s in &info.shards {
        let voters = s.replicas.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let mut lag: Vec<_> = s.lag.iter().map(|(n, l)| format!("{n}:{l}")).collect();
        lag.sort();
        let leader = if s.leader == 0 { "-".to_string() } else { s.leader.to_string() };
        print!(
            "{:>5} {:>6} {:>6} {:>6} {:<10} {:>10} {:>10} {:>9} {:>9} {:>8}  {}",
            s.shard,
            leader,
            s.term,
            s.epoch,
            voters,
            s.committed_index,
            s.applied_index,
            s.pending_timers,
            s.firing_timers,
            s.lateness_ms_p99,
            if lag.is_empty() { "-".to_string() } else { lag.join(" ") }
        );
        if digests {
            print!("  {:016x}@{} ({})", s.state_digest, s.digest_applied_index, s.timer_count);
        }
        println!();
    }
}

fn status_json(info: &pb::ClusterInfo) -> serde_json::Value {
    serde_json::json!({
        "node_id": info.node_id,
        "num_shards": info.num_shards,
        "map_epoch": info.map_epoch,
        "nodes": info.nodes.iter().map(|n| serde_json::json!({
            "node_id": n.node_id, "grpc_addr": n.grpc_addr, "http_addr": n.http_addr, "reachable": n.reachable,
        })).collect::<Vec<_>>(),
        "shards": info.shards.iter().map(|s| serde_json::json!({
            "shard": s.shard, "leader": s.leader, "term": s.term, "epoch": s.epoch,
            "voters": s.replicas, "learners": s.learners,
            "committed_index": s.committed_index, "applied_index": s.applied_index,
            "pending_timers": s.pending_timers, "firing_timers": s.firing_timers,
            "lateness_ms_p99": s.lateness_ms_p99, "lag": s.lag, "state_digest": s.state_digest, "digest_applied_index": s.digest_applied_index,
            "timer_count": s.timer_count,
        })).collect::<Vec<_>>(),
    })
}
