//! TLS on the client ports, with client certificates required: made with
//! the real `tocsin certs` commands; the CLI with the CA and a client
//! certificate creates and reads (and still needs its token); plaintext,
//! TLS without a client certificate and a certificate from a foreign CA
//! are refused on gRPC and HTTP alike; the client certificate does not
//! open the peer port; a node whose TLS file is missing does not start.

use std::path::Path;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tocsin_client::v1 as pb;
use tocsin_client::v1::admin_service_client::AdminServiceClient;
use tocsin_client::v1::timer_service_client::TimerServiceClient;
use tonic::transport::Certificate;
use tonic::transport::ClientTlsConfig;
use tonic::transport::Endpoint;
use tonic::transport::Identity;

use crate::support::NodeProcess;
use crate::support::ProbeTls;

const ROOT: &str = "bootstrap-token-for-the-client-tls-test-0123";

fn tocsin(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin")).args(args).output().expect("run tocsin");
    assert!(out.status.success(), "tocsin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// `tocsin <args>` with the environment cleared of the CLI's TLS and token
/// variables, so only the flags given count: (success, stdout, stderr).
fn cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(args)
        .env_remove("TOCSIN_TOKEN")
        .env_remove("TOCSIN_TLS_CA")
        .env_remove("TOCSIN_TLS_CERT")
        .env_remove("TOCSIN_TLS_KEY")
        .env_remove("TOCSIN_TLS_DOMAIN")
        .output()
        .expect("run tocsin");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// One GetCluster over gRPC at `url` (`http://` or `https://`) with `tls`,
/// carrying the bootstrap token; Err says how it failed.
async fn get_cluster(url: String, tls: Option<ClientTlsConfig>) -> Result<pb::ClusterInfo, String> {
    let call = async {
        let mut endpoint = Endpoint::from_shared(url).map_err(|e| e.to_string())?;
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
        }
        let channel = endpoint.connect_timeout(Duration::from_secs(3)).connect().await.map_err(|e| format!("{e:?}"))?;
        let mut request = tonic::Request::new(pb::GetClusterRequest { digests: false });
        request.metadata_mut().insert("authorization", format!("Bearer {ROOT}").parse().unwrap());
        AdminServiceClient::new(channel).get_cluster(request).await.map(|r| r.into_inner()).map_err(|e| e.to_string())
    };
    tokio::time::timeout(Duration::from_secs(15), call).await.unwrap_or_else(|_| Err("no answer in 15 s".into()))
}

/// A GET of `path` on the HTTP port over `scheme`, trusting `ca`, presenting
/// `identity` (cert and key PEM files); Ok(status, body).
async fn http_get(
    scheme: &str,
    addr: &str,
    path: &str,
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<(u16, String), String> {
    let mut builder = tocsin_contract::tls::http_client_builder().timeout(Duration::from_secs(10));
    if let Some(ca) = ca {
        builder = builder.tls_certs_only([reqwest::Certificate::from_pem(read(ca).as_bytes()).unwrap()]);
    }
    if let Some((cert, key)) = identity {
        let pem = format!("{}\n{}", read(cert), read(key));
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    let client = builder.build().map_err(|e| e.to_string())?;
    let resp =
        client.get(format!("{scheme}://{addr}{path}")).bearer_auth(ROOT).send().await.map_err(|e| format!("{e:?}"))?;
    let status = resp.status().as_u16();
    Ok((status, resp.text().await.map_err(|e| e.to_string())?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_ports_speak_mutual_tls_only() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let foreign = dir.path().join("foreign");
    let (certs_s, foreign_s) = (certs.to_str().unwrap(), foreign.to_str().unwrap());

    // Phase: the CLI makes a CA, a node certificate naming the address
    // clients dial, and client certificates (ours, and one from a CA the
    // node does not trust).
    tocsin(&["certs", "init", "--dir", certs_s]);
    tocsin(&["certs", "issue", "--dir", certs_s, "--node", "1", "--host", "127.0.0.1"]);
    tocsin(&["certs", "client", "--dir", certs_s, "--name", "app"]);
    tocsin(&["certs", "init", "--dir", foreign_s]);
    tocsin(&["certs", "client", "--dir", foreign_s, "--name", "app"]);
    let again = cli(&["certs", "client", "--dir", certs_s, "--name", "app"]);
    assert!(!again.0 && again.2.contains("already exist"), "certs client overwrote a certificate: {again:?}");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(certs.join("client-app.key")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a client's private key is readable by others");
    let ca = certs.join("ca.pem");
    let (cert, key) = (certs.join("client-app.pem"), certs.join("client-app.key"));
    let (foreign_cert, foreign_key) = (foreign.join("client-app.pem"), foreign.join("client-app.key"));
    let path = |p: &PathBuf| p.display().to_string();

    // Phase: a node whose client certificate file is missing does not
    // start, and says which file.
    let missing = dir.path().join("no-such-cert.pem");
    let refused = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["serve", "--node-id", "1", "--insecure-no-auth"])
        .arg("--data")
        .arg(dir.path().join("data-bad"))
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--peer", "127.0.0.1:0"])
        .env("TOCSIN_CLIENT_TLS__CERT_FILE", &missing)
        .env("TOCSIN_CLIENT_TLS__KEY_FILE", certs.join("node-1.key"))
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a node started with a missing client TLS certificate");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(&path(&missing)), "the error does not name the file: {stderr}");

    // Phase: a node with client TLS and client certificates required, tokens
    // on, and peer mTLS from the same CA. Its readiness probe speaks TLS
    // with our certificate, so it is up only if that works.
    let token_file = dir.path().join("bootstrap-token");
    std::fs::write(&token_file, format!("{ROOT}\n")).unwrap();
    let env = [
        ("TOCSIN_CLIENT_TLS__CERT_FILE", path(&certs.join("node-1.pem"))),
        ("TOCSIN_CLIENT_TLS__KEY_FILE", path(&certs.join("node-1.key"))),
        ("TOCSIN_CLIENT_TLS__CLIENT_CA_FILE", path(&ca)),
        ("TOCSIN_PEER_TLS__DIR", certs_s.to_string()),
        ("TOCSIN_AUTH__MODE", "tokens".to_string()),
        ("TOCSIN_AUTH__BOOTSTRAP_TOKEN_FILE", path(&token_file)),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let probe = ProbeTls { ca: ca.clone(), cert: Some(cert.clone()), key: Some(key.clone()) };
    let node = NodeProcess::start_with_tls(dir.path(), &env, probe);
    assert!(node.log().contains("client TLS on"), "the node did not log client TLS");

    // Phase: the CLI with the CA, its certificate and a token creates and
    // reads a timer; without the token it is refused (tokens still apply).
    let tls_flags: Vec<&str> = vec![
        "--tls-ca",
        ca.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let with = |token: bool, args: &[&str]| {
        let mut all: Vec<&str> = tls_flags.clone();
        if token {
            all.extend(["--token", ROOT]);
        }
        all.extend(args);
        cli(&all)
    };
    let create = ["timer", "create", "--addr", &node.grpc, "tls", "t-1", "--delay-ms", "600000", "--topic", "jobs"];
    let created = with(true, &create);
    assert!(created.0, "create over TLS failed: {created:?}");
    let got = with(true, &["timer", "get", "--addr", &node.grpc, "--json", "tls", "t-1"]);
    assert!(got.0 && got.1.contains("\"t-1\""), "get over TLS failed: {got:?}");
    let no_token = with(false, &["timer", "get", "--addr", &node.grpc, "tls", "t-1"]);
    assert!(!no_token.0, "a call with a client certificate but no token was answered: {no_token:?}");
    // `tocsin probe` speaks TLS with the same flags, and not without them.
    assert!(with(false, &["probe", "--http", &node.http]).0, "probe over TLS failed");
    assert!(!cli(&["probe", "--http", &node.http]).0, "a plaintext probe passed on a TLS port");

    // Phase: gRPC. The control (CA and our certificate) is answered;
    // plaintext, TLS without a client certificate, and a certificate from
    // a foreign CA are not.
    let https = format!("https://{}", node.grpc);
    let trusting = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&ca)));
    let ours = trusting().identity(Identity::from_pem(read(&cert), read(&key)));
    let info = get_cluster(https.clone(), Some(ours)).await.expect("mutual TLS with our certificate");
    assert_eq!(info.nodes.len(), 1);
    let plain = get_cluster(format!("http://{}", node.grpc), None).await;
    assert!(plain.is_err(), "a plaintext gRPC call was answered: {plain:?}");
    let anonymous = get_cluster(https.clone(), Some(trusting())).await;
    assert!(anonymous.is_err(), "a TLS call without a client certificate was answered: {anonymous:?}");
    let stranger = trusting().identity(Identity::from_pem(read(&foreign_cert), read(&foreign_key)));
    let stranger = get_cluster(https.clone(), Some(stranger)).await;
    assert!(stranger.is_err(), "a certificate from a foreign CA was answered: {stranger:?}");
    // The generated client, too, with nothing but plaintext: refused.
    let plain_timer = async {
        let mut c = TimerServiceClient::connect(format!("http://{}", node.grpc)).await.map_err(|e| e.to_string())?;
        c.get_timer(pb::GetTimerRequest { namespace: "tls".into(), id: "t-1".into(), include_attempts: false })
            .await
            .map_err(|e| e.to_string())
    };
    let plain_timer = tokio::time::timeout(Duration::from_secs(15), plain_timer).await.expect("a refusal in time");
    assert!(plain_timer.is_err(), "a plaintext TimerService call was answered: {plain_timer:?}");

    // Phase: HTTP. https with our certificate reads the timer; plain http,
    // https without a certificate and with a foreign one do not.
    let timer_path = "/v1/timers/tls/t-1";
    let (status, body) = http_get("https", &node.http, timer_path, Some(&ca), Some((&cert, &key)))
        .await
        .expect("the HTTP API over mutual TLS");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"t-1\""), "{body}");
    let plain = http_get("http", &node.http, timer_path, None, None).await;
    assert!(plain.is_err(), "plain http was answered: {plain:?}");
    let anonymous = http_get("https", &node.http, timer_path, Some(&ca), None).await;
    assert!(anonymous.is_err(), "https without a client certificate was answered: {anonymous:?}");
    let stranger = http_get("https", &node.http, timer_path, Some(&ca), Some((&foreign_cert, &foreign_key))).await;
    assert!(stranger.is_err(), "https with a foreign client certificate was answered: {stranger:?}");

    // Phase: the client certificate (same CA as the nodes') does not open
    // the peer port, where the node's own certificate reads the cluster.
    let peer = format!("https://{}", node.peer);
    let as_node = |cert: &Path, key: &Path| {
        trusting().domain_name("node-1.peer.tocsin").identity(Identity::from_pem(read(cert), read(key)))
    };
    let node_cert =
        get_cluster(peer.clone(), Some(as_node(&certs.join("node-1.pem"), &certs.join("node-1.key")))).await;
    assert!(node_cert.is_ok(), "the node's own certificate was refused on the peer port: {node_cert:?}");
    let client_cert = get_cluster(peer, Some(as_node(&cert, &key))).await;
    assert!(client_cert.is_err(), "a client certificate was answered on the peer port: {client_cert:?}");
    assert!(node.log().contains("the certificate names no node"), "the peer port did not log the refusal");
}

/// `tocsin admin node add` of a node whose client port runs TLS: asked on
/// its client port in plaintext, the new node does not answer and the add
/// fails saying so; with `--peer`, the cluster asks it on its peer port
/// (peer mTLS) and the add completes; a wrong `--peer` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_client_tls_is_added_through_its_peer_port() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let certs_s = certs.to_str().unwrap();
    tocsin(&["certs", "init", "--dir", certs_s]);
    for id in ["1", "2"] {
        tocsin(&["certs", "issue", "--dir", certs_s, "--node", id, "--host", "127.0.0.1"]);
    }
    tocsin(&["certs", "client", "--dir", certs_s, "--name", "ops"]);
    let ca = certs.join("ca.pem");
    let (cert, key) = (certs.join("client-ops.pem"), certs.join("client-ops.key"));
    let token_file = dir.path().join("bootstrap-token");
    std::fs::write(&token_file, format!("{ROOT}\n")).unwrap();
    let env_of = |id: &str| -> Vec<(String, String)> {
        vec![
            ("TOCSIN_CLIENT_TLS__CERT_FILE".into(), certs.join(format!("node-{id}.pem")).display().to_string()),
            ("TOCSIN_CLIENT_TLS__KEY_FILE".into(), certs.join(format!("node-{id}.key")).display().to_string()),
            ("TOCSIN_CLIENT_TLS__CLIENT_CA_FILE".into(), ca.display().to_string()),
            ("TOCSIN_PEER_TLS__DIR".into(), certs_s.to_string()),
            ("TOCSIN_AUTH__MODE".into(), "tokens".into()),
            ("TOCSIN_AUTH__BOOTSTRAP_TOKEN_FILE".into(), token_file.display().to_string()),
            ("TOCSIN_REPLICATION_FACTOR".into(), "1".into()),
        ]
    };
    let probe = ProbeTls { ca: ca.clone(), cert: Some(cert.clone()), key: Some(key.clone()) };
    let env1 = env_of("1");
    let env1: Vec<(&str, &str)> = env1.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let n1_dir = dir.path().join("n1");
    std::fs::create_dir_all(&n1_dir).unwrap();
    let node1 = NodeProcess::start_with_tls(&n1_dir, &env1, probe.clone());

    // Node 2 starts empty, waiting to be added.
    let ports = tocsin_node::testing::free_ports(3);
    let [grpc2, http2, peer2] = [0, 1, 2].map(|i| format!("127.0.0.1:{}", ports[i]));
    let env2 = env_of("2");
    let env2: Vec<(&str, &str)> = env2.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut node2 = NodeProcess::start_member(dir.path(), 2, [&grpc2, &http2, &peer2], &["--join"], &env2);
    node2.set_probe_tls(probe);
    node2.wait_ready();

    let admin = |args: &[&str]| {
        let mut all = vec!["--tls-ca", ca.to_str().unwrap(), "--tls-cert", cert.to_str().unwrap()];
        all.extend(["--tls-key", key.to_str().unwrap(), "--token", ROOT, "admin", "--addr", &node1.grpc]);
        all.extend(args);
        cli(&all)
    };
    // Phase: asked on its client port, in plaintext, it cannot answer.
    let (ok, out, err) = admin(&["node", "add", &grpc2]);
    assert!(!ok, "node add reached a TLS client port in plaintext: {out}{err}");
    assert!(err.contains("cannot reach"), "{err}");
    // Phase: a --peer the node does not advertise is refused.
    let (ok, out, err) = admin(&["node", "add", &grpc2, "--peer", &node1.peer]);
    assert!(!ok, "node add took a peer address the node does not own: {out}{err}");
    // Phase: asked on its peer port, it is added.
    let (ok, out, err) = admin(&["node", "add", &grpc2, "--peer", &peer2]);
    assert!(ok && format!("{out}{err}").contains("node 2 added"), "{out}{err}");
    let (ok, out, err) = cli(&[
        "--tls-ca",
        ca.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--token",
        ROOT,
        "cluster",
        "status",
        "--addr",
        &node1.grpc,
        "--json",
    ]);
    assert!(ok, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    let nodes: Vec<u64> = status["nodes"].as_array().unwrap().iter().map(|n| n["node_id"].as_u64().unwrap()).collect();
    assert_eq!(nodes, vec![1, 2], "{out}");
}
