//! `tocsin`: run a node (`dev`, `serve`), use one (`timer`), inspect a
//! cluster (`cluster`), operate one (`admin`), measure one
//! (`bench`), receive its callbacks (`sink`), and check one (`probe`).
//!
//! Only `dev` and `serve` link the server (`tocsin-node`, and so RocksDB
//! and openraft), behind the default `server` feature: `cargo build -p
//! tocsin-cli --no-default-features` builds a client-side `tocsin` (timer,
//! cluster, admin, bench, sink, probe) without them.

mod admin;
mod bench;
#[cfg(feature = "server")]
mod certs;
mod cluster;
#[cfg(feature = "server")]
mod logpipe;
mod probe;
#[cfg(feature = "server")]
mod run;
mod sink;
mod timer;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;

use clap::Subcommand;

/// Turns transparent huge pages off for this process, as mimalloc's own
/// `MIMALLOC_ALLOW_THP=0` does, unless that variable is set (mimalloc then
/// follows it).
///
/// Why: mimalloc asks the kernel for huge pages on its arenas
/// (`MADV_HUGEPAGE`), so the first touch of each 2 MiB page zeroes all of
/// it. Profiling a node draining a 200,000-timer burst put 12.6% of its
/// samples in the kernel's `clear_page_erms` under huge-page faults, and
/// the node ended the drain at 1.25-1.50 GB resident against 0.91-0.95 GB
/// without them. A/B figures in docs/perf-history.md ("Transparent huge pages
/// off").
#[allow(unsafe_code)]
fn no_transparent_huge_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes plain integers and touches no
    // memory of ours; on failure (an old kernel) nothing changes.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

#[derive(Parser)]
#[command(name = "tocsin", version, about = "A Raft-replicated timer service: do X at time T unless cancelled first")]
struct Cli {
    /// The bearer token for calls to the cluster (`tocsin admin token
    /// create`); not needed by a node that runs open (`tocsin dev`).
    #[arg(long, global = true, env = "TOCSIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The CA certificate (PEM) that signed the nodes' client-port
    /// certificates: connect over TLS, for nodes with `client_tls` on.
    #[arg(long, global = true, env = "TOCSIN_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// This client's certificate (PEM, `tocsin certs client`), for nodes
    /// that require one; needs --tls-key.
    #[arg(long, global = true, env = "TOCSIN_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// This client's private key (PEM); needs --tls-cert.
    #[arg(long, global = true, env = "TOCSIN_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The name every node's certificate must carry; default: the host of
    /// the address dialed.
    #[arg(long, global = true, env = "TOCSIN_TLS_DOMAIN")]
    tls_domain: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// The `--token` given, for every client the CLI opens.
static TOKEN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

pub(crate) fn token() -> Option<String> {
    TOKEN.get().cloned().flatten()
}

/// The TLS the `--tls-*` flags describe, read once at start.
static TLS: std::sync::OnceLock<Option<tocsin_client::ClientTls>> = std::sync::OnceLock::new();

pub(crate) fn tls() -> Option<tocsin_client::ClientTls> {
    TLS.get().cloned().flatten()
}

impl Cli {
    /// Reads the files the `--tls-*` flags name: a missing file is an error
    /// before anything connects, and a certificate without a CA is too
    /// (it would silently go unused over plaintext).
    fn client_tls(&self) -> anyhow::Result<Option<tocsin_client::ClientTls>> {
        let read =
            |path: &PathBuf| std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()));
        let Some(ca) = &self.tls_ca else {
            if self.tls_cert.is_some() || self.tls_domain.is_some() {
                anyhow::bail!("--tls-cert, --tls-key and --tls-domain need --tls-ca");
            }
            return Ok(None);
        };
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            _ => None,
        };
        Ok(Some(tocsin_client::ClientTls { ca_pem: read(ca)?, identity, domain: self.tls_domain.clone() }))
    }
}

/// A gRPC endpoint for one node's client port, with the `--tls-*` flags'
/// TLS, for the commands that talk to one node directly.
pub(crate) fn endpoint(addr: &str) -> anyhow::Result<tonic::transport::Endpoint> {
    let endpoint = match tls() {
        Some(tls) => tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls.tonic())?,
        None => tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?,
    };
    Ok(endpoint)
}

/// A shard-aware client to the cluster at `addrs`, carrying `--token`.
pub(crate) async fn connect(
    addrs: impl IntoIterator<Item = impl Into<String>>,
) -> Result<tocsin_client::Client, tocsin_client::ClientError> {
    connect_with(addrs, |_| {}).await
}

/// [`connect`], with the options adjusted by `adjust`.
pub(crate) async fn connect_with(
    addrs: impl IntoIterator<Item = impl Into<String>>,
    adjust: impl FnOnce(&mut tocsin_client::ClientOptions),
) -> Result<tocsin_client::Client, tocsin_client::ClientError> {
    let mut options = tocsin_client::ClientOptions { token: token(), tls: tls(), ..Default::default() };
    adjust(&mut options);
    tocsin_client::Client::with_options(addrs, options).await
}

#[derive(Subcommand)]
enum Command {
    /// Run a single-node cluster for development, with data in ./tocsin-data.
    #[cfg(feature = "server")]
    Dev(run::DevArgs),
    /// Run a production node from a config file (see deploy/tocsin.example.toml).
    #[cfg(feature = "server")]
    Serve(run::ServeArgs),
    /// Create, get, list, cancel and reschedule timers on a running cluster.
    #[command(subcommand)]
    Timer(timer::TimerCommand),
    /// Look at a running cluster; move a shard's leadership.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Operate a live cluster: add, drain, remove and decommission nodes,
    /// move shards and leaderships, rebalance.
    Admin(admin::AdminArgs),
    /// Load generator: create throughput, steady fires, thundering seconds.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// A reference webhook receiver that checks fencing tokens and records
    /// every delivery as NDJSON.
    Sink(sink::SinkArgs),
    /// Exit 0 if a node's HTTP endpoint answers /readyz (for health checks).
    Probe(probe::ProbeArgs),
    /// Create a cluster CA, node certificates for mTLS between nodes, and
    /// client certificates for the client ports' TLS.
    #[cfg(feature = "server")]
    #[command(subcommand)]
    Certs(certs::CertsCommand),
}

/// The `tocsin` command: parses the arguments and runs the subcommand.
pub fn main() -> std::process::ExitCode {
    no_transparent_huge_pages();
    let cli = Cli::parse();
    let _ = TOKEN.set(cli.token.clone());
    match cli.client_tls() {
        Ok(tls) => {
            let _ = TLS.set(tls);
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            #[cfg(feature = "server")]
            Command::Dev(args) => run::dev(args).await,
            #[cfg(feature = "server")]
            Command::Serve(args) => run::serve(args).await,
            Command::Timer(cmd) => timer::run(cmd).await,
            Command::Cluster(cmd) => cluster::run(cmd).await,
            Command::Admin(args) => admin::run(args).await,
            Command::Bench(cmd) => bench::run(cmd).await,
            Command::Sink(args) => sink::run(args).await,
            Command::Probe(args) => probe::run(args).await,
            #[cfg(feature = "server")]
            Command::Certs(cmd) => certs::run(cmd),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
