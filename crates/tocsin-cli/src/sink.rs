//! `tocsin sink`: the reference webhook receiver.
//!
//! It does what the webhook docs ask of every receiver, in one atomic step
//! per delivery: keep the largest epoch seen per cluster and shard, answer
//! `409 stale epoch` to anything lower, treat a repeated `fire_id` as a duplicate, and
//! only then perform the side effect — here, appending the delivery and its
//! verdict as one NDJSON line. Tests, benchmarks and demos use it.
//!
//! For fault tests it can also misbehave, per path: `/status/<code>` answers
//! that status (`?retry_after=<s>` adds a `Retry-After` header) and
//! `/slow/<ms>` waits that long before deciding. `--mode PREFIX=MODE` (and
//! `POST /_sink/mode` at run time, one `PREFIX=MODE` per line) overrides the
//! behaviour of every path starting with `PREFIX`, so a test can make an
//! endpoint fail and then recover. Every answer is recorded with the status
//! the sink gave.

use axum::serve::ListenerExt as _;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use anyhow::bail;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::http::Uri;
use axum::response::IntoResponse;
use axum::response::Response;
use serde::Serialize;
use tocsin_contract::Verdict;
use tocsin_contract::headers;
use tocsin_contract::json::DeliveryJson;
use tocsin_contract::signing;

#[derive(clap::Args)]
pub struct SinkArgs {
    /// Address to listen on; repeat it to listen on several (they share one
    /// fence, and a webhook sender treats each as its own endpoint).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: Vec<String>,
    /// NDJSON file to append deliveries to ("-" for stdout).
    #[arg(long, default_value = "-")]
    out: String,
    /// Verify Standard Webhooks signatures with this secret.
    #[arg(long)]
    secret: Option<String>,
    /// Print nothing but the deliveries.
    #[arg(long)]
    quiet: bool,
    /// `PREFIX=MODE`: answer requests whose path starts with PREFIX as MODE
    /// says (`ok`, `status:CODE`, `status:CODE:RETRY_AFTER_S`, `slow:MS`).
    /// Repeatable; the longest matching prefix wins. `POST /_sink/mode`
    /// changes them while the sink runs.
    #[arg(long = "mode", value_name = "PREFIX=MODE")]
    modes: Vec<String>,
}

/// Unix milliseconds by the host's clock. Not the node's clock module: the
/// receiver's time is the reference a test judges the nodes by.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// One received request and what the sink did with it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Received {
    pub recv_ms: u64,
    /// What the sink decided (see [`Verdict`]).
    pub verdict: Verdict,
    pub namespace: String,
    pub id: String,
    pub shard: u32,
    pub epoch: u64,
    pub fire_id: String,
    /// The cluster that fired it: epochs are compared per (cluster, shard).
    pub cluster_id: String,
    pub attempt: u32,
    pub attempt_index: u64,
    pub fire_at_ms: u64,
    pub fired_at_ms: u64,
    /// The request path.
    pub path: String,
    /// The HTTP status the sink answered (0 on a `slow` arrival line).
    pub status: u16,
}

impl Received {
    fn parse(recv_ms: u64, path: &str, body: &[u8]) -> Option<Received> {
        let delivery: DeliveryJson = serde_json::from_slice(body).ok()?;
        Some(Received {
            recv_ms,
            verdict: Verdict::Accepted,
            namespace: delivery.namespace,
            id: delivery.id,
            shard: delivery.shard,
            epoch: delivery.epoch,
            fire_id: delivery.fire_id,
            cluster_id: delivery.cluster_id,
            attempt: delivery.attempt,
            attempt_index: delivery.attempt_index,
            fire_at_ms: delivery.fire_at_ms,
            fired_at_ms: delivery.fired_at_ms,
            path: path.to_string(),
            status: 0,
        })
    }
}

/// How the sink answers a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Decide (fence, deduplicate) and answer as a healthy receiver.
    Ok,
    /// Answer this status without accepting the delivery.
    Status { code: u16, retry_after_s: Option<u64> },
    /// Wait this long, then decide as a healthy receiver.
    Slow { ms: u64 },
}

impl std::str::FromStr for Mode {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Mode> {
        let parts: Vec<&str> = text.trim().split(':').collect();
        let number = |s: &str| s.parse::<u64>().with_context(|| format!("{s:?} in mode {text:?} is not a number"));
        Ok(match parts.as_slice() {
            ["ok"] => Mode::Ok,
            ["status", code] => Mode::Status { code: status_code(number(code)?)?, retry_after_s: None },
            ["status", code, after] => {
                Mode::Status { code: status_code(number(code)?)?, retry_after_s: Some(number(after)?) }
            }
            ["slow", ms] => Mode::Slow { ms: number(ms)? },
            _ => bail!("mode {text:?} is not ok, status:CODE, status:CODE:RETRY_AFTER_S or slow:MS"),
        })
    }
}

fn status_code(code: u64) -> anyhow::Result<u16> {
    match u16::try_from(code) {
        Ok(c) if StatusCode::from_u16(c).is_ok() => Ok(c),
        _ => bail!("{code} is not an HTTP status"),
    }
}

/// `PREFIX=MODE` into its parts; `MODE` may be `reset` (drop the override).
fn parse_override(line: &str) -> anyhow::Result<(String, Option<Mode>)> {
    let (prefix, mode) = line.split_once('=').with_context(|| format!("{line:?} is not PREFIX=MODE"))?;
    if !prefix.starts_with('/') {
        bail!("prefix {prefix:?} must start with /");
    }
    let mode = if mode.trim() == "reset" { None } else { Some(mode.parse()?) };
    Ok((prefix.to_string(), mode))
}

/// The mode a path's own shape asks for: `/status/<code>[?retry_after=<s>]`
/// or `/slow/<ms>`.
fn implied_mode(uri: &Uri) -> Mode {
    let mut segments = uri.path().trim_start_matches('/').split('/');
    match (segments.next(), segments.next().map(str::parse::<u64>)) {
        (Some("status"), Some(Ok(code))) => match status_code(code) {
            Ok(code) => {
                let retry_after_s = uri
                    .query()
                    .unwrap_or("")
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("retry_after=").and_then(|v| v.parse::<u64>().ok()));
                Mode::Status { code, retry_after_s }
            }
            Err(_) => Mode::Ok,
        },
        (Some("slow"), Some(Ok(ms))) => Mode::Slow { ms },
        _ => Mode::Ok,
    }
}

/// Fencing and deduplication state, behind one lock so the check and the
/// side effect are one step.
pub struct Fence {
    /// Per (cluster id, shard): a rebuilt cluster's epochs start again
    /// under a new cluster id, and are not stale.
    max_epoch: HashMap<(String, u32), u64>,
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

    fn decide(&mut self, path: &str, headers: &HeaderMap, body: &[u8]) -> (StatusCode, Verdict, Option<Received>) {
        let recv_ms = now_ms();
        let Some(mut received) = Received::parse(recv_ms, path, body) else {
            return (StatusCode::BAD_REQUEST, Verdict::BadBody, None);
        };
        if let Some(secret) = &self.secret {
            let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
            let ts: u64 = header(headers::WEBHOOK_TIMESTAMP).parse().unwrap_or(0);
            let fresh = (recv_ms / 1000).abs_diff(ts) <= 300;
            if !fresh
                || !signing::verify(secret, header(headers::WEBHOOK_ID), ts, body, header(headers::WEBHOOK_SIGNATURE))
            {
                received.verdict = Verdict::RejectedSig;
                return (StatusCode::UNAUTHORIZED, Verdict::RejectedSig, Some(received));
            }
        }
        let max = self.max_epoch.entry((received.cluster_id.clone(), received.shard)).or_insert(0);
        if received.epoch < *max {
            received.verdict = Verdict::RejectedStale;
            return (StatusCode::CONFLICT, Verdict::RejectedStale, Some(received));
        }
        *max = received.epoch;
        if !self.seen.insert(received.fire_id.clone()) {
            received.verdict = Verdict::Duplicate;
            return (StatusCode::OK, Verdict::Duplicate, Some(received));
        }
        (StatusCode::OK, Verdict::Accepted, Some(received))
    }

    fn record(&mut self, received: &Received) {
        if let Ok(line) = serde_json::to_string(received) {
            let _ = writeln!(self.out, "{line}");
            let _ = self.out.flush();
        }
        if let Some(tap) = &self.tap {
            tap(received);
        }
    }

    /// Decides and records one delivery to `path`; returns the HTTP answer.
    pub fn handle(&mut self, path: &str, headers: &HeaderMap, body: &[u8]) -> Response {
        let (status, verdict, received) = self.decide(path, headers, body);
        if let Some(mut r) = received {
            r.status = status.as_u16();
            self.record(&r);
        }
        let max_epoch = self.max_epoch.get(&fence_of(body)).copied().unwrap_or(0);
        let body = match verdict {
            Verdict::RejectedStale => serde_json::json!({ "error": "stale epoch", "max_epoch": max_epoch }),
            other => serde_json::json!({ "verdict": other }),
        };
        (status, axum::Json(body)).into_response()
    }

    /// Records a request a mode answered without deciding on it.
    fn note(&mut self, verdict: Verdict, status: u16, path: &str, body: &[u8]) {
        let mut r = Received::parse(now_ms(), path, body).unwrap_or_else(|| Received {
            recv_ms: now_ms(),
            path: path.to_string(),
            ..Received::default()
        });
        r.verdict = verdict;
        r.status = status;
        self.record(&r);
    }
}

fn fence_of(body: &[u8]) -> (String, u32) {
    serde_json::from_slice::<DeliveryJson>(body).map(|d| (d.cluster_id, d.shard)).unwrap_or_default()
}

/// The fence and the per-path modes.
struct Sink {
    fence: Mutex<Fence>,
    /// Overrides by path prefix; the longest matching prefix wins.
    modes: Mutex<BTreeMap<String, Mode>>,
}

impl Sink {
    fn mode_for(&self, uri: &Uri) -> Mode {
        let modes = self.modes.lock().expect("modes lock");
        let path = uri.path();
        let chosen = modes.iter().filter(|(prefix, _)| path.starts_with(prefix.as_str())).max_by_key(|(p, _)| p.len());
        match chosen {
            Some((_, mode)) => mode.clone(),
            None => implied_mode(uri),
        }
    }
}

/// An axum app that feeds every POST to `fence`, healthy on every path but
/// those whose shape asks for a failure (`/status/…`, `/slow/…`).
pub fn app(fence: Fence) -> axum::Router {
    app_with_modes(fence, BTreeMap::new())
}

fn app_with_modes(fence: Fence, modes: BTreeMap<String, Mode>) -> axum::Router {
    async fn receive(State(sink): State<Arc<Sink>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        let path = uri.path().to_string();
        match sink.mode_for(&uri) {
            Mode::Ok => sink.fence.lock().expect("fence lock").handle(&path, &headers, &body),
            Mode::Status { code, retry_after_s } => {
                sink.fence.lock().expect("fence lock").note(Verdict::Refused, code, &path, &body);
                let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let mut response =
                    (status, axum::Json(serde_json::json!({ "error": "refused by the sink's mode" }))).into_response();
                if let Some(s) = retry_after_s
                    && let Ok(value) = s.to_string().parse()
                {
                    response.headers_mut().insert("retry-after", value);
                }
                response
            }
            Mode::Slow { ms } => {
                sink.fence.lock().expect("fence lock").note(Verdict::Slow, 0, &path, &body);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                sink.fence.lock().expect("fence lock").handle(&path, &headers, &body)
            }
        }
    }
    async fn set_modes(State(sink): State<Arc<Sink>>, body: String) -> Response {
        let mut changes = Vec::new();
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            match parse_override(line.trim()) {
                Ok(change) => changes.push(change),
                Err(e) => return (StatusCode::BAD_REQUEST, format!("{e:#}\n")).into_response(),
            }
        }
        let mut modes = sink.modes.lock().expect("modes lock");
        for (prefix, mode) in changes {
            let line = serde_json::json!({
                "recv_ms": now_ms(),
                "verdict": "mode",
                "path": prefix,
                "mode": mode.as_ref().map_or("reset".to_string(), |m| format!("{m:?}")),
            });
            let mut fence = sink.fence.lock().expect("fence lock");
            let _ = writeln!(fence.out, "{line}");
            let _ = fence.out.flush();
            match mode {
                Some(mode) => modes.insert(prefix, mode),
                None => modes.remove(&prefix),
            };
        }
        (StatusCode::OK, list(&modes)).into_response()
    }
    async fn get_modes(State(sink): State<Arc<Sink>>) -> String {
        list(&sink.modes.lock().expect("modes lock"))
    }
    fn list(modes: &BTreeMap<String, Mode>) -> String {
        modes.iter().map(|(p, m)| format!("{p}={m:?}\n")).collect()
    }
    let sink = Arc::new(Sink { fence: Mutex::new(fence), modes: Mutex::new(modes) });
    axum::Router::new()
        .route("/_sink/mode", axum::routing::post(set_modes).get(get_modes))
        .fallback(axum::routing::post(receive))
        .with_state(sink)
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
    let mut modes = BTreeMap::new();
    for line in &args.modes {
        if let (prefix, Some(mode)) = parse_override(line)? {
            modes.insert(prefix, mode);
        }
    }
    let secret = args.secret.as_deref().map(signing::secret_bytes).transpose().context("--secret")?;
    let app = app_with_modes(Fence::new(secret, out, None), modes);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    for addr in &args.listen {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        if !args.quiet {
            eprintln!("listening on {}", listener.local_addr()?);
        }
        let mut stop = stop_rx.clone();
        let app = app.clone();
        servers.spawn(async move {
            axum::serve(
                listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                }),
                app,
            )
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
        });
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        Some(done) = servers.join_next() => done??,
    }
    let _ = stop_tx.send(true);
    while let Some(done) = servers.join_next().await {
        done??;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("ok".parse::<Mode>().unwrap(), Mode::Ok);
        assert_eq!("status:503:3".parse::<Mode>().unwrap(), Mode::Status { code: 503, retry_after_s: Some(3) });
        assert_eq!("slow:20000".parse::<Mode>().unwrap(), Mode::Slow { ms: 20_000 });
        assert!("status:99999".parse::<Mode>().is_err());
        assert!("fast".parse::<Mode>().is_err());
        assert_eq!(parse_override("/x=reset").unwrap(), ("/x".to_string(), None));
        assert!(parse_override("x=ok").is_err());
    }

    #[test]
    fn paths_imply_modes() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(implied_mode(&uri("/status/429?retry_after=2")), Mode::Status { code: 429, retry_after_s: Some(2) });
        assert_eq!(implied_mode(&uri("/status/500")), Mode::Status { code: 500, retry_after_s: None });
        assert_eq!(implied_mode(&uri("/slow/20000")), Mode::Slow { ms: 20_000 });
        assert_eq!(implied_mode(&uri("/hook")), Mode::Ok);
        assert_eq!(implied_mode(&uri("/status/abc")), Mode::Ok);
    }

    #[test]
    fn overrides_take_the_longest_prefix() {
        let fence = Fence::new(None, Box::new(std::io::sink()), None);
        let sink = Sink { fence: Mutex::new(fence), modes: Mutex::new(BTreeMap::new()) };
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        sink.modes.lock().unwrap().insert("/status".into(), Mode::Ok);
        sink.modes.lock().unwrap().insert("/status/410".into(), Mode::Status { code: 410, retry_after_s: None });
        assert_eq!(sink.mode_for(&uri("/status/500")), Mode::Ok, "a recovered path answers as a healthy one");
        assert_eq!(sink.mode_for(&uri("/status/410")), Mode::Status { code: 410, retry_after_s: None });
        assert_eq!(sink.mode_for(&uri("/slow/5")), Mode::Slow { ms: 5 });
    }
}
