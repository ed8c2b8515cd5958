//! The SSRF guard at connect time: the webhook client's resolver.
//!
//! The rules (what is refused, the allowlist) are `tocsin_core::egress`'s;
//! `api::parse` applies them to a URL at create. Here a name is resolved
//! and only the addresses the policy permits are handed to the connector,
//! on every new connection (reqwest keeps no DNS cache), so DNS rebinding
//! reaches nothing. Address literals skip resolvers; the webhook sender
//! checks them before each request.

use std::net::IpAddr;
use std::net::SocketAddr;
use std::sync::Arc;

pub use tocsin_core::egress::EgressPolicy;
pub use tocsin_core::egress::Refused;

/// Test builds only: `TOCSIN_TEST_HOSTS_FILE` names a file of `name address`
/// lines the resolver answers from before asking the system, so an
/// end-to-end test can make a name point at loopback (DNS rebinding)
/// without touching `/etc/hosts`. Re-read on every lookup.
fn test_hosts(name: &str) -> Option<Vec<SocketAddr>> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let path = std::env::var_os("TOCSIN_TEST_HOSTS_FILE")?;
    let text = std::fs::read_to_string(path).ok()?;
    let addrs: Vec<SocketAddr> = text
        .lines()
        .filter_map(|line| line.split_once(char::is_whitespace))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .filter_map(|(_, ip)| ip.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 0))
        .collect();
    (!addrs.is_empty()).then_some(addrs)
}

/// A name could not be resolved (the class `last_error` shows).
#[derive(Debug, thiserror::Error)]
#[error("dns resolution failed")]
pub struct DnsFailed;

/// reqwest's resolver for webhook requests: the system resolver, then the
/// policy's filter. Called for every new connection.
pub struct GuardedResolver {
    pub policy: Arc<EgressPolicy>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = match test_hosts(&host) {
                Some(addrs) => addrs,
                None => tokio::net::lookup_host((host.as_str(), 0))
                    .await
                    .map_err(|_| Box::new(DnsFailed) as Box<dyn std::error::Error + Send + Sync>)?
                    .collect(),
            };
            // Boxed as the error itself (not a `Box<Refused>`), so the webhook
            // sender finds it by downcasting.
            let kept = policy
                .filter_resolved(&host, addrs)
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::dns::Resolve as _;

    #[tokio::test]
    async fn the_resolver_hands_over_only_permitted_addresses() {
        let strict = GuardedResolver { policy: Arc::new(EgressPolicy::default()) };
        let err = match strict.resolve("localhost".parse().unwrap()).await {
            Ok(addrs) => panic!("localhost resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(e) => e,
        };
        assert!(err.downcast_ref::<Refused>().is_some(), "{err}");
        let loopback = GuardedResolver { policy: Arc::new(EgressPolicy::parse(&["127.0.0.0/8".into()]).unwrap()) };
        let addrs: Vec<SocketAddr> = loopback.resolve("localhost".parse().unwrap()).await.unwrap().collect();
        assert!(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback() && a.is_ipv4()), "{addrs:?}");
    }
}
