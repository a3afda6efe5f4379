//! The real node's acceptance (issue 30): a kubelet with containerd and runc that registers
//! with the containerd runtime, runs an image built here and serves its logs through
//! kube-apiserver, enforces memory limits (OOMKilled), and gives pods cluster DNS and Services
//! through kube-proxy, across its two nodes; nothing a pod sends leaves the machine. Needs root.

mod common;

use common::namespace;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, LogParams, PostParams};
use localcluster::Options;
use serde_json::json;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(90);

async fn cluster() -> localcluster::Shared {
    tokio::task::spawn_blocking(|| {
        localcluster::shared_with("real-node", || Options {
            nodes: 2,
            ..Options::named("real")
        })
    })
    .await
    .expect("join")
    .expect("start a cluster with a real node")
}

const NODES: [&str; 2] = ["real-node", "real-node-1"];

/// Creates a pod of busybox running `script`; `extra` goes into the container, except
/// `nodeName`, which goes into the pod.
async fn run_pod(pods: &Api<Pod>, name: &str, script: &str, mut extra: serde_json::Value) -> Pod {
    let node = extra.as_object_mut().and_then(|e| e.remove("nodeName"));
    let mut container = json!({
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sh", "-c", script],
    });
    if let (Some(c), Some(e)) = (container.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    let mut spec = json!({"restartPolicy": "Never", "containers": [container]});
    if let Some(node) = node {
        spec["nodeName"] = node;
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": spec,
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod")
}

/// Waits until the pod's container has terminated; returns its terminated state.
async fn terminated(
    pods: &Api<Pod>,
    name: &str,
) -> k8s_openapi::api::core::v1::ContainerStateTerminated {
    let deadline = Instant::now() + WAIT;
    loop {
        let pod = pods.get(name).await.expect("get pod");
        let state = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone());
        if let Some(terminated) = state {
            return terminated;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} did not terminate: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn logs(pods: &Api<Pod>, name: &str) -> String {
    pods.logs(name, &LogParams::default())
        .await
        .expect("pods/log through kube-apiserver")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn the_node_runs_containerd_and_a_pod_logs_through_the_api_server() {
    let cluster = &cluster().await;
    let client = cluster.client().await.expect("client");
    let node = Api::<Node>::all(client.clone())
        .get(&format!("{}-node", cluster.name()))
        .await
        .expect("the kubelet registered its node");
    let runtime = node
        .status
        .and_then(|s| s.node_info)
        .map(|i| i.container_runtime_version)
        .unwrap_or_default();
    assert!(runtime.starts_with("containerd://"), "runtime: {runtime:?}");

    let ns = namespace(&client, "hello").await;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    run_pod(
        &pods,
        "hello",
        "echo hello from $(hostname) as $(id -u)",
        json!({}),
    )
    .await;
    let end = terminated(&pods, "hello").await;
    assert_eq!(end.exit_code, 0, "{end:?}");
    assert_eq!(logs(&pods, "hello").await.trim(), "hello from hello as 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn a_pod_over_its_memory_limit_is_oom_killed() {
    let cluster = &cluster().await;
    let client = cluster.client().await.expect("client");
    let ns = namespace(&client, "oom").await;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    // `tail` holds the whole stream in memory: 200 MiB against a 32 MiB limit.
    let limits = json!({"resources": {"limits": {"memory": "32Mi"}}});
    run_pod(
        &pods,
        "hog",
        "head -c 200m /dev/zero | tail > /dev/null",
        limits,
    )
    .await;
    let end = terminated(&pods, "hog").await;
    assert_eq!(end.reason.as_deref(), Some("OOMKilled"), "{end:?}");
    // The same pod under a limit it fits in completes: the limit, not the image, killed it.
    let fits = json!({"resources": {"limits": {"memory": "32Mi"}}});
    run_pod(
        &pods,
        "small",
        "head -c 1m /dev/zero | tail > /dev/null",
        fits,
    )
    .await;
    assert_eq!(terminated(&pods, "small").await.exit_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn a_service_name_resolves_and_routes_to_its_endpoints_on_every_node() {
    let cluster = &cluster().await;
    let client = cluster.client().await.expect("client");
    let ns = namespace(&client, "svc").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let serve = "mkdir -p /tmp/www && echo served-by-$(hostname) > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www";
    for (i, node) in NODES.iter().enumerate() {
        let ready = json!({
            "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
            "nodeName": node,
        });
        run_pod(&pods, &format!("web-{i}"), serve, ready).await;
    }
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client, &ns);
    for i in 0..NODES.len() {
        let service = json!({
            "metadata": {"name": format!("web-{i}")},
            "spec": {"selector": {"app": format!("web-{i}")}, "ports": [{"port": 80, "targetPort": 8080}]},
        });
        services
            .create(
                &PostParams::default(),
                &serde_json::from_value(service).expect("service"),
            )
            .await
            .expect("create service");
    }
    // From each node to the server on each node, by name. Retries while the endpoints and
    // kube-proxy's rules catch up with the pod's readiness (no `-T`: Debian's static busybox
    // wget crashes with it).
    let fetch = (0..NODES.len())
        .map(|i| {
            format!("until wget -qO- http://web-{i}.{ns}.svc.cluster.local/ 2>/dev/null; do sleep 1; done")
        })
        .collect::<Vec<_>>()
        .join("; ");
    for (i, node) in NODES.iter().enumerate() {
        let name = format!("client-{i}");
        run_pod(&pods, &name, &fetch, json!({"nodeName": node})).await;
        let end = terminated(&pods, &name).await;
        assert_eq!(end.exit_code, 0, "{name}: {}", logs(&pods, &name).await);
        assert_eq!(
            logs(&pods, &name).await.lines().collect::<Vec<_>>(),
            ["served-by-web-0", "served-by-web-1"],
            "{name} on {node}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn nothing_a_pod_sends_leaves_the_machine() {
    let cluster = &cluster().await;
    let client = cluster.client().await.expect("client");
    let ns = namespace(&client, "egress").await;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    // A documentation address (TEST-NET-3): with a route off the node, the connection would
    // time out instead of failing at once.
    run_pod(
        &pods,
        "out",
        "nc -w 3 203.0.113.1 80 </dev/null 2>&1; echo exit=$?",
        json!({}),
    )
    .await;
    terminated(&pods, "out").await;
    let text = logs(&pods, "out").await;
    assert!(
        text.contains("Network is unreachable") && text.contains("exit=1"),
        "{text}"
    );
}
