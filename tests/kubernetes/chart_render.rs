//! The chart rendered by the tools that read it: `helm lint --strict` and `helm template` with the
//! default values and every `ci/` file (helm from scripts/k8s-bins.sh), and Kubernetes' own schemas
//! (`kubernetes-validate`, PyPI) for the CRD and the examples' Job templates.

use support::{files_in, repo, yaml};
use testsupport as support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const CHART: &str = "charts/lockedjob-operator";

/// As a module, so a pip install works without a console script on PATH.
fn kubernetes_validate() -> Command {
    let mut command = Command::new("python3");
    command.args(["-m", "kubernetes_validate"]);
    command
}

/// Kubernetes' own OpenAPI schemas, offline: the CRD as a CustomResourceDefinition, and each
/// example's `spec.jobTemplate` as the batch/v1 Job the operator will create from it.
#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn manifests_validate_against_kubernetes_schemas() {
    let _turn = crate::beside();
    let installed = kubernetes_validate()
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        installed,
        "kubernetes-validate is not installed (scripts/test.sh kubernetes installs it from PyPI)"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let mut manifests = vec![repo("crds/lockedjob.dev_lockedjobs.yaml")];
    for example in files_in(&repo("examples"), "yaml") {
        let lj = yaml(&example);
        let job = serde_json::json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": lj["metadata"]["name"], "namespace": "default"},
            "spec": lj["spec"]["jobTemplate"]["spec"],
        });
        let path = dir.path().join(example.file_name().expect("name"));
        std::fs::write(&path, serde_json::to_string(&job).expect("json")).expect("write");
        manifests.push(path);
    }
    // A deliberately broken Job must fail, or the tool is not checking anything.
    let broken = dir.path().join("broken-job.yaml");
    std::fs::write(
        &broken,
        r#"{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"x"},"spec":{"template":{"spec":{"containers":[{"name":"a","image":"b","commandd":["x"]}]}}}}"#,
    )
    .expect("write");
    let run = |path: &Path| {
        kubernetes_validate()
            .args(["--strict", "--no-warn"])
            .arg(path)
            .output()
            .expect("run kubernetes-validate")
    };
    assert!(
        !run(&broken).status.success(),
        "kubernetes-validate accepted a broken Job"
    );
    for path in manifests {
        let out = run(&path);
        assert!(
            out.status.success(),
            "{}: {}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The helm built with the control plane (scripts/k8s-bins.sh), never skipped.
fn helm() -> Command {
    let bins = localcluster::Binaries::locate()
        .unwrap_or_else(|e| panic!("helm comes with the control plane binaries: {e}"));
    let mut command = Command::new(bins.path("helm"));
    let home = std::env::temp_dir().join(format!("lockedjob-chart-helm-{}", std::process::id()));
    command
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"));
    command
}

#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn helm_lint_and_template_with_default_and_every_ci_values_file() {
    let _turn = crate::beside();
    let chart = repo(CHART);
    let lint = helm()
        .args(["lint", "--strict"])
        .arg(&chart)
        .output()
        .expect("helm lint");
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let mut values_files: Vec<Option<PathBuf>> = vec![None];
    values_files.extend(
        files_in(&repo(&format!("{CHART}/ci")), "yaml")
            .into_iter()
            .map(Some),
    );
    // Every optional object on, so each template renders at least once.
    let all_on = [
        "--set",
        "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,redis.exporter.enabled=true,metrics.networkPolicy.enabled=true",
    ];
    for values in values_files {
        let mut command = helm();
        command.args(["template", "t", "--namespace", "locks"]);
        if let Some(values) = &values {
            command.arg("-f").arg(values);
        }
        let out = command
            .args(all_on)
            .arg(&chart)
            .output()
            .expect("helm template");
        assert!(
            out.status.success(),
            "{values:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        for kind in [
            "kind: Deployment",
            "kind: PrometheusRule",
            "kind: ServiceMonitor",
            "kind: NetworkPolicy\nmetadata:\n  name: t-lockedjob-operator-metrics\n",
        ] {
            assert!(text.contains(kind), "{values:?} renders {kind}");
        }
    }
}

/// The names of the cluster-scoped objects `helm template` renders for release `t` in `ns`.
fn cluster_scoped_names(ns: &str) -> Vec<String> {
    let out = helm()
        .args(["template", "t", "--namespace", ns])
        .arg(repo(CHART))
        .output()
        .expect("helm template");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut names = Vec::new();
    for document in text.split("\n---\n") {
        let object: Value = serde_saphyr::from_str(document).expect("a rendered object");
        let kind = object["kind"].as_str().unwrap_or_default();
        if kind.starts_with("Cluster") {
            names.push(format!(
                "{kind}/{}",
                object["metadata"]["name"].as_str().unwrap_or_default()
            ));
        }
    }
    names
}

/// Two releases of one name in two namespaces: were a ClusterRole or its binding named after
/// the release only, the later install would take it over and the other's operators would
/// lose every right (seen on the real node before the names carried the namespace).
#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn releases_of_one_name_in_two_namespaces_share_no_cluster_wide_object() {
    let _turn = crate::beside();
    let first = cluster_scoped_names("team-a");
    let second = cluster_scoped_names("team-b");
    assert!(!first.is_empty(), "the default install is cluster-wide");
    for name in &first {
        assert!(!second.contains(name), "both releases render {name}");
    }
}

/// TLS on with a plain-text external node would send the lock traffic in the clear to that
/// node: the chart refuses to render, naming it.
#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn tls_with_a_plain_text_external_node_is_refused() {
    let _turn = crate::beside();
    let out = helm()
        .args(["template", "t", "--namespace", "locks"])
        .args(["--set", "redis.enabled=false"])
        .args([
            "--set-json",
            r#"redis.external=["rediss://a.example:6379","redis://b.example:6379","rediss://c.example:6379"]"#,
        ])
        .args(["--set", "redis.tls.enabled=true,redis.tls.existingSecret=ca"])
        .arg(repo(CHART))
        .output()
        .expect("helm template");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("must be rediss://, got redis://b.example:6379"),
        "{stderr}"
    );
}
