//! The lock engine: Redlock over N independent Redis nodes, fencing tokens, and a watchdog.
//! Nothing here knows about Kubernetes; the controller and `exec` build on it.

mod batch;
mod config;
mod engine;
mod error;
mod inspect;
mod lease;
mod node;
mod phase1;
mod scripts;
pub mod timing;
mod tls;
mod watchdog;

pub use config::{
    default_holder, holder, split_node_list, Credentials, LeaseTiming, RedlockConfig,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, DEFAULT_KEY_PREFIX, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TTL,
};
pub use engine::{Redlock, StepHint};
pub use error::{ConfigError, LockError, NodeErrorKind, NodeFailure};
pub use inspect::{LockView, NodeView};
pub use lease::Lease;
pub use tls::TlsFiles;
pub use watchdog::{LeaseStatus, Watchdog, WatchdogEnd};
