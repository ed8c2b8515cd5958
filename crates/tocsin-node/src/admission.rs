//! What the node lets in: a per-namespace create rate (token bucket), a
//! free-disk watermark below which creates are refused with
//! RESOURCE_EXHAUSTED before RocksDB would hit ENOSPC, and the node's
//! scheduling lag.
//!
//! **Scheduling lag.** A node offered more than its CPU can run falls
//! behind on everything at once, Raft heartbeats included: past the
//! election timeout its followers start elections, and every shard pays a
//! new term on top of the overload (measured: an election storm, tens of
//! seconds late). The lag of a task that only sleeps 20 ms and looks at the
//! clock is the earliest sign (`runtime::probe_lag`, on the work runtime and
//! on the fire runtime, where fire loops and deliveries run); while the
//! larger moving average is over
//! `shed_creates_lag_ms`, creates are refused with a retry hint, so that
//! what was accepted keeps its time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use crate::config::AdmissionConfig;
use crate::error::NodeError;

/// Most namespaces tracked by the rate limiter; past it the oldest buckets
/// are dropped (they refill anyway).
const MAX_BUCKETS: usize = 100_000;

pub struct Admission {
    config: AdmissionConfig,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
    /// Namespace quotas' create-rate buckets, per (namespace, shard).
    quota_buckets: Mutex<HashMap<(String, u32), (f64, Instant)>>,
    disk_low: Arc<AtomicBool>,
    free_bytes: Arc<AtomicU64>,
    /// Moving average of the lag probe's wake-up lateness, in microseconds.
    lag_us: Arc<AtomicU64>,
    /// The fire runtime's (`runtime.rs`): a node whose fire loops and
    /// deliveries run late takes no more creates either.
    fire_lag_us: std::sync::OnceLock<Arc<AtomicU64>>,
}

impl Admission {
    /// Starts the disk watcher for `data_dir`.
    pub fn start(config: AdmissionConfig, data_dir: PathBuf) -> Arc<Admission> {
        let admission = Arc::new(Admission {
            config,
            buckets: Mutex::new(HashMap::new()),
            quota_buckets: Mutex::new(HashMap::new()),
            disk_low: Arc::new(AtomicBool::new(false)),
            free_bytes: Arc::new(AtomicU64::new(u64::MAX)),
            lag_us: Arc::new(AtomicU64::new(0)),
            fire_lag_us: std::sync::OnceLock::new(),
        });
        tokio::spawn(crate::runtime::probe_lag(
            admission.lag_us.clone(),
            "tocsin_scheduling_lag_seconds",
            crate::runtime::LAG_PROBE_EVERY,
        ));
        let weak = Arc::downgrade(&admission);
        tokio::spawn(async move {
            loop {
                let Some(a) = weak.upgrade() else { return };
                let dir = data_dir.clone();
                if let Ok(Ok(free)) = tokio::task::spawn_blocking(move || free_bytes(&dir)).await {
                    a.free_bytes.store(free, Ordering::Relaxed);
                    let low = free < a.config.min_free_disk_bytes;
                    if low != a.disk_low.swap(low, Ordering::Relaxed) {
                        if low {
                            tracing::warn!(
                                free,
                                min = a.config.min_free_disk_bytes,
                                "free disk below the watermark; refusing creates"
                            );
                        } else {
                            tracing::info!(free, "free disk above the watermark again; accepting creates");
                        }
                    }
                    metrics::gauge!("tocsin_disk_free_bytes").set(free as f64);
                }
                drop(a);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        admission
    }

    /// Whether free disk is below the watermark (creates are refused).
    pub fn disk_low(&self) -> bool {
        self.disk_low.load(Ordering::Relaxed)
    }

    /// The flag behind [`Admission::disk_low`], for the Raft transport to
    /// tell peers (see `raft.rs`).
    pub fn disk_low_flag(&self) -> Arc<AtomicBool> {
        self.disk_low.clone()
    }

    pub fn free_disk_bytes(&self) -> u64 {
        self.free_bytes.load(Ordering::Relaxed)
    }

    /// Counts the fire runtime's lag (its probe's moving average) in the
    /// node's scheduling lag from now on.
    pub fn watch_fire_lag(&self, fire_lag_us: Arc<AtomicU64>) {
        let _ = self.fire_lag_us.set(fire_lag_us);
    }

    /// The node's scheduling lag (moving average; see the module doc): the
    /// larger of the work runtime's and the fire runtime's.
    pub fn scheduling_lag(&self) -> Duration {
        let work = self.lag_us.load(Ordering::Relaxed);
        let fire = self.fire_lag_us.get().map_or(0, |l| l.load(Ordering::Relaxed));
        Duration::from_micros(work.max(fire))
    }

    /// Admits `count` creates in `namespace`, or says why not.
    pub fn admit_create(&self, namespace: &str, count: u64) -> Result<(), NodeError> {
        if self.disk_low.load(Ordering::Relaxed) {
            return Err(NodeError::ResourceExhausted {
                message: format!(
                    "free disk is below {} bytes; creates are refused until space is freed",
                    self.config.min_free_disk_bytes
                ),
                retry_after_ms: 5_000,
            });
        }
        shed_for_lag(self.scheduling_lag(), Duration::from_millis(self.config.shed_creates_lag_ms))?;
        let rate = self.config.create_rate_per_namespace;
        if rate == 0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().expect("buckets lock");
        take(&mut buckets, namespace.to_string(), rate, count, Instant::now()).map_err(|retry_after_ms| {
            NodeError::ResourceExhausted {
                message: format!("namespace {namespace} is over its create rate of {rate}/s"),
                retry_after_ms,
            }
        })
    }

    /// Admits `count` creates in `namespace` on `shard` against the
    /// namespace's quota of `share_per_sec` creates per second on each
    /// shard (its cluster-wide quota's share, see `NamespaceQuota::share`).
    pub fn admit_quota_rate(
        &self,
        namespace: &str,
        shard: u32,
        share_per_sec: u64,
        count: u64,
    ) -> Result<(), NodeError> {
        let mut buckets = self.quota_buckets.lock().expect("buckets lock");
        take(&mut buckets, (namespace.to_string(), shard), share_per_sec, count, Instant::now()).map_err(
            |retry_after_ms| {
                metrics::counter!("tocsin_creates_over_quota_total", "quota" => "creates_per_sec").increment(count);
                NodeError::ResourceExhausted {
                    message: format!("namespace {namespace} is over its quota of creates per second"),
                    retry_after_ms,
                }
            },
        )
    }
}

/// Takes `count` tokens from `key`'s bucket (`rate` per second, holding at
/// most one second's worth), or answers how many ms until they would be
/// there. A batch larger than the bucket is let in when the bucket is full
/// and leaves it in debt, so any batch size is admitted at the rate on
/// average. Past [`MAX_BUCKETS`] keys the least recently used is dropped
/// (a dropped bucket starts full, a bounded leniency).
fn take<K: std::hash::Hash + Eq + Clone>(
    buckets: &mut HashMap<K, (f64, Instant)>,
    key: K,
    rate: u64,
    count: u64,
    now: Instant,
) -> Result<(), u64> {
    if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&key) {
        let oldest = buckets.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            buckets.remove(&k);
        }
    }
    let rate = rate.max(1) as f64;
    let (tokens, last) = buckets.entry(key).or_insert((rate, now));
    *tokens = (*tokens + now.saturating_duration_since(*last).as_secs_f64() * rate).min(rate);
    *last = now;
    let needed = (count as f64).min(rate);
    if *tokens >= needed {
        *tokens -= count as f64;
        Ok(())
    } else {
        Err((((needed - *tokens) / rate) * 1000.0).ceil().max(1.0) as u64)
    }
}

/// Why a create was shed: the `reason` label of `tocsin_creates_shed_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShedReason {
    /// The shard's proposal queue head waited past `shed_creates_after_ms`.
    QueueDelay,
    /// The node's scheduling lag is past `shed_creates_lag_ms`.
    SchedulingLag,
    /// The shard's fire loop has been leaving due timers unfired for want
    /// of batches for longer than `shed_creates_fire_behind_ms`.
    FireBehind,
}

impl ShedReason {
    fn label(self) -> &'static str {
        match self {
            ShedReason::QueueDelay => "queue_delay",
            ShedReason::SchedulingLag => "scheduling_lag",
            ShedReason::FireBehind => "fire_behind",
        }
    }

    /// How many of the measured delays a client is told to wait: a lag is
    /// an average over the whole node and clears more slowly than a queue.
    fn hint_factor(self) -> u32 {
        match self {
            ShedReason::QueueDelay | ShedReason::FireBehind => 1,
            ShedReason::SchedulingLag => 4,
        }
    }
}

/// Whether a create is shed because `measured` is past `bound` (a zero
/// bound never sheds): `None` admits it, `Some` is the retry hint, a few of
/// the measured delays within 50 ms and 2 s. A shed is counted.
pub fn shed(reason: ShedReason, measured: Duration, bound: Duration) -> Option<Duration> {
    if bound.is_zero() || measured <= bound {
        return None;
    }
    metrics::counter!("tocsin_creates_shed_total", "reason" => reason.label()).increment(1);
    Some((measured * reason.hint_factor()).clamp(Duration::from_millis(50), Duration::from_secs(2)))
}

/// Whether creates are refused for a scheduling lag of `lag` against the
/// bound `shed_after` (0: never).
pub fn shed_for_lag(lag: Duration, shed_after: Duration) -> Result<(), NodeError> {
    match shed(ShedReason::SchedulingLag, lag, shed_after) {
        None => Ok(()),
        Some(retry_after) => Err(NodeError::ResourceExhausted {
            message: format!("this node is overloaded: its scheduling lag is {} ms", lag.as_millis()),
            retry_after_ms: retry_after.as_millis() as u64,
        }),
    }
}

fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let stat = rustix::fs::statvfs(dir)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::next_lag_average_us;

    #[test]
    fn one_late_wake_up_does_not_shed_but_a_sustained_lag_does() {
        let bound = Duration::from_millis(30);
        let average = next_lag_average_us(0, 100_000);
        assert!(shed_for_lag(Duration::from_micros(average), bound).is_ok(), "one 100 ms stall weighs 25 ms");
        let average = next_lag_average_us(0, 80_000);
        assert!(shed_for_lag(Duration::from_micros(average), bound).is_ok());
        let mut average = 0;
        for _ in 0..4 {
            average = next_lag_average_us(average, 60_000);
        }
        match shed_for_lag(Duration::from_micros(average), bound) {
            Err(NodeError::ResourceExhausted { retry_after_ms, message }) => {
                assert!((100..=2_000).contains(&retry_after_ms), "{retry_after_ms}");
                assert!(message.contains("overloaded"), "{message}");
            }
            other => panic!("expected ResourceExhausted, got {other:?}"),
        }
        // And it recovers once the node keeps up again.
        for _ in 0..12 {
            average = next_lag_average_us(average, 1_000);
        }
        assert!(shed_for_lag(Duration::from_micros(average), bound).is_ok(), "{average} us");
    }

    #[test]
    fn a_bucket_admits_its_rate_and_a_large_batch_goes_into_debt() {
        let mut buckets = HashMap::new();
        let t0 = Instant::now();
        // 10/s: ten single creates pass, the eleventh waits about 100 ms.
        for _ in 0..10 {
            assert_eq!(take(&mut buckets, "a", 10, 1, t0), Ok(()));
        }
        let wait = take(&mut buckets, "a", 10, 1, t0).unwrap_err();
        assert!((90..=110).contains(&wait), "{wait} ms");
        assert_eq!(take(&mut buckets, "a", 10, 1, t0 + Duration::from_millis(100)), Ok(()));
        // A batch of 50 into a full 10/s bucket passes once, then the
        // bucket owes 4 s.
        assert_eq!(take(&mut buckets, "b", 10, 50, t0), Ok(()));
        let wait = take(&mut buckets, "b", 10, 1, t0 + Duration::from_secs(1)).unwrap_err();
        assert!((3_000..=4_200).contains(&wait), "{wait} ms");
        assert_eq!(take(&mut buckets, "b", 10, 1, t0 + Duration::from_secs(5)), Ok(()));
        // Buckets are bounded.
        let mut many = HashMap::new();
        for i in 0..MAX_BUCKETS + 10 {
            let _ = take(&mut many, i, 1, 1, t0);
        }
        assert_eq!(many.len(), MAX_BUCKETS);
    }

    #[test]
    fn a_zero_bound_never_sheds_for_lag() {
        assert!(shed_for_lag(Duration::from_secs(10), Duration::ZERO).is_ok());
    }
}
