//! Stage 1 of a run: win the lock for the scheduled time, or learn why not
//! (docs/design.md, "Acquire").

use super::super::context::Context;
use super::super::decide::backfill_status;
use super::report::patch_status;
use super::{step_of, NotStarted, Run, RunKind};
use crate::api::BackfillPhase;
use crate::redlock::{Lease, LockError};
use jiff::Timestamp;
use serde_json::json;
use tokio::sync::SemaphorePermit;

/// One lock attempt for the run's time, in the slot `attempt` of `Context::lock_attempts`. The
/// scheduled time is the lock's progress step: the engine reads the progress register in
/// phase 1 and records this time in phase 2, so a runner (another replica or cluster) that
/// wins the lock after this time already started does not run it again. A manual run takes
/// the lock without a step; a backfill run's step goes to the backfill's own register.
pub(super) async fn acquire(
    ctx: &Context,
    run: &Run,
    attempt: SemaphorePermit<'_>,
) -> Result<Lease, NotStarted> {
    let acquired = {
        // Held for the attempt only, not for the run.
        let _attempt = attempt;
        let (lock, ttl) = (run.lock(), run.valid.timing.ttl);
        match run.kind.step_register(lock) {
            None => ctx.engine.try_acquire(lock, ttl).await,
            Some(register) => {
                ctx.engine
                    .try_acquire_step_in(lock, ttl, &register, step_of(run.scheduled))
                    .await
            }
        }
    };
    match acquired {
        Ok(lease) => Ok(lease),
        Err(e) => Err(not_started(ctx, run, e).await),
    }
}

/// Why the attempt did not win, and what that means for trying the run's time again.
async fn not_started(ctx: &Context, run: &Run, error: LockError) -> NotStarted {
    let (scheduled, kind) = (run.scheduled, &run.kind);
    let manual = matches!(kind, RunKind::Manual);
    match error {
        LockError::Contended { progress, .. } | LockError::SplitVote { progress, .. }
            if progress >= step_of(scheduled) && !manual =>
        {
            tracing::debug!("another runner holds the lock and runs this time");
            NotStarted::RunningElsewhere
        }
        // Nobody won (the replicas split the nodes) and so nobody will record a run: waiting
        // for the LockedJob's status to change would wait a whole TTL and could miss the time.
        e @ LockError::SplitVote { .. } => {
            tracing::debug!(error = %e, "split vote; trying again after a short random pause");
            NotStarted::Failed
        }
        e if e.is_contended() => {
            tracing::debug!("the lock is held (by an earlier run); trying again when it frees");
            NotStarted::Contended
        }
        LockError::StepDone { done, .. } => {
            tracing::info!("this scheduled time already ran elsewhere; not running it again");
            // The register holds the latest time started: everything up to it is done, and
            // jumping there saves a lock round per time another cluster already ran.
            let done = Timestamp::from_millisecond(done.min(i64::MAX as u64) as i64)
                .map_or(scheduled, |t| t.max(scheduled));
            let status = match kind {
                RunKind::Backfill(range) => json!({"backfill": backfill_status(
                    range, &run.valid.policy.schedule, Some(done), BackfillPhase::Running)}),
                _ => json!({"lastScheduleTime": done.to_string()}),
            };
            patch_status(ctx, &run.subject, status).await;
            NotStarted::AlreadyRan
        }
        e => {
            tracing::warn!(error = %e, "lock not acquired; the run waits for the next attempt");
            NotStarted::Failed
        }
    }
}
