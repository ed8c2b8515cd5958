//! `tocsin dev` and `tocsin serve`: run a node until Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use tocsin_node::Node;
use tocsin_node::NodeConfig;

use crate::logpipe::FlushOnDrop;
use crate::logpipe::LogPipe;

#[derive(clap::Args)]
pub struct DevArgs {
    /// Data directory (RocksDB and snapshots).
    #[arg(long, default_value = "./tocsin-data")]
    data: PathBuf,
    #[arg(long, default_value_t = 16)]
    shards: u32,
    #[arg(long, default_value = "127.0.0.1:7070")]
    grpc: String,
    #[arg(long, default_value = "127.0.0.1:7071")]
    http: String,
    /// The peer port (Raft and forwarding; a dev node has no peers, but
    /// listens): default the gRPC port + 2.
    #[arg(long)]
    peer: Option<String>,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML config file; every setting can also come from a TOCSIN_* variable.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Overrides `node_id`.
    #[arg(long, conflicts_with = "node_id_from_hostname")]
    node_id: Option<u64>,
    /// Takes the node id from the host name's trailing ordinal plus one
    /// (`tocsin-0` is node 1): a Kubernetes StatefulSet's stable identity.
    #[arg(long)]
    node_id_from_hostname: bool,
    /// Overrides `data_dir`.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Overrides `grpc_listen`.
    #[arg(long)]
    grpc: Option<String>,
    /// Overrides `http_listen`.
    #[arg(long)]
    http: Option<String>,
    /// Overrides `peer_listen` (default: the gRPC port + 2).
    #[arg(long)]
    peer: Option<String>,
    /// Overrides `grpc_advertise`.
    #[arg(long)]
    advertise_grpc: Option<String>,
    /// Overrides `http_advertise`.
    #[arg(long)]
    advertise_http: Option<String>,
    /// Overrides `peer_advertise`.
    #[arg(long)]
    advertise_peer: Option<String>,
    /// Overrides `initial_cluster`: `1=grpc/http/peer,2=…` (host:port each;
    /// without a peer address, the gRPC port + 2).
    #[arg(long, value_delimiter = ',')]
    initial_cluster: Option<Vec<String>>,
    /// Overrides `num_shards`.
    #[arg(long)]
    shards: Option<u32>,
    /// Sets `join`: start empty and wait for `tocsin admin node add`.
    #[arg(long)]
    join: bool,
    /// Serve the client ports with no token checks (`auth.mode = "open"`):
    /// anyone who reaches them may act on every namespace and operate the
    /// cluster. Only on a network where every host is trusted.
    #[arg(long)]
    insecure_no_auth: bool,
    /// Sets `peer_tls.dir`: mTLS between nodes with DIR/ca.pem and this
    /// node's DIR/node-<id>.pem and .key (made by `tocsin certs`).
    #[arg(long, value_name = "DIR")]
    peer_tls_dir: Option<PathBuf>,
}

/// Logs to stderr through [`LogPipe`]: no thread of the node waits on its
/// log. The returned guard flushes it when the command ends.
fn init_logging(filter: &str, format: tocsin_node::config::LogFormat) -> anyhow::Result<FlushOnDrop> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let pipe = LogPipe::start(std::io::stderr(), crate::logpipe::QUEUE_LINES).context("starting the log writer")?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(pipe.clone());
    let _ = match format {
        // One JSON object per line, with the event's target (`access` for
        // the access log) so a pipeline can route by it.
        tocsin_node::config::LogFormat::Json => builder.json().with_current_span(false).try_init(),
        tocsin_node::config::LogFormat::Text => {
            builder.with_target(false).with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).try_init()
        }
    };
    // Test builds only: fault points armed by the FAILPOINTS variable.
    tocsin_node::fault::setup_from_env();
    Ok(FlushOnDrop(pipe))
}

fn install_metrics() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    let buckets = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
    let handle =
        metrics_exporter_prometheus::PrometheusBuilder::new().set_buckets(&buckets).ok()?.install_recorder().ok()?;
    // `# HELP` and units for every metric, whether or not it has a value yet.
    tocsin_node::telemetry::describe();
    Some(handle)
}

/// Loads the config again, as at start (SIGHUP).
type Reload = Box<dyn Fn() -> anyhow::Result<NodeConfig> + Send>;

async fn run_until_signal(
    config: NodeConfig,
    reload: Option<Reload>,
    on_ready: impl FnOnce(&Node),
) -> anyhow::Result<ExitCode> {
    let node = Node::start(config, install_metrics()).await.context("starting the node")?;
    if !node.wait_ready(Duration::from_secs(30)).await {
        tracing::warn!("not every shard has a leader after 30 s; serving anyway");
    }
    on_ready(&node);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = hup.recv() => {
                let Some(reload) = &reload else {
                    tracing::info!("SIGHUP: nothing to reload (tocsin dev has no config file)");
                    continue;
                };
                // A bad file keeps the running secrets: rotation must never
                // leave a node signing with nothing.
                match reload().and_then(|config| Ok(node.reload(&config)?)) {
                    Ok(namespaces) => tracing::info!(namespaces, "SIGHUP: webhook signing secrets reloaded"),
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "SIGHUP: config reload failed; keeping the current secrets"),
                }
            }
        }
    }
    tracing::info!("shutting down");
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// What a dev node's SSRF guard allows besides public addresses.
const DEV_WEBHOOK_ALLOW: &[&str] = &["127.0.0.0/8", "::1/128"];

pub async fn dev(args: DevArgs) -> anyhow::Result<ExitCode> {
    let mut config = NodeConfig {
        data_dir: args.data.clone(),
        num_shards: args.shards,
        grpc_listen: args.grpc,
        http_listen: args.http,
        peer_listen: args.peer,
        replication_factor: 1,
        ..NodeConfig::default()
    };
    // A dev node is for one machine: no tokens (the banner says so).
    config.auth.mode = tocsin_node::config::AuthMode::Open;
    // A dev node's receivers run on the same machine: the SSRF guard lets
    // loopback through (and the banner says so); `tocsin serve` does not.
    config.delivery.webhook_allow = DEV_WEBHOOK_ALLOW.iter().map(|s| s.to_string()).collect();
    let _log = init_logging(&config.log, config.log_format)?;
    let shards = config.num_shards;
    let data = args.data.display().to_string();
    run_until_signal(config, None, |node| {
        let http = node.http_addr;
        println!();
        println!("Tocsin dev node 1 is running: {shards} shards, data in {data}");
        println!("  gRPC     {}", node.grpc_addr);
        println!("  HTTP     http://{http}  (metrics at /metrics, health at /healthz and /readyz)");
        println!("  peer     {}  (other nodes only: Raft and forwarding)", node.peer_addr);
        println!("  auth     open: no tokens asked for (tocsin serve checks bearer tokens; see docs/security.md)");
        println!();
        println!("Receive callbacks (in another terminal):");
        println!("  tocsin sink --listen 127.0.0.1:9000");
        println!("Create a timer that fires in 10 seconds:");
        println!(
            "  curl -s -XPOST http://{http}/v1/timers -d '{{\"namespace\":\"orders\",\"id\":\"order-42\",\"delay_ms\":10000,\"payload\":\"eyJvcmRlciI6NDJ9\",\"callback\":{{\"webhook\":{{\"url\":\"http://127.0.0.1:9000/hook\"}}}}}}'"
        );
        println!("Look at it, or cancel it:");
        println!("  curl -s http://{http}/v1/timers/orders/order-42");
        println!("  curl -s -XDELETE http://{http}/v1/timers/orders/order-42");
        println!();
        println!(
            "Webhooks may go to public addresses and, on a dev node only, to loopback ({}); `tocsin serve` allows only",
            DEV_WEBHOOK_ALLOW.join(", ")
        );
        println!("public addresses unless delivery.webhook_allow lists more (see docs/security.md).");
        println!("Ctrl-C stops the node; its data stays in {data}.");
    })
    .await
}

fn hostname() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")?.trim().to_string())
}

/// `tocsin-2` → 3: StatefulSet ordinals start at 0, node ids at 1.
fn node_id_from_hostname(host: &str) -> Option<u64> {
    let (_, ordinal) = host.rsplit_once('-')?;
    ordinal.parse::<u64>().ok()?.checked_add(1)
}

/// The config `serve` runs with: the file and the environment, then the
/// command line's overrides.
fn serve_config(args: &ServeArgs) -> anyhow::Result<(NodeConfig, Vec<String>)> {
    let (mut config, ignored) =
        NodeConfig::load_reporting(args.config.as_deref(), std::env::vars()).context("loading the config")?;
    if let Some(v) = args.node_id {
        config.node_id = v;
    }
    if args.node_id_from_hostname {
        let host = hostname().context("reading the host name")?;
        config.node_id =
            node_id_from_hostname(&host).with_context(|| format!("host name {host:?} does not end in -<ordinal>"))?;
    }
    if let Some(v) = args.data.clone() {
        config.data_dir = v;
    }
    if let Some(v) = args.grpc.clone() {
        config.grpc_listen = v;
    }
    if let Some(v) = args.http.clone() {
        config.http_listen = v;
    }
    if let Some(v) = args.peer.clone() {
        config.peer_listen = Some(v);
    }
    if let Some(v) = args.advertise_grpc.clone() {
        config.grpc_advertise = Some(v);
    }
    if let Some(v) = args.advertise_http.clone() {
        config.http_advertise = Some(v);
    }
    if let Some(v) = args.advertise_peer.clone() {
        config.peer_advertise = Some(v);
    }
    if let Some(v) = args.initial_cluster.clone() {
        config.initial_cluster = v;
    }
    if let Some(v) = args.shards {
        config.num_shards = v;
    }
    if args.join {
        config.join = true;
    }
    if args.insecure_no_auth {
        config.auth.mode = tocsin_node::config::AuthMode::Open;
    }
    if let Some(dir) = args.peer_tls_dir.clone() {
        config.peer_tls.dir = Some(dir);
    }
    config.validate().context("invalid configuration")?;
    Ok((config, ignored))
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let (config, ignored) = serve_config(&args)?;
    let _log = init_logging(&config.log, config.log_format)?;
    for name in ignored {
        tracing::warn!(
            variable = %name,
            "ignoring a TOCSIN_* environment variable that names no setting (Kubernetes sets TOCSIN_SERVICE_* and TOCSIN_PORT* for a Service named tocsin)"
        );
    }
    match (config.auth.mode, &config.auth.bootstrap_token_file) {
        (tocsin_node::config::AuthMode::Open, _) => tracing::warn!(
            "auth.mode is open: the client ports check no token; anyone who reaches them may act on every namespace and operate the cluster"
        ),
        (tocsin_node::config::AuthMode::Tokens, None) => tracing::info!(
            "auth.mode is tokens with no bootstrap token: only tokens already in the cluster map are accepted (set auth.bootstrap_token_file to create the first)"
        ),
        (tocsin_node::config::AuthMode::Tokens, Some(_)) => {}
    }
    if config.peer_tls.dir.is_none() && config.peer_tls.ca_file.is_none() {
        tracing::warn!(
            "peer_tls is off: the peer port takes Raft messages and forwarded requests from anyone who reaches it; keep it on the cluster's private network, or set peer_tls.dir (tocsin certs init|issue)"
        );
    }
    let reload: Reload = Box::new(move || Ok(serve_config(&args)?.0));
    run_until_signal(config, Some(reload), |node| {
        println!("ready grpc={} http={} peer={}", node.grpc_addr, node.http_addr, node.peer_addr);
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statefulset_ordinals_become_node_ids() {
        assert_eq!(node_id_from_hostname("tocsin-0"), Some(1));
        assert_eq!(node_id_from_hostname("my-tocsin-12"), Some(13));
        assert_eq!(node_id_from_hostname("tocsin"), None);
        assert_eq!(node_id_from_hostname("tocsin-x"), None);
    }
}
