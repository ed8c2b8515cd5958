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
//!   tasks, the outgoing transport channels, and the gRPC server's
//!   connections. Its queue holds only Raft work, so its tasks run within
//!   the OS's scheduling latency (milliseconds) however busy the node is;
//! - the **work runtime** (the process's main one): request handlers,
//!   proposers, fire loops, delivery, the HTTP server.
//!
//! One gRPC port serves both kinds of traffic, so [`OffloadLayer`] moves
//! each request to the work runtime unless it is a Raft transport message,
//! which stays on the Raft runtime. Each runtime has a lag probe
//! ([`probe_lag`]): the work runtime's drives admission (`admission.rs`),
//! the Raft runtime's is exported to show that the split holds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::task::Context;
use std::task::Poll;
use std::time::Duration;
use std::time::Instant;

use tokio::runtime::Handle;

/// Worker threads of the Raft runtime at most: one group's core runs on one
/// thread at a time, and the runtime holds only Raft work.
const RAFT_WORKER_THREADS_MAX: usize = 2;

/// How often a lag probe wakes.
pub const LAG_PROBE_EVERY: Duration = Duration::from_millis(20);

/// gRPC paths that stay on the Raft runtime.
const RAFT_TRANSPORT_PATH_PREFIX: &str = "/tocsin.v1.RaftTransport/";

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

/// Whether a gRPC request to `path` is Raft's and stays on the Raft runtime.
pub fn is_raft_transport(path: &str) -> bool {
    path.starts_with(RAFT_TRANSPORT_PATH_PREFIX)
}

/// A tower layer for the gRPC server (which runs on the Raft runtime): runs
/// every request but Raft's on `work`.
#[derive(Clone)]
pub struct OffloadLayer {
    work: Handle,
}

impl OffloadLayer {
    pub fn new(work: Handle) -> OffloadLayer {
        OffloadLayer { work }
    }
}

impl<S> tower_layer::Layer<S> for OffloadLayer {
    type Service = Offload<S>;

    fn layer(&self, inner: S) -> Offload<S> {
        Offload { inner, work: self.work.clone() }
    }
}

/// The service [`OffloadLayer`] makes.
#[derive(Clone)]
pub struct Offload<S> {
    inner: S,
    work: Handle,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B, R> tower_service::Service<http::Request<B>> for Offload<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    R: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<R>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The clone is the ready one's replacement (tower's usual dance).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if is_raft_transport(request.uri().path()) {
            let call = inner.call(request);
            return Box::pin(async move { call.await.map_err(Into::into) });
        }
        let call = self.work.spawn(inner.call(request));
        Box::pin(async move {
            match call.await {
                Ok(result) => result.map_err(Into::into),
                Err(join) => Err(Box::new(join) as BoxError),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_raft_transport_stays_on_the_raft_runtime() {
        assert!(is_raft_transport("/tocsin.v1.RaftTransport/Append"));
        assert!(!is_raft_transport("/tocsin.v1.TimerService/CreateTimer"));
        assert!(!is_raft_transport("/tocsin.v1.ReplicaControl/ReleaseShard"));
        assert!(!is_raft_transport("/tocsin.v1.AdminService/AddNode"));
    }

    #[test]
    fn the_lag_average_weighs_a_new_sample_a_quarter() {
        assert_eq!(next_lag_average_us(0, 100_000), 25_000);
        assert_eq!(next_lag_average_us(40_000, 0), 30_000);
    }

    /// Answers with the name of the thread that polled the call.
    #[derive(Clone)]
    struct ThreadName;

    impl tower_service::Service<http::Request<()>> for ThreadName {
        type Response = http::Response<String>;
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<http::Response<String>, Self::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            Box::pin(async { Ok(http::Response::new(std::thread::current().name().unwrap_or_default().to_string())) })
        }
    }

    /// A request the layer offloads runs on the work runtime, and a Raft
    /// message on the runtime that serves the connection.
    #[test]
    fn requests_run_on_the_work_runtime_and_raft_messages_stay() {
        use tower_service::Service as _;
        let raft = RaftRuntime::start().unwrap();
        let work = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("work").build().unwrap();
        let mut svc = tower_layer::Layer::layer(&OffloadLayer::new(work.handle().clone()), ThreadName);
        let mut on = |path: &str| {
            let call = svc.call(http::Request::builder().uri(path).body(()).unwrap());
            raft.handle().block_on(raft.handle().spawn(call)).unwrap().unwrap().into_body()
        };
        assert_eq!(on("/tocsin.v1.TimerService/CreateTimer"), "work");
        assert_eq!(on("/tocsin.v1.RaftTransport/Append"), "tocsin-raft");
        work.shutdown_background();
    }
}
