//! `tocsin timer …`: one request each, through the shard-aware client.
//! Output is a short human-readable summary, or the JSON form with `--json`.

use std::process::ExitCode;

use anyhow::Context;
use tocsin_client::v1 as pb;
use tocsin_contract::json::TimerJson;

#[derive(clap::Args, Clone)]
pub struct Conn {
    /// gRPC address of any node (repeat for several).
    #[arg(long = "addr", default_value = "127.0.0.1:7070", env = "TOCSIN_ADDR")]
    addrs: Vec<String>,
    /// Print JSON instead of a summary.
    #[arg(long)]
    json: bool,
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(clap::Subcommand)]
pub enum TimerCommand {
    /// Create a timer (idempotent: the same id and spec returns the live timer). An id holding a
    /// finished timer (delivered, dead, cancelled) is refused unless --replace-finished.
    Create {
        #[command(flatten)]
        conn: Conn,
        namespace: String,
        id: String,
        /// Fire after this many milliseconds.
        #[arg(long, conflicts_with = "at")]
        delay_ms: Option<u64>,
        /// Fire at this unix time in milliseconds.
        #[arg(long)]
        at: Option<u64>,
        /// Deliver by POSTing to this URL.
        #[arg(long, conflicts_with_all = ["topic", "amqp_broker"])]
        webhook: Option<String>,
        /// Deliver by publishing to an AMQP exchange (RabbitMQ) on this broker, one the nodes'
        /// configuration names (delivery.amqp_brokers); with --exchange and --routing-key.
        #[arg(long, conflicts_with = "topic")]
        amqp_broker: Option<String>,
        /// With --amqp-broker: the exchange ("" for the default exchange).
        #[arg(long, default_value = "", requires = "amqp_broker")]
        exchange: String,
        /// With --amqp-broker: the routing key.
        #[arg(long, default_value = "", requires = "amqp_broker")]
        routing_key: String,
        /// Deliver by holding on this pull topic.
        #[arg(long)]
        topic: Option<String>,
        /// With --topic: how long a consumer's reservation of this timer lasts (overrides the
        /// consumer's); 0 = the consumer's.
        #[arg(long, default_value_t = 0, requires = "topic")]
        ttr_ms: u64,
        /// Payload, as text.
        #[arg(long, default_value = "")]
        payload: String,
        /// Labels, key=value (repeatable).
        #[arg(long = "label")]
        labels: Vec<String>,
        #[arg(long, default_value_t = 0)]
        max_attempts: u32,
        /// If the id holds a finished timer (DELIVERED, DEAD or CANCELLED), start a new one under
        /// it (its generation the old one's plus one). Without it such a create is refused.
        #[arg(long)]
        replace_finished: bool,
        /// The late-fire policy: skip the fire (the timer ends SKIPPED) if it comes more than
        /// this many ms after its time (after an outage, say); 0 = fire however late.
        #[arg(long, default_value_t = 0)]
        skip_if_late_ms: u64,
        #[command(flatten)]
        recurrence: RecurrenceArgs,
    },
    Get {
        #[command(flatten)]
        conn: Conn,
        namespace: String,
        id: String,
        /// Also print its delivery attempts (the latest 32): outcome, HTTP status, latency, error.
        #[arg(long)]
        attempts: bool,
    },
    /// List a namespace's timers.
    List {
        #[command(flatten)]
        conn: Conn,
        namespace: String,
        /// SCHEDULED, FIRING, DELIVERED, DEAD, CANCELLED or SKIPPED.
        #[arg(long)]
        state: Option<String>,
        /// Only DEAD timers that gave up for this reason: MAX_ATTEMPTS, GIVE_UP_AFTER or GONE.
        #[arg(long)]
        reason: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[arg(long, default_value = "")]
        page_token: String,
    },
    /// Cancel a timer; says whether it was cancelled (before firing, or while its delivery was
    /// retrying, and then whether an attempt may still arrive), already cancelled, already fired,
    /// or unknown.
    Cancel {
        #[command(flatten)]
        conn: Conn,
        namespace: String,
        id: String,
    },
    /// Move a scheduled timer's fire time (compare-and-set on its generation).
    Reschedule {
        #[command(flatten)]
        conn: Conn,
        namespace: String,
        id: String,
        /// The generation you last saw (see `timer get`).
        #[arg(long)]
        generation: u64,
        #[arg(long, conflicts_with = "at")]
        delay_ms: Option<u64>,
        #[arg(long)]
        at: Option<u64>,
    },
    /// Start DEAD timers over: each is scheduled again at once (its generation raised) and fires
    /// with a new fire id and a new attempt series.
    Redrive {
        #[command(flatten)]
        conn: Conn,
        namespace: String,
        /// The timers to redrive.
        #[arg(required_unless_present = "all_dead", conflicts_with = "all_dead")]
        ids: Vec<String>,
        /// Every DEAD timer of the namespace (with --reason, those that gave up for that reason).
        #[arg(long)]
        all_dead: bool,
        /// With --all-dead: MAX_ATTEMPTS, GIVE_UP_AFTER or GONE.
        #[arg(long, requires = "all_dead")]
        reason: Option<String>,
    },
    /// How many timers of a namespace fire in the next minute, hour and day.
    Horizon {
        #[command(flatten)]
        conn: Conn,
        namespace: String,
    },
}

/// Makes a create recurring. Each occurrence is a firing of its own (its own fire id); the next
/// one waits until the current one's delivery ended. --delay-ms or --at then give the series'
/// start (default: now for --cron, one interval from now for --every-ms).
#[derive(clap::Args)]
pub struct RecurrenceArgs {
    /// Recur on a cron schedule: 5 fields (minute hour day-of-month month day-of-week), or 6 with
    /// seconds first, such as "0 9 * * MON".
    #[arg(long, conflicts_with = "every_ms")]
    cron: Option<String>,
    /// With --cron: the IANA time zone it is read in (Europe/Berlin); default UTC. Daylight-saving
    /// changes are handled: a skipped wall time fires just after the gap, a repeated one once.
    #[arg(long, requires = "cron")]
    tz: Option<String>,
    /// Recur every this many milliseconds (at least 1000), counted from the first occurrence.
    #[arg(long)]
    every_ms: Option<u64>,
    /// No occurrence after this unix time in milliseconds.
    #[arg(long, default_value_t = 0)]
    until_ms: u64,
    /// At most this many occurrences (fired or skipped); 0 = no limit.
    #[arg(long, default_value_t = 0)]
    count: u64,
    /// A series late by several slots (an outage, a pause) fires once per missed slot instead
    /// of once.
    #[arg(long)]
    catch_up_all: bool,
}

impl RecurrenceArgs {
    fn into_proto(self) -> anyhow::Result<Option<pb::Recurrence>> {
        let rule = match (self.cron, self.every_ms) {
            (Some(cron), _) => pb::recurrence::Rule::Cron(cron),
            (None, Some(every)) => pb::recurrence::Rule::EveryMs(every),
            (None, None) => {
                if self.until_ms != 0 || self.count != 0 || self.catch_up_all {
                    anyhow::bail!("--until-ms, --count and --catch-up-all need --cron or --every-ms");
                }
                return Ok(None);
            }
        };
        Ok(Some(pb::Recurrence {
            rule: Some(rule),
            time_zone: self.tz.unwrap_or_default(),
            until_ms: self.until_ms,
            count: self.count,
            catch_up_all: self.catch_up_all,
        }))
    }
}

fn print_timer(timer: &pb::Timer, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(&TimerJson::from_proto(timer)).expect("json"));
        return;
    }
    let state = tocsin_contract::json::state_name(timer.state);
    print!(
        "{}/{}  {state}  fire_at_ms={}  generation={}  shard={}",
        timer.namespace, timer.id, timer.fire_at_ms, timer.generation, timer.shard
    );
    if let Some(f) = &timer.fire {
        print!("  fire_id={} epoch={} attempt={}", f.fire_id, f.epoch, f.attempt);
        if !f.last_error.is_empty() {
            print!("  last_error={:?}", f.last_error);
        }
        if !f.dead_reason.is_empty() {
            print!("  dead_reason={}", f.dead_reason);
        }
    }
    if let Some(s) = &timer.series {
        let rule = match timer.recurrence.as_ref().and_then(|r| r.rule.as_ref()) {
            Some(pb::recurrence::Rule::Cron(c)) => {
                let tz = timer.recurrence.as_ref().map_or("", |r| r.time_zone.as_str());
                format!("cron={c:?} tz={}", if tz.is_empty() { "UTC" } else { tz })
            }
            Some(pb::recurrence::Rule::EveryMs(e)) => format!("every_ms={e}"),
            None => String::new(),
        };
        print!("  {rule} occurrence={} delivered={} dead={} skipped={}", s.occurrence, s.delivered, s.dead, s.skipped);
        if s.next_fire_at_ms != 0 {
            print!(" next_fire_at_ms={}", s.next_fire_at_ms);
        }
    }
    println!();
}

fn print_attempts(attempts: &[pb::AttemptInfo]) {
    if attempts.is_empty() {
        println!("  no finished attempts");
        return;
    }
    for a in attempts {
        let status = if a.http_status == 0 { "-".to_string() } else { a.http_status.to_string() };
        print!(
            "  #{:<3} {:<14} status={status:<3} class={:<18} {} ms  started={} epoch={} fire_id={}",
            a.attempt, a.outcome, a.class, a.latency_ms, a.started_at_ms, a.epoch, a.fire_id
        );
        if !a.error.is_empty() {
            print!("  error={:?}", a.error);
        }
        println!();
    }
}

fn parse_labels(labels: &[String]) -> anyhow::Result<std::collections::HashMap<String, String>> {
    labels
        .iter()
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("label {l:?} is not key=value"))
        })
        .collect()
}

pub async fn run(cmd: TimerCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TimerCommand::Create {
            conn,
            namespace,
            id,
            delay_ms,
            at,
            webhook,
            amqp_broker,
            exchange,
            routing_key,
            topic,
            ttr_ms,
            payload,
            labels,
            max_attempts,
            replace_finished,
            skip_if_late_ms,
            recurrence,
        } => {
            let recurrence = recurrence.into_proto()?;
            let fire_time = match (delay_ms, at) {
                (Some(d), _) => Some(pb::create_timer_request::FireTime::DelayMs(d)),
                (None, Some(a)) => Some(pb::create_timer_request::FireTime::FireAtMs(a)),
                // A series starts now by default.
                (None, None) if recurrence.is_some() => None,
                (None, None) => anyhow::bail!("give --delay-ms or --at (or --cron / --every-ms)"),
            };
            let target = match (webhook, amqp_broker, topic) {
                (Some(url), _, _) => pb::callback::Target::Webhook(pb::Webhook { url }),
                (None, Some(broker), _) => pb::callback::Target::Amqp(pb::Amqp { broker, exchange, routing_key }),
                (None, None, Some(topic)) => pb::callback::Target::Pull(pb::Pull { topic, ttr_ms }),
                (None, None, None) => anyhow::bail!("give --webhook URL, --amqp-broker NAME or --topic NAME"),
            };
            let req = pb::CreateTimerRequest {
                namespace,
                id,
                fire_time,
                payload: payload.into_bytes().into(),
                labels: parse_labels(&labels)?,
                callback: Some(pb::Callback { target: Some(target) }),
                retry: Some(pb::RetryPolicy { max_attempts, ..Default::default() }),
                replace_finished,
                skip_if_late_ms,
                recurrence,
            };
            let client = crate::connect(conn.addrs.clone()).await?;
            let resp = client.create_timer(req).await?;
            if let Some(t) = &resp.timer {
                if !conn.json {
                    print!("{} ", if resp.created { "created" } else { "exists" });
                }
                print_timer(t, conn.json);
            }
        }
        TimerCommand::Get { conn, namespace, id, attempts } => {
            let client = crate::connect(conn.addrs.clone()).await?;
            let timer = client.get_timer_with(&namespace, &id, attempts).await?;
            if conn.json && attempts {
                let list: Vec<_> = timer.attempts.iter().map(tocsin_contract::json::AttemptJson::from_proto).collect();
                let body = serde_json::json!({ "timer": TimerJson::from_proto(&timer), "attempts": list });
                println!("{}", serde_json::to_string_pretty(&body).expect("json"));
            } else {
                print_timer(&timer, conn.json);
                if attempts {
                    print_attempts(&timer.attempts);
                }
            }
        }
        TimerCommand::List { conn, namespace, state, reason, limit, page_token } => {
            let client = crate::connect(conn.addrs.clone()).await?;
            let state = match state {
                Some(s) => pb::timer::State::from_str_name(&s.to_ascii_uppercase())
                    .with_context(|| format!("unknown state {s}"))? as i32,
                None => 0,
            };
            let resp = client
                .list_timers(pb::ListTimersRequest {
                    namespace,
                    state,
                    page_size: limit,
                    page_token,
                    dead_reason: reason.unwrap_or_default().to_ascii_uppercase(),
                    ..Default::default()
                })
                .await?;
            if conn.json {
                let timers: Vec<TimerJson> = resp.timers.iter().map(TimerJson::from_proto).collect();
                println!("{}", serde_json::json!({ "timers": timers, "next_page_token": resp.next_page_token }));
            } else {
                for t in &resp.timers {
                    print_timer(t, false);
                }
                if !resp.next_page_token.is_empty() {
                    println!("more: --page-token {}", resp.next_page_token);
                }
            }
        }
        TimerCommand::Cancel { conn, namespace, id } => {
            let client = crate::connect(conn.addrs.clone()).await?;
            let resp = client.cancel_timer(&namespace, &id).await?;
            let outcome =
                pb::cancel_timer_response::Outcome::try_from(resp.outcome).map(|o| o.as_str_name()).unwrap_or("?");
            if conn.json {
                let fire = resp
                    .fire
                    .as_ref()
                    .map(|f| serde_json::json!({ "fire_id": f.fire_id, "epoch": f.epoch, "attempt": f.attempt }));
                let mut body = serde_json::json!({ "outcome": outcome, "fire": fire });
                if outcome == "CANCELLED_WHILE_FIRING" {
                    body["attempt_in_flight"] = resp.attempt_in_flight.into();
                }
                println!("{body}");
            } else {
                match &resp.fire {
                    Some(f) => print!("{outcome}  fire_id={} epoch={} attempt={}", f.fire_id, f.epoch, f.attempt),
                    None => print!("{outcome}"),
                }
                if outcome == "CANCELLED_WHILE_FIRING" {
                    if resp.attempt_in_flight {
                        print!("  (no further attempt; attempt {} was under way and may still arrive)", {
                            resp.fire.as_ref().map_or(0, |f| f.attempt)
                        });
                    } else {
                        print!("  (no further attempt; none was under way)");
                    }
                }
                println!();
            }
            if outcome == "NOT_FOUND" {
                return Ok(ExitCode::from(4));
            }
        }
        TimerCommand::Redrive { conn, namespace, ids, all_dead, reason } => {
            let client = crate::connect(conn.addrs.clone()).await?;
            if all_dead {
                let reason = reason.unwrap_or_default().to_ascii_uppercase();
                let tty = std::io::IsTerminal::is_terminal(&std::io::stderr()) && !conn.json;
                let bar = if tty { indicatif::ProgressBar::new_spinner() } else { indicatif::ProgressBar::hidden() };
                let (redriven, other) = client
                    .redrive_dead(&namespace, &reason, |done, other| {
                        bar.set_message(format!("{done} redriven, {other} not"));
                        bar.tick();
                    })
                    .await?;
                bar.finish_and_clear();
                if conn.json {
                    println!("{}", serde_json::json!({ "redriven": redriven, "not_redriven": other }));
                } else {
                    println!("redriven {redriven} DEAD timers of {namespace}; {other} were not DEAD any more");
                }
                return Ok(ExitCode::SUCCESS);
            }
            let mut failed = false;
            let mut out = Vec::new();
            for chunk in ids.chunks(1_000) {
                let resp = client.redrive_timers(&namespace, chunk.to_vec()).await?;
                for r in resp.results {
                    let outcome =
                        pb::redrive_result::Outcome::try_from(r.outcome).map(|o| o.as_str_name()).unwrap_or("?");
                    failed |= r.outcome != pb::redrive_result::Outcome::Redriven as i32;
                    if conn.json {
                        let error = r.error.as_ref().map(tocsin_contract::json::ErrorJson::from_info);
                        out.push(serde_json::json!({
                            "id": r.id,
                            "outcome": outcome,
                            "generation": r.timer.as_ref().map(|t| t.generation),
                            "error": error,
                        }));
                    } else {
                        match (&r.timer, &r.error) {
                            (Some(t), _) => println!(
                                "{}  {outcome}  now {} generation={}",
                                r.id,
                                tocsin_contract::json::state_name(t.state),
                                t.generation
                            ),
                            (None, Some(e)) => println!("{}  {outcome}  {}", r.id, e.message),
                            (None, None) => println!("{}  {outcome}", r.id),
                        }
                    }
                }
            }
            if conn.json {
                println!("{}", serde_json::json!({ "results": out }));
            }
            if failed {
                return Ok(ExitCode::from(4));
            }
        }
        TimerCommand::Reschedule { conn, namespace, id, generation, delay_ms, at } => {
            let client = crate::connect(conn.addrs.clone()).await?;
            let fire_time = match (delay_ms, at) {
                (Some(d), _) => pb::reschedule_timer_request::FireTime::DelayMs(d),
                (None, Some(a)) => pb::reschedule_timer_request::FireTime::FireAtMs(a),
                (None, None) => anyhow::bail!("give --delay-ms or --at"),
            };
            let timer = client
                .reschedule_timer(pb::RescheduleTimerRequest {
                    namespace,
                    id,
                    expected_generation: generation,
                    fire_time: Some(fire_time),
                })
                .await?;
            print_timer(&timer, conn.json);
        }
        TimerCommand::Horizon { conn, namespace } => {
            let client = crate::connect(conn.addrs.clone()).await?;
            let h = client.horizon(&namespace).await?;
            if conn.json {
                println!(
                    "{}",
                    serde_json::json!({ "overdue": h.overdue, "next_minute": h.next_minute, "next_hour": h.next_hour, "next_day": h.next_day })
                );
            } else {
                println!(
                    "overdue {}  next minute {}  next hour {}  next day {}",
                    h.overdue, h.next_minute, h.next_hour, h.next_day
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
