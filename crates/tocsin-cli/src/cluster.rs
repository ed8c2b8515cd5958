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
            let client = crate::connect(addrs).await.context("connecting to the cluster")?;
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
            let client = crate::connect(addrs).await.context("connecting to the cluster")?;
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
    // The newest cluster map decides the node list and states.
    if map.epoch >= merged.map_epoch {
        merged.map_epoch = map.epoch;
        merged.nodes = map.nodes.clone();
        merged.metadata = map.metadata.clone();
    }
    for n in map.nodes {
        if !merged.nodes.iter().any(|m| m.node_id == n.node_id) {
            merged.nodes.push(n);
        }
    }
    merged.nodes.sort_by_key(|n| n.node_id);
    // shard -> (status, reported by its leader)
    let mut shards: std::collections::BTreeMap<u32, (pb::ShardStatus, bool)> = std::collections::BTreeMap::new();
    let removed = pb::node_info::State::Removed as i32;
    let answers = futures::future::join_all(merged.nodes.iter().map(|n| {
        let ask = n.state != removed;
        let addr = n.grpc_addr.clone();
        async move { if ask { node_info(addr, digests).await } else { None } }
    }))
    .await;
    for (node, answer) in merged.nodes.iter_mut().zip(answers) {
        node.reachable = answer.is_some();
        // A metadata voter's own report is the best one.
        if let Some(meta) = answer.as_ref().and_then(|a| a.metadata.clone())
            && better_metadata(&meta, merged.metadata.as_ref(), node.node_id)
        {
            merged.metadata = Some(meta);
        }
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

/// Whether node `reporter`'s report of the metadata group, `meta`, is
/// better than the one `have`: only a replica's own report counts, and only
/// one that names the group's voters (a replica that has heard of the
/// group's leader but not yet received its membership reports none: seen
/// right after a cluster starts, when it made `admin status` show no
/// voters). Then a newer term wins; in the same term, the leader's own
/// report, or any report that names a leader where `have` names none.
fn better_metadata(meta: &pb::MetadataStatus, have: Option<&pb::MetadataStatus>, reporter: u64) -> bool {
    if !meta.hosted || meta.voters.is_empty() {
        return false;
    }
    let Some(have) = have else { return true };
    meta.term > have.term
        || (meta.term == have.term
            && (have.voters.is_empty() || meta.leader == reporter || (have.leader == 0 && meta.leader != 0)))
}

async fn node_info(grpc_addr: String, digests: bool) -> Option<pb::ClusterInfo> {
    let endpoint = crate::endpoint(&grpc_addr)
        .ok()?
        .connect_timeout(std::time::Duration::from_secs(2))
        .timeout(std::time::Duration::from_secs(20));
    let channel = endpoint.connect().await.ok()?;
    let mut admin = pb::admin_service_client::AdminServiceClient::new(channel);
    let mut request = tonic::Request::new(pb::GetClusterRequest { digests });
    if let Some(token) = crate::token() {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().ok()?);
    }
    admin.get_cluster(request).await.ok().map(|r| r.into_inner())
}

/// A node's state as the CLI prints it.
pub fn state_name(state: i32) -> &'static str {
    match pb::node_info::State::try_from(state) {
        Ok(pb::node_info::State::Joining) => "joining",
        Ok(pb::node_info::State::Active) => "active",
        Ok(pb::node_info::State::Draining) => "draining",
        Ok(pb::node_info::State::Removed) => "removed",
        _ => "-",
    }
}

fn ids(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn print_status(info: &pb::ClusterInfo, digests: bool) {
    let id = if info.cluster_id.is_empty() { "not bootstrapped" } else { info.cluster_id.as_str() };
    println!(
        "cluster {id}: {} shards; cluster map epoch {}; each shard as its leader reports it",
        info.num_shards, info.map_epoch
    );
    if let Some(m) = &info.metadata {
        let leader = if m.leader == 0 { "none".to_string() } else { format!("node {}", m.leader) };
        println!("metadata group: voters {}, leader {leader}, term {}", ids(&m.voters), m.term);
    }
    println!("{:>6}  {:<9} {:>6} {:<5} {:<28} http", "node", "state", "since", "up", "grpc");
    for n in &info.nodes {
        let up = match (n.reachable, n.state == pb::node_info::State::Removed as i32) {
            (true, _) => "yes",
            (false, true) => "-",
            (false, false) => "NO",
        };
        println!(
            "{:>6}  {:<9} {:>6} {:<5} {:<28} {}",
            n.node_id,
            state_name(n.state),
            n.since_epoch,
            up,
            n.grpc_addr,
            n.http_addr
        );
    }
    println!();
    print!(
        "{:>5} {:>6} {:>6} {:>6} {:<10} {:<12} {:>10} {:>10} {:>9} {:>9} {:>8}  lag",
        "shard", "leader", "term", "epoch", "voters", "target", "committed", "applied", "pending", "firing", "late99ms"
    );
    println!("{}", if digests { "  digest@index (timers)" } else { "" });
    for s in &info.shards {
        let voters = s.replicas.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let mut lag: Vec<_> = s.lag.iter().map(|(n, l)| format!("{n}:{l}")).collect();
        lag.sort();
        let leader = if s.leader == 0 { "-".to_string() } else { s.leader.to_string() };
        // "=" when the replicas are where the map says; otherwise the
        // target they are moving to.
        let mut sorted = s.replicas.clone();
        sorted.sort_unstable();
        let target =
            if s.target.is_empty() || sorted == s.target { "=".to_string() } else { format!("-> {}", ids(&s.target)) };
        print!(
            "{:>5} {:>6} {:>6} {:>6} {:<10} {:<12} {:>10} {:>10} {:>9} {:>9} {:>8}  {}",
            s.shard,
            leader,
            s.term,
            s.epoch,
            voters,
            target,
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
        if !s.move_error.is_empty() {
            println!("      shard {}: last move failed: {}", s.shard, s.move_error);
        }
    }
}

fn status_json(info: &pb::ClusterInfo) -> serde_json::Value {
    serde_json::json!({
        "node_id": info.node_id,
        "cluster_id": info.cluster_id,
        "num_shards": info.num_shards,
        "map_epoch": info.map_epoch,
        "metadata": info.metadata.as_ref().map(|m| serde_json::json!({
            "voters": m.voters, "leader": m.leader, "term": m.term,
        })),
        "nodes": info.nodes.iter().map(|n| serde_json::json!({
            "node_id": n.node_id, "grpc_addr": n.grpc_addr, "http_addr": n.http_addr, "reachable": n.reachable,
            "state": state_name(n.state), "since_epoch": n.since_epoch,
        })).collect::<Vec<_>>(),
        "shards": info.shards.iter().map(|s| serde_json::json!({
            "shard": s.shard, "leader": s.leader, "term": s.term, "epoch": s.epoch,
            "voters": s.replicas, "learners": s.learners, "target": s.target, "shard_epoch": s.shard_epoch,
            "move_error": s.move_error,
            "committed_index": s.committed_index, "applied_index": s.applied_index,
            "pending_timers": s.pending_timers, "firing_timers": s.firing_timers,
            "lateness_ms_p99": s.lateness_ms_p99, "lag": s.lag, "state_digest": s.state_digest, "digest_applied_index": s.digest_applied_index,
            "timer_count": s.timer_count,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(voters: &[u64], leader: u64, term: u64) -> pb::MetadataStatus {
        pb::MetadataStatus { voters: voters.to_vec(), leader, term, hosted: true, ..Default::default() }
    }

    #[test]
    fn the_metadata_leaders_own_report_wins_and_one_without_voters_never_does() {
        let leaders = meta(&[1, 2, 3], 1, 1);
        // Right after a start: node 3 knows the leader, not yet the voters.
        let early = meta(&[], 1, 1);
        assert!(!better_metadata(&early, Some(&leaders), 3));
        assert!(!better_metadata(&early, None, 3));
        // A follower's report does not displace the leader's in its term...
        assert!(better_metadata(&leaders, Some(&meta(&[1, 2, 3], 1, 1)), 1));
        assert!(!better_metadata(&meta(&[1, 2, 3], 1, 1), Some(&leaders), 2));
        // ...but a newer term does, and one with a leader beats one without.
        assert!(better_metadata(&meta(&[1, 2, 3], 2, 2), Some(&leaders), 3));
        assert!(better_metadata(&meta(&[1, 2, 3], 1, 1), Some(&meta(&[1, 2, 3], 0, 1)), 2));
        // Only a replica's own report counts.
        assert!(!better_metadata(&pb::MetadataStatus { hosted: false, ..leaders.clone() }, None, 1));
    }
}
