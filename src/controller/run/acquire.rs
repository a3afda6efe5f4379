//! Stage 1 of a run: win the lock for the scheduled time, or learn why not
//! (docs/design.md, "Acquire").

use super::report::patch_status;
use super::NotStarted;
use crate::api::{LockedJob, ValidSpec};
use crate::redlock::{Lease, LockError};
use jiff::Timestamp;
use serde_json::json;

use super::super::Context;

/// One lock attempt for `scheduled`. The scheduled time is the lock's progress step: the
/// engine reads the progress register in phase 1 and records this time in phase 2, so a
/// runner (another replica or cluster) that wins the lock after this time already started
/// does not run it again. A manual run takes the lock without a step.
pub(super) async fn acquire(
    ctx: &Context,
    lj: &LockedJob,
    valid: &ValidSpec,
    scheduled: Timestamp,
    manual: bool,
) -> Result<Lease, NotStarted> {
    let scheduled_ms = scheduled.as_millisecond().max(0) as u64;
    let acquired = {
        // Held for the attempt only, not for the run.
        let Ok(_permit) = ctx.lock_attempts.acquire().await else {
            return Err(NotStarted::Failed);
        };
        let (lock, ttl) = (&valid.lock_name, valid.timing.ttl);
        if manual {
            ctx.engine.try_acquire(lock, ttl).await
        } else {
            ctx.engine.try_acquire_step(lock, ttl, scheduled_ms).await
        }
    };
    match acquired {
        Ok(lease) => Ok(lease),
        Err(e) => Err(not_started(ctx, lj, scheduled, manual, e).await),
    }
}

/// Why the attempt did not win, and what that means for trying `scheduled` again.
async fn not_started(
    ctx: &Context,
    lj: &LockedJob,
    scheduled: Timestamp,
    manual: bool,
    error: LockError,
) -> NotStarted {
    let scheduled_ms = scheduled.as_millisecond().max(0) as u64;
    match error {
        LockError::Contended { progress, .. } | LockError::SplitVote { progress, .. }
            if progress >= scheduled_ms && !manual =>
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
        LockError::StepDone { .. } => {
            tracing::info!("this scheduled time already ran elsewhere; not running it again");
            patch_status(ctx, lj, json!({"lastScheduleTime": scheduled.to_string()})).await;
            NotStarted::AlreadyRan
        }
        e => {
            tracing::warn!(error = %e, "lock not acquired; the run waits for the next attempt");
            NotStarted::Failed
        }
    }
}
