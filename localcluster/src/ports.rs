//! Free loopback ports for the servers a cluster (or a test) starts.
//!
//! Not port 0's choice: the kernel hands out bind(0) ports from the ephemeral range, the same
//! range it takes the source ports of outgoing connections from. Between learning a port and
//! the server binding it, any client connection on the machine could take it as its source
//! port, and the server then fails with "address already in use" (kube-controller-manager did
//! so in CI while 200 LockedJobs kept a few hundred connections churning). Ports below the
//! ephemeral range are never taken that way. A process-wide cursor also keeps two callers in
//! one process (tests run in parallel threads) from being handed the same port, and a claim
//! (an abstract Unix socket named after the port, held until the process exits) keeps two
//! processes from it: the Kubernetes tier runs two test processes at once, and a sidecar once
//! answered another process's request on a port both had been handed.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, TcpListener};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// Well clear of the registered ports most services on a developer's machine use.
const LOWEST: u16 = 10_000;

/// A free loopback port below the kernel's ephemeral range (port 0's choice when that range
/// leaves no room below it). A server started on it can still lose it to another listener
/// started in between, so a failed start says which port it was.
pub fn free_port() -> std::io::Result<u16> {
    free_port_from(cursor())
}

fn free_port_from(cursor: &AtomicU32) -> std::io::Result<u16> {
    let range = non_ephemeral_range();
    if range.is_empty() {
        return kernel_chosen_port();
    }
    let span = u32::from(range.end - range.start);
    for _ in 0..span {
        let offset = cursor.fetch_add(1, Ordering::Relaxed) % span;
        let port = range.start + offset as u16;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() && claim(port) {
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

/// Claims `port` for this process, machine-wide, until it exits: false if another process
/// holds it. An abstract socket lives in the network namespace, not the file system, and goes
/// with its process: nothing to clean up.
fn claim(port: u16) -> bool {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    static CLAIMS: Mutex<Vec<UnixListener>> = Mutex::new(Vec::new());
    let name = format!("localcluster-port-{port}");
    let Ok(address) = SocketAddr::from_abstract_name(name.as_bytes()) else {
        return true;
    };
    match UnixListener::bind_addr(&address) {
        Ok(listener) => {
            CLAIMS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(listener);
            true
        }
        Err(e) => e.kind() != std::io::ErrorKind::AddrInUse,
    }
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

    /// Another process's claim (made here by hand, as it would be there) keeps a port from
    /// this one, though the port itself is free.
    #[test]
    fn a_port_another_process_claimed_is_not_handed_out() {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};
        let range = non_ephemeral_range();
        // A cursor of this test's own (the process's is shared with the other tests), at a
        // port no test here has been handed.
        let back = 1000 + u16::try_from(std::process::id() % 500).unwrap_or(0);
        let start = range.end.saturating_sub(back).max(range.start);
        let cursor = AtomicU32::new(u32::from(start - range.start));
        let name = format!("localcluster-port-{start}");
        let address = SocketAddr::from_abstract_name(name.as_bytes()).expect("a name");
        let _theirs = UnixListener::bind_addr(&address).expect("claim it as another process");
        let port = free_port_from(&cursor).expect("a free port");
        assert_ne!(port, start, "handed out a port another process claimed");
    }
}
