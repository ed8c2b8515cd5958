//! The OpenAPI document (`/openapi.json`) against a live node:
//!
//! - every route the router serves (its own table,
//!   `tocsin_node::api::http::routes`) is an operation of the document,
//!   with its method and exactly the query parameters the route takes, and
//!   the document describes nothing that is not served;
//! - real responses of every operation, successes and errors, validate
//!   against the JSON Schema the document gives for that operation and
//!   status (response objects closed: a field the document does not name
//!   fails too), and every operation has had at least one checked; every
//!   request body the node accepted is one the document allows;
//! - every way a request can be refused (malformed JSON, a body over the
//!   limit, an unknown route, a wrong method, a bad path, an unknown or bad
//!   query parameter) answers the one JSON error shape, with its status.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use serde_json::json;

use crate::support::NodeProcess;

/// Where the test's schema resource lives (a name only; nothing is fetched).
const BASE: &str = "http://tocsin.invalid/openapi.json";

/// The document, its response schemas compiled for validation, and which
/// operations real responses have been checked against.
struct Spec {
    doc: Value,
    schemas: boon::Schemas,
    /// `(method, path, status or "default" or "request")` → the compiled
    /// schema.
    compiled: BTreeMap<(String, String, String), boon::SchemaIndex>,
    error_shape: boon::SchemaIndex,
    checked: BTreeSet<(String, String)>,
}

/// Closes every object schema that lists its properties: the node's
/// responses must name no field the document does not (clients may be
/// lenient, the document must be complete).
fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            map.values_mut().for_each(close_objects);
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

impl Spec {
    fn new(doc: Value) -> Spec {
        // One JSON Schema 2020-12 resource: the components as `$defs`, and
        // each response schema beside them (`$ref`s rewritten to match).
        let mut defs = doc["components"]["schemas"].as_object().cloned().expect("components.schemas");
        let mut keys = BTreeMap::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                if let Some(schema) = op.pointer("/requestBody/content/application~1json/schema") {
                    let key = format!("request-{}", keys.len());
                    defs.insert(key.clone(), schema.clone());
                    keys.insert((method.clone(), path.clone(), "request".to_string()), key);
                }
                for (status, response) in op["responses"].as_object().expect("responses") {
                    let Some(schema) = response.pointer("/content/application~1json/schema") else { continue };
                    let key = format!("response-{}", keys.len());
                    defs.insert(key.clone(), schema.clone());
                    keys.insert((method.clone(), path.clone(), status.clone()), key);
                }
            }
        }
        let resource = json!({ "$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs });
        let text = resource.to_string().replace("\"#/components/schemas/", "\"#/$defs/");
        let mut resource: Value = serde_json::from_str(&text).unwrap();
        close_objects(&mut resource);
        let mut compiler = boon::Compiler::new();
        compiler.set_default_draft(boon::Draft::V2020_12);
        compiler.add_resource(BASE, resource).unwrap();
        let mut schemas = boon::Schemas::new();
        let mut compiled = BTreeMap::new();
        for (op, key) in keys {
            let index = compiler
                .compile(&format!("{BASE}#/$defs/{key}"), &mut schemas)
                .unwrap_or_else(|e| panic!("{op:?}: {e:#}"));
            compiled.insert(op, index);
        }
        let error_shape = compiler.compile(&format!("{BASE}#/$defs/ErrorBodyJson"), &mut schemas).unwrap();
        Spec { doc, schemas, compiled, error_shape, checked: BTreeSet::new() }
    }

    /// Checks a real response of the operation `method path` (the
    /// document's path): its status is described (or `default` is), its
    /// content type is the described one, and a JSON body validates.
    /// Returns the body, parsed if JSON.
    fn check(&mut self, method: &str, path: &str, status: u16, content_type: &str, body: &[u8]) -> Value {
        let what = format!("{method} {path} → {status}");
        let op = self.doc["paths"][path][method].clone();
        assert!(op.is_object(), "{what}: no such operation in the document");
        let status_key = if op["responses"].get(status.to_string()).is_some() {
            status.to_string()
        } else {
            assert!(op["responses"].get("default").is_some(), "{what}: status not described");
            "default".to_string()
        };
        let response = &op["responses"][&status_key];
        let essence = content_type.split(';').next().unwrap_or("").trim().to_string();
        let described: Vec<&String> = response["content"].as_object().map(|c| c.keys().collect()).unwrap_or_default();
        if described.is_empty() {
            assert!(
                body.is_empty() || essence.is_empty(),
                "{what}: a body ({content_type}) the document does not describe"
            );
        } else {
            assert!(
                described.iter().any(|d| **d == essence),
                "{what}: {content_type}, the document says {described:?}"
            );
        }
        self.checked.insert((method.to_string(), path.to_string()));
        if essence != "application/json" {
            return Value::Null;
        }
        let value: Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("{what}: not JSON ({e})"));
        let index = self.compiled[&(method.to_string(), path.to_string(), status_key)];
        if let Err(e) = self.schemas.validate(&value, index) {
            panic!("{what}: the body does not match the document:\n{e:#}\nbody: {value:#}");
        }
        value
    }

    /// Checks a request body the node accepted against the operation's
    /// request schema: the document must allow what the node takes.
    fn check_request(&self, method: &str, path: &str, body: &Value) {
        let Some(&index) = self.compiled.get(&(method.to_string(), path.to_string(), "request".to_string())) else {
            panic!("{method} {path}: a JSON body the document does not describe");
        };
        if let Err(e) = self.schemas.validate(body, index) {
            panic!("{method} {path}: an accepted request the document refuses:\n{e:#}\nbody: {body:#}");
        }
    }

    /// Checks a refusal that matched no operation: the one error shape.
    fn check_error_shape(&self, what: &str, body: &Value) {
        if let Err(e) = self.schemas.validate(body, self.error_shape) {
            panic!("{what}: not the error shape:\n{e:#}\nbody: {body:#}");
        }
    }
}

/// One HTTP exchange.
struct Answer {
    status: u16,
    content_type: String,
    allow: String,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text()))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn send(&self, method: &str, uri: &str, content_type: Option<&str>, body: Option<Vec<u8>>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{uri}", self.base));
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let resp = request.send().await.unwrap();
        let header =
            |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let (status, content_type, allow) = (resp.status().as_u16(), header("content-type"), header("allow"));
        let body = resp.bytes().await.unwrap().to_vec();
        Answer { status, content_type, allow, body }
    }

    async fn call(&self, method: &str, uri: &str, body: Option<Value>) -> Answer {
        let bytes = body.map(|b| serde_json::to_vec(&b).unwrap());
        let ct = bytes.as_ref().map(|_| "application/json");
        self.send(method, uri, ct, bytes).await
    }
}

/// Sends `method uri` (with a JSON body) as the operation `path`, checks the
/// answer against the document (and a body the node accepted against the
/// operation's request schema), and returns its status and JSON body.
async fn op(api: &Api, spec: &mut Spec, method: &str, path: &str, uri: &str, body: Option<Value>) -> (u16, Value) {
    let answer = api.call(&method.to_ascii_uppercase(), uri, body.clone()).await;
    let value = spec.check(method, path, answer.status, &answer.content_type, &answer.body);
    if let Some(body) = body.filter(|_| (200..300).contains(&answer.status)) {
        spec.check_request(method, path, &body);
    }
    (answer.status, value)
}

/// Asserts an error answer: its status, code and field.
fn assert_error(what: &str, (status, body): &(u16, Value), want: (u16, &str, &str)) {
    let got = (*status, body["error"]["code"].as_str().unwrap_or(""), body["error"]["field"].as_str().unwrap_or(""));
    assert_eq!(got, want, "{what}: {body}");
}

fn pull_timer(namespace: &str, id: &str, delay_ms: u64, topic: &str) -> Value {
    json!({ "namespace": namespace, "id": id, "delay_ms": delay_ms, "callback": { "pull": { "topic": topic } } })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_describes_every_route_and_real_responses_match_it() {
    let dir = tempfile::tempdir().unwrap();
    // A small body limit, so the 413 takes a small body.
    let node = NodeProcess::start(dir.path(), &[("TOCSIN_ADMISSION__MAX_REQUEST_BYTES", "262144")]);
    let http = tocsin_contract::tls::http_client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let api = Api { http, base: format!("http://{}", node.http) };

    // Phase: the document is OpenAPI 3.1, served as JSON, and every route
    // of the router's table is one of its operations with the route's
    // query parameters; it describes nothing else.
    let answer = api.call("GET", "/openapi.json", None).await;
    assert_eq!((answer.status, answer.content_type.as_str()), (200, "application/json"));
    let doc = answer.json();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut spec = Spec::new(doc.clone());
    spec.check("get", "/openapi.json", answer.status, &answer.content_type, &answer.body);
    let mut served = BTreeSet::new();
    for route in tocsin_node::api::http::routes() {
        for path in route.operation_paths() {
            let method = route.method.to_ascii_lowercase();
            let op = &doc["paths"][&path][&method];
            assert!(op.is_object(), "{} {path} is served but not described", route.method);
            let described: BTreeSet<&str> = op["parameters"]
                .as_array()
                .map(|ps| ps.iter().filter(|p| p["in"] == "query").map(|p| p["name"].as_str().unwrap()).collect())
                .unwrap_or_default();
            let taken: BTreeSet<&str> = route.query.iter().copied().collect();
            assert_eq!(described, taken, "{} {path}: the query parameters described and taken", route.method);
            // Every path parameter the path names is described.
            let named: BTreeSet<&str> = path.split('{').skip(1).filter_map(|s| s.split('}').next()).collect();
            let in_path: BTreeSet<&str> = op["parameters"]
                .as_array()
                .map(|ps| ps.iter().filter(|p| p["in"] == "path").map(|p| p["name"].as_str().unwrap()).collect())
                .unwrap_or_default();
            assert_eq!(named, in_path, "{} {path}: path parameters", route.method);
            served.insert((method, path));
        }
    }
    let described: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| item.as_object().unwrap().keys().map(move |m| (m.clone(), path.clone())))
        .collect();
    assert_eq!(served, described, "served and described operations differ");

    // Phase: timers, their successes and refusals.
    let (status, body) =
        op(&api, &mut spec, "post", "/v1/timers", "/v1/timers", Some(pull_timer("orders", "o-1", 60_000, "t"))).await;
    assert_eq!((status, body["created"].as_bool()), (201, Some(true)), "{body}");
    let (status, body) =
        op(&api, &mut spec, "post", "/v1/timers", "/v1/timers", Some(pull_timer("orders", "o-1", 60_000, "t"))).await;
    assert_eq!((status, body["created"].as_bool()), (200, Some(false)), "an identical repeat: {body}");
    let conflict =
        op(&api, &mut spec, "post", "/v1/timers", "/v1/timers", Some(pull_timer("orders", "o-1", 70_000, "t"))).await;
    assert_error("a different spec under the id", &conflict, (409, "ALREADY_EXISTS", ""));
    let mut full = pull_timer("orders", "o-2", 60_000, "t");
    full["payload"] = json!("aGVsbG8=");
    full["labels"] = json!({ "team": "billing" });
    full["retry"] = json!({ "max_attempts": 3, "initial_backoff_ms": 1_000 });
    full["skip_if_late_ms"] = json!(5_000);
    let (status, body) = op(&api, &mut spec, "post", "/v1/timers", "/v1/timers", Some(full)).await;
    assert_eq!(status, 201, "{body}");
    let recurring = json!({ "namespace": "orders", "id": "every", "callback": { "pull": { "topic": "t" } },
        "recurrence": { "every_ms": 3_600_000, "count": 3 } });
    let (status, body) = op(&api, &mut spec, "post", "/v1/timers", "/v1/timers", Some(recurring)).await;
    assert_eq!(status, 201, "{body}");
    let bad =
        op(&api, &mut spec, "post", "/v1/timers", "/v1/timers", Some(pull_timer("Orders!", "x", 1000, "t"))).await;
    assert_error("a bad namespace", &bad, (400, "INVALID_ARGUMENT", "namespace"));

    let batch = json!({ "timers": [pull_timer("orders", "b-1", 60_000, "t"), pull_timer("BAD", "b-2", 60_000, "t")] });
    let (status, body) = op(&api, &mut spec, "post", "/v1/timers:batch", "/v1/timers:batch", Some(batch)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["results"][0]["ok"].is_object() && body["results"][1]["error"].is_object(), "{body}");

    let (status, body) = op(&api, &mut spec, "get", "/v1/timers/{namespace}/{id}", "/v1/timers/orders/o-2", None).await;
    assert_eq!((status, body["timer"]["labels"]["team"].as_str()), (200, Some("billing")), "{body}");
    op(&api, &mut spec, "get", "/v1/timers/{namespace}/{id}", "/v1/timers/orders/every", None).await;
    let missing = op(&api, &mut spec, "get", "/v1/timers/{namespace}/{id}", "/v1/timers/orders/nope", None).await;
    assert_error("get of a missing timer", &missing, (404, "NOT_FOUND", ""));

    let (status, body) =
        op(&api, &mut spec, "get", "/v1/timers/{namespace}", "/v1/timers/orders?state=SCHEDULED&page_size=2", None)
            .await;
    assert_eq!(status, 200, "{body}");
    assert!(!body["next_page_token"].as_str().unwrap().is_empty(), "a second page: {body}");
    let page_token = body["next_page_token"].as_str().unwrap().to_string();
    let uri = format!("/v1/timers/orders?page_token={page_token}&page_size=2");
    let (status, _) = op(&api, &mut spec, "get", "/v1/timers/{namespace}", &uri, None).await;
    assert_eq!(status, 200);
    for (query, field) in [("state=SLEEPING", "state"), ("page_size=x", "page_size"), ("sate=DEAD", "sate")] {
        let uri = format!("/v1/timers/orders?{query}");
        let refused = op(&api, &mut spec, "get", "/v1/timers/{namespace}", &uri, None).await;
        assert_error(query, &refused, (400, "INVALID_ARGUMENT", field));
    }

    let path = "/v1/timers/{namespace}/{id}:reschedule";
    let body = json!({ "expected_generation": 1, "delay_ms": 90_000 });
    let (status, got) = op(&api, &mut spec, "post", path, "/v1/timers/orders/o-1:reschedule", Some(body.clone())).await;
    assert_eq!((status, got["timer"]["generation"].as_u64()), (200, Some(2)), "{got}");
    let stale = op(&api, &mut spec, "post", path, "/v1/timers/orders/o-1:reschedule", Some(body)).await;
    assert_error("a stale generation", &stale, (412, "FAILED_PRECONDITION", ""));

    let path = "/v1/timers/{namespace}/{id}";
    let (status, body) = op(&api, &mut spec, "delete", path, "/v1/timers/orders/o-1", None).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("CANCELLED")), "{body}");
    let (status, body) = op(&api, &mut spec, "delete", path, "/v1/timers/orders/o-1", None).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("ALREADY_CANCELLED")), "{body}");
    let (status, body) = op(&api, &mut spec, "delete", path, "/v1/timers/orders/nope", None).await;
    assert_eq!(
        (status, body["outcome"].as_str(), body["error"]["code"].as_str()),
        (404, Some("NOT_FOUND"), Some("NOT_FOUND"))
    );

    let (status, body) =
        op(&api, &mut spec, "get", "/v1/namespaces/{namespace}/horizon", "/v1/namespaces/orders/horizon", None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["next_day"].as_u64().unwrap() >= 2, "o-2 and b-1 fire within the day: {body}");

    // Phase: pull: reserve, nack, reserve again, ack; a repeated ack is
    // STALE. A timer that may fail once is DEAD after its nack.
    let mut once = pull_timer("jobs", "j-dead", 1, "work");
    once["retry"] = json!({ "max_attempts": 1 });
    op(&api, &mut spec, "post", "/v1/timers", "/v1/timers", Some(once)).await;
    op(&api, &mut spec, "post", "/v1/timers", "/v1/timers", Some(pull_timer("jobs", "j-1", 1, "work"))).await;
    let topic = "/v1/namespaces/{namespace}/topics/{topic}";
    let reserve = |max: u32| json!({ "max": max, "wait_ms": 5_000, "ttr_ms": 60_000 });
    let mut held: Vec<Value> = Vec::new();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while held.len() < 2 {
        assert!(std::time::Instant::now() < until, "both pull timers reserved: {held:?}");
        let (status, body) = op(
            &api,
            &mut spec,
            "post",
            &format!("{topic}:reserve"),
            "/v1/namespaces/jobs/topics/work:reserve",
            Some(reserve(2)),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        held.extend(body["deliveries"].as_array().unwrap().iter().cloned());
    }
    let refs: Vec<Value> =
        held.iter().map(|d| json!({ "id": d["id"], "fire_id": d["fire_id"], "attempt": d["attempt"] })).collect();
    let (status, body) = op(
        &api,
        &mut spec,
        "post",
        &format!("{topic}:nack"),
        "/v1/namespaces/jobs/topics/work:nack",
        Some(json!({ "deliveries": refs, "delay_ms": 0, "reason": "not yet" })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let again = loop {
        assert!(std::time::Instant::now() < until, "j-1 offered again");
        let (_, body) = op(
            &api,
            &mut spec,
            "post",
            &format!("{topic}:reserve"),
            "/v1/namespaces/jobs/topics/work:reserve",
            Some(reserve(1)),
        )
        .await;
        if let Some(d) = body["deliveries"].as_array().and_then(|d| d.first()) {
            break d.clone();
        }
    };
    assert_eq!(again["id"], "j-1", "{again}");
    let acks =
        json!({ "deliveries": [{ "id": again["id"], "fire_id": again["fire_id"], "attempt": again["attempt"] }] });
    let (status, body) =
        op(&api, &mut spec, "post", &format!("{topic}:ack"), "/v1/namespaces/jobs/topics/work:ack", Some(acks.clone()))
            .await;
    assert_eq!((status, body["results"][0]["status"].as_str()), (200, Some("OK")), "{body}");
    let (_, body) =
        op(&api, &mut spec, "post", &format!("{topic}:ack"), "/v1/namespaces/jobs/topics/work:ack", Some(acks)).await;
    assert_eq!(body["results"][0]["status"], "STALE", "{body}");
    let refused = op(
        &api,
        &mut spec,
        "post",
        &format!("{topic}:reserve"),
        "/v1/namespaces/jobs/topics/work:reserve",
        Some(json!({ "max": 0 })),
    )
    .await;
    assert_error("max 0", &refused, (400, "INVALID_ARGUMENT", "max"));
    let (status, body) =
        op(&api, &mut spec, "get", "/v1/timers/{namespace}/{id}/attempts", "/v1/timers/jobs/j-1/attempts", None).await;
    assert_eq!((status, body["attempts"].as_array().map(Vec::len)), (200, Some(2)), "{body}");

    // Phase: the DEAD timer is redriven by id; all_dead then finds none.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = op(&api, &mut spec, "get", "/v1/timers/{namespace}/{id}", "/v1/timers/jobs/j-dead", None).await;
        if body["timer"]["state"] == "DEAD" {
            break;
        }
        assert!(std::time::Instant::now() < until, "j-dead DEAD after its one attempt: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    op(&api, &mut spec, "get", "/v1/timers/{namespace}/{id}/attempts", "/v1/timers/jobs/j-dead/attempts", None).await;
    let path = "/v1/namespaces/{namespace}:redrive";
    let (status, body) = op(
        &api,
        &mut spec,
        "post",
        path,
        "/v1/namespaces/jobs:redrive",
        Some(json!({ "ids": ["j-dead", "nope", "j-1"] })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let outcomes: Vec<&str> =
        body["results"].as_array().unwrap().iter().map(|r| r["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["REDRIVEN", "NOT_FOUND", "NOT_DEAD"], "{body}");
    let (status, body) = op(
        &api,
        &mut spec,
        "post",
        path,
        "/v1/namespaces/jobs:redrive",
        Some(json!({ "all_dead": true, "limit": 10 })),
    )
    .await;
    assert_eq!((status, body["more"].as_bool()), (200, Some(false)), "{body}");
    let refused = op(&api, &mut spec, "post", path, "/v1/namespaces/jobs:redrive", Some(json!({}))).await;
    assert_error("redrive of nothing", &refused, (400, "INVALID_ARGUMENT", "ids"));

    // Phase: operations and the console.
    let (status, body) = op(&api, &mut spec, "get", "/v1/cluster", "/v1/cluster", None).await;
    assert_eq!((status, body["nodes"].as_array().map(Vec::len)), (200, Some(1)), "{body}");
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, _) = op(&api, &mut spec, "get", path, path, None).await;
        assert_eq!(status, 200, "{path}");
    }
    for (path, uri, want) in [
        ("/ui", "/ui", 200),
        ("/ui/namespaces/{namespace}", "/ui/namespaces/orders", 200),
        ("/ui/search", "/ui/search?namespace=orders&state=SCHEDULED", 200),
        ("/ui/search", "/ui/search?namespace=orders&id=o-2", 303),
        ("/ui/timers/{namespace}/{id}", "/ui/timers/orders/o-2", 200),
        ("/ui/login", "/ui/login", 200),
    ] {
        let (status, _) = op(&api, &mut spec, "get", path, uri, None).await;
        assert_eq!(status, want, "{uri}");
    }
    let answer =
        api.send("POST", "/ui/login", Some("application/x-www-form-urlencoded"), Some(b"token=tcn_abc".to_vec())).await;
    spec.check("post", "/ui/login", answer.status, &answer.content_type, &answer.body);
    assert_eq!(answer.status, 303);

    // Phase: every refusal is the one JSON error shape. A query parameter
    // an operation does not take is refused by every operation.
    for route in tocsin_node::api::http::routes() {
        for path in route.operation_paths() {
            let concrete = path.replace("{namespace}", "orders").replace("{id}", "o-2").replace("{topic}", "work");
            let answer = api.call(route.method, &format!("{concrete}?bogus=1"), None).await;
            let body = spec.check(
                &route.method.to_ascii_lowercase(),
                &path,
                answer.status,
                &answer.content_type,
                &answer.body,
            );
            assert_error(
                &format!("{} {path}?bogus=1", route.method),
                &(answer.status, body),
                (400, "INVALID_ARGUMENT", "bogus"),
            );
        }
    }
    let refusals: Vec<(&str, Answer, (u16, &str, &str))> = vec![
        (
            "malformed JSON",
            api.send("POST", "/v1/timers", Some("application/json"), Some(b"{nope".to_vec())).await,
            (400, "INVALID_ARGUMENT", "body"),
        ),
        ("an empty body", api.send("POST", "/v1/timers", None, None).await, (400, "INVALID_ARGUMENT", "body")),
        (
            "a form, not JSON",
            api.send("POST", "/v1/timers", Some("application/x-www-form-urlencoded"), Some(b"namespace=a".to_vec()))
                .await,
            (400, "INVALID_ARGUMENT", "body"),
        ),
        (
            "an unknown field",
            api.send(
                "POST",
                "/v1/timers",
                Some("application/json"),
                Some(br#"{"namespace":"a","colour":"red"}"#.to_vec()),
            )
            .await,
            (400, "INVALID_ARGUMENT", "body"),
        ),
        (
            "a body over the limit",
            api.send("POST", "/v1/timers", Some("application/json"), Some(vec![b' '; 300_000])).await,
            (413, "RESOURCE_EXHAUSTED", "body"),
        ),
        (
            "a path segment that is not UTF-8",
            api.call("GET", "/v1/timers/orders/%FF", None).await,
            (400, "INVALID_ARGUMENT", "id"),
        ),
        (
            "a console query without its namespace",
            api.call("GET", "/ui/search?id=x", None).await,
            (400, "INVALID_ARGUMENT", "namespace"),
        ),
        (
            "a console sign-in without a token",
            api.send("POST", "/ui/login", Some("application/x-www-form-urlencoded"), Some(b"token=".to_vec())).await,
            (400, "INVALID_ARGUMENT", "token"),
        ),
        ("an unknown route", api.call("GET", "/v2/whatever", None).await, (404, "NOT_FOUND", "")),
        (
            "an unknown verb",
            api.call("POST", "/v1/timers/orders/o-2:snooze", Some(json!({}))).await,
            (404, "NOT_FOUND", ""),
        ),
        ("a wrong method", api.call("PUT", "/v1/timers", None).await, (405, "UNIMPLEMENTED", "")),
        ("a wrong method on a probe", api.call("DELETE", "/healthz", None).await, (405, "UNIMPLEMENTED", "")),
        (
            "a wrong method on a timer",
            api.call("PATCH", "/v1/timers/orders/o-2", None).await,
            (405, "UNIMPLEMENTED", ""),
        ),
    ];
    for (what, answer, want) in refusals {
        assert_eq!(answer.content_type, "application/json", "{what}: {}", answer.text());
        let body = answer.json();
        spec.check_error_shape(what, &body);
        assert_error(what, &(answer.status, body), want);
        if answer.status == 405 {
            assert!(!answer.allow.is_empty(), "{what}: a 405 says what is allowed");
        }
    }
    let answer = api.call("PATCH", "/v1/timers/orders/o-2", None).await;
    let allowed: BTreeSet<&str> = answer.allow.split(',').map(str::trim).collect();
    assert!(["GET", "DELETE", "POST"].iter().all(|m| allowed.contains(m)), "Allow: {}", answer.allow);

    // Phase: a real response of every operation was checked.
    let unchecked: Vec<_> = described.iter().filter(|(m, p)| !spec.checked.contains(&(m.clone(), p.clone()))).collect();
    assert!(unchecked.is_empty(), "operations no real response was checked against: {unchecked:?}");
}
