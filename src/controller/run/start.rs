//! Stage 0 of a run: whether this replica tries at all, when, and what became of the attempt
//! (docs/design.md, "Who tries first"); the stages after it are `acquire`, `launch` and
//! `supervise`.

use super::super::context::Context;
use super::super::runs::RunKey;
use super::launch::{self, Launched};
use super::supervise::{supervise, HeldRun};
use super::{jittered, step_of, HoldBack, NotStarted, Run, RunKind};
use crate::api::LockedJob;
use crate::redlock::StepHint;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

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

/// How long a scheduled time that ran (here or elsewhere) is not tried again by this replica.
const SETTLED: Duration = Duration::from_secs(600);

/// How long a replica whose attempt failed (no quorum, API error) waits before the next.
const FAILED_PAUSE: Duration = Duration::from_millis(500);

/// Tries to start `run`: only the replica that wins the lock goes on, to supervise its Job.
pub async fn start(ctx: Arc<Context>, run: Run) {
    let key = run.key();
    let last_run = last_run_tag(&run.subject.lj);
    let span = run.span();
    let settled = &ctx.runs.settled;
    // The Job's claim is taken before the Job exists and held through its supervision, so no
    // orphan check of this replica can take the Job between its creation and its supervision.
    let job_key = (run.subject.namespace.clone(), run.job_name());
    let Some(supervising) = ctx.runs.claim_job(&job_key) else {
        return;
    };
    let launched = {
        let Some(_starting) = ctx.runs.claim_start(&key) else {
            return;
        };
        if settled.holds(&key, Instant::now(), last_run) {
            return;
        }
        match Box::pin(try_launch(&ctx, &run, &key, last_run).instrument(span.clone())).await {
            Some(launched) => launched,
            None => return,
        }
    };
    let ttl = run.valid.timing.ttl;
    let manual = matches!(run.kind, RunKind::Manual);
    match launched {
        Ok(launched) => {
            settled.set(key, Instant::now() + SETTLED);
            let held = HeldRun {
                job_name: launched.job_name,
                lease: launched.lease,
                timing: run.valid.timing,
                scheduled: run.scheduled,
            };
            Box::pin(supervise(&ctx, run.subject, held, supervising).instrument(span)).await;
        }
        // Someone holds the lock for this time: it runs there. Try again only once their
        // lease could have expired (they may have died before creating the Job).
        Err(NotStarted::RunningElsewhere) => settled.set(key, Instant::now() + ttl),
        // A run-now waits for nobody's end: the lock is often held by another cluster's runs,
        // which this LockedJob's status never shows, and waiting a TTL from a scheduled run's
        // start lands on the next one's (seen in the soak: a run-now held back until the
        // schedule stopped). Try again at the next reconcile, within a renew interval.
        Err(NotStarted::Contended) if manual => {
            settled.set(key, Instant::now() + jittered(FAILED_PAUSE))
        }
        // The lock is held for something else (an earlier run still going, or a winner of
        // this time that has not recorded it yet): try again when the LockedJob's last run
        // changes (that run ended, or this one started), which every replica sees as a status
        // update, rather than at each of the bursts of Job events before it; after a TTL at
        // the latest (a holder that died updates nothing).
        Err(NotStarted::Contended) => {
            settled.set_until_changed(key, Instant::now() + ttl, last_run)
        }
        Err(NotStarted::AlreadyRan) => settled.set(key, Instant::now() + SETTLED),
        // No quorum, API trouble: a later reconcile tries again, but not at once: under
        // overload (nodes timing out) immediate retries from every replica feed the overload.
        Err(NotStarted::Failed) => settled.set(key, Instant::now() + jittered(FAILED_PAUSE)),
    }
}

/// Holds back as `HoldBack` says, then, with a lock-attempt slot, tries for the lock and
/// creates the Job. `None`: not tried (shutting down, or this replica's last run of the
/// LockedJob still holds the lock).
async fn try_launch(
    ctx: &Context,
    run: &Run,
    key: &RunKey,
    last_run: u64,
) -> Option<Result<Launched, NotStarted>> {
    // The LockedJob's last run is ours and still holds the lock (its Job has finished in the
    // cache, and its supervisor, which looks every 500 ms, has not released yet): an attempt
    // now would be refused by our own lease. Try again once that run's end shows in the
    // status, as after `Contended`.
    let previous = run
        .subject
        .lj
        .status
        .as_ref()
        .and_then(|s| s.last_run.as_ref());
    let namespace = &run.subject.namespace;
    if previous.is_some_and(|r| {
        ctx.runs
            .is_supervised(&(namespace.clone(), r.job_name.clone()))
    }) {
        tracing::debug!("the last run still holds the lock here; trying again when it ends");
        let until = Instant::now() + run.valid.timing.ttl;
        ctx.runs
            .settled
            .set_until_changed(key.clone(), until, last_run);
        return None;
    }
    let manual = matches!(run.kind, RunKind::Manual);
    let hold_back = HoldBack::decide(previous.map(|r| r.holder.as_str()), &ctx.holder, manual);
    if hold_back != HoldBack::No {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return None,
            _ = tokio::time::sleep(hold_back.pause(rand::random())) => {}
        }
    }
    // Only once this task has a lock-attempt slot does it go on: the tasks waiting out their
    // hold-back or for a slot (most of a minute's tasks at the top of the minute) then hold a
    // small future, not every stage's state (10 KB a task, thousands of tasks at 1,000
    // LockedJobs); `start` boxes this future for the same reason.
    let Ok(attempt) = ctx.lock_attempts.acquire().await else {
        return None; // Never closed.
    };
    // Looked at with the slot in hand, not before queueing for it: under load the queue takes
    // seconds, in which the replica that went first has most often taken the lock.
    if hold_back != HoldBack::No {
        if let Some(outcome) = taken_elsewhere(ctx, hold_back, run).await {
            return Some(Err(outcome));
        }
    }
    Some(launch::launch(ctx, run, attempt).await)
}

/// For a replica that held back: whether the time is already taken, by the cheapest words
/// first. The Job's name is the same in every replica of this cluster: once it is in the
/// cache, a winner took this time (`RunningElsewhere`). Not in the cache (yet: under load the
/// winner's create and this replica's watch take seconds), one node, a random one, is the next
/// cheapest word: if it has this time as started, a winner started it (`RunningElsewhere`);
/// if it stores a lock value, the lock is held, by this time's winner before it recorded the
/// run or by an earlier run still releasing (`Contended`; a value one node keeps from an
/// attempt that failed costs this replica a TTL at most, and only when the replica that went
/// first did not take the time either). Either way the full attempt would only lose. `None`:
/// try.
///
/// Before this cluster's first run (`HoldBack::Spread`) a started time is tried all the same:
/// nobody here may have won it (another cluster sharing the lock did), and the full attempt's
/// `StepDone` is what records it in this cluster's status (`lastScheduleTime`, a backfill's
/// progress). The replica named in `lastRun` records it otherwise.
async fn taken_elsewhere(ctx: &Context, hold_back: HoldBack, run: &Run) -> Option<NotStarted> {
    if ctx
        .cached_job(&run.subject.namespace, &run.job_name())
        .is_some()
    {
        return Some(NotStarted::RunningElsewhere);
    }
    // A manual run has no step; it never holds back, so it does not come here.
    let register = run.kind.step_register(run.lock())?;
    let node = rand::random::<u32>() as usize;
    let step = step_of(run.scheduled);
    let hint = ctx
        .engine
        .step_hint(run.lock(), &register, step, node)
        .await;
    match hint {
        StepHint::Started if hold_back == HoldBack::Spread => {
            tracing::debug!("a node records this time as started; trying to record it here");
            None
        }
        StepHint::Started => {
            tracing::debug!("a node records this time as started: not trying for the lock");
            Some(NotStarted::RunningElsewhere)
        }
        StepHint::Held => {
            tracing::debug!("a node shows the lock held: trying again when the last run changes");
            Some(NotStarted::Contended)
        }
        StepHint::Unknown => None,
    }
}

#[cfg(test)]
mod tests {
    use super::taken_elsewhere;
    use crate::api::validate;
    use crate::controller::jobs::job_name;
    use crate::controller::reconcile_tests::{api_server, context_on, locked_job};
    use crate::controller::run::{step_of, HoldBack, NotStarted, Run, RunKind};
    use crate::controller::subject::Subject;
    use crate::lab::harness::{Persistence, RedisNodes};
    use crate::redlock::{Redlock, RedlockConfig};
    use jiff::Timestamp;
    use k8s_openapi::api::batch::v1::Job;
    use serde_json::json;
    use std::sync::Arc;
    use std::time::Duration;

    /// What a replica that held back makes of a time, against real nodes: left alone when the
    /// Job is cached, the lock held, or (once this cluster has a last run) a node records the
    /// time as started; tried before this cluster's first run even then, so that the attempt
    /// records a time another cluster ran.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
    async fn a_held_back_replica_leaves_a_taken_time_alone_but_a_first_run_records_it() {
        use HoldBack::{HeadStart, Spread};
        let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
        let lj = locked_job(json!({}));
        let valid = validate("team-a", "report", &lj.spec).expect("valid spec");
        let lock = valid.lock_name.clone();
        let scheduled = Timestamp::from_second(1_800_000_000).expect("time");
        let earlier = Timestamp::from_second(1_800_000_000 - 1).expect("time");
        let (client, _) = api_server(Box::new(|_| (404, json!({}))));
        let ctx = context_on(client, Vec::new(), nodes.urls(), Duration::from_secs(2));
        let job: Job = serde_json::from_value(json!({"metadata": {
            "name": job_name("report", scheduled, true), "namespace": "team-a"}}))
        .expect("job");
        let (client, _) = api_server(Box::new(|_| (404, json!({}))));
        let cached = context_on(client, vec![job], nodes.urls(), Duration::from_secs(2));
        let mut config = RedlockConfig::new(nodes.urls());
        config.holder = "other/r1".into();
        let other = Redlock::new(config).expect("engine");
        let ttl = Duration::from_secs(30);
        let run = Run {
            subject: Subject::of(Arc::new(lj)).expect("a namespaced LockedJob"),
            valid: Arc::new(valid),
            scheduled,
            kind: RunKind::Scheduled {
                replace: Vec::new(),
            },
        };

        // Nothing anywhere: try.
        assert_eq!(taken_elsewhere(&ctx, HeadStart, &run).await, None);
        assert_eq!(taken_elsewhere(&ctx, Spread, &run).await, None);
        // The Job is in the cache: its winner runs it.
        let elsewhere = Some(NotStarted::RunningElsewhere);
        assert_eq!(taken_elsewhere(&cached, HeadStart, &run).await, elsewhere);
        assert_eq!(taken_elsewhere(&cached, Spread, &run).await, elsewhere);
        // An earlier time's run holds the lock: wait for it.
        let held = other
            .try_acquire_step(&lock, ttl, step_of(earlier))
            .await
            .expect("another runner takes the lock");
        assert_eq!(
            taken_elsewhere(&ctx, HeadStart, &run).await,
            Some(NotStarted::Contended)
        );
        assert_eq!(
            taken_elsewhere(&ctx, Spread, &run).await,
            Some(NotStarted::Contended)
        );
        other.release(&held).await;
        // Another runner started this time and is done: skipped once this cluster has a last
        // run, tried before its first.
        let ran = other
            .try_acquire_step(&lock, ttl, step_of(scheduled))
            .await
            .expect("another runner takes this time");
        other.release(&ran).await;
        assert_eq!(taken_elsewhere(&ctx, HeadStart, &run).await, elsewhere);
        assert_eq!(taken_elsewhere(&ctx, Spread, &run).await, None);
    }
}
