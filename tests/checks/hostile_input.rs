//! Hostile and malformed input, as property tests: cron schedules with time zones, LockedJob
//! specs, Redis node URLs and the run-now annotation. For every input: no panic, an answer (no
//! hang), and what is accepted is usable; what is refused says why. The same four targets run
//! under libFuzzer with `scripts/fuzz.sh` (fuzz/). `PROPTEST_CASES=100000` runs longer.

use jiff::Timestamp;
use lockedjob::api::{validate, LockedJobSpec};
use lockedjob::redlock::{Redlock, RedlockConfig};
use lockedjob::schedule::{parse_run_now, BackfillRange, Schedule, MAX_BACKFILL};
use proptest::prelude::*;

/// Cron-ish text: the characters cron uses, so most inputs get past the field count.
fn cron_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9*/,LW#?-]{1,6}( [0-9*/,LW#?A-Za-z-]{1,6}){4,5}",
        "@[a-z]{0,9}",
        "\\PC{0,40}",
    ]
}

fn zone() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        Just(Some("UTC".to_string())),
        Just(Some("Europe/Berlin".to_string())),
        Just(Some("America/St_Johns".to_string())),
        Just(Some("Australia/Lord_Howe".to_string())),
        "\\PC{0,30}".prop_map(Some),
        "[A-Za-z]{1,12}/[A-Za-z_]{1,12}".prop_map(Some),
    ]
}

fn cases() -> ProptestConfig {
    // CI's count; PROPTEST_CASES overrides it for longer runs.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    ProptestConfig::with_cases(cases)
}

proptest! {
    #![proptest_config(cases())]

    /// A schedule that parses fires: its next times exist and grow, the latest at or before
    /// one of them is that time itself.
    #[test]
    fn cron_schedules_with_time_zones(expression in cron_text(), zone in zone()) {
        let from: Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
        match Schedule::parse(&expression, zone.as_deref()) {
            Ok(schedule) => {
                let mut at = from;
                for _ in 0..3 {
                    let next = schedule.next_after(at);
                    prop_assert!(next.is_some_and(|n| n > at), "{expression:?} stops firing");
                    let next = next.unwrap();
                    prop_assert_eq!(schedule.latest_at_or_before(next), Some(next));
                    at = next;
                }
            }
            Err(err) => prop_assert!(!err.to_string().is_empty()),
        }
    }

    /// Any spec the CRD's JSON shape admits is either valid, with lease timing that itself
    /// validates, or refused with errors that each name a field.
    #[test]
    fn lockedjob_spec_validation(
        schedule in cron_text(),
        zone in zone(),
        lock_name in proptest::option::of("\\PC{0,300}"),
        ttl in prop_oneof![-5i64..5, 0i64..100_000, Just(i64::from(i32::MAX)), Just(i64::from(i32::MIN))],
        renew in proptest::option::of(-5i64..200_000),
        margin in proptest::option::of(-5i64..200_000),
        deadline in proptest::option::of(any::<i64>()),
        history in (any::<i32>(), any::<i32>()),
        grace in proptest::option::of(any::<i64>()),
        restart in prop_oneof![
            Just("Never".to_string()),
            Just("OnFailure".to_string()),
            Just("Always".to_string()),
            "\\PC{0,8}",
        ],
        policy in prop_oneof![Just("Allow"), Just("Forbid"), Just("Replace")],
        name in "[a-z0-9-]{1,80}",
    ) {
        let spec = serde_json::json!({
            "schedule": schedule,
            "timeZone": zone,
            "concurrencyPolicy": policy,
            "startingDeadlineSeconds": deadline,
            "successfulJobsHistoryLimit": history.0,
            "failedJobsHistoryLimit": history.1,
            "lock": {
                "name": lock_name,
                "ttlSeconds": ttl,
                "renewIntervalSeconds": renew,
                "safetyMarginSeconds": margin,
            },
            "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": restart,
                "terminationGracePeriodSeconds": grace,
                "containers": [{"name": "c", "image": "busybox"}],
            }}}},
        });
        let Ok(spec) = serde_json::from_value::<LockedJobSpec>(spec) else {
            // Out of the schema's range (e.g. a TTL beyond i32): the API server refuses it.
            return Ok(());
        };
        match validate("team-a", &name, &spec) {
            Ok(valid) => {
                prop_assert!(valid.timing.validate(lockedjob::redlock::DEFAULT_DRIFT_FACTOR).is_ok());
                prop_assert!(!valid.lock_name.is_empty());
            }
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                for error in errors {
                    prop_assert!(
                        error.field == "metadata.name" || error.field.starts_with("spec."),
                        "{error:?}"
                    );
                    prop_assert!(!error.message.is_empty());
                }
            }
        }
    }

    /// Node URLs: accepted or refused, and a password in the URL is never repeated in an
    /// error message.
    #[test]
    fn redis_node_urls(
        scheme in prop_oneof![Just("redis://"), Just("rediss://"), Just("http://"), Just("")],
        password in "[A-Za-z0-9]{12}",
        rest in "\\PC{0,60}",
        with_password in any::<bool>(),
    ) {
        let url = if with_password {
            format!("{scheme}user:{password}@{rest}")
        } else {
            format!("{scheme}{rest}")
        };
        match Redlock::new(RedlockConfig::new(vec![url.clone()])) {
            Ok(_) => {}
            Err(err) => {
                let message = err.to_string();
                prop_assert!(!message.is_empty());
                if with_password {
                    prop_assert!(!message.contains(&password), "{message}");
                }
            }
        }
    }

    /// The run-now annotation: an accepted time prints back as itself; a refused one is
    /// explained with the command that sets it right.
    #[test]
    fn run_now_annotation(
        value in prop_oneof![
            "\\PC{0,40}",
            "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{2,12}(Z|[+-][0-9]{2}:[0-9]{2})?",
        ]
    ) {
        match parse_run_now(&value) {
            Ok(time) => prop_assert_eq!(parse_run_now(&time.to_string()), Ok(time)),
            Err(message) => prop_assert!(message.contains("kubectl annotate")),
        }
    }

    /// The backfill annotation: an accepted range is in the past, in order, and holds 1 to
    /// MAX_BACKFILL scheduled times; anything else is refused with a message, never a panic.
    #[test]
    fn backfill_annotation(
        value in prop_oneof![
            "\\PC{0,60}",
            "2026-0[1-3]-[0-2][0-9]T[0-2][0-9]:[0-5][0-9]:00Z/2026-0[1-3]-[0-2][0-9]T[0-2][0-9]:[0-5][0-9]:00Z",
        ],
        which in 0..3usize,
    ) {
        let schedule = Schedule::parse(["@hourly", "*/5 * * * *", "0 0 * * * *"][which], None).expect("schedule");
        let now: Timestamp = "2026-06-01T00:00:00Z".parse().expect("now");
        match BackfillRange::parse(&value, &schedule, now) {
            Ok(range) => {
                prop_assert!(range.from <= range.to && range.to <= now);
                prop_assert!((1..=MAX_BACKFILL).contains(&range.count(&schedule)));
                prop_assert_eq!(range.next(&schedule, None).map(|t| t >= range.from), Some(true));
            }
            Err(message) => prop_assert!(!message.is_empty()),
        }
    }
}
