//! End to end: stand-in API servers, real Redis nodes, and the real `lockedjob operator`
//! binary as separate processes. Each Job appends `lock scheduled token cluster start end` to a
//! shared journal; the checker asserts one run per scheduled time per lock, no overlap, and
//! tokens growing in start order.

mod e2e;
mod standin;
mod support;

use e2e::{check, condition, journaled, logs_of, read_journal, Lab, Replica};
use kube::api::{Api, PostParams};
use lockedjob::api::LockedJob;
use nix::sys::signal::Signal;
use serde_json::json;
use standin::{eventually, ApiServer};
use std::time::Duration;
use support::{Persistence, RedisNodes};

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
    let nodes = RedisNodes::start(5, Persistence::AppendFsyncAlways).expect("start redis-server");
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

    nodes[0].restart().expect("restart redis-server");
    nodes[1].restart().expect("restart redis-server");
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

/// `lockedjob.dev/run-now`: each request runs once across the replicas, outside the schedule,
/// and is cleared; a malformed request is reported and cleared without a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_now_annotation_runs_once_per_request_across_replicas() {
    use kube::api::{Patch, PatchParams};
    let Lab {
        nodes: _nodes,
        server,
        dir: _dir,
        journal,
        replicas,
    } = Lab::start(3, 3);
    let client = server.client().await;
    let api: Api<LockedJob> = Api::namespaced(client.clone(), "default");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client, "default");
    // Yearly: no scheduled run falls inside the test.
    api.create(
        &PostParams::default(),
        &journaled("manual", "0 0 1 1 *", "c1", &journal, None, "0.2"),
    )
    .await
    .expect("create");
    let annotate = |value: &str| {
        let api = api.clone();
        let patch = json!({"metadata": {"annotations": {"lockedjob.dev/run-now": value}}});
        async move {
            api.patch("manual", &PatchParams::default(), &Patch::Merge(patch))
                .await
                .expect("annotate")
        }
    };
    let annotation_cleared = || async {
        api.get("manual")
            .await
            .ok()
            .is_some_and(|lj| !lj.annotations().contains_key("lockedjob.dev/run-now"))
    };
    use kube::ResourceExt;

    for (i, requested) in ["2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"]
        .into_iter()
        .enumerate()
    {
        annotate(requested).await;
        assert!(
            eventually(Duration::from_secs(20), || async {
                read_journal(&journal).len() == i + 1
            })
            .await,
            "request {requested} ran:\n{}",
            logs_of(&replicas)
        );
        assert!(
            eventually(Duration::from_secs(10), annotation_cleared).await,
            "request {requested} cleared"
        );
    }
    // Let any replica that would run a request twice do so before counting.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let runs = read_journal(&journal);
    assert_eq!(runs.len(), 2, "{runs:#?}\n{}", logs_of(&replicas));
    check(&runs).unwrap_or_else(|e| panic!("{e}"));
    let manual: Vec<String> = jobs
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .iter()
        .filter(|j| {
            j.labels()
                .get("lockedjob.dev/manual")
                .is_some_and(|v| v == "true")
        })
        .map(|j| j.name_any())
        .collect();
    assert_eq!(manual.len(), 2, "{manual:?}");
    assert!(
        manual.iter().all(|n| n.starts_with("manual-m")),
        "{manual:?}"
    );
    let lj = api.get("manual").await.expect("get");
    assert!(
        lj.status
            .as_ref()
            .and_then(|s| s.last_schedule_time.as_ref())
            .is_none(),
        "a manual run is no scheduled time"
    );

    annotate("tomorrow").await;
    assert!(
        eventually(Duration::from_secs(20), annotation_cleared).await,
        "a malformed request is cleared"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        read_journal(&journal).len(),
        2,
        "a malformed request runs nothing"
    );
    for r in &replicas {
        r.signal(Signal::SIGTERM);
    }
}
