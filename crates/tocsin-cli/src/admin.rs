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
    /// Namespace quotas and webhook signing secrets, kept in the cluster
    /// map (needs an `admin` token).
    #[command(subcommand)]
    Namespace(NamespaceCommand),
    /// Webhook endpoints as each node sees them: circuit breakers that are
    /// open or throttled, and URLs a 410 Gone disabled (needs an `admin`
    /// token).
    #[command(subcommand)]
    Endpoint(EndpointCommand),
}

#[derive(clap::Subcommand)]
enum EndpointCommand {
    /// Every node's breakers that are not closed, and its disabled URLs.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Deliver to a URL a 410 Gone disabled again, on every node.
    Enable { url: String },
    /// Hold every delivery to an endpoint (a webhook URL or its origin)
    /// until `resume`, cluster-wide: attempts are not sent, and retried with
    /// their backoff.
    Pause { endpoint: String },
    /// Resume a paused endpoint's deliveries.
    Resume { endpoint: String },
}

#[derive(clap::Subcommand)]
enum NamespaceCommand {
    /// Limit a namespace: unfinished timers and creates per second, each
    /// cluster-wide (0: no limit). Creates past it get RESOURCE_EXHAUSTED.
    SetQuota {
        namespace: String,
        #[arg(long, default_value_t = 0)]
        max_pending: u64,
        #[arg(long, default_value_t = 0)]
        creates_per_sec: u64,
    },
    /// Remove a namespace's quota.
    ClearQuota { namespace: String },
    /// Every namespace quota.
    Quotas {
        #[arg(long)]
        json: bool,
    },
    /// Make a new signing secret current (drawn by the node unless
    /// --secret is given; printed once). Deliveries carry a signature with
    /// it and with the previous ones until drop-previous-secrets.
    RotateSecret {
        namespace: String,
        /// whsec_<base64> or raw text, 24 to 64 bytes.
        #[arg(long, env = "TOCSIN_NEW_SECRET", hide_env_values = true)]
        secret: Option<String>,
    },
    /// Stop signing with the secrets a rotation replaced.
    DropPreviousSecrets { namespace: String },
    /// Remove a namespace's secrets from the cluster map (a node's own
    /// configured secret applies again).
    ClearSecret { namespace: String },
    /// Every namespace with secrets in the map, by fingerprint.
    Secrets {
        #[arg(long)]
        json: bool,
    },
    /// Stop a namespace's firing: its due timers wait (nothing fires or is
    /// retried) until `resume`, then fire late, paced as catch-up (or are
    /// skipped, per their late-fire policy).
    Pause { namespace: String },
    /// Resume a paused namespace's firing.
    Resume { namespace: String },
    /// Every paused namespace and endpoint.
    Paused {
        #[arg(long)]
        json: bool,
    },
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
        /// Its peer address: the cluster asks the node there instead of on
        /// its client port (needed when the new node's client port runs TLS).
        #[arg(long, default_value = "")]
        peer: String,
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
        AdminCommand::Node(NodeCommand::Add { grpc_addr, http, peer }) => {
            AdminOp::AddNode { grpc_addr, http_addr: http, peer_addr: peer }
        }
        AdminCommand::Node(NodeCommand::Remove { node_id }) => AdminOp::RemoveNode { node_id },
        AdminCommand::Node(NodeCommand::Decommission { node_id }) => AdminOp::DecommissionNode { node_id },
        AdminCommand::Rebalance { dry_run } => AdminOp::Rebalance { dry_run },
        AdminCommand::Token(cmd) => return token(addrs, cmd).await,
        AdminCommand::Namespace(cmd) => return namespace(addrs, cmd).await,
        AdminCommand::Endpoint(cmd) => return endpoint(addrs, cmd).await,
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

/// Pauses or resumes a namespace or an endpoint; prints what changed.
async fn set_paused(
    client: &tocsin_client::Client,
    namespace: String,
    endpoint: String,
    paused: bool,
) -> anyhow::Result<ExitCode> {
    let what = if namespace.is_empty() { format!("endpoint {endpoint}") } else { format!("namespace {namespace}") };
    let req = tocsin_client::v1::SetPausedRequest { namespace, endpoint, paused };
    let resp = client
        .set_paused(req)
        .await
        .with_context(|| format!("{} {what}", if paused { "pausing" } else { "resuming" }))?;
    let state = if paused { "paused" } else { "resumed" };
    if resp.changed {
        println!("{what} {state} (cluster map epoch {})", resp.map_epoch);
    } else {
        println!("{what} was already {state}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn endpoint(addrs: Vec<String>, cmd: EndpointCommand) -> anyhow::Result<ExitCode> {
    let client = crate::connect(addrs).await.context("connecting to the cluster")?;
    let mut unanswered = 0;
    match cmd {
        EndpointCommand::Pause { endpoint } => return set_paused(&client, String::new(), endpoint, true).await,
        EndpointCommand::Resume { endpoint } => return set_paused(&client, String::new(), endpoint, false).await,
        EndpointCommand::List { json } => {
            let answers = client.endpoints_on_every_node().await.context("listing endpoints")?;
            let mut rows = Vec::new();
            for (node, answer) in answers {
                match answer {
                    Ok(list) => {
                        if json {
                            rows.push(serde_json::json!({
                                "node_id": list.node_id,
                                "endpoints": list.endpoints.iter().map(|e| serde_json::json!({
                                    "endpoint": e.endpoint, "state": e.state,
                                    "failures_in_a_row": e.failures_in_a_row,
                                    "held_until_ms": e.held_until_ms, "in_flight": e.in_flight,
                                })).collect::<Vec<_>>(),
                                "disabled": list.disabled.iter().map(|d| serde_json::json!({
                                    "url": d.url, "disabled_at_ms": d.disabled_at_ms, "by_timer": d.by_timer,
                                })).collect::<Vec<_>>(),
                            }));
                            continue;
                        }
                        println!("node {} ({})", node.node_id, node.grpc_addr);
                        if list.endpoints.is_empty() && list.disabled.is_empty() {
                            println!("  every endpoint healthy, no URL disabled");
                        }
                        for e in &list.endpoints {
                            println!(
                                "  {:<40} {:<10} failures in a row {:>4}  in flight {:>4}{}",
                                e.endpoint,
                                e.state,
                                e.failures_in_a_row,
                                e.in_flight,
                                if e.held_until_ms > 0 {
                                    format!("  held until {} ms", e.held_until_ms)
                                } else {
                                    String::new()
                                }
                            );
                        }
                        for d in &list.disabled {
                            println!(
                                "  DISABLED {} (410 Gone at {} ms, timer {})",
                                d.url, d.disabled_at_ms, d.by_timer
                            );
                        }
                    }
                    Err(e) => {
                        unanswered += 1;
                        eprintln!("node {} ({}) did not answer: {e}", node.node_id, node.grpc_addr);
                    }
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            }
        }
        EndpointCommand::Enable { url } => {
            let answers = client.enable_endpoint_everywhere(&url).await.context("enabling the URL")?;
            let mut enabled_on = Vec::new();
            for (node, answer) in answers {
                match answer {
                    Ok(r) if r.was_disabled => enabled_on.push(r.node_id.to_string()),
                    Ok(_) => {}
                    Err(e) => {
                        unanswered += 1;
                        eprintln!("node {} ({}) did not answer: {e}", node.node_id, node.grpc_addr);
                    }
                }
            }
            if enabled_on.is_empty() {
                println!("{url} was not disabled on any node that answered");
            } else {
                println!("{url} enabled again on node(s) {}", enabled_on.join(", "));
            }
        }
    }
    if unanswered > 0 {
        eprintln!("error: {unanswered} node(s) did not answer; run the command again");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

async fn namespace(addrs: Vec<String>, cmd: NamespaceCommand) -> anyhow::Result<ExitCode> {
    use tocsin_client::v1::SetNamespaceSecretRequest;
    use tocsin_client::v1::set_namespace_secret_request::Action;
    let client = crate::connect(addrs).await.context("connecting to the cluster")?;
    let secret_call = |namespace: String, action: Action, secret: String| SetNamespaceSecretRequest {
        namespace,
        action: action as i32,
        secret,
    };
    match cmd {
        NamespaceCommand::Pause { namespace } => return set_paused(&client, namespace, String::new(), true).await,
        NamespaceCommand::Resume { namespace } => return set_paused(&client, namespace, String::new(), false).await,
        NamespaceCommand::Paused { json } => {
            let list = client.list_paused().await.context("listing pauses")?;
            if json {
                let rows = |v: &[tocsin_client::v1::PausedInfo]| -> Vec<serde_json::Value> {
                    v.iter().map(|p| serde_json::json!({"name": p.name, "paused_at_ms": p.paused_at_ms})).collect()
                };
                let out = serde_json::json!({"namespaces": rows(&list.namespaces), "endpoints": rows(&list.endpoints)});
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                if list.namespaces.is_empty() && list.endpoints.is_empty() {
                    println!("nothing is paused");
                }
                for p in &list.namespaces {
                    println!("namespace {:<40} paused at {} ms", p.name, p.paused_at_ms);
                }
                for p in &list.endpoints {
                    println!("endpoint  {:<40} paused at {} ms", p.name, p.paused_at_ms);
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        NamespaceCommand::SetQuota { namespace, max_pending, creates_per_sec } => {
            if max_pending == 0 && creates_per_sec == 0 {
                anyhow::bail!("give --max-pending or --creates-per-sec (or use clear-quota)");
            }
            let resp = client
                .set_namespace_quota(&namespace, max_pending, creates_per_sec)
                .await
                .context("setting the quota")?;
            let what = if resp.changed { "set" } else { "already set" };
            println!(
                "quota of {namespace} {what}: max pending {}, creates/s {} (cluster map epoch {})",
                limit(max_pending),
                limit(creates_per_sec),
                resp.map_epoch
            );
        }
        NamespaceCommand::ClearQuota { namespace } => {
            let resp = client.set_namespace_quota(&namespace, 0, 0).await.context("clearing the quota")?;
            if resp.changed {
                println!("quota of {namespace} cleared (cluster map epoch {})", resp.map_epoch);
            } else {
                println!("{namespace} has no quota: nothing to clear");
            }
        }
        NamespaceCommand::Quotas { json } => {
            let quotas = client.list_namespace_quotas().await.context("listing quotas")?;
            if json {
                let rows: Vec<serde_json::Value> = quotas
                    .iter()
                    .map(|q| {
                        serde_json::json!({"namespace": q.namespace, "max_pending": q.max_pending,
                            "creates_per_sec": q.creates_per_sec})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!("{:<32} {:>12} {:>10}", "namespace", "max pending", "creates/s");
                for q in &quotas {
                    println!("{:<32} {:>12} {:>10}", q.namespace, limit(q.max_pending), limit(q.creates_per_sec));
                }
            }
        }
        NamespaceCommand::RotateSecret { namespace, secret } => {
            let given = secret.is_some();
            let req = secret_call(namespace.clone(), Action::Rotate, secret.unwrap_or_default());
            let resp = client.set_namespace_secret(req).await.context("rotating the secret")?;
            eprintln!(
                "{namespace}'s current secret is now {} (cluster map epoch {}); the previous ones sign too until \
                 `tocsin admin namespace drop-previous-secrets {namespace}`",
                resp.fingerprint, resp.map_epoch
            );
            if !given {
                eprintln!("the new secret, shown this once (give it to the receivers):");
                println!("{}", resp.secret);
            }
        }
        NamespaceCommand::DropPreviousSecrets { namespace } => {
            let req = secret_call(namespace.clone(), Action::DropPrevious, String::new());
            let resp = client.set_namespace_secret(req).await.context("dropping the previous secrets")?;
            if resp.changed {
                println!("{namespace} is signed with {} only (cluster map epoch {})", resp.fingerprint, resp.map_epoch);
            } else {
                println!("{namespace} has no previous secret: nothing to drop");
            }
        }
        NamespaceCommand::ClearSecret { namespace } => {
            let req = secret_call(namespace.clone(), Action::Clear, String::new());
            let resp = client.set_namespace_secret(req).await.context("clearing the secret")?;
            if resp.changed {
                println!("{namespace}'s secrets removed from the cluster map (epoch {})", resp.map_epoch);
            } else {
                println!("{namespace} has no secret in the cluster map: nothing to clear");
            }
        }
        NamespaceCommand::Secrets { json } => {
            let secrets = client.list_namespace_secrets().await.context("listing secrets")?;
            if json {
                let rows: Vec<serde_json::Value> = secrets
                    .iter()
                    .map(|s| {
                        serde_json::json!({"namespace": s.namespace, "fingerprints": s.fingerprints,
                            "rotated_at_ms": s.rotated_at_ms})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!("{:<32} fingerprints (current first)", "namespace");
                for s in &secrets {
                    println!("{:<32} {}", s.namespace, s.fingerprints.join(" "));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A quota limit as printed: 0 is none.
fn limit(n: u64) -> String {
    if n == 0 { "none".into() } else { n.to_string() }
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
