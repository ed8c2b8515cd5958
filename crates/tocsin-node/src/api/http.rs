//! The HTTP/JSON mirror of the `TimerService`, plus health, readiness,
//! Prometheus metrics and the API's OpenAPI 3.1 document.
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
//! | `GET /openapi.json` | this API's OpenAPI 3.1 document ([`ApiDoc`]) |
//! | `GET /ui`, `/ui/…` | the web console (`crate::api::console`) |
//!
//! The routes are a table (`API`, mounted by `rest::mount`; [`routes`]
//! lists them with the console's), and each handler carries its OpenAPI
//! description (`#[utoipa::path]`), its bodies' schemas generated from the
//! contract's JSON types: the end-to-end test `openapi` checks that every
//! route in the table is described and that real responses match.
//!
//! Bodies are parsed into the generated proto types and handed to the same
//! [`TimerApi`] as gRPC. Every error, whoever refuses the request (the API,
//! the JSON parser, a path or query the route cannot take, an unknown
//! route, a method the path does not serve, the body limit), is
//! `{"error": {"code", "message", "field", "leader", …}}` with the HTTP
//! status of the gRPC code (`crate::api::rest`). A query parameter a route
//! does not take is refused, not ignored. The body size is checked while
//! reading, before the JSON is parsed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::LazyLock;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::on;
use tocsin_contract::codes;
use tocsin_contract::json::AttemptJson;
use tocsin_contract::json::AttemptsJson;
use tocsin_contract::json::BatchCreatedJson;
use tocsin_contract::json::BatchResultJson;
use tocsin_contract::json::CancelledJson;
use tocsin_contract::json::ClusterJson;
use tocsin_contract::json::CreateTimerJson;
use tocsin_contract::json::CreateTimersJson;
use tocsin_contract::json::CreatedJson;
use tocsin_contract::json::DeliveryJson;
use tocsin_contract::json::ErrorBodyJson;
use tocsin_contract::json::ErrorJson;
use tocsin_contract::json::HorizonJson;
use tocsin_contract::json::NodeJson;
use tocsin_contract::json::PulledJson;
use tocsin_contract::json::RedriveJson;
use tocsin_contract::json::RedriveResultJson;
use tocsin_contract::json::RedrivenJson;
use tocsin_contract::json::RescheduleJson;
use tocsin_contract::json::ReserveJson;
use tocsin_contract::json::ReservedJson;
use tocsin_contract::json::SettleJson;
use tocsin_contract::json::SettleResultJson;
use tocsin_contract::json::SettledJson;
use tocsin_contract::json::ShardJson;
use tocsin_contract::json::TimerBodyJson;
use tocsin_contract::json::TimerJson;
use tocsin_contract::json::TimerPageJson;
use tocsin_contract::query::LIST_PARAMS;
use tocsin_contract::query::ListTimersParams;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::timer_service_server::TimerService;
use utoipa::OpenApi;

use crate::api::admin::AdminApi;
use crate::api::parse;
use crate::api::request;
use crate::api::request::rpc;
use crate::api::rest::ApiBody;
use crate::api::rest::ApiErrors;
use crate::api::rest::ApiPath;
use crate::api::rest::ApiQuery;
use crate::api::rest::BearerAuth;
use crate::api::rest::Mount;
use crate::api::rest::NamespacePath;
use crate::api::rest::Route;
use crate::api::rest::TimerPath;
use crate::api::rest::TopicPath;
use crate::api::rest::error_response;
use crate::api::rest::parse_json as parse;
use crate::api::rest::status_response;
use crate::api::timers::TimerApi;
use crate::control::state::NodeState;
use crate::error::NodeError;

#[derive(Clone)]
struct HttpState {
    timers: TimerApi,
    admin: AdminApi,
    node: Arc<NodeState>,
}

/// Every route of the JSON API, probes and metrics. Routes with `verbs`
/// are one handler telling custom methods apart by the path's suffix
/// (`…/{id}:reschedule`); the OpenAPI document describes each verb.
const API: &[Mount<HttpState>] = &[
    Mount { route: Route { method: "POST", path: "/v1/timers", verbs: &[], query: &[] }, handler: |m| on(m, create) },
    Mount {
        route: Route { method: "POST", path: "/v1/timers:batch", verbs: &[], query: &[] },
        handler: |m| on(m, create_batch),
    },
    Mount {
        route: Route { method: "GET", path: "/v1/timers/{namespace}", verbs: &[], query: &LIST_PARAMS },
        handler: |m| on(m, list),
    },
    Mount {
        route: Route { method: "GET", path: "/v1/timers/{namespace}/{id}", verbs: &[], query: &[] },
        handler: |m| on(m, get_timer),
    },
    Mount {
        route: Route { method: "DELETE", path: "/v1/timers/{namespace}/{id}", verbs: &[], query: &[] },
        handler: |m| on(m, cancel),
    },
    Mount {
        route: Route { method: "POST", path: "/v1/timers/{namespace}/{id}", verbs: &["reschedule"], query: &[] },
        handler: |m| on(m, timer_action),
    },
    Mount {
        route: Route { method: "GET", path: "/v1/timers/{namespace}/{id}/attempts", verbs: &[], query: &[] },
        handler: |m| on(m, attempts),
    },
    Mount {
        route: Route { method: "POST", path: "/v1/namespaces/{namespace}", verbs: &["redrive"], query: &[] },
        handler: |m| on(m, namespace_action),
    },
    Mount {
        route: Route { method: "GET", path: "/v1/namespaces/{namespace}/horizon", verbs: &[], query: &[] },
        handler: |m| on(m, horizon),
    },
    Mount {
        route: Route {
            method: "POST",
            path: "/v1/namespaces/{namespace}/topics/{topic}",
            verbs: &["reserve", "ack", "nack"],
            query: &[],
        },
        handler: |m| on(m, topic_action),
    },
    Mount { route: Route { method: "GET", path: "/v1/cluster", verbs: &[], query: &[] }, handler: |m| on(m, cluster) },
    Mount { route: Route { method: "GET", path: "/healthz", verbs: &[], query: &[] }, handler: |m| on(m, healthz) },
    Mount { route: Route { method: "GET", path: "/readyz", verbs: &[], query: &[] }, handler: |m| on(m, ready) },
    Mount {
        route: Route { method: "GET", path: "/metrics", verbs: &[], query: &[] },
        handler: |m| on(m, metrics_text),
    },
    Mount {
        route: Route { method: "GET", path: "/openapi.json", verbs: &[], query: &[] },
        handler: |m| on(m, openapi_json),
    },
];

/// Every route a node's HTTP port serves: the API's and the console's.
pub fn routes() -> Vec<Route> {
    API.iter().map(|m| m.route).chain(crate::api::console::PAGES.iter().map(|m| m.route)).collect()
}

/// The OpenAPI document: every operation of `API` and of the console,
/// the schemas generated from the contract's JSON types.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tocsin",
        description = "The HTTP/JSON API of a Tocsin node: durable timers that fire once, \
            replicated with Raft. It mirrors the gRPC `tocsin.v1.TimerService`: any node answers, \
            forwarding to the timer's shard leader. Every error is `{\"error\": {\"code\", \
            \"message\", \"field\", …}}` with the HTTP status of the gRPC code; a query parameter \
            an operation does not list is refused. With tokens on, send `Authorization: Bearer …`."
    ),
    paths(
        create,
        create_batch,
        list,
        get_timer,
        cancel,
        reschedule,
        attempts,
        redrive,
        horizon,
        reserve,
        ack,
        nack,
        cluster,
        healthz,
        ready,
        metrics_text,
        openapi_json,
        crate::api::console::cluster,
        crate::api::console::namespace,
        crate::api::console::search,
        crate::api::console::timer,
        crate::api::console::login_form,
        crate::api::console::login,
    ),
    components(schemas(ErrorBodyJson, DeliveryJson)),
    modifiers(&BearerAuth),
    tags(
        (name = "timers", description = "Create, read, reschedule and cancel timers"),
        (name = "pull", description = "Pull delivery: reserve fired timers of a topic, then ack or nack them"),
        (name = "namespaces", description = "A namespace's horizon and its DEAD timers"),
        (name = "operations", description = "The cluster, probes, metrics and this document"),
        (name = "console", description = "The web console's HTML pages (for a browser)"),
    )
)]
pub struct ApiDoc;

/// The document as served, built once.
static OPENAPI_JSON: LazyLock<Bytes> =
    LazyLock::new(|| Bytes::from(ApiDoc::openapi().to_pretty_json().expect("the OpenAPI document serializes")));

/// The HTTP router for a node.
pub fn router(node: Arc<NodeState>) -> Router {
    let max_body = node.config.admission.max_request_bytes;
    let state = HttpState { timers: TimerApi::new(node.clone()), admin: AdminApi::new(node.clone()), node };
    crate::api::rest::mount(Router::new(), API)
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
        .method_not_allowed_fallback(crate::api::rest::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.node.clone(), carry_authorization))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::Extension(crate::api::rest::BodyLimit(max_body)))
        .layer(axum::middleware::map_response(move |resp: Response| async move {
            crate::api::rest::json_413(resp, max_body)
        }))
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
/// token's scopes. Probes, metrics and the OpenAPI document stay open.
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

/// Create a timer.
///
/// Exactly one of `fire_at_ms` and `delay_ms` (a recurring timer may give
/// neither), and a callback. Repeating a create with the same spec is
/// answered 200 with the timer; a different spec under the same id is a
/// 409 ALREADY_EXISTS.
#[utoipa::path(
    post,
    path = "/v1/timers",
    operation_id = "create_timer",
    tag = "timers",
    request_body = CreateTimerJson,
    responses(
        (status = 201, description = "Created", body = CreatedJson),
        (status = 200, description = "An identical timer was already there", body = CreatedJson),
        ApiErrors,
    )
)]
async fn create(State(s): State<HttpState>, ApiBody(body): ApiBody) -> Response {
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
            (status, Json(CreatedJson { timer, created: resp.created })).into_response()
        }
        Err(status) => status_response(status),
    }
}

/// Create up to 1,000 timers.
///
/// Each timer succeeds or fails on its own: `results[i]` is `ok` or
/// `error` for `timers[i]`. A body that cannot be parsed, or a fire time
/// rule broken by any timer, refuses the whole batch.
#[utoipa::path(
    post,
    path = "/v1/timers:batch",
    operation_id = "create_timers",
    tag = "timers",
    request_body = CreateTimersJson,
    responses((status = 200, description = "One result per timer", body = BatchCreatedJson), ApiErrors)
)]
async fn create_batch(State(s): State<HttpState>, ApiBody(body): ApiBody) -> Response {
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
            let results = resp
                .into_inner()
                .results
                .into_iter()
                .map(|r| match r.result {
                    Some(pb::create_timer_result::Result::Ok(ok)) => BatchResultJson {
                        ok: Some(CreatedJson {
                            timer: ok.timer.as_ref().map(TimerJson::from_proto),
                            created: ok.created,
                        }),
                        error: None,
                    },
                    Some(pb::create_timer_result::Result::Error(info)) => {
                        BatchResultJson { ok: None, error: Some(ErrorJson::from_info(&info)) }
                    }
                    None => BatchResultJson { ok: None, error: None },
                })
                .collect();
            Json(BatchCreatedJson { results }).into_response()
        }
        Err(status) => status_response(status),
    }
}

/// Get a timer.
#[utoipa::path(
    get,
    path = "/v1/timers/{namespace}/{id}",
    operation_id = "get_timer",
    tag = "timers",
    params(TimerPath),
    responses((status = 200, description = "The timer", body = TimerBodyJson), ApiErrors)
)]
async fn get_timer(State(s): State<HttpState>, ApiPath(p): ApiPath<TimerPath>) -> Response {
    let request = pb::GetTimerRequest { namespace: p.namespace, id: p.id, include_attempts: false };
    match s.timers.get_timer(rpc(request)).await {
        Ok(resp) => {
            Json(TimerBodyJson { timer: resp.into_inner().timer.as_ref().map(TimerJson::from_proto) }).into_response()
        }
        Err(status) => status_response(status),
    }
}

/// A timer's delivery attempts (the latest 32, oldest first).
#[utoipa::path(
    get,
    path = "/v1/timers/{namespace}/{id}/attempts",
    operation_id = "get_attempts",
    tag = "timers",
    params(TimerPath),
    responses((status = 200, description = "The attempt history", body = AttemptsJson), ApiErrors)
)]
async fn attempts(State(s): State<HttpState>, ApiPath(p): ApiPath<TimerPath>) -> Response {
    let request = pb::GetTimerRequest { namespace: p.namespace, id: p.id, include_attempts: true };
    match s.timers.get_timer(rpc(request)).await {
        Ok(resp) => {
            let timer = resp.into_inner().timer.unwrap_or_default();
            let attempts: Vec<AttemptJson> = timer.attempts.iter().map(AttemptJson::from_proto).collect();
            Json(AttemptsJson {
                namespace: timer.namespace,
                id: timer.id,
                state: tocsin_contract::json::state_name(timer.state),
                generation: timer.generation,
                attempts,
            })
            .into_response()
        }
        Err(status) => status_response(status),
    }
}

/// Longest a reserve call waits for its first delivery.
const RESERVE_WAIT_MAX_MS: u64 = 30_000;
/// The least a reserve call waits (see [`reserve_deliveries`]).
const RESERVE_RECORD_MS: u64 = 200;
/// After the first batch, how long a reserve call waits for more (other
/// nodes' shards) before it answers.
const RESERVE_GATHER_MS: u64 = 10;

/// `POST /v1/namespaces/{namespace}/topics/{topic}:reserve`, `:ack`, `:nack`.
async fn topic_action(State(s): State<HttpState>, ApiPath(p): ApiPath<TopicPath>, ApiBody(body): ApiBody) -> Response {
    let TopicPath { namespace, topic } = p;
    if let Some(topic) = topic.strip_suffix(":reserve") {
        return reserve_deliveries(&s, namespace, topic.to_string(), &body).await;
    }
    match topic.rsplit_once(':') {
        Some((_, "ack")) => settle(&s, namespace, &body, false).await,
        Some((_, "nack")) => settle(&s, namespace, &body, true).await,
        _ => error_response(tonic::Code::NotFound, "no such route; use {topic}:reserve, :ack or :nack", ""),
    }
}

/// Acknowledge pull deliveries: each timer is DELIVERED.
///
/// Name each delivery by the `id`, `fire_id` and `attempt` its reserve
/// returned. A reservation that expired (or was already settled) is STALE.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/topics/{topic}:ack",
    operation_id = "ack",
    tag = "pull",
    params(TopicPath),
    request_body = SettleJson,
    responses((status = 200, description = "One result per delivery", body = SettledJson), ApiErrors)
)]
#[allow(dead_code)] // Described here, served by `topic_action`.
fn ack() {}

/// Give pull deliveries back: each is offered again after `delay_ms` (or
/// the timer's backoff), as a failed attempt with `reason`.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/topics/{topic}:nack",
    operation_id = "nack",
    tag = "pull",
    params(TopicPath),
    request_body = SettleJson,
    responses((status = 200, description = "One result per delivery", body = SettledJson), ApiErrors)
)]
#[allow(dead_code)] // Described here, served by `topic_action`.
fn nack() {}

async fn settle(s: &HttpState, namespace: String, body: &Bytes, nack: bool) -> Response {
    let req: SettleJson = match parse(body) {
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
            let results = ids
                .into_iter()
                .zip(results)
                .map(|(id, r)| {
                    let status = pb::ack_result::Status::try_from(r.status).map(|s| s.as_str_name()).unwrap_or("?");
                    SettleResultJson { id, status }
                })
                .collect();
            Json(SettledJson { results }).into_response()
        }
        Err(status) => status_response(status),
    }
}

/// Reserve deliveries of a pull topic (a long poll).
///
/// Up to `max` fired timers of the topic, each reserved for `ttr_ms`;
/// waits up to `wait_ms` for the first. An empty body takes the defaults.
/// Ack or nack each before its reservation ends, or it is offered again.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/topics/{topic}:reserve",
    operation_id = "reserve",
    tag = "pull",
    params(TopicPath),
    request_body(content = ReserveJson, description = "Optional: an empty body takes the defaults"),
    responses((status = 200, description = "The reserved deliveries (maybe none)", body = ReservedJson), ApiErrors)
)]
#[allow(dead_code)] // Described here, served by `topic_action`.
fn reserve() {}

/// A long-poll reserve: opens a `Reserve` stream like a gRPC consumer
/// (every node's shards), waits up to `wait_ms` for the first batch, takes
/// what else arrives within [`RESERVE_GATHER_MS`] up to `max`, and closes
/// it. Each node reserves at most `max` for the call; deliveries reserved
/// after it answered (a node's batch that came later) are offered again
/// once their time-to-run ends.
async fn reserve_deliveries(s: &HttpState, namespace: String, topic: String, body: &Bytes) -> Response {
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
    Json(ReservedJson { deliveries }).into_response()
}

/// Most DEAD timers one `all_dead` redrive call handles (`limit`).
const REDRIVE_ALL_MAX: u32 = 10_000;

/// `POST /v1/namespaces/{namespace}:redrive`.
async fn namespace_action(
    State(s): State<HttpState>,
    ApiPath(p): ApiPath<NamespacePath>,
    ApiBody(body): ApiBody,
) -> Response {
    let Some(namespace) = p.namespace.strip_suffix(":redrive") else {
        return error_response(tonic::Code::NotFound, "no such route; did you mean {namespace}:redrive", "");
    };
    redrive_timers(&s, namespace, &body).await
}

/// Start DEAD timers over.
///
/// Either `ids`, or `all_dead: true` for up to `limit` (default 1,000, at
/// most 10,000) of the namespace's DEAD timers, of one `dead_reason` if
/// given. Each is SCHEDULED again to fire now, under a new generation.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}:redrive",
    operation_id = "redrive_timers",
    tag = "namespaces",
    params(NamespacePath),
    request_body = RedriveJson,
    responses((status = 200, description = "Counts and one result per timer", body = RedrivenJson), ApiErrors)
)]
#[allow(dead_code)] // Described here, served by `namespace_action`.
fn redrive() {}

async fn redrive_timers(s: &HttpState, namespace: &str, body: &Bytes) -> Response {
    let req: RedriveJson = match parse(body) {
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
            results.push(RedriveResultJson {
                id: r.id,
                outcome,
                generation: r.timer.as_ref().map(|t| t.generation),
                state: r.timer.as_ref().map(|t| tocsin_contract::json::state_name(t.state)),
                error: r.error.as_ref().map(ErrorJson::from_info),
            });
        }
    }
    Json(RedrivenJson {
        redriven: counts[1],
        not_dead: counts[2],
        not_found: counts[3],
        failed: counts[4],
        more,
        results,
    })
    .into_response()
}

/// Cancel a timer.
///
/// The outcome says whether this call cancelled it, an earlier one did, or
/// it had already fired (`fire` facts then). A timer that does not exist
/// is a 404 with outcome NOT_FOUND and the `error` shape.
#[utoipa::path(
    delete,
    path = "/v1/timers/{namespace}/{id}",
    operation_id = "cancel_timer",
    tag = "timers",
    params(TimerPath),
    responses(
        (status = 200, description = "What the cancel did", body = CancelledJson),
        (status = 404, description = "No such timer (outcome NOT_FOUND, with `error`)", body = CancelledJson),
        ApiErrors,
    )
)]
async fn cancel(State(s): State<HttpState>, ApiPath(p): ApiPath<TimerPath>) -> Response {
    let key = format!("{}/{}", p.namespace, p.id);
    match s.timers.cancel_timer(rpc(pb::CancelTimerRequest { namespace: p.namespace, id: p.id })).await {
        Ok(resp) => {
            let resp = resp.into_inner();
            let outcome = pb::cancel_timer_response::Outcome::try_from(resp.outcome)
                .map(|o| o.as_str_name())
                .unwrap_or("OUTCOME_UNSPECIFIED");
            let mut body = CancelledJson {
                outcome,
                timer: resp.timer.as_ref().map(TimerJson::from_proto),
                epoch: resp.fire.as_ref().map(|f| f.epoch),
                fire_id: resp.fire.as_ref().map(|f| f.fire_id.clone()),
                attempt: resp.fire.as_ref().map(|f| f.attempt),
                attempt_in_flight: None,
                error: None,
            };
            if resp.outcome == pb::cancel_timer_response::Outcome::CancelledWhileFiring as i32 {
                body.attempt_in_flight = Some(resp.attempt_in_flight);
            }
            if resp.outcome == pb::cancel_timer_response::Outcome::NotFound as i32 {
                body.error = Some(ErrorJson {
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
async fn timer_action(State(s): State<HttpState>, ApiPath(p): ApiPath<TimerPath>, ApiBody(body): ApiBody) -> Response {
    let Some(id) = p.id.strip_suffix(":reschedule") else {
        return error_response(tonic::Code::NotFound, "no such route; did you mean {id}:reschedule", "");
    };
    reschedule_timer(&s, p.namespace, id.to_string(), &body).await
}

/// Reschedule a SCHEDULED timer.
///
/// `expected_generation` (from the timer) guards against a concurrent
/// change: a different one is a 412 FAILED_PRECONDITION. Give the new fire
/// time as `fire_at_ms` or `delay_ms`.
#[utoipa::path(
    post,
    path = "/v1/timers/{namespace}/{id}:reschedule",
    operation_id = "reschedule_timer",
    tag = "timers",
    params(TimerPath),
    request_body = RescheduleJson,
    responses((status = 200, description = "The timer, rescheduled", body = TimerBodyJson), ApiErrors)
)]
#[allow(dead_code)] // Described here, served by `timer_action`.
fn reschedule() {}

async fn reschedule_timer(s: &HttpState, namespace: String, id: String, body: &Bytes) -> Response {
    let req: RescheduleJson = match parse(body) {
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
    let request = pb::RescheduleTimerRequest { namespace, id, expected_generation: req.expected_generation, fire_time };
    match s.timers.reschedule_timer(rpc(request)).await {
        Ok(resp) => {
            Json(TimerBodyJson { timer: resp.into_inner().timer.as_ref().map(TimerJson::from_proto) }).into_response()
        }
        Err(status) => status_response(status),
    }
}

/// List a namespace's timers, a page at a time.
///
/// Filters combine; pass `next_page_token` back as `page_token` for the
/// next page. An unknown parameter is refused (a misspelt filter would
/// otherwise list everything).
#[utoipa::path(
    get,
    path = "/v1/timers/{namespace}",
    operation_id = "list_timers",
    tag = "timers",
    params(NamespacePath, ListTimersParams),
    responses((status = 200, description = "A page of timers", body = TimerPageJson), ApiErrors)
)]
async fn list(
    State(s): State<HttpState>,
    ApiPath(p): ApiPath<NamespacePath>,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
) -> Response {
    let request = match tocsin_contract::query::list_timers(&p.namespace, &query) {
        Ok(request) => request,
        Err(e) => return error_response(tonic::Code::InvalidArgument, &e.message, &e.field),
    };
    match s.timers.list_timers(rpc(request)).await {
        Ok(resp) => {
            let resp = resp.into_inner();
            let timers: Vec<TimerJson> = resp.timers.iter().map(TimerJson::from_proto).collect();
            Json(TimerPageJson { timers, next_page_token: resp.next_page_token }).into_response()
        }
        Err(status) => status_response(status),
    }
}

/// How many of a namespace's timers fire soon.
///
/// Overdue, in the next minute, hour and day, and the next hour per
/// minute, counted over every shard.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/horizon",
    operation_id = "get_horizon",
    tag = "namespaces",
    params(NamespacePath),
    responses((status = 200, description = "The counts", body = HorizonJson), ApiErrors)
)]
async fn horizon(State(s): State<HttpState>, ApiPath(p): ApiPath<NamespacePath>) -> Response {
    match s.timers.get_horizon(rpc(pb::GetHorizonRequest { namespace: p.namespace })).await {
        Ok(resp) => {
            let h = resp.into_inner();
            Json(HorizonJson {
                as_of_ms: h.as_of_ms,
                overdue: h.overdue,
                next_minute: h.next_minute,
                next_hour: h.next_hour,
                next_day: h.next_day,
                bucket_ms: h.bucket_ms,
                next_hour_by_minute: h.next_hour_by_minute,
            })
            .into_response()
        }
        Err(status) => status_response(status),
    }
}

/// The cluster: its nodes and shards, as this node sees them.
#[utoipa::path(
    get,
    path = "/v1/cluster",
    operation_id = "get_cluster",
    tag = "operations",
    responses((status = 200, description = "Nodes and shards", body = ClusterJson), ApiErrors)
)]
async fn cluster(State(s): State<HttpState>) -> Response {
    // Any known token may read the cluster (checked on the way in).
    let info = s.admin.cluster_info().await;
    let nodes = info
        .nodes
        .iter()
        .map(|n| NodeJson {
            node_id: n.node_id,
            grpc_addr: n.grpc_addr.clone(),
            http_addr: n.http_addr.clone(),
            peer_addr: n.peer_addr.clone(),
            state: pb::node_info::State::try_from(n.state).map(|s| s.as_str_name()).unwrap_or("STATE_UNSPECIFIED"),
        })
        .collect();
    let shards = info
        .shards
        .iter()
        .map(|s| ShardJson {
            shard: s.shard,
            replicas: s.replicas.clone(),
            learners: s.learners.clone(),
            leader: s.leader,
            term: s.term,
            epoch: s.epoch,
            committed_index: s.committed_index,
            applied_index: s.applied_index,
            pending_timers: s.pending_timers,
            firing_timers: s.firing_timers,
        })
        .collect();
    Json(ClusterJson { node_id: info.node_id, map_epoch: info.map_epoch, num_shards: info.num_shards, nodes, shards })
        .into_response()
}

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    security(()),
    responses((status = 200, description = "`ok`", body = String, content_type = "text/plain"), ApiErrors)
)]
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: the node can serve requests (`NodeState::not_ready_reason`).
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "`ready`", body = String, content_type = "text/plain"),
        (status = 503, description = "Why it is not ready", body = String, content_type = "text/plain"),
        ApiErrors,
    )
)]
async fn ready(State(s): State<HttpState>) -> Response {
    match s.node.not_ready_reason() {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// Prometheus metrics, in the text exposition format.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    security(()),
    responses((status = 200, description = "The metrics", body = String, content_type = "text/plain"), ApiErrors)
)]
async fn metrics_text(State(s): State<HttpState>) -> Response {
    // The gauges read shard meta from RocksDB: off the async workers.
    let node = s.node.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || node.refresh_gauges()).await {
        tracing::warn!(error = %e, "refreshing the gauges failed");
    }
    let text = s.node.metrics.as_ref().map(|h| h.render()).unwrap_or_default();
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// This document: the API in OpenAPI 3.1, for client generators and tools.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    security(()),
    responses((status = 200, description = "The OpenAPI document", body = Object), ApiErrors)
)]
async fn openapi_json() -> Response {
    ([("content-type", "application/json")], OPENAPI_JSON.clone()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each route of the table is described in the document, under each of
    /// its verbs, and the document describes nothing that is not served.
    /// (The end-to-end test `openapi` checks the same against a live node,
    /// with real responses.)
    #[test]
    fn every_route_is_described() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut served = std::collections::BTreeSet::new();
        for route in routes() {
            for path in route.operation_paths() {
                served.insert((path, route.method.to_ascii_lowercase()));
            }
        }
        let mut described = std::collections::BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                described.insert((path.clone(), method.clone()));
            }
        }
        assert_eq!(served, described);
    }
}
