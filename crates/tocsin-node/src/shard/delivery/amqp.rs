//! AMQP delivery: a publish of the JSON [`Delivery`] body per attempt to an
//! exchange on a broker the node's configuration names
//! (`delivery.amqp_brokers`), RabbitMQ's publisher confirms deciding the
//! outcome.
//!
//! - **Success only on the broker's ack.** Every publish is persistent
//!   (delivery mode 2) and `mandatory`, on a channel in confirm mode. An ack
//!   with nothing returned is delivered. A message the broker returns
//!   (`NO_ROUTE`: no queue bound for the routing key), a nack, an error
//!   (an exchange that does not exist closes the channel) or no confirm
//!   before the attempt's deadline is a failed attempt, retried with the
//!   timer's backoff like a failed webhook, and recorded in its history with
//!   the class `unroutable`, `nack`, `amqp_error`, `connection` or
//!   `timeout`.
//! - **Fencing** travels in the body (as for webhooks) and in the message's
//!   headers: `tocsin-fire-id`, `tocsin-cluster-id`, `tocsin-shard`,
//!   `tocsin-epoch`, `tocsin-attempt`; the fire id is also the message id,
//!   for brokers' and consumers' deduplication.
//! - One connection and one confirm channel per broker, opened on first use
//!   and opened again after it breaks; publishes share the channel, each
//!   waiting for its own confirm. A broker that is down costs each attempt
//!   at most its deadline and then backs off.
//! - Clients name a broker, never an address: the brokers, and the
//!   credentials in their URLs, are the operator's.
//!
//! [`Delivery`]: tocsin_contract::json::DeliveryJson

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::Channel;
use lapin::Confirmation;
use lapin::Connection;
use lapin::ConnectionProperties;
use lapin::options::BasicPublishOptions;
use lapin::options::ConfirmSelectOptions;
use lapin::types::AMQPValue;
use lapin::types::FieldTable;
use tocsin_contract::json::DeliveryJson;
use tocsin_core::Callback;
use tocsin_core::FirePhase;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::command::AttemptOutcome;
use tocsin_core::command::AttemptReport;

use crate::config::BrokerUrl;
use crate::shard::ShardCtx;
use crate::shard::delivery::attempt;

/// Longest a connection (TCP, AMQP handshake, channel, confirm mode) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

struct Broker {
    url: String,
    /// The open channel, if any; replaced when it breaks.
    channel: tokio::sync::Mutex<Option<(Connection, Channel)>>,
}

impl Broker {
    /// The confirm channel, opening the connection if there is none or it
    /// broke. Held only while opening: publishes run side by side.
    async fn channel(&self) -> Result<Channel, lapin::Error> {
        let mut open = self.channel.lock().await;
        if let Some((connection, channel)) = open.as_ref()
            && connection.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        *open = None;
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        *open = Some((connection, channel.clone()));
        Ok(channel)
    }
}

/// Publishes AMQP deliveries for every shard this node leads.
pub struct AmqpSender {
    brokers: HashMap<String, Arc<Broker>>,
}

/// How one publish ended: the error, and its class for the history.
type Published = Result<(), (String, &'static str)>;

impl AmqpSender {
    pub fn new(brokers: &std::collections::BTreeMap<String, BrokerUrl>) -> AmqpSender {
        let brokers = brokers
            .iter()
            .map(|(name, url)| {
                (name.clone(), Arc::new(Broker { url: url.0.clone(), channel: tokio::sync::Mutex::new(None) }))
            })
            .collect();
        AmqpSender { brokers }
    }

    /// Whether this node's configuration names `broker`: a create naming
    /// another is refused.
    pub fn knows(&self, broker: &str) -> bool {
        self.brokers.contains_key(broker)
    }

    /// Starts one attempt of a timer whose `Fire` just applied under `epoch`.
    pub fn spawn(self: &Arc<Self>, ctx: Arc<ShardCtx>, epoch: u64, key: TimerKey, record: TimerRecord) {
        let this = self.clone();
        tokio::spawn(async move {
            let Some(fire) = record.fire.clone() else { return };
            let FirePhase::InFlight { until_ms, .. } = fire.phase else { return };
            let Some((published, latency_ms)) = this.attempt(&ctx, epoch, &key, &record, until_ms).await else {
                return;
            };
            let now = ctx.clock.now_ms();
            let (outcome, class) = match published {
                Ok(()) => {
                    attempt::observe_delivered(&key, record.fire_at_ms, now);
                    (AttemptOutcome::Delivered, "ack")
                }
                Err((error, class)) => {
                    let backoff = tocsin_core::backoff::backoff_ms(&record.retry, fire.attempt, rand::random::<f64>());
                    (AttemptOutcome::Failed { error, retry_at_ms: now.saturating_add(backoff) }, class)
                }
            };
            metrics::counter!("tocsin_amqp_publishes_total", "class" => class).increment(1);
            attempt::record(&ctx, epoch, key, &fire, outcome, AttemptReport::new(0, class, latency_ms)).await;
        });
    }

    /// Publishes one attempt and waits for its confirm; `None` when it is
    /// left to its deadline (the lease was lost, no time is left).
    async fn attempt(
        &self,
        ctx: &ShardCtx,
        epoch: u64,
        key: &TimerKey,
        record: &TimerRecord,
        until_ms: u64,
    ) -> Option<(Published, u32)> {
        let Callback::Amqp { broker, exchange, routing_key } = &record.callback else { return None };
        let Some(broker_conn) = self.brokers.get(broker) else {
            // Created through a node that has it, led by one that has not:
            // the operator's configurations differ. Retried, so that fixing
            // them delivers it.
            let error = format!("no AMQP broker named {broker:?} is configured on this node");
            return Some((Err((error, "unknown_broker")), 0));
        };
        let left_ms = attempt::gate(ctx, epoch, until_ms, "amqp").await?;
        attempt::note_wait(ctx, key, record);
        let body = DeliveryJson::from_record(ctx.cluster_id().unwrap_or_default(), ctx.shard, key, record);
        let mut headers = FieldTable::default();
        headers.insert("tocsin-fire-id".into(), AMQPValue::LongString(body.fire_id.as_str().into()));
        headers.insert("tocsin-cluster-id".into(), AMQPValue::LongString(body.cluster_id.as_str().into()));
        headers.insert("tocsin-shard".into(), AMQPValue::LongLongInt(i64::from(body.shard)));
        headers.insert("tocsin-epoch".into(), AMQPValue::LongLongInt(body.epoch as i64));
        headers.insert("tocsin-attempt".into(), AMQPValue::LongLongInt(i64::from(body.attempt)));
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(body.fire_id.as_str().into())
            .with_timestamp(ctx.clock.now_ms() / 1000)
            .with_headers(headers);
        let payload = serde_json::to_vec(&body).expect("delivery serializes");
        let started = std::time::Instant::now();
        let publish = async {
            let channel = tokio::time::timeout(CONNECT_TIMEOUT, broker_conn.channel())
                .await
                .map_err(|_| ("connecting to the broker timed out".to_string(), "connection"))?
                .map_err(|e| (format!("connecting to the broker: {e}"), "connection"))?;
            let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
            let confirm = channel
                .basic_publish(exchange.as_str().into(), routing_key.as_str().into(), options, &payload, properties)
                .await
                .map_err(|e| (format!("publish: {e}"), "amqp_error"))?
                .await
                .map_err(|e| (format!("publish confirm: {e}"), "amqp_error"))?;
            match confirm {
                Confirmation::Ack(None) => Ok(()),
                Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => Err((
                    format!(
                        "unroutable: the broker returned it ({} {}): no queue is bound to exchange {exchange:?} \
                         for routing key {routing_key:?}",
                        returned.reply_code, returned.reply_text
                    ),
                    "unroutable",
                )),
                Confirmation::Nack(None) => Err(("the broker nacked the publish".to_string(), "nack")),
                Confirmation::NotRequested => Err(("the channel is not in confirm mode".to_string(), "amqp_error")),
            }
        };
        let published = match tokio::time::timeout(Duration::from_millis(left_ms), publish).await {
            Ok(published) => published,
            Err(_) => Err(("no confirm before the attempt's deadline".to_string(), "timeout")),
        };
        let latency_ms = started.elapsed().as_millis().min(u128::from(u32::MAX)) as u32;
        metrics::histogram!("tocsin_amqp_publish_seconds").record(f64::from(latency_ms) / 1000.0);
        Some((published, latency_ms))
    }
}
