//! Log append throughput on real RocksDB with the WAL synced before each
//! acknowledgement: entries of 1 KiB, in appends of 1, 16 and 256 entries,
//! from 1 group and from 16 groups sharing the store (as one node's shards
//! do). Reports appends/s, entries/s, fsyncs/s and append→durable latency.
//!
//! Run with `cargo bench -p tocsin-store --bench append`. Set
//! `TOCSIN_BENCH_DIR` to put the database on a particular disk (default: a
//! temporary directory) and `TOCSIN_BENCH_SECS` for the duration per cell.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use openraft::EntryPayload;
use openraft::storage::RaftLogStorage;
use tocsin_core::Command;
use tocsin_core::Proposal;
use tocsin_core::TimerKey;
use tocsin_core::TimerSpec;
use tocsin_core::timer::Callback;
use tocsin_core::timer::FireTime;
use tocsin_core::timer::RetryPolicy;
use tocsin_store::Entry;
use tocsin_store::LogStore;
use tocsin_store::Store;
use tocsin_store::StoreConfig;
use tocsin_store::TypeConfig;

fn entry(index: u64) -> Entry {
    let spec = TimerSpec {
        fire_time: FireTime::Delay(60_000),
        payload: vec![0x5a; 880].into(),
        labels: BTreeMap::new(),
        callback: Callback::Webhook { url: "http://127.0.0.1:9000/hook".into() },
        retry: RetryPolicy::default(),
        skip_if_late_ms: 0,
        recurrence: None,
    };
    Entry {
        log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index),
        payload: EntryPayload::Normal(Proposal {
            now_ms: 1_800_000_000_000 + index,
            commands: vec![Command::Create {
                key: TimerKey::new("bench", format!("timer-{index:012}")),
                spec: Box::new(spec),
                fire_at_ms: 1_800_000_060_000 + index,
                retry: RetryPolicy {
                    max_attempts: 10,
                    initial_backoff_ms: 1000,
                    max_backoff_ms: 300_000,
                    give_up_after_ms: 0,
                },
                retention_ms: 604_800_000,
                replace_finished: false,
            }]
            .into(),
        }),
    }
}

struct Cell {
    appends: u64,
    entries: u64,
    bytes: u64,
    fsyncs: u64,
    elapsed: Duration,
    latency: hdrhistogram::Histogram<u64>,
}

async fn run(store: Arc<Store>, groups: u64, batch: u64, duration: Duration) -> Cell {
    let encoded_len = tocsin_store::codec::encode(&entry(1)).unwrap().len() as u64;
    let fsyncs_before = store.stats().fsyncs.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for group in 0..groups {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut log = LogStore::new(store, group);
            let mut latency = hdrhistogram::Histogram::<u64>::new(3).unwrap();
            let mut index = 1u64;
            let mut appends = 0u64;
            while started.elapsed() < duration {
                let entries: Vec<Entry> = (index..index + batch).map(entry).collect();
                index += batch;
                let (tx, rx) = <TypeConfig as openraft::type_config::TypeConfigExt>::oneshot();
                let t = Instant::now();
                log.append(entries, openraft::storage::IOFlushed::signal(tx)).await.unwrap();
                rx.await.unwrap().unwrap();
                latency.record(t.elapsed().as_micros() as u64).unwrap();
                appends += 1;
            }
            (appends, latency)
        }));
    }
    let mut cell = Cell {
        appends: 0,
        entries: 0,
        bytes: 0,
        fsyncs: 0,
        elapsed: Duration::ZERO,
        latency: hdrhistogram::Histogram::new(3).unwrap(),
    };
    for t in tasks {
        let (appends, latency) = t.await.unwrap();
        cell.appends += appends;
        cell.latency.add(latency).unwrap();
    }
    cell.elapsed = started.elapsed();
    cell.entries = cell.appends * batch;
    cell.bytes = cell.entries * encoded_len;
    cell.fsyncs = store.stats().fsyncs.load(Ordering::Relaxed) - fsyncs_before;
    cell
}

fn main() {
    // `cargo bench` passes `--bench`. Without it (`cargo test --all-targets`)
    // this runs as a quick smoke test of the benchmark itself.
    let full = std::env::args().any(|a| a == "--bench");
    let default_secs = if full { 5.0 } else { 0.2 };
    let secs: f64 = std::env::var("TOCSIN_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(default_secs);
    let base = std::env::var("TOCSIN_BENCH_DIR").map(std::path::PathBuf::from).unwrap_or_else(|_| std::env::temp_dir());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!(
        "entry size: {} bytes encoded; {secs} s per cell; database under {}",
        tocsin_store::codec::encode(&entry(1)).unwrap().len(),
        base.display()
    );
    println!();
    println!(
        "| groups | entries/append | appends/s | entries/s | MiB/s | fsyncs/s | appends/fsync | p50 ms | p99 ms |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for groups in [1u64, 16] {
        for batch in [1u64, 16, 256] {
            let dir = tempfile::tempdir_in(&base).unwrap();
            let store = Store::open(&StoreConfig::new(dir.path())).unwrap();
            let cell = rt.block_on(run(store.clone(), groups, batch, Duration::from_secs_f64(secs)));
            let s = cell.elapsed.as_secs_f64();
            println!(
                "| {groups} | {batch} | {:.0} | {:.0} | {:.1} | {:.0} | {:.1} | {:.2} | {:.2} |",
                cell.appends as f64 / s,
                cell.entries as f64 / s,
                cell.bytes as f64 / s / (1 << 20) as f64,
                cell.fsyncs as f64 / s,
                cell.appends as f64 / cell.fsyncs.max(1) as f64,
                cell.latency.value_at_quantile(0.5) as f64 / 1000.0,
                cell.latency.value_at_quantile(0.99) as f64 / 1000.0,
            );
            drop(store);
        }
    }
}
