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
//! clock is the earliest sign; while its moving average is over
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

use crate::api::error::ApiError;
use crate::config::AdmissionConfig;

/// Most namespaces tracked by the rate limiter; past it the oldest buckets
/// are dropped (they refill anyway).
const MAX_BUCKETS: usize = 100_000;

pub struct Admission {
    config: AdmissionConfig,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
    disk_low: Arc<AtomicBool>,
    free_bytes: Arc<AtomicU64>,
    /// Moving average of the lag probe's wake-up lateness, in microseconds.
    lag_us: Arc<AtomicU64>,
}

/// How often the lag probe wakes.
const LAG_PROBE_EVERY: Duration = Duration::from_millis(20);

/// The probe's moving average after one more sample: each sample weighs a
/// quarter, so a lag of a few probe periods shows within about 100 ms and
/// one late wake-up alone does not shed.
pub fn next_lag_average_us(average_us: u64, sample_us: u64) -> u64 {
    (average_us * 3 + sample_us) / 4
}

impl Admission {
    /// Starts the disk watcher for `data_dir`.
    pub fn start(config: AdmissionConfig, data_dir: PathBuf) -> Arc<Admission> {
        let admission = Arc::new(Admission {
            config,
            buckets: Mutex::new(HashMap::new()),
            disk_low: Arc::new(AtomicBool::new(false)),
            free_bytes: Arc::new(AtomicU64::new(u64::MAX)),
            lag_us: Arc::new(AtomicU64::new(0)),
        });
        {
            let lag_us = admission.lag_us.clone();
            let weak = Arc::downgrade(&admission);
            tokio::spawn(async move {
                let mut average_us = 0;
                while weak.strong_count() > 0 {
                    let slept = Instant::now();
                    tokio::time::sleep(LAG_PROBE_EVERY).await;
                    let late = slept.elapsed().saturating_sub(LAG_PROBE_EVERY);
                    average_us = next_lag_average_us(average_us, late.as_micros() as u64);
                    lag_us.store(average_us, Ordering::Relaxed);
                    metrics::gauge!("tocsin_scheduling_lag_seconds").set(average_us as f64 / 1e6);
                }
            });
        }
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

    /// The node's scheduling lag (moving average; see the module doc).
    pub fn scheduling_lag(&self) -> Duration {
        Duration::from_micros(self.lag_us.load(Ordering::Relaxed))
    }

    /// Admits `count` creates in `namespace`, or says why not.
    pub fn admit_create(&self, namespace: &str, count: u64) -> Result<(), ApiError> {
        if self.disk_low.load(Ordering::Relaxed) {
            return Err(ApiError::ResourceExhausted {
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
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(namespace) {
            let oldest = buckets.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                buckets.remove(&k);
            }
        }
        let now = Instant::now();
        let (tokens, last) = buckets.entry(namespace.to_string()).or_insert((rate as f64, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rate as f64).min(rate as f64);
        *last = now;
        if *tokens >= count as f64 {
            *tokens -= count as f64;
            Ok(())
        } else {
            let missing = count as f64 - *tokens;
            Err(ApiError::ResourceExhausted {
                message: format!("namespace {namespace} is over its create rate of {rate}/s"),
                retry_after_ms: ((missing / rate as f64) * 1000.0).ceil() as u64,
            })
        }
    }
}

/// Whether creates are refused for a scheduling lag of `lag` against the
/// bound `shed_after` (0: never), with a retry hint of a few lags.
pub fn shed_for_lag(lag: Duration, shed_after: Duration) -> Result<(), ApiError> {
    if shed_after.is_zero() || lag <= shed_after {
        return Ok(());
    }
    metrics::counter!("tocsin_creates_shed_total").increment(1);
    Err(ApiError::ResourceExhausted {
        message: format!("this node is overloaded: its scheduling lag is {} ms", lag.as_millis()),
        retry_after_ms: (lag.as_millis() as u64 * 4).clamp(100, 2_000),
    })
}

fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let stat = rustix::fs::statvfs(dir)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Err(ApiError::ResourceExhausted { retry_after_ms, message }) => {
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
    fn a_zero_bound_never_sheds_for_lag() {
        assert!(shed_for_lag(Duration::from_secs(10), Duration::ZERO).is_ok());
    }
}
