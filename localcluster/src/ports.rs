//! Free loopback ports for the servers a cluster (or a test) starts.
//!
//! Not port 0's choice: the kernel hands out bind(0) ports from the ephemeral range, the same
//! range it takes the source ports of outgoing connections from. Between learning a port and
//! the server binding it, any client connection on the machine could take it as its source
//! port, and the server then fails with "address already in use" (kube-controller-manager did
//! so in CI while 200 LockedJobs kept a few hundred connections churning). Ports below the
//! ephemeral range are never taken that way. A process-wide cursor also keeps two callers in
//! one process (tests run in parallel threads) from being handed the same port.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, TcpListener};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Well clear of the registered ports most services on a developer's machine use.
const LOWEST: u16 = 10_000;

/// A free loopback port below the kernel's ephemeral range (port 0's choice when that range
/// leaves no room below it). A server started on it can still lose it to another listener
/// started in between, so a failed start says which port it was.
pub fn free_port() -> std::io::Result<u16> {
    let range = non_ephemeral_range();
    if range.is_empty() {
        return kernel_chosen_port();
    }
    let span = u32::from(range.end - range.start);
    for _ in 0..span {
        let offset = cursor().fetch_add(1, Ordering::Relaxed) % span;
        let port = range.start + offset as u16;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    kernel_chosen_port()
}

fn kernel_chosen_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Starts at a random place, so that two processes (a test run beside a `localcluster up`)
/// do not walk the same ports in step.
fn cursor() -> &'static AtomicU32 {
    static CURSOR: OnceLock<AtomicU32> = OnceLock::new();
    CURSOR.get_or_init(|| AtomicU32::new(RandomState::new().build_hasher().finish() as u32))
}

fn non_ephemeral_range() -> Range<u16> {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    LOWEST..first_ephemeral.max(LOWEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_outside_the_ephemeral_range() {
        let range = non_ephemeral_range();
        let ports: Vec<u16> = (0..200)
            .map(|_| free_port().expect("a free port"))
            .collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(
            distinct.len(),
            ports.len(),
            "a port handed out twice: {ports:?}"
        );
        for port in &ports {
            assert!(range.contains(port), "{port} is not in {range:?}");
        }
    }
}
