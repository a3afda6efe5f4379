//! Restarts the chart's lock nodes one at a time after their pod template changed.
//!
//! Each lock node is a StatefulSet of one replica, so Kubernetes' own rolling update cannot
//! order them: an upgrade that changed their template (image, settings, a `rollout restart`)
//! restarted all of them at once, and with the restart delay the quorum was gone for that long
//! (every run's watchdog stopped its work, no lock could be had). The chart sets `OnDelete` and
//! names the StatefulSets here; a replica deletes an outdated pod only when every lock node is
//! ready, so a roll never takes more than one node out (docs/design.md, "Rolling the lock
//! nodes").

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A lock node's StatefulSet, as `namespace/name` on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSet {
    pub namespace: String,
    pub name: String,
}

impl std::str::FromStr for NodeSet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => Ok(Self {
                namespace: namespace.to_string(),
                name: name.to_string(),
            }),
            _ => Err(format!(
                "{s:?} is not NAMESPACE/STATEFULSET (e.g. lockedjob/locks-redis-0)"
            )),
        }
    }
}

/// What one read of a lock node showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub namespace: String,
    pub set: String,
    /// The StatefulSet controller has seen the latest spec, so its update revision is current.
    pub synced: bool,
    pub update_revision: Option<String>,
    /// `OnDelete`: the operator restarts its pod. A StatefulSet that kept Kubernetes' rolling
    /// update (one made by an older chart) is left to it, but still counts for readiness.
    pub on_delete: bool,
    pub pod: Option<PodView>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    pub revision: Option<String>,
    pub ready: bool,
    pub terminating: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Every node runs the current template.
    Idle,
    /// Not now: why.
    Wait(String),
    /// Delete this pod (this uid only) so that its StatefulSet recreates it from the template.
    Restart {
        namespace: String,
        pod: String,
        uid: String,
    },
}

/// The next step of a roll: restart the first outdated pod, only while every node is ready.
pub fn next_step(nodes: &[NodeView]) -> Step {
    for node in nodes {
        if !node.synced {
            return Step::Wait(format!("StatefulSet {} has a spec not yet seen", node.set));
        }
        match &node.pod {
            None => return Step::Wait(format!("StatefulSet {} has no pod", node.set)),
            Some(pod) if pod.terminating || !pod.ready => {
                return Step::Wait(format!("lock node {} is not ready", pod.name));
            }
            Some(_) => {}
        }
    }
    let outdated = nodes.iter().filter(|node| node.on_delete).find_map(|node| {
        let pod = node.pod.as_ref()?;
        (node.update_revision.is_some() && pod.revision != node.update_revision).then(|| {
            Step::Restart {
                namespace: node.namespace.clone(),
                pod: pod.name.clone(),
                uid: pod.uid.clone(),
            }
        })
    });
    outdated.unwrap_or(Step::Idle)
}

/// How often the lock nodes are read; a roll moves on at most this long after a node is ready.
const PERIOD: Duration = Duration::from_secs(5);

/// Rolls `sets` until `shutdown`. Every replica runs it: each acts only on a fresh read, and the
/// pod it picks is the same for all (the first outdated one), deleted by uid, so two replicas
/// at once delete the same pod, never two pods.
pub async fn roll_lock_nodes(client: Client, sets: Vec<NodeSet>, shutdown: CancellationToken) {
    if sets.is_empty() {
        return;
    }
    let mut last_wait = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(PERIOD) => {}
        }
        let nodes = match observe(&client, &sets).await {
            Ok(nodes) => nodes,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the lock nodes' StatefulSets and pods; retrying");
                continue;
            }
        };
        let step = next_step(&nodes);
        if let (Step::Wait(why), true) = (&step, pending(&nodes)) {
            if last_wait.as_ref() != Some(why) {
                tracing::info!(reason = %why, "lock node roll waiting");
            }
        }
        last_wait = match &step {
            Step::Wait(why) => Some(why.clone()),
            _ => None,
        };
        if let Step::Restart {
            namespace,
            pod,
            uid,
        } = step
        {
            restart(&client, &namespace, &pod, uid).await;
        }
    }
}

/// Some node still runs an older template (a wait is worth a log line only then).
fn pending(nodes: &[NodeView]) -> bool {
    nodes
        .iter()
        .filter(|node| node.on_delete)
        .any(|node| match &node.pod {
            Some(pod) => pod.revision != node.update_revision,
            None => true,
        })
}

async fn restart(client: &Client, namespace: &str, pod: &str, uid: String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods.delete(pod, &params).await {
        Ok(_) => {
            tracing::info!(
                namespace,
                pod,
                "lock node restarted for its new pod template (every lock node was ready)"
            )
        }
        Err(e) => {
            tracing::warn!(namespace, pod, error = %e, "cannot restart the lock node; retrying at the next read")
        }
    }
}

/// A single-replica StatefulSet's pod.
fn pod_name(set: &str) -> String {
    format!("{set}-0")
}

async fn observe(client: &Client, sets: &[NodeSet]) -> Result<Vec<NodeView>, kube::Error> {
    let mut nodes = Vec::with_capacity(sets.len());
    for set in sets {
        let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &set.namespace);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &set.namespace);
        let statefulset = statefulsets.get(&set.name).await?;
        let pod = pods.get_opt(&pod_name(&set.name)).await?;
        nodes.push(view(set, &statefulset, pod.as_ref()));
    }
    Ok(nodes)
}

fn view(set: &NodeSet, statefulset: &StatefulSet, pod: Option<&Pod>) -> NodeView {
    let status = statefulset.status.as_ref();
    let observed = status.and_then(|s| s.observed_generation);
    NodeView {
        namespace: set.namespace.clone(),
        set: set.name.clone(),
        synced: observed.is_some() && observed >= statefulset.metadata.generation,
        update_revision: status.and_then(|s| s.update_revision.clone()),
        on_delete: statefulset
            .spec
            .update_strategy
            .as_ref()
            .and_then(|strategy| strategy.type_.as_deref())
            == Some("OnDelete"),
        pod: pod.map(pod_view),
    }
}

fn pod_view(pod: &Pod) -> PodView {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
    PodView {
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        revision: pod
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get("controller-revision-hash").cloned()),
        ready,
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: usize, update: &str, pod: Option<(&str, bool, bool)>) -> NodeView {
        NodeView {
            namespace: "lockedjob".into(),
            set: format!("locks-redis-{i}"),
            synced: true,
            update_revision: Some(update.to_string()),
            on_delete: true,
            pod: pod.map(|(revision, ready, terminating)| PodView {
                name: format!("locks-redis-{i}-0"),
                uid: format!("uid-{i}"),
                revision: Some(revision.to_string()),
                ready,
                terminating,
            }),
        }
    }

    fn restart(i: usize) -> Step {
        Step::Restart {
            namespace: "lockedjob".into(),
            pod: format!("locks-redis-{i}-0"),
            uid: format!("uid-{i}"),
        }
    }

    #[test]
    fn restarts_one_outdated_node_only_while_every_node_is_ready() {
        let ready_new = Some(("new", true, false));
        let ready_old = Some(("old", true, false));
        let cases: Vec<(&str, Vec<NodeView>, Step)> = vec![
            (
                "all current",
                vec![node(0, "new", ready_new), node(1, "new", ready_new)],
                Step::Idle,
            ),
            (
                "the first outdated one",
                vec![
                    node(0, "new", ready_new),
                    node(1, "new", ready_old),
                    node(2, "new", ready_old),
                ],
                restart(1),
            ),
            (
                "a restarted node still in its restart delay",
                vec![
                    node(0, "new", Some(("new", false, false))),
                    node(1, "new", ready_old),
                ],
                Step::Wait("lock node locks-redis-0-0 is not ready".into()),
            ),
            (
                "a node being deleted",
                vec![
                    node(0, "new", Some(("old", true, true))),
                    node(1, "new", ready_old),
                ],
                Step::Wait("lock node locks-redis-0-0 is not ready".into()),
            ),
            (
                "a node whose pod is gone (down for another reason)",
                vec![node(0, "new", ready_old), node(1, "new", None)],
                Step::Wait("StatefulSet locks-redis-1 has no pod".into()),
            ),
        ];
        for (case, nodes, expected) in cases {
            assert_eq!(next_step(&nodes), expected, "{case}");
        }
    }

    #[test]
    fn leaves_a_node_on_kubernetes_rolling_update_to_kubernetes() {
        let mut rolling = node(0, "new", Some(("old", true, false)));
        rolling.on_delete = false;
        let nodes = vec![rolling, node(1, "new", Some(("old", true, false)))];
        assert_eq!(next_step(&nodes), restart(1));
        let mut down = node(1, "new", Some(("new", false, false)));
        down.on_delete = false;
        let nodes = vec![node(0, "new", Some(("old", true, false))), down];
        assert_eq!(
            next_step(&nodes),
            Step::Wait("lock node locks-redis-1-0 is not ready".into()),
            "a node down under Kubernetes' rolling update still holds the roll"
        );
    }

    #[test]
    fn waits_for_the_statefulset_controller_to_see_the_new_spec() {
        let mut stale = node(0, "old", Some(("old", true, false)));
        stale.synced = false;
        let nodes = vec![stale, node(1, "new", Some(("old", true, false)))];
        assert_eq!(
            next_step(&nodes),
            Step::Wait("StatefulSet locks-redis-0 has a spec not yet seen".into())
        );
    }

    #[test]
    fn node_sets_are_namespace_slash_name() {
        assert_eq!(
            "lockedjob/locks-redis-0".parse::<NodeSet>(),
            Ok(NodeSet {
                namespace: "lockedjob".into(),
                name: "locks-redis-0".into()
            })
        );
        for bad in ["locks-redis-0", "/locks-redis-0", "lockedjob/"] {
            assert!(bad.parse::<NodeSet>().is_err(), "{bad}");
        }
    }
}
