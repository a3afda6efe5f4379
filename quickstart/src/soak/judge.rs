//! The soak's own checker, pure: runs, the store's answers and the faults in; per lock what
//! went wrong and what each miss is explained by out; and the history in the independent
//! checker's format (`lockedjob::lab::porcupine`).

use super::faults::Executed;
use super::store::StoreWrite;
use super::workload::{Kind, Run, RunKind};
use lockedjob::lab::porcupine::{Export, Step, Write};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// The span of the soak the due times are judged over, in seconds since the epoch: from one
/// period after the LockedJobs were created to one period before they were suspended.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Span {
    pub from: f64,
    pub to: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Missed {
    pub due: String,
    /// The faults around the due time, or a run still in progress (which the policy made wait
    /// or drop it); empty when nothing explains it.
    pub explained_by: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overlap {
    pub first: String,
    pub second: String,
    pub first_pod: String,
    pub second_pod: String,
    /// No fault outside the lock's model was active around it: the lock failed.
    pub inside_the_model: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LockReport {
    pub lock: String,
    pub policy: &'static str,
    pub due_times: usize,
    pub runs: BTreeMap<String, usize>,
    /// Times run more than once across the clusters by runs of one kind (a backfill reruns
    /// scheduled times, once).
    pub doubled: Vec<String>,
    pub missed: Vec<Missed>,
    pub overlaps: Vec<Overlap>,
    /// Runs whose end is not known (the pod went before it was read): left out of the sections.
    pub without_an_end: usize,
    pub writes: usize,
    pub stale_writes_refused: usize,
    /// Accepted writes with a token below one already accepted before their call: the fence
    /// failed (the store's own bug, were it ever to happen).
    pub stale_writes_accepted: usize,
}

impl LockReport {
    /// What our checker objects to.
    pub fn objections(&self) -> Vec<String> {
        let mut said = Vec::new();
        for due in &self.doubled {
            said.push(format!("{}: {due} ran twice", self.lock));
        }
        for overlap in self.overlaps.iter().filter(|o| o.inside_the_model) {
            said.push(format!(
                "{}: {} and {} overlapped with no fault outside the model around",
                self.lock, overlap.first, overlap.second
            ));
        }
        for missed in self.missed.iter().filter(|m| m.explained_by.is_empty()) {
            said.push(format!(
                "{}: {} was missed, and no fault explains it",
                self.lock, missed.due
            ));
        }
        if self.stale_writes_accepted > 0 {
            said.push(format!(
                "{}: {} stale writes were accepted",
                self.lock, self.stale_writes_accepted
            ));
        }
        said
    }
}

/// Judges one lock of the mix.
pub fn judge(
    kind: &Kind,
    lock: &str,
    runs: &[Run],
    writes: &[StoreWrite],
    faults: &[Executed],
    span: Span,
    ttl: f64,
) -> LockReport {
    let runs: Vec<&Run> = runs.iter().filter(|r| r.lock == lock).collect();
    let writes: Vec<&StoreWrite> = writes.iter().filter(|w| w.lock == lock).collect();
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    // Runs per (kind, time): a backfill reruns scheduled times, once per request.
    let mut times: BTreeMap<(RunKind, i64), usize> = BTreeMap::new();
    for run in &runs {
        *by_kind.entry(run.kind.name().to_string()).or_default() += 1;
        if let Ok(t) = run.scheduled.parse::<jiff::Timestamp>() {
            *times.entry((run.kind, t.as_second())).or_default() += 1;
        }
    }
    let doubled = times
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|((kind, t), _)| format!("{} {}", kind.name(), stamp(*t as f64)))
        .collect();
    let due: Vec<i64> = due_times(kind.period, span);
    let missed = due
        .iter()
        .filter(|t| !times.contains_key(&(RunKind::Scheduled, **t)))
        .map(|t| Missed {
            due: stamp(*t as f64),
            explained_by: explain(*t as f64, kind.period as f64, ttl, &runs, faults),
        })
        .collect();
    LockReport {
        lock: lock.to_string(),
        policy: kind.policy,
        due_times: due.len(),
        runs: by_kind,
        doubled,
        missed,
        overlaps: overlaps(&runs, faults, ttl),
        without_an_end: runs.iter().filter(|r| r.exit.is_none()).count(),
        writes: writes.len(),
        stale_writes_refused: writes.iter().filter(|w| !w.accepted).count(),
        stale_writes_accepted: stale_accepted(&writes),
    }
}

fn due_times(period: u64, span: Span) -> Vec<i64> {
    let period = period.max(1) as i64;
    let first = (span.from.ceil() as i64).div_euclid(period) * period + period;
    (0..)
        .map(|i| first + i * period)
        .take_while(|t| (*t as f64) <= span.to)
        .collect()
}

fn stamp(seconds: f64) -> String {
    jiff::Timestamp::from_microsecond((seconds * 1e6) as i64)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{seconds}"))
}

/// What explains a missed due time `t`: a fault active from a TTL before it (a lease a dead
/// or cut-off holder still had) to a period after it (the starting deadline's grace), or a
/// run of the lock in progress at `t` (the policy held it back or dropped it).
fn explain(t: f64, period: f64, ttl: f64, runs: &[&Run], faults: &[Executed]) -> Vec<String> {
    let mut said: Vec<String> = faults
        .iter()
        .filter(|f| {
            let (start, healed) = f.window();
            f.hit && start <= t + period && healed + ttl + period >= t
        })
        .map(|f| format!("fault {} {} ({})", f.index, f.kind, f.target))
        .collect();
    said.extend(
        runs.iter()
            .filter(|r| r.enter <= t + 1.0 && r.exit.is_none_or(|e| e >= t))
            .map(|r| format!("run {} in progress", r.scheduled)),
    );
    said
}

/// Pairs of sections (in entry order) where the second entered before the first left.
fn overlaps(runs: &[&Run], faults: &[Executed], ttl: f64) -> Vec<Overlap> {
    let mut ended: Vec<&&Run> = runs.iter().filter(|r| r.exit.is_some()).collect();
    ended.sort_by(|a, b| a.enter.total_cmp(&b.enter));
    let mut found = Vec::new();
    for (i, first) in ended.iter().enumerate() {
        let first_exit = first.exit.unwrap_or(first.enter);
        for second in ended[i + 1..].iter().take_while(|s| s.enter < first_exit) {
            let (from, to) = (first.enter - ttl, second.exit.unwrap_or(second.enter));
            let outside = faults.iter().any(|f| {
                let (start, healed) = f.window();
                f.outside_the_model && f.hit && start <= to && healed + ttl >= from
            });
            found.push(Overlap {
                first: format!("{} ({})", first.scheduled, first.pod),
                second: format!("{} ({})", second.scheduled, second.pod),
                first_pod: first.pod.clone(),
                second_pod: second.pod.clone(),
                inside_the_model: !outside,
            });
        }
    }
    found
}

/// Accepted writes whose token is below one the store had accepted before they were sent.
pub fn stale_accepted(writes: &[&StoreWrite]) -> usize {
    writes
        .iter()
        .filter(|w| {
            w.accepted
                && writes
                    .iter()
                    .any(|o| o.accepted && o.return_us < w.call_us && o.token > w.token)
        })
        .count()
}

/// The lock's history for the independent checker: the store's answers and the runs'
/// sections, each run (pod) a client.
pub fn export(lock: &str, runs: &[Run], writes: &[StoreWrite]) -> Export {
    let mut clients: HashMap<String, u32> = HashMap::new();
    let mut client = |pod: &str| {
        let next = clients.len() as u32 + 1;
        *clients.entry(pod.to_string()).or_insert(next)
    };
    let mut export = Export::default();
    for w in writes.iter().filter(|w| w.lock == lock) {
        export.writes.push(Write {
            client: client(&w.writer),
            call_us: w.call_us,
            return_us: w.return_us,
            token: w.token,
            accepted: w.accepted,
        });
    }
    for run in runs.iter().filter(|r| r.lock == lock) {
        let Some(exit) = run.exit else { continue };
        let id = client(&run.pod);
        for (at, enter) in [(run.enter, true), (exit, false)] {
            export.sections.push(Step {
                client: id,
                at_us: (at * 1e6) as u64,
                enter,
                token: run.token,
            });
        }
    }
    export.sections.sort_by_key(|s| (s.at_us, s.enter));
    export
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::workload::MIX;

    const T0: f64 = 1_800_000_000.0; // a multiple of 10 s

    fn run(pod: &str, kind: RunKind, at: f64, token: u64, exit: Option<f64>) -> Run {
        Run {
            cluster: "east".into(),
            pod: pod.into(),
            kind,
            lock: "soak-forbid".into(),
            scheduled: stamp(at),
            token,
            holder: "east/locks-0".into(),
            enter: at + 1.0,
            exit,
        }
    }

    fn fault(kind: &'static str, outside: bool, from: f64, to: f64) -> Executed {
        Executed {
            index: 0,
            kind,
            outside_the_model: outside,
            hit: true,
            target: "x".into(),
            started_us: (from * 1e6) as u64,
            healed_us: (to * 1e6) as u64,
        }
    }

    fn write(writer: &str, token: u64, accepted: bool, call: f64, ret: f64) -> StoreWrite {
        StoreWrite {
            lock: "soak-forbid".into(),
            writer: writer.into(),
            token,
            accepted,
            call_us: (call * 1e6) as u64,
            return_us: (ret * 1e6) as u64,
        }
    }

    fn judged(runs: &[Run], writes: &[StoreWrite], faults: &[Executed]) -> LockReport {
        let span = Span {
            from: T0 - 1.0,
            to: T0 + 20.0,
        };
        judge(&MIX[0], "soak-forbid", runs, writes, faults, span, 10.0)
    }

    #[test]
    fn each_objection_is_found_and_a_clean_history_passes() {
        use RunKind::*;
        let clean = vec![
            run("a", Scheduled, T0, 1, Some(T0 + 3.0)),
            run("b", Scheduled, T0 + 10.0, 2, Some(T0 + 13.0)),
            run("c", Scheduled, T0 + 20.0, 3, Some(T0 + 23.0)),
        ];
        let writes = vec![write("a", 1, true, T0 + 1.0, T0 + 1.1)];
        type Holds = fn(&LockReport) -> bool;
        type Case = (
            &'static str,
            Vec<Run>,
            Vec<StoreWrite>,
            Vec<Executed>,
            Holds,
        );
        let cases: Vec<Case> = vec![
            ("clean", clean.clone(), writes.clone(), vec![], |r| {
                r.objections().is_empty() && r.due_times == 3
            }),
            (
                "a backfill reruns a time once: not a double",
                [
                    clean.clone(),
                    vec![Run {
                        enter: T0 + 25.0,
                        exit: Some(T0 + 27.0),
                        ..run("d", Backfill, T0, 4, None)
                    }],
                ]
                .concat(),
                vec![],
                vec![],
                |r| r.objections().is_empty(),
            ),
            (
                "a scheduled time twice",
                [
                    clean.clone(),
                    vec![Run {
                        enter: T0 + 25.0,
                        exit: Some(T0 + 27.0),
                        ..run("d", Scheduled, T0 + 20.0, 4, None)
                    }],
                ]
                .concat(),
                vec![],
                vec![],
                |r| r.doubled.len() == 1 && r.objections().len() == 1,
            ),
            (
                "a miss with nothing around it",
                vec![clean[0].clone(), clean[2].clone()],
                vec![],
                vec![],
                |r| r.missed.len() == 1 && r.objections().len() == 1,
            ),
            (
                "a miss during a fault is explained",
                vec![clean[0].clone(), clean[2].clone()],
                vec![],
                vec![fault("kill-node", false, T0 + 5.0, T0 + 8.0)],
                |r| r.missed.len() == 1 && r.objections().is_empty(),
            ),
            (
                "a fault that hit nothing explains nothing",
                vec![clean[0].clone(), clean[2].clone()],
                vec![],
                vec![Executed {
                    hit: false,
                    ..fault("delete-replica", false, T0 + 5.0, T0 + 5.0)
                }],
                |r| r.missed.len() == 1 && r.objections().len() == 1,
            ),
            (
                "an overlap inside the model",
                vec![
                    clean[0].clone(),
                    run("d", Scheduled, T0 + 10.0, 2, Some(T0 + 13.0)),
                    run("e", RunNow, T0 + 11.0, 3, Some(T0 + 15.0)),
                ],
                vec![],
                vec![fault("kill-node", false, T0, T0 + 1.0)],
                |r| {
                    r.overlaps.len() == 1
                        && r.overlaps[0].inside_the_model
                        && !r.objections().is_empty()
                },
            ),
            (
                "an overlap under a paused holder is fenced, not an objection",
                vec![
                    clean[0].clone(),
                    run("d", Scheduled, T0 + 10.0, 2, Some(T0 + 13.0)),
                    run("e", RunNow, T0 + 11.0, 3, Some(T0 + 15.0)),
                ],
                vec![],
                vec![fault("pause-holder", true, T0 + 2.0, T0 + 9.0)],
                |r| {
                    r.overlaps.len() == 1
                        && !r.overlaps[0].inside_the_model
                        && r.objections().is_empty()
                },
            ),
            (
                "a stale write accepted",
                clean.clone(),
                vec![
                    write("b", 2, true, T0 + 11.0, T0 + 11.1),
                    write("a", 1, true, T0 + 12.0, T0 + 12.1),
                ],
                vec![],
                |r| r.stale_writes_accepted == 1 && !r.objections().is_empty(),
            ),
            (
                "a stale write refused is counted, not an objection",
                clean.clone(),
                vec![
                    write("b", 2, true, T0 + 11.0, T0 + 11.1),
                    write("a", 1, false, T0 + 12.0, T0 + 12.1),
                ],
                vec![],
                |r| r.stale_writes_refused == 1 && r.objections().is_empty(),
            ),
        ];
        for (name, runs, writes, faults, holds) in cases {
            let report = judged(&runs, &writes, &faults);
            assert!(holds(&report), "{name}: {report:#?}");
        }
    }

    #[test]
    fn the_export_pairs_each_pods_writes_and_section_under_one_client() {
        let runs = vec![
            run("a", RunKind::Scheduled, T0, 1, Some(T0 + 3.0)),
            run("gone", RunKind::Scheduled, T0 + 10.0, 2, None),
        ];
        let writes = vec![
            write("a", 1, true, T0 + 1.0, T0 + 1.5),
            write("gone", 2, true, T0 + 11.0, T0 + 11.5),
        ];
        let export = export("soak-forbid", &runs, &writes);
        assert_eq!(export.writes.len(), 2);
        // The run whose end is unknown has no section; the other enters and leaves as one client.
        let steps: Vec<(u32, bool)> = export
            .sections
            .iter()
            .map(|s| (s.client, s.enter))
            .collect();
        assert_eq!(
            steps,
            [
                (export.writes[0].client, true),
                (export.writes[0].client, false)
            ]
        );
        assert_ne!(export.writes[0].client, export.writes[1].client);
    }
}
