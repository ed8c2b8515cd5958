//! `tocsin-chaos`: runs the fault scenarios against a real three-node
//! cluster (four for the membership scenarios) and judges each with the
//! invariant checker.
//!
//! Each scenario starts from nothing: a fresh network (bridge, one namespace
//! per node and one for the receiver), fresh data directories, the steady
//! load (creates at a fixed rate, some cancelled), then its fault, then a
//! drain until every timer that must fire has fired or the drain gives up.
//! The runner checks I7 (replica digests) and I8 (leaders after healing)
//! live; the rest come from the recorded files.
//!
//! Each scenario is its own module under `scenarios/`, listed in order by
//! `scenarios::all`; `scenario.rs` has what they share.
//!
//! It needs root (network namespaces, iptables). Without it the run prints
//! SKIPPED and exits with status 77; it never reports a pass it did not see.

mod check;
mod cluster;
mod disk;
mod driver;
mod leaders;
mod net;
mod observe;
mod scenario;
mod scenarios;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use anyhow::bail;
use clap::Parser;

use crate::check::Report;
use crate::scenario::Bounds;
use crate::scenario::Live;

/// Exit status for "could not run" (the automake convention for skipped).
const EXIT_SKIPPED: u8 = 77;

#[derive(Parser, Clone, Debug)]
#[command(about = "Fault scenarios against a real three-node Tocsin cluster")]
pub struct Args {
    /// Scenarios to run, comma separated (default: all). `--list` names them.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The CI subset: baseline, kill-leader, partition-leader.
    #[arg(long)]
    quick: bool,
    /// Print the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// The `tocsin` binary (default: next to this one).
    #[arg(long)]
    tocsin: Option<PathBuf>,
    /// Where each scenario keeps its data, logs and NDJSON records.
    #[arg(long, default_value = "chaos-tests/run")]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 12)]
    pub shards: u32,
    /// Steady creates per second.
    #[arg(long, default_value_t = 1_000)]
    pub rate: u64,
    /// Fraction of the steady creates cancelled before they are due.
    #[arg(long, default_value_t = 0.1)]
    pub cancel_fraction: f64,
    /// Timers due in the ten seconds after the leader kill.
    #[arg(long, default_value_t = 20_000)]
    pub burst: u64,
    /// Puts each node's data on a tmpfs of its own of this many MiB, for
    /// the scenarios that do not choose their disk (the disk-full and
    /// slow-disk rows keep theirs). What CI's quick subset uses: a kill -9
    /// loses nothing more on a disk than on tmpfs (what a process wrote is
    /// in the page cache, synced or not), so every invariant is the same
    /// test, without the latency of a virtual disk that the suites before
    /// it have just written gigabytes to (see chaos-tests/README.md).
    #[arg(long)]
    pub data_tmpfs_mib: Option<u64>,
    /// Mounts a tmpfs of this many MiB at `--dir` (unless one is there) for
    /// every scenario's records, the nodes' logs and the receiver's files,
    /// and leaves it mounted. What CI's quick subset uses: the driver, the
    /// receiver and the nodes write those on the same threads that send
    /// creates, take deliveries and fire timers, and a stalled virtual disk
    /// then stalls the scenario rather than the fault (chaos-tests/README.md,
    /// run 84).
    #[arg(long)]
    pub dir_tmpfs_mib: Option<u64>,
    /// receiver-down: how long the receiver stays unreachable, in seconds.
    #[arg(long, default_value_t = 300)]
    pub receiver_outage_secs: u64,
    /// receiver-failing: timers per failing endpoint.
    #[arg(long, default_value_t = 100)]
    pub failing_timers: u64,
    /// pull-consumer-crash: pull timers, all due in the same second.
    #[arg(long, default_value_t = 3_000)]
    pub pull_timers: u64,
    /// slow-disk: the throttle on the leader's data device, bytes per second.
    #[arg(long, default_value_t = 1 << 20)]
    pub slow_disk_write_bps: u64,
    /// slow-disk: the throttle on the leader's data device, writes per second.
    #[arg(long, default_value_t = 20)]
    pub slow_disk_write_iops: u64,
    /// flapping-partitions: the seed of the partition schedule (default:
    /// random; printed either way).
    #[arg(long)]
    pub seed: Option<u64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let all = scenarios::all();
    if args.list {
        for s in &all {
            println!("{:<22} {}{}", s.name(), s.about(), if s.quick() { " (quick)" } else { "" });
        }
        return ExitCode::SUCCESS;
    }
    if let Some(unknown) = args.only.iter().find(|o| !all.iter().any(|s| s.name() == o.as_str())) {
        eprintln!("error: no scenario named {unknown:?} (see --list)");
        return ExitCode::from(2);
    }
    let selected: Vec<_> = all
        .iter()
        .filter(
            |s| if args.only.is_empty() { !args.quick || s.quick() } else { args.only.iter().any(|o| o == s.name()) },
        )
        .collect();
    if let Err(why) = can_run() {
        eprintln!();
        eprintln!("************************************************************");
        eprintln!("  CHAOS TESTS SKIPPED: {why}");
        eprintln!("  nothing was checked; run as root to check the invariants");
        eprintln!("************************************************************");
        return ExitCode::from(EXIT_SKIPPED);
    }
    let tocsin = match args.tocsin.clone().map_or_else(default_tocsin, Ok) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Some(size_mib) = args.dir_tmpfs_mib
        && let Err(e) = disk::mount_run_dir(&args.dir, size_mib)
    {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let (mut passed, mut failed) = (0, 0);
    for scenario in selected {
        let name = scenario.name();
        println!("=== {name}: {}", scenario.about());
        let started = Instant::now();
        let result = runtime.block_on(scenario::execute(scenario.as_ref(), &args, &tocsin));
        match result {
            Ok((report, live, own)) => {
                print_figures(&report, &live);
                let mut failures = failures(&report, scenario.bounds());
                failures.extend(own);
                if failures.is_empty() {
                    println!("--- {name}: PASS ({:.0} s)", started.elapsed().as_secs_f64());
                    passed += 1;
                } else {
                    for f in &failures {
                        println!("    FAIL {f}");
                    }
                    println!("--- {name}: FAIL (records in {})", args.dir.join(name).display());
                    failed += 1;
                }
            }
            Err(e) => {
                println!("    ERROR {e:#}");
                println!("--- {name}: FAIL (could not complete; records in {})", args.dir.join(name).display());
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn can_run() -> anyhow::Result<()> {
    let uid = net::sh(&["id", "-u"]).context("running id")?;
    if uid.trim() != "0" {
        bail!("not root (network namespaces and iptables need it)");
    }
    for tool in ["ip", "iptables"] {
        net::sh(&["sh", "-c", &format!("command -v {tool}")]).with_context(|| format!("{tool} is not installed"))?;
    }
    // The kernel must let us make a namespace at all.
    net::sh(&["ip", "netns", "add", "tc-probe"]).context("cannot create a network namespace")?;
    let _ = net::sh(&["ip", "netns", "del", "tc-probe"]);
    Ok(())
}

fn default_tocsin() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.parent().context("no parent directory")?.join("tocsin");
    if !path.exists() {
        bail!("no tocsin binary at {} (build it, or pass --tocsin)", path.display());
    }
    Ok(path)
}

fn failures(report: &Report, bounds: Bounds) -> Vec<String> {
    let mut out = report.failures(bounds.window_p99_ms.unwrap_or(u64::MAX));
    if let Some(max) = bounds.window_max_ms
        && report.lateness_fault_window.max_ms > max
    {
        out.push(format!("I5: fault-window lateness max {} ms over {max} ms", report.lateness_fault_window.max_ms));
    }
    if let Some(p99) = bounds.run_p99_ms
        && report.lateness.p99_ms > p99
    {
        out.push(format!("I5: whole-run lateness p99 {} ms over {p99} ms", report.lateness.p99_ms));
    }
    if let Some(p99) = bounds.after_heal_create_p99_ms
        && report.create_calls_after_heal.p99_ms > p99
    {
        out.push(format!(
            "create calls sent in the {} s after healing: p99 {} ms over {p99} ms",
            check::AFTER_HEAL_MS / 1_000,
            report.create_calls_after_heal.p99_ms
        ));
    }
    out
}

fn print_figures(r: &Report, live: &Live) {
    println!(
        "    creates {} acknowledged, {} unknown; cancels {} acknowledged, {} unknown; {} must fire",
        r.creates_ok, r.creates_unknown, r.cancels_cancelled, r.cancels_unknown, r.must_fire
    );
    for (code, (n, first)) in &r.creates_unknown_by_code {
        println!("      {n} unknown creates ended in {code}, the first: {first}");
    }
    println!(
        "    I1 lost {}   I2 cancelled-then-delivered {} ({} in flight, shown by index)",
        r.lost, r.cancelled_then_delivered, r.cancelled_in_flight_excused
    );
    println!(
        "    I4 accepted stale {}, epoch-order violations {} (rejected stale {}, duplicates {})",
        r.accepted_stale, r.epoch_order_violations, r.rejected_stale, r.duplicates
    );
    println!("    I5 lateness, whole run:    {}", r.lateness);
    println!("    I5 lateness, fault window: {}", r.lateness_fault_window);
    println!("    I6 early {}", r.early);
    if r.created_overdue > 0 {
        println!(
            "    {} creates were committed after their fire time; their lateness counts from creation",
            r.created_overdue
        );
    }
    println!(
        "    I7 digests {}   I8 leaders after healing {}",
        match r.digests_equal {
            Some(true) => "equal".to_string(),
            Some(false) => "DIFFER".to_string(),
            None => "not compared".to_string(),
        },
        r.leaders_after_heal_ms.map_or("never".to_string(), |ms| format!("{ms} ms")),
    );
    if r.create_calls_at_fault.n > 0 {
        println!(
            "    create calls sent in the first {} s of the fault: {}",
            check::AFTER_HEAL_MS / 1_000,
            r.create_calls_at_fault
        );
    }
    if r.create_calls_after_heal.n > 0 {
        println!(
            "    create calls sent in the {} s after healing: {}",
            check::AFTER_HEAL_MS / 1_000,
            r.create_calls_after_heal
        );
    }
    if let Some(ms) = live.failover_ms {
        println!("    failover: shard 0 had a new leader {ms} ms after the fault");
    }
    if let Some(ms) = r.first_fire_new_leader_ms {
        println!("    failover: shard 0's new leader's first fire arrived {ms} ms after the fault");
    }
    for line in &live.leadership {
        println!("      {line}");
    }
}
