//! What a lab run records: every lock operation and critical section of every client, and the
//! state of every Redis node, stamped with the system-wide monotonic clock (comparable across
//! the lab's processes, unaffected by the wall-clock faults it injects).

use serde::{Deserialize, Serialize};

/// Microseconds on `CLOCK_MONOTONIC`, the same clock in every process of the machine.
pub fn monotonic_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000)
        .unwrap_or(0)
}

/// One thing a client did or saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientEvent {
    /// Monotonic microseconds (see [`monotonic_us`]); relative to the run's start once the lab
    /// has collected the history.
    pub at_us: u64,
    pub client: u32,
    #[serde(flatten)]
    pub op: ClientOp,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ClientOp {
    AcquireStart,
    /// A lease: valid until `deadline_us` (monotonic), `validity_ms` after the attempt began.
    Acquired {
        token: u64,
        validity_ms: u64,
        deadline_us: u64,
    },
    AcquireFailed {
        reason: String,
    },
    /// A watchdog renewal: the lease now runs to `deadline_us`.
    Extended {
        token: u64,
        deadline_us: u64,
    },
    /// The watchdog gave the lease up before its deadline.
    LeaseLost {
        token: u64,
    },
    Released {
        token: u64,
    },
    /// Entry to and exit from the critical section, under the lease with `token`.
    Enter {
        token: u64,
    },
    Exit {
        token: u64,
    },
    /// A write to the fenced store with `token` is sent (its answer is the next `Write` of the
    /// same client): the call of the write, for the independent checker (`porcupine.rs`).
    WriteStart {
        token: u64,
    },
    /// A write to the fenced store with `token`, and whether the store took it.
    Write {
        token: u64,
        accepted: bool,
    },
}

/// How a Redis node is, from some moment on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum NodeState {
    Up,
    /// Killed (kill -9), not running.
    Down,
    /// SIGSTOP: holds its sockets, answers nothing.
    Paused,
    /// Running with its wall clock moved forward by this much.
    Skewed {
        offset_ms: u64,
    },
    /// Reached through a proxy that delays each direction by this much.
    Slow {
        delay_ms: u64,
    },
    /// Cut off (blackholed) from the clients listed in the fault note.
    Partitioned,
    /// Up again after a restart that lost its data.
    Emptied,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEvent {
    pub at_us: u64,
    pub node: u32,
    #[serde(flatten)]
    pub state: NodeState,
}

/// A fault the scenario injected, for the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub at_us: u64,
    pub label: String,
}

/// One write as the fenced store logged it, in the store's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreWrite {
    pub client: u32,
    pub token: u64,
    pub accepted: bool,
}

/// A whole run, times relative to its start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub clients: u32,
    pub nodes: u32,
    pub end_us: u64,
    pub events: Vec<ClientEvent>,
    pub node_events: Vec<NodeEvent>,
    pub faults: Vec<Fault>,
    /// The fenced store's log of write attempts, in its order.
    pub store_log: Vec<StoreWrite>,
}

impl History {
    /// Rebases every time (including deadlines) on `origin_us`, sorts by time, and sets the end.
    pub fn rebase(&mut self, origin_us: u64, end_us: u64) {
        let rel = |t: u64| t.saturating_sub(origin_us);
        for e in &mut self.events {
            e.at_us = rel(e.at_us);
            match &mut e.op {
                ClientOp::Acquired { deadline_us, .. } | ClientOp::Extended { deadline_us, .. } => {
                    *deadline_us = rel(*deadline_us)
                }
                _ => {}
            }
        }
        for n in &mut self.node_events {
            n.at_us = rel(n.at_us);
        }
        for f in &mut self.faults {
            f.at_us = rel(f.at_us);
        }
        self.events.sort_by_key(|e| e.at_us);
        self.node_events.sort_by_key(|e| e.at_us);
        self.faults.sort_by_key(|e| e.at_us);
        self.end_us = rel(end_us);
    }
}

/// A client event at `at_ms` milliseconds, for hand-made histories in tests.
#[cfg(test)]
pub(crate) fn event_at_ms(at_ms: u64, client: u32, op: ClientOp) -> ClientEvent {
    ClientEvent {
        at_us: at_ms * 1000,
        client,
        op,
    }
}
