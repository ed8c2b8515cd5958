//! The gRPC conventions other tools rely on, against a real node: the
//! `grpc.health.v1` service tied to readiness (what Kubernetes gRPC probes
//! and load balancers call), server reflection (what grpcurl lists and
//! describes the API with), and a default `Reserve` batch that a client with
//! the 4 MiB receive limit of grpc-go and grpcio can read. The standard
//! error details are asserted on every refusal of `bad_input.rs`.

use std::collections::HashSet;
use std::time::Duration;

use prost::Message;
use tocsin_client::v1 as pb;
use tocsin_client::v1::timer_service_client::TimerServiceClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1 as reflection;

use crate::support::NodeProcess;
use crate::support::now_ms;

async fn channel(node: &NodeProcess) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{}", node.grpc)).unwrap().connect().await.unwrap()
}

/// One reflection request, its one answer.
async fn reflect(
    channel: &tonic::transport::Channel,
    request: reflection::server_reflection_request::MessageRequest,
) -> reflection::server_reflection_response::MessageResponse {
    let mut client = reflection::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let req = reflection::ServerReflectionRequest { host: String::new(), message_request: Some(request) };
    let mut answers = client.server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
    answers.message().await.unwrap().expect("an answer").message_response.expect("a response")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_reflection_and_a_reserve_batch_that_fits_four_mib() {
    let dir = tempfile::tempdir().unwrap();
    // JSON logs with the access log on: the last phase reads them.
    let node = NodeProcess::start(dir.path(), &[("TOCSIN_LOG_FORMAT", "json"), ("TOCSIN_ACCESS_LOG", "true")]);
    let channel = channel(&node).await;

    // Phase: health. A ready node serves, as a whole and per service; an
    // unknown service is NOT_FOUND, as the health protocol says.
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "tocsin.v1.TimerService", "tocsin.v1.AdminService"] {
        // The health service follows readiness within its 250 ms period:
        // `/readyz` answered 200 a moment ago.
        let mut status = ServingStatus::Unknown as i32;
        for _ in 0..20 {
            status = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner().status;
            if status == ServingStatus::Serving as i32 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    let unknown = health.check(HealthCheckRequest { service: "no.such.Service".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    // No token is needed: probes carry none (the node runs with tokens off
    // here; `auth.rs` runs the token checks, which guard the API services).

    // Phase: reflection lists the client services, not the peer ones this
    // port refuses, over v1 and the v1alpha older grpcurl builds use.
    use reflection::server_reflection_request::MessageRequest;
    use reflection::server_reflection_response::MessageResponse;
    let listed = match reflect(&channel, MessageRequest::ListServices(String::new())).await {
        MessageResponse::ListServicesResponse(list) => list.service.into_iter().map(|s| s.name).collect::<HashSet<_>>(),
        other => panic!("not a service list: {other:?}"),
    };
    for name in ["tocsin.v1.TimerService", "tocsin.v1.AdminService", "grpc.health.v1.Health"] {
        assert!(listed.contains(name), "{name} not listed: {listed:?}");
    }
    assert!(!listed.iter().any(|n| n.contains("RaftTransport") || n.contains("ReplicaControl")), "{listed:?}");
    {
        use tonic_reflection::pb::v1alpha as alpha;
        let mut client = alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
        let req = alpha::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(alpha::server_reflection_request::MessageRequest::ListServices(String::new())),
        };
        let mut answers = client.server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
        let answer = answers.message().await.unwrap().unwrap().message_response.unwrap();
        let alpha::server_reflection_response::MessageResponse::ListServicesResponse(list) = answer else {
            panic!("v1alpha: not a service list: {answer:?}");
        };
        assert!(list.service.iter().any(|s| s.name == "tocsin.v1.TimerService"), "{list:?}");
    }
    // Describing a service gives its file: enough for grpcurl to build a call.
    let files = match reflect(&channel, MessageRequest::FileContainingSymbol("tocsin.v1.TimerService".into())).await {
        MessageResponse::FileDescriptorResponse(f) => f.file_descriptor_proto,
        other => panic!("not a file: {other:?}"),
    };
    let file = files
        .iter()
        .map(|bytes| prost_types::FileDescriptorProto::decode(bytes.as_slice()).unwrap())
        .find(|f| f.service.iter().any(|s| s.name() == "TimerService"))
        .expect("the file that defines TimerService");
    let service = file.service.iter().find(|s| s.name() == "TimerService").unwrap();
    let methods: HashSet<_> = service.method.iter().map(|m| m.name().to_string()).collect();
    for m in ["CreateTimer", "CancelTimer", "RescheduleTimer", "Reserve", "Ack"] {
        assert!(methods.contains(m), "{m} missing: {methods:?}");
    }
    assert!(file.message_type.iter().any(|m| m.name() == "CreateTimerRequest"));

    // Phase: 300 pull timers with 64 KiB payloads (the default payload
    // limit), due now; a consumer whose client refuses messages over 4 MiB,
    // as grpc-go and grpcio do by default, reserves with the default batch
    // (256: 16 MiB in one message before) and gets every one of them.
    let mut timers = TimerServiceClient::new(channel.clone()).max_decoding_message_size(4 << 20);
    let due = now_ms() + 1_500;
    let payload: bytes::Bytes = vec![0xA5; 64 * 1024].into();
    for chunk in (0..300).collect::<Vec<_>>().chunks(25) {
        let reqs = chunk
            .iter()
            .map(|i| {
                let mut r = tocsin_client::pull_timer("big", &format!("b-{i}"), due, "jobs");
                r.payload = payload.clone();
                r
            })
            .collect();
        let resp = timers.create_timers(pb::CreateTimersRequest { timers: reqs }).await.unwrap().into_inner();
        assert!(
            resp.results.iter().all(|r| matches!(r.result, Some(pb::create_timer_result::Result::Ok(_)))),
            "{:?}",
            resp.results.first()
        );
    }
    let request = pb::ReserveRequest { namespace: "big".into(), topic: "jobs".into(), ..Default::default() };
    let mut stream = timers.reserve(request).await.unwrap().into_inner();
    let mut got = HashSet::new();
    let mut messages = 0;
    let deadline = now_ms() + 20_000;
    while got.len() < 300 && now_ms() < deadline {
        match tokio::time::timeout(Duration::from_secs(2), stream.message()).await {
            Ok(Ok(Some(batch))) => {
                messages += 1;
                assert!(batch.encoded_len() < 4 << 20, "a message of {} bytes", batch.encoded_len());
                for d in batch.deliveries {
                    assert_eq!(d.payload.len(), 64 * 1024);
                    got.insert(d.id);
                }
            }
            Ok(Ok(None)) => panic!("the stream ended"),
            Ok(Err(status)) => panic!("the 4 MiB client failed to read a batch: {status:?}"),
            Err(_) => {}
        }
    }
    assert_eq!(got.len(), 300, "every big timer reached the consumer");
    assert!(messages >= 6, "{messages} messages: 19 MiB of deliveries must come in several");
    drop(stream);

    // Phase: the metrics say what happened, each with its help text: 300
    // created in "big" (counted once, by the shards' leader), 12 batched
    // CreateTimers calls answered OK, the Reserve stream, a health check
    // answered NOT_FOUND.
    let http = tocsin_contract::tls::http_client_builder().build().unwrap();
    let text = http.get(format!("http://{}/metrics", node.http)).send().await.unwrap().text().await.unwrap();
    let value = |series: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("tocsin_timers_created_total{namespace=\"big\"}"), 300.0);
    assert_eq!(value("tocsin_timers_fired_total{namespace=\"big\"}"), 300.0);
    assert_eq!(value("tocsin_grpc_requests_total{method=\"tocsin.v1.TimerService/CreateTimers\",code=\"OK\"}"), 12.0);
    assert_eq!(value("tocsin_grpc_requests_total{method=\"grpc.health.v1.Health/Check\",code=\"NOT_FOUND\"}"), 1.0);
    assert!(value("tocsin_grpc_requests_total{method=\"tocsin.v1.TimerService/Reserve\",code=\"OK\"}") >= 1.0);
    for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.split(' ').next().unwrap()) {
        assert!(text.contains(&format!("# HELP {family} ")), "{family} has no help text");
    }

    // Phase: the log is JSON, a line per event, and the access log has a
    // line per call with its method and code.
    let log = node.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.len() > 10, "{} JSON lines in:\n{log}", lines.len());
    let access: Vec<&serde_json::Value> = lines.iter().filter(|l| l["target"] == "access").collect();
    let creates = access
        .iter()
        .filter(|l| l["fields"]["method"] == "tocsin.v1.TimerService/CreateTimers" && l["fields"]["code"] == "OK")
        .count();
    assert_eq!(creates, 12, "one access line per CreateTimers call");
    assert!(access.iter().any(|l| l["fields"]["proto"] == "http" && l["fields"]["route"] == "/metrics"));

    // Phase: shutting down, the node stops serving before it stops
    // answering: a watcher sees NOT_SERVING, so a balancer drains it.
    let mut watch = health.watch(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().expect("the current status");
    assert_eq!(first.status, ServingStatus::Serving as i32);
    node.signal("TERM");
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.expect("a status within 5 s");
    match next {
        Ok(Some(r)) => assert_eq!(r.status, ServingStatus::NotServing as i32),
        other => panic!("the watch ended without NOT_SERVING: {other:?}"),
    }
}
