//! The test network: one Linux bridge and one network namespace per host
//! (each node, the receiver), joined by veth pairs on a private subnet. The
//! driver runs in the root namespace and reaches everyone through the
//! bridge's own address.
//!
//! Faults are iptables rules inside a host's namespace, so a partition can
//! cut a node off from its peers while it still reaches clients and the
//! receiver (which is what makes a deposed leader's stray deliveries
//! visible). Everything is created and removed by name; nothing outside the
//! subnet is touched.

use std::process::Command;

use anyhow::Context;
use anyhow::bail;

/// Bridge name, namespace prefix and subnet of the test network.
pub const BRIDGE: &str = "tcbr0";
pub const NS_PREFIX: &str = "tc-";
pub const SUBNET: &str = "10.77.0";
pub const HOST_IP: &str = "10.77.0.254";

/// Runs a command, failing with its stderr.
pub fn sh(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("running {args:?}"))?;
    if !out.status.success() {
        bail!("{:?} failed: {}", args, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like [`sh`], ignoring failure (for cleanup).
fn sh_quiet(args: &[&str]) {
    let _ = Command::new(args[0]).args(&args[1..]).output();
}

/// A network host: a namespace with one address.
#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    pub ip: String,
}

impl Host {
    pub fn ns(&self) -> String {
        format!("{NS_PREFIX}{}", self.name)
    }
}

/// The bridge and its namespaces; removed on drop.
pub struct Net {
    pub hosts: Vec<Host>,
}

/// Removes anything a previous run left behind.
pub fn cleanup() {
    if let Ok(list) = sh(&["ip", "netns", "list"]) {
        for line in list.lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with(NS_PREFIX) {
                sh_quiet(&["ip", "netns", "del", name]);
            }
        }
    }
    // Deleting a namespace frees its veth ends asynchronously; delete our
    // root-side ends by name so the next run can reuse the names at once.
    for _ in 0..50 {
        let links = sh(&["ip", "-o", "link", "show"]).unwrap_or_default();
        let ours: Vec<String> = links
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|name| name.trim().split('@').next().unwrap_or("").to_string())
            .filter(|name| name.starts_with("tcv-"))
            .collect();
        if ours.is_empty() {
            break;
        }
        for name in ours {
            sh_quiet(&["ip", "link", "del", &name]);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    sh_quiet(&["ip", "link", "del", BRIDGE]);
    // The bridge needs its traffic let through Docker's FORWARD policy; remove
    // every copy of our rule.
    for _ in 0..8 {
        if Command::new("iptables")
            .args(["-D", "FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            break;
        }
    }
}

impl Net {
    /// Creates the bridge and a namespace for each `(name, last octet)`.
    pub fn create(hosts: &[(&str, u8)]) -> anyhow::Result<Net> {
        cleanup();
        sh(&["ip", "link", "add", BRIDGE, "type", "bridge"])?;
        sh(&["ip", "addr", "add", &format!("{HOST_IP}/24"), "dev", BRIDGE])?;
        sh(&["ip", "link", "set", BRIDGE, "up"])?;
        // With bridge netfilter on (Docker enables it), bridged frames go through
        // the FORWARD chain, whose policy Docker sets to DROP.
        sh_quiet(&["iptables", "-I", "FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"]);
        let mut out = Vec::new();
        for (name, octet) in hosts {
            let host = Host { name: name.to_string(), ip: format!("{SUBNET}.{octet}") };
            let ns = host.ns();
            let veth = format!("tcv-{name}");
            sh(&["ip", "netns", "add", &ns])?;
            sh(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            sh(&["ip", "link", "set", &veth, "master", BRIDGE])?;
            sh(&["ip", "link", "set", &veth, "up"])?;
            sh(&["ip", "-n", &ns, "addr", "add", &format!("{}/24", host.ip), "dev", "eth0"])?;
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            out.push(host);
        }
        Ok(Net { hosts: out })
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts.iter().find(|h| h.name == name).unwrap_or_else(|| panic!("no host {name}"))
    }

    /// Silently drops all traffic between `host` and each of `peers` (both
    /// directions, inside `host`'s namespace); other traffic flows.
    pub fn partition(&self, host: &Host, peers: &[&Host]) -> anyhow::Result<()> {
        let ns = host.ns();
        for peer in peers {
            sh(&["ip", "netns", "exec", &ns, "iptables", "-A", "INPUT", "-s", &peer.ip, "-j", "DROP"])?;
            sh(&["ip", "netns", "exec", &ns, "iptables", "-A", "OUTPUT", "-d", &peer.ip, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Removes every rule a partition added to `host`.
    pub fn heal(&self, host: &Host) -> anyhow::Result<()> {
        sh(&["ip", "netns", "exec", &host.ns(), "iptables", "-F"])?;
        Ok(())
    }

    /// Drops everything `host` sends to each of `peers` (inside `host`'s
    /// namespace, OUTPUT only): a one-way cut. [`Net::heal`] removes it.
    pub fn drop_outgoing(&self, host: &Host, peers: &[&Host]) -> anyhow::Result<()> {
        let ns = host.ns();
        for peer in peers {
            sh(&["ip", "netns", "exec", &ns, "iptables", "-A", "OUTPUT", "-d", &peer.ip, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Cuts the link between `a` and `b` both ways (rules in both
    /// namespaces), leaving their other traffic alone.
    pub fn cut(&self, a: &Host, b: &Host) -> anyhow::Result<()> {
        for (from, to) in [(a, b), (b, a)] {
            let ns = from.ns();
            sh(&["ip", "netns", "exec", &ns, "iptables", "-A", "INPUT", "-s", &to.ip, "-j", "DROP"])?;
            sh(&["ip", "netns", "exec", &ns, "iptables", "-A", "OUTPUT", "-d", &to.ip, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Undoes one [`Net::cut`] between `a` and `b`.
    pub fn uncut(&self, a: &Host, b: &Host) -> anyhow::Result<()> {
        for (from, to) in [(a, b), (b, a)] {
            let ns = from.ns();
            sh(&["ip", "netns", "exec", &ns, "iptables", "-D", "INPUT", "-s", &to.ip, "-j", "DROP"])?;
            sh(&["ip", "netns", "exec", &ns, "iptables", "-D", "OUTPUT", "-d", &to.ip, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Takes `host`'s bridge port down (it reaches nobody, silently) or back up.
    pub fn set_link(&self, host: &Host, up: bool) -> anyhow::Result<()> {
        sh(&["ip", "link", "set", &format!("tcv-{}", host.name), if up { "up" } else { "down" }])?;
        Ok(())
    }

    /// Limits what the bridge sends to `host` (everything it receives) to
    /// `rate` (tc syntax, `20mbit`) with a token bucket; `None` removes it.
    pub fn shape_incoming(&self, host: &Host, rate: Option<&str>) -> anyhow::Result<()> {
        let dev = format!("tcv-{}", host.name);
        match rate {
            Some(rate) => {
                sh(&[
                    "tc", "qdisc", "replace", "dev", &dev, "root", "tbf", "rate", rate, "burst", "64kb", "latency",
                    "1s",
                ])?;
            }
            None => sh_quiet(&["tc", "qdisc", "del", "dev", &dev, "root"]),
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        cleanup();
    }
}
