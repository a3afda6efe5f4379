//! Pure time logic: cron schedules in a time zone, and what a LockedJob should do at a given
//! instant, with batch/v1 CronJob's semantics. No I/O, no clock: `now` is always an argument.

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

/// CronJob warns when more start times than this were missed, and runs only the most recent.
pub const TOO_MANY_MISSED: u64 = 100;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule {schedule:?} is not a valid cron expression: {reason}; use 5 fields (minute hour day-of-month month day-of-week, e.g. \"*/5 * * * *\"), a leading seconds field as an extension, or a macro such as @hourly")]
    Cron { schedule: String, reason: String },
    #[error("unknown time zone {0:?}: use an IANA name such as \"Europe/Berlin\" or \"America/New_York\"")]
    TimeZone(String),
    #[error("schedule {0:?} sets its time zone inline: put it in spec.timeZone instead")]
    InlineTimeZone(String),
}

/// A parsed cron schedule bound to a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    zone: TimeZone,
    zone_name: String,
    has_seconds: bool,
}

impl Schedule {
    /// Parses a 5-field expression, a 6-field one with leading seconds, or a macro
    /// (`@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`).
    /// Day-of-month and day-of-week combine with OR, as in Vixie cron and CronJob.
    pub fn parse(expression: &str, time_zone: Option<&str>) -> Result<Self, ScheduleError> {
        let trimmed = expression.trim();
        if trimmed.starts_with("TZ=") || trimmed.starts_with("CRON_TZ=") {
            return Err(ScheduleError::InlineTimeZone(expression.to_string()));
        }
        let bad = |reason: String| ScheduleError::Cron {
            schedule: expression.to_string(),
            reason,
        };
        let fields = trimmed.split_whitespace().count();
        let has_seconds = !trimmed.starts_with('@') && fields == 6;
        if !trimmed.starts_with('@') && !(5..=6).contains(&fields) {
            return Err(bad(format!("it has {fields} fields")));
        }
        let macro_expression = match trimmed.to_ascii_lowercase().as_str() {
            "@midnight" => Some("0 0 * * *"),
            _ => None,
        };
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(macro_expression.unwrap_or(trimmed))
            .map_err(|e| bad(e.to_string()))?;
        let zone_name = time_zone.unwrap_or("UTC").to_string();
        let zone = jiff::tz::db()
            .get(&zone_name)
            .map_err(|_| ScheduleError::TimeZone(zone_name.clone()))?;
        let schedule = Self {
            cron,
            zone,
            zone_name,
            has_seconds,
        };
        // Patterns like "0 0 30 2 *" parse but never fire. Searched from a fixed instant, so
        // parsing reads no clock: a pattern that matches some date matches one after 1970.
        if schedule.next_after(Timestamp::UNIX_EPOCH).is_none() {
            return Err(bad("it never matches a real date".into()));
        }
        Ok(schedule)
    }

    pub fn has_seconds(&self) -> bool {
        self.has_seconds
    }

    pub fn time_zone(&self) -> &str {
        &self.zone_name
    }

    /// The first scheduled time strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.cron
            .find_next_occurrence(&t.to_zoned(self.zone.clone()), false)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The last scheduled time at or before `t`.
    pub fn latest_at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        self.cron
            .find_previous_occurrence(&t.to_zoned(self.zone.clone()), true)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The scheduled times strictly after `after`, in order (ending only where the schedule
    /// has no further time).
    pub fn times_after(&self, after: Timestamp) -> impl Iterator<Item = Timestamp> + '_ {
        std::iter::successors(self.next_after(after), move |t| self.next_after(*t))
    }

    /// Scheduled times in `(after, until]`, counted up to `cap`.
    pub fn count_between(&self, after: Timestamp, until: Timestamp, cap: u64) -> u64 {
        self.times_after(after)
            .take_while(|t| *t <= until)
            .take(usize::try_from(cap).unwrap_or(usize::MAX))
            .count() as u64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concurrency {
    Allow,
    Forbid,
    Replace,
    /// Like Forbid, but the first time that comes due while a run is active is kept, past the
    /// starting deadline, and starts as soon as that run ends; later ones are dropped.
    BufferOne,
}

/// Which missed times run after a pause (an operator or Redis outage, a long run under Forbid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// Only the most recent, as CronJob does.
    Latest,
    /// Each, oldest first, but no more than the `max` most recent.
    All { max: u32 },
}

/// The parts of a LockedJob's spec that decide when it runs.
#[derive(Debug, Clone)]
pub struct Policy {
    pub schedule: Schedule,
    pub suspend: bool,
    pub concurrency: Concurrency,
    pub starting_deadline: Option<SignedDuration>,
    pub jitter: Option<Jitter>,
    pub catch_up: CatchUp,
}

impl Policy {
    /// When the run for `scheduled` starts: the scheduled time plus its jitter offset.
    pub fn start_of(&self, scheduled: Timestamp) -> Timestamp {
        match &self.jitter {
            Some(jitter) => scheduled
                .checked_add(jitter.offset(scheduled))
                .unwrap_or(scheduled),
            None => scheduled,
        }
    }
}

/// `spec.jitterSeconds`: each scheduled time's start is delayed by an offset below `max`,
/// derived from the lock name and the time alone, so that every replica and cluster computes
/// the same start and LockedJobs due at the same minute spread out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jitter {
    pub max: SignedDuration,
    /// The lock name: LockedJobs sharing a lock share their starts.
    pub key: String,
}

impl Jitter {
    /// FNV-1a of the key and the time in unix milliseconds, modulo `max` in milliseconds. A
    /// published hash rather than std's, whose output may change between Rust releases, and
    /// replicas of different builds must agree.
    pub fn offset(&self, scheduled: Timestamp) -> SignedDuration {
        use std::hash::Hasher;
        let max_ms = self.max.as_millis().max(0) as u64;
        if max_ms == 0 {
            return SignedDuration::ZERO;
        }
        let mut hasher = fnv::FnvHasher::default();
        hasher.write(self.key.as_bytes());
        hasher.write(&[0]);
        hasher.write(&scheduled.as_millisecond().to_be_bytes());
        SignedDuration::from_millis((hasher.finish() % max_ms) as i64)
    }
}

/// What is known about past runs.
#[derive(Debug, Clone, Copy)]
pub struct History {
    /// The LockedJob's creation time: no run is due before it.
    pub created: Timestamp,
    /// Scheduled time of the last run started.
    pub last_schedule_time: Option<Timestamp>,
    /// Runs still active.
    pub active_runs: usize,
    /// When the run for `last_schedule_time` started and ended, where both are known:
    /// BufferOne's pending time is the first that came due in between.
    pub previous_run: Option<(Timestamp, Timestamp)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start the run for `scheduled` now. With `replace_active`, stop the active runs first.
    /// `missed` counts due times since the last run up to and including `scheduled`: the ones
    /// before it are dropped (with `CatchUp::Latest`, every one but the most recent, as in
    /// CronJob); `missed > TOO_MANY_MISSED` deserves a warning.
    Run {
        scheduled: Timestamp,
        replace_active: bool,
        missed: u64,
        next: Option<Timestamp>,
    },
    /// Nothing is due; look again at `next` (`None`: the schedule has no future time).
    Wait { next: Option<Timestamp> },
    /// A run is due for `scheduled` but must not start now.
    Skip {
        scheduled: Timestamp,
        reason: SkipReason,
        next: Option<Timestamp>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    Suspended,
    /// concurrencyPolicy Forbid or BufferOne and a run is active; decided again when it ends
    /// (and run then if still within the starting deadline, or, with BufferOne, if it is the
    /// first time that came due during the run).
    PreviousRunActive,
}

/// What to do at `now`, with CronJob's semantics:
/// - due times are those after the last run's scheduled time (or the creation time) whose
///   start (`Policy::start_of`: the time plus its jitter) has come;
/// - with `startingDeadlineSeconds`, due times that started before `now - deadline` are dropped;
/// - of several missed times only the most recent runs (`CatchUp::Latest`), or each of the
///   `max` most recent in turn, oldest first (`CatchUp::All`);
/// - suspend and concurrencyPolicy Forbid hold a due run back without consuming it;
/// - BufferOne runs the first time that came due while the last run was active, deadline or
///   not, before anything later.
///
/// `next` in the decision is the next start, jitter included.
pub fn next_action(policy: &Policy, now: Timestamp, history: &History) -> Decision {
    let schedule = &policy.schedule;
    let since = history.last_schedule_time.unwrap_or(history.created);
    let cutoff = policy
        .starting_deadline
        .and_then(|deadline| now.checked_sub(deadline).ok());
    // With jitter the latest scheduled time may still wait for its start; then the one before
    // is the candidate (a jitter below the schedule's period keeps it to these two).
    let latest = schedule.latest_at_or_before(now);
    let (candidate, waiting) = match latest {
        Some(t) if policy.start_of(t) <= now => (Some(t), None),
        Some(t) => (
            previous_time(schedule, t).filter(|p| policy.start_of(*p) <= now),
            Some(t).filter(|t| *t > since),
        ),
        None => (None, None),
    };
    let next = waiting
        .into_iter()
        .chain(schedule.next_after(now))
        .map(|t| policy.start_of(t))
        .min();
    let (due, missed) = match buffered(policy, now, history, since) {
        Some(pending) => (pending, 1),
        None => {
            let due = match candidate {
                Some(t) if t > since && cutoff.is_none_or(|c| policy.start_of(t) > c) => t,
                _ => return Decision::Wait { next },
            };
            // Times after the last run and the cutoff, up to the one that runs (which counts
            // even when jitter put its start, not the time, after the cutoff).
            let earliest = cutoff.map_or(since, |c| since.max(c));
            let due = match policy.catch_up {
                CatchUp::Latest => due,
                CatchUp::All { max } => oldest_to_catch_up(schedule, earliest, due, max),
            };
            let missed = if due > earliest {
                schedule.count_between(earliest, due, TOO_MANY_MISSED + 1)
            } else {
                1
            };
            (due, missed)
        }
    };
    if policy.suspend {
        return Decision::Skip {
            scheduled: due,
            reason: SkipReason::Suspended,
            next,
        };
    }
    let holds_back = matches!(
        policy.concurrency,
        Concurrency::Forbid | Concurrency::BufferOne
    );
    if history.active_runs > 0 && holds_back {
        return Decision::Skip {
            scheduled: due,
            reason: SkipReason::PreviousRunActive,
            next,
        };
    }
    let replace_active = history.active_runs > 0 && policy.concurrency == Concurrency::Replace;
    Decision::Run {
        scheduled: due,
        replace_active,
        missed,
        next,
    }
}

/// The scheduled time before `t`.
fn previous_time(schedule: &Schedule, t: Timestamp) -> Option<Timestamp> {
    t.checked_sub(SignedDuration::from_millis(1))
        .ok()
        .and_then(|before| schedule.latest_at_or_before(before))
}

/// BufferOne's pending time: with no run active, the first time that came due (its start,
/// jitter included) while the last run was active. Times that came due after it in that
/// span are dropped; nothing is pending where the span is not known.
fn buffered(
    policy: &Policy,
    now: Timestamp,
    history: &History,
    since: Timestamp,
) -> Option<Timestamp> {
    if policy.concurrency != Concurrency::BufferOne || history.active_runs > 0 {
        return None;
    }
    let (started, ended) = history.previous_run?;
    let jitter = policy
        .jitter
        .as_ref()
        .map_or(SignedDuration::ZERO, |j| j.max);
    let from = since.max(started.checked_sub(jitter).unwrap_or(started));
    policy
        .schedule
        .times_after(from)
        .find(|t| policy.start_of(*t) > started)
        .filter(|t| {
            let start = policy.start_of(*t);
            start <= ended && start <= now
        })
}

/// With `CatchUp::All`: the oldest of the (at most) `max` most recent times in
/// `(earliest, latest]`. Walks back from `latest`, so a long outage of a frequent schedule
/// costs `max` steps, not one per missed time.
fn oldest_to_catch_up(
    schedule: &Schedule,
    earliest: Timestamp,
    latest: Timestamp,
    max: u32,
) -> Timestamp {
    let mut oldest = latest;
    for _ in 1..max {
        match previous_time(schedule, oldest) {
            Some(t) if t > earliest => oldest = t,
            _ => break,
        }
    }
    oldest
}

/// Parses the `lockedjob.dev/run-now` annotation: the RFC 3339 time the run is requested for,
/// e.g. `kubectl annotate lj NAME lockedjob.dev/run-now="$(date -u +%FT%TZ)" --overwrite`.
pub fn parse_run_now(value: &str) -> Result<Timestamp, String> {
    value.trim().parse::<Timestamp>().map_err(|e| {
        format!(
            "annotation lockedjob.dev/run-now={value:?} is not an RFC 3339 time ({e}); set it with \
             kubectl annotate lj NAME lockedjob.dev/run-now=\"$(date -u +%FT%TZ)\" --overwrite"
        )
    })
}

/// The most scheduled times one backfill may run.
pub const MAX_BACKFILL: u64 = 1000;

/// A backfill request: the scheduled times in `[from, to]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackfillRange {
    pub from: Timestamp,
    pub to: Timestamp,
}

impl BackfillRange {
    /// Parses the `lockedjob.dev/backfill` annotation, `FROM/TO` in RFC 3339, and checks it
    /// against the schedule at `now`: a past range of at most [`MAX_BACKFILL`] times, at
    /// least one.
    pub fn parse(value: &str, schedule: &Schedule, now: Timestamp) -> Result<Self, String> {
        let range = Self::read(value, now)?;
        range.check_size(value, schedule)?;
        Ok(range)
    }

    /// The part of [`BackfillRange::parse`] that needs no schedule: two RFC 3339 times, in
    /// order, the second not after `now`.
    pub fn read(value: &str, now: Timestamp) -> Result<Self, String> {
        let fix = "set it with lockedjob backfill NAME --from FROM --to TO (RFC 3339 times, e.g. 2026-12-01T00:00:00Z)";
        let (from, to) = value.trim().split_once('/').ok_or_else(|| {
            format!("annotation lockedjob.dev/backfill={value:?} is not FROM/TO; {fix}")
        })?;
        let time = |text: &str| {
            text.trim().parse::<Timestamp>().map_err(|e| {
                format!("annotation lockedjob.dev/backfill={value:?}: {text:?} is not an RFC 3339 time ({e}); {fix}")
            })
        };
        let range = Self {
            from: time(from)?,
            to: time(to)?,
        };
        if range.from > range.to {
            return Err(format!(
                "backfill {value:?} ends before it starts; swap FROM and TO"
            ));
        }
        if range.to > now {
            return Err(format!(
                "backfill {value:?} reaches into the future ({} is after now, {now}): the schedule runs future times; end the range in the past",
                range.to
            ));
        }
        Ok(range)
    }

    /// The part of [`BackfillRange::parse`] that walks the schedule (up to `MAX_BACKFILL + 1`
    /// steps): at least one time in the range, at most [`MAX_BACKFILL`]. `value` is the
    /// request, for the message.
    pub fn check_size(&self, value: &str, schedule: &Schedule) -> Result<(), String> {
        match self.count(schedule) {
            0 => Err(format!(
                "backfill {value:?} holds no scheduled time of {:?}",
                schedule.time_zone()
            )),
            n if n > MAX_BACKFILL => Err(format!(
                "backfill {value:?} holds more than {MAX_BACKFILL} scheduled times; split it into smaller ranges, one after another"
            )),
            _ => Ok(()),
        }
    }

    /// The annotation value that asks for this range: `FROM/TO`, as [`BackfillRange::read`]
    /// reads it.
    pub fn annotation(&self) -> String {
        format!("{}/{}", self.from, self.to)
    }

    /// Scheduled times in the range, counted up to `MAX_BACKFILL + 1`.
    pub fn count(&self, schedule: &Schedule) -> u64 {
        self.count_after(schedule, None)
    }

    /// Scheduled times in the range after `last` (all of them without), counted up to
    /// `MAX_BACKFILL + 1`.
    pub fn count_after(&self, schedule: &Schedule, last: Option<Timestamp>) -> u64 {
        schedule.count_between(self.cursor(last), self.to, MAX_BACKFILL + 1)
    }

    /// The first scheduled time in the range after `last` (the first in the range without).
    pub fn next(&self, schedule: &Schedule, last: Option<Timestamp>) -> Option<Timestamp> {
        schedule
            .next_after(self.cursor(last))
            .filter(|t| *t <= self.to)
    }

    /// Where the range's remaining times begin (exclusive): after `last`, or just before
    /// `from`, which is included.
    fn cursor(&self, last: Option<Timestamp>) -> Timestamp {
        let before_from = self
            .from
            .checked_sub(SignedDuration::from_nanos(1))
            .unwrap_or(self.from);
        last.map_or(before_from, |l| l.max(before_from))
    }

    /// The progress register of this backfill: its own, under the lock's name, so that each
    /// time runs once per request across replicas and clusters, whatever the schedule ran.
    pub fn register(&self, lock_name: &str) -> String {
        format!(
            "{lock_name}#backfill:{}-{}",
            self.from.as_millisecond(),
            self.to.as_millisecond()
        )
    }
}

#[cfg(test)]
mod tests;
