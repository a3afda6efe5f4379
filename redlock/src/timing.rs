//! Pure timing math of the protocol: quorum size, lease validity with clock drift, retry backoff.
//! Kept free of I/O so it can be tested by tables.

use std::time::Duration;

/// Fixed part of the drift allowance: covers the granularity of Redis' expiry clock.
pub const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// Nodes that must agree: a strict majority, so that any two quorums intersect.
pub fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// What the holder subtracts from the TTL because node clocks may run fast.
pub fn drift_allowance(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor.max(0.0)) + DRIFT_FLOOR
}

/// Validity left after an attempt that took `elapsed`: `ttl - elapsed - drift`. `None` when
/// nothing is left, so that a slow round trip can never hand out a lease that is already over.
pub fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift_allowance(ttl, drift_factor))
        .filter(|left| !left.is_zero())
}

/// Whether a refused attempt may have met a holder: some other value sits on `strongest_other`
/// of the nodes that answered, and the `unanswered` nodes could hold it too. If not even then
/// it reaches `quorum`, the contenders split the vote and nobody holds the lock.
pub fn may_hold_quorum(strongest_other: usize, unanswered: usize, quorum: usize) -> bool {
    strongest_other + unanswered >= quorum
}

/// "Full jitter" backoff: a uniform pick in `[0, min(max, base * 2^attempt)]`, so that clients
/// that failed together do not retry together. `unit` is a uniform sample in `[0, 1)`.
pub fn backoff(attempt: u32, base: Duration, max: Duration, unit: f64) -> Duration {
    let ceiling = base.saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX));
    ceiling.min(max).mul_f64(unit.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        for (nodes, expected) in [
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 3),
            (5, 3),
            (6, 4),
            (7, 4),
            (9, 5),
        ] {
            assert_eq!(quorum(nodes), expected, "nodes={nodes}");
            assert!(2 * quorum(nodes) > nodes, "two quorums must intersect");
        }
    }

    #[test]
    fn a_holder_is_told_from_a_split_vote() {
        // (strongest other value, unanswered nodes, quorum, someone may hold the lock)
        let table = [
            (3, 0, 3, true),  // 5 nodes: another holder has 3
            (2, 0, 3, false), // 2 / 2 / 1 split
            (1, 0, 3, false), // 2 granted, three different others
            (2, 1, 3, true),  // the silent node may be the holder's third
            (0, 3, 3, true),  // too few answers to tell
            (1, 0, 2, false), // 3 nodes: 1 / 1 / 1
            (2, 0, 2, true),
        ];
        for (other, unanswered, quorum, expected) in table {
            assert_eq!(
                may_hold_quorum(other, unanswered, quorum),
                expected,
                "other={other} unanswered={unanswered} quorum={quorum}"
            );
        }
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        // (ttl, elapsed, drift factor, expected validity)
        let table = [
            (ms(30_000), ms(10), 0.01, Some(ms(30_000 - 10 - 300 - 2))),
            (ms(1_000), ms(0), 0.01, Some(ms(1_000 - 10 - 2))),
            (ms(1_000), ms(988), 0.01, None),
            (ms(1_000), ms(987), 0.01, Some(ms(1))),
            (ms(1_000), ms(5_000), 0.01, None),
            (ms(100), ms(0), 0.0, Some(ms(98))),
            (ms(2), ms(0), 0.0, None),
        ];
        for (ttl, elapsed, drift, expected) in table {
            assert_eq!(
                validity(ttl, elapsed, drift),
                expected,
                "ttl={ttl:?} elapsed={elapsed:?}"
            );
        }
    }

    #[test]
    fn validity_is_always_strictly_below_ttl() {
        for ttl in [3u64, 10, 100, 30_000] {
            if let Some(v) = validity(ms(ttl), Duration::ZERO, 0.0) {
                assert!(v < ms(ttl));
            }
        }
    }

    #[test]
    fn backoff_is_full_jitter_capped() {
        let base = ms(50);
        let max = ms(1_000);
        let table = [
            (0, 0.5, ms(25)),
            (1, 0.5, ms(50)),
            (3, 1.0, ms(400)),
            (10, 1.0, ms(1_000)),
            (10, 0.0, ms(0)),
            (u32::MAX, 0.5, ms(500)),
        ];
        for (attempt, unit, expected) in table {
            assert_eq!(
                backoff(attempt, base, max, unit),
                expected,
                "attempt={attempt}"
            );
        }
    }
}
