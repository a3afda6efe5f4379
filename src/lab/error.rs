//! What went wrong running the lab.

use super::harness;

/// What went wrong running the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error(transparent)]
    Harness(#[from] harness::HarnessError),
    #[error("cannot {0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
    #[error("cannot read the fenced store's log: {0}")]
    Store(#[source] redis::RedisError),
    #[error("a history collector panicked")]
    Poisoned,
    #[error("{0}")]
    Usage(String),
    #[error("the independent checker failed: {0}")]
    Checker(String),
}
