//! The README's first command (`scripts/quickstart.sh`): the operator doing its job on this
//! machine. Two local clusters (real control planes and a real node each, see `localcluster/`)
//! share five local Redis nodes, which their pods reach through a proxy per node on the host's
//! end of each cluster's node link; `helm install` puts 3 operator replicas in each, with
//! different cluster ids; the same LockedJob (one `spec.lock.name`) goes into both, every 10
//! seconds. Midway the holder's pod is
//! deleted and one Redis node is killed with SIGKILL. At the end: one line per run, `kubectl get lj`
//! of both clusters, and a verdict: every due time ran exactly once across both clusters, no two
//! runs overlapped, tokens grew.

mod verdict;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use localcluster::Binaries;
use lockedjob::api::LockedJob;
use lockedjob::lab::harness::{Persistence, RedisNodes};
use quickstart::clusters::{block_on, lockedjob_binary, running_holder, NodeProxies, Side};
use serde_json::json;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use verdict::Run;

/// Not 5 s: on a real node a Job's pod takes about 3.5 s from creation to completion beyond
/// its command (sandbox, network, the Job controller's count), and `Forbid` rightly holds a due
/// time back while the previous run's Job is still active.
const PERIOD_SECONDS: u64 = 10;
const LOCK: &str = "quickstart-report";
const NAMESPACE: &str = "demo";
const TAG: &str = "quickstart-run";

fn say(text: impl std::fmt::Display) {
    eprintln!("[quickstart] {text}");
}

fn main() -> ExitCode {
    let seconds: u64 = std::env::var("QUICKSTART_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s| *s >= 30)
        .unwrap_or(60);
    match block_on(run(Duration::from_secs(seconds))).and_then(|outcome| outcome) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            say(format!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}

async fn run(length: Duration) -> Result<bool, String> {
    let lockedjob = lockedjob_binary()?;
    let bins = Binaries::locate().map_err(|e| e.to_string())?;

    let mut nodes = RedisNodes::start(5, Persistence::AppendFsyncAlways)
        .map_err(|e| format!("start redis-server: {e}"))?;
    let password = format!("{:032x}", rand::random::<u128>());
    for node in &nodes.nodes {
        node.command::<()>(&["CONFIG", "SET", "requirepass", &password])
            .map_err(|e| format!("set the password of {}: {e}", node.url()))?;
    }
    let urls = nodes.urls();
    say(format!(
        "5 Redis nodes up (appendfsync always): {}",
        urls.join(" ")
    ));

    say("starting two local clusters, east and west (etcd, kube-apiserver, kube-controller-manager, kube-scheduler; a node each: kubelet, containerd, runc, kube-proxy, CoreDNS)");
    let started = Instant::now();
    let (east, west) = tokio::join!(
        Side::start("east", &lockedjob, &bins),
        Side::start("west", &lockedjob, &bins)
    );
    let sides = [east?, west?];
    say(format!(
        "clusters ready in {:.0} s",
        started.elapsed().as_secs_f64()
    ));

    let addrs: Vec<String> = nodes.nodes.iter().map(|n| n.addr()).collect();
    let mut proxies = Vec::new();
    for side in &sides {
        let side_proxies = NodeProxies::start(side, &addrs)?;
        say(format!(
            "{}: helm install locks (3 replicas, cluster id {})",
            side.id, side.id
        ));
        side.install_operator(&side_proxies.urls(), &password, &[])?;
        proxies.push(side_proxies);
    }
    for side in &sides {
        create_locked_job(side).await?;
    }
    say(format!(
        "LockedJob {NAMESPACE}/report applied in both clusters, lock {LOCK:?}, every {PERIOD_SECONDS} s; running for {} s",
        length.as_secs()
    ));

    tokio::time::sleep(length / 2).await;
    let wait = Duration::from_secs(3 * PERIOD_SECONDS);
    match running_holder(&sides, NAMESPACE, wait).await {
        Some((side, pod)) => {
            say(format!(
                "deleting the holder's pod: {}/{pod} (it hands the run over)",
                sides[side].id
            ));
            Api::<Pod>::namespaced(sides[side].client.clone(), "lockedjob")
                .delete(&pod, &DeleteParams::default())
                .await
                .map_err(|e| format!("delete pod {pod}: {e}"))?;
        }
        None => say("no run was in flight to take the holder from"),
    }
    say(format!(
        "killing one Redis node (kill -9): {}",
        nodes.nodes[2].url()
    ));
    nodes.nodes[2].kill9();
    tokio::time::sleep(length / 2).await;

    say("suspending the LockedJobs and waiting for the last runs to end");
    for side in &sides {
        Api::<LockedJob>::namespaced(side.client.clone(), NAMESPACE)
            .patch(
                "report",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"suspend": true}})),
            )
            .await
            .map_err(|e| format!("suspend on {}: {e}", side.id))?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut runs = loop {
        let (collected, unfinished) = collect_runs(&sides).await;
        if unfinished == 0 || Instant::now() > deadline {
            break collected;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    println!();
    println!(
        "{:<7} {:<47} {:<20} {:<22} {:>5}  {:<12}  {:<12}",
        "cluster", "replica", "job", "scheduled", "token", "start", "end"
    );
    runs.sort_by(|a, b| a.scheduled.cmp(&b.scheduled));
    for r in &runs {
        println!(
            "{:<7} {:<47} {:<20} {:<22} {:>5}  {:<12}  {:<12}",
            r.cluster,
            r.replica,
            r.job,
            r.scheduled,
            r.token,
            clock(r.start),
            clock(r.end)
        );
    }
    for side in &sides {
        println!("\n$ kubectl get lj -n {NAMESPACE}   # {}", side.id);
        print!("{}", side.tool("kubectl", &["get", "lj", "-n", NAMESPACE])?);
    }
    let verdict = verdict::judge(&runs, PERIOD_SECONDS);
    println!("\n{verdict}");
    Ok(verdict.ok())
}

async fn create_locked_job(side: &Side) -> Result<(), String> {
    Api::<Namespace>::all(side.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))
                .map_err(|e| e.to_string())?,
        )
        .await
        .map_err(|e| format!("create namespace {NAMESPACE} on {}: {e}", side.id))?;
    // Each run prints one line when it ends: what ran, under which token, on which replica.
    let script = format!(
        "{} start=$(now); sleep 2; end=$(now); \
         echo \"{TAG} $LOCKEDJOB_SCHEDULED_TIME $LOCKEDJOB_FENCING_TOKEN $LOCKEDJOB_HOLDER $start $end\"",
        localcluster::SHELL_NOW
    );
    let locked_job: LockedJob = serde_json::from_value(json!({
        "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
        "metadata": {"name": "report"},
        "spec": {
            "schedule": format!("*/{PERIOD_SECONDS} * * * * *"),
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 100,
            "failedJobsHistoryLimit": 100,
            "lock": {"name": LOCK, "ttlSeconds": 10},
            "jobTemplate": {"spec": {"backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "report", "image": "busybox:1.36",
                                "command": ["sh", "-c", script]}]}}}}
        }
    }))
    .map_err(|e| e.to_string())?;
    // The CRD came with the chart; it may take a moment to be served.
    let api = Api::<LockedJob>::namespaced(side.client.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&PostParams::default(), &locked_job).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("create the LockedJob on {}: {e}", side.id))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Every finished run of both clusters, read from its pod's output; and how many Jobs have
/// not finished yet.
async fn collect_runs(sides: &[Side]) -> (Vec<Run>, usize) {
    let mut runs = Vec::new();
    let mut unfinished = 0;
    for side in sides {
        let jobs = Api::<Job>::namespaced(side.client.clone(), NAMESPACE);
        let pods = Api::<Pod>::namespaced(side.client.clone(), NAMESPACE);
        let Ok(list) = jobs.list(&ListParams::default()).await else {
            unfinished += 1;
            continue;
        };
        for job in list.items {
            let done = job
                .status
                .as_ref()
                .is_some_and(|s| s.succeeded.unwrap_or(0) + s.failed.unwrap_or(0) > 0);
            if !done {
                unfinished += 1;
                continue;
            }
            let name = job.name_any();
            let selector = format!("batch.kubernetes.io/job-name={name}");
            let Ok(job_pods) = pods.list(&ListParams::default().labels(&selector)).await else {
                continue;
            };
            for pod in job_pods.items {
                let Ok(log) = pods.logs(&pod.name_any(), &LogParams::default()).await else {
                    continue;
                };
                runs.extend(verdict::parse(TAG, side.id, &name, &log));
            }
        }
    }
    (runs, unfinished)
}

fn clock(epoch: f64) -> String {
    jiff::Timestamp::from_microsecond((epoch * 1e6) as i64)
        .map(|t| t.strftime("%H:%M:%S%.3f").to_string())
        .unwrap_or_else(|_| format!("{epoch}"))
}
