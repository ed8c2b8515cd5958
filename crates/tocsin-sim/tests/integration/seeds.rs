//! Seed runs, determinism, and mutation tests that show the checker fails
//! when the system is broken on purpose.

use tocsin_sim::Knobs;
use tocsin_sim::run_seed;

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("TOCSIN_DST_SEED") {
        return vec![s.parse().expect("TOCSIN_DST_SEED is a number")];
    }
    let n: u64 =
        std::env::var("TOCSIN_DST_SEEDS").ok().map_or(100, |n| n.parse().expect("TOCSIN_DST_SEEDS is a number"));
    (0..n).collect()
}

#[test]
fn dst_seeds() {
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for seed in seeds() {
        let t = std::time::Instant::now();
        let result = run_seed(seed, Knobs::default());
        let r = &result.report;
        eprintln!(
            "seed {seed}: {} ms, {} acked creates, {} must deliver, {} accepted, {} stale rejected, {} leaders, {} violations",
            t.elapsed().as_millis(),
            r.acked_creates,
            r.must_deliver,
            r.accepted,
            r.rejected_stale,
            r.leaders,
            r.violations.len()
        );
        if !r.violations.is_empty() {
            for v in &r.violations {
                eprintln!("  seed {seed}: {v}");
            }
            eprintln!(
                "replay: TOCSIN_DST_SEED={seed} cargo test -p tocsin-sim --test integration dst_seeds -- --nocapture"
            );
            failed.push(seed);
        }
    }
    eprintln!("ran {} seeds in {:.1} s", seeds().len(), started.elapsed().as_secs_f64());
    assert!(failed.is_empty(), "seeds with violations: {failed:?} (replay commands above)");
}

/// The seed fixes the workload and the fault schedule exactly; the trace of
/// what happened is compared too (see the crate's determinism notes).
#[test]
fn same_seed_same_run() {
    let a = run_seed(3, Knobs::default());
    let b = run_seed(3, Knobs::default());
    assert_eq!(a.plan_digest, b.plan_digest, "the plan must depend on the seed alone");
    // The execution is not bit-exact yet: tokio's own scheduler RNG (select!
    // fairness, seeded only under `--cfg tokio_unstable`) still varies between
    // runs. Report rather than assert.
    eprintln!(
        "seed 3 trace digests: {:x} {:x} (equal: {})",
        a.trace_digest,
        b.trace_digest,
        a.trace_digest == b.trace_digest
    );
    assert_ne!(a.plan_digest, run_seed(4, Knobs::default()).plan_digest);
}

/// Runs seeds until one reports a violation starting with `invariant`.
fn first_violation(knobs: Knobs, invariant: &str) -> Option<(u64, String)> {
    (0..10).find_map(|seed| {
        let r = run_seed(seed, knobs);
        r.report.violations.into_iter().find(|v| v.starts_with(invariant)).map(|v| (seed, v))
    })
}

/// Mutation: a leader that never starts a second attempt loses timers whose
/// receiver was down or whose consumer crashed; the checker must say so.
#[test]
fn checker_catches_missing_redelivery() {
    let found = first_violation(Knobs { no_redelivery: true, ..Knobs::default() }, "I1");
    eprintln!("no_redelivery: {found:?}");
    assert!(found.is_some(), "no seed reported I1 with redelivery switched off");
}

/// Mutation: a leader whose fire clock runs 1.5 s ahead (a clock guard that
/// lets it) fires early; the checker must say so.
#[test]
fn checker_catches_early_fires() {
    let found = first_violation(Knobs { early_ms: 1_500, ..Knobs::default() }, "I6");
    eprintln!("early_ms: {found:?}");
    assert!(found.is_some(), "no seed reported I6 with the fire clock 1.5 s ahead");
}

/// Mutation: a leader that sends an armed attempt at its start without
/// asking the stamp fence or reading the applied log since it armed it
/// sends timers whose cancel answered CANCELLED; the checker must say so.
#[test]
fn checker_catches_an_armed_attempt_sent_after_its_cancel() {
    let found = (0..30).find_map(|seed| {
        let r = run_seed(seed, Knobs { arm_unfenced: true, ..Knobs::default() });
        r.report.violations.into_iter().find(|v| v.starts_with("I2 fired after a cancel that said")).map(|v| (seed, v))
    });
    eprintln!("arm_unfenced: {found:?}");
    assert!(found.is_some(), "no seed reported I2 with armed attempts sent blind");
}
