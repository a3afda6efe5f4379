//! Stage 3 of a run: renew the lease under the watchdog while the Job runs, act on lease loss
//! (delete the Job and its pods before the deadline, unless another holder has it now), and
//! record how the run ended (docs/design.md, "A run's life in the operator", 3 to 6).

use super::super::context::Context;
use super::super::events::{self, Reason};
use super::super::jobs::{job_state, JobState, LABEL_POD_JOB_NAME};
use super::super::runs::{Claim, JobKey};
use super::super::status::{condition_is_true, ConditionUpdate};
use super::super::subject::Subject;
use super::report::{
    active_after, bounded, patch_status, record, update_condition, API_CALL_LIMIT,
};
use crate::api::{conditions, RunOutcome};
use crate::metrics::RunResult;
use crate::redlock::{Lease, LeaseTiming, Watchdog};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A run this replica holds the lock of, with its Job created.
pub struct HeldRun {
    pub job_name: String,
    pub lease: Lease,
    pub timing: LeaseTiming,
    pub scheduled: Timestamp,
}

/// How supervision ended.
enum End {
    Finished(JobState),
    /// The Job disappeared (deleted by a user, or by the LockedJob's deletion).
    Gone,
    LockLost,
    HandedOver,
}

/// Renews the lease while the Job runs; acts on lease loss; records the outcome. The caller
/// claimed the Job before it had one to supervise (before creating or adopting it): a claim
/// taken only here let an orphan check of this replica hold the Job at that moment, and the
/// run then walked away from its lease without a word (seen with a holder paused past its TTL).
pub async fn supervise(
    ctx: &Context,
    subject: Subject,
    run: HeldRun,
    _supervising: Claim<'_, JobKey>,
) {
    let namespace = &subject.namespace;
    let jobs: Api<Job> = subject.api(&ctx.client);
    // Dropped on every path out of here, which ends its renewals.
    let watchdog = Watchdog::spawn(ctx.engine.clone(), run.lease.clone(), run.timing);
    let end = watch_job(ctx, &jobs, namespace, &run.job_name, watchdog.lost()).await;
    match end {
        End::LockLost => {
            let deadline = watchdog.status().deadline;
            let _ = watchdog.stop().await;
            on_lock_lost(ctx, &subject, &jobs, &run, deadline).await;
        }
        End::HandedOver => {
            // Release, so another replica acquires the lock afresh and adopts the Job.
            watchdog.release(&ctx.engine).await;
            tracing::info!(job = %run.job_name, "shutting down: lock released for another replica to adopt the Job");
        }
        End::Gone => {
            watchdog.release(&ctx.engine).await;
            ctx.metrics.record_run(RunResult::Stopped);
            let message = Some("the Job was deleted".to_string());
            let last = record(
                &run.lease,
                &run.job_name,
                run.scheduled,
                RunOutcome::Stopped,
                message,
            );
            patch_status(ctx, &subject, json!({"lastRun": last})).await;
        }
        End::Finished(state) => {
            let held = watchdog.release(&ctx.engine).await;
            on_finished(ctx, &subject, &run, state, held).await;
        }
    }
}

/// Polls the Job (from the watch cache) until it finishes or goes, the lease is lost, or the
/// replica shuts down.
async fn watch_job(
    ctx: &Context,
    jobs: &Api<Job>,
    namespace: &str,
    job_name: &str,
    lost: CancellationToken,
) -> End {
    loop {
        tokio::select! {
            biased;
            _ = lost.cancelled() => return End::LockLost,
            _ = ctx.shutdown.cancelled() => return End::HandedOver,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        // Only a Job the cache does not have (just created, or gone) costs a GET.
        let job = match ctx.cached_job(namespace, job_name) {
            Some(job) => job,
            None => match tokio::time::timeout(API_CALL_LIMIT, jobs.get_opt(job_name)).await {
                Ok(Ok(Some(job))) => Arc::new(job),
                Ok(Ok(None)) => return End::Gone,
                // API trouble: keep the lease; the Job runs on regardless.
                _ => continue,
            },
        };
        match job_state(&job) {
            JobState::Active => {}
            finished => return End::Finished(finished),
        }
    }
}

/// Someone else holding the lock now (we were paused, they adopted the Job) owns the Job;
/// otherwise nobody may run it without a lease: stop it before our deadline.
async fn on_lock_lost(
    ctx: &Context,
    subject: &Subject,
    jobs: &Api<Job>,
    run: &HeldRun,
    deadline: Instant,
) {
    ctx.metrics.record_run(RunResult::LockLost);
    let (lease, job_name) = (&run.lease, &run.job_name);
    let message = match ctx.engine.current_holder(lease.name()).await {
        Some(holder) if holder != lease.holder() => {
            tracing::warn!(new_holder = %holder, "lease lost; another holder has the lock now, leaving the Job to it");
            format!(
                "lease on {} lost; {holder} holds the lock now",
                lease.name()
            )
        }
        _ => {
            let left = deadline.saturating_duration_since(Instant::now());
            tracing::error!(
                left_ms = left.as_millis() as u64,
                "lease lost: deleting the Job before the lease deadline"
            );
            stop_job(ctx, subject, jobs, job_name, deadline).await;
            format!("lease on {} lost (no Redis quorum renewed it); Job {job_name} and its pods deleted before the lease deadline", lease.name())
        }
    };
    events::publish(ctx, &subject.lj, Reason::LockLost, message.clone());
    let update = ConditionUpdate {
        kind: conditions::LOCK_LOST,
        status: true,
        reason: "LeaseLost",
        message: &message,
        generation: None,
    };
    update_condition(ctx, subject, update).await;
    let last = record(
        lease,
        job_name,
        run.scheduled,
        RunOutcome::LockLost,
        Some(message),
    );
    patch_status(ctx, subject, json!({"lastRun": last})).await;
}

/// Deletes the Job, then its pods. The Job controller makes no pod for a Job being deleted,
/// but the pods it already made go only when the garbage collector gets to them: after an API
/// server restart a Pending pod outlived its Job's deletion, was scheduled and ran without a
/// lease (seen in the cluster soak). A Pending pod is removed at once when deleted.
async fn stop_job(
    ctx: &Context,
    subject: &Subject,
    jobs: &Api<Job>,
    job_name: &str,
    deadline: Instant,
) {
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100))
    };
    bounded(left(), jobs.delete(job_name, &DeleteParams::foreground())).await;
    let pods: Api<Pod> = subject.api(&ctx.client);
    let of_the_job = ListParams::default().labels(&format!("{LABEL_POD_JOB_NAME}={job_name}"));
    bounded(
        left(),
        pods.delete_collection(&DeleteParams::default(), &of_the_job),
    )
    .await;
}

async fn on_finished(ctx: &Context, subject: &Subject, run: &HeldRun, state: JobState, held: bool) {
    let lj = &subject.lj;
    let succeeded = state == JobState::Succeeded;
    let (outcome, result, reason) = if succeeded {
        (
            RunOutcome::Succeeded,
            RunResult::Succeeded,
            Reason::Completed,
        )
    } else {
        (RunOutcome::Failed, RunResult::Failed, Reason::Failed)
    };
    ctx.metrics.record_run(result);
    let job_name = &run.job_name;
    tracing::info!(job = %job_name, ?outcome, lease_held = held, "run finished; lock released");
    let verb = if succeeded { "completed" } else { "failed" };
    events::publish(ctx, lj, reason, format!("Job {job_name} {verb}"));
    let mut status = json!({"lastRun": record(&run.lease, job_name, run.scheduled, outcome, None)});
    if succeeded {
        status["lastSuccessfulTime"] = json!(Timestamp::now().to_string());
    }
    if let Some(active) = active_after(ctx, subject, None, Some(job_name)).await {
        status["active"] = json!(active);
    }
    patch_status(ctx, subject, status).await;
    let lock_lost_shown = lj
        .status
        .as_ref()
        .is_some_and(|s| condition_is_true(&s.conditions, conditions::LOCK_LOST));
    if lock_lost_shown {
        let update = ConditionUpdate {
            kind: conditions::LOCK_LOST,
            status: false,
            reason: "LeaseHeld",
            message: "the last run kept its lease",
            generation: None,
        };
        update_condition(ctx, subject, update).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{on_lock_lost, HeldRun};
    use crate::controller::reconcile_tests::{api_server, context_on, locked_job, requests};
    use crate::controller::subject::Subject;
    use crate::lab::harness::{Persistence, RedisNodes};
    use crate::redlock::LeaseTiming;
    use jiff::Timestamp;
    use k8s_openapi::api::batch::v1::Job;
    use kube::api::Api;
    use serde_json::json;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// With the lease lost and nobody else holding the lock, the Job is deleted and then its
    /// pods, by the Job controller's label: a Pending pod must not wait for the garbage
    /// collector (against real nodes, which still name this replica as the holder).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
    async fn a_lost_lease_deletes_the_job_then_its_pods() {
        let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
        let (client, seen) = api_server(Box::new(|_| (200, json!({}))));
        let ctx = context_on(client, Vec::new(), nodes.urls(), Duration::from_secs(2));
        let ttl = Duration::from_secs(30);
        let lease = ctx
            .engine
            .try_acquire("lockedjob:team-a:report", ttl)
            .await
            .expect("the lock");
        let subject = Subject::of(Arc::new(locked_job(json!({})))).expect("namespaced");
        let jobs: Api<Job> = subject.api(&ctx.client);
        let run = HeldRun {
            job_name: "report-29000000".into(),
            lease,
            timing: LeaseTiming::from_ttl(ttl),
            scheduled: Timestamp::now(),
        };
        let deadline = Instant::now() + Duration::from_secs(5);

        on_lock_lost(&ctx, &subject, &jobs, &run, deadline).await;

        let deletes: Vec<_> = requests(&ctx, &seen)
            .await
            .into_iter()
            .filter(|r| r.method == "DELETE")
            .collect();
        let paths: Vec<&str> = deletes.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/apis/batch/v1/namespaces/team-a/jobs/report-29000000",
                "/api/v1/namespaces/team-a/pods",
            ],
            "{deletes:#?}"
        );
        assert!(
            deletes[1]
                .query
                .contains("labelSelector=batch.kubernetes.io%2Fjob-name%3Dreport-29000000"),
            "only the Job's pods: {:?}",
            deletes[1].query
        );
    }
}
