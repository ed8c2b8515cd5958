//! The AMQP sink against a real RabbitMQ (Debian's `rabbitmq-server`,
//! which `.ci/setup` installs; the test starts its own broker in a temporary
//! directory on free ports): a delivery published to a direct exchange with
//! a routing key, confirmed, fencing fields in its headers; an unroutable
//! publish, a missing exchange and a broker that is down are failed
//! attempts, retried until the broker can take the message; a broker the
//! node does not know is refused at create.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::time::Duration;

use lapin::Connection;
use lapin::ConnectionProperties;
use lapin::ExchangeKind;
use lapin::message::BasicGetMessage;
use lapin::options::BasicGetOptions;
use lapin::options::ExchangeDeclareOptions;
use lapin::options::QueueBindOptions;
use lapin::options::QueueDeclareOptions;
use lapin::types::AMQPValue;
use lapin::types::FieldTable;
use tocsin_client::Client;
use tocsin_client::v1 as pb;

use crate::support::NodeProcess;
use crate::support::free_ports;

const RABBITMQ: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

/// A RabbitMQ node of the test's own: its data in `dir`, its ports free
/// ones, its own epmd (so nothing outlives the test).
struct Rabbit {
    dir: PathBuf,
    amqp_port: u16,
    dist_port: u16,
    epmd_port: u16,
    epmd: Option<Child>,
    server: Option<Child>,
}

impl Rabbit {
    fn start(dir: &Path) -> Rabbit {
        assert!(
            Path::new(RABBITMQ).exists(),
            "{RABBITMQ} is missing: install Debian's rabbitmq-server (.ci/setup does)"
        );
        let ports = free_ports(3);
        let mut rabbit = Rabbit {
            dir: dir.to_path_buf(),
            amqp_port: ports[0],
            dist_port: ports[1],
            epmd_port: ports[2],
            epmd: None,
            server: None,
        };
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        rabbit.epmd = Some(
            Command::new("epmd")
                .args(["-port", &rabbit.epmd_port.to_string(), "-address", "127.0.0.1"])
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("epmd"),
        );
        rabbit.spawn();
        rabbit
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.join("rabbit.log")).unwrap();
        let child = Command::new(RABBITMQ)
            .env("HOME", &self.dir)
            .env("RABBITMQ_NODENAME", format!("tocsin{}@localhost", self.amqp_port))
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.amqp_port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", self.dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("rabbitmq-server");
        self.server = Some(child);
    }

    /// Kills the broker (its whole process group): its connections drop.
    fn kill(&mut self) {
        if let Some(mut child) = self.server.take() {
            // `--`: a negative pid names the process group, not an option.
            let _ = Command::new("kill").args(["-s", "KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.wait();
        }
    }

    fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A client connection once the broker takes one (it starts in ~10 s).
    async fn connect(&self) -> Connection {
        let until = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            match Connection::connect(&self.url(), ConnectionProperties::default()).await {
                Ok(c) => return c,
                Err(_) if std::time::Instant::now() < until => tokio::time::sleep(Duration::from_millis(250)).await,
                Err(e) => panic!(
                    "RabbitMQ did not come up: {e}; log:\n{}",
                    std::fs::read_to_string(self.dir.join("rabbit.log")).unwrap_or_default()
                ),
            }
        }
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        self.kill();
        if let Some(mut epmd) = self.epmd.take() {
            let _ = epmd.kill();
            let _ = epmd.wait();
        }
    }
}

/// Declares a durable queue bound to `exchange` under its own name.
async fn bind_queue(channel: &lapin::Channel, exchange: &str, queue: &str) {
    channel.queue_declare(queue.into(), QueueDeclareOptions::durable(), FieldTable::default()).await.unwrap();
    channel
        .queue_bind(queue.into(), exchange.into(), queue.into(), QueueBindOptions::default(), FieldTable::default())
        .await
        .unwrap();
}

async fn declare_exchange(channel: &lapin::Channel, exchange: &str) {
    let options = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
    channel.exchange_declare(exchange.into(), ExchangeKind::Direct, options, FieldTable::default()).await.unwrap();
}

/// The next message on `queue`, waiting up to `limit`.
async fn next_message(channel: &lapin::Channel, queue: &str, limit: Duration) -> BasicGetMessage {
    let until = std::time::Instant::now() + limit;
    loop {
        let options = BasicGetOptions { no_ack: true };
        if let Some(message) = channel.basic_get(queue.into(), options).await.unwrap() {
            return message;
        }
        assert!(std::time::Instant::now() < until, "no message on {queue} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn amqp_timer(id: &str, exchange: &str, routing_key: &str) -> pb::CreateTimerRequest {
    let mut req = tocsin_client::webhook_timer("apps", id, 200, "http://unused.invalid/");
    req.callback = Some(pb::Callback {
        target: Some(pb::callback::Target::Amqp(pb::Amqp {
            broker: "main".into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        })),
    });
    req.retry = Some(pb::RetryPolicy { initial_backoff_ms: 1000, max_backoff_ms: 1000, ..Default::default() });
    req
}

async fn state_of(client: &Client, id: &str) -> (i32, Vec<pb::AttemptInfo>) {
    let t = client.get_timer_with("apps", id, true).await.unwrap();
    (t.state, t.attempts)
}

async fn wait_delivered(client: &Client, id: &str) -> Vec<pb::AttemptInfo> {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (state, attempts) = state_of(client, id).await;
        if state == pb::timer::State::Delivered as i32 {
            return attempts;
        }
        assert!(std::time::Instant::now() < until, "{id} not DELIVERED: state {state}, attempts {attempts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `id` has at least `n` failed attempts of class `class`.
async fn wait_failed(client: &Client, id: &str, n: usize, classes: &[&str]) -> Vec<pb::AttemptInfo> {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (state, attempts) = state_of(client, id).await;
        let failed = attempts.iter().filter(|a| classes.contains(&a.class.as_str())).count();
        if failed >= n {
            assert_eq!(state, pb::timer::State::Firing as i32, "still retrying");
            return attempts;
        }
        assert!(std::time::Instant::now() < until, "{id}: {n} attempts of {classes:?} expected: {attempts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn header<'a>(message: &'a BasicGetMessage, name: &str) -> &'a AMQPValue {
    let headers = message.delivery.properties.headers().as_ref().expect("headers");
    headers.inner().get(name).unwrap_or_else(|| panic!("no {name} header in {headers:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publishes_are_confirmed_fenced_and_retried_until_the_broker_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut rabbit = Rabbit::start(dir.path());
    let connection = rabbit.connect().await;
    let channel = connection.create_channel().await.unwrap();
    declare_exchange(&channel, "apps").await;
    bind_queue(&channel, "apps", "app-a").await;
    let node = NodeProcess::start(dir.path(), &[("TOCSIN_DELIVERY__AMQP_BROKERS__MAIN", &rabbit.url())]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();

    // Phase: from the CLI, published to the exchange with the routing key,
    // the fencing fields in the body and in the headers.
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["timer", "create", "--addr", &node.grpc, "apps", "order-1", "--delay-ms", "300"])
        .args(["--amqp-broker", "main", "--exchange", "apps", "--routing-key", "app-a", "--payload", "hello"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let message = next_message(&channel, "app-a", Duration::from_secs(15)).await;
    let body: serde_json::Value = serde_json::from_slice(&message.delivery.data).unwrap();
    assert_eq!(body["id"], "order-1");
    assert_eq!(body["payload"], "aGVsbG8="); // "hello"
    let fire_id = body["fire_id"].as_str().unwrap().to_string();
    assert!(message.delivery.properties.message_id().as_ref().is_some_and(|m| m.as_str() == fire_id));
    assert_eq!(*message.delivery.properties.delivery_mode(), Some(2), "persistent");
    assert_eq!(header(&message, "tocsin-fire-id"), &AMQPValue::LongString(fire_id.as_str().into()));
    assert_eq!(header(&message, "tocsin-epoch"), &AMQPValue::LongLongInt(body["epoch"].as_i64().unwrap()));
    assert_eq!(header(&message, "tocsin-shard"), &AMQPValue::LongLongInt(body["shard"].as_i64().unwrap()));
    assert_eq!(
        header(&message, "tocsin-cluster-id"),
        &AMQPValue::LongString(body["cluster_id"].as_str().unwrap().into())
    );
    let attempts = wait_delivered(&client, "order-1").await;
    assert_eq!(attempts.last().map(|a| a.class.as_str()), Some("ack"), "{attempts:?}");

    // Phase: no queue bound for the routing key: the broker returns the
    // message, which is a failed attempt; once a queue is bound, delivered.
    client.create_timer(amqp_timer("order-2", "apps", "app-b")).await.unwrap();
    let attempts = wait_failed(&client, "order-2", 2, &["unroutable"]).await;
    assert!(attempts[0].error.contains("NO_ROUTE"), "{attempts:?}");
    bind_queue(&channel, "apps", "app-b").await;
    let message = next_message(&channel, "app-b", Duration::from_secs(15)).await;
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&message.delivery.data).unwrap()["id"], "order-2");
    wait_delivered(&client, "order-2").await;

    // Phase: an exchange that does not exist closes the node's channel; the
    // attempts fail and the node opens a new channel for the next ones.
    client.create_timer(amqp_timer("order-3", "late-exchange", "app-c")).await.unwrap();
    wait_failed(&client, "order-3", 2, &["amqp_error"]).await;
    declare_exchange(&channel, "late-exchange").await;
    channel.queue_declare("app-c".into(), QueueDeclareOptions::durable(), FieldTable::default()).await.unwrap();
    channel
        .queue_bind(
            "app-c".into(),
            "late-exchange".into(),
            "app-c".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    next_message(&channel, "app-c", Duration::from_secs(15)).await;
    wait_delivered(&client, "order-3").await;

    // Phase: the broker is down: attempts fail (connection), the timer keeps
    // retrying, and once the broker is back (its durable queue with it) the
    // node reconnects and the message arrives.
    drop(channel);
    drop(connection);
    rabbit.kill();
    client.create_timer(amqp_timer("order-4", "apps", "app-a")).await.unwrap();
    wait_failed(&client, "order-4", 2, &["connection", "timeout", "amqp_error"]).await;
    rabbit.restart();
    let connection = rabbit.connect().await;
    let channel = connection.create_channel().await.unwrap();
    let message = next_message(&channel, "app-a", Duration::from_secs(30)).await;
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&message.delivery.data).unwrap()["id"], "order-4");
    wait_delivered(&client, "order-4").await;

    // Phase: a broker the node's configuration does not name is refused at
    // create, naming the field.
    let mut unknown = amqp_timer("order-5", "apps", "app-a");
    if let Some(pb::callback::Target::Amqp(a)) = unknown.callback.as_mut().and_then(|c| c.target.as_mut()) {
        a.broker = "elsewhere".into();
    }
    let refused = client.create_timer(unknown).await.unwrap_err();
    assert!(refused.to_string().contains("callback.amqp.broker"), "{refused}");
}
