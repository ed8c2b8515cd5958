//! What a node tells its operators: the catalogue of every metric it
//! exports (name, kind, unit, help text: [`describe`] registers them so
//! `/metrics` carries `# HELP` for each), the per-request metrics and access
//! log of the client gRPC port ([`GrpcRequestsLayer`]) and of the HTTP API
//! ([`observe_http`]), and the timer lifecycle totals counted from the
//! applied log ([`LifecycleCounts`]).
//!
//! Label values that come from clients are capped (`crate::labels`); a gRPC
//! method is a label only if the API defines it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::Context;
use std::task::Poll;
use std::time::Instant;

use metrics::Unit;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::command::AttemptOutcome;

/// A metric's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric a node exports: name, kind, unit, help. A test keeps this
/// list and the code's metric names the same.
pub const METRICS: &[(&str, Kind, Unit, &str)] = &[
    // Requests.
    ("tocsin_grpc_requests_total", Kind::Counter, Unit::Count, "Client gRPC calls answered, by method and gRPC code"),
    (
        "tocsin_grpc_request_seconds",
        Kind::Histogram,
        Unit::Seconds,
        "Client gRPC call latency until the response headers (a stream's: until it opened), by method",
    ),
    ("tocsin_http_requests_total", Kind::Counter, Unit::Count, "HTTP requests answered, by route and status"),
    ("tocsin_http_request_seconds", Kind::Histogram, Unit::Seconds, "HTTP request latency, by route"),
    (
        "tocsin_forwarded_requests_total",
        Kind::Counter,
        Unit::Count,
        "Requests this node forwarded to the shard's leader",
    ),
    (
        "tocsin_create_items_refused_total",
        Kind::Counter,
        Unit::Count,
        "Items of client batch creates (gRPC CreateTimers, HTTP POST /v1/timers:batch) answered with an error of their own (the call itself OK), by gRPC code",
    ),
    (
        "tocsin_stale_map_refusals_total",
        Kind::Counter,
        Unit::Count,
        "Requests refused as routed by an older shard map (ABORTED)",
    ),
    (
        "tocsin_creates_shed_total",
        Kind::Counter,
        Unit::Count,
        "Creates refused early under overload (RESOURCE_EXHAUSTED), by reason (queue_delay, scheduling_lag, fire_behind, delivery_behind)",
    ),
    ("tocsin_creates_over_quota_total", Kind::Counter, Unit::Count, "Creates refused by a namespace quota, by quota"),
    (
        "tocsin_client_tls_refused_total",
        Kind::Counter,
        Unit::Count,
        "Client connections refused by the TLS handshake, by port",
    ),
    ("tocsin_peer_refused_total", Kind::Counter, Unit::Count, "Peer-port calls refused, by reason"),
    // Timer lifecycle, counted by each shard's leader from the applied log.
    (
        "tocsin_timers_created_total",
        Kind::Counter,
        Unit::Count,
        "Timers created (not counting idempotent repeats), by namespace",
    ),
    ("tocsin_timers_cancelled_total", Kind::Counter, Unit::Count, "Timers cancelled, by namespace"),
    (
        "tocsin_timers_fired_total",
        Kind::Counter,
        Unit::Count,
        "Timers fired (first attempts started or made ready), by namespace",
    ),
    (
        "tocsin_timers_retried_total",
        Kind::Counter,
        Unit::Count,
        "Further attempts started after a failed or expired one, by namespace",
    ),
    (
        "tocsin_timers_delivered_total",
        Kind::Counter,
        Unit::Count,
        "Deliveries acknowledged (webhook 2xx, broker confirm, pull ack), by namespace",
    ),
    (
        "tocsin_timers_dead_total",
        Kind::Counter,
        Unit::Count,
        "Timers that became DEAD (attempts or time ran out, or the receiver gave up), by namespace",
    ),
    (
        "tocsin_fire_lateness_seconds",
        Kind::Histogram,
        Unit::Seconds,
        "How late each fire was, from fire time to the attempt's start, by namespace",
    ),
    (
        "tocsin_delivery_latency_seconds",
        Kind::Histogram,
        Unit::Seconds,
        "From fire time to the acknowledgement of the delivery, by namespace",
    ),
    ("tocsin_pending_timers", Kind::Gauge, Unit::Count, "Timers scheduled and not yet fired, by shard"),
    ("tocsin_firing_timers", Kind::Gauge, Unit::Count, "Timers fired and not yet delivered or dead, by shard"),
    (
        "tocsin_namespace_pending_timers",
        Kind::Gauge,
        Unit::Count,
        "Unfinished timers (scheduled, firing or retrying) of each namespace in the shards this node leads",
    ),
    // Delivery.
    (
        "tocsin_webhook_responses_total",
        Kind::Counter,
        Unit::Count,
        "Webhook attempts by how they ended (status class or failure)",
    ),
    ("tocsin_webhook_request_seconds", Kind::Histogram, Unit::Seconds, "Webhook request latency"),
    (
        "tocsin_webhook_slot_wait_seconds",
        Kind::Histogram,
        Unit::Seconds,
        "How long a webhook attempt waited for a connection slot (delivery.per_endpoint_concurrency, delivery.max_in_flight)",
    ),
    ("tocsin_webhook_disabled_urls", Kind::Gauge, Unit::Count, "Webhook URLs disabled after answering 410"),
    (
        "tocsin_webhook_urls_disabled_total",
        Kind::Counter,
        Unit::Count,
        "Webhook URLs disabled after answering 410, since start",
    ),
    ("tocsin_amqp_publishes_total", Kind::Counter, Unit::Count, "AMQP publishes by how they ended"),
    ("tocsin_amqp_publish_seconds", Kind::Histogram, Unit::Seconds, "AMQP publish latency until the broker's confirm"),
    (
        "tocsin_attempts_abandoned_total",
        Kind::Counter,
        Unit::Count,
        "Attempts left to their deadline before sending, by sink and reason (leadership, lease, deadline)",
    ),
    (
        "tocsin_attempt_outcome_retries_total",
        Kind::Counter,
        Unit::Count,
        "Proposals of an attempt's outcome tried again",
    ),
    ("tocsin_pull_ready", Kind::Gauge, Unit::Count, "Pull deliveries ready and not reserved, by namespace and topic"),
    (
        "tocsin_pull_overflow_total",
        Kind::Counter,
        Unit::Count,
        "Pull offers dropped by a full topic queue (offered again at their deadline)",
    ),
    // Firing.
    ("tocsin_wheel_entries", Kind::Gauge, Unit::Count, "Timers loaded in the leader's timing wheel, by shard"),
    ("tocsin_wheel_poll_lag_seconds", Kind::Histogram, Unit::Seconds, "How late the wheel handed out due timers"),
    (
        "tocsin_wheel_event_overflows_total",
        Kind::Counter,
        Unit::Count,
        "Applied-log events dropped by a full leader mailbox (the leader rescans)",
    ),
    (
        "tocsin_fire_rereads_total",
        Kind::Counter,
        Unit::Count,
        "Timers the fire loop read again from the index after an unknown outcome",
    ),
    (
        "tocsin_log_lines_dropped_total",
        Kind::Counter,
        Unit::Count,
        "Log lines dropped because stderr did not keep up (the node never waits on its log)",
    ),
    (
        "tocsin_fire_lease_refusals_total",
        Kind::Counter,
        Unit::Count,
        "Fires openraft refused because this leader's lease lapsed (re-read, not a deposition)",
    ),
    (
        "tocsin_fire_behind_seconds",
        Kind::Gauge,
        Unit::Seconds,
        "How long the leader's fire loop has left due timers unfired for want of Fire batches (creates are shed past admission.shed_creates_fire_behind_ms), by shard",
    ),
    (
        "tocsin_loader_lag_seconds",
        Kind::Gauge,
        Unit::Seconds,
        "How far the leader's index loader is behind its window, by shard",
    ),
    ("tocsin_leader_changes_total", Kind::Counter, Unit::Count, "Times this node became a shard's leader, by shard"),
    ("tocsin_epoch", Kind::Gauge, Unit::Count, "The shard's fencing epoch, by shard"),
    // Raft and storage.
    ("tocsin_raft_is_leader", Kind::Gauge, Unit::Count, "1 where this node leads the shard, by shard"),
    ("tocsin_raft_term", Kind::Gauge, Unit::Count, "Raft term, by shard"),
    ("tocsin_raft_committed_index", Kind::Gauge, Unit::Count, "Raft committed log index, by shard"),
    ("tocsin_raft_applied_index", Kind::Gauge, Unit::Count, "Raft applied log index, by shard"),
    (
        "tocsin_raft_write_seconds",
        Kind::Histogram,
        Unit::Seconds,
        "From a proposal's hand-off to Raft until it was applied (the commit path)",
    ),
    ("tocsin_raft_log_append_seconds", Kind::Histogram, Unit::Seconds, "Raft log appends, until synced"),
    (
        "tocsin_raft_log_uncached_entries_total",
        Kind::Counter,
        Unit::Count,
        "Raft log entries read back from RocksDB because replication or apply fell behind the log cache",
    ),
    (
        "tocsin_raft_apply_seconds",
        Kind::Histogram,
        Unit::Seconds,
        "Applying a batch of committed entries to the state machine",
    ),
    ("tocsin_raft_append_handled_seconds", Kind::Histogram, Unit::Seconds, "Handling one incoming AppendEntries"),
    ("tocsin_raft_rpc_seconds", Kind::Histogram, Unit::Seconds, "Raft RPC round trips, by RPC"),
    ("tocsin_raft_rpcs_sent_total", Kind::Counter, Unit::Count, "Raft RPCs sent, by RPC"),
    ("tocsin_raft_reconnects_total", Kind::Counter, Unit::Count, "Raft peer connections replaced"),
    (
        "tocsin_raft_quiet_groups",
        Kind::Gauge,
        Unit::Count,
        "Groups this node leads that are quiet (idle; heartbeated every raft.quiet_heartbeat_ms, kept by LIVENESS)",
    ),
    ("tocsin_raft_heartbeats_total", Kind::Counter, Unit::Count, "openraft heartbeats this node's group timers sent"),
    (
        "tocsin_raft_lease_renewals_total",
        Kind::Counter,
        Unit::Count,
        "Writes that first renewed the leader's lease with a heartbeat (the first write to a quiet group)",
    ),
    ("tocsin_raft_link_connects_total", Kind::Counter, Unit::Count, "Raft link connections opened"),
    ("tocsin_raft_link_messages_per_frame", Kind::Histogram, Unit::Count, "Raft messages per link frame"),
    (
        "tocsin_propose_queue_seconds",
        Kind::Histogram,
        Unit::Seconds,
        "Time a command waited in the shard's proposer queue",
    ),
    ("tocsin_propose_batch_commands", Kind::Histogram, Unit::Count, "Commands per proposed log entry"),
    ("tocsin_store_fsync_total", Kind::Counter, Unit::Count, "RocksDB WAL syncs"),
    ("tocsin_store_fsync_seconds", Kind::Histogram, Unit::Seconds, "RocksDB WAL sync latency"),
    ("tocsin_store_batches_per_fsync", Kind::Histogram, Unit::Count, "Write batches per WAL sync (group commit)"),
    ("tocsin_disk_free_bytes", Kind::Gauge, Unit::Bytes, "Free bytes on the data directory's file system"),
    (
        "tocsin_scheduling_lag_seconds",
        Kind::Gauge,
        Unit::Seconds,
        "How late the main runtime runs a timer-woken task (moving average); past admission.shed_creates_lag_ms, creates are shed",
    ),
    (
        "tocsin_raft_scheduling_lag_seconds",
        Kind::Gauge,
        Unit::Seconds,
        "How late the Raft runtime runs a timer-woken task (moving average)",
    ),
    (
        "tocsin_raft_thread_nice",
        Kind::Gauge,
        Unit::Count,
        "The nice value the Raft runtime's threads run at (raft.thread_nice); 0 when the node could not raise them",
    ),
    (
        "tocsin_fire_scheduling_lag_seconds",
        Kind::Gauge,
        Unit::Seconds,
        "How late the fire runtime runs a timer-woken task (moving average); counts in the lag that sheds creates",
    ),
    ("tocsin_rocksdb_memtable_bytes", Kind::Gauge, Unit::Bytes, "RocksDB memtables, all column families"),
    (
        "tocsin_rocksdb_table_readers_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "RocksDB table readers (indexes and filters outside the block cache)",
    ),
    ("tocsin_rocksdb_block_cache_bytes", Kind::Gauge, Unit::Bytes, "RocksDB block cache in use"),
    ("tocsin_rocksdb_block_cache_pinned_bytes", Kind::Gauge, Unit::Bytes, "RocksDB block cache pinned"),
    ("tocsin_rocksdb_live_sst_bytes", Kind::Gauge, Unit::Bytes, "RocksDB live SST files"),
    ("tocsin_rocksdb_write_stopped", Kind::Gauge, Unit::Count, "1 while RocksDB stops writes (compaction far behind)"),
    (
        "tocsin_rocksdb_delayed_write_rate",
        Kind::Gauge,
        Unit::Count,
        "RocksDB's delayed write rate in bytes per second, 0 when writes are not delayed",
    ),
    // Cluster and clock.
    ("tocsin_map_epoch", Kind::Gauge, Unit::Count, "The cluster map epoch this node holds"),
    (
        "tocsin_clock_offset_seconds",
        Kind::Gauge,
        Unit::Seconds,
        "This node's wall-clock offset from its peers (median)",
    ),
    (
        "tocsin_clock_peer_offset_seconds",
        Kind::Gauge,
        Unit::Seconds,
        "This node's wall-clock offset from each peer, by peer",
    ),
    (
        "tocsin_clock_unsafe",
        Kind::Gauge,
        Unit::Count,
        "1 while the clock offset is past max_clock_offset_ms (the node does not fire)",
    ),
    ("tocsin_clock_jumped", Kind::Gauge, Unit::Count, "1 while a wall-clock step waits for the peers' confirmation"),
];

/// Registers the help text and unit of every metric with the installed
/// recorder (call once, after installing it).
pub fn describe() {
    for &(name, kind, unit, help) in METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, unit, help),
            Kind::Gauge => metrics::describe_gauge!(name, unit, help),
            Kind::Histogram => metrics::describe_histogram!(name, unit, help),
        }
    }
}

/// The timer lifecycle totals of applied commands, counted by the shard's
/// leader only (each shard's entries are counted once cluster-wide). Summed
/// per (metric, namespace) over a batch of entries and added once per pair:
/// a batch of 100 creates is one counter update, not 100 label lookups.
#[derive(Default)]
pub struct LifecycleCounts {
    counts: Vec<(&'static str, String, u64)>,
}

impl LifecycleCounts {
    pub fn add(&mut self, command: &Command, result: &CommandResult) {
        let (metric, key) = match (command, result) {
            (Command::Create { key, .. }, CommandResult::Created { created: true, .. }) => {
                ("tocsin_timers_created_total", key)
            }
            (Command::Cancel { key }, CommandResult::Cancelled { .. } | CommandResult::CancelledWhileFiring { .. }) => {
                ("tocsin_timers_cancelled_total", key)
            }
            (Command::Fire { key, .. } | Command::FireReserve { key, .. }, CommandResult::Dispatch { record }) => {
                let first = record.fire.as_ref().is_none_or(|f| f.attempt <= 1);
                (if first { "tocsin_timers_fired_total" } else { "tocsin_timers_retried_total" }, key)
            }
            (
                Command::AttemptResult { key, outcome: AttemptOutcome::Delivered, .. },
                CommandResult::Recorded { .. },
            ) => ("tocsin_timers_delivered_total", key),
            (
                Command::AttemptResult { key, .. } | Command::Fire { key, .. } | Command::FireReserve { key, .. },
                CommandResult::Dead { .. },
            ) => ("tocsin_timers_dead_total", key),
            _ => return,
        };
        // Batches are small and mostly one namespace: a linear scan.
        match self.counts.iter_mut().find(|(m, ns, _)| *m == metric && *ns == key.namespace) {
            Some((_, _, n)) => *n += 1,
            None => self.counts.push((metric, key.namespace.clone(), 1)),
        }
    }

    /// Adds the sums to the counters.
    pub fn flush(self) {
        for (metric, namespace, n) in self.counts {
            metrics::counter!(metric, "namespace" => crate::labels::namespace(&namespace)).increment(n);
        }
    }
}

/// The methods the client port serves, `/package.Service/Method` to its
/// label (the path without its leading `/`): a method outside this set (a
/// client's invention) is `other`. The labels are built once and leaked (a
/// few dozen, for the process's life) so that counting a call allocates
/// no label.
static KNOWN_METHODS: LazyLock<HashMap<String, &'static str>> = LazyLock::new(|| {
    use prost::Message;
    let mut known = HashMap::new();
    for set in [tocsin_proto::FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET] {
        let Ok(set) = prost_types::FileDescriptorSet::decode(set) else { continue };
        for file in set.file {
            for service in &file.service {
                for method in &service.method {
                    let label = format!("{}.{}/{}", file.package(), service.name(), method.name());
                    known.insert(format!("/{label}"), &*Box::leak(label.into_boxed_str()));
                }
            }
        }
    }
    known
});

fn method_label(path: &str) -> &'static str {
    if let Some(label) = KNOWN_METHODS.get(path) {
        label
    } else if path.starts_with("/grpc.reflection.") {
        "grpc.reflection"
    } else {
        "other"
    }
}

/// Counts and times every call on the client gRPC port, and writes its
/// access-log line when asked to.
#[derive(Clone)]
pub struct GrpcRequestsLayer {
    access_log: bool,
}

impl GrpcRequestsLayer {
    pub fn new(access_log: bool) -> GrpcRequestsLayer {
        GrpcRequestsLayer { access_log }
    }
}

impl<S> tower::Layer<S> for GrpcRequestsLayer {
    type Service = GrpcRequests<S>;

    fn layer(&self, inner: S) -> GrpcRequests<S> {
        GrpcRequests { inner, access_log: self.access_log }
    }
}

/// See [`GrpcRequestsLayer`].
#[derive(Clone)]
pub struct GrpcRequests<S> {
    inner: S,
    access_log: bool,
}

impl<S, B, RB> tower::Service<http::Request<B>> for GrpcRequests<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_label(request.uri().path());
        let access_log = self.access_log;
        let peer = access_log
            .then(|| {
                request
                    .extensions()
                    .get::<tonic::transport::server::TcpConnectInfo>()
                    .and_then(|i| i.remote_addr())
                    .map(|a| a.to_string())
            })
            .flatten();
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            // A unary call's error comes as a trailers-only response, its
            // code in the headers; a success's code is in the trailers: OK.
            let code = match &result {
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or(tonic::Code::Ok, tonic::Code::from),
                Err(_) => tonic::Code::Unavailable,
            };
            let code_name = tocsin_contract::codes::code_name(code);
            let seconds = started.elapsed().as_secs_f64();
            metrics::counter!("tocsin_grpc_requests_total", "method" => method, "code" => code_name).increment(1);
            metrics::histogram!("tocsin_grpc_request_seconds", "method" => method).record(seconds);
            if access_log {
                tracing::info!(
                    target: "access",
                    proto = "grpc",
                    method = %method,
                    code = code_name,
                    ms = format_args!("{:.3}", seconds * 1000.0),
                    peer = peer.as_deref().unwrap_or("-"),
                );
            }
            result
        })
    }
}

/// Counts and times one HTTP request (`route` is the router's pattern, so
/// a label never holds a client's path), and writes its access-log line
/// when asked to.
pub fn observe_http(method: &http::Method, route: &str, status: u16, started: Instant, access_log: bool) {
    let seconds = started.elapsed().as_secs_f64();
    metrics::counter!("tocsin_http_requests_total", "route" => route.to_string(), "status" => status.to_string())
        .increment(1);
    metrics::histogram!("tocsin_http_request_seconds", "route" => route.to_string()).record(seconds);
    if access_log {
        tracing::info!(
            target: "access",
            proto = "http",
            method = %method,
            route,
            status,
            ms = format_args!("{:.3}", seconds * 1000.0),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric name the code records is in the catalogue, and the
    /// catalogue names nothing the code does not record.
    #[test]
    fn the_catalogue_and_the_code_name_the_same_metrics() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut used = std::collections::BTreeSet::new();
        let mut stack = vec![root.join("tocsin-node/src"), root.join("tocsin-store/src")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") || path.ends_with("telemetry.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                // Gauges named at run time (`Store::memory_usage`) are
                // listed as `("tocsin_…", value)` pairs.
                for (at, _) in text.match_indices("(\"tocsin_") {
                    if let Some(name) = text[at + 2..].split('"').next()
                        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    {
                        used.insert(name.to_string());
                    }
                }
                // Names handed to code that records them (a runtime's lag
                // gauge): any whole literal with a metric's suffix.
                for part in text.split('"').skip(1).step_by(2) {
                    let is_name = part.starts_with("tocsin_")
                        && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                    if is_name && ["_total", "_seconds", "_bytes"].iter().any(|s| part.ends_with(s)) {
                        used.insert(part.to_string());
                    }
                }
                for marker in ["counter!(", "gauge!(", "histogram!("] {
                    for (at, _) in text.match_indices(marker) {
                        let rest = text[at + marker.len()..].trim_start();
                        if let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                            used.insert(name.to_string());
                        }
                    }
                }
            }
        }
        // Recorded by the binary's log writer, the one metric outside the
        // node's crates.
        let logpipe = std::fs::read_to_string(root.join("tocsin-cli/src/logpipe.rs")).unwrap();
        assert!(logpipe.contains("counter!(\"tocsin_log_lines_dropped_total\")"));
        used.insert("tocsin_log_lines_dropped_total".to_string());
        // Recorded in this file.
        for own in [
            "tocsin_grpc_requests_total",
            "tocsin_grpc_request_seconds",
            "tocsin_http_requests_total",
            "tocsin_http_request_seconds",
            "tocsin_timers_created_total",
            "tocsin_timers_cancelled_total",
            "tocsin_timers_fired_total",
            "tocsin_timers_retried_total",
            "tocsin_timers_delivered_total",
            "tocsin_timers_dead_total",
        ] {
            used.insert(own.to_string());
        }
        let described: std::collections::BTreeSet<String> = METRICS.iter().map(|m| m.0.to_string()).collect();
        let undescribed: Vec<_> = used.difference(&described).collect();
        let unused: Vec<_> = described.difference(&used).collect();
        assert!(undescribed.is_empty(), "metrics without help text in telemetry::METRICS: {undescribed:?}");
        assert!(unused.is_empty(), "telemetry::METRICS names metrics nothing records: {unused:?}");
        for &(name, kind, unit, help) in METRICS {
            assert!(name.starts_with("tocsin_") && !help.is_empty(), "{name}");
            // Units last in the name, as Prometheus names them.
            match unit {
                Unit::Seconds => assert!(name.ends_with("_seconds"), "{name}"),
                Unit::Bytes => assert!(name.ends_with("_bytes"), "{name}"),
                _ => {}
            }
            if kind == Kind::Counter {
                assert!(name.ends_with("_total"), "{name}");
            }
        }
    }

    /// The Grafana dashboard (`deploy/grafana/tocsin.json`) queries only
    /// metrics a node exports, with the suffixes their kind has.
    #[test]
    fn the_dashboard_queries_exported_metrics() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/tocsin.json");
        let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut queried = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                for (at, _) in expr.match_indices("tocsin_") {
                    let name: String =
                        expr[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    let base = name.strip_suffix("_bucket").unwrap_or(&name);
                    let found = METRICS.iter().find(|m| m.0 == base);
                    assert!(found.is_some(), "{}: {name} is not exported", panel["title"]);
                    if name.ends_with("_bucket") {
                        assert_eq!(found.unwrap().1, Kind::Histogram, "{name}");
                    }
                    queried += 1;
                }
            }
        }
        assert!(queried >= 10, "{queried} metric references");
    }

    #[test]
    fn only_the_apis_methods_are_labels() {
        assert_eq!(method_label("/tocsin.v1.TimerService/CreateTimer"), "tocsin.v1.TimerService/CreateTimer");
        assert_eq!(method_label("/grpc.health.v1.Health/Check"), "grpc.health.v1.Health/Check");
        assert_eq!(method_label("/tocsin.v1.TimerService/Invented123"), "other");
        assert_eq!(method_label("/anything"), "other");
        assert_eq!(method_label("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"), "grpc.reflection");
    }
}
