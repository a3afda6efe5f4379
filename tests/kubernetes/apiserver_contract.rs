//! The API behaviours the operator relies on, through the real `kube::Client`, on the local
//! control plane's real kube-apiserver (and on the external cluster of
//! `LOCKEDJOB_E2E_KUBECONFIG` too, when set: same code, each in a namespace of its own):
//! resource versions, watches and their recovery, bookmarks, conflicts and preconditions,
//! patches (merge, JSON, server-side apply), the status subresource, the CRD's schema and CEL
//! rules, selectors, finalizers, garbage collection, and Jobs run by the real Job controller
//! on a real node (kubelet, containerd, runc: needs root).

use testsupport as support;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams, Preconditions,
    WatchEvent, WatchParams,
};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use lockedjob::api::LockedJob;
use serde_json::json;
use std::time::Duration;
use support::kubernetes::{
    client_for, create_namespace, delete_namespace, eventually, install_lockedjob_crd,
    local_cluster, restricted,
};

const WAIT: Duration = Duration::from_secs(60);

/// One backend: a client and a namespace of its own.
struct Backend {
    name: &'static str,
    client: Client,
    namespace: String,
}

impl Backend {
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

async fn backends() -> Vec<Backend> {
    let local = &local_cluster("east").await;
    let client = client_for(&local.kubeconfig()).await;
    let mut list = vec![Backend {
        name: "local cluster",
        namespace: create_namespace(&client, "lockedjob-contract").await,
        client,
    }];
    if let Ok(path) = std::env::var("LOCKEDJOB_E2E_KUBECONFIG") {
        let client = client_for(std::path::Path::new(&path)).await;
        list.push(Backend {
            name: "external cluster",
            namespace: create_namespace(&client, "lockedjob-contract").await,
            client,
        });
    }
    list
}

async fn cleanup(backends: Vec<Backend>) {
    for b in backends {
        delete_namespace(&b.client, &b.namespace).await;
    }
}

fn lease(name: &str, labels: serde_json::Value) -> Lease {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "spec": {"holderIdentity": "test"}}),
    )
    .expect("lease")
}

fn rv<K: ResourceExt>(object: &K) -> u64 {
    object
        .resource_version()
        .and_then(|v| v.parse().ok())
        .expect("numeric resourceVersion")
}

fn status_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn locked_job(name: &str) -> LockedJob {
    serde_json::from_value(json!({
        "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
        "metadata": {"name": name},
        "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": {"spec": restricted(json!({
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}]}))}}}}
    }))
    .expect("locked job")
}

fn job(name: &str, script: &str, extra: serde_json::Value) -> Job {
    let mut value = json!({
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": restricted(json!({
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script],
                            "env": [{"name": "GREETING", "value": "hello"}]}]}))}}
    });
    json_patch::merge(&mut value, &extra);
    serde_json::from_value(value).expect("job")
}

async fn ensure_crd(b: &Backend) {
    install_lockedjob_crd(&b.client, "lockedjob-contract")
        .await
        .unwrap_or_else(|e| panic!("LockedJob CRD on the {}: {e}", b.name));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn resource_versions_increase_and_lists_report_them() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        let leases: Api<Lease> = b.api();
        let first = leases
            .create(&PostParams::default(), &lease("rv-a", json!({})))
            .await
            .expect("create a");
        let second = leases
            .create(&PostParams::default(), &lease("rv-b", json!({})))
            .await
            .expect("create b");
        assert!(rv(&second) > rv(&first), "{}", b.name);
        let updated = leases
            .patch(
                "rv-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"holderIdentity": "x"}})),
            )
            .await
            .expect("patch");
        assert!(rv(&updated) > rv(&second), "{}", b.name);
        let list = leases.list(&ListParams::default()).await.expect("list");
        let list_rv: u64 = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .expect("list rv");
        assert!(list_rv >= rv(&updated), "{}", b.name);
        assert!(
            first.uid().is_some() && first.creation_timestamp().is_some(),
            "{}",
            b.name
        );
    }
    cleanup(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn watch_from_a_resource_version_streams_what_came_after() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        let leases: Api<Lease> = b.api();
        let before = leases
            .create(&PostParams::default(), &lease("w-before", json!({})))
            .await
            .expect("create");
        leases
            .create(&PostParams::default(), &lease("w-after", json!({})))
            .await
            .expect("create");
        leases
            .patch(
                "w-after",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
            )
            .await
            .expect("patch");
        leases
            .delete("w-after", &DeleteParams::default())
            .await
            .expect("delete");
        let stream = leases
            .watch(&WatchParams::default().timeout(5), &rv(&before).to_string())
            .await
            .expect("watch");
        let events: Vec<String> = stream
            .try_filter_map(|e| async move {
                Ok(match e {
                    WatchEvent::Added(l) => Some(format!("ADDED {}", l.name_any())),
                    WatchEvent::Modified(l) => Some(format!("MODIFIED {}", l.name_any())),
                    WatchEvent::Deleted(l) => Some(format!("DELETED {}", l.name_any())),
                    _ => None,
                })
            })
            .take(3)
            .try_collect()
            .await
            .expect("watch events");
        assert_eq!(
            events,
            ["ADDED w-after", "MODIFIED w-after", "DELETED w-after"],
            "{}",
            b.name
        );
    }
    cleanup(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn streaming_list_watch_ends_its_initial_events_with_a_bookmark() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        // kube's watcher may list through a watch (sendInitialEvents): the server sends the
        // current objects, then a bookmark marking the end of them.
        let leases: Api<Lease> = b.api();
        leases
            .create(&PostParams::default(), &lease("bm-a", json!({})))
            .await
            .expect("create");
        let events: Vec<WatchEvent<Lease>> = leases
            .watch(&WatchParams::streaming_lists().timeout(3), "")
            .await
            .expect("watch")
            .try_collect()
            .await
            .expect("events");
        let added = events
            .iter()
            .position(|e| matches!(e, WatchEvent::Added(l) if l.name_any() == "bm-a"));
        let end = events.iter().position(|e| {
            matches!(e, WatchEvent::Bookmark(b)
                if b.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str) == Some("true"))
        });
        assert!(
            added.is_some() && end > added,
            "{}: the object, then the end-of-initial-events bookmark: {events:?}",
            b.name
        );
    }
    cleanup(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn a_watcher_survives_an_api_server_restart() {
    let _turn = crate::beside();
    // A control plane of its own: this test stops its API server.
    let cluster = tokio::task::spawn_blocking(|| {
        localcluster::LocalCluster::start(localcluster::Options::named("restart"))
    })
    .await
    .expect("join")
    .expect("start a local cluster");
    let client = client_for(&cluster.kubeconfig()).await;
    let namespace = create_namespace(&client, "restart").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    leases
        .create(&PostParams::default(), &lease("c-1", json!({})))
        .await
        .expect("create");
    // kube's watcher re-lists after its stream breaks (here: kube-apiserver stopped and
    // started again) and goes on.
    // It yields the errors on the way (a real restart ends the watch with 410 Gone: the new
    // watch cache starts after the old resource version), so the stream is read past them.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (sink, error_sink) = (std::sync::Arc::clone(&seen), std::sync::Arc::clone(&errors));
    let task = tokio::spawn(
        watcher(leases.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .for_each(move |event| {
                match event {
                    Ok(l) => sink.lock().expect("seen").push(l.name_any()),
                    Err(e) => error_sink.lock().expect("errors").push(e.to_string()),
                }
                futures::future::ready(())
            }),
    );
    assert!(
        eventually(WAIT, || async {
            seen.lock().expect("seen").contains(&"c-1".to_string())
        })
        .await
    );
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.stop_apiserver().expect("stop kube-apiserver");
        std::thread::sleep(Duration::from_secs(2));
        cluster.start_apiserver().expect("start kube-apiserver");
        cluster
    })
    .await
    .expect("join");
    let leases: Api<Lease> = Api::namespaced(client_for(&cluster.kubeconfig()).await, &namespace);
    leases
        .create(&PostParams::default(), &lease("c-2", json!({})))
        .await
        .expect("create after the restart");
    assert!(
        eventually(WAIT, || async {
            seen.lock().expect("seen").contains(&"c-2".to_string())
        })
        .await,
        "watcher did not recover: saw {:?}, errors {:?}",
        seen.lock().map(|s| s.clone()),
        errors.lock().map(|e| e.clone())
    );
    task.abort();
    drop(tokio::task::spawn_blocking(move || drop(cluster)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn conflicts_preconditions_and_generate_name() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        let leases: Api<Lease> = b.api();
        let created = leases
            .create(&PostParams::default(), &lease("k-1", json!({})))
            .await
            .expect("create");
        let again = leases
            .create(&PostParams::default(), &lease("k-1", json!({})))
            .await
            .expect_err("exists");
        assert_eq!(status_code(&again), Some(409), "{}", b.name);

        let mut fresh = leases.get("k-1").await.expect("get");
        fresh.spec.as_mut().expect("spec").holder_identity = Some("new".into());
        leases
            .replace("k-1", &PostParams::default(), &fresh)
            .await
            .expect("replace with current rv");
        let mut stale = created.clone();
        stale.spec.as_mut().expect("spec").holder_identity = Some("stale".into());
        let conflict = leases
            .replace("k-1", &PostParams::default(), &stale)
            .await
            .expect_err("stale rv");
        assert_eq!(status_code(&conflict), Some(409), "{}", b.name);

        let wrong_uid = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some("not-the-uid".into()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let refused = leases
            .delete("k-1", &wrong_uid)
            .await
            .expect_err("uid precondition");
        assert_eq!(status_code(&refused), Some(409), "{}", b.name);
        let right_uid = DeleteParams {
            preconditions: Some(Preconditions {
                uid: created.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        leases
            .delete("k-1", &right_uid)
            .await
            .expect("delete with the right uid");

        let generated: Lease =
            serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).expect("lease");
        let made = leases
            .create(&PostParams::default(), &generated)
            .await
            .expect("generateName");
        assert!(
            made.name_any().starts_with("gen-") && made.name_any().len() > 4,
            "{}",
            b.name
        );
    }
    cleanup(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn merge_json_and_apply_patches() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        let leases: Api<Lease> = b.api();
        leases
            .create(&PostParams::default(), &lease("p-1", json!({"a": "1"})))
            .await
            .expect("create");
        let merged = leases
            .patch(
                "p-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"b": "2", "a": null}}})),
            )
            .await
            .expect("merge");
        assert_eq!(
            merged.labels().get("b").map(String::as_str),
            Some("2"),
            "{}",
            b.name
        );
        assert!(!merged.labels().contains_key("a"), "{}", b.name);
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/labels/b", "value": "2"},
            {"op": "add", "path": "/metadata/labels/c", "value": "3"}]))
        .expect("json patch");
        let patched = leases
            .patch("p-1", &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
            .expect("json patch");
        assert_eq!(
            patched.labels().get("c").map(String::as_str),
            Some("3"),
            "{}",
            b.name
        );
        let failing: json_patch::Patch = serde_json::from_value(
            json!([{"op": "test", "path": "/metadata/labels/b", "value": "nope"}]),
        )
        .expect("p");
        assert!(
            leases
                .patch("p-1", &PatchParams::default(), &Patch::<()>::Json(failing))
                .await
                .is_err(),
            "{}",
            b.name
        );

        let applied = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "p-2", "labels": {"applied": "yes"}}, "spec": {"holderIdentity": "applier"}});
        let params = PatchParams::apply("contract-test").force();
        let created = leases
            .patch("p-2", &params, &Patch::Apply(&applied))
            .await
            .expect("apply creates");
        assert_eq!(
            created.spec.and_then(|s| s.holder_identity).as_deref(),
            Some("applier"),
            "{}",
            b.name
        );
        let again = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "p-2"}, "spec": {"holderIdentity": "applier", "leaseDurationSeconds": 7}});
        let updated = leases
            .patch("p-2", &params, &Patch::Apply(&again))
            .await
            .expect("apply updates");
        assert_eq!(
            updated.spec.and_then(|s| s.lease_duration_seconds),
            Some(7),
            "{}",
            b.name
        );
    }
    cleanup(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn status_subresource_and_generation() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        ensure_crd(b).await;
        let jobs: Api<LockedJob> = b.api();
        let mut with_status = locked_job("s-1");
        with_status.status =
            Some(serde_json::from_value(json!({"observedGeneration": 99})).expect("status"));
        let created = jobs
            .create(&PostParams::default(), &with_status)
            .await
            .expect("create");
        assert!(
            created.status.is_none(),
            "{}: status is dropped on create",
            b.name
        );
        assert_eq!(created.metadata.generation, Some(1), "{}", b.name);

        let status_patch =
            json!({"status": {"observedGeneration": 1}, "spec": {"schedule": "@daily"}});
        let after_status = jobs
            .patch_status("s-1", &PatchParams::default(), &Patch::Merge(&status_patch))
            .await
            .expect("status patch");
        assert_eq!(
            after_status
                .status
                .as_ref()
                .and_then(|s| s.observed_generation),
            Some(1),
            "{}",
            b.name
        );
        assert_eq!(
            after_status.spec.schedule, "*/5 * * * *",
            "{}: /status ignores spec",
            b.name
        );
        assert_eq!(after_status.metadata.generation, Some(1), "{}", b.name);

        let main_patch =
            json!({"status": {"observedGeneration": 5}, "spec": {"schedule": "@hourly"}});
        let after_main = jobs
            .patch("s-1", &PatchParams::default(), &Patch::Merge(&main_patch))
            .await
            .expect("main patch");
        assert_eq!(after_main.spec.schedule, "@hourly", "{}", b.name);
        assert_eq!(
            after_main
                .status
                .as_ref()
                .and_then(|s| s.observed_generation),
            Some(1),
            "{}: main ignores status",
            b.name
        );
        assert_eq!(
            after_main.metadata.generation,
            Some(2),
            "{}: spec change bumps generation",
            b.name
        );

        let labels_only = jobs
            .patch(
                "s-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
            )
            .await
            .expect("labels");
        assert_eq!(
            labels_only.metadata.generation,
            Some(2),
            "{}: metadata does not bump generation",
            b.name
        );
    }
    cleanup(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn schema_is_enforced_with_defaults_and_422s() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        ensure_crd(b).await;
        let jobs: Api<LockedJob> = b.api();
        let created = jobs
            .create(&PostParams::default(), &locked_job("v-ok"))
            .await
            .expect("valid");
        assert_eq!(created.spec.lock.ttl_seconds, 30, "{}", b.name);
        let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
            b.client.clone(),
            &b.namespace,
            &kube::api::ApiResource::erase::<LockedJob>(&()),
        );
        let stored = raw.get("v-ok").await.expect("get raw");
        assert_eq!(
            stored.data["spec"]["concurrencyPolicy"], "Forbid",
            "{}: default applied",
            b.name
        );
        assert_eq!(
            stored.data["spec"]["successfulJobsHistoryLimit"], 3,
            "{}",
            b.name
        );

        let bad_bodies = [
            ("enum", json!({"concurrencyPolicy": "Sometimes"})),
            ("range", json!({"lock": {"ttlSeconds": 0}})),
            (
                "cel",
                json!({"lock": {"ttlSeconds": 10, "renewIntervalSeconds": 10}}),
            ),
            ("type", json!({"suspend": "yes"})),
            ("cel-tz", json!({"schedule": "TZ=UTC 0 * * * *"})),
        ];
        for (what, spec_patch) in bad_bodies {
            let mut value = serde_json::to_value(locked_job(&format!("v-{what}"))).expect("value");
            json_patch::merge(&mut value["spec"], &spec_patch);
            let object: kube::api::DynamicObject = serde_json::from_value(value).expect("dynamic");
            let err = raw
                .create(&PostParams::default(), &object)
                .await
                .expect_err(what);
            assert_eq!(status_code(&err), Some(422), "{}: {what}: {err}", b.name);
        }
        let mut missing = serde_json::to_value(locked_job("v-missing")).expect("value");
        missing["spec"]
            .as_object_mut()
            .expect("spec")
            .remove("schedule");
        let object: kube::api::DynamicObject = serde_json::from_value(missing).expect("dynamic");
        let err = raw
            .create(&PostParams::default(), &object)
            .await
            .expect_err("required");
        assert_eq!(status_code(&err), Some(422), "{}: {err}", b.name);
    }
    cleanup(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn label_and_field_selectors_on_list_and_watch() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        let leases: Api<Lease> = b.api();
        for (name, tier) in [("sel-a", "web"), ("sel-b", "db"), ("sel-c", "web")] {
            leases
                .create(
                    &PostParams::default(),
                    &lease(name, json!({"tier": tier, "app": "sel"})),
                )
                .await
                .expect("create");
        }
        let names = |list: kube::api::ObjectList<Lease>| {
            let mut n: Vec<String> = list.items.iter().map(|l| l.name_any()).collect();
            n.sort();
            n
        };
        let web = leases
            .list(&ListParams::default().labels("app=sel,tier=web"))
            .await
            .expect("list");
        assert_eq!(names(web), ["sel-a", "sel-c"], "{}", b.name);
        let not_web = leases
            .list(&ListParams::default().labels("app=sel,tier notin (web)"))
            .await
            .expect("list");
        assert_eq!(names(not_web), ["sel-b"], "{}", b.name);
        let by_name = leases
            .list(&ListParams::default().fields("metadata.name=sel-b"))
            .await
            .expect("list");
        assert_eq!(names(by_name), ["sel-b"], "{}", b.name);

        let stream = leases
            .watch(&WatchParams::default().labels("tier=db").timeout(5), "0")
            .await
            .expect("watch");
        let added: Vec<String> = stream
            .try_filter_map(|e| async move {
                Ok(match e {
                    WatchEvent::Added(l) => Some(l.name_any()),
                    _ => None,
                })
            })
            .take(1)
            .try_collect()
            .await
            .expect("watch");
        assert_eq!(added, ["sel-b"], "{}", b.name);
    }
    cleanup(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn finalizers_hold_deletion_until_removed() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        ensure_crd(b).await;
        let jobs: Api<LockedJob> = b.api();
        let mut lj = locked_job("f-1");
        lj.metadata.finalizers = Some(vec!["lockedjob.dev/test".into()]);
        jobs.create(&PostParams::default(), &lj)
            .await
            .expect("create");
        jobs.delete("f-1", &DeleteParams::default())
            .await
            .expect("delete");
        let pending = jobs.get("f-1").await.expect("still there");
        assert!(pending.metadata.deletion_timestamp.is_some(), "{}", b.name);
        jobs.patch(
            "f-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("drop finalizer");
        assert!(
            eventually(WAIT, || async {
                jobs.get_opt("f-1").await.ok().flatten().is_none()
            })
            .await,
            "{}",
            b.name
        );
    }
    cleanup(all).await;
}

async fn pods_of(pods: &Api<Pod>, job: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The name of `job`'s pod once it runs (its container started, so its log can be followed).
async fn running_pod(pods: &Api<Pod>, job: &str) -> String {
    let running = eventually(WAIT, || async {
        let pod = pods_of(pods, job).await.pop();
        pod.and_then(|p| p.status).and_then(|s| s.phase).as_deref() == Some("Running")
    })
    .await;
    assert!(running, "{job}'s pod did not run");
    pods_of(pods, job).await.pop().expect("pod").name_any()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn owner_references_garbage_collection() {
    let _turn = crate::beside();
    let all = backends().await;
    for b in &all {
        ensure_crd(b).await;
        let lockedjobs: Api<LockedJob> = b.api();
        let jobs: Api<Job> = b.api();
        let pods: Api<Pod> = b.api();
        let owner = lockedjobs
            .create(&PostParams::default(), &locked_job("gc-owner"))
            .await
            .expect("owner");
        let mut owned = job("gc-owned", "sleep 60", json!({}));
        owned.metadata.owner_references = Some(vec![serde_json::from_value(json!({
            "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob", "name": "gc-owner", "uid": owner.uid(), "controller": true}))
            .expect("owner ref")]);
        jobs.create(&PostParams::default(), &owned)
            .await
            .expect("owned job");
        assert!(
            eventually(WAIT, || async {
                !pods_of(&pods, "gc-owned").await.is_empty()
            })
            .await,
            "{}: pod created",
            b.name
        );

        // Deleting the LockedJob deletes its Job, which deletes its pods.
        lockedjobs
            .delete("gc-owner", &DeleteParams::background())
            .await
            .expect("delete owner");
        assert!(
            eventually(WAIT, || async {
                jobs.get_opt("gc-owned").await.ok().flatten().is_none()
            })
            .await,
            "{}: job collected",
            b.name
        );
        assert!(
            eventually(WAIT, || async {
                pods_of(&pods, "gc-owned").await.is_empty()
            })
            .await,
            "{}: pods collected",
            b.name
        );

        // Foreground: the Job waits, with a deletionTimestamp, until its pods are gone.
        jobs.create(&PostParams::default(), &job("gc-fg", "sleep 60", json!({})))
            .await
            .expect("job");
        assert!(eventually(WAIT, || async { !pods_of(&pods, "gc-fg").await.is_empty() }).await);
        // The DELETE answer is the Job as it stands right after the delete: still there,
        // waiting for its pods. A later GET could race the kubelet, which may already have
        // stopped the pods and so let the Job go.
        let waiting = jobs
            .delete("gc-fg", &DeleteParams::foreground())
            .await
            .expect("foreground delete")
            .left()
            .expect("the Job waits for its pods");
        assert!(waiting.metadata.deletion_timestamp.is_some(), "{}", b.name);
        assert!(
            waiting
                .finalizers()
                .iter()
                .any(|f| f == "foregroundDeletion"),
            "{}",
            b.name
        );
        assert!(
            eventually(WAIT, || async {
                jobs.get_opt("gc-fg").await.ok().flatten().is_none()
            })
            .await,
            "{}",
            b.name
        );
        assert!(
            pods_of(&pods, "gc-fg").await.is_empty(),
            "{}: pods went first",
            b.name
        );

        // Orphan (the API's default for batch/v1 Jobs): the pods stay, without the owner.
        jobs.create(
            &PostParams::default(),
            &job("gc-orphan", "sleep 60", json!({})),
        )
        .await
        .expect("job");
        assert!(
            eventually(WAIT, || async {
                !pods_of(&pods, "gc-orphan").await.is_empty()
            })
            .await
        );
        jobs.delete("gc-orphan", &DeleteParams::orphan())
            .await
            .expect("orphan delete");
        assert!(
            eventually(WAIT, || async {
                jobs.get_opt("gc-orphan").await.ok().flatten().is_none()
            })
            .await
        );
        let orphans = pods_of(&pods, "gc-orphan").await;
        assert_eq!(orphans.len(), 1, "{}", b.name);
        assert!(orphans[0].owner_references().is_empty(), "{}", b.name);
        pods.delete(
            &orphans[0].name_any(),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .expect("clean up");
    }
    cleanup(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn the_job_controller_counts_what_the_node_runs() {
    let _turn = crate::beside();
    let all = backends().await;
    let b = &all[0];
    let jobs: Api<Job> = b.api();
    let pods: Api<Pod> = b.api();
    let completed = |name: &'static str, kind: &'static str| {
        let jobs = jobs.clone();
        async move {
            eventually(WAIT, || async {
                jobs.get(name)
                    .await
                    .ok()
                    .and_then(|j| j.status)
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
            })
            .await
        }
    };

    jobs.create(
        &PostParams::default(),
        &job("k-ok", "echo $GREETING; echo oops >&2", json!({})),
    )
    .await
    .expect("job");
    assert!(completed("k-ok", "Complete").await);
    let status = jobs.get("k-ok").await.expect("job").status.expect("status");
    assert_eq!(status.succeeded, Some(1));
    assert!(status.start_time.is_some() && status.completion_time.is_some());
    let pod = pods_of(&pods, "k-ok").await.pop().expect("pod");
    assert_eq!(
        pod.status.clone().and_then(|s| s.phase).as_deref(),
        Some("Succeeded")
    );
    // Through the logs API (kube-apiserver asks the node), as `kubectl logs` and the e2e
    // journal read it. Both streams, in no set order: the container runtime reads stdout and
    // stderr from two pipes (a real node does not keep their order).
    let log = pods
        .logs(&pod.name_any(), &Default::default())
        .await
        .expect("pods/log");
    let mut lines: Vec<&str> = log.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["hello", "oops"], "{log:?}");
    let missing = pods.logs("no-such-pod", &Default::default()).await;
    assert!(
        matches!(missing, Err(kube::Error::Api(ref s)) if s.code == 404),
        "{missing:?}"
    );

    jobs.create(
        &PostParams::default(),
        &job("k-fail", "exit 3", json!({"spec": {"backoffLimit": 1}})),
    )
    .await
    .expect("job");
    assert!(completed("k-fail", "Failed").await);
    let status = jobs
        .get("k-fail")
        .await
        .expect("job")
        .status
        .expect("status");
    assert_eq!(status.failed, Some(2), "backoffLimit 1 allows one retry");
    let reason = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Failed")
        .and_then(|c| c.reason);
    assert_eq!(reason.as_deref(), Some("BackoffLimitExceeded"));

    jobs.create(
        &PostParams::default(),
        &job(
            "k-slow",
            "sleep 60",
            json!({"spec": {"activeDeadlineSeconds": 1}}),
        ),
    )
    .await
    .expect("job");
    assert!(completed("k-slow", "Failed").await);
    assert!(
        eventually(WAIT, || async { pods_of(&pods, "k-slow").await.is_empty() }).await,
        "overdue pod stopped"
    );

    // Deleting a pod: SIGTERM first (the trap runs, its line reaches the log followed from
    // before the delete), SIGKILL after the grace period.
    let script = "echo started; trap 'echo term; exit 0' TERM; while true; do sleep 0.05; done";
    jobs.create(&PostParams::default(), &job("k-term", script, json!({})))
        .await
        .expect("job");
    let pod = running_pod(&pods, "k-term").await;
    let follow = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let log = pods
        .log_stream(&pod, &follow)
        .await
        .expect("follow the log");
    let log = tokio::spawn(async move {
        use futures::AsyncBufReadExt;
        let mut lines = log.lines();
        let mut seen = Vec::new();
        while let Some(Ok(line)) = lines.next().await {
            seen.push(line);
        }
        seen
    });
    pods.delete(&pod, &DeleteParams::default())
        .await
        .expect("delete pod");
    assert!(
        eventually(WAIT, || async {
            pods.get_opt(&pod).await.ok().flatten().is_none()
        })
        .await
    );
    let seen = tokio::time::timeout(WAIT, log).await;
    assert!(
        matches!(&seen, Ok(Ok(lines)) if lines == &["started", "term"]),
        "the TERM trap's line in the followed log: {seen:?}"
    );

    let stubborn = "trap '' TERM; while true; do sleep 0.05; done";
    jobs.create(&PostParams::default(), &job("k-kill", stubborn, json!({})))
        .await
        .expect("job");
    let pod = running_pod(&pods, "k-kill").await;
    pods.delete(&pod, &DeleteParams::default())
        .await
        .expect("delete pod");
    assert!(
        eventually(WAIT, || async {
            pods.get_opt(&pod).await.ok().flatten().is_none()
        })
        .await,
        "SIGKILL after grace"
    );
    cleanup(all).await;
}
