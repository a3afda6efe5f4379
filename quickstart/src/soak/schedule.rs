//! The cluster soak's fault schedule: drawn from a seed, so that the same seed gives the same
//! schedule, and written into the report. Faults overlap; each is healed after a drawn time.
//! Pure: no clock, no I/O. Which faults lie outside the lock's model (where mutual exclusion
//! may break and only the fence keeps storage safe) is said here, once.

use rand::{Rng, SeedableRng};
use serde::Serialize;

/// How many Redis nodes the soak's clusters share.
pub const NODES: u32 = 5;
/// The node whose clock can jump (started under the clock shim).
pub const CLOCK_NODE: u32 = 2;
/// The node that may come back without its data.
pub const WIPED_NODE: u32 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    /// kill -9 of an operator replica's process (the kubelet restarts its container).
    KillReplica { cluster: usize, replica: usize },
    /// `kubectl delete pod` of a replica: SIGTERM, graceful handover, a new pod.
    DeleteReplica { cluster: usize, replica: usize },
    /// SIGSTOP of the replica holding a run (a long GC pause), often past the lock's TTL;
    /// SIGCONT when healed.
    PauseHolder,
    /// One replica's packets to its API server dropped (in its pod's network namespace).
    CutReplica { cluster: usize, replica: usize },
    /// kube-apiserver of one cluster stopped; started again when healed.
    StopApiserver { cluster: usize },
    /// kill -9 of a Redis node; it restarts with its append-only file when healed.
    KillNode { node: u32 },
    /// kill -9 of node `WIPED_NODE` and its disk lost: it restarts empty when healed, after
    /// the restart delay at least.
    WipeNode,
    /// Latency on every path to one node (both clusters' proxies), each way.
    SlowNode { node: u32, delay_ms: u64 },
    /// Node `CLOCK_NODE`'s clock jumps ahead; jumps add up and are not undone.
    ClockJump { by_ms: u64 },
}

impl Fault {
    /// Faults under which Redlock promises nothing about mutual exclusion (a paused holder
    /// acting past its lease, a node's clock running ahead, a node forgetting a vote): two runs
    /// may overlap, and the fencing token must keep the store safe.
    pub fn outside_the_model(&self) -> bool {
        matches!(
            self,
            Fault::PauseHolder | Fault::ClockJump { .. } | Fault::WipeNode
        )
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillReplica { .. } => "kill-replica",
            Fault::DeleteReplica { .. } => "delete-replica",
            Fault::PauseHolder => "pause-holder",
            Fault::CutReplica { .. } => "cut-replica",
            Fault::StopApiserver { .. } => "stop-apiserver",
            Fault::KillNode { .. } => "kill-node",
            Fault::WipeNode => "wipe-node",
            Fault::SlowNode { .. } => "slow-node",
            Fault::ClockJump { .. } => "clock-jump",
        }
    }
}

/// One fault of the schedule: when, what, and how long until it is healed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Planned {
    pub at_ms: u64,
    pub heal_after_ms: u64,
    #[serde(flatten)]
    pub fault: Fault,
}

/// What the schedule is drawn for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Shape {
    pub seconds: u64,
    pub ttl_ms: u64,
    pub clusters: usize,
    pub replicas: usize,
    pub restart_delay_ms: u64,
}

/// A fault every half to three TTLs (about 200 an hour with a 10 s TTL), none in the last
/// three TTLs, so that the soak ends healed.
pub fn schedule(seed: u64, shape: Shape) -> Vec<Planned> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ttl = shape.ttl_ms;
    let last = (shape.seconds * 1000).saturating_sub(3 * ttl);
    let mut plan = Vec::new();
    let mut at_ms = 2 * ttl;
    while at_ms < last {
        let cluster = rng.random_range(0..shape.clusters);
        let replica = rng.random_range(0..shape.replicas);
        let node = rng.random_range(0..NODES);
        let back_after_restart_delay = shape.restart_delay_ms + rng.random_range(0..=ttl);
        let (fault, heal_after_ms) = match rng.random_range(0..9) {
            0 => (Fault::KillReplica { cluster, replica }, 0),
            1 => (Fault::DeleteReplica { cluster, replica }, 0),
            2 => (Fault::PauseHolder, rng.random_range(ttl / 2..=3 * ttl)),
            3 => (
                Fault::CutReplica { cluster, replica },
                rng.random_range(ttl..=4 * ttl),
            ),
            4 => (
                Fault::StopApiserver { cluster },
                rng.random_range(ttl / 2..=3 * ttl),
            ),
            5 => (Fault::KillNode { node }, back_after_restart_delay),
            6 => (Fault::WipeNode, back_after_restart_delay),
            7 => (
                Fault::SlowNode {
                    node,
                    delay_ms: rng.random_range(20..=200),
                },
                rng.random_range(ttl..=4 * ttl),
            ),
            _ => (
                Fault::ClockJump {
                    by_ms: rng.random_range(ttl / 2..=2 * ttl),
                },
                0,
            ),
        };
        plan.push(Planned {
            at_ms,
            heal_after_ms,
            fault,
        });
        at_ms += rng.random_range(ttl / 2..=3 * ttl);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(seconds: u64) -> Shape {
        Shape {
            seconds,
            ttl_ms: 10_000,
            clusters: 2,
            replicas: 3,
            restart_delay_ms: 12_000,
        }
    }

    #[test]
    fn a_seed_gives_one_schedule_and_another_seed_another() {
        assert_eq!(schedule(7, shape(600)), schedule(7, shape(600)));
        assert_ne!(schedule(7, shape(600)), schedule(8, shape(600)));
    }

    #[test]
    fn an_hour_draws_every_kind_about_200_times_and_ends_healed() {
        let plan = schedule(42, shape(3600));
        assert!((150..=300).contains(&plan.len()), "{}", plan.len());
        let kinds: std::collections::BTreeSet<&str> = plan.iter().map(|p| p.fault.kind()).collect();
        assert_eq!(kinds.len(), 9, "{kinds:?}");
        for planned in &plan {
            assert!(planned.at_ms + planned.heal_after_ms <= 3_600_000 + 3 * 10_000);
            assert!(planned.at_ms < 3_600_000 - 30_000, "{planned:?}");
            match planned.fault {
                Fault::KillNode { .. } | Fault::WipeNode => {
                    assert!(planned.heal_after_ms >= 12_000, "{planned:?}")
                }
                Fault::KillReplica { cluster, replica }
                | Fault::DeleteReplica { cluster, replica }
                | Fault::CutReplica { cluster, replica } => assert!(cluster < 2 && replica < 3),
                Fault::SlowNode { node, .. } => assert!(node < NODES),
                _ => {}
            }
        }
        assert!(plan
            .windows(2)
            .any(|pair| pair[1].at_ms < pair[0].at_ms + pair[0].heal_after_ms));
    }
}
