//! One run's life: win the lock, create the Job, supervise it under the watchdog, and give it
//! up (deleting the Job before the lease deadline) when the lease is lost. Also adoption of
//! Jobs whose holder vanished.

use super::events::{self, Reason};
use super::jobs::{build_job, job_state, JobState, RunIdentity};
use super::status::{set_condition, ConditionUpdate};
use super::{Context, MANAGER};
use crate::api::{conditions, LockedJob, RunOutcome, RunRecord, ValidSpec, ANNOTATION_RUN_NOW};
use crate::metrics::{self, RunResult};
use crate::redlock::{Lease, LeaseTiming, LockError, Watchdog};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

/// API calls made while a lease runs out must not outlast it (kube retries 503s for minutes).
const API_CALL_LIMIT: Duration = Duration::from_secs(5);

async fn bounded<T>(
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
async fn patch_status(ctx: &Context, lj: &LockedJob, status: serde_json::Value) {
    let api: Api<LockedJob> =
        Api::namespaced(ctx.client.clone(), &lj.namespace().unwrap_or_default());
    bounded(
        API_CALL_LIMIT,
        api.patch_status(
            &lj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        ),
    )
    .await;
}

/// Read-modify-write of the conditions, guarded by resourceVersion, retried on conflict.
/// (The update's generation is replaced by the current object's.)
async fn update_condition(ctx: &Context, lj: &LockedJob, update: ConditionUpdate<'_>) {
    let api: Api<LockedJob> =
        Api::namespaced(ctx.client.clone(), &lj.namespace().unwrap_or_default());
    for _ in 0..5 {
        let Some(current) = bounded(API_CALL_LIMIT, api.get(&lj.name_any())).await else {
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
            api.patch_status(
                &lj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            ),
        )
        .await
        {
            Ok(Ok(_)) => return,
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => continue,
            _ => return,
        }
    }
}

fn record(
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

/// Marks `key` as taken by this replica; false when it already was (a poisoned set counts as
/// taken, so nothing runs twice).
fn claim<K: Clone + Eq + std::hash::Hash>(set: &Mutex<HashSet<K>>, key: &K) -> bool {
    set.lock()
        .map(|mut s| s.insert(key.clone()))
        .unwrap_or(false)
}

fn unclaim<K: Eq + std::hash::Hash>(set: &Mutex<HashSet<K>>, key: &K) {
    if let Ok(mut s) = set.lock() {
        s.remove(key);
    }
}

/// The LockedJob's last run as status shows it (Job, outcome, token), hashed: when it changes,
/// the lock holder has moved on.
fn last_run_tag(lj: &LockedJob) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    if let Some(run) = lj.status.as_ref().and_then(|s| s.last_run.as_ref()) {
        (&run.job_name, run.outcome, run.fencing_token).hash(&mut hasher);
    }
    hasher.finish()
}

/// What starts a run.
#[derive(Debug, Clone)]
pub enum RunKind {
    /// A due scheduled time; `replace` names active Jobs to stop first (concurrencyPolicy
    /// Replace).
    Scheduled { replace: Vec<String> },
    /// The `lockedjob.dev/run-now` annotation, requested for the time it holds. Like
    /// `kubectl create job --from=cronjob/x`: outside the schedule, so it neither reads nor
    /// advances the lock's progress register, nor `lastScheduleTime`.
    Manual,
}

/// Tries to run `lj` for `scheduled`: only the replica that wins the lock goes on.
pub async fn start(
    ctx: Arc<Context>,
    lj: Arc<LockedJob>,
    valid: ValidSpec,
    scheduled: Timestamp,
    kind: RunKind,
) {
    let namespace = lj.namespace().unwrap_or_default();
    let manual = matches!(kind, RunKind::Manual);
    let key = (
        namespace.clone(),
        if manual {
            format!("{}#run-now", lj.name_any())
        } else {
            lj.name_any()
        },
        scheduled.as_second(),
    );
    if !claim(&ctx.starting, &key) {
        return;
    }
    let last_run = last_run_tag(&lj);
    if ctx.settled.holds(&key, Instant::now(), last_run) {
        unclaim(&ctx.starting, &key);
        return;
    }
    let ttl = valid.timing.ttl;
    let span = tracing::info_span!("run", namespace = %namespace, name = %lj.name_any(), lock = %valid.lock_name, scheduled = %scheduled, manual, token = tracing::field::Empty);
    let started = start_inner(Arc::clone(&ctx), Arc::clone(&lj), valid, scheduled, kind)
        .instrument(span.clone())
        .await;
    unclaim(&ctx.starting, &key);
    match started {
        Ok((lease, job_name, timing)) => {
            ctx.settled.set(key.clone(), Instant::now() + SETTLED);
            supervise(ctx, lj, job_name, lease, timing, scheduled)
                .instrument(span)
                .await;
        }
        // Someone holds the lock for this time: it runs there. Try again only once their
        // lease could have expired (they may have died before creating the Job).
        Err(NotStarted::RunningElsewhere) => ctx.settled.set(key, Instant::now() + ttl),
        // The lock is held for something else (an earlier run still going, or a winner of
        // this time that has not recorded it yet): try again when the LockedJob's last run
        // changes (that run ended, or this one started), which every replica sees as a status
        // update, rather than at each of the bursts of Job events before it; after a TTL at
        // the latest (a holder that died updates nothing).
        Err(NotStarted::Contended) => {
            ctx.settled
                .set_until_changed(key, Instant::now() + ttl, last_run)
        }
        Err(NotStarted::AlreadyRan) => ctx.settled.set(key, Instant::now() + SETTLED),
        // No quorum, API trouble: a later reconcile tries again, but not at once: under
        // overload (nodes timing out) immediate retries from every replica feed the overload.
        Err(NotStarted::Failed) => ctx
            .settled
            .set(key, Instant::now() + jittered(FAILED_PAUSE)),
    }
}

/// How long a scheduled time that ran (here or elsewhere) is not tried again by this replica.
const SETTLED: Duration = Duration::from_secs(600);

/// How long a replica whose attempt failed (no quorum, API error) waits before the next.
const FAILED_PAUSE: Duration = Duration::from_millis(500);

/// `pause` scaled by a random factor in [0.5, 1.5), so replicas that failed together do not
/// retry together.
pub(super) fn jittered(pause: Duration) -> Duration {
    pause.mul_f64(0.5 + rand::random::<f64>())
}

/// Why this replica did not start a run.
enum NotStarted {
    /// Another runner holds the lock and has started this very time.
    RunningElsewhere,
    /// The lock is held, for an earlier time or before its holder recorded this one.
    Contended,
    /// The lock's progress register says this time already ran.
    AlreadyRan,
    /// No quorum, a split vote, API errors, shutting down: tried again after a short pause.
    Failed,
}

async fn start_inner(
    ctx: Arc<Context>,
    lj: Arc<LockedJob>,
    valid: ValidSpec,
    scheduled: Timestamp,
    kind: RunKind,
) -> Result<(Lease, String, LeaseTiming), NotStarted> {
    let (manual, replace) = match kind {
        RunKind::Scheduled { replace } => (false, replace),
        RunKind::Manual => (true, Vec::new()),
    };
    if ctx.shutdown.is_cancelled() {
        return Err(NotStarted::Failed);
    }
    let namespace = lj.namespace().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    // The scheduled time is the lock's progress step: the engine reads the progress register
    // in phase 1 and records this time in phase 2, so a runner (another replica or cluster)
    // that wins the lock after this time already started does not run it again.
    let scheduled_ms = scheduled.as_millisecond().max(0) as u64;
    let acquired = {
        // Held for the attempt only, not for the run.
        let Ok(_permit) = ctx.lock_attempts.acquire().await else {
            return Err(NotStarted::Failed);
        };
        if manual {
            ctx.engine
                .try_acquire(&valid.lock_name, valid.timing.ttl)
                .await
        } else {
            ctx.engine
                .try_acquire_step(&valid.lock_name, valid.timing.ttl, scheduled_ms)
                .await
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(LockError::Contended { progress, .. } | LockError::SplitVote { progress, .. })
            if progress >= scheduled_ms && !manual =>
        {
            tracing::debug!("another runner holds the lock and runs this time");
            return Err(NotStarted::RunningElsewhere);
        }
        // Nobody won (the replicas split the nodes) and so nobody will record a run: waiting
        // for the LockedJob's status to change would wait a whole TTL and could miss the time.
        Err(e @ LockError::SplitVote { .. }) => {
            tracing::debug!(error = %e, "split vote; trying again after a short random pause");
            return Err(NotStarted::Failed);
        }
        Err(e) if e.is_contended() => {
            tracing::debug!("the lock is held (by an earlier run); trying again when it frees");
            return Err(NotStarted::Contended);
        }
        Err(LockError::StepDone { .. }) => {
            tracing::info!("this scheduled time already ran elsewhere; not running it again");
            patch_status(
                &ctx,
                &lj,
                json!({"lastScheduleTime": scheduled.to_string()}),
            )
            .await;
            return Err(NotStarted::AlreadyRan);
        }
        Err(e) => {
            tracing::warn!(error = %e, "lock not acquired; the run waits for the next attempt");
            return Err(NotStarted::Failed);
        }
    };
    tracing::Span::current().record("token", lease.token());
    events::publish(
        &ctx,
        &lj,
        Reason::Acquired,
        format!(
            "lock {} acquired by {} with fencing token {} for {scheduled}",
            valid.lock_name,
            lease.holder(),
            lease.token()
        ),
    );
    for name in &replace {
        tracing::info!(job = %name, "concurrencyPolicy Replace: stopping the active Job");
        bounded(
            API_CALL_LIMIT,
            jobs.delete(name, &DeleteParams::foreground()),
        )
        .await;
    }
    let job_name = if manual {
        super::jobs::manual_job_name(&lj.name_any(), scheduled)
    } else {
        super::jobs::job_name(
            &lj.name_any(),
            scheduled,
            valid.policy.schedule.has_seconds(),
        )
    };
    let job = build_job(
        &lj,
        &RunIdentity {
            job_name: &job_name,
            scheduled,
            lock_name: &valid.lock_name,
            lock_value: lease.value(),
            holder: lease.holder(),
            token: lease.token(),
            manual,
        },
    );
    // The time is already recorded as started (phase 2), so nobody else will run it: keep
    // trying to create the Job while the lease leaves room, or it is lost.
    match create_job(&jobs, &job, &lease).await {
        Created::New => {
            let lag = (Timestamp::now() - scheduled).get_milliseconds().max(0) as u64;
            if !manual {
                metrics::record_schedule_lag(Duration::from_millis(lag));
            }
            tracing::info!(job = %job_name, lag_ms = lag, "Job created");
            events::publish(
                &ctx,
                &lj,
                Reason::Created,
                format!(
                    "created Job {job_name} for {scheduled} (token {})",
                    lease.token()
                ),
            );
        }
        Created::Existed => {
            tracing::info!(job = %job_name, "the Job already exists (created by an earlier holder or an attempt whose reply was lost); supervising it");
        }
        Created::Failed(message) => {
            tracing::error!(job = %job_name, error = %message, "Job not created; this scheduled time is skipped");
            metrics::record_run(RunResult::CreateFailed);
            events::publish(
                &ctx,
                &lj,
                Reason::CreateFailed,
                format!(
                    "cannot create Job {job_name} for {scheduled}, the run is skipped: {message}"
                ),
            );
            ctx.engine.release(&lease).await;
            if manual {
                clear_run_now(&ctx, &lj, &scheduled.to_string()).await;
            }
            return Err(NotStarted::Failed);
        }
    }
    let mut status =
        json!({"lastRun": record(&lease, &job_name, scheduled, RunOutcome::Running, None)});
    if manual {
        // Done with the request: no replica may act on it again.
        clear_run_now(&ctx, &lj, &scheduled.to_string()).await;
    } else {
        status["lastScheduleTime"] = json!(scheduled.to_string());
    }
    patch_status(&ctx, &lj, status).await;
    Ok((lease, job_name, valid.timing))
}

/// How creating a run's Job ended.
enum Created {
    New,
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
            Ok(Ok(_)) => return Created::New,
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

/// Removes the `lockedjob.dev/run-now` annotation if it still holds `value` (a newer request
/// written meanwhile stays).
pub async fn clear_run_now(ctx: &Context, lj: &LockedJob, value: &str) {
    let api: Api<LockedJob> =
        Api::namespaced(ctx.client.clone(), &lj.namespace().unwrap_or_default());
    // JSON pointer escaping of the annotation key: '/' is '~1'.
    let path = format!(
        "/metadata/annotations/{}",
        ANNOTATION_RUN_NOW.replace('~', "~0").replace('/', "~1")
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
            &lj.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        ),
    )
    .await;
}

/// How supervision ended.
enum End {
    Finished(JobState),
    /// The Job disappeared (deleted by a user, or by the LockedJob's deletion).
    Gone,
    LockLost,
    HandedOver,
}

/// Renews the lease while the Job runs; acts on lease loss; records the outcome.
pub async fn supervise(
    ctx: Arc<Context>,
    lj: Arc<LockedJob>,
    job_name: String,
    lease: Lease,
    timing: LeaseTiming,
    scheduled: Timestamp,
) {
    let namespace = lj.namespace().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    let key = (namespace.clone(), job_name.clone());
    claim(&ctx.supervised, &key);
    let watchdog = Watchdog::spawn(ctx.engine.clone(), lease.clone(), timing);
    let lost = watchdog.lost();
    let end = loop {
        tokio::select! {
            biased;
            _ = lost.cancelled() => break End::LockLost,
            _ = ctx.shutdown.cancelled() => break End::HandedOver,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                // From the watch cache; only a Job the cache does not have (just created, or
                // gone) costs a GET.
                let job = match ctx.cached_job(&namespace, &job_name) {
                    Some(job) => job,
                    None => match tokio::time::timeout(API_CALL_LIMIT, jobs.get_opt(&job_name)).await {
                        Ok(Ok(Some(job))) => Arc::new(job),
                        Ok(Ok(None)) => break End::Gone,
                        // API trouble: keep the lease; the Job runs on regardless.
                        _ => continue,
                    },
                };
                match job_state(&job) {
                    JobState::Active => {}
                    finished => break End::Finished(finished),
                }
            }
        }
    };
    match end {
        End::LockLost => {
            let deadline = watchdog.status().deadline;
            let _ = watchdog.stop().await;
            metrics::record_run(RunResult::LockLost);
            // Someone else holding the lock now (we were paused, they adopted the Job) owns
            // the Job; otherwise nobody may run it without a lease: stop it before our deadline.
            let other = ctx.engine.current_holder(lease.name()).await;
            let message = match other {
                Some(holder) if holder != lease.holder() => {
                    tracing::warn!(new_holder = %holder, "lease lost; another holder has the lock now, leaving the Job to it");
                    format!(
                        "lease on {} lost; {holder} holds the lock now",
                        lease.name()
                    )
                }
                _ => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    tracing::error!(
                        left_ms = left.as_millis() as u64,
                        "lease lost: deleting the Job before the lease deadline"
                    );
                    bounded(
                        left.max(Duration::from_millis(100)),
                        jobs.delete(&job_name, &DeleteParams::foreground()),
                    )
                    .await;
                    format!("lease on {} lost (no Redis quorum renewed it); Job {job_name} deleted before the lease deadline", lease.name())
                }
            };
            events::publish(&ctx, &lj, Reason::LockLost, message.clone());
            let update = ConditionUpdate {
                kind: conditions::LOCK_LOST,
                status: true,
                reason: "LeaseLost",
                message: &message,
                generation: None,
            };
            update_condition(&ctx, &lj, update).await;
            patch_status(&ctx, &lj, json!({"lastRun": record(&lease, &job_name, scheduled, RunOutcome::LockLost, Some(message))})).await;
        }
        End::HandedOver => {
            // Release, so another replica acquires the lock afresh and adopts the Job.
            watchdog.release(&ctx.engine).await;
            tracing::info!(job = %job_name, "shutting down: lock released for another replica to adopt the Job");
        }
        End::Gone => {
            watchdog.release(&ctx.engine).await;
            metrics::record_run(RunResult::Stopped);
            patch_status(&ctx, &lj, json!({"lastRun": record(&lease, &job_name, scheduled, RunOutcome::Stopped, Some("the Job was deleted".into()))})).await;
        }
        End::Finished(state) => {
            let held = watchdog.release(&ctx.engine).await;
            let (outcome, reason) = match state {
                JobState::Succeeded => (RunOutcome::Succeeded, Reason::Completed),
                _ => (RunOutcome::Failed, Reason::Failed),
            };
            metrics::record_run(if outcome == RunOutcome::Succeeded {
                RunResult::Succeeded
            } else {
                RunResult::Failed
            });
            tracing::info!(job = %job_name, ?outcome, lease_held = held, "run finished; lock released");
            events::publish(
                &ctx,
                &lj,
                reason,
                format!(
                    "Job {job_name} {}",
                    if outcome == RunOutcome::Succeeded {
                        "completed"
                    } else {
                        "failed"
                    }
                ),
            );
            let mut status =
                json!({"lastRun": record(&lease, &job_name, scheduled, outcome, None)});
            if outcome == RunOutcome::Succeeded {
                status["lastSuccessfulTime"] = json!(Timestamp::now().to_string());
            }
            patch_status(&ctx, &lj, status).await;
            if lj.status.as_ref().is_some_and(|s| {
                super::status::condition_is_true(&s.conditions, conditions::LOCK_LOST)
            }) {
                let update = ConditionUpdate {
                    kind: conditions::LOCK_LOST,
                    status: false,
                    reason: "LeaseHeld",
                    message: "the last run kept its lease",
                    generation: None,
                };
                update_condition(&ctx, &lj, update).await;
            }
        }
    }
    unclaim(&ctx.supervised, &key);
}

/// An active Job nobody here supervises: its holder may have died. Adopt it by acquiring the
/// lock afresh; delete it if another cluster holds the lock; leave it if a replica of this
/// cluster does.
pub async fn check_orphan(ctx: Arc<Context>, lj: Arc<LockedJob>, valid: ValidSpec, job: Job) {
    let namespace = lj.namespace().unwrap_or_default();
    let job_name = job.name_any();
    let key = (namespace.clone(), job_name.clone());
    if !claim(&ctx.supervised, &key) {
        return;
    }
    let span = tracing::info_span!("adopt", namespace = %namespace, name = %lj.name_any(), lock = %valid.lock_name, job = %job_name, token = tracing::field::Empty);
    let adopted = async {
        let ours = format!("{}/", ctx.cluster_id);
        match ctx.engine.current_holder(&valid.lock_name).await {
            Some(holder) if holder.starts_with(&ours) => None,
            Some(holder) => {
                tracing::warn!(%holder, "another cluster holds the lock: deleting this cluster's orphaned Job");
                let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
                bounded(API_CALL_LIMIT, jobs.delete(&job_name, &DeleteParams::foreground())).await;
                events::publish(&ctx, &lj, Reason::OrphanDeleted, format!("Job {job_name} deleted: lock {} is held by {holder}", valid.lock_name));
                None
            }
            None => match ctx.engine.try_acquire(&valid.lock_name, valid.timing.ttl).await {
                Ok(lease) => {
                    // Our view of the Job may be stale: its holder may have seen it finish and
                    // released the lock a moment ago. Adopt only a Job that still runs.
                    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
                    let fresh = bounded(API_CALL_LIMIT, jobs.get_opt(&job_name)).await;
                    if !matches!(&fresh, Some(Some(job)) if job_state(job) == JobState::Active && job.metadata.deletion_timestamp.is_none()) {
                        tracing::debug!("the Job finished meanwhile: nothing to adopt");
                        ctx.engine.release(&lease).await;
                        return None;
                    }
                    tracing::Span::current().record("token", lease.token());
                    tracing::info!("holder gone: lock acquired afresh, adopting the Job");
                    events::publish(&ctx, &lj, Reason::Adopted, format!("Job {job_name} adopted by {} with token {}", lease.holder(), lease.token()));
                    Some(lease)
                }
                Err(_) => None,
            },
        }
    }
    .instrument(span.clone())
    .await;
    unclaim(&ctx.supervised, &key);
    if let Some(lease) = adopted {
        let scheduled = super::jobs::scheduled_time(&job).unwrap_or_else(Timestamp::now);
        supervise(ctx, lj, job_name, lease, valid.timing, scheduled)
            .instrument(span)
            .await;
    }
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
