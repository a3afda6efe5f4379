//! Prometheus metrics of the engine and the operator: a value (`Metrics`, cheap to clone)
//! that the operator creates, hands to its engine and its controller, and renders at
//! `/metrics`. Nothing is global: an engine made without one (`exec`, the lab, tests) counts
//! into a registry of its own that nobody reads.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    Acquired,
    Contended,
    /// The lock was free, but the step asked for had already been started by a holder.
    AlreadyDone,
    Failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The metrics of one operator (or engine). Clones share the registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Families>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

struct Families {
    registry: Registry,
    reconciles: Counter,
    reconcile_seconds: Histogram,
    reconcile_errors: Family<KindLabel, Counter>,
    redis_requests: Family<OpLabel, Counter>,
    acquisitions: Family<OutcomeLabel, Counter>,
    acquire_seconds: Histogram,
    renewals: Family<ResultLabel, Counter>,
    releases: Counter,
    lease_losses: Counter,
    nodes_reachable: Gauge,
    runs: Family<ResultLabel, Counter>,
    schedule_lag_seconds: Histogram,
}

fn families() -> Families {
    let mut registry = Registry::with_prefix("lockedjob");
    let reconciles = Counter::default();
    registry.register("reconciles", "LockedJob reconciles", reconciles.clone());
    let reconcile_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
    registry.register(
        "reconcile_duration_seconds",
        "Time one reconcile took",
        reconcile_seconds.clone(),
    );
    let reconcile_errors = Family::<KindLabel, Counter>::default();
    registry.register(
        "reconcile_errors",
        "Reconciles that failed, by kind of error",
        reconcile_errors.clone(),
    );
    let redis_requests = Family::<OpLabel, Counter>::default();
    registry.register(
        "redis_requests",
        "Requests sent to Redis nodes (one per node per round), by what they were for",
        redis_requests.clone(),
    );
    let acquisitions = Family::<OutcomeLabel, Counter>::default();
    registry.register(
        "lock_acquisitions",
        "Lock acquisition attempts by outcome",
        acquisitions.clone(),
    );
    let acquire_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
    registry.register(
        "lock_acquire_duration_seconds",
        "Time one acquisition attempt took",
        acquire_seconds.clone(),
    );
    let renewals = Family::<ResultLabel, Counter>::default();
    registry.register(
        "lock_renewals",
        "Lease renewals by result",
        renewals.clone(),
    );
    let releases = Counter::default();
    registry.register("lock_releases", "Lock releases", releases.clone());
    let lease_losses = Counter::default();
    registry.register(
        "lease_losses",
        "Leases lost because no quorum renewed them in time",
        lease_losses.clone(),
    );
    let nodes_reachable = Gauge::default();
    registry.register(
        "redis_nodes_reachable",
        "Redis nodes that answered the last probe",
        nodes_reachable.clone(),
    );
    let runs = Family::<ResultLabel, Counter>::default();
    registry.register("runs", "Job runs by outcome", runs.clone());
    let schedule_lag_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 14));
    registry.register(
        "schedule_lag_seconds",
        "Delay from a run's scheduled time to its Job being created",
        schedule_lag_seconds.clone(),
    );
    Families {
        registry,
        reconciles,
        reconcile_seconds,
        reconcile_errors,
        redis_requests,
        acquisitions,
        acquire_seconds,
        renewals,
        releases,
        lease_losses,
        nodes_reachable,
        runs,
        schedule_lag_seconds,
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(families()),
        }
    }

    pub fn reconciled(&self, took: Duration) {
        self.inner.reconciles.inc();
        self.inner.reconcile_seconds.observe(took.as_secs_f64());
    }

    /// A failed reconcile, by the kind of its error (`controller::Error::kind`).
    pub fn reconcile_failed(&self, kind: &'static str) {
        self.inner
            .reconcile_errors
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    pub fn record_acquire(&self, outcome: Outcome, took: Duration) {
        self.inner
            .acquisitions
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        self.inner.acquire_seconds.observe(took.as_secs_f64());
    }

    pub fn record_renewal(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" }.to_string();
        self.inner
            .renewals
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    pub fn record_release(&self) {
        self.inner.releases.inc();
    }

    pub fn record_lease_lost(&self) {
        self.inner.lease_losses.inc();
    }

    /// `nodes` requests sent for `op` (acquire, fence, extend, progress, release, holder,
    /// probe).
    pub fn record_redis_requests(&self, op: &'static str, nodes: usize) {
        self.inner
            .redis_requests
            .get_or_create(&OpLabel { op: op.to_string() })
            .inc_by(nodes as u64);
    }

    pub fn set_nodes_reachable(&self, nodes: usize) {
        self.inner.nodes_reachable.set(nodes as i64);
    }

    pub fn record_run(&self, result: RunResult) {
        self.inner
            .runs
            .get_or_create(&ResultLabel {
                result: result.label().to_string(),
            })
            .inc();
    }

    pub fn record_schedule_lag(&self, lag: Duration) {
        self.inner.schedule_lag_seconds.observe(lag.as_secs_f64());
    }

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> String {
        self.render_with(&[])
    }

    /// This registry and `others` (a subcommand's own metrics) as one exposition.
    pub fn render_with(&self, others: &[&Registry]) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.inner.registry);
        for registry in others {
            let _ = encode_registry(&mut out, registry);
        }
        let _ = encode_eof(&mut out);
        out
    }
}

/// How a run ended, as `lockedjob_runs_total{result}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunResult {
    Succeeded,
    Failed,
    /// The Job was deleted under the run (by a user, or with its LockedJob).
    Stopped,
    /// Quorum was lost mid-run.
    LockLost,
    /// The lock was won but the API server refused the Job.
    CreateFailed,
}

impl RunResult {
    /// The label value (the README's alerts use these).
    pub fn label(self) -> &'static str {
        match self {
            RunResult::Succeeded => "succeeded",
            RunResult::Failed => "failed",
            RunResult::Stopped => "stopped",
            RunResult::LockLost => "lock_lost",
            RunResult::CreateFailed => "create_failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_metrics_carry_recorded_values_and_registries_are_apart() {
        let metrics = Metrics::new();
        metrics.record_lease_lost();
        metrics.record_acquire(Outcome::Contended, Duration::from_millis(3));
        metrics.reconcile_failed("kube");
        let text = metrics.render();
        assert!(text.contains("lockedjob_lease_losses_total 1"), "{text}");
        assert!(
            text.contains("lockedjob_lock_acquisitions_total{outcome=\"Contended\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("lockedjob_reconcile_errors_total{kind=\"kube\"} 1"),
            "{text}"
        );
        let other = Metrics::new();
        assert!(other.render().contains("lockedjob_lease_losses_total 0"));
    }
}
