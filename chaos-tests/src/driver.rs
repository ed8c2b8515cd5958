//! The load driver: creates timers at a steady rate through the shard-aware
//! client, cancels some of them before they are due, and records every
//! operation with its outcome as NDJSON for the checker.
//!
//! An operation whose outcome is not known (the client gave up after its
//! retries) is recorded as `unknown`, and the checker never counts it as
//! lost or as a violation.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Deserialize;
use serde::Serialize;
use tocsin_client::Client;
use tocsin_client::ClientOptions;
use tocsin_client::v1 as pb;

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// One recorded operation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Op {
    /// `create` or `cancel`.
    pub op: String,
    #[serde(default)]
    pub namespace: String,
    pub id: String,
    #[serde(default)]
    pub fire_at_ms: u64,
    pub invoke_ms: u64,
    pub complete_ms: u64,
    /// create: `ok` or `unknown`; cancel: `cancelled`, `already_cancelled`,
    /// `cancelled_while_firing`, `already_fired`, `not_found` or `unknown`.
    pub outcome: String,
    /// For a cancel: the log index it was applied at.
    #[serde(default)]
    pub applied_index: u64,
    /// For an acknowledged create: when the leader created the timer (its
    /// own clock, stamped into the log). A timer created after its fire time
    /// is due at creation, not before.
    #[serde(default)]
    pub created_at_ms: u64,
    /// Why the outcome is unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// The gRPC code of that error (`ResourceExhausted`, `Unavailable`, …).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub code: String,
}

/// Records operations to a file.
#[derive(Clone)]
pub struct Recorder {
    out: Arc<Mutex<std::io::BufWriter<std::fs::File>>>,
    pub creates: Arc<AtomicU64>,
    pub failures: Arc<AtomicU64>,
}

impl Recorder {
    pub fn new(path: &Path) -> anyhow::Result<Recorder> {
        Ok(Recorder {
            out: Arc::new(Mutex::new(std::io::BufWriter::new(std::fs::File::create(path)?))),
            creates: Arc::default(),
            failures: Arc::default(),
        })
    }

    fn record(&self, op: &Op) {
        let mut out = self.out.lock().expect("recorder lock");
        let _ = writeln!(out, "{}", serde_json::to_string(op).expect("op serializes"));
    }

    pub fn flush(&self) {
        let _ = self.out.lock().expect("recorder lock").flush();
    }
}

pub const NAMESPACE: &str = "chaos";

/// A client that keeps retrying through leader changes for a while.
pub async fn client(seeds: Vec<String>) -> anyhow::Result<Client> {
    let options = ClientOptions {
        request_timeout: Duration::from_secs(2),
        max_attempts: 30,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(500),
        token: Some(crate::cluster::load_token().unwrap_or_else(|| crate::cluster::BOOTSTRAP_TOKEN.to_string())),
        ..Default::default()
    };
    Ok(Client::with_options(seeds, options).await?)
}

/// Creates `reqs` (already carrying ids and fire times) and records them;
/// returns the acknowledged ids.
pub async fn create_batch(client: &Client, rec: &Recorder, reqs: Vec<pb::CreateTimerRequest>) -> Vec<String> {
    let invoke_ms = now_ms();
    let results = client.create_timers(reqs.clone()).await;
    let complete_ms = now_ms();
    let mut ok = Vec::new();
    for (req, res) in reqs.iter().zip(results) {
        let fire_at_ms = match req.fire_time {
            Some(pb::create_timer_request::FireTime::FireAtMs(at)) => at,
            _ => 0,
        };
        let (outcome, error, code, created_at_ms) = match &res {
            Ok(resp) => {
                ok.push(req.id.clone());
                ("ok", String::new(), String::new(), resp.timer.as_ref().map_or(0, |t| t.created_at_ms))
            }
            Err(e) => {
                rec.failures.fetch_add(1, Ordering::Relaxed);
                ("unknown", e.to_string(), format!("{:?}", e.code()), 0)
            }
        };
        rec.creates.fetch_add(1, Ordering::Relaxed);
        rec.record(&Op {
            op: "create".into(),
            namespace: req.namespace.clone(),
            id: req.id.clone(),
            fire_at_ms,
            invoke_ms,
            complete_ms,
            outcome: outcome.into(),
            applied_index: 0,
            created_at_ms,
            error,
            code,
        });
    }
    ok
}

async fn cancel(client: &Client, rec: &Recorder, namespace: &str, id: String) {
    let invoke_ms = now_ms();
    let result = client.cancel_timer(namespace, &id).await;
    let complete_ms = now_ms();
    use pb::cancel_timer_response::Outcome;
    let error = result.as_ref().err().map(ToString::to_string).unwrap_or_default();
    let code = result.as_ref().err().map(|e| format!("{:?}", e.code())).unwrap_or_default();
    let (outcome, applied_index) = match result {
        Ok(r) => (
            match Outcome::try_from(r.outcome) {
                Ok(Outcome::Cancelled) => "cancelled",
                Ok(Outcome::CancelledWhileFiring) => "cancelled_while_firing",
                Ok(Outcome::AlreadyCancelled) => "already_cancelled",
                Ok(Outcome::AlreadyFired) => "already_fired",
                Ok(Outcome::NotFound) => "not_found",
                _ => "unknown",
            },
            r.applied_index,
        ),
        Err(_) => ("unknown", 0),
    };
    rec.record(&Op {
        op: "cancel".into(),
        namespace: namespace.into(),
        id,
        fire_at_ms: 0,
        invoke_ms,
        complete_ms,
        outcome: outcome.into(),
        applied_index,
        created_at_ms: 0,
        error,
        code,
    });
}

/// The retry policy of the chaos load's timers: many quick retries, so a
/// fault's failed attempts are retried within the drain.
pub fn chaos_retry() -> pb::RetryPolicy {
    pb::RetryPolicy { max_attempts: 50, initial_backoff_ms: 200, max_backoff_ms: 2_000, give_up_after_ms: 0 }
}

/// A webhook timer firing at `fire_at_ms`; `retry` `None` leaves the
/// server's default policy.
pub fn request(
    namespace: &str,
    id: String,
    fire_at_ms: u64,
    url: &str,
    retry: Option<pb::RetryPolicy>,
) -> pb::CreateTimerRequest {
    let mut r = tocsin_client::webhook_timer(namespace, &id, 0, url);
    r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(fire_at_ms));
    r.payload = vec![b'p'; 64].into();
    r.retry = retry;
    r
}

/// One stream of steady creates.
#[derive(Clone, Debug)]
pub struct Load {
    pub namespace: String,
    pub url: String,
    /// Id prefix: ids are `<tag>-<n>`, unique over the run.
    pub tag: String,
    /// Creates per second.
    pub rate: u64,
    /// Fraction cancelled about half a second after their create.
    pub cancel_fraction: f64,
    /// `None`: the server's default policy.
    pub retry: Option<pb::RetryPolicy>,
}

impl Load {
    /// The chaos load: namespace `chaos`, ids `s-<n>`, the quick retry policy.
    pub fn steady(url: &str, rate: u64, cancel_fraction: f64) -> Load {
        Load {
            namespace: NAMESPACE.into(),
            url: url.into(),
            tag: "s".into(),
            rate,
            cancel_fraction,
            retry: Some(chaos_retry()),
        }
    }
}

/// Steady load until `stop`: `rate` creates per second, due 1–10 s ahead;
/// a random `cancel_fraction` of them cancelled about half a second later.
pub async fn steady(client: Client, rec: Recorder, load: Load, stop: Arc<AtomicBool>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let per_tick = (load.rate / 10).max(1);
    let mut n = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    while !stop.load(Ordering::Relaxed) {
        ticker.tick().await;
        let now = now_ms();
        let reqs: Vec<pb::CreateTimerRequest> = (0..per_tick)
            .map(|i| {
                let id = format!("{}-{}", load.tag, n + i);
                request(&load.namespace, id, now + 1_000 + rand::random::<u64>() % 9_000, &load.url, load.retry)
            })
            .collect();
        n += per_tick;
        let (client, rec, namespace) = (client.clone(), rec.clone(), load.namespace.clone());
        let cancel_fraction = load.cancel_fraction;
        tasks.spawn(async move {
            let ok = create_batch(&client, &rec, reqs).await;
            let to_cancel: Vec<String> = ok.into_iter().filter(|_| rand::random::<f64>() < cancel_fraction).collect();
            tokio::time::sleep(Duration::from_millis(500)).await;
            futures::future::join_all(to_cancel.into_iter().map(|id| cancel(&client, &rec, &namespace, id))).await;
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    rec.flush();
}

/// Creates `reqs` in chunks of 500, eight at a time, as fast as the cluster
/// takes them; returns the acknowledged ids.
pub async fn create_all(client: &Client, rec: &Recorder, reqs: Vec<pb::CreateTimerRequest>) -> Vec<String> {
    use futures::StreamExt;
    let chunks: Vec<Vec<pb::CreateTimerRequest>> = reqs.chunks(500).map(<[_]>::to_vec).collect();
    let ok = futures::stream::iter(chunks)
        .map(|chunk| create_batch(client, rec, chunk))
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    rec.flush();
    ok.into_iter().flatten().collect()
}

/// Creates `count` timers due uniformly within `[lead, lead + window)` from
/// now, as fast as the cluster takes them.
pub async fn burst(client: &Client, rec: &Recorder, url: &str, count: u64, lead_ms: u64, window_ms: u64, tag: &str) {
    let base = now_ms() + lead_ms;
    let reqs: Vec<pb::CreateTimerRequest> = (0..count)
        .map(|i| {
            request(NAMESPACE, format!("{tag}-{i}"), base + i * window_ms / count.max(1), url, Some(chaos_retry()))
        })
        .collect();
    create_all(client, rec, reqs).await;
}
