//! The quickstart's verdict, pure: runs in, what went wrong (if anything) out.

use std::collections::BTreeMap;
use std::fmt;

/// One run, as its pod printed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub cluster: String,
    pub replica: String,
    pub job: String,
    /// RFC 3339, as the operator hands it to the Job.
    pub scheduled: String,
    pub token: u64,
    pub start: f64,
    pub end: f64,
}

/// Runs in a pod's output: lines `TAG scheduled token holder start end`.
pub fn parse(tag: &str, cluster: &str, job: &str, output: &str) -> Vec<Run> {
    output
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() != 6 || f[0] != tag {
                return None;
            }
            Some(Run {
                cluster: cluster.to_string(),
                replica: f[3].to_string(),
                job: job.to_string(),
                scheduled: f[1].to_string(),
                token: f[2].parse().ok()?,
                start: f[4].parse().ok()?,
                end: f[5].parse().ok()?,
            })
        })
        .collect()
}

#[derive(Debug, Default, PartialEq)]
pub struct Verdict {
    pub runs: usize,
    pub clusters: Vec<String>,
    /// Due times between the first and the last run that did not run.
    pub missed: Vec<String>,
    /// Due times that ran more than once.
    pub doubled: Vec<String>,
    /// Pairs of runs (by scheduled time) that were in progress at once.
    pub overlapping: Vec<(String, String)>,
    /// Pairs of runs (in start order) whose tokens did not grow.
    pub out_of_order: Vec<(String, String)>,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.runs > 0
            && self.missed.is_empty()
            && self.doubled.is_empty()
            && self.overlapping.is_empty()
            && self.out_of_order.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} runs by clusters {:?}: {} due times missed, {} run twice, {} overlapping, {} out of token order",
            self.runs,
            self.clusters,
            self.missed.len(),
            self.doubled.len(),
            self.overlapping.len(),
            self.out_of_order.len()
        )?;
        for (what, list) in [("missed", &self.missed), ("run twice", &self.doubled)] {
            for time in list {
                writeln!(f, "  {what}: {time}")?;
            }
        }
        for (what, list) in [
            ("overlap", &self.overlapping),
            ("tokens not growing", &self.out_of_order),
        ] {
            for (a, b) in list {
                writeln!(f, "  {what}: {a} and {b}")?;
            }
        }
        if self.ok() {
            write!(
                f,
                "OK: every due time ran exactly once across both clusters, one at a time, tokens growing"
            )
        } else {
            write!(f, "FAILED")
        }
    }
}

/// Judges the runs of one lock scheduled every `period` seconds.
pub fn judge(runs: &[Run], period: u64) -> Verdict {
    let mut verdict = Verdict {
        runs: runs.len(),
        ..Verdict::default()
    };
    let mut clusters: Vec<String> = runs.iter().map(|r| r.cluster.clone()).collect();
    clusters.sort();
    clusters.dedup();
    verdict.clusters = clusters;

    let mut by_time: BTreeMap<jiff::Timestamp, usize> = BTreeMap::new();
    for run in runs {
        if let Ok(t) = run.scheduled.parse::<jiff::Timestamp>() {
            *by_time.entry(t).or_default() += 1;
        }
    }
    verdict.doubled = by_time
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(t, _)| t.to_string())
        .collect();
    if let (Some(first), Some(last)) = (
        by_time.keys().next().copied(),
        by_time.keys().next_back().copied(),
    ) {
        let step = jiff::SignedDuration::from_secs(period.max(1) as i64);
        let mut due = first;
        while due < last {
            if !by_time.contains_key(&due) {
                verdict.missed.push(due.to_string());
            }
            due = match due.checked_add(step) {
                Ok(next) => next,
                Err(_) => break,
            };
        }
    }

    let mut in_start_order: Vec<&Run> = runs.iter().collect();
    in_start_order.sort_by(|a, b| a.start.total_cmp(&b.start));
    for pair in in_start_order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.start < a.end {
            verdict
                .overlapping
                .push((a.scheduled.clone(), b.scheduled.clone()));
        }
        if b.token <= a.token {
            verdict
                .out_of_order
                .push((a.scheduled.clone(), b.scheduled.clone()));
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(scheduled: &str, token: u64, start: f64, end: f64) -> Run {
        Run {
            cluster: "east".into(),
            replica: "east/locks-0".into(),
            job: "report-1".into(),
            scheduled: scheduled.into(),
            token,
            start,
            end,
        }
    }

    #[test]
    fn each_kind_of_failure_is_found_and_a_clean_history_passes() {
        let t = |s: u32| format!("2026-12-03T10:00:{s:02}Z");
        let clean = vec![
            run(&t(0), 1, 0.0, 2.0),
            run(&t(5), 2, 5.0, 7.0),
            run(&t(10), 3, 10.0, 12.0),
        ];
        type Holds = fn(&Verdict) -> bool;
        let cases: Vec<(&str, Vec<Run>, Holds)> = vec![
            ("clean", clean.clone(), |v| v.ok()),
            ("nothing ran", vec![], |v| !v.ok() && v.runs == 0),
            (
                "a due time missed",
                vec![clean[0].clone(), clean[2].clone()],
                |v| v.missed == ["2026-12-03T10:00:05Z"] && !v.ok(),
            ),
            (
                "a due time twice",
                vec![clean[0].clone(), run(&t(0), 2, 3.0, 4.0)],
                |v| v.doubled == ["2026-12-03T10:00:00Z"] && !v.ok(),
            ),
            (
                "overlap",
                vec![clean[0].clone(), run(&t(5), 2, 1.0, 3.0)],
                |v| v.overlapping.len() == 1 && !v.ok(),
            ),
            (
                "token not growing",
                vec![clean[0].clone(), run(&t(5), 1, 5.0, 7.0)],
                |v| v.out_of_order.len() == 1 && !v.ok(),
            ),
        ];
        for (name, runs, holds) in cases {
            let verdict = judge(&runs, 5);
            assert!(holds(&verdict), "{name}: {verdict:?}");
        }
    }

    #[test]
    fn run_lines_are_told_from_other_output() {
        let output = "starting\nquickstart-run 2026-12-03T10:00:05Z 7 west/locks-1 100.5 102.5\nquickstart-run broken\n";
        let runs = parse("quickstart-run", "west", "report-9", output);
        assert_eq!(
            runs,
            vec![Run {
                cluster: "west".into(),
                replica: "west/locks-1".into(),
                job: "report-9".into(),
                scheduled: "2026-12-03T10:00:05Z".into(),
                token: 7,
                start: 100.5,
                end: 102.5,
            }]
        );
    }
}
