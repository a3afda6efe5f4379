//! A held lock: who, which token, and until when (on the monotonic clock).

use std::time::{Duration, Instant};

/// The proof of holding a lock. Its deadline is monotonic: wall-clock jumps on this machine do
/// not move it. After the deadline the holder must assume someone else may hold the lock.
#[derive(Debug, Clone)]
pub struct Lease {
    pub(crate) name: String,
    pub(crate) value: String,
    /// Nodes that refused the lock in phase 1 (they hold another value): a release skips them.
    pub(crate) refused: Vec<bool>,
    pub(crate) token: u64,
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) deadline: Instant,
}

impl Lease {
    /// The lock name (without key prefix).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The unique value stored in the lock key: `{holder}/{random 128-bit hex}`.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// `{clusterId}/{podName}`: the value without its random part.
    pub fn holder(&self) -> &str {
        self.value
            .rsplit_once('/')
            .map_or(self.value.as_str(), |(holder, _)| holder)
    }

    /// The fencing token: larger than every token issued before this acquisition.
    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// When the lease ends unless renewed, already reduced by the clock-drift allowance.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Validity left now; zero once the deadline has passed.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.deadline
    }
}
