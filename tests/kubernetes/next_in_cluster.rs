//! `lockedjob next` on a LockedJob in the local control plane: its schedule and time zone read
//! from the cluster.

use testsupport as support;

use kube::api::{Api, PostParams};
use lockedjob::api::LockedJob;
use serde_json::json;
use support::{lockedjob, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn next_reads_a_lockedjobs_schedule_and_zone_from_the_cluster() {
    let _turn = crate::beside();
    let cluster = &support::kubernetes::local_cluster("east").await;
    let client = support::kubernetes::client_for(&cluster.kubeconfig()).await;
    support::kubernetes::install_lockedjob_crd(&client, "cli")
        .await
        .expect("CRD");
    let namespace = support::kubernetes::create_namespace(&client, "cli").await;
    let lj: LockedJob = serde_json::from_value(json!({
        "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
        "metadata": {"name": "report"},
        "spec": {"schedule": "30 6 * * 1", "timeZone": "Europe/Berlin",
            "jobTemplate": {"spec": {"template": {"spec": support::kubernetes::restricted(json!({"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}]}))}}}}
    }))
    .expect("LockedJob");
    Api::<LockedJob>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &lj)
        .await
        .expect("create");
    let kubeconfig = cluster.kubeconfig();
    let next = |name: &str| {
        lockedjob(&["next", name, "--namespace", &namespace, "-n", "2"])
            .args(["--after", "2026-12-03T00:00:00Z"])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("run next")
    };
    let out = next("report");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "2026-12-07T06:30:00+01:00 CET  (2026-12-07T05:30:00Z)\n\
         2026-12-14T06:30:00+01:00 CET  (2026-12-14T05:30:00Z)\n"
    );
    let missing = next("no-such-job");
    assert_eq!(missing.status.code(), Some(64), "{}", text(&missing));
    assert!(
        text(&missing).contains("no LockedJob \"no-such-job\""),
        "{}",
        text(&missing)
    );
    support::kubernetes::delete_namespace(&client, &namespace).await;
}
