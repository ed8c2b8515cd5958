//! The cluster map's pauses as this node last learned them: namespaces
//! whose firing is paused (the fire loops let their due timers go) and
//! webhook endpoints whose deliveries are held (the webhook sender).

use std::collections::BTreeSet;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

/// What the cluster map pauses: namespaces (nothing of theirs fires) and
/// webhook endpoints (nothing is sent to them). Replaced whole whenever
/// this node learns a map that changes it; the fire loops look at the
/// version each turn.
#[derive(Default)]
pub struct Paused {
    current: RwLock<Arc<PausedSets>>,
    version: AtomicU64,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct PausedSets {
    pub namespaces: BTreeSet<String>,
    pub endpoints: BTreeSet<String>,
}

impl Paused {
    /// Takes a newly learned map's pauses.
    pub fn learn(&self, map: &tocsin_core::cluster::ClusterMap) {
        let next = PausedSets {
            namespaces: map.paused_namespaces.keys().cloned().collect(),
            endpoints: map.paused_endpoints.keys().cloned().collect(),
        };
        let mut current = self.current.write().expect("paused lock");
        if **current != next {
            tracing::info!(namespaces = ?next.namespaces, endpoints = ?next.endpoints, "paused set changed");
            *current = Arc::new(next);
            self.version.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    pub fn get(&self) -> Arc<PausedSets> {
        self.current.read().expect("paused lock").clone()
    }

    /// The paused namespaces, for the fire core.
    pub fn namespaces(&self) -> HashSet<String> {
        self.get().namespaces.iter().cloned().collect()
    }

    pub fn endpoint_paused(&self, origin: &str) -> bool {
        self.get().endpoints.contains(origin)
    }
}
