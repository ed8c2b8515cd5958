//! The SSRF guard's rules: which webhook targets a node may connect to.
//!
//! A webhook URL is client input, and the node POSTs to it from inside the
//! operator's network. Without a guard, any client could make the node
//! probe or call loopback services, the cloud metadata endpoint
//! (`169.254.169.254`) or anything on a private network. So every target
//! is refused unless it is a public address or the operator allowed it
//! (`delivery.webhook_allow`: CIDRs, addresses, host names, `*.suffix`).
//!
//! The check runs twice:
//! - **at create** ([`EgressPolicy::check_url`], from the node's
//!   `api::parse`), from the URL alone: an address literal is checked,
//!   `localhost` counts as loopback, other names pass (they are resolved
//!   only when used);
//! - **at connect**, on every new connection: the node's webhook client
//!   resolves names through its guarded resolver (`tocsin-node`'s
//!   `egress.rs`), which keeps only what [`EgressPolicy::filter_resolved`]
//!   permits, so a name that pointed somewhere public at create and at
//!   `127.0.0.1` at delivery (DNS rebinding) reaches nothing. Address
//!   literals never go through a resolver; the sender checks the URL again
//!   before each request instead.
//!
//! Pure: the resolver does the I/O; these are the rules.
//!
//! The URL is parsed the way the HTTP client parses it (WHATWG, the `url`
//! crate), so numeric host tricks (`2130706433`, `0x7f.1`, `127.1`,
//! `0177.0.0.1`) are checked as the address they become: what is checked is
//! what would be connected to.
//!
//! Refused classes: unspecified, loopback, private (RFC 1918), shared
//! (100.64/10), link-local, the IETF, documentation and benchmark ranges,
//! multicast, reserved and broadcast for IPv4; unspecified, loopback,
//! unique-local, link-local, site-local, multicast, documentation and
//! discard for IPv6, and every IPv6 form that embeds an IPv4 address
//! (mapped, compatible, NAT64 `64:ff9b::/96`, 6to4) is judged by that
//! address; local-use NAT64 (`64:ff9b:1::/48`) and Teredo are refused.

use std::net::IpAddr;
use std::net::Ipv4Addr;
use std::net::Ipv6Addr;
use std::net::SocketAddr;

/// A target the policy refuses, and why (a class, never the target's
/// answer: this text reaches the timer's `last_error`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("refused by the webhook egress policy: {class} address (allow it with delivery.webhook_allow)")]
pub struct Refused {
    pub class: &'static str,
}

/// One allowlist entry.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    Net {
        addr: Ipv6Addr,
        prefix: u8,
    },
    Host(String),
    /// `*.example.com`: any name ending in `.example.com`.
    Suffix(String),
}

/// The operator's allowlist, parsed once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    rules: Vec<Rule>,
}

impl EgressPolicy {
    /// Parses `delivery.webhook_allow` entries: `10.0.0.0/8`, `::1/128`,
    /// `192.168.1.20`, `receiver.internal`, `*.svc.cluster.local`.
    pub fn parse(entries: &[String]) -> Result<EgressPolicy, String> {
        let mut rules = Vec::with_capacity(entries.len());
        for entry in entries {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            rules.push(parse_rule(entry).map_err(|e| format!("{entry:?}: {e}"))?);
        }
        Ok(EgressPolicy { rules })
    }

    /// Whether the operator allowed this host name (or address literal) as such.
    fn host_allowed(&self, host: &str) -> bool {
        let host = normalize_host(host);
        self.rules.iter().any(|rule| match rule {
            Rule::Host(h) => *h == host,
            Rule::Suffix(s) => host.ends_with(s.as_str()),
            Rule::Net { .. } => false,
        })
    }

    fn net_allowed(&self, ip: Ipv6Addr) -> bool {
        self.rules.iter().any(|rule| match rule {
            Rule::Net { addr, prefix } => in_prefix(ip, *addr, *prefix),
            _ => false,
        })
    }

    /// Whether the node may connect to `ip`.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refused> {
        match refused_class(ip) {
            Some(class) if !self.net_allowed(as_v6(ip)) => Err(Refused { class }),
            _ => Ok(()),
        }
    }

    /// The create-time check of a webhook URL (already syntactically
    /// valid): its host as the HTTP client would parse it.
    pub fn check_url(&self, url: &str) -> Result<(), Refused> {
        let Ok(parsed) = url::Url::parse(url) else {
            // The syntax check upstream decides what is malformed; a URL the
            // client cannot parse is never sent.
            return Err(Refused { class: "unparsable" });
        };
        match parsed.host() {
            Some(url::Host::Ipv4(v4)) => self.check_ip(IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => self.check_ip(IpAddr::V6(v6)),
            Some(url::Host::Domain(name)) => {
                if self.host_allowed(name) {
                    return Ok(());
                }
                let name = normalize_host(name);
                if name == "localhost" || name.ends_with(".localhost") {
                    return self.check_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
                }
                Ok(())
            }
            None => Err(Refused { class: "hostless" }),
        }
    }

    /// What the resolver keeps of `host`'s addresses: all of them for an
    /// allowed host, else those the policy permits; none is a refusal.
    pub fn filter_resolved(&self, host: &str, addrs: Vec<SocketAddr>) -> Result<Vec<SocketAddr>, Refused> {
        if self.host_allowed(host) {
            return Ok(addrs);
        }
        let mut refused = None;
        let kept: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| match self.check_ip(a.ip()) {
                Ok(()) => true,
                Err(e) => {
                    refused.get_or_insert(e);
                    false
                }
            })
            .collect();
        match (kept.is_empty(), refused) {
            (true, Some(e)) => Err(e),
            _ => Ok(kept),
        }
    }
}

fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn parse_rule(entry: &str) -> Result<Rule, String> {
    if let Some((addr, prefix)) = entry.split_once('/') {
        let ip: IpAddr = addr.parse().map_err(|_| "not an address before the '/'".to_string())?;
        let prefix: u8 = prefix.parse().map_err(|_| "the prefix length is not a number".to_string())?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(format!("prefix length over {max}"));
        }
        // IPv4 nets are kept as their IPv4-mapped IPv6 form.
        let prefix = if ip.is_ipv4() { prefix + 96 } else { prefix };
        return Ok(Rule::Net { addr: as_v6(ip), prefix });
    }
    if let Ok(ip) = entry.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        return Ok(Rule::Net { addr: as_v6(ip), prefix: 128 });
    }
    let valid_name = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|l| {
                !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            })
    };
    if let Some(suffix) = entry.strip_prefix("*.") {
        if !valid_name(suffix) {
            return Err("not a host name after '*.'".into());
        }
        return Ok(Rule::Suffix(format!(".{}", normalize_host(suffix))));
    }
    if !valid_name(entry.trim_end_matches('.')) {
        return Err("neither a CIDR, an address nor a host name".into());
    }
    Ok(Rule::Host(normalize_host(entry)))
}

/// IPv4 as its mapped IPv6 form, so one comparison serves both.
fn as_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn in_prefix(ip: Ipv6Addr, net: Ipv6Addr, prefix: u8) -> bool {
    let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(prefix)) };
    (u128::from(ip) & mask) == (u128::from(net) & mask)
}

/// The class of a non-public address, `None` for a public one.
pub fn refused_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) | (172, 16..=31, _) | (192, 168, _) => "private",
        (100, 64..=127, _) => "shared",
        (169, 254, _) => "link-local",
        (192, 0, 0) => "IETF-reserved",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    let seg = ip.segments();
    let embedded = |shift: u32| Ipv4Addr::from((bits >> shift) as u32);
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible, deprecated).
    if bits >> 32 == 0xffff {
        return v4_class(embedded(0));
    }
    if bits >> 32 == 0 {
        return v4_class(embedded(0)).or(Some("IPv4-compatible"));
    }
    if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        // NAT64 well-known prefix: judged by the IPv4 address inside.
        return v4_class(embedded(0));
    }
    if seg[0] == 0x0064 && seg[1] == 0xff9b && seg[2] == 0x0001 {
        return Some("local NAT64");
    }
    if seg[0] == 0x2002 {
        // 6to4: 2002:AABB:CCDD::/48 carries a.b.c.d.
        return v4_class(embedded(80));
    }
    if seg[0] == 0x2001 && seg[1] == 0 {
        return Some("Teredo");
    }
    if seg[0] == 0x2001 && seg[1] == 0x0db8 {
        return Some("documentation");
    }
    if seg[0] == 0x0100 && seg[1] == 0 && seg[2] == 0 && seg[3] == 0 {
        return Some("discard");
    }
    Some(match seg[0] {
        0xfc00..=0xfdff => "unique-local",
        0xfe80..=0xfebf => "link-local",
        0xfec0..=0xfeff => "site-local",
        0xff00..=0xffff => "multicast",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(entries: &[&str]) -> EgressPolicy {
        EgressPolicy::parse(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn non_public_addresses_have_a_class() {
        for (ip, class) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("10.1.2.3", "private"),
            ("172.31.0.1", "private"),
            ("192.168.0.1", "private"),
            ("100.100.0.1", "shared"),
            ("169.254.169.254", "link-local"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::127.0.0.1", "loopback"),
            ("64:ff9b::7f00:1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("64:ff9b:1::1", "local NAT64"),
            ("2002:7f00:1::1", "loopback"),
            ("2002:c0a8:1::", "private"),
            ("2001::1", "Teredo"),
            ("2001:db8::1", "documentation"),
            ("fc00::1", "unique-local"),
            ("fd12:3456::1", "unique-local"),
            ("fe80::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
        ] {
            assert_eq!(refused_class(ip.parse().unwrap()), Some(class), "{ip}");
        }
        for ip in ["93.184.216.34", "8.8.8.8", "172.32.0.1", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"] {
            assert_eq!(refused_class(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn numeric_host_tricks_are_checked_as_the_address_they_become() {
        let strict = EgressPolicy::default();
        for url in [
            "http://127.0.0.1:9000/x",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://[::1]:80/",
            "http://[::ffff:7f00:1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[64:ff9b::127.0.0.1]/",
            "http://localhost:9000/",
            "http://LOCALHOST./",
            "http://api.localhost/",
            "http://0.0.0.0:9000/",
            "http://169.254.169.254/latest/meta-data/",
            "http://user:pw@10.0.0.1/",
            "http://example.com@192.168.1.1/",
            "https://[fe80::1]/",
        ] {
            assert!(strict.check_url(url).is_err(), "{url} passed");
        }
        for url in ["https://example.com/hook", "http://93.184.216.34/", "http://receiver.internal:8080/"] {
            assert_eq!(strict.check_url(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn the_allowlist_lets_nets_and_hosts_through() {
        let p = policy(&["127.0.0.0/8", "fd00::/8", "10.77.0.5", "receiver.internal", "*.svc.cluster.local"]);
        assert_eq!(p.check_url("http://127.0.0.1:9000/"), Ok(()));
        assert_eq!(p.check_url("http://localhost:9000/"), Ok(()));
        assert_eq!(p.check_url("http://[::ffff:127.0.0.1]/"), Ok(()));
        assert_eq!(p.check_url("http://[fd00::1]/"), Ok(()));
        assert_eq!(p.check_url("http://10.77.0.5/"), Ok(()));
        assert!(p.check_url("http://10.77.0.6/").is_err());
        assert!(p.check_url("http://[::1]/").is_err(), "::1 is not in 127.0.0.0/8");
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let private: SocketAddr = "10.1.1.1:0".parse().unwrap();
        let public: SocketAddr = "93.184.216.34:0".parse().unwrap();
        assert_eq!(p.filter_resolved("RECEIVER.internal.", vec![private]), Ok(vec![private]));
        assert_eq!(p.filter_resolved("a.svc.cluster.local", vec![private]), Ok(vec![private]));
        assert!(p.filter_resolved("svc.cluster.local.evil.com", vec![private]).is_err());
        // A rebinding name: only what the policy permits is kept.
        assert_eq!(p.filter_resolved("rebind.example", vec![private, public, lo]), Ok(vec![public, lo]));
        assert_eq!(
            EgressPolicy::default().filter_resolved("rebind.example", vec![lo]),
            Err(Refused { class: "loopback" })
        );
    }

    #[test]
    fn bad_allowlist_entries_are_errors() {
        for bad in ["10.0.0.0/33", "::/129", "10.0.0/8", "not a host", "*.", "http://x", "1.2.3.4/x"] {
            assert!(EgressPolicy::parse(&[bad.to_string()]).is_err(), "{bad} accepted");
        }
    }
}
