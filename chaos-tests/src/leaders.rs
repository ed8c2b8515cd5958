//! Watches who leads each shard while a fault runs: samples every node's
//! view a few times a second and counts leader changes (a new leader, or a
//! new term, per shard), for the scenarios whose bound is "no flapping".

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::cluster;
use crate::driver::now_ms;

/// Who led a shard at one moment, as the nodes reported it.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub at_ms: u64,
    pub shard: u32,
    pub leader: u64,
    pub term: u64,
}

/// A background sampler; stops when dropped.
pub struct LeaderWatch {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
}

impl LeaderWatch {
    /// Samples `addrs` every `every`.
    pub fn start(addrs: Vec<String>, every: Duration) -> LeaderWatch {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (out, halt) = (samples.clone(), stop.clone());
        tokio::spawn(async move {
            while !halt.load(Ordering::Relaxed) {
                let at_ms = now_ms();
                let infos = futures::future::join_all(addrs.iter().map(|a| cluster::node_info(a, false))).await;
                // Per shard, the report with the highest term that names a leader.
                let mut best: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
                for info in infos.into_iter().flatten() {
                    for s in info.shards.iter().filter(|s| s.leader != 0) {
                        let e = best.entry(s.shard).or_insert((s.term, s.leader));
                        if s.term > e.0 {
                            *e = (s.term, s.leader);
                        }
                    }
                }
                out.lock().expect("samples lock").extend(best.into_iter().map(|(shard, (term, leader))| Sample {
                    at_ms,
                    shard,
                    leader,
                    term,
                }));
                tokio::time::sleep(every).await;
            }
        });
        LeaderWatch { samples, stop }
    }

    /// Leader changes per shard seen in `[from_ms, to_ms]`: how often a
    /// shard's (leader, term) differs from its previous sample.
    pub fn changes(&self, from_ms: u64, to_ms: u64) -> std::collections::BTreeMap<u32, usize> {
        let samples = self.samples.lock().expect("samples lock");
        let mut last: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
        let mut changes: std::collections::BTreeMap<u32, usize> = Default::default();
        for s in samples.iter() {
            let previous = last.insert(s.shard, (s.leader, s.term));
            if s.at_ms < from_ms || s.at_ms > to_ms {
                continue;
            }
            let count = changes.entry(s.shard).or_insert(0);
            if previous.is_some_and(|p| p != (s.leader, s.term)) {
                *count += 1;
            }
        }
        changes
    }
}

impl Drop for LeaderWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
