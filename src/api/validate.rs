//! What the CRD schema cannot say: cron syntax, time zones, lease timing against the pods'
//! shutdown time, derived name lengths. Every error names the field and the fix.

use super::{CatchUpPolicy, ConcurrencyPolicy, LockedJobSpec};
use crate::redlock::{LeaseTiming, DEFAULT_DRIFT_FACTOR};
use crate::schedule::{CatchUp, Concurrency, Jitter, Policy, Schedule};
use jiff::SignedDuration;
use std::fmt;
use std::time::Duration;

/// Longest LockedJob name: the Job name appends `-` and up to 10 digits and must stay a valid
/// label value (63 characters), as with CronJob's 52.
/// Kubernetes' limit for label values, which the Job controller copies the Job name into.
pub const MAX_JOB_NAME: usize = 63;

pub const MAX_NAME_LENGTH: usize = MAX_JOB_NAME - 11;
/// Longest lock name (it becomes part of two Redis keys).
pub const MAX_LOCK_NAME_LENGTH: usize = 200;
/// Time allowed for a Job deletion to reach the kubelet, on top of the pods' grace period.
pub const STOP_SLACK_SECONDS: i64 = 2;
/// The largest `spec.jitterSeconds`: an hour (the CRD schema says the same).
pub const MAX_JITTER_SECONDS: i32 = 3600;
/// `spec.maxCatchUp`'s default and bounds (the CRD schema says the same).
pub const DEFAULT_MAX_CATCH_UP: i32 = 10;
pub const MAX_CATCH_UP: i32 = 1000;
/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE_SECONDS: i64 = 30;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// JSON path of the offending field, e.g. `spec.lock.ttlSeconds`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Joins errors for a condition message or an event.
pub fn describe(errors: &[SpecError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A spec that passed every check, with its parsed parts.
#[derive(Debug, Clone)]
pub struct ValidSpec {
    pub policy: Policy,
    pub lock_name: String,
    pub timing: LeaseTiming,
}

fn error(field: &str, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.to_string(),
        message: message.into(),
    }
}

pub fn validate(
    namespace: &str,
    name: &str,
    spec: &LockedJobSpec,
) -> Result<ValidSpec, Vec<SpecError>> {
    let mut errors = Vec::new();
    check_name(name, &mut errors);
    let schedule = schedule(spec, &mut errors);
    let lock_name = lock_name(namespace, name, spec, &mut errors);
    check_counts(spec, &mut errors);
    let grace = pod_grace(spec, &mut errors);
    let timing = lease_timing(spec, grace, &mut errors);
    check_jitter(spec, &mut errors);
    let catch_up = catch_up(spec, &mut errors);
    match (schedule, timing, errors.is_empty()) {
        (Some(schedule), Some(timing), true) => Ok(ValidSpec {
            policy: policy(spec, schedule, catch_up, &lock_name),
            lock_name,
            timing,
        }),
        _ => Err(errors),
    }
}

fn check_name(name: &str, errors: &mut Vec<SpecError>) {
    if name.len() > MAX_NAME_LENGTH {
        errors.push(error(
            "metadata.name",
            format!(
                "{name:?} is {} characters; at most {MAX_NAME_LENGTH} are allowed so that derived Job names fit Kubernetes' 63-character limit",
                name.len()
            ),
        ));
    }
}

fn schedule(spec: &LockedJobSpec, errors: &mut Vec<SpecError>) -> Option<Schedule> {
    match Schedule::parse(&spec.schedule, spec.time_zone.as_deref()) {
        Ok(schedule) => Some(schedule),
        Err(e @ crate::schedule::ScheduleError::TimeZone(_)) => {
            errors.push(error("spec.timeZone", e.to_string()));
            None
        }
        Err(e) => {
            errors.push(error("spec.schedule", e.to_string()));
            None
        }
    }
}

/// `spec.lock.name`, by default `{namespace}/{name}`: the same in every cluster that runs the
/// LockedJob under that namespace and name.
fn lock_name(
    namespace: &str,
    name: &str,
    spec: &LockedJobSpec,
    errors: &mut Vec<SpecError>,
) -> String {
    let lock_name = spec
        .lock
        .name
        .clone()
        .unwrap_or_else(|| format!("{namespace}/{name}"));
    if lock_name.trim().is_empty()
        || lock_name.len() > MAX_LOCK_NAME_LENGTH
        || lock_name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        errors.push(error(
            "spec.lock.name",
            format!("{lock_name:?} must be 1 to {MAX_LOCK_NAME_LENGTH} characters without spaces or control characters"),
        ));
    }
    lock_name
}

/// The starting deadline and the history limits: none negative.
fn check_counts(spec: &LockedJobSpec, errors: &mut Vec<SpecError>) {
    if let Some(deadline) = spec.starting_deadline_seconds {
        if deadline < 0 {
            errors.push(error(
                "spec.startingDeadlineSeconds",
                "must be zero or more seconds",
            ));
        }
    }
    for (field, limit) in [
        (
            "spec.successfulJobsHistoryLimit",
            spec.successful_jobs_history_limit,
        ),
        (
            "spec.failedJobsHistoryLimit",
            spec.failed_jobs_history_limit,
        ),
    ] {
        if limit < 0 {
            errors.push(error(field, "must be zero or more"));
        }
    }
}

/// Checks the Job template's pod spec; its termination grace period (the lease must outlast
/// it).
fn pod_grace(spec: &LockedJobSpec, errors: &mut Vec<SpecError>) -> i64 {
    let pod_spec = spec
        .job_template
        .spec
        .as_ref()
        .and_then(|job| job.template.spec.as_ref());
    match pod_spec {
        None => errors.push(error(
            "spec.jobTemplate.spec.template.spec",
            "the Job template needs a pod spec with at least one container",
        )),
        Some(pod) => {
            if pod.containers.is_empty() {
                errors.push(error(
                    "spec.jobTemplate.spec.template.spec.containers",
                    "must list at least one container",
                ));
            }
            match pod.restart_policy.as_deref() {
                Some("Never") | Some("OnFailure") => {}
                other => errors.push(error(
                    "spec.jobTemplate.spec.template.spec.restartPolicy",
                    format!(
                        "is {:?}; Jobs need Never or OnFailure",
                        other.unwrap_or("Always (the default)")
                    ),
                )),
            }
        }
    }
    pod_spec
        .and_then(|pod| pod.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS)
        .max(0)
}

fn check_jitter(spec: &LockedJobSpec, errors: &mut Vec<SpecError>) {
    if let Some(jitter) = spec.jitter_seconds {
        if !(0..=MAX_JITTER_SECONDS).contains(&jitter) {
            errors.push(error(
                "spec.jitterSeconds",
                format!("is {jitter}; use 0 to {MAX_JITTER_SECONDS} seconds, below the schedule's period"),
            ));
        }
    }
}

/// The schedule's policy from a spec that passed every check.
fn policy(spec: &LockedJobSpec, schedule: Schedule, catch_up: CatchUp, lock_name: &str) -> Policy {
    Policy {
        schedule,
        suspend: spec.suspend,
        concurrency: match spec.concurrency_policy {
            ConcurrencyPolicy::Allow => Concurrency::Allow,
            ConcurrencyPolicy::Forbid => Concurrency::Forbid,
            ConcurrencyPolicy::Replace => Concurrency::Replace,
            ConcurrencyPolicy::BufferOne => Concurrency::BufferOne,
        },
        catch_up,
        starting_deadline: spec
            .starting_deadline_seconds
            .map(SignedDuration::from_secs),
        jitter: spec.jitter_seconds.filter(|s| *s > 0).map(|s| Jitter {
            max: SignedDuration::from_secs(i64::from(s)),
            key: lock_name.to_string(),
        }),
    }
}

/// `spec.catchUp` and `spec.maxCatchUp`, with the combinations that cannot mean anything
/// refused.
fn catch_up(spec: &LockedJobSpec, errors: &mut Vec<SpecError>) -> CatchUp {
    let all = spec.catch_up == CatchUpPolicy::All;
    match (all, spec.max_catch_up) {
        (false, Some(_)) => errors.push(error(
            "spec.maxCatchUp",
            "applies only with catchUp: All; set catchUp: All or remove maxCatchUp",
        )),
        (true, Some(max)) if !(1..=MAX_CATCH_UP).contains(&max) => errors.push(error(
            "spec.maxCatchUp",
            format!("is {max}; use 1 to {MAX_CATCH_UP}"),
        )),
        _ => {}
    }
    match spec.concurrency_policy {
        ConcurrencyPolicy::Replace if all => errors.push(error(
            "spec.catchUp",
            "All with concurrencyPolicy Replace would stop each caught-up run as soon as the next starts; use Forbid or Allow with catchUp: All",
        )),
        ConcurrencyPolicy::BufferOne if all => errors.push(error(
            "spec.catchUp",
            "All runs every missed time, BufferOne at most one: choose one (Forbid with catchUp: All runs each in turn)",
        )),
        ConcurrencyPolicy::BufferOne
            if spec.successful_jobs_history_limit < 1 || spec.failed_jobs_history_limit < 1 =>
        {
            errors.push(error(
                "spec.concurrencyPolicy",
                "BufferOne reads when the last run ended from its Job: keep successfulJobsHistoryLimit and failedJobsHistoryLimit at 1 or more",
            ))
        }
        _ => {}
    }
    if !all {
        return CatchUp::Latest;
    }
    let max = spec
        .max_catch_up
        .unwrap_or(DEFAULT_MAX_CATCH_UP)
        .clamp(1, MAX_CATCH_UP);
    CatchUp::All { max: max as u32 }
}

/// The lease must outlive one renewal period plus the time the pods need to stop after the
/// holder gives up (`safetyMargin`, which defaults to the grace period plus slack).
fn lease_timing(
    spec: &LockedJobSpec,
    grace: i64,
    errors: &mut Vec<SpecError>,
) -> Option<LeaseTiming> {
    let lock = &spec.lock;
    if lock.ttl_seconds < 1 {
        errors.push(error("spec.lock.ttlSeconds", "must be at least 1"));
        return None;
    }
    let needed_margin = grace + STOP_SLACK_SECONDS;
    let margin = match lock.safety_margin_seconds {
        Some(m) if i64::from(m) < needed_margin => {
            errors.push(error(
                "spec.lock.safetyMarginSeconds",
                format!("is {m}s, but the pods may take terminationGracePeriodSeconds ({grace}s) + {STOP_SLACK_SECONDS}s to stop; set it to at least {needed_margin} or lower the grace period"),
            ));
            return None;
        }
        Some(m) => i64::from(m),
        None => needed_margin,
    };
    let timing_for = |ttl_seconds: i64| {
        let ttl = Duration::from_secs(ttl_seconds as u64);
        LeaseTiming {
            ttl,
            renew_interval: lock
                .renew_interval_seconds
                .map(|r| Duration::from_secs(r.max(0) as u64))
                .unwrap_or(ttl / 3),
            safety_margin: Duration::from_secs(margin as u64),
        }
    };
    let timing = timing_for(i64::from(lock.ttl_seconds));
    if timing.validate(DEFAULT_DRIFT_FACTOR).is_ok() {
        return Some(timing);
    }
    let fix = (i64::from(lock.ttl_seconds)..=86_400)
        .find(|t| timing_for(*t).validate(DEFAULT_DRIFT_FACTOR).is_ok());
    let renew = lock
        .renew_interval_seconds
        .map_or("ttlSeconds/3".to_string(), |r| format!("{r}s"));
    let advice = match fix {
        Some(t) => format!("raise ttlSeconds to at least {t}"),
        None => "lower renewIntervalSeconds".to_string(),
    };
    errors.push(error(
        "spec.lock.ttlSeconds",
        format!(
            "{}s is too short: a holder must renew (every {renew}) and still have {margin}s (safety margin: the pods' terminationGracePeriodSeconds {grace}s + {STOP_SLACK_SECONDS}s) to stop the Job before the lease ends; {advice}, or lower terminationGracePeriodSeconds",
            lock.ttl_seconds
        ),
    ));
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LockedJobSpec;

    fn spec(yaml: &str) -> LockedJobSpec {
        serde_saphyr::from_str(yaml).expect("test spec parses")
    }

    const TEMPLATE: &str = r#"
jobTemplate:
  spec:
    template:
      spec:
        restartPolicy: Never
        terminationGracePeriodSeconds: 5
        containers: [{name: main, image: busybox}]
"#;

    #[test]
    fn valid_spec_gets_defaults() {
        let s = spec(&format!("schedule: '*/5 * * * *'\n{TEMPLATE}"));
        let valid = validate("team", "sweep", &s).expect("valid");
        assert_eq!(valid.lock_name, "team/sweep");
        assert_eq!(valid.timing.ttl, Duration::from_secs(30));
        assert_eq!(valid.timing.renew_interval, Duration::from_secs(10));
        assert_eq!(valid.timing.safety_margin, Duration::from_secs(7));
        assert_eq!(valid.policy.concurrency, Concurrency::Forbid);
        assert!(!valid.policy.schedule.has_seconds());
        assert_eq!(valid.policy.catch_up, CatchUp::Latest);
        let s = spec(&format!("schedule: '@hourly'\ncatchUp: All\n{TEMPLATE}"));
        let valid = validate("team", "sweep", &s).expect("valid");
        assert_eq!(valid.policy.catch_up, CatchUp::All { max: 10 });
    }

    #[test]
    fn each_broken_field_is_named_with_its_fix() {
        // (extra yaml, name, field, fragment of the message)
        let long_name = "x".repeat(53);
        let table: Vec<(String, &str, &str, &str)> = vec![
            (
                "schedule: 'not a cron'".into(),
                "a",
                "spec.schedule",
                "not a valid cron expression",
            ),
            (
                "schedule: '61 * * * *'".into(),
                "a",
                "spec.schedule",
                "not a valid cron expression",
            ),
            (
                "schedule: 'TZ=UTC 0 * * * *'".into(),
                "a",
                "spec.schedule",
                "spec.timeZone",
            ),
            (
                "schedule: '0 0 30 2 *'".into(),
                "a",
                "spec.schedule",
                "never matches",
            ),
            (
                "schedule: '@hourly'\ntimeZone: Mars/Olympus".into(),
                "a",
                "spec.timeZone",
                "IANA name",
            ),
            (
                "schedule: '@hourly'".into(),
                &long_name,
                "metadata.name",
                "at most 52",
            ),
            (
                "schedule: '@hourly'\nlock: {ttlSeconds: 5}".into(),
                "a",
                "spec.lock.ttlSeconds",
                "raise ttlSeconds to at least 11",
            ),
            (
                "schedule: '@hourly'\nlock: {ttlSeconds: 30, safetyMarginSeconds: 3}".into(),
                "a",
                "spec.lock.safetyMarginSeconds",
                "at least 7",
            ),
            (
                "schedule: '@hourly'\nlock: {name: 'has space'}".into(),
                "a",
                "spec.lock.name",
                "without spaces",
            ),
            (
                "schedule: '@hourly'\nstartingDeadlineSeconds: -1".into(),
                "a",
                "spec.startingDeadlineSeconds",
                "zero or more",
            ),
            (
                "schedule: '@hourly'\nmaxCatchUp: 5".into(),
                "a",
                "spec.maxCatchUp",
                "only with catchUp: All",
            ),
            (
                "schedule: '@hourly'\ncatchUp: All\nmaxCatchUp: 0".into(),
                "a",
                "spec.maxCatchUp",
                "use 1 to 1000",
            ),
            (
                "schedule: '@hourly'\ncatchUp: All\nconcurrencyPolicy: Replace".into(),
                "a",
                "spec.catchUp",
                "use Forbid or Allow",
            ),
            (
                "schedule: '@hourly'\ncatchUp: All\nconcurrencyPolicy: BufferOne".into(),
                "a",
                "spec.catchUp",
                "choose one",
            ),
            (
                "schedule: '@hourly'\nconcurrencyPolicy: BufferOne\nsuccessfulJobsHistoryLimit: 0"
                    .into(),
                "a",
                "spec.concurrencyPolicy",
                "at 1 or more",
            ),
        ];
        for (extra, name, field, fragment) in table {
            let s = spec(&format!("{extra}\n{TEMPLATE}"));
            let errors = validate("ns", name, &s).expect_err(&extra);
            let hit = errors.iter().find(|e| e.field == field);
            let hit = hit.unwrap_or_else(|| panic!("{extra}: no error on {field}: {errors:?}"));
            assert!(hit.message.contains(fragment), "{extra}: {hit}");
        }
    }

    #[test]
    fn job_template_must_be_runnable() {
        let table = [
            (
                "jobTemplate: {spec: {template: {spec: {restartPolicy: Never, containers: []}}}}",
                "containers",
            ),
            (
                "jobTemplate: {spec: {template: {spec: {containers: [{name: a, image: b}]}}}}",
                "restartPolicy",
            ),
            ("jobTemplate: {}", "spec.jobTemplate.spec.template.spec"),
        ];
        for (template, field) in table {
            let s = spec(&format!("schedule: '@daily'\n{template}"));
            let errors = validate("ns", "a", &s).expect_err(template);
            assert!(
                errors.iter().any(|e| e.field.ends_with(field)),
                "{template}: {errors:?}"
            );
        }
    }

    #[test]
    fn default_grace_period_needs_a_longer_ttl() {
        // No terminationGracePeriodSeconds: Kubernetes' 30 s applies, so 30 s TTL is too short.
        let s = spec("schedule: '@daily'\njobTemplate: {spec: {template: {spec: {restartPolicy: Never, containers: [{name: a, image: b}]}}}}");
        let errors = validate("ns", "a", &s).expect_err("ttl too short for 30s grace");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0]
                .message
                .contains("raise ttlSeconds to at least 49"),
            "{}",
            errors[0]
        );
    }
}
