//! End to end: stand-in API servers, real Redis nodes, and the real `lockedjob operator`
//! binary as separate processes. Each Job appends `lock scheduled token cluster start end` to a
//! shared journal; the checker asserts one run per scheduled time per lock, no overlap, and
//! tokens growing in start order.

mod standin;
mod support;

use kube::api::{Api, PostParams};
use lockedjob::api::LockedJob;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use standin::{eventually, ApiServer};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{Persistence, RedisNodes};

/// One operator replica process.
struct Replica {
    child: Child,
    name: String,
    log: PathBuf,
}

impl Replica {
    fn start(server: &ApiServer, urls: &[String], cluster: &str, name: &str, dir: &Path) -> Self {
        let kubeconfig = server.write_kubeconfig(name);
        let log = dir.join(format!("{cluster}-{name}.log"));
        let child = Command::new(support::lockedjob_bin())
            .arg("operator")
            .args(["--redis", &urls.join(",")])
            .args(["--cluster-id", cluster, "--runner-name", name])
            .args(["--request-timeout", "300ms"])
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{}", support::free_port()),
            ])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .env_remove("LOCKEDJOB_REDIS_URLS")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start operator");
        Self {
            child,
            name: name.into(),
            log,
        }
    }

    fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Redis nodes, one stand-in cluster, its operator replicas and the shared journal.
struct Lab {
    nodes: RedisNodes,
    server: ApiServer,
    dir: tempfile::TempDir,
    journal: PathBuf,
    replicas: Vec<Replica>,
}

impl Lab {
    fn start(redis_nodes: usize, replicas: usize) -> Self {
        let nodes = RedisNodes::start(redis_nodes, Persistence::AppendFsyncAlways);
        let server = ApiServer::start();
        let dir = tempfile::tempdir().expect("dir");
        let journal = dir.path().join("journal");
        let replicas = (0..replicas)
            .map(|i| Replica::start(&server, &nodes.urls(), "c1", &format!("r{i}"), dir.path()))
            .collect();
        Self {
            nodes,
            server,
            dir,
            journal,
            replicas,
        }
    }
}

fn logs_of(replicas: &[Replica]) -> String {
    replicas
        .iter()
        .map(|r| format!("--- {}\n{}", r.name, r.log()))
        .collect()
}

/// A LockedJob whose every run records itself in `journal`.
fn journaled(
    name: &str,
    schedule: &str,
    cluster: &str,
    journal: &Path,
    lock: Option<&str>,
    sleep: &str,
) -> LockedJob {
    let script = format!(
        "start=$(date +%s.%N); sleep {sleep}; end=$(date +%s.%N); echo \"$LOCKEDJOB_LOCK_NAME $LOCKEDJOB_SCHEDULED_TIME $LOCKEDJOB_FENCING_TOKEN {cluster} $start $end\" >> {}",
        journal.display()
    );
    let mut lock_spec = json!({"ttlSeconds": 6});
    if let Some(lock) = lock {
        lock_spec["name"] = json!(lock);
    }
    serde_json::from_value(json!({
        "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedule": schedule, "lock": lock_spec, "jobTemplate": {"spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}]}}}}}
    }))
    .expect("locked job")
}

#[derive(Debug, Clone)]
struct Run {
    lock: String,
    scheduled: String,
    token: u64,
    cluster: String,
    start: f64,
    end: f64,
}

fn read_journal(path: &Path) -> Vec<Run> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() == 6).then(|| Run {
                lock: f[0].into(),
                scheduled: f[1].into(),
                token: f[2].parse().unwrap_or(0),
                cluster: f[3].into(),
                start: f[4].parse().unwrap_or(0.0),
                end: f[5].parse().unwrap_or(0.0),
            })
        })
        .collect()
}

/// The checker: per lock, one run per scheduled time, no overlap, tokens growing in start order.
fn check(runs: &[Run]) -> Result<(), String> {
    let clusters: std::collections::BTreeSet<&str> =
        runs.iter().map(|r| r.cluster.as_str()).collect();
    let tokens: Vec<u64> = runs.iter().map(|r| r.token).collect();
    println!(
        "journal: {} runs by clusters {clusters:?}, tokens {tokens:?}",
        runs.len()
    );
    let mut locks: Vec<&str> = runs.iter().map(|r| r.lock.as_str()).collect();
    locks.sort();
    locks.dedup();
    for lock in locks {
        let mut mine: Vec<&Run> = runs.iter().filter(|r| r.lock == lock).collect();
        mine.sort_by(|a, b| a.start.total_cmp(&b.start));
        let mut times: Vec<&str> = mine.iter().map(|r| r.scheduled.as_str()).collect();
        times.sort();
        let before = times.len();
        times.dedup();
        if times.len() != before {
            return Err(format!("{lock}: a scheduled time ran twice: {mine:#?}"));
        }
        for pair in mine.windows(2) {
            if pair[1].start < pair[0].end {
                return Err(format!(
                    "{lock}: runs overlap: {:?} and {:?}",
                    pair[0], pair[1]
                ));
            }
            if pair[1].token <= pair[0].token {
                return Err(format!(
                    "{lock}: tokens not increasing in start order: {:?} then {:?}",
                    pair[0], pair[1]
                ));
            }
        }
    }
    Ok(())
}

async fn condition(api: &Api<LockedJob>, name: &str, kind: &str) -> Option<(String, String)> {
    let lj = api.get(name).await.ok()?;
    lj.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status, c.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_run_each_time_once_and_invalid_specs_are_reported() {
    let Lab {
        nodes: _nodes,
        server,
        dir: _dir,
        journal,
        replicas,
    } = Lab::start(5, 3);
    let client = server.client().await;
    let api: Api<LockedJob> = Api::namespaced(client, "default");
    api.create(
        &PostParams::default(),
        &journaled("every-2s", "*/2 * * * * *", "c1", &journal, None, "0.3"),
    )
    .await
    .expect("create");
    let mut bad = journaled("bad-cron", "61 * * * *", "c1", &journal, None, "0");
    bad.metadata.name = Some("bad-cron".into());
    api.create(&PostParams::default(), &bad)
        .await
        .expect("create invalid");

    assert!(
        eventually(Duration::from_secs(20), || async {
            condition(&api, "bad-cron", "InvalidSpec")
                .await
                .is_some_and(|(s, m)| s == "True" && m.contains("spec.schedule"))
        })
        .await,
        "InvalidSpec not reported"
    );
    tokio::time::sleep(Duration::from_secs(24)).await;
    for r in &replicas {
        r.signal(Signal::SIGTERM);
    }
    let runs = read_journal(&journal);
    let logs = logs_of(&replicas);
    assert!(runs.len() >= 5, "too few runs ({}):\n{logs}", runs.len());
    check(&runs).unwrap_or_else(|e| panic!("{e}\n{logs}"));
    let holders: std::collections::HashSet<String> = api
        .get("every-2s")
        .await
        .expect("get")
        .status
        .and_then(|s| s.last_run)
        .map(|r| r.holder)
        .into_iter()
        .collect();
    assert!(!holders.is_empty(), "lastRun recorded");
    assert!(runs.iter().all(|r| r.lock == "default/every-2s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_sharing_redis_run_each_time_once_across_both() {
    let nodes = RedisNodes::start(5, Persistence::AppendFsyncAlways);
    let east = ApiServer::start();
    let west = ApiServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let journal = dir.path().join("journal");
    let mut replicas = Vec::new();
    for (cluster, server) in [("east", &east), ("west", &west)] {
        for i in 0..2 {
            replicas.push(Replica::start(
                server,
                &nodes.urls(),
                cluster,
                &format!("r{i}"),
                dir.path(),
            ));
        }
        let api: Api<LockedJob> = Api::namespaced(server.client().await, "default");
        api.create(
            &PostParams::default(),
            &journaled(
                "shared",
                "*/2 * * * * *",
                cluster,
                &journal,
                Some("global/shared"),
                "0.3",
            ),
        )
        .await
        .expect("create");
    }
    tokio::time::sleep(Duration::from_secs(24)).await;
    for r in &replicas {
        r.signal(Signal::SIGTERM);
    }
    let runs = read_journal(&journal);
    let logs = logs_of(&replicas);
    assert!(runs.len() >= 5, "too few runs ({}):\n{logs}", runs.len());
    check(&runs).unwrap_or_else(|e| panic!("{e}\n{logs}"));
    assert!(runs.iter().all(|r| r.lock == "global/shared"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_loss_deletes_the_job_before_the_deadline_and_runs_resume_after() {
    let Lab {
        mut nodes,
        server,
        dir: _dir,
        journal,
        replicas,
    } = Lab::start(5, 2);
    let client = server.client().await;
    let api: Api<LockedJob> = Api::namespaced(client.clone(), "default");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client, "default");
    api.create(
        &PostParams::default(),
        &journaled("long", "*/3 * * * * *", "c1", &journal, None, "60"),
    )
    .await
    .expect("create");

    // One node down: runs go on, RedisDegraded is reported.
    nodes[4].kill9();
    assert!(
        eventually(Duration::from_secs(30), || async {
            condition(&api, "long", "RedisDegraded")
                .await
                .is_some_and(|(s, _)| s == "True")
        })
        .await,
        "RedisDegraded not reported"
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            jobs.list(&Default::default()).await.is_ok_and(|l| {
                l.items
                    .iter()
                    .any(|j| j.metadata.deletion_timestamp.is_none())
            })
        })
        .await,
        "no Job started"
    );

    // Majority down mid-run: the Job is deleted within the lease, LockLost is set.
    nodes[0].kill9();
    nodes[1].kill9();
    let lost_at = std::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(20), || async {
            condition(&api, "long", "LockLost")
                .await
                .is_some_and(|(s, _)| s == "True")
        })
        .await,
        "LockLost not set"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            jobs.list(&Default::default())
                .await
                .is_ok_and(|l| l.items.is_empty())
        })
        .await,
        "the Job was not deleted"
    );
    let stopped_after = lost_at.elapsed();
    // The lease (6 s) was renewed at most 2 s before the kill: its deadline is within 6 s.
    assert!(
        stopped_after < Duration::from_secs(6),
        "Job outlived the lease deadline: {stopped_after:?}"
    );
    // No new run without the lock.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        jobs.list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty(),
        "a run started without quorum"
    );

    nodes[0].restart();
    nodes[1].restart();
    assert!(
        eventually(Duration::from_secs(30), || async {
            jobs.list(&Default::default())
                .await
                .is_ok_and(|l| !l.items.is_empty())
        })
        .await,
        "runs did not resume: {}",
        replicas.iter().map(|r| r.log()).collect::<String>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_is_replaced_without_a_second_job_for_the_same_time() {
    let Lab {
        nodes: _nodes,
        server,
        dir: _dir,
        journal,
        mut replicas,
    } = Lab::start(3, 3);
    let client = server.client().await;
    let api: Api<LockedJob> = Api::namespaced(client.clone(), "default");
    api.create(
        &PostParams::default(),
        &journaled("adopt", "*/4 * * * * *", "c1", &journal, None, "3"),
    )
    .await
    .expect("create");
    // Wait for the first run's holder, then kill -9 it mid-run.
    assert!(
        eventually(Duration::from_secs(30), || async {
            api.get("adopt")
                .await
                .ok()
                .and_then(|l| l.status)
                .and_then(|s| s.last_run)
                .is_some()
        })
        .await
    );
    let holder = api
        .get("adopt")
        .await
        .expect("get")
        .status
        .and_then(|s| s.last_run)
        .map(|r| r.holder)
        .expect("holder");
    let index = replicas
        .iter()
        .position(|r| holder.ends_with(&format!("/{}", r.name)))
        .expect("holder is a replica");
    let victim = replicas.remove(index);
    drop(victim); // kill -9
    tokio::time::sleep(Duration::from_secs(20)).await;
    for r in &replicas {
        r.signal(Signal::SIGTERM);
    }
    let runs = read_journal(&journal);
    let logs = logs_of(&replicas);
    check(&runs).unwrap_or_else(|e| panic!("{e}\n{logs}"));
    assert!(
        runs.len() >= 3,
        "runs did not go on after the holder died ({}):\n{logs}",
        runs.len()
    );
}

async fn wait_for_holder(api: &Api<LockedJob>, name: &str) -> String {
    assert!(
        eventually(Duration::from_secs(40), || async {
            api.get(name)
                .await
                .ok()
                .and_then(|l| l.status)
                .and_then(|s| s.last_run)
                .is_some()
        })
        .await,
        "no run started"
    );
    api.get(name)
        .await
        .expect("get")
        .status
        .and_then(|s| s.last_run)
        .map(|r| r.holder)
        .expect("holder")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_is_taken_over_and_leaves_the_job_alone_when_it_wakes() {
    let Lab {
        nodes: _nodes,
        server,
        dir: _dir,
        journal,
        replicas,
    } = Lab::start(3, 3);
    let api: Api<LockedJob> = Api::namespaced(server.client().await, "default");
    api.create(
        &PostParams::default(),
        &journaled("paused", "*/20 * * * * *", "c1", &journal, None, "11"),
    )
    .await
    .expect("create");
    let holder = wait_for_holder(&api, "paused").await;
    let paused = replicas
        .iter()
        .find(|r| holder.ends_with(&format!("/{}", r.name)))
        .expect("holder is a replica");
    // Longer than the 6 s TTL: the lease runs out while the holder sleeps.
    paused.signal(Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(9)).await;
    paused.signal(Signal::SIGCONT);
    // The run the paused holder started must finish (it writes its journal line at the end):
    // had the woken holder deleted the Job, that line would be missing.
    assert!(
        eventually(Duration::from_secs(20), || async {
            !read_journal(&journal).is_empty()
        })
        .await,
        "the first run never finished: {}",
        replicas
            .iter()
            .map(|r| format!("--- {}\n{}", r.name, r.log()))
            .collect::<String>()
    );
    let adopted = replicas
        .iter()
        .any(|r| r.name != paused.name && r.log().contains("adopting the Job"));
    let left_alone = paused.log().contains("another holder has the lock now");
    let logs = logs_of(&replicas);
    assert!(adopted, "no replica adopted the Job:\n{logs}");
    assert!(left_alone, "the woken holder did not step aside:\n{logs}");
    check(&read_journal(&journal)).unwrap_or_else(|e| panic!("{e}\n{logs}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_cut_off_from_its_api_server_causes_no_duplicate_and_status_catches_up() {
    let Lab {
        nodes: _nodes,
        server,
        dir: _dir,
        journal,
        replicas,
    } = Lab::start(3, 3);
    let api: Api<LockedJob> = Api::namespaced(server.client().await, "default");
    api.create(
        &PostParams::default(),
        &journaled("cut", "*/4 * * * * *", "c1", &journal, None, "2"),
    )
    .await
    .expect("create");
    let holder = wait_for_holder(&api, "cut").await;
    let token = holder.rsplit('/').next().expect("runner name").to_string();
    server.set_faults(|f| {
        f.cut_tokens.insert(token.clone());
    });
    tokio::time::sleep(Duration::from_secs(8)).await;
    server.set_faults(|f| f.cut_tokens.clear());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let status = api.get("cut").await.expect("get").status.expect("status");
    let logs = logs_of(&replicas);
    assert!(
        status.last_successful_time.is_some(),
        "status did not catch up:\n{logs}"
    );
    let runs = read_journal(&journal);
    check(&runs).unwrap_or_else(|e| panic!("{e}\n{logs}"));
    assert!(runs.len() >= 3, "runs stopped ({}):\n{logs}", runs.len());
}

/// Scenario 8: 200 LockedJobs over 3 replicas, each on a 10-second schedule: every LockedJob
/// runs every due time inside the observed window, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known gap (issue 5): on the 2-core machine, debug-build replicas miss due times at 200 LockedJobs; run with --ignored"]
async fn two_hundred_lockedjobs_over_three_replicas_each_run_once_per_due_time() {
    const COUNT: usize = 200;
    const PERIOD_S: i64 = 10;
    let Lab {
        nodes: _nodes,
        server,
        dir: _dir,
        journal,
        replicas,
    } = Lab::start(5, 3);
    let api: Api<LockedJob> = Api::namespaced(server.client().await, "default");
    for i in 0..COUNT {
        api.create(
            &PostParams::default(),
            &journaled(
                &format!("many-{i:03}"),
                "*/10 * * * * *",
                "c1",
                &journal,
                None,
                "0",
            ),
        )
        .await
        .expect("create");
    }
    let created = jiff::Timestamp::now();
    tokio::time::sleep(Duration::from_secs(34)).await;
    let stopped = jiff::Timestamp::now();
    for r in &replicas {
        r.signal(Signal::SIGTERM);
    }
    // Runs started = Jobs created (their processes may still be queued on the local kubelet).
    let jobs: Api<k8s_openapi::api::batch::v1::Job> =
        Api::namespaced(server.client().await, "default");
    let started: Vec<(String, i64, i64)> = jobs
        .list(&Default::default())
        .await
        .expect("list Jobs")
        .items
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
    let runs = read_journal(&journal);
    let logs = logs_of(&replicas);
    check(&runs).unwrap_or_else(|e| panic!("{e}\n{logs}"));

    // Due times with room on both sides: after every object existed (plus a moment for the
    // watches to deliver them) and early enough to have started before the replicas stopped.
    let first = (created.as_second() + 2 + PERIOD_S - 1) / PERIOD_S * PERIOD_S;
    let last = stopped.as_second() - 5;
    let due: Vec<i64> = (first..=last).step_by(PERIOD_S as usize).collect();
    assert!(!due.is_empty(), "the window holds a due time");
    let mut missing = Vec::new();
    let mut twice = Vec::new();
    for i in 0..COUNT {
        let name = format!("many-{i:03}");
        for t in &due {
            match started
                .iter()
                .filter(|(o, s, _)| *o == name && s == t)
                .count()
            {
                0 => missing.push(format!("{name}@{t}")),
                1 => {}
                n => twice.push(format!("{name}@{t} x{n}")),
            }
        }
    }
    let mut lags: Vec<i64> = started.iter().map(|(_, _, lag)| *lag).collect();
    lags.sort_unstable();
    println!(
        "{} Jobs created; lag (s, creationTimestamp - scheduled): p50 {:?} p99 {:?} max {:?}",
        started.len(),
        lags.get(lags.len() / 2),
        lags.get(lags.len() * 99 / 100),
        lags.last()
    );
    assert!(twice.is_empty(), "a due time ran twice: {twice:?}");
    assert!(
        missing.is_empty(),
        "{} of {} due runs missing (first: {:?}); {} Jobs created, {} runs journaled",
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
