//! Reconcile one LockedJob: the finalizer (`kube::runtime::finalizer`), then observe (its Jobs
//! from the watch cache, the time, the Redis nodes answering), decide (`decide.rs`, pure) and
//! act. Runs happen in tasks of their own: a reconcile never waits on a lock or a Job.

use super::context::Context;
use super::decide::{decide, Backfill, Observed, Plan, RunNow, StatusUpdate, ValidPlan};
use super::error::Error;
use super::events::{self, Reason};
use super::jobs::is_running;
use super::names::FINALIZER;
use super::run;
use super::subject::Subject;
use crate::api::{BackfillPhase, LockedJob, ANNOTATION_BACKFILL};
use crate::schedule::TOO_MANY_MISSED;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::ResourceExt;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Fallback retry of a status write another replica won (the watch usually comes first).
const CONFLICT_PAUSE: Duration = Duration::from_secs(2);
/// Retry of a reconcile that failed (API trouble).
const ERROR_PAUSE: Duration = Duration::from_secs(5);

pub fn error_policy(lj: Arc<LockedJob>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(error.kind());
    if error.is_finalizer_race() {
        tracing::debug!(namespace = ?lj.namespace(), name = %lj.name_any(), "another replica added the finalizer first");
        return Action::requeue(run::jittered(CONFLICT_PAUSE));
    }
    tracing::warn!(namespace = ?lj.namespace(), name = %lj.name_any(), %error, "reconcile failed; retrying");
    Action::requeue(ERROR_PAUSE)
}

pub async fn reconcile(lj: Arc<LockedJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = lj.namespace().ok_or(Error::NoNamespace)?;
    let span = tracing::info_span!("reconcile", namespace = %namespace, name = %lj.name_any());
    let started = Instant::now();
    let api: Api<LockedJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, lj, |event| async {
        match event {
            Finalizer::Apply(lj) => apply(lj, Arc::clone(&ctx)).await,
            Finalizer::Cleanup(lj) => cleanup(lj, Arc::clone(&ctx)).await,
        }
    })
    .instrument(span)
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics.reconciled(started.elapsed());
    result
}

/// The LockedJob is being deleted: stop this replica's view of its active Jobs (their
/// supervisors see them go, release their locks and record the outcome); then kube removes
/// the finalizer.
async fn cleanup(lj: Arc<LockedJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let subject = Subject::of(lj)?;
    let seen = observe(&ctx, &subject).await?;
    let active: Vec<Job> = seen.jobs.into_iter().filter(is_running).collect();
    run::stop_all(&ctx, &subject.namespace, &active).await;
    tracing::info!("LockedJob deleted: its Jobs were stopped");
    Ok(Action::await_change())
}

async fn apply(lj: Arc<LockedJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    if ctx.shutdown.is_cancelled() {
        return Ok(Action::await_change());
    }
    let subject = Subject::of(lj)?;
    let seen = observe(&ctx, &subject).await?;
    match decide(&subject.lj, &subject.namespace, &seen) {
        Plan::Invalid { message, report } => {
            if let Some(status) = report {
                tracing::warn!(%message, "invalid spec");
                Box::pin(write_status(&ctx, &subject, status, false)).await?;
                events::publish(&ctx, &subject.lj, Reason::InvalidSpec, message);
            }
            Ok(Action::await_change())
        }
        Plan::Valid(plan) => act(&ctx, &subject, *plan, seen.jobs).await,
    }
}

/// The LockedJob's Jobs (its label and owner reference) from the watch cache, and the rest of
/// what `decide` needs.
async fn observe(ctx: &Context, subject: &Subject) -> Result<Observed, Error> {
    let jobs = ctx
        .jobs_of(subject)
        .await?
        .iter()
        .map(|j| Job::clone(j))
        .collect();
    Ok(Observed {
        now: Timestamp::now(),
        jobs,
        reachable: ctx.health.reported(),
        nodes: ctx.nodes(),
        quorum: ctx.engine.quorum(),
        holder: ctx.holder.clone(),
    })
}

async fn act(
    ctx: &Arc<Context>,
    subject: &Subject,
    plan: ValidPlan,
    jobs: Vec<Job>,
) -> Result<Action, Error> {
    let (lj, namespace) = (&subject.lj, subject.namespace.as_str());
    let spawn_run = |scheduled, kind| {
        let run = run::Run {
            subject: subject.clone(),
            valid: Arc::clone(&plan.valid),
            scheduled,
            kind,
        };
        ctx.tasks.spawn(run::start(Arc::clone(ctx), run));
    };
    match &plan.run_now {
        Some(RunNow::Requested(requested)) => spawn_run(*requested, run::RunKind::Manual),
        Some(RunNow::Refused { value, message }) => {
            tracing::warn!(%message, "invalid run-now request");
            events::publish(ctx, lj, Reason::InvalidRunNow, message.clone());
            Box::pin(run::clear_run_now(ctx, subject, value)).await;
        }
        None => {}
    }
    match &plan.backfill {
        Some(Backfill::Start(range, time)) => spawn_run(*time, run::RunKind::Backfill(*range)),
        Some(Backfill::Refused { value, message }) => {
            tracing::warn!(%message, "invalid backfill request");
            events::publish(ctx, lj, Reason::InvalidBackfill, message.clone());
            Box::pin(run::clear_annotation(
                ctx,
                subject,
                ANNOTATION_BACKFILL,
                value,
            ))
            .await;
        }
        None => {}
    }
    check_orphans(ctx, subject, &plan, jobs);
    if let Some((scheduled, replace)) = &plan.start {
        if plan.missed_too_many {
            events::publish(ctx, lj, Reason::TooManyMissedTimes, format!(
                "more than {TOO_MANY_MISSED} missed start times; running only the latest. Set or decrease spec.startingDeadlineSeconds or check clock skew"));
        }
        let kind = run::RunKind::Scheduled {
            replace: replace.clone(),
        };
        spawn_run(*scheduled, kind);
    }
    delete_history(ctx, namespace, &plan.delete);
    if let Some(status) = plan.status {
        if let Some(wait) = status.defer {
            // The run's own status patch usually writes this change first; look again after.
            return Ok(Action::requeue(plan.requeue.min(wait)));
        }
        let backfill = status.backfill.clone();
        if !Box::pin(write_status(ctx, subject, status, true)).await? {
            // Another replica wrote first: its version reaches us through the watch and
            // reconciles again anyway. Retrying at once made three replicas whose Job caches
            // lag each other fight over `active` (130 conflicts/s at 200 LockedJobs on a real
            // API server), so the fallback comes late and jittered.
            return Ok(Action::requeue(run::jittered(CONFLICT_PAUSE)));
        }
        // The replica whose write landed tells; the others' writes were refused.
        if let Some(b) = backfill {
            let range = b.range().annotation();
            match b.phase {
                BackfillPhase::Complete => events::publish(ctx, lj, Reason::BackfillComplete,
                    format!("backfill {range}: all {} scheduled times started", b.total)),
                BackfillPhase::Cancelled => events::publish(ctx, lj, Reason::BackfillCancelled,
                    format!("backfill {range} cancelled after {} of {} times; a run already started finishes", b.started, b.total)),
                BackfillPhase::Running => {}
            }
        }
    }
    Ok(Action::requeue(plan.requeue))
}

/// Active Jobs nobody here supervises may have lost their holder: check each candidate (a TTL
/// old, see `ValidPlan::orphan_candidates`) at most once per renew interval, or later when the
/// last check saw the holder's value live on (`Runs::defer_orphan_check`).
fn check_orphans(ctx: &Arc<Context>, subject: &Subject, plan: &ValidPlan, jobs: Vec<Job>) {
    let now = Instant::now();
    let every = plan.valid.timing.renew_interval;
    for job in jobs
        .into_iter()
        .filter(|j| plan.orphan_candidates.contains(&j.name_any()))
    {
        let key = (subject.namespace.clone(), job.name_any());
        if ctx.runs.is_supervised(&key) || !ctx.runs.orphan_check_due(&key, now, every) {
            continue;
        }
        let candidate = run::Candidate::of(&job);
        let check = run::check_orphan(
            Arc::clone(ctx),
            subject.clone(),
            Arc::clone(&plan.valid),
            candidate,
        );
        ctx.tasks.spawn(check);
    }
}

/// Deletes finished Jobs beyond the history limits in a task of their own: a reconcile waiting
/// on them would hold one of the controller's reconcile slots, and under load the next
/// LockedJobs' runs queued behind them. A Job already asked for recently is left alone
/// (`Runs::delete_due`); a failed delete is tried again by a later reconcile.
fn delete_history(ctx: &Arc<Context>, namespace: &str, doomed: &[String]) {
    let now = Instant::now();
    let due: Vec<String> = doomed
        .iter()
        .filter(|name| {
            ctx.runs
                .delete_due(&(namespace.to_string(), name.to_string()), now)
        })
        .cloned()
        .collect();
    if due.is_empty() {
        return;
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), namespace);
    let deletes = async move {
        for name in due {
            if let Err(error) = jobs.delete(&name, &DeleteParams::background()).await {
                tracing::debug!(job = %name, %error, "history Job not deleted; a later reconcile tries again");
            }
        }
    };
    ctx.tasks
        .spawn(deletes.instrument(tracing::Span::current()));
}

/// Merge-patches the status; with `guarded`, only over the version this reconcile saw.
/// Returns false when another writer came first (409).
async fn write_status(
    ctx: &Context,
    subject: &Subject,
    status: StatusUpdate,
    guarded: bool,
) -> Result<bool, Error> {
    let mut patch = json!({"status": {"conditions": status.conditions,
        "observedGeneration": status.observed_generation}});
    if let Some(active) = status.active {
        patch["status"]["active"] = json!(active);
    }
    if let Some(backfill) = status.backfill {
        patch["status"]["backfill"] = json!(backfill);
    }
    if guarded {
        patch["metadata"] = json!({"resourceVersion": subject.lj.resource_version()});
    }
    let api: Api<LockedJob> = subject.api(&ctx.client);
    match api
        .patch_status(&subject.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 && guarded => Ok(false),
        Err(e) => Err(e.into()),
    }
}
