//! Shared by the end-to-end suites: where they run (the local control plane — real
//! kube-apiserver, etcd, controller manager and scheduler, with a real node running the pods —
//! and the external cluster of `LOCKEDJOB_E2E_KUBECONFIG` when set), operator
//! replica processes each behind a fault proxy of its own, a lab of Redis nodes + one cluster +
//! replicas, LockedJobs that journal their runs, the journal reader and its checker.
//!
//! The journal is the Jobs' own output: each run prints one line when it ends, and the suites
//! read it through the pods' logs API (kube-apiserver asks the node for it).

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams};
use kube::ResourceExt;
use localcluster::{LocalCluster, Shared};
use lockedjob::api::LockedJob;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;
use testsupport::kubernetes::{
    client_for, create_namespace, eventually, install_lockedjob_crd, local_cluster, restricted,
};
use testsupport::{self as support, FaultProxy, Persistence, RedisNodes};

/// Names an external cluster to run the scenarios against too (opt-in).
pub const KUBECONFIG_ENV: &str = "LOCKEDJOB_E2E_KUBECONFIG";
/// How much slower than written the external cluster's scenarios run (its pods pull images and
/// take seconds to start): schedules, run lengths, TTLs and waits are multiplied by it.
/// Default 3; the local cluster runs at `LOCAL_PACE`.
pub const PACE_ENV: &str = "LOCKEDJOB_E2E_PACE";
/// Label on the journaling pods, for the journal reader.
const JOURNAL_LABEL: &str = "lockedjob-e2e/journal";
/// First word of a journal line, so other output of a pod is never taken for one.
const JOURNAL_TAG: &str = "lockedjob-journal";
/// `now`: the wall clock in seconds with microseconds, in a pod's shell.
const NOW: &str = localcluster::SHELL_NOW;

/// How much slower than written a scenario runs on the local cluster (see `Cluster::local`).
const LOCAL_PACE: u32 = 2;

/// Where a scenario runs: a fresh namespace of the local control plane, or of the external
/// cluster. The namespace is deleted on drop.
pub struct Cluster {
    pub name: String,
    pub client: kube::Client,
    pub namespace: String,
    /// The local control plane, for the replicas' fault proxies and stopping the API server;
    /// `None` on the external cluster.
    pub local: Option<Shared>,
    /// The admin kubeconfig.
    kubeconfig: PathBuf,
    pace: u32,
}

impl Cluster {
    /// A fresh namespace on the local cluster shared under `name` by this test process. It
    /// runs at pace 2: a Job of a 0.3 s command took about 3.5 s from creation to completion
    /// on its real node (sandbox, network, container, the Job controller's count), which a
    /// 2-second schedule does not leave room for.
    pub async fn local(name: &'static str) -> Self {
        Self::on(local_cluster(name).await).await
    }

    /// A fresh namespace on `local`.
    async fn on(local: Shared) -> Self {
        let name = local.name().to_string();
        let mut cluster = Self::in_namespace_of(&local.kubeconfig(), LOCAL_PACE).await;
        cluster.name = format!("local cluster {name}");
        cluster.local = Some(local);
        cluster
    }

    /// A fresh namespace on the cluster of `kubeconfig`.
    pub async fn external(kubeconfig: &Path) -> Self {
        let pace = std::env::var(PACE_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|p| *p >= 1)
            .unwrap_or(3);
        let cluster = Self::in_namespace_of(kubeconfig, pace).await;
        println!(
            "external cluster: namespace {}, pace x{pace}",
            cluster.namespace
        );
        cluster
    }

    async fn in_namespace_of(kubeconfig: &Path, pace: u32) -> Self {
        let client = client_for(kubeconfig).await;
        install_lockedjob_crd(&client, "lockedjob-e2e")
            .await
            .unwrap_or_else(|e| panic!("install the CRD (needs cluster-admin): {e}"));
        let namespace = create_namespace(&client, "lockedjob-e2e").await;
        Self {
            name: "external cluster".into(),
            client,
            namespace,
            local: None,
            kubeconfig: kubeconfig.to_path_buf(),
            pace,
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The local control plane, or a visible skip of a scenario that needs it.
    pub fn local_or_skip(&self, scenario: &str) -> Option<&LocalCluster> {
        if self.local.is_none() {
            println!(
                "skipped on the {}: {scenario} needs the local control plane",
                self.name
            );
        }
        self.local.as_deref()
    }

    /// Replicas watch only the test's namespace (other tests share the cluster).
    fn scope_args(&self) -> Vec<String> {
        vec!["--namespaces".into(), self.namespace.clone()]
    }

    /// `seconds` at this cluster's pace.
    pub fn secs(&self, seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds * f64::from(self.pace))
    }

    /// A schedule every `seconds` at this cluster's pace (a minute or more: whole minutes,
    /// rounded up, as the seconds field cannot step past 59).
    pub fn every(&self, seconds: u32) -> String {
        match seconds * self.pace {
            s if s < 60 => format!("*/{s} * * * * *"),
            s => format!("0 */{} * * * *", s.div_ceil(60)),
        }
    }

    /// The admin kubeconfig, for running the CLI against this cluster.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The lock name a LockedJob gets by default here.
    pub fn default_lock(&self, locked_job: &str) -> String {
        format!("{}/{locked_job}", self.namespace)
    }

    /// A LockedJob whose every run prints its journal line when it ends; `sleep` (the run
    /// length) and the 6-second TTL are at this cluster's pace.
    pub fn journaled(
        &self,
        name: &str,
        schedule: &str,
        cluster_id: &str,
        lock: Option<&str>,
        sleep: f64,
    ) -> LockedJob {
        let sleep = sleep * f64::from(self.pace);
        let script = format!(
            "{NOW} start=$(now); sleep {sleep}; end=$(now); echo \"{JOURNAL_TAG} $LOCKEDJOB_LOCK_NAME $LOCKEDJOB_SCHEDULED_TIME $LOCKEDJOB_FENCING_TOKEN {cluster_id} $start $end\""
        );
        let mut lock_spec = json!({"ttlSeconds": 6 * self.pace});
        if let Some(lock) = lock {
            lock_spec["name"] = json!(lock);
        }
        serde_json::from_value(json!({
            "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
            "metadata": {"name": name},
            // The journal is read from the pods: keep them for the whole scenario.
            "spec": {"schedule": schedule, "lock": lock_spec,
                "successfulJobsHistoryLimit": 100, "failedJobsHistoryLimit": 100,
                "jobTemplate": {"spec": {"backoffLimit": 0, "template": {
                    "metadata": {"labels": {JOURNAL_LABEL: "true"}},
                    "spec": restricted(json!({"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script]}]}))}}}}
        }))
        .expect("locked job")
    }
}

impl Drop for Cluster {
    /// The test namespace is deleted, with the finalizers of LockedJobs whose replicas are
    /// gone removed (in a thread of its own: `Drop` cannot await).
    fn drop(&mut self) {
        let kubeconfig = self.kubeconfig.clone();
        let namespace = self.namespace.clone();
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let client = client_for(&kubeconfig).await;
                let _ = Api::<Namespace>::all(client.clone())
                    .delete(&namespace, &DeleteParams::background())
                    .await;
                // Deleting the namespace marks its LockedJobs deleted: no finalizer can be
                // added after that, so removing them now lets the namespace go.
                let locked_jobs: Api<LockedJob> = Api::namespaced(client, &namespace);
                if let Ok(list) = locked_jobs.list(&ListParams::default()).await {
                    for lj in list.items {
                        let _ = locked_jobs
                            .patch(
                                &lj.name_any(),
                                &PatchParams::default(),
                                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                            )
                            .await;
                    }
                }
            });
        });
        let _ = cleanup.join();
    }
}

fn external_kubeconfig() -> Option<PathBuf> {
    let path = std::env::var_os(KUBECONFIG_ENV).map(PathBuf::from);
    if path.is_none() {
        println!("{KUBECONFIG_ENV} not set: this scenario runs on the local control plane only");
    }
    path
}

/// The local control plane, and the external cluster when `LOCKEDJOB_E2E_KUBECONFIG` names one.
pub async fn clusters() -> Vec<Cluster> {
    let mut list = vec![Cluster::local("east").await];
    if let Some(path) = external_kubeconfig() {
        list.push(Cluster::external(&path).await);
    }
    list
}

/// Two clusters sharing one set of Redis nodes: two local control planes; on the external
/// cluster, two namespaces of it whose replicas use different cluster ids.
pub async fn cluster_pairs() -> Vec<(Cluster, Cluster)> {
    // Both at once: a test holding one while waiting for the other's slot could wait forever.
    let mut both = tokio::task::spawn_blocking(|| {
        let named = |name: &'static str| -> localcluster::LazyOptions<'static> {
            Box::new(move || localcluster::Options::named(name))
        };
        localcluster::shared_many(vec![("east", named("east")), ("west", named("west"))])
    })
    .await
    .expect("join the clusters' start")
    .unwrap_or_else(|e| panic!("start the local clusters east and west: {e}"));
    let west = Cluster::on(both.pop().expect("west")).await;
    let east = Cluster::on(both.pop().expect("east")).await;
    let mut list = vec![(east, west)];
    if let Some(path) = external_kubeconfig() {
        list.push((
            Cluster::external(&path).await,
            Cluster::external(&path).await,
        ));
    }
    list
}

/// One operator replica process. On the local control plane it reaches the API server
/// through a fault proxy of its own, so a test can cut it off alone.
pub struct Replica {
    pub child: Child,
    pub name: String,
    pub log: PathBuf,
    api_proxy: Option<FaultProxy>,
}

impl Replica {
    pub fn start(
        cluster: &Cluster,
        urls: &[String],
        cluster_id: &str,
        name: &str,
        dir: &Path,
    ) -> Self {
        Self::start_with_env(cluster, urls, cluster_id, name, dir, &[])
    }

    /// [`Replica::start`] with more environment: credentials and TLS files, say.
    pub fn start_with_env(
        cluster: &Cluster,
        urls: &[String],
        cluster_id: &str,
        name: &str,
        dir: &Path,
        env: &[(&str, std::ffi::OsString)],
    ) -> Self {
        let log = dir.join(format!("{cluster_id}-{name}.log"));
        let (api_proxy, kubeconfig) = match &cluster.local {
            Some(local) => {
                let proxy = FaultProxy::start(&local.apiserver_addr()).expect("API proxy");
                let kubeconfig = local
                    .kubeconfig_via(
                        &format!("https://{}", proxy.addr()),
                        &format!("kubeconfig-{}-{cluster_id}-{name}", cluster.namespace),
                    )
                    .expect("replica kubeconfig");
                (Some(proxy), kubeconfig)
            }
            None => (None, cluster.kubeconfig.clone()),
        };
        let child = Command::new(support::lockedjob_bin())
            .arg("operator")
            .args(["--redis", &urls.join(",")])
            .args(["--cluster-id", cluster_id, "--runner-name", name])
            .args(["--request-timeout", "300ms"])
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{}", support::free_port()),
            ])
            .args(cluster.scope_args())
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .env_remove("LOCKEDJOB_REDIS_URLS")
            .env_remove("LOCKEDJOB_NAMESPACES")
            .envs(env.iter().map(|(key, value)| (key, value)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start operator");
        Self {
            child,
            name: name.into(),
            log,
            api_proxy,
        }
    }

    pub fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The proxy between this replica and its API server (local control plane only).
    pub fn api_proxy(&self) -> Option<&FaultProxy> {
        self.api_proxy.as_ref()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Redis nodes, one cluster, its operator replicas and the journal of its runs.
pub struct Lab {
    pub nodes: RedisNodes,
    /// The replicas' logs, kept until the lab is dropped.
    _logs: tempfile::TempDir,
    pub journal: Journal,
    pub replicas: Vec<Replica>,
    /// Last: dropped after the replicas, so a real cluster's namespace goes once they stopped.
    pub cluster: Cluster,
}

impl Lab {
    pub fn start(cluster: Cluster, redis_nodes: usize, replicas: usize) -> Self {
        let nodes = RedisNodes::start(redis_nodes, Persistence::AppendFsyncAlways)
            .expect("start redis-server");
        let dir = tempfile::tempdir().expect("dir");
        let replicas = (0..replicas)
            .map(|i| Replica::start(&cluster, &nodes.urls(), "c1", &format!("r{i}"), dir.path()))
            .collect();
        Self {
            nodes,
            _logs: dir,
            journal: Journal::new(vec![cluster.api()]),
            replicas,
            cluster,
        }
    }
}

/// Sets annotation `key` of LockedJob `name` to `value`, or removes it (`None`).
pub async fn annotate(api: &Api<LockedJob>, name: &str, key: &str, value: Option<&str>) {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("annotate");
}

pub fn logs_of(replicas: &[Replica]) -> String {
    replicas
        .iter()
        .map(|r| format!("--- {}\n{}", r.name, r.log()))
        .collect()
}

#[derive(Debug, Clone)]
pub struct Run {
    pub lock: String,
    pub scheduled: String,
    pub token: u64,
    pub cluster: String,
    pub start: f64,
    pub end: f64,
}

/// The journal lines in a pod's output.
pub fn parse_journal(output: &str) -> Vec<Run> {
    output
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() == 7 && f[0] == JOURNAL_TAG).then(|| Run {
                lock: f[1].into(),
                scheduled: f[2].into(),
                token: f[3].parse().unwrap_or(0),
                cluster: f[4].into(),
                start: f[5].parse().unwrap_or(0.0),
                end: f[6].parse().unwrap_or(0.0),
            })
        })
        .collect()
}

/// The runs journaled by the pods of one or more clusters, read through the logs API. The
/// journaling LockedJobs keep 100 finished Jobs, more than any scenario runs, so every pod of
/// a finished run is still there to read at the end (a run stopped early journals nothing).
pub struct Journal {
    sources: Vec<Api<Pod>>,
    /// Pod uid -> the runs it journaled; a finished pod is read once.
    read: Mutex<BTreeMap<String, Vec<Run>>>,
}

impl Journal {
    pub fn new(sources: Vec<Api<Pod>>) -> Self {
        Self {
            sources,
            read: Mutex::new(BTreeMap::new()),
        }
    }

    /// Reads the pods that finished since the last call.
    async fn collect(&self) {
        let already = |uid: &str| self.read.lock().is_ok_and(|r| r.contains_key(uid));
        for pods in &self.sources {
            let Ok(list) = pods
                .list(&ListParams::default().labels(&format!("{JOURNAL_LABEL}=true")))
                .await
            else {
                continue;
            };
            let finished: Vec<(String, String)> = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
                .filter_map(|p| Some((p.uid()?, p.name_any())))
                .filter(|(uid, _)| !already(uid))
                .collect();
            let outputs: Vec<(String, Option<String>)> = futures::stream::iter(finished)
                .map(|(uid, name)| async move {
                    (uid, pods.logs(&name, &LogParams::default()).await.ok())
                })
                .buffer_unordered(8)
                .collect()
                .await;
            if let Ok(mut read) = self.read.lock() {
                for (uid, output) in outputs {
                    if let Some(output) = output {
                        read.insert(uid, parse_journal(&output));
                    }
                }
            }
        }
    }

    /// Every run journaled so far, after one more read.
    pub async fn runs(&self) -> Vec<Run> {
        self.collect().await;
        self.read
            .lock()
            .map(|r| r.values().flatten().cloned().collect())
            .unwrap_or_default()
    }

    /// Polls (every 250 ms, up to `limit`) until the runs satisfy `done`.
    pub async fn wait_for(&self, limit: Duration, done: impl Fn(&[Run]) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if done(&self.runs().await) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The checker: per lock, one run per scheduled time, no overlap, tokens growing in start order.
pub fn check(runs: &[Run]) -> Result<(), String> {
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

/// Per lock, no due time between its first and last run went without one: consecutive
/// scheduled times are `period` apart.
pub fn check_every_time_ran(runs: &[Run], period: Duration) -> Result<(), String> {
    let mut locks: Vec<&str> = runs.iter().map(|r| r.lock.as_str()).collect();
    locks.sort();
    locks.dedup();
    for lock in locks {
        let mut times: Vec<jiff::Timestamp> = runs
            .iter()
            .filter(|r| r.lock == lock)
            .map(|r| {
                r.scheduled
                    .parse()
                    .map_err(|e| format!("scheduled time {:?}: {e}", r.scheduled))
            })
            .collect::<Result<_, _>>()?;
        times.sort();
        for pair in times.windows(2) {
            let gap = pair[1].duration_since(pair[0]);
            if gap.unsigned_abs() != period {
                return Err(format!(
                    "{lock}: no run between {} and {} (every {period:?} was due)",
                    pair[0], pair[1]
                ));
            }
        }
    }
    Ok(())
}

pub async fn condition(api: &Api<LockedJob>, name: &str, kind: &str) -> Option<(String, String)> {
    let lj = api.get(name).await.ok()?;
    lj.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status, c.message))
}

/// Waits for the first run's holder of `name` (`status.lastRun.holder`).
pub async fn wait_for_holder(api: &Api<LockedJob>, name: &str, limit: Duration) -> String {
    let holder = || async {
        api.get(name)
            .await
            .ok()
            .and_then(|l| l.status)
            .and_then(|s| s.last_run)
            .map(|r| r.holder)
    };
    assert!(
        eventually(limit, || async { holder().await.is_some() }).await,
        "no run started"
    );
    holder().await.expect("holder")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(scheduled: &str, token: u64, start: f64, end: f64) -> Run {
        Run {
            lock: "ns/a".into(),
            scheduled: scheduled.into(),
            token,
            cluster: "c1".into(),
            start,
            end,
        }
    }

    #[test]
    fn checker_finds_each_kind_of_violation() {
        let cases: &[(&str, Vec<Run>, Option<&str>)] = &[
            (
                "clean",
                vec![run("t1", 1, 0.0, 1.0), run("t2", 2, 2.0, 3.0)],
                None,
            ),
            (
                "a time twice",
                vec![run("t1", 1, 0.0, 1.0), run("t1", 2, 2.0, 3.0)],
                Some("ran twice"),
            ),
            (
                "overlap",
                vec![run("t1", 1, 0.0, 2.5), run("t2", 2, 2.0, 3.0)],
                Some("overlap"),
            ),
            (
                "tokens going down",
                vec![run("t1", 5, 0.0, 1.0), run("t2", 4, 2.0, 3.0)],
                Some("tokens not increasing"),
            ),
        ];
        for (case, runs, expected) in cases {
            match (check(runs), expected) {
                (Ok(()), None) => {}
                (Err(e), Some(part)) if e.contains(part) => {}
                (got, _) => panic!("{case}: {got:?}, expected {expected:?}"),
            }
        }
        // Another lock's runs are judged apart.
        let mut other = run("t1", 1, 0.5, 1.5);
        other.lock = "ns/b".into();
        assert!(check(&[run("t1", 1, 0.0, 1.0), other]).is_ok());
    }

    #[test]
    fn a_due_time_without_a_run_is_found() {
        let at = |time: &str| run(time, 1, 0.0, 0.0);
        let every_2s = Duration::from_secs(2);
        let all = [
            at("2026-01-01T00:00:04Z"),
            at("2026-01-01T00:00:00Z"),
            at("2026-01-01T00:00:02Z"),
        ];
        assert_eq!(check_every_time_ran(&all, every_2s), Ok(()));
        let gap = [at("2026-01-01T00:00:00Z"), at("2026-01-01T00:00:04Z")];
        let err = check_every_time_ran(&gap, every_2s).unwrap_err();
        assert!(err.contains("no run between"), "{err}");
        assert!(check_every_time_ran(&[at("yesterday")], every_2s).is_err());
    }

    #[test]
    fn journal_lines_are_told_from_other_output() {
        let output = format!(
            "starting\n{JOURNAL_TAG} ns/a 2026-01-01T00:00:00Z 7 c1 1.5 2.5\n{JOURNAL_TAG} broken\n"
        );
        let runs = parse_journal(&output);
        assert_eq!(runs.len(), 1);
        assert_eq!((runs[0].lock.as_str(), runs[0].token), ("ns/a", 7));
        assert_eq!((runs[0].start, runs[0].end), (1.5, 2.5));
    }
}
