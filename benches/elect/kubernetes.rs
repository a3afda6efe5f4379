//! `BENCH_NODE=real`: the sidecar on a real node (kubelet, containerd, runc; root only). A
//! Deployment of two pods, each with `lockedjob elect --sidecar` as a native sidecar, against
//! three Redis pods; per trial the leader is stopped and the time until the lock holds the
//! other's value is measured, read straight from a Redis pod:
//! - crash: the leader's sidecar process killed with SIGKILL on the node (the kubelet reports
//!   its termination message; docs/design.md, "Failover when Kubernetes confirms the leader's
//!   end");
//! - graceful: the leader's pod deleted: its workload stops on SIGTERM, then the native
//!   sidecar gets SIGTERM and releases the lock.
//!
//! After each crash the killed pod is deleted too, so the Deployment gives the next trial a
//! fresh standby instead of a container in restart back-off.

use localcluster::{LocalCluster, Options};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NAMESPACE: &str = "elect-bench";
const LOCK: &str = "bench-writer";
const TTL: &str = "15s";
const WAIT: Duration = Duration::from_secs(120);

fn kubectl(cluster: &LocalCluster, args: &[&str]) -> String {
    let out = cluster
        .tool("kubectl")
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn apply(cluster: &LocalCluster, manifest: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("manifest.yaml");
    std::fs::write(&file, manifest).expect("write the manifest");
    kubectl(cluster, &["apply", "-f", file.to_str().expect("utf-8")]);
}

fn until<T>(mut found: impl FnMut() -> Option<T>, what: &str) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The IP of each Running pod whose name starts with `prefix`.
fn pod_ips(cluster: &LocalCluster, prefix: &str) -> Vec<(String, String)> {
    let out = kubectl(
        cluster,
        &[
            "get", "pods", "-n", NAMESPACE, "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.podIP} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ],
    );
    out.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [name, "Running", ip] if name.starts_with(prefix) => {
                    Some((name.to_string(), ip.to_string()))
                }
                _ => None,
            }
        })
        .collect()
}

fn redis_pods() -> String {
    (0..3)
        .map(|i| {
            format!(
                r#"apiVersion: v1
kind: Pod
metadata: {{name: redis-{i}, namespace: {NAMESPACE}, labels: {{app: redis}}}}
spec:
  containers:
    - name: redis
      image: redis:7.2-alpine
      command: ["redis-server", "--save", "", "--appendonly", "no", "--protected-mode", "no"]
---
"#
            )
        })
        .collect()
}

fn writers(urls: &str, image: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: writer, namespace: {NAMESPACE}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: writer}}}}
  template:
    metadata: {{labels: {{app: writer}}}}
    spec:
      serviceAccountName: lockedjob-elect
      terminationGracePeriodSeconds: 5
      readinessGates: [{{conditionType: lockedjob.dev/leader}}]
      initContainers:
        - name: leader
          image: {image}
          restartPolicy: Always
          args: ["elect", "{LOCK}", "--sidecar", "--ttl", "{TTL}"]
          env:
            - {{name: LOCKEDJOB_REDIS_URLS, value: "{urls}"}}
            - {{name: LOCKEDJOB_CLUSTER_ID, value: bench}}
            - name: POD_NAME
              valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
            - name: POD_NAMESPACE
              valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}
      containers:
        - name: writer
          image: busybox:1.36
          # A workload that stops at once on SIGTERM: then the sidecar, stopped after it,
          # releases the lock.
          command: ["sh", "-c", "trap 'exit 0' TERM; sleep 100000 & wait"]
"#
    )
}

/// The lock's value held by a majority of the Redis pods (`{cluster}/{pod}/{random}`), if
/// any: a node outside the holder's quorum may hold nothing, or an older value.
fn holder_value(redis: &[String]) -> Option<String> {
    let read = |ip: &String| -> Option<String> {
        let client = redis::Client::open(format!("redis://{ip}:6379/")).ok()?;
        let mut connection = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        redis::cmd("GET")
            .arg(format!("lockedjob:lock:{LOCK}"))
            .query(&mut connection)
            .ok()?
    };
    let values: Vec<String> = redis.iter().filter_map(read).collect();
    crate::support::majority(&values, redis.len())
}

/// The next holder's value, once a majority holds one other than `held`.
fn next_value(redis: &[String], held: &str, what: &str) -> String {
    until(|| holder_value(redis).filter(|v| v != held), what)
}

/// Deletes pod `pod` without waiting for it to go.
fn delete_pod(cluster: &LocalCluster, pod: &str) {
    kubectl(
        cluster,
        &["delete", "pod", "-n", NAMESPACE, pod, "--wait=false"],
    );
}

/// The leader's pod and its lock value, once both writer pods run and one holds the lock.
fn leader(cluster: &LocalCluster, redis: &[String]) -> (String, String) {
    until(
        || {
            let writers = pod_ips(cluster, "writer-");
            let value = holder_value(redis)?;
            let held = writers
                .iter()
                .find(|(name, _)| value.contains(&format!("/{name}/")))?;
            let standby = writers.iter().find(|(name, _)| *name != held.0)?;
            // The standby campaigns once its sidecar runs.
            crate::support::sidecar_pid(&standby.0)?;
            Some((held.0.clone(), value))
        },
        "a leader and a running standby",
    )
}

pub fn failovers(trials: usize) -> Vec<(&'static str, Vec<Duration>)> {
    let image = "ghcr.io/lockedjob/lockedjob-operator:bench";
    let cluster = LocalCluster::start(Options {
        nodes: 2,
        images: BTreeMap::from([(image.to_string(), crate::support::lockedjob_image())]),
        ..Options::named("elect")
    })
    .expect("start a cluster with real nodes");
    kubectl(&cluster, &["create", "namespace", NAMESPACE]);
    let dir = tempfile::tempdir().expect("tempdir");
    crate::support::kubernetes::apply_chart_rbac(&cluster, NAMESPACE, dir.path());
    apply(&cluster, &redis_pods());
    let redis = until(
        || {
            let pods = pod_ips(&cluster, "redis-");
            (pods.len() == 3).then_some(pods)
        },
        "three Redis pods",
    );
    let urls: Vec<String> = redis
        .iter()
        .map(|(_, ip)| format!("redis://{ip}:6379"))
        .collect();
    let redis: Vec<String> = redis.into_iter().map(|(_, ip)| ip).collect();
    apply(&cluster, &writers(&urls.join(","), image));
    let mut crash = Vec::new();
    let mut graceful = Vec::new();
    for _ in 0..trials {
        let (was, held) = leader(&cluster, &redis);
        let pid = crate::support::sidecar_pid(&was).expect("the leader's sidecar");
        let killed = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        killed.expect("kill -9 the sidecar");
        let stopped = Instant::now();
        let next = next_value(&redis, &held, "a next leader after a crash");
        crash.push(stopped.elapsed());
        // The killed pod's restarted sidecar may have won; otherwise it is replaced by a
        // fresh pod rather than left in restart back-off.
        if !next.contains(&format!("/{was}/")) {
            delete_pod(&cluster, &was);
        }

        let (was, held) = leader(&cluster, &redis);
        let stopped = Instant::now();
        delete_pod(&cluster, &was);
        next_value(&redis, &held, "a next leader after a delete");
        graceful.push(stopped.elapsed());
    }
    vec![
        ("crash, container killed, node alive (SIGKILL)", crash),
        ("graceful, pod deleted", graceful),
    ]
}
