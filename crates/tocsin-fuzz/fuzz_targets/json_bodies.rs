//! The HTTP API's JSON request bodies (create, batch create, reschedule),
//! from arbitrary bytes, through the same decoding and conversion to the
//! gRPC request the HTTP handlers use, then the domain's input rules on
//! the key, labels and retry policy, and a recurrence's rule (cron parsing
//! and time zones, its first occurrences). Nothing may panic; bad input is
//! an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tocsin_contract::json::CreateTimerJson;
use tocsin_contract::json::CreateTimersJson;
use tocsin_contract::json::RescheduleJson;
use tocsin_core::Limits;
use tocsin_core::TimerKey;
use tocsin_core::recurrence;
use tocsin_core::recurrence::Recurrence;
use tocsin_core::recurrence::Rule;
use tocsin_core::validate;

fn check(req: tocsin_proto::v1::CreateTimerRequest, limits: &Limits) {
    let _ = validate::check_key(&TimerKey::new(req.namespace, req.id));
    let _ = validate::check_payload(&req.payload, limits);
    let labels: std::collections::BTreeMap<String, String> = req.labels.into_iter().collect();
    let _ = validate::check_labels(&labels);
    if let Some(r) = req.recurrence {
        let rule = match r.rule {
            Some(tocsin_proto::v1::recurrence::Rule::Cron(expr)) => Some(Rule::Cron { expr, tz: r.time_zone }),
            Some(tocsin_proto::v1::recurrence::Rule::EveryMs(interval_ms)) => Some(Rule::Every { interval_ms }),
            None => None,
        };
        if let Some(rule) = rule {
            let recurrence = Recurrence { rule, until_ms: r.until_ms, count: r.count, catch_up_all: r.catch_up_all };
            if recurrence::check(&recurrence).is_ok() {
                let start_ms = 1_800_000_000_000;
                if let Some(first) = recurrence::first_at(&recurrence, start_ms) {
                    let mut series = recurrence::Series::new(recurrence, first);
                    let mut at = first;
                    for _ in 0..3 {
                        recurrence::advance(&mut series, at, at);
                        match series.next_at_ms {
                            Some(next) => {
                                assert!(next > at, "occurrences go forward: {at} then {next}");
                                at = next;
                            }
                            None => break,
                        }
                    }
                }
            }
        }
    }
    if let Some(retry) = req.retry {
        let policy = tocsin_core::RetryPolicy {
            max_attempts: retry.max_attempts,
            initial_backoff_ms: retry.initial_backoff_ms,
            max_backoff_ms: retry.max_backoff_ms,
            give_up_after_ms: retry.give_up_after_ms,
        };
        if validate::check_retry(&policy, limits).is_ok() {
            let effective = validate::effective_retry(&policy, limits);
            for attempt in [1, 2, 30, effective.max_attempts] {
                let _ = tocsin_core::backoff::backoff_ms(&effective, attempt, 0.5);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let Some((&which, data)) = data.split_first() else { return };
    match which % 3 {
        0 => {
            if let Ok(Ok(req)) = serde_json::from_slice::<CreateTimerJson>(data).map(CreateTimerJson::into_proto) {
                check(req, &limits);
            }
        }
        1 => {
            if let Ok(body) = serde_json::from_slice::<CreateTimersJson>(data) {
                for req in body.timers.into_iter().filter_map(|t| t.into_proto().ok()) {
                    check(req, &limits);
                }
            }
        }
        _ => {
            let _ = serde_json::from_slice::<RescheduleJson>(data);
        }
    }
});
