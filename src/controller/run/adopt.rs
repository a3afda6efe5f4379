//! Adoption (docs/design.md, "A run's life in the operator", 5): an active Job nobody here
//! supervises may have lost its holder. Adopt it by acquiring the lock afresh; delete it if
//! another cluster holds the lock; leave it if a replica of this cluster does.

use super::super::context::Context;
use super::super::events::{self, Reason};
use super::super::jobs::{job_state, scheduled_time, JobState};
use super::super::runs::JobKey;
use super::super::subject::Subject;
use super::report::{bounded, API_CALL_LIMIT};
use super::supervise::{supervise, HeldRun};
use crate::api::{ValidSpec, ANNOTATION_LOCK_VALUE};
use crate::redlock::Lease;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams};
use kube::ResourceExt;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// What an orphan check needs of a Job: its check task holds this, not a copy of the Job
/// (hundreds of checks are in flight at once at 1,000 LockedJobs under load).
pub struct Candidate {
    pub name: String,
    /// The `lockedjob.dev/lock-value` the Job was created with.
    pub lock_value: Option<String>,
    pub scheduled: Option<Timestamp>,
}

impl Candidate {
    pub fn of(job: &Job) -> Self {
        Self {
            name: job.name_any(),
            lock_value: job.annotations().get(ANNOTATION_LOCK_VALUE).cloned(),
            scheduled: scheduled_time(job),
        }
    }
}

pub async fn check_orphan(
    ctx: Arc<Context>,
    subject: Subject,
    valid: Arc<ValidSpec>,
    candidate: Candidate,
) {
    let namespace = &subject.namespace;
    let Candidate {
        name: job_name,
        lock_value,
        scheduled,
    } = candidate;
    let span = tracing::info_span!("adopt", namespace = %namespace, name = %subject.name, lock = %valid.lock_name, job = %job_name, token = tracing::field::Empty);
    let key = (namespace.clone(), job_name.clone());
    // Held from the check through the supervision of an adopted Job.
    let Some(claim) = ctx.runs.claim_job(&key) else {
        return;
    };
    if holder_alive(&ctx, &valid, &key, lock_value.as_deref()).await {
        return;
    }
    // Boxed: most checks end at the hint above, and their tasks stay small.
    let adopted =
        Box::pin(try_adopt(&ctx, &subject, &valid, &job_name).instrument(span.clone())).await;
    if let Some(lease) = adopted {
        let run = HeldRun {
            job_name,
            lease,
            timing: valid.timing,
            scheduled: scheduled.unwrap_or_else(Timestamp::now),
        };
        Box::pin(supervise(&ctx, subject, run, claim).instrument(span)).await;
    }
}

/// A hint, from one node (a random one each time): if it still stores the lock value the Job
/// was created with, the Job's holder renewed within a TTL and is alive. That is the usual
/// answer, and it costs one request instead of one per node. A value of another runner of this
/// cluster (one that adopted the Job, or the next run's holder while this replica's cache still
/// shows the Job running) ends the check too: the quorum read would leave the Job to that runner
/// as well. Anything else (another cluster's value, none, no answer) goes on to the quorum
/// read, which alone may lead to a delete or an acquisition. Nobody can take the lock before
/// that node lets the value expire, so the next check waits for that (at most a TTL): a check
/// when the lease could have run out, instead of one every renew interval.
async fn holder_alive(
    ctx: &Context,
    valid: &ValidSpec,
    job: &JobKey,
    lock_value: Option<&str>,
) -> bool {
    match ctx.engine.value_on_any_node(&valid.lock_name).await {
        Some((stored, left)) if held_here(&stored, lock_value, &ctx.cluster_id) => {
            let wait = left.min(valid.timing.ttl);
            ctx.runs.defer_orphan_check(job, Instant::now() + wait);
            true
        }
        _ => false,
    }
}

/// Whether a lock value a node stores is the Job's own (`job_value`) or another of this
/// cluster's runners' (`{cluster}/{runner}/{random}`).
fn held_here(stored: &str, job_value: Option<&str>, cluster_id: &str) -> bool {
    job_value == Some(stored) || of_cluster(stored, cluster_id)
}

/// Whether a holder (`{cluster}/{runner}`) or a lock value (`{holder}/{random}`) belongs to a
/// runner of `cluster_id`.
fn of_cluster(holder_or_value: &str, cluster_id: &str) -> bool {
    holder_or_value
        .strip_prefix(cluster_id)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// The quorum's word on the lock: leave the Job to a holder of this cluster, delete it for
/// another cluster's, adopt it by acquiring the lock afresh when nobody holds it.
async fn try_adopt(
    ctx: &Context,
    subject: &Subject,
    valid: &ValidSpec,
    job_name: &str,
) -> Option<Lease> {
    let jobs: Api<Job> = subject.api(&ctx.client);
    match ctx.engine.current_holder(&valid.lock_name).await {
        Some(holder) if of_cluster(&holder, &ctx.cluster_id) => None,
        Some(holder) => {
            tracing::warn!(%holder, "another cluster holds the lock: deleting this cluster's orphaned Job");
            bounded(
                API_CALL_LIMIT,
                jobs.delete(job_name, &DeleteParams::foreground()),
            )
            .await;
            let note = format!(
                "Job {job_name} deleted: lock {} is held by {holder}",
                valid.lock_name
            );
            events::publish(ctx, &subject.lj, Reason::OrphanDeleted, note);
            None
        }
        None => {
            let lease = ctx
                .engine
                .try_acquire(&valid.lock_name, valid.timing.ttl)
                .await
                .ok()?;
            // Our view of the Job may be stale: its holder may have seen it finish and
            // released the lock a moment ago. Adopt only a Job that still runs.
            let fresh = bounded(API_CALL_LIMIT, jobs.get_opt(job_name)).await;
            let runs = matches!(&fresh, Some(Some(job)) if job_state(job) == JobState::Active && job.metadata.deletion_timestamp.is_none());
            if !runs {
                tracing::debug!("the Job finished meanwhile: nothing to adopt");
                ctx.engine.release(&lease).await;
                return None;
            }
            tracing::Span::current().record("token", lease.token());
            tracing::info!("holder gone: lock acquired afresh, adopting the Job");
            let note = format!(
                "Job {job_name} adopted by {} with token {}",
                lease.holder(),
                lease.token()
            );
            events::publish(ctx, &subject.lj, Reason::Adopted, note);
            Some(lease)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::held_here;

    #[test]
    fn a_value_of_this_clusters_runners_ends_the_check_another_clusters_does_not() {
        let job = Some("east/r1/aaaa");
        let table = [
            ("east/r1/aaaa", job, true, "the Job's own value"),
            (
                "east/r2/bbbb",
                job,
                true,
                "another replica of this cluster (adopted)",
            ),
            (
                "east/r1/cccc",
                None,
                true,
                "a Job without a value, a runner of this cluster",
            ),
            (
                "west/r1/aaaa",
                job,
                false,
                "another cluster: the quorum decides",
            ),
            (
                "eastern/r1/aaaa",
                job,
                false,
                "a cluster whose id only starts alike",
            ),
            ("east", job, false, "not a value"),
        ];
        for (stored, job_value, expected, what) in table {
            assert_eq!(held_here(stored, job_value, "east"), expected, "{what}");
        }
    }
}
