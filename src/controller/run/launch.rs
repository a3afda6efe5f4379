//! Stage 2 of a run: with the lock won, stop the Jobs `Replace` names, create the run's Job
//! (retrying while the lease leaves room) and record the run in the LockedJob's status.

use super::super::context::Context;
use super::super::decide::backfill_status;
use super::super::events::{self, Reason};
use super::super::jobs::{build_job, Origin, RunIdentity};
use super::super::names::MANAGER;
use super::acquire::acquire;
use super::report::{active_after, bounded, clear_run_now, patch_status, record, API_CALL_LIMIT};
use super::{NotStarted, Run, RunKind};
use crate::api::{BackfillPhase, RunOutcome};
use crate::metrics::RunResult;
use crate::redlock::Lease;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use std::time::Duration;
use tokio::sync::SemaphorePermit;

/// A run whose Job exists, ready to be supervised.
pub(super) struct Launched {
    pub lease: Lease,
    pub job_name: String,
}

/// Acquires the lock for the run's time (in the lock-attempt slot `attempt`) and creates the
/// run's Job.
pub(super) async fn launch(
    ctx: &Context,
    run: &Run,
    attempt: SemaphorePermit<'_>,
) -> Result<Launched, NotStarted> {
    if ctx.shutdown.is_cancelled() {
        return Err(NotStarted::Failed);
    }
    let lease = acquire(ctx, run, attempt).await?;
    tracing::Span::current().record("token", lease.token());
    let (subject, scheduled) = (&run.subject, run.scheduled);
    let jobs: Api<Job> = subject.api(&ctx.client);
    let replace: &[String] = match &run.kind {
        RunKind::Scheduled { replace } => replace,
        _ => &[],
    };
    for name in replace {
        tracing::info!(job = %name, "concurrencyPolicy Replace: stopping the active Job");
        bounded(
            API_CALL_LIMIT,
            jobs.delete(name, &DeleteParams::foreground()),
        )
        .await;
    }
    let job_name = run.job_name();
    let job = build_job(
        &subject.lj,
        &RunIdentity {
            job_name: &job_name,
            scheduled,
            lock_name: run.lock(),
            lock_value: lease.value(),
            holder: lease.holder(),
            token: lease.token(),
            origin: run.kind.origin(),
        },
    );
    // The time is already recorded as started (phase 2), so nobody else will run it: keep
    // trying to create the Job while the lease leaves room, or it is lost.
    let created = create_job(&jobs, &job, &lease).await;
    if !report_created(ctx, run, &lease, &job_name, &created).await {
        ctx.engine.release(&lease).await;
        return Err(NotStarted::Failed);
    }
    let mut status =
        json!({"lastRun": record(&lease, &job_name, scheduled, RunOutcome::Running, None)});
    match &run.kind {
        // Done with the request: no replica may act on it again.
        RunKind::Manual => clear_run_now(ctx, subject, &scheduled.to_string()).await,
        RunKind::Scheduled { .. } => status["lastScheduleTime"] = json!(scheduled.to_string()),
        RunKind::Backfill(range) => {
            let progress = backfill_status(
                range,
                &run.valid.policy.schedule,
                Some(scheduled),
                BackfillPhase::Running,
            );
            status["backfill"] = json!(progress);
        }
    }
    let new_job = match &created {
        Created::New(job) => Some(job.as_ref()),
        _ => None,
    };
    if let Some(active) = active_after(ctx, subject, new_job, None).await {
        status["active"] = json!(active);
    }
    patch_status(ctx, subject, status).await;
    Ok(Launched { lease, job_name })
}

/// Logs, counts and publishes how the create went; false when there is no Job to supervise.
async fn report_created(
    ctx: &Context,
    run: &Run,
    lease: &Lease,
    job_name: &str,
    created: &Created,
) -> bool {
    let (lj, scheduled, origin) = (&run.subject.lj, run.scheduled, run.kind.origin());
    match created {
        Created::New(_) => {
            // Lag counts from the start the jitter gives the time (the time itself without
            // jitter).
            let start = run.valid.policy.start_of(scheduled);
            let lag = (Timestamp::now() - start).get_milliseconds().max(0) as u64;
            if origin == Origin::Schedule {
                ctx.metrics.record_schedule_lag(Duration::from_millis(lag));
            }
            tracing::info!(job = %job_name, lag_ms = lag, "Job created");
            // One Event for the lock and the Job: a separate `Acquired` Event a moment before
            // doubled the Events of every run (a third of the operator's API writes at scale).
            let note = format!("created Job {job_name} for {scheduled}: {}", held(lease));
            events::publish(ctx, lj, Reason::Created, note);
            true
        }
        Created::Existed => {
            tracing::info!(job = %job_name, "the Job already exists (created by an earlier holder or an attempt whose reply was lost); supervising it");
            let note = format!(
                "Job {job_name} for {scheduled} exists already, supervising it: {}",
                held(lease)
            );
            events::publish(ctx, lj, Reason::Acquired, note);
            true
        }
        Created::Failed(message) => {
            tracing::error!(job = %job_name, error = %message, "Job not created; this scheduled time is skipped");
            ctx.metrics.record_run(RunResult::CreateFailed);
            let note = format!(
                "cannot create Job {job_name} for {scheduled}, the run is skipped ({}): {message}",
                held(lease)
            );
            events::publish(ctx, lj, Reason::CreateFailed, note);
            if origin == Origin::Manual {
                clear_run_now(ctx, &run.subject, &scheduled.to_string()).await;
            }
            false
        }
    }
}

/// Who holds which lock with which token, for an Event's note.
fn held(lease: &Lease) -> String {
    format!(
        "lock {} held by {} with fencing token {}",
        lease.name(),
        lease.holder(),
        lease.token()
    )
}

/// How creating a run's Job ended.
enum Created {
    /// Created: the Job as the API server returned it.
    New(Box<Job>),
    /// The name exists: an earlier holder's Job, or our own attempt whose reply was lost.
    Existed,
    /// Not created, with why.
    Failed(String),
}

/// Creates `job`, retrying timeouts, transport errors, 429 and 5xx while the lease has room
/// for another bounded attempt. The deterministic name makes a retry safe: a 409 means an
/// earlier attempt landed. Other 4xx (invalid template, forbidden) will not heal by retrying.
async fn create_job(jobs: &Api<Job>, job: &Job, lease: &Lease) -> Created {
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    let mut pause = Duration::from_millis(200);
    loop {
        let failure = match tokio::time::timeout(API_CALL_LIMIT, jobs.create(&params, job)).await {
            Ok(Ok(created)) => return Created::New(Box::new(created)),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => return Created::Existed,
            Ok(Err(kube::Error::Api(s))) if s.code != 429 && s.code < 500 => {
                return Created::Failed(format!("{} ({})", s.message, s.code))
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {API_CALL_LIMIT:?}"),
        };
        if lease.remaining() < API_CALL_LIMIT + pause {
            return Created::Failed(format!("{failure}; gave up before the lease ran out"));
        }
        tracing::warn!(error = %failure, "Job create failed; retrying");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
