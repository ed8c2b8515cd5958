//! Raft and the shards' fire paths get tokio runtimes of their own, so that
//! no backlog of client work can delay a heartbeat or a fire.
//!
//! Why: on a node offered more than its CPU can run, every task waits its
//! turn in the scheduler's queue. Heartbeats and appends queued behind
//! thousands of create handlers, fire batches and webhook calls arrived
//! later than the election timeout (then 150–300 ms), so followers started
//! elections on every shard at once (measured: 2,000–3,400 per node in
//! 20 s of overload), and each new term cost a wheel rebuild and repeated
//! deliveries: more load.
//!
//! The same held for fires: offered 10,000 timers/s, three nodes spent
//! their CPU on create handlers (most of them shed) while the fire loops,
//! proposers and webhook calls waited behind them in one queue: the timers
//! that were accepted fired seconds late.
//!
//! So the node runs three runtimes ([`SideRuntime`] for the first two):
//! - the **Raft runtime** (a few worker threads, `tocsin-raft`): every
//!   group's openraft core and its replication, heartbeat and state-machine
//!   tasks, and both ends of the Raft links (`link.rs`). Its queue holds
//!   only Raft work, so its tasks run within the OS's scheduling latency
//!   (milliseconds) however busy the node is;
//! - the **fire runtime** (`tocsin-fire`): each shard's proposer, leader
//!   supervisor and fire loop, and webhook delivery. Creates reach it only
//!   through a proposer's bounded queue, and are shed at the door when that
//!   queue waits (`admission.rs`), so the work of timers already accepted
//!   is never behind a crowd of new ones;
//! - the **work runtime** (the process's main one): the gRPC and HTTP
//!   servers and request handlers, the control plane.
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

use tokio::runtime::Handle;

/// Worker threads of a side runtime at most: one group's core (or fire
/// loop) runs on one thread at a time, and the runtime holds only its work.
const SIDE_WORKER_THREADS_MAX: usize = 2;

/// How often a lag probe that drives admission wakes (the work and fire
/// runtimes'): overload must show within about 100 ms.
pub const LAG_PROBE_EVERY: Duration = Duration::from_millis(20);
/// How often the Raft runtime's probe wakes: its lag is only a gauge, and
/// three probes at 50 wake-ups a second were a visible part of an idle
/// node's CPU. A multiple of the heartbeat and LIVENESS lines (40 and 80
/// ms at the defaults), so on the grid it wakes with them.
const GAUGE_PROBE_EVERY: Duration = Duration::from_millis(400);

/// A runtime beside the work runtime (Raft's, the fire path's). Dropping it
/// stops its tasks without waiting for them (openraft's cores are shut
/// down before, by `Node::shutdown`).
pub struct SideRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    handle: Handle,
    /// The runtime's lag probe's moving average, in microseconds (also the
    /// runtime's gauge, `tocsin_{name}_scheduling_lag_seconds`).
    lag_us: Arc<AtomicU64>,
}

impl SideRuntime {
    /// Starts the Raft runtime (threads `tocsin-raft`), its threads at
    /// `nice` (see [`raise_priority`]; 0: the process's own).
    pub fn start_raft(nice: i32) -> std::io::Result<SideRuntime> {
        SideRuntime::start("tocsin-raft", "tocsin_raft_scheduling_lag_seconds", GAUGE_PROBE_EVERY, nice)
    }

    /// Starts the fire runtime (threads `tocsin-fire`).
    pub fn start_fire() -> std::io::Result<SideRuntime> {
        SideRuntime::start("tocsin-fire", "tocsin_fire_scheduling_lag_seconds", LAG_PROBE_EVERY, 0)
    }

    fn start(thread_name: &str, gauge: &'static str, probe_every: Duration, nice: i32) -> std::io::Result<SideRuntime> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(SIDE_WORKER_THREADS_MAX);
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads).thread_name(thread_name).enable_all();
        // Only the Raft runtime asks for a priority (`start_raft`).
        if nice != 0 {
            let reported = Arc::new(std::sync::Once::new());
            builder.on_thread_start(move || {
                let raised = raise_priority(nice);
                reported.call_once(|| report_priority(nice, raised));
            });
        }
        let runtime = builder.build()?;
        let handle = runtime.handle().clone();
        let lag_us = Arc::new(AtomicU64::new(0));
        handle.spawn(probe_lag(lag_us.clone(), gauge, probe_every));
        Ok(SideRuntime { runtime: Some(runtime), handle, lag_us })
    }

    /// How late the runtime's tasks run (moving average).
    pub fn scheduling_lag(&self) -> Duration {
        Duration::from_micros(self.lag_us.load(Ordering::Relaxed))
    }

    /// The lag probe's moving average, in microseconds, as it updates.
    pub fn lag_us(&self) -> Arc<AtomicU64> {
        self.lag_us.clone()
    }

    /// Where the runtime's tasks are spawned.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stops the runtime and waits (up to [`STOP_TIMEOUT`]) for the blocking
    /// work it started (index reads of the fire loops, log reads of the Raft
    /// cores), so that none of it still holds the store, or runs in RocksDB,
    /// while the process exits. Dropping the runtime instead does not wait
    /// (it cannot block inside an async context).
    pub async fn stop(mut self) {
        if let Some(runtime) = self.runtime.take() {
            // A blocking-pool thread may block; a runtime worker may not.
            let _ = tokio::task::spawn_blocking(move || runtime.shutdown_timeout(STOP_TIMEOUT)).await;
        }
    }
}

/// How long [`SideRuntime::stop`] waits for a runtime's blocking work.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

impl Drop for SideRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks on its tasks, which panics inside an
        // async context (where a node is usually dropped).
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Sets the calling thread's nice value to `nice` (Linux keeps it per
/// thread; the threads a thread starts inherit it).
///
/// Why the Raft threads get it: on a CPU-saturated host (three nodes, the
/// load generator and its receiver on two cores, offered 10,000 timers/s),
/// their own runtime was not enough. The kernel shared the cores evenly
/// among some sixty runnable threads, heartbeats went out and were answered
/// late (1,700–3,000 late per node in 20 s with 40 / 100–130 ms timings),
/// followers campaigned (200–500 elections per node), and every new term
/// repeated deliveries (18,248 duplicates). With these threads at nice −10:
/// 49–81 late heartbeats per node, no election, 67 duplicates
/// (docs/perf-history.md, "Raft threads first"). Raft's own work is small (heartbeats,
/// appends, votes): ahead of the rest it costs the rest little.
///
/// Lowering a nice value needs `CAP_SYS_NICE` or an `RLIMIT_NICE` of at
/// least `20 - nice` (systemd's `LimitNICE=`); without either the call
/// fails and the thread keeps the process's priority.
#[allow(unsafe_code)]
pub fn raise_priority(nice: i32) -> Result<(), std::io::Error> {
    // SAFETY: setpriority takes plain integers and touches no memory of
    // ours. On Linux, PRIO_PROCESS with `who` 0 names the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Says once whether the Raft runtime's threads got their priority, and
/// exports the nice value they run at (`tocsin_raft_thread_nice`).
fn report_priority(nice: i32, raised: Result<(), std::io::Error>) {
    match raised {
        Ok(()) => {
            tracing::info!(nice, "the Raft runtime's threads run at a raised priority");
            metrics::gauge!("tocsin_raft_thread_nice").set(f64::from(nice));
        }
        Err(error) => {
            tracing::warn!(
                nice,
                %error,
                "could not raise the Raft runtime's threads' priority (needs CAP_SYS_NICE or RLIMIT_NICE); \
                 on a CPU-saturated host their heartbeats may be late and leaders change"
            );
            metrics::gauge!("tocsin_raft_thread_nice").set(0.0);
        }
    }
}

/// The probe's moving average after one more sample: each sample weighs a
/// quarter, so a lag of a few probe periods shows within about 100 ms and
/// one late wake-up alone does not shed.
pub fn next_lag_average_us(average_us: u64, sample_us: u64) -> u64 {
    (average_us * 3 + sample_us) / 4
}

/// A probe sample later than this is not quiet (tokio's timers round a
/// sleep up to their millisecond ticks, so an idle runtime's samples are
/// 0–2 ms late).
const QUIET_LAG_US: u64 = 5_000;
/// Quiet samples in a row after which the probe slows down.
const QUIET_SAMPLES: u32 = 10;
/// How often a probe of a quiet runtime wakes.
const QUIET_PROBE_EVERY: Duration = Duration::from_millis(250);

/// How long the probe sleeps next: `every` while the runtime is busy,
/// [`QUIET_PROBE_EVERY`] once its last [`QUIET_SAMPLES`] samples were all
/// under [`QUIET_LAG_US`]. On an idle node the probes were most of its
/// wake-ups (two at 50 a second); a runtime that turns busy shows lag in
/// its next sample, a quarter of a second at most, and the probe is back
/// at `every` from then on.
pub fn next_probe_every(every: Duration, quiet_samples: u32) -> Duration {
    if quiet_samples >= QUIET_SAMPLES { every.max(QUIET_PROBE_EVERY) } else { every }
}

/// Measures the scheduling lag of the runtime it is spawned on: how late a
/// task that sleeps `every` (slower while the runtime is quiet, see
/// [`next_probe_every`]) wakes, as a moving average in `lag_us` and the
/// gauge `gauge` (seconds). Returns once `lag_us` has no other owner.
pub async fn probe_lag(lag_us: Arc<AtomicU64>, gauge: &'static str, every: Duration) {
    let mut average_us = 0;
    let mut quiet_samples = 0u32;
    while Arc::strong_count(&lag_us) > 1 {
        // On the node's grid (`crate::grid`): the runtime's other periodic
        // work wakes on these lines too, and lateness counts from the line.
        let line = crate::grid::next_line(next_probe_every(every, quiet_samples));
        tokio::time::sleep_until(line).await;
        let late_us = tokio::time::Instant::now().saturating_duration_since(line).as_micros() as u64;
        quiet_samples = if late_us < QUIET_LAG_US { quiet_samples.saturating_add(1) } else { 0 };
        average_us = next_lag_average_us(average_us, late_us);
        lag_us.store(average_us, Ordering::Relaxed);
        metrics::gauge!(gauge).set(average_us as f64 / 1e6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_runtime_is_probed_less_often_until_a_sample_is_late() {
        let every = Duration::from_millis(20);
        assert_eq!(next_probe_every(every, 0), every);
        assert_eq!(next_probe_every(every, QUIET_SAMPLES - 1), every);
        assert_eq!(next_probe_every(every, QUIET_SAMPLES), QUIET_PROBE_EVERY);
        // A probe already slower than the quiet period keeps its own.
        assert_eq!(next_probe_every(Duration::from_secs(1), QUIET_SAMPLES), Duration::from_secs(1));
    }

    /// The calling thread's nice value, from `/proc/thread-self/stat`
    /// (field 19; the name in field 2 may hold spaces, so count from the
    /// closing parenthesis).
    fn own_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn the_raft_runtimes_threads_run_at_the_nice_value_asked_for_where_allowed() {
        let before = std::thread::spawn(own_nice).join().unwrap();
        let allowed = std::thread::spawn(|| raise_priority(-3)).join().unwrap();
        let raft = SideRuntime::start_raft(-3).unwrap();
        let on_raft = raft.handle().block_on(async { tokio::spawn(async { own_nice() }).await.unwrap() });
        match allowed {
            Ok(()) => assert_eq!(on_raft, -3, "the Raft runtime's worker runs at the nice value asked for"),
            // Without CAP_SYS_NICE the threads keep the process's priority.
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
                assert_eq!(on_raft, before);
            }
        }
        // The other runtimes are left alone.
        let fire = SideRuntime::start_fire().unwrap();
        let on_fire = fire.handle().block_on(async { tokio::spawn(async { own_nice() }).await.unwrap() });
        assert_eq!(on_fire, before);
    }

    #[test]
    fn the_lag_average_weighs_a_new_sample_a_quarter() {
        assert_eq!(next_lag_average_us(0, 100_000), 25_000);
        assert_eq!(next_lag_average_us(40_000, 0), 30_000);
    }
}
