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
mod cluster;
mod probe;
#[cfg(feature = "server")]
mod run;
mod sink;
mod timer;

use clap::Parser;

use clap::Subcommand;

#[derive(Parser)]
#[command(name = "tocsin", version, about = "A Raft-replicated timer service: do X at time T unless cancelled first")]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
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
