//! Recurring timers: a series rule (a cron expression in a time zone, or a
//! fixed interval) with an optional end, and the pure calculation of its
//! occurrences.
//!
//! A recurring timer is one record that goes round `SCHEDULED → FIRING →
//! SCHEDULED` once per occurrence. The apply rules call [`next_after`] when
//! an occurrence fires, in that same entry, and keep the answer in the
//! record ([`Series::next_at_ms`]); when the occurrence's delivery ends the
//! record is scheduled at it. A failover therefore neither skips nor
//! doubles an occurrence: the next one is replicated state from the moment
//! the current one fired.
//!
//! **Architecture Invariant:** this calculation is part of the apply rules:
//! every replica must get the same answer for the same inputs. It depends
//! on nothing but its arguments, the cron crate and the compiled-in time-zone
//! database, both pinned exactly in the workspace manifest.

use std::str::FromStr;

use chrono::TimeZone;
use croner::Cron;
use croner::parser::CronParser;
use croner::parser::Seconds;
use serde::Deserialize;
use serde::Serialize;

use crate::limits;

/// How a series repeats.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rule {
    /// A cron expression (5 fields, or 6 with seconds first) read in the IANA
    /// time zone `tz` (`UTC` when empty). Daylight-saving changes follow the
    /// usual cron rules: a wall time skipped by a spring-forward fires at the
    /// first instant after the gap; one repeated by a fall-back fires once.
    Cron { expr: String, tz: String },
    /// Every `interval_ms`, counted from the first occurrence.
    Every { interval_ms: u64 },
}

/// A recurring timer's rule and end, as the client asked for them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Recurrence {
    pub rule: Rule,
    /// No occurrence after this unix ms; 0 for no end.
    pub until_ms: u64,
    /// At most this many occurrences; 0 for no limit.
    pub count: u64,
    /// What a series late by several slots does (after an outage, a pause or
    /// a slow receiver): false (the default) fires once and goes on from the
    /// first slot after now; true fires once for every missed slot.
    pub catch_up_all: bool,
}

/// Where a series stands: kept in its record beside the rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    pub recurrence: Recurrence,
    /// The first occurrence: an interval series counts from it.
    pub anchor_ms: u64,
    /// Occurrences that came so far (fired or skipped), the current one
    /// included.
    pub occurrence: u64,
    /// The occurrence after the current one, computed in the entry that
    /// fired the current one; `None` before the first fire, or when the
    /// current one is the last.
    pub next_at_ms: Option<u64>,
    /// How the occurrences so far ended.
    pub delivered: u64,
    pub dead: u64,
    pub skipped: u64,
}

impl Series {
    pub fn new(recurrence: Recurrence, first_at_ms: u64) -> Series {
        Series {
            recurrence,
            anchor_ms: first_at_ms,
            occurrence: 0,
            next_at_ms: None,
            delivered: 0,
            dead: 0,
            skipped: 0,
        }
    }
}

/// Why a recurrence is refused: the field and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RecurrenceError {
    pub field: &'static str,
    pub message: String,
}

fn refuse(field: &'static str, message: impl Into<String>) -> RecurrenceError {
    RecurrenceError { field, message: message.into() }
}

fn parse_tz(tz: &str) -> Result<chrono_tz::Tz, RecurrenceError> {
    if tz.is_empty() {
        return Ok(chrono_tz::UTC);
    }
    if tz.len() > limits::MAX_TIME_ZONE_BYTES {
        return Err(refuse("recurrence.time_zone", format!("must be at most {} bytes", limits::MAX_TIME_ZONE_BYTES)));
    }
    chrono_tz::Tz::from_str(tz)
        .map_err(|_| refuse("recurrence.time_zone", format!("{tz:?} is not an IANA time zone (such as Europe/Berlin)")))
}

fn parse_cron(expr: &str) -> Result<Cron, RecurrenceError> {
    if expr.len() > limits::MAX_CRON_BYTES {
        return Err(refuse("recurrence.cron", format!("must be at most {} bytes", limits::MAX_CRON_BYTES)));
    }
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expr)
        .map_err(|e| refuse("recurrence.cron", format!("{expr:?} is not a cron expression: {e}")))
}

/// The rules a recurrence must pass, with no clock: a cron expression that
/// parses in a known time zone, or an interval within bounds.
pub fn check(recurrence: &Recurrence) -> Result<(), RecurrenceError> {
    match &recurrence.rule {
        Rule::Cron { expr, tz } => {
            parse_cron(expr)?;
            parse_tz(tz)?;
        }
        Rule::Every { interval_ms } => {
            if !(limits::MIN_INTERVAL_MS..=limits::MAX_INTERVAL_MS).contains(interval_ms) {
                return Err(refuse(
                    "recurrence.every_ms",
                    format!("must be {} to {} ms", limits::MIN_INTERVAL_MS, limits::MAX_INTERVAL_MS),
                ));
            }
        }
    }
    Ok(())
}

/// The first cron slot at or after `at_ms` (`inclusive`) or strictly after
/// it. Cron works in whole seconds.
fn cron_slot(expr: &str, tz: &str, at_ms: u64, inclusive: bool) -> Option<u64> {
    let cron = parse_cron(expr).ok()?;
    let tz = parse_tz(tz).ok()?;
    let from_ms = if inclusive { at_ms.div_ceil(1000) * 1000 } else { at_ms / 1000 * 1000 };
    let from = tz.timestamp_millis_opt(i64::try_from(from_ms).ok()?).single()?;
    let next = cron.find_next_occurrence(&from, inclusive).ok()?;
    u64::try_from(next.timestamp_millis()).ok()
}

/// The series' first occurrence at or after `start_ms`: the start itself
/// for an interval, the first matching slot for a cron rule. `None` when
/// there is none (a cron expression that never matches, or an `until`
/// before it).
pub fn first_at(recurrence: &Recurrence, start_ms: u64) -> Option<u64> {
    let first = match &recurrence.rule {
        Rule::Cron { expr, tz } => cron_slot(expr, tz, start_ms, true)?,
        Rule::Every { .. } => start_ms,
    };
    within_until(recurrence, first)
}

/// The series' first occurrence strictly after `after_ms`, or `None` when
/// the series has ended by then (`until`). `count` is the caller's.
pub fn next_after(series: &Series, after_ms: u64) -> Option<u64> {
    let next = match &series.recurrence.rule {
        Rule::Cron { expr, tz } => cron_slot(expr, tz, after_ms, false)?,
        Rule::Every { interval_ms } => {
            let interval = (*interval_ms).max(1);
            if after_ms < series.anchor_ms {
                series.anchor_ms
            } else {
                let steps = (after_ms - series.anchor_ms) / interval + 1;
                series.anchor_ms.checked_add(steps.checked_mul(interval)?)?
            }
        }
    };
    within_until(&series.recurrence, next)
}

fn within_until(recurrence: &Recurrence, at_ms: u64) -> Option<u64> {
    (recurrence.until_ms == 0 || at_ms <= recurrence.until_ms).then_some(at_ms)
}

/// Decided when an occurrence fires (or is skipped as too late) at `now_ms`:
/// counts it, and computes the occurrence after it, honouring the catch-up
/// policy and the series' end.
pub fn advance(series: &mut Series, fire_at_ms: u64, now_ms: u64) {
    series.occurrence += 1;
    let count_left = series.recurrence.count == 0 || series.occurrence < series.recurrence.count;
    // Late by several slots: by default fire once, then go on from now.
    let after = if series.recurrence.catch_up_all { fire_at_ms } else { fire_at_ms.max(now_ms) };
    series.next_at_ms = if count_left { next_after(series, after) } else { None };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-03-29 00:00:00 UTC: the night Europe/Berlin springs forward
    /// (02:00 CET → 03:00 CEST, at 01:00 UTC).
    const SPRING_2026_MS: u64 = 1_774_742_400_000;
    /// 2026-10-25 00:00:00 UTC: the night it falls back (03:00 CEST → 02:00
    /// CET, at 01:00 UTC).
    const FALL_2026_MS: u64 = 1_792_886_400_000;
    const HOUR: u64 = 3_600_000;
    const DAY: u64 = 24 * HOUR;

    fn cron(expr: &str, tz: &str) -> Recurrence {
        Recurrence { rule: Rule::Cron { expr: expr.into(), tz: tz.into() }, until_ms: 0, count: 0, catch_up_all: false }
    }

    fn occurrences(recurrence: Recurrence, start_ms: u64, n: usize) -> Vec<u64> {
        let first = first_at(&recurrence, start_ms).expect("a first occurrence");
        let mut series = Series::new(recurrence, first);
        let mut out = vec![first];
        while out.len() < n {
            let Some(next) = next_after(&series, *out.last().unwrap()) else { break };
            series.occurrence += 1;
            out.push(next);
        }
        out
    }

    #[test]
    fn monday_at_nine_in_berlin_is_eight_utc_in_winter_and_seven_in_summer() {
        // From Friday 2026-03-27: Monday 30 March is after the change (CEST).
        let summer = occurrences(cron("0 9 * * MON", "Europe/Berlin"), SPRING_2026_MS - 2 * DAY, 1);
        assert_eq!(summer, vec![SPRING_2026_MS + DAY + 7 * HOUR]);
        // Monday 23 March, before it (CET).
        let winter = occurrences(cron("0 9 * * MON", "Europe/Berlin"), SPRING_2026_MS - 7 * DAY, 1);
        assert_eq!(winter, vec![SPRING_2026_MS - 6 * DAY + 8 * HOUR]);
    }

    #[test]
    fn a_wall_time_skipped_by_spring_forward_fires_once_just_after_the_gap() {
        // 02:30 does not exist in Berlin on 29 March 2026: the daily job runs
        // at 03:00 CEST (01:00 UTC) that day, and at 02:30 on the days around.
        let got = occurrences(cron("30 2 * * *", "Europe/Berlin"), SPRING_2026_MS - DAY, 3);
        assert_eq!(
            got,
            vec![
                SPRING_2026_MS - DAY + HOUR + HOUR / 2, // 28 Mar 02:30 CET = 01:30 UTC
                SPRING_2026_MS + HOUR,                  // 29 Mar 03:00 CEST = 01:00 UTC
                SPRING_2026_MS + DAY + HOUR / 2,        // 30 Mar 02:30 CEST = 00:30 UTC
            ]
        );
    }

    #[test]
    fn a_wall_time_repeated_by_fall_back_fires_once() {
        // 02:30 happens twice in Berlin on 25 October 2026 (00:30 and 01:30
        // UTC): the daily job runs once that day.
        let got = occurrences(cron("30 2 * * *", "Europe/Berlin"), FALL_2026_MS - DAY, 3);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], FALL_2026_MS - DAY + HOUR / 2); // 24 Oct 02:30 CEST
        assert!(got[1] == FALL_2026_MS + HOUR / 2 || got[1] == FALL_2026_MS + HOUR + HOUR / 2, "{got:?}");
        assert_eq!(got[2], FALL_2026_MS + DAY + HOUR + HOUR / 2); // 26 Oct 02:30 CET
        // An hourly job keeps every real hour through the change: 25
        // occurrences in that 25-hour day.
        let hourly = occurrences(cron("0 * * * *", "Europe/Berlin"), FALL_2026_MS - 2 * HOUR, 26);
        let day = FALL_2026_MS - 2 * HOUR..FALL_2026_MS + 23 * HOUR;
        let in_day = hourly.iter().filter(|t| day.contains(t)).count();
        assert_eq!(in_day, 25);
        assert!(hourly.windows(2).all(|w| w[1] - w[0] == HOUR), "{hourly:?}");
    }

    #[test]
    fn seconds_and_utc_by_default() {
        let got = occurrences(cron("*/2 * * * * *", ""), 1_000_500, 3);
        assert_eq!(got, vec![1_002_000, 1_004_000, 1_006_000]);
        // A start on a slot is that slot; an occurrence is strictly after.
        assert_eq!(first_at(&cron("*/2 * * * * *", "UTC"), 1_002_000), Some(1_002_000));
    }

    #[test]
    fn an_interval_counts_from_its_first_occurrence_and_until_ends_it() {
        let every = Recurrence { rule: Rule::Every { interval_ms: 5_000 }, until_ms: 0, count: 0, catch_up_all: false };
        assert_eq!(occurrences(every.clone(), 1_000, 4), vec![1_000, 6_000, 11_000, 16_000]);
        let until = Recurrence { until_ms: 11_000, ..every };
        assert_eq!(occurrences(until.clone(), 1_000, 10), vec![1_000, 6_000, 11_000]);
        assert_eq!(first_at(&until, 12_000), None);
    }

    #[test]
    fn advance_fires_a_late_series_once_unless_asked_for_every_slot() {
        let every = Recurrence { rule: Rule::Every { interval_ms: 1_000 }, until_ms: 0, count: 0, catch_up_all: false };
        // Occurrence at 10 000 fires at 15 500 (5.5 s late): next is 16 000.
        let mut series = Series::new(every.clone(), 10_000);
        advance(&mut series, 10_000, 15_500);
        assert_eq!((series.occurrence, series.next_at_ms), (1, Some(16_000)));
        // catch_up_all: every missed slot, from 11 000 on.
        let mut all = Series::new(Recurrence { catch_up_all: true, ..every.clone() }, 10_000);
        advance(&mut all, 10_000, 15_500);
        assert_eq!(all.next_at_ms, Some(11_000));
        // count: the third occurrence is the last.
        let mut counted = Series::new(Recurrence { count: 3, ..every }, 10_000);
        for (i, at) in [10_000, 11_000].into_iter().enumerate() {
            advance(&mut counted, at, at);
            assert_eq!(counted.next_at_ms, Some(at + 1_000), "occurrence {}", i + 1);
        }
        advance(&mut counted, 12_000, 12_000);
        assert_eq!((counted.occurrence, counted.next_at_ms), (3, None));
    }

    #[test]
    fn bad_rules_name_their_field() {
        let bad_cron = check(&cron("61 * * * *", "UTC")).unwrap_err();
        assert_eq!(bad_cron.field, "recurrence.cron");
        let bad_tz = check(&cron("0 9 * * MON", "Mars/Olympus")).unwrap_err();
        assert_eq!(bad_tz.field, "recurrence.time_zone");
        let short = Recurrence { rule: Rule::Every { interval_ms: 10 }, until_ms: 0, count: 0, catch_up_all: false };
        assert_eq!(check(&short).unwrap_err().field, "recurrence.every_ms");
        // A pattern that never matches has no first occurrence.
        assert_eq!(first_at(&cron("0 0 30 2 *", "UTC"), 0), None);
    }
}
