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
            let info = client.cluster_with(digests).await.context("asking for the cluster's state")?;
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

fn print_status(info: &pb::ClusterInfo, digests: bool) {
    println!("answered by node {}; {} shards; map epoch {}", info.node_id, info.num_shards, info.map_epoch);
    println!("{:>6}  {:<28} http", "node", "grpc");
    for n in &info.nodes {
        println!("{:>6}  {:<28} {}", n.node_id, n.grpc_addr, n.http_addr);
    }
    println!();
    print!(
        "{:>5} {:>6} {:>6} {:>6} {:<10} {:>10} {:>10} {:>9} {:>9}  lag",
        "shard", "leader", "term", "epoch", "voters", "committed", "applied", "pending", "firing"
    );
    println!("{}", if digests { "  digest@index (timers)" } else { "" });
    for s in &info.shards {
        let voters = s.replicas.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let mut lag: Vec<_> = s.lag.iter().map(|(n, l)| format!("{n}:{l}")).collect();
        lag.sort();
        let leader = if s.leader == 0 { "-".to_string() } else { s.leader.to_string() };
        print!(
            "{:>5} {:>6} {:>6} {:>6} {:<10} {:>10} {:>10} {:>9} {:>9}  {}",
            s.shard,
            leader,
            s.term,
            s.epoch,
            voters,
            s.committed_index,
            s.applied_index,
            s.pending_timers,
            s.firing_timers,
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
            "node_id": n.node_id, "grpc_addr": n.grpc_addr, "http_addr": n.http_addr,
        })).collect::<Vec<_>>(),
        "shards": info.shards.iter().map(|s| serde_json::json!({
            "shard": s.shard, "leader": s.leader, "term": s.term, "epoch": s.epoch,
            "voters": s.replicas, "learners": s.learners,
            "committed_index": s.committed_index, "applied_index": s.applied_index,
            "pending_timers": s.pending_timers, "firing_timers": s.firing_timers,
            "lag": s.lag, "state_digest": s.state_digest, "digest_applied_index": s.digest_applied_index,
            "timer_count": s.timer_count,
        })).collect::<Vec<_>>(),
    })
}
