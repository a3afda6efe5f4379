//! What a sidecar shows Kubernetes of its pod's leadership (docs/design.md, "Leader election"):
//! the pod condition `lockedjob.dev/leader` (for a readiness gate, so a plain Service routes
//! only to the leader), the label `lockedjob.dev/leader: "true"` (for a leader-only Service),
//! and a `coordination.k8s.io/v1` Lease named after the lock, so `kubectl get lease` shows who
//! leads. These are mirrors: the Redis lock stays the authority, and the workload checks its
//! token, not the label.

use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

/// The pod condition a `readinessGate` names.
pub const LEADER_CONDITION: &str = "lockedjob.dev/leader";
/// The label on the leading pod, `"true"`, for a Service that selects only the leader.
pub const LEADER_LABEL: &str = "lockedjob.dev/leader";
/// The annotation naming the lock a pod's leader label is for: a new leader clears the label
/// only on pods of its own election.
pub const LEADER_LOCK_ANNOTATION: &str = "lockedjob.dev/leader-lock";
const FIELD_MANAGER: &str = "lockedjob-elect";

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("cannot {verb} {resource} in namespace {namespace}: forbidden; grant the sidecar's ServiceAccount `{verb}` on `{resource}` there (the chart's `leaderElection.namespaces` value does)")]
    Forbidden {
        verb: &'static str,
        resource: &'static str,
        namespace: String,
    },
    #[error("cannot {verb} {resource} in namespace {namespace}: {source}")]
    Api {
        verb: &'static str,
        resource: &'static str,
        namespace: String,
        source: kube::Error,
    },
    #[error("no Kubernetes client (in-cluster configuration or KUBECONFIG): {0}")]
    Client(String),
}

/// The pod this sidecar runs in, and the Lease that mirrors the election.
pub struct PodMirror {
    pods: Api<Pod>,
    leases: Api<KubeLease>,
    namespace: String,
    pod: String,
    lock: String,
    lease: String,
}

impl PodMirror {
    pub async fn connect(namespace: &str, pod: &str, lock: &str) -> Result<Self, MirrorError> {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| MirrorError::Client(e.to_string()))?;
        Ok(Self {
            pods: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            lock: lock.to_string(),
            lease: lease_name(lock),
        })
    }

    /// This pod does not lead: condition False, label and annotation off. Called before a
    /// campaign, so that what a sidecar killed while leading left on its pod is gone before a
    /// restarted one campaigns, and first of all when stepping down.
    pub async fn not_leading(&self, reason: &str) -> Result<(), MirrorError> {
        self.set_condition(&self.pod, "False", reason).await?;
        self.set_marks(&self.pod, false).await
    }

    /// This pod leads: other pods of this election lose their marks first (a leader whose
    /// sidecar died without stepping down), then this pod gets the label and the condition,
    /// then the Lease names `holder`.
    pub async fn leading(&self, holder: &str, ttl_seconds: i32) -> Result<(), MirrorError> {
        for stale in self.other_marked_pods().await? {
            tracing::info!(pod = %stale, "clearing the leader marks of a pod that no longer leads");
            self.set_condition(&stale, "False", "AnotherPodLeads")
                .await?;
            self.set_marks(&stale, false).await?;
        }
        self.set_marks(&self.pod, true).await?;
        self.set_condition(&self.pod, "True", "Elected").await?;
        self.mirror_lease(holder, ttl_seconds).await
    }

    /// The Lease's renew time, after each renewal.
    pub async fn renewed(&self, holder: &str, ttl_seconds: i32) -> Result<(), MirrorError> {
        self.mirror_lease(holder, ttl_seconds).await
    }

    async fn set_condition(
        &self,
        pod: &str,
        status: &str,
        reason: &str,
    ) -> Result<(), MirrorError> {
        let message = match status {
            "True" => format!("this pod holds lock {}", self.lock),
            _ => format!("this pod does not hold lock {}", self.lock),
        };
        // A strategic merge patch merges pod conditions by type: the kubelet's stay.
        let patch = json!({"status": {"conditions": [{
            "type": LEADER_CONDITION,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_rfc3339(),
        }]}});
        self.pods
            .patch_status(pod, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map_err(|e| self.error("patch", "pods/status", e))?;
        Ok(())
    }

    async fn set_marks(&self, pod: &str, leading: bool) -> Result<(), MirrorError> {
        let (label, lock) = if leading {
            (json!("true"), json!(self.lock))
        } else {
            (serde_json::Value::Null, serde_json::Value::Null)
        };
        let patch = json!({"metadata": {
            "labels": {LEADER_LABEL: label},
            "annotations": {LEADER_LOCK_ANNOTATION: lock},
        }});
        self.pods
            .patch(pod, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| self.error("patch", "pods", e))?;
        Ok(())
    }

    async fn other_marked_pods(&self) -> Result<Vec<String>, MirrorError> {
        let marked = self
            .pods
            .list_metadata(&ListParams::default().labels(&format!("{LEADER_LABEL}=true")))
            .await
            .map_err(|e| self.error("list", "pods", e))?;
        Ok(marked
            .items
            .into_iter()
            .filter(|pod| {
                let annotations = pod.metadata.annotations.as_ref();
                annotations.and_then(|a| a.get(LEADER_LOCK_ANNOTATION)) == Some(&self.lock)
            })
            .filter_map(|pod| pod.metadata.name)
            .filter(|name| *name != self.pod)
            .collect())
    }

    /// Writes the Lease as the leader sees it; `leaseTransitions` grows when the holder changes.
    async fn mirror_lease(&self, holder: &str, ttl_seconds: i32) -> Result<(), MirrorError> {
        let current = self
            .leases
            .get_opt(&self.lease)
            .await
            .map_err(|e| self.error("get", "leases", e))?
            .and_then(|lease| lease.spec);
        let now = now_rfc3339();
        let (acquired, transitions) = match &current {
            Some(spec) if spec.holder_identity.as_deref() == Some(holder) => (
                spec.acquire_time
                    .as_ref()
                    .map(|t| json!(t))
                    .unwrap_or(json!(now)),
                spec.lease_transitions.unwrap_or(0),
            ),
            Some(spec) => (json!(now), spec.lease_transitions.unwrap_or(0) + 1),
            None => (json!(now), 0),
        };
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.lease, "labels": {"app.kubernetes.io/managed-by": "lockedjob"}},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": ttl_seconds,
                "acquireTime": acquired,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        });
        self.leases
            .patch(
                &self.lease,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(lease),
            )
            .await
            .map_err(|e| self.error("patch", "leases", e))?;
        Ok(())
    }

    fn error(
        &self,
        verb: &'static str,
        resource: &'static str,
        source: kube::Error,
    ) -> MirrorError {
        let namespace = self.namespace.clone();
        match &source {
            kube::Error::Api(status) if status.code == 403 => MirrorError::Forbidden {
                verb,
                resource,
                namespace,
            },
            _ => MirrorError::Api {
                verb,
                resource,
                namespace,
                source,
            },
        }
    }
}

/// The Lease's name: the lock name as a DNS subdomain (lowercase; anything else becomes `-`),
/// prefixed so that it cannot clash with another component's Lease.
pub fn lease_name(lock: &str) -> String {
    let body: String = lock
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
            _ => '-',
        })
        .collect();
    let name = format!("lockedjob-{}", body.trim_matches(|c| c == '-' || c == '.'));
    name.chars()
        .take(253)
        .collect::<String>()
        .trim_end_matches(['-', '.'])
        .to_string()
}

/// Now, as Kubernetes' MicroTime wants it (RFC 3339 with microseconds).
fn now_rfc3339() -> String {
    let now = jiff::Timestamp::now();
    let micros = now.subsec_microsecond();
    let seconds = jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    format!("{}.{micros:06}Z", seconds.strftime("%Y-%m-%dT%H:%M:%S"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_dns_subdomains() {
        let table = [
            ("billing-writer", "lockedjob-billing-writer"),
            ("Team/Billing Writer", "lockedjob-team-billing-writer"),
            ("ns/name", "lockedjob-ns-name"),
            ("-x-", "lockedjob-x"),
        ];
        for (lock, name) in table {
            assert_eq!(lease_name(lock), name, "{lock}");
        }
        assert!(lease_name(&"a".repeat(400)).len() <= 253);
    }

    #[test]
    fn micro_times_have_six_fraction_digits() {
        let text = now_rfc3339();
        let (_, fraction) = text.rsplit_once('.').expect("a fraction");
        assert_eq!(fraction.len(), 7, "{text}");
        assert!(text.parse::<jiff::Timestamp>().is_ok(), "{text}");
    }
}
