//! mTLS between nodes: a three-node cluster made with `tocsin certs` forms,
//! replicates and forwards over TLS; the peer port refuses plaintext, a
//! certificate from a foreign CA, and a Raft message whose `from_node` is
//! not the node its certificate names; a node given another node's
//! certificate does not start.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject as _;
use tocsin_client::v1 as pb;
use tocsin_client::v1::admin_service_client::AdminServiceClient;
use tocsin_client::v1::timer_service_client::TimerServiceClient;
use tokio::io::AsyncWriteExt as _;

use crate::support::NodeProcess;
use crate::support::Receiver;

fn tocsin(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin")).args(args).output().expect("run tocsin");
    assert!(out.status.success(), "tocsin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A raw TLS connection to a peer port with ALPN `tocsin-link/1`,
/// trusting `ca` and presenting `cert`/`key`; sends one Vote claiming to
/// come from `from_node` and returns the reply frame, if any came.
async fn raw_link_vote(
    addr: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
    from_node: u64,
) -> std::io::Result<Option<pb::RaftLinkFrame>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(ca).unwrap()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_file(cert).unwrap()],
            PrivateKeyDer::from_pem_file(key).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"tocsin-link/1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("node-1.peer.tocsin").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
    s.write_all(tocsin_contract::link_frame::PREFACE).await?;
    let request = pb::RaftLinkRequest {
        id: 1,
        kind: pb::RaftRpcKind::Vote as i32,
        group_id: 0,
        from_node,
        payload: vec![0xff; 8].into(),
        sent_at_ms: 0,
    };
    let mut buf = Vec::new();
    tocsin_contract::link_frame::encode_frame(
        &pb::RaftLinkFrame { requests: vec![request], replies: vec![] },
        &mut buf,
    );
    s.write_all(&buf).await?;
    let mut reader = tokio::io::BufReader::new(s);
    tokio::time::timeout(Duration::from_secs(5), tocsin_contract::link_frame::read_frame(&mut reader))
        .await
        .unwrap_or(Ok(None))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_speak_mtls_and_the_peer_port_refuses_strangers_and_forgeries() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let certs_s = certs.to_str().unwrap();

    // Phase: the CLI makes a CA and node certificates, and refuses to
    // overwrite them.
    tocsin(&["certs", "init", "--dir", certs_s]);
    tocsin(&["certs", "issue", "--dir", certs_s, "--node", "1,2,3"]);
    let again = Command::new(env!("CARGO_BIN_EXE_tocsin")).args(["certs", "init", "--dir", certs_s]).output().unwrap();
    assert!(!again.status.success(), "certs init overwrote a CA");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exist"));
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(certs.join("node-1.key")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a private key is readable by others");

    // Phase: three nodes with peer TLS form a cluster; creates sent to
    // every node are forwarded over TLS and fire.
    let receiver = Receiver::start().await;
    let nodes = NodeProcess::start_three(dir.path(), |_| vec![("TOCSIN_PEER_TLS__DIR".into(), certs_s.into())]);
    let mut clients = Vec::new();
    for n in &nodes {
        clients.push(TimerServiceClient::connect(format!("http://{}", n.grpc)).await.unwrap());
    }
    let now = crate::support::now_ms();
    let mut forwarded = 0;
    for i in 0..30 {
        let mut req = tocsin_client::webhook_timer("tls", &format!("t-{i}"), 0, &receiver.url);
        req.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(now + 1_500));
        let resp = crate::support::create_retrying_unavailable(&mut clients[i % 3], req)
            .await
            .expect("created over TLS between nodes");
        if resp.metadata().get("x-tocsin-leader").is_some() {
            forwarded += 1;
        }
    }
    assert!(forwarded > 0, "no create was forwarded between nodes");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while receiver.delivered().len() < 30 {
        assert!(tokio::time::Instant::now() < deadline, "delivered {} of 30", receiver.delivered().len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Phase: plaintext gRPC on a TLS peer port gets nowhere.
    let plain = async {
        let mut admin =
            AdminServiceClient::connect(format!("http://{}", nodes[0].peer)).await.map_err(|e| e.to_string())?;
        admin.get_cluster(pb::GetClusterRequest { digests: false }).await.map_err(|e| e.to_string())
    };
    let plain = tokio::time::timeout(Duration::from_secs(10), plain).await.expect("a refusal in time");
    assert!(plain.is_err(), "a plaintext client read the peer port: {plain:?}");

    // Phase: node 2's own certificate cannot speak for node 3 (the reply
    // says so), while speaking for itself reaches the handler (which
    // refuses the garbage vote as a bad payload).
    let (ca, c2, k2) = (certs.join("ca.pem"), certs.join("node-2.pem"), certs.join("node-2.key"));
    let forged = raw_link_vote(&nodes[0].peer, &ca, &c2, &k2, 3).await.expect("a TLS link").expect("a reply");
    let error = &forged.replies[0].reply.as_ref().unwrap().error;
    assert!(error.contains("from_node 3 is not the node"), "{error}");
    let honest = raw_link_vote(&nodes[0].peer, &ca, &c2, &k2, 2).await.expect("a TLS link").expect("a reply");
    let error = &honest.replies[0].reply.as_ref().unwrap().error;
    assert!(error.contains("bad payload"), "{error}");

    // Phase: a certificate for node 2 from another CA (the client trusts
    // the cluster's CA): the server ends the handshake, nothing answers.
    let foreign = dir.path().join("foreign");
    let foreign_s = foreign.to_str().unwrap();
    tocsin(&["certs", "init", "--dir", foreign_s]);
    tocsin(&["certs", "issue", "--dir", foreign_s, "--node", "2"]);
    let stranger =
        raw_link_vote(&nodes[0].peer, &ca, &foreign.join("node-2.pem"), &foreign.join("node-2.key"), 2).await;
    assert!(!matches!(stranger, Ok(Some(_))), "a foreign certificate was answered: {stranger:?}");
    let log = nodes[0].log();
    assert!(log.contains("TLS handshake failed"), "node 1 did not log the refused handshake");

    // Phase: a node given another node's certificate refuses to start.
    let wrong = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["serve", "--node-id", "4", "--join", "--insecure-no-auth", "--peer-tls-dir", certs_s])
        .arg("--data")
        .arg(dir.path().join("data-4"))
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--peer", "127.0.0.1:0"])
        .env("TOCSIN_PEER_TLS__CERT_FILE", certs.join("node-1.pem"))
        .env("TOCSIN_PEER_TLS__KEY_FILE", certs.join("node-1.key"))
        .output()
        .unwrap();
    assert!(!wrong.status.success(), "node 4 started with node 1's certificate");
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(stderr.contains("does not name this node"), "{stderr}");
}
