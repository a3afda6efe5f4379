//! What a sidecar shows Kubernetes of its pod's leadership (docs/design.md, "Leader election"):
//! the pod condition `lockedjob.dev/leader` (for a readiness gate, so a plain Service routes
//! only to the leader), the label `lockedjob.dev/leader: "true"` (for a leader-only Service),
//! and a `coordination.k8s.io/v1` Lease named after the lock, so `kubectl get lease` shows who
//! leads. These are mirrors: the Redis lock stays the authority, and the workload checks its
//! token, not the label.

use super::ended::{ended_holders, HeldValue};
use futures::StreamExt;
use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;

/// The pod condition a `readinessGate` names.
pub const LEADER_CONDITION: &str = "lockedjob.dev/leader";
/// The label on the leading pod, `"true"`, for a Service that selects only the leader.
pub const LEADER_LABEL: &str = "lockedjob.dev/leader";
/// The annotation naming the lock a pod's leader label is for: a new leader clears the label
/// only on pods of its own election.
pub const LEADER_LOCK_ANNOTATION: &str = "lockedjob.dev/leader-lock";
/// The label on every pod of an election (its lock name as a label value), kept while the pod
/// lives: candidates watch these pods for a leader whose container has terminated.
pub const ELECTION_LABEL: &str = "lockedjob.dev/election";
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
    #[error("the previous leader's pod {pods:?} is still Ready (its kubelet has not yet seen it stop leading); this pod is marked once it is not, so a Service never lists both")]
    PreviousLeaderReady { pods: Vec<String> },
    #[error("an EndpointSlice still lists the previous leader's pod {pods:?} as ready (the EndpointSlice controller has not yet followed its Ready condition); this pod is marked once none does, so a Service never lists both")]
    PreviousLeaderRouted { pods: Vec<String> },
}

/// The pod this sidecar runs in, and the Lease that mirrors the election.
pub struct PodMirror {
    pods: Api<Pod>,
    leases: Api<KubeLease>,
    namespace: String,
    pod: String,
    lock: String,
    lease: String,
    election: String,
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
            election: election_label(lock),
        })
    }

    /// Returns once no EndpointSlice of this namespace lists one of `others` as ready, or fails
    /// after `bound` naming them. The controller updates the slices only after it saw the
    /// pod's Ready condition change, tens of milliseconds later, so a pod that is no longer
    /// Ready may still be routed to. Without the right to list EndpointSlices (RBAC made
    /// before this check) it says which right is missing and lets the pods' Ready do.
    pub async fn until_no_endpoint_of(
        &self,
        others: &[String],
        bound: std::time::Duration,
    ) -> Result<(), MirrorError> {
        let slices: Api<EndpointSlice> =
            Api::namespaced(self.pods.clone().into_client(), &self.namespace);
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let routed = match slices.list(&ListParams::default()).await {
                Ok(list) => routed_pods(&list.items, others),
                Err(e) => match self.error("list", "endpointslices", e) {
                    e @ MirrorError::Forbidden { .. } => {
                        tracing::warn!(error = %e, "cannot check that no Service still routes to the previous leader");
                        return Ok(());
                    }
                    e => return Err(e),
                },
            };
            if routed.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(MirrorError::PreviousLeaderRouted { pods: routed });
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Watches the election's pods (its label) for leaders whose container has terminated.
    /// Checks the right to watch first: without it a watch would only retry in silence.
    pub async fn watch_ended_leaders(&self) -> Result<EndedLeaders, MirrorError> {
        self.check_allowed("watch", "pods").await?;
        let (store, writer) = reflector::store();
        let config =
            watcher::Config::default().labels(&format!("{ELECTION_LABEL}={}", self.election));
        let changed = Arc::new(Notify::new());
        let notify = Arc::clone(&changed);
        let pods = watcher(self.pods.clone(), config)
            .default_backoff()
            // Only the statuses are read.
            .modify(|pod| {
                pod.spec = None;
                pod.metadata.managed_fields = None;
            })
            .reflect(writer)
            .for_each(move |event| {
                match event {
                    Ok(_) => notify.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %e, "watching the election's pods failed; retrying")
                    }
                }
                async {}
            });
        Ok(EndedLeaders {
            store,
            pod: self.pod.clone(),
            lock: self.lock.clone(),
            changed,
            _watch: AbortOnDropHandle::new(tokio::spawn(pods)),
        })
    }

    /// Asks the API server whether this ServiceAccount may `verb` `resource` here.
    async fn check_allowed(
        &self,
        verb: &'static str,
        resource: &'static str,
    ) -> Result<(), MirrorError> {
        let review: SelfSubjectAccessReview = serde_json::from_value(json!({
            "spec": {"resourceAttributes": {"namespace": self.namespace, "verb": verb, "resource": resource}}
        }))
        .unwrap_or_default();
        let reviews: Api<SelfSubjectAccessReview> = Api::all(self.pods.clone().into_client());
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| self.error("create", "selfsubjectaccessreviews", e))?;
        match answer.status {
            Some(status) if status.allowed => Ok(()),
            _ => Err(MirrorError::Forbidden {
                verb,
                resource,
                namespace: self.namespace.clone(),
            }),
        }
    }

    /// This pod does not lead: condition False, label and annotation off. Called before a
    /// campaign, so that what a sidecar killed while leading left on its pod is gone before a
    /// restarted one campaigns, and first of all when stepping down.
    pub async fn not_leading(&self, reason: &str) -> Result<(), MirrorError> {
        self.set_condition(&self.pod, "False", reason).await?;
        self.set_marks(&self.pod, false).await
    }

    /// Before this pod leads: other pods of this election lose their marks (a leader whose
    /// sidecar died without stepping down).
    pub async fn clear_other_leaders(&self) -> Result<(), MirrorError> {
        for stale in self.other_marked_pods().await? {
            tracing::info!(pod = %stale, "clearing the leader marks of a pod that no longer leads");
            self.set_condition(&stale, "False", "AnotherPodLeads")
                .await?;
            self.set_marks(&stale, false).await?;
        }
        Ok(())
    }

    /// This pod leads (after [`PodMirror::clear_other_leaders`]): it gets the label and the
    /// condition, then the Lease names `holder`.
    pub async fn leading(&self, holder: &str, ttl_seconds: i32) -> Result<(), MirrorError> {
        self.set_marks(&self.pod, true).await?;
        self.set_condition(&self.pod, "True", "Elected").await?;
        self.mirror_lease(holder, ttl_seconds).await
    }

    /// The lock was released: the condition's reason says so. The change is what wakes the
    /// candidates watching the election's pods, so the next leader does not wait for its
    /// next attempt.
    pub async fn released(&self) -> Result<(), MirrorError> {
        self.set_condition(&self.pod, "False", "Released").await
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
            "labels": {LEADER_LABEL: label, ELECTION_LABEL: self.election},
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

/// The election's pods, watched: which of them show a leader's container terminated.
pub struct EndedLeaders {
    store: Store<Pod>,
    /// This sidecar's own pod, also one of the election's.
    pod: String,
    lock: String,
    /// Told when an election pod changes: a leader stepped down or was reported terminated.
    changed: Arc<Notify>,
    _watch: AbortOnDropHandle<()>,
}

impl EndedLeaders {
    /// Returns once an election pod has changed since the last call (at once if one did).
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Whether the API shows this sidecar's own pod being deleted (its deletionTimestamp set):
    /// it then leads no more and campaigns no more.
    pub fn self_deleting(&self) -> bool {
        self.store.state().iter().any(|pod| {
            pod.metadata.name.as_deref() == Some(self.pod.as_str())
                && pod.metadata.deletion_timestamp.is_some()
        })
    }

    /// Returns once this sidecar's own pod is being deleted.
    pub async fn until_self_deleting(&self) {
        while !self.self_deleting() {
            self.changed().await;
        }
    }

    /// The election's other pods, by name.
    pub fn others(&self) -> Vec<String> {
        self.store
            .state()
            .iter()
            .filter_map(|pod| pod.metadata.name.clone())
            .filter(|name| *name != self.pod)
            .collect()
    }

    /// Other pods of the election that the API shows Ready: a previous leader whose kubelet
    /// has not yet acted on its cleared condition (a standby is never Ready: its readiness
    /// gate is False).
    pub fn ready_others(&self) -> Vec<String> {
        self.store
            .state()
            .iter()
            .filter(|other| other.metadata.name.as_deref() != Some(self.pod.as_str()))
            .filter(|other| {
                let conditions = other.status.as_ref().and_then(|s| s.conditions.as_ref());
                conditions
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|other| other.metadata.name.clone())
            .collect()
    }

    /// Returns once no other pod of the election is Ready, or fails after `bound` naming them.
    pub async fn until_no_other_ready(
        &self,
        bound: std::time::Duration,
    ) -> Result<(), MirrorError> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let ready = self.ready_others();
            if ready.is_empty() {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, self.changed())
                .await
                .is_err()
            {
                return Err(MirrorError::PreviousLeaderReady { pods: ready });
            }
        }
    }

    /// `(pod, what it held)` of every container instance of the election's pods that the
    /// kubelet reports terminated while it held the lock.
    pub fn values(&self) -> Vec<(String, HeldValue)> {
        self.store
            .state()
            .iter()
            .filter_map(|pod| Some((pod.metadata.name.clone()?, pod.status.as_ref()?)))
            .flat_map(|(name, status)| {
                ended_holders(status, &self.lock)
                    .into_iter()
                    .map(move |held| (name.clone(), held))
            })
            .collect()
    }
}

/// Which of `pods` some slice lists as a ready endpoint.
fn routed_pods(slices: &[EndpointSlice], pods: &[String]) -> Vec<String> {
    let mut routed: Vec<String> = slices
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|target| target.kind.as_deref() == Some("Pod"))
        .filter_map(|target| target.name.clone())
        .filter(|name| pods.contains(name))
        .collect();
    routed.sort();
    routed.dedup();
    routed
}

/// The election's label value: the lock name as a label value (63 characters at most, letters,
/// digits, `-`, `_`, `.`, starting and ending with a letter or digit). Two locks may share one;
/// the lock name in a termination message tells them apart.
pub fn election_label(lock: &str) -> String {
    let body: String = lock
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '-',
        })
        .collect();
    let trimmed = |s: &str| {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string()
    };
    let label = trimmed(&body);
    if !label.is_empty() && label.len() <= 63 {
        return label;
    }
    // Too long (or nothing left): a prefix and a hash of the whole name.
    use std::hash::Hasher;
    let mut hash = fnv::FnvHasher::default();
    hash.write(lock.as_bytes());
    let prefix = trimmed(&label.chars().take(50).collect::<String>());
    trimmed(&format!(
        "{prefix}-{:012x}",
        hash.finish() & 0xffff_ffff_ffff
    ))
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

    /// Only ready endpoints that are pods of the election count, each once.
    #[test]
    fn the_pods_a_slice_routes_to_are_its_ready_pod_endpoints() {
        let endpoint = |name: &str, kind: &str, ready: Option<bool>| {
            json!({"addresses": ["10.0.0.1"], "conditions": {"ready": ready},
                "targetRef": {"kind": kind, "name": name}})
        };
        let slice = |endpoints: Vec<serde_json::Value>| -> EndpointSlice {
            serde_json::from_value(json!({"metadata": {"name": "s"}, "addressType": "IPv4",
                "endpoints": endpoints}))
            .expect("slice")
        };
        let slices = [
            slice(vec![
                endpoint("old", "Pod", Some(true)),
                endpoint("standby", "Pod", Some(false)),
                endpoint("unknown", "Pod", None),
                endpoint("other-app", "Pod", Some(true)),
            ]),
            slice(vec![endpoint("old", "Pod", Some(true))]),
            slice(vec![endpoint("standby", "Node", Some(true))]),
            slice(vec![]),
        ];
        let election = ["old".to_string(), "standby".into(), "unknown".into()];
        assert_eq!(routed_pods(&slices, &election), ["old"]);
        assert!(routed_pods(&slices[2..], &election).is_empty());
    }

    #[test]
    fn election_labels_are_label_values() {
        let long = "x".repeat(80);
        // (lock, label)
        let table = [
            ("demo-writer", "demo-writer".to_string()),
            ("team/Writer 1", "team-Writer-1".to_string()),
            ("-/edge/-", "edge".to_string()),
        ];
        for (lock, expected) in table {
            assert_eq!(election_label(lock), expected, "{lock}");
        }
        for lock in [long.as_str(), "///", ""] {
            let label = election_label(lock);
            assert!(label.len() <= 63 && !label.is_empty(), "{lock}: {label}");
            assert!(
                label.starts_with(|c: char| c.is_ascii_alphanumeric()),
                "{label}"
            );
            assert!(
                label.ends_with(|c: char| c.is_ascii_alphanumeric()),
                "{label}"
            );
        }
        assert_ne!(election_label(&long), election_label(&"x".repeat(81)));
    }

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
