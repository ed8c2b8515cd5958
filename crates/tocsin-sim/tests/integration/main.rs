//! The simulation's seeds: `cargo test` runs 100, `TOCSIN_DST_SEEDS=N` runs
//! N, `TOCSIN_DST_SEED=s` replays one.

mod seeds;
