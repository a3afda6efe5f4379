//! A held lock: who, which token, and until when (on the monotonic clock).

use std::time::{Duration, Instant};

/// The holder part (`{clusterId}/{podName}`) of a lock value `{holder}/{random}`.
pub(crate) fn holder_of(value: &str) -> &str {
    value.rsplit_once('/').map_or(value, |(holder, _)| holder)
}

/// The most common of `values` and on how many it is (the first of equals); `None` when there
/// are none. Redlock's view of "the" value of a lock: the holder needs it on a quorum.
pub(crate) fn most_common<'a>(
    values: impl IntoIterator<Item = &'a str>,
) -> Option<(&'a str, usize)> {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for value in values {
        match counts.iter_mut().find(|(v, _)| *v == value) {
            Some((_, count)) => *count += 1,
            None => counts.push((value, 1)),
        }
    }
    counts.into_iter().rev().max_by_key(|(_, count)| *count)
}

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
        holder_of(&self.value)
    }

    /// The fencing token: larger than every token issued before this acquisition.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The TTL the lock was acquired with, which each renewal sets again on the nodes.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the acquisition began (monotonic clock), before the first node was asked: the
    /// point its validity counts from.
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

    /// True once the deadline has passed: the holder must then assume someone else may hold
    /// the lock.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::{holder_of, most_common};

    #[test]
    fn lock_values_name_their_holder_and_the_most_common_wins() {
        assert_eq!(holder_of("east/lockedjob-0/9f2c"), "east/lockedjob-0");
        assert_eq!(holder_of("bare"), "bare");
        // (what, values, most common and its count)
        type Row = (
            &'static str,
            &'static [&'static str],
            Option<(&'static str, usize)>,
        );
        let table: [Row; 4] = [
            ("none", &[], None),
            ("a majority", &["a", "b", "a"], Some(("a", 2))),
            (
                "a tie: the first seen",
                &["b", "a", "a", "b"],
                Some(("b", 2)),
            ),
            ("all different", &["x", "y", "z"], Some(("x", 1))),
        ];
        for (what, values, expected) in table {
            assert_eq!(most_common(values.iter().copied()), expected, "{what}");
        }
    }
}
