//! The SSRF guard end to end, on a `tocsin serve` node whose allowlist names
//! one host (`allowed.test`) and no address:
//! - every loopback, private, link-local, unique-local, IPv4-mapped, NAT64
//!   and numeric-trick form of a webhook target is refused at create, over
//!   gRPC, HTTP and in a batch, with INVALID_ARGUMENT on
//!   `callback.webhook.url`, and nothing is stored;
//! - a name that resolves to loopback only at delivery (DNS rebinding,
//!   through the test-build hosts file) is refused at connect: the timer
//!   goes DEAD with a class in `last_error`;
//! - a receiver on an allowed name that redirects to loopback is not
//!   followed;
//! - a loopback canary listener, the target of all of the above, sees no
//!   connection at all, while the allowed name's receiver gets its delivery
//!   (so the same path does connect when allowed).

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tocsin_client::v1 as pb;
use tocsin_client::v1::timer_service_client::TimerServiceClient;

use crate::support::NodeProcess;
use crate::support::Receiver;
use crate::support::now_ms;

/// Counts TCP connections accepted on a loopback port (IPv4, and IPv6 on
/// the same port where the machine has `::1`).
struct Canary {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl Canary {
    fn start() -> Canary {
        let v4 = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = v4.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let mut listeners = vec![v4];
        if let Ok(v6) = TcpListener::bind(("::1", port)) {
            listeners.push(v6);
        }
        for listener in listeners {
            let accepted = accepted.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    drop(conn);
                }
            });
        }
        Canary { port, accepted }
    }
}

fn hook(url: &str) -> Option<pb::Callback> {
    Some(pb::Callback { target: Some(pb::callback::Target::Webhook(pb::Webhook { url: url.into() })) })
}

async fn wait_state(
    grpc: &mut TimerServiceClient<tonic::transport::Channel>,
    id: &str,
    state: pb::timer::State,
) -> pb::Timer {
    let deadline = now_ms() + 30_000;
    loop {
        let timer = grpc
            .get_timer(pb::GetTimerRequest { namespace: "egress".into(), id: id.into(), include_attempts: false })
            .await
            .unwrap()
            .into_inner()
            .timer
            .unwrap();
        if timer.state() == state || now_ms() > deadline {
            return timer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_targets_off_the_allowlist_reach_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let canary = Canary::start();
    let receiver = Receiver::start().await;
    let receiver_port = receiver.url.rsplit(':').next().unwrap().split('/').next().unwrap().to_string();
    // A receiver on an allowed name that redirects every request to the canary.
    let redirect_to = format!("http://127.0.0.1:{}/redirected", canary.port);
    let app = axum::Router::new().fallback(move || {
        let to = redirect_to.clone();
        async move { (axum::http::StatusCode::TEMPORARY_REDIRECT, [("location", to)]) }
    });
    let redirector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redirector_port = redirector.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(redirector, app).await });

    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "rebind.test 127.0.0.1\nrebind.test ::1\nallowed.test 127.0.0.1\n").unwrap();
    let node = NodeProcess::start(
        dir.path(),
        &[("TOCSIN_DELIVERY__WEBHOOK_ALLOW", "allowed.test"), ("TOCSIN_TEST_HOSTS_FILE", hosts.to_str().unwrap())],
    );
    let mut grpc = TimerServiceClient::connect(format!("http://{}", node.grpc)).await.unwrap();
    let http = tocsin_contract::tls::http_client_builder().build().unwrap();
    let p = canary.port;

    // Phase: every refused form, at create, both ways and in a batch.
    let refused = [
        format!("http://127.0.0.1:{p}/x"),
        format!("http://127.9.9.9:{p}/x"),
        format!("http://2130706433:{p}/x"),
        format!("http://0x7f.1:{p}/x"),
        format!("http://0x7f000001:{p}/x"),
        format!("http://0177.0.0.1:{p}/x"),
        format!("http://127.1:{p}/x"),
        format!("http://[::1]:{p}/x"),
        format!("http://[::ffff:127.0.0.1]:{p}/x"),
        format!("http://[::ffff:7f00:1]:{p}/x"),
        format!("http://[64:ff9b::7f00:1]:{p}/x"),
        format!("http://[2002:7f00:1::1]:{p}/x"),
        format!("http://localhost:{p}/x"),
        format!("http://LocalHost.:{p}/x"),
        format!("http://0.0.0.0:{p}/x"),
        format!("http://[::]:{p}/x"),
        format!("http://allowed.test@127.0.0.1:{p}/x"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        format!("http://[::ffff:169.254.169.254]:{p}/x"),
        format!("http://10.0.0.1:{p}/x"),
        format!("http://172.16.0.1:{p}/x"),
        format!("http://192.168.1.1:{p}/x"),
        format!("http://100.64.0.1:{p}/x"),
        format!("https://[fd00::1]:{p}/x"),
        format!("http://[fe80::1]:{p}/x"),
    ];
    for (i, url) in refused.iter().enumerate() {
        let id = format!("refused-{i}");
        let mut req = tocsin_client::webhook_timer("egress", &id, 500, url);
        req.callback = hook(url);
        let err = grpc.create_timer(req.clone()).await.expect_err(url);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{url}: {err:?}");
        let info = tocsin_contract::codes::info_of(&err);
        assert_eq!(info.field, "callback.webhook.url", "{url}");
        assert!(err.message().contains("egress policy"), "{url}: {}", err.message());

        let body = serde_json::json!({"namespace": "egress", "id": id, "delay_ms": 500,
            "callback": {"webhook": {"url": url}}});
        let resp = http.post(format!("http://{}/v1/timers", node.http)).json(&body).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{url} over HTTP");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["field"], "callback.webhook.url", "{url}: {v}");

        let batch = pb::CreateTimersRequest { timers: vec![req] };
        let results = grpc.create_timers(batch).await.unwrap().into_inner().results;
        match &results[0].result {
            Some(pb::create_timer_result::Result::Error(e)) => {
                assert_eq!((e.code.as_str(), e.field.as_str()), ("INVALID_ARGUMENT", "callback.webhook.url"), "{url}")
            }
            other => panic!("{url} in a batch: {other:?}"),
        }
        // Nothing was stored.
        let got = grpc.get_timer(pb::GetTimerRequest { namespace: "egress".into(), id, include_attempts: false }).await;
        assert_eq!(got.unwrap_err().code(), tonic::Code::NotFound, "{url}");
    }
    println!("{} refused forms: refused at create over gRPC, HTTP and in a batch", refused.len());

    // Phase: a name that is fine at create and loopback at connect, a
    // redirect to loopback from an allowed receiver, and an allowed name.
    let two_attempts = Some(pb::RetryPolicy { max_attempts: 2, initial_backoff_ms: 1000, ..Default::default() });
    let mut rebind = tocsin_client::webhook_timer("egress", "rebind", 300, &format!("http://rebind.test:{p}/rebind"));
    rebind.retry = two_attempts;
    assert!(grpc.create_timer(rebind).await.unwrap().into_inner().created, "a name passes at create");
    let mut redirect =
        tocsin_client::webhook_timer("egress", "redirect", 300, &format!("http://allowed.test:{redirector_port}/hook"));
    redirect.retry = Some(pb::RetryPolicy { max_attempts: 1, ..Default::default() });
    assert!(grpc.create_timer(redirect).await.unwrap().into_inner().created);
    let allowed =
        tocsin_client::webhook_timer("egress", "allowed", 300, &format!("http://allowed.test:{receiver_port}/hook"));
    assert!(grpc.create_timer(allowed).await.unwrap().into_inner().created);

    let rebind = wait_state(&mut grpc, "rebind", pb::timer::State::Dead).await;
    assert_eq!(rebind.state(), pb::timer::State::Dead, "{rebind:?}");
    let fire = rebind.fire.clone().unwrap();
    assert_eq!(fire.attempt, 2, "{rebind:?}");
    assert!(
        fire.last_error.contains("egress policy") && fire.last_error.contains("loopback"),
        "last_error names the class: {:?}",
        fire.last_error
    );
    let redirect = wait_state(&mut grpc, "redirect", pb::timer::State::Dead).await;
    assert_eq!(redirect.state(), pb::timer::State::Dead, "{redirect:?}");
    assert_eq!(redirect.fire.unwrap().last_error, "http 307", "a redirect is an answer, not followed");
    let allowed = wait_state(&mut grpc, "allowed", pb::timer::State::Delivered).await;
    assert_eq!(allowed.state(), pb::timer::State::Delivered, "{allowed:?}");
    assert_eq!(receiver.delivered()["allowed"].len(), 1);
    println!("rebind: DEAD after 2 attempts, last_error {:?}", fire.last_error);

    // Phase: the canary saw nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(canary.accepted.load(Ordering::SeqCst), 0, "the loopback canary was reached");
}
