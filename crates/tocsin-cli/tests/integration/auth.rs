//! Bearer tokens on the client ports: no token, a wrong one, another
//! namespace, an admin call without `admin`, a revoked token: each refused
//! with the right code, over gRPC and HTTP, and nothing changed. Tokens are
//! created, listed and revoked through the CLI, and a revocation reaches
//! every node of a cluster within a second.

use std::process::Command;
use std::time::Duration;
use std::time::Instant;

use tocsin_client::ClientOptions;
use tocsin_client::v1 as pb;
use tocsin_client::v1::admin_service_client::AdminServiceClient;
use tocsin_client::v1::timer_service_client::TimerServiceClient;

use crate::support::NodeProcess;
use crate::support::Receiver;

const ROOT: &str = "bootstrap-token-for-the-auth-tests-0123456789";

/// Node settings with tokens on and `ROOT` as the bootstrap token.
fn token_env(dir: &std::path::Path) -> Vec<(String, String)> {
    let file = dir.join("bootstrap-token");
    std::fs::write(&file, format!("{ROOT}\n")).unwrap();
    vec![
        ("TOCSIN_AUTH__MODE".into(), "tokens".into()),
        ("TOCSIN_AUTH__BOOTSTRAP_TOKEN_FILE".into(), file.display().to_string()),
    ]
}

/// `tocsin --token <token> admin --addr <addr> token <args…>`: (success, stdout + stderr).
fn token_cli(addr: &str, token: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["--token", token, "admin", "--addr", addr, "token"])
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Creates a token through the CLI; returns `(id, token)`.
fn create_token(addr: &str, scopes: &str, namespaces: &str, label: &str) -> (String, String) {
    let mut args = vec!["create", "--scope", scopes, "--label", label, "--json"];
    if !namespaces.is_empty() {
        args.extend(["--namespace", namespaces]);
    }
    let (ok, out, err) = token_cli(addr, ROOT, &args);
    assert!(ok, "token create failed: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    (v["id"].as_str().unwrap().to_string(), v["token"].as_str().unwrap().to_string())
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(t) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    request
}

fn code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> tonic::Code {
    match result {
        Ok(_) => tonic::Code::Ok,
        Err(e) => e.code(),
    }
}

fn timer(ns: &str, id: &str, url: &str) -> pb::CreateTimerRequest {
    tocsin_client::webhook_timer(ns, id, 60_000, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_call_needs_a_token_whose_scopes_cover_it() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let env = token_env(dir.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let node = NodeProcess::start(dir.path(), &env);
    let mut grpc = TimerServiceClient::connect(format!("http://{}", node.grpc)).await.unwrap();
    let http = tocsin_contract::tls::http_client_builder().build().unwrap();
    let url = |path: &str| format!("http://{}{path}", node.http);

    // Phase: no token, a malformed one, a forged one: UNAUTHENTICATED / 401.
    for bad in [None, Some("nonsense"), Some("tcn_0123456789abcdef_forged")] {
        let got = grpc.create_timer(with_token(timer("orders", "x", &receiver.url), bad)).await;
        assert_eq!(code(got), tonic::Code::Unauthenticated, "token {bad:?}");
    }
    let resp = http.get(url("/v1/timers/orders/x")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "UNAUTHENTICATED", "{body}");
    let resp = http.get(url("/v1/cluster")).bearer_auth("nonsense").send().await.unwrap();
    assert_eq!(resp.status(), 401);
    // Refused before the body is looked at: a bad body is not an answer.
    let resp = http.post(url("/v1/timers")).body("{}").send().await.unwrap();
    assert_eq!(resp.status(), 401, "unauthenticated first, then validated");
    // Probes stay open.
    assert_eq!(http.get(url("/readyz")).send().await.unwrap().status(), 200);

    // Phase: tokens from the CLI, with the bootstrap token.
    let (orders_id, orders) = create_token(&node.grpc, "timers:write,timers:read", "orders,team-*", "orders-svc");
    let (_, puller) = create_token(&node.grpc, "pull", "orders", "orders-consumer");
    let (_, admin) = create_token(&node.grpc, "admin", "", "ops");
    let (ok, _, err) = token_cli(&node.grpc, &orders, &["create", "--scope", "admin"]);
    assert!(!ok && err.contains("does not grant admin"), "a non-admin token creates no token: {err}");

    // Phase: its own namespaces (and a prefix) work.
    let ok = grpc.create_timer(with_token(timer("orders", "o1", &receiver.url), Some(&orders))).await;
    assert_eq!(code(ok), tonic::Code::Ok);
    let ok = grpc.create_timer(with_token(timer("team-blue", "t1", &receiver.url), Some(&orders))).await;
    assert_eq!(code(ok), tonic::Code::Ok);
    let get = grpc.get_timer(with_token(
        pb::GetTimerRequest { namespace: "orders".into(), id: "o1".into(), include_attempts: false },
        Some(&orders),
    ));
    assert_eq!(code(get.await), tonic::Code::Ok);

    // Phase: another namespace, in every form: PERMISSION_DENIED / 403, and
    // nothing about what is there.
    let root = Some(ROOT);
    let made = grpc.create_timer(with_token(timer("billing", "b1", &receiver.url), root)).await;
    assert_eq!(code(made), tonic::Code::Ok, "the bootstrap token may do anything");
    let denied = grpc.create_timer(with_token(timer("billing", "b2", &receiver.url), Some(&orders))).await;
    let err = denied.expect_err("another namespace");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(err.message().contains("timers:write") && !err.message().contains("b1"), "{err:?}");
    let existing = pb::GetTimerRequest { namespace: "billing".into(), id: "b1".into(), include_attempts: false };
    let missing = pb::GetTimerRequest { namespace: "billing".into(), id: "nope".into(), include_attempts: false };
    let a = grpc.get_timer(with_token(existing, Some(&orders))).await.expect_err("denied");
    let b = grpc.get_timer(with_token(missing, Some(&orders))).await.expect_err("denied");
    assert_eq!((a.code(), a.message()), (b.code(), b.message()), "an existing timer looks like a missing one");
    let cancel = grpc.cancel_timer(with_token(
        pb::CancelTimerRequest { namespace: "billing".into(), id: "b1".into() },
        Some(&orders),
    ));
    assert_eq!(code(cancel.await), tonic::Code::PermissionDenied);
    let list = pb::ListTimersRequest { namespace: String::new(), ..Default::default() };
    assert_eq!(
        code(grpc.list_timers(with_token(list, Some(&orders))).await),
        tonic::Code::PermissionDenied,
        "all namespaces"
    );
    let mixed = pb::CreateTimersRequest {
        timers: vec![timer("orders", "m1", &receiver.url), timer("billing", "m2", &receiver.url)],
    };
    assert_eq!(code(grpc.create_timers(with_token(mixed, Some(&orders))).await), tonic::Code::PermissionDenied);
    let m1 = pb::GetTimerRequest { namespace: "orders".into(), id: "m1".into(), include_attempts: false };
    assert_eq!(
        code(grpc.get_timer(with_token(m1, root)).await),
        tonic::Code::NotFound,
        "a refused batch creates nothing"
    );
    let resp = http.get(url("/v1/timers/billing/b1")).bearer_auth(&orders).send().await.unwrap();
    assert_eq!(resp.status(), 403);
    let resp = http.get(url("/v1/timers/orders/o1")).bearer_auth(&orders).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let resp = http.delete(url("/v1/timers/billing/b1")).bearer_auth(&orders).send().await.unwrap();
    assert_eq!(resp.status(), 403);
    let b1 = pb::GetTimerRequest { namespace: "billing".into(), id: "b1".into(), include_attempts: false };
    let b1 = grpc.get_timer(with_token(b1, root)).await.unwrap().into_inner().timer.unwrap();
    assert_eq!(b1.state, pb::timer::State::Scheduled as i32, "the refused cancels changed nothing");

    // Phase: scopes: pull is not write, write is not pull, admin is admin.
    let reserve = pb::ReserveRequest { namespace: "orders".into(), topic: "t".into(), ..Default::default() };
    let got = grpc.reserve(with_token(reserve.clone(), Some(&orders))).await;
    assert_eq!(code(got), tonic::Code::PermissionDenied);
    let got = grpc.create_timer(with_token(timer("orders", "p1", &receiver.url), Some(&puller))).await;
    assert_eq!(code(got), tonic::Code::PermissionDenied);
    let ack = pb::AckRequest {
        deliveries: vec![pb::DeliveryRef {
            namespace: "billing".into(),
            id: "b1".into(),
            fire_id: "x".into(),
            attempt: 1,
        }],
    };
    assert_eq!(code(grpc.ack(with_token(ack, Some(&puller))).await), tonic::Code::PermissionDenied);
    let mut admin_api = AdminServiceClient::connect(format!("http://{}", node.grpc)).await.unwrap();
    let dry = || pb::RebalanceRequest { dry_run: true };
    assert_eq!(code(admin_api.rebalance(with_token(dry(), Some(&orders))).await), tonic::Code::PermissionDenied);
    assert_eq!(code(admin_api.rebalance(with_token(dry(), None)).await), tonic::Code::Unauthenticated);
    assert_eq!(code(admin_api.rebalance(with_token(dry(), Some(&admin))).await), tonic::Code::Ok);
    // Any known token reads the shard map (the shard-aware client needs it),
    // and the client library carries its token on every call.
    let options = ClientOptions { token: Some(orders.clone()), ..Default::default() };
    let client = tocsin_client::Client::with_options([node.grpc.clone()], options).await.unwrap();
    client.create_timer(timer("orders", "c1", &receiver.url)).await.expect("the client's token is sent");
    // Concurrent creates share `CreateTimers` calls in the client; one in a
    // namespace the token does not cover gets its own refusal, and the
    // others their timers (a refused shared call is not their answer).
    let creates = (0..40).map(|i| {
        let ns = if i == 17 { "billing" } else { "orders" };
        let (client, req) = (client.clone(), timer(ns, &format!("shared-{i}"), &receiver.url));
        async move { client.create_timer(req).await }
    });
    for (i, got) in futures::future::join_all(creates).await.into_iter().enumerate() {
        match (i, got) {
            (17, Err(e)) => assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}"),
            (17, Ok(_)) => panic!("a create in billing passed an orders token"),
            (_, got) => assert!(got.expect("an orders create with an orders token").created),
        }
    }
    assert!(tocsin_client::Client::connect([node.grpc.clone()]).await.is_err(), "no token, no map");

    // Phase: list shows ids and grants, never a secret.
    let (ok, out, err) = token_cli(&node.grpc, &admin, &["list"]);
    assert!(ok && out.contains(&orders_id) && out.contains("orders-svc") && out.contains("team-*"), "{out}{err}");
    // The secret is everything after "<id>_": it is URL-safe base64, which
    // may hold '_' itself (splitting at the last '_' left a fragment of a
    // few characters that a listing can hold by chance).
    let secret = &orders[orders.find(&orders_id).expect("the token holds its id") + orders_id.len() + 1..];
    assert!(secret.len() >= 40, "{secret}");
    assert!(!out.contains(secret), "a token's secret is never listed");

    // Phase: revoked: refused at once.
    let (ok, out, err) = token_cli(&node.grpc, &admin, &["revoke", &orders_id]);
    assert!(ok && out.contains("revoked"), "{out}{err}");
    let got = grpc.create_timer(with_token(timer("orders", "o2", &receiver.url), Some(&orders))).await;
    assert_eq!(code(got), tonic::Code::Unauthenticated);
    let (ok, out, _) = token_cli(&node.grpc, &admin, &["revoke", &orders_id]);
    assert!(ok && out.contains("nothing to revoke"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_token_is_refused_by_every_node_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let env = token_env(dir.path());
    let nodes = NodeProcess::start_three(dir.path(), |_| env.clone());
    let (id, token) = create_token(&nodes[0].grpc, "timers:write,timers:read", "ns", "svc");
    let mut clients = Vec::new();
    for n in &nodes {
        clients.push(TimerServiceClient::connect(format!("http://{}", n.grpc)).await.unwrap());
    }
    // Every node knows the new token soon (it was announced).
    for (i, c) in clients.iter_mut().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let got = c.create_timer(with_token(timer("ns", &format!("a{i}"), &receiver.url), Some(&token))).await;
            if code(got) == tonic::Code::Ok {
                break;
            }
            assert!(Instant::now() < deadline, "node {} does not know the new token", i + 1);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (ok, out, err) = token_cli(&nodes[0].grpc, ROOT, &["revoke", &id]);
    assert!(ok, "{out}{err}");
    let revoked = Instant::now();
    let mut refused_after = Vec::new();
    for (i, c) in clients.iter_mut().enumerate() {
        loop {
            let get = pb::GetTimerRequest { namespace: "ns".into(), id: format!("a{i}"), include_attempts: false };
            if code(c.get_timer(with_token(get, Some(&token))).await) == tonic::Code::Unauthenticated {
                refused_after.push(revoked.elapsed());
                break;
            }
            assert!(revoked.elapsed() < Duration::from_secs(1), "node {} still takes a revoked token", i + 1);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    eprintln!("revoked token refused by nodes 1-3 after {refused_after:?}");
}
