//! The sidecar's own metrics, beside the engine's (`lockedjob_lock_*`, `lockedjob_lease_losses`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub(super) struct ElectionMetrics {
    pub registry: Registry,
    leader: Gauge,
    token: Gauge,
    elections: Counter,
    step_downs: Counter,
    handovers: Counter,
    leaderless: Counter<f64, AtomicU64>,
}

impl ElectionMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lockedjob");
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this candidate leads, else 0",
            leader.clone(),
        );
        let token = Gauge::default();
        registry.register(
            "leader_token",
            "The fencing token of this candidate's current leadership (0 while it does not lead)",
            token.clone(),
        );
        let elections = Counter::default();
        registry.register(
            "leader_elections",
            "Times this candidate was elected",
            elections.clone(),
        );
        let step_downs = Counter::default();
        registry.register(
            "leader_step_downs",
            "Times this candidate stepped down because its lease could not be renewed",
            step_downs.clone(),
        );
        let handovers = Counter::default();
        registry.register(
            "leader_handovers",
            "Times this candidate handed leadership over to a candidate of higher priority",
            handovers.clone(),
        );
        let leaderless = Counter::<f64, AtomicU64>::default();
        registry.register(
            "leaderless_seconds",
            "Seconds this candidate, campaigning, found no leader: no Redis quorum answered, the vote split, or it won the free lock and gave it back to a preferred candidate (a leader that died unseen counts as a leader until its lease expires)",
            leaderless.clone(),
        );
        Self {
            registry,
            leader,
            token,
            elections,
            step_downs,
            handovers,
            leaderless,
        }
    }

    pub fn saw_no_leader_for(&self, span: Duration) {
        self.leaderless.inc_by(span.as_secs_f64());
    }

    pub fn elected(&self, token: u64) {
        self.elections.inc();
        self.leader.set(1);
        self.token.set(i64::try_from(token).unwrap_or(i64::MAX));
    }

    /// Leadership ended; `lost` when the lease could not be renewed, `handed_over` when a
    /// candidate of higher priority asked for it (neither: a requested stop).
    pub fn stepped_down(&self, lost: bool, handed_over: bool) {
        if lost {
            self.step_downs.inc();
        }
        if handed_over {
            self.handovers.inc();
        }
        self.leader.set(0);
        self.token.set(0);
    }
}
