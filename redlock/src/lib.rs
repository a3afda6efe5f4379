//! Redlock over N independent Redis nodes, with fencing tokens that only grow, a progress
//! register that makes each step run once, and a watchdog that renews a lease and says the
//! moment it can no longer be trusted. No Kubernetes: the lockedjob operator and its CLI
//! (`lockedjob exec`, `lockedjob elect`) build on this crate, and a Rust service can embed it
//! as it would embed rslock.
//!
//! What it adds to the Redlock of the Redis documentation (each in docs/design.md of the
//! repository, "Redlock, as this project does it"):
//! - **Fencing tokens**: every lease carries a token greater than any granted before for the
//!   same lock on a quorum of nodes. Hand it to the storage you write to and reject lower
//!   ones, and a holder that paused past its lease cannot overwrite its successor's work.
//! - **Validity with clock drift**: a lease is valid for `ttl − elapsed − drift`, and every
//!   request to a node is bounded by a timeout, so a hung node costs one timeout, not a lease.
//! - **Steps**: [`Redlock::try_acquire_step`] grants the lock only to start a step (a
//!   scheduled time, say) that no earlier holder started, so a step runs once even when
//!   holders come and go.
//! - **The watchdog**: [`Watchdog`] renews in the background and cancels
//!   [`Watchdog::lost`] before the lease can expire when no quorum renews it; stop the work
//!   then.
//!
//! # Example
//!
//! Three Redis nodes, one lock: the first attempt wins with token 1, a second holder is turned
//! away while it is held, and the next holder's token is higher.
//!
//! ```
//! use lockedjob_redlock::{LeaseTiming, Redlock, RedlockConfig, Watchdog};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let nodes = doc_nodes::Nodes::start(3)?;
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! // One URL per independent node: `redis://[user:password@]host:port` or `rediss://`.
//! let urls: Vec<String> = nodes.urls();
//! let engine = Redlock::new(RedlockConfig::new(urls.clone()))?;
//!
//! let ttl = Duration::from_secs(10);
//! let lease = engine.try_acquire("nightly-report", ttl).await?;
//! assert_eq!(lease.token(), 1);
//!
//! // Another process (another engine, another holder name) is refused while it is held.
//! let mut other = RedlockConfig::new(urls);
//! other.holder = "elsewhere/replica-2".into();
//! let other = Redlock::new(other)?;
//! assert!(other.try_acquire("nightly-report", ttl).await.is_err());
//!
//! // Renew in the background while the work runs; stop the work if `lost` fires.
//! let watchdog = Watchdog::spawn(engine.clone(), lease, LeaseTiming::from_ttl(ttl));
//! let lost = watchdog.lost();
//! tokio::select! {
//!     _ = lost.cancelled() => return Err("lease lost: stop writing".into()),
//!     _ = tokio::time::sleep(Duration::from_millis(100)) => {} // the work
//! }
//! assert!(watchdog.release(&engine).await);
//!
//! // The next holder's token is higher: storage can reject the one before.
//! let next = other.try_acquire("nightly-report", ttl).await?;
//! assert_eq!(next.token(), 2);
//! other.release(&next).await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok(())
//! # }
//! # mod doc_nodes {
//! #     //! Real redis-server processes on free loopback ports, stopped when dropped.
//! #     pub struct Nodes(Vec<(std::process::Child, u16)>);
//! #     impl Nodes {
//! #         pub fn start(n: usize) -> std::io::Result<Self> {
//! #             let mut nodes = Vec::new();
//! #             for _ in 0..n {
//! #                 let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//! #                 let child = std::process::Command::new("redis-server")
//! #                     .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
//! #                     .args(["--save", "", "--appendonly", "no"])
//! #                     .stdout(std::process::Stdio::null())
//! #                     .spawn()?;
//! #                 nodes.push((child, port));
//! #             }
//! #             for (_, port) in &nodes {
//! #                 let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
//! #                 while std::net::TcpStream::connect(("127.0.0.1", *port)).is_err() {
//! #                     assert!(std::time::Instant::now() < deadline, "redis-server did not start");
//! #                     std::thread::sleep(std::time::Duration::from_millis(20));
//! #                 }
//! #             }
//! #             Ok(Self(nodes))
//! #         }
//! #         pub fn urls(&self) -> Vec<String> {
//! #             self.0.iter().map(|(_, port)| format!("redis://127.0.0.1:{port}")).collect()
//! #         }
//! #     }
//! #     impl Drop for Nodes {
//! #         fn drop(&mut self) {
//! #             for (child, _) in &mut self.0 {
//! #                 let _ = child.kill();
//! #                 let _ = child.wait();
//! #             }
//! #         }
//! #     }
//! # }
//! ```
//!
//! `examples/critical_section.rs` does the same against nodes you name:
//! `cargo run -p lockedjob-redlock --example critical_section -- redis://127.0.0.1:6379 ...`.
//!
//! # Choosing the nodes
//!
//! Use an odd number of independent nodes (no replication between them: a replica that takes
//! over without the last writes forgets locks and fences), with `appendfsync always`, and
//! keep a restarted node out of service for longer than the longest TTL. A node that restarts
//! without its data can otherwise grant a lock still held elsewhere.

#![deny(missing_docs)]

mod batch;
mod config;
mod engine;
mod error;
mod handshake;
mod inspect;
mod lease;
mod metrics;
mod node;
mod phase1;
mod reload;
mod scripts;
pub mod timing;
mod tls;
mod watchdog;

pub use config::{
    default_holder, holder, split_node_list, Credentials, LeaseTiming, RedlockConfig,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, DEFAULT_KEY_PREFIX, DEFAULT_RELOAD_INTERVAL,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_TTL,
};
pub use engine::{Redlock, StepHint};
pub use error::{ConfigError, LockError, NodeErrorKind, NodeFailure};
pub use inspect::{LockView, NodeView};
pub use lease::Lease;
pub use metrics::{LockMetrics, Outcome};
pub use tls::TlsFiles;
pub use watchdog::{LeaseStatus, Watchdog, WatchdogEnd};
