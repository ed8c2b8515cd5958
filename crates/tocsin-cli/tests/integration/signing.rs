//! Rotating a namespace's webhook signing secret without a restart: a node
//! started with secret A signs with A; its config file rewritten to secret B
//! with A as a previous secret and SIGHUP sent, deliveries carry both
//! signatures, so receivers holding A or B verify; a malformed file on the
//! next SIGHUP is refused and the node keeps signing with B and A. Secrets
//! in the cluster map (`tocsin admin namespace rotate-secret`) take over
//! from the file at once, on every node, and rotate the same way.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tocsin_contract::headers;
use tocsin_contract::signing;

use crate::support::NodeProcess;
use crate::support::now_ms;

/// (webhook-id, webhook-timestamp, webhook-signature, body) by timer id.
type Seen = Arc<Mutex<HashMap<String, (String, u64, String, Vec<u8>)>>>;

const A: &str = "the-first-secret-of-24-bytes-or-more";
const B: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn receiver() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let state = seen.clone();
    let app = axum::Router::new().fallback(axum::routing::post(
        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let state = state.clone();
            async move {
                let h = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let entry = (
                    h(headers::WEBHOOK_ID),
                    h(headers::WEBHOOK_TIMESTAMP).parse().unwrap_or(0),
                    h(headers::WEBHOOK_SIGNATURE),
                    body.to_vec(),
                );
                state.lock().unwrap().insert(v["id"].as_str().unwrap().to_string(), entry);
                "ok"
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

async fn delivered(seen: &Seen, id: &str) -> (String, u64, String, Vec<u8>) {
    let deadline = now_ms() + 20_000;
    loop {
        if let Some(entry) = seen.lock().unwrap().get(id).cloned() {
            return entry;
        }
        assert!(now_ms() < deadline, "{id} was not delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn verifies(secret: &str, (id, ts, signature, body): &(String, u64, String, Vec<u8>)) -> bool {
    signing::verify(&signing::secret_bytes(secret).unwrap(), id, *ts, body, signature)
}

async fn wait_log(node: &NodeProcess, line: &str, times: usize) {
    let deadline = now_ms() + 10_000;
    while node.log().matches(line).count() < times {
        assert!(now_ms() < deadline, "no {line:?} in the log:\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signing_secret_rotates_on_sighup_with_both_signatures_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let (url, seen) = receiver().await;
    let config = dir.path().join("tocsin.toml");
    std::fs::write(&config, format!("[namespaces.signed]\nwebhook_secret = {A:?}\n")).unwrap();
    let node = NodeProcess::start_with_args(dir.path(), &["--config", config.to_str().unwrap()], &[]);
    let client = tocsin_client::Client::connect([node.grpc.clone()]).await.unwrap();

    // Phase: signed with A only.
    client.create_timer(tocsin_client::webhook_timer("signed", "t-1", 200, &url)).await.unwrap();
    let first = delivered(&seen, "t-1").await;
    assert_eq!(first.2.split_whitespace().count(), 1, "{}", first.2);
    assert!(verifies(A, &first) && !verifies(B, &first));

    // Phase: rotate to B, keeping A during the overlap; no restart.
    std::fs::write(
        &config,
        format!("[namespaces.signed]\nwebhook_secret = {B:?}\nwebhook_previous_secrets = [{A:?}]\n"),
    )
    .unwrap();
    node.signal("HUP");
    wait_log(&node, "webhook signing secrets reloaded", 1).await;
    client.create_timer(tocsin_client::webhook_timer("signed", "t-2", 200, &url)).await.unwrap();
    let second = delivered(&seen, "t-2").await;
    assert_eq!(second.2.split_whitespace().count(), 2, "{}", second.2);
    assert!(verifies(A, &second) && verifies(B, &second), "either secret verifies during the overlap");
    assert!(!verifies("some-other-secret-of-24-bytes", &second));

    // Phase: a malformed file is refused on SIGHUP; the node keeps B and A.
    std::fs::write(&config, "[namespaces.signed]\nwebhook_secret = \"whsec_%%%\"\n").unwrap();
    node.signal("HUP");
    wait_log(&node, "config reload failed", 1).await;
    assert!(!node.log().contains("%%%"), "the log repeats a secret");
    client.create_timer(tocsin_client::webhook_timer("signed", "t-3", 200, &url)).await.unwrap();
    let third = delivered(&seen, "t-3").await;
    assert!(verifies(A, &third) && verifies(B, &third));
}

/// `tocsin admin --addr <addr> namespace <args…>`: (success, stdout, stderr).
fn namespace_cli(addr: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["admin", "--addr", addr, "namespace"])
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_map_secrets_rotate_without_restart_and_take_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let (url, seen) = receiver().await;
    let config = dir.path().join("tocsin.toml");
    std::fs::write(&config, format!("[namespaces.signed]\nwebhook_secret = {A:?}\n")).unwrap();
    let node = NodeProcess::start_with_args(dir.path(), &["--config", config.to_str().unwrap()], &[]);
    let client = tocsin_client::Client::connect([node.grpc.clone()]).await.unwrap();
    let mut n = 0;
    let mut deliver = async || {
        n += 1;
        let id = format!("m-{n}");
        client.create_timer(tocsin_client::webhook_timer("signed", &id, 100, &url)).await.unwrap();
        delivered(&seen, &id).await
    };

    // Phase: the map's secret B takes over from the file's A, at once.
    let (ok, out, err) = namespace_cli(&node.grpc, &["rotate-secret", "signed", "--secret", B]);
    assert!(ok, "{out}{err}");
    assert!(!out.contains(B) && !err.contains(B), "the CLI repeats a given secret");
    let first = deliver().await;
    assert_eq!(first.2.split_whitespace().count(), 1, "{}", first.2);
    assert!(verifies(B, &first) && !verifies(A, &first), "the map's secret, not the file's");

    // Phase: a drawn secret C becomes current; B still signs meanwhile.
    let (ok, out, err) = namespace_cli(&node.grpc, &["rotate-secret", "signed"]);
    assert!(ok, "{err}");
    let c = out.trim().to_string();
    assert!(c.starts_with("whsec_"), "the drawn secret is printed once: {out}");
    let second = deliver().await;
    assert_eq!(second.2.split_whitespace().count(), 2, "{}", second.2);
    assert!(verifies(&c, &second) && verifies(B, &second));
    let (ok, out, _) = namespace_cli(&node.grpc, &["secrets", "--json"]);
    assert!(ok);
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed[0]["namespace"], "signed");
    assert_eq!(listed[0]["fingerprints"].as_array().unwrap().len(), 2);
    assert!(!out.contains(&c) && !out.contains(B), "a listing shows a secret");

    // Phase: the rotation finished, C alone signs.
    let (ok, out, err) = namespace_cli(&node.grpc, &["drop-previous-secrets", "signed"]);
    assert!(ok && out.contains("only"), "{out}{err}");
    let third = deliver().await;
    assert_eq!(third.2.split_whitespace().count(), 1, "{}", third.2);
    assert!(verifies(&c, &third) && !verifies(B, &third));

    // Bad input: a malformed whsec_ secret and a short one are refused, and
    // nothing changes.
    let (ok, _, err) = namespace_cli(&node.grpc, &["rotate-secret", "signed", "--secret", "whsec_%%%"]);
    assert!(!ok && err.contains("base64"), "{err}");
    let (ok, _, err) = namespace_cli(&node.grpc, &["rotate-secret", "signed", "--secret", "too-short"]);
    assert!(!ok && err.contains("24 to 64 bytes"), "{err}");
    assert!(verifies(&c, &deliver().await));

    // Phase: cleared from the map, the file's secret applies again.
    let (ok, out, err) = namespace_cli(&node.grpc, &["clear-secret", "signed"]);
    assert!(ok && out.contains("removed"), "{out}{err}");
    let fourth = deliver().await;
    assert!(verifies(A, &fourth) && !verifies(&c, &fourth));
    assert!(!node.log().contains(&c) && !node.log().contains(B), "the node's log shows a secret");
}
