//! Fault points: places where a test can make the node misbehave on cue
//! (drop a reply, stall, fail a proposal), as TiKV does with the `fail`
//! crate.
//!
//! They are compiled into test builds only (debug assertions on, which is
//! the profile the tests and the CI binaries use); in a release build every
//! check is a constant `None`. A point is armed with `fail::cfg(name,
//! action)` in-process, or for a whole process with the `FAILPOINTS`
//! environment variable (`name=action;name=action`, read at start-up by
//! `tocsin serve` and `tocsin dev`). Actions are `fail`'s, with the
//! argument of `return` saying what to do, so nothing blocks an async
//! worker:
//!
//! - `return(drop)`: the point's operation is dropped (a reply never sent,
//!   a stream closed, an RPC lost);
//! - `return(error)`: it fails;
//! - `return(delay:250)`: it is delayed by 250 ms first.
//!
//! `fail`'s counts and odds apply (`3*return(drop)`, `20%return(error)`).
//! The points, by name: `proposer::reply` (every reply of one entry),
//! `leader::fire_reply` (the `Fire` outcomes of one batch),
//! `leader::fire_refused` (one `Fire` batch, answered as openraft answers a
//! leader whose lease lapsed, `ForwardReason::LeaseExpired`, through the
//! proposer's own mapping; nothing proposed),
//! `webhook::record_outcome` (one attempt-outcome proposal),
//! `events::lose` (one applied entry that dispatched nothing, lost to its
//! shard leader's fire loop as a full queue loses it),
//! `pull::reserve_stream` (a consumer's stream, after each message),
//! `raft::to::<node id>` (one Raft RPC to that node), `raft::from::<node
//! id>` (one Raft message that node sends, `LIVENESS` included: armed for
//! good, the node falls silent to its peers), and in the store
//! `store::writer` (one write round: `delay:<ms>` stalls the writer).

use std::time::Duration;

/// What an armed fault point asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Drop,
    Error,
}

/// Reads the point `name`: `None` when it is not armed (always, in release
/// builds). A `delay:<ms>` action sleeps here, asynchronously, and then
/// reports nothing.
pub async fn hit(name: &str) -> Option<Fault> {
    match check_now(name) {
        Err(f) => Some(f),
        Ok(delay) => {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            None
        }
    }
}

/// Reads the point `name` without waiting: the fault it asks for, or the
/// delay a `delay:<ms>` action asks the caller to take (zero when the
/// point is not armed), for code that waits on its own terms or not at all.
pub fn check_now(name: &str) -> Result<Duration, Fault> {
    match check(name) {
        Some(Action::Fault(f)) => Err(f),
        Some(Action::Delay(d)) => Ok(d),
        None => Ok(Duration::ZERO),
    }
}

enum Action {
    Fault(Fault),
    Delay(Duration),
}

fn check(name: &str) -> Option<Action> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let arg = fail::eval(name, |arg| arg.unwrap_or_default())?;
    match arg.as_str() {
        "drop" => Some(Action::Fault(Fault::Drop)),
        "error" => Some(Action::Fault(Fault::Error)),
        other => match other.strip_prefix("delay:").and_then(|ms| ms.parse::<u64>().ok()) {
            Some(ms) => Some(Action::Delay(Duration::from_millis(ms))),
            None => {
                tracing::warn!(point = name, action = other, "unknown fault point action; ignored");
                None
            }
        },
    }
}

/// Arms the points named in `FAILPOINTS` (test builds only). Call once at
/// process start.
pub fn setup_from_env() {
    if cfg!(debug_assertions) && std::env::var_os("FAILPOINTS").is_some() {
        tracing::warn!("test build: fault points armed from FAILPOINTS");
        // The scenario lives as long as the process.
        std::mem::forget(fail::FailScenario::setup());
    }
}
