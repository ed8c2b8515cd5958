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
//!
//! **Delivery lag.** A node can keep its fires on time and still fall
//! behind on delivering them: each fired timer then waits for a connection
//! slot or the lease before its send starts, and every create taken only
//! lengthens that wait (measured: three nodes offered 10,000 timers/s kept
//! `tocsin_fire_behind_seconds` at 0 while fired-but-undelivered timers
//! grew by 5,000 a second, p99 35 s late). So each push attempt reports
//! how long it waited between its start in replicated state and its send
//! ([`DeliveryLag`]), per namespace; in a second in which 1% of a
//! namespace's waits are over `shed_creates_delivery_behind_ms`, that
//! namespace's creates are refused, and after it they are let in at less
//! than its deliveries made lately, a limit that grows while they stay on
//! time.
//! Per namespace, because the usual cause of a long wait is one tenant's
//! slow receiver filling its endpoint's slots: that tenant is told to slow
//! down, the others are not.

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
    delivery_lag: Arc<DeliveryLag>,
}

impl Admission {
    /// Starts the disk watcher for `data_dir`.
    pub fn start(config: AdmissionConfig, data_dir: PathBuf) -> Arc<Admission> {
        let delivery_lag = Arc::new(DeliveryLag::new(config.shed_creates_delivery_behind_ms));
        let admission = Arc::new(Admission {
            config,
            buckets: Mutex::new(HashMap::new()),
            quota_buckets: Mutex::new(HashMap::new()),
            disk_low: Arc::new(AtomicBool::new(false)),
            free_bytes: Arc::new(AtomicU64::new(u64::MAX)),
            lag_us: Arc::new(AtomicU64::new(0)),
            fire_lag_us: std::sync::OnceLock::new(),
            delivery_lag,
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
                crate::grid::sleep_to_next_line(Duration::from_secs(1)).await;
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

    /// Where this node's push attempts report how long they waited to be
    /// sent (see the module doc).
    pub fn delivery_lag(&self) -> Arc<DeliveryLag> {
        self.delivery_lag.clone()
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
        self.delivery_lag.admit(namespace, count, Instant::now()).map_err(|shed| {
            metrics::counter!("tocsin_creates_shed_total", "reason" => DELIVERY_BEHIND_LABEL).increment(1);
            match shed {
                DeliveryShed::Behind { wait_ms } => NodeError::ResourceExhausted {
                    message: format!(
                        "namespace {namespace}'s deliveries from this node waited {wait_ms} ms to be sent; \
                         its creates are refused until they catch up"
                    ),
                    retry_after_ms: wait_ms.clamp(50, 2_000),
                },
                DeliveryShed::Limited { per_sec, retry_after_ms } => NodeError::ResourceExhausted {
                    message: format!(
                        "namespace {namespace}'s deliveries from this node fell behind; its creates are let in \
                         at {per_sec}/s while they catch up"
                    ),
                    retry_after_ms: retry_after_ms.clamp(50, 2_000),
                },
            }
        })?;
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

/// A delay measured against a bound, for which [`shed`] refuses a create:
/// the `reason` label of `tocsin_creates_shed_total`. The delivery shed
/// ([`DeliveryLag`]) decides and hints for itself and counts under
/// [`DELIVERY_BEHIND_LABEL`].
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

/// The `reason` label of a create shed because 1% of its namespace's push
/// attempts on this node in a second waited longer than
/// `shed_creates_delivery_behind_ms` to be sent, or because its creates are
/// over the limit that followed ([`DeliveryLag`]).
pub const DELIVERY_BEHIND_LABEL: &str = "delivery_behind";

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

/// Most namespaces [`DeliveryLag`] tracks; past it the one with the oldest
/// window is dropped (a namespace not heard from in a window is on time).
const MAX_DELIVERY_NAMESPACES: usize = 10_000;
/// The period over which sends are counted and judged.
const LAG_WINDOW: Duration = Duration::from_secs(1);
/// A namespace that fell behind is let in at this share of the most its
/// deliveries made in a recent window: less than they can deliver, so the
/// queue in front of them drains.
const RATE_DECREASE: f64 = 0.7;
/// How much of the most sends a window made is still remembered a window
/// later: the peak follows a receiver that slows for good within a few
/// seconds, and a window that sent little because everything paused does
/// not set the limit.
const PEAK_DECAY: f64 = 0.8;
/// ... and at this many times its limit more for every window on time (at
/// most twice the recent peak of sends).
const RATE_INCREASE: f64 = 1.25;
/// The lowest limit, creates per second (a receiver that delivered
/// nothing in the window still lets its namespace create a little).
const MIN_RATE_PER_SEC: f64 = 10.0;
/// A limit is lifted after this many windows on time in which it refused
/// nothing: the namespace asks for no more than its deliveries keep up with.
const RELEASE_AFTER_WINDOWS: u32 = 3;

/// Per namespace, how its push attempts on this node keep up, and the
/// create limit that follows from it (see the module doc).
///
/// Each attempt reports how long it waited between its start in replicated
/// state and its send ([`DeliveryLag::note`]). A window in which at least
/// 1% of them waited longer than the bound is *behind*: while it lasts,
/// the namespace's creates are refused outright; from its end they are let
/// in at [`RATE_DECREASE`] of the recent peak of sends ([`PEAK_DECAY`]), a
/// limit that grows by [`RATE_INCREASE`] for each window on time and is
/// lifted after [`RELEASE_AFTER_WINDOWS`] on time without refusing
/// anything. An on/off gate alone lets every create waiting on a retry in
/// at once when it opens, and they all fall due together a timer's delay
/// later: measured, three nodes offered 10,000 timers/s with 2 s delays
/// went on and off every few seconds with p99 lateness over 20 s. A limit
/// taken from the sends of the window behind alone fell to the floor when
/// that window sent little (a pause of the whole node, or a receiver that
/// hung for a second), and grew back only as fast as the creates it let in
/// fell due.
#[derive(Debug)]
pub struct DeliveryLag {
    base: Instant,
    bound_ms: u64,
    /// The latest window in which any namespace was behind or limited:
    /// [`DeliveryLag::admit`] skips the lock when it is older than the
    /// previous window.
    restricted_window: AtomicU64,
    namespaces: Mutex<HashMap<String, NsDelivery>>,
}

/// One namespace's window, and its limit while it recovers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct NsDelivery {
    window: u64,
    sends: u64,
    /// The longest wait reported in the window.
    max_wait_ms: u64,
    /// Sends in the window that waited longer than the bound.
    over: u64,
    /// Whether the limit refused a create in the window.
    limited_some: bool,
    /// The most sends per second of a recent window, decaying by
    /// [`PEAK_DECAY`] a window.
    peak_sends_per_sec: f64,
    /// Consecutive finished windows on time with the limit refusing
    /// nothing.
    quiet_windows: u32,
    /// Creates per second while it recovers, the tokens left and when they
    /// were counted (ms since `base`).
    limit: Option<(f64, f64, u64)>,
}

impl NsDelivery {
    /// Whether the window is behind: at least 1% of its sends (and at
    /// least one) waited past the bound. A percentile, not the maximum: at
    /// thousands of sends a second a few slow ones are noise, and shedding
    /// on them cut a node that kept up to a quarter of its rate.
    fn behind(&self) -> bool {
        self.over > 0 && self.over * 100 >= self.sends
    }

    /// Moves to `window`, judging the windows that ended.
    fn roll(&mut self, window: u64) {
        if window <= self.window {
            return;
        }
        let elapsed = window - self.window;
        let sends_per_sec = self.sends as f64 / LAG_WINDOW.as_secs_f64();
        // Windows with no report at all are on time and sent nothing.
        let peak =
            (self.peak_sends_per_sec * PEAK_DECAY).max(sends_per_sec) * PEAK_DECAY.powi((elapsed - 1).min(64) as i32);
        let mut limit = self.limit;
        let mut quiet_windows = self.quiet_windows;
        if self.behind() {
            // What the deliveries made at their best lately is what they can
            // do: let in less than that.
            limit = Some(((peak * RATE_DECREASE).max(MIN_RATE_PER_SEC), 0.0, 0));
            quiet_windows = 0;
        } else if let Some((rate, tokens, at)) = limit {
            // The window that ended was on time, and so was every window
            // after it with no report at all.
            let on_time = elapsed.min(64) as u32;
            quiet_windows = if self.limited_some { on_time - 1 } else { quiet_windows + on_time };
            // Grown by a quarter a window, but never past twice the recent
            // peak of sends: creates let in now fall due together later,
            // and a limit far above what was delivered would let the whole
            // backlog of retries in at once (measured: 10,000 in one second,
            // 3-5 s late two seconds on).
            let grown = (rate * RATE_INCREASE.powi(on_time as i32)).min((2.0 * peak).max(rate));
            limit = (quiet_windows < RELEASE_AFTER_WINDOWS).then_some((grown, tokens, at));
        }
        *self = NsDelivery { window, limit, quiet_windows, peak_sends_per_sec: peak, ..NsDelivery::default() };
    }
}

/// Why [`DeliveryLag::admit`] refused a create.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeliveryShed {
    /// A send of the namespace in this window waited `wait_ms`.
    Behind { wait_ms: u64 },
    /// The namespace is recovering and its limit is spent.
    Limited { per_sec: u64, retry_after_ms: u64 },
}

impl DeliveryLag {
    /// Sends waiting up to `bound_ms` are on time (0: never shed).
    pub fn new(bound_ms: u64) -> DeliveryLag {
        DeliveryLag {
            base: Instant::now(),
            bound_ms,
            restricted_window: AtomicU64::new(0),
            namespaces: Mutex::new(HashMap::new()),
        }
    }

    /// Windows count from 2: 0 is "never restricted", which must look older
    /// than the previous window of every real one.
    fn window_and_ms(&self, now: Instant) -> (u64, u64) {
        let ms = now.saturating_duration_since(self.base).as_millis() as u64;
        (ms / LAG_WINDOW.as_millis() as u64 + 2, ms)
    }

    /// A push attempt of `namespace` waited `wait_ms` to be sent.
    pub fn note(&self, namespace: &str, wait_ms: u64, now: Instant) {
        if self.bound_ms == 0 {
            return;
        }
        let (window, _) = self.window_and_ms(now);
        let mut namespaces = self.namespaces.lock().expect("delivery lag lock");
        if !namespaces.contains_key(namespace) && namespaces.len() >= MAX_DELIVERY_NAMESPACES {
            let oldest = namespaces.iter().min_by_key(|(_, ns)| ns.window).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                namespaces.remove(&k);
            }
        }
        let ns = namespaces.entry(namespace.to_string()).or_insert(NsDelivery { window, ..NsDelivery::default() });
        ns.roll(window);
        ns.sends += 1;
        ns.max_wait_ms = ns.max_wait_ms.max(wait_ms);
        if wait_ms > self.bound_ms {
            ns.over += 1;
        }
        if ns.behind() || ns.limit.is_some() {
            self.restricted_window.fetch_max(window, Ordering::Relaxed);
        }
    }

    /// Lets `count` creates of `namespace` in, or says why not.
    pub fn admit(&self, namespace: &str, count: u64, now: Instant) -> Result<(), DeliveryShed> {
        let (window, ms) = self.window_and_ms(now);
        if self.restricted_window.load(Ordering::Relaxed) + 1 < window {
            return Ok(());
        }
        let mut namespaces = self.namespaces.lock().expect("delivery lag lock");
        let Some(ns) = namespaces.get_mut(namespace) else { return Ok(()) };
        ns.roll(window);
        if ns.behind() {
            return Err(DeliveryShed::Behind { wait_ms: ns.max_wait_ms });
        }
        let Some((rate, tokens, at)) = ns.limit.as_mut() else { return Ok(()) };
        self.restricted_window.fetch_max(window, Ordering::Relaxed);
        // A token bucket holding at most a tenth of a second's creates, so
        // a limit lets them in smoothly rather than a window's worth at once;
        // a batch larger than that is let in when it is full, leaving debt.
        let burst = (*rate / 10.0).max(1.0);
        *tokens = (*tokens + ms.saturating_sub(*at) as f64 * *rate / 1000.0).min(burst);
        *at = ms;
        let needed = (count as f64).min(burst);
        if *tokens >= needed {
            *tokens -= count as f64;
            return Ok(());
        }
        ns.limited_some = true;
        let retry_after_ms = (((needed - *tokens) / *rate) * 1000.0).ceil().max(1.0) as u64;
        Err(DeliveryShed::Limited { per_sec: *rate as u64, retry_after_ms })
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

    /// `ns`'s create limit, creates per second, if it has one.
    fn limit_of(lag: &DeliveryLag, ns: &str) -> Option<f64> {
        lag.namespaces.lock().unwrap()[ns].limit.map(|(rate, _, _)| rate)
    }

    #[test]
    fn a_namespace_behind_is_refused_then_let_in_at_a_growing_rate_then_freed() {
        let lag = DeliveryLag::new(300);
        let t0 = lag.base;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for _ in 0..50 {
            lag.note("a", 100, t0);
        }
        assert_eq!(lag.admit("a", 1, t0), Ok(()), "on time: no limit");
        // Phase: one send of 100 in the window waited past the bound.
        for _ in 0..49 {
            lag.note("a", 120, at(10));
        }
        lag.note("a", 900, at(20));
        assert_eq!(lag.admit("a", 1, at(30)), Err(DeliveryShed::Behind { wait_ms: 900 }));
        assert_eq!(lag.admit("b", 1, at(30)), Ok(()), "another namespace is not held back");
        // Phase: from the next window, 70% of the peak of 100 sends a
        // second, in bursts of a tenth of that.
        for _ in 0..7 {
            assert_eq!(lag.admit("a", 1, at(1_000)), Ok(()));
        }
        assert_eq!(lag.admit("a", 1, at(1_000)), Err(DeliveryShed::Limited { per_sec: 70, retry_after_ms: 15 }));
        assert_eq!(lag.admit("a", 1, at(1_015)), Ok(()), "a token every 1/70 s");
        // Phase: windows on time raise the limit by a quarter each; three
        // in which it refused nothing lift it.
        for _ in 0..100 {
            lag.note("a", 10, at(1_500));
        }
        assert!(lag.admit("a", 1, at(2_000)).is_ok());
        assert!(matches!(limit_of(&lag, "a"), Some(r) if (r - 87.5).abs() < 1e-9));
        assert!(lag.admit("a", 1, at(3_000)).is_ok());
        assert!(lag.admit("a", 1, at(4_000)).is_ok());
        assert!(limit_of(&lag, "a").is_some(), "two quiet windows");
        assert!(lag.admit("a", 1, at(5_000)).is_ok());
        assert_eq!(limit_of(&lag, "a"), None, "three quiet windows lift it");
        for _ in 0..100 {
            assert_eq!(lag.admit("a", 1, at(5_001)), Ok(()));
        }
    }

    #[test]
    fn the_limit_follows_the_recent_peak_of_sends_not_a_window_that_paused() {
        let lag = DeliveryLag::new(300);
        let at = |ms: u64| lag.base + Duration::from_millis(ms);
        // 1,000 sends on time, then a window in which everything paused and
        // the few sends made had all waited: the limit comes from the peak
        // (1,000 a second, 800 a window later), not from the 10.
        for _ in 0..1_000 {
            lag.note("a", 10, at(500));
        }
        for _ in 0..10 {
            lag.note("a", 5_000, at(1_500));
        }
        assert!(lag.admit("a", 1, at(1_600)).is_err(), "behind");
        assert!(lag.admit("a", 1, at(2_000)).is_ok());
        assert!(matches!(limit_of(&lag, "a"), Some(r) if (r - 560.0).abs() < 1e-9), "{:?}", limit_of(&lag, "a"));
        // On time with 100 sends: a quarter more (the peak is 640 now).
        for _ in 0..100 {
            lag.note("a", 10, at(2_500));
        }
        assert!(lag.admit("a", 1, at(3_000)).is_ok());
        assert!(matches!(limit_of(&lag, "a"), Some(r) if (r - 700.0).abs() < 1e-9), "{:?}", limit_of(&lag, "a"));
        // While it still refuses some, it grows a quarter a window, but
        // never past twice the decaying peak (512 a second after the next
        // window, 409.6 after the one after) unless it was already higher.
        let refuse_some = |ms: u64| assert!((0..100).any(|_| lag.admit("a", 1, at(ms)).is_err()));
        refuse_some(3_000);
        assert!(lag.admit("a", 1, at(4_000)).is_ok());
        assert!(matches!(limit_of(&lag, "a"), Some(r) if (r - 875.0).abs() < 1e-9), "{:?}", limit_of(&lag, "a"));
        refuse_some(4_000);
        assert!(lag.admit("a", 1, at(5_000)).is_ok());
        assert!(matches!(limit_of(&lag, "a"), Some(r) if (r - 875.0).abs() < 1e-9), "{:?}", limit_of(&lag, "a"));
        // A receiver that barely answers and has no history: the floor.
        lag.note("b", 5_000, at(0));
        assert!(lag.admit("b", 1, at(1_000)).is_ok());
        assert_eq!(limit_of(&lag, "b"), Some(MIN_RATE_PER_SEC));
        // A long silence is on time throughout: the limits are gone.
        for _ in 0..1_000 {
            assert_eq!(lag.admit("a", 1, at(60_000)), Ok(()));
        }
        lag.note("a", 10, at(60_000));
        assert_eq!(limit_of(&lag, "a"), None);
    }

    #[test]
    fn a_zero_bound_never_sheds_and_namespaces_are_bounded() {
        let off = DeliveryLag::new(0);
        off.note("a", 60_000, off.base);
        assert_eq!(off.admit("a", 1, off.base), Ok(()));
        let lag = DeliveryLag::new(300);
        let t0 = lag.base;
        lag.note("first", 500, t0);
        for i in 0..MAX_DELIVERY_NAMESPACES {
            lag.note(&format!("ns{i}"), 500, t0 + LAG_WINDOW);
        }
        assert_eq!(lag.namespaces.lock().unwrap().len(), MAX_DELIVERY_NAMESPACES);
        assert_eq!(lag.admit("first", 1, t0 + LAG_WINDOW), Ok(()), "the oldest namespace was dropped");
        assert_eq!(lag.admit("ns9", 1, t0 + LAG_WINDOW), Err(DeliveryShed::Behind { wait_ms: 500 }));
    }

    #[tokio::test]
    async fn creates_of_a_namespace_whose_deliveries_wait_are_refused_with_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let config = AdmissionConfig { shed_creates_delivery_behind_ms: 300, ..AdmissionConfig::default() };
        let admission = Admission::start(config, dir.path().to_path_buf());
        admission.delivery_lag().note("slow", 250, Instant::now());
        assert!(admission.admit_create("slow", 1).is_ok(), "under the bound");
        admission.delivery_lag().note("slow", 900, Instant::now());
        match admission.admit_create("slow", 1) {
            Err(NodeError::ResourceExhausted { message, retry_after_ms }) => {
                assert!(message.contains("slow") && message.contains("900 ms"), "{message}");
                assert_eq!(retry_after_ms, 900, "the wait is the hint");
            }
            other => panic!("expected RESOURCE_EXHAUSTED, got {other:?}"),
        }
        assert!(admission.admit_create("fast", 1).is_ok(), "other namespaces are let in");
        let off = AdmissionConfig { shed_creates_delivery_behind_ms: 0, ..AdmissionConfig::default() };
        let admission = Admission::start(off, dir.path().to_path_buf());
        admission.delivery_lag().note("slow", 5_000, Instant::now());
        assert!(admission.admit_create("slow", 1).is_ok(), "0 turns it off");
    }

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
