//! The node's only reads of the wall clock.
//!
//! Leaders stamp `now_ms` from here into every log entry (so apply never
//! reads a clock), and the wheel is polled with it. Wall-clock time is unix
//! milliseconds, the scale fire times use.

use std::time::SystemTime;
use std::time::UNIX_EPOCH;

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
