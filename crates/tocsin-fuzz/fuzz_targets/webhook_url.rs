//! Webhook URL validation and the SSRF guard, on arbitrary text: the
//! syntax check and the create-time egress check never panic, and whatever
//! the strict policy lets through never names a non-public address. An
//! arbitrary allowlist parses or is refused, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tocsin_core::egress::EgressPolicy;
use tocsin_core::egress::refused_class;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (allow, url) = text.split_once('\n').unwrap_or(("", text));
    let _ = tocsin_core::validate::check_webhook_url(url);
    let strict = EgressPolicy::default();
    if strict.check_url(url).is_ok() {
        if let Ok(parsed) = url::Url::parse(url) {
            let ip = match parsed.host() {
                Some(url::Host::Ipv4(v4)) => Some(std::net::IpAddr::V4(v4)),
                Some(url::Host::Ipv6(v6)) => Some(std::net::IpAddr::V6(v6)),
                _ => None,
            };
            if let Some(ip) = ip {
                assert_eq!(refused_class(ip), None, "{url} passed the strict guard as {ip}");
            }
        }
    }
    let entries: Vec<String> = allow.split(',').map(str::to_string).collect();
    if let Ok(policy) = EgressPolicy::parse(&entries) {
        let _ = policy.check_url(url);
    }
});
