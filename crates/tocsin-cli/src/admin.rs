//! `tocsin admin …`: operate a live cluster. Look at it (`status`,
//! `shard list`), grow and shrink it (`node add`, `node remove`, `node
//! decommission`), and move things (`shard move`, `leader transfer`,
//! `rebalance`). Long operations stream their progress from the node that
//! runs them; each is safe to run again after an interruption.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use anyhow::Context;
use indicatif::ProgressBar;
use indicatif::ProgressStyle;
use tocsin_client::AdminOp;

use crate::cluster::ClusterCommand;

#[derive(clap::Args)]
pub struct AdminArgs {
    /// gRPC address of any node (repeat for several).
    #[arg(long = "addr", global = true, default_value = "127.0.0.1:7070", env = "TOCSIN_ADDR")]
    addrs: Vec<String>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(clap::Subcommand)]
enum AdminCommand {
    /// Nodes, shards, leaders, replica lag, pending timers.
    Status {
        /// Also compute each replica's state digest on the answering node.
        #[arg(long)]
        digests: bool,
        /// Print the raw answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add, drain and remove, or decommission nodes.
    #[command(subcommand)]
    Node(NodeCommand),
    /// List shards or move one replica.
    #[command(subcommand)]
    Shard(ShardCommand),
    /// Move a shard's leadership.
    #[command(subcommand)]
    Leader(LeaderCommand),
    /// Place every shard as the ring over the current nodes says; the
    /// balancer evens out leaderships afterwards.
    Rebalance {
        /// Only print the moves that would be made.
        #[arg(long)]
        dry_run: bool,
    },
    /// Create, list and revoke bearer tokens (needs an `admin` token).
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(clap::Subcommand)]
enum TokenCommand {
    /// Create a token; prints it once (the cluster keeps only its hash).
    Create {
        /// timers:write, timers:read, pull or admin (comma-separated or repeated).
        #[arg(long = "scope", value_delimiter = ',', required = true)]
        scopes: Vec<String>,
        /// A namespace, a prefix ending in *, or * (comma-separated or repeated).
        #[arg(long = "namespace", value_delimiter = ',')]
        namespaces: Vec<String>,
        /// What the token is for.
        #[arg(long, default_value = "")]
        label: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every token's id, scopes, namespaces and label.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id: every node refuses it within about a second.
    Revoke { id: String },
}

#[derive(clap::Subcommand)]
enum NodeCommand {
    /// Add a running node started with `tocsin serve --join`: it becomes a
    /// replica of the shards the ring gives it, catches up, is promoted, and
    /// takes over some leaderships.
    Add {
        /// The new node's gRPC address, as the other nodes reach it.
        grpc_addr: String,
        /// Its HTTP address (default: what the node reports).
        #[arg(long, default_value = "")]
        http: String,
    },
    /// Drain a live node (move every replica and leadership off it), then
    /// remove it. Refused if a shard would lose its quorum.
    Remove { node_id: u64 },
    /// Replace a dead node's replicas from the survivors.
    Decommission { node_id: u64 },
}

#[derive(clap::Subcommand)]
enum ShardCommand {
    /// Every shard's voters and leader, merged from all nodes.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Move one replica of a shard from one node to another.
    Move {
        #[arg(long)]
        shard: u32,
        #[arg(long)]
        from: u64,
        #[arg(long)]
        to: u64,
    },
}

#[derive(clap::Subcommand)]
enum LeaderCommand {
    /// Make a voter of the shard its leader.
    Transfer {
        #[arg(long)]
        shard: u32,
        #[arg(long)]
        to: u64,
    },
}

pub async fn run(args: AdminArgs) -> anyhow::Result<ExitCode> {
    let addrs = args.addrs;
    let op = match args.command {
        AdminCommand::Status { digests, json } => {
            return crate::cluster::run(ClusterCommand::Status { addrs, digests, json }).await;
        }
        AdminCommand::Leader(LeaderCommand::Transfer { shard, to }) => {
            return crate::cluster::run(ClusterCommand::TransferLeader { addrs, shard, to }).await;
        }
        AdminCommand::Shard(ShardCommand::List { json }) => return shard_list(addrs, json).await,
        AdminCommand::Shard(ShardCommand::Move { shard, from, to }) => {
            AdminOp::MoveShard { shard, from_node: from, to_node: to }
        }
        AdminCommand::Node(NodeCommand::Add { grpc_addr, http }) => AdminOp::AddNode { grpc_addr, http_addr: http },
        AdminCommand::Node(NodeCommand::Remove { node_id }) => AdminOp::RemoveNode { node_id },
        AdminCommand::Node(NodeCommand::Decommission { node_id }) => AdminOp::DecommissionNode { node_id },
        AdminCommand::Rebalance { dry_run } => AdminOp::Rebalance { dry_run },
        AdminCommand::Token(cmd) => return token(addrs, cmd).await,
    };
    let client = crate::connect(addrs).await.context("connecting to the cluster")?;
    let mut stream = client.admin_op(op).await.context("starting the operation")?;
    let tty = std::io::stderr().is_terminal();
    let bar = if tty { ProgressBar::new(0) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {pos}/{len} shards  {prefix}  {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    loop {
        let progress = match stream.message().await {
            Ok(Some(p)) => p,
            Ok(None) => {
                bar.abandon();
                eprintln!("error: the node ended the operation without a result; run the command again");
                return Ok(ExitCode::FAILURE);
            }
            Err(status) => {
                bar.abandon();
                eprintln!("error: {}", status.message());
                // The node's own refusals carry an ErrorInfo; a broken
                // stream does not.
                if status.details().is_empty() {
                    eprintln!(
                        "the node running the operation went away; what the cluster map already says is \
                         finished by the cluster anyway. Run the command again to follow it"
                    );
                }
                return Ok(ExitCode::FAILURE);
            }
        };
        bar.set_length(u64::from(progress.shards_total));
        bar.set_position(u64::from(progress.shards_done));
        bar.set_prefix(format!("{}, eta {}", human_bytes(progress.bytes_streamed), eta(progress.eta_ms)));
        let line =
            format!("[{}/{}] {}: {}", progress.shards_done, progress.shards_total, progress.step, progress.message);
        if tty {
            bar.println(&line);
        } else {
            println!("{line}");
        }
        if progress.done {
            bar.finish_and_clear();
            println!("{}", progress.message);
            return Ok(ExitCode::SUCCESS);
        }
    }
}

async fn token(addrs: Vec<String>, cmd: TokenCommand) -> anyhow::Result<ExitCode> {
    let client = crate::connect(addrs).await.context("connecting to the cluster")?;
    match cmd {
        TokenCommand::Create { scopes, namespaces, label, json } => {
            let req = tocsin_client::v1::CreateTokenRequest { scopes, namespaces, label };
            let resp = client.create_token(req).await.context("creating the token")?;
            if json {
                println!("{}", serde_json::json!({"id": resp.id, "token": resp.token, "map_epoch": resp.map_epoch}));
            } else {
                eprintln!("token {} created; it is shown this once, keep it secret:", resp.id);
                println!("{}", resp.token);
            }
        }
        TokenCommand::List { json } => {
            let tokens = client.list_tokens().await.context("listing tokens")?;
            if json {
                let rows: Vec<serde_json::Value> = tokens
                    .iter()
                    .map(|t| {
                        serde_json::json!({"id": t.id, "scopes": t.scopes, "namespaces": t.namespaces,
                            "label": t.label, "created_at_ms": t.created_at_ms})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!("{:<18} {:<32} {:<24} label", "id", "scopes", "namespaces");
                for t in &tokens {
                    println!("{:<18} {:<32} {:<24} {}", t.id, t.scopes.join(","), t.namespaces.join(","), t.label);
                }
            }
        }
        TokenCommand::Revoke { id } => {
            let resp = client.revoke_token(&id).await.context("revoking the token")?;
            if resp.revoked {
                println!("token {id} revoked (cluster map epoch {})", resp.map_epoch);
            } else {
                println!("no token {id}: nothing to revoke");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn shard_list(addrs: Vec<String>, json: bool) -> anyhow::Result<ExitCode> {
    let client = crate::connect(addrs).await.context("connecting to the cluster")?;
    let map = client.shard_map().await.context("loading the shard map")?;
    if json {
        let shards: Vec<serde_json::Value> = map
            .shards
            .iter()
            .map(|s| {
                serde_json::json!({
                    "shard": s.shard, "voters": s.replicas, "target": s.target, "shard_epoch": s.shard_epoch,
                    "leader": s.leader, "term": s.term,
                })
            })
            .collect();
        let doc = serde_json::json!({"map_epoch": map.epoch, "num_shards": map.num_shards, "shards": shards});
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("cluster map epoch {}", map.epoch);
        println!("{:>5} {:>6} {:>6} {:>6}  {:<10} target", "shard", "leader", "term", "epoch", "voters");
        for s in &map.shards {
            let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            let leader = if s.leader == 0 { "-".to_string() } else { s.leader.to_string() };
            let mut voters = s.replicas.clone();
            voters.sort_unstable();
            let target = if voters == s.target { "=".to_string() } else { join(&s.target) };
            println!(
                "{:>5} {:>6} {:>6} {:>6}  {:<10} {}",
                s.shard,
                leader,
                s.term,
                s.shard_epoch,
                join(&voters),
                target
            );
        }
    }
    let leaderless = map.shards.iter().filter(|s| s.leader == 0).count();
    Ok(if leaderless == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB streamed", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB streamed", b as f64 / f64::from(1u32 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB streamed", b as f64 / 1024.0),
        b => format!("{b} B streamed"),
    }
}

fn eta(ms: u64) -> String {
    if ms == 0 { "-".into() } else { format!("{}s", ms.div_ceil(1000)) }
}
