//! The Redis tier: the lock engine, `exec`, `elect`, `status`, TLS, ACLs, rotation, the chart's
//! start script and the lab, against real `redis-server` processes on loopback ports. Every test
//! is `#[ignore]`d so that a plain `cargo test` leaves it out and says so; `scripts/test.sh
//! redis` (and CI) run it with `--include-ignored` (docs/testing.md, "Tiers").

mod acl;
mod chart_node;
mod elect;
mod exec;
mod lab;
mod redlock;
mod rotation;
mod status;
mod tls;
