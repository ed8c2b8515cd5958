//! The web console every node serves at `/ui`: server-rendered HTML, no
//! script, reading through the same API services as every client (so
//! tokens, scopes and forwarding to shard leaders apply unchanged).
//!
//! | page | shows |
//! |---|---|
//! | `/ui` | the cluster: nodes and their states, the map epoch, every shard this node hosts with its leader, term, epoch, applied index, follower lag, pending and firing timers, lateness |
//! | `/ui/namespaces/{ns}` | a namespace: upcoming fires per minute over the next hour (a chart), the horizon counts, its fire lateness on this node, its DEAD timers |
//! | `/ui/search?namespace=&id=&state=` | a timer by id, or a namespace's timers in a state |
//! | `/ui/timers/{ns}/{id}` | a timer: its fields, its current firing and its attempt history |
//! | `/ui/login` | a form that keeps a bearer token in a cookie (`HttpOnly`, `SameSite=Strict`), for nodes with tokens on |
//!
//! The pages are a route table ([`PAGES`]), described in the node's OpenAPI
//! document as `text/html` (tag `console`). A page that cannot be shown
//! says why as a page; a path or query the router refuses, like every
//! route's, is the API's JSON error (`crate::api::rest`).

use std::sync::Arc;

use axum::Form;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::Html;
use axum::response::IntoResponse;
use axum::response::Redirect;
use axum::response::Response;
use axum::routing::on;
use tocsin_contract::json::AttemptJson;
use tocsin_contract::json::TimerJson;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::timer_service_server::TimerService;

use crate::api::admin::AdminApi;
use crate::api::request::CONSOLE_COOKIE;
use crate::api::request::rpc;
use crate::api::rest::ApiErrors;
use crate::api::rest::ApiPath;
use crate::api::rest::ApiQuery;
use crate::api::rest::Mount;
use crate::api::rest::NamespacePath;
use crate::api::rest::Route;
use crate::api::rest::TimerPath;
use crate::api::timers::TimerApi;
use crate::control::state::NodeState;

/// What the console's pages read through.
#[derive(Clone)]
pub struct Console {
    timers: TimerApi,
    admin: AdminApi,
    node: Arc<NodeState>,
}

/// DEAD timers and search results shown on one page.
const PAGE_ROWS: u32 = 100;

/// The console's pages.
pub const PAGES: &[Mount<Console>] = &[
    Mount { route: Route { method: "GET", path: "/ui", verbs: &[], query: &[] }, handler: |m| on(m, cluster) },
    Mount {
        route: Route { method: "GET", path: "/ui/namespaces/{namespace}", verbs: &[], query: &[] },
        handler: |m| on(m, namespace),
    },
    Mount {
        route: Route { method: "GET", path: "/ui/search", verbs: &[], query: &["namespace", "id", "state"] },
        handler: |m| on(m, search),
    },
    Mount {
        route: Route { method: "GET", path: "/ui/timers/{namespace}/{id}", verbs: &[], query: &[] },
        handler: |m| on(m, timer),
    },
    Mount { route: Route { method: "GET", path: "/ui/login", verbs: &[], query: &[] }, handler: |m| on(m, login_form) },
    Mount { route: Route { method: "POST", path: "/ui/login", verbs: &[], query: &[] }, handler: |m| on(m, login) },
];

/// The console's routes, for the node's HTTP router.
pub fn routes<S: Clone + Send + Sync + 'static>(node: Arc<NodeState>) -> Router<S> {
    let console = Console { timers: TimerApi::new(node.clone()), admin: AdminApi::new(node.clone()), node };
    crate::api::rest::mount(Router::new(), PAGES).with_state(console)
}

/// HTML-escapes text for an element or a quoted attribute.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a path segment (namespaces and ids are client input).
fn seg(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Unix milliseconds as UTC, to the millisecond (no time-zone data here:
/// the reader's zone is the browser's business).
fn when(ms: u64) -> String {
    if ms == 0 {
        return "—".into();
    }
    let secs = (ms / 1000) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03} UTC", rem / 3600, rem % 3600 / 60, rem % 60, ms % 1000)
}

fn page(title: &str, node_id: u64, body: &str) -> Response {
    let html = format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{title} · Tocsin</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d232a; background: #f6f7f9; }}
header {{ background: #1d232a; color: #fff; padding: 10px 24px; display: flex; gap: 24px; align-items: center; }}
header a {{ color: #fff; text-decoration: none; }} header .brand {{ font-weight: 700; font-size: 16px; }}
header form {{ margin-left: auto; display: flex; gap: 6px; }}
main {{ padding: 16px 24px; max-width: 1200px; }}
h1 {{ font-size: 20px; margin: 8px 0 16px; }} h2 {{ font-size: 16px; margin: 24px 0 8px; }}
table {{ border-collapse: collapse; background: #fff; width: 100%; }}
th, td {{ text-align: left; padding: 5px 10px; border-bottom: 1px solid #e3e6ea; font-variant-numeric: tabular-nums; }}
th {{ background: #eef0f3; font-weight: 600; }}
.num {{ text-align: right; }} .muted {{ color: #6b7480; }} .bad {{ color: #b42318; font-weight: 600; }} .ok {{ color: #067647; }}
.cards {{ display: flex; gap: 12px; flex-wrap: wrap; }}
.card {{ background: #fff; border: 1px solid #e3e6ea; border-radius: 6px; padding: 10px 16px; min-width: 140px; }}
.card b {{ display: block; font-size: 22px; }}
pre {{ background: #fff; border: 1px solid #e3e6ea; padding: 10px; overflow: auto; }}
input, select, button {{ font: inherit; padding: 3px 6px; }}
</style></head>
<body><header><a class="brand" href="/ui">Tocsin</a><a href="/ui">Cluster</a>
<form action="/ui/search" method="get"><input name="namespace" placeholder="namespace" required>
<input name="id" placeholder="timer id (optional)"><select name="state"><option value="">any state</option>
<option>SCHEDULED</option><option>FIRING</option><option>DELIVERED</option><option>DEAD</option><option>CANCELLED</option><option>SKIPPED</option></select>
<button>Find</button></form><span class="muted">node {node_id}</span></header>
<main>{body}</main></body></html>"#,
        title = esc(title),
    );
    Html(html).into_response()
}

/// A refused or failed API call, as a page (the status the API would give).
fn failure(console: &Console, title: &str, status: tonic::Status) -> Response {
    let info = tocsin_contract::codes::info_of(&status);
    let http = tocsin_contract::codes::http_status(status.code());
    let body = format!("<h1>{}</h1><p class=\"bad\">{}: {}</p>", esc(title), esc(&info.code), esc(&info.message));
    let mut resp = page(title, console.node.node_id, &body);
    *resp.status_mut() = http;
    resp
}

/// The console: the cluster's nodes and shards.
#[utoipa::path(
    get,
    path = "/ui",
    operation_id = "console_cluster",
    tag = "console",
    responses((status = 200, description = "A page", body = String, content_type = "text/html"), ApiErrors)
)]
pub async fn cluster(State(c): State<Console>) -> Response {
    let info = c.admin.cluster_info().await;
    let mut body = format!(
        "<h1>Cluster <span class=\"muted\">{}</span></h1><div class=\"cards\">\
         <div class=\"card\">map epoch<b>{}</b></div><div class=\"card\">shards<b>{}</b></div>\
         <div class=\"card\">nodes<b>{}</b></div><div class=\"card\">answered by<b>node {}</b></div></div>",
        esc(&info.cluster_id),
        info.map_epoch,
        info.num_shards,
        info.nodes.len(),
        info.node_id
    );
    body.push_str(
        "<h2>Nodes</h2><table><tr><th>node</th><th>state</th><th>reachable</th><th>gRPC</th><th>HTTP</th><th>peer</th></tr>",
    );
    for n in &info.nodes {
        let state = pb::node_info::State::try_from(n.state).map(|s| s.as_str_name()).unwrap_or("STATE_UNSPECIFIED");
        let reach = if n.reachable { "<span class=\"ok\">yes</span>" } else { "<span class=\"bad\">no</span>" };
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{reach}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            n.node_id,
            esc(state),
            esc(&n.grpc_addr),
            esc(&n.http_addr),
            esc(&n.peer_addr)
        ));
    }
    body.push_str(&format!(
        "</table><h2>Shards hosted by node {}</h2><table><tr><th>shard</th><th>replicas</th><th>leader</th>\
         <th class=\"num\">term</th><th class=\"num\">epoch</th><th class=\"num\">applied</th>\
         <th class=\"num\">lag (entries)</th><th class=\"num\">pending</th><th class=\"num\">firing</th>\
         <th class=\"num\">lateness p99</th></tr>",
        info.node_id
    ));
    for s in &info.shards {
        let replicas: Vec<String> = s.replicas.iter().map(u64::to_string).collect();
        let leader =
            if s.leader == 0 { "<span class=\"bad\">none</span>".to_string() } else { format!("node {}", s.leader) };
        let lag = s.lag.values().max().copied().unwrap_or(0);
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{leader}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{lag}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{} ms</td></tr>",
            s.shard,
            replicas.join(", "),
            s.term,
            s.epoch,
            s.applied_index,
            s.pending_timers,
            s.firing_timers,
            s.lateness_ms_p99
        ));
    }
    body.push_str("</table>");
    page("Cluster", c.node.node_id, &body)
}

/// The p50 and p99 of a namespace's fire lateness on this node, from its
/// Prometheus histogram (the shards this node leads).
fn lateness_here(node: &NodeState, namespace: &str) -> Option<(f64, f64, u64)> {
    let text = node.metrics.as_ref()?.render();
    let label = format!("namespace=\"{}\"", crate::labels::namespace(namespace));
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("tocsin_fire_lateness_seconds_bucket{") && l.contains(&label)) {
        let le = line.split("le=\"").nth(1)?.split('"').next()?;
        let count: u64 = line.rsplit(' ').next()?.parse().ok()?;
        let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
        buckets.push((le, count));
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let quantile = |q: f64| {
        let rank = (q * total as f64).ceil() as u64;
        buckets.iter().find(|(_, n)| *n >= rank).map_or(f64::INFINITY, |(le, _)| *le)
    };
    Some((quantile(0.5), quantile(0.99), total))
}

/// Upcoming fires per minute as an SVG bar chart.
fn chart(minutes: &[u64]) -> String {
    let (w, h, pad) = (720.0, 160.0, 24.0);
    let max = minutes.iter().copied().max().unwrap_or(0).max(1) as f64;
    let bar = (w - 2.0 * pad) / minutes.len().max(1) as f64;
    let mut svg = format!(
        "<svg id=\"upcoming-chart\" width=\"{w}\" height=\"{}\" role=\"img\" aria-label=\"upcoming fires per minute\" \
         style=\"background:#fff;border:1px solid #e3e6ea\">",
        h + 20.0
    );
    for (i, n) in minutes.iter().enumerate() {
        let bh = (*n as f64 / max) * (h - pad);
        svg.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"#3b82f6\"><title>+{i} min: {n}</title></rect>",
            pad + i as f64 * bar + 1.0,
            h - bh,
            (bar - 2.0).max(1.0)
        ));
    }
    svg.push_str(&format!(
        "<line x1=\"{pad}\" y1=\"{h}\" x2=\"{}\" y2=\"{h}\" stroke=\"#6b7480\"/>\
         <text x=\"{pad}\" y=\"{}\" font-size=\"11\" fill=\"#6b7480\">now</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#6b7480\" text-anchor=\"end\">+60 min</text>\
         <text x=\"{pad}\" y=\"12\" font-size=\"11\" fill=\"#6b7480\">max {} per minute</text></svg>",
        w - pad,
        h + 14.0,
        w - pad,
        h + 14.0,
        max as u64
    ));
    svg
}

fn timer_rows(timers: &[pb::Timer]) -> String {
    let mut rows = String::from(
        "<table><tr><th>id</th><th>state</th><th>fire time</th><th class=\"num\">attempt</th><th>last error</th></tr>",
    );
    for t in timers {
        let fire = t.fire.as_ref();
        let error = fire.map(|f| {
            if f.dead_reason.is_empty() { f.last_error.clone() } else { format!("{}: {}", f.dead_reason, f.last_error) }
        });
        rows.push_str(&format!(
            "<tr><td><a href=\"/ui/timers/{}/{}\">{}</a></td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            seg(&t.namespace),
            seg(&t.id),
            esc(&t.id),
            tocsin_contract::json::state_name(t.state),
            when(t.fire_at_ms),
            fire.map_or(0, |f| f.attempt),
            esc(&error.unwrap_or_default())
        ));
    }
    rows.push_str("</table>");
    rows
}

/// The console: a namespace's horizon and DEAD timers.
#[utoipa::path(
    get,
    path = "/ui/namespaces/{namespace}",
    operation_id = "console_namespace",
    tag = "console",
    params(NamespacePath),
    responses((status = 200, description = "A page", body = String, content_type = "text/html"), ApiErrors)
)]
pub async fn namespace(State(c): State<Console>, ApiPath(p): ApiPath<NamespacePath>) -> Response {
    let ns = p.namespace;
    let title = format!("Namespace {ns}");
    let horizon = match c.timers.get_horizon(rpc(pb::GetHorizonRequest { namespace: ns.clone() })).await {
        Ok(h) => h.into_inner(),
        Err(status) => return failure(&c, &title, status),
    };
    let dead = pb::ListTimersRequest {
        namespace: ns.clone(),
        state: pb::timer::State::Dead as i32,
        page_size: PAGE_ROWS,
        ..Default::default()
    };
    let dead = match c.timers.list_timers(rpc(dead)).await {
        Ok(r) => r.into_inner(),
        Err(status) => return failure(&c, &title, status),
    };
    let mut body = format!(
        "<h1>Namespace <span id=\"namespace\">{}</span></h1><div class=\"cards\">\
         <div class=\"card\">overdue<b id=\"overdue\">{}</b></div><div class=\"card\">next minute<b id=\"next-minute\">{}</b></div>\
         <div class=\"card\">next hour<b id=\"next-hour\">{}</b></div><div class=\"card\">next day<b id=\"next-day\">{}</b></div>",
        esc(&ns),
        horizon.overdue,
        horizon.next_minute,
        horizon.next_hour,
        horizon.next_day
    );
    match lateness_here(&c.node, &ns) {
        Some((p50, p99, n)) => body.push_str(&format!(
            "<div class=\"card\">fire lateness on this node<b id=\"lateness\">p50 ≤ {} ms · p99 ≤ {} ms</b>\
             <span class=\"muted\">{n} fires</span></div>",
            (p50 * 1000.0).round(),
            (p99 * 1000.0).round()
        )),
        None => body.push_str(
            "<div class=\"card\">fire lateness on this node<b id=\"lateness\">—</b>\
             <span class=\"muted\">no fires led here yet</span></div>",
        ),
    }
    body.push_str("</div><h2>Upcoming fires, per minute, next hour</h2>");
    body.push_str(&chart(&horizon.next_hour_by_minute));
    body.push_str(&format!(
        "<h2>DEAD timers <span class=\"muted\">({}{})</span></h2>",
        dead.timers.len(),
        if dead.next_page_token.is_empty() { "" } else { " shown; more with tocsin timer list --state dead" }
    ));
    if dead.timers.is_empty() {
        body.push_str("<p class=\"muted\" id=\"no-dead\">None.</p>");
    } else {
        body.push_str(&timer_rows(&dead.timers));
        body.push_str("<p class=\"muted\">Start them over with <code>tocsin timer redrive</code>.</p>");
    }
    page(&title, c.node.node_id, &body)
}

/// The search form's fields.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// The namespace to search.
    namespace: String,
    /// A timer's id: its page.
    #[serde(default)]
    #[param(required = false)]
    id: String,
    /// Else the namespace's timers in this state.
    #[serde(default)]
    #[param(required = false)]
    state: String,
}

/// The console: a timer by id, or a namespace's timers in a state.
#[utoipa::path(
    get,
    path = "/ui/search",
    operation_id = "console_search",
    tag = "console",
    params(SearchQuery),
    responses(
        (status = 200, description = "The timers found", body = String, content_type = "text/html"),
        (status = 303, description = "To the timer's page"),
        ApiErrors,
    )
)]
pub async fn search(State(c): State<Console>, ApiQuery(q): ApiQuery<SearchQuery>) -> Response {
    let ns = q.namespace.trim().to_string();
    let id = q.id.trim();
    if !id.is_empty() {
        return Redirect::to(&format!("/ui/timers/{}/{}", seg(&ns), seg(id))).into_response();
    }
    let state = if q.state.is_empty() {
        pb::timer::State::Unspecified
    } else {
        match pb::timer::State::from_str_name(&q.state) {
            Some(s) => s,
            None => {
                return failure(&c, "Search", tonic::Status::invalid_argument(format!("state: no state {}", q.state)));
            }
        }
    };
    let title = format!("Timers in {ns}");
    let list = pb::ListTimersRequest {
        namespace: ns.clone(),
        state: state as i32,
        page_size: PAGE_ROWS,
        ..Default::default()
    };
    let list = match c.timers.list_timers(rpc(list)).await {
        Ok(r) => r.into_inner(),
        Err(status) => return failure(&c, &title, status),
    };
    let mut body = format!(
        "<h1>Timers in <a href=\"/ui/namespaces/{}\">{}</a>{}</h1>",
        seg(&ns),
        esc(&ns),
        if q.state.is_empty() { String::new() } else { format!(", {}", esc(&q.state)) }
    );
    if list.timers.is_empty() {
        body.push_str("<p class=\"muted\">None.</p>");
    } else {
        body.push_str(&timer_rows(&list.timers));
        if !list.next_page_token.is_empty() {
            body.push_str(&format!(
                "<p class=\"muted\">The first {PAGE_ROWS}; the rest with <code>tocsin timer list</code>.</p>"
            ));
        }
    }
    page(&title, c.node.node_id, &body)
}

/// The console: a timer, its firing and its attempts.
#[utoipa::path(
    get,
    path = "/ui/timers/{namespace}/{id}",
    operation_id = "console_timer",
    tag = "console",
    params(TimerPath),
    responses((status = 200, description = "A page", body = String, content_type = "text/html"), ApiErrors)
)]
pub async fn timer(State(c): State<Console>, ApiPath(p): ApiPath<TimerPath>) -> Response {
    let TimerPath { namespace: ns, id } = p;
    let title = format!("Timer {ns}/{id}");
    let req = pb::GetTimerRequest { namespace: ns.clone(), id: id.clone(), include_attempts: true };
    let t = match c.timers.get_timer(rpc(req)).await {
        Ok(r) => r.into_inner().timer.unwrap_or_default(),
        Err(status) => return failure(&c, &title, status),
    };
    let json = TimerJson::from_proto(&t);
    let mut body = format!(
        "<h1>Timer <a href=\"/ui/namespaces/{}\">{}</a> / <span id=\"timer-id\">{}</span></h1><div class=\"cards\">\
         <div class=\"card\">state<b id=\"state\">{}</b></div><div class=\"card\">fire time<b>{}</b></div>\
         <div class=\"card\">generation<b>{}</b></div><div class=\"card\">shard<b>{}</b></div></div>",
        seg(&ns),
        esc(&ns),
        esc(&id),
        json.state,
        when(t.fire_at_ms),
        t.generation,
        t.shard
    );
    if let Some(f) = &t.fire {
        body.push_str(&format!(
            "<h2>Current firing</h2><table><tr><th>fire id</th><th class=\"num\">epoch</th><th class=\"num\">attempt</th>\
             <th>fired at</th><th>next attempt</th><th>last error</th></tr><tr><td>{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>",
            esc(&f.fire_id),
            f.epoch,
            f.attempt,
            when(f.fired_at_ms),
            when(f.next_attempt_at_ms),
            esc(&if f.dead_reason.is_empty() { f.last_error.clone() } else { format!("{}: {}", f.dead_reason, f.last_error) })
        ));
    }
    body.push_str("<h2>Attempts</h2>");
    if t.attempts.is_empty() {
        body.push_str("<p class=\"muted\" id=\"no-attempts\">None yet.</p>");
    } else {
        body.push_str(
            "<table id=\"attempts\"><tr><th class=\"num\">attempt</th><th>fire id</th><th class=\"num\">epoch</th><th>started</th>\
             <th>outcome</th><th class=\"num\">HTTP</th><th>class</th><th class=\"num\">latency</th><th>error</th></tr>",
        );
        for a in t.attempts.iter().map(AttemptJson::from_proto) {
            body.push_str(&format!(
                "<tr><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td>\
                 <td class=\"num\">{}</td><td>{}</td><td class=\"num\">{} ms</td><td>{}</td></tr>",
                a.attempt,
                esc(&a.fire_id),
                a.epoch,
                when(a.started_at_ms),
                esc(&a.outcome),
                if a.http_status == 0 { String::new() } else { a.http_status.to_string() },
                esc(&a.class),
                a.latency_ms,
                esc(&a.error)
            ));
        }
        body.push_str("</table>");
    }
    let pretty = serde_json::to_string_pretty(&json).unwrap_or_default();
    body.push_str(&format!("<h2>As JSON</h2><pre>{}</pre>", esc(&pretty)));
    page(&title, c.node.node_id, &body)
}

/// The console's sign-in form.
#[utoipa::path(
    get,
    path = "/ui/login",
    operation_id = "console_login_form",
    tag = "console",
    security(()),
    responses((status = 200, description = "A page", body = String, content_type = "text/html"), ApiErrors)
)]
pub async fn login_form(State(c): State<Console>) -> Response {
    page(
        "Sign in",
        c.node.node_id,
        "<h1>Sign in</h1><p>This node checks bearer tokens. Paste one (a token with <code>timers:read</code> on the \
         namespaces you want to see); it is kept in a cookie for this site only.</p>\
         <form method=\"post\" action=\"/ui/login\"><input name=\"token\" type=\"password\" size=\"60\" \
         autocomplete=\"off\" required> <button>Sign in</button></form>",
    )
}

/// The sign-in form's field.
#[derive(serde::Deserialize, utoipa::ToSchema)]
pub struct LoginForm {
    /// A bearer token.
    token: String,
}

/// The console: sign in, keeping the token in a cookie.
#[utoipa::path(
    post,
    path = "/ui/login",
    operation_id = "console_login",
    tag = "console",
    security(()),
    request_body(content = LoginForm, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 303, description = "Signed in: to `/ui`, with the cookie"),
        ApiErrors,
    )
)]
pub async fn login(Form(form): Form<LoginForm>) -> Response {
    let token = form.token.trim();
    // A token is `tcn_…` or the bootstrap token (base64): no cookie syntax.
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic() && b != b';' && b != b',' && b != b'"') {
        return crate::api::rest::error_response(tonic::Code::InvalidArgument, "not a token", "token");
    }
    let cookie = format!("{CONSOLE_COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_clients_is_escaped_and_encoded() {
        assert_eq!(esc("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
        assert_eq!(seg("a b/c?é"), "a%20b%2Fc%3F%C3%A9");
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(when(0), "—");
        assert_eq!(when(1_795_334_823_951), "2026-11-22 08:07:03.951 UTC");
        assert_eq!(when(951_782_400_000), "2000-02-29 00:00:00.000 UTC");
    }
}
