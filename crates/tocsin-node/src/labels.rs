//! Metric label values drawn from client input (namespaces, topics), capped:
//! the first [`MAX_VALUES`] distinct values of a label get series of their
//! own, every later one is reported as `other`. A client that invents a new
//! namespace per request cannot grow the metrics registry (and every scrape)
//! without bound.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::sync::Mutex;

/// Distinct values one label keeps before the rest become [`OTHER`].
pub const MAX_VALUES: usize = 100;
/// The value every value past the cap is reported as.
pub const OTHER: &str = "other";

/// One label's admitted values.
pub struct LabelCap {
    seen: Mutex<HashSet<String>>,
    max: usize,
}

impl LabelCap {
    pub fn new(max: usize) -> LabelCap {
        LabelCap { seen: Mutex::new(HashSet::new()), max }
    }

    /// `value` if it has (or may still get) a series of its own, else
    /// [`OTHER`].
    pub fn label(&self, value: &str) -> String {
        let mut seen = self.seen.lock().expect("label cap lock");
        if seen.contains(value) {
            return value.to_string();
        }
        if seen.len() < self.max && value != OTHER {
            seen.insert(value.to_string());
            return value.to_string();
        }
        OTHER.to_string()
    }
}

/// The `namespace` label of every metric.
pub fn namespace(value: &str) -> String {
    static CAP: LazyLock<LabelCap> = LazyLock::new(|| LabelCap::new(MAX_VALUES));
    CAP.label(value)
}

/// The `topic` label of every metric (topics of all namespaces together).
pub fn topic(value: &str) -> String {
    static CAP: LazyLock<LabelCap> = LazyLock::new(|| LabelCap::new(MAX_VALUES));
    CAP.label(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_cap_are_other_and_admitted_ones_stay() {
        let cap = LabelCap::new(2);
        assert_eq!(cap.label("a"), "a");
        assert_eq!(cap.label("b"), "b");
        assert_eq!(cap.label("c"), OTHER);
        assert_eq!(cap.label("a"), "a");
        // A client's namespace named `other` does not take a slot.
        let cap = LabelCap::new(1);
        assert_eq!(cap.label(OTHER), OTHER);
        assert_eq!(cap.label("x"), "x");
    }
}
