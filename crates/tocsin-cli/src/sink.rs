//! `tocsin sink`: the reference webhook receiver.
//!
//! It does what the webhook docs ask of every receiver, in one atomic step
//! per delivery: keep the largest epoch seen per shard, answer `409 stale
//! epoch` to anything lower, treat a repeated `fire_id` as a duplicate, and
//! only then perform the side effect — here, appending the delivery and its
//! verdict as one NDJSON line. Tests, benchmarks and demos use it.

use axum::serve::ListenerExt as _;
use std::collections::HashMap;
use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::Mutex;

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use serde::Serialize;
use tocsin_node::delivery::signing;
use tocsin_node::json::DeliveryJson;

#[derive(clap::Args)]
pub struct SinkArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: String,
    /// NDJSON file to append deliveries to ("-" for stdout).
    #[arg(long, default_value = "-")]
    out: String,
    /// Verify Standard Webhooks signatures with this secret.
    #[arg(long)]
    secret: Option<String>,
    /// Print nothing but the deliveries.
    #[arg(long)]
    quiet: bool,
}

/// One received delivery and what the sink decided.
#[derive(Clone, Debug, Serialize)]
pub struct Received {
    pub recv_ms: u64,
    /// accepted, duplicate, rejected_stale, rejected_sig, bad_body.
    pub verdict: &'static str,
    pub namespace: String,
    pub id: String,
    pub shard: u32,
    pub epoch: u64,
    pub fire_id: String,
    pub attempt: u32,
    pub attempt_index: u64,
    pub fire_at_ms: u64,
    pub fired_at_ms: u64,
}

/// Fencing and deduplication state, behind one lock so the check and the
/// side effect are one step.
pub struct Fence {
    max_epoch: HashMap<u32, u64>,
    seen: HashSet<String>,
    secret: Option<Vec<u8>>,
    out: Box<dyn Write + Send>,
    /// Also called with every record (the benchmark's own sink).
    tap: Option<Box<dyn Fn(&Received) + Send>>,
}

impl Fence {
    pub fn new(
        secret: Option<Vec<u8>>,
        out: Box<dyn Write + Send>,
        tap: Option<Box<dyn Fn(&Received) + Send>>,
    ) -> Fence {
        Fence { max_epoch: HashMap::new(), seen: HashSet::new(), secret, out, tap }
    }

    fn decide(&mut self, headers: &HeaderMap, body: &[u8]) -> (StatusCode, &'static str, Option<Received>) {
        let recv_ms = tocsin_node::clock::now_ms();
        let delivery: DeliveryJson = match serde_json::from_slice(body) {
            Ok(d) => d,
            Err(_) => return (StatusCode::BAD_REQUEST, "bad_body", None),
        };
        let mut received = Received {
            recv_ms,
            verdict: "accepted",
            namespace: delivery.namespace.clone(),
            id: delivery.id.clone(),
            shard: delivery.shard,
            epoch: delivery.epoch,
            fire_id: delivery.fire_id.clone(),
            attempt: delivery.attempt,
            attempt_index: delivery.attempt_index,
            fire_at_ms: delivery.fire_at_ms,
            fired_at_ms: delivery.fired_at_ms,
        };
        if let Some(secret) = &self.secret {
            let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
            let ts: u64 = header("webhook-timestamp").parse().unwrap_or(0);
            let fresh = (recv_ms / 1000).abs_diff(ts) <= 300;
            if !fresh || !signing::verify(secret, header("webhook-id"), ts, body, header("webhook-signature")) {
                received.verdict = "rejected_sig";
                return (StatusCode::UNAUTHORIZED, "rejected_sig", Some(received));
            }
        }
        let max = self.max_epoch.entry(delivery.shard).or_insert(0);
        if delivery.epoch < *max {
            received.verdict = "rejected_stale";
            return (StatusCode::CONFLICT, "rejected_stale", Some(received));
        }
        *max = delivery.epoch;
        if !self.seen.insert(delivery.fire_id.clone()) {
            received.verdict = "duplicate";
            return (StatusCode::OK, "duplicate", Some(received));
        }
        (StatusCode::OK, "accepted", Some(received))
    }

    /// Decides and records one delivery; returns the HTTP answer.
    pub fn handle(&mut self, headers: &HeaderMap, body: &[u8]) -> Response {
        let (status, verdict, received) = self.decide(headers, body);
        if let Some(r) = &received {
            if let Ok(line) = serde_json::to_string(r) {
                let _ = writeln!(self.out, "{line}");
                let _ = self.out.flush();
            }
            if let Some(tap) = &self.tap {
                tap(r);
            }
        }
        let max_epoch = received.as_ref().and_then(|r| self.max_epoch.get(&r.shard).copied()).unwrap_or(0);
        let body = match verdict {
            "rejected_stale" => serde_json::json!({ "error": "stale epoch", "max_epoch": max_epoch }),
            other => serde_json::json!({ "verdict": other }),
        };
        (status, axum::Json(body)).into_response()
    }
}

/// An axum app that feeds every POST to `fence`.
pub fn app(fence: Arc<Mutex<Fence>>) -> axum::Router {
    async fn receive(State(fence): State<Arc<Mutex<Fence>>>, headers: HeaderMap, body: Bytes) -> Response {
        fence.lock().expect("fence lock").handle(&headers, &body)
    }
    axum::Router::new().fallback(axum::routing::post(receive)).with_state(fence)
}

pub async fn run(args: SinkArgs) -> anyhow::Result<ExitCode> {
    let out: Box<dyn Write + Send> = if args.out == "-" {
        Box::new(std::io::stdout())
    } else {
        let path = PathBuf::from(&args.out);
        Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?,
        )
    };
    let secret = args.secret.as_deref().map(signing::secret_bytes);
    let fence = Arc::new(Mutex::new(Fence::new(secret, out, None)));
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    if !args.quiet {
        eprintln!("listening on {}", listener.local_addr()?);
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    axum::serve(
        listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        }),
        app(fence),
    )
    .with_graceful_shutdown(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}
