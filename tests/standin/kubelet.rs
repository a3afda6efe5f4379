//! A local kubelet and Job controller: for each Job it creates a Pod and runs the first
//! container's `command` + `args` as a local process with the template's env (the image is
//! ignored), then reports Pod and Job status as the Job controller would: startTime, active,
//! succeeded/failed, completionTime, Complete/Failed conditions, backoffLimit,
//! activeDeadlineSeconds. Deleting a Pod (or its Job) sends SIGTERM, then SIGKILL after the
//! grace period. Output goes to `{logs}/{namespace}_{pod}.stdout` / `.stderr`.
//! It also marks CustomResourceDefinitions `Established`, as kube-apiserver's own controller
//! does (the served types themselves are fixed, see `resources.rs`).

use super::http::State;
use super::resources::index_of;
use super::store::{now_rfc3339, random_suffix, Key, Sub};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

#[derive(Default)]
struct Processes {
    /// Pod uid -> process group of its running process.
    running: HashMap<String, i32>,
    /// Pod uids whose process was started (never start twice).
    started: HashSet<String>,
    /// Pod uids already sent SIGTERM.
    terminating: HashSet<String>,
}

pub struct Kubelet {
    state: Arc<State>,
    logs: PathBuf,
    processes: Arc<Mutex<Processes>>,
    jobs: usize,
    pods: usize,
    crds: usize,
}

/// Where the kubelet writes a pod's `stdout` or `stderr`.
pub fn log_path(logs: &Path, namespace: &str, pod: &str, stream: &str) -> PathBuf {
    logs.join(format!("{namespace}_{pod}.{stream}"))
}

fn has_condition(job: &Value, kind: &str) -> bool {
    job["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

/// Nothing left for the Job controller to do: deleting, complete or failed.
fn job_is_done(job: &Value) -> bool {
    job["metadata"].get("deletionTimestamp").is_some()
        || has_condition(job, "Complete")
        || has_condition(job, "Failed")
}

fn owned_by(object: &Value, uid: &str) -> bool {
    object["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(uid)))
}

fn key_of(resource: usize, object: &Value) -> Key {
    (
        resource,
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        object["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    )
}

impl Kubelet {
    pub fn new(state: Arc<State>, logs: PathBuf) -> Self {
        Self {
            state,
            logs,
            processes: Arc::new(Mutex::new(Processes::default())),
            jobs: index_of("batch", "jobs"),
            pods: index_of("", "pods"),
            crds: index_of("apiextensions.k8s.io", "customresourcedefinitions"),
        }
    }

    fn processes(&self) -> std::sync::MutexGuard<'_, Processes> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub async fn run(self) {
        let mut events = self.state.store.subscribe();
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                received = events.recv() => match received {
                    Ok(event) if event.resource == self.jobs => self.reconcile_job(&key_of(self.jobs, &event.object)),
                    Ok(event) if event.resource == self.pods => {
                        self.reconcile_pod(&key_of(self.pods, &event.object), &event.object);
                        if let Some(job) = self.job_of(&event.object) {
                            self.reconcile_job(&job);
                        }
                    }
                    Ok(event) if event.resource == self.crds => self.establish(&key_of(self.crds, &event.object)),
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => self.resync(),
                    Err(RecvError::Closed) => return,
                },
                _ = tick.tick() => self.resync(),
            }
        }
    }

    fn resync(&self) {
        for (key, _) in self.state.store.select(self.jobs, |job| !job_is_done(job)) {
            self.reconcile_job(&key);
        }
        for (key, pod) in self.state.store.select(self.pods, |pod| {
            pod["metadata"].get("deletionTimestamp").is_some()
                || !matches!(
                    pod["status"]["phase"].as_str(),
                    Some("Succeeded" | "Failed")
                )
        }) {
            self.reconcile_pod(&key, &pod);
        }
    }

    fn job_of(&self, pod: &Value) -> Option<Key> {
        let owner = pod["metadata"]["ownerReferences"]
            .as_array()?
            .iter()
            .find(|r| r["kind"] == "Job")?;
        Some((
            self.jobs,
            pod["metadata"]["namespace"].as_str()?.to_string(),
            owner["name"].as_str()?.to_string(),
        ))
    }

    fn reconcile_job(&self, key: &Key) {
        let Ok(job) = self.state.store.get(key) else {
            return;
        };
        if job_is_done(&job) {
            return;
        }
        let uid = job["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let pods: Vec<Value> = self
            .state
            .store
            .select(self.pods, |p| owned_by(p, &uid))
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        let phase = |p: &Value| {
            p["status"]["phase"]
                .as_str()
                .unwrap_or("Pending")
                .to_string()
        };
        let succeeded = pods.iter().filter(|p| phase(p) == "Succeeded").count();
        let failed = pods.iter().filter(|p| phase(p) == "Failed").count();
        let active: Vec<&Value> = pods
            .iter()
            .filter(|p| !matches!(phase(p).as_str(), "Succeeded" | "Failed"))
            .collect();
        let backoff_limit = job["spec"]["backoffLimit"].as_u64().unwrap_or(6) as usize;
        let now = now_rfc3339();
        let mut status = job.get("status").cloned().unwrap_or_else(|| json!({}));
        if status.get("startTime").is_none() {
            status["startTime"] = json!(now);
        }
        let started = status["startTime"]
            .as_str()
            .and_then(|s| s.parse::<jiff::Timestamp>().ok());
        let overdue = job["spec"]["activeDeadlineSeconds"]
            .as_i64()
            .is_some_and(|limit| {
                started.is_some_and(|s| jiff::Timestamp::now().as_second() - s.as_second() >= limit)
            });
        let mut finished: Option<(&str, &str, String)> = None;
        if succeeded >= 1 {
            finished = Some(("Complete", "Completed", "Job completed".into()));
        } else if failed > backoff_limit {
            finished = Some((
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit".into(),
            ));
        } else if overdue {
            finished = Some((
                "Failed",
                "DeadlineExceeded",
                "Job was active longer than specified deadline".into(),
            ));
        }
        let mut still_active = active
            .iter()
            .filter(|p| p["metadata"].get("deletionTimestamp").is_none())
            .count();
        match finished {
            Some((kind, reason, message)) => {
                for pod in &active {
                    let _ = self
                        .state
                        .store
                        .delete(&key_of(self.pods, pod), &Default::default());
                }
                still_active = 0;
                let mut conditions = vec![];
                if kind == "Complete" {
                    conditions.push(json!({"type": "SuccessCriteriaMet", "status": "True", "reason": reason, "message": message, "lastProbeTime": now, "lastTransitionTime": now}));
                    status["completionTime"] = json!(now);
                } else {
                    conditions.push(json!({"type": "FailureTarget", "status": "True", "reason": reason, "message": message, "lastProbeTime": now, "lastTransitionTime": now}));
                }
                conditions.push(json!({"type": kind, "status": "True", "reason": reason, "message": message, "lastProbeTime": now, "lastTransitionTime": now}));
                status["conditions"] = json!(conditions);
            }
            None if still_active == 0 => {
                self.create_pod(&job);
                still_active = 1;
            }
            None => {}
        }
        status["active"] = json!(still_active);
        status["succeeded"] = json!(succeeded);
        status["failed"] = json!(failed);
        if status != job.get("status").cloned().unwrap_or(Value::Null) {
            let mut next = job.clone();
            next["status"] = status;
            if let Some(m) = next["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            let _ = self.state.store.update(key, next, Sub::Status);
        }
    }

    /// `NamesAccepted` and `Established`, which clients wait for before using a new type.
    fn establish(&self, key: &Key) {
        let Ok(crd) = self.state.store.get(key) else {
            return;
        };
        if has_condition(&crd, "Established") {
            return;
        }
        let now = now_rfc3339();
        let mut next = crd.clone();
        next["status"]["conditions"] = json!([
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ]);
        next["status"]["acceptedNames"] = crd["spec"]["names"].clone();
        if let Some(m) = next["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
        let _ = self.state.store.update(key, next, Sub::Status);
    }

    fn create_pod(&self, job: &Value) {
        let name = job["metadata"]["name"].as_str().unwrap_or("job");
        let namespace = job["metadata"]["namespace"].as_str().unwrap_or("default");
        let uid = job["metadata"]["uid"].clone();
        let template = &job["spec"]["template"];
        let mut labels = template["metadata"]["labels"].clone();
        if !labels.is_object() {
            labels = json!({});
        }
        for (k, v) in [("job-name", name), ("batch.kubernetes.io/job-name", name)] {
            labels[k] = json!(v);
        }
        labels["controller-uid"] = uid.clone();
        labels["batch.kubernetes.io/controller-uid"] = uid.clone();
        let mut spec = template["spec"].clone();
        spec["nodeName"] = json!("standin-node");
        let pod = json!({
            "metadata": {
                "name": format!("{name}-{}", random_suffix(5)),
                "labels": labels,
                "annotations": template["metadata"]["annotations"],
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                      "controller": true, "blockOwnerDeletion": true}],
            },
            "spec": spec,
        });
        if let Ok(created) = self.state.store.create(self.pods, namespace, pod) {
            let key = key_of(self.pods, &created);
            let mut next = created.clone();
            next["status"] = json!({"phase": "Pending"});
            let _ = self.state.store.update(&key, next, Sub::Status);
        }
    }

    fn reconcile_pod(&self, key: &Key, last_seen: &Value) {
        let uid = last_seen["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let pod = match self.state.store.get(key) {
            Ok(pod) if pod["metadata"]["uid"].as_str() == Some(uid.as_str()) => pod,
            _ => {
                // Gone (force-deleted, or its owner went): nothing may keep running for it.
                if let Some(group) = self.processes().running.get(&uid).copied() {
                    let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
                }
                return;
            }
        };
        let deleting = pod["metadata"].get("deletionTimestamp").is_some();
        let running = self.processes().running.get(&uid).copied();
        if deleting {
            match running {
                Some(group) => {
                    if self.processes().terminating.insert(uid.clone()) {
                        let _ = killpg(Pid::from_raw(group), Signal::SIGTERM);
                        let grace = pod["metadata"]["deletionGracePeriodSeconds"]
                            .as_u64()
                            .unwrap_or(30);
                        let processes = Arc::clone(&self.processes);
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(grace)).await;
                            let still = processes
                                .lock()
                                .ok()
                                .and_then(|p| p.running.get(&uid).copied());
                            if let Some(group) = still {
                                let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
                            }
                        });
                    }
                }
                None => self.state.store.remove_now(key),
            }
            return;
        }
        let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
        if phase == "Pending" && !self.processes().started.contains(&uid) {
            self.start(key, &pod, uid);
        }
    }

    fn env_of(pod: &Value, container: &Value) -> Vec<(String, String)> {
        let mut env = Vec::new();
        for var in container["env"].as_array().cloned().unwrap_or_default() {
            let Some(name) = var["name"].as_str() else {
                continue;
            };
            let value = if let Some(v) = var["value"].as_str() {
                v.to_string()
            } else if let Some(path) = var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match path {
                    "metadata.name" => pod["metadata"]["name"].as_str().unwrap_or("").into(),
                    "metadata.namespace" => {
                        pod["metadata"]["namespace"].as_str().unwrap_or("").into()
                    }
                    "metadata.uid" => pod["metadata"]["uid"].as_str().unwrap_or("").into(),
                    "spec.nodeName" => "standin-node".into(),
                    p => {
                        let inner = |prefix: &str| {
                            p.strip_prefix(prefix)
                                .and_then(|r| r.strip_prefix("['"))
                                .and_then(|r| r.strip_suffix("']"))
                                .map(String::from)
                        };
                        if let Some(label) = inner("metadata.labels") {
                            pod["metadata"]["labels"][label]
                                .as_str()
                                .unwrap_or("")
                                .into()
                        } else if let Some(annotation) = inner("metadata.annotations") {
                            pod["metadata"]["annotations"][annotation]
                                .as_str()
                                .unwrap_or("")
                                .into()
                        } else {
                            String::new()
                        }
                    }
                }
            } else {
                String::new()
            };
            env.push((name.to_string(), value));
        }
        env
    }

    fn start(&self, key: &Key, pod: &Value, uid: String) {
        self.processes().started.insert(uid.clone());
        let container = pod["spec"]["containers"][0].clone();
        let argv: Vec<String> = container["command"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(container["args"].as_array().into_iter().flatten())
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        let log = |suffix: &str| log_path(&self.logs, &key.1, &key.2, suffix);
        let spawned = match argv.split_first() {
            None => Err(std::io::Error::other(
                "the stand-in kubelet runs containers[0].command/args; none given",
            )),
            Some((program, args)) => std::fs::File::create(log("stdout"))
                .and_then(|out| std::fs::File::create(log("stderr")).map(|err| (out, err)))
                .and_then(|(out, err)| {
                    tokio::process::Command::new(program)
                        .args(args)
                        .envs(Self::env_of(pod, &container))
                        .stdin(std::process::Stdio::null())
                        .stdout(out)
                        .stderr(err)
                        .process_group(0)
                        .kill_on_drop(true)
                        .spawn()
                }),
        };
        let store_update = |phase: &str, state: Value, message: Option<String>| {
            if let Ok(current) = self.state.store.get(key) {
                let mut next = current.clone();
                let now = now_rfc3339();
                next["status"] = json!({"phase": phase, "startTime": now, "hostIP": "127.0.0.1",
                    "containerStatuses": [{"name": container["name"], "ready": phase == "Running", "state": state, "restartCount": 0, "image": container["image"], "imageID": ""}]});
                if let Some(m) = message {
                    next["status"]["message"] = json!(m);
                }
                let _ = self.state.store.update(key, next, Sub::Status);
            }
        };
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                store_update(
                    "Failed",
                    json!({"terminated": {"exitCode": 127, "reason": "StartError", "message": e.to_string()}}),
                    Some(e.to_string()),
                );
                return;
            }
        };
        let group = child.id().map(|p| p as i32).unwrap_or(0);
        self.processes().running.insert(uid.clone(), group);
        store_update(
            "Running",
            json!({"running": {"startedAt": now_rfc3339()}}),
            None,
        );
        let state = Arc::clone(&self.state);
        let processes = Arc::clone(&self.processes);
        let key = key.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let code = status
                .as_ref()
                .ok()
                .map(|s| {
                    use std::os::unix::process::ExitStatusExt;
                    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
                })
                .unwrap_or(1);
            if let Ok(mut p) = processes.lock() {
                p.running.remove(&uid);
            }
            if let Ok(current) = state.store.get(&key) {
                if current["metadata"]["uid"].as_str() != Some(uid.as_str()) {
                    return;
                }
                if current["metadata"].get("deletionTimestamp").is_some() {
                    state.store.remove_now(&key);
                    return;
                }
                let mut next = current.clone();
                let phase = if code == 0 { "Succeeded" } else { "Failed" };
                next["status"]["phase"] = json!(phase);
                next["status"]["containerStatuses"][0]["ready"] = json!(false);
                next["status"]["containerStatuses"][0]["state"] = json!({"terminated": {"exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" }, "finishedAt": now_rfc3339()}});
                let _ = state.store.update(&key, next, Sub::Status);
            }
        });
    }
}
