//! Scenario 8 of the operator's end-to-end suite, in a test binary of its own: cargo runs
//! test binaries one after the other, so this load (200 LockedJobs falling due at once) never
//! shares the two cores with the timing-sensitive fault scenarios of `operator_e2e.rs`. Runs on
//! the local control plane with a real node (every run's Job a pod under the kubelet, at pace 2),
//! and on the external cluster of `LOCKEDJOB_E2E_KUBECONFIG` too, at that cluster's pace.

use crate::e2e;

use e2e::{check, clusters, logs_of, Lab};
use kube::api::{Api, PostParams};
use lockedjob::api::{ConcurrencyPolicy, LockedJob};
use nix::sys::signal::Signal;

/// Scenario 8: 200 LockedJobs over 3 replicas, each on a one-minute schedule: every LockedJob
/// runs every due time inside the observed window, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn two_hundred_lockedjobs_over_three_replicas_each_run_once_per_due_time() {
    let _turn = crate::alone();
    for cluster in clusters().await {
        two_hundred(Lab::start(cluster, 5, 3)).await;
    }
}

async fn two_hundred(lab: Lab) {
    const COUNT: usize = 200;
    let c = &lab.cluster;
    // A minute (two at the local pace): on two cores the real control plane (Job controller,
    // scheduler, API server, the node) carries about 3 runs/s beside three debug-build replicas and five Redis
    // nodes; at 10 runs/s (a 20 s period) a Job took ~40 s from creation to completion, and
    // concurrencyPolicy Forbid rightly held the next due time back.
    const PERIOD_S: u32 = 60;
    let period_s = c.secs(f64::from(PERIOD_S)).as_secs() as i64;
    let api: Api<LockedJob> = c.api();
    for i in 0..COUNT {
        let mut lj = c.journaled(&format!("many-{i:03}"), &c.every(PERIOD_S), "c1", None, 0.0);
        // Not the 6 s of the fault scenarios: when 200 runs fall due at once, their 200 pods
        // can starve the replicas of the cores for seconds, and a
        // starved holder rightly gives its lease up. This scenario is about scale.
        lj.spec.lock.ttl_seconds = c.secs(30.0).as_secs() as i32;
        // Allow, not the default Forbid: on two cores the node took 90 to 100 s to finish 200
        // pods (p50, p99 of one run) against a 120 s period, and a CI run where it took longer
        // saw Forbid rightly drop the next due time (CronJob's semantics, which
        // `operator_e2e` covers). Under Allow that time waits for the lock, which the run of
        // the time before holds until its Job finishes, and runs late: still once.
        lj.spec.concurrency_policy = ConcurrencyPolicy::Allow;
        api.create(&PostParams::default(), &lj)
            .await
            .expect("create");
    }
    let created = jiff::Timestamp::now();
    // Due times with room on both sides: after every object existed (plus a moment for the
    // watches to deliver them) and early enough to have started before the replicas stopped,
    // even late behind a run that held its lock past the next due time. The replicas stop
    // once two due times of each LockedJob lie in that window (a fixed wait cost a minute and
    // a half more on average, the kubernetes tier's budget, docs/testing.md "Time").
    let first = (created.as_second() + 2 + period_s - 1) / period_s * period_s;
    let room = c.secs(15.0).as_secs() as i64;
    let stop_at = first + period_s + room + 1;
    tokio::time::sleep(std::time::Duration::from_secs(
        (stop_at - jiff::Timestamp::now().as_second()).max(0) as u64,
    ))
    .await;
    let stopped = jiff::Timestamp::now();
    for r in &lab.replicas {
        r.signal(Signal::SIGTERM);
    }
    // Runs started = Jobs created (their pods may still be queued behind the Job controller).
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = c.api();
    let all_jobs = jobs
        .list(&Default::default())
        .await
        .expect("list Jobs")
        .items;
    let started: Vec<(String, i64, i64)> = all_jobs
        .iter()
        .filter_map(|job| {
            let owner = job
                .metadata
                .owner_references
                .as_ref()?
                .first()?
                .name
                .clone();
            let scheduled = job
                .metadata
                .annotations
                .as_ref()?
                .get("lockedjob.dev/scheduled-time")?
                .parse::<jiff::Timestamp>()
                .ok()?;
            let created = job.metadata.creation_timestamp.as_ref()?.0.as_second();
            Some((
                owner,
                scheduled.as_second(),
                created - scheduled.as_second(),
            ))
        })
        .collect();
    // How long the control plane took from a Job's creation to its completion: a Job still
    // active holds the LockedJob's next due time back (concurrencyPolicy Forbid).
    let durations: Vec<i64> = all_jobs
        .iter()
        .filter_map(|job| {
            let created = job.metadata.creation_timestamp.as_ref()?.0.as_second();
            let done = job.status.as_ref()?.completion_time.as_ref()?.0.as_second();
            Some(done - created)
        })
        .collect();
    println!(
        "{} Jobs completed; creation to completion (s): {}",
        durations.len(),
        percentiles(durations)
    );
    let runs = lab.journal.runs().await;
    let logs = logs_of(&lab.replicas);
    check(&runs).unwrap_or_else(|e| panic!("{e}\n{logs}"));

    // `room` is generous: on two loaded cores, debug-build replicas and the control plane lag
    // by seconds when 200 runs fall due at once (the release benchmark measures the real lag).
    let last = stopped.as_second() - room;
    let due: Vec<i64> = (first..=last).step_by(period_s as usize).collect();
    assert!(!due.is_empty(), "the window holds a due time");
    let mut missing = Vec::new();
    let mut twice = Vec::new();
    for i in 0..COUNT {
        let name = format!("many-{i:03}");
        let lock = c.default_lock(&name);
        for t in &due {
            // A run counts once its Job exists or its process journaled it (older finished
            // Jobs may already be gone to the history limit).
            let jobs = started
                .iter()
                .filter(|(o, s, _)| *o == name && s == t)
                .count();
            let journaled = runs
                .iter()
                .filter(|r| {
                    r.lock == lock
                        && r.scheduled
                            .parse::<jiff::Timestamp>()
                            .is_ok_and(|s| s.as_second() == *t)
                })
                .count();
            match jobs.max(journaled) {
                0 => missing.push(format!("{name}@{t}")),
                1 => {}
                n => twice.push(format!("{name}@{t} x{n}")),
            }
        }
    }
    println!(
        "{} Jobs created; lag (s, creationTimestamp - scheduled): {}",
        started.len(),
        percentiles(started.iter().map(|(_, _, lag)| *lag).collect())
    );
    assert!(twice.is_empty(), "a due time ran twice: {twice:?}");
    // On failure, what the replicas said about the first missing LockedJob.
    let story = missing.first().map_or_else(String::new, |m| {
        let name = m.split('@').next().unwrap_or_default();
        logs.lines()
            .filter(|l| l.contains(&c.default_lock(name)) || l.contains(&format!("{name}-")))
            .collect::<Vec<_>>()
            .join("\n")
    });
    assert!(
        missing.is_empty(),
        "{} of {} due runs missing (first: {:?}); {} Jobs created, {} runs journaled\n{story}",
        missing.len(),
        COUNT * due.len(),
        missing.iter().take(5).collect::<Vec<_>>(),
        started.len(),
        runs.len()
    );
    println!(
        "{} LockedJobs x {} due times each ran once ({} runs journaled)",
        COUNT,
        due.len(),
        runs.len()
    );
}

/// "p50 .. p99 .. max .." of whole seconds, for the scenario's report.
fn percentiles(mut values: Vec<i64>) -> String {
    values.sort_unstable();
    format!(
        "p50 {:?} p99 {:?} max {:?}",
        values.get(values.len() / 2),
        values.get(values.len() * 99 / 100),
        values.last()
    )
}
