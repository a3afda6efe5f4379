//! The engine's Prometheus metrics: a value (`LockMetrics`, cheap to clone) an engine counts
//! into. Nothing is global: an engine made without one counts into metrics of its own, and a
//! program that serves `/metrics` registers them in its own registry ([`LockMetrics::register`]).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// How one acquisition attempt ended, as `lockedjob_lock_acquisitions_total{outcome}` counts it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    /// A lease was granted.
    Acquired,
    /// Another holder held the lock, or contenders split the vote
    /// ([`LockError::is_contended`](crate::LockError::is_contended)).
    Contended,
    /// The lock was free, but the step asked for had already been started by a holder.
    AlreadyDone,
    /// Any other error: invalid arguments, no quorum, no validity left, a fence conflict.
    Failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeOpLabel {
    node: String,
    op: &'static str,
    result: &'static str,
}

type NodeLatency = Family<NodeOpLabel, Histogram, fn() -> Histogram>;

fn node_latency_buckets() -> Histogram {
    // 0.25 ms to about 4 s: a loopback node answers in well under a millisecond, a request
    // timeout is 50 ms by default, a hung connect takes seconds.
    Histogram::new(exponential_buckets(0.00025, 2.0, 15))
}

/// The engine's metrics. Clones share their values (prometheus-client's metrics are shared
/// handles), so one value can be handed to an engine and registered for `/metrics`.
#[derive(Clone, Debug)]
pub struct LockMetrics {
    redis_requests: Family<OpLabel, Counter>,
    node_latency: NodeLatency,
    acquisitions: Family<OutcomeLabel, Counter>,
    acquire_seconds: Histogram,
    renewals: Family<ResultLabel, Counter>,
    releases: Counter,
    lease_losses: Counter,
    nodes_reachable: Gauge,
    material_reloads: Family<ResultLabel, Counter>,
}

impl Default for LockMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl LockMetrics {
    /// Metrics at zero, registered nowhere yet.
    pub fn new() -> Self {
        Self {
            redis_requests: Family::default(),
            node_latency: Family::new_with_constructor(node_latency_buckets),
            acquisitions: Family::default(),
            acquire_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            renewals: Family::default(),
            releases: Counter::default(),
            lease_losses: Counter::default(),
            nodes_reachable: Gauge::default(),
            material_reloads: Family::default(),
        }
    }

    /// Adds these metrics to `registry` (names as the alerts of docs/operations.md use them,
    /// under the registry's prefix: `lockedjob_` in the operator).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "redis_requests",
            "Requests sent to Redis nodes (one per node per round), by what they were for",
            self.redis_requests.clone(),
        );
        registry.register(
            "redis_request_duration_seconds",
            "Time from sending a request to one node to its answer or its failure, by node, by what it was for (extend: renewals) and by result (ok, or the failure's kind)",
            self.node_latency.clone(),
        );
        registry.register(
            "lock_acquisitions",
            "Lock acquisition attempts by outcome",
            self.acquisitions.clone(),
        );
        registry.register(
            "lock_acquire_duration_seconds",
            "Time one acquisition attempt took",
            self.acquire_seconds.clone(),
        );
        registry.register(
            "lock_renewals",
            "Lease renewals by result",
            self.renewals.clone(),
        );
        registry.register("lock_releases", "Lock releases", self.releases.clone());
        registry.register(
            "lease_losses",
            "Leases lost because no quorum renewed them in time",
            self.lease_losses.clone(),
        );
        registry.register(
            "redis_nodes_reachable",
            "Redis nodes that answered the last probe",
            self.nodes_reachable.clone(),
        );
        registry.register(
            "redis_credential_reloads",
            "Changes seen in the TLS or password files, by result: applied (new connections use them) or refused (unusable; the old ones stay in use)",
            self.material_reloads.clone(),
        );
    }

    /// These metrics alone, in the Prometheus text format, with the prefix `lockedjob`.
    pub fn render(&self) -> String {
        use prometheus_client::encoding::text::encode;
        let mut registry = Registry::with_prefix("lockedjob");
        self.register(&mut registry);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }

    /// Counts one acquisition attempt by its outcome, and the time it took.
    pub fn record_acquire(&self, outcome: Outcome, took: Duration) {
        self.acquisitions
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        self.acquire_seconds.observe(took.as_secs_f64());
    }

    /// Counts one lease renewal, as `ok` or `failed`.
    pub fn record_renewal(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.renewals.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts one release.
    pub fn record_release(&self) {
        self.releases.inc();
    }

    /// Counts one lease lost because no quorum renewed it in time.
    pub fn record_lease_lost(&self) {
        self.lease_losses.inc();
    }

    /// `nodes` requests sent for `op` (acquire, fence, extend, progress, release, holder,
    /// probe).
    pub fn record_redis_requests(&self, op: &'static str, nodes: usize) {
        self.redis_requests
            .get_or_create(&OpLabel { op })
            .inc_by(nodes as u64);
    }

    /// One node's answer (or failure, `result` naming its kind) to a request for `op`, after
    /// `took`.
    pub fn record_node_request(
        &self,
        node: &str,
        op: &'static str,
        result: &'static str,
        took: Duration,
    ) {
        self.node_latency
            .get_or_create(&NodeOpLabel {
                node: node.to_string(),
                op,
                result,
            })
            .observe(took.as_secs_f64());
    }

    /// Counts one change seen in the TLS or password files, as `applied` (new connections use
    /// them) or `refused` (unusable; the ones read before stay in use).
    pub fn record_material_reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.material_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Sets how many nodes answered the last probe.
    pub fn set_nodes_reachable(&self, nodes: usize) {
        self.nodes_reachable.set(nodes as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_metrics_carry_recorded_values_and_clones_share_them() {
        let metrics = LockMetrics::new();
        metrics.clone().record_lease_lost();
        metrics.record_acquire(Outcome::Contended, Duration::from_millis(3));
        metrics.record_redis_requests("acquire", 5);
        metrics.record_node_request("redis://n1:6379", "extend", "ok", Duration::from_millis(2));
        let text = metrics.render();
        assert!(text.contains("lockedjob_lease_losses_total 1"), "{text}");
        assert!(
            text.contains("lockedjob_lock_acquisitions_total{outcome=\"Contended\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("lockedjob_redis_requests_total{op=\"acquire\"} 5"),
            "{text}"
        );
        assert!(
            text.contains(r#"lockedjob_redis_request_duration_seconds_bucket{le="0.004",node="redis://n1:6379",op="extend",result="ok"} 1"#),
            "{text}"
        );
        let other = LockMetrics::new();
        assert!(other.render().contains("lockedjob_lease_losses_total 0"));
    }
}
