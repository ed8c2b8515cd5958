//! Every validation rule, over gRPC and over HTTP, with the exact error code
//! (and, for bad arguments, the field) asserted; plus the create-rate limit
//! and the free-disk watermark; and a node started among environment
//! variables that are not its settings.

use tocsin_client::v1 as pb;
use tocsin_client::v1::timer_service_client::TimerServiceClient;

use crate::support::NodeProcess;
use crate::support::now_ms;

/// (name, request, gRPC code, HTTP status, field)
fn bad_creates() -> Vec<(&'static str, pb::CreateTimerRequest, tonic::Code, u16, &'static str)> {
    let ok = || tocsin_client::webhook_timer("orders", "ok-1", 60_000, "http://127.0.0.1:9/hook");
    let with = |f: &dyn Fn(&mut pb::CreateTimerRequest)| {
        let mut r = ok();
        f(&mut r);
        r
    };
    use tonic::Code::InvalidArgument as IA;
    vec![
        ("bad namespace", with(&|r| r.namespace = "Orders!".into()), IA, 400, "namespace"),
        ("empty namespace", with(&|r| r.namespace.clear()), IA, 400, "namespace"),
        ("long namespace", with(&|r| r.namespace = "a".repeat(65)), IA, 400, "namespace"),
        ("empty id", with(&|r| r.id.clear()), IA, 400, "id"),
        ("long id", with(&|r| r.id = "x".repeat(257)), IA, 400, "id"),
        ("oversize payload", with(&|r| r.payload = vec![0; 64 * 1024 + 1].into()), IA, 400, "payload"),
        (
            "fire time in the past",
            with(&|r| r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(now_ms() - 3_600_000))),
            IA,
            400,
            "fire_at_ms",
        ),
        (
            "fire time beyond the horizon",
            with(&|r| r.fire_time = Some(pb::create_timer_request::FireTime::DelayMs(3 * 365 * 24 * 3600 * 1000))),
            IA,
            400,
            "delay_ms",
        ),
        ("no fire time", with(&|r| r.fire_time = None), IA, 400, "fire_at_ms"),
        ("no callback", with(&|r| r.callback = None), IA, 400, "callback"),
        (
            "bad webhook url",
            with(&|r| {
                r.callback = Some(pb::Callback {
                    target: Some(pb::callback::Target::Webhook(pb::Webhook { url: "ftp://x".into() })),
                })
            }),
            IA,
            400,
            "callback.webhook.url",
        ),
        (
            "bad topic",
            with(&|r| {
                r.callback = Some(pb::Callback {
                    target: Some(pb::callback::Target::Pull(pb::Pull { topic: "A B".into(), ttr_ms: 0 })),
                })
            }),
            IA,
            400,
            "callback.pull.topic",
        ),
        (
            "too many labels",
            with(&|r| r.labels = (0..17).map(|i| (format!("k{i}"), "v".into())).collect()),
            IA,
            400,
            "labels",
        ),
        (
            "too many attempts",
            with(&|r| r.retry = Some(pb::RetryPolicy { max_attempts: 5000, ..Default::default() })),
            IA,
            400,
            "retry.max_attempts",
        ),
    ]
}

/// Tocsin's `ErrorInfo` from a failed status, after checking that the
/// standard details any gRPC client reads (`google.rpc.Status`: ErrorInfo,
/// BadRequest, RetryInfo) say the same.
fn info(status: &tonic::Status) -> pb::ErrorInfo {
    use tonic_types::StatusExt;
    let details = status.check_error_details().expect("details are a google.rpc.Status");
    let info = tocsin_contract::codes::info_of(status);
    let standard = details.error_info().expect("google.rpc.ErrorInfo");
    assert_eq!(standard.domain, tocsin_contract::codes::ERROR_DOMAIN);
    assert_eq!(standard.metadata.get("code"), Some(&info.code), "{status:?}");
    let fields: Vec<&str> = details
        .bad_request()
        .map(|b| b.field_violations.iter().map(|v| v.field.as_str()).collect())
        .unwrap_or_default();
    if info.field.is_empty() {
        assert!(fields.is_empty(), "{status:?}");
    } else {
        assert_eq!(fields, [info.field.as_str()], "{status:?}");
    }
    let retry_ms = details.retry_info().and_then(|r| r.retry_delay).map(|d| d.as_millis() as u64);
    assert_eq!(retry_ms.unwrap_or(0), info.retry_after_ms, "{status:?}");
    info
}

fn json_create(r: &pb::CreateTimerRequest) -> serde_json::Value {
    use base64::Engine;
    let mut v = serde_json::json!({
        "namespace": r.namespace,
        "id": r.id,
        "payload": base64::engine::general_purpose::STANDARD.encode(&r.payload),
        "labels": r.labels,
    });
    match r.fire_time {
        Some(pb::create_timer_request::FireTime::FireAtMs(at)) => v["fire_at_ms"] = at.into(),
        Some(pb::create_timer_request::FireTime::DelayMs(d)) => v["delay_ms"] = d.into(),
        None => {}
    }
    match r.callback.as_ref().and_then(|c| c.target.as_ref()) {
        Some(pb::callback::Target::Webhook(w)) => v["callback"] = serde_json::json!({ "webhook": { "url": w.url } }),
        Some(pb::callback::Target::Pull(p)) => v["callback"] = serde_json::json!({ "pull": { "topic": p.topic } }),
        Some(pb::callback::Target::Amqp(a)) => {
            v["callback"] = serde_json::json!({
                "amqp": { "broker": a.broker, "exchange": a.exchange, "routing_key": a.routing_key }
            })
        }
        None => {}
    }
    if let Some(retry) = &r.retry {
        v["retry"] = serde_json::json!({ "max_attempts": retry.max_attempts });
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_answers_the_right_code() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let mut grpc = TimerServiceClient::connect(format!("http://{}", node.grpc)).await.unwrap();
    let http = tocsin_contract::tls::http_client_builder().build().unwrap();
    let base = format!("http://{}", node.http);

    // Phase: each bad create, both ways.
    for (name, req, code, status, field) in bad_creates() {
        let err = grpc.create_timer(req.clone()).await.expect_err(name);
        assert_eq!(err.code(), code, "{name}: {err:?}");
        assert_eq!(info(&err).field, field, "{name}");
        let resp = http.post(format!("{base}/v1/timers")).json(&json_create(&req)).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status, "{name} over HTTP");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "INVALID_ARGUMENT", "{name}: {body}");
        assert_eq!(body["error"]["field"], field, "{name}: {body}");
    }

    // Phase: malformed bodies over HTTP.
    for (name, body) in [
        ("not json", "{nope"),
        (
            "unknown field",
            r#"{"namespace":"a","id":"b","delay_ms":1,"callback":{"pull":{"topic":"t"}},"colour":"red"}"#,
        ),
        (
            "payload not base64",
            r#"{"namespace":"a","id":"b","delay_ms":1,"payload":"%%%","callback":{"pull":{"topic":"t"}}}"#,
        ),
        ("delay as a negative number", r#"{"namespace":"a","id":"b","delay_ms":-5,"callback":{"pull":{"topic":"t"}}}"#),
        ("empty body", ""),
    ] {
        let resp = http
            .post(format!("{base}/v1/timers"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{name}");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "INVALID_ARGUMENT", "{name}: {v}");
    }
    let both = r#"{"namespace":"a","id":"b","delay_ms":1,"fire_at_ms":1,"callback":{"pull":{"topic":"t"}}}"#;
    let resp = http.post(format!("{base}/v1/timers")).body(both).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 400, "fire_at_ms and delay_ms together");

    // Phase: a body over the size limit is refused before it is parsed.
    let huge = vec![b'a'; 9 << 20];
    let resp = http.post(format!("{base}/v1/timers")).body(huge.clone()).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "RESOURCE_EXHAUSTED");
    // A chunked body declares no length: the limit is found while reading,
    // and the client still gets its 413 after writing the whole body, not a
    // connection closed under it (a broken pipe).
    {
        use tokio::io::AsyncReadExt;
        use tokio::io::AsyncWriteExt;
        let mut tcp = tokio::net::TcpStream::connect(node.http.as_str()).await.unwrap();
        let head = "POST /v1/timers HTTP/1.1\r\nhost: tocsin\r\ncontent-type: application/json\r\n\
                    transfer-encoding: chunked\r\nconnection: close\r\n\r\n";
        tcp.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b'a'; 1 << 20];
        for i in 0..9 {
            tcp.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await.unwrap();
            tcp.write_all(&chunk).await.unwrap_or_else(|e| panic!("chunk {i} of a 9 MiB chunked body: {e}"));
            tcp.write_all(b"\r\n").await.unwrap();
        }
        tcp.write_all(b"0\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 413"), "{}", &answer[..answer.len().min(300)]);
        assert!(answer.contains("RESOURCE_EXHAUSTED"), "{answer}");
    }
    let mut big = tocsin_client::webhook_timer("orders", "huge", 1000, "http://127.0.0.1:9/hook");
    big.payload = huge.into();
    let err = grpc.create_timer(big).await.unwrap_err();
    assert!(matches!(err.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted), "{err:?}");

    // Phase: batch rules.
    let many = pb::CreateTimersRequest {
        timers: (0..1001)
            .map(|i| tocsin_client::webhook_timer("orders", &format!("b-{i}"), 60_000, "http://127.0.0.1:9/h"))
            .collect(),
    };
    let err = grpc.create_timers(many).await.unwrap_err();
    assert_eq!((err.code(), info(&err).field.as_str()), (tonic::Code::InvalidArgument, "timers"));
    let mixed = pb::CreateTimersRequest {
        timers: vec![
            tocsin_client::webhook_timer("orders", "m-1", 60_000, "http://127.0.0.1:9/h"),
            tocsin_client::webhook_timer("BAD", "m-2", 60_000, "http://127.0.0.1:9/h"),
        ],
    };
    let results = grpc.create_timers(mixed).await.unwrap().into_inner().results;
    assert!(matches!(results[0].result, Some(pb::create_timer_result::Result::Ok(_))));
    match &results[1].result {
        Some(pb::create_timer_result::Result::Error(e)) => {
            assert_eq!((e.code.as_str(), e.field.as_str()), ("INVALID_ARGUMENT", "namespace"))
        }
        other => panic!("{other:?}"),
    }

    // Phase: conflicts and preconditions.
    let created =
        grpc.create_timer(tocsin_client::webhook_timer("orders", "c-1", 60_000, "http://127.0.0.1:9/h")).await.unwrap();
    assert!(created.into_inner().created);
    let err = grpc
        .create_timer(tocsin_client::webhook_timer("orders", "c-1", 70_000, "http://127.0.0.1:9/h"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    let resp = http
        .post(format!("{base}/v1/timers"))
        .json(&json_create(&tocsin_client::webhook_timer("orders", "c-1", 70_000, "http://127.0.0.1:9/h")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 409);
    let resched = |generation| pb::RescheduleTimerRequest {
        namespace: "orders".into(),
        id: "c-1".into(),
        expected_generation: generation,
        fire_time: Some(pb::reschedule_timer_request::FireTime::DelayMs(90_000)),
    };
    let err = grpc.reschedule_timer(resched(7)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let resp = http
        .post(format!("{base}/v1/timers/orders/c-1:reschedule"))
        .body(r#"{"expected_generation":7,"delay_ms":90000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 412);
    let timer = grpc.reschedule_timer(resched(1)).await.unwrap().into_inner().timer.unwrap();
    assert_eq!(timer.generation, 2);
    let resp = http
        .post(format!("{base}/v1/timers/orders/nope:reschedule"))
        .body(r#"{"expected_generation":1,"delay_ms":9000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);

    // Phase: reads of what is not there, and bad list parameters.
    let err = grpc
        .get_timer(pb::GetTimerRequest { namespace: "orders".into(), id: "missing".into(), include_attempts: false })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert_eq!(http.get(format!("{base}/v1/timers/orders/missing")).send().await.unwrap().status().as_u16(), 404);
    let resp = http.delete(format!("{base}/v1/timers/orders/missing")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap()["outcome"], "NOT_FOUND");
    for (query, field) in [
        ("state=SLEEPING", "state"),
        ("page_token=garbage!", "page_token"),
        ("page_size=5000", "page_size"),
        ("fire_before_ms=abc", "fire_before_ms"),
        // A misspelt filter is refused, not ignored (it would list everything).
        ("sate=DEAD", "sate"),
    ] {
        let resp = http.get(format!("{base}/v1/timers/orders?{query}")).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{query}");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["field"], field, "{query}: {v}");
    }
    let well_formed =
        pb::DeliveryRef { namespace: "orders".into(), id: "c-0".into(), fire_id: String::new(), attempt: 1 };
    let err = grpc
        .ack(pb::AckRequest {
            deliveries: vec![
                pb::DeliveryRef { fire_id: "nope".into(), ..well_formed.clone() },
                pb::DeliveryRef { id: "c-1".into(), fire_id: "xyz".into(), ..well_formed.clone() },
            ],
        })
        .await
        .unwrap_err();
    assert_eq!((err.code(), info(&err).field.as_str()), (tonic::Code::InvalidArgument, "deliveries.fire_id"));
    assert!(err.message().contains("deliveries[0]") && err.message().contains("nothing"), "{}", err.message());
    let err = grpc
        .ack(pb::AckRequest { deliveries: vec![pb::DeliveryRef { namespace: "bad ns!".into(), ..well_formed }] })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(info(&err).field.starts_with("deliveries."), "{:?}", info(&err).field);
    assert!(err.message().contains("deliveries[0]"), "{}", err.message());

    // Phase: unknown routes answer JSON 404s; the process is still healthy.
    assert_eq!(http.get(format!("{base}/v2/whatever")).send().await.unwrap().status().as_u16(), 404);
    assert!(http.get(format!("{base}/healthz")).send().await.unwrap().status().is_success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_and_disk_watermark_refuse_creates() {
    let dir = tempfile::tempdir().unwrap();
    // Phase: 5 creates per second per namespace.
    let node = NodeProcess::start(dir.path(), &[("TOCSIN_ADMISSION__CREATE_RATE_PER_NAMESPACE", "5")]);
    let mut grpc = TimerServiceClient::connect(format!("http://{}", node.grpc)).await.unwrap();
    let mut refused = None;
    for i in 0..20 {
        if let Err(e) = grpc
            .create_timer(tocsin_client::webhook_timer("limited", &format!("r-{i}"), 60_000, "http://127.0.0.1:9/h"))
            .await
        {
            refused = Some((i, e));
            break;
        }
    }
    let (i, err) = refused.expect("the rate limit refuses a burst");
    assert!(i >= 5, "the first 5 pass");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(info(&err).retry_after_ms > 0);
    // Another namespace is unaffected.
    assert!(
        grpc.create_timer(tocsin_client::webhook_timer("other", "o-1", 60_000, "http://127.0.0.1:9/h")).await.is_ok()
    );
    drop(node);

    // Phase: a watermark above the disk's free space refuses creates, over gRPC
    // and HTTP, while reads still work.
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[("TOCSIN_ADMISSION__MIN_FREE_DISK_BYTES", "9000000000000000000")]);
    let mut grpc = TimerServiceClient::connect(format!("http://{}", node.grpc)).await.unwrap();
    // The watcher samples once a second.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let err = grpc
        .create_timer(tocsin_client::webhook_timer("full", "f-1", 60_000, "http://127.0.0.1:9/h"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.message().contains("free disk"), "{}", err.message());
    let resp = tocsin_contract::tls::http_client_builder()
        .build()
        .unwrap()
        .post(format!("http://{}/v1/timers", node.http))
        .body(r#"{"namespace":"full","id":"f-2","delay_ms":60000,"callback":{"pull":{"topic":"t"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    let err = grpc
        .get_timer(pb::GetTimerRequest { namespace: "full".into(), id: "f-1".into(), include_attempts: false })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "reads still work");
}

/// Kubernetes injects `TOCSIN_SERVICE_HOST`, `TOCSIN_PORT` and the like into
/// every pod of a namespace with a Service named `tocsin`, and the CLI reads
/// `TOCSIN_ADDR`: `tocsin serve` starts anyway, says which it ignored, and
/// still reads its real settings from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_starts_among_kubernetes_service_variables() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(
        dir.path(),
        &[
            ("TOCSIN_SERVICE_HOST", "10.96.0.10"),
            ("TOCSIN_SERVICE_PORT", "7070"),
            ("TOCSIN_SERVICE_PORT_GRPC", "7070"),
            ("TOCSIN_PORT", "tcp://10.96.0.10:7070"),
            ("TOCSIN_PORT_7070_TCP", "tcp://10.96.0.10:7070"),
            ("TOCSIN_PORT_7070_TCP_PROTO", "tcp"),
            ("TOCSIN_ADDR", "127.0.0.1:1"),
            ("TOCSIN_ADMISSION__CREATE_RATE_PER_NAMESPACE", "5"),
        ],
    );
    let log = node.log();
    for ignored in ["TOCSIN_SERVICE_HOST", "TOCSIN_PORT_7070_TCP"] {
        assert!(log.contains(ignored) && log.contains("ignoring a TOCSIN_*"), "no warning about {ignored}:\n{log}");
    }
    assert!(!log.contains("TOCSIN_ADDR"), "the CLI's own variable is not warned about:\n{log}");
    // The real setting among them applies: the sixth create in a second is refused.
    let mut client = TimerServiceClient::connect(format!("http://{}", node.grpc)).await.unwrap();
    let mut refused = 0;
    for i in 0..10 {
        let req = tocsin_client::pull_timer("k8s", &format!("t-{i}"), now_ms() + 60_000, "t");
        if let Err(s) = client.create_timer(req).await {
            assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
            refused += 1;
        }
    }
    assert!(refused >= 4, "the create rate from the environment applies: {refused} of 10 refused");
}
