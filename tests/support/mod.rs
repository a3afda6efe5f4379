//! Test harness shared by the integration tests. The parts (real `redis-server` processes on
//! free loopback ports with kill -9, SIGSTOP/SIGCONT, restart and a movable clock, and the
//! fault-injecting TCP proxy) live in `lockedjob::lab::harness`, shared with `lockedjob lab`;
//! here are the panicking shorthands a test wants for its checks.
#![allow(dead_code, unused_imports)]

pub use lockedjob::lab::harness::{
    FaultProxy, NodeTls, Persistence, ProxyMode, RedisNode, RedisNodes,
};

pub mod kubernetes;
pub mod pki;

/// Checks on a node's data that fail the test, with context, when the node cannot answer.
pub trait NodeChecks {
    fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T;

    fn get(&self, key: &str) -> Option<String> {
        self.query(&["GET", key])
    }

    /// `PTTL` of a key: -2 when absent, -1 without expiry.
    fn pttl(&self, key: &str) -> i64 {
        self.query(&["PTTL", key])
    }
}

impl NodeChecks for RedisNode {
    fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.command(args)
            .unwrap_or_else(|e| panic!("{args:?} on {}: {e}", self.url()))
    }
}

pub trait SetChecks {
    /// How many nodes that are up hold `key`.
    fn count_key(&self, key: &str) -> usize;
}

impl SetChecks for RedisNodes {
    fn count_key(&self, key: &str) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.is_running() && n.get(key).is_some())
            .count()
    }
}

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
    lockedjob::lab::harness::free_port().expect("a free loopback port")
}
