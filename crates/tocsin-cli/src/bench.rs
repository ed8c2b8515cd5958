//! `tocsin bench`: Tocsin's own load generator.
//!
//! - `create`: create throughput, with `CreateTimers` batches or single
//!   creates at a given concurrency;
//! - `fire`: a steady rate of timers due a little later, some cancelled,
//!   received by an embedded `tocsin sink`; reports fire lateness;
//! - `burst`: a "thundering second" of timers all due in the same second:
//!   pull timers drained by a pull consumer, or (`--webhook`) webhook
//!   timers received by an embedded `tocsin sink`.
//!
//! Each reports what it measured in a plain table; long runs show progress.

use axum::serve::ListenerExt as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use indicatif::ProgressStyle;
use tocsin_client::v1 as pb;

use crate::sink;

/// Unix milliseconds by the host's clock: the load generator's reference.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[derive(clap::Args, Clone)]
pub struct Common {
    /// gRPC address of any node (repeat for several).
    #[arg(long = "addr", default_value = "127.0.0.1:7070", env = "TOCSIN_ADDR")]
    addrs: Vec<String>,
    #[arg(long, default_value = "bench")]
    namespace: String,
    /// Payload bytes per timer.
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Distinguishes runs: ids are `<run>-<n>`.
    #[arg(long)]
    run: Option<String>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Concurrent single creates to one node share a `CreateTimers` call
    /// while this many calls to it are out (the client's default; see
    /// `tocsin-client`'s `coalesce.rs`); 0: every create is a call of its own.
    #[arg(long, default_value_t = tocsin_client::ClientOptions::default().coalesce_in_flight)]
    coalesce_in_flight: usize,
}

impl Common {
    /// A client to `addrs`, coalescing single creates as told.
    async fn connect(&self) -> Result<tocsin_client::Client, tocsin_client::ClientError> {
        crate::connect_with(self.addrs.clone(), |o| o.coalesce_in_flight = self.coalesce_in_flight).await
    }

    fn run_id(&self) -> String {
        self.run.clone().unwrap_or_else(|| format!("r{}", now_ms()))
    }
}

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Create throughput.
    Create {
        #[command(flatten)]
        common: Common,
        /// Timers to create.
        #[arg(long, default_value_t = 200_000)]
        total: u64,
        /// Timers per CreateTimers call (1 uses CreateTimer).
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Calls in flight.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Fire times are now + delay + a random share of the spread.
        #[arg(long, default_value_t = 3_600_000)]
        delay_ms: u64,
        #[arg(long, default_value_t = 0)]
        spread_ms: u64,
        /// Pull topic instead of a webhook (nothing is listening: the timers
        /// are meant to stay pending).
        #[arg(long, default_value = "nowhere")]
        topic: String,
    },
    /// Steady fires at a given rate, received by an embedded sink.
    Fire {
        #[command(flatten)]
        common: Common,
        /// Timers per second to create (and, `delay_ms` later, to fire).
        #[arg(long, default_value_t = 1000)]
        rate: u64,
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// How far ahead each timer is due.
        #[arg(long, default_value_t = 2_000)]
        delay_ms: u64,
        /// Share of timers cancelled right after creation.
        #[arg(long, default_value_t = 0.1)]
        cancel_fraction: f64,
        /// Address the embedded sink listens on (the node must reach it).
        #[arg(long, default_value = "127.0.0.1:0")]
        sink: String,
        /// The `host:port` nodes should call back, when it differs from the
        /// listen address (a container name, say).
        #[arg(long)]
        sink_advertise: Option<String>,
    },
    /// Memory and restart time with many pending timers: starts its own
    /// node, preloads `pending` timers due in 1-7 days, reports the node's
    /// RSS, then kills it with SIGKILL and measures restart to first fire.
    /// Its node runs open on loopback: `--token` is not used.
    Restart {
        /// Data directory for the node this bench starts (created; reused if
        /// it already holds the timers, see --skip-preload).
        #[arg(long, default_value = "./tocsin-bench-data")]
        data: std::path::PathBuf,
        #[arg(long, default_value_t = 10_000_000)]
        pending: u64,
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        #[arg(long, default_value_t = 256)]
        payload_bytes: usize,
        /// Reuse timers already in --data instead of creating them.
        #[arg(long)]
        skip_preload: bool,
        #[arg(long)]
        quiet: bool,
    },
    /// Many timers due in the same second: pull timers drained by a
    /// consumer, or with `--webhook` webhook timers received by an embedded
    /// sink.
    Burst {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 200_000)]
        count: u64,
        /// The burst second starts this long after the creates finish.
        #[arg(long, default_value_t = 5_000)]
        lead_ms: u64,
        #[arg(long, default_value = "burst")]
        topic: String,
        /// Deliveries per stream message.
        #[arg(long, default_value_t = 500)]
        max_batch: u32,
        /// Webhook timers calling an embedded sink instead of pull timers
        /// (`--topic` and `--max-batch` are then not used). The drain waits
        /// up to 60 s plus 1 s per 5,000 timers after the second begins.
        #[arg(long)]
        webhook: bool,
        /// Address the embedded sink listens on (the node must reach it).
        #[arg(long, default_value = "127.0.0.1:0")]
        sink: String,
        /// The `host:port` nodes should call back, when it differs from the
        /// listen address.
        #[arg(long)]
        sink_advertise: Option<String>,
    },
}

fn bar(quiet: bool, len: u64, what: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>8} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    bar
}

fn percentiles(name: &str, h: &Histogram<u64>, unit: &str) {
    if h.is_empty() {
        println!("{name}: no samples");
        return;
    }
    println!(
        "{name} ({unit}): p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (n={})",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.9),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
        h.len()
    );
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Create { common, total, batch, concurrency, delay_ms, spread_ms, topic } => {
            create(common, total, batch, concurrency, delay_ms, spread_ms, topic).await
        }
        BenchCommand::Fire { common, rate, seconds, delay_ms, cancel_fraction, sink, sink_advertise } => {
            fire(common, rate, seconds, delay_ms, cancel_fraction, sink, sink_advertise).await
        }
        BenchCommand::Burst { common, count, lead_ms, topic, max_batch, webhook, sink, sink_advertise } => {
            let run = common.run_id();
            let target = if webhook {
                // The sink listens before the first create names it, and
                // counts only this run's timers: an earlier run's webhook
                // timers may still be retrying against the same address.
                let (stats, url) = start_sink(&sink, sink_advertise, Some(format!("{run}-"))).await?;
                BurstTarget::Webhook { url, stats }
            } else {
                BurstTarget::Pull { topic, max_batch }
            };
            burst(common, run, count, lead_ms, target).await
        }
        BenchCommand::Restart { data, pending, batch, concurrency, payload_bytes, skip_preload, quiet } => {
            restart(data, pending, batch, concurrency, payload_bytes, skip_preload, quiet).await
        }
    }
}

fn payload(n: usize) -> bytes::Bytes {
    vec![b'x'; n].into()
}

async fn create(
    common: Common,
    total: u64,
    batch: usize,
    concurrency: usize,
    delay_ms: u64,
    spread_ms: u64,
    topic: String,
) -> anyhow::Result<ExitCode> {
    let client = common.connect().await.context("connecting")?;
    let run = common.run_id();
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let latency = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let progress = bar(common.quiet, total, "create");
    let started = Instant::now();
    let batch = batch.max(1);
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, run, next, errors, latency, progress) =
            (client.clone(), run.clone(), next.clone(), errors.clone(), latency.clone(), progress.clone());
        let (namespace, topic, payload) = (common.namespace.clone(), topic.clone(), payload(common.payload_bytes));
        tasks.push(tokio::spawn(async move {
            loop {
                let from = next.fetch_add(batch as u64, Ordering::Relaxed);
                if from >= total {
                    return;
                }
                let to = (from + batch as u64).min(total);
                let base = now_ms();
                let reqs: Vec<pb::CreateTimerRequest> = (from..to)
                    .map(|i| {
                        let spread = if spread_ms > 0 { rand::random::<u64>() % spread_ms } else { 0 };
                        let mut req = tocsin_client::pull_timer(
                            &namespace,
                            &format!("{run}-{i}"),
                            base + delay_ms + spread,
                            &topic,
                        );
                        req.payload = payload.clone();
                        req
                    })
                    .collect();
                let t = Instant::now();
                let failed = if reqs.len() == 1 {
                    u64::from(client.create_timer(reqs.into_iter().next().expect("one")).await.is_err())
                } else {
                    client.create_timers(reqs).await.iter().filter(|r| r.is_err()).count() as u64
                };
                latency.lock().expect("lock").record(t.elapsed().as_micros() as u64).ok();
                errors.fetch_add(failed, Ordering::Relaxed);
                progress.inc(to - from);
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    progress.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    let failed = errors.load(Ordering::Relaxed);
    println!(
        "created {} timers in {elapsed:.2} s: {:.0} creates/s (batch {batch}, concurrency {concurrency}, {} B payload), {failed} failed",
        total - failed,
        (total - failed) as f64 / elapsed,
        common.payload_bytes
    );
    percentiles("call latency", &latency.lock().expect("lock"), "µs");
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[derive(Default)]
struct FireStats {
    /// Receive time minus fire time, per first accepted delivery.
    lateness: Option<Histogram<u64>>,
    accepted: u64,
    duplicates: u64,
    stale: u64,
    early: u64,
    /// Ids of the timers delivered and accepted at least once.
    seen: std::collections::HashSet<String>,
    /// When the latest first accepted delivery arrived (Unix ms).
    last_recv_ms: u64,
    /// When set, only deliveries of ids with this prefix are recorded; the
    /// others are counted in `foreign` and nowhere else.
    only_prefix: Option<String>,
    foreign: u64,
}

/// Starts an embedded `tocsin sink` on `sink_addr` whose accepted
/// deliveries are counted into the returned stats; returns them and the URL
/// nodes should call (`sink_advertise` when given).
async fn start_sink(
    sink_addr: &str,
    sink_advertise: Option<String>,
    only_prefix: Option<String>,
) -> anyhow::Result<(Arc<Mutex<FireStats>>, String)> {
    let stats =
        Arc::new(Mutex::new(FireStats { lateness: Some(Histogram::new(3)?), only_prefix, ..Default::default() }));
    let tap_stats = stats.clone();
    let tap: Box<dyn Fn(&sink::Received) + Send> = Box::new(move |r| {
        let mut s = tap_stats.lock().expect("stats lock");
        if s.only_prefix.as_ref().is_some_and(|p| !r.id.starts_with(p.as_str())) {
            s.foreign += 1;
            return;
        }
        match r.verdict {
            tocsin_contract::Verdict::Accepted => {
                s.accepted += 1;
                if r.recv_ms + 1 < r.fire_at_ms {
                    s.early += 1;
                }
                s.lateness.as_mut().expect("histogram").record(r.recv_ms.saturating_sub(r.fire_at_ms)).ok();
                if s.seen.insert(r.id.clone()) {
                    s.last_recv_ms = s.last_recv_ms.max(r.recv_ms);
                }
            }
            tocsin_contract::Verdict::Duplicate => s.duplicates += 1,
            tocsin_contract::Verdict::RejectedStale => s.stale += 1,
            tocsin_contract::Verdict::RejectedSig
            | tocsin_contract::Verdict::BadBody
            | tocsin_contract::Verdict::Refused
            | tocsin_contract::Verdict::Slow
            | tocsin_contract::Verdict::Abandoned
            | tocsin_contract::Verdict::AckStale
            | tocsin_contract::Verdict::AckNotFound
            | tocsin_contract::Verdict::AckFailed => {}
        }
    });
    let fence = sink::Fence::new(None, Box::new(std::io::sink()), Some(tap));
    let listener = tokio::net::TcpListener::bind(sink_addr).await?;
    let url = match sink_advertise {
        Some(advertised) => format!("http://{advertised}/hook"),
        None => format!("http://{}/hook", listener.local_addr()?),
    };
    tokio::spawn(async move {
        axum::serve(
            listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            }),
            sink::app(fence),
        )
        .await
    });
    Ok((stats, url))
}

async fn fire(
    common: Common,
    rate: u64,
    seconds: u64,
    delay_ms: u64,
    cancel_fraction: f64,
    sink_addr: String,
    sink_advertise: Option<String>,
) -> anyhow::Result<ExitCode> {
    let client = common.connect().await.context("connecting")?;
    let run = common.run_id();
    let (stats, url) = start_sink(&sink_addr, sink_advertise, None).await?;

    let total = rate * seconds;
    let progress = bar(common.quiet, total, "create");
    // Cancels that answered CANCELLED (the timer will never be delivered),
    // and those that answered CANCELLED_WHILE_FIRING (an attempt may or may
    // not still arrive: neither counted nor expected).
    let cancelled = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let cancelled_firing = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let created = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    // Ticks of 10 ms, or longer below 100/s, so low rates are honoured.
    let tick_ms = if rate >= 100 { 10 } else { 1_000 / rate.max(1) };
    let per_tick = (rate * tick_ms / 1_000).max(1);
    let mut ticker = tokio::time::interval(Duration::from_millis(tick_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut i = 0u64;
    let mut tasks = Vec::new();
    while i < total {
        ticker.tick().await;
        let n = per_tick.min(total - i);
        let reqs: Vec<pb::CreateTimerRequest> = (i..i + n)
            .map(|j| {
                let mut req = tocsin_client::webhook_timer(&common.namespace, &format!("{run}-{j}"), delay_ms, &url);
                req.payload = payload(common.payload_bytes);
                req
            })
            .collect();
        i += n;
        // Each tick's creates (and cancels) run on their own, so a slow call
        // does not lower the offered rate.
        let (client, cancelled, cancelled_firing, created, progress) =
            (client.clone(), cancelled.clone(), cancelled_firing.clone(), created.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            let results = client.create_timers(reqs.clone()).await;
            let mut cancels = Vec::new();
            for (req, r) in reqs.iter().zip(&results) {
                if r.is_ok() {
                    created.fetch_add(1, Ordering::Relaxed);
                    if rand::random::<f64>() < cancel_fraction {
                        cancels.push(req.id.clone());
                    }
                }
            }
            for id in cancels {
                use pb::cancel_timer_response::Outcome;
                match client.cancel_timer(&reqs[0].namespace, &id).await.map(|r| Outcome::try_from(r.outcome)) {
                    Ok(Ok(Outcome::Cancelled)) => {
                        cancelled.lock().expect("lock").insert(id);
                    }
                    Ok(Ok(Outcome::CancelledWhileFiring)) => {
                        cancelled_firing.lock().expect("lock").insert(id);
                    }
                    _ => {}
                }
            }
            progress.inc(reqs.len() as u64);
        }));
    }
    for t in tasks {
        t.await?;
    }
    let created = created.load(Ordering::Relaxed);
    let cancelled = Arc::try_unwrap(cancelled).map(|m| m.into_inner().expect("lock")).unwrap_or_default();
    let cancelled_firing = Arc::try_unwrap(cancelled_firing).map(|m| m.into_inner().expect("lock")).unwrap_or_default();
    progress.finish_and_clear();
    let create_secs = started.elapsed().as_secs_f64();
    let expected = created - cancelled.len() as u64 - cancelled_firing.len() as u64;
    // Deliveries of timers that must be delivered: neither kind of cancel.
    let must_seen = |s: &FireStats| {
        s.seen.iter().filter(|id| !cancelled.contains(*id) && !cancelled_firing.contains(*id)).count() as u64
    };
    let drain = bar(common.quiet, expected, "fire");
    let deadline = Instant::now() + Duration::from_millis(delay_ms) + Duration::from_secs(30);
    loop {
        let delivered = must_seen(&stats.lock().expect("lock"));
        drain.set_position(delivered);
        if delivered >= expected || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drain.finish_and_clear();
    let s = stats.lock().expect("lock");
    let delivered = must_seen(&s);
    let delivered_cancelled = s.seen.iter().filter(|id| cancelled.contains(*id)).count();
    let delivered_firing = s.seen.iter().filter(|id| cancelled_firing.contains(*id)).count();
    println!(
        "created {created} in {create_secs:.1} s ({:.0}/s), cancelled {} (and {} while firing, {delivered_firing} of them delivered), delivered {delivered} of {expected} expected, duplicates {}, stale rejected {}, early {}, delivered after an acknowledged cancel {delivered_cancelled}",
        created as f64 / create_secs,
        cancelled.len(),
        cancelled_firing.len(),
        s.duplicates,
        s.stale,
        s.early
    );
    percentiles("lateness (receive − fire time)", s.lateness.as_ref().expect("histogram"), "ms");
    let ok = delivered >= expected && s.early == 0 && delivered_cancelled == 0;
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// What a burst's timers call when they fire, once its sink (if any) listens.
enum BurstTarget {
    /// Pull timers on `topic`, drained by one consumer taking `max_batch`
    /// deliveries per stream message.
    Pull { topic: String, max_batch: u32 },
    /// The sink's URL and what it has accepted.
    Webhook { url: String, stats: Arc<Mutex<FireStats>> },
}

async fn burst(common: Common, run: String, count: u64, lead_ms: u64, target: BurstTarget) -> anyhow::Result<ExitCode> {
    let client = common.connect().await.context("connecting")?;
    // Phase: preload `count` timers due within one second, starting well
    // after the creates finish.
    let estimate_ms = count / 20 + 2_000;
    let second_start = now_ms() + estimate_ms + lead_ms;
    let progress = bar(common.quiet, count, "create");
    let started = Instant::now();
    let mut i = 0u64;
    let mut inflight = Vec::new();
    while i < count {
        let n = 1000.min(count - i);
        let reqs: Vec<pb::CreateTimerRequest> = (i..i + n)
            .map(|j| {
                let (id, fire_at_ms) = (format!("{run}-{j}"), second_start + (j * 1000 / count));
                let mut req = match &target {
                    BurstTarget::Pull { topic, .. } => {
                        tocsin_client::pull_timer(&common.namespace, &id, fire_at_ms, topic)
                    }
                    BurstTarget::Webhook { url, .. } => {
                        let mut req = tocsin_client::webhook_timer(&common.namespace, &id, 0, url);
                        req.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(fire_at_ms));
                        req
                    }
                };
                req.payload = payload(common.payload_bytes);
                req
            })
            .collect();
        i += n;
        let client = client.clone();
        let progress = progress.clone();
        inflight.push(tokio::spawn(async move {
            let failed = client.create_timers(reqs).await.iter().filter(|r| r.is_err()).count();
            progress.inc(n);
            failed
        }));
        if inflight.len() >= 8 {
            let failed = inflight.remove(0).await?;
            anyhow::ensure!(failed == 0, "{failed} creates failed");
        }
    }
    for t in inflight {
        anyhow::ensure!(t.await? == 0, "creates failed");
    }
    progress.finish_and_clear();
    let create_secs = started.elapsed().as_secs_f64();
    let kind = match target {
        BurstTarget::Pull { .. } => "pull",
        BurstTarget::Webhook { .. } => "webhook",
    };
    println!("created {count} {kind} timers in {create_secs:.1} s ({:.0}/s)", count as f64 / create_secs);
    anyhow::ensure!(now_ms() < second_start, "creating took longer than planned; use a larger --lead-ms");
    let (topic, max_batch) = match target {
        BurstTarget::Pull { topic, max_batch } => (topic, max_batch),
        BurstTarget::Webhook { stats, .. } => {
            return burst_webhook_drain(count, second_start, &stats, common.quiet).await;
        }
    };

    // Phase: consume.
    let mut rx = client
        .reserve(pb::ReserveRequest {
            namespace: common.namespace.clone(),
            topic: topic.clone(),
            ttr_ms: 60_000,
            max_batch,
            max_in_flight: 100_000,
        })
        .await?;
    let mut lateness = Histogram::<u64>::new(3)?;
    let mut seen = std::collections::HashSet::new();
    let drain = bar(common.quiet, count, "drain");
    let deadline =
        Instant::now() + Duration::from_millis(second_start.saturating_sub(now_ms())) + Duration::from_secs(60);
    let mut last_recv = 0u64;
    let mut early = 0u64;
    // Timers of an earlier run on the topic (one whose last acks never went
    // out) come back when their reservation ends: they are acked, not counted.
    let ours = format!("{run}-");
    let mut foreign = 0u64;
    let mut acks = tokio::task::JoinSet::new();
    while (seen.len() as u64) < count && Instant::now() < deadline {
        let Ok(Some(batch)) = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await else { continue };
        let recv = now_ms();
        let mut refs = Vec::with_capacity(batch.deliveries.len());
        for d in &batch.deliveries {
            if !d.id.starts_with(&ours) {
                foreign += 1;
            } else if seen.insert(d.id.clone()) {
                lateness.record(recv.saturating_sub(d.fire_at_ms)).ok();
                if recv < d.fire_at_ms {
                    early += 1;
                }
                last_recv = recv;
            }
            refs.push(pb::DeliveryRef {
                namespace: d.namespace.clone(),
                id: d.id.clone(),
                fire_id: d.fire_id.clone(),
                attempt: d.attempt,
            });
        }
        drain.set_position(seen.len() as u64);
        let client = client.clone();
        acks.spawn(async move { client.ack(refs).await.is_ok() });
        while acks.try_join_next().is_some() {}
    }
    drain.finish_and_clear();
    let drained_s = last_recv.saturating_sub(second_start) as f64 / 1000.0;
    // Every ack is answered before the bench ends, so the next run on the
    // topic does not get this run's timers back a reservation later.
    let mut acks_failed = 0u64;
    while let Some(ok) = acks.join_next().await {
        if !matches!(ok, Ok(true)) {
            acks_failed += 1;
        }
    }
    println!(
        "{} of {count} delivered; the last {drained_s:.2} s after the burst second began; early {early}; \
         {foreign} deliveries of earlier runs acked and not counted; {acks_failed} ack calls failed",
        seen.len()
    );
    percentiles("lateness (receive − fire time)", &lateness, "ms");
    Ok(if seen.len() as u64 == count && early == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Waits until the sink has accepted every timer of the webhook burst (or
/// 60 s plus 1 s per 5,000 timers after the second began) and reports it in
/// the pull drain's terms. The sink records only this run's timers, so its
/// `seen` is the count.
async fn burst_webhook_drain(
    count: u64,
    second_start: u64,
    stats: &Mutex<FireStats>,
    quiet: bool,
) -> anyhow::Result<ExitCode> {
    let delivered = |s: &FireStats| s.seen.len() as u64;
    let drain = bar(quiet, count, "drain");
    let limit_ms = 60_000 + count / 5;
    while now_ms() < second_start + limit_ms {
        let n = delivered(&stats.lock().expect("lock"));
        drain.set_position(n);
        if n >= count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drain.finish_and_clear();
    let s = stats.lock().expect("lock");
    let n = delivered(&s);
    let drained_s = s.last_recv_ms.saturating_sub(second_start) as f64 / 1000.0;
    println!(
        "{n} of {count} delivered; the last {drained_s:.2} s after the burst second began; early {}; duplicates {}; stale rejected {}; \
         {} deliveries of earlier runs accepted and not counted",
        s.early, s.duplicates, s.stale, s.foreign
    );
    percentiles("lateness (receive − fire time)", s.lateness.as_ref().expect("histogram"), "ms");
    Ok(if n == count && s.early == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// A `tocsin serve` child process of this same binary.
struct Child {
    child: std::process::Child,
    grpc: String,
    http: String,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Child {
    fn start(data: &std::path::Path, grpc: &str, http: &str) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(data.with_extension("log"))?;
        let child = std::process::Command::new(std::env::current_exe()?)
            .args(["serve", "--node-id", "1", "--grpc", grpc, "--http", http])
            .arg("--data")
            .arg(data)
            .env("TOCSIN_REPLICATION_FACTOR", "1")
            // The bench's own throwaway node on loopback: no tokens to mint
            // (the bench has none for a node it just made), and its marker
            // timers call the bench's sink on 127.0.0.1, which `serve`
            // refuses unless allowed.
            .env("TOCSIN_AUTH__MODE", "open")
            .env("TOCSIN_DELIVERY__WEBHOOK_ALLOW", "127.0.0.1/32")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()?;
        Ok(Child { child, grpc: grpc.to_string(), http: http.to_string() })
    }

    fn rss_bytes(&self) -> u64 {
        self.proc_kib("status", "VmRSS:") * 1024
    }

    /// A `<field> <n> kB` line of `/proc/<pid>/<file>`, in KiB (0 if absent).
    fn proc_kib(&self, file: &str, field: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/{file}", self.child.id())).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .unwrap_or(0)
    }

    /// Where the resident memory is: anonymous (heap, RocksDB's memtables
    /// and cache) against file-backed pages, and RocksDB's own accounts from
    /// the node's `/metrics`, so that an RSS figure says what holds it.
    async fn memory_breakdown(&self) -> String {
        let anon_kib = self.proc_kib("smaps_rollup", "Anonymous:");
        let file_kib = self.proc_kib("status", "RssFile:");
        let mut parts = vec![
            format!("anonymous {:.1} MiB", anon_kib as f64 / 1024.0),
            format!("file-backed {:.1} MiB", file_kib as f64 / 1024.0),
        ];
        // A node that stopped answering must not hang the bench: the
        // breakdown is a diagnostic, so it goes without the RocksDB parts.
        let metrics = async {
            let client = tocsin_contract::tls::http_client_builder().timeout(Duration::from_secs(2)).build().ok()?;
            client.get(format!("http://{}/metrics", self.http)).send().await.ok()?.text().await.ok()
        }
        .await
        .unwrap_or_default();
        for (metric, label) in [
            ("tocsin_rocksdb_memtable_bytes", "RocksDB memtables"),
            ("tocsin_rocksdb_block_cache_bytes", "block cache"),
            ("tocsin_rocksdb_table_readers_bytes", "table readers"),
        ] {
            let bytes = metrics.lines().find_map(|l| l.strip_prefix(metric).and_then(|v| v.trim().parse::<f64>().ok()));
            if let Some(bytes) = bytes {
                parts.push(format!("{label} {:.1} MiB", bytes / 1048576.0));
            }
        }
        parts.join(", ")
    }

    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let client = tocsin_contract::tls::http_client_builder().timeout(Duration::from_millis(500)).build()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("node exited with {status}");
            }
            if let Ok(r) = client.get(format!("http://{}/readyz", self.http)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        anyhow::bail!("node not ready after {timeout:?}")
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bench that fails half way (a refused create, a node that never became
/// ready) must not leave its node running and holding the data directory.
impl Drop for Child {
    fn drop(&mut self) {
        self.kill9();
    }
}

async fn restart(
    data: std::path::PathBuf,
    pending: u64,
    batch: usize,
    concurrency: usize,
    payload_bytes: usize,
    skip_preload: bool,
    quiet: bool,
) -> anyhow::Result<ExitCode> {
    if crate::token().is_some() {
        // Not an error: TOCSIN_TOKEN set for the other commands sets it here too.
        eprintln!("note: bench restart starts its own node, open on loopback; --token (or TOCSIN_TOKEN) is not used");
    }
    std::fs::create_dir_all(&data)?;
    let grpc = format!("127.0.0.1:{}", free_port()?);
    let http = format!("127.0.0.1:{}", free_port()?);
    let mut node = Child::start(&data, &grpc, &http)?;
    node.wait_ready(Duration::from_secs(120)).await?;
    let addrs = vec![node.grpc.clone()];

    // Phase: preload timers due in 1-7 days (outside any hot window).
    if !skip_preload {
        let common = Common {
            addrs: addrs.clone(),
            namespace: "pending".into(),
            payload_bytes,
            run: Some("p".into()),
            quiet,
            coalesce_in_flight: tocsin_client::ClientOptions::default().coalesce_in_flight,
        };
        create(common, pending, batch, concurrency, 24 * 3600 * 1000, 6 * 24 * 3600 * 1000, "later".into()).await?;
    }
    // Let compactions and flushes settle before reading the RSS.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss = node.rss_bytes();
    let client = crate::connect(addrs.clone()).await?;
    let info = client.cluster().await?;
    let total: u64 = info.shards.iter().map(|s| s.pending_timers).sum();
    println!(
        "pending timers: {total}; node RSS: {:.1} MiB ({:.1} bytes per pending timer)",
        rss as f64 / 1048576.0,
        rss as f64 / total.max(1) as f64
    );
    println!("  of which: {}", node.memory_breakdown().await);

    // Phase: marker timers due 3 s from now, received by an embedded sink.
    let received = Arc::new(Mutex::new(Vec::<u64>::new()));
    let tap_received = received.clone();
    let tap: Box<dyn Fn(&sink::Received) + Send> = Box::new(move |r| {
        if r.verdict == tocsin_contract::Verdict::Accepted {
            tap_received.lock().expect("lock").push(r.recv_ms);
        }
    });
    let fence = sink::Fence::new(None, Box::new(std::io::sink()), Some(tap));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move {
        axum::serve(
            listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            }),
            sink::app(fence),
        )
        .await
    });
    let due = now_ms() + 3_000;
    let markers: Vec<pb::CreateTimerRequest> = (0..100)
        .map(|i| {
            let mut r = tocsin_client::webhook_timer("marker", &format!("m-{}-{i}", now_ms()), 0, &url);
            r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(due));
            r
        })
        .collect();
    anyhow::ensure!(client.create_timers(markers).await.iter().all(Result::is_ok), "creating markers failed");

    // Phase: kill -9 before the markers are due; restart after they are overdue.
    tokio::time::sleep(Duration::from_millis(due.saturating_sub(now_ms()).saturating_sub(1_000))).await;
    node.kill9();
    tokio::time::sleep(Duration::from_millis((due + 1_000).saturating_sub(now_ms()))).await;
    let started_ms = now_ms();
    let started = Instant::now();
    let mut node = Child::start(&data, &grpc, &http)?;
    node.wait_ready(Duration::from_secs(120)).await?;
    let ready_ms = started.elapsed().as_millis();
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.lock().expect("lock").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let first = received.lock().expect("lock").iter().min().copied();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n = received.lock().expect("lock").len();
    match first {
        Some(first) => println!(
            "restart after kill -9 with {total} pending: ready in {ready_ms} ms, first overdue fire {} ms after exec; {n} of 100 markers delivered",
            first.saturating_sub(started_ms)
        ),
        None => println!("restart after kill -9: ready in {ready_ms} ms, but no marker delivered within 60 s"),
    }
    node.kill9();
    Ok(if first.is_some() && n == 100 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
