//! The HTTP/JSON mirror of the `TimerService`, plus health, readiness and
//! Prometheus metrics.
//!
//! | method and path | does |
//! |---|---|
//! | `POST /v1/timers` | create (201 created, 200 identical repeat) |
//! | `POST /v1/timers:batch` | create up to 1,000 |
//! | `GET /v1/timers/{namespace}/{id}` | get |
//! | `DELETE /v1/timers/{namespace}/{id}` | cancel (404 carries `NOT_FOUND`) |
//! | `POST /v1/timers/{namespace}/{id}:reschedule` | reschedule |
//! | `GET /v1/timers/{namespace}/{id}/attempts` | the timer's attempt history (the latest 32) |
//! | `GET /v1/timers/{namespace}?state=&dead_reason=&fire_after_ms=&fire_before_ms=&page_size=&page_token=` | list |
//! | `POST /v1/namespaces/{namespace}:redrive` | start DEAD timers over: `{"ids": […]}`, or `{"all_dead": true, "dead_reason": …, "limit": …}` |
//! | `POST /v1/namespaces/{namespace}/topics/{topic}:reserve` | pull: up to `max` deliveries, waiting up to `wait_ms` for the first |
//! | `POST /v1/namespaces/{namespace}/topics/{topic}:ack`, `:nack` | pull: settle deliveries |
//! | `GET /v1/namespaces/{namespace}/horizon` | fires in the next minute, hour, day |
//! | `GET /v1/cluster` | nodes and shards |
//! | `GET /healthz`, `GET /readyz`, `GET /metrics` | operations |
//! | `GET /ui`, `/ui/…` | the web console (`crate::api::console`) |
//!
//! Bodies are parsed into the generated proto types and handed to the same
//! [`TimerApi`] as gRPC. Errors are `{"error": {"code", "message", "field",
//! "leader", …}}` with the HTTP status of the gRPC code. The body size is
//! checked while reading, before the JSON is parsed.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::Path;
use axum::extract::Query;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use axum::routing::post;
use serde::de::DeserializeOwned;
use serde_json::json;
use tocsin_contract::codes;
use tocsin_contract::json::AttemptJson;
use tocsin_contract::json::CreateTimerJson;
use tocsin_contract::json::CreateTimersJson;
use tocsin_contract::json::ErrorJson;
use tocsin_contract::json::PulledJson;
use tocsin_contract::json::RedriveJson;
use tocsin_contract::json::RescheduleJson;
use tocsin_contract::json::ReserveJson;
use tocsin_contract::json::SettleJson;
use tocsin_contract::json::TimerJson;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::timer_service_server::TimerService;

use crate::api::admin::AdminApi;

use crate::api::parse;
use crate::api::request;
use crate::api::request::rpc;
use crate::api::timers::TimerApi;
use crate::control::state::NodeState;
use crate::error::NodeError;

#[derive(Clone)]
struct HttpState {
    timers: TimerApi,
    admin: AdminApi,
    node: Arc<NodeState>,
}

/// The HTTP router for a node.
pub fn router(node: Arc<NodeState>) -> Router {
    let max_body = node.config.admission.max_request_bytes;
    let state = HttpState { timers: TimerApi::new(node.clone()), admin: AdminApi::new(node.clone()), node };
    Router::new()
        .route("/v1/timers", post(create))
        .route("/v1/timers:batch", post(create_batch))
        .route("/v1/timers/{namespace}", get(list))
        .route("/v1/timers/{namespace}/{id}", get(get_timer).delete(cancel).post(action))
        .route("/v1/timers/{namespace}/{id}/attempts", get(attempts))
        .route("/v1/namespaces/{namespace}", post(namespace_action))
        .route("/v1/namespaces/{namespace}/horizon", get(horizon))
        .route("/v1/namespaces/{namespace}/topics/{topic}", post(topic_action))
        .route("/v1/cluster", get(cluster))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics_text))
        .merge(crate::api::console::routes(state.node.clone()))
        .route_layer(axum::middleware::from_fn_with_state(state.node.clone(), observe))
        .fallback(|State(s): State<HttpState>, method: axum::http::Method| async move {
            let started = std::time::Instant::now();
            let resp = error_response(tonic::Code::NotFound, "no such route", "");
            crate::telemetry::observe_http(
                &method,
                "unmatched",
                resp.status().as_u16(),
                started,
                s.node.config.access_log,
            );
            resp
        })
        .layer(axum::middleware::from_fn_with_state(state.node.clone(), carry_authorization))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::map_response(move |resp: Response| async move { json_413(resp, max_body) }))
        .with_state(state)
}

/// Per-route request metrics and the access log (`crate::telemetry`).
async fn observe(
    State(node): State<Arc<NodeState>>,
    route: axum::extract::MatchedPath,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let response = next.run(request).await;
    crate::telemetry::observe_http(
        &method,
        route.as_str(),
        response.status().as_u16(),
        started,
        node.config.access_log,
    );
    response
}

/// Refuses an API call (`/v1/…`) or console page (`/ui`) whose token is
/// missing or unknown before its body is even parsed, and keeps the token
/// where [`rpc`] finds it, so the handler's call into the API checks the
/// token's scopes. Probes and metrics stay open.
async fn carry_authorization(
    State(node): State<Arc<NodeState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    let console = path == "/ui" || (path.starts_with("/ui/") && path != "/ui/login");
    let value = request::authorization(request.headers(), console);
    if path.starts_with("/v1/") || console {
        let bearer = value.as_ref().and_then(|v| v.to_str().ok()).and_then(crate::auth::bearer_in);
        if let Err(e) = node.authority.check(&node.map.get(), bearer, None, &[]) {
            if console {
                // A browser: to the login form, not a JSON error.
                return axum::response::Redirect::to("/ui/login").into_response();
            }
            return status_response(e.into());
        }
    }
    request::AUTHORIZATION.scope(value, next.run(request)).await
}

/// axum answers an oversized body with plain text; give it the API's JSON
/// error shape.
fn json_413(resp: Response, max_body: usize) -> Response {
    if resp.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return resp;
    }
    let message = format!("request body exceeds {max_body} bytes");
    error_with_status(StatusCode::PAYLOAD_TOO_LARGE, tonic::Code::ResourceExhausted, &message, "body")
}

/// The one JSON error shape, with the HTTP status the contract gives `code`.
fn error_response(code: tonic::Code, message: &str, field: &str) -> Response {
    error_with_status(codes::http_status(code), code, message, field)
}

/// The JSON error shape with a status of its own (413 for a body too large,
/// which is RESOURCE_EXHAUSTED to a gRPC client).
fn error_with_status(status: StatusCode, code: tonic::Code, message: &str, field: &str) -> Response {
    let body = ErrorJson {
        code: codes::code_name(code).into(),
        message: message.into(),
        field: field.into(),
        ..ErrorJson::default()
    };
    (status, Json(json!({ "error": body }))).into_response()
}

/// A gRPC status as an HTTP error response.
fn status_response(status: tonic::Status) -> Response {
    let info = codes::info_of(&status);
    let http = codes::http_status(status.code());
    let mut resp = (http, Json(json!({ "error": ErrorJson::from_info(&info) }))).into_response();
    if info.retry_after_ms > 0 {
        let secs = info.retry_after_ms.div_ceil(1000).to_string();
        if let Ok(v) = HeaderValue::from_str(&secs) {
            resp.headers_mut().insert("retry-after", v);
        }
    }
    resp
}

/// Parses a JSON body into `T`, answering 400 (with the serde message, which
/// names the field) when it does not fit.
fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, Response> {
    if body.is_empty() {
        return Err(error_response(tonic::Code::InvalidArgument, "request body is empty", "body"));
    }
    serde_json::from_slice(body).map_err(|e| {
        let message = format!("malformed JSON: {e}");
        error_response(tonic::Code::InvalidArgument, &message, "body")
    })
}

/// A JSON body can carry both fire times, which the proto cannot: the one
/// rule (`parse::fire_time`) decides here, and its refusal reads like any
/// other error of the field (`context` names the batch item).
fn fire_time_error(fire_at_ms: Option<u64>, delay_ms: Option<u64>, context: &str) -> Option<Response> {
    let e = parse::fire_time(fire_at_ms, delay_ms).err()?;
    Some(context_error(e, context))
}

/// A create's fire time, which a recurring timer may leave out.
fn create_fire_time_error(t: &CreateTimerJson, context: &str) -> Option<Response> {
    if t.recurrence.is_some() && t.fire_at_ms.is_none() && t.delay_ms.is_none() {
        return None;
    }
    fire_time_error(t.fire_at_ms, t.delay_ms, context)
}

/// A create body the proto cannot carry (a recurrence with both rules).
fn create_proto(t: CreateTimerJson, context: &str) -> Result<pb::CreateTimerRequest, Response> {
    t.into_proto().map_err(|message| context_error(NodeError::invalid("recurrence", message), context))
}

fn context_error(e: NodeError, context: &str) -> Response {
    let info = e.info();
    let message = format!("{context}{}", info.message);
    error_response(e.code(), &message, &info.field)
}

async fn create(State(s): State<HttpState>, body: Bytes) -> Response {
    let req: CreateTimerJson = match parse(&body) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if let Some(resp) = create_fire_time_error(&req, "") {
        return resp;
    }
    let req = match create_proto(req, "") {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    match s.timers.create_timer(rpc(req)).await {
        Ok(resp) => {
            let resp = resp.into_inner();
            let status = if resp.created { StatusCode::CREATED } else { StatusCode::OK };
            let timer = resp.timer.as_ref().map(TimerJson::from_proto);
            (status, Json(json!({ "timer": timer, "created": resp.created }))).into_response()
        }
        Err(status) => status_response(status),
    }
}

async fn create_batch(State(s): State<HttpState>, body: Bytes) -> Response {
    let req: CreateTimersJson = match parse(&body) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    for (i, t) in req.timers.iter().enumerate() {
        if let Some(resp) = create_fire_time_error(t, &format!("timers[{i}]: ")) {
            return resp;
        }
    }
    let mut timers = Vec::with_capacity(req.timers.len());
    for (i, t) in req.timers.into_iter().enumerate() {
        match create_proto(t, &format!("timers[{i}]: ")) {
            Ok(t) => timers.push(t),
            Err(resp) => return resp,
        }
    }
    match s.timers.create_timers(rpc(pb::CreateTimersRequest { timers })).await {
        Ok(resp) => {
            let results: Vec<serde_json::Value> = resp
                .into_inner()
                .results
                .into_iter()
                .map(|r| match r.result {
                    Some(pb::create_timer_result::Result::Ok(ok)) => json!({
                        "ok": { "timer": ok.timer.as_ref().map(TimerJson::from_proto), "created": ok.created }
                    }),
                    Some(pb::create_timer_result::Result::Error(info)) => {
                        json!({ "error": ErrorJson::from_info(&info) })
                    }
                    None => json!({}),
                })
                .collect();
            Json(json!({ "results": results })).into_response()
        }
        Err(status) => status_response(status),
    }
}

async fn get_timer(State(s): State<HttpState>, Path((namespace, id)): Path<(String, String)>) -> Response {
    match s.timers.get_timer(rpc(pb::GetTimerRequest { namespace, id, include_attempts: false })).await {
        Ok(resp) => {
            Json(json!({ "timer": resp.into_inner().timer.as_ref().map(TimerJson::from_proto) })).into_response()
        }
        Err(status) => status_response(status),
    }
}

async fn attempts(State(s): State<HttpState>, Path((namespace, id)): Path<(String, String)>) -> Response {
    match s.timers.get_timer(rpc(pb::GetTimerRequest { namespace, id, include_attempts: true })).await {
        Ok(resp) => {
            let timer = resp.into_inner().timer.unwrap_or_default();
            let attempts: Vec<AttemptJson> = timer.attempts.iter().map(AttemptJson::from_proto).collect();
            Json(json!({
                "namespace": timer.namespace,
                "id": timer.id,
                "state": tocsin_contract::json::state_name(timer.state),
                "generation": timer.generation,
                "attempts": attempts,
            }))
            .into_response()
        }
        Err(status) => status_response(status),
    }
}

/// Longest a reserve call waits for its first delivery.
const RESERVE_WAIT_MAX_MS: u64 = 30_000;
/// The least a reserve call waits (see [`reserve`]).
const RESERVE_RECORD_MS: u64 = 200;
/// After the first batch, how long a reserve call waits for more (other
/// nodes' shards) before it answers.
const RESERVE_GATHER_MS: u64 = 10;

/// `POST /v1/namespaces/{namespace}/topics/{topic}:reserve`, `:ack`, `:nack`.
async fn topic_action(
    State(s): State<HttpState>,
    Path((namespace, topic)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    if let Some(topic) = topic.strip_suffix(":reserve") {
        return reserve(&s, namespace, topic.to_string(), &body).await;
    }
    let nack = match topic.rsplit_once(':') {
        Some((_, "ack")) => false,
        Some((_, "nack")) => true,
        _ => return error_response(tonic::Code::NotFound, "no such route; use {topic}:reserve, :ack or :nack", ""),
    };
    let req: SettleJson = match parse(&body) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if !nack && (req.delay_ms != 0 || !req.reason.is_empty()) {
        return error_response(tonic::Code::InvalidArgument, "delay_ms and reason are for :nack", "delay_ms");
    }
    let ids: Vec<String> = req.deliveries.iter().map(|d| d.id.clone()).collect();
    let deliveries: Vec<pb::DeliveryRef> = req
        .deliveries
        .into_iter()
        .map(|d| pb::DeliveryRef {
            namespace: namespace.clone(),
            id: d.id,
            fire_id: d.fire_id,
            attempt: u32::try_from(d.attempt).unwrap_or(u32::MAX),
        })
        .collect();
    let results = if nack {
        let request = pb::NackRequest { deliveries, delay_ms: req.delay_ms, reason: req.reason };
        s.timers.nack(rpc(request)).await.map(|r| r.into_inner().results)
    } else {
        s.timers.ack(rpc(pb::AckRequest { deliveries })).await.map(|r| r.into_inner().results)
    };
    match results {
        Ok(results) => {
            let results: Vec<_> = ids
                .into_iter()
                .zip(results)
                .map(|(id, r)| {
                    let status = pb::ack_result::Status::try_from(r.status).map(|s| s.as_str_name()).unwrap_or("?");
                    json!({ "id": id, "status": status })
                })
                .collect();
            Json(json!({ "results": results })).into_response()
        }
        Err(status) => status_response(status),
    }
}

/// A long-poll reserve: opens a `Reserve` stream like a gRPC consumer
/// (every node's shards), waits up to `wait_ms` for the first batch, takes
/// what else arrives within [`RESERVE_GATHER_MS`] up to `max`, and closes
/// it. Each node reserves at most `max` for the call; deliveries reserved
/// after it answered (a node's batch that came later) are offered again
/// once their time-to-run ends.
async fn reserve(s: &HttpState, namespace: String, topic: String, body: &Bytes) -> Response {
    let req: ReserveJson = if body.is_empty() {
        ReserveJson::default()
    } else {
        match parse(body) {
            Ok(r) => r,
            Err(resp) => return resp,
        }
    };
    let max = req.max.unwrap_or(10);
    if max == 0 || max > 1_000 {
        return error_response(tonic::Code::InvalidArgument, "max must be 1 to 1000", "max");
    }
    let wait_ms = req.wait_ms.unwrap_or(1_000);
    if wait_ms > RESERVE_WAIT_MAX_MS {
        let message = format!("wait_ms must be at most {RESERVE_WAIT_MAX_MS}");
        return error_response(tonic::Code::InvalidArgument, &message, "wait_ms");
    }
    let request =
        pb::ReserveRequest { namespace, topic, ttr_ms: req.ttr_ms.unwrap_or(0), max_batch: max, max_in_flight: max };
    let mut stream = match s.timers.reserve(rpc(request)).await {
        Ok(resp) => resp.into_inner(),
        Err(status) => return status_response(status),
    };
    let mut deliveries: Vec<pb::Delivery> = Vec::new();
    // A reservation is recorded through Raft before it is handed out, so
    // even timers ready now take a commit to reserve: a call with a shorter
    // wait still waits that long at most.
    let until = tokio::time::Instant::now() + std::time::Duration::from_millis(wait_ms.max(RESERVE_RECORD_MS));
    let mut gather_until: Option<tokio::time::Instant> = None;
    loop {
        let deadline = gather_until.unwrap_or(until);
        let next = tokio::time::timeout_at(deadline, futures::StreamExt::next(&mut stream)).await;
        match next {
            Ok(Some(Ok(batch))) => {
                deliveries.extend(batch.deliveries);
                if deliveries.len() >= max as usize {
                    break;
                }
                if !deliveries.is_empty() && gather_until.is_none() {
                    gather_until = Some(
                        (tokio::time::Instant::now() + std::time::Duration::from_millis(RESERVE_GATHER_MS)).min(until),
                    );
                }
            }
            Ok(Some(Err(status))) => return status_response(status),
            Ok(None) | Err(_) => break,
        }
    }
    drop(stream);
    deliveries.truncate(max as usize);
    let deliveries: Vec<PulledJson> = deliveries.iter().map(PulledJson::from_proto).collect();
    Json(json!({ "deliveries": deliveries })).into_response()
}

/// Most DEAD timers one `all_dead` redrive call handles (`limit`).
const REDRIVE_ALL_MAX: u32 = 10_000;

/// `POST /v1/namespaces/{namespace}:redrive`.
async fn namespace_action(State(s): State<HttpState>, Path(namespace): Path<String>, body: Bytes) -> Response {
    let Some(namespace) = namespace.strip_suffix(":redrive") else {
        return error_response(tonic::Code::NotFound, "no such route; did you mean {namespace}:redrive", "");
    };
    let req: RedriveJson = match parse(&body) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    match (req.ids.is_empty(), req.all_dead) {
        (true, false) => return error_response(tonic::Code::InvalidArgument, "give ids, or all_dead: true", "ids"),
        (false, true) => {
            return error_response(tonic::Code::InvalidArgument, "give ids or all_dead, not both", "all_dead");
        }
        _ => {}
    }
    if !req.dead_reason.is_empty() && !req.all_dead {
        return error_response(tonic::Code::InvalidArgument, "dead_reason goes with all_dead", "dead_reason");
    }
    let limit = req.limit.unwrap_or(1_000);
    if limit == 0 || limit > REDRIVE_ALL_MAX {
        return error_response(tonic::Code::InvalidArgument, &format!("limit must be 1 to {REDRIVE_ALL_MAX}"), "limit");
    }
    // The ids: as given, or the namespace's DEAD timers, page by page.
    let mut ids = req.ids;
    let mut more = false;
    if req.all_dead {
        let mut page_token = String::new();
        loop {
            let want = (limit as usize - ids.len()).min(1_000) as u32;
            let list = pb::ListTimersRequest {
                namespace: namespace.to_string(),
                state: pb::timer::State::Dead as i32,
                dead_reason: req.dead_reason.clone(),
                page_size: want,
                page_token,
                ..Default::default()
            };
            let page = match s.timers.list_timers(rpc(list)).await {
                Ok(resp) => resp.into_inner(),
                Err(status) => return status_response(status),
            };
            ids.extend(page.timers.into_iter().map(|t| t.id));
            page_token = page.next_page_token;
            if page_token.is_empty() {
                break;
            }
            if ids.len() >= limit as usize {
                more = true;
                break;
            }
        }
    }
    let mut counts = [0u64; 5];
    let mut results = Vec::new();
    for chunk in ids.chunks(s.node.config.limits.max_batch.max(1)) {
        let request = pb::RedriveTimersRequest { namespace: namespace.to_string(), ids: chunk.to_vec() };
        let resp = match s.timers.redrive_timers(rpc(request)).await {
            Ok(resp) => resp.into_inner(),
            Err(status) => return status_response(status),
        };
        for r in resp.results {
            counts[(r.outcome as usize).min(4)] += 1;
            let outcome = pb::redrive_result::Outcome::try_from(r.outcome).map(|o| o.as_str_name()).unwrap_or("?");
            let mut item = json!({ "id": r.id, "outcome": outcome });
            if let Some(t) = &r.timer {
                item["generation"] = json!(t.generation);
                item["state"] = json!(tocsin_contract::json::state_name(t.state));
            }
            if let Some(e) = &r.error {
                item["error"] = json!(ErrorJson::from_info(e));
            }
            results.push(item);
        }
    }
    Json(json!({
        "redriven": counts[1],
        "not_dead": counts[2],
        "not_found": counts[3],
        "failed": counts[4],
        "more": more,
        "results": results,
    }))
    .into_response()
}

async fn cancel(State(s): State<HttpState>, Path((namespace, id)): Path<(String, String)>) -> Response {
    let key = format!("{namespace}/{id}");
    match s.timers.cancel_timer(rpc(pb::CancelTimerRequest { namespace, id })).await {
        Ok(resp) => {
            let resp = resp.into_inner();
            let outcome = pb::cancel_timer_response::Outcome::try_from(resp.outcome)
                .map(|o| o.as_str_name())
                .unwrap_or("OUTCOME_UNSPECIFIED");
            let mut body = json!({ "outcome": outcome });
            if let Some(timer) = &resp.timer {
                body["timer"] = json!(TimerJson::from_proto(timer));
            }
            if let Some(fire) = &resp.fire {
                body["epoch"] = json!(fire.epoch);
                body["fire_id"] = json!(fire.fire_id);
                body["attempt"] = json!(fire.attempt);
            }
            if resp.outcome == pb::cancel_timer_response::Outcome::CancelledWhileFiring as i32 {
                body["attempt_in_flight"] = json!(resp.attempt_in_flight);
            }
            if resp.outcome == pb::cancel_timer_response::Outcome::NotFound as i32 {
                body["error"] = json!(ErrorJson {
                    code: codes::code_name(tonic::Code::NotFound).into(),
                    message: format!("no timer {key}"),
                    ..ErrorJson::default()
                });
                return (codes::http_status(tonic::Code::NotFound), Json(body)).into_response();
            }
            Json(body).into_response()
        }
        Err(status) => status_response(status),
    }
}

/// `POST /v1/timers/{namespace}/{id}:reschedule`.
async fn action(State(s): State<HttpState>, Path((namespace, id)): Path<(String, String)>, body: Bytes) -> Response {
    let Some(id) = id.strip_suffix(":reschedule") else {
        return error_response(tonic::Code::NotFound, "no such route; did you mean {id}:reschedule", "");
    };
    let req: RescheduleJson = match parse(&body) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if let Some(resp) = fire_time_error(req.fire_at_ms, req.delay_ms, "") {
        return resp;
    }
    let fire_time = match (req.fire_at_ms, req.delay_ms) {
        (Some(at), _) => Some(pb::reschedule_timer_request::FireTime::FireAtMs(at)),
        (None, Some(d)) => Some(pb::reschedule_timer_request::FireTime::DelayMs(d)),
        (None, None) => None,
    };
    let request = pb::RescheduleTimerRequest {
        namespace,
        id: id.to_string(),
        expected_generation: req.expected_generation,
        fire_time,
    };
    match s.timers.reschedule_timer(rpc(request)).await {
        Ok(resp) => {
            Json(json!({ "timer": resp.into_inner().timer.as_ref().map(TimerJson::from_proto) })).into_response()
        }
        Err(status) => status_response(status),
    }
}

async fn list(
    State(s): State<HttpState>,
    Path(namespace): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let request = match tocsin_contract::query::list_timers(&namespace, &query) {
        Ok(request) => request,
        Err(e) => return error_response(tonic::Code::InvalidArgument, &e.message, &e.field),
    };
    match s.timers.list_timers(rpc(request)).await {
        Ok(resp) => {
            let resp = resp.into_inner();
            let timers: Vec<TimerJson> = resp.timers.iter().map(TimerJson::from_proto).collect();
            Json(json!({ "timers": timers, "next_page_token": resp.next_page_token })).into_response()
        }
        Err(status) => status_response(status),
    }
}

async fn horizon(State(s): State<HttpState>, Path(namespace): Path<String>) -> Response {
    match s.timers.get_horizon(rpc(pb::GetHorizonRequest { namespace })).await {
        Ok(resp) => {
            let h = resp.into_inner();
            Json(json!({
                "as_of_ms": h.as_of_ms,
                "overdue": h.overdue,
                "next_minute": h.next_minute,
                "next_hour": h.next_hour,
                "next_day": h.next_day,
                "bucket_ms": h.bucket_ms,
                "next_hour_by_minute": h.next_hour_by_minute,
            }))
            .into_response()
        }
        Err(status) => status_response(status),
    }
}

async fn cluster(State(s): State<HttpState>) -> Response {
    // Any known token may read the cluster (checked on the way in).
    let info = s.admin.cluster_info().await;
    let nodes: Vec<serde_json::Value> = info
        .nodes
        .iter()
        .map(|n| {
            json!({
                "node_id": n.node_id,
                "grpc_addr": n.grpc_addr,
                "http_addr": n.http_addr,
                "peer_addr": n.peer_addr,
                "state": pb::node_info::State::try_from(n.state).map(|s| s.as_str_name()).unwrap_or("STATE_UNSPECIFIED"),
            })
        })
        .collect();
    let shards: Vec<serde_json::Value> = info
        .shards
        .iter()
        .map(|s| {
            json!({
                "shard": s.shard,
                "replicas": s.replicas,
                "learners": s.learners,
                "leader": s.leader,
                "term": s.term,
                "epoch": s.epoch,
                "committed_index": s.committed_index,
                "applied_index": s.applied_index,
                "pending_timers": s.pending_timers,
                "firing_timers": s.firing_timers,
            })
        })
        .collect();
    Json(json!({
        "node_id": info.node_id,
        "map_epoch": info.map_epoch,
        "num_shards": info.num_shards,
        "nodes": nodes,
        "shards": shards,
    }))
    .into_response()
}

/// Ready when the node can serve requests (`NodeState::not_ready_reason`).
async fn ready(State(s): State<HttpState>) -> Response {
    match s.node.not_ready_reason() {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn metrics_text(State(s): State<HttpState>) -> Response {
    // The gauges read shard meta from RocksDB: off the async workers.
    let node = s.node.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || node.refresh_gauges()).await {
        tracing::warn!(error = %e, "refreshing the gauges failed");
    }
    let text = s.node.metrics.as_ref().map(|h| h.render()).unwrap_or_default();
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}
