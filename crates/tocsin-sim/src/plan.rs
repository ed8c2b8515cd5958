//! What a seed fixes: the workload (creates, cancels, reschedules, dropped
//! replies) and the fault schedule (partitions, delays, crashes, clock
//! offsets, receiver outages), drawn from a splitmix64 stream so that a seed
//! means the same plan on every platform and Rust release.

use tocsin_core::TimerKey;

/// The workload's ops start in `[OPS_FROM_MS, OPS_UNTIL_MS)` of simulated time.
pub const OPS_FROM_MS: u64 = 1_000;
pub const OPS_UNTIL_MS: u64 = 30_000;
/// Faults start before this; at it everything heals.
pub const HEAL_AT_MS: u64 = 36_000;
/// The run ends here: time to drain backoffs, deadlines and reservations.
pub const END_MS: u64 = 56_000;
/// Largest clock offset ahead of true time a node may get. The real node's
/// clock guard stops a node that is further off its peers from firing; the
/// simulation has no guard, so it keeps fast clocks within what the guard
/// tolerates, and I6 allows a delivery to be this early.
pub const MAX_AHEAD_MS: i64 = 250;

/// splitmix64: small, fast, and fixed forever (unlike `StdRng`).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }

    /// True with probability `permille / 1000`.
    pub fn chance(&mut self, permille: u64) -> bool {
        self.next_u64() % 1000 < permille
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// `fire_at_ms` is in simulated time (ms since the start).
    Create {
        fire_at_ms: u64,
        pull: bool,
    },
    Cancel,
    Reschedule {
        fire_at_ms: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub at_ms: u64,
    pub key: TimerKey,
    pub kind: OpKind,
    /// The first attempt's reply is dropped after the node applied it.
    pub drop_reply: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    Partition { a: String, b: String, oneway: bool },
    Repair { a: String, b: String },
    Crash(u64),
    Restart(u64),
    Latency { a: String, b: String, ms: u64 },
    Clock { node: u64, offset_ms: i64 },
    ReceiverDown(bool),
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    pub ops: Vec<Op>,
    /// `(at_ms, fault)`, sorted by time.
    pub faults: Vec<(u64, Fault)>,
    /// The receiver accepts a delivery and drops the reply this often.
    pub receiver_drop_permille: u64,
    /// A pull consumer crashes part-way through a batch this often.
    pub consumer_crash_permille: u64,
}

fn node_name(n: u64) -> String {
    crate::net::node_host(n)
}

impl Plan {
    pub fn generate(seed: u64) -> Plan {
        let mut rng = Rng::new(seed);
        let mut ops = Vec::new();
        let creates = rng.range(30, 70);
        for i in 0..creates {
            let key = TimerKey::new("dst", format!("t{i:03}"));
            let at_ms = rng.range(OPS_FROM_MS, OPS_UNTIL_MS);
            let fire_at_ms = at_ms + rng.range(500, 8_000);
            let pull = rng.chance(300);
            let drop_reply = rng.chance(100);
            ops.push(Op { at_ms, key: key.clone(), kind: OpKind::Create { fire_at_ms, pull }, drop_reply });
            if rng.chance(80) {
                // The same create again later: idempotent.
                let again = at_ms + rng.range(10, 3_000);
                ops.push(Op {
                    at_ms: again,
                    key: key.clone(),
                    kind: OpKind::Create { fire_at_ms, pull },
                    drop_reply: false,
                });
            }
            if rng.chance(200) {
                let at = at_ms + rng.range(200, 4_000);
                let fire_at_ms = at + rng.range(300, 5_000);
                ops.push(Op {
                    at_ms: at,
                    key: key.clone(),
                    kind: OpKind::Reschedule { fire_at_ms },
                    drop_reply: rng.chance(100),
                });
            }
            if rng.chance(300) {
                // Some race the fire, some come after it.
                let at = at_ms + rng.range(50, 9_000);
                ops.push(Op { at_ms: at, key, kind: OpKind::Cancel, drop_reply: rng.chance(100) });
            }
        }
        ops.sort_by(|a, b| (a.at_ms, &a.key).cmp(&(b.at_ms, &b.key)));

        let mut faults = Vec::new();
        let hosts = ["n1", "n2", "n3", "recv", "client", "consumer"];
        let episodes = rng.range(3, 9);
        for _ in 0..episodes {
            let at = rng.range(2_000, HEAL_AT_MS - 2_000);
            let until = (at + rng.range(500, 6_000)).min(HEAL_AT_MS - 1);
            match rng.range(0, 7) {
                0 => {
                    // One node cut off from the other two.
                    let n = rng.range(1, 4);
                    for m in (1..=3).filter(|m| *m != n) {
                        faults.push((at, Fault::Partition { a: node_name(n), b: node_name(m), oneway: false }));
                        faults.push((until, Fault::Repair { a: node_name(n), b: node_name(m) }));
                    }
                }
                1 => {
                    let a = hosts[rng.range(0, 6) as usize].to_string();
                    let b = hosts[rng.range(0, 3) as usize].to_string();
                    if a != b {
                        let oneway = rng.chance(500);
                        faults.push((at, Fault::Partition { a: a.clone(), b: b.clone(), oneway }));
                        faults.push((until, Fault::Repair { a, b }));
                    }
                }
                2 => {
                    let n = rng.range(1, 4);
                    faults.push((at, Fault::Crash(n)));
                    faults.push((until, Fault::Restart(n)));
                }
                3 => {
                    let a = node_name(rng.range(1, 4));
                    let b = hosts[rng.range(0, 6) as usize].to_string();
                    if a != b {
                        let ms = rng.range(20, 200);
                        faults.push((at, Fault::Latency { a: a.clone(), b: b.clone(), ms }));
                        faults.push((until, Fault::Latency { a, b, ms: 2 }));
                    }
                }
                4 => {
                    let node = rng.range(1, 4);
                    let offset_ms = if rng.chance(150) {
                        // Far behind: a slow clock must not make anything early
                        // or move a stamp backwards.
                        -(rng.range(1_000, 5_000) as i64)
                    } else {
                        rng.range(0, 2 * MAX_AHEAD_MS as u64 + 1) as i64 - MAX_AHEAD_MS
                    };
                    faults.push((at, Fault::Clock { node, offset_ms }));
                }
                _ => {
                    faults.push((at, Fault::ReceiverDown(true)));
                    faults.push((until, Fault::ReceiverDown(false)));
                }
            }
        }
        faults.sort_by_key(|(at, _)| *at);
        Plan {
            seed,
            ops,
            faults,
            receiver_drop_permille: rng.range(0, 100),
            consumer_crash_permille: rng.range(100, 400),
        }
    }

    /// A digest of the whole plan: equal seeds give equal digests.
    pub fn digest(&self) -> u64 {
        let text = format!(
            "{:?}|{:?}|{}|{}",
            self.ops, self.faults, self.receiver_drop_permille, self.consumer_crash_permille
        );
        xxhash_rust::xxh3::xxh3_64(text.as_bytes())
    }
}
