//! Prometheus metrics of the engine and the operator, in one process-wide registry that
//! `/metrics` renders.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::LazyLock;
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

struct Metrics {
    registry: Registry,
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

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix("lockedjob");
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
    Metrics {
        registry,
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
});

pub fn record_acquire(outcome: Outcome, took: Duration) {
    METRICS
        .acquisitions
        .get_or_create(&OutcomeLabel { outcome })
        .inc();
    METRICS.acquire_seconds.observe(took.as_secs_f64());
}

pub fn record_renewal(ok: bool) {
    let result = if ok { "ok" } else { "failed" }.to_string();
    METRICS
        .renewals
        .get_or_create(&ResultLabel { result })
        .inc();
}

pub fn record_release() {
    METRICS.releases.inc();
}

pub fn record_lease_lost() {
    METRICS.lease_losses.inc();
}

/// `nodes` requests sent for `op` (acquire, fence, extend, progress, release, holder, probe).
pub fn record_redis_requests(op: &'static str, nodes: usize) {
    METRICS
        .redis_requests
        .get_or_create(&OpLabel { op: op.to_string() })
        .inc_by(nodes as u64);
}

pub fn set_nodes_reachable(nodes: usize) {
    METRICS.nodes_reachable.set(nodes as i64);
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

pub fn record_run(result: RunResult) {
    METRICS
        .runs
        .get_or_create(&ResultLabel {
            result: result.label().to_string(),
        })
        .inc();
}

pub fn record_schedule_lag(lag: Duration) {
    METRICS.schedule_lag_seconds.observe(lag.as_secs_f64());
}

/// The registry in the Prometheus text format.
pub fn render() -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &METRICS.registry);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn rendered_metrics_carry_recorded_values() {
        super::record_lease_lost();
        super::record_acquire(
            super::Outcome::Contended,
            std::time::Duration::from_millis(3),
        );
        let text = super::render();
        assert!(text.contains("lockedjob_lease_losses_total"), "{text}");
        assert!(
            text.contains("lockedjob_lock_acquisitions_total{outcome=\"Contended\"}"),
            "{text}"
        );
    }
}
