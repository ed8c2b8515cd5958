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
mod probe;
#[cfg(feature = "server")]
mod run;
mod sink;
mod timer;

use clap::Parser;

use clap::Subcommand;

/// mimalloc instead of glibc's malloc: a node allocates and frees small
/// buffers on every request, entry and message across a dozen threads, and
/// glibc's arenas showed as 6–8% of a loaded node's CPU (`_int_malloc`,
/// `_int_free`, `malloc_consolidate`, `unlink_chunk`). A/B figures in
/// BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "tocsin", version, about = "A Raft-replicated timer service: do X at time T unless cancelled first")]
struct Cli {
    /// The bearer token for calls to the cluster (`tocsin admin token
    /// create`); not needed by a node that runs open (`tocsin dev`).
    #[arg(long, global = true, env = "TOCSIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// The `--token` given, for every client the CLI opens.
static TOKEN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

pub(crate) fn token() -> Option<String> {
    TOKEN.get().cloned().flatten()
}

/// A shard-aware client to the cluster at `addrs`, carrying `--token`.
pub(crate) async fn connect(
    addrs: impl IntoIterator<Item = impl Into<String>>,
) -> Result<tocsin_client::Client, tocsin_client::ClientError> {
    let options = tocsin_client::ClientOptions { token: token(), ..Default::default() };
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
    /// Create a cluster CA and node certificates for mTLS between nodes.
    #[cfg(feature = "server")]
    #[command(subcommand)]
    Certs(certs::CertsCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let _ = TOKEN.set(cli.token.clone());
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
