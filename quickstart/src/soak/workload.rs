//! What the soak runs: LockedJobs that together use every concurrency policy, catch-up,
//! run-now and backfill, each in both clusters under one shared lock; and the runs read back
//! from their pods' output.

use super::store::now_us;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use kube::ResourceExt;
use lockedjob::api::LockedJob;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;

pub const NAMESPACE: &str = "soak";
pub const TTL_SECONDS: u64 = 10;
const TAG: &str = "soak-run";

/// One LockedJob of the mix. Every schedule is "every `period` seconds" (a divisor of 60), so
/// that its due times are the multiples of the period.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Kind {
    pub name: &'static str,
    pub policy: &'static str,
    pub period: u64,
    pub work_seconds: u64,
    pub catch_up_all: bool,
}

/// The run-now's LockedJob.
pub const FORBID: Kind = Kind {
    name: "forbid",
    policy: "Forbid",
    period: 10,
    work_seconds: 2,
    catch_up_all: true,
};

/// The backfill's LockedJob.
pub const ALLOW: Kind = Kind {
    name: "allow",
    policy: "Allow",
    period: 20,
    work_seconds: 2,
    catch_up_all: false,
};

pub const MIX: [Kind; 4] = [
    FORBID,
    Kind {
        name: "replace",
        policy: "Replace",
        period: 15,
        work_seconds: 3,
        catch_up_all: false,
    },
    Kind {
        name: "buffer-one",
        policy: "BufferOne",
        period: 12,
        work_seconds: 2,
        catch_up_all: false,
    },
    ALLOW,
];

/// The lock every cluster's LockedJob of this kind shares.
pub fn lock_name(kind: &Kind) -> String {
    format!("soak-{}", kind.name)
}

/// The pod's command: say it entered, write to the store, work, write again, say it left.
/// `nc` is busybox's; its answer is in the store's log, so it is not parsed here.
fn script(store: SocketAddr, work_seconds: u64) -> String {
    let fields =
        "$LOCKEDJOB_LOCK_NAME $LOCKEDJOB_SCHEDULED_TIME $LOCKEDJOB_FENCING_TOKEN $LOCKEDJOB_HOLDER";
    let write = format!(
        "echo \"$LOCKEDJOB_LOCK_NAME $LOCKEDJOB_FENCING_TOKEN $HOSTNAME\" | nc -w 5 {} {} >/dev/null",
        store.ip(),
        store.port()
    );
    format!(
        "{now} echo \"{TAG} enter {fields} $(now)\"; {write}; sleep {work_seconds}; {write}; \
         echo \"{TAG} exit {fields} $(now)\"",
        now = localcluster::SHELL_NOW
    )
}

pub fn locked_job(kind: &Kind, store: SocketAddr) -> Result<LockedJob, serde_json::Error> {
    let mut spec = json!({
        "schedule": format!("*/{} * * * * *", kind.period),
        "concurrencyPolicy": kind.policy,
        "startingDeadlineSeconds": 30,
        "successfulJobsHistoryLimit": 100,
        "failedJobsHistoryLimit": 100,
        "lock": {"name": lock_name(kind), "ttlSeconds": TTL_SECONDS},
        "jobTemplate": {"spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "work", "image": "busybox:1.36",
                            "command": ["sh", "-c", script(store, kind.work_seconds)]}]}}}}
    });
    if kind.catch_up_all {
        spec["catchUp"] = json!("All");
        spec["maxCatchUp"] = json!(3);
    }
    serde_json::from_value(json!({
        "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
        "metadata": {"name": kind.name, "namespace": NAMESPACE},
        "spec": spec
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunKind {
    Scheduled,
    RunNow,
    Backfill,
}

impl RunKind {
    pub fn name(self) -> &'static str {
        match self {
            RunKind::Scheduled => "scheduled",
            RunKind::RunNow => "run-now",
            RunKind::Backfill => "backfill",
        }
    }
}

/// One run, as its pod said it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    pub cluster: String,
    pub pod: String,
    pub kind: RunKind,
    pub lock: String,
    pub scheduled: String,
    pub token: u64,
    pub holder: String,
    /// Seconds since the epoch.
    pub enter: f64,
    /// When the pod said it left; else when its container ended (to the second, rounded up);
    /// `None` when neither is known (the pod went before it was read).
    pub exit: Option<f64>,
}

/// What one line of a pod's output says: `TAG enter|exit LOCK SCHEDULED TOKEN HOLDER T`.
fn parse_line(line: &str) -> Option<(bool, &str, &str, u64, &str, f64)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 7 || f[0] != TAG {
        return None;
    }
    let enter = match f[1] {
        "enter" => true,
        "exit" => false,
        _ => return None,
    };
    Some((
        enter,
        f[2],
        f[3],
        f[4].parse().ok()?,
        f[5],
        f[6].parse().ok()?,
    ))
}

/// The run in one pod's output, if it entered.
pub fn parse_run(cluster: &str, pod: &str, kind: RunKind, output: &str) -> Option<Run> {
    let mut run: Option<Run> = None;
    for (enter, lock, scheduled, token, holder, at) in output.lines().filter_map(parse_line) {
        match (&mut run, enter) {
            (None, true) => {
                run = Some(Run {
                    cluster: cluster.to_string(),
                    pod: pod.to_string(),
                    kind,
                    lock: lock.to_string(),
                    scheduled: scheduled.to_string(),
                    token,
                    holder: holder.to_string(),
                    enter: at,
                    exit: None,
                })
            }
            (Some(run), false) => run.exit = Some(at),
            _ => {}
        }
    }
    run
}

fn kind_of(job: &Job) -> RunKind {
    let labels = job.labels();
    if labels.contains_key(lockedjob::controller::jobs::LABEL_BACKFILL) {
        RunKind::Backfill
    } else if labels.contains_key(lockedjob::controller::jobs::LABEL_MANUAL) {
        RunKind::RunNow
    } else {
        RunKind::Scheduled
    }
}

/// What has been read of one pod.
struct Seen {
    run: Option<Run>,
    done: bool,
}

/// Reads the runs from the pods of both clusters as they go, so that a pod deleted later (a
/// lost lock's Job, a replaced run) keeps what it said.
#[derive(Default)]
pub struct Collector {
    seen: BTreeMap<(String, String), Seen>,
    kinds: BTreeMap<(String, String), RunKind>,
}

impl Collector {
    /// One pass over cluster `id`: reads every pod not read to its end yet. An API error
    /// (the API server stopped by a fault) skips the pass.
    pub async fn read(&mut self, id: &str, client: &kube::Client) {
        let jobs = Api::<Job>::namespaced(client.clone(), NAMESPACE);
        let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
        if let Ok(list) = jobs.list(&ListParams::default()).await {
            for job in &list.items {
                self.kinds
                    .insert((id.to_string(), job.name_any()), kind_of(job));
            }
        }
        let Ok(list) = pods.list(&ListParams::default()).await else {
            return;
        };
        for pod in list.items {
            let name = pod.name_any();
            let key = (id.to_string(), name.clone());
            if self.seen.get(&key).is_some_and(|s| s.done) {
                continue;
            }
            // Runs only: the leader's pods share the namespace.
            let Some(job) = pod.labels().get("batch.kubernetes.io/job-name").cloned() else {
                continue;
            };
            let kind = self
                .kinds
                .get(&(id.to_string(), job))
                .copied()
                .unwrap_or(RunKind::Scheduled);
            let Ok(log) = pods.logs(&name, &LogParams::default()).await else {
                continue;
            };
            let finished = container_finished(&pod);
            let mut run = parse_run(id, &name, kind, &log);
            if let (Some(run), Some(finished)) = (&mut run, finished) {
                run.exit = run.exit.or(Some(finished.ceil()));
            }
            let done = finished.is_some();
            self.seen.insert(key, Seen { run, done });
        }
    }

    pub fn runs(&self) -> Vec<Run> {
        self.seen.values().filter_map(|s| s.run.clone()).collect()
    }
}

/// When the pod's container ended, in seconds since the epoch.
fn container_finished(pod: &Pod) -> Option<f64> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let finished = statuses
        .iter()
        .find_map(|s| s.state.as_ref()?.terminated.as_ref()?.finished_at.clone())?;
    Some(finished.0.as_millisecond() as f64 / 1000.0)
}

/// Seconds since the epoch, now.
pub fn now_seconds() -> f64 {
    now_us() as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_output_gives_its_run_with_or_without_its_end() {
        let both = "soak-run enter soak-forbid 2026-12-06T10:00:10Z 7 east/locks-1 100.5\n\
                    noise\n\
                    soak-run exit soak-forbid 2026-12-06T10:00:10Z 7 east/locks-1 102.75\n";
        let run = parse_run("east", "forbid-1-x", RunKind::Scheduled, both).expect("a run");
        assert_eq!(
            (run.lock.as_str(), run.token, run.enter, run.exit),
            ("soak-forbid", 7, 100.5, Some(102.75))
        );
        let cut_short = both.lines().next().unwrap_or_default();
        let run = parse_run("east", "p", RunKind::Backfill, cut_short).expect("a run");
        assert_eq!((run.exit, run.kind), (None, RunKind::Backfill));
        assert_eq!(
            parse_run("east", "p", RunKind::Scheduled, "soak-run exit x"),
            None
        );
    }

    #[test]
    fn every_kind_of_the_mix_is_a_valid_locked_job() {
        let store: SocketAddr = "10.250.0.1:4000".parse().expect("an address");
        for kind in &MIX {
            let job = locked_job(kind, store).expect("a LockedJob");
            assert_eq!(60 % kind.period, 0, "{}", kind.name);
            let valid = lockedjob::api::validate(NAMESPACE, kind.name, &job.spec)
                .unwrap_or_else(|errors| panic!("{}: {errors:?}", kind.name));
            assert_eq!(valid.lock_name, lock_name(kind));
        }
    }
}
