//! `reconcile` against a scripted API server (`tower_test::mock::pair`, as controller-rs's
//! fixtures do) and an engine whose Redis nodes do not answer. Each test answers the requests
//! the operator makes, records them, and checks what was asked: milliseconds, beside the
//! end-to-end suites on the real control plane.

use super::health::Health;
use super::reconcile::reconcile;
use super::runs::Runs;
use super::{Context, MAX_LOCK_ATTEMPTS_IN_FLIGHT};
use crate::api::LockedJob;
use crate::metrics::Metrics;
use crate::redlock::{Redlock, RedlockConfig};
use http::{Request, Response};
use k8s_openapi::api::batch::v1::Job;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// One request the operator made.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) query: String,
    pub(super) body: Value,
}

pub(super) type Answer = Box<dyn Fn(&Seen) -> (u16, Value) + Send>;

/// A scripted API server: answers each request with `answer`, and records it.
pub(super) fn api_server(answer: Answer) -> (kube::Client, Arc<Mutex<Vec<Seen>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Some((request, reply)) = handle.next_request().await {
            let method = request.method().to_string();
            let path = request.uri().path().to_string();
            let query = request.uri().query().unwrap_or_default().to_string();
            let bytes = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let seen = Seen {
                method,
                path,
                query,
                body,
            };
            let (status, reply_body) = answer(&seen);
            if let Ok(mut all) = record.lock() {
                all.push(seen);
            }
            let response = Response::builder().status(status).body(Body::from(
                serde_json::to_vec(&reply_body).unwrap_or_default(),
            ));
            if let Ok(response) = response {
                reply.send_response(response);
            }
        }
    });
    (kube::Client::new(service, "team-a"), seen)
}

/// Requests so far, once the runs and Events the reconcile started have ended.
pub(super) async fn requests(ctx: &Context, seen: &Arc<Mutex<Vec<Seen>>>) -> Vec<Seen> {
    ctx.tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), ctx.tasks.wait()).await;
    seen.lock().map(|s| s.clone()).unwrap_or_default()
}

/// A context on the mocked API server, with `jobs` in its Job cache and three Redis nodes
/// that refuse every connection.
fn context(client: kube::Client, jobs: Vec<Job>) -> Arc<Context> {
    let refusing = (1..=3).map(|i| format!("redis://127.0.0.1:{i}")).collect();
    context_on(client, jobs, refusing, Duration::from_millis(20))
}

/// A context of the replica `test/r0` on the mocked API server, with `jobs` in its Job cache
/// and the Redis nodes at `urls`.
pub(super) fn context_on(
    client: kube::Client,
    jobs: Vec<Job>,
    urls: Vec<String>,
    timeout: Duration,
) -> Arc<Context> {
    let mut config = RedlockConfig::new(urls);
    config.request_timeout = timeout;
    config.connect_timeout = timeout;
    config.holder = "test/r0".into();
    let metrics = Metrics::new();
    let engine = Redlock::with_metrics(config, metrics.lock().clone()).expect("engine config");
    let (cache, mut writer) = reflector::store();
    for job in jobs {
        writer.apply_watcher_event(&watcher::Event::InitApply(job));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let health = Health::default();
    health.set_reachable(3);
    health.set_reported(3);
    Arc::new(Context {
        client,
        engine,
        cluster_id: "test".into(),
        holder: "test/r0".into(),
        runs: Runs::default(),
        health,
        shutdown: CancellationToken::new(),
        job_caches: vec![(None, cache)],
        lock_attempts: tokio::sync::Semaphore::new(MAX_LOCK_ATTEMPTS_IN_FLIGHT),
        tasks: TaskTracker::new(),
        metrics,
    })
}

/// A LockedJob every second (always due), with the finalizer, `extra` merged in.
pub(super) fn locked_job(extra: Value) -> LockedJob {
    let mut value = json!({
        "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
        "metadata": {"name": "report", "namespace": "team-a", "uid": "u-1", "generation": 1,
            "resourceVersion": "7", "creationTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": ["lockedjob.dev/cleanup"]},
        "spec": {"schedule": "* * * * * *", "successfulJobsHistoryLimit": 1,
            "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
                "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "main", "image": "busybox"}]}}}}}
    });
    json_patch::merge(&mut value, &extra);
    serde_json::from_value(value).expect("locked job")
}

/// A finished Job of `report` (for history cleanup).
fn finished_job(minute: i64) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": format!("report-{minute}"), "namespace": "team-a",
            "creationTimestamp": format!("2026-01-01T00:{minute:02}:00Z"),
            "annotations": {"lockedjob.dev/scheduled-time": format!("2026-01-01T00:{minute:02}:00Z")},
            "labels": {"lockedjob.dev/locked-job": "report"},
            "ownerReferences": [{"apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
                "name": "report", "uid": "u-1"}]},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]}
    }))
    .expect("job")
}

fn ok_with(object: &LockedJob) -> Answer {
    let object = serde_json::to_value(object).expect("json");
    Box::new(move |_| (200, object.clone()))
}

/// One reconcile of `lj` against an API server answering with `answer`, with `jobs` cached;
/// its result, the requests it made (runs and Events included), and its context.
async fn reconcile_once(
    lj: LockedJob,
    answer: Answer,
    jobs: Vec<Job>,
) -> (Result<Action, super::Error>, Vec<Seen>, Arc<Context>) {
    let (client, seen) = api_server(answer);
    let ctx = context(client, jobs);
    let result = reconcile(Arc::new(lj), Arc::clone(&ctx)).await;
    let requests = requests(&ctx, &seen).await;
    (result, requests, ctx)
}

const LJ_PATH: &str = "/apis/lockedjob.dev/v1alpha1/namespaces/team-a/lockedjobs/report";

#[tokio::test]
async fn the_finalizer_is_added_before_anything_else() {
    let lj = locked_job(json!({"metadata": {"finalizers": null}}));
    let answer = ok_with(&lj);
    let (result, requests, _ctx) = reconcile_once(lj, answer, vec![]).await;
    let action = result.expect("reconcile");
    assert_eq!(action, Action::await_change());
    assert_eq!(requests.len(), 1, "{requests:#?}");
    let patch = &requests[0];
    assert_eq!(
        (patch.method.as_str(), patch.path.as_str()),
        ("PATCH", LJ_PATH)
    );
    assert!(
        patch.body.to_string().contains("lockedjob.dev/cleanup"),
        "{patch:?}"
    );
}

#[tokio::test]
async fn a_deleted_locked_job_loses_its_finalizer() {
    let lj = locked_job(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:10:00Z"}}));
    let answer = ok_with(&lj);
    let (result, requests, _ctx) = reconcile_once(lj, answer, vec![]).await;
    result.expect("reconcile");
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(requests[0].method, "PATCH");
    let body = requests[0].body.to_string();
    assert!(
        body.contains("remove") || !body.contains("cleanup"),
        "{body}"
    );
}

#[tokio::test]
async fn an_invalid_spec_is_reported_once() {
    let bad = locked_job(json!({"spec": {"schedule": "61 * * * *"}}));
    let answer = ok_with(&bad);
    let (result, first, _ctx) = reconcile_once(bad, answer, vec![]).await;
    result.expect("reconcile");
    let status = first
        .iter()
        .find(|r| r.method == "PATCH" && r.path == format!("{LJ_PATH}/status"))
        .expect("status written");
    let conditions = status.body["status"]["conditions"].clone();
    assert!(
        conditions.to_string().contains("InvalidSpec"),
        "{conditions}"
    );
    assert!(
        first
            .iter()
            .any(|r| r.method == "POST" && r.path.ends_with("/events")),
        "a Warning Event: {first:#?}"
    );

    // The status now shows it: the next reconcile writes nothing and publishes nothing.
    let reported = locked_job(json!({"spec": {"schedule": "61 * * * *"},
        "status": {"conditions": conditions, "observedGeneration": 1}}));
    let answer = ok_with(&reported);
    let (result, again, _ctx) = reconcile_once(reported, answer, vec![]).await;
    result.expect("reconcile");
    assert!(again.is_empty(), "{again:#?}");
}

#[tokio::test]
async fn finished_jobs_beyond_the_history_limit_are_deleted() {
    let lj = locked_job(json!({"spec": {"suspend": true}}));
    let answer = ok_with(&lj);
    let jobs = (1..=3).map(finished_job).collect();
    let (result, requests, _ctx) = reconcile_once(lj, answer, jobs).await;
    result.expect("reconcile");
    let deleted: Vec<String> = requests
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| r.path)
        .collect();
    let prefix = "/apis/batch/v1/namespaces/team-a/jobs/";
    assert_eq!(
        deleted,
        [format!("{prefix}report-1"), format!("{prefix}report-2")],
        "the oldest two of three, with a limit of one"
    );
}

#[tokio::test]
async fn a_conflicting_status_write_requeues_instead_of_failing() {
    let lj = locked_job(json!({"spec": {"suspend": true}}));
    let object = serde_json::to_value(&lj).expect("json");
    let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "the object has been modified", "reason": "Conflict", "code": 409});
    let (result, requests, _ctx) = reconcile_once(
        lj,
        Box::new(move |r| {
            if r.path.ends_with("/status") {
                (409, conflict.clone())
            } else {
                (200, object.clone())
            }
        }),
        vec![],
    )
    .await;
    let action = result.expect("not an error");
    assert_ne!(action, Action::await_change());
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(
        requests[0].body["metadata"]["resourceVersion"], "7",
        "guarded by the version this reconcile saw"
    );
}

#[tokio::test]
async fn a_due_time_whose_lock_is_refused_creates_nothing() {
    let lj = locked_job(json!({"spec": {"startingDeadlineSeconds": 10}}));
    let answer = ok_with(&lj);
    let (result, requests, ctx) = reconcile_once(lj, answer, vec![]).await;
    result.expect("reconcile");
    assert!(
        !requests.iter().any(|r| r.path.contains("/jobs")),
        "no Job without the lock: {requests:#?}"
    );
    assert!(
        !requests.iter().any(|r| r.path.ends_with("/events")),
        "no Acquired or Created Event: {requests:#?}"
    );
    let text = ctx.metrics.render();
    assert!(
        text.contains("lockedjob_lock_acquisitions_total{outcome=\"Failed\"} 1"),
        "one attempt, refused: {text}"
    );
}
