//! Test harness shared by the integration tests: real `redis-server` processes on free loopback
//! ports, with real faults (kill -9, SIGSTOP/SIGCONT, restart, clock skew through libfaketime),
//! and a fault-injecting TCP proxy. Everything it starts is stopped when the handle drops, also
//! when a test panics.
#![allow(dead_code, unused_imports)]

pub mod proxy;
pub mod redis_nodes;

pub use proxy::{FaultProxy, ProxyMode};
pub use redis_nodes::{Persistence, RedisNode, RedisNodes};

use std::time::{Duration, Instant};

/// Polls `check` until it holds or `limit` passes. For waiting on state, never for asserting
/// how fast something happened.
pub fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// Path of the built `lockedjob` binary (cargo builds it for integration tests).
pub fn lockedjob_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_lockedjob"))
}

/// Binds port 0 on loopback to learn a free port. A small race remains until the server binds
/// it; callers retry on a failed start.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}
