//! The local cluster's acceptance: the pinned version, the built-in APIs, and a Job whose pod
//! the real Job controller creates, the real scheduler binds, the real node runs, and whose
//! output is read through kube-apiserver's `pods/log`; deletion with a grace period; an
//! environment resolved from a Secret, a ConfigMap and the pod's fields; restarts. Needs root.

mod common;

use common::namespace;
use futures::TryStreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube::ResourceExt;
use localcluster::LocalCluster;
use serde_json::json;
use std::future::Future;
use std::process::Command;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    check().await
}

async fn cluster() -> localcluster::Shared {
    tokio::task::spawn_blocking(|| localcluster::shared("acceptance"))
        .await
        .expect("join")
        .expect("start the local cluster")
}

fn kubectl(cluster: &LocalCluster, args: &[&str]) -> String {
    let bin = localcluster::Binaries::locate().expect("binaries");
    let out = Command::new(bin.path("kubectl"))
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn serves_the_pinned_version_and_the_builtin_apis() {
    let cluster = &cluster().await;
    let pinned = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/k8s-versions.env"),
    )
    .expect("versions file");
    let pinned = pinned
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
        .expect("KUBERNETES_VERSION");
    assert_eq!(cluster.version(), pinned);
    let version = kubectl(cluster, &["version", "-o", "json"]);
    let version: serde_json::Value = serde_json::from_str(&version).expect("json");
    assert_eq!(version["serverVersion"]["gitVersion"], pinned);
    let resources = kubectl(cluster, &["api-resources", "-o", "name"]);
    for expected in [
        "cronjobs.batch",
        "jobs.batch",
        "deployments.apps",
        "statefulsets.apps",
        "leases.coordination.k8s.io",
        "pods",
    ] {
        assert!(
            resources.lines().any(|l| l == expected),
            "{expected} missing from api-resources:\n{resources}"
        );
    }
    let client = cluster.client().await.expect("client");
    let node = Api::<Node>::all(client)
        .get(&format!("{}-node", cluster.name()))
        .await
        .expect("the cluster's node");
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(ready, "node Ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn a_job_runs_to_complete_with_env_and_logs_through_the_api() {
    let cluster = &cluster().await;
    let client = cluster.client().await.expect("client");
    let ns = namespace(&client, "job").await;
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}),
            )
            .expect("secret"),
        )
        .await
        .expect("create secret");
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"MODE": "fast"}}))
                .expect("configmap"),
        )
        .await
        .expect("create configmap");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "hello"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app": "hello"}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox:1.36",
                "command": ["sh", "-c", "echo \"$GREETING $(POD) $PASSWORD $MODE $LABEL $KUBERNETES_SERVICE_HOST\""],
                "envFrom": [{"configMapRef": {"name": "c"}}],
                "env": [
                    {"name": "GREETING", "value": "hello"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
                    {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}}
                ]}]}}}
    }))
    .expect("job");
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("create job");
    assert!(
        eventually(WAIT, || async {
            jobs.get("hello")
                .await
                .ok()
                .and_then(|j| j.status)
                .is_some_and(|s| {
                    s.conditions
                        .into_iter()
                        .flatten()
                        .any(|c| c.type_ == "Complete" && c.status == "True")
                })
        })
        .await,
        "Job not Complete: {:?}",
        jobs.get("hello").await.map(|j| j.status)
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods
        .list(&ListParams::default().labels("job-name=hello"))
        .await
        .expect("list")
        .items
        .into_iter()
        .next()
        .expect("the Job controller created a pod");
    let status = pod.status.clone().expect("status");
    assert_eq!(status.phase.as_deref(), Some("Succeeded"));
    let exit = status.container_statuses.expect("container statuses")[0]
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(exit, Some(0));
    let logs = pods
        .logs(&pod.name_any(), &LogParams::default())
        .await
        .expect("pods/log through kube-apiserver");
    // In-cluster clients find the API server at the `kubernetes` Service's address.
    let service_ip = Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .expect("the kubernetes Service")
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("its cluster IP");
    assert_eq!(
        logs.trim(),
        format!("hello {} hunter2 fast hello {service_ip}", pod.name_any())
    );
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::background())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn deletion_sends_sigterm_and_a_failing_container_restarts_by_policy() {
    let cluster = &cluster().await;
    let client = cluster.client().await.expect("client");
    let ns = namespace(&client, "pods").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = |name: &str, policy: &str, script: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"restartPolicy": policy, "terminationGracePeriodSeconds": 20,
                "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script]}]}
        }))
        .expect("pod")
    };
    // Traps SIGTERM and says so: the grace period lets it write its last line.
    pods.create(
        &PostParams::default(),
        &pod(
            "graceful",
            "Never",
            "trap 'echo got-term; exit 0' TERM; echo up; while true; do sleep 0.1; done",
        ),
    )
    .await
    .expect("create");
    pods.create(
        &PostParams::default(),
        &pod("crashy", "OnFailure", "echo try; exit 3"),
    )
    .await
    .expect("create");
    let phase = |name: &'static str| {
        let pods = pods.clone();
        async move {
            pods.get(name)
                .await
                .ok()
                .and_then(|p| p.status)
                .and_then(|s| s.phase)
        }
    };
    assert!(
        eventually(WAIT, || async {
            phase("graceful").await.as_deref() == Some("Running")
        })
        .await,
        "graceful never ran"
    );
    let ready = pods
        .get("graceful")
        .await
        .expect("get")
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(ready, "a running container without probes is Ready");
    let started = Instant::now();
    pods.delete("graceful", &DeleteParams::default())
        .await
        .expect("delete");
    let mut watch = std::pin::pin!(kube::runtime::watcher(
        pods.clone(),
        kube::runtime::watcher::Config::default().fields("metadata.name=graceful")
    ));
    // The last version before the object went: its container's final state.
    let mut last = None;
    let mut gone = false;
    while !gone && started.elapsed() < WAIT {
        match tokio::time::timeout(Duration::from_secs(5), watch.try_next()).await {
            Ok(Ok(Some(kube::runtime::watcher::Event::Delete(_)))) => gone = true,
            Ok(Ok(Some(
                kube::runtime::watcher::Event::Apply(p)
                | kube::runtime::watcher::Event::InitApply(p),
            ))) => last = Some(p),
            Ok(Ok(Some(_))) => {}
            _ => gone = pods.get_opt("graceful").await.ok().flatten().is_none(),
        }
    }
    assert!(gone, "the pod object is removed after its process ended");
    let terminated = last
        .and_then(|p| p.status)
        .and_then(|s| s.container_statuses)
        .and_then(|c| c[0].state.clone())
        .and_then(|s| s.terminated);
    assert_eq!(
        terminated.map(|t| t.exit_code),
        Some(0),
        "SIGTERM reached the trap (exit 0), not SIGKILL after the grace period (137)"
    );

    assert!(
        eventually(WAIT, || async {
            pods.get("crashy")
                .await
                .ok()
                .and_then(|p| p.status)
                .and_then(|s| s.container_statuses)
                .is_some_and(|c| c[0].restart_count >= 2)
        })
        .await,
        "OnFailure restarts a failing container"
    );
    let _ = Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::background())
        .await;
}

/// A component that exits while the cluster starts fails the start with its log (the
/// quickstart once waited 5 minutes on a scheduler that had exited at once), after the retries
/// on fresh ports a taken port gets.
#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn a_component_that_exits_at_start_fails_the_start_with_its_log() {
    let real = localcluster::Binaries::locate().expect("binaries");
    let dir = tempfile::tempdir().expect("temp dir");
    // Every binary but the scheduler, and the version stamps beside them.
    let every = std::fs::read_dir(real.dir()).expect("the binaries' directory");
    for entry in every.flatten() {
        let name = entry.file_name();
        if name != "kube-scheduler" {
            std::os::unix::fs::symlink(entry.path(), dir.path().join(&name)).expect("link");
        }
    }
    let scheduler = dir.path().join("kube-scheduler");
    std::fs::write(
        &scheduler,
        "#!/bin/sh\necho 'failed to listen on 127.0.0.1:1: bind: address already in use' >&2\nexit 1\n",
    )
    .expect("write a failing scheduler");
    std::fs::set_permissions(
        &scheduler,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let started = LocalCluster::start(localcluster::Options {
        binaries: Some(localcluster::Binaries::in_dir(dir.path()).expect("binaries")),
        ..localcluster::Options::named("broken")
    });
    match started {
        Err(
            e @ localcluster::Error::Exited {
                process: "kube-scheduler",
                ..
            },
        ) => {
            assert!(e.to_string().contains("address already in use"), "{e}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("the cluster started without its scheduler"),
    }
}
