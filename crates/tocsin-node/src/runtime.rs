//! Raft gets a tokio runtime of its own, so that no backlog of client work
//! can delay a heartbeat.
//!
//! Why: on a node offered more than its CPU can run, every task waits its
//! turn in the scheduler's queue. Heartbeats and appends queued behind
//! thousands of create handlers, fire batches and webhook calls arrived
//! later than the 150–300 ms election timeout, so followers started
//! elections on every shard at once (measured: 2,000–3,400 per node in
//! 20 s of overload), and each new term cost a wheel rebuild and repeated
//! deliveries: more load.
//!
//! So the node runs two runtimes:
//! - the **Raft runtime** ([`RaftRuntime`], a few worker threads): every
//!   group's openraft core and its replication, heartbeat and state-machine
//!   tasks, and both ends of the Raft links (`link.rs`). Its queue holds
//!   only Raft work, so its tasks run within the OS's scheduling latency
//!   (milliseconds) however busy the node is;
//! - the **work runtime** (the process's main one): the gRPC and HTTP
//!   servers, request handlers, proposers, fire loops and delivery.
//!
//! One port serves both: the accept loop (`link::split_incoming`) moves a
//! Raft link's connection to the Raft runtime and keeps every gRPC
//! connection on the work runtime, so a client request crosses no runtime
//! until its command reaches openraft. Each runtime has a lag probe
//! ([`probe_lag`]): the work runtime's drives admission (`admission.rs`),
//! the Raft runtime's is exported to show that the split holds.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use tokio::runtime::Handle;

/// Worker threads of the Raft runtime at most: one group's core runs on one
/// thread at a time, and the runtime holds only Raft work.
const RAFT_WORKER_THREADS_MAX: usize = 2;

/// How often a lag probe wakes.
pub const LAG_PROBE_EVERY: Duration = Duration::from_millis(20);

/// The Raft runtime. Dropping it stops its tasks without waiting for them
/// (openraft's cores are shut down before, by `Node::shutdown`).
pub struct RaftRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    handle: Handle,
    /// The runtime's lag probe's moving average, in microseconds (also the
    /// gauge `tocsin_raft_scheduling_lag_seconds`).
    lag_us: Arc<AtomicU64>,
}

impl RaftRuntime {
    /// Starts the runtime's worker threads (`tocsin-raft`).
    pub fn start() -> std::io::Result<RaftRuntime> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(RAFT_WORKER_THREADS_MAX);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("tocsin-raft")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let lag_us = Arc::new(AtomicU64::new(0));
        handle.spawn(probe_lag(lag_us.clone(), "tocsin_raft_scheduling_lag_seconds"));
        Ok(RaftRuntime { runtime: Some(runtime), handle, lag_us })
    }

    /// How late the runtime's tasks run (moving average).
    pub fn scheduling_lag(&self) -> Duration {
        Duration::from_micros(self.lag_us.load(Ordering::Relaxed))
    }

    /// Where Raft's tasks are spawned.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks on its tasks, which panics inside an
        // async context (where a node is usually dropped).
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The probe's moving average after one more sample: each sample weighs a
/// quarter, so a lag of a few probe periods shows within about 100 ms and
/// one late wake-up alone does not shed.
pub fn next_lag_average_us(average_us: u64, sample_us: u64) -> u64 {
    (average_us * 3 + sample_us) / 4
}

/// Measures the scheduling lag of the runtime it is spawned on: how late a
/// task that sleeps [`LAG_PROBE_EVERY`] wakes, as a moving average in
/// `lag_us` and the gauge `gauge` (seconds). Returns once `lag_us` has no
/// other owner.
pub async fn probe_lag(lag_us: Arc<AtomicU64>, gauge: &'static str) {
    let mut average_us = 0;
    while Arc::strong_count(&lag_us) > 1 {
        let slept = Instant::now();
        tokio::time::sleep(LAG_PROBE_EVERY).await;
        let late = slept.elapsed().saturating_sub(LAG_PROBE_EVERY);
        average_us = next_lag_average_us(average_us, late.as_micros() as u64);
        lag_us.store(average_us, Ordering::Relaxed);
        metrics::gauge!(gauge).set(average_us as f64 / 1e6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_average_weighs_a_new_sample_a_quarter() {
        assert_eq!(next_lag_average_us(0, 100_000), 25_000);
        assert_eq!(next_lag_average_us(40_000, 0), 30_000);
    }
}
