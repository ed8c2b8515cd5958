//! The invariants, judged over one run's history (the project's reliability
//! notes; the chaos harness's `check.rs` judges the same on real processes):
//!
//! - **I1** every timer whose create was acknowledged, with no cancel that
//!   answered `CANCELLED`/`ALREADY_CANCELLED` or whose outcome is unknown,
//!   has an accepted delivery (webhook 2xx, or processed by a consumer);
//! - **I2** no accepted delivery of a timer after its cancel was
//!   acknowledged, unless the attempt started before the cancel's log index
//!   and arrived within the lease (plus an epsilon) of the acknowledgement;
//!   and none at all of a timer whose cancel answered `CANCELLED` (it had
//!   not fired: an armed fire whose time had not come was undone);
//! - **I4** the receiver accepts no delivery whose epoch is below one it
//!   accepted before; and epochs order attempts as the log does (a higher
//!   epoch's attempt has a higher log index, at or after its epoch entry);
//! - **I6** nothing arrives before its fire time, measured in true time
//!   (less one tick and the largest clock lead a node was given);
//! - **I7** after heal every replica has the same `last_applied` and digest.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use tocsin_core::CommandResult;
use tocsin_core::TimerKey;

use crate::plan::OpKind;
use crate::world::BASE_MS;
use crate::world::Channel;
use crate::world::OpOutcome;
use crate::world::RunOutput;
use crate::world::TICK_MS;

/// I2's epsilon beyond the lease: one webhook attempt's time, the longest an
/// attempt dispatched before the cancel can take to arrive.
const I2_EPSILON_MS: u64 = crate::node::WEBHOOK_TIMEOUT_MS;

#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub acked_creates: usize,
    pub must_deliver: usize,
    pub accepted: usize,
    pub rejected_stale: usize,
    pub leaders: usize,
}

pub fn check(out: &RunOutput) -> Report {
    let mut r = Report::default();
    let h = &out.history;
    for p in &out.panics {
        r.violations.push(format!("panic: {p}"));
    }
    // What the client learnt about each timer.
    let mut acked: BTreeSet<TimerKey> = BTreeSet::new();
    let mut cancel_excludes: BTreeSet<TimerKey> = BTreeSet::new();
    let mut cancels_ok: BTreeMap<TimerKey, (u64, u64)> = BTreeMap::new();
    let mut cancelled_unfired: BTreeMap<TimerKey, (u64, u64)> = BTreeMap::new();
    let mut fire_times: BTreeMap<TimerKey, BTreeSet<u64>> = BTreeMap::new();
    for rec in &h.ops {
        match &rec.op.kind {
            OpKind::Create { fire_at_ms, .. } => {
                fire_times.entry(rec.op.key.clone()).or_default().insert(BASE_MS + fire_at_ms);
                if let OpOutcome::Applied { result, .. } = &rec.outcome
                    && matches!(**result, CommandResult::Created { .. })
                {
                    acked.insert(rec.op.key.clone());
                }
            }
            OpKind::Reschedule { fire_at_ms } => {
                fire_times.entry(rec.op.key.clone()).or_default().insert(BASE_MS + fire_at_ms);
            }
            OpKind::Cancel => match &rec.outcome {
                // Cancelled before it fired or while its delivery went on:
                // anything delivered after must have started before `index`.
                OpOutcome::Applied { index, result }
                    if !rec.any_unknown
                        && matches!(
                            **result,
                            CommandResult::Cancelled { .. } | CommandResult::CancelledWhileFiring { .. }
                        ) =>
                {
                    cancel_excludes.insert(rec.op.key.clone());
                    cancels_ok.insert(rec.op.key.clone(), (*index, rec.ack_ms));
                    if matches!(**result, CommandResult::Cancelled { .. }) {
                        cancelled_unfired.insert(rec.op.key.clone(), (*index, rec.ack_ms));
                    }
                }
                OpOutcome::Applied { result, .. }
                    if !rec.any_unknown
                        && matches!(**result, CommandResult::AlreadyFired { .. } | CommandResult::NotFound) => {}
                // Cancelled after an unknown attempt, already cancelled, or
                // unknown: the cancel may have taken effect at an unknown index.
                OpOutcome::Skipped => {}
                _ => {
                    cancel_excludes.insert(rec.op.key.clone());
                }
            },
        }
    }
    r.acked_creates = acked.len();

    let accepted: Vec<_> = h.received.iter().filter(|d| d.status == 200).collect();
    r.accepted = accepted.len();
    r.rejected_stale = h.received.iter().filter(|d| d.status == 409).count();
    r.leaders = h.epochs.len();
    let delivered: BTreeSet<&TimerKey> = accepted.iter().map(|d| &d.delivery.key).collect();

    // I1.
    for key in acked.iter().filter(|k| !cancel_excludes.contains(*k)) {
        r.must_deliver += 1;
        if !delivered.contains(key) {
            let ops: Vec<_> =
                h.ops.iter().filter(|o| &o.op.key == key).map(|o| (&o.op, &o.outcome, o.ack_ms - BASE_MS)).collect();
            let seen: Vec<_> = h.received.iter().filter(|d| &d.delivery.key == key).collect();
            r.violations.push(format!(
                "I1 lost: {key} was acknowledged, never cancelled, and never delivered; ops {ops:?}; \
                 reached a receiver {seen:?}; final record {:?}; leaders (node, epoch, ms) {:?}",
                out.final_records.get(key),
                h.epochs.iter().map(|(n, e, ms)| (n, e, ms - BASE_MS)).collect::<Vec<_>>()
            ));
        }
    }

    // I2.
    for d in &accepted {
        let Some((cancel_index, ack_ms)) = cancels_ok.get(&d.delivery.key) else { continue };
        let in_flight =
            d.delivery.attempt_index < *cancel_index && d.recv_ms <= ack_ms + crate::node::LEASE_MS + I2_EPSILON_MS;
        if d.delivery.attempt_index >= *cancel_index || (d.recv_ms > *ack_ms && !in_flight) {
            r.violations.push(format!(
                "I2 fired after cancel: {} cancel applied at index {cancel_index}, acknowledged at +{} ms; \
                 delivery (attempt index {}, epoch {}, from n{}) received at +{} ms via {:?}",
                d.delivery.key,
                ack_ms - BASE_MS,
                d.delivery.attempt_index,
                d.delivery.epoch,
                d.delivery.from,
                d.recv_ms - BASE_MS,
                d.channel
            ));
        }
    }

    for d in &accepted {
        let Some((cancel_index, ack_ms)) = cancelled_unfired.get(&d.delivery.key) else { continue };
        r.violations.push(format!(
            "I2 fired after a cancel that said it had not: {} cancel answered CANCELLED at index {cancel_index}, \
             acknowledged at +{} ms; delivery (attempt index {}, epoch {}, from n{}) received at +{} ms",
            d.delivery.key,
            ack_ms - BASE_MS,
            d.delivery.attempt_index,
            d.delivery.epoch,
            d.delivery.from,
            d.recv_ms - BASE_MS,
        ));
    }

    // I4: the receiver's acceptances in arrival order, then the epochs against
    // the log order of every attempt that reached it.
    let mut max_epoch = 0;
    for d in accepted.iter().filter(|d| d.channel == Channel::Webhook) {
        if d.delivery.epoch < max_epoch {
            r.violations.push(format!(
                "I4 stale epoch accepted: {} epoch {} after epoch {max_epoch} (from n{})",
                d.delivery.key, d.delivery.epoch, d.delivery.from
            ));
        }
        max_epoch = max_epoch.max(d.delivery.epoch);
    }
    let mut by_epoch: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for d in &h.received {
        let e = by_epoch.entry(d.delivery.epoch).or_insert((u64::MAX, 0));
        e.0 = e.0.min(d.delivery.attempt_index);
        e.1 = e.1.max(d.delivery.attempt_index);
        if d.delivery.attempt_index < d.delivery.epoch {
            r.violations.push(format!(
                "I4 attempt before its epoch: {} attempt index {} under epoch {}",
                d.delivery.key, d.delivery.attempt_index, d.delivery.epoch
            ));
        }
    }
    let mut highest_below = 0;
    for (epoch, (lo, hi)) in &by_epoch {
        if *lo <= highest_below && highest_below > 0 {
            r.violations.push(format!(
                "I4 epochs out of log order: an attempt under epoch {epoch} has index {lo}, \
                 not above {highest_below} of a lower epoch"
            ));
        }
        highest_below = highest_below.max(*hi);
    }

    // I6.
    let tolerance_ms = TICK_MS + out.max_ahead_ms;
    for d in &accepted {
        if d.recv_ms + tolerance_ms < d.delivery.fire_at_ms {
            r.violations.push(format!(
                "I6 early: {} due at +{} ms received at +{} ms ({} ms early, tolerance {tolerance_ms} ms)",
                d.delivery.key,
                d.delivery.fire_at_ms - BASE_MS,
                d.recv_ms - BASE_MS,
                d.delivery.fire_at_ms - d.recv_ms
            ));
        }
        if !fire_times.get(&d.delivery.key).is_some_and(|t| t.contains(&d.delivery.fire_at_ms)) {
            r.violations.push(format!(
                "delivery of {} carries fire time +{} ms, which no client asked for",
                d.delivery.key,
                d.delivery.fire_at_ms.saturating_sub(BASE_MS)
            ));
        }
    }

    // I7.
    if out.finals.iter().any(|f| *f != out.finals[0]) {
        r.violations.push(format!("I7 replicas disagree after heal: (last_applied, digest) per node {:?}", out.finals));
    }
    r
}
