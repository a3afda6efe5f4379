//! The scenarios the lab can run, and what each is meant to show.

use super::checker::Verdict;
use super::harness;
use clap::ValueEnum;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// 5 nodes, 8 clients, no fault: no overlap, tokens increasing.
    Baseline,
    /// kill -9 and restart nodes one at a time (appendfsync always, restart delay): no overlap.
    NodeCrash,
    /// A majority of nodes restart empty with no delay while a lock is held: overlap is
    /// possible and reported; the fencing check says whether fenced storage stayed safe.
    RestartNoPersistence,
    /// One node's clock jumps past the TTL while the holder has exactly a majority
    /// (Kleppmann): overlap reported; the later holder's larger token fences the earlier.
    ClockJump,
    /// The holder is stopped (SIGSTOP) past its TTL: another client acquires; the paused
    /// client's writes are refused by the fenced store after it wakes.
    ClientPause,
    /// The holder is cut from a majority: its watchdog gives up before the deadline; no overlap.
    Partition,
    /// Latency near the TTL on every path: acquisitions fail rather than return a lease with
    /// no validity; no overlap.
    SlowNetwork,
    /// Random faults from a seed (--seed), overlapping: nodes killed and restarted, node 0
    /// restarted empty after the restart delay, holders paused or cut off, slow nodes, clock
    /// jumps. Safe or fenced, never unsafe; the schedule is in the report.
    Soak,
    /// Every scenario above but the soak, one after the other, each in its own subdirectory.
    All,
}

impl Scenario {
    pub(super) const EACH: [Scenario; 7] = [
        Scenario::Baseline,
        Scenario::NodeCrash,
        Scenario::RestartNoPersistence,
        Scenario::ClockJump,
        Scenario::ClientPause,
        Scenario::Partition,
        Scenario::SlowNetwork,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Baseline => "baseline",
            Scenario::NodeCrash => "node-crash",
            Scenario::RestartNoPersistence => "restart-no-persistence",
            Scenario::ClockJump => "clock-jump",
            Scenario::ClientPause => "client-pause",
            Scenario::Partition => "partition",
            Scenario::SlowNetwork => "slow-network",
            Scenario::Soak => "soak",
            Scenario::All => "all",
        }
    }

    /// How the lock nodes keep their data.
    pub fn persistence(self) -> harness::Persistence {
        match self {
            Scenario::RestartNoPersistence => harness::Persistence::None,
            _ => harness::Persistence::AppendFsyncAlways,
        }
    }

    /// The verdicts this scenario may reach and still show what it is meant to show.
    pub fn expected(self) -> &'static [Verdict] {
        match self {
            Scenario::Baseline
            | Scenario::NodeCrash
            | Scenario::Partition
            | Scenario::SlowNetwork => &[Verdict::Safe],
            // The documented hazard: whatever happens is shown, not prevented.
            Scenario::RestartNoPersistence => &[Verdict::Safe, Verdict::Fenced, Verdict::Unsafe],
            Scenario::ClockJump | Scenario::ClientPause => &[Verdict::Fenced],
            // Pauses, cuts and clock jumps may break mutual exclusion; fencing must hold.
            Scenario::Soak => &[Verdict::Safe, Verdict::Fenced],
            Scenario::All => &[],
        }
    }
}
