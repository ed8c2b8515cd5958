//! The HTTP API's plumbing, shared by the JSON API ([`crate::api::http`])
//! and the web console ([`crate::api::console`]):
//!
//! - the route tables: each path and method a node serves, as data. The
//!   router is built from them ([`mount`]) and the end-to-end tests read
//!   them ([`Route`]), so a route cannot be served without the OpenAPI
//!   document's test knowing of it;
//! - the one JSON error shape (`{"error": {"code", "message", "field", …}}`)
//!   and the extractors that answer in it when a path, a query string or a
//!   body is refused, where axum's own would answer plain text;
//! - the query check: a parameter a route does not take is refused, not
//!   ignored (a misspelt filter would otherwise list everything);
//! - what the OpenAPI document shares between operations: the path
//!   parameters, the error response, the bearer token.

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::FromRequest;
use axum::extract::FromRequestParts;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::http::Method;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::MethodFilter;
use axum::routing::MethodRouter;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tocsin_contract::codes;
use tocsin_contract::json::ErrorBodyJson;
use tocsin_contract::json::ErrorJson;
use utoipa::IntoParams;
use utoipa::openapi::ContentBuilder;
use utoipa::openapi::Ref;
use utoipa::openapi::RefOr;
use utoipa::openapi::ResponseBuilder;

/// One method on one path, as the router serves it.
#[derive(Clone, Copy, Debug)]
pub struct Route {
    /// `GET`, `POST`, `DELETE`.
    pub method: &'static str,
    /// The path as axum matches it (`/v1/timers/{namespace}/{id}`).
    pub path: &'static str,
    /// The custom methods (`reschedule` for `…/{id}:reschedule`) the
    /// handler tells apart by the last segment's suffix: axum's matcher
    /// cannot route on a suffix, the OpenAPI document names each as a path
    /// of its own. Empty: the path itself is the operation.
    pub verbs: &'static [&'static str],
    /// The query parameters it takes; any other is refused.
    pub query: &'static [&'static str],
}

impl Route {
    /// The operations' paths as the OpenAPI document writes them.
    pub fn operation_paths(&self) -> Vec<String> {
        if self.verbs.is_empty() {
            return vec![self.path.to_string()];
        }
        self.verbs.iter().map(|v| format!("{}:{v}", self.path)).collect()
    }
}

/// A route and the handler that serves it: `handler` is given the method's
/// filter, so the table states each method once.
pub struct Mount<S> {
    pub route: Route,
    pub handler: fn(MethodFilter) -> MethodRouter<S>,
}

/// Adds `mounts` to `router`, a path's methods merged into one method
/// router (axum panics on a method mounted twice). Each route refuses
/// query parameters it does not take.
pub fn mount<S: Clone + Send + Sync + 'static>(mut router: Router<S>, mounts: &[Mount<S>]) -> Router<S> {
    let mut by_path: BTreeMap<&'static str, MethodRouter<S>> = BTreeMap::new();
    for m in mounts {
        let method = Method::from_bytes(m.route.method.as_bytes()).expect("a route's method is a method");
        let filter = MethodFilter::try_from(method).expect("a route's method is routable");
        let query = m.route.query;
        let handler =
            (m.handler)(filter).route_layer(axum::middleware::from_fn(move |request: Request, next: Next| {
                known_query(query, request, next)
            }));
        let merged = match by_path.remove(m.route.path) {
            Some(existing) => existing.merge(handler),
            None => handler,
        };
        by_path.insert(m.route.path, merged);
    }
    for (path, methods) in by_path {
        router = router.route(path, methods);
    }
    router
}

/// Refuses a request whose query string names a parameter its route does
/// not take (the first such, by name, in `field`).
async fn known_query(known: &'static [&'static str], request: Request, next: Next) -> Response {
    // Decoded as axum's `Query` decodes it (a form: `+` is a space).
    let unknown = request.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .map(|(name, _)| name.into_owned())
            .filter(|name| !known.contains(&name.as_str()))
            .min()
    });
    if let Some(name) = unknown {
        let message = if known.is_empty() {
            format!("unknown query parameter {name:?}: this route takes none")
        } else {
            format!("unknown query parameter {name:?}; use {}", known.join(", "))
        };
        return error_response(tonic::Code::InvalidArgument, &message, &name);
    }
    next.run(request).await
}

/// The one JSON error shape, with the HTTP status the contract gives `code`.
pub fn error_response(code: tonic::Code, message: &str, field: &str) -> Response {
    error_with_status(codes::http_status(code), code, message, field)
}

/// The JSON error shape with a status of its own (413 for a body too large,
/// which is RESOURCE_EXHAUSTED to a gRPC client; 405 for a method a path
/// does not serve, UNIMPLEMENTED to a gRPC client).
pub fn error_with_status(status: StatusCode, code: tonic::Code, message: &str, field: &str) -> Response {
    let error = ErrorJson {
        code: codes::code_name(code).into(),
        message: message.into(),
        field: field.into(),
        ..ErrorJson::default()
    };
    (status, Json(ErrorBodyJson { error })).into_response()
}

/// A gRPC status as an HTTP error response (with `retry-after` when the
/// status says when to retry).
pub fn status_response(status: tonic::Status) -> Response {
    let info = codes::info_of(&status);
    let http = codes::http_status(status.code());
    let mut resp = (http, Json(ErrorBodyJson { error: ErrorJson::from_info(&info) })).into_response();
    if info.retry_after_ms > 0 {
        let secs = info.retry_after_ms.div_ceil(1000).to_string();
        if let Ok(v) = HeaderValue::from_str(&secs) {
            resp.headers_mut().insert("retry-after", v);
        }
    }
    resp
}

/// axum answers an oversized body with plain text (a console form reads
/// its body through axum's own extractor): give it the API's JSON error
/// shape.
pub fn json_413(resp: Response, max_body: usize) -> Response {
    if resp.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return resp;
    }
    too_large(max_body)
}

fn too_large(max_body: usize) -> Response {
    let message = format!("request body exceeds {max_body} bytes");
    error_with_status(StatusCode::PAYLOAD_TOO_LARGE, tonic::Code::ResourceExhausted, &message, "body")
}

/// A method the path does not serve: 405 (with axum's `Allow` header).
pub async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    let message = format!("{method} is not served at {}", uri.path());
    error_with_status(StatusCode::METHOD_NOT_ALLOWED, tonic::Code::Unimplemented, &message, "")
}

/// axum's `Path`, refusing in the JSON error shape (a segment that is not
/// UTF-8 once percent-decoded, say).
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(e) => {
                let message = format!("bad path: {}", e.body_text());
                // axum names the parameter between backticks.
                let field = message.split('`').nth(1).unwrap_or("path").to_string();
                Err(error_with_status(e.status(), tonic::Code::InvalidArgument, &message, &field))
            }
        }
    }
}

/// axum's `Query`, refusing in the JSON error shape (the parameters a route
/// takes are checked before, by [`mount`]).
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(e) => {
                let message = e.body_text();
                // serde names the parameter between backticks.
                let field = message.split('`').nth(1).unwrap_or("query").to_string();
                Err(error_response(tonic::Code::InvalidArgument, &message, &field))
            }
        }
    }
}

/// The body limit the HTTP router applies (`admission.max_request_bytes`),
/// as a request extension for [`ApiBody`].
#[derive(Clone, Copy, Debug)]
pub struct BodyLimit(pub usize);

/// Most bytes of a body over the limit that are read (and dropped) before
/// its 413 goes out; past it, or after [`OVERSIZE_DRAIN_TIMEOUT`], the
/// connection is closed unread.
const OVERSIZE_DRAIN_MAX_BYTES: u64 = 64 << 20;
const OVERSIZE_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The request body, whole, as bytes (the handlers parse it as JSON
/// whatever the `content-type` says: `curl -d` sends a form's). Refuses in
/// the JSON error shape: 413 over the body limit ([`BodyLimit`]), 400 if it
/// cannot be read.
///
/// A body over the limit, declared so by its `content-length` or found so
/// while reading a chunked one, is read on (and dropped) before the 413:
/// answering while the client still writes closes the connection under
/// it, and the client sees a broken pipe instead of the 413 (measured: a
/// 9 MiB body on loopback, 1 run in 3 in CI). The read goes at most to
/// [`OVERSIZE_DRAIN_MAX_BYTES`] and for [`OVERSIZE_DRAIN_TIMEOUT`], a
/// bounded lingering close as web servers do. Being an extractor, the
/// refusal is inside the route's metrics and access log.
pub struct ApiBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Some(BodyLimit(limit)) = request.extensions().get::<BodyLimit>().copied() else {
            // Outside the router (tests of one handler): axum's own limit.
            return match Bytes::from_request(request, state).await {
                Ok(bytes) => Ok(ApiBody(bytes)),
                Err(e) => Err(body_error(e.status(), &e.body_text())),
            };
        };
        let declared = request
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let mut body = request.into_body().into_data_stream();
        let mut read = Vec::new();
        let mut over = declared.is_some_and(|len| len > limit as u64);
        let mut seen = 0u64;
        if !over {
            while let Some(chunk) = futures::StreamExt::next(&mut body).await {
                let chunk = chunk.map_err(|e| body_error(StatusCode::BAD_REQUEST, &e.to_string()))?;
                seen += chunk.len() as u64;
                if read.len() + chunk.len() > limit {
                    over = true;
                    break;
                }
                read.extend_from_slice(&chunk);
            }
        }
        if !over {
            return Ok(ApiBody(Bytes::from(read)));
        }
        drop(read);
        if declared.unwrap_or(0) <= OVERSIZE_DRAIN_MAX_BYTES {
            let drain = async {
                while let Some(Ok(chunk)) = futures::StreamExt::next(&mut body).await {
                    seen += chunk.len() as u64;
                    if seen > OVERSIZE_DRAIN_MAX_BYTES {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(OVERSIZE_DRAIN_TIMEOUT, drain).await;
        }
        Err(too_large(limit))
    }
}

/// A body that could not be read: 413 over axum's limit (worded by the
/// router's `json_413`), else 400.
fn body_error(status: StatusCode, text: &str) -> Response {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return status.into_response();
    }
    let message = format!("cannot read the request body: {text}");
    let status = if status.is_client_error() { status } else { StatusCode::BAD_REQUEST };
    error_with_status(status, tonic::Code::InvalidArgument, &message, "body")
}

/// Parses a JSON body into `T`, answering 400 (with the serde message, which
/// names the field) when it does not fit.
pub fn parse_json<T: DeserializeOwned>(body: &Bytes) -> Result<T, Response> {
    if body.is_empty() {
        return Err(error_response(tonic::Code::InvalidArgument, "request body is empty", "body"));
    }
    serde_json::from_slice(body).map_err(|e| {
        let message = format!("malformed JSON: {e}");
        error_response(tonic::Code::InvalidArgument, &message, "body")
    })
}

/// A timer's key in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TimerPath {
    /// The timer's namespace.
    pub namespace: String,
    /// The timer's id within its namespace.
    pub id: String,
}

/// A namespace in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct NamespacePath {
    pub namespace: String,
}

/// A pull topic of a namespace in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TopicPath {
    pub namespace: String,
    /// The topic named by the timers' `callback.pull.topic`.
    pub topic: String,
}

/// Every operation's errors: the one JSON shape, under `default` (the
/// status is the code's: 400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403
/// PERMISSION_DENIED, 404 NOT_FOUND, 405, 409 ALREADY_EXISTS or ABORTED,
/// 412 FAILED_PRECONDITION, 413, 429 RESOURCE_EXHAUSTED with
/// `retry-after`, 503 UNAVAILABLE with the leader's address, …).
pub struct ApiErrors;

impl utoipa::IntoResponses for ApiErrors {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::response::Response>> {
        let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBodyJson"))).build();
        let response = ResponseBuilder::new()
            .description(
                "An error: the status is the code's (400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 \
                 PERMISSION_DENIED, 404 NOT_FOUND, 405 for a method the path does not serve, 409 \
                 ALREADY_EXISTS or ABORTED, 412 FAILED_PRECONDITION, 413 for a body over the limit, 429 \
                 RESOURCE_EXHAUSTED with `retry-after`, 503 UNAVAILABLE, …)",
            )
            .content("application/json", content)
            .build();
        BTreeMap::from([("default".to_string(), RefOr::T(response))])
    }
}

/// The bearer token a node with tokens on asks for (`auth.mode = tokens`):
/// optional in the document, as a node in `open` mode takes none.
pub struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::HttpAuthScheme;
        use utoipa::openapi::security::HttpBuilder;
        use utoipa::openapi::security::SecurityRequirement;
        use utoipa::openapi::security::SecurityScheme;
        let components = openapi.components.get_or_insert_with(Default::default);
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("A token from `tocsin admin token create` (tokens start `tcn_`)"))
            .build();
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
        openapi.security =
            Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new()), SecurityRequirement::default()]);
    }
}
