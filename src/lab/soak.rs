//! The soak's fault schedule (docs/design.md, "The lab's two checkers"): drawn from a seed, so
//! that the same seed gives the same schedule with the same build, and printed into the report.
//! Faults overlap; each is healed after a drawn time. Pure: no clock, no I/O.
//!
//! The faults stay where fencing must keep storage safe: every node but node 0 keeps its data
//! (`appendfsync always`), and node 0 comes back empty only after the restart delay, so every
//! quorum still holds the largest fence. Pauses, cuts and clock jumps may break mutual
//! exclusion (a `fenced` verdict); nothing here may make a run `unsafe`.

use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum SoakFault {
    /// kill -9 a node; it restarts with its append-only file when healed.
    KillNode { node: u32 },
    /// kill -9 node 0 and lose its disk: it restarts empty when healed (after the restart
    /// delay, as `start-redis.sh` does).
    WipeNode,
    /// SIGSTOP the holder (a long GC pause), often past its TTL.
    PauseHolder,
    /// Blackhole the holder's paths to a majority of nodes.
    CutHolder,
    /// Latency on every path to one node, each way.
    SlowNode { node: u32, delay_ms: u64 },
    /// Node 2's clock (the one node with a movable clock) jumps ahead; jumps add up and are not
    /// undone.
    ClockJump { by_ms: u64 },
}

/// One fault of the schedule: when, what, and how long until it is healed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Planned {
    pub at_ms: u64,
    pub heal_after_ms: u64,
    #[serde(flatten)]
    pub fault: SoakFault,
}

/// The schedule of a soak of `seconds` with lock TTL `ttl_ms` over `nodes` nodes: a fault
/// every half to three TTLs, none in the last two TTLs, so that the run ends healed.
pub fn schedule(
    seed: u64,
    seconds: u64,
    ttl_ms: u64,
    nodes: u32,
    restart_delay_ms: u64,
) -> Vec<Planned> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let last = (seconds * 1000).saturating_sub(2 * ttl_ms);
    let mut plan = Vec::new();
    let mut at_ms = ttl_ms;
    while at_ms < last {
        let (fault, heal_after_ms) = match rng.random_range(0..6) {
            0 => (
                SoakFault::KillNode {
                    node: rng.random_range(0..nodes),
                },
                restart_delay_ms + rng.random_range(0..=ttl_ms),
            ),
            1 => (
                SoakFault::WipeNode,
                restart_delay_ms + rng.random_range(0..=ttl_ms),
            ),
            2 => (
                SoakFault::PauseHolder,
                rng.random_range(ttl_ms..=4 * ttl_ms),
            ),
            3 => (SoakFault::CutHolder, rng.random_range(ttl_ms..=4 * ttl_ms)),
            4 => (
                SoakFault::SlowNode {
                    node: rng.random_range(0..nodes),
                    delay_ms: rng.random_range(ttl_ms / 20..=ttl_ms / 2),
                },
                rng.random_range(ttl_ms..=5 * ttl_ms),
            ),
            _ => (
                SoakFault::ClockJump {
                    by_ms: ttl_ms * rng.random_range(1..=4),
                },
                0,
            ),
        };
        plan.push(Planned {
            at_ms,
            heal_after_ms,
            fault,
        });
        at_ms += rng.random_range(ttl_ms / 2..=3 * ttl_ms);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_and_another_seed_another() {
        let plan = |seed| schedule(seed, 120, 1000, 5, 1500);
        assert_eq!(plan(7), plan(7));
        assert_ne!(plan(7), plan(8));
    }

    #[test]
    fn a_long_schedule_draws_every_fault_within_the_run_and_its_rules() {
        let plan = schedule(3, 600, 1000, 5, 1500);
        let drawn = |pick: fn(&SoakFault) -> bool| plan.iter().any(|p| pick(&p.fault));
        assert!(drawn(|f| matches!(f, SoakFault::KillNode { .. })));
        assert!(drawn(|f| matches!(f, SoakFault::WipeNode)));
        assert!(drawn(|f| matches!(f, SoakFault::PauseHolder)));
        assert!(drawn(|f| matches!(f, SoakFault::CutHolder)));
        assert!(drawn(|f| matches!(f, SoakFault::SlowNode { .. })));
        assert!(drawn(|f| matches!(f, SoakFault::ClockJump { .. })));
        for planned in &plan {
            assert!(
                planned.at_ms >= 1000 && planned.at_ms < 598_000,
                "{planned:?}"
            );
            match planned.fault {
                // A node that lost its data stays out for the restart delay at least.
                SoakFault::KillNode { node } => {
                    assert!(node < 5);
                    assert!(planned.heal_after_ms >= 1500);
                }
                SoakFault::WipeNode => assert!(planned.heal_after_ms >= 1500),
                SoakFault::SlowNode { delay_ms, .. } => assert!(delay_ms <= 500),
                _ => {}
            }
        }
        // Faults overlap: some start before the one before them is healed.
        assert!(plan
            .windows(2)
            .any(|pair| pair[1].at_ms < pair[0].at_ms + pair[0].heal_after_ms));
    }
}
