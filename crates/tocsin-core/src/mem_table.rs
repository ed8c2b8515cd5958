//! An in-memory [`TimerTable`] that keeps the fire-time and retention
//! indexes exactly as the RocksDB store derives them: the reference model
//! the rules and the store are tested against.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::convert::Infallible;

use crate::apply::TimerTable;
use crate::timer::TimerKey;
use crate::timer::TimerRecord;

#[derive(Default, Clone, Debug, PartialEq, Eq)]
pub struct MemTable {
    pub timers: BTreeMap<TimerKey, TimerRecord>,
    /// The fire-time index: `(due_ms, key)`.
    pub due: BTreeSet<(u64, TimerKey)>,
    /// The retention index: `(purge_after_ms, key)`.
    pub retention: BTreeSet<(u64, TimerKey)>,
    /// Scheduled timers per `(namespace, fire minute)`.
    pub horizon: BTreeMap<(String, u64), u64>,
}

impl TimerTable for MemTable {
    type Error = Infallible;

    fn get(&mut self, key: &TimerKey) -> Result<Option<TimerRecord>, Infallible> {
        Ok(self.timers.get(key).cloned())
    }

    fn write(
        &mut self,
        key: &TimerKey,
        old: Option<&TimerRecord>,
        new: Option<&TimerRecord>,
    ) -> Result<(), Infallible> {
        assert_eq!(self.timers.get(key), old, "write must be given the stored record as old");
        if let Some(old) = old {
            if let Some(due) = old.due_ms() {
                assert!(self.due.remove(&(due, key.clone())), "due entry of {key} missing");
            }
            if let Some(after) = old.purge_after_ms() {
                assert!(self.retention.remove(&(after, key.clone())), "retention entry of {key} missing");
            }
            if let Some(minute) = old.horizon_minute() {
                let slot = (key.namespace.clone(), minute);
                let count = self.horizon.get_mut(&slot).expect("horizon counter present");
                *count -= 1;
                if *count == 0 {
                    self.horizon.remove(&slot);
                }
            }
        }
        match new {
            Some(new) => {
                if let Some(due) = new.due_ms() {
                    self.due.insert((due, key.clone()));
                }
                if let Some(after) = new.purge_after_ms() {
                    self.retention.insert((after, key.clone()));
                }
                if let Some(minute) = new.horizon_minute() {
                    *self.horizon.entry((key.namespace.clone(), minute)).or_default() += 1;
                }
                self.timers.insert(key.clone(), new.clone());
            }
            None => {
                self.timers.remove(key);
            }
        }
        Ok(())
    }
}
