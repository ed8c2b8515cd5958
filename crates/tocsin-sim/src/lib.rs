//! Deterministic simulation of one Tocsin shard: three nodes in one
//! process, on turmoil's simulated network and clock, running openraft and
//! tocsin-core's real rules (`apply`, `FireCore`) behind a compact
//! equivalent of the node's leader shell, under a seeded workload and fault
//! schedule, with the reliability invariants checked after every seed.
//!
//! - [`plan`]: what a seed fixes (workload and faults);
//! - [`world`]: the hosts, the fault loop and the history;
//! - [`node`]: a simulated node (Raft, client API, leader loop, delivery);
//! - [`store`]: in-memory openraft storage that survives host crashes;
//! - [`net`]: the wire (JSON frames over turmoil TCP);
//! - [`types`]: openraft's type config with a seeded RNG;
//! - [`check`]: the invariants I1, I2, I4, I6 and I7.

pub mod check;
pub mod net;
pub mod node;
pub mod plan;
pub mod store;
pub mod types;
pub mod world;

pub use world::Knobs;

/// One seed's verdict.
pub struct SeedResult {
    pub seed: u64,
    pub report: check::Report,
    /// Digest of the plan (workload and faults) the seed drew.
    pub plan_digest: u64,
    /// Digest of what happened: every op's outcome, every delivery with its
    /// arrival time, every leader epoch.
    pub trace_digest: u64,
}

/// Runs and checks one seed.
pub fn run_seed(seed: u64, knobs: Knobs) -> SeedResult {
    let out = world::run(seed, knobs);
    let report = check::check(&out);
    let h = &out.history;
    let trace = format!(
        "{:?}|{:?}|{:?}|{:?}",
        h.ops.iter().map(|o| (&o.op, format!("{:?}", o.outcome), o.any_unknown, o.ack_ms)).collect::<Vec<_>>(),
        h.received.iter().map(|d| (&d.delivery, d.recv_ms, d.status)).collect::<Vec<_>>(),
        h.epochs,
        out.finals
    );
    SeedResult {
        seed,
        report,
        plan_digest: out.plan.digest(),
        trace_digest: xxhash_rust::xxh3::xxh3_64(trace.as_bytes()),
    }
}
