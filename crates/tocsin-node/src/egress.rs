//! The SSRF guard at connect time: the webhook client's resolver, and the
//! node's remembered verdicts on webhook URLs ([`CheckedUrls`]).
//!
//! The rules (what is refused, the allowlist) are `tocsin_core::egress`'s;
//! `api::parse` applies them to a URL at create. Here a name is resolved
//! and only the addresses the policy permits are handed to the connector,
//! on every new connection (reqwest keeps no DNS cache), so DNS rebinding
//! reaches nothing. Address literals skip resolvers; the webhook sender
//! checks them before each request.

use std::collections::HashMap;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;

pub use tocsin_core::egress::EgressPolicy;
pub use tocsin_core::egress::Refused;

/// Most URLs [`CheckedUrls`] remembers. A node's timers name a handful of
/// callback URLs, usually; a client that names a new one per timer fills
/// the map, which is then emptied and filled again, so it holds at most
/// this many URLs of at most `limits::MAX_URL_BYTES` each.
pub const MAX_REMEMBERED_URLS: usize = 4_096;

/// [`EgressPolicy::check_url`], remembered per URL.
///
/// Why: the check parses the URL the way the HTTP client does (WHATWG,
/// with IDNA processing of the host), a few microseconds each time, and it
/// ran on every create and again before every attempt, mostly for the same
/// few URLs: 5% of a node's CPU at 10,000 timers a second, more while it
/// sheds creates that clients send again. A sender's policy never changes
/// (a new allowlist is a new node process), so the verdict is a function
/// of the URL alone and remembering it changes no answer.
#[derive(Debug)]
pub struct CheckedUrls {
    policy: Arc<EgressPolicy>,
    verdicts: Mutex<HashMap<Box<str>, Result<(), Refused>>>,
}

impl CheckedUrls {
    pub fn new(policy: Arc<EgressPolicy>) -> CheckedUrls {
        CheckedUrls { policy, verdicts: Mutex::new(HashMap::new()) }
    }

    /// The policy the verdicts are the policy's on.
    pub fn policy(&self) -> &Arc<EgressPolicy> {
        &self.policy
    }

    /// The policy's verdict on `url`: remembered, or worked out (outside
    /// the lock) and remembered.
    pub fn check_url(&self, url: &str) -> Result<(), Refused> {
        if let Some(verdict) = self.verdicts.lock().expect("verdicts lock").get(url) {
            return verdict.clone();
        }
        let verdict = self.policy.check_url(url);
        let mut verdicts = self.verdicts.lock().expect("verdicts lock");
        if verdicts.len() >= MAX_REMEMBERED_URLS {
            verdicts.clear();
        }
        verdicts.insert(url.into(), verdict.clone());
        verdict
    }

    /// How many verdicts are remembered (for tests).
    pub fn remembered(&self) -> usize {
        self.verdicts.lock().expect("verdicts lock").len()
    }
}

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

    #[test]
    fn remembered_verdicts_are_the_policys_and_stay_bounded() {
        let urls = [
            "http://127.0.0.1:9000/hook",
            "http://0x7f.1/hook",
            "http://2130706433/",
            "http://localhost:8080/",
            "http://10.77.0.5/",
            "http://10.77.0.6/",
            "http://[::ffff:127.0.0.1]/",
            "http://169.254.169.254/latest/meta-data",
            "https://example.com/hook",
            "http://[::1]/",
            "not a url",
        ];
        for allow in [vec![], vec!["127.0.0.0/8".to_string(), "10.77.0.5".to_string()]] {
            let policy = Arc::new(EgressPolicy::parse(&allow).unwrap());
            let checked = CheckedUrls::new(policy.clone());
            // Twice: the first answer is worked out, the second remembered.
            for round in 0..2 {
                for url in urls {
                    assert_eq!(checked.check_url(url), policy.check_url(url), "{url}, round {round}, allow {allow:?}");
                }
            }
            assert_eq!(checked.remembered(), urls.len());
        }
        // A different URL per timer never grows the map past its bound, and
        // a verdict worked out after the map was emptied is still the policy's.
        let checked = CheckedUrls::new(Arc::new(EgressPolicy::default()));
        for i in 0..MAX_REMEMBERED_URLS + 10 {
            assert_eq!(checked.check_url(&format!("https://example.com/hook/{i}")), Ok(()));
            assert!(checked.remembered() <= MAX_REMEMBERED_URLS);
        }
        assert!(checked.check_url("http://127.0.0.1/").is_err());
        assert!(checked.check_url("http://127.0.0.1/").is_err());
    }

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
