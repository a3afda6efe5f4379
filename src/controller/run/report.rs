//! What a run writes to the API server besides its Job: the LockedJob's status and
//! conditions, the run-now annotation cleared, Jobs stopped. Every call is bounded: a run
//! whose lease runs out must not wait on the API server past it.

use super::super::context::Context;
use super::super::decide::active_list;
use super::super::jobs::is_running;
use super::super::status::{set_condition, ConditionUpdate};
use super::super::subject::Subject;
use crate::api::{LockedJob, RunOutcome, RunRecord, ANNOTATION_RUN_NOW};
use crate::redlock::Lease;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;
use std::time::Duration;

/// API calls made while a lease runs out must not outlast it (kube retries 503s for minutes).
pub(super) const API_CALL_LIMIT: Duration = Duration::from_secs(5);

pub(super) async fn bounded<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Option<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(value)) => Some(value),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "Kubernetes API call failed");
            None
        }
        Err(_) => {
            tracing::warn!(
                limit_ms = limit.as_millis() as u64,
                "Kubernetes API call timed out"
            );
            None
        }
    }
}

/// Merge-patches the LockedJob's status.
pub(super) async fn patch_status(ctx: &Context, subject: &Subject, status: serde_json::Value) {
    let api: Api<LockedJob> = subject.api(&ctx.client);
    bounded(
        API_CALL_LIMIT,
        api.patch_status(
            &subject.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        ),
    )
    .await;
}

/// `status.active` once `started` began or `ended` finished: the LockedJob's running Jobs in
/// this replica's cache with that one added or removed, built as `decide` builds it. The
/// run's own status patch carries it, so the other replicas can leave it alone
/// (`decide::ACTIVE_GRACE`). `None` when the cache cannot be read.
pub(super) async fn active_after(
    ctx: &Context,
    subject: &Subject,
    started: Option<&Job>,
    ended: Option<&str>,
) -> Option<Vec<ObjectReference>> {
    let cached = ctx.jobs_of(subject).await.ok()?;
    let running = cached.iter().map(|j| j.as_ref()).filter(|j| is_running(j));
    Some(active_list(
        running
            .chain(started)
            .filter(|j| Some(j.name_any().as_str()) != ended),
    ))
}

/// Read-modify-write of the conditions, guarded by resourceVersion, retried on conflict.
/// (The update's generation is replaced by the current object's.)
pub(super) async fn update_condition(
    ctx: &Context,
    subject: &Subject,
    update: ConditionUpdate<'_>,
) {
    let api: Api<LockedJob> = subject.api(&ctx.client);
    for _ in 0..5 {
        let Some(current) = bounded(API_CALL_LIMIT, api.get(&subject.name)).await else {
            return;
        };
        let mut conditions = current.status.clone().unwrap_or_default().conditions;
        let update = ConditionUpdate {
            generation: current.metadata.generation,
            ..update
        };
        set_condition(&mut conditions, update, Timestamp::now());
        let patch = json!({"metadata": {"resourceVersion": current.resource_version()}, "status": {"conditions": conditions}});
        match tokio::time::timeout(
            API_CALL_LIMIT,
            api.patch_status(&subject.name, &PatchParams::default(), &Patch::Merge(patch)),
        )
        .await
        {
            Ok(Ok(_)) => return,
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => continue,
            _ => return,
        }
    }
}

pub(super) fn record(
    lease: &Lease,
    job_name: &str,
    scheduled: Timestamp,
    outcome: RunOutcome,
    message: Option<String>,
) -> serde_json::Value {
    serde_json::to_value(RunRecord {
        scheduled_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(scheduled),
        job_name: job_name.into(),
        fencing_token: lease.token() as i64,
        holder: lease.holder().into(),
        outcome,
        message,
    })
    .unwrap_or_default()
}

/// Removes the `lockedjob.dev/run-now` annotation if it still holds `value` (a newer request
/// written meanwhile stays).
pub async fn clear_run_now(ctx: &Context, subject: &Subject, value: &str) {
    clear_annotation(ctx, subject, ANNOTATION_RUN_NOW, value).await;
}

/// Removes annotation `key` if it still holds `value`.
pub async fn clear_annotation(ctx: &Context, subject: &Subject, key: &str, value: &str) {
    let api: Api<LockedJob> = subject.api(&ctx.client);
    // JSON pointer escaping of the annotation key: '/' is '~1'.
    let path = format!(
        "/metadata/annotations/{}",
        key.replace('~', "~0").replace('/', "~1")
    );
    let patch = json!([
        {"op": "test", "path": path, "value": value},
        {"op": "remove", "path": path},
    ]);
    let Ok(patch) = serde_json::from_value::<json_patch::Patch>(patch) else {
        return;
    };
    bounded(
        API_CALL_LIMIT,
        api.patch(
            &subject.name,
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        ),
    )
    .await;
}

/// Stops this replica's Jobs of a LockedJob being deleted (supervisors see them go, release
/// their locks, and record the outcome).
pub async fn stop_all(ctx: &Context, namespace: &str, jobs: &[Job]) {
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), namespace);
    for job in jobs {
        bounded(
            API_CALL_LIMIT,
            api.delete(&job.name_any(), &DeleteParams::foreground()),
        )
        .await;
    }
}
