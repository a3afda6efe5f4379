//! The report: both checkers on every lock and on the leader's writes, and where they
//! disagree.

use super::config::{Options, CLUSTERS, REPLICAS, RESTART_DELAY_MS};
use super::faults::Executed;
use super::judge::Span;
use super::judge::{self, LockReport};
use super::schedule::Planned;
use super::workload::{self, lock_name, RunKind, MIX, TTL_SECONDS};
use super::{leader, store, timeline};
use lockedjob::lab::porcupine::{check_export, Independent};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Serialize)]
struct Parameters {
    seed: u64,
    seconds: u64,
    ttl_seconds: u64,
    restart_delay_ms: u64,
    split_nodes: bool,
    unfenced_store: bool,
    clusters: [&'static str; 2],
    replicas: usize,
    mix: [workload::Kind; 4],
}

/// A run-now or backfill the soak asked for, and when its first run entered (none: it never
/// ran).
#[derive(Clone, Serialize)]
pub(super) struct Request {
    asked: String,
    at: f64,
    first_run_after_s: Option<f64>,
}

impl Request {
    pub(super) fn answered(asked: String, at: f64, kind: RunKind, runs: &[workload::Run]) -> Self {
        let first_run_after_s = runs
            .iter()
            .filter(|r| r.kind == kind && r.enter >= at)
            .map(|r| r.enter - at)
            .reduce(f64::min);
        Self {
            asked,
            at,
            first_run_after_s,
        }
    }
}

#[derive(Serialize)]
pub struct Report {
    parameters: Parameters,
    schedule: Vec<Planned>,
    faults: Vec<Executed>,
    faults_by_kind: BTreeMap<&'static str, usize>,
    requests: Vec<Request>,
    locks: Vec<LockReport>,
    leader: leader::LeaderReport,
    independent: BTreeMap<String, Independent>,
    /// What our checker objects to.
    ours: Vec<String>,
    /// What porcupine objects to, and where the two checkers disagree.
    porcupine: Vec<String>,
    disagreements: Vec<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.ours.is_empty() && self.porcupine.is_empty() && self.disagreements.is_empty()
    }

    pub fn ours(&self) -> &[String] {
        &self.ours
    }

    pub fn porcupine(&self) -> &[String] {
        &self.porcupine
    }

    pub(super) fn timeline(&self, title: &str, seen: &Seen) -> String {
        let locks: Vec<String> = self.locks.iter().map(|l| l.lock.clone()).collect();
        let overlapping: Vec<String> = self
            .locks
            .iter()
            .flat_map(|l| &l.overlaps)
            .flat_map(|o| [o.first_pod.clone(), o.second_pod.clone()])
            .collect();
        timeline::render(
            title,
            &locks,
            &seen.runs,
            &seen.writes,
            &seen.executed,
            &overlapping,
        )
    }
}

/// Both checkers on every lock and on the leader's writes.
pub(super) fn judge_all(options: &Options, seen: &Seen) -> Result<Report, String> {
    let mut report = Report {
        parameters: Parameters {
            seed: options.seed,
            seconds: options.seconds,
            ttl_seconds: TTL_SECONDS,
            restart_delay_ms: RESTART_DELAY_MS,
            split_nodes: options.split_nodes,
            unfenced_store: options.unfenced_store,
            clusters: CLUSTERS,
            replicas: REPLICAS,
            mix: MIX,
        },
        faults_by_kind: seen.executed.iter().fold(BTreeMap::new(), |mut m, f| {
            *m.entry(f.kind).or_default() += 1;
            m
        }),
        schedule: seen.plan.clone(),
        faults: seen.executed.clone(),
        requests: seen.requests.clone(),
        locks: Vec::new(),
        leader: leader::judge(&seen.writes),
        independent: BTreeMap::new(),
        ours: Vec::new(),
        porcupine: Vec::new(),
        disagreements: Vec::new(),
    };
    let ttl = TTL_SECONDS as f64;
    for kind in &MIX {
        let lock = lock_name(kind);
        let judged = judge::judge(
            kind,
            &lock,
            &seen.runs,
            &seen.writes,
            &seen.executed,
            seen.span,
            ttl,
        );
        report.ours.extend(judged.objections());
        if let Some(checker) = &options.porcupine_check {
            let dir = options.out.join("porcupine").join(&lock);
            std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            let export = judge::export(&lock, &seen.runs, &seen.writes);
            let independent = check_export(checker, &export, &dir).map_err(|e| e.to_string())?;
            compare(&lock, &judged, &independent, &mut report);
            report.independent.insert(lock.clone(), independent);
        }
        report.locks.push(judged);
    }
    judge_leader(options, &seen.writes, &mut report)?;
    Ok(report)
}

/// The leader's objections: no term at all, or a stale write taken; and porcupine's verdict
/// on its writes (the fenced-store model; its sections are not recorded).
fn judge_leader(
    options: &Options,
    writes: &[store::StoreWrite],
    report: &mut Report,
) -> Result<(), String> {
    let said = &report.leader;
    if said.terms == 0 {
        report
            .ours
            .push(format!("{}: no leader ever wrote", leader::LOCK));
    }
    if said.stale_writes_accepted > 0 {
        report.ours.push(format!(
            "{}: {} stale writes were accepted",
            leader::LOCK,
            said.stale_writes_accepted
        ));
    }
    let Some(checker) = &options.porcupine_check else {
        return Ok(());
    };
    let dir = options.out.join("porcupine").join(leader::LOCK);
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let independent = check_export(checker, &judge::export(leader::LOCK, &[], writes), &dir)
        .map_err(|e| e.to_string())?;
    let fenced_ok = independent.fenced_store == "ok";
    if !fenced_ok {
        report.porcupine.push(format!(
            "{}: fenced-store: {}",
            leader::LOCK,
            independent.fenced_store
        ));
    }
    if fenced_ok != (said.stale_writes_accepted == 0) {
        report.disagreements.push(format!(
            "{}: porcupine's fenced-store says {}, ours counts {} stale writes accepted",
            leader::LOCK,
            independent.fenced_store,
            said.stale_writes_accepted
        ));
    }
    report
        .independent
        .insert(leader::LOCK.to_string(), independent);
    Ok(())
}

/// Porcupine's objections, and where it and our checker disagree: the store's answers fit
/// an order of the writes exactly when no stale write was accepted; the sections fit "one
/// holder at a time" exactly when our checker found no overlap.
fn compare(lock: &str, ours: &LockReport, independent: &Independent, report: &mut Report) {
    let fenced_ok = independent.fenced_store == "ok";
    let one_holder_ok = independent.one_holder == "ok";
    if !fenced_ok {
        report.porcupine.push(format!(
            "{lock}: fenced-store: {}",
            independent.fenced_store
        ));
    }
    // Two runs inside at once is `fenced`, as the lab says it: allowed where a fault outside
    // Redlock's model (a paused holder, a clock jump, a node that lost its data) was around
    // every overlap, when the fence must keep the store safe; an objection otherwise.
    if !one_holder_ok && ours.overlaps.iter().any(|o| o.inside_the_model) {
        report.porcupine.push(format!(
            "{lock}: one-holder: {}, with no fault outside the model around",
            independent.one_holder
        ));
    }
    if fenced_ok != (ours.stale_writes_accepted == 0) {
        report.disagreements.push(format!(
            "{lock}: porcupine's fenced-store says {}, ours counts {} stale writes accepted",
            independent.fenced_store, ours.stale_writes_accepted
        ));
    }
    if one_holder_ok != ours.overlaps.is_empty() {
        report.disagreements.push(format!(
            "{lock}: porcupine's one-holder says {}, ours found {} overlaps",
            independent.one_holder,
            ours.overlaps.len()
        ));
    }
}

/// What the soak saw.
pub(super) struct Seen {
    pub(super) plan: Vec<Planned>,
    pub(super) executed: Vec<Executed>,
    pub(super) requests: Vec<Request>,
    pub(super) runs: Vec<workload::Run>,
    pub(super) writes: Vec<store::StoreWrite>,
    pub(super) span: Span,
}
