//! `receiver-failing` (matrix row 18): endpoints that fail in every way a
//! webhook receiver does, next to a healthy one.
//!
//! The sink listens on several ports, one per failing behaviour (the
//! node's circuit breaker and slow-down are per scheme, host and port, so
//! each is an endpoint of its own): 9000 `/status/500` (the server's
//! default retry policy), 9002 `/status/429?retry_after=2` and 9003
//! `/status/503?retry_after=3` (a policy whose own backoff, 0.1–1 s, is
//! shorter than `Retry-After`), 9004 `/status/410`, and 9005 `/slow/20000`
//! (answers after 20 s; the node's webhook timeout is 10 s), each with
//! `--failing-timers` timers due within five seconds. The steady load posts
//! to port 9001; a small load to `/hook` on port 9000 shows what a healthy
//! path sharing the 500 endpoint sees (reported, not bounded). After 40 s
//! every failing path but 410 is switched to healthy at run time.
//!
//! Checks: the healthy endpoint's fault-window lateness p99 < 1 s (the
//! lateness figures cover its `s-…` timers only); 429 and 503 retries
//! arrive no sooner than their `Retry-After`; a 410 timer is sent once and
//! is DEAD (GONE), or, once the node disabled the URL, held unsent; the 500
//! endpoint's breaker holds attempts and the attempt gaps (from the timers'
//! histories) grow; every slow timer's first attempt timed out and it was
//! attempted again, no request sooner than the timeout after the previous;
//! and once the paths recover, every timer but the 410 ones is delivered
//! (I1).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use tocsin_client::v1 as pb;

use crate::check;
use crate::check::Report;
use crate::cluster::SINK_PORT;
use crate::driver;
use crate::driver::Load;
use crate::driver::NAMESPACE;
use crate::driver::Recorder;
use crate::driver::now_ms;
use crate::observe;
use crate::scenario::Bounds;
use crate::scenario::NO_BOUNDS;
use crate::scenario::Run;
use crate::scenario::Scenario;
use crate::scenario::Setup;
use crate::scenario::sleep_rest;

pub struct ReceiverFailing;

/// The healthy endpoint's port.
const HEALTHY_PORT: u16 = 9001;
/// How long the failing paths fail.
const FAILING_FOR: Duration = Duration::from_secs(40);
/// The node's default webhook timeout.
const WEBHOOK_TIMEOUT_MS: u64 = 10_000;

/// One failing endpoint: id tag, its own port (an endpoint of its own for
/// the node's breaker and slow-down, which are per scheme, host and port),
/// path, retry policy.
struct Endpoint {
    tag: &'static str,
    port: u16,
    path: &'static str,
    retry: Option<pb::RetryPolicy>,
}

fn endpoints() -> Vec<Endpoint> {
    let short =
        Some(pb::RetryPolicy { max_attempts: 50, initial_backoff_ms: 200, max_backoff_ms: 1_000, give_up_after_ms: 0 });
    vec![
        Endpoint { tag: "f500", port: SINK_PORT, path: "/status/500", retry: None },
        Endpoint { tag: "f429", port: 9002, path: "/status/429?retry_after=2", retry: short },
        Endpoint { tag: "f503", port: 9003, path: "/status/503?retry_after=3", retry: short },
        Endpoint { tag: "f410", port: 9004, path: "/status/410", retry: None },
        Endpoint { tag: "fslow", port: 9005, path: "/slow/20000", retry: None },
    ]
}

impl Scenario for ReceiverFailing {
    fn name(&self) -> &'static str {
        "receiver-failing"
    }
    fn about(&self) -> &'static str {
        "endpoints answering 500, 429 and 503 with Retry-After, 410, and after 20 s; a healthy endpoint beside them"
    }
    fn bounds(&self) -> Bounds {
        Bounds { window_p99_ms: Some(1_000), ..NO_BOUNDS }
    }
    fn setup_options(&self, _args: &crate::Args) -> Setup {
        let mut setup = Setup::default();
        setup.nodes.sink_extra_ports = std::iter::once(HEALTHY_PORT)
            .chain(endpoints().iter().map(|e| e.port).filter(|p| *p != SINK_PORT))
            .collect();
        setup
    }
    fn setup<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let ip = run.net.host("sink").ip.clone();
            run.loads[0].url = format!("http://{ip}:{HEALTHY_PORT}/hook");
            run.loads.push(Load {
                tag: "h".into(),
                rate: (run.args.rate / 20).max(1),
                ..Load::steady(&run.cluster.sink_url, 0, run.args.cancel_fraction)
            });
            run.lateness_prefixes = vec!["s-".into()];
            // A 500 or slow timer refused (or held by its endpoint's open
            // breaker) just before the paths recover waits its next
            // default-policy gap (up to 64 s after its seventh attempt, 128 s
            // after its eighth; held attempts count) before it is delivered.
            run.drain_limit = Duration::from_secs(150);
            Ok(())
        })
    }
    fn fault<'a>(&'a self, run: &'a mut Run) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let ip = run.net.host("sink").ip.clone();
            let fault_start_ms = now_ms();
            run.fault_start_ms = Some(fault_start_ms);
            let gone = Recorder::new(&run.dir.join("gone-ops.ndjson"))?;
            let base = now_ms() + 2_000;
            let n = run.args.failing_timers.max(1);
            for e in endpoints() {
                let url = format!("http://{ip}:{}{}", e.port, e.path);
                let reqs: Vec<pb::CreateTimerRequest> = (0..n)
                    .map(|i| driver::request(NAMESPACE, format!("{}-{i}", e.tag), base + i * 5_000 / n, &url, e.retry))
                    .collect();
                // The 410 timers are meant to die: they are kept out of I1.
                let rec = if e.tag == "f410" { &gone } else { &run.rec };
                let ok = driver::create_all(run.client(), rec, reqs).await;
                println!("    {} timers for {} ({} acknowledged)", n, e.path, ok.len());
            }
            gone.flush();
            sleep_rest(fault_start_ms, FAILING_FOR).await;
            println!("    the failing paths recover (all but 410)");
            observe::sink_modes(
                &format!("http://{ip}:{SINK_PORT}"),
                &["/status/500=ok", "/status/429=ok", "/status/503=ok", "/slow=ok"],
            )
            .await?;
            run.notes.insert("recovered_ms", now_ms());
            Ok(())
        })
    }
    fn judge<'a>(&'a self, run: &'a mut Run, report: &'a Report) -> BoxFuture<'a, anyhow::Result<Vec<String>>> {
        Box::pin(async move {
            let mut failures = Vec::new();
            let recovered_ms = run.notes.get("recovered_ms").copied().unwrap_or(u64::MAX);
            println!("    healthy endpoint (own port): fault-window lateness {}", report.lateness_fault_window);
            let same_origin = check::check(&check::Inputs {
                ops: &run.ops,
                deliveries: &run.deliveries,
                fault: Some((run.fault_start_ms.unwrap_or(0), run.fault_end_ms.unwrap_or(0))),
                lateness_prefixes: &["h-".to_string()],
                early_tolerance_ms: 0,
            })?;
            println!(
                "    healthy path on the failing endpoint's port (not bounded): fault-window lateness {}",
                same_origin.lateness_fault_window
            );
            // Every request the sink saw, per timer, in arrival order.
            let mut seen: BTreeMap<String, Vec<check::Delivery>> = BTreeMap::new();
            for d in check::read_deliveries(&run.deliveries[0])? {
                if d.id.starts_with('f') && d.verdict != tocsin_contract::Verdict::Duplicate {
                    seen.entry(d.id.clone()).or_default().push(d);
                }
            }
            let of = |tag: &str| -> Vec<&Vec<check::Delivery>> {
                seen.iter().filter(|(id, _)| id.starts_with(&format!("{tag}-"))).map(|(_, v)| v).collect()
            };
            // 429 and 503: the retry after a refusal comes no sooner than Retry-After.
            for (tag, retry_after_ms) in [("f429", 2_000u64), ("f503", 3_000)] {
                let mut gaps = Vec::new();
                for arrivals in of(tag) {
                    for pair in arrivals.windows(2).filter(|p| p[0].verdict == tocsin_contract::Verdict::Refused) {
                        gaps.push(pair[1].recv_ms.saturating_sub(pair[0].recv_ms));
                    }
                }
                let early = gaps.iter().filter(|g| **g < retry_after_ms).count();
                println!(
                    "    {tag}: {} retries after a refusal, gaps min {} ms, median {} ms (Retry-After {} ms); {early} too soon",
                    gaps.len(),
                    gaps.iter().min().unwrap_or(&0),
                    check::Percentiles::of(gaps.clone()).p50_ms,
                    retry_after_ms
                );
                if gaps.is_empty() {
                    failures.push(format!("receiver-failing: {tag} timers were never retried"));
                }
                if early > 0 {
                    failures.push(format!("receiver-failing: {early} {tag} retries came sooner than Retry-After"));
                }
            }
            // 410: the timers whose attempts were under way when the first
            // 410 came back got one attempt each and are DEAD (GONE); the
            // node then disabled the URL, so the rest were never sent: each
            // is held (`url_disabled` in its history), neither DEAD nor
            // delivered.
            let gone = check::read_ops(&run.dir.join("gone-ops.ndjson"))?;
            let (mut dead_once, mut held, mut wrong) = (0, 0, Vec::new());
            for op in gone.iter().filter(|o| o.outcome == "ok") {
                let sent = seen.get(&op.id).map_or(0, Vec::len);
                let timer = run.client().get_timer_with(NAMESPACE, &op.id, true).await?;
                let attempts = timer.fire.as_ref().map_or(0, |f| f.attempt);
                let dead = timer.state == pb::timer::State::Dead as i32;
                let reason = timer.fire.as_ref().map_or("", |f| f.dead_reason.as_str());
                match sent {
                    // Sent once; earlier attempts may have been held unsent.
                    1 if dead && attempts >= 1 && reason == "GONE" => dead_once += 1,
                    0 if !dead
                        && timer.state != pb::timer::State::Delivered as i32
                        && timer.attempts.iter().any(|a| a.class == "url_disabled") =>
                    {
                        held += 1
                    }
                    _ => wrong.push(format!("{} (sent {sent}, state {}, attempt {attempts})", op.id, timer.state)),
                }
            }
            println!(
                "    f410: {} timers; {dead_once} attempted once and DEAD (GONE), {held} held by the disabled URL, {} otherwise",
                gone.len(),
                wrong.len()
            );
            if dead_once == 0 || !wrong.is_empty() {
                failures.push(format!(
                    "receiver-failing: a 410 timer must end DEAD after one attempt, or be held unsent once its URL is disabled ({dead_once} DEAD; otherwise: {:?})",
                    &wrong[..wrong.len().min(5)]
                ));
            }
            // 500: the endpoint's breaker opens, so most retries are held
            // unsent (class circuit_open) and the sink sees a fraction of
            // the attempts; the attempts' gaps (sent or held, from the
            // timers' histories) grow with the backoff.
            let (held, sent, gaps_by_attempt) = history(run, "f500", run.args.failing_timers).await?;
            let medians: Vec<u64> =
                gaps_by_attempt.values().map(|g| check::Percentiles::of(g.clone()).p50_ms).collect();
            let requests: usize = of("f500").iter().map(|a| a.len()).sum();
            println!(
                "    f500: {sent} attempts sent, {held} held by the open breaker ({requests} requests at the sink); median gap after attempt 1, 2, …: {medians:?} ms"
            );
            if held == 0 {
                failures.push("receiver-failing: the 500 endpoint's breaker never held an attempt".into());
            }
            if medians.len() < 3 || medians.windows(2).take(3).any(|w| w[1] < w[0]) {
                failures.push(format!("receiver-failing: 500 timers' attempt gaps did not grow: {medians:?}"));
            }
            // Slow: every timer's first attempt timed out and it was attempted
            // again (held by the breaker, or sent); no request for a timer
            // came sooner than the timeout after its previous one.
            let mut too_soon = 0;
            for arrivals in of("fslow") {
                let slow: Vec<&check::Delivery> = arrivals
                    .iter()
                    .filter(|d| d.verdict == tocsin_contract::Verdict::Slow && d.recv_ms < recovered_ms)
                    .collect();
                too_soon +=
                    slow.windows(2).filter(|p| p[1].recv_ms.saturating_sub(p[0].recv_ms) < WEBHOOK_TIMEOUT_MS).count();
            }
            let mut not_again = 0;
            let mut timed_out = 0;
            for i in 0..run.args.failing_timers.max(1) {
                let t = run.client().get_timer_with(NAMESPACE, &format!("fslow-{i}"), true).await?;
                if t.attempts.first().is_some_and(|a| a.class == "timeout") {
                    timed_out += 1;
                }
                if t.attempts.len() < 2 && t.state != pb::timer::State::Delivered as i32 {
                    not_again += 1;
                }
            }
            println!(
                "    fslow: {timed_out} first attempts timed out; {not_again} never attempted again; {too_soon} requests sooner than the 10 s timeout after the previous"
            );
            if not_again > 0 || too_soon > 0 || timed_out == 0 {
                failures.push(format!(
                    "receiver-failing: slow attempts must time out and be attempted again ({timed_out} timed out, {not_again} not attempted again, {too_soon} too soon)"
                ));
            }
            Ok(failures)
        })
    }
}

/// From the histories of `tag`'s timers: attempts held by the breaker,
/// attempts sent, and the gaps between consecutive attempts' starts by the
/// earlier attempt's number (up to attempt 6).
async fn history(run: &Run, tag: &str, n: u64) -> anyhow::Result<(usize, usize, BTreeMap<u32, Vec<u64>>)> {
    let (mut held, mut sent) = (0, 0);
    let mut gaps: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for i in 0..n.max(1) {
        let t = run.client().get_timer_with(NAMESPACE, &format!("{tag}-{i}"), true).await?;
        for a in &t.attempts {
            if a.class == "circuit_open" || a.class == "throttled" {
                held += 1;
            } else {
                sent += 1;
            }
        }
        for pair in t.attempts.windows(2).filter(|p| p[0].fire_id == p[1].fire_id && p[0].attempt <= 6) {
            gaps.entry(pair[0].attempt).or_default().push(pair[1].started_at_ms.saturating_sub(pair[0].started_at_ms));
        }
    }
    Ok((held, sent, gaps))
}
