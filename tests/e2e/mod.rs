//! Shared by the end-to-end suites: operator replica processes, a lab of Redis nodes + one
//! stand-in cluster + replicas, LockedJobs that journal their runs, and the journal checker.
#![allow(dead_code)]

use super::standin::ApiServer;
use super::support::{self, Persistence, RedisNodes};
use kube::api::Api;
use lockedjob::api::LockedJob;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// One operator replica process.
pub struct Replica {
    pub child: Child,
    pub name: String,
    pub log: PathBuf,
}

impl Replica {
    pub fn start(
        server: &ApiServer,
        urls: &[String],
        cluster: &str,
        name: &str,
        dir: &Path,
    ) -> Self {
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

    pub fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
    }

    pub fn log(&self) -> String {
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
pub struct Lab {
    pub nodes: RedisNodes,
    pub server: ApiServer,
    pub dir: tempfile::TempDir,
    pub journal: PathBuf,
    pub replicas: Vec<Replica>,
}

impl Lab {
    pub fn start(redis_nodes: usize, replicas: usize) -> Self {
        let nodes = RedisNodes::start(redis_nodes, Persistence::AppendFsyncAlways)
            .expect("start redis-server");
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

pub fn logs_of(replicas: &[Replica]) -> String {
    replicas
        .iter()
        .map(|r| format!("--- {}\n{}", r.name, r.log()))
        .collect()
}

/// A LockedJob whose every run records itself in `journal`.
pub fn journaled(
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
pub struct Run {
    pub lock: String,
    pub scheduled: String,
    pub token: u64,
    pub cluster: String,
    pub start: f64,
    pub end: f64,
}

pub fn read_journal(path: &Path) -> Vec<Run> {
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

pub async fn condition(api: &Api<LockedJob>, name: &str, kind: &str) -> Option<(String, String)> {
    let lj = api.get(name).await.ok()?;
    lj.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status, c.message))
}
