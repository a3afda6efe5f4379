//! Prometheus metrics of the operator: a value (`Metrics`, cheap to clone) that the operator
//! creates, hands to its controller (and the engine's part, [`Metrics::lock`], to its engine),
//! and renders at `/metrics`. Nothing is global: an engine made without one (`exec`, the lab,
//! tests) counts into metrics of its own that nobody reads.

use crate::redlock::LockMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The metrics of one operator. Clones share the registry.
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
    lock: LockMetrics,
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
    let lock = LockMetrics::new();
    lock.register(&mut registry);
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
        lock,
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

    /// The engine's part, for `Redlock::with_metrics`: what it counts shows at `/metrics`.
    pub fn lock(&self) -> &LockMetrics {
        &self.inner.lock
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
    /// The label value (the alerts of docs/operations.md use these).
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
        metrics.lock().record_lease_lost();
        metrics.reconcile_failed("kube");
        let text = metrics.render();
        assert!(text.contains("lockedjob_lease_losses_total 1"), "{text}");
        assert!(
            text.contains("lockedjob_reconcile_errors_total{kind=\"kube\"} 1"),
            "{text}"
        );
        let other = Metrics::new();
        assert!(other.render().contains("lockedjob_lease_losses_total 0"));
    }
}
