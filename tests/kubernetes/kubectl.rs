//! kubectl (the one built with the control plane, not Debian's 1.20) against the local control
//! plane's real kube-apiserver: apply the CRD and the examples with client-side validation
//! against the server's OpenAPI documents, get them back through the CRD's printer columns.

use testsupport as support;

use localcluster::LocalCluster;
use std::path::Path;
use support::kubernetes::{client_for, create_namespace, delete_namespace, local_cluster};

fn kubectl(cluster: &LocalCluster, namespace: &str, args: &[&str]) -> (bool, String) {
    let out = cluster
        .tool("kubectl")
        .args(["--namespace", namespace])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn kubectl_applies_the_crd_and_examples_and_gets_them() {
    let _turn = crate::beside();
    let cluster = &local_cluster("east").await;
    let kubeconfig = cluster.kubeconfig();
    let client = client_for(&kubeconfig).await;
    let ns = create_namespace(&client, "kubectl").await;
    let (ok, text) = kubectl(
        cluster,
        &ns,
        &["apply", "-f", "crds/lockedjob.dev_lockedjobs.yaml"],
    );
    assert!(ok, "apply the CRD: {text}");
    let (ok, text) = kubectl(
        cluster,
        &ns,
        &[
            "wait",
            "--for=condition=Established",
            "crd/lockedjobs.lockedjob.dev",
            "--timeout=60s",
        ],
    );
    assert!(ok, "CRD established: {text}");
    // The examples name their own namespaces; they are applied into the test's.
    let apply = |file: &str| {
        let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
            .expect("example")
            .lines()
            .filter(|l| !l.trim_start().starts_with("namespace:"))
            .collect::<Vec<_>>()
            .join("\n");
        let path = cluster
            .dir()
            .join(format!("{ns}-{}", file.replace('/', "-")));
        std::fs::write(&path, manifest).expect("write manifest");
        kubectl(cluster, &ns, &["apply", "-f", &path.to_string_lossy()])
    };
    for file in [
        "examples/nightly-report.yaml",
        "examples/sweep-every-5-minutes.yaml",
        "examples/cross-cluster.yaml",
        // A second apply of the same file is an update, not a conflict.
        "examples/nightly-report.yaml",
    ] {
        let (ok, text) = apply(file);
        assert!(ok, "kubectl apply {file}: {text}");
    }
    let (ok, text) = kubectl(cluster, &ns, &["get", "lj"]);
    assert!(ok, "{text}");
    for expected in [
        "nightly-report",
        "billing-sweep",
        "cache-rebuild",
        "SCHEDULE",
        "*/5 * * * *",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let (ok, text) = kubectl(cluster, &ns, &["get", "jobs"]);
    assert!(ok, "{text}");
    let (ok, text) = kubectl(
        cluster,
        &ns,
        &[
            "get",
            "lockedjob",
            "nightly-report",
            "-o",
            "jsonpath={.spec.concurrencyPolicy}",
        ],
    );
    assert!(ok, "{text}");
    assert_eq!(text, "Forbid", "defaults applied by the schema");
    let (ok, text) = apply("examples/invalid/restart-always.yaml");
    assert!(
        ok,
        "schema-valid manifest is accepted by the API (the operator reports InvalidSpec): {text}"
    );
    delete_namespace(&client, &ns).await;
}
