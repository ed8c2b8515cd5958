//! The invariant checker: reads the driver's operations and the receiver's
//! deliveries and judges a run.
//!
//! - **I1 lost**: every timer whose create was acknowledged and which was
//!   not cancelled (no cancel tried, or the cancel answered ALREADY_FIRED)
//!   has an accepted delivery.
//! - **I2 cancelled then delivered**: a timer whose cancel answered
//!   CANCELLED (or CANCELLED_WHILE_FIRING: it had fired, and its delivery
//!   was retrying) is delivered only if the delivery's attempt started before
//!   the cancel was applied (`attempt_index <= cancel applied_index`: one
//!   entry can carry both the `Fire` and, after it, the cancel, which then
//!   answers CANCELLED_WHILE_FIRING; a `Fire` after a cancel in the same
//!   entry starts nothing): that is "in flight", shown by the log indexes.
//!   Any other such delivery is a violation.
//! - **I4 fencing**: per shard, no delivery the receiver accepted carries an
//!   epoch below one it accepted earlier; and over every delivery that
//!   reached the receiver (accepted or not), epochs order attempts the way
//!   the log does: an attempt started under a higher epoch has a higher log
//!   index than every attempt started under a lower one. Two leaders sharing
//!   an epoch, or a deposed leader starting attempts after its successor
//!   took over, break this.
//! - **I5 lateness**: receive time minus fire time of each timer's first
//!   accepted delivery: p50/p99/max over the run and over the fault window.
//! - **I6 early**: no delivery received before its fire time (more than
//!   the scenario's tolerance before it, for the clock scenarios).
//!
//! A run may have several receivers (a second tenant's sink, a pull
//! consumer); each keeps its own fence, so I4 is re-derived per file, and
//! the other invariants over all of them. A scenario may restrict the
//! lateness figures to some timers (by id prefix), for example those whose
//! receiver was not the one made to fail.
//!
//! I7 (replica digests) and I8 (leaders after healing) are checked live by
//! the scenario runner and passed in.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::Path;
use std::path::PathBuf;

use serde::Deserialize;
use serde::Serialize;

use tocsin_contract::Verdict;

use crate::driver::Op;

/// One line of `tocsin sink`'s output (the pull consumer writes the same).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Delivery {
    pub recv_ms: u64,
    pub verdict: Verdict,
    pub id: String,
    pub shard: u32,
    pub epoch: u64,
    pub fire_id: String,
    #[serde(default)]
    pub attempt: u32,
    #[serde(default)]
    pub attempt_index: u64,
    pub fire_at_ms: u64,
    /// The request path (`tocsin sink`), empty for a pull consumer.
    #[serde(default)]
    pub path: String,
    /// The HTTP status the sink answered.
    #[serde(default)]
    pub status: u16,
}

/// Every delivery in a receiver's records. The sink also records each
/// mode change (`"verdict": "mode"`, from `POST /_sink/mode`) in the same
/// file; those are not deliveries and are skipped. Any other line that does
/// not parse is an error.
pub fn read_deliveries(path: &Path) -> anyhow::Result<Vec<Delivery>> {
    let records: Vec<serde_json::Value> = read_lines(path)?;
    records
        .into_iter()
        .filter(|r| r.get("verdict").and_then(|v| v.as_str()) != Some("mode"))
        .map(|r| {
            let line = r.to_string();
            serde_json::from_value(r).map_err(|e| anyhow::anyhow!("{}: {e}: {line}", path.display()))
        })
        .collect()
}

/// Every operation the driver recorded.
pub fn read_ops(path: &Path) -> anyhow::Result<Vec<Op>> {
    read_lines(path)
}

/// Every line of an NDJSON file. A line that does not parse is an error
/// (a renamed verdict or field must fail the check, not count as zero),
/// except the last one, which a writer killed mid-line may have cut short.
fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text = std::fs::read_to_string(path)?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {}
            Err(e) => anyhow::bail!("{}: line {}: {e}: {line}", path.display(), i + 1),
        }
    }
    Ok(out)
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub n: usize,
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
}

impl Percentiles {
    pub fn of(mut v: Vec<u64>) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Percentiles { n: v.len(), p50_ms: at(0.5), p99_ms: at(0.99), max_ms: v[v.len() - 1] }
    }
}

impl std::fmt::Display for Percentiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "p50 {} ms, p99 {} ms, max {} ms (n={})", self.p50_ms, self.p99_ms, self.max_ms, self.n)
    }
}

/// Everything the checker found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub creates_ok: usize,
    pub creates_unknown: usize,
    /// The unknown creates by the gRPC code of their last error: how many,
    /// and the first one's message (what CI prints when a run goes wrong).
    pub creates_unknown_by_code: std::collections::BTreeMap<String, (usize, String)>,
    pub cancels_cancelled: usize,
    pub cancels_unknown: usize,
    pub must_fire: usize,
    /// I1.
    pub lost: usize,
    pub lost_examples: Vec<String>,
    /// I2.
    pub cancelled_then_delivered: usize,
    pub cancelled_in_flight_excused: usize,
    /// I4.
    pub accepted_stale: usize,
    pub epoch_order_violations: usize,
    pub rejected_stale: usize,
    pub duplicates: usize,
    /// I6.
    pub early: usize,
    /// Acknowledged creates whose timer the leader created after its fire
    /// time (the create itself was slowed by the fault); their lateness
    /// counts from creation.
    pub created_overdue: usize,
    /// I5.
    pub lateness: Percentiles,
    pub lateness_fault_window: Percentiles,
    /// The fault window's timers as (due, lateness) in ms, for the phase
    /// breakdown of [`lateness_by_phase`].
    #[serde(skip)]
    pub fault_window_samples: Vec<(u64, u64)>,
    /// I7: replicas agree (checked by the runner).
    pub digests_equal: Option<bool>,
    /// I8: milliseconds until every shard had a leader after healing.
    pub leaders_after_heal_ms: Option<u64>,
    /// Milliseconds from the fault's start to the first delivery of shard 0
    /// fenced by a newer epoch than any before the fault: when the new
    /// leader's first fire arrived (issue 11: within 400 ms of a kill).
    /// `None` when shard 0 kept its leader.
    pub first_fire_new_leader_ms: Option<u64>,
    /// How long the create calls sent in the [`AFTER_HEAL_MS`] after the
    /// fault ended took to be answered (per item; a batch's items share
    /// its call's time). Reported, not bounded: a node whose connection to
    /// a peer went stale in a partition showed here as calls held past the
    /// client's 2 s deadline.
    pub create_calls_after_heal: Percentiles,
    /// The same over the create calls sent in the first [`AFTER_HEAL_MS`]
    /// of the fault (reported, not bounded): calls to a leader that was
    /// just cut off or killed wait for an answer or a deadline.
    pub create_calls_at_fault: Percentiles,
}

/// The span after the fault's end whose create calls
/// [`Report::create_calls_after_heal`] measures.
pub const AFTER_HEAL_MS: u64 = 5_000;

impl Report {
    /// The failed invariants, empty when the run passed. `max_p99_ms` bounds
    /// the fault window's p99.
    pub fn failures(&self, max_p99_ms: u64) -> Vec<String> {
        let mut out = Vec::new();
        if self.lost > 0 {
            out.push(format!("I1: {} acknowledged timers never delivered, e.g. {:?}", self.lost, self.lost_examples));
        }
        if self.cancelled_then_delivered > 0 {
            out.push(format!("I2: {} timers delivered after an acknowledged cancel", self.cancelled_then_delivered));
        }
        if self.accepted_stale > 0 {
            out.push(format!("I4: {} deliveries accepted with a stale epoch", self.accepted_stale));
        }
        if self.epoch_order_violations > 0 {
            out.push(format!("I4: {} shard epochs whose attempts interleave in the log", self.epoch_order_violations));
        }
        if self.early > 0 {
            out.push(format!("I6: {} deliveries before their fire time", self.early));
        }
        if self.lateness_fault_window.p99_ms > max_p99_ms {
            out.push(format!(
                "I5: fault-window lateness p99 {} ms over {max_p99_ms} ms",
                self.lateness_fault_window.p99_ms
            ));
        }
        if self.digests_equal == Some(false) {
            out.push("I7: replicas' state digests differ after healing".into());
        }
        match self.leaders_after_heal_ms {
            Some(ms) if ms > 5_000 => out.push(format!("I8: shards without a leader {ms} ms after healing")),
            None => out.push("I8: some shard never got a leader after healing".into()),
            _ => {}
        }
        if self.must_fire == 0 {
            out.push("no timer was expected to fire: the load did not run".into());
        }
        out
    }
}

/// What to judge, and how.
pub struct Inputs<'a> {
    pub ops: &'a Path,
    /// Every receiver's records; each file is one receiver with its own fence.
    pub deliveries: &'a [PathBuf],
    /// The fault window `(start, end)` in unix ms (timers due in it, give or
    /// take a second before and ten after).
    pub fault: Option<(u64, u64)>,
    /// Only timers whose id starts with one of these count towards the
    /// lateness figures; empty means every timer.
    pub lateness_prefixes: &'a [String],
    /// A delivery counts as early only if it arrives more than this before
    /// its fire time.
    pub early_tolerance_ms: u64,
}

/// Judges a run from its files.
pub fn check(inputs: &Inputs) -> anyhow::Result<Report> {
    let ops: Vec<Op> = read_lines(inputs.ops)?;
    let mut files: Vec<Vec<Delivery>> = Vec::new();
    for path in inputs.deliveries {
        files.push(if path.exists() { read_deliveries(path)? } else { Vec::new() });
    }
    let fault = inputs.fault;
    let mut report = Report::default();

    // Each acknowledged timer's due time: its fire time, or its creation if
    // that came later (a timer cannot fire before it exists).
    let mut created: HashMap<&str, u64> = HashMap::new();
    let mut unknown_create: Vec<&str> = Vec::new();
    for op in ops.iter().filter(|o| o.op == "create") {
        if op.outcome == "ok" {
            // The leader stamps creation with its own clock; a timer cannot
            // have been created after its create was answered (host clock),
            // which bounds a leader whose clock runs ahead.
            let created_at_ms = op.created_at_ms.min(op.complete_ms);
            if created_at_ms > op.fire_at_ms {
                report.created_overdue += 1;
            }
            created.insert(&op.id, op.fire_at_ms.max(created_at_ms));
        } else {
            unknown_create.push(&op.id);
            let by_code = report.creates_unknown_by_code.entry(op.code.clone()).or_insert((0, op.error.clone()));
            by_code.0 += 1;
        }
    }
    report.creates_ok = created.len();
    report.creates_unknown = unknown_create.len();
    // The cancel that decides each timer's fate (the last definite one).
    let mut cancel: HashMap<&str, &Op> = HashMap::new();
    for op in ops.iter().filter(|o| o.op == "cancel") {
        cancel.insert(&op.id, op);
    }
    report.cancels_cancelled = cancel.values().filter(|c| cancel_took_effect(&c.outcome)).count();
    report.cancels_unknown = cancel.values().filter(|c| c.outcome == "unknown").count();

    // Deliveries, in receive order (each file's order); the earliest accepted
    // one of each timer over every receiver.
    let mut first_accepted: HashMap<&str, &Delivery> = HashMap::new();
    let mut seen_fire_ids: HashMap<&str, usize> = HashMap::new();
    for deliveries in &files {
        let mut max_epoch: BTreeMap<u32, u64> = BTreeMap::new();
        for d in deliveries {
            match d.verdict {
                Verdict::Accepted => {
                    let max = max_epoch.entry(d.shard).or_insert(0);
                    if d.epoch < *max {
                        report.accepted_stale += 1;
                    }
                    *max = (*max).max(d.epoch);
                    let first = first_accepted.entry(&d.id).or_insert(d);
                    if d.recv_ms < first.recv_ms {
                        *first = d;
                    }
                    *seen_fire_ids.entry(&d.fire_id).or_default() += 1;
                    if d.recv_ms + inputs.early_tolerance_ms < d.fire_at_ms {
                        report.early += 1;
                    }
                }
                Verdict::Duplicate => report.duplicates += 1,
                Verdict::RejectedStale => report.rejected_stale += 1,
                Verdict::RejectedSig
                | Verdict::BadBody
                | Verdict::Refused
                | Verdict::Slow
                | Verdict::Abandoned
                | Verdict::AckStale
                | Verdict::AckNotFound
                | Verdict::AckFailed => {}
            }
        }
        report.epoch_order_violations += epoch_order_violations(deliveries);
    }
    let deliveries: Vec<&Delivery> = files.iter().flatten().collect();

    let mut lateness = Vec::new();
    let mut window = Vec::new();
    for (id, due_ms) in &created {
        let fate = cancel.get(id).map(|c| c.outcome.as_str());
        let must = matches!(fate, None | Some("already_fired"));
        if must {
            report.must_fire += 1;
        }
        match first_accepted.get(id) {
            Some(d) => {
                let late = d.recv_ms.saturating_sub(*due_ms);
                let counted = inputs.lateness_prefixes.is_empty()
                    || inputs.lateness_prefixes.iter().any(|p| id.starts_with(p.as_str()));
                if counted {
                    lateness.push(late);
                }
                if let Some((start, end)) = fault
                    && counted
                    && *due_ms + 1_000 >= start
                    && *due_ms <= end + 10_000
                {
                    window.push(late);
                    report.fault_window_samples.push((*due_ms, late));
                }
                if let Some(c) = cancel.get(id)
                    && cancel_took_effect(&c.outcome)
                {
                    // CANCELLED says the timer had not fired (an armed fire whose
                    // time had not come was undone): no delivery is excused. The
                    // other answers excuse an attempt started no later than the
                    // cancel's entry.
                    let in_flight = c.outcome != "cancelled"
                        && deliveries
                            .iter()
                            .filter(|x| x.id == *id && x.verdict == Verdict::Accepted)
                            .all(|x| x.attempt_index != 0 && x.attempt_index <= c.applied_index);
                    if in_flight {
                        report.cancelled_in_flight_excused += 1;
                    } else {
                        report.cancelled_then_delivered += 1;
                    }
                }
            }
            None if must => {
                report.lost += 1;
                if report.lost_examples.len() < 5 {
                    report.lost_examples.push(id.to_string());
                }
            }
            None => {}
        }
    }
    report.lateness = Percentiles::of(lateness);
    report.lateness_fault_window = Percentiles::of(window);
    report.first_fire_new_leader_ms = fault.and_then(|(start, _)| first_fire_new_leader(&deliveries, 0, start));
    if let Some((start, end)) = fault {
        report.create_calls_at_fault = create_calls_begun(&ops, start, start + AFTER_HEAL_MS);
        report.create_calls_after_heal = create_calls_begun(&ops, end, end + AFTER_HEAL_MS);
    }
    Ok(report)
}

/// How long the creates sent from `from_ms` until `to_ms` took to be
/// answered, whatever the answer.
pub fn create_calls_begun(ops: &[Op], from_ms: u64, to_ms: u64) -> Percentiles {
    Percentiles::of(
        ops.iter()
            .filter(|o| o.op == "create" && (from_ms..to_ms).contains(&o.invoke_ms))
            .map(|o| o.complete_ms.saturating_sub(o.invoke_ms))
            .collect(),
    )
}

/// When `shard`'s first accepted delivery under an epoch newer than every
/// epoch delivered before `start_ms` arrived, in ms after `start_ms`: the
/// new leader's first fire after a fault that moved the shard. `None` if
/// nothing was delivered before the fault or no newer epoch delivered.
pub fn first_fire_new_leader(deliveries: &[&Delivery], shard: u32, start_ms: u64) -> Option<u64> {
    let accepted = || deliveries.iter().filter(|d| d.shard == shard && d.verdict == Verdict::Accepted);
    let before = accepted().filter(|d| d.recv_ms < start_ms).map(|d| d.epoch).max()?;
    accepted().filter(|d| d.recv_ms >= start_ms && d.epoch > before).map(|d| d.recv_ms - start_ms).min()
}

/// What a node logs as it takes up or gives up a shard's leadership
/// (`tocsin-node`'s `shard/leader.rs`), in the order a failover goes.
const LEADERSHIP_MESSAGES: [&str; 9] = [
    "stopped leading shard",
    "deposed",
    "elected; committing a leader epoch",
    "leader epoch refused",
    "cannot reach a quorum; its leader epoch waits",
    "proposing the leader epoch failed",
    "gave up committing a leader epoch",
    "leading shard",
    "first fire batch",
];

/// From a node's text log, its lines about `shard`'s leadership logged at
/// or after `since_ms`, each with its time (Unix ms) and the line without
/// its timestamp and level. A failover whose first fire comes late shows
/// here where the time went: the election, the epoch's commit, or the
/// first fire batch.
pub fn leadership_lines(log: &str, shard: u32, since_ms: u64) -> Vec<(u64, String)> {
    let field = format!("shard={shard}");
    log.lines()
        .filter(|line| line.split_whitespace().any(|w| w == field))
        .filter(|line| LEADERSHIP_MESSAGES.iter().any(|m| line.contains(m)))
        .filter_map(|line| {
            let (stamp, rest) = line.split_once(' ')?;
            let at_ms = rfc3339_utc_ms(stamp)?;
            let rest = rest.trim_start();
            let rest = rest.split_once(' ').map_or(rest, |(_level, msg)| msg.trim_start());
            (at_ms >= since_ms).then(|| (at_ms, rest.to_string()))
        })
        .collect()
}

/// `2026-12-07T07:04:02.123456Z` as Unix ms (UTC only, as the nodes log).
fn rfc3339_utc_ms(stamp: &str) -> Option<u64> {
    let stamp = stamp.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let ms: i64 = format!("{frac:0<3}").get(..3)?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000 + ms).ok()
}

/// The lateness of the timers due in each labelled phase. `phases` holds
/// (start ms, label) in time order; a phase lasts until the next one starts
/// (the last one until the end of the samples), and phases that share a
/// label are counted together. Labels come out in the order they first
/// appear; a label no timer was due in is left out.
pub fn lateness_by_phase(samples: &[(u64, u64)], phases: &[(u64, String)]) -> Vec<(String, Percentiles)> {
    let mut labels: Vec<&str> = Vec::new();
    let mut late: HashMap<&str, Vec<u64>> = HashMap::new();
    for (due_ms, late_ms) in samples {
        // The last phase that started at or before the timer was due.
        let at = phases.partition_point(|(start, _)| start <= due_ms);
        let Some(i) = at.checked_sub(1) else { continue };
        let label = phases[i].1.as_str();
        if !labels.contains(&label) {
            labels.push(label);
        }
        late.entry(label).or_default().push(*late_ms);
    }
    let mut out: Vec<(String, Percentiles)> =
        labels.iter().map(|l| (l.to_string(), Percentiles::of(late.remove(l).unwrap_or_default()))).collect();
    out.sort_by_key(|(l, _)| phases.iter().position(|(_, p)| p == l));
    out
}

/// The lateness of the timers whose every phase from `before_ms` before
/// their due time to `after_ms` after it passes `ok` (labels as in
/// [`lateness_by_phase`]); timers due before the first phase are left out.
pub fn lateness_where(
    samples: &[(u64, u64)],
    phases: &[(u64, String)],
    before_ms: u64,
    after_ms: u64,
    ok: impl Fn(&str) -> bool,
) -> Percentiles {
    let mut late = Vec::new();
    for (due_ms, late_ms) in samples {
        if phases.partition_point(|(start, _)| start <= due_ms) == 0 {
            continue;
        }
        let from = due_ms.saturating_sub(before_ms);
        let first = phases.partition_point(|(start, _)| *start <= from).saturating_sub(1);
        let last = phases.partition_point(|(start, _)| *start <= due_ms + after_ms) - 1;
        if phases[first..=last].iter().all(|(_, label)| ok(label)) {
            late.push(*late_ms);
        }
    }
    Percentiles::of(late)
}

/// Counts the places where, within a shard, a higher epoch's earliest attempt
/// index is not above every attempt index of the lower epochs.
fn epoch_order_violations(deliveries: &[Delivery]) -> usize {
    // shard -> epoch -> (min attempt index, max attempt index)
    let mut spans: BTreeMap<u32, BTreeMap<u64, (u64, u64)>> = BTreeMap::new();
    for d in deliveries.iter().filter(|d| d.attempt_index != 0 && d.epoch != 0) {
        let span = spans.entry(d.shard).or_default().entry(d.epoch).or_insert((u64::MAX, 0));
        span.0 = span.0.min(d.attempt_index);
        span.1 = span.1.max(d.attempt_index);
    }
    let mut violations = 0;
    for epochs in spans.values() {
        let mut max_below = 0u64;
        for (min, max) in epochs.values() {
            if *min <= max_below {
                violations += 1;
            }
            max_below = max_below.max(*max);
        }
    }
    violations
}

/// A cancel that answered that the timer is cancelled: before it fired,
/// while its delivery went on, or by an earlier cancel.
fn cancel_took_effect(outcome: &str) -> bool {
    matches!(outcome, "cancelled" | "cancelled_while_firing" | "already_cancelled")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(shard: u32, epoch: u64, attempt_index: u64) -> Delivery {
        Delivery {
            recv_ms: 0,
            verdict: Verdict::Accepted,
            id: String::new(),
            shard,
            epoch,
            fire_id: String::new(),
            attempt: 1,
            attempt_index,
            fire_at_ms: 0,
            path: String::new(),
            status: 200,
        }
    }

    #[test]
    fn create_calls_after_healing_count_only_creates_sent_in_the_span() {
        let op = |op: &str, invoke_ms: u64, complete_ms: u64| Op {
            op: op.into(),
            namespace: String::new(),
            id: String::new(),
            fire_at_ms: 0,
            invoke_ms,
            complete_ms,
            outcome: "ok".into(),
            applied_index: 0,
            created_at_ms: 0,
            error: String::new(),
            code: String::new(),
        };
        let ops = [
            op("create", 900, 5_000), // sent before the heal
            op("create", 1_000, 1_004),
            op("create", 1_500, 3_700), // held past a 2 s deadline
            op("cancel", 1_600, 9_000),
            op("create", 6_000, 6_001), // sent after the span
        ];
        let p = create_calls_begun(&ops, 1_000, 6_000);
        assert_eq!((p.n, p.max_ms), (2, 2_200));
        assert_eq!(create_calls_begun(&ops, 7_000, 8_000).n, 0);
    }

    #[test]
    fn the_sinks_mode_lines_are_skipped_and_anything_else_unparsable_fails() {
        let dir = std::env::temp_dir().join(format!("tocsin-check-modes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dels = dir.join("deliveries.ndjson");
        let a =
            r#"{"recv_ms":1030,"verdict":"accepted","id":"a","shard":0,"epoch":1,"fire_id":"f1","fire_at_ms":1000}"#;
        let mode = r#"{"mode":"Ok","path":"/status/500","recv_ms":1040,"verdict":"mode"}"#;
        let b =
            r#"{"recv_ms":1050,"verdict":"duplicate","id":"b","shard":0,"epoch":1,"fire_id":"f2","fire_at_ms":1000}"#;
        std::fs::write(&dels, format!("{a}\n{mode}\n{b}\n")).unwrap();
        let read = read_deliveries(&dels).unwrap();
        assert_eq!(read.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let renamed =
            r#"{"recv_ms":1050,"verdict":"renamed","id":"c","shard":0,"epoch":1,"fire_id":"f3","fire_at_ms":1000}"#;
        std::fs::write(&dels, format!("{a}\n{renamed}\n{b}\n")).unwrap();
        assert!(read_deliveries(&dels).is_err(), "a renamed verdict must fail the check");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Checks the operations and deliveries given as NDJSON lines, written to
    /// a scratch directory of the test's own.
    fn check_lines(test: &str, ops: &[&str], deliveries: &[&str]) -> Report {
        let dir = std::env::temp_dir().join(format!("tocsin-check-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ops_path, dels_path) = (dir.join("ops.ndjson"), dir.join("deliveries.ndjson"));
        std::fs::write(&ops_path, ops.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
        std::fs::write(&dels_path, deliveries.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
        let inputs = Inputs {
            ops: &ops_path,
            deliveries: std::slice::from_ref(&dels_path),
            fault: None,
            lateness_prefixes: &[],
            early_tolerance_ms: 0,
        };
        let report = check(&inputs).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        report
    }

    #[test]
    fn unknown_creates_are_counted_by_their_code_with_the_first_message() {
        let r = check_lines(
            "unknown",
            &[
                r#"{"op":"create","id":"a","fire_at_ms":1000,"invoke_ms":0,"complete_ms":1,"outcome":"ok","created_at_ms":1}"#,
                r#"{"op":"create","id":"b","fire_at_ms":1000,"invoke_ms":0,"complete_ms":9,"outcome":"unknown","error":"first","code":"ResourceExhausted"}"#,
                r#"{"op":"create","id":"c","fire_at_ms":1000,"invoke_ms":0,"complete_ms":9,"outcome":"unknown","error":"second","code":"ResourceExhausted"}"#,
                r#"{"op":"create","id":"d","fire_at_ms":1000,"invoke_ms":0,"complete_ms":9,"outcome":"unknown","error":"gone","code":"Unavailable"}"#,
            ],
            &[r#"{"recv_ms":1005,"verdict":"accepted","id":"a","shard":0,"epoch":1,"fire_id":"f1","fire_at_ms":1000}"#],
        );
        assert_eq!(r.creates_unknown, 3);
        let by_code: Vec<_> =
            r.creates_unknown_by_code.iter().map(|(c, (n, m))| (c.as_str(), *n, m.as_str())).collect();
        assert_eq!(by_code, [("ResourceExhausted", 2, "first"), ("Unavailable", 1, "gone")]);
    }

    /// Seen in the full matrix (flapping-partitions, 2026-11-26): a `Fire`
    /// and a cancel proposed at the same moment share one log entry; the
    /// cancel, applied after the fire, answers CANCELLED_WHILE_FIRING with
    /// the entry's index, which is the attempt's index too. That delivery
    /// was in flight; one started by a later entry is not.
    #[test]
    fn an_attempt_started_in_the_cancels_own_entry_was_in_flight() {
        let r = check_lines(
            "i2",
            &[
                r#"{"op":"create","id":"a","fire_at_ms":1000,"invoke_ms":0,"complete_ms":1,"outcome":"ok","created_at_ms":1}"#,
                r#"{"op":"create","id":"b","fire_at_ms":1000,"invoke_ms":0,"complete_ms":1,"outcome":"ok","created_at_ms":1}"#,
                r#"{"op":"cancel","id":"a","invoke_ms":990,"complete_ms":1010,"outcome":"cancelled_while_firing","applied_index":7}"#,
                r#"{"op":"cancel","id":"b","invoke_ms":990,"complete_ms":1010,"outcome":"cancelled_while_firing","applied_index":7}"#,
            ],
            &[
                r#"{"recv_ms":1005,"verdict":"accepted","id":"a","shard":0,"epoch":1,"fire_id":"f1","attempt_index":7,"fire_at_ms":1000}"#,
                r#"{"recv_ms":1020,"verdict":"accepted","id":"b","shard":0,"epoch":1,"fire_id":"f2","attempt_index":8,"fire_at_ms":1000}"#,
            ],
        );
        assert_eq!((r.cancelled_in_flight_excused, r.cancelled_then_delivered), (1, 1));
    }

    /// A cancel that answered CANCELLED found the timer unfired (an armed
    /// fire whose time had not come is undone by it): a delivery of it is a
    /// violation whatever its attempt's index, an armed attempt's being
    /// below the cancel's.
    #[test]
    fn a_timer_whose_cancel_answered_cancelled_is_never_delivered() {
        let r = check_lines(
            "i2-cancelled",
            &[
                r#"{"op":"create","id":"a","fire_at_ms":1000,"invoke_ms":0,"complete_ms":1,"outcome":"ok","created_at_ms":1}"#,
                r#"{"op":"cancel","id":"a","invoke_ms":900,"complete_ms":910,"outcome":"cancelled","applied_index":9}"#,
            ],
            &[
                r#"{"recv_ms":1005,"verdict":"accepted","id":"a","shard":0,"epoch":1,"fire_id":"f1","attempt_index":8,"fire_at_ms":1000}"#,
            ],
        );
        assert_eq!((r.cancelled_in_flight_excused, r.cancelled_then_delivered), (0, 1));
    }

    #[test]
    fn a_nodes_leadership_lines_come_with_their_time_after_the_fault() {
        assert_eq!(rfc3339_utc_ms("1970-01-01T00:00:01.5Z"), Some(1_500));
        assert_eq!(rfc3339_utc_ms("2026-12-07T07:04:02.123456Z"), Some(1_796_627_042_123));
        assert_eq!(rfc3339_utc_ms("2024-02-29T00:00:00Z"), Some(1_709_164_800_000));
        assert_eq!(rfc3339_utc_ms("not a time"), None);
        let log = "\
2026-12-07T07:04:01.000000Z  INFO elected; committing a leader epoch shard=0
2026-12-07T07:04:02.100000Z  INFO elected; committing a leader epoch shard=0
2026-12-07T07:04:02.100500Z  INFO elected; committing a leader epoch shard=10
2026-12-07T07:04:02.110000Z  INFO applied something shard=0
2026-12-07T07:04:02.350000Z  INFO leading shard shard=0 epoch=41 epoch_ms=250
2026-12-07T07:04:02.400000Z  INFO first fire batch shard=0 epoch=41 ms_since_leading=50
garbage shard=0 leading shard";
        let since = rfc3339_utc_ms("2026-12-07T07:04:02Z").unwrap();
        let lines = leadership_lines(log, 0, since);
        let got: Vec<(u64, &str)> = lines.iter().map(|(at, l)| (at - since, l.as_str())).collect();
        assert_eq!(
            got,
            vec![
                (100, "elected; committing a leader epoch shard=0"),
                (350, "leading shard shard=0 epoch=41 epoch_ms=250"),
                (400, "first fire batch shard=0 epoch=41 ms_since_leading=50"),
            ]
        );
    }

    #[test]
    fn the_new_leaders_first_fire_is_its_shards_first_delivery_under_a_newer_epoch() {
        let at = |recv_ms, shard, epoch| Delivery { recv_ms, ..d(shard, epoch, 1) };
        let stale = Delivery { verdict: Verdict::RejectedStale, ..at(1_100, 0, 9) };
        // Shard 0 delivered under epoch 3 before the fault at 1,000 and under
        // 3 again after it (the old leader, still serving) before its new
        // leader's epoch 5 at 1,240; shard 1's new epoch and a rejected
        // delivery do not count.
        let ds = [at(900, 0, 3), at(1_050, 0, 3), stale, at(1_150, 1, 7), at(1_300, 0, 5), at(1_240, 0, 5)];
        let refs: Vec<&Delivery> = ds.iter().collect();
        assert_eq!(first_fire_new_leader(&refs, 0, 1_000), Some(240));
        assert_eq!(first_fire_new_leader(&refs, 1, 1_000), None, "nothing of shard 1 before the fault");
        assert_eq!(first_fire_new_leader(&refs[..3], 0, 1_000), None, "shard 0 kept its leader");
    }

    #[test]
    fn lateness_counts_from_creation_when_the_create_came_after_the_fire_time() {
        // "a" is on time-ish (30 ms late); "b" was created 2 s after its fire
        // time and delivered 40 ms after creation; "c" was acknowledged and
        // never delivered.
        let r = check_lines(
            "lateness",
            &[
                r#"{"op":"create","id":"a","fire_at_ms":1000,"invoke_ms":0,"complete_ms":1,"outcome":"ok","created_at_ms":1}"#,
                r#"{"op":"create","id":"b","fire_at_ms":1000,"invoke_ms":0,"complete_ms":3001,"outcome":"ok","created_at_ms":3000}"#,
                r#"{"op":"create","id":"c","fire_at_ms":1000,"invoke_ms":0,"complete_ms":1,"outcome":"ok","created_at_ms":1}"#,
            ],
            &[
                r#"{"recv_ms":1030,"verdict":"accepted","id":"a","shard":0,"epoch":1,"fire_id":"f1","attempt_index":5,"fire_at_ms":1000}"#,
                r#"{"recv_ms":3040,"verdict":"accepted","id":"b","shard":0,"epoch":1,"fire_id":"f2","attempt_index":6,"fire_at_ms":1000}"#,
            ],
        );
        assert_eq!((r.must_fire, r.lost, r.created_overdue, r.early), (3, 1, 1, 0));
        assert_eq!(r.lateness.max_ms, 40);
        assert!(!r.failures(1_000).is_empty(), "a lost timer fails the run");
    }

    #[test]
    fn epochs_must_order_attempts_like_the_log() {
        assert_eq!(epoch_order_violations(&[d(0, 1, 10), d(0, 1, 20), d(0, 2, 30), d(1, 1, 5)]), 0);
        // Epoch 2 started an attempt at index 15, before epoch 1's at 20.
        assert_eq!(epoch_order_violations(&[d(0, 1, 10), d(0, 1, 20), d(0, 2, 15)]), 1);
        // Other shards' indexes are unrelated.
        assert_eq!(epoch_order_violations(&[d(0, 1, 100), d(1, 2, 1)]), 0);
    }

    #[test]
    fn lateness_is_split_by_the_phase_each_timer_was_due_in() {
        let phases = vec![(100, "quorum".to_string()), (200, "no quorum".to_string()), (300, "quorum".to_string())];
        // Before the first phase: not counted. 150 and 350 share a label.
        let samples = [(50, 9_999), (150, 10), (250, 2_000), (299, 3_000), (350, 30), (200, 1_500)];
        let by = lateness_by_phase(&samples, &phases);
        let labels: Vec<&str> = by.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["quorum", "no quorum"]);
        assert_eq!((by[0].1.n, by[0].1.max_ms), (2, 30));
        assert_eq!((by[1].1.n, by[1].1.p50_ms, by[1].1.max_ms), (3, 2_000, 3_000));
        assert!(lateness_by_phase(&samples, &[]).is_empty());
    }

    #[test]
    fn only_timers_whose_whole_window_passes_are_counted() {
        let phases = vec![(100, "up".to_string()), (200, "down".to_string()), (300, "up".to_string())];
        let samples = [(50, 1), (110, 2), (150, 3), (199, 4), (250, 5), (300, 6), (500, 7)];
        // 150 and 199 run into "down" within 60 ms; 50 is before the phases.
        let p = lateness_where(&samples, &phases, 0, 60, |l| l == "up");
        assert_eq!((p.n, p.max_ms), (3, 7));
        assert_eq!(lateness_where(&samples, &phases, 0, 0, |l| l == "up").n, 5);
        assert_eq!(lateness_where(&samples, &phases, 0, 1_000, |l| l == "up").n, 2);
        // 300 came right after "down": 50 ms before it is still down.
        let p = lateness_where(&samples, &phases, 50, 0, |l| l == "up");
        assert_eq!((p.n, p.max_ms), (4, 7));
    }
}
