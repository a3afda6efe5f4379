//! The node agent: the one simulated part of the local cluster. It does what a kubelet does
//! that the operator's tests can observe, with local processes instead of containers:
//! - registers a Node (Ready, with capacity) and keeps it alive with a node Lease and status
//!   heartbeats, so the node lifecycle controller never marks it NotReady;
//! - runs each pod the real scheduler binds to it: every container's `command` + `args` as a
//!   process group, with `env`/`envFrom` resolved as a kubelet does; a container without a
//!   command runs the program its image is mapped to (`AgentConfig::images`), as an image's
//!   entrypoint would;
//! - gives each pod an address of its own in 127.0.0.0/8 (reported as its pod IP, probed
//!   there), so several replicas can serve the same port;
//! - lays out the pod's volumes (the service-account token, CA and namespace above all) and
//!   binds them at their mount paths in a private mount namespace (`volumes.rs`), so programs
//!   in pods use in-cluster configuration as they would on a real node;
//! - reports pod status through the status subresource (phase, conditions, container states
//!   with exit codes, restart counts, readiness from probes);
//! - honours deletion: SIGTERM, SIGKILL after the grace period, then removes the pod object;
//! - serves container logs at its kubelet endpoint, so `pods/{name}/log` and `kubectl logs`
//!   work through the real kube-apiserver.
//!
//! Not done: images (programs run from this machine), user and security contexts (processes
//! run as the agent's user), resource limits, network isolation (pods share the host's network
//! namespace; only their addresses differ), token rotation, liveness probes.

mod config;
mod env;
mod logs;
mod pod;
mod shared;
mod volumes;

use crate::Error;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use config::repository_of;
pub use config::AgentConfig;
use config::HOST_IP;
pub use logs::LogIndex;
use shared::Shared;

/// A running agent; `stop` (or dropping it) ends every pod it runs.
pub struct NodeAgent {
    cancel: CancellationToken,
    tasks: TaskTracker,
}

/// How often the node Lease is renewed and the Ready condition's heartbeat refreshed.
const HEARTBEAT: Duration = Duration::from_secs(10);

impl NodeAgent {
    /// Registers the node, starts the log server, the heartbeat and the pod watch.
    pub async fn start(client: kube::Client, config: AgentConfig) -> Result<Self, Error> {
        std::fs::create_dir_all(&config.dir)
            .map_err(|e| Error::io("create the node agent's directory", e))?;
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        let logs = LogIndex::default();
        let port = logs::serve(&config, logs.clone(), cancel.clone(), &tasks).await?;
        register_node(&client, &config, port).await?;
        let shared = Arc::new(Shared {
            client,
            config,
            logs,
        });
        tasks.spawn(heartbeat(Arc::clone(&shared), port, cancel.clone()));
        tasks.spawn(watch_pods(shared, cancel.clone(), tasks.clone()));
        Ok(Self { cancel, tasks })
    }

    /// Stops the watch and every pod (SIGKILL), and waits for them.
    pub async fn stop(&self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn node_status(config: &AgentConfig, port: u16) -> serde_json::Value {
    let now = jiff::Timestamp::now().to_string();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let resources = json!({"cpu": "64", "memory": "256Gi", "pods": "5000",
                           "ephemeral-storage": "500Gi"});
    json!({
        "capacity": resources, "allocatable": resources,
        "conditions": [
            condition("Ready", "True", "KubeletReady", "localcluster node agent is posting ready status"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "enough memory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "enough PIDs"),
        ],
        "addresses": [{"type": "InternalIP", "address": HOST_IP},
                      {"type": "Hostname", "address": config.node_name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {"machineID": "localcluster", "systemUUID": "localcluster",
            "bootID": "localcluster", "kernelVersion": "", "osImage": "local processes",
            "containerRuntimeVersion": "localcluster://0.1.0",
            "kubeletVersion": config.kubelet_version, "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": std::env::consts::ARCH}
    })
}

async fn register_node(
    client: &kube::Client,
    config: &AgentConfig,
    port: u16,
) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": config.node_name, "labels": {
            "kubernetes.io/hostname": config.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "localcluster"}},
        "spec": {}
    }))
    .map_err(|e| Error::Client(e.to_string()))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(Error::Client(format!("register the node: {e}"))),
    }
    nodes
        .patch_status(
            &config.node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": node_status(config, port)})),
        )
        .await
        .map_err(|e| Error::Client(format!("report the node's status: {e}")))?;
    Ok(())
}

/// Renews the node Lease and the node's Ready heartbeat; errors are retried next beat.
async fn heartbeat(shared: Arc<Shared>, port: u16, cancel: CancellationToken) {
    let name = shared.config.node_name.clone();
    let leases: Api<Lease> = Api::namespaced(shared.client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(shared.client.clone());
    loop {
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
            .to_string();
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now}});
        if let Err(e) = leases
            .patch(
                &name,
                &PatchParams::apply("localcluster-node-agent").force(),
                &Patch::Apply(lease),
            )
            .await
        {
            tracing::debug!(error = %e, "node lease not renewed");
        }
        if let Err(e) = nodes
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": node_status(&shared.config, port)})),
            )
            .await
        {
            tracing::debug!(error = %e, "node status not reported");
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(HEARTBEAT) => {}
        }
    }
}

/// A pod this agent has seen bound to it. Finished pods are remembered until the API drops
/// them, so a stale event can never start one again.
enum Entry {
    /// Its task gets every newer version of the object.
    Running(watch::Sender<Pod>),
    Finished {
        final_delete_sent: bool,
    },
}

type Entries = Arc<Mutex<HashMap<String, Entry>>>;

/// Watches the pods bound to this node and keeps one task per running pod.
async fn watch_pods(shared: Arc<Shared>, cancel: CancellationToken, tasks: TaskTracker) {
    let pods: Api<Pod> = Api::all(shared.client.clone());
    let config =
        watcher::Config::default().fields(&format!("spec.nodeName={}", shared.config.node_name));
    let mut events = std::pin::pin!(watcher(pods, config));
    let table: Entries = Arc::default();
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            event = events.next() => event,
        };
        let pod = match event {
            Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => pod,
            Some(Ok(watcher::Event::Delete(pod))) => {
                // Gone from the API: dropping its entry stops its task, if it still runs.
                if let Some(uid) = pod.uid() {
                    if let Ok(mut entries) = table.lock() {
                        entries.remove(&uid);
                    }
                    shared.logs.forget(&uid);
                }
                continue;
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "pod watch error; the watcher retries");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            None => return,
        };
        let Some(uid) = pod.uid() else { continue };
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let start = {
            let Ok(mut entries) = table.lock() else {
                return;
            };
            match entries.get_mut(&uid) {
                Some(Entry::Running(updates)) => {
                    updates.send_replace(pod.clone());
                    false
                }
                Some(Entry::Finished { final_delete_sent }) => {
                    if deleting && !*final_delete_sent {
                        *final_delete_sent = true;
                        tasks.spawn(final_delete(pod_api(&shared, &pod), pod.name_any(), uid));
                    }
                    false
                }
                None if deleting || pod::is_terminal(&pod) => {
                    // Never run here (finished elsewhere, or deleted before it started).
                    if deleting {
                        tasks.spawn(final_delete(
                            pod_api(&shared, &pod),
                            pod.name_any(),
                            uid.clone(),
                        ));
                    }
                    entries.insert(
                        uid,
                        Entry::Finished {
                            final_delete_sent: deleting,
                        },
                    );
                    false
                }
                None => {
                    let (updates, updates_rx) = watch::channel(pod.clone());
                    entries.insert(uid.clone(), Entry::Running(updates));
                    let shared = Arc::clone(&shared);
                    let cancel = cancel.child_token();
                    let table = Arc::clone(&table);
                    let pod = pod.clone();
                    tasks.spawn(async move {
                        let deleted = pod::run(&shared, pod.clone(), updates_rx, cancel).await;
                        if deleted {
                            final_delete(pod_api(&shared, &pod), pod.name_any(), uid.clone()).await;
                        }
                        if let Ok(mut entries) = table.lock() {
                            if let Some(entry) = entries.get_mut(&uid) {
                                *entry = Entry::Finished {
                                    final_delete_sent: deleted,
                                };
                            }
                        }
                    });
                    true
                }
            }
        };
        if start {
            tracing::debug!(pod = %pod.name_any(), "started");
        }
    }
}

fn pod_api(shared: &Shared, pod: &Pod) -> Api<Pod> {
    Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default())
}

/// The kubelet's last word on a deleted pod: delete with grace 0, for this uid only.
async fn final_delete(api: Api<Pod>, name: String, uid: String) {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    if let Err(e) = api.delete(&name, &params).await {
        tracing::debug!(pod = %name, error = %e, "final delete");
    }
}

#[cfg(test)]
mod tests {
    use super::config::{pod_ip, repository_of};
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn image_repositories_drop_tag_and_digest_but_keep_registry_ports() {
        for (image, repository) in [
            ("ghcr.io/org/app:1.2", "ghcr.io/org/app"),
            ("ghcr.io/org/app", "ghcr.io/org/app"),
            ("localhost:5000/app", "localhost:5000/app"),
            ("localhost:5000/app:v1", "localhost:5000/app"),
            ("app@sha256:abc", "app"),
            ("app:1@sha256:abc", "app"),
        ] {
            assert_eq!(repository_of(image), repository, "{image}");
        }
    }

    #[test]
    fn pod_addresses_are_stable_loopback_and_differ_between_pods() {
        let pod = |uid: &str| {
            let mut pod = Pod::default();
            pod.metadata.uid = Some(uid.into());
            pod
        };
        let a = pod_ip(&pod("0b9d2c4e-1111-4a5b-8c9d-000000000001"));
        let b = pod_ip(&pod("0b9d2c4e-1111-4a5b-8c9d-000000000002"));
        assert_eq!(a, pod_ip(&pod("0b9d2c4e-1111-4a5b-8c9d-000000000001")));
        assert_ne!(a, b);
        for ip in [a, b] {
            let parsed: std::net::Ipv4Addr = ip.parse().expect("an IPv4 address");
            assert!(parsed.is_loopback(), "{ip}");
            assert!(parsed.octets()[1] >= 16 && parsed.octets()[3] != 0, "{ip}");
        }
    }
}
