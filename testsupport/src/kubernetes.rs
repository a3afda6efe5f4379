//! Kubernetes for the tests: the local cluster (real kube-apiserver, etcd, controller manager
//! and scheduler, and a real node; see `localcluster/`), clients, the LockedJob CRD,
//! namespaces of a test's own.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use localcluster::{LocalCluster, Shared};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// The local cluster this test process shares under `name` (started on first use, stopped at
/// exit), with a real node (kubelet, containerd, runc, kube-proxy, CoreDNS). Two names are two
/// independent clusters. Needs root.
pub async fn local_cluster(name: &'static str) -> Shared {
    tokio::task::spawn_blocking(move || localcluster::shared(name))
        .await
        .expect("join the cluster start")
        .unwrap_or_else(|e| panic!("start the local cluster {name}: {e}"))
}

/// A kube client from a kubeconfig file.
pub async fn client_for(path: &Path) -> kube::Client {
    client_with_retries(path, true).await
}

/// Like [`client_for`]; without retries a failure surfaces at once instead of after kube's
/// backoff, which is what fault tests want to observe.
pub async fn client_with_retries(path: &Path, retries: bool) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("kubeconfig is usable");
    config.default_retry = retries;
    kube::Client::try_from(config).expect("kube client")
}

/// The Pod Security Standard every test namespace enforces: the tests' pods pass it, as pods
/// must in a locked-down namespace of a user's, and runc enforces what they declare.
pub const POD_SECURITY_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

/// A fresh namespace `PREFIX-xxxxxxxx` labelled `lockedjob-e2e=true`, enforcing the
/// `restricted` Pod Security Standard.
pub async fn create_namespace(client: &kube::Client, prefix: &str) -> String {
    let namespace = format!("{prefix}-{:08x}", rand::random::<u32>());
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {
                "name": namespace,
                "labels": {"lockedjob-e2e": "true", POD_SECURITY_ENFORCE: "restricted"}}}))
            .expect("namespace"),
        )
        .await
        .unwrap_or_else(|e| panic!("create the test namespace {namespace}: {e}"));
    namespace
}

/// A pod spec made to pass the `restricted` Pod Security Standard: user nobody, the runtime's
/// seccomp profile, and in every container no privilege escalation and no capabilities.
pub fn restricted(mut spec: serde_json::Value) -> serde_json::Value {
    spec["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 65534,
        "runAsGroup": 65534, "seccompProfile": {"type": "RuntimeDefault"}});
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec[list].as_array_mut() else {
            continue;
        };
        for container in containers {
            container["securityContext"] = json!({"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}});
        }
    }
    spec
}

pub async fn delete_namespace(client: &kube::Client, namespace: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(namespace, &DeleteParams::background())
        .await;
}

/// Server-side applies the LockedJob CRD as `manager` and waits (up to 60 s) until it is
/// established.
pub async fn install_lockedjob_crd(client: &kube::Client, manager: &str) -> Result<(), String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "lockedjobs.lockedjob.dev";
    crds.patch(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(lockedjob::api::crd()),
    )
    .await
    .map_err(|e| format!("apply the LockedJob CRD: {e}"))?;
    let established = kube::runtime::wait::await_condition(
        crds,
        name,
        kube::runtime::wait::conditions::is_crd_established(),
    );
    match tokio::time::timeout(Duration::from_secs(60), established).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("watch the CRD: {e}")),
        Err(_) => Err("the LockedJob CRD was not established within 60 s".into()),
    }
}

/// Polls until `check` holds, for up to `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The chart's leader-election RBAC for `namespace`, rendered by helm and applied.
pub fn apply_chart_rbac(local: &LocalCluster, namespace: &str, dir: &Path) {
    let chart = crate::repo("charts/lockedjob-operator");
    let chart = chart.to_str().expect("a UTF-8 path");
    let rendered = local
        .tool("helm")
        .args(["template", "locks", chart, "--namespace", "lockedjob"])
        .args([
            "--set",
            &format!("leaderElection.namespaces={{{namespace}}}"),
        ])
        .args(["--show-only", "templates/leader-election-rbac.yaml"])
        .output()
        .expect("helm template");
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let file = dir.join("rbac.yaml");
    std::fs::write(&file, &rendered.stdout).expect("rbac.yaml");
    kubectl_apply(local, &file);
}

/// `kubectl apply -f FILE` on `local`; fails the test with kubectl's complaint.
pub fn kubectl_apply(local: &LocalCluster, file: &Path) {
    let applied = local
        .tool("kubectl")
        .args(["apply", "-f"])
        .arg(file)
        .output()
        .expect("kubectl apply");
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
}
