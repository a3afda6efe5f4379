//! One run's life, a stage a file: win the lock (`acquire`), create the Job (`launch`),
//! supervise it under the watchdog and record how it ended (`supervise`), take over a Job whose
//! holder vanished (`adopt`); `report` is what they write besides the Job.

mod acquire;
mod adopt;
mod launch;
mod report;
mod start;
mod supervise;

pub use adopt::{check_orphan, Candidate};
pub use report::{clear_annotation, clear_run_now, stop_all};
pub use start::start;

use super::jobs::{backfill_job_name, job_name, manual_job_name, Origin};
use super::runs::RunKey;
use super::subject::Subject;
use crate::api::ValidSpec;
use crate::schedule::BackfillRange;
use jiff::Timestamp;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

/// How long the replicas that did not run a LockedJob's last time hold back before trying for
/// the next, so that the one that did usually wins alone (docs/design.md, "Who tries first").
/// Redlock still decides; this only saves the losers' rounds.
pub const HEAD_START: Duration = Duration::from_secs(2);

/// Whether this replica (`holder`) holds back before trying for a scheduled time, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldBack {
    /// This replica ran the LockedJob's last run, or the run was asked for now (the
    /// annotation): it tries at once.
    No,
    /// Another runner ran the last run and tries first: wait [`HEAD_START`].
    HeadStart,
    /// Nobody has run the LockedJob yet, so nobody is named to go first: wait a random part
    /// of [`HEAD_START`], and the replica that drew the shortest wait usually goes alone.
    Spread,
}

impl HoldBack {
    pub fn decide(last_holder: Option<&str>, holder: &str, manual: bool) -> Self {
        match last_holder {
            _ if manual => HoldBack::No,
            None => HoldBack::Spread,
            Some(last) if last == holder => HoldBack::No,
            Some(_) => HoldBack::HeadStart,
        }
    }

    /// How long to wait: `draw` is a random number in [0, 1), used by `Spread` only.
    pub fn pause(self, draw: f64) -> Duration {
        match self {
            HoldBack::No => Duration::ZERO,
            HoldBack::HeadStart => HEAD_START,
            HoldBack::Spread => HEAD_START.mul_f64(draw.clamp(0.0, 1.0)),
        }
    }
}

/// What starts a run.
#[derive(Debug, Clone)]
pub enum RunKind {
    /// A due scheduled time; `replace` names active Jobs to stop first (concurrencyPolicy
    /// Replace).
    Scheduled { replace: Vec<String> },
    /// The `lockedjob.dev/run-now` annotation, requested for the time it holds. Like
    /// `kubectl create job --from=cronjob/x`: outside the schedule, so it neither reads nor
    /// advances the lock's progress register, nor `lastScheduleTime`.
    Manual,
    /// A scheduled time of a backfill range: its step is recorded in the backfill's own
    /// progress register, not the schedule's, and not in `lastScheduleTime`.
    Backfill(BackfillRange),
}

impl RunKind {
    pub fn origin(&self) -> Origin {
        match self {
            RunKind::Scheduled { .. } => Origin::Schedule,
            RunKind::Manual => Origin::Manual,
            RunKind::Backfill(_) => Origin::Backfill,
        }
    }

    /// The progress register this run steps under the lock `lock`: the lock's own for a
    /// scheduled time, the backfill's own for a backfill time; none for a manual run, which
    /// takes the lock without a step.
    pub fn step_register<'a>(&self, lock: &'a str) -> Option<Cow<'a, str>> {
        match self {
            RunKind::Scheduled { .. } => Some(Cow::Borrowed(lock)),
            RunKind::Backfill(range) => Some(Cow::Owned(range.register(lock))),
            RunKind::Manual => None,
        }
    }

    /// The name of this run's Job: the same in every replica of a cluster.
    pub fn job_name(&self, valid: &ValidSpec, locked_job: &str, scheduled: Timestamp) -> String {
        match self {
            RunKind::Scheduled { .. } => {
                job_name(locked_job, scheduled, valid.policy.schedule.has_seconds())
            }
            RunKind::Manual => manual_job_name(locked_job, scheduled),
            RunKind::Backfill(_) => backfill_job_name(locked_job, scheduled),
        }
    }
}

/// One run on its way through the stages: what it runs for, for which LockedJob.
pub struct Run {
    pub subject: Subject,
    pub valid: Arc<ValidSpec>,
    pub scheduled: Timestamp,
    pub kind: RunKind,
}

impl Run {
    fn lock(&self) -> &str {
        &self.valid.lock_name
    }

    /// The name of this run's Job: the same in every replica of a cluster.
    fn job_name(&self) -> String {
        self.kind
            .job_name(&self.valid, &self.subject.name, self.scheduled)
    }

    /// Who may start this run here at a time: one task per LockedJob, origin and time.
    fn key(&self) -> RunKey {
        let name = &self.subject.name;
        let of = match self.kind.origin() {
            Origin::Schedule => name.clone(),
            Origin::Manual => format!("{name}#run-now"),
            Origin::Backfill => format!("{name}#backfill"),
        };
        (
            self.subject.namespace.clone(),
            of,
            self.scheduled.as_second(),
        )
    }

    fn span(&self) -> tracing::Span {
        tracing::info_span!("run", namespace = %self.subject.namespace, name = %self.subject.name, lock = %self.lock(), scheduled = %self.scheduled, origin = ?self.kind.origin(), token = tracing::field::Empty)
    }
}

/// A scheduled time as the lock's progress step: unix milliseconds (none before 1970).
fn step_of(scheduled: Timestamp) -> u64 {
    scheduled.as_millisecond().max(0) as u64
}

/// `pause` scaled by a random factor in [0.5, 1.5), so replicas that failed together do not
/// retry together.
pub(super) fn jittered(pause: Duration) -> Duration {
    pause.mul_f64(0.5 + rand::random::<f64>())
}

/// Why this replica did not start a run.
#[derive(Debug, PartialEq, Eq)]
enum NotStarted {
    /// Another runner holds the lock and has started this very time.
    RunningElsewhere,
    /// The lock is held, for an earlier time or before its holder recorded this one.
    Contended,
    /// The lock's progress register says this time already ran.
    AlreadyRan,
    /// No quorum, a split vote, API errors, shutting down: tried again after a short pause.
    Failed,
}

#[cfg(test)]
mod tests {
    use super::{HoldBack, HEAD_START};
    use std::time::Duration;

    #[test]
    fn the_last_runs_holder_tries_first_and_the_others_hold_back() {
        use HoldBack::*;
        // (last run's holder, this replica, run-now, decision, what)
        let table = [
            (
                Some("east/r1"),
                "east/r1",
                false,
                No,
                "ran the last time: goes at once",
            ),
            (
                Some("east/r1"),
                "east/r2",
                false,
                HeadStart,
                "another replica ran it",
            ),
            (
                Some("west/r1"),
                "east/r1",
                false,
                HeadStart,
                "another cluster ran it",
            ),
            (
                None,
                "east/r2",
                false,
                Spread,
                "never ran: a random part of the head start",
            ),
            (
                Some("east/r1"),
                "east/r2",
                true,
                No,
                "run-now: nobody waits",
            ),
            (
                None,
                "east/r2",
                true,
                No,
                "run-now of a new LockedJob: nobody waits",
            ),
        ];
        for (last, me, manual, expected, what) in table {
            assert_eq!(HoldBack::decide(last, me, manual), expected, "{what}");
        }
    }

    #[test]
    fn only_a_first_run_draws_its_pause() {
        use HoldBack::*;
        let ms = Duration::from_millis;
        // (decision, draw in [0, 1), pause)
        let table = [
            (No, 0.7, Duration::ZERO),
            (HeadStart, 0.0, HEAD_START),
            (HeadStart, 0.7, HEAD_START),
            (Spread, 0.0, Duration::ZERO),
            (Spread, 0.25, ms(500)),
            (Spread, 0.999, ms(1_998)),
            // Out of range is held to the head start.
            (Spread, 7.0, HEAD_START),
        ];
        for (decision, draw, expected) in table {
            assert_eq!(decision.pause(draw), expected, "{decision:?} {draw}");
        }
    }
}
