//! The mixed workload: 1M inserts due within the next 60 s, 50% of
//! them cancelled, then everything expired. Compared with a
//! `BinaryHeap` plus a cancelled-id set (the usual hand-rolled scheduler) and
//! with `tokio_util::time::DelayQueue`.
//!
//! Run with `cargo bench -p tocsin-wheel`; the README quotes the figures.
//! (`cargo test` runs it once, smaller: see [`N`].)

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::HashSet;
use std::time::Duration;
use std::time::Instant;

use criterion::BenchmarkId;
use criterion::Criterion;
use criterion::Throughput;
use criterion::criterion_group;
use criterion::criterion_main;
use futures::StreamExt;
use tocsin_wheel::Wheel;

/// 1M under `cargo bench`. `cargo test` runs this file once as a smoke test
/// in the dev profile, where debug assertions are on, and tokio-util's
/// `DelayQueue` then walks a whole slot list on every remove (quadratic: a
/// million entries would take hours), so the smoke run uses fewer entries.
const N: usize = if cfg!(debug_assertions) { 20_000 } else { 1_000_000 };
const SPAN_MS: u64 = 60_000;
const START_MS: u64 = 1_800_000_000_000;

/// Deterministic pseudo-random due offsets in `[1, SPAN_MS]` and a
/// pseudo-random choice of which half to cancel.
fn workload() -> (Vec<u64>, Vec<bool>) {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let dues = (0..N).map(|_| 1 + next() % SPAN_MS).collect();
    let cancel = (0..N).map(|_| next() & 1 == 1).collect();
    (dues, cancel)
}

fn run_wheel(dues: &[u64], cancel: &[bool]) -> usize {
    let mut wheel = Wheel::with_capacity(START_MS, dues.len());
    let handles: Vec<_> = dues.iter().enumerate().map(|(i, d)| wheel.insert(START_MS + d, i as u64).unwrap()).collect();
    for (handle, c) in handles.iter().zip(cancel) {
        if *c {
            wheel.cancel(*handle);
        }
    }
    let mut fired = 0;
    while wheel.poll(START_MS + SPAN_MS).is_some() {
        fired += 1;
    }
    fired
}

fn run_heap(dues: &[u64], cancel: &[bool]) -> usize {
    let mut heap = BinaryHeap::with_capacity(dues.len());
    for (i, d) in dues.iter().enumerate() {
        heap.push(Reverse((START_MS + d, i as u64)));
    }
    let mut cancelled = HashSet::with_capacity(dues.len() / 2);
    for (i, c) in cancel.iter().enumerate() {
        if *c {
            cancelled.insert(i as u64);
        }
    }
    let mut fired = 0;
    while let Some(Reverse((_, id))) = heap.pop() {
        if !cancelled.remove(&id) {
            fired += 1;
        }
    }
    fired
}

fn run_delay_queue(runtime: &tokio::runtime::Runtime, dues: &[u64], cancel: &[bool]) -> usize {
    runtime.block_on(async {
        let mut queue = tokio_util::time::DelayQueue::with_capacity(dues.len());
        let keys: Vec<_> =
            dues.iter().enumerate().map(|(i, d)| queue.insert(i as u64, Duration::from_millis(*d))).collect();
        for (key, c) in keys.iter().zip(cancel) {
            if *c {
                queue.remove(key);
            }
        }
        tokio::time::advance(Duration::from_millis(SPAN_MS + 1)).await;
        let mut fired = 0;
        while queue.next().await.is_some() {
            fired += 1;
        }
        fired
    })
}

fn mixed(c: &mut Criterion) {
    let (dues, cancel) = workload();
    let expected = cancel.iter().filter(|c| !**c).count();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();

    let mut group = c.benchmark_group("mixed_1m_insert_50pct_cancel_expire_all");
    group.sample_size(10).measurement_time(Duration::from_secs(20)).throughput(Throughput::Elements(N as u64));
    group.bench_function(BenchmarkId::new("tocsin_wheel", N), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                assert_eq!(run_wheel(&dues, &cancel), expected);
            }
            start.elapsed()
        })
    });
    group.bench_function(BenchmarkId::new("binary_heap_plus_cancel_set", N), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                assert_eq!(run_heap(&dues, &cancel), expected);
            }
            start.elapsed()
        })
    });
    group.bench_function(BenchmarkId::new("tokio_util_delay_queue", N), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                assert_eq!(run_delay_queue(&runtime, &dues, &cancel), expected);
            }
            start.elapsed()
        })
    });
    group.finish();
}

criterion_group!(benches, mixed);
criterion_main!(benches);
