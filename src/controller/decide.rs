//! What a reconcile does, decided without I/O: from the LockedJob and what was observed (its
//! Jobs, the time, the Redis nodes answering), which run to start, which Jobs to check for a
//! dead holder, which finished Jobs to delete, what status to write and when to look again.
//! `reconcile.rs` gathers the inputs and carries the plan out.

use super::jobs::LABEL_BACKFILL;
use super::jobs::{
    age, cleans_history, created_at, expired_history, finished_at, is_running, scheduled_time,
};
use super::status::{set_condition, ConditionUpdate};
use crate::api::{
    conditions, describe, validate, BackfillPhase, BackfillStatus, LockedJob, ValidSpec,
    ANNOTATION_BACKFILL, ANNOTATION_RUN_NOW,
};
use crate::schedule::{
    next_action, parse_run_now, BackfillRange, Decision, History, Schedule, TOO_MANY_MISSED,
};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::sync::Arc;
use std::time::Duration;

/// The longest a LockedJob waits for its next reconcile.
pub const MAX_REQUEUE: Duration = Duration::from_secs(300);

/// How long after a Job started or finished the replicas leave `status.active` to the run's
/// own status patch, which carries the change (docs/design.md, "Status writes"). Three replicas writing
/// it at once cost a write and two conflicts per change. Longer than the run's patch may take
/// (`API_CALL_LIMIT`, 5 s) and its way back through the watch under load: with 3 s, at 1,000
/// LockedJobs the replicas wrote most changes themselves, ~9 status patches a run.
pub const ACTIVE_GRACE: Duration = Duration::from_secs(15);

/// What a reconcile saw, besides the LockedJob.
#[derive(Debug, Clone)]
pub struct Observed {
    pub now: Timestamp,
    /// The LockedJob's Jobs (label and owner reference), from the watch cache.
    pub jobs: Vec<Job>,
    /// Redis nodes that answered the last probe, of how many, and the quorum.
    pub reachable: usize,
    pub nodes: usize,
    pub quorum: usize,
    /// This replica's holder name (`cluster/runner`), as Jobs record it.
    pub holder: String,
}

/// The status a reconcile writes, when it differs from what the object has.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    pub conditions: Vec<Condition>,
    pub active: Option<Vec<ObjectReference>>,
    pub observed_generation: Option<i64>,
    /// The backfill's progress, when it changed phase (started, completed, cancelled).
    pub backfill: Option<BackfillStatus>,
    /// Write only after this long: the change is `active` alone, from a Job that started or
    /// finished within `ACTIVE_GRACE`, which the run's own patch normally writes first.
    pub defer: Option<Duration>,
}

#[derive(Debug, Clone)]
pub enum Plan {
    /// The spec is invalid: nothing runs. `report` is set the first time this message is seen
    /// for this generation (status written and a Warning Event), not at every reconcile.
    Invalid {
        message: String,
        report: Option<StatusUpdate>,
    },
    Valid(Box<ValidPlan>),
}

/// What the `lockedjob.dev/backfill` annotation asks for now.
#[derive(Debug, Clone, PartialEq)]
pub enum Backfill {
    /// Start the run for this time of the range.
    Start(BackfillRange, Timestamp),
    /// A value that is no usable range: reported, then cleared (`value` is what to clear).
    Refused { value: String, message: String },
}

/// What the `lockedjob.dev/run-now` annotation asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum RunNow {
    /// A run for this time.
    Requested(Timestamp),
    /// A value that is no time: reported, then cleared (`value` is what to clear).
    Refused { value: String, message: String },
}

#[derive(Debug, Clone)]
pub struct ValidPlan {
    /// Shared with the run and orphan-check tasks this reconcile starts (each held a copy).
    pub valid: Arc<ValidSpec>,
    /// The run-now annotation, when set.
    pub run_now: Option<RunNow>,
    /// A scheduled run to start, with the active Jobs to stop first (Replace).
    pub start: Option<(Timestamp, Vec<String>)>,
    /// The backfill's next time to start (when no Job is active and no scheduled run starts),
    /// or why the request is refused.
    pub backfill: Option<Backfill>,
    /// More than `TOO_MANY_MISSED` due times were missed (worth a Warning Event).
    pub missed_too_many: bool,
    /// Active Jobs at least a TTL old: a replica that does not supervise one checks whether its
    /// holder is gone. A holder that died keeps the lock until a TTL after its last renewal,
    /// so asking Redis about a younger Job could not find the lock free.
    pub orphan_candidates: Vec<String>,
    /// Finished Jobs beyond the history limits, when this replica is the one to delete them
    /// (`cleans_history`).
    pub delete: Vec<String>,
    pub status: Option<StatusUpdate>,
    pub requeue: Duration,
}

/// The plan for `lj` (in `namespace`, which reconcile checked) given what was `seen`.
pub fn decide(lj: &LockedJob, namespace: &str, seen: &Observed) -> Plan {
    match validate(namespace, &lj.name_any(), &lj.spec) {
        Ok(valid) => Plan::Valid(Box::new(decide_valid(lj, seen, valid))),
        Err(errors) => decide_invalid(lj, seen.now, describe(&errors)),
    }
}

fn decide_invalid(lj: &LockedJob, now: Timestamp, message: String) -> Plan {
    let status = lj.status.clone().unwrap_or_default();
    let generation = lj.metadata.generation;
    let already = status.observed_generation == generation
        && status.conditions.iter().any(|c| {
            c.type_ == conditions::INVALID_SPEC && c.status == "True" && c.message == message
        });
    let report = (!already).then(|| {
        let mut conditions = status.conditions.clone();
        for kind in [conditions::INVALID_SPEC, conditions::READY] {
            let update = ConditionUpdate {
                kind,
                status: kind == conditions::INVALID_SPEC,
                reason: "InvalidSpec",
                message: &message,
                generation,
            };
            set_condition(&mut conditions, update, now);
        }
        StatusUpdate {
            conditions,
            active: None,
            observed_generation: generation,
            backfill: None,
            defer: None,
        }
    });
    Plan::Invalid { message, report }
}

fn decide_valid(lj: &LockedJob, seen: &Observed, valid: ValidSpec) -> ValidPlan {
    let active: Vec<&Job> = seen.jobs.iter().filter(|j| is_running(j)).collect();
    let status = lj.status.clone().unwrap_or_default();
    let last = seen
        .jobs
        .iter()
        .filter_map(scheduled_time)
        .chain(status.last_schedule_time.as_ref().map(|t| t.0))
        .max();
    let history = History {
        created: lj
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(seen.now, |t| t.0),
        last_schedule_time: last,
        active_runs: active.len(),
        previous_run: last.and_then(|t| previous_run(&seen.jobs, t)),
    };
    let decision = next_action(&valid.policy, seen.now, &history);
    let active_names: Vec<String> = active.iter().map(|j| j.name_any()).collect();
    let ttl = valid.timing.ttl;
    let orphan_candidates = active
        .iter()
        .filter(|j| created_at(j).is_none_or(|t| age(t, seen.now) >= ttl))
        .map(|j| j.name_any())
        .collect();
    let (start, missed_too_many, next) = match decision {
        Decision::Run {
            scheduled,
            replace_active,
            missed,
            next,
        } => {
            let replace = if replace_active {
                active_names.clone()
            } else {
                Vec::new()
            };
            (Some((scheduled, replace)), missed > TOO_MANY_MISSED, next)
        }
        Decision::Skip { next, .. } | Decision::Wait { next } => (None, false, next),
    };
    let run_now =
        lj.annotations()
            .get(ANNOTATION_RUN_NOW)
            .map(|value| match parse_run_now(value) {
                Ok(requested) => RunNow::Requested(requested),
                Err(message) => RunNow::Refused {
                    value: value.clone(),
                    message,
                },
            });
    let (backfill, backfill_status) = decide_backfill(lj, seen, &valid, start.is_some());
    let mut requeue = until(next, seen.now);
    if !active.is_empty() {
        requeue = requeue.min(valid.timing.ttl / 2);
    }
    if matches!(run_now, Some(RunNow::Requested(_))) {
        // A run-now that found the lock held (often by another cluster's run, which this
        // LockedJob's status never shows) is tried again at a reconcile; with none before the
        // next due time it waited for that, an hour for an hourly job (found by the soak).
        requeue = requeue.min(valid.timing.renew_interval);
    }
    if matches!(backfill, Some(Backfill::Start(..))) {
        // A time that another runner holds the lock for is tried again by this replica after
        // its cooldown; nothing else may wake this LockedJob before then.
        requeue = requeue.min(valid.timing.renew_interval);
    }
    ValidPlan {
        run_now,
        start,
        backfill,
        missed_too_many,
        delete: if cleans_history(&seen.jobs, &seen.holder, seen.now, ttl) {
            expired_history(
                &seen.jobs,
                lj.spec.successful_jobs_history_limit.max(0) as usize,
                lj.spec.failed_jobs_history_limit.max(0) as usize,
            )
        } else {
            Vec::new()
        },
        status: status_update(lj, seen, &valid, next, &active, backfill_status),
        orphan_candidates,
        requeue: requeue.max(Duration::from_millis(50)),
        valid: Arc::new(valid),
    }
}

/// The backfill's next step, and its status when that changes phase. A time starts only while
/// no Job of the LockedJob is active and no scheduled run starts: backfill runs one at a time,
/// after the schedule's. Across clusters the lock and the backfill's register order them.
fn decide_backfill(
    lj: &LockedJob,
    seen: &Observed,
    valid: &ValidSpec,
    scheduled_run_starts: bool,
) -> (Option<Backfill>, Option<BackfillStatus>) {
    let written = lj.status.as_ref().and_then(|s| s.backfill.as_ref());
    let Some(value) = lj.annotations().get(ANNOTATION_BACKFILL) else {
        // Removed while running: cancelled. What already started finishes.
        let cancelled = written
            .filter(|b| b.phase == BackfillPhase::Running)
            .map(|b| BackfillStatus {
                phase: BackfillPhase::Cancelled,
                ..b.clone()
            });
        return (None, cancelled);
    };
    let schedule = &valid.policy.schedule;
    let refused = |message| {
        let refused = Backfill::Refused {
            value: value.clone(),
            message,
        };
        (Some(refused), None)
    };
    let range = match BackfillRange::read(value, seen.now) {
        Ok(range) => range,
        Err(message) => return refused(message),
    };
    // The request this status describes; set again after a cancel, it resumes (the
    // register skips what started).
    let same = written.filter(|b| b.range() == range && b.phase != BackfillPhase::Cancelled);
    // A finished request starts nothing more, so its size needs no check: walking the
    // schedule over the range (up to 1,000 steps) at every reconcile of a LockedJob that keeps
    // a finished backfill's annotation would be work for nothing.
    if same.is_none_or(|b| b.phase != BackfillPhase::Complete) {
        if let Err(message) = range.check_size(value, schedule) {
            return refused(message);
        }
    }
    let last = same.and_then(|b| b.last_time.as_ref().map(|t| t.0));
    let next = range.next(schedule, last);
    let backfill_active = seen
        .jobs
        .iter()
        .any(|j| is_running(j) && j.labels().get(LABEL_BACKFILL).is_some_and(|v| v == "true"));
    let status = match (same, next) {
        // A new request (or one replacing another): shown at once, before its first run.
        (None, _) => Some(backfill_status(
            &range,
            schedule,
            None,
            BackfillPhase::Running,
        )),
        (Some(b), None) if b.phase == BackfillPhase::Running && !backfill_active => Some(
            backfill_status(&range, schedule, last, BackfillPhase::Complete),
        ),
        _ => None,
    };
    let idle = !scheduled_run_starts && !seen.jobs.iter().any(is_running);
    let start = next.filter(|_| idle).map(|t| Backfill::Start(range, t));
    (start, status)
}

/// A backfill's progress with `last` the last time started: the same figures in every replica
/// and cluster.
pub fn backfill_status(
    range: &BackfillRange,
    schedule: &Schedule,
    last: Option<Timestamp>,
    phase: BackfillPhase,
) -> BackfillStatus {
    let total = range.count(schedule) as i64;
    let remaining = range.count_after(schedule, last) as i64;
    BackfillStatus {
        from: Time(range.from),
        to: Time(range.to),
        phase,
        total,
        started: total - remaining,
        remaining,
        last_time: last.map(Time),
    }
}

/// When the Job of the run for `scheduled` started and ended, once it has.
fn previous_run(jobs: &[Job], scheduled: Timestamp) -> Option<(Timestamp, Timestamp)> {
    let job = jobs
        .iter()
        .find(|j| scheduled_time(j) == Some(scheduled) && !is_running(j))?;
    Some((created_at(job)?, finished_at(job)?))
}

/// Conditions and active Jobs every replica computes alike; `None` when nothing changed, so
/// replicas do not write the same status over and over.
fn status_update(
    lj: &LockedJob,
    seen: &Observed,
    valid: &ValidSpec,
    next: Option<Timestamp>,
    active: &[&Job],
    backfill: Option<BackfillStatus>,
) -> Option<StatusUpdate> {
    let status = lj.status.clone().unwrap_or_default();
    let generation = lj.metadata.generation;
    // No scheduled time in the message: one that changed every period made each replica
    // write every LockedJob's status once a period, racing the others (at 1,000 LockedJobs,
    // most of the status patches that starved the API server). `lockedjob next NAME` prints
    // the coming times.
    let ready_message = match next {
        Some(_) if valid.policy.suspend => "suspended",
        Some(_) => "scheduling",
        None => "the schedule has no future time",
    };
    let degraded = seen.reachable < seen.nodes;
    let redis_message = format!(
        "{} of {} Redis nodes answer (quorum {})",
        seen.reachable, seen.nodes, seen.quorum
    );
    // Redis health is each replica's own view, and under load views differ (one replica's probe
    // times out, another's does not): if all wrote theirs, they would overwrite each other on
    // every LockedJob at every reconcile. The last run's holder speaks for it; before a first
    // run, anyone.
    let speaks_for_redis = status
        .last_run
        .as_ref()
        .is_none_or(|run| run.holder == seen.holder);
    let updates = [
        (
            conditions::INVALID_SPEC,
            false,
            "Valid",
            "the spec is valid",
            generation,
        ),
        (
            conditions::READY,
            true,
            "Scheduling",
            ready_message,
            generation,
        ),
        (
            conditions::REDIS_DEGRADED,
            degraded,
            if degraded { "NodesDown" } else { "AllNodesUp" },
            redis_message.as_str(),
            None,
        ),
    ];
    let mut conditions = status.conditions.clone();
    for (kind, value, reason, message, generation) in updates {
        if kind == conditions::REDIS_DEGRADED && !speaks_for_redis {
            continue;
        }
        let update = ConditionUpdate {
            kind,
            status: value,
            reason,
            message,
            generation,
        };
        set_condition(&mut conditions, update, seen.now);
    }
    let active_refs = active_list(active.iter().copied());
    let others_changed = !same_conditions(&conditions, &status.conditions)
        || status.observed_generation != generation
        || backfill.is_some();
    if !others_changed && status.active == active_refs {
        return None;
    }
    let defer = if others_changed {
        None
    } else {
        active_change_defer(&status.active, &active_refs, &seen.jobs, seen.now)
    };
    Some(StatusUpdate {
        conditions,
        active: Some(active_refs),
        observed_generation: generation,
        backfill,
        defer,
    })
}

/// How long to hold back a change of `status.active` alone: until `ACTIVE_GRACE` after the
/// latest start or finish among the Jobs that entered or left it. `None` (write now) when one
/// of them has no such time here (gone from the cache, or no timestamps).
fn active_change_defer(
    written: &[ObjectReference],
    wanted: &[ObjectReference],
    jobs: &[Job],
    now: Timestamp,
) -> Option<Duration> {
    let named = |r: &ObjectReference| r.name.clone().unwrap_or_default();
    let entered = wanted
        .iter()
        .filter(|r| !written.iter().any(|w| w.name == r.name));
    let left = written
        .iter()
        .filter(|w| !wanted.iter().any(|r| r.name == w.name));
    let mut latest = None;
    for (reference, started) in entered.map(|r| (r, true)).chain(left.map(|r| (r, false))) {
        let job = jobs.iter().find(|j| j.name_any() == named(reference))?;
        let at = if started {
            created_at(job)
        } else {
            finished_at(job)
        }?;
        latest = latest.max(Some(at));
    }
    let wait = ACTIVE_GRACE.checked_sub(age(latest?, now))?;
    (!wait.is_zero()).then_some(wait)
}

/// `status.active` for these Jobs: sorted by name, each once. The cache's order is arbitrary,
/// and a list in another order is another list to compare and write.
pub(crate) fn active_list<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> Vec<ObjectReference> {
    let mut list: Vec<ObjectReference> = jobs.into_iter().map(job_reference).collect();
    list.sort_by(|a, b| a.name.cmp(&b.name));
    list.dedup_by(|a, b| a.name == b.name);
    list
}

fn job_reference(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: Some(job.name_any()),
        namespace: job.namespace(),
        uid: job.uid(),
        ..Default::default()
    }
}

/// Equal but for Ready's message, which names the next time and changes at every run.
fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().all(|x| {
            b.iter().any(|y| {
                y.type_ == x.type_
                    && y.status == x.status
                    && y.reason == x.reason
                    && (y.type_ == conditions::READY || y.message == x.message)
            })
        })
}

/// How long until `next`, at most `MAX_REQUEUE`; zero when it is past. (The whole span: a
/// `Span`'s `get_milliseconds` is only its milliseconds field, which made every LockedJob
/// reconcile within a second whatever its schedule.)
fn until(next: Option<Timestamp>, now: Timestamp) -> Duration {
    next.map(|t| Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO))
        .unwrap_or(MAX_REQUEUE)
        .min(MAX_REQUEUE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// A LockedJob every minute, created at 10:00, with `extra` merged into its JSON.
    fn locked_job(extra: serde_json::Value) -> LockedJob {
        let mut value = json!({
            "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
            "metadata": {"name": "report", "namespace": "team-a", "uid": "u-1", "generation": 1,
                         "creationTimestamp": "2026-01-01T10:00:00Z"},
            "spec": {"schedule": "* * * * *", "successfulJobsHistoryLimit": 1,
                     "failedJobsHistoryLimit": 1,
                     "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                        "containers": [{"name": "main", "image": "busybox"}]}}}}}
        });
        json_patch::merge(&mut value, &extra);
        serde_json::from_value(value).expect("locked job")
    }

    /// A Job of the LockedJob for `scheduled`, in `state` ("active", "Complete", "Failed").
    fn job(scheduled: &str, state: &str) -> Job {
        let minute = ts(scheduled).as_second() / 60;
        let conditions = match state {
            "active" => json!([]),
            kind => json!([{"type": kind, "status": "True"}]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": format!("report-{minute}"), "namespace": "team-a",
                "creationTimestamp": scheduled,
                "annotations": {"lockedjob.dev/scheduled-time": scheduled,
                    "lockedjob.dev/holder": "east/r1"}},
            "status": {"conditions": conditions}
        }))
        .expect("job")
    }

    fn observed(now: &str, jobs: Vec<Job>, reachable: usize) -> Observed {
        Observed {
            now: ts(now),
            jobs,
            reachable,
            nodes: 3,
            quorum: 2,
            holder: "east/r1".into(),
        }
    }

    /// The conditions a fresh LockedJob gets with every Redis node answering.
    fn healthy_conditions() -> Vec<Condition> {
        valid(decide(
            &locked_job(json!({})),
            "team-a",
            &observed("2026-01-01T10:05:00Z", vec![], 3),
        ))
        .status
        .expect("a fresh object gets its conditions")
        .conditions
    }

    fn valid(plan: Plan) -> ValidPlan {
        match plan {
            Plan::Valid(plan) => *plan,
            other => panic!("expected a valid plan: {other:?}"),
        }
    }

    #[test]
    fn runs_are_started_held_back_and_cleaned_up_as_cronjob_would() {
        let forbid = json!({"spec": {"concurrencyPolicy": "Forbid"}});
        let replace = json!({"spec": {"concurrencyPolicy": "Replace"}});
        let allow = json!({"spec": {"concurrencyPolicy": "Allow"}});
        let suspended = json!({"spec": {"suspend": true}});
        let at = "2026-01-01T10:05:10Z";
        type Check = fn(&ValidPlan) -> bool;
        let table: Vec<(&str, serde_json::Value, Vec<Job>, Check)> = vec![
            ("due: start 10:05", json!({}), vec![], |p| {
                p.start.as_ref().map(|s| s.0) == Some(ts("2026-01-01T10:05:00Z"))
            }),
            (
                "already ran 10:05: nothing to start",
                json!({}),
                vec![job("2026-01-01T10:05:00Z", "Complete")],
                |p| p.start.is_none(),
            ),
            (
                "Allow: start beside an active run",
                allow,
                vec![job("2026-01-01T10:04:00Z", "active")],
                |p| {
                    p.start.as_ref().is_some_and(|s| s.1.is_empty())
                        && p.orphan_candidates.len() == 1
                },
            ),
            (
                "an active Job younger than a TTL is no orphan candidate",
                json!({}),
                vec![job("2026-01-01T10:05:00Z", "active")],
                |p| p.orphan_candidates.is_empty(),
            ),
            (
                "Forbid: held back while one is active",
                forbid,
                vec![job("2026-01-01T10:04:00Z", "active")],
                |p| p.start.is_none(),
            ),
            (
                "Replace: start and stop the active one",
                replace,
                vec![job("2026-01-01T10:04:00Z", "active")],
                |p| p.start.as_ref().is_some_and(|s| s.1.len() == 1),
            ),
            ("suspended: nothing starts", suspended, vec![], |p| {
                p.start.is_none()
            }),
            (
                "history beyond the limits is deleted, oldest first",
                json!({}),
                vec![
                    job("2026-01-01T10:03:00Z", "Complete"),
                    job("2026-01-01T10:04:00Z", "Complete"),
                    job("2026-01-01T10:05:00Z", "Failed"),
                ],
                |p| {
                    p.delete.len() == 1
                        && p.delete[0]
                            .ends_with(&(ts("2026-01-01T10:03:00Z").as_second() / 60).to_string())
                },
            ),
            (
                "an active run: looked at again within half a TTL",
                json!({}),
                vec![job("2026-01-01T10:05:00Z", "active")],
                |p| p.requeue <= Duration::from_secs(15),
            ),
        ];
        for (what, extra, jobs, check) in table {
            let plan = valid(decide(&locked_job(extra), "team-a", &observed(at, jobs, 3)));
            assert!(check(&plan), "{what}: {plan:#?}");
        }
    }

    #[test]
    fn a_change_of_active_alone_is_left_to_the_run_for_a_grace_period() {
        let conditions = healthy_conditions();
        let written = |active: serde_json::Value| {
            locked_job(json!({"status": {"conditions": conditions.clone(),
                "observedGeneration": 1, "active": active}}))
        };
        let finished_at = |at: &str| {
            let mut j = job("2026-01-01T10:05:00Z", "Complete");
            if let Some(c) = j.status.as_mut().and_then(|s| s.conditions.as_mut()) {
                c[0].last_transition_time =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(at)));
            }
            j
        };
        let active_ref = json!([{"apiVersion": "batch/v1", "kind": "Job",
            "name": format!("report-{}", ts("2026-01-01T10:05:00Z").as_second() / 60),
            "namespace": "team-a"}]);
        // (what, written status, Jobs in the cache, now, expected defer)
        type Row = (
            &'static str,
            LockedJob,
            Vec<Job>,
            &'static str,
            Option<Option<u64>>,
        );
        let table: Vec<Row> = vec![
            (
                "a Job started 1 s ago: wait 14 s more",
                written(json!([])),
                vec![job("2026-01-01T10:05:00Z", "active")],
                "2026-01-01T10:05:01Z",
                Some(Some(14)),
            ),
            (
                "a Job started 15 s ago and still missing: write now",
                written(json!([])),
                vec![job("2026-01-01T10:05:00Z", "active")],
                "2026-01-01T10:05:15Z",
                Some(None),
            ),
            (
                "a Job finished 1 s ago: wait",
                written(active_ref.clone()),
                vec![finished_at("2026-01-01T10:05:20Z")],
                "2026-01-01T10:05:21Z",
                Some(Some(14)),
            ),
            (
                "a Job gone from the cache: write now",
                written(active_ref.clone()),
                vec![],
                "2026-01-01T10:05:21Z",
                Some(None),
            ),
            (
                "the conditions changed too: write now",
                locked_job(json!({"status": {"active": []}})),
                vec![job("2026-01-01T10:05:00Z", "active")],
                "2026-01-01T10:05:01Z",
                Some(None),
            ),
            (
                "active as written: nothing to write",
                written(active_ref),
                vec![job("2026-01-01T10:05:00Z", "active")],
                "2026-01-01T10:05:01Z",
                None,
            ),
        ];
        for (what, lj, jobs, now, expected) in table {
            let plan = valid(decide(&lj, "team-a", &observed(now, jobs, 3)));
            let defer = plan
                .status
                .map(|s| s.defer.map(|d| d.as_secs_f64().round() as u64));
            assert_eq!(defer, expected, "{what}");
        }
    }

    #[test]
    fn status_is_written_when_it_changes_and_only_then() {
        let lj = locked_job(json!({}));
        let first = valid(decide(
            &lj,
            "team-a",
            &observed("2026-01-01T10:05:30Z", vec![], 3),
        ));
        let update = first.status.expect("a fresh object gets its conditions");
        let kinds: Vec<(&str, &str)> = update
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("InvalidSpec", "False"),
                ("Ready", "True"),
                ("RedisDegraded", "False")
            ]
        );
        // The same status written back: the next reconcile writes nothing, even though
        // Ready's message (the next time) moved on.
        let written = locked_job(json!({"status": {
            "conditions": update.conditions, "observedGeneration": 1}}));
        let again = valid(decide(
            &written,
            "team-a",
            &observed("2026-01-01T10:06:30Z", vec![], 3),
        ));
        assert_eq!(again.status, None);
        // A node stops answering: RedisDegraded turns True.
        let degraded = valid(decide(
            &written,
            "team-a",
            &observed("2026-01-01T10:06:30Z", vec![], 2),
        ));
        let conditions = degraded.status.expect("changed").conditions;
        assert!(conditions.iter().any(|c| c.type_ == "RedisDegraded"
            && c.status == "True"
            && c.message.contains("2 of 3")));
    }

    #[test]
    fn redis_health_is_written_by_the_last_runs_holder_only() {
        let healthy = healthy_conditions();
        let last_run = |holder: &str| {
            json!({"scheduledTime": "2026-01-01T10:05:00Z", "jobName": "report-1",
                "fencingToken": 7, "holder": holder, "outcome": "Succeeded"})
        };
        // (what, last run's holder, nodes this replica sees answer, expected RedisDegraded)
        let table = [
            ("no run yet: anyone reports", None, 2, Some("True")),
            (
                "this replica ran it: it reports",
                Some("east/r1"),
                2,
                Some("True"),
            ),
            (
                "another replica ran it: its view stands",
                Some("east/r2"),
                2,
                None,
            ),
            (
                "another cluster ran it: its view stands",
                Some("west/r1"),
                2,
                None,
            ),
            (
                "nothing changed: nothing to write",
                Some("east/r1"),
                3,
                None,
            ),
        ];
        for (what, holder, reachable, expected) in table {
            let mut status = json!({"conditions": healthy, "observedGeneration": 1});
            if let Some(holder) = holder {
                status["lastRun"] = last_run(holder);
            }
            let lj = locked_job(json!({"status": status}));
            let plan = valid(decide(
                &lj,
                "team-a",
                &observed("2026-01-01T10:06:30Z", vec![], reachable),
            ));
            let written = plan.status.map(|update| {
                update
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "RedisDegraded")
                    .map(|c| c.status)
                    .unwrap_or_default()
            });
            assert_eq!(written.as_deref(), expected, "{what}");
        }
    }

    #[test]
    fn an_invalid_spec_is_reported_once_per_message_and_generation() {
        let bad = locked_job(json!({"spec": {"schedule": "61 * * * *"}}));
        let now = "2026-01-01T10:05:00Z";
        let Plan::Invalid { message, report } = decide(&bad, "team-a", &observed(now, vec![], 3))
        else {
            panic!("invalid")
        };
        assert!(message.contains("spec.schedule"), "{message}");
        let report = report.expect("reported the first time");
        let reported = locked_job(json!({"spec": {"schedule": "61 * * * *"}, "status": {
            "conditions": report.conditions, "observedGeneration": 1}}));
        let Plan::Invalid { report, .. } = decide(&reported, "team-a", &observed(now, vec![], 3))
        else {
            panic!("still invalid")
        };
        assert_eq!(
            report, None,
            "not again for the same message and generation"
        );
    }

    #[test]
    fn the_wait_for_the_next_time_is_the_whole_span_up_to_the_cap() {
        let now = ts("2026-01-01T10:05:30Z");
        let table = [
            (
                Some("2026-01-01T10:05:31.500Z"),
                Duration::from_millis(1500),
            ),
            (Some("2026-01-01T10:06:30Z"), Duration::from_secs(60)),
            (Some("2026-01-01T11:00:00Z"), MAX_REQUEUE),
            (Some("2026-01-01T10:05:00Z"), Duration::ZERO),
            (None, MAX_REQUEUE),
        ];
        for (next, expected) in table {
            assert_eq!(until(next.map(ts), now), expected, "{next:?}");
        }
    }

    #[test]
    fn the_run_now_annotation_is_parsed_or_refused() {
        let at = "2026-01-01T10:05:30Z";
        let asked = locked_job(json!({"metadata": {"annotations": {
            "lockedjob.dev/run-now": "2026-01-01T10:05:20Z"}}}));
        let plan = valid(decide(&asked, "team-a", &observed(at, vec![], 3)));
        assert_eq!(
            plan.run_now,
            Some(RunNow::Requested(ts("2026-01-01T10:05:20Z")))
        );
        // Asked of an hourly job whose lock another cluster holds: looked at again within a
        // renew interval, not at the next hour.
        let hourly = locked_job(json!({"metadata": {"annotations": {
            "lockedjob.dev/run-now": "2026-01-01T10:05:20Z"}},
            "spec": {"schedule": "0 * * * *", "lock": {"ttlSeconds": 30}},
            "status": {"lastScheduleTime": "2026-01-01T10:00:00Z"}}));
        let plan = valid(decide(&hourly, "team-a", &observed(at, vec![], 3)));
        assert!(
            plan.requeue <= Duration::from_secs(10),
            "{:?}",
            plan.requeue
        );
        let garbled = locked_job(json!({"metadata": {"annotations": {
            "lockedjob.dev/run-now": "now please"}}}));
        let plan = valid(decide(&garbled, "team-a", &observed(at, vec![], 3)));
        assert!(
            matches!(&plan.run_now, Some(RunNow::Refused { value, message })
                if value == "now please" && message.contains("RFC 3339")),
            "{:?}",
            plan.run_now
        );
    }

    #[test]
    fn a_backfill_runs_its_times_in_turn_and_reports_its_phase() {
        let now = "2026-01-01T10:30:30Z";
        let range = "2026-01-01T10:05:00Z/2026-01-01T10:07:00Z";
        let parsed = BackfillRange {
            from: ts("2026-01-01T10:05:00Z"),
            to: ts("2026-01-01T10:07:00Z"),
        };
        let written = |last: Option<&str>, phase: &str| {
            json!({"from": "2026-01-01T10:05:00Z", "to": "2026-01-01T10:07:00Z", "phase": phase,
                   "total": 3, "started": 0, "remaining": 3, "lastTime": last})
        };
        // Suspended, so that the schedule starts nothing: a backfill still runs.
        let lj = |annotation: Option<&str>, status: serde_json::Value| {
            locked_job(json!({"spec": {"suspend": true},
                "metadata": {"annotations": {"lockedjob.dev/backfill": annotation}},
                "status": {"backfill": status}}))
        };
        let backfill_job = |scheduled: &str, state: &str| {
            let mut j = job(scheduled, state);
            j.metadata.labels =
                Some([("lockedjob.dev/backfill".to_string(), "true".to_string())].into());
            j
        };
        let start = |t: &str| Some(Backfill::Start(parsed, ts(t)));
        let phase = |status: &Option<StatusUpdate>| {
            status
                .as_ref()
                .and_then(|s| s.backfill.as_ref())
                .map(|b| (b.phase, b.started, b.last_time.clone()))
        };
        type Row = (
            &'static str,
            LockedJob,
            Vec<Job>,
            Option<Backfill>,
            Option<(BackfillPhase, i64, Option<Time>)>,
        );
        let table: Vec<Row> = vec![
            (
                "a new request: its first time, and the status shows it at once",
                lj(Some(range), json!(null)),
                vec![],
                start("2026-01-01T10:05:00Z"),
                Some((BackfillPhase::Running, 0, None)),
            ),
            (
                "the next time once the last ended",
                lj(
                    Some(range),
                    written(Some("2026-01-01T10:05:00Z"), "Running"),
                ),
                vec![backfill_job("2026-01-01T10:05:00Z", "Complete")],
                start("2026-01-01T10:06:00Z"),
                None,
            ),
            (
                "not while a Job runs",
                lj(
                    Some(range),
                    written(Some("2026-01-01T10:05:00Z"), "Running"),
                ),
                vec![backfill_job("2026-01-01T10:05:00Z", "active")],
                None,
                None,
            ),
            (
                "every time started and none runs: complete",
                lj(
                    Some(range),
                    written(Some("2026-01-01T10:07:00Z"), "Running"),
                ),
                vec![backfill_job("2026-01-01T10:07:00Z", "Complete")],
                None,
                Some((
                    BackfillPhase::Complete,
                    3,
                    Some(Time(ts("2026-01-01T10:07:00Z"))),
                )),
            ),
            (
                "the last one still runs: not complete yet",
                lj(
                    Some(range),
                    written(Some("2026-01-01T10:07:00Z"), "Running"),
                ),
                vec![backfill_job("2026-01-01T10:07:00Z", "active")],
                None,
                None,
            ),
            (
                "the annotation removed: cancelled",
                lj(None, written(Some("2026-01-01T10:06:00Z"), "Running")),
                vec![],
                None,
                Some((
                    BackfillPhase::Cancelled,
                    0,
                    Some(Time(ts("2026-01-01T10:06:00Z"))),
                )),
            ),
            (
                "set again after a cancel: resumes from the start (the register skips what ran)",
                lj(
                    Some(range),
                    written(Some("2026-01-01T10:06:00Z"), "Cancelled"),
                ),
                vec![],
                start("2026-01-01T10:05:00Z"),
                Some((BackfillPhase::Running, 0, None)),
            ),
            (
                "complete stays complete",
                lj(
                    Some(range),
                    written(Some("2026-01-01T10:07:00Z"), "Complete"),
                ),
                vec![],
                None,
                None,
            ),
        ];
        for (what, lj, jobs, expected_start, expected_status) in table {
            let plan = valid(decide(&lj, "team-a", &observed(now, jobs, 3)));
            assert_eq!(plan.backfill, expected_start, "{what}");
            assert_eq!(phase(&plan.status), expected_status, "{what}");
        }
        for (value, fragment) in [
            ("yesterday", "not FROM/TO"),
            (
                "2026-01-01T10:07:00Z/2026-01-01T10:05:00Z",
                "swap FROM and TO",
            ),
            ("2026-01-01T10:05:00Z/2026-01-01T11:00:00Z", "future"),
            (
                "2026-01-01T10:05:10Z/2026-01-01T10:05:20Z",
                "no scheduled time",
            ),
            (
                "2025-01-01T00:00:00Z/2026-01-01T10:00:00Z",
                "more than 1000",
            ),
        ] {
            let plan = valid(decide(
                &lj(Some(value), json!(null)),
                "team-a",
                &observed(now, vec![], 3),
            ));
            assert!(
                matches!(&plan.backfill, Some(Backfill::Refused { value: v, message })
                    if v == value && message.contains(fragment)),
                "{value}: {:?}",
                plan.backfill
            );
        }
        // Not suspended, with a scheduled time due: the schedule goes first.
        let due =
            locked_job(json!({"metadata": {"annotations": {"lockedjob.dev/backfill": range}}}));
        let plan = valid(decide(&due, "team-a", &observed(now, vec![], 3)));
        assert!(
            plan.start.is_some() && plan.backfill.is_none(),
            "{:?}",
            plan.backfill
        );
    }
}
