use super::*;
use proptest::prelude::*;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn schedule(expr: &str, zone: Option<&str>) -> Schedule {
    Schedule::parse(expr, zone).unwrap_or_else(|e| panic!("{expr}: {e}"))
}

fn policy(expr: &str) -> Policy {
    Policy {
        schedule: schedule(expr, None),
        suspend: false,
        concurrency: Concurrency::Forbid,
        starting_deadline: None,
        jitter: None,
        catch_up: CatchUp::Latest,
    }
}

#[test]
fn parses_standard_macros_and_seconds_and_rejects_the_rest() {
    // (expression, after, expected next, has seconds)
    let table = [
        (
            "*/5 * * * *",
            "2026-01-01T00:01:00Z",
            "2026-01-01T00:05:00Z",
            false,
        ),
        (
            "0 3 * * *",
            "2026-01-01T03:00:00Z",
            "2026-01-02T03:00:00Z",
            false,
        ),
        (
            "@hourly",
            "2026-01-01T00:59:59Z",
            "2026-01-01T01:00:00Z",
            false,
        ),
        (
            "@daily",
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z",
            false,
        ),
        (
            "@midnight",
            "2026-01-01T12:00:00Z",
            "2026-01-02T00:00:00Z",
            false,
        ),
        (
            "@weekly",
            "2026-01-01T00:00:00Z",
            "2026-01-04T00:00:00Z",
            false,
        ), // a Sunday
        (
            "@monthly",
            "2026-01-15T00:00:00Z",
            "2026-02-01T00:00:00Z",
            false,
        ),
        (
            "@yearly",
            "2026-01-15T00:00:00Z",
            "2027-01-01T00:00:00Z",
            false,
        ),
        (
            "*/2 * * * * *",
            "2026-01-01T00:00:01Z",
            "2026-01-01T00:00:02Z",
            true,
        ),
        (
            "30 0 9 * * MON-FRI",
            "2026-01-02T09:00:30Z",
            "2026-01-05T09:00:30Z",
            true,
        ),
        // Day-of-month OR day-of-week, as in Vixie cron: the 13th, or any Friday.
        (
            "0 0 13 * 5",
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z",
            false,
        ),
    ];
    for (expr, after, expected, seconds) in table {
        let s = schedule(expr, None);
        assert_eq!(
            s.next_after(ts(after)),
            Some(ts(expected)),
            "{expr} after {after}"
        );
        assert_eq!(s.has_seconds(), seconds, "{expr}");
    }
    for bad in [
        "",
        "* * * *",
        "* * * * * * *",
        "60 * * * *",
        "* 24 * * *",
        "@often",
        "a b c d e",
    ] {
        assert!(
            matches!(Schedule::parse(bad, None), Err(ScheduleError::Cron { .. })),
            "{bad:?}"
        );
    }
    assert!(matches!(
        Schedule::parse("TZ=UTC * * * * *", None),
        Err(ScheduleError::InlineTimeZone(_))
    ));
    assert!(matches!(
        Schedule::parse("@daily", Some("Nowhere/City")),
        Err(ScheduleError::TimeZone(_))
    ));
}

#[test]
fn time_zones_with_dst_gaps_and_overlaps() {
    let ny = Some("America/New_York");
    // (expression, zone, after, expected next occurrences in UTC)
    let table: [(&str, Option<&str>, &str, &[&str]); 5] = [
        // Plain offset: 03:00 in Berlin (CET, UTC+1) is 02:00 UTC.
        (
            "0 3 * * *",
            Some("Europe/Berlin"),
            "2026-01-10T00:00:00Z",
            &["2026-01-10T02:00:00Z"],
        ),
        // Spring forward (2026-03-08, 02:00 EST -> 03:00 EDT): 02:30 does not exist that day;
        // the run happens once, right after the gap at 03:00 EDT, and at 02:30 EDT next day.
        (
            "30 2 * * *",
            ny,
            "2026-03-07T12:00:00Z",
            &["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"],
        ),
        // Fall back (2026-11-01, 02:00 EDT -> 01:00 EST): 01:30 happens twice; a fixed-time job
        // runs once, at the first (EDT) one.
        (
            "30 1 * * *",
            ny,
            "2026-10-30T12:00:00Z",
            &[
                "2026-10-31T05:30:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-02T06:30:00Z",
            ],
        ),
        // An interval job runs in both passes of the repeated hour.
        (
            "*/30 1 * * *",
            ny,
            "2026-11-01T04:59:00Z",
            &[
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:30:00Z",
            ],
        ),
        // And skips what falls in the gap.
        (
            "0 * * * *",
            ny,
            "2026-03-08T06:30:00Z",
            &["2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"],
        ),
    ];
    for (expr, zone, after, expected) in table {
        let s = schedule(expr, zone);
        let mut cursor = ts(after);
        for want in expected {
            let got = s.next_after(cursor).expect("a next time");
            assert_eq!(got, ts(want), "{expr} in {zone:?} after {cursor}");
            cursor = got;
        }
    }
}

#[test]
fn latest_at_or_before_includes_the_instant() {
    let s = schedule("*/5 * * * *", None);
    let t = ts("2026-01-01T00:10:00Z");
    assert_eq!(s.latest_at_or_before(t), Some(t));
    assert_eq!(s.latest_at_or_before(ts("2026-01-01T00:14:59Z")), Some(t));
}

#[test]
fn next_action_follows_cronjob_semantics() {
    let created = ts("2026-01-01T00:00:30Z");
    let every_minute = policy("* * * * *");
    let h = |last: Option<&str>, active: usize| History {
        created,
        last_schedule_time: last.map(ts),
        active_runs: active,
        previous_run: None,
    };
    let run = |at: &str, missed: u64, replace: bool, next: &str| Decision::Run {
        scheduled: ts(at),
        replace_active: replace,
        missed,
        next: Some(ts(next)),
    };
    let with = |f: &dyn Fn(&mut Policy)| {
        let mut p = every_minute.clone();
        f(&mut p);
        p
    };
    // (policy, now, history, expected)
    let table = [
        // Nothing due before the first minute after creation.
        (
            every_minute.clone(),
            "2026-01-01T00:00:50Z",
            h(None, 0),
            Decision::Wait {
                next: Some(ts("2026-01-01T00:01:00Z")),
            },
        ),
        // Due exactly at the minute.
        (
            every_minute.clone(),
            "2026-01-01T00:01:00Z",
            h(None, 0),
            run("2026-01-01T00:01:00Z", 1, false, "2026-01-01T00:02:00Z"),
        ),
        // Already run for that minute: wait.
        (
            every_minute.clone(),
            "2026-01-01T00:01:20Z",
            h(Some("2026-01-01T00:01:00Z"), 0),
            Decision::Wait {
                next: Some(ts("2026-01-01T00:02:00Z")),
            },
        ),
        // Three missed: only the most recent runs.
        (
            every_minute.clone(),
            "2026-01-01T00:04:10Z",
            h(Some("2026-01-01T00:01:00Z"), 0),
            run("2026-01-01T00:04:00Z", 3, false, "2026-01-01T00:05:00Z"),
        ),
        // Far behind: the count is capped just past the warning threshold.
        (
            every_minute.clone(),
            "2026-01-02T00:00:10Z",
            h(None, 0),
            run(
                "2026-01-02T00:00:00Z",
                TOO_MANY_MISSED + 1,
                false,
                "2026-01-02T00:01:00Z",
            ),
        ),
        // The starting deadline drops a due time that is too old...
        (
            with(&|p| p.starting_deadline = Some(SignedDuration::from_secs(10))),
            "2026-01-01T00:01:15Z",
            h(None, 0),
            Decision::Wait {
                next: Some(ts("2026-01-01T00:02:00Z")),
            },
        ),
        // ...and keeps one within it.
        (
            with(&|p| p.starting_deadline = Some(SignedDuration::from_secs(20))),
            "2026-01-01T00:01:15Z",
            h(None, 0),
            run("2026-01-01T00:01:00Z", 1, false, "2026-01-01T00:02:00Z"),
        ),
        // Suspended: due but held back.
        (
            with(&|p| p.suspend = true),
            "2026-01-01T00:01:05Z",
            h(None, 0),
            Decision::Skip {
                scheduled: ts("2026-01-01T00:01:00Z"),
                reason: SkipReason::Suspended,
                next: Some(ts("2026-01-01T00:02:00Z")),
            },
        ),
        // Forbid with an active run: held back.
        (
            every_minute.clone(),
            "2026-01-01T00:02:05Z",
            h(Some("2026-01-01T00:01:00Z"), 1),
            Decision::Skip {
                scheduled: ts("2026-01-01T00:02:00Z"),
                reason: SkipReason::PreviousRunActive,
                next: Some(ts("2026-01-01T00:03:00Z")),
            },
        ),
        // Replace with an active run: run, replacing it.
        (
            with(&|p| p.concurrency = Concurrency::Replace),
            "2026-01-01T00:02:05Z",
            h(Some("2026-01-01T00:01:00Z"), 1),
            run("2026-01-01T00:02:00Z", 1, true, "2026-01-01T00:03:00Z"),
        ),
        // Allow with an active run: run beside it.
        (
            with(&|p| p.concurrency = Concurrency::Allow),
            "2026-01-01T00:02:05Z",
            h(Some("2026-01-01T00:01:00Z"), 1),
            run("2026-01-01T00:02:00Z", 1, false, "2026-01-01T00:03:00Z"),
        ),
    ];
    for (i, (p, now, history, expected)) in table.into_iter().enumerate() {
        assert_eq!(
            next_action(&p, ts(now), &history),
            expected,
            "row {i} at {now}"
        );
    }
}

#[test]
fn run_now_requests_parse_as_rfc3339_times() {
    assert_eq!(
        parse_run_now("2026-12-02T17:00:00Z"),
        Ok(ts("2026-12-02T17:00:00Z"))
    );
    assert_eq!(
        parse_run_now(" 2026-12-02T18:00:00+01:00 "),
        Ok(ts("2026-12-02T17:00:00Z"))
    );
    for bad in ["", "true", "now", "2026-12-02", "17:00"] {
        let err = parse_run_now(bad).expect_err(bad);
        assert!(
            err.contains("lockedjob.dev/run-now") && err.contains("kubectl annotate"),
            "{err}"
        );
    }
}

const SCHEDULES: &[&str] = &[
    "* * * * *",
    "*/7 * * * *",
    "0,15,40 * * * *",
    "*/3 * * * * *",
    "17 */2 * * *",
];

proptest! {
    // Walk `now` forward by arbitrary steps, applying each Run as the controller would (record
    // lastScheduleTime). Runs are strictly increasing (never twice), each is a real scheduled
    // time no later than `now`, and it is the most recent one due.
    #[test]
    fn runs_are_never_repeated_and_always_the_latest_due(
        which in 0..SCHEDULES.len(),
        steps in proptest::collection::vec(1i64..400, 1..150),
    ) {
        let p = policy(SCHEDULES[which]);
        let created = ts("2026-03-01T00:00:00Z");
        let mut now = created;
        let mut last: Option<Timestamp> = None;
        for step in steps {
            now += SignedDuration::from_secs(step);
            let history = History { created, last_schedule_time: last, active_runs: 0, previous_run: None };
            if let Decision::Run { scheduled, .. } = next_action(&p, now, &history) {
                prop_assert!(scheduled <= now);
                prop_assert!(last.is_none_or(|l| scheduled > l), "ran {scheduled} again");
                prop_assert_eq!(p.schedule.latest_at_or_before(now), Some(scheduled));
                last = Some(scheduled);
            }
        }
    }

    // When `now` advances by less than the shortest gap between scheduled times, every due
    // time in the walked range runs exactly once: none is skipped.
    #[test]
    fn dense_observation_runs_every_due_time_exactly_once(
        steps in proptest::collection::vec(1i64..60, 1..300),
    ) {
        let p = policy("*/2 * * * *"); // every 120 s; steps are shorter
        let (runs, now) = observe(&p, &steps);
        let runs: Vec<Timestamp> = runs.into_iter().map(|(scheduled, _)| scheduled).collect();
        let expected = started_by(&p, now);
        prop_assert_eq!(runs, expected);
    }
}

const WALK_START: &str = "2026-03-01T00:00:30Z";

/// Calls `next_action` after each step of seconds from [`WALK_START`], recording each run as
/// it would be; returns the runs (scheduled time, when it ran) and the last `now`.
fn observe(p: &Policy, steps: &[i64]) -> (Vec<(Timestamp, Timestamp)>, Timestamp) {
    let created = ts(WALK_START);
    let mut now = created;
    let mut runs: Vec<(Timestamp, Timestamp)> = Vec::new();
    for &step in steps {
        now += SignedDuration::from_secs(step);
        let history = History {
            created,
            last_schedule_time: runs.last().map(|&(scheduled, _)| scheduled),
            active_runs: 0,
            previous_run: None,
        };
        if let Decision::Run { scheduled, .. } = next_action(p, now, &history) {
            runs.push((scheduled, now));
        }
    }
    (runs, now)
}

/// The scheduled times after [`WALK_START`] whose (jittered) start is at or before `now`.
fn started_by(p: &Policy, now: Timestamp) -> Vec<Timestamp> {
    p.schedule
        .times_after(ts(WALK_START))
        .take_while(|t| p.start_of(*t) <= now)
        .collect()
}

fn jittered(expr: &str, seconds: i64) -> Policy {
    Policy {
        jitter: Some(Jitter {
            max: SignedDuration::from_secs(seconds),
            key: "team-a/report".into(),
        }),
        ..policy(expr)
    }
}

#[test]
fn jitter_offsets_are_fixed_by_lock_name_and_time_and_stay_below_the_bound() {
    let jitter = Jitter {
        max: SignedDuration::from_secs(60),
        key: "team-a/report".into(),
    };
    // Known answers of FNV-1a 64 over "team-a/report", 0, the time's unix ms (big-endian),
    // computed outside Rust: replicas of every build and cluster must agree on these.
    assert_eq!(
        jitter.offset(ts("2026-01-01T00:00:00Z")),
        SignedDuration::from_millis(37_431)
    );
    assert_eq!(
        jitter.offset(ts("2026-01-01T00:01:00Z")),
        SignedDuration::from_millis(56_678)
    );
    let mut seen = std::collections::BTreeSet::new();
    let mut t = ts("2026-01-01T00:00:00Z");
    for _ in 0..120 {
        let offset = jitter.offset(t);
        assert!(
            offset >= SignedDuration::ZERO && offset < jitter.max,
            "{t}: {offset:?}"
        );
        seen.insert(offset.as_secs());
        t += SignedDuration::from_secs(60);
    }
    assert!(seen.len() > 30, "offsets spread over the bound: {seen:?}");
    let other = Jitter {
        key: "team-b/report".into(),
        ..jitter.clone()
    };
    assert_ne!(
        other.offset(ts("2026-01-01T00:00:00Z")),
        jitter.offset(ts("2026-01-01T00:00:00Z")),
        "another lock name, another start"
    );
    let none = Jitter {
        max: SignedDuration::ZERO,
        ..jitter
    };
    assert_eq!(
        none.offset(ts("2026-01-01T00:00:00Z")),
        SignedDuration::ZERO
    );
}

#[test]
fn jitter_delays_the_start_and_the_run_keeps_its_nominal_time() {
    // Every minute, starts up to 60 s late: 00:00 starts at 00:00:37.431, 00:01 at 00:01:56.678.
    let p = jittered("* * * * *", 60);
    let with_deadline = Policy {
        starting_deadline: Some(SignedDuration::from_secs(30)),
        ..jittered("* * * * *", 60)
    };
    let created = ts("2025-12-31T23:59:30Z");
    let h = |last: Option<&str>| History {
        created,
        last_schedule_time: last.map(ts),
        active_runs: 0,
        previous_run: None,
    };
    let run = |scheduled: &str, missed: u64, next: &str| Decision::Run {
        scheduled: ts(scheduled),
        replace_active: false,
        missed,
        next: Some(ts(next)),
    };
    let wait = |next: &str| Decision::Wait {
        next: Some(ts(next)),
    };
    let table = [
        (
            "before the jittered start: wait for it",
            &p,
            "2026-01-01T00:00:30Z",
            h(None),
            wait("2026-01-01T00:00:37.431Z"),
        ),
        (
            "after it: run, for the nominal time",
            &p,
            "2026-01-01T00:00:40Z",
            h(None),
            run("2026-01-01T00:00:00Z", 1, "2026-01-01T00:01:56.678Z"),
        ),
        (
            "00:01 is past but not started, 00:00 ran: wait",
            &p,
            "2026-01-01T00:01:30Z",
            h(Some("2026-01-01T00:00:00Z")),
            wait("2026-01-01T00:01:56.678Z"),
        ),
        (
            "00:01 not started, 00:00 never ran: 00:00 runs now",
            &p,
            "2026-01-01T00:01:30Z",
            h(None),
            run("2026-01-01T00:00:00Z", 1, "2026-01-01T00:01:56.678Z"),
        ),
        (
            "the starting deadline counts from the jittered start: within it",
            &with_deadline,
            "2026-01-01T00:01:05Z",
            h(None),
            run("2026-01-01T00:00:00Z", 1, "2026-01-01T00:01:56.678Z"),
        ),
        (
            "the starting deadline counts from the jittered start: past it",
            &with_deadline,
            "2026-01-01T00:01:10Z",
            h(None),
            wait("2026-01-01T00:01:56.678Z"),
        ),
    ];
    for (what, p, now, history, expected) in table {
        assert_eq!(next_action(p, ts(now), &history), expected, "{what}");
    }
}

proptest! {
    // With jitter below half the period, observed more often than two starts can come
    // (120 s apart, minus the jitter), every due time runs exactly once, in order, never
    // before its jittered start.
    #[test]
    fn jittered_times_each_run_once_never_before_their_start(
        steps in proptest::collection::vec(1i64..60, 1..300),
        jitter in 1i64..60,
    ) {
        let p = jittered("*/2 * * * *", jitter); // every 120 s; steps are shorter
        let (runs, now) = observe(&p, &steps);
        for &(scheduled, ran_at) in &runs {
            prop_assert!(p.start_of(scheduled) <= ran_at, "{scheduled} ran at {ran_at}, before its start");
        }
        let runs: Vec<Timestamp> = runs.into_iter().map(|(scheduled, _)| scheduled).collect();
        let expected = started_by(&p, now);
        prop_assert_eq!(runs, expected);
    }
}

fn catching_up(expr: &str, max: u32) -> Policy {
    Policy {
        catch_up: CatchUp::All { max },
        ..policy(expr)
    }
}

#[test]
fn catch_up_all_runs_missed_times_oldest_first_within_the_bound_and_deadline() {
    let created = ts("2026-01-01T00:00:30Z");
    let h = |last: Option<&str>, active: usize| History {
        created,
        last_schedule_time: last.map(ts),
        active_runs: active,
        previous_run: None,
    };
    let run = |at: &str, missed: u64, next: &str| Decision::Run {
        scheduled: ts(at),
        replace_active: false,
        missed,
        next: Some(ts(next)),
    };
    let all = catching_up("* * * * *", 10);
    let two = catching_up("* * * * *", 2);
    let with_deadline = Policy {
        starting_deadline: Some(SignedDuration::from_secs(150)),
        ..all.clone()
    };
    let allow = Policy {
        concurrency: Concurrency::Allow,
        ..all.clone()
    };
    type Row<'a> = (&'a str, &'a Policy, &'a str, History, Decision);
    let table: [Row; 8] = [
        (
            "after an outage: the oldest missed time first",
            &all,
            "2026-01-01T00:04:10Z",
            h(Some("2026-01-01T00:01:00Z"), 0),
            run("2026-01-01T00:02:00Z", 1, "2026-01-01T00:05:00Z"),
        ),
        (
            "then the next one",
            &all,
            "2026-01-01T00:04:12Z",
            h(Some("2026-01-01T00:02:00Z"), 0),
            run("2026-01-01T00:03:00Z", 1, "2026-01-01T00:05:00Z"),
        ),
        (
            "caught up: as Latest",
            &all,
            "2026-01-01T00:04:14Z",
            h(Some("2026-01-01T00:03:00Z"), 0),
            run("2026-01-01T00:04:00Z", 1, "2026-01-01T00:05:00Z"),
        ),
        (
            "never ran: from the creation time",
            &all,
            "2026-01-01T00:03:10Z",
            h(None, 0),
            run("2026-01-01T00:01:00Z", 1, "2026-01-01T00:04:00Z"),
        ),
        (
            "more missed than maxCatchUp: the older ones are dropped",
            &two,
            "2026-01-01T00:06:10Z",
            h(Some("2026-01-01T00:01:00Z"), 0),
            run("2026-01-01T00:05:00Z", 4, "2026-01-01T00:07:00Z"),
        ),
        (
            "the starting deadline drops what started before it",
            &with_deadline,
            "2026-01-01T00:06:10Z",
            h(Some("2026-01-01T00:01:00Z"), 0),
            run("2026-01-01T00:04:00Z", 1, "2026-01-01T00:07:00Z"),
        ),
        (
            "Forbid: held while the previous caught-up run is active",
            &all,
            "2026-01-01T00:04:12Z",
            h(Some("2026-01-01T00:02:00Z"), 1),
            Decision::Skip {
                scheduled: ts("2026-01-01T00:03:00Z"),
                reason: SkipReason::PreviousRunActive,
                next: Some(ts("2026-01-01T00:05:00Z")),
            },
        ),
        (
            "Allow: the next one starts beside it",
            &allow,
            "2026-01-01T00:04:12Z",
            h(Some("2026-01-01T00:02:00Z"), 1),
            run("2026-01-01T00:03:00Z", 1, "2026-01-01T00:05:00Z"),
        ),
    ];
    for (what, p, now, history, expected) in table {
        assert_eq!(next_action(p, ts(now), &history), expected, "{what}");
    }
    // A year of a per-second schedule missed: the walk back is maxCatchUp steps.
    let per_second = catching_up("* * * * * *", 3);
    let started = std::time::Instant::now();
    let decision = next_action(
        &per_second,
        ts("2027-01-01T00:00:00Z"),
        &h(Some("2026-01-01T00:00:00Z"), 0),
    );
    assert!(
        matches!(decision, Decision::Run { scheduled, missed, .. }
            if scheduled == ts("2026-12-31T23:59:58Z") && missed == TOO_MANY_MISSED + 1),
        "{decision:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn buffer_one_keeps_the_first_time_due_during_a_run_past_the_deadline() {
    let created = ts("2026-01-01T00:00:30Z");
    // Every minute, a 30 s starting deadline.
    let buffer_one = Policy {
        concurrency: Concurrency::BufferOne,
        starting_deadline: Some(SignedDuration::from_secs(30)),
        ..policy("* * * * *")
    };
    let forbid = Policy {
        concurrency: Concurrency::Forbid,
        ..buffer_one.clone()
    };
    // The run for 00:01 started at 00:01:02.
    let h = |active: usize, ended: Option<&str>| History {
        created,
        last_schedule_time: Some(ts("2026-01-01T00:01:00Z")),
        active_runs: active,
        previous_run: ended.map(|e| (ts("2026-01-01T00:01:02Z"), ts(e))),
    };
    let run = |at: &str, next: &str| Decision::Run {
        scheduled: ts(at),
        replace_active: false,
        missed: 1,
        next: Some(ts(next)),
    };
    type Row<'a> = (&'a str, &'a Policy, &'a str, History, Decision);
    let table: [Row; 6] = [
        (
            "held while the run is active",
            &buffer_one,
            "2026-01-01T00:02:10Z",
            h(1, None),
            Decision::Skip {
                scheduled: ts("2026-01-01T00:02:00Z"),
                reason: SkipReason::PreviousRunActive,
                next: Some(ts("2026-01-01T00:03:00Z")),
            },
        ),
        (
            "the run ended at 00:03:40: 00:02 came due first and runs, past the deadline",
            &buffer_one,
            "2026-01-01T00:03:41Z",
            h(0, Some("2026-01-01T00:03:40Z")),
            run("2026-01-01T00:02:00Z", "2026-01-01T00:04:00Z"),
        ),
        (
            "Forbid drops 00:02 and 00:03, both past the deadline",
            &forbid,
            "2026-01-01T00:03:41Z",
            h(0, Some("2026-01-01T00:03:40Z")),
            Decision::Wait {
                next: Some(ts("2026-01-01T00:04:00Z")),
            },
        ),
        (
            "nothing came due during the run: as Forbid",
            &buffer_one,
            "2026-01-01T00:02:10Z",
            h(0, Some("2026-01-01T00:01:30Z")),
            run("2026-01-01T00:02:00Z", "2026-01-01T00:03:00Z"),
        ),
        (
            "nothing came due during the run, and the next is past the deadline",
            &buffer_one,
            "2026-01-01T00:02:40Z",
            h(0, Some("2026-01-01T00:01:30Z")),
            Decision::Wait {
                next: Some(ts("2026-01-01T00:03:00Z")),
            },
        ),
        (
            "the run's span unknown (its Job gone): as Forbid",
            &buffer_one,
            "2026-01-01T00:03:41Z",
            h(0, None),
            Decision::Wait {
                next: Some(ts("2026-01-01T00:04:00Z")),
            },
        ),
    ];
    for (what, p, now, history, expected) in table {
        assert_eq!(next_action(p, ts(now), &history), expected, "{what}");
    }
}

proptest! {
    // After an outage of any length, walked forward in steps shorter than any schedule's gap
    // with each run recorded, catch-up All runs the `max` most recent missed times and then
    // every later one, each exactly once and in order.
    #[test]
    fn catch_up_all_runs_each_missed_time_once_in_order(
        which in 0..SCHEDULES.len(),
        outage in 0i64..20_000,
        max in 1u32..20,
        steps in proptest::collection::vec(1i64..3, 1..200),
    ) {
        let p = catching_up(SCHEDULES[which], max);
        let created = ts(WALK_START);
        let resumed = created + SignedDuration::from_secs(outage);
        let mut now = resumed;
        let mut runs: Vec<Timestamp> = Vec::new();
        for step in steps {
            let history = History {
                created,
                last_schedule_time: runs.last().copied(),
                active_runs: 0,
                previous_run: None,
            };
            if let Decision::Run { scheduled, .. } = next_action(&p, now, &history) {
                runs.push(scheduled);
            }
            now += SignedDuration::from_secs(step);
        }
        let missed: Vec<Timestamp> = p.schedule.times_after(created).take_while(|t| *t <= resumed).collect();
        let kept = missed.len().saturating_sub(max as usize);
        let due_by_end: Vec<Timestamp> = missed[kept..]
            .iter()
            .copied()
            .chain(p.schedule.times_after(resumed).take_while(|t| *t < now))
            .collect();
        prop_assert!(runs.windows(2).all(|w| w[0] < w[1]), "in order, once: {runs:?}");
        prop_assert_eq!(&runs[..], &due_by_end[..runs.len()]);
    }
}
