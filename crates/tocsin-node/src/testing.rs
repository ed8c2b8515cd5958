//! Helpers the workspace's tests share (the node's in-process cluster
//! tests and the CLI's process tests). Nothing in the node uses them.

use std::net::TcpListener;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering;

/// Where [`free_ports`] looks next, shared by every test thread of a
/// process so no two threads are handed the same port.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The kernel's ephemeral range (outgoing connections take their local
/// port from it), or Linux's default when it cannot be read.
fn ephemeral_range() -> (u32, u32) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u32>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// `n` distinct loopback ports nothing listens on right now, for a node
/// that binds them a moment later.
///
/// Ports the kernel hands out (`bind(":0")`) come from the ephemeral range,
/// which is also where every outgoing connection of every other test takes
/// its local port: between our check and the node's bind, a client
/// connection elsewhere can take the port ("Address already in use", seen
/// in CI). So these come from below that range, where nothing is handed
/// out implicitly, starting at a point that depends on the process id (two
/// test processes at once rarely overlap) and moving on for every port.
pub fn free_ports(n: usize) -> Vec<u16> {
    let (low, high) = ephemeral_range();
    // [10000, low) unless the ephemeral range starts too low; then above it.
    let (start, end) = if low > 12_000 { (10_000, low) } else { (high + 1, 65_536) };
    let span = end - start;
    let seed = std::process::id().wrapping_mul(7919) % span;
    let mut ports = Vec::with_capacity(n);
    let mut held = Vec::with_capacity(n);
    for _ in 0..span {
        if ports.len() == n {
            break;
        }
        let offset = (seed + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = (start + offset) as u16;
        // Held until all are picked, so a port is not handed out twice.
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), n, "no {n} free loopback ports below the ephemeral range");
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let (low, high) = ephemeral_range();
        let a = free_ports(20);
        let b = free_ports(20);
        let mut all: Vec<u16> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 40, "a port was handed out twice");
        for p in all {
            assert!(!(low..=high).contains(&u32::from(p)), "{p} is in the ephemeral range");
            TcpListener::bind(("127.0.0.1", p)).expect("a handed-out port binds");
        }
    }
}
