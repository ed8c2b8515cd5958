//! The HTTP API's query strings (`GET /v1/timers/{namespace}?…`), from
//! arbitrary bytes decoded as the server decodes them (form-urlencoded
//! pairs, the last of a repeated name winning), into the gRPC request they
//! stand for. Nothing may panic; an accepted query names only known
//! parameters, and its numbers are the ones given.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let query: HashMap<String, String> = url::form_urlencoded::parse(data).into_owned().collect();
    if let Ok(request) = tocsin_contract::query::list_timers("orders", &query) {
        for (name, value) in [("fire_after_ms", request.fire_after_ms), ("fire_before_ms", request.fire_before_ms)] {
            if let Some(given) = query.get(name) {
                assert_eq!(given.parse::<u64>().ok(), Some(value), "{name}={given:?}");
            }
        }
        assert_eq!(request.page_token, query.get("page_token").cloned().unwrap_or_default());
    }
});
