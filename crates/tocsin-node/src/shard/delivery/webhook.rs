//! Webhook delivery: an HTTP POST of the JSON [`Delivery`] body per attempt.
//!
//! - Headers follow Standard Webhooks: `webhook-id` (the `fire_id`, stable
//!   across retries), `webhook-timestamp`, and `webhook-signature` when the
//!   namespace has a secret (the cluster map's, else the node's file's).
//! - Any 2xx is delivered. 410 gives up, and disables the URL on this node
//!   (`tocsin admin endpoint list`, `… enable` turns it back on). 429 and
//!   503 retry no sooner than `Retry-After`, and hold every attempt to the
//!   endpoint until then (`tocsin_core::breaker`). 409 whose body mentions a stale epoch means a receiver
//!   saw a newer leader's token: this node re-checks its leadership and stops
//!   dispatching for the shard if it lost it. Anything else (and timeouts)
//!   retries with the timer's backoff. Redirects are not followed, and no
//!   proxy from the environment is used.
//! - **The SSRF guard** (`egress.rs`) sits in the connection: names are
//!   resolved through its resolver on every new connection, and a URL's
//!   address literal is checked before each request. A refused target is
//!   a failed attempt whose error names the class, never an answer.
//! - `last_error` holds classes ("connection refused", "timeout", "http
//!   503"), not what the target said: a webhook must not become a way to
//!   read or scan what the node can reach.
//! - Requests to one endpoint (scheme, host, port) are bounded by a
//!   semaphore and a queue limit; every delivery is its own task, so a slow
//!   endpoint only delays its own deliveries. A **circuit breaker** per
//!   endpoint (`tocsin_core::breaker`) stops sending to one that failed five
//!   times in a row: its attempts fail at once (class `circuit_open`, retry
//!   no sooner than the breaker's next probe) instead of holding connection
//!   slots for a timeout each. A timeout counts as a failure only when the
//!   request had at least half the endpoint's timeout: one cut short by the
//!   wait for a slot here is this node's backlog, not the endpoint's fault.
//! - **Every attempt has a deadline in replicated state** (`until_ms` of
//!   its `InFlight` phase, where the timer is indexed). The request must be
//!   sent and answered before it, with time left to record the outcome; an
//!   attempt that cannot be (queued too long, lease lost, outcome not
//!   recorded) is simply left: at the deadline the leader starts the next
//!   attempt. Recording an outcome is retried while this node still leads
//!   under the attempt's epoch.
//!
//! [`Delivery`]: tocsin_contract::json::DeliveryJson

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tocsin_contract::headers;
use tocsin_contract::json::DeliveryJson;
use tocsin_contract::signing;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::breaker::Breaker;
use tocsin_core::breaker::BreakerConfig;
use tocsin_core::breaker::Disabled;
use tocsin_core::breaker::Observed;
use tocsin_core::breaker::Verdict;
use tocsin_core::command::AttemptOutcome;
use tocsin_core::command::AttemptReport;
use tokio::sync::Semaphore;

use crate::config::DeliveryConfig;
use crate::egress::CheckedUrls;
use crate::egress::EgressPolicy;
use crate::egress::GuardedResolver;
use crate::shard::ShardCtx;
use crate::shard::delivery::attempt;
use crate::shard::delivery::attempt::RECORD_MARGIN_MS;
use crate::shard::delivery::paused::Paused;

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Retry, not before `retry_after_ms` if the endpoint said so.
    Retry {
        error: String,
        retry_after_ms: Option<u64>,
    },
    GiveUp {
        error: String,
    },
    /// The receiver rejected our epoch as stale.
    Fenced,
}

/// Endpoints (origins, from client input) whose state is kept at once;
/// past it, idle ones are forgotten (their state is only free permits).
const MAX_ENDPOINTS: usize = 10_000;

/// Callback URLs disabled by a `410` kept at once; past it, the oldest
/// is enabled again (its next attempt finds out).
const MAX_DISABLED: usize = 10_000;

/// What an attempt waiting for a slot holds besides its payload (its task,
/// record and URL), roughly, for `delivery.max_queued_bytes`.
const QUEUED_OVERHEAD_BYTES: usize = 2_048;

struct Endpoint {
    permits: Arc<Semaphore>,
    queued: AtomicUsize,
    breaker: Mutex<Breaker>,
}

/// One endpoint as `tocsin admin endpoint list` shows it.
#[derive(Clone, Debug)]
pub struct EndpointView {
    pub endpoint: String,
    pub state: &'static str,
    pub failures_in_a_row: u32,
    pub held_until_ms: u64,
    pub in_flight: usize,
}

/// Gives back a half-open breaker's probe slot if the probe is never sent
/// or answered (the attempt was abandoned).
struct ProbeSlot {
    endpoint: Arc<Endpoint>,
    armed: bool,
}

impl ProbeSlot {
    fn observe(&mut self, cfg: &BreakerConfig, now_ms: u64, observed: Observed) {
        let probe = std::mem::take(&mut self.armed);
        self.endpoint.breaker.lock().expect("breaker lock").observe(cfg, now_ms, probe, observed);
    }
}

impl Drop for ProbeSlot {
    fn drop(&mut self) {
        if self.armed {
            self.endpoint.breaker.lock().expect("breaker lock").probe_dropped();
        }
    }
}

/// Sends webhook deliveries for every shard this node leads.
pub struct WebhookSender {
    client: reqwest::Client,
    config: DeliveryConfig,
    endpoints: Mutex<HashMap<String, Arc<Endpoint>>>,
    breaker: BreakerConfig,
    /// Callback URLs a `410 Gone` disabled, by URL.
    disabled: Mutex<HashMap<String, Disabled>>,
    global: Arc<Semaphore>,
    /// Bytes held by attempts waiting for a connection slot, all endpoints
    /// together (bounded by `delivery.max_queued_bytes`).
    queued_bytes: AtomicUsize,
    /// Per namespace, the signing keys, current first: every delivery is
    /// signed with each (rotation). Replaced whole by [`Self::set_secrets`].
    secrets: std::sync::RwLock<Arc<HashMap<String, Vec<Vec<u8>>>>>,
    /// The same from the cluster map (`tocsin admin namespace
    /// rotate-secret`), replaced whole whenever this node learns a newer
    /// map; a namespace named here is signed with these keys only.
    map_secrets: std::sync::RwLock<Arc<HashMap<String, Vec<Vec<u8>>>>>,
    /// The egress policy's verdicts, remembered per URL.
    urls: CheckedUrls,
    /// The cluster map's pauses (namespaces and endpoints).
    paused: Arc<Paused>,
}

impl WebhookSender {
    pub fn new(
        config: DeliveryConfig,
        secrets: HashMap<String, Vec<Vec<u8>>>,
        policy: Arc<EgressPolicy>,
    ) -> Result<WebhookSender, reqwest::Error> {
        let client = tocsin_contract::tls::http_client_builder()
            .dns_resolver(Arc::new(GuardedResolver { policy: policy.clone() }))
            .no_proxy()
            .timeout(Duration::from_millis(config.webhook_timeout_ms))
            .connect_timeout(Duration::from_millis(config.webhook_timeout_ms.min(5_000)))
            .pool_max_idle_per_host(config.per_endpoint_concurrency)
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .user_agent(concat!("tocsin/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(WebhookSender {
            client,
            global: Arc::new(Semaphore::new(config.max_in_flight)),
            queued_bytes: AtomicUsize::new(0),
            breaker: BreakerConfig {
                probe_timeout_ms: config.webhook_timeout_ms.saturating_add(1_000),
                ..BreakerConfig::default()
            },
            disabled: Mutex::new(HashMap::new()),
            config,
            endpoints: Mutex::new(HashMap::new()),
            secrets: std::sync::RwLock::new(Arc::new(secrets)),
            map_secrets: std::sync::RwLock::new(Arc::new(HashMap::new())),
            urls: CheckedUrls::new(policy),
            paused: Arc::default(),
        })
    }

    /// The SSRF guard's allowlist this sender connects under, with its
    /// remembered verdicts; `api::parse` checks creates against the same.
    pub fn egress(&self) -> &CheckedUrls {
        &self.urls
    }

    /// The cluster map's pauses, as this node last learned them.
    pub fn paused(&self) -> &Arc<Paused> {
        &self.paused
    }

    /// Replaces every namespace's signing keys (a config reload): the next
    /// attempt is signed with the new ones.
    pub fn set_secrets(&self, secrets: HashMap<String, Vec<Vec<u8>>>) {
        *self.secrets.write().expect("secrets lock") = Arc::new(secrets);
    }

    /// Takes the signing keys of a newly learned cluster map.
    pub fn set_map_secrets(&self, map: &tocsin_core::cluster::ClusterMap) {
        let keys = map.secrets.iter().map(|(ns, s)| (ns.clone(), s.keys().map(<[u8]>::to_vec).collect())).collect();
        *self.map_secrets.write().expect("secrets lock") = Arc::new(keys);
    }

    /// The keys `namespace`'s deliveries are signed with, current first:
    /// the cluster map's if it names the namespace, else the node's file's.
    pub fn keys_for(&self, namespace: &str) -> Vec<Vec<u8>> {
        let from_map = self.map_secrets.read().expect("secrets lock").get(namespace).cloned();
        from_map.or_else(|| self.secrets.read().expect("secrets lock").get(namespace).cloned()).unwrap_or_default()
    }

    fn endpoint(&self, origin: String) -> Arc<Endpoint> {
        let mut endpoints = self.endpoints.lock().expect("endpoints lock");
        if endpoints.len() >= MAX_ENDPOINTS && !endpoints.contains_key(&origin) {
            // Only this map holds an idle endpoint: nothing is in flight or
            // queued for it, and a fresh one (a closed breaker) is the same.
            endpoints.retain(|_, e| Arc::strong_count(e) > 1 || !e.breaker.lock().expect("breaker lock").is_fresh());
            if endpoints.len() >= MAX_ENDPOINTS {
                // Every one is busy or has a breaker to remember: forget idle
                // ones anyway (a forgotten breaker starts closed).
                endpoints.retain(|_, e| Arc::strong_count(e) > 1);
            }
        }
        endpoints
            .entry(origin)
            .or_insert_with(|| {
                Arc::new(Endpoint {
                    permits: Arc::new(Semaphore::new(self.config.per_endpoint_concurrency)),
                    queued: AtomicUsize::new(0),
                    breaker: Mutex::new(Breaker::default()),
                })
            })
            .clone()
    }

    /// This node's endpoints with something to show (a breaker not closed,
    /// or requests in flight), and the URLs a `410` disabled.
    pub fn endpoints_view(&self, now_ms: u64) -> (Vec<EndpointView>, Vec<Disabled>) {
        let endpoints = self.endpoints.lock().expect("endpoints lock");
        let mut views: Vec<EndpointView> = endpoints
            .iter()
            .filter_map(|(origin, e)| {
                let breaker = e.breaker.lock().expect("breaker lock");
                let in_flight = self.config.per_endpoint_concurrency.saturating_sub(e.permits.available_permits());
                if breaker.is_fresh() && in_flight == 0 {
                    return None;
                }
                Some(EndpointView {
                    endpoint: origin.clone(),
                    state: breaker.state(now_ms).name(),
                    failures_in_a_row: breaker.failures_in_a_row(),
                    held_until_ms: breaker.held_until_ms(),
                    in_flight,
                })
            })
            .collect();
        views.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
        let mut disabled: Vec<Disabled> = self.disabled.lock().expect("disabled lock").values().cloned().collect();
        disabled.sort_by(|a, b| a.url.cmp(&b.url));
        (views, disabled)
    }

    /// Enables a URL a `410` disabled, and closes its endpoint's breaker.
    /// Returns whether it was disabled.
    pub fn enable(&self, url: &str) -> bool {
        let was = self.disabled.lock().expect("disabled lock").remove(url).is_some();
        metrics::gauge!("tocsin_webhook_disabled_urls").set(self.disabled.lock().expect("disabled lock").len() as f64);
        if let Some(e) = self.endpoints.lock().expect("endpoints lock").get(&origin_of(url)) {
            *e.breaker.lock().expect("breaker lock") = Breaker::default();
        }
        if was {
            tracing::info!(url = %redact_url(url), "webhook URL enabled again");
        }
        was
    }

    fn disable(&self, url: &str, key: &TimerKey, now_ms: u64) {
        let mut disabled = self.disabled.lock().expect("disabled lock");
        if disabled.contains_key(url) {
            return;
        }
        if disabled.len() >= MAX_DISABLED
            && let Some(oldest) = disabled.values().min_by_key(|d| d.disabled_at_ms).map(|d| d.url.clone())
        {
            disabled.remove(&oldest);
        }
        disabled.insert(
            url.to_string(),
            Disabled { url: url.to_string(), disabled_at_ms: now_ms, by_timer: key.to_string() },
        );
        metrics::gauge!("tocsin_webhook_disabled_urls").set(disabled.len() as f64);
        metrics::counter!("tocsin_webhook_urls_disabled_total").increment(1);
        tracing::warn!(
            url = %redact_url(url),
            timer = %key,
            "webhook URL disabled: it answered 410 Gone; its other timers are held until `tocsin admin endpoint enable`"
        );
    }

    /// Delivers one attempt in its own task and records the outcome.
    pub fn spawn(self: &Arc<Self>, ctx: Arc<ShardCtx>, epoch: u64, key: TimerKey, record: TimerRecord) {
        let this = self.clone();
        tokio::spawn(async move {
            let Some(fire) = record.fire.clone() else { return };
            let tocsin_core::FirePhase::InFlight { until_ms, .. } = fire.phase else { return };
            let Some((outcome, report)) = this.attempt(&ctx, epoch, &key, &record, until_ms).await else { return };
            let now = ctx.clock.now_ms();
            let class = match &outcome {
                Outcome::Delivered => {
                    attempt::observe_delivered(&key, record.fire_at_ms, now);
                    AttemptOutcome::Delivered
                }
                Outcome::GiveUp { error } => AttemptOutcome::GiveUp { error: error.clone() },
                Outcome::Retry { error, retry_after_ms } => {
                    let backoff = tocsin_core::backoff::backoff_ms(&record.retry, fire.attempt, rand::random::<f64>());
                    let delay = backoff.max(retry_after_ms.unwrap_or(0));
                    AttemptOutcome::Failed { error: error.clone(), retry_at_ms: now.saturating_add(delay) }
                }
                Outcome::Fenced => {
                    if ctx.confirm_leadership().await {
                        AttemptOutcome::Failed {
                            error: "receiver rejected a current epoch as stale".into(),
                            retry_at_ms: now.saturating_add(tocsin_core::backoff::backoff_ms(
                                &record.retry,
                                fire.attempt,
                                rand::random::<f64>(),
                            )),
                        }
                    } else {
                        tracing::warn!(
                            shard = ctx.shard,
                            epoch,
                            "fenced by a receiver and no longer leader; stopping dispatch"
                        );
                        return;
                    }
                }
            };
            attempt::record(&ctx, epoch, key, &fire, class, report).await;
        });
    }

    /// Sends one attempt, or `None` if it cannot be sent before its deadline
    /// or this node may no longer deliver for the shard (the deadline, or
    /// the next leader, starts the next attempt).
    async fn attempt(
        &self,
        ctx: &ShardCtx,
        epoch: u64,
        key: &TimerKey,
        record: &TimerRecord,
        until_ms: u64,
    ) -> Option<(Outcome, AttemptReport)> {
        let tocsin_core::Callback::Webhook { url } = &record.callback else { return None };
        // An address literal never reaches the guarded resolver: check it
        // here (a timer created before the allowlist shrank, or before the
        // guard existed). Names are checked after resolution.
        if let Err(refused) = self.urls.check_url(url) {
            metrics::counter!("tocsin_webhook_responses_total", "class" => "egress_refused").increment(1);
            let outcome = Outcome::Retry { error: refused.to_string(), retry_after_ms: None };
            return Some((outcome, AttemptReport::new(0, "egress_refused", 0)));
        }
        if self.disabled.lock().expect("disabled lock").contains_key(url.as_str()) {
            metrics::counter!("tocsin_webhook_responses_total", "class" => "url_disabled").increment(1);
            let outcome = Outcome::Retry {
                error: "the URL answered 410 Gone and is disabled (tocsin admin endpoint enable)".into(),
                retry_after_ms: None,
            };
            return Some((outcome, AttemptReport::new(0, "url_disabled", 0)));
        }
        let origin = origin_of(url);
        if self.paused.endpoint_paused(&origin) {
            // Paused by an operator (`tocsin admin endpoint pause`): not sent;
            // retried with the timer's backoff until resumed.
            metrics::counter!("tocsin_webhook_responses_total", "class" => "endpoint_paused").increment(1);
            let outcome = Outcome::Retry { error: "the endpoint's deliveries are paused".into(), retry_after_ms: None };
            return Some((outcome, AttemptReport::new(0, "endpoint_paused", 0)));
        }
        let endpoint = self.endpoint(origin);
        let now_ms = ctx.clock.now_ms();
        let verdict = endpoint.breaker.lock().expect("breaker lock").check(&self.breaker, now_ms);
        let mut slot = match verdict {
            Verdict::Send { probe } => ProbeSlot { endpoint: endpoint.clone(), armed: probe },
            Verdict::Hold { until_ms, why } => {
                metrics::counter!("tocsin_webhook_responses_total", "class" => why.class()).increment(1);
                let error = match why {
                    tocsin_core::breaker::HoldReason::CircuitOpen => "endpoint circuit open: it failed repeatedly",
                    tocsin_core::breaker::HoldReason::Throttled => "endpoint asked to slow down (429/503)",
                };
                let outcome =
                    Outcome::Retry { error: error.into(), retry_after_ms: Some(until_ms.saturating_sub(now_ms)) };
                return Some((outcome, AttemptReport::new(0, why.class(), 0)));
            }
        };
        // The lease gate before taking a place in the queue, so that an
        // attempt waiting for its leader's lease (which may take until the
        // attempt's deadline) holds no connection slot other shards' timers
        // to this endpoint could use; it is checked again right before the
        // send, below.
        attempt::gate(ctx, epoch, until_ms, "webhook").await?;
        // What a waiting attempt holds: its record (the payload most of it).
        let cost_bytes = record.payload.len() + QUEUED_OVERHEAD_BYTES;
        let over_bytes =
            self.queued_bytes.fetch_add(cost_bytes, Ordering::SeqCst) + cost_bytes > self.config.max_queued_bytes;
        if over_bytes || endpoint.queued.fetch_add(1, Ordering::SeqCst) >= self.config.per_endpoint_queue {
            if !over_bytes {
                endpoint.queued.fetch_sub(1, Ordering::SeqCst);
            }
            self.queued_bytes.fetch_sub(cost_bytes, Ordering::SeqCst);
            metrics::counter!("tocsin_webhook_responses_total", "class" => "queue_full").increment(1);
            let outcome = Outcome::Retry { error: "endpoint queue full".into(), retry_after_ms: None };
            return Some((outcome, AttemptReport::new(0, "queue_full", 0)));
        }
        // Wait for a slot no longer than the attempt has: a busy (or dead)
        // endpoint then counts as a failed attempt and backs off, rather than
        // leaving the deadline to start attempt after attempt.
        let slot_deadline = tokio::time::Instant::now()
            + Duration::from_millis(until_ms.saturating_sub(ctx.clock.now_ms()).saturating_sub(RECORD_MARGIN_MS));
        let permits = async {
            let endpoint_permit = endpoint.permits.clone().acquire_owned().await.ok()?;
            let global_permit = self.global.clone().acquire_owned().await.ok()?;
            Some((endpoint_permit, global_permit))
        };
        let queued_at = std::time::Instant::now();
        let permits = tokio::time::timeout_at(slot_deadline, permits).await;
        // The endpoint's queue, apart from the request: at 10k fires/s to one
        // receiver this wait, not the request, is what made deliveries late.
        metrics::histogram!("tocsin_webhook_slot_wait_seconds").record(queued_at.elapsed().as_secs_f64());
        endpoint.queued.fetch_sub(1, Ordering::SeqCst);
        self.queued_bytes.fetch_sub(cost_bytes, Ordering::SeqCst);
        let _permits = match permits {
            Ok(Some(permits)) => permits,
            Ok(None) => return None,
            Err(_) => {
                attempt::note_wait(ctx, key, record);
                metrics::counter!("tocsin_webhook_responses_total", "class" => "endpoint_busy").increment(1);
                let outcome = Outcome::Retry {
                    error: "endpoint busy: no connection slot before the attempt's deadline".into(),
                    retry_after_ms: None,
                };
                return Some((outcome, AttemptReport::new(0, "endpoint_busy", 0)));
            }
        };

        let left_ms = attempt::gate(ctx, epoch, until_ms, "webhook").await?;
        attempt::note_wait(ctx, key, record);

        let body = DeliveryJson::from_record(ctx.cluster_id().unwrap_or_default(), ctx.shard, key, record);
        let fire_id = body.fire_id.clone();
        let body = serde_json::to_vec(&body).expect("delivery serializes");
        let timestamp_s = ctx.clock.now_ms() / 1000;
        let budget_ms = left_ms.min(self.config.webhook_timeout_ms);
        let mut request = self
            .client
            .post(url)
            .timeout(Duration::from_millis(budget_ms))
            .header("content-type", "application/json")
            .header(headers::WEBHOOK_ID, &fire_id)
            .header(headers::WEBHOOK_TIMESTAMP, timestamp_s.to_string());
        let keys = self.keys_for(&key.namespace);
        if !keys.is_empty() {
            // Standard Webhooks: space-separated signatures, one per key.
            let signatures: Vec<String> = keys.iter().map(|k| signing::sign(k, &fire_id, timestamp_s, &body)).collect();
            request = request.header(headers::WEBHOOK_SIGNATURE, signatures.join(" "));
        }
        let started = std::time::Instant::now();
        let response = request.body(body).send().await;
        let latency = started.elapsed();
        metrics::histogram!("tocsin_webhook_request_seconds").record(latency.as_secs_f64());
        let latency_ms = latency.as_millis().min(u128::from(u32::MAX)) as u32;
        Some(match response {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let report = AttemptReport::new(status, status_class(status), latency_ms);
                let outcome = classify(resp).await;
                let observed = match (&outcome, status) {
                    (Outcome::Delivered, _) => Observed::Success,
                    (Outcome::Retry { retry_after_ms, .. }, 429 | 503) => {
                        Observed::Throttled { retry_after_ms: *retry_after_ms }
                    }
                    (_, 500..=599) => Observed::Failure,
                    _ => Observed::Answered,
                };
                let now_ms = ctx.clock.now_ms();
                slot.observe(&self.breaker, now_ms, observed);
                if status == 410 {
                    self.disable(url, key, now_ms);
                }
                (outcome, report)
            }
            Err(e) => {
                let (class, error) = error_class(&e);
                if failure_counts_against_breaker(class, budget_ms, self.config.webhook_timeout_ms) {
                    slot.observe(&self.breaker, ctx.clock.now_ms(), Observed::Failure);
                }
                metrics::counter!("tocsin_webhook_responses_total", "class" => class).increment(1);
                // The history's class: the kind of failure ("connection
                // refused", "timeout", "dns"), never the target's words.
                let history_class = if class == "error" { error.clone() } else { class.to_string() };
                (Outcome::Retry { error, retry_after_ms: None }, AttemptReport::new(0, history_class, latency_ms))
            }
        })
    }
}

/// Whether a request that failed with `class` (from [`error_class`]) counts
/// against its endpoint's circuit breaker, given the time it was allowed
/// (`budget_ms`) and the endpoint's full timeout.
///
/// A refusal by the egress policy never reached the endpoint. A timeout
/// counts only when the request had at least half the endpoint's timeout (a
/// fresh attempt has all of it but the record margin and the `Fire`'s
/// commit). One cut shorter because the attempt spent its time waiting here
/// for a slot says more of this node's backlog than of the endpoint:
/// counted, it opened the breaker of a receiver that was only slow, and the
/// held attempts became paced retries, tens of seconds late (docs/perf-history.md,
/// "Raft threads first"). Every other failure (refused connection, reset,
/// DNS) counts whatever the budget.
fn failure_counts_against_breaker(class: &str, budget_ms: u64, webhook_timeout_ms: u64) -> bool {
    match class {
        "egress_refused" => false,
        "timeout" => budget_ms >= webhook_timeout_ms / 2,
        _ => true,
    }
}

/// An HTTP status's class: `2xx` … `5xx`.
fn status_class(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

async fn classify(resp: reqwest::Response) -> Outcome {
    let status = resp.status();
    metrics::counter!("tocsin_webhook_responses_total", "class" => status_class(status.as_u16())).increment(1);
    if status.is_success() {
        return Outcome::Delivered;
    }
    let retry_after_ms = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
    match status.as_u16() {
        410 => Outcome::GiveUp { error: "http 410 gone".into() },
        409 => {
            let text = resp.text().await.unwrap_or_default().to_ascii_lowercase();
            if text.contains("stale") || text.contains("fenced") {
                Outcome::Fenced
            } else {
                Outcome::Retry { error: "http 409".into(), retry_after_ms: None }
            }
        }
        429 | 503 => Outcome::Retry { error: format!("http {}", status.as_u16()), retry_after_ms },
        code => Outcome::Retry { error: format!("http {code}"), retry_after_ms: None },
    }
}

/// `Retry-After` as delay-seconds (HTTP dates are rare from webhook
/// receivers and are treated as absent).
fn parse_retry_after(value: &str) -> Option<u64> {
    value.trim().parse::<u64>().ok().map(|s| s.min(86_400) * 1000)
}

/// A failed request as a metric class and the `last_error` text: a class
/// of failure, never the target's own words (those would make webhooks a
/// way to read or scan whatever the node can reach).
fn error_class(e: &reqwest::Error) -> (&'static str, String) {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<crate::egress::Refused>() {
            return ("egress_refused", refused.to_string());
        }
        if s.downcast_ref::<crate::egress::DnsFailed>().is_some() {
            return ("dns", "dns resolution failed".into());
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            let text = match io.kind() {
                K::ConnectionRefused => Some("connection refused"),
                K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => Some("connection reset"),
                K::TimedOut => Some("timeout"),
                K::HostUnreachable | K::NetworkUnreachable => Some("unreachable"),
                _ => None,
            };
            if let Some(text) = text {
                return ("error", text.into());
            }
        }
        if s.downcast_ref::<rustls::Error>().is_some() {
            return ("error", "tls handshake failed".into());
        }
        source = s.source();
    }
    if e.is_timeout() {
        ("timeout", "timeout".into())
    } else if e.is_connect() {
        ("error", "connection failed".into())
    } else if e.is_body() || e.is_decode() {
        ("error", "response unreadable".into())
    } else {
        ("error", "request failed".into())
    }
}

/// A URL for the logs: its origin and path, without the query (which may
/// carry a receiver's token).
fn redact_url(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

/// `scheme://host:port` of a URL: the unit of per-endpoint limits.
pub fn origin_of(url: &str) -> String {
    match url.find("://") {
        Some(i) => {
            let rest = &url[i + 3..];
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            format!("{}://{}", &url[..i], &rest[..end])
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        assert_eq!(origin_of("http://127.0.0.1:9000/hook?x=1"), "http://127.0.0.1:9000");
        assert_eq!(origin_of("https://example.com"), "https://example.com");
    }

    #[test]
    fn idle_endpoints_are_forgotten_past_the_bound() {
        let sender = WebhookSender::new(DeliveryConfig::default(), HashMap::new(), Default::default()).unwrap();
        let busy = sender.endpoint(origin_of("http://busy.example:1/hook"));
        for i in 0..MAX_ENDPOINTS + 50 {
            drop(sender.endpoint(origin_of(&format!("http://h{i}.example/hook"))));
        }
        let endpoints = sender.endpoints.lock().unwrap();
        assert!(endpoints.len() <= MAX_ENDPOINTS, "{} endpoints kept", endpoints.len());
        // One still in use is never forgotten.
        assert!(Arc::ptr_eq(&endpoints["http://busy.example:1"], &busy));
    }

    #[tokio::test]
    async fn a_refused_target_is_reported_as_a_class() {
        let sender = WebhookSender::new(DeliveryConfig::default(), HashMap::new(), Default::default()).unwrap();
        let err = sender.client.post("http://localhost:9/hook").send().await.unwrap_err();
        // The chain, printed if the class is wrong.
        let mut chain = Vec::new();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
        while let Some(s) = source {
            chain.push(format!("{s:?}"));
            source = s.source();
        }
        assert_eq!(
            error_class(&err),
            (
                "egress_refused",
                "refused by the webhook egress policy: loopback address (allow it with delivery.webhook_allow)".into()
            ),
            "{chain:#?}"
        );
    }

    #[test]
    fn only_a_timeout_with_most_of_the_endpoints_time_counts_against_its_breaker() {
        let full_ms = 10_000;
        // A fresh attempt: all of the timeout, or all but the record margin.
        assert!(failure_counts_against_breaker("timeout", full_ms, full_ms));
        assert!(failure_counts_against_breaker("timeout", full_ms - 300, full_ms));
        // The boundary: half the timeout still counts, a millisecond less not.
        assert!(failure_counts_against_breaker("timeout", full_ms / 2, full_ms));
        assert!(!failure_counts_against_breaker("timeout", full_ms / 2 - 1, full_ms));
        // Cut short by the wait for a connection slot: this node's backlog.
        assert!(!failure_counts_against_breaker("timeout", 1_200, full_ms));
        assert!(!failure_counts_against_breaker("timeout", 0, full_ms));
        // Failures the endpoint caused count however little time was left.
        for class in ["unreachable", "dns", "error"] {
            assert!(failure_counts_against_breaker(class, 10, full_ms), "{class}");
        }
        // The egress policy's refusal never reached the endpoint.
        assert!(!failure_counts_against_breaker("egress_refused", full_ms, full_ms));
    }

    #[test]
    fn retry_after() {
        assert_eq!(parse_retry_after("3"), Some(3000));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }
}
