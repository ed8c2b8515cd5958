//! The HTTP API's query strings, parsed into the gRPC request they stand
//! for. Pure, so the HTTP mirror and the fuzz targets share it; their
//! description in the OpenAPI document is [`ListTimersParams`].

use std::collections::HashMap;

use tocsin_proto::v1 as pb;
use utoipa::IntoParams;

use crate::json::TimerStateName;

/// A query parameter the API refuses: its name and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryError {
    pub field: String,
    pub message: String,
}

impl QueryError {
    fn new(field: &str, message: impl Into<String>) -> QueryError {
        QueryError { field: field.into(), message: message.into() }
    }
}

/// What `GET /v1/timers/{namespace}` accepts.
pub const LIST_PARAMS: [&str; 6] =
    ["state", "fire_after_ms", "fire_before_ms", "page_size", "page_token", "dead_reason"];

/// `GET /v1/timers/{namespace}`'s query parameters as the OpenAPI document
/// describes them. [`list_timers`] reads them from the query's pairs, so
/// that a refusal names the parameter at fault (serde's would not); the
/// test below keeps the two lists one.
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Its fields are read by the schema only.
pub struct ListTimersParams {
    /// Only timers in this state.
    #[param(value_type = Option<TimerStateName>)]
    state: Option<String>,
    /// Only DEAD timers that died for this reason (`MAX_ATTEMPTS`,
    /// `GIVE_UP_AFTER`, …); with `state=DEAD`.
    dead_reason: Option<String>,
    /// Only timers firing at or after this Unix millisecond.
    fire_after_ms: Option<u64>,
    /// Only timers firing before this Unix millisecond.
    fire_before_ms: Option<u64>,
    /// At most this many (default 100, at most 1,000).
    page_size: Option<u32>,
    /// The `next_page_token` of the page before.
    page_token: Option<String>,
}

/// `GET /v1/timers/{namespace}?state=…&fire_after_ms=…&fire_before_ms=…&page_size=…&page_token=…&dead_reason=…`.
/// A parameter the API does not know is refused rather than ignored: a
/// misspelt filter would otherwise list everything.
pub fn list_timers(namespace: &str, query: &HashMap<String, String>) -> Result<pb::ListTimersRequest, QueryError> {
    if let Some(unknown) = query.keys().filter(|k| !LIST_PARAMS.contains(&k.as_str())).min() {
        return Err(QueryError::new(
            unknown,
            format!("unknown query parameter {unknown:?}; use {}", LIST_PARAMS.join(", ")),
        ));
    }
    let num = |name: &str| -> Result<u64, QueryError> {
        match query.get(name) {
            None => Ok(0),
            Some(v) => v.parse().map_err(|_| QueryError::new(name, format!("{name} must be an unsigned integer"))),
        }
    };
    let state = match query.get("state").map(String::as_str) {
        None | Some("") => 0,
        Some(name) => match pb::timer::State::from_str_name(name) {
            Some(s) => s as i32,
            None => {
                return Err(QueryError::new(
                    "state",
                    format!("unknown state {name:?}: use SCHEDULED, FIRING, DELIVERED, DEAD or CANCELLED"),
                ));
            }
        },
    };
    Ok(pb::ListTimersRequest {
        namespace: namespace.to_string(),
        state,
        fire_after_ms: num("fire_after_ms")?,
        fire_before_ms: num("fire_before_ms")?,
        page_size: u32::try_from(num("page_size")?).unwrap_or(u32::MAX),
        page_token: query.get("page_token").cloned().unwrap_or_default(),
        dead_reason: query.get("dead_reason").cloned().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_described_parameters_are_the_accepted_ones() {
        let described: Vec<String> = ListTimersParams::into_params(|| None).into_iter().map(|p| p.name).collect();
        let mut accepted: Vec<String> = LIST_PARAMS.iter().map(|p| p.to_string()).collect();
        let mut sorted = described.clone();
        sorted.sort();
        accepted.sort();
        assert_eq!(sorted, accepted, "{described:?}");
    }

    #[test]
    fn list_queries() {
        let r = list_timers("orders", &q(&[("state", "SCHEDULED"), ("page_size", "10")])).unwrap();
        assert_eq!((r.state, r.page_size), (pb::timer::State::Scheduled as i32, 10));
        assert_eq!(list_timers("o", &q(&[("page_size", "99999999999")])).unwrap().page_size, u32::MAX);
        assert_eq!(list_timers("o", &q(&[("state", "SLEEPING")])).unwrap_err().field, "state");
        assert_eq!(list_timers("o", &q(&[("fire_before_ms", "-1")])).unwrap_err().field, "fire_before_ms");
        let err = list_timers("o", &q(&[("sate", "DEAD")])).unwrap_err();
        assert_eq!(err.field, "sate");
        assert!(err.message.contains("unknown query parameter"), "{err:?}");
    }
}
