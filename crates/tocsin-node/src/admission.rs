//! What the node lets in: a per-namespace create rate (token bucket) and a
//! free-disk watermark below which creates are refused with
//! RESOURCE_EXHAUSTED before RocksDB would hit ENOSPC.

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
}

impl Admission {
    /// Starts the disk watcher for `data_dir`.
    pub fn start(config: AdmissionConfig, data_dir: PathBuf) -> Arc<Admission> {
        let admission = Arc::new(Admission {
            config,
            buckets: Mutex::new(HashMap::new()),
            disk_low: Arc::new(AtomicBool::new(false)),
            free_bytes: Arc::new(AtomicU64::new(u64::MAX)),
        });
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

fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let stat = rustix::fs::statvfs(dir)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}
