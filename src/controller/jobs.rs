//! Building the Job for a run, and reading runs back from Jobs. Pure functions.

use crate::api::{
    LockedJob, ANNOTATION_FENCING_TOKEN, ANNOTATION_HOLDER, ANNOTATION_LOCK_VALUE,
    ANNOTATION_SCHEDULED_TIME, ENV_FENCING_TOKEN, ENV_HOLDER, ENV_LOCK_NAME, ENV_SCHEDULED_TIME,
};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::EnvVar;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};
use std::time::Duration;

/// Label on every Job the operator creates: which LockedJob it belongs to.
pub const LABEL_LOCKED_JOB: &str = "lockedjob.dev/locked-job";
/// Label on Jobs started by the `lockedjob.dev/run-now` annotation rather than the schedule.
pub const LABEL_MANUAL: &str = "lockedjob.dev/manual";
/// Label on Jobs started by a backfill (`lockedjob.dev/backfill`) rather than the schedule.
pub const LABEL_BACKFILL: &str = "lockedjob.dev/backfill";
/// Set by the Job controller on every pod it makes for a Job.
pub const LABEL_POD_JOB_NAME: &str = "batch.kubernetes.io/job-name";

/// What a run was started by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Schedule,
    /// The `lockedjob.dev/run-now` annotation.
    Manual,
    /// A backfill of a past range.
    Backfill,
}

impl Origin {
    /// The label that marks a Job of this origin, if any.
    fn label(self) -> Option<&'static str> {
        match self {
            Origin::Schedule => None,
            Origin::Manual => Some(LABEL_MANUAL),
            Origin::Backfill => Some(LABEL_BACKFILL),
        }
    }
}

/// What a run's Job carries.
#[derive(Debug, Clone)]
pub struct RunIdentity<'a> {
    pub job_name: &'a str,
    pub scheduled: Timestamp,
    pub lock_name: &'a str,
    pub lock_value: &'a str,
    pub holder: &'a str,
    pub token: u64,
    /// Runs not started by the schedule are labelled so, and not counted as scheduled times.
    pub origin: Origin,
}

/// The Job for one run: the template, plus owner reference, label, the annotations of docs/design.md,
/// and the run's environment appended to every container (after the template's own env, so a
/// template cannot shadow the token).
pub fn build_job(locked_job: &LockedJob, run: &RunIdentity<'_>) -> Job {
    let template = &locked_job.spec.job_template;
    let mut metadata = template.metadata.clone().unwrap_or_default();
    let scheduled = run.scheduled.to_string();
    let mut labels = metadata.labels.take().unwrap_or_default();
    labels.insert(LABEL_LOCKED_JOB.into(), locked_job.name_any());
    if let Some(label) = run.origin.label() {
        labels.insert(label.into(), "true".into());
    }
    let mut annotations = metadata.annotations.take().unwrap_or_default();
    annotations.insert(ANNOTATION_FENCING_TOKEN.into(), run.token.to_string());
    annotations.insert(ANNOTATION_LOCK_VALUE.into(), run.lock_value.into());
    annotations.insert(ANNOTATION_HOLDER.into(), run.holder.into());
    annotations.insert(ANNOTATION_SCHEDULED_TIME.into(), scheduled.clone());
    let mut spec = template.spec.clone().unwrap_or_default();
    let env = [
        (ENV_FENCING_TOKEN, run.token.to_string()),
        (ENV_LOCK_NAME, run.lock_name.to_string()),
        (ENV_SCHEDULED_TIME, scheduled),
        (ENV_HOLDER, run.holder.to_string()),
    ];
    if let Some(pod) = spec.template.spec.as_mut() {
        for container in pod
            .containers
            .iter_mut()
            .chain(pod.init_containers.iter_mut().flatten())
        {
            let vars = container.env.get_or_insert_with(Vec::new);
            vars.retain(|v| !env.iter().any(|(name, _)| *name == v.name));
            vars.extend(env.iter().map(|(name, value)| EnvVar {
                name: (*name).into(),
                value: Some(value.clone()),
                value_from: None,
            }));
        }
    }
    Job {
        metadata: ObjectMeta {
            name: Some(run.job_name.into()),
            namespace: locked_job.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: locked_job.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Active,
    Succeeded,
    Failed,
}

pub fn job_state(job: &Job) -> JobState {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let has = |kind: &str| {
        conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
    };
    if has("Complete") {
        JobState::Succeeded
    } else if has("Failed") {
        JobState::Failed
    } else {
        JobState::Active
    }
}

/// Still running and not being deleted: a run in progress.
pub fn is_running(job: &Job) -> bool {
    job_state(job) == JobState::Active && job.metadata.deletion_timestamp.is_none()
}

/// The scheduled time a Job was created for, from its annotation; `None` for a manual or
/// backfill run, which the schedule's history does not count.
pub fn scheduled_time(job: &Job) -> Option<Timestamp> {
    let labelled = |label| job.labels().get(label).is_some_and(|v| v == "true");
    if labelled(LABEL_MANUAL) || labelled(LABEL_BACKFILL) {
        return None;
    }
    job.annotations()
        .get(ANNOTATION_SCHEDULED_TIME)?
        .parse()
        .ok()
}

/// Finished Jobs beyond the history limits, oldest first: the ones to delete.
pub fn expired_history(jobs: &[Job], successful_limit: usize, failed_limit: usize) -> Vec<String> {
    let mut doomed = Vec::new();
    for (state, limit) in [
        (JobState::Succeeded, successful_limit),
        (JobState::Failed, failed_limit),
    ] {
        let mut finished: Vec<&Job> = jobs.iter().filter(|j| job_state(j) == state).collect();
        finished.sort_by_key(|j| scheduled_time(j));
        let excess = finished.len().saturating_sub(limit);
        doomed.extend(finished.iter().take(excess).map(|j| j.name_any()));
    }
    doomed
}

/// When a Job was created, from its creationTimestamp.
pub fn created_at(job: &Job) -> Option<Timestamp> {
    job.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// When a finished Job finished: the last transition of its Complete or Failed condition.
pub fn finished_at(job: &Job) -> Option<Timestamp> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .filter(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .filter_map(|c| c.last_transition_time.as_ref().map(|t| t.0))
        .max()
}

/// Whether this replica (`holder`) deletes the finished Jobs beyond the history limits. Every
/// replica sees the same ones; with all of them deleting, each Job cost three DELETEs. The
/// replica that created the newest Job (its holder annotation) does it, or any replica once
/// that Job is older than `grace`, in case its creator is gone.
pub fn cleans_history(jobs: &[Job], holder: &str, now: Timestamp, grace: Duration) -> bool {
    let Some(newest) = jobs.iter().max_by_key(|j| created_at(j)) else {
        return true;
    };
    let created_by_me = newest
        .annotations()
        .get(ANNOTATION_HOLDER)
        .map(String::as_str)
        == Some(holder);
    created_by_me || created_at(newest).is_none_or(|t| age(t, now) >= grace)
}

/// How long ago `t` was; zero for a time ahead of `now` (another machine's clock).
pub fn age(t: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(t)).unwrap_or(Duration::ZERO)
}

/// The Job name for a run, derived from the LockedJob's name and the scheduled time, as
/// CronJob does: minutes since the epoch, or seconds for schedules with a seconds field. Every
/// replica and cluster derives the same name, so a second create for the same run collides.
pub fn job_name(locked_job: &str, scheduled: Timestamp, has_seconds: bool) -> String {
    let stamp = if has_seconds {
        scheduled.as_second()
    } else {
        scheduled.as_second().div_euclid(60)
    };
    format!("{locked_job}-{stamp}")
}

/// The Job name of a run requested with `lockedjob.dev/run-now` for `requested`: deterministic,
/// so replicas racing for it create one Job, and distinct from every scheduled run's name
/// (`-m` then the seconds in base 36: at most 9 characters, so a 52-character LockedJob name
/// still fits the 63 a Job name may have).
pub fn manual_job_name(locked_job: &str, requested: Timestamp) -> String {
    off_schedule_job_name(locked_job, 'm', requested)
}

/// The Job name of a backfill run for `scheduled`: as [`manual_job_name`], with `-b`, so that
/// it never collides with the schedule's Job for the same time.
pub fn backfill_job_name(locked_job: &str, scheduled: Timestamp) -> String {
    off_schedule_job_name(locked_job, 'b', scheduled)
}

fn off_schedule_job_name(locked_job: &str, marker: char, at: Timestamp) -> String {
    let mut seconds = at.as_second().max(0) as u64;
    let mut digits = Vec::new();
    loop {
        digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(seconds % 36) as usize]);
        seconds /= 36;
        if seconds == 0 {
            break;
        }
    }
    digits.reverse();
    format!("{locked_job}-{marker}{}", String::from_utf8_lossy(&digits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn locked_job() -> LockedJob {
        serde_json::from_value(json!({
            "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
            "metadata": {"name": "report", "namespace": "team", "uid": "u-1"},
            "spec": {"schedule": "@daily", "jobTemplate": {
                "metadata": {"labels": {"app": "report"}},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                    {"name": "main", "image": "x", "env": [{"name": "KEEP", "value": "me"},
                                                             {"name": "LOCKEDJOB_FENCING_TOKEN", "value": "spoofed"}]}]}}}}}
        }))
        .expect("locked job")
    }

    fn job_with(conditions: serde_json::Value, scheduled: &str) -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": format!("j-{scheduled}"), "annotations": {ANNOTATION_SCHEDULED_TIME: scheduled}},
            "status": {"conditions": conditions}
        }))
        .expect("job")
    }

    #[test]
    fn job_carries_owner_labels_annotations_and_env() {
        let scheduled: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let run = RunIdentity {
            job_name: "report-29457600",
            scheduled,
            lock_name: "team/report",
            lock_value: "c/p/abc",
            holder: "c/p",
            token: 42,
            origin: Origin::Schedule,
        };
        let job = build_job(&locked_job(), &run);
        assert_eq!(job.name_any(), "report-29457600");
        assert_eq!(job.namespace().as_deref(), Some("team"));
        assert_eq!(
            job.labels().get(LABEL_LOCKED_JOB).map(String::as_str),
            Some("report")
        );
        assert_eq!(job.labels().get("app").map(String::as_str), Some("report"));
        assert_eq!(
            job.annotations()
                .get(ANNOTATION_FENCING_TOKEN)
                .map(String::as_str),
            Some("42")
        );
        assert_eq!(
            job.annotations()
                .get(ANNOTATION_SCHEDULED_TIME)
                .map(String::as_str),
            Some("2026-01-01T00:00:00Z")
        );
        let owner = &job.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("LockedJob", "u-1", Some(true))
        );
        let env = job.spec.unwrap().template.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap();
        let get = |n: &str| {
            env.iter()
                .filter(|v| v.name == n)
                .map(|v| v.value.clone().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("KEEP"), ["me"]);
        assert_eq!(
            get(ENV_FENCING_TOKEN),
            ["42"],
            "the template cannot shadow the token"
        );
        assert_eq!(get(ENV_LOCK_NAME), ["team/report"]);
        assert_eq!(get(ENV_SCHEDULED_TIME), ["2026-01-01T00:00:00Z"]);
        assert_eq!(get(ENV_HOLDER), ["c/p"]);
    }

    #[test]
    fn history_is_cleaned_by_the_newest_jobs_creator_or_anyone_after_a_grace() {
        let job = |created: &str, holder: &str| -> Job {
            serde_json::from_value(
                json!({"metadata": {"name": created, "creationTimestamp": created,
                "annotations": {"lockedjob.dev/holder": holder}}}),
            )
            .expect("job")
        };
        let jobs = vec![
            job("2026-01-01T10:00:00Z", "east/r2"),
            job("2026-01-01T10:01:00Z", "east/r1"),
        ];
        let grace = Duration::from_secs(30);
        let ts = |s: &str| s.parse::<Timestamp>().expect("time");
        let table = [
            (
                "the newest Job's creator",
                "east/r1",
                "2026-01-01T10:01:05Z",
                true,
            ),
            (
                "another replica, within the grace",
                "east/r2",
                "2026-01-01T10:01:05Z",
                false,
            ),
            (
                "another replica, after the grace",
                "east/r2",
                "2026-01-01T10:01:30Z",
                true,
            ),
            (
                "another cluster, after the grace",
                "west/r1",
                "2026-01-01T10:02:00Z",
                true,
            ),
        ];
        for (what, holder, now, expected) in table {
            assert_eq!(
                cleans_history(&jobs, holder, ts(now), grace),
                expected,
                "{what}"
            );
        }
        assert!(
            cleans_history(&[], "east/r2", ts("2026-01-01T10:01:05Z"), grace),
            "no Jobs"
        );
    }

    #[test]
    fn job_states_and_history_limits() {
        let complete = json!([{"type": "Complete", "status": "True"}]);
        let failed = json!([{"type": "Failed", "status": "True"}]);
        let jobs = vec![
            job_with(complete.clone(), "2026-01-01T00:01:00Z"),
            job_with(complete.clone(), "2026-01-01T00:00:00Z"),
            job_with(complete, "2026-01-01T00:02:00Z"),
            job_with(failed.clone(), "2026-01-01T00:03:00Z"),
            job_with(failed, "2026-01-01T00:04:00Z"),
            job_with(json!([]), "2026-01-01T00:05:00Z"),
        ];
        assert_eq!(job_state(&jobs[5]), JobState::Active);
        assert_eq!(job_state(&jobs[3]), JobState::Failed);
        // (successful limit, failed limit, expected deletions)
        let table: [(usize, usize, &[&str]); 3] = [
            (3, 1, &["j-2026-01-01T00:03:00Z"]),
            (
                1,
                0,
                &[
                    "j-2026-01-01T00:00:00Z",
                    "j-2026-01-01T00:01:00Z",
                    "j-2026-01-01T00:03:00Z",
                    "j-2026-01-01T00:04:00Z",
                ],
            ),
            (10, 10, &[]),
        ];
        for (ok, bad, expected) in table {
            assert_eq!(
                expired_history(&jobs, ok, bad),
                expected,
                "limits {ok}/{bad}"
            );
        }
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn job_names_are_deterministic_and_fit_label_limits() {
        let t = ts("2026-01-01T00:02:00Z");
        assert_eq!(
            job_name("report", t, false),
            format!("report-{}", t.as_second() / 60)
        );
        assert_eq!(
            job_name("report", t, true),
            format!("report-{}", t.as_second())
        );
        let longest = "x".repeat(crate::api::MAX_NAME_LENGTH);
        // Seconds-resolution names stay within the limit for millennia.
        let far = ts("2286-11-20T17:46:39Z");
        assert!(job_name(&longest, far, true).len() <= crate::api::MAX_JOB_NAME);
    }

    #[test]
    fn manual_run_names_are_deterministic_distinct_and_short_enough() {
        let table = [
            ("1970-01-01T00:00:00Z", "report-m0"),
            ("1970-01-01T00:00:35Z", "report-mz"),
            ("1970-01-01T00:00:36Z", "report-m10"),
            ("2026-12-02T17:00:00Z", "report-mtpfgk0"),
        ];
        for (at, expected) in table {
            let t = ts(at);
            assert_eq!(manual_job_name("report", t), expected, "{at}");
            assert_eq!(manual_job_name("report", t), manual_job_name("report", t));
            assert_ne!(manual_job_name("report", t), job_name("report", t, true));
            assert_ne!(backfill_job_name("report", t), job_name("report", t, true));
            assert_ne!(backfill_job_name("report", t), manual_job_name("report", t));
        }
        let longest = "x".repeat(crate::api::MAX_NAME_LENGTH);
        let far = ts("2286-11-20T17:46:39Z");
        assert!(manual_job_name(&longest, far).len() <= crate::api::MAX_JOB_NAME);
        assert_ne!(
            manual_job_name("report", ts("2026-01-01T00:00:01Z")),
            manual_job_name("report", ts("2026-01-01T00:00:02Z"))
        );
    }
}
