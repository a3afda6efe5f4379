//! The `LockedJob` API (`lockedjob.dev/v1alpha1`): a CronJob-like schedule plus a Job template,
//! run under a Redlock lease. Spec fields mirror batch/v1 CronJob where they apply.

mod validate;

pub use validate::{
    describe, validate, SpecError, ValidSpec, MAX_JOB_NAME, MAX_NAME_LENGTH, STOP_SLACK_SECONDS,
};

use k8s_openapi::api::batch::v1::JobTemplateSpec;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const API_GROUP: &str = "lockedjob.dev";
pub const API_VERSION: &str = "v1alpha1";

/// Annotations on every Job the operator creates (docs/design.md, "Names").
pub const ANNOTATION_FENCING_TOKEN: &str = "lockedjob.dev/fencing-token";
pub const ANNOTATION_LOCK_VALUE: &str = "lockedjob.dev/lock-value";
pub const ANNOTATION_HOLDER: &str = "lockedjob.dev/holder";
pub const ANNOTATION_SCHEDULED_TIME: &str = "lockedjob.dev/scheduled-time";
/// Set on a LockedJob to start a run now, like `kubectl create job --from=cronjob/x`.
pub const ANNOTATION_RUN_NOW: &str = "lockedjob.dev/run-now";
/// Set on a LockedJob to run the scheduled times of a past range, `FROM/TO` (RFC 3339, both
/// included), once each across replicas and clusters; removing it cancels what has not
/// started. `lockedjob backfill` sets and removes it.
pub const ANNOTATION_BACKFILL: &str = "lockedjob.dev/backfill";

/// Environment given to every Job pod (docs/design.md, "Names").
pub const ENV_FENCING_TOKEN: &str = "LOCKEDJOB_FENCING_TOKEN";
pub const ENV_LOCK_NAME: &str = "LOCKEDJOB_LOCK_NAME";
pub const ENV_SCHEDULED_TIME: &str = "LOCKEDJOB_SCHEDULED_TIME";
pub const ENV_HOLDER: &str = "LOCKEDJOB_HOLDER";

/// Condition types in `status.conditions`.
pub mod conditions {
    /// The spec is valid and the LockedJob is being scheduled.
    pub const READY: &str = "Ready";
    /// The spec cannot be run; the message says which field and how to fix it.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The last run lost its lease and was stopped.
    pub const LOCK_LOST: &str = "LockLost";
    /// Some Redis nodes do not answer; runs go on while a quorum does.
    pub const REDIS_DEGRADED: &str = "RedisDegraded";
}

/// A schedule and a Job template, run exactly once per scheduled time across every replica and
/// cluster that shares the same Redis nodes and lock name.
// Several printcolumns repeat `type_ = "string"`, which the lint mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lockedjob.dev",
    version = "v1alpha1",
    kind = "LockedJob",
    plural = "lockedjobs",
    shortname = "lj",
    namespaced,
    status = "LockedJobStatus",
    derive = "PartialEq",
    doc = "A CronJob-like schedule whose every run is executed exactly once, by one runner, under a Redlock lease with a fencing token.",
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(
        name = "Active",
        type_ = "string",
        json_path = ".status.active[*].name"
    ),
    printcolumn(
        name = "Last Schedule",
        type_ = "date",
        json_path = ".status.lastScheduleTime"
    ),
    printcolumn(
        name = "Holder",
        type_ = "string",
        json_path = ".status.lastRun.holder"
    ),
    printcolumn(
        name = "Token",
        type_ = "integer",
        json_path = ".status.lastRun.fencingToken"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("!self.schedule.startsWith('TZ=') && !self.schedule.startsWith('CRON_TZ=')").message("put the time zone in spec.timeZone, not in the schedule"))]
#[serde(rename_all = "camelCase")]
pub struct LockedJobSpec {
    /// Cron schedule: 5 fields (minute hour day-of-month month day-of-week) or a macro such as
    /// `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`. Extension: an optional leading
    /// seconds field (6 fields), e.g. `*/2 * * * * *` for every two seconds.
    #[schemars(length(min = 1, max = 256))]
    pub schedule: String,

    /// IANA time zone of the schedule, e.g. `Europe/Berlin`. Default: UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: Option<String>,

    /// No new runs while true; a running Job is left to finish.
    #[serde(default)]
    pub suspend: bool,

    /// What to do when a run is due while the previous one is still active.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,

    /// A run that could not start within this many seconds of its scheduled time is skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub starting_deadline_seconds: Option<i64>,

    /// Delay each scheduled time's start by up to this many seconds, by an offset derived from
    /// the lock name and the time: every replica and cluster computes the same start, and
    /// LockedJobs due at the same minute spread out. The Job still records its nominal
    /// scheduled time. Keep it below the schedule's period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub jitter_seconds: Option<i32>,

    /// Which missed scheduled times run after a pause (an operator or Redis outage): `Latest`
    /// (the default, as CronJob) runs only the most recent; `All` runs each, oldest first,
    /// once across replicas and clusters, within startingDeadlineSeconds and at most
    /// `maxCatchUp` of them.
    #[serde(default)]
    pub catch_up: CatchUpPolicy,

    /// With `catchUp: All`, the most missed times to run (the most recent ones). Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_catch_up: Option<i32>,

    /// Finished successful Jobs to keep.
    #[serde(default = "default_successful_history")]
    #[schemars(range(min = 0, max = 100))]
    pub successful_jobs_history_limit: i32,

    /// Finished failed Jobs to keep.
    #[serde(default = "default_failed_history")]
    #[schemars(range(min = 0, max = 100))]
    pub failed_jobs_history_limit: i32,

    /// The lease every run holds while its Job runs.
    #[serde(default)]
    pub lock: LockSpec,

    /// The Job to create for each run (batch/v1 JobTemplateSpec). Validated when the Job is
    /// created; kept open in this schema so the CRD stays small enough for `kubectl apply`.
    #[schemars(schema_with = "open_object_schema")]
    pub job_template: JobTemplateSpec,
}

fn default_successful_history() -> i32 {
    3
}

fn default_failed_history() -> i32 {
    1
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConcurrencyPolicy {
    /// Run the new Job alongside the active one (each still under its own lease).
    Allow,
    /// Skip the new run while one is active.
    #[default]
    Forbid,
    /// Stop the active Job, then run the new one.
    Replace,
    /// Keep the first run that comes due while one is active, and start it as soon as that
    /// one ends (even past startingDeadlineSeconds); drop any later ones.
    BufferOne,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CatchUpPolicy {
    /// Run only the most recent missed time.
    #[default]
    Latest,
    /// Run every missed time, oldest first, up to maxCatchUp of them.
    All,
}

/// The lease: its TTL bounds how long a dead holder blocks the job; renewals keep it while the
/// Job runs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.renewIntervalSeconds) || self.renewIntervalSeconds < self.ttlSeconds").message("renewIntervalSeconds must be shorter than ttlSeconds"))]
#[x_kube(validation = Rule::new("!has(self.safetyMarginSeconds) || self.safetyMarginSeconds < self.ttlSeconds").message("safetyMarginSeconds must be shorter than ttlSeconds"))]
#[serde(rename_all = "camelCase")]
pub struct LockSpec {
    /// Lock name shared by every runner of this job; default `{namespace}/{name}`. Give two
    /// clusters' LockedJobs the same name to run the job once across both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 200))]
    pub name: Option<String>,

    /// Lease TTL in seconds.
    #[serde(default = "default_ttl_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub ttl_seconds: i32,

    /// Renewal period in seconds; default ttlSeconds/3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub renew_interval_seconds: Option<i32>,

    /// Seconds before the lease deadline at which a holder that could not renew stops its Job.
    /// Default: the pod template's terminationGracePeriodSeconds plus 2, so that the pods are
    /// gone before the deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub safety_margin_seconds: Option<i32>,
}

fn default_ttl_seconds() -> i32 {
    30
}

impl Default for LockSpec {
    fn default() -> Self {
        Self {
            name: None,
            ttl_seconds: default_ttl_seconds(),
            renew_interval_seconds: None,
            safety_margin_seconds: None,
        }
    }
}

/// What the operator observed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockedJobStatus {
    /// Jobs of this LockedJob that are running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<ObjectReference>,
    /// Scheduled time of the last run that was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When the last successful run finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Time>,
    /// The last run: its scheduled time, token, holder and outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunRecord>,
    /// Ready, InvalidSpec, LockLost, RedisDegraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The backfill requested with the `lockedjob.dev/backfill` annotation, and how far it got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<BackfillStatus>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A backfill's progress. Every replica and cluster computes the same figures from `lastTime`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackfillStatus {
    /// The range requested, both ends included.
    pub from: Time,
    pub to: Time,
    pub phase: BackfillPhase,
    /// Scheduled times in the range.
    pub total: i64,
    /// Times started (here or in another cluster sharing the lock), in order.
    pub started: i64,
    /// Times not started yet.
    pub remaining: i64,
    /// The last time started.
    // Written as null when there is none: this status is written whole with merge patches,
    // where a missing field keeps the previous request's last time (and a new, earlier range
    // looked complete before it started).
    #[serde(default)]
    pub last_time: Option<Time>,
}

impl BackfillStatus {
    /// The request this status describes.
    pub fn range(&self) -> crate::schedule::BackfillRange {
        crate::schedule::BackfillRange {
            from: self.from.0,
            to: self.to.0,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BackfillPhase {
    /// Times remain; they start one after another, each once the lock is free.
    Running,
    /// Every time in the range started.
    Complete,
    /// The annotation was removed before the end: nothing more starts.
    Cancelled,
}

/// One run of the job.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub scheduled_time: Time,
    pub job_name: String,
    /// The fencing token the run held; larger than any token before it for this lock.
    pub fencing_token: i64,
    /// `{clusterId}/{podName}` of the operator replica that ran it.
    pub holder: String,
    pub outcome: RunOutcome,
    /// Why the run ended as it did.
    // Written as null when there is none, so that a merge patch with a new run's record does
    // not keep the previous run's message.
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum RunOutcome {
    Running,
    Succeeded,
    Failed,
    /// The lease was lost; the Job was deleted before the lease deadline.
    LockLost,
    /// Stopped by the operator (concurrency policy Replace, shutdown, or deletion).
    Stopped,
}

/// `{type: object, x-kubernetes-preserve-unknown-fields: true}`: the one place the schema is
/// open, for the embedded Job template.
fn open_object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// The LockedJob CRD, its descriptions as prose: the doc comments' line breaks joined within a
/// paragraph, so `kubectl explain` wraps them to the terminal instead of breaking sentences.
pub fn crd() -> CustomResourceDefinition {
    use kube::CustomResourceExt;
    let mut json = serde_json::to_value(LockedJob::crd())
        .unwrap_or_else(|e| unreachable!("a CRD always serializes: {e}"));
    join_descriptions(&mut json);
    serde_json::from_value(json).unwrap_or_else(|e| unreachable!("the same CRD reads back: {e}"))
}

fn join_descriptions(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    serde_json::Value::String(text) if key == "description" => *text = prose(text),
                    _ => join_descriptions(value),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(join_descriptions),
        _ => {}
    }
}

/// Joins the lines of each paragraph with spaces; blank lines stay paragraph breaks, and a
/// line starting a list item (`- `, `* `) keeps its own line.
pub fn prose(text: &str) -> String {
    text.split("\n\n")
        .map(|paragraph| {
            let mut joined = String::new();
            for line in paragraph.lines().map(str::trim) {
                if joined.is_empty() {
                } else if line.starts_with("- ") || line.starts_with("* ") {
                    joined.push('\n');
                } else {
                    joined.push(' ');
                }
                joined.push_str(line);
            }
            joined
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The CustomResourceDefinition as YAML, exactly as committed in `crds/`.
pub fn crd_yaml() -> String {
    let body = serde_saphyr::to_string(&crd())
        .unwrap_or_else(|e| unreachable!("a CRD always serializes: {e}"));
    format!("# Generated by `lockedjob crd`; do not edit: change src/api/ and regenerate.\n{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The operator writes `lastRun` and `backfill` whole, with JSON merge patches (RFC 7386):
    /// a field the new value lacks must be cleared, not kept from the old one.
    #[test]
    fn descriptions_read_as_prose() {
        let table = [
            ("one line", "one line"),
            (
                "a sentence broken\nacross lines.",
                "a sentence broken across lines.",
            ),
            (
                "first.\n\nsecond\nparagraph.",
                "first.\n\nsecond paragraph.",
            ),
            (
                "items:\n- one\n- two\nstill two",
                "items:\n- one\n- two still two",
            ),
        ];
        for (text, expected) in table {
            assert_eq!(prose(text), expected, "{text:?}");
        }
        let yaml = crd_yaml();
        assert!(yaml.contains(
            "description: What to do when a run is due while the previous one is still active."
        ));
        let json = serde_json::to_string(&crd()).expect("JSON");
        assert!(
            !json.contains("replica and\\ncluster"),
            "a description keeps a broken line"
        );
    }

    #[test]
    fn a_status_part_written_whole_replaces_the_old_one_in_a_merge_patch() {
        let time = |t: &str| Time(t.parse().expect("test time"));
        let backfill = |last_time: Option<&str>| BackfillStatus {
            from: time("2026-12-01T00:00:00Z"),
            to: time("2026-12-01T01:00:00Z"),
            phase: BackfillPhase::Running,
            total: 60,
            started: 0,
            remaining: 60,
            last_time: last_time.map(time),
        };
        let run = |message: Option<&str>| RunRecord {
            scheduled_time: time("2026-12-01T02:00:00Z"),
            job_name: "report-1".into(),
            fencing_token: 7,
            holder: "east/op-0".into(),
            outcome: RunOutcome::Running,
            message: message.map(String::from),
        };
        let cases = [
            (
                "a new backfill over a finished one",
                json!(backfill(Some("2026-12-02T00:00:00Z"))),
                json!(backfill(None)),
            ),
            (
                "a new run over one that ended with a message",
                json!(run(Some("the Job was deleted"))),
                json!(run(None)),
            ),
        ];
        // What a reader sees: the API server drops a field a merge patch sets to null.
        let present = |part: &serde_json::Value| -> Vec<(String, serde_json::Value)> {
            let fields = part.as_object().expect("an object");
            let fields = fields.iter().filter(|(_, v)| !v.is_null());
            fields.map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        for (case, mut written, new) in cases {
            json_patch::merge(&mut written, &new);
            assert_eq!(present(&written), present(&new), "{case}");
        }
    }
}
