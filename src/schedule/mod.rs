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
}

/// The parts of a LockedJob's spec that decide when it runs.
#[derive(Debug, Clone)]
pub struct Policy {
    pub schedule: Schedule,
    pub suspend: bool,
    pub concurrency: Concurrency,
    pub starting_deadline: Option<SignedDuration>,
    pub jitter: Option<Jitter>,
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start the run for `scheduled` now. With `replace_active`, stop the active runs first.
    /// `missed` counts due times since the last run (the most recent is the one run; earlier
    /// ones are not made up, as in CronJob); `missed > TOO_MANY_MISSED` deserves a warning.
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
    /// concurrencyPolicy Forbid and a run is active; decided again when it ends (and run then
    /// if still within the starting deadline).
    PreviousRunActive,
}

/// What to do at `now`, with CronJob's semantics:
/// - due times are those after the last run's scheduled time (or the creation time) whose
///   start (`Policy::start_of`: the time plus its jitter) has come;
/// - with `startingDeadlineSeconds`, due times that started before `now - deadline` are dropped;
/// - of several missed times only the most recent runs;
/// - suspend and concurrencyPolicy Forbid hold a due run back without consuming it.
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
            t.checked_sub(SignedDuration::from_millis(1))
                .ok()
                .and_then(|before| schedule.latest_at_or_before(before))
                .filter(|p| policy.start_of(*p) <= now),
            Some(t).filter(|t| *t > since),
        ),
        None => (None, None),
    };
    let next = waiting
        .into_iter()
        .chain(schedule.next_after(now))
        .map(|t| policy.start_of(t))
        .min();
    let due = match candidate {
        Some(t) if t > since && cutoff.is_none_or(|c| policy.start_of(t) > c) => t,
        _ => return Decision::Wait { next },
    };
    // Times after the last run and the cutoff, up to the one that runs (which counts even
    // when jitter put its start, not the time, after the cutoff).
    let earliest = cutoff.map_or(since, |c| since.max(c));
    let missed = if due > earliest {
        schedule.count_between(earliest, due, TOO_MANY_MISSED + 1)
    } else {
        1
    };
    if policy.suspend {
        return Decision::Skip {
            scheduled: due,
            reason: SkipReason::Suspended,
            next,
        };
    }
    let replace_active = history.active_runs > 0 && policy.concurrency == Concurrency::Replace;
    if history.active_runs > 0 && policy.concurrency == Concurrency::Forbid {
        return Decision::Skip {
            scheduled: due,
            reason: SkipReason::PreviousRunActive,
            next,
        };
    }
    Decision::Run {
        scheduled: due,
        replace_active,
        missed,
        next,
    }
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

#[cfg(test)]
mod tests;
